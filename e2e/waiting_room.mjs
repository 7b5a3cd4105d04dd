// A sale's waiting room (issue 29) in the browser, at 1280x800 and 390x844, against
// a running, seeded server (scripts/browser-test starts one):
// - the opening: a shopper joins the line of a sale that opens a few seconds later,
//   reads that the order is drawn at the opening, then sees "You're in!" with a
//   countdown, buys with the button (the admission's ticket) and finds the order
//   on My orders;
// - a line that moves: three shoppers ahead (one admitted, the only unit held for
//   them), the page's shopper joins and reads "2 people ahead of you"; the admin
//   tops the stock up unit by unit, each admitting the next, and the page counts
//   down to "You're in!" from the sale's event stream alone: it asks the shop where
//   it stands only once its turn has come;
// - the estimate (issue 50): a range, "at the soonest" when the turn needs passes,
//   the place agreeing with the people ahead, the chance against the units left;
// - let in, the shopper is called back: the title blinks until the tab is focused,
//   a beep, a vibration, a notification once asked for (the browser's APIs
//   recorded); a line paused and closed by the admin, as the shopper reads it;
// - signed out, the page offers to sign in to join the line;
// - the sale's admin page lists the line's numbers ("0 waiting for 4 units left")
//   and pauses, resumes, closes and reopens the line with its buttons; the admin form creates a
//   waiting-room sale (its fields show once ticked; a line opening after the sale
//   is refused by its field);
// - a sale's edit form adds a waiting room to an upcoming sale (a line opening
//   early, a rate; only the changed fields are sent, wrong values are refused by
//   their fields), and shows an opened sale's waiting room disabled.
// Every state shown is scanned with axe-core and must not scroll sideways; the
// screenshots (pages-sale-queue-*, pages-admin-sale-queue-*, pages-admin-sale-edit-queue-*,
// pages-admin-sale-open-queue-*) go to E2E_OUT.
// It creates its own sales and users (named "E2E queue ...", "e2eq-...").

import { accounts, call, check, goto, inspect, isInViewport, launchChromium, newContextPage, out, problems, signInApi, signUpApi as signUpWith, until, finish } from "./lib.mjs";
import { mkdir } from "node:fs/promises";
import { randomBytes } from "node:crypto";

const { demoPassword, adminUser, adminPassword } = accounts();
const runId = randomBytes(3).toString("hex");
const SIZES = [
  ["desktop", { width: 1280, height: 800 }],
  ["phone", { width: 390, height: 844 }],
];

// ---- the API, for setting the scene -----------------------------------------

const signUpApi = (username) => signUpWith(username, demoPassword);

/** A sale with a waiting room whose line is open, opening `startsInS` from now. */
async function queueSale(admin, name, stock, startsInS, rate) {
  const now = Date.now();
  const res = await call("POST", "/api/admin/sales", admin.token, {
    name,
    description: "Made by e2e/waiting_room.mjs.",
    price_cents: 4_900,
    stock,
    starts_at: new Date(now + startsInS * 1000).toISOString(),
    ends_at: new Date(now + 3600 * 1000).toISOString(),
    waiting_room: true,
    queue_opens_at: new Date(Math.min(now - 60 * 1000, now + startsInS * 1000)).toISOString(),
    admit_per_second: rate,
  });
  if (res.status !== 201) throw new Error(`create sale: ${res.status} ${JSON.stringify(res.data)}`);
  return res.data.id;
}

const standing = async (sale, user) => (await call("GET", `/api/sales/${sale}/queue/me`, user.token)).data;

// ---- the browser ------------------------------------------------------------

await mkdir(out, { recursive: true });
const browser = await launchChromium();
const newPage = (viewport, session) => newContextPage(browser, viewport, session);

/** Counts the page's reads of its standing (`GET .../queue/me`). */
function countStandingReads(page, sale) {
  const counted = { reads: 0 };
  page.on("request", (r) => {
    if (r.method() === "GET" && new URL(r.url()).pathname === `/api/sales/${sale}/queue/me`) counted.reads += 1;
  });
  return counted;
}

