// Answers lost on the way back, and refusals that need their own words, at
// desktop size:
// - a budget vote whose 202 is lost (the request reached the shop, the page saw
//   the connection reset): the page sends it again with the same Idempotency-Key,
//   and the votes count once;
// - the same for a purchase of 2 on a sale of up to 3 per customer: one order of
//   2 units, not two;
// - a sale with an account-age rule, bought by an account made a moment ago:
//   "Your account is too new", with the shop's words, not "sign in again".

import { accounts, call, check, finish, goto, inspect, launchChromium, newContextPage, out, signInApi, signUpApi, until } from "./lib.mjs";
import { mkdir } from "node:fs/promises";
import { randomBytes } from "node:crypto";

const { demoPassword, adminUser, adminPassword } = accounts();
const runId = randomBytes(3).toString("hex");
const viewport = { width: 1280, height: 800 };

async function liveSale(admin, name, settings) {
  const now = Date.now();
  const res = await call("POST", "/api/admin/sales", admin.token, {
    name: `E2E lost answers ${name} ${runId}`,
    description: "Made by e2e/lost_answers.mjs.",
    price_cents: 1_000,
    stock: 20,
    starts_at: new Date(now - 60_000).toISOString(),
    ends_at: new Date(now + 3_600_000).toISOString(),
    ...settings,
  });
  if (res.status !== 201) throw new Error(`create sale: ${res.status} ${JSON.stringify(res.data)}`);
  return res.data.id;
}

/**
 * Makes the first POST to `path` reach the shop and its answer be lost (the
 * page sees a connection reset); later ones pass. Returns the Idempotency-Keys
 * the page sent, in order, and the first answer the shop gave.
 */
async function loseFirstAnswer(page, path) {
  const seen = { keys: [], lost: null };
  await page.route(`**${path}`, async (route) => {
    const request = route.request();
    if (request.method() !== "POST") return route.continue();
    seen.keys.push(request.headers()["idempotency-key"] || "");
    if (seen.lost) return route.continue();
    const answer = await route.fetch();
    seen.lost = { status: answer.status(), body: await answer.text() };
    return route.abort("connectionreset");
  });
  return seen;
}

await mkdir(out, { recursive: true });
const browser = await launchChromium();
const admin = await signInApi(adminUser, adminPassword);

try {
  // ---- a budget vote, its answer lost ----------------------------------------
  {
    const now = Date.now();
    const made = await call("POST", "/api/admin/polls", admin.token, {
      question: `E2E lost answers: budget ${runId}`,
      options: ["Tea", "Coffee"],
      opens_at: new Date(now - 60_000).toISOString(),
      closes_at: new Date(now + 3_600_000).toISOString(),
      ballot: "budget",
      votes_per_user: 10,
      max_per_option: 5,
    });
    if (made.status !== 201) throw new Error(`create poll: ${made.status} ${JSON.stringify(made.data)}`);
    const poll = made.data.id;
    const voter = await signUpApi(`e2el-v${runId}`, demoPassword);
    const page = await newContextPage(browser, viewport, voter);
    const seen = await loseFirstAnswer(page, `/api/polls/${poll}/votes`);
    await goto(page, `/polls/${poll}`);
    const more = page.locator(".stepper-row").nth(0).locator('[data-action="more"]');
    await until("the steppers enabled", async () => !(await more.isDisabled()));
    for (let n = 0; n < 3; n += 1) await more.click();
    await page.locator('[data-action="vote"]').click();
    await page.locator('[data-field="outcome"]', { hasText: "You have 7 left to give." }).waitFor({ timeout: 15_000 });
    const said = await page.locator('[data-field="outcome"]').innerText();
    check(said.includes("nothing counted twice"), `the page says the answer was given again (${JSON.stringify(said)})`);
    check(seen.lost && seen.lost.status === 202, `the lost answer was a 202 (${JSON.stringify(seen.lost)})`);
    check(
      seen.keys.length === 2 && seen.keys[0] !== "" && seen.keys[0] === seen.keys[1],
      `the vote was sent again with its key (${JSON.stringify(seen.keys)})`,
    );
    const mine = (await call("GET", `/api/polls/${poll}/my-ballot`, voter.token)).data;
    const given = Object.fromEntries(mine.votes.map((v) => [v.option_id, v.count]));
    check(
      mine.remaining === 7 && given[made.data.options[0].id] === 3,
      `the 3 votes counted once: 7 left (${JSON.stringify(mine)})`,
    );
    await inspect(page, "lost-answer-vote");
    await page.context().close();
  }

  // ---- a purchase of 2, its answer lost ----------------------------------------
  {
    const sale = await liveSale(admin, "several", { max_per_user: 3 });
    const buyer = await signUpApi(`e2el-b${runId}`, demoPassword);
    const page = await newContextPage(browser, viewport, buyer);
    const seen = await loseFirstAnswer(page, `/api/sales/${sale}/purchase`);
    await goto(page, `/sales/${sale}`);
    await page.locator('[name="quantity"]').selectOption("2");
    await page.locator('[data-action="buy"]').click();
    await page.locator('[data-field="outcome"]', { hasText: "Order for 2 placed" }).waitFor({ timeout: 15_000 });
    const placed = await page.locator('[data-field="outcome"]').innerText();
    check(placed.includes("not placed twice"), `the page says the order was given again (${JSON.stringify(placed)})`);
    check(seen.lost && seen.lost.status === 202, `the lost answer was a 202 (${JSON.stringify(seen.lost)})`);
    check(
      seen.keys.length === 2 && seen.keys[0] !== "" && seen.keys[0] === seen.keys[1],
      `the purchase was sent again with its key (${JSON.stringify(seen.keys)})`,
    );
    const left = await call("GET", `/api/sales/${sale}`, null);
    check(left.data.stock_left === 18, `2 units taken, not 4 (stock_left ${left.data.stock_left})`);
    await until("the order in Postgres", async () => (await call("GET", "/api/me/orders", buyer.token)).data.length === 1);
    const orders = (await call("GET", "/api/me/orders", buyer.token)).data;
    check(orders.length === 1 && orders[0].quantity === 2, `one order of 2 units (${JSON.stringify(orders)})`);
    await inspect(page, "lost-answer-purchase");
    await page.context().close();
  }

  // ---- an account too new for the sale -----------------------------------------
  {
    const sale = await liveSale(admin, "account age", { min_account_age_s: 86_400 });
    const buyer = await signUpApi(`e2el-n${runId}`, demoPassword);
    const page = await newContextPage(browser, viewport, buyer);
    await goto(page, `/sales/${sale}`);
    await page.locator('[data-action="buy"]').click();
    const outcome = page.locator('[data-field="outcome"]');
    await outcome.getByText("Your account is too new for this yet.").waitFor();
    const words = await outcome.innerText();
    check(!words.includes("Sign in again"), `no "sign in again" for a new account (${JSON.stringify(words)})`);
    await inspect(page, "account-too-new");
    await page.context().close();
  }
} finally {
  await finish(browser, "lost answers");
}
