// The poll page for each ballot kind (issue 51), at 1280x800 and 390x844, against
// a running, seeded server (scripts/browser-test starts one):
// - multi: checkboxes with "n of 2 chosen", the third disabled at the most;
//   the vote sends option_ids, and my-ballot holds them;
// - budget: steppers (+/-) with "n of 10 votes left", the cap per option; votes
//   spent in two sends, "left" following each answer; over the budget in plain
//   words;
// - ranked: tap to rank, reorder with the up/down buttons (keyboard), send; then
//   "Change my vote" (allow_change) and "Your vote was changed"; my-ballot holds
//   the new ranking; the receipts say "recorded" once settled;
// - a ranked poll closed with its results: the count by rounds when the results
//   carry `runoff`, and the page still whole when they do not;
// - the admin's New poll form: the ballot fields of each kind show only for it, a
//   server refusal shows next to its field, and a budget poll is created with its
//   settings.
// Every state is scanned with axe-core and must not scroll sideways; screenshots
// go to E2E_OUT as pages-ballot-*.
// It creates its own polls and users ("E2E ballot ...", "e2eb-...").

import { accounts, call, check, finish, goto, inspect, launchChromium, newContextPage, out, signInApi, signUpApi, until } from "./lib.mjs";
import { mkdir } from "node:fs/promises";
import { randomBytes } from "node:crypto";

const { demoPassword, adminUser, adminPassword } = accounts();
const runId = randomBytes(3).toString("hex");
const SIZES = [
  ["desktop", { width: 1280, height: 800 }],
  ["phone", { width: 360, height: 740 }],
];

/** An open poll of `settings` (ballot, ...); its id and option ids. */
async function ballotPoll(admin, question, settings, options = ["Tea", "Coffee", "Cocoa"]) {
  const now = Date.now();
  const res = await call("POST", "/api/admin/polls", admin.token, {
    question: `E2E ballot ${question} ${runId}`,
    options,
    opens_at: new Date(now - 60_000).toISOString(),
    closes_at: new Date(now + 3_600_000).toISOString(),
    ...settings,
  });
  if (res.status !== 201) throw new Error(`create poll: ${res.status} ${JSON.stringify(res.data)}`);
  return { id: res.data.id, options: res.data.options.map((o) => o.id) };
}

const myBallot = async (poll, user) => (await call("GET", `/api/polls/${poll}/my-ballot`, user.token)).data;
const text = (page, selector) => page.locator(selector).first().innerText();

await mkdir(out, { recursive: true });
const browser = await launchChromium();
const admin = await signInApi(adminUser, adminPassword);

