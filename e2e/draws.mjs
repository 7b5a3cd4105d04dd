// A draw sale (issue 52) in the browser, at 1280x800 and 390x844, against a
// running, seeded server (scripts/browser-test starts one):
// - before entries open, the sale page says when they open, in local time, and
//   "How this draw was made" shows the commitment only;
// - while open, two shoppers enter through the page: the sale asks for a proof
//   of work (12 bits), which the page solves in its Web Worker ("Checking your
//   browser…") and sends with the entry; then "You're in the draw. Results at
//   HH:MM, your local time" (the draw's time in the browser's zone);
// - the admin draws it now (the open endpoint); the winner's page shows "You won!
//   Buy before HH:MM" with a countdown and buys with the win's ticket; the other
//   reads that they are number 1 on the waiting list, then (desktop) that they
//   were not drawn once the unit is bought;
// - the sale's admin page shows its entries, winners and wins bought, live;
// - a draw nobody entered is over at once: signed out, its page says the unit
//   left is not for sale, its badge "Draw over" (kept through the live updates);
// - "How this draw was made" recomputes the draw with WebCrypto: "Verified: ...";
// - the sale's Edit form: no waiting room on offer; the draw's fields checked and saved (only what changed
//   is sent) before entries open, disabled with the reason once they have;
// - the New sale form makes a draw, its fields checked as the API does.
// Every state shown is scanned with axe-core and must not scroll sideways; the
// screenshots (pages-sale-draw-*, pages-draw-proof-*, pages-admin-sale-draw-*) go to E2E_OUT.
// It creates its own sales and users (named "E2E draw ...", "e2ed-...").

import { accounts, call, check, finish, goto, inspect, launchChromium, newContextPage, out, signInApi, signUpApi as signUpWith, until } from "./lib.mjs";
import { mkdir } from "node:fs/promises";
import { createHash, randomBytes } from "node:crypto";

const { demoPassword, adminUser, adminPassword } = accounts();
const runId = randomBytes(3).toString("hex");
const SIZES = [
  ["desktop", { width: 1280, height: 800 }],
  ["phone", { width: 390, height: 844 }],
];
const POW_BITS = 12;

const signUpApi = (username) => signUpWith(username, demoPassword);

/** A draw sale of one unit whose entries open `opensInS` from now. */
async function drawSale(admin, name, opensInS) {
  const now = Date.now();
  const at = (s) => new Date(now + s * 1000).toISOString();
  const res = await call("POST", "/api/admin/sales", admin.token, {
    name,
    description: "Made by e2e/draws.mjs.",
    price_cents: 12_900,
    stock: 1,
    mode: "draw",
    entries_open_at: at(opensInS),
    draw_at: at(opensInS + 3600),
    ends_at: at(opensInS + 7200),
    claim_window_s: 600,
    proof_of_work: POW_BITS,
  });
  if (res.status !== 201) throw new Error(`create sale: ${res.status} ${JSON.stringify(res.data)}`);
  return res.data;
}

/** Leading zero bits of SHA-256 of a `Proof-Of-Work` value (`challenge:nonce`). */
function zeroBits(proof) {
  let bits = 0;
  for (const byte of createHash("sha256").update(proof).digest()) {
    if (byte === 0) {
      bits += 8;
      continue;
    }
    bits += Math.clz32(byte) - 24;
    break;
  }
  return bits;
}

/**
 * A moment as the draw's panel shows it (en-US, Berlin time): "6:05 PM" on the
 * day it is, else "Dec 3, 6:05 PM GMT+1".
 */
function berlinClock(iso) {
  const at = new Date(iso);
  const zone = { timeZone: "Europe/Berlin" };
  const day = (d) => new Intl.DateTimeFormat("en-US", { ...zone, dateStyle: "short" }).format(d);
  if (day(at) === day(new Date())) return new Intl.DateTimeFormat("en-US", { ...zone, hour: "numeric", minute: "2-digit" }).format(at);
  return new Intl.DateTimeFormat("en-US", { ...zone, month: "short", day: "numeric", hour: "numeric", minute: "2-digit", timeZoneName: "short" }).format(at);
}

