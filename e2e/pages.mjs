// Every page at desktop (1280x800) and phone (390x844) size, against a running,
// seeded server (scripts/browser-test starts one; scripts/e2e's settings apply):
// - no page scrolls sideways at 390 px;
// - an axe-core scan of every page state finds no violation at all, at both sizes
//   (the 403 page included);
// - the fixes of issue 12, each at both sizes: the buy box on screen and the answer
//   to Buy scrolled into view with the focus on it, "Sign in to buy" and `next`
//   kept through sign-up, the sold-out message gone after a top-up and nothing
//   stale after a close, the "Opens" time of an open sale page following the
//   admin's "Open now", the admin's orders page listing the buyers (its totals
//   following an admin's cancel and refund without a reload, a Cancel of an order
//   awaiting payment inside its card, short order ids with Copy), tallies that
//   follow votes without a reload, admin rows that offer only what makes sense and
//   do not move, plain field errors that clear when fixed, visible focus on sale
//   and poll cards; and a live home page with countdowns and grouped numbers, and
//   "Closed early" on a poll; a sale with a payment window: the sale page says how
//   long there is to pay, My orders counts down to the deadline, Pay (pressed
//   twice, paid once) turns the order Paid in place with the answer announced and
//   focused, an order left unpaid shows Expired, the admin's orders page counts
//   payments, and the admin form creates a sale with the payment window typed in;
//   a sale of up to two per customer: the quantity next to Buy, 2 bought at once
//   (two units gone), one more refused with the per-customer message, and the
//   admin form's "Most per customer" (its error by the field, the sale made with it);
//   hidden poll results (issue 51): plain words and no number until the vote, the
//   close or the reveal, a voter's tallies once the vote is in, the admin's tallies
//   of a hidden poll and the reveal button.
// Screenshots of every page at both sizes go to E2E_OUT.
// It creates its own sales, polls and users (named "E2E pages ...", "e2ep-...").

import { accounts, base, call, check, goto, inspect, isInViewport, launchChromium, newContextPage, out, problems, signInApi, signUpApi as signUpWith, until, finish } from "./lib.mjs";
import { mkdir } from "node:fs/promises";
import { randomBytes } from "node:crypto";

const { demoPassword, adminUser, adminPassword } = accounts();
const runId = randomBytes(3).toString("hex");
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const SIZES = [
  ["desktop", DESKTOP],
  ["phone", PHONE],
];

// ---- the API, for setting the scene -----------------------------------------

// A purchase through the API as the sale page makes it: a ticket (sales made here
// require one, the API's default), then the purchase carrying it.
async function buyApi(sale, token) {
  const ticket = await call("POST", `/api/sales/${sale}/ticket`, token);
  if (ticket.status !== 200) return ticket;
  return call("POST", `/api/sales/${sale}/purchase`, token, { ticket: ticket.data.ticket });
}

const signUpApi = (username) => signUpWith(username, demoPassword);

async function createSale(admin, name, stock, startsInMin, endsInMin, imageUrl = null, more = {}) {
  const now = Date.now();
  const res = await call("POST", "/api/admin/sales", admin.token, {
    ...more,
    name,
    image_url: imageUrl,
    description: "Made by e2e/pages.mjs.",
    price_cents: 129_900,
    stock,
    starts_at: new Date(now + startsInMin * 60000).toISOString(),
    ends_at: new Date(now + endsInMin * 60000).toISOString(),
  });
  if (res.status !== 201) throw new Error(`create sale: ${res.status} ${JSON.stringify(res.data)}`);
  return res.data.id;
}

/** An open poll; returns the API's answer (id, options with their ids). */
async function createPoll(admin, question, options, results = "live") {
  const res = await call("POST", "/api/admin/polls", admin.token, {
    question,
    options,
    opens_at: new Date(Date.now() - 60000).toISOString(),
    closes_at: new Date(Date.now() + 3600000).toISOString(),
    results,
  });
  if (res.status !== 201) throw new Error(`create poll: ${res.status} ${JSON.stringify(res.data)}`);
  return res.data;
}

// ---- the browser ------------------------------------------------------------

await mkdir(out, { recursive: true });
const browser = await launchChromium();
const newPage = (viewport, session) => newContextPage(browser, viewport, session);

/** The element's box lies wholly inside the viewport as it is scrolled now. */
async function inViewport(locator) {
  return locator.evaluate(isInViewport);
}

/**
 * Tabs from the top of the page until a card (`selector`) has the keyboard focus;
 * true when one does and its focus ring is drawn (an outline of 2 px or more).
 */
async function focusRingOnCard(page, selector) {
  let onCard = false;
  for (let i = 0; i < 40 && !onCard; i += 1) {
    await page.keyboard.press("Tab");
    onCard = await page.evaluate((sel) => document.activeElement?.matches(sel) ?? false, selector);
  }
  const ring = await page.evaluate(() => {
    const s = getComputedStyle(document.activeElement);
    return { style: s.outlineStyle, width: parseFloat(s.outlineWidth), visible: document.activeElement.matches(":focus-visible") };
  });
  return { ok: onCard && ring.visible && ring.style !== "none" && ring.width >= 2, ring };
}