try {
  for (const [size, viewport] of SIZES) {
    // ---- multi --------------------------------------------------------------
    {
      const poll = await ballotPoll(admin, `multi ${size}`, { ballot: "multi", max_choices: 2 });
      const voter = await signUpApi(`e2eb-m${size[0]}${runId}`, demoPassword);
      const page = await newContextPage(browser, viewport, voter);
      await goto(page, `/polls/${poll.id}`);
      const boxes = page.locator('input[type="checkbox"][name="option"]');
      await until("the checkboxes enabled", async () => !(await boxes.nth(0).isDisabled()));
      check((await text(page, '[data-field="counter"]')) === "0 of 2 chosen", `multi (${size}): 0 of 2 chosen`);
      await boxes.nth(0).check();
      await boxes.nth(2).check();
      check((await text(page, '[data-field="counter"]')).startsWith("2 of 2 chosen"), `multi (${size}): 2 of 2 chosen`);
      check(await boxes.nth(1).isDisabled(), `multi (${size}): the third box is disabled at the most`);
      await inspect(page, `ballot-multi-chosen`);
      await page.locator('[data-action="vote"]').click();
      await page.locator('[data-field="outcome"]', { hasText: "Thanks, your vote counted." }).waitFor();
      const mine = await myBallot(poll.id, voter);
      check(
        JSON.stringify(mine.choices) === JSON.stringify([poll.options[0], poll.options[2]]),
        `multi (${size}): my-ballot holds the two choices (${JSON.stringify(mine.choices)})`,
      );
      await page.locator('[data-field="receipts"] li').first().waitFor();
      await until("the receipt's words", async () => (await text(page, '[data-field="counts"]')) === "Your choices: Tea, Cocoa.");
      check(true, `multi (${size}): the receipt says what counts`);
      await inspect(page, `ballot-multi-voted`);
      await page.context().close();
    }

    // ---- budget spread over many options, through the per-voter limit --------
    // One press over five options is five requests; the poll's per-voter limit
    // (5 in 10 s by default; off in this run) may refuse some with 429, which
    // decides nothing: the page waits Retry-After and sends the rest. The 429 is
    // the browser's (a route that answers the third request once), the votes the
    // server's.
    if (size === "desktop") {
      const options = ["A", "B", "C", "D", "E"];
      const poll = await ballotPoll(admin, `budget spread`, { ballot: "budget", votes_per_user: 10, results: "after_vote" }, options);
      const voter = await signUpApi(`e2eb-s${runId}`, demoPassword);
      const page = await newContextPage(browser, viewport, voter);
      let sent = 0;
      let limited = 0;
      await page.route(`**/api/polls/${poll.id}/votes`, async (route) => {
        sent += 1;
        if (sent === 3) {
          limited += 1;
          const body = JSON.stringify({ error: "rate_limited", message: "too many requests; try again in 1 s" });
          await route.fulfill({ status: 429, headers: { "Retry-After": "1", "Content-Type": "application/json" }, body });
          return;
        }
        await route.continue();
      });
      await goto(page, `/polls/${poll.id}`);
      const more = (i) => page.locator(".stepper-row").nth(i).locator('[data-action="more"]');
      await until("the steppers enabled", async () => !(await more(0).isDisabled()));
      for (let i = 0; i < options.length; i += 1) await more(i).click();
      await page.locator('[data-action="vote"]').click();
      await page.locator('[data-field="outcome"]', { hasText: "Giving your votes: 2 of 5 sent" }).waitFor();
      await inspect(page, `ballot-budget-limited`);
      await page.locator('[data-field="outcome"]', { hasText: "You have 5 left to give." }).waitFor();
      const mine = await myBallot(poll.id, voter);
      const given = (mine.votes || []).filter((v) => v.count === 1).length;
      check(
        limited === 1 && sent === 6 && given === 5 && mine.remaining === 5,
        `budget spread: a 429 mid-press waited out, all five votes in (${sent} sent, ${given} given, ${mine.remaining} left)`,
      );
      await until("the receipts listed", async () => (await page.locator('[data-field="receipts"] li').count()) === 5);
      check(true, "budget spread: five receipts");
      await page.context().close();
    }

    // ---- budget -------------------------------------------------------------
    {
      const poll = await ballotPoll(admin, `budget ${size}`, { ballot: "budget", votes_per_user: 10, max_per_option: 4 });
      const voter = await signUpApi(`e2eb-b${size[0]}${runId}`, demoPassword);
      const page = await newContextPage(browser, viewport, voter);
      await goto(page, `/polls/${poll.id}`);
      const row = (i) => page.locator(".stepper-row").nth(i);
      const more = (i) => row(i).locator('[data-action="more"]');
      await until("the steppers enabled", async () => !(await more(0).isDisabled()));
      check((await text(page, '[data-field="counter"]')) === "10 of 10 votes left", `budget (${size}): 10 of 10 votes left`);
      for (let n = 0; n < 4; n += 1) await more(0).click();
      check(await more(0).isDisabled(), `budget (${size}): + stops at the most per option (4)`);
      await more(1).click();
      await more(1).click();
      check(
        (await text(page, '[data-field="counter"]')) === "10 of 10 votes left · giving 6 now",
        `budget (${size}): the counter says what is being given`,
      );
      await inspect(page, `ballot-budget-stepping`);
      await page.locator('[data-action="vote"]').click();
      await page.locator('[data-field="outcome"]', { hasText: "You have 4 left to give." }).waitFor();
      check((await text(page, '[data-field="counter"]')) === "4 of 10 votes left", `budget (${size}): 4 of 10 left after the answer`);
      // At once, before my-ballot is read again: what was given, never "No votes given yet".
      const counts = await text(page, '[data-field="counts"]');
      check(counts === "Your votes: Tea: 4, Coffee: 2. 4 left.", `budget (${size}): the receipt box says what was given at once (${counts})`);
      check(await more(0).isDisabled(), `budget (${size}): Tea's cap of 4 is used up`);
      // A second visit's spend: 3 more on Cocoa.
      for (let n = 0; n < 3; n += 1) await row(2).locator('[data-action="more"]').click();
      await page.locator('[data-action="vote"]').click();
      await page.locator('[data-field="outcome"]', { hasText: "You have 1 left to give." }).waitFor();
      // Another tab spends the last vote; this page still offers 1: over the budget, in words.
      // (The page re-reads my-ballot while its receipts are being recorded, so it
      // may learn of the other tab's vote first and offer nothing more: then there
      // is no refusal to show, and the counter must say so.)
      await call("POST", `/api/polls/${poll.id}/votes`, voter.token, { option_id: poll.options[1], count: 1 });
      let offered = true;
      try {
        await more(1).click({ timeout: 2000 });
        await page.locator('[data-action="vote"]').click({ timeout: 2000 });
      } catch {
        offered = false;
      }
      if (offered) {
        await page.locator('[data-field="outcome"]', { hasText: "You have given all your votes." }).waitFor();
      }
      await until("the counter at 0", async () => (await text(page, '[data-field="counter"]')) === "0 of 10 votes left");
      check((await text(page, '[data-field="counter"]')) === "0 of 10 votes left", `budget (${size}): a spent budget shows 0 left (${offered ? "refused in words" : "learned from my-ballot"})`);
      const mine = await myBallot(poll.id, voter);
      const given = Object.fromEntries(mine.votes.map((v) => [v.option_id, v.count]));
      check(
        mine.remaining === 0 && given[poll.options[0]] === 4 && given[poll.options[1]] === 3 && given[poll.options[2]] === 3,
        `budget (${size}): my-ballot holds 4/3/3 and 0 left (${JSON.stringify(mine.votes)})`,
      );
      // Four accepted requests: Tea 4, Coffee 2, Cocoa 3, and the other tab's Coffee 1.
      await until("the receipts listed", async () => (await page.locator('[data-field="receipts"] li').count()) === 4);
      await inspect(page, `ballot-budget-spent`);
      await page.context().close();
    }

    // ---- ranked, with a change ---------------------------------------------
    {
      const poll = await ballotPoll(admin, `ranked ${size}`, { ballot: "ranked", allow_change: true });
      const voter = await signUpApi(`e2eb-r${size[0]}${runId}`, demoPassword);
      const page = await newContextPage(browser, viewport, voter);
      await goto(page, `/polls/${poll.id}`);
      const pick = (i) => page.locator(".rank-pick").nth(i);
      await until("the options enabled", async () => !(await pick(0).isDisabled()));
      await pick(1).click(); // Coffee
      await pick(0).click(); // Tea
      await pick(2).click(); // Cocoa
      await pick(2).click(); // Cocoa out again
      const order = async () => page.locator('[data-field="ranking"] li .ranking-label').allInnerTexts();
      check(JSON.stringify(await order()) === '["Coffee","Tea"]', `ranked (${size}): tap to rank, tap again to take out`);
      // Move Tea up with the keyboard.
      await page.locator('[data-field="ranking"] li').nth(1).locator('[data-action="up"]').focus();
      await page.keyboard.press("Enter");
      check(JSON.stringify(await order()) === '["Tea","Coffee"]', `ranked (${size}): the up button reorders (keyboard)`);
      check(
        await page.evaluate(() => document.activeElement?.closest("li")?.textContent.includes("Tea")),
        `ranked (${size}): the focus stays with the moved option`,
      );
      await inspect(page, `ballot-ranked-ranking`);
      await page.locator('[data-action="vote"]').click();
      await page.locator('[data-field="outcome"]', { hasText: "Thanks, your vote counted." }).waitFor();
      let mine = await myBallot(poll.id, voter);
      check(
        JSON.stringify(mine.choices) === JSON.stringify([poll.options[0], poll.options[1]]),
        `ranked (${size}): my-ballot holds Tea, Coffee`,
      );
      // Change it: Cocoa first.
      await page.locator('[data-action="change"]').click();
      await pick(2).click();
      await page.locator('[data-field="ranking"] li').nth(2).locator('[data-action="up"]').click();
      await page.locator('[data-field="ranking"] li').nth(1).locator('[data-action="up"]').click();
      check(JSON.stringify(await order()) === '["Cocoa","Tea","Coffee"]', `ranked (${size}): the ranking is changeable before sending`);
      await page.locator('[data-action="vote"]').click();
      await page.locator('[data-field="outcome"]', { hasText: "Your vote was changed." }).waitFor();
      mine = await myBallot(poll.id, voter);
      check(
        JSON.stringify(mine.choices) === JSON.stringify([poll.options[2], poll.options[0], poll.options[1]]),
        `ranked (${size}): my-ballot holds the changed ranking`,
      );
      await until(
        "the receipts recorded",
        async () => (await page.locator('[data-field="receipts"]').innerText()).includes("recorded") &&
          !(await page.locator('[data-field="receipts"]').innerText()).includes("being recorded"),
        15000,
      );
      const receipts = await page.locator('[data-field="receipts"] li').allInnerTexts();
      check(
        receipts.length === 2 && receipts[0].endsWith("recorded") && receipts[1].endsWith("replaced by a later vote"),
        `ranked (${size}): two receipts, the first replaced (${JSON.stringify(receipts)})`,
      );
      await inspect(page, `ballot-ranked-changed`);
      // Closed: the results, and the rounds when the API carries them.
      await call("POST", `/api/admin/polls/${poll.id}/close`, admin.token);
      await goto(page, `/polls/${poll.id}`);
      await page.locator('[data-field="results-heading"]', { hasText: "Final results" }).waitFor();
      const results = (await call("GET", `/api/polls/${poll.id}/results`, voter.token)).data;
      if (results.runoff) {
        await page.locator('[data-field="runoff"]').waitFor();
        check((await text(page, '[data-field="runoff-winner"]')).startsWith("Winner: Cocoa"), `ranked (${size}): the rounds name the winner`);
      } else {
        check(await page.locator('[data-field="runoff"]').isHidden(), `ranked (${size}): no runoff in the results, no rounds box`);
      }
      check(
        (await page.locator('[data-field="rank-picks"]').isHidden()) && (await page.locator('[data-field="ranking"] button').first().isHidden()),
        `ranked (${size}): a closed poll shows the ranking, not the controls to change it`,
      );
      check((await page.locator(".result.is-mine .mine-tag").allInnerTexts()).includes("Your #1"), `ranked (${size}): the first choice is tagged "Your #1"`);
      await inspect(page, `ballot-ranked-closed`);
      await page.context().close();
    }
  }

  // ---- the admin's form -----------------------------------------------------
  for (const [size, viewport] of SIZES) {
    const page = await newContextPage(browser, viewport, admin);
    await goto(page, "/admin");
    await page.locator("#new-poll > summary").click();
    const form = page.locator('form[data-form="create-poll"]');
    const shown = async (name) => form.locator(`[name="${name}"]`).isVisible();
    check(!(await shown("max_choices")) && (await shown("allow_change")), `admin form (${size}): single shows only allow change`);
    await form.locator('[name="ballot"]').selectOption("budget");
    check(
      (await shown("votes_per_user")) && (await shown("max_per_option")) && !(await shown("allow_change")),
      `admin form (${size}): budget shows its two numbers`,
    );
    await form.locator('[name="question"]').fill(`E2E ballot admin ${size} ${runId}`);
    const options = form.locator('[data-field="option-list"] input');
    await options.nth(0).fill("Red");
    await options.nth(1).fill("Blue");
    // Several choices, at most 5 of 2 options: the server's 422, next to its field.
    await form.locator('[name="ballot"]').selectOption("multi");
    await form.locator('[name="max_choices"]').fill("5");
    await form.locator('button[type="submit"]').click();
    await form.locator('[data-error-for="max_choices"]', { hasText: "Most choices on one ballot" }).waitFor({ timeout: 5000 });
    check(
      (await text(page, '[data-error-for="max_choices"]')) === "“Most choices on one ballot” must be 1 to the number of options (2).",
      `admin form (${size}): the refusal names the field by its label, whole`,
    );
    await inspect(page, `ballot-admin-refused`);
    await form.locator('[name="ballot"]').selectOption("budget");
    await form.locator('[name="votes_per_user"]').fill("5");
    await form.locator('[name="max_per_option"]').fill("3");
    await form.locator('button[type="submit"]').click();
    await form.locator('[data-field="poll-create-message"]', { hasText: "Created poll" }).waitFor({ timeout: 5000 });
    const created = (await text(page, '[data-field="poll-create-message"]')).match(/#(\d+)/);
    const made = created && (await call("GET", `/api/polls/${created[1]}`, admin.token)).data;
    check(
      made && made.ballot === "budget" && made.votes_per_user === 5 && made.max_per_option === 3,
      `admin form (${size}): the budget poll is created with its settings (${JSON.stringify(made && [made.ballot, made.votes_per_user, made.max_per_option])})`,
    );
    await page.context().close();
  }
} catch (err) {
  check(false, `ballots run: ${err.stack || err}`);
}
await finish(browser, "Ballots");