await mkdir(out, { recursive: true });
const browser = await launchChromium();
const newPage = (viewport, session) => newContextPage(browser, viewport, session);

try {
  const admin = await signInApi(adminUser, adminPassword);

  // ---- before entries open ----
  {
    const sale = await drawSale(admin, `E2E draw ${runId}: later`, 3600);
    const shopper = await signUpApi(`e2ed-${runId}-later`);
    for (const [size, viewport] of SIZES) {
      const at = `at ${viewport.width}x${viewport.height}`;
      const page = await newPage(viewport, shopper);
      await goto(page, `/sales/${sale.id}`);
      const status = page.locator('[data-field="draw-status"]');
      await status.filter({ hasText: /^Entries open at .+, your local time\.$/ }).waitFor({ timeout: 5000 });
      check(!(await page.getByRole("button", { name: "Enter the draw" }).isVisible()), `before entries open there is no Enter ${at}`);
      check(!(await page.getByRole("button", { name: /Buy/ }).isVisible()), `no Buy on a draw before it is drawn ${at}`);
      await inspect(page, "sale-draw-upcoming");
      await goto(page, `/sales/${sale.id}/draw`);
      check(
        (await page.locator('[data-field="commitment"]').innerText()) === sale.draw_commitment,
        `the draw's page shows the commitment from the start ${at}`,
      );
      check(await page.getByText("The check runs here once the draw is made.").isVisible(), `before the draw nothing is checked yet ${at}`);
      await inspect(page, "draw-proof-pending");
      await page.context().close();
    }
  }

  // ---- a draw nobody entered: over at once, its unit not for sale ----
  {
    const sale = await drawSale(admin, `E2E draw ${runId}: nobody entered`, -60);
    const opened = await call("POST", `/api/admin/sales/${sale.id}/open`, admin.token);
    check(opened.status === 200, `the admin draws a sale nobody entered (${opened.status})`);
    await until("the draw's finish in the sale's view", async () => typeof (await call("GET", `/api/sales/${sale.id}`)).data?.draw_finished_at === "string");
    for (const [size, viewport] of SIZES) {
      const at = `at ${viewport.width}x${viewport.height}`;
      const visitor = await newPage(viewport, null);
      await goto(visitor, `/sales/${sale.id}`);
      const badge = visitor.locator('[data-field="badge"]');
      await visitor.locator('[data-field="draw-status"]').filter({ hasText: "The draw is over." }).waitFor({ timeout: 5000 });
      check(
        (await visitor.locator('[data-field="draw-detail"]').innerText()) === "No more wins will be given: the units left are not for sale.",
        `signed out, a finished draw's page says its unit left is not for sale ${at}`,
      );
      // The page's live updates (a view a second) keep it so.
      await visitor.waitForTimeout(2500);
      check((await badge.innerText()) === "Draw over", `the badge says "Draw over", not Live, after the live updates (${await badge.innerText()}) ${at}`);
      check(!(await visitor.getByRole("button", { name: "Buy now" }).isVisible()), `no Buy on a finished draw ${at}`);
      await inspect(visitor, "sale-draw-over");
      await visitor.context().close();
    }
  }

  // ---- enter, the draw, the win and the waiting list, the check ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const sale = await drawSale(admin, `E2E draw ${runId}: now (${size})`, -60);
    const users = await Promise.all(["a", "b"].map((who) => signUpApi(`e2ed-${runId}-${who}-${size}`)));
    const pages = [];
    for (const [i, user] of users.entries()) {
      const page = await newPage(viewport, user);
      const entries = [];
      page.on("request", (r) => {
        if (r.method() === "POST" && new URL(r.url()).pathname === `/api/sales/${sale.id}/entry`) entries.push(r.headers()["proof-of-work"]);
      });
      await goto(page, `/sales/${sale.id}`);
      const enter = page.getByRole("button", { name: "Enter the draw" });
      await enter.waitFor({ timeout: 5000 });
      if (i === 0) await inspect(page, "sale-draw-open");
      const workers = [];
      page.on("worker", (w) => workers.push(w.url()));
      await page.evaluate(() => {
        const box = document.querySelector('[data-field="outcome"]');
        new MutationObserver(() => {
          if (box.textContent.includes("Checking your browser…")) window.__sawChecking = true;
        }).observe(box, { subtree: true, childList: true, characterData: true });
      });
      await enter.click();
      const status = page.locator('[data-field="draw-status"]');
      const results = `You're in the draw. Results at ${berlinClock(sale.draw_at)}, your local time.`;
      await status.filter({ hasText: results }).waitFor({ timeout: 10000 });
      check(true, `entered through the page: "${results}" ${at}`);
      check(
        entries.length === 1 && zeroBits(entries[0] || "") >= POW_BITS,
        `the entry carries a proof of work of ${POW_BITS} zero bits, solved in the page ${at}`,
      );
      check(
        workers.some((u) => u.endsWith("/static/js/pow-worker.js")) && (await page.evaluate(() => window.__sawChecking === true)),
        `the proof was solved in the Web Worker while the page said "Checking your browser…" ${at}`,
      );
      if (i === 0) await inspect(page, "sale-draw-entered");
      pages.push({ page, user, status });
    }

    // The draw, now.
    const opened = await call("POST", `/api/admin/sales/${sale.id}/open`, admin.token);
    check(opened.status === 200, `the admin draws the sale now (${opened.status}) ${at}`);
    let draw = null;
    await until("the draw", async () => {
      const res = await call("GET", `/api/sales/${sale.id}/draw`);
      draw = res.data;
      return res.status === 200;
    });
    const standings = await Promise.all(users.map(async (u) => (await call("GET", `/api/sales/${sale.id}/entry/me`, u.token)).data));
    const winner = standings.findIndex((s) => s.state === "won");
    check(winner >= 0 && standings[1 - winner].state === "waitlisted", `one winner, one on the waiting list ${at}`);
    const won = pages[winner];
    const lost = pages[1 - winner];

    const buyBefore = `You won! Buy before ${berlinClock(standings[winner].claim_until)}.`;
    await won.status.filter({ hasText: buyBefore }).waitFor({ timeout: 10000 });
    check(true, `the winner's page says "${buyBefore}" ${at}`);
    const countdown = won.page.locator('[data-field="draw-expiry-time"]');
    const first = await countdown.innerText();
    await won.page.waitForFunction(([el, was]) => el.textContent !== was, [await countdown.elementHandle(), first], { timeout: 3000 });
    check(/^(09|10):\d\d$/.test(await countdown.innerText()), `the time to buy counts down (${first} -> ${await countdown.innerText()}) ${at}`);
    await inspect(won.page, "sale-draw-won");

    await lost.status.filter({ hasText: "You're number 1 on the waiting list." }).waitFor({ timeout: 10000 });
    check(!(await lost.page.getByRole("button", { name: "Buy now" }).isVisible()), `no Buy on the waiting list ${at}`);
    await inspect(lost.page, "sale-draw-waitlisted");

    const sent = [];
    won.page.on("request", (r) => {
      if (r.method() === "POST" && new URL(r.url()).pathname === `/api/sales/${sale.id}/purchase`) sent.push(r.postDataJSON());
    });
    await won.page.getByRole("button", { name: "Buy now" }).click();
    await won.page.locator('[data-field="outcome"]').filter({ hasText: /Order placed|Order confirmed/ }).waitFor({ timeout: 5000 });
    check(sent.length === 1 && sent[0].ticket === standings[winner].ticket, `Buy sends the win's ticket ${at}`);
    await won.status.filter({ hasText: "You won the draw and bought this." }).waitFor({ timeout: 5000 });
    check(true, `bought, the winner's page says so ${at}`);
    if (size === "desktop") {
      // Sold: the waiting list can no longer win (asked again within 5 s).
      await lost.status.filter({ hasText: "You were not drawn this time." }).waitFor({ timeout: 10000 });
      check(true, `once the unit is bought, the other reads they were not drawn ${at}`);
      await inspect(lost.page, "sale-draw-not-drawn");
    }

    // Signed out, after the draw: its outcome and how it was made, no entry.
    {
      const visitor = await newPage(viewport, null);
      await goto(visitor, `/sales/${sale.id}`);
      await visitor.locator('[data-field="draw-status"]').filter({ hasText: "The draw has been made." }).waitFor({ timeout: 5000 });
      check(!(await visitor.getByText("Sign in to enter the draw").isVisible()), `signed out after the draw, no "Sign in to enter the draw" ${at}`);
      check(await visitor.getByRole("link", { name: "How this draw was made" }).isVisible(), `signed out after the draw, the link to how it was made ${at}`);
      await visitor.context().close();
    }

    // How this draw was made: checked in the browser.
    const proof = won.page;
    await goto(proof, `/sales/${sale.id}/draw`);
    const verdict = proof.locator('[data-field="verdict"]');
    await verdict.filter({ hasText: /^Verified: / }).waitFor({ timeout: 10000 });
    check(true, `the draw's page says Verified ${at}`);
    check((await proof.locator('[data-field="seed"]').innerText()) === draw.seed, `the page shows the published seed ${at}`);
    check(
      (await proof.locator('[data-field="winners"] tr').count()) === draw.winners.length,
      `the page lists the ${draw.winners.length} winner(s) in order ${at}`,
    );
    check(
      await proof.getByText(`stampede verify-draw --url `).isVisible(),
      `the page gives the command that checks it from a terminal ${at}`,
    );
    await inspect(proof, "draw-proof");

    // A doctored publication fails the check: the winner moved to rank 2 (rank 1
    // left out), and the CSV listing one entry twice in place of the other.
    const doctored = async (route, change) => {
      const answer = await route.fetch();
      await route.fulfill({ response: answer, body: change(await answer.text()) });
    };
    await proof.route(`**/api/sales/${sale.id}/draw`, (route) =>
      doctored(route, (text) => {
        const d = JSON.parse(text);
        d.winners = d.winners.map((w) => ({ ...w, rank: w.rank + 1 }));
        return JSON.stringify(d);
      }),
    );
    await proof.route(`**/api/sales/${sale.id}/draw/entries.csv`, (route) =>
      doctored(route, (text) => {
        const [head, first] = text.trim().split("\n");
        return [head, first, first].join("\n") + "\n";
      }),
    );
    await goto(proof, `/sales/${sale.id}/draw`);
    await verdict.filter({ hasText: /^Does not match: / }).waitFor({ timeout: 10000 });
    const failed = await proof.locator('[data-field="checks"] li.check-fail').allInnerTexts();
    check(
      failed.some((t) => /listed twice in the CSV/.test(t)) &&
        failed.some((t) => /not the draw's entries digest/.test(t)) &&
        failed.some((t) => /listed at rank 2 is entry/.test(t)),
      `a doctored draw (a rank left out, an entry twice) is not verified: ${JSON.stringify(failed)} ${at}`,
    );
    await proof.unrouteAll();

    // The admin's view of the draw: entries, winners, buying, bought, passed, live.
    const adminPage = await newPage(viewport, admin);
    await goto(adminPage, `/admin/sales/${sale.id}`);
    const number = (name) => adminPage.locator(`[data-draw="${name}"]`);
    await adminPage.waitForFunction(() => document.querySelector('[data-draw="bought"]')?.textContent === "1", null, { timeout: 10000 });
    const shown = {};
    for (const name of ["entries", "winners_at_draw", "running", "bought", "returned", "passed"]) shown[name] = await number(name).innerText();
    check(
      JSON.stringify(shown) === JSON.stringify({ entries: "2", winners_at_draw: "1", running: "0", bought: "1", returned: "0", passed: "0" }),
      `the admin's page shows the draw's numbers (${JSON.stringify(shown)}) ${at}`,
    );
    check(/^Drawn at .+ from 2 entries: 1 win so far\.$/.test(await adminPage.locator('[data-field="draw-summary"]').innerText()), `the admin's page says when it was drawn ${at}`);
    await inspect(adminPage, "admin-sale-draw");
    await adminPage.context().close();

    // A top-up after the draw: the recipe still names the stock the draw divided.
    const topped = await call("POST", `/api/admin/sales/${sale.id}/stock`, admin.token, { add: 5 });
    check(topped.status === 200, `the admin tops the sale up after the draw (${topped.status}) ${at}`);
    await goto(proof, `/sales/${sale.id}/draw`);
    await verdict.filter({ hasText: /^Verified: / }).waitFor({ timeout: 10000 });
    const recipeStock = await proof.locator('[data-field="recipe-stock"]').innerText();
    check(
      recipeStock === String(draw.stock_at_draw),
      `after a top-up the recipe names the ${draw.stock_at_draw} unit(s) the draw divided, not the sale's stock (${recipeStock}) ${at}`,
    );
    for (const p of pages) await p.page.context().close();
  }

  // ---- a draw's Edit form: its fields checked and saved before entries open, fixed after ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const sale = await drawSale(admin, `E2E draw ${runId}: edited (${size})`, 3600);
    const page = await newPage(viewport, admin);
    await goto(page, `/admin/sales/${sale.id}`);
    const form = page.locator('form[data-form="edit-sale"]');
    const entries = form.getByLabel(/^Entries open \(your local time/);
    const claim = form.getByLabel("Time a winner has to buy (seconds)");
    check(
      (await entries.isEnabled()) && (await claim.isEnabled()) && (await claim.inputValue()) === "600",
      `before entries open the draw's fields are the admin's to change (claim ${await claim.inputValue()} s) ${at}`,
    );
    check(
      (await form.getByLabel(/^Waiting room/).count()) === 0 && (await form.locator('[name="admit_per_second"]').count()) === 0,
      `a draw's form offers no waiting room (the API refuses one on a draw) ${at}`,
    );
    const shift = (value, minutes) =>
      page.evaluate(
        ([v, m]) => {
          const d = new Date(new Date(v).getTime() + m * 60000);
          const pad = (n) => String(n).padStart(2, "0");
          return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
        },
        [value, minutes],
      );
    const patches = [];
    page.on("request", (r) => {
      if (r.method() === "PATCH" && new URL(r.url()).pathname === `/api/admin/sales/${sale.id}`) patches.push(r.postDataJSON());
    });
    // Refused by their fields: a claim window under a minute, entries opening after the draw.
    const draws = await form.getByLabel(/^Opens \(your local time/).inputValue();
    await claim.fill("30");
    await entries.fill(await shift(draws, 10));
    await form.getByRole("button", { name: "Save changes" }).click();
    await form.locator("#edit-claim-window-error").filter({ hasText: "60 to 86,400" }).waitFor({ timeout: 3000 });
    await form.locator("#edit-entries-opens-error").filter({ hasText: "before the draw" }).waitFor({ timeout: 3000 });
    check(
      (await claim.getAttribute("aria-invalid")) === "true" && (await entries.getAttribute("aria-invalid")) === "true",
      `a claim window of 30 s and entries opening after the draw are marked by their fields ${at}`,
    );
    check(patches.length === 0, `nothing is sent while a draw field is wrong ${at}`);
    // Entries open half an hour earlier; a winner has a quarter of an hour.
    const earlier = await shift(await entries.inputValue(), -40);
    await entries.fill(earlier);
    await claim.fill("900");
    await form.getByRole("button", { name: "Save changes" }).click();
    await page.locator('[data-field="history"]').getByText("claim_window_s: 600 → 900").waitFor({ timeout: 8000 });
    const wanted = await page.evaluate((v) => new Date(v).toISOString(), earlier);
    const sent = patches[0] || {};
    check(
      patches.length === 1 && JSON.stringify(Object.keys(sent).sort()) === JSON.stringify(["claim_window_s", "entries_open_at"]),
      `the form sends only the draw's changed fields (${JSON.stringify(sent)}) ${at}`,
    );
    const edited = (await call("GET", `/api/sales/${sale.id}`)).data;
    check(
      edited.claim_window_s === 900 &&
        Date.parse(edited.entries_open_at) === Date.parse(wanted) &&
        Date.parse(edited.draw_at) === Date.parse(sale.draw_at) &&
        edited.draw_commitment === sale.draw_commitment,
      `the API shows the edited draw (claim ${edited.claim_window_s} s, entries open ${edited.entries_open_at}, wanted ${wanted}), drawn when it was, the same commitment ${at}`,
    );
    await page.waitForLoadState("load");
    check(
      (await entries.inputValue()) === earlier && (await claim.inputValue()) === "900",
      `after the save the form shows the draw as saved ${at}`,
    );
    await inspect(page, "admin-sale-edit-draw");
    await page.context().close();

    // Entries open (the draw still an hour away): the draw's terms are fixed, as the API holds them.
    const open = await drawSale(admin, `E2E draw ${runId}: entries open, fixed (${size})`, -60);
    const openPage = await newPage(viewport, admin);
    await goto(openPage, `/admin/sales/${open.id}`);
    const openForm = openPage.locator('form[data-form="edit-sale"]');
    const fixed = [
      openForm.getByLabel(/^Entries open \(your local time/),
      openForm.getByLabel("Time a winner has to buy (seconds)"),
      openForm.getByLabel("Price", { exact: true }),
      openForm.getByLabel("Proof of work (0 = off)"),
    ];
    const states = await Promise.all(fixed.map(async (l) => (await l.isVisible()) && (await l.isDisabled())));
    check(states.every(Boolean), `once entries open the draw's fields, the price and the proof show disabled (${states}) ${at}`);
    check(
      /^Entries to this draw have opened/.test(await openPage.locator("#opened-help").innerText()),
      `the form says why: entries have opened ${at}`,
    );
    check(!(await openForm.getByLabel("Name", { exact: true }).isDisabled()), `once entries open the name can still change ${at}`);
    const refused = await call("PATCH", `/api/admin/sales/${open.id}`, admin.token, { claim_window_s: 900 });
    check(refused.status === 409 && refused.data?.error === "sale_started", `and the API refuses the claim window then (${refused.status}) ${at}`);
    await inspect(openPage, "admin-sale-edit-draw-open");
    await openPage.context().close();
  }

  // ---- the admin's New sale form: a draw, its fields checked as the API does ----
  {
    const [, viewport] = SIZES[0];
    const at = `at ${viewport.width}x${viewport.height}`;
    const page = await newPage(viewport, admin);
    await goto(page, "/admin");
    await page.getByText("New sale", { exact: true }).click();
    const claim = page.getByLabel("Time a winner has to buy (seconds)");
    check(!(await claim.isVisible()), `the draw's fields show only for a draw ${at}`);
    const name = `E2E draw ${runId}: made in the form`;
    await page.getByLabel("Name", { exact: true }).fill(name);
    await page.getByLabel("Price", { exact: true }).fill("129");
    await page.getByLabel("Stock", { exact: true }).fill("3");
    await page.getByLabel("How it sells").selectOption("draw");
    check(await claim.isVisible(), `a draw shows when entries open and the time to buy ${at}`);
    await claim.fill("30");
    await page.getByLabel("Proof of work (0 = off)").fill("25");
    await page.getByRole("button", { name: "Create sale" }).click();
    await page.locator("#sale-claim-window-error").filter({ hasText: "60 to 86,400" }).waitFor({ timeout: 3000 });
    check((await claim.getAttribute("aria-invalid")) === "true", `a claim window under 60 s is marked by its field ${at}`);
    check(/0 \(off\) to 24/.test(await page.locator("#sale-proof-error").innerText()), `a proof of work over 24 is marked by its field ${at}`);
    await claim.fill("120");
    await page.getByLabel("Proof of work (0 = off)").fill("8");
    await page.getByLabel("Least account age (seconds, 0 = any)").fill("3600");
    await page.getByRole("button", { name: "Create sale" }).click();
    const created = page.locator('[data-field="create-message"]');
    await created.filter({ hasText: name }).waitFor({ timeout: 5000 });
    const id = /\(#(\d+)\)/.exec(await created.innerText())?.[1];
    const made = (await call("GET", `/api/sales/${id}`, admin.token)).data;
    check(
      made.mode === "draw" && made.claim_window_s === 120 && made.draw_at === made.starts_at && Boolean(made.entries_open_at) &&
        made.proof_of_work === 8 && made.min_account_age_s === 3600,
      `the form creates the draw (${made.mode}, claim ${made.claim_window_s} s, proof ${made.proof_of_work}, age ${made.min_account_age_s}) ${at}`,
    );
    await page.context().close();
  }
} catch (err) {
  check(false, `draws run: ${err.stack || err}`);
}
await finish(browser, "Draws");