try {
  const admin = await signInApi(adminUser, adminPassword);

  // ---- the opening: join early, the draw, "You're in!", Buy, My orders ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const name = `E2E queue ${runId}: the opening (${size})`;
    const shopper = await signUpApi(`e2eq-${runId}-o-${size}`);
    const page = await newPage(viewport, shopper);
    // Opens in a few seconds: time to load the page, join and scan it first.
    const sale = await queueSale(admin, name, 1, 6, 1000);
    await goto(page, `/sales/${sale}`);
    const status = page.locator('[data-field="queue-status"]');
    const join = page.getByRole("button", { name: "Join the line" });
    await join.waitFor({ timeout: 5000 });
    check(await page.getByText("gets a place drawn at random").isVisible(), `before the opening the page says early joiners are drawn at random ${at}`);
    check(await page.evaluate(isInViewport, await join.elementHandle()), `Join the line is on screen without scrolling ${at}`);
    await join.click();
    await status.filter({ hasText: "You're in the line." }).waitFor({ timeout: 5000 });
    check(
      await page.getByText(/The order is drawn at random when the sale opens at \d/).isVisible(),
      `after joining the page says the order is drawn at the opening ${at}`,
    );
    check(await page.locator('[data-field="queue-standing"]').evaluate((el) => el === document.activeElement), `after Join the focus is on the standing ${at}`);
    check(!(await page.getByRole("button", { name: "Buy now" }).isVisible()), `no Buy while in the line ${at}`);
    await inspect(page, "sale-queue-joined");
    check(Date.now() < Date.parse((await call("GET", `/api/sales/${sale}`)).data.starts_at), `the joined state was seen before the opening ${at}`);

    // The opening: the draw, then the admission (stock 1, one shopper: ours).
    await status.filter({ hasText: "You're in!" }).waitFor({ timeout: 15000 });
    const buy = page.getByRole("button", { name: "Buy now" });
    check(await buy.isEnabled(), `at the opening the page says You're in! and offers Buy ${at}`);
    const countdown = page.locator('[data-field="queue-expiry-time"]');
    const first = await countdown.innerText();
    await page.waitForFunction(([el, was]) => el.textContent !== was, [await countdown.elementHandle(), first], { timeout: 3000 });
    check(/^00:[0-3]\d$/.test(await countdown.innerText()), `the admission counts down (${first} -> ${await countdown.innerText()}) ${at}`);
    check(await page.evaluate(isInViewport, await buy.elementHandle()), `Buy is on screen without scrolling ${at}`);
    await inspect(page, "sale-queue-admitted");

    const sent = [];
    page.on("request", (r) => {
      if (r.method() === "POST" && new URL(r.url()).pathname === `/api/sales/${sale}/purchase`) sent.push(r.postDataJSON());
    });
    await buy.click();
    const outcome = page.locator('[data-field="outcome"]');
    await outcome.filter({ hasText: /Order placed|Order confirmed/ }).waitFor({ timeout: 5000 });
    check(sent.length === 1 && typeof sent[0].ticket === "string", `Buy sends the admission's ticket ${at}`);
    await status.filter({ hasText: "You bought from this sale." }).waitFor({ timeout: 5000 });
    await outcome.filter({ hasText: "Order confirmed" }).waitFor({ timeout: 20000 });
    await inspect(page, "sale-queue-bought");
    await goto(page, "/me/orders");
    await page.getByRole("link", { name }).waitFor({ timeout: 5000 });
    check(true, `My orders lists the order from the waiting room ${at}`);
    // Cancelled: the line's panel says how it ended and that the turn bought once,
    // not "You bought from this sale" (queue/me still says bought).
    const [order] = (await call("GET", "/api/me/orders", shopper.token)).data;
    const cancelled = await call("POST", `/api/orders/${order.id}/cancel`, shopper.token);
    check(cancelled.status === 200, `the shopper cancels the order (${cancelled.status}) ${at}`);
    await goto(page, `/sales/${sale}`);
    await status.filter({ hasText: "You cancelled your order." }).waitFor({ timeout: 10000 });
    const detail = await page.locator('[data-field="queue-detail"]').innerText();
    check(
      detail.startsWith("A turn in the line buys once: a returned order does not give another.") &&
        (await page.getByText("A turn in the line buys once").count()) === 1,
      `after a cancel the line's panel (alone) says the turn bought once: "${detail}" ${at}`,
    );
    // The unit is offered again (units offered do not move), and the page says so.
    await page.waitForFunction(
      () =>
        document.querySelector('[data-field="stock-left"]')?.textContent === "1" &&
        document.querySelector('[data-field="stock-total"]')?.textContent === "1",
      null,
      { timeout: 10000 },
    );
    check(true, `after the cancel the page shows 1 of 1 left ${at}`);
    await inspect(page, "sale-queue-cancelled");
    await page.context().close();
  }

  // ---- a line that moves, followed live ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const sale = await queueSale(admin, `E2E queue ${runId}: a long line (${size})`, 1, -60, 1);
    const [first, second, third, shopper] = await Promise.all(
      ["a", "b", "c", "s"].map((who) => signUpApi(`e2eq-${runId}-${who}-${size}`)),
    );
    // The first is admitted (the admitter picks a new sale up within 2 s), holding
    // the only unit; the next two wait behind.
    await call("POST", `/api/sales/${sale}/queue`, first.token);
    await until("the first shopper's admission", async () => (await standing(sale, first)).state === "admitted");
    await call("POST", `/api/sales/${sale}/queue`, second.token);
    await call("POST", `/api/sales/${sale}/queue`, third.token);

    // Signed out: the page offers to sign in to join.
    const anonymous = await newPage(viewport);
    await goto(anonymous, `/sales/${sale}`);
    const signIn = anonymous.getByRole("link", { name: "Sign in to join the line" });
    check(
      (await signIn.isVisible()) && (await signIn.getAttribute("href")) === `/signin?next=%2Fsales%2F${sale}`,
      `signed out, the waiting room offers to sign in and come back ${at}`,
    );
    await inspect(anonymous, "sale-queue-anonymous");
    await anonymous.context().close();

    const page = await newPage(viewport, shopper);
    const counted = countStandingReads(page, sale);
    await goto(page, `/sales/${sale}`);
    const status = page.locator('[data-field="queue-status"]');
    await page.getByRole("button", { name: "Join the line" }).waitFor({ timeout: 5000 });
    check(await page.getByText("2 people waiting").isVisible(), `the open line says how many wait ${at}`);
    await inspect(page, "sale-queue-open");
    await page.getByRole("button", { name: "Join the line" }).click();
    // One unit, held by the first let in, two ahead: the turn needs passes (30 s
    // each), so the page gives the soonest and says the chance (issue 50).
    await status.filter({ hasText: /^2 people ahead of you: (\d+ s|\d+ min) at the soonest\.$/ }).waitFor({ timeout: 5000 });
    check(
      await page.getByText("You were number 4 in the line; 1 let in before you.").isVisible(),
      `joined, the place agrees with the people ahead (4 = 1 let in + 2 ahead + 1) ${at}`,
    );
    const chance = page.locator('[data-field="queue-chance"]');
    check(
      (await chance.innerText()) === "1 unit left for 3 shoppers before you (1 let in, 2 waiting): you may not get one.",
      `the page sets the line against the units left (${await chance.innerText()}) ${at}`,
    );
    const soonest = Number(/(\d+) s at the soonest/.exec(await status.innerText())?.[1] ?? 60);
    check(soonest >= 50, `the soonest counts the turns held and passed, 30 s each (${await status.innerText()}) ${at}`);
    await inspect(page, "sale-queue-waiting");

    // Each unit added admits the next in line; the page follows the event stream,
    // and asks for a fresh estimate at most every 10 s.
    const readsAfterJoin = counted.reads;
    const followedFrom = Date.now();
    const refreshes = () => 1 + Math.floor((Date.now() - followedFrom) / 10000);
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { add: 1 });
    await status.filter({ hasText: /^1 person ahead of you/ }).waitFor({ timeout: 8000 });
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { add: 1 });
    await status.filter({ hasText: /^You're next/ }).waitFor({ timeout: 8000 });
    check(counted.reads - readsAfterJoin < refreshes(), `the place moved on from the event stream (${counted.reads - readsAfterJoin} reads of the standing) ${at}`);
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { add: 1 });
    await status.filter({ hasText: "You're in!" }).waitFor({ timeout: 8000 });
    check(
      counted.reads - readsAfterJoin <= 1 + refreshes(),
      `the page asked where it stands once its turn came, and for the estimate every 10 s (${counted.reads - readsAfterJoin} reads) ${at}`,
    );

    // The admin's view of the line: 4 in line, 3 admitted and open, 1 waiting... then
    // the shopper's admission too.
    const adminPage = await newPage(viewport, admin);
    await goto(adminPage, `/admin/sales/${sale}`);
    const fact = (name) => adminPage.locator(`[data-line="${name}"]`).innerText();
    check(
      (await fact("line")) === "4" && (await fact("admitted")) === "4" && (await fact("open")) === "4" && (await fact("waiting")) === "0",
      `the sale's admin page lists the line (${await fact("line")} in line, ${await fact("admitted")} admitted, ${await fact("open")} open, ${await fact("waiting")} waiting) ${at}`,
    );
    check(await adminPage.getByText("1 a second").isVisible(), `the admin page shows the admission rate ${at}`);
    const summary = adminPage.locator('[data-field="line-summary"]');
    check((await summary.innerText()) === "0 waiting for 4 units left", `the admin page sets the line against the stock (${await summary.innerText()}) ${at}`);
    await inspect(adminPage, "admin-sale-queue");
    // The line's controls: pause and resume, close and reopen, each saying what it did.
    const lineState = adminPage.locator('[data-field="line-state"]');
    const lineOf = async () => (await call("GET", `/api/sales/${sale}`)).data.line;
    await adminPage.getByRole("button", { name: "Pause the line" }).click();
    await lineState.filter({ hasText: "Paused: nobody is let in; open to new joins." }).waitFor({ timeout: 5000 });
    check((await lineOf()).paused === true, `Pause the line pauses it ${at}`);
    const resume = adminPage.getByRole("button", { name: "Resume the line" });
    check((await resume.isVisible()) && (await resume.evaluate((el) => el === document.activeElement)), `paused, Resume shows and takes the focus ${at}`);
    await inspect(adminPage, "admin-sale-queue-paused");
    await resume.click();
    await lineState.filter({ hasText: "Letting shoppers in; open to new joins." }).waitFor({ timeout: 5000 });
    await adminPage.getByRole("button", { name: "Close the line to new joins" }).click();
    await lineState.filter({ hasText: "Letting shoppers in; closed to new joins." }).waitFor({ timeout: 5000 });
    const closed = await lineOf();
    check(closed.paused === false && closed.joins_closed === true, `resumed, then closed to new joins (${JSON.stringify(closed)}) ${at}`);
    await adminPage.getByRole("button", { name: "Reopen the line" }).click();
    await lineState.filter({ hasText: "Letting shoppers in; open to new joins." }).waitFor({ timeout: 5000 });
    check((await lineOf()).joins_closed === false, `Reopen the line reopens it ${at}`);
    await adminPage.context().close();
    await page.context().close();
  }

  // ---- let in: the shopper is called back; a paused line and a closed one ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const sale = await queueSale(admin, `E2E queue ${runId}: called back (${size})`, 1, -60, 5);
    const [first, shopper, late] = await Promise.all(["f", "t", "l"].map((who) => signUpApi(`e2eq-${runId}-${who}-${size}`)));
    await call("POST", `/api/sales/${sale}/queue`, first.token);
    await until("the first shopper's admission", async () => (await standing(sale, first)).state === "admitted");

    const page = await newPage(viewport, shopper);
    // What the browser would do, recorded: the notification (permission asked,
    // then given), the vibration, the beep; and a tab in the background.
    await page.addInitScript(() => {
      window.__calledBack = { notes: [], vibrations: [], tones: 0, asked: 0 };
      class FakeNotification {
        static permission = "default";
        static async requestPermission() {
          window.__calledBack.asked += 1;
          FakeNotification.permission = "granted";
          return "granted";
        }
        constructor(title, options) {
          window.__calledBack.notes.push({ title, body: options && options.body });
        }
        close() {}
      }
      window.Notification = FakeNotification;
      navigator.vibrate = (pattern) => {
        window.__calledBack.vibrations.push(pattern);
        return true;
      };
      const Real = window.AudioContext;
      window.AudioContext = class extends Real {
        createOscillator() {
          const tone = super.createOscillator();
          const start = tone.start.bind(tone);
          tone.start = (...a) => {
            window.__calledBack.tones += 1;
            return start(...a);
          };
          return tone;
        }
      };
      document.hasFocus = () => window.__focused === true;
    });
    await goto(page, `/sales/${sale}`);
    const status = page.locator('[data-field="queue-status"]');
    await page.getByRole("button", { name: "Join the line" }).click();
    await status.filter({ hasText: /^You're next: .* at the soonest\.$/ }).waitFor({ timeout: 5000 });
    const chance = page.locator('[data-field="queue-chance"]');
    check((await chance.innerText()) === "1 unit left for 1 shopper before you (1 let in): you may not get one.", `the chance is said (${await chance.innerText()}) ${at}`);
    check(/^You're next: \d+ s at the soonest\.$/.test(await status.innerText()), `the wait in whole seconds (${await status.innerText()}) ${at}`);

    // The opt-in: asked once, then said.
    const notify = page.getByRole("button", { name: "Notify me when it's my turn" });
    check(await notify.isVisible(), `waiting, the page offers a notification ${at}`);
    await notify.click();
    await page.getByText("You'll get a notification when it's your turn.").waitFor({ timeout: 3000 });
    check(!(await notify.isVisible()) && (await page.evaluate(() => window.__calledBack.asked)) === 1, `the permission is asked once and the button goes ${at}`);
    await inspect(page, "sale-queue-chance");

    // Paused by the admin: the page says so (from the event stream).
    await call("POST", `/api/admin/sales/${sale}/line`, admin.token, { action: "pause" });
    await status.filter({ hasText: "The line is paused." }).waitFor({ timeout: 8000 });
    check(await page.getByText(/The shop has paused the line: nobody is let in until it resumes\. Your place is kept/).isVisible(), `a paused line is said ${at}`);
    check(!(await chance.isVisible()), `paused, no estimate or chance is given ${at}`);
    await inspect(page, "sale-queue-paused");
    await call("POST", `/api/admin/sales/${sale}/line`, admin.token, { action: "resume" });
    await status.filter({ hasText: /at the soonest/ }).waitFor({ timeout: 8000 });

    // A unit added: let in, called back by every way the browser allows.
    await call("POST", `/api/admin/sales/${sale}/stock`, admin.token, { add: 1 });
    await status.filter({ hasText: "You're in!" }).waitFor({ timeout: 10000 });
    const called = await page.evaluate(() => window.__calledBack);
    check(
      called.notes.length === 1 && called.notes[0].title === "Your turn: buy now!" && /you have \d+ s to buy/.test(called.notes[0].body),
      `let in, a notification (${JSON.stringify(called.notes)}) ${at}`,
    );
    check(called.vibrations.length === 1 && called.tones >= 1, `a vibration and a beep (${called.vibrations.length}, ${called.tones} tones) ${at}`);
    check((await page.title()).startsWith("▶ Your turn: buy now!"), `the tab's title calls the shopper back (${await page.title()}) ${at}`);
    await page.waitForFunction(() => !document.title.startsWith("▶"), null, { timeout: 3000 });
    await page.waitForFunction(() => document.title.startsWith("▶"), null, { timeout: 3000 });
    check(true, `the title blinks while the tab is in the background ${at}`);
    await page.evaluate(() => {
      window.__focused = true;
      window.dispatchEvent(new Event("focus"));
    });
    check(!(await page.title()).startsWith("▶"), `focused, the title is the page's again (${await page.title()}) ${at}`);
    await inspect(page, "sale-queue-called-back");
    await page.context().close();

    // Closed to new joins: a newcomer reads it, and has no Join button.
    await call("POST", `/api/admin/sales/${sale}/line`, admin.token, { action: "close" });
    const newcomer = await newPage(viewport, late);
    await goto(newcomer, `/sales/${sale}`);
    const lateStatus = newcomer.locator('[data-field="queue-status"]');
    await lateStatus.filter({ hasText: "The line is closed." }).waitFor({ timeout: 8000 });
    // The page follows the sale's shared stream, whose reading may lag the close by
    // one interval (1 s): the Join button must be gone within a deadline.
    const joinGone = await newcomer
      .getByRole("button", { name: "Join the line" })
      .waitFor({ state: "hidden", timeout: 8000 })
      .then(() => true, () => false);
    check(joinGone, `a closed line offers no Join ${at}`);
    const refused = await call("POST", `/api/sales/${sale}/queue`, late.token);
    check(refused.status === 409 && refused.data.error === "line_closed", `a closed line refuses a join with 409 line_closed (${refused.status} ${refused.data.error}) ${at}`);
    await inspect(newcomer, "sale-queue-closed");
    await newcomer.context().close();
  }

  // ---- the admin form: a sale with a waiting room ----
  {
    const [size, viewport] = SIZES[0];
    const at = `at ${viewport.width}x${viewport.height}`;
    const page = await newPage(viewport, admin);
    await goto(page, "/admin");
    await page.getByText("New sale", { exact: true }).click();
    const opens = page.getByLabel(/^Line opens \(your local time/);
    check(!(await opens.isVisible()), `the waiting room's fields show only once ticked ${at}`);
    const name = `E2E queue ${runId}: made in the form (${size})`;
    await page.getByLabel("Name", { exact: true }).fill(name);
    await page.getByLabel("Price", { exact: true }).fill("9.99");
    await page.getByLabel("Stock", { exact: true }).fill("20");
    await page.getByLabel(/Waiting room/).check();
    check(await opens.isVisible(), `ticked, the line's fields show ${at}`);
    const starts = await page.getByLabel(/^Opens \(your local time/).inputValue();
    check((await opens.inputValue()) === starts, `the line opens with the sale unless set earlier (${await opens.inputValue()}) ${at}`);
    // A line that opens after the sale is refused by its field.
    const later = await page.evaluate((s) => {
      const d = new Date(new Date(s).getTime() + 3600000);
      const pad = (n) => String(n).padStart(2, "0");
      return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
    }, starts);
    await opens.fill(later);
    await page.getByRole("button", { name: "Create sale" }).click();
    await page.locator("#sale-queue-opens-error").filter({ hasText: "at or before the sale opens" }).waitFor({ timeout: 3000 });
    check((await opens.getAttribute("aria-invalid")) === "true", `a line opening after the sale is marked by its field ${at}`);
    await opens.fill(starts);
    await page.getByLabel("Shoppers let in a second").fill("250");
    // The form from the top of the page, so the sticky header stays out of the picture.
    await page.evaluate(() => window.scrollTo(0, 0));
    const box = await page.locator('form[data-form="create-sale"]').evaluate((form) => {
      const r = form.getBoundingClientRect();
      return { x: r.x + scrollX - 8, y: r.y + scrollY - 8, width: r.width + 16, height: r.height + 16 };
    });
    await page.screenshot({ path: `${out}/pages-admin-sale-form-queue-${size}.png`, fullPage: true, clip: box });
    await page.getByRole("button", { name: "Create sale" }).click();
    const created = page.locator('[data-field="create-message"]');
    await created.filter({ hasText: name }).waitFor({ timeout: 5000 });
    const id = /\(#(\d+)\)/.exec(await created.innerText())?.[1];
    const made = (await call("GET", `/api/sales/${id}`)).data;
    check(
      made.waiting_room === true && made.admit_per_second === 250 && made.queue_opens_at === made.starts_at,
      `the form creates the waiting room (${made.waiting_room}, ${made.admit_per_second} a second, line opens ${made.queue_opens_at}) ${at}`,
    );
    check(!(await opens.isVisible()), `the form is ready for the next sale ${at}`);
    await page.context().close();
  }

  // ---- the edit form: a waiting room added before the opening, fixed after ----
  for (const [size, viewport] of SIZES) {
    const at = `at ${viewport.width}x${viewport.height}`;
    const now = Date.now();
    const made = await call("POST", "/api/admin/sales", admin.token, {
      name: `E2E queue ${runId}: a line added (${size})`,
      description: "Made by e2e/waiting_room.mjs.",
      price_cents: 4_900,
      stock: 10,
      starts_at: new Date(now + 2 * 3600 * 1000).toISOString(),
      ends_at: new Date(now + 5 * 3600 * 1000).toISOString(),
      requires_ticket: false,
    });
    if (made.status !== 201) throw new Error(`create sale: ${made.status} ${JSON.stringify(made.data)}`);
    const sale = made.data.id;
    const page = await newPage(viewport, admin);
    await goto(page, `/admin/sales/${sale}`);
    const form = page.locator('form[data-form="edit-sale"]');
    const box = form.getByLabel(/Waiting room/);
    const opens = form.getByLabel(/^Line opens \(your local time/);
    const rate = form.getByLabel("Shoppers let in a second");
    const ticket = form.getByLabel("Require a purchase ticket");
    check(
      !(await box.isChecked()) && (await box.isEnabled()) && !(await opens.isVisible()) && !(await rate.isVisible()),
      `an upcoming sale without a waiting room: the box unticked, the line's fields hidden ${at}`,
    );
    check(!(await ticket.isChecked()) && (await ticket.isEnabled()), `its ticket box is the admin's to tick ${at}`);
    await box.check();
    check((await opens.isVisible()) && (await rate.isVisible()), `ticked, the line's fields show ${at}`);
    const starts = await form.getByLabel(/^Opens \(your local time/).inputValue();
    check((await opens.inputValue()) === starts, `the line opens with the sale unless set earlier (${await opens.inputValue()}) ${at}`);
    check((await ticket.isChecked()) && (await ticket.isDisabled()), `with a waiting room the ticket box is ticked and held ${at}`);

    // Refused by their fields: a rate out of range, a line opening after the sale.
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
      if (r.method() === "PATCH" && new URL(r.url()).pathname === `/api/admin/sales/${sale}`) patches.push(r.postDataJSON());
    });
    await rate.fill("0");
    await opens.fill(await shift(starts, 30));
    await form.getByRole("button", { name: "Save changes" }).click();
    await form.locator("#edit-admit-rate-error").filter({ hasText: "1 to 100,000" }).waitFor({ timeout: 3000 });
    await form.locator("#edit-queue-opens-error").filter({ hasText: "at or before the sale opens" }).waitFor({ timeout: 3000 });
    check(
      (await rate.getAttribute("aria-invalid")) === "true" && (await opens.getAttribute("aria-invalid")) === "true",
      `a rate of 0 and a line opening after the sale are marked by their fields ${at}`,
    );
    check(patches.length === 0, `nothing is sent while a field is wrong ${at}`);

    // The line opens a quarter of an hour early and lets 300 in a second.
    const earlier = await shift(starts, -15);
    await opens.fill(earlier);
    await rate.fill("300");
    check(
      (await rate.getAttribute("aria-invalid")) === null && (await opens.getAttribute("aria-invalid")) === null,
      `fixed, the fields' errors go ${at}`,
    );
    check(
      (await form.locator('[data-field="edit-message"]').innerText()) === "",
      `and so does the form's "check the fields" ${at}`,
    );
    await inspect(page, "admin-sale-edit-queue");
    // The form from the top of the page, so the sticky header stays out of the picture.
    await page.evaluate(() => window.scrollTo(0, 0));
    const clip = await form.evaluate((el) => {
      const r = el.getBoundingClientRect();
      return { x: Math.max(0, r.x + scrollX - 8), y: r.y + scrollY - 8, width: r.width + 16, height: r.height + 16 };
    });
    await page.screenshot({ path: `${out}/pages-admin-sale-edit-queue-form-${size}.png`, fullPage: true, clip });
    await form.getByRole("button", { name: "Save changes" }).click();
    await page.locator('[data-field="history"]').getByText("waiting_room: false → true").waitFor({ timeout: 8000 });
    const wanted = await page.evaluate((v) => new Date(v).toISOString(), earlier);
    const sent = patches[0] || {};
    check(
      patches.length === 1 && JSON.stringify(Object.keys(sent).sort()) === JSON.stringify(["admit_per_second", "queue_opens_at", "requires_ticket", "waiting_room"]),
      `the form sends only what changed (${JSON.stringify(sent)}) ${at}`,
    );
    const edited = (await call("GET", `/api/sales/${sale}`)).data;
    check(
      edited.waiting_room === true &&
        edited.admit_per_second === 300 &&
        Date.parse(edited.queue_opens_at) === Date.parse(wanted) &&
        edited.requires_ticket === true &&
        Date.parse(edited.starts_at) === Date.parse(made.data.starts_at),
      `the API shows the waiting room (${edited.waiting_room}, ${edited.admit_per_second} a second, line opens ${edited.queue_opens_at}, wanted ${wanted}, ticket ${edited.requires_ticket}) ${at}`,
    );
    // The page after the save (reloaded): the form as saved, the line's panel.
    await page.waitForLoadState("load");
    check(
      (await box.isChecked()) && (await opens.inputValue()) === earlier && (await rate.inputValue()) === "300",
      `after the save the form shows the waiting room as saved ${at}`,
    );
    check(await page.getByText("300 a second").isVisible(), `the line's panel shows the new rate ${at}`);
    // Unticked again (not saved): the fields go, the ticket box is the admin's again.
    await box.uncheck();
    check(!(await opens.isVisible()) && (await ticket.isEnabled()), `unticked, the line's fields hide and the ticket box is free ${at}`);
    await page.context().close();

    // An opened sale: the waiting room is fixed.
    const open = await queueSale(admin, `E2E queue ${runId}: opened, fixed (${size})`, 5, -60, 7);
    const openPage = await newPage(viewport, admin);
    await goto(openPage, `/admin/sales/${open}`);
    const openForm = openPage.locator('form[data-form="edit-sale"]');
    const fixed = [
      openForm.getByLabel(/Waiting room/),
      openForm.getByLabel(/^Line opens \(your local time/),
      openForm.getByLabel("Shoppers let in a second"),
      openForm.getByLabel("Require a purchase ticket"),
    ];
    const states = await Promise.all(fixed.map(async (l) => (await l.isVisible()) && (await l.isDisabled())));
    check(states.every(Boolean), `once open the waiting room, its line's opening, its rate and the ticket box show disabled (${states}) ${at}`);
    check(
      (await fixed[0].isChecked()) && (await fixed[2].inputValue()) === "7" && (await fixed[1].inputValue()) !== "",
      `once open the fields still show the sale's waiting room ${at}`,
    );
    check(!(await openForm.getByLabel("Name", { exact: true }).isDisabled()), `once open the name can still change ${at}`);
    await inspect(openPage, "admin-sale-open-queue");
    await openPage.context().close();
  }
} catch (err) {
  problems.push(`aborted: ${err.stack || err.message}`);
}
await finish(browser, "waiting room");