try {
  const admin = await signInApi(adminUser, adminPassword);
  const alice = await signInApi("alice", demoPassword);
  const bob = await signInApi("bob", demoPassword);

  // The scene: a live sale with a two-line name, one that opens in 30 minutes with
  // a stock in the millions, a closed one, an open poll; per size, a sale with a
  // single unit, one the admin opens early, and a poll whose tallies the admin
  // watches.
  const longName = `E2E pages ${runId}: Stampede Phone X Pro Max, 512 GB, midnight blue`;
  const liveSale = await createSale(admin, longName, 50, -1, 600, "/static/products/phone.svg");
  const upcoming = await createSale(admin, `E2E pages ${runId}: opens soon`, 10, 30, 600);
  await call("POST", `/api/admin/sales/${upcoming}/stock`, admin.token, { set: 1234567 });
  const closedSale = await createSale(admin, `E2E pages ${runId}: closed early`, 5, -1, 600);
  await call("POST", `/api/admin/sales/${closedSale}/close`, admin.token);
  const pollId = (await createPoll(admin, `E2E pages ${runId}: which size?`, ["Small", "Large"])).id;
  const oneUnit = {};
  const toOpen = {};
  const tallyPoll = {};
  const paySale = {};
  const lateSale = {};
  const twoEach = {};
  const payName = (size) => `E2E pages ${runId}: pay within a minute (${size})`;
  for (const [size] of SIZES) {
    paySale[size] = await createSale(admin, payName(size), 5, -1, 600, null, { payment_window_s: 60 });
    lateSale[size] = await createSale(admin, `E2E pages ${runId}: left unpaid (${size})`, 5, -1, 600, null, { payment_window_s: 1 });
    oneUnit[size] = await createSale(admin, `E2E pages ${runId}: last unit (${size})`, 1, -1, 600);
    twoEach[size] = await createSale(admin, `E2E pages ${runId}: up to two each (${size})`, 10, -1, 600, "/static/products/earbuds.svg", { max_per_user: 2 });
    toOpen[size] = await createSale(admin, `E2E pages ${runId}: opened early (${size})`, 10, 30, 600);
    tallyPoll[size] = await createPoll(admin, `E2E pages ${runId}: tea or coffee (${size})?`, ["Tea", "Coffee"]);
  }

  // ---- signed out ----
  for (const [, viewport] of SIZES) {
    const page = await newPage(viewport);
    await goto(page, "/");
    const card = page.locator(`.sale-card[data-sale-id="${upcoming}"]`);
    await card.locator('[data-field="when"]').filter({ hasText: /Opens in \d\d:\d\d/ }).waitFor({ timeout: 5000 });
    check(true, "an upcoming card counts down to its opening");
    check((await card.locator('[data-field="stock-left"]').innerText()) === "1,234,567", "stock numbers are grouped on cards");
    await inspect(page, "home-anonymous");
    // Pictures: the sale's own, or the placeholder; both load (they load lazily:
    // brought into view, each gets a few seconds).
    const loaded = async (img) => {
      await img.scrollIntoViewIfNeeded();
      return page
        .waitForFunction((el) => el.complete && el.naturalWidth > 0, await img.elementHandle(), { timeout: 5000 })
        .then(() => true, () => false);
    };
    const ownPicture = page.locator(`.sale-card[data-sale-id="${liveSale}"] img.card-picture`);
    const placeholder = card.locator("img.card-picture");
    check(
      (await ownPicture.getAttribute("src")) === "/static/products/phone.svg" && (await loaded(ownPicture)),
      "a card shows its sale's picture",
    );
    check(
      (await placeholder.getAttribute("src")) === "/static/products/placeholder.svg" && (await loaded(placeholder)),
      "a card without a picture shows the placeholder",
    );

    await goto(page, `/sales/${liveSale}`);
    const picture = page.locator(".sale-picture img");
    check((await picture.getAttribute("alt")) === longName && (await loaded(picture)), "the sale page shows the picture, named for screen readers");
    const signInToBuy = page.getByRole("link", { name: "Sign in to buy" });
    check(await signInToBuy.isVisible(), "signed out, the main button is Sign in to buy");
    check(await inViewport(signInToBuy), `Sign in to buy is on screen without scrolling at ${viewport.width}x${viewport.height}`);
    check((await signInToBuy.getAttribute("href")) === `/signin?next=%2Fsales%2F${liveSale}`, "Sign in to buy returns to the sale");
    check((await page.getByRole("button", { name: "Buy now" }).count()) === 0 || !(await page.getByRole("button", { name: "Buy now" }).isVisible()), "no dead Buy button when signed out");
    await inspect(page, "sale-anonymous");
    await goto(page, `/sales/${upcoming}`);
    await inspect(page, "sale-upcoming");
    await goto(page, `/sales/${closedSale}`);
    check(await page.getByText("Closed by the shop").isVisible(), "a closed sale says so in its facts");
    await inspect(page, "sale-closed");
    await goto(page, "/polls");
    await inspect(page, "polls");
    await goto(page, `/polls/${pollId}`);
    await inspect(page, "poll-anonymous");
    await goto(page, "/signin");
    await inspect(page, "signin");
    await goto(page, "/no-such-page");
    await inspect(page, "not-found");
    await page.context().close();
  }

  // `next` survives the header's Sign up and the sign-up itself; then the new
  // shopper buys, and sees the signed-in pages.
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const page = await newPage(viewport);
    await goto(page, `/sales/${liveSale}`);
    const header = page.getByRole("navigation", { name: "Account" });
    check((await header.getByRole("link", { name: "Sign up" }).getAttribute("href")) === `/signup?next=%2Fsales%2F${liveSale}`, `the header's Sign up keeps the way back ${at}`);
    await header.getByRole("link", { name: "Sign up" }).click();
    await page.waitForURL(/\/signup\?next=/);
    // Every problem at once, under its field, fields marked; fixed ones clear.
    await page.getByLabel("Username").fill("x");
    await page.getByLabel("Password").fill("short");
    await page.getByRole("button", { name: "Sign up" }).click();
    await page.locator("#username-error").filter({ hasText: /3 to 32/ }).waitFor({ timeout: 3000 });
    check(await page.locator("#password-error").filter({ hasText: /at least 8/ }).isVisible(), `sign-up shows both errors at once ${at}`);
    check((await page.getByLabel("Username").getAttribute("aria-invalid")) === "true", `the bad username is marked ${at}`);
    await inspect(page, "signup-errors");
    const name = `e2ep-${runId}-${size}`;
    await page.getByLabel("Username").fill(name);
    check((await page.locator("#username-error").innerText()) === "", `the username's error clears once fixed ${at}`);
    check((await page.getByLabel("Username").getAttribute("aria-invalid")) === null, `the fixed username is no longer marked ${at}`);
    await page.getByLabel("Password").fill(demoPassword);
    check((await page.locator("#password-error").innerText()) === "", `the password's error clears once fixed ${at}`);
    await Promise.all([page.waitForURL(`${base}/sales/${liveSale}`), page.getByRole("button", { name: "Sign up" }).click()]);
    check(true, `sign-up from the header returns to the sale ${at}`);
    const buy = page.getByRole("button", { name: "Buy now" });
    await buy.waitFor({ timeout: 5000 });
    check(await inViewport(buy), `Buy is on screen without scrolling, even under a two-line name, ${at}`);
    await inspect(page, "sale-live");
    // A page opened before the CSRF token was bound to the session holds a
    // token of the old kind: its first change is refused, the refusal sets the
    // cookie right, and the page sends it again (static/js/api.js).
    await page.evaluate(() => {
      document.cookie = "stampede_csrf=0123456789abcdef0123456789abcdef; path=/; samesite=strict";
    });
    await buy.click();
    const outcome = page.locator('[data-field="outcome"]');
    await outcome.filter({ hasText: /Order placed|Order confirmed/ }).waitFor({ timeout: 5000 });
    check(await outcome.evaluate((el) => el === document.activeElement), `after Buy the focus is on the answer, not the page, ${at}`);
    // The answer scrolls into view (smoothly, so wait for it to get there).
    const seen = await page
      .waitForFunction(isInViewport, await outcome.elementHandle(), { timeout: 3000 })
      .then(() => true, () => false);
    check(seen, `the answer to Buy is scrolled into view ${at}`);
    await outcome.filter({ hasText: "Order confirmed" }).waitFor({ timeout: 20000 });
    await inspect(page, "sale-bought");
    await goto(page, "/");
    const account = page.getByRole("navigation", { name: "Account" });
    check(
      (await account.getByRole("link", { name: "My orders" }).isVisible()) && (await account.getByRole("link", { name: "Sign up" }).count()) === 0,
      `the home page shows the new shopper signed in ${at}`,
    );
    await inspect(page, "home-signed-in");
    await goto(page, "/me/orders");
    await page.getByRole("link", { name: longName }).waitFor();
    check(await page.getByText("Confirmed", { exact: true }).first().isVisible(), `My orders shows the order's status ${at}`);
    await inspect(page, "my-orders");
    // A shopper at the admin page gets the 403 page.
    const denied = await page.goto(`${base}/admin`);
    check(denied.status() === 403, `a shopper gets 403 at /admin ${at}`);
    await inspect(page, "forbidden");
    await page.context().close();
  }

  // Sold out, then a top-up: the message goes and Buy comes back, without a
  // reload; after a close nothing stale stays.
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const sale = oneUnit[size];
    const taken = await buyApi(sale, bob.token);
    check(taken.status === 202, `bob takes the last unit (${size})`);
    const page = await newPage(viewport, alice);
    // The page follows the sale over its event stream: no polling of the sale.
    const asked = { polls: 0, streams: 0 };
    page.on("request", (r) => {
      const path = new URL(r.url()).pathname;
      if (path === `/api/sales/${sale}`) asked.polls += 1;
      if (path === `/api/sales/${sale}/events`) asked.streams += 1;
    });
    const followedSince = Date.now();
    await goto(page, `/sales/${sale}`);
    const button = page.locator('[data-action="buy"]');
    check((await button.innerText()) === "Sold out", `a sold-out sale's button says so ${at}`);
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { add: 1 });
    await page.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 6000 });
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { set: 0 });
    await page.getByRole("button", { name: "Sold out" }).waitFor({ timeout: 6000 });
    // Now the refusal itself: a stale page presses Buy just after the last unit went.
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { add: 1 });
    await page.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 6000 });
    const carol = await signUpApi(`e2ep-${runId}-c-${size}`);
    const last = await buyApi(sale, carol.token);
    check(last.status === 202, `carol takes the topped-up unit (${size})`);
    await page.getByRole("button", { name: "Buy now" }).click();
    const outcome = page.locator('[data-field="outcome"]');
    await outcome.filter({ hasText: "Sold out" }).waitFor({ timeout: 5000 });
    check(await page.getByText("Better luck next time").isVisible(), `the refusal says sold out ${at}`);
    await inspect(page, "sale-sold-out");
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { add: 2 });
    await page.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 6000 });
    check((await outcome.innerText()).trim() === "", `after a top-up the sold-out message is gone and Buy is back ${at}`);
    await call("POST", `/api/admin/sales/${sale}/close`, admin.token);
    await page.getByRole("button", { name: "Sale closed" }).waitFor({ timeout: 6000 });
    check(!(await page.getByText("Better luck next time").isVisible()), `after a close no sold-out message stays ${at}`);
    check((await outcome.innerText()).trim() === "", `after a close the answer box is empty ${at}`);
    check(
      (await page.locator('[data-field="badge"]').innerText()) === "Closed" && (await page.getByText("Closed by the shop").isVisible()),
      `after a close the badge and the facts say closed ${at}`,
    );
    await inspect(page, "sale-closed-live");
    const followedFor = Math.round((Date.now() - followedSince) / 1000);
    // One read after pressing Buy is the page's own; polling every 2 s would be many.
    check(
      asked.streams >= 1 && asked.polls <= 1,
      `the sale page followed ${followedFor} s of changes over its event stream (${asked.streams} stream, ${asked.polls} reads of the sale) ${at}`,
    );
    await page.context().close();
  }

  // A sale of up to two per customer: the page offers a quantity; 2 chosen, Buy
  // takes two units. A page of the same shopper opened before (another tab) then
  // asks for one more: the shop's per-customer refusal, in the answer box.
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const sale = twoEach[size];
    const shopper = await signUpApi(`e2ep-${runId}-q-${size}`);
    const page = await newPage(viewport, shopper);
    const other = await newPage(viewport, shopper);
    await goto(page, `/sales/${sale}`);
    await goto(other, `/sales/${sale}`);
    const quantity = page.getByLabel("Quantity");
    const buy = page.getByRole("button", { name: "Buy now" });
    await buy.waitFor({ timeout: 5000 });
    const choices = await quantity.locator("option").evaluateAll((options) => options.map((o) => o.value).join(","));
    check((await quantity.isVisible()) && choices === "1,2", `a sale of two per customer offers a quantity of 1 or 2 (${choices}) ${at}`);
    check(await page.locator(".buy-limit").filter({ hasText: /^Up to 2 per customer$/ }).isVisible(), `the buy box says up to 2 per customer ${at}`);
    check((await inViewport(quantity)) && (await inViewport(buy)), `the quantity and Buy are on screen without scrolling ${at}`);
    const box = async (locator) => locator.evaluate((el) => el.getBoundingClientRect().toJSON());
    const [q, b] = [await box(quantity), await box(buy)];
    check(Math.abs(q.bottom - b.bottom) <= 2 && q.right < b.left, `the quantity sits next to Buy, level with it ${at}`);
    await inspect(page, "sale-quantity");
    const stockOf = async () => (await call("GET", `/api/sales/${sale}`)).data.stock_left;
    const before = await stockOf();
    const sent = [];
    page.on("request", (r) => {
      if (r.method() === "POST" && new URL(r.url()).pathname === `/api/sales/${sale}/purchase`) sent.push(r.postDataJSON());
    });
    await quantity.selectOption("2");
    await buy.click();
    const outcome = page.locator('[data-field="outcome"]');
    await outcome.filter({ hasText: /Order for 2 placed|Order confirmed/ }).waitFor({ timeout: 5000 });
    check(sent.length === 1 && sent[0].quantity === 2 && typeof sent[0].ticket === "string", `Buy sends the quantity with its ticket (${JSON.stringify(sent.map((b) => b.quantity))}) ${at}`);
    const after = await stockOf();
    check(after === before - 2, `buying 2 takes two units (${before} -> ${after}) ${at}`);
    const button = page.locator('[data-action="buy"]');
    check((await button.innerText()) === "You have 2" && (await button.isDisabled()) && (await quantity.isDisabled()), `with 2 of 2 held the page offers no more ${at}`);
    const held = await page.locator('[data-field="held-note"]').innerText();
    check(held === "You have 2 from this sale, the most one customer may buy.", `the page says what the buyer holds (${held}) ${at}`);
    await outcome.filter({ hasText: "Order confirmed" }).waitFor({ timeout: 20000 });
    await inspect(page, "sale-quantity-bought");

    // The other tab still offers Buy: one more passes the limit.
    await other.getByRole("button", { name: "Buy now" }).click();
    const refusal = other.locator('[data-field="outcome"]');
    await refusal.filter({ hasText: "limit per customer" }).waitFor({ timeout: 5000 });
    check(/2 of your units count toward it already/.test(await refusal.innerText()), `one more shows the per-customer refusal with what the buyer holds ${at}`);
    check(await refusal.evaluate((el) => el === document.activeElement), `the refusal has the focus ${at}`);
    check((await stockOf()) === after, `the refused purchase took nothing ${at}`);
    await inspect(other, "sale-quantity-limit");
    // My orders: the order of two says so, at the price of both.
    await goto(page, "/me/orders");
    const line = page.locator("tr", { has: page.getByRole("link", { name: `E2E pages ${runId}: up to two each (${size})` }) });
    await line.waitFor({ timeout: 20000 });
    check(
      (await line.locator(".order-qty").innerText()).replace(/\s+/g, " ").startsWith("2 ×") && (await line.getByText("$2,598.00").isVisible()),
      `My orders shows the order's 2 units and their price ${at}`,
    );
    await inspect(page, "my-orders-quantity");
    await page.context().close();
    await other.context().close();
  }

  // A sale with a payment window: buy, see the deadline count down on My orders,
  // pay. An order of a one-second window is left to expire.
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const shopper = await signUpApi(`e2ep-${runId}-p-${size}`);
    const late = await buyApi(lateSale[size], shopper.token);
    const lateAt = Date.now();
    check(late.status === 202, `the shopper buys in the one-second sale (${size})`);
    const page = await newPage(viewport, shopper);
    const payRequests = [];
    page.on("request", (r) => {
      if (r.method() === "POST" && /^\/api\/orders\/[^/]+\/pay$/.test(new URL(r.url()).pathname)) payRequests.push(r.headers()["idempotency-key"]);
    });
    await goto(page, `/sales/${paySale[size]}`);
    check(await page.getByText("Within 1 minute of ordering").isVisible(), `the sale page says how long there is to pay ${at}`);
    await page.getByRole("button", { name: "Buy now" }).click();
    const outcome = page.locator('[data-field="outcome"]');
    // "Order placed — pay within 1 minute", then "Order confirmed — pay by ...".
    await outcome.filter({ hasText: /(pay within 1 minute|pay by .+) on My orders/ }).waitFor({ timeout: 5000 });
    check(true, `after Buy the sale page says to pay on My orders ${at}`);
    const toOrders = outcome.getByRole("link", { name: "Go to My orders" });
    check((await toOrders.getAttribute("href")) === "/me/orders", `the answer links to My orders ${at}`);
    await inspect(page, "sale-bought-pay");
    // The one-second order's deadline must be behind us before My orders is read
    // (on a fast run the steps above take less than that).
    await page.waitForTimeout(Math.max(0, 1500 - (Date.now() - lateAt)));
    await Promise.all([page.waitForURL(`${base}/me/orders`), toOrders.click()]);
    // A pending order reloads the page every 3 s until it is confirmed.
    const awaiting = page.locator('tr[data-payment="awaiting_payment"]', { hasText: "pay within" });
    await awaiting.waitFor({ timeout: 20000 });
    const orderId = await awaiting.getAttribute("data-order-id");
    const row = page.locator(`tr[data-order-id="${orderId}"]`);
    check(await row.getByText("Awaiting payment").isVisible(), `My orders says Awaiting payment ${at}`);
    const left = row.locator('[data-field="pay-left"]');
    const first = await left.innerText();
    await page.waitForTimeout(1300);
    const then = await left.innerText();
    check(/^0[01]:\d\d$/.test(first) && then < first, `the deadline counts down in mm:ss (${first} -> ${then}) ${at}`);
    check(
      await page.locator("tr", { hasText: "left unpaid" }).getByText("Not paid in time; the unit went back on sale.").isVisible(),
      `the order left unpaid shows Expired ${at}`,
    );
    await inspect(page, "my-orders-awaiting");
    const pay = page.getByRole("button", { name: `Pay for ${payName(size)}` });
    check(await pay.isVisible(), `the Pay button is named for its sale ${at}`);
    // Twice, quickly: the button is disabled while the payment is on its way.
    await pay.dblclick();
    const answer = page.locator('[data-field="pay-outcome"]');
    await answer.filter({ hasText: `$1,299.00 paid for “${payName(size)}”` }).waitFor({ timeout: 5000 });
    check(await row.locator(".badge-paid").isVisible(), `the order shows Paid in place ${at}`);
    check((await row.getByRole("button", { name: /^(Pay|Cancel)/ }).count()) === 0, `no Pay button is left on the paid order ${at}`);
    check(await answer.evaluate((el) => el === document.activeElement), `after Pay the focus is on the answer ${at}`);
    check(payRequests.length === 1 && /^[\w-]{16,}$/.test(payRequests[0] || ""), `one payment request, with an Idempotency-Key (${payRequests.length} sent) ${at}`);
    await inspect(page, "my-orders-paid");
    await goto(page, "/me/orders");
    check(await row.locator(".badge-paid").isVisible(), `after a reload the order is still Paid ${at}`);
    await page.context().close();
  }

  // The home page follows a sale without a reload.
  {
    const page = await newPage(DESKTOP);
    await goto(page, "/");
    const left = page.locator(`.sale-card[data-sale-id="${liveSale}"] [data-field="stock-left"]`);
    const before = await left.innerText();
    await call("POST", `/api/admin/sales/${liveSale}/stock`, admin.token, { set: 4321 });
    await left.filter({ hasText: /^4,321$/ }).waitFor({ timeout: 8000 });
    check(true, `a card's stock follows a change without a reload (${before} -> 4,321)`);
    await page.context().close();
  }

  // Keyboard focus on sale and poll cards is visible.
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const page = await newPage(viewport);
    for (const [path, selector, what] of [
      ["/", ".sale-card[data-sale-id]", "sale"],
      ["/polls", ".poll-card", "poll"],
    ]) {
      await goto(page, path);
      const { ok, ring } = await focusRingOnCard(page, selector);
      check(ok, `a focused ${what} card shows a focus ring ${at} (${ring.style} ${ring.width}px)`);
      await page.screenshot({ path: `${out}/pages-${what}-card-focus-${size}.png` });
    }
    await page.context().close();
  }

  // A poll closed early says so without a reload.
  {
    const page = await newPage(PHONE, alice);
    await goto(page, `/polls/${pollId}`);
    await page.getByLabel("Large").check();
    await page.getByRole("button", { name: "Vote" }).click();
    await page.getByText("Thanks, your vote counted").waitFor({ timeout: 5000 });
    await call("POST", `/api/admin/polls/${pollId}/close`, admin.token);
    await page.getByText("Closed early").waitFor({ timeout: 6000 });
    check(await page.getByText("Closed", { exact: true }).first().isVisible(), "after an early close the poll says Closed early");
    await inspect(page, "poll-closed-early");
    await page.context().close();
  }

  // A tab whose clock is past the closing time (asleep through it) when the admin
  // closes the poll early: its clock would say the poll ran out; the poll's
  // `closed_at` says it was closed early, and so does the page.
  {
    const late = await createPoll(admin, `E2E pages ${runId}: a tab asleep through the close?`, ["Tea", "Coffee"]);
    const page = await newPage(PHONE, alice);
    await goto(page, `/polls/${late.id}`);
    await page.clock.setFixedTime(new Date(Date.now() + 2 * 3600 * 1000));
    await call("POST", `/api/admin/polls/${late.id}/close`, admin.token);
    await page.getByText("Closed early").waitFor({ timeout: 8000 });
    check(await page.getByText("Closed early").isVisible(), "a tab past the closing time learns from closed_at that the poll was closed early");
    await page.context().close();
  }

  // A poll closed early whose results stay hidden from the reader (on_reveal):
  // the page learns of the close all the same (the hidden answer's `closed`), and
  // stops offering the vote.
  {
    const closing = await createPoll(admin, `E2E pages ${runId}: closed while hidden?`, ["Tea", "Coffee"], "on_reveal");
    const page = await newPage(PHONE, await signUpApi(`e2ep-${runId}-hc`));
    await goto(page, `/polls/${closing.id}`);
    const vote = page.getByRole("button", { name: "Vote" });
    check(!(await vote.isDisabled()), "a hidden poll's page offers the vote while open");
    await call("POST", `/api/admin/polls/${closing.id}/close`, admin.token);
    await page.getByText("Closed early").waitFor({ timeout: 6000 });
    check(!(await vote.isVisible()) || (await vote.isDisabled()), "a page with hidden results learns of an early close without a reload");
    await inspect(page, "poll-hidden-closed-early");
    await page.context().close();
  }

  // Hidden results (issue 51): plain words instead of numbers, until the vote, the
  // close or the reveal; a voter's page shows the tallies once the vote is in.
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const options = ["Tea", "Coffee"];
    const afterVote = await createPoll(admin, `E2E pages ${runId}: after vote ${size}?`, options, "after_vote");
    const afterClose = await createPoll(admin, `E2E pages ${runId}: after close ${size}?`, options, "after_close");
    const onReveal = await createPoll(admin, `E2E pages ${runId}: on reveal ${size}?`, options, "on_reveal");
    for (const poll of [afterVote, afterClose, onReveal]) {
      for (const i of [1, 2]) {
        const voter = await signUpApi(`e2ep-${runId}-h${i}-${poll.id}`);
        await call("POST", `/api/polls/${poll.id}/votes`, voter.token, { option_id: poll.options[i - 1].id });
      }
    }
    const hiddenShown = async (page, words, name) => {
      const note = page.locator('[data-field="results-hidden"]');
      check((await note.textContent()).trim() === words && (await note.isVisible()), `the poll says “${words}” ${at}`);
      check(!(await page.locator('[data-field="results"]').isVisible()), `no tallies on screen while hidden (${name}) ${at}`);
      check(!/\d+%/.test(await page.locator(".results-box").innerText()), `no percentage in the results box while hidden (${name}) ${at}`);
      await inspect(page, name);
    };
    const anonymous = await newPage(viewport);
    await goto(anonymous, `/polls/${afterVote.id}`);
    await hiddenShown(anonymous, "Results after you vote", "poll-hidden-after-vote");
    await goto(anonymous, `/polls/${afterClose.id}`);
    await hiddenShown(anonymous, "Results at the end of the vote", "poll-hidden-after-close");
    await call("POST", `/api/admin/polls/${onReveal.id}/close`, admin.token);
    await goto(anonymous, `/polls/${onReveal.id}`);
    await hiddenShown(anonymous, "Results when the organisers reveal them", "poll-hidden-on-reveal");
    await goto(anonymous, "/polls");
    const card = anonymous.locator(`a[href="/polls/${afterClose.id}"]`);
    check(await card.getByText("Results at the end of the vote").isVisible(), `the polls list says when a card's results show ${at}`);
    await inspect(anonymous, "polls-hidden-results");
    await anonymous.context().close();

    const voter = await newPage(viewport, await signUpApi(`e2ep-${runId}-hv-${size}`));
    await goto(voter, `/polls/${afterVote.id}`);
    await voter.getByLabel("Coffee").check();
    await voter.getByRole("button", { name: "Vote" }).click();
    await voter.locator('[data-field="results"]').waitFor({ state: "visible", timeout: 6000 });
    const coffee = voter.locator(`li[data-option-id="${afterVote.options[1].id}"] [data-field="votes"]`);
    await until("the voter's tallies", async () => (await coffee.textContent()).trim() === "2", 6000);
    check(!(await voter.locator('[data-field="results-hidden"]').isVisible()), `the voter's page drops the hidden note ${at}`);
    await inspect(voter, "poll-after-vote-voted");
    await voter.context().close();

    const adminPage = await newPage(viewport, admin);
    await goto(adminPage, `/admin/polls/${onReveal.id}`);
    check(await adminPage.locator('[data-field="live"]').first().isVisible(), `the admin sees the tallies of a hidden poll ${at}`);
    await inspect(adminPage, "admin-poll-reveal");
    await adminPage.getByRole("button", { name: "Reveal the results" }).click();
    await adminPage.getByText("Public since you revealed them").waitFor({ timeout: 8000 });
    check(await adminPage.locator('[data-field="history"]').getByText("Results revealed").isVisible(), `the history shows the reveal ${at}`);
    await goto(adminPage, `/polls/${onReveal.id}`);
    check(await adminPage.locator('[data-field="results"]').isVisible(), `a revealed poll shows its tallies ${at}`);
    await adminPage.context().close();
  }

  // ---- the admin ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const page = await newPage(viewport, admin);
    // Every refresh of the sales table the page asks for.
    let refreshes = 0;
    page.on("requestfinished", (r) => {
      if (r.method() === "GET" && new URL(r.url()).pathname === "/api/admin/sales") refreshes += 1;
    });
    // A rehearsal (as `stampede load` makes them), which the cleanup below removes.
    const rehearsal = await createSale(admin, `E2E pages ${runId}: rehearsal (${size})`, 5, -1, 600, null, { rehearsal: true });
    await goto(page, "/admin");
    const row = (id) => page.locator(`tr[data-sale-id="${id}"]`);
    // The sale-day console comes first, with the day's numbers and buttons; on a
    // phone its heading and first sale are on the first screen.
    const consoleRow = (id) => page.locator(`tr[data-console-sale="${id}"]`);
    check((await page.locator("main section.panel h2").first().innerText()) === "Sale day", `the admin page opens on the sale-day console ${at}`);
    check(await inViewport(page.getByRole("heading", { name: "Sale day" })), `the console's heading is on the first screen ${at}`);
    check(
      await consoleRow(liveSale).getByRole("button", { name: "Close" }).isVisible() && (await consoleRow(upcoming).getByRole("button", { name: "Open now" }).isVisible()),
      `the console offers Close on a live sale and Open now on an upcoming one ${at}`,
    );
    check(!(await consoleRow(closedSale).count()), `a closed sale is not on the console ${at}`);
    check((await consoleRow(liveSale).locator('[data-field="revenue"]').innerText()).startsWith("$"), `the console shows the revenue paid ${at}`);
    check(!(await page.getByLabel("Name", { exact: true }).isVisible()), `the new-sale form waits behind its button ${at}`);
    check(!(await page.getByLabel("Question", { exact: true }).isVisible()), `the new-poll form waits behind its button ${at}`);
    // The one signed in, named in the header at both sizes.
    const who = page.locator('[data-field="who"] strong');
    check((await who.isVisible()) && (await who.innerText()) === adminUser, `the header names who is signed in ${at}`);
    await inspect(page, "admin-console");
    // Top up from the console: the units left follow without a reload.
    const leftBefore = Number((await consoleRow(liveSale).locator('[data-field="stock-left"]').innerText()).replace(/,/g, ""));
    await consoleRow(liveSale).getByLabel(/^Units to add to /).fill("3");
    await consoleRow(liveSale).getByRole("button", { name: "Top up" }).click();
    await page.locator('[data-field="console-message"]').filter({ hasText: "Added 3" }).waitFor({ timeout: 5000 });
    const leftAfter = Number((await consoleRow(liveSale).locator('[data-field="stock-left"]').innerText()).replace(/,/g, ""));
    check(leftAfter === leftBefore + 3, `Top up on the console adds to the units left (${leftBefore} -> ${leftAfter}) ${at}`);
    // Remove rehearsals: their rows go at once, and the count is of users alone.
    check(await row(rehearsal).isVisible() && (await consoleRow(rehearsal).isVisible()), `the rehearsal is listed before the cleanup ${at}`);
    await page.getByRole("button", { name: "Remove rehearsals" }).click();
    const cleaned = page.locator('[data-field="rehearsals-message"]');
    await cleaned.filter({ hasText: "Removed" }).waitFor({ timeout: 10000 });
    check(/^Removed 1 rehearsal sale, 0 orders and 0 users\.$/.test(await cleaned.innerText()), `the cleanup says what it removed (${await cleaned.innerText()}) ${at}`);
    check(!(await row(rehearsal).count()) && !(await consoleRow(rehearsal).count()), `the removed rehearsal's rows go without a reload ${at}`);
    await page.waitForTimeout(3500);
    check(!(await row(rehearsal).count()) && !(await consoleRow(rehearsal).count()), `a refresh does not bring the removed rows back ${at}`);
    await page.getByText("New sale", { exact: true }).click();
    check(await page.getByLabel("Name", { exact: true }).isVisible(), `New sale opens the form ${at}`);
    // The date fields name the zone they are read in (Berlin: GMT+1, or +2 in summer).
    check(await page.getByLabel(/^Opens \(your local time, GMT\+[12]\)$/).isVisible(), `the date fields name the time zone ${at}`);
    const closedRow = row(closedSale);
    check(!(await closedRow.getByRole("button", { name: "Close" }).isVisible()), `a closed sale offers no Close ${at}`);
    check(await closedRow.getByRole("button", { name: "Reopen now" }).isVisible(), `a closed sale offers Reopen now ${at}`);
    check(!(await row(liveSale).getByRole("button", { name: "Open now" }).isVisible()), `a live sale offers no Open now ${at}`);
    check(await page.getByText("makes the units left equal").isVisible(), `the page says Set stock sets units left ${at}`);
    await inspect(page, "admin");
    // The poll form, too, behind its button (the checks below fill it).
    await page.getByText("New poll", { exact: true }).click();

    // A shopper has the upcoming sale open; the admin opens it now: the admin's rows
    // stay where they were, and the shopper's page says it opened, without a reload.
    const shopper = await newPage(viewport, alice);
    await goto(shopper, `/sales/${toOpen[size]}`);
    const startsLabel = shopper.locator('[data-field="starts-label"]');
    const starts = shopper.locator('[data-field="starts"]');
    check((await startsLabel.textContent()) === "Opens", `the shopper's page says when it opens ${at}`);
    const opensAt = Date.parse(await starts.getAttribute("datetime"));
    const order = () => page.locator('[data-field="admin-rows"] tr').evaluateAll((rows) => rows.map((r) => r.dataset.saleId).join(","));
    const before = await order();
    const clickedAt = Date.now();
    await row(toOpen[size]).getByRole("button", { name: "Open now" }).click();
    await page.getByText("is open.").waitFor({ timeout: 5000 });
    check((await order()) === before, `rows keep their place after Open now ${at}`);
    // Two refreshes after the click: the first has surely been applied by the time
    // the second is asked for (the page asks again only after it is done).
    const seen = refreshes;
    await until("two refreshes of the admin table", () => refreshes >= seen + 2, 15000);
    check((await order()) === before, `rows keep their place after a refresh ${at}`);
    await startsLabel.filter({ hasText: /^Opened$/i }).waitFor({ timeout: 6000 });
    const openedAt = Date.parse(await starts.getAttribute("datetime"));
    check(
      openedAt < opensAt && Math.abs(openedAt - clickedAt) < 60000,
      `the shopper's page shows the new opening time without a reload ${at} (${new Date(opensAt).toISOString()} -> ${new Date(openedAt).toISOString()})`,
    );
    check(
      (await starts.innerText()) !== "" && (await shopper.locator('[data-field="countdown"]').isHidden()),
      `the shopper's countdown is gone ${at}`,
    );
    await shopper.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 6000 });
    check(true, `the shopper's Buy comes alive ${at}`);
    await inspect(shopper, "sale-opened-early");
    await shopper.context().close();

    // Field errors in plain words, cleared when fixed: the sale form...
    await page.getByLabel(/^Ends \(your local time/).fill("2020-01-01T10:00");
    await page.getByRole("button", { name: "Create sale" }).click();
    await page.locator("#sale-name-error").filter({ hasText: "Give the sale a name." }).waitFor({ timeout: 3000 });
    check(await page.locator("#sale-ends-error").filter({ hasText: "in the past" }).isVisible(), `the end in the past is said in plain words ${at}`);
    check((await page.getByLabel("Name", { exact: true }).getAttribute("aria-invalid")) === "true", `the empty name is marked ${at}`);
    check(await page.getByLabel("Name", { exact: true }).evaluate((el) => el === document.activeElement), `the focus goes to the first bad field ${at}`);
    await page.getByLabel("Name", { exact: true }).fill("Something");
    check((await page.locator("#sale-name-error").innerText()) === "", `the name's error clears once fixed ${at}`);
    // ...and the poll form: a repeated option, in plain words, without API wording.
    await page.getByLabel("Option 1", { exact: true }).fill("Tea");
    await page.getByLabel("Option 2", { exact: true }).fill("tea");
    await page.getByRole("button", { name: "Create poll" }).click();
    const optionsError = page.locator("#poll-options-error");
    await optionsError.filter({ hasText: "“tea” is listed more than once: make each option different." }).waitFor({ timeout: 3000 });
    check(await page.locator("#poll-question-error").filter({ hasText: "Write the question." }).isVisible(), `the missing question is said in plain words ${at}`);
    check(!/distinct|must be|options_|invalid/i.test(await optionsError.innerText()), `the options' message has no API wording ${at}`);
    check((await page.getByLabel("Option 2", { exact: true }).getAttribute("aria-invalid")) === "true", `the repeated option is marked ${at}`);
    await inspect(page, "admin-form-errors");
    // The whole admin page is long on a phone: the poll form on its own as well.
    await page.locator('form[data-form="create-poll"]').screenshot({ path: `${out}/pages-admin-poll-form-errors-${size}.png` });
    await page.getByLabel("Option 2", { exact: true }).fill("Coffee");
    check((await optionsError.innerText()) === "", `the options' message clears once fixed ${at}`);
    check((await page.getByLabel("Option 2", { exact: true }).getAttribute("aria-invalid")) === null, `the fixed option is no longer marked ${at}`);

    // A sale with a payment window, made in the form (a fresh form: default times).
    await goto(page, "/admin");
    await page.getByText("New sale", { exact: true }).click();
    const formName = `E2E pages ${runId}: made with a payment window (${size})`;
    const windowField = page.getByLabel("Payment window (seconds, 0 = none)");
    check((await windowField.inputValue()) === "0", `the payment window starts at 0 ${at}`);
    const perUserField = page.getByLabel("Most per customer");
    check((await perUserField.inputValue()) === "1", `most per customer starts at 1 ${at}`);
    await page.getByLabel("Name", { exact: true }).fill(formName);
    await page.getByLabel("Price", { exact: true }).fill("19.99");
    await page.getByLabel("Stock", { exact: true }).fill("3");
    await windowField.fill("90000");
    await perUserField.fill("101");
    await page.getByRole("button", { name: "Create sale" }).click();
    const windowError = page.locator("#sale-payment-window-error");
    await windowError.filter({ hasText: "86,400" }).waitFor({ timeout: 3000 });
    check((await windowField.getAttribute("aria-invalid")) === "true", `a too long payment window is marked by its field ${at}`);
    const perUserError = page.locator("#sale-max-per-user-error");
    check(
      (await perUserError.innerText()) === "Enter a whole number from 1 to 100." && (await perUserField.getAttribute("aria-invalid")) === "true",
      `most per customer above 100 is said and marked by its field ${at}`,
    );
    await inspect(page, "admin-form-payment-error");
    await page.locator('form[data-form="create-sale"]').screenshot({ path: `${out}/pages-admin-sale-form-payment-error-${size}.png` });
    await windowField.fill("45");
    check((await windowError.innerText()) === "", `the payment window's error clears once fixed ${at}`);
    await perUserField.fill("3");
    check((await perUserError.innerText()) === "", `the per-customer error clears once fixed ${at}`);
    await page.getByLabel("Buyers whose order expires or is cancelled may buy again").check();
    await page.getByRole("button", { name: "Create sale" }).click();
    const created = page.locator('[data-field="create-message"]');
    await created.filter({ hasText: formName }).waitFor({ timeout: 5000 });
    const createdId = /\(#(\d+)\)/.exec(await created.innerText())?.[1];
    const made = await call("GET", `/api/sales/${createdId}`);
    check(
      made.status === 200 && made.data.payment_window_s === 45 && made.data.rebuy_after_expiry === true && made.data.max_per_user === 3,
      `the form creates the sale with the payment window and most per customer typed in (${made.data?.payment_window_s} s, rebuy ${made.data?.rebuy_after_expiry}, ${made.data?.max_per_user} each) ${at}`,
    );
    check((await windowField.inputValue()) === "0" && (await perUserField.inputValue()) === "1", `the form is ready for the next sale ${at}`);
    await page.context().close();
  }

  // The orders page lists the buyers; the tallies page follows votes live.
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const page = await newPage(viewport, admin);
    await goto(page, `/admin/sales/${oneUnit[size]}/orders`);
    const table = page.locator('[data-field="orders"]');
    await table.waitFor();
    for (const buyer of ["bob", `e2ep-${runId}-c-${size}`]) {
      check(await table.getByText(buyer, { exact: true }).isVisible(), `the orders page lists the buyer ${buyer} ${at}`);
    }
    await inspect(page, "admin-orders");

    await goto(page, `/admin/sales/${paySale[size]}/orders`);
    const counts = page.locator(".unit-counts");
    check((await counts.locator('[data-field="units-paid"]').innerText()) === "1", `the orders page counts the payment ${at}`);
    check(await page.locator('[data-field="orders"] .badge-paid').isVisible(), `the paid order's row says Paid ${at}`);
    await inspect(page, "admin-orders-payment");

    const poll = tallyPoll[size];
    await goto(page, `/admin/polls/${poll.id}`);
    const tallies = page.locator('[data-field="tallies"]');
    check(await tallies.getByText("Coffee").isVisible(), `the tallies page lists the options ${at}`);
    check(!(await page.getByText(/reload/i).count()), `the tallies page asks for no reload ${at}`);
    const coffee = tallies.locator("tr", { hasText: "Coffee" });
    check((await coffee.locator('[data-field="live"]').innerText()) === "0", `no votes yet ${at}`);
    // A vote cast elsewhere shows up, live and then settled, without a reload.
    const voter = await signUpApi(`e2ep-${runId}-v-${size}`);
    const option = poll.options.find((o) => o.label === "Coffee").id;
    const voted = await call("POST", `/api/polls/${poll.id}/votes`, voter.token, { option_id: option });
    check(voted.status === 202, `the vote counts (${size})`);
    await coffee.locator('[data-field="live"]').filter({ hasText: /^1$/ }).waitFor({ timeout: 8000 });
    check((await coffee.locator('[data-field="percent"]').innerText()) === "100%", `the share follows ${at}`);
    check((await page.locator('[data-field="live-voters"]').innerText()) === "1", `the live voter count follows ${at}`);
    await coffee.locator('[data-field="settled"]').filter({ hasText: /^1$/ }).waitFor({ timeout: 10000 });
    await page.locator('[data-field="settled-voters"]').filter({ hasText: /^1$/ }).waitFor({ timeout: 5000 });
    check((await coffee.locator('[data-field="unsettled"]').innerText()) === "0", `the settled count follows too ${at}`);
    await inspect(page, "admin-poll");
    await page.context().close();
  }

  // ---- a sale's whole life: the edit form, archive and the admin's tabs ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const page = await newPage(viewport, admin);
    const name = `E2E pages ${runId}: to edit (${size})`;
    const drill = await createSale(admin, `E2E pages ${runId}: a rehearsal's page (${size})`, 5, 60, 180, null, { rehearsal: true });
    await goto(page, `/admin/sales/${drill}`);
    check(await page.locator('[data-field="rehearsal"]').filter({ hasText: "Rehearsal" }).isVisible(), `a rehearsal's page shows its badge ${at}`);
    const opened = page.locator('[data-field="sale-controls"]');
    await opened.getByRole("button", { name: "Open now" }).click();
    await page.locator('[data-field="controls-message"]').filter({ hasText: "is open." }).waitFor({ timeout: 5000 });
    check((await page.locator('[data-field="badge"]').first().innerText()) === "Live" && (await opened.getByRole("button", { name: "Close" }).isVisible()), `Open now on a sale's page opens it there and offers Close ${at}`);
    await inspect(page, "admin-sale-rehearsal");
    await call("POST", "/api/admin/rehearsals/cleanup", admin.token);
    const id = await createSale(admin, name, 5, 60, 180);
    const watcher = await newPage(viewport);
    await goto(watcher, `/sales/${id}`);
    await goto(page, `/admin/sales/${id}`);
    check(!(await page.getByLabel("Price", { exact: true }).isDisabled()), `before the opening the price can change ${at}`);
    await page.getByLabel("Name", { exact: true }).fill(`${name}, renamed`);
    await page.getByLabel("Price", { exact: true }).fill("12.50");
    await page.getByRole("button", { name: "Save changes" }).click();
    await page.locator('[data-field="history"]').getByText("Edited").waitFor({ timeout: 8000 });
    const edited = await call("GET", `/api/sales/${id}`);
    check(
      edited.data.name === `${name}, renamed` && edited.data.price_cents === 1250,
      `the form edits the sale (${edited.data.name}, ${edited.data.price_cents}) ${at}`,
    );
    check(await page.locator('[data-field="history"]').getByText("price_cents: 129900 → 1250").isVisible(), `the history shows the price before and after ${at}`);
    // A shopper's open page shows the edit without a reload, within a second or so.
    const savedAt = Date.now();
    await watcher.locator('h1[data-field="name"]').filter({ hasText: "renamed" }).waitFor({ timeout: 5000 });
    const price = await watcher.locator('[data-field="price"]').innerText();
    check(price === "$12.50", `the open sale page shows the new name and price (${price}) ${Date.now() - savedAt} ms after the save was seen ${at}`);
    await watcher.context().close();
    await inspect(page, "admin-sale-edit");

    await page.getByRole("button", { name: "Archive" }).click();
    await page.getByRole("button", { name: "Put back on the shop" }).waitFor({ timeout: 8000 });
    const listed = await call("GET", "/api/sales?limit=200");
    check(!listed.data.some((s) => s.id === id), `an archived sale is off the public list ${at}`);
    await goto(page, "/admin?sales=archived#sales-heading");
    check(await page.locator(`tr[data-sale-id="${id}"]`).isVisible(), `the Archived tab lists it ${at}`);
    check((await page.getByRole("navigation", { name: "Which sales" }).getByRole("link", { name: "Archived" }).getAttribute("aria-current")) === "page", `the Archived tab is marked current ${at}`);
    await inspect(page, "admin-archived");
    await goto(page, "/admin#sales-heading");
    check(!(await page.locator(`tr[data-sale-id="${id}"]`).count()), `the All tab leaves it out ${at}`);

    // An open sale: what buyers were promised is fixed.
    await goto(page, `/admin/sales/${liveSale}`);
    // Its buttons of the day, beside its numbers.
    const controls = page.locator('[data-field="sale-controls"]');
    check(
      (await controls.getByRole("button", { name: "Close" }).isVisible()) && (await controls.getByRole("button", { name: "Top up" }).isVisible()) && !(await controls.getByRole("button", { name: "Open now" }).isVisible()),
      `a live sale's page offers Close and Top up ${at}`,
    );
    check(!(await page.locator('[data-field="rehearsal"]').count()), `a real sale has no Rehearsal badge ${at}`);
    check(await page.getByLabel("Price", { exact: true }).isDisabled(), `once open the price is fixed ${at}`);
    check(!(await page.getByLabel("Name", { exact: true }).isDisabled()), `once open the name can still change ${at}`);
    await inspect(page, "admin-sale-open");
    await page.context().close();
  }

  // ---- cancel: the buyer in My orders, the admin on a sale's orders ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const name = `E2E pages ${runId}: to cancel (${size})`;
    const sale = await createSale(admin, name, 5, -1, 600, null, { payment_window_s: 600 });
    const settled = async (token, orderId) =>
      until(`order ${orderId} confirmed`, async () => (await call("GET", `/api/orders/${orderId}`, token)).data?.status === "confirmed", 15000);
    const buyer = await signUpApi(`e2ep-${runId}-k-${size}`);
    const bought = await buyApi(sale, buyer.token);
    check(bought.status === 202, `the buyer's purchase is accepted (${bought.status}) ${at}`);
    await settled(buyer.token, bought.data.order_id);
    const page = await newPage(viewport, buyer);
    const asked = [];
    page.on("dialog", (dialog) => asked.push(dialog.message()));
    await goto(page, "/me/orders");
    const row = page.locator(`tr[data-order-id="${bought.data.order_id}"]`);
    await row.getByRole("button", { name: /Cancel order/ }).click();
    await row.locator(".badge", { hasText: "Cancelled" }).waitFor({ timeout: 8000 });
    // Before the cancel, the dialog said what it means; after, the row and the sale say it.
    const rule = "This sale allows one purchase per customer, cancelled or not";
    check(asked.some((m) => m.includes("goes back on sale") && m.includes(rule)), `the cancel dialog says the buyer cannot buy again (${JSON.stringify(asked)}) ${at}`);
    check(await row.getByText(rule).isVisible(), `the cancelled row says the rule ${at}`);
    const view = (await call("GET", `/api/sales/${sale}`)).data;
    check(view.stock_left === 5 && view.stock_total === 5 && view.sold === 0, `the buyer's cancel gives the unit back and the offer stays 5 (${view.stock_left} of ${view.stock_total} left, ${view.sold} sold) ${at}`);
    await inspect(page, "orders-cancelled");
    await goto(page, `/sales/${sale}`);
    check(await page.getByText("You cancelled your order.").isVisible(), `the sale page says the buyer cancelled ${at}`);
    check(await page.getByText(rule).isVisible(), `the sale page says one purchase per customer, cancelled or not ${at}`);
    check((await page.locator('[data-field="stock-total"]').textContent()).trim() === "5", `the sale page offers 5, not 6 ${at}`);
    check((await page.locator('[data-action="buy"]').textContent()).includes("One per customer"), `Buy reads "One per customer" ${at}`);
    await inspect(page, "sale-after-cancel");
    await page.context().close();

    // On the admin's page: two orders awaiting payment (each with its Cancel
    // button, the widest status cell) and one paid (Cancel and refund), at $1,299.00.
    const other = await signUpApi(`e2ep-${runId}-l-${size}`);
    const second = await buyApi(sale, other.token);
    const third = await signUpApi(`e2ep-${runId}-m-${size}`);
    const paidOrder = await buyApi(sale, third.token);
    const fourth = await signUpApi(`e2ep-${runId}-n-${size}`);
    const waiting = await buyApi(sale, fourth.token);
    await settled(other.token, second.data.order_id);
    await settled(third.token, paidOrder.data.order_id);
    await settled(fourth.token, waiting.data.order_id);
    const payRes = await fetch(`${base}/api/orders/${paidOrder.data.order_id}/pay`, {
      method: "POST",
      headers: { Authorization: `Bearer ${third.token}`, "Idempotency-Key": `e2e-${runId}-${size}` },
    });
    check(payRes.status === 200, `the third buyer pays (${payRes.status}) ${at}`);
    const adminPage = await newPage(viewport, admin);
    await goto(adminPage, `/admin/sales/${sale}/orders`);
    const summary = adminPage.locator('[data-field="totals"]');
    const shown = async () =>
      Object.fromEntries(
        await Promise.all(
          ["units-sold", "revenue-paid", "revenue-awaiting", "units-returned", "revenue-refunded", "stock-left"].map(async (f) => [
            f,
            await summary.locator(`[data-field="${f}"]`).innerText(),
          ]),
        ),
      );
    const before = await shown();
    check(
      JSON.stringify(before) ===
        JSON.stringify({ "units-sold": "3", "revenue-paid": "$1,299.00", "revenue-awaiting": "$2,598.00", "units-returned": "1", "revenue-refunded": "$0.00", "stock-left": "2" }),
      `the orders page's totals before the admin's cancels (${JSON.stringify(before)}) ${at}`,
    );
    const awaitingRow = adminPage.locator(`tr[data-order-id="${waiting.data.order_id}"]`);
    const cancelBox = await awaitingRow.getByRole("button", { name: /^Cancel/ }).evaluate((b) => {
      const card = b.closest("tr").getBoundingClientRect();
      const box = b.getBoundingClientRect();
      return { left: box.left, right: box.right, cardLeft: card.left, cardRight: card.right };
    });
    check(
      cancelBox.left >= cancelBox.cardLeft && cancelBox.right <= cancelBox.cardRight,
      `the Cancel button of an order awaiting payment stays inside its row (${Math.round(cancelBox.right)} <= ${Math.round(cancelBox.cardRight)} px) ${at}`,
    );
    // The short order id, and its Copy button.
    const idCell = awaitingRow.locator(".order-id");
    const full = waiting.data.order_id;
    check((await idCell.locator("code").innerText()) === `…${full.slice(-8)}` && (await idCell.locator("code").getAttribute("title")) === full, `the order id shows its short form, the whole id in its title ${at}`);
    await idCell.getByRole("button", { name: /^Copy/ }).click();
    await idCell.getByRole("button", { name: /^Copied/ }).waitFor({ timeout: 3000 });
    check(true, `the Copy button copies the order id ${at}`);
    await inspect(adminPage, "admin-orders-awaiting");
    // A page that reloads loses this mark: the totals must follow without one.
    await adminPage.evaluate(() => (window.__noReload = true));
    const adminRow = adminPage.locator(`tr[data-order-id="${second.data.order_id}"]`);
    await adminRow.getByRole("button", { name: /^Cancel/ }).click();
    await adminRow.locator(".badge", { hasText: "Cancelled" }).waitFor({ timeout: 8000 });
    await summary.locator('[data-field="units-sold"]').filter({ hasText: /^2$/ }).waitFor({ timeout: 5000 }).catch(() => {});
    const afterCancel = await shown();
    check(
      JSON.stringify(afterCancel) ===
        JSON.stringify({ "units-sold": "2", "revenue-paid": "$1,299.00", "revenue-awaiting": "$1,299.00", "units-returned": "2", "revenue-refunded": "$0.00", "stock-left": "3" }),
      `after a cancel the totals follow without a reload (${JSON.stringify(afterCancel)}) ${at}`,
    );
    await inspect(adminPage, "admin-orders-cancelled");
    const paidRow = adminPage.locator(`tr[data-order-id="${paidOrder.data.order_id}"]`);
    await paidRow.getByRole("button", { name: /^Cancel and refund/ }).click();
    await paidRow.locator(".badge", { hasText: "Refunded" }).waitFor({ timeout: 8000 });
    await summary.locator('[data-field="revenue-refunded"]').filter({ hasText: "$1,299.00" }).waitFor({ timeout: 5000 }).catch(() => {});
    const afterRefund = await shown();
    check(
      JSON.stringify(afterRefund) ===
        JSON.stringify({ "units-sold": "1", "revenue-paid": "$0.00", "revenue-awaiting": "$1,299.00", "units-returned": "3", "revenue-refunded": "$1,299.00", "stock-left": "4" }),
      `after a refund the totals follow without a reload (${JSON.stringify(afterRefund)}) ${at}`,
    );
    check(await adminPage.evaluate(() => window.__noReload === true), `the page was not reloaded ${at}`);
    const api = await call("GET", `/api/admin/sales/${sale}/orders`, admin.token);
    const t = api.data.totals;
    check(
      t.units_sold === 1 && t.revenue_paid_cents === 0 && t.revenue_awaiting_cents === 129_900 && t.units_returned === 3 && t.revenue_refunded_cents === 129_900,
      `the page says what the API says (${JSON.stringify(t)}) ${at}`,
    );
    await inspect(adminPage, "admin-orders-refunded");
    await goto(adminPage, `/admin/sales/${sale}`);
    check(await adminPage.locator('[data-field="history"]').getByText("Order cancelled").isVisible(), `the sale's history shows the admin's cancel ${at}`);
    await adminPage.context().close();
  }
} catch (err) {
  problems.push(`aborted: ${err.stack || err.message}`);
}
await finish(browser, "pages");
