// Every page at desktop (1280x800) and phone (390x844) size, against a running,
// seeded server (scripts/browser-test starts one; scripts/e2e's settings apply):
// - no page scrolls sideways at 390 px;
// - an axe-core scan of every page state finds no violation at all;
// - the fixes of issue 12: the buy box above the fold on a phone and the answer
//   scrolled into view with the focus on it, "Sign in to buy" and `next` kept
//   through sign-up, the sold-out message gone after a top-up, the admin's orders
//   page listing the buyers, admin rows that offer only what makes sense and do
//   not move, plain field errors that clear when fixed, a live home page with
//   countdowns and grouped numbers, "Closed early" on a poll, visible focus on cards.
// Screenshots of every page at both sizes go to E2E_OUT.
// It creates its own sales, poll and users (named "E2E pages ...", "e2ep-...").

import { check, launchChromium, problems, required } from "./lib.mjs";
import { mkdir, readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { randomBytes } from "node:crypto";

const require = createRequire(import.meta.url);
const axeSource = await readFile(require.resolve("axe-core/axe.min.js"), "utf8");
const base = (process.env.STAMPEDE_URL || "http://127.0.0.1:8080").replace(/\/$/, "");
const out = process.env.E2E_OUT || "/tmp/stampede-e2e";
const demoPassword = required("STAMPEDE_DEMO_PASSWORD");
const adminUser = process.env.STAMPEDE_ADMIN_USERNAME || "admin";
const adminPassword = required("STAMPEDE_ADMIN_PASSWORD");
const runId = randomBytes(3).toString("hex");
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const SIZES = [
  ["desktop", DESKTOP],
  ["phone", PHONE],
];

// ---- the API, for setting the scene -----------------------------------------

async function call(method, path, token, body) {
  const resp = await fetch(`${base}${path}`, {
    method,
    headers: {
      Accept: "application/json",
      ...(token ? { Authorization: `Bearer ${token}` } : {}),
      ...(body ? { "Content-Type": "application/json" } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await resp.text();
  return { status: resp.status, data: text ? JSON.parse(text) : null };
}

// A purchase through the API as the sale page makes it: a ticket (sales made here
// require one, the API's default), then the purchase carrying it.
async function buyApi(sale, token) {
  const ticket = await call("POST", `/api/sales/${sale}/ticket`, token);
  if (ticket.status !== 200) return ticket;
  return call("POST", `/api/sales/${sale}/purchase`, token, { ticket: ticket.data.ticket });
}

async function signInApi(username, password) {
  const res = await call("POST", "/api/auth/signin", null, { username, password });
  if (res.status !== 200) throw new Error(`sign-in of ${username}: ${res.status}`);
  return res.data;
}

async function signUpApi(username) {
  const res = await call("POST", "/api/auth/signup", null, { username, password: demoPassword });
  if (res.status !== 201) throw new Error(`sign-up of ${username}: ${res.status}`);
  return signInApi(username, demoPassword);
}

async function createSale(admin, name, stock, startsInMin, endsInMin, imageUrl = null) {
  const now = Date.now();
  const res = await call("POST", "/api/admin/sales", admin.token, {
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

// ---- the browser ------------------------------------------------------------

await mkdir(out, { recursive: true });
const browser = await launchChromium();

/** A page of a new context, signed in as `session` (the sign-in answer) if given. */
async function newPage(viewport, session) {
  const context = await browser.newContext({ viewport, locale: "en-US", timezoneId: "Europe/Berlin" });
  if (session) {
    const url = base;
    await context.addCookies([
      { name: "stampede_session", value: session.token, url, httpOnly: true, sameSite: "Lax" },
      { name: "stampede_csrf", value: session.csrf_token, url, sameSite: "Lax" },
    ]);
  }
  const page = await context.newPage();
  page.on("console", (msg) => {
    if (msg.type() === "error" && !msg.text().startsWith("Failed to load resource")) {
      problems.push(`console error on ${page.url()}: ${msg.text()}`);
    }
  });
  page.on("pageerror", (err) => problems.push(`script error on ${page.url()}: ${err.message}`));
  page.on("dialog", (dialog) => dialog.accept());
  return page;
}

/** Screenshot, sideways-scroll check and axe scan of the page as it is now. */
async function inspect(page, name) {
  const size = page.viewportSize().width < 600 ? "phone" : "desktop";
  const label = `${name} (${size})`;
  const widths = await page.evaluate(() => ({
    scroll: document.documentElement.scrollWidth,
    view: window.innerWidth,
  }));
  check(widths.scroll <= widths.view, `${label}: no sideways scroll (${widths.scroll} <= ${widths.view} px)`);
  if (!(await page.evaluate(() => typeof window.axe === "object"))) await page.evaluate(axeSource);
  const violations = await page.evaluate(async () => {
    const result = await window.axe.run(document, { resultTypes: ["violations"] });
    return result.violations.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
  });
  check(violations.length === 0, `${label}: axe finds no violation${violations.length ? `: ${violations.join("; ")}` : ""}`);
  const path = `${out}/pages-${name}-${size}.png`;
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path, fullPage: true });
  console.log(`     screenshot ${path}`);
}

/** The element's box lies wholly inside the viewport as it is scrolled now. */
async function inViewport(locator) {
  return locator.evaluate((el) => {
    const r = el.getBoundingClientRect();
    return r.top >= 0 && r.left >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth && r.height > 0;
  });
}

async function goto(page, path) {
  await page.goto(`${base}${path}`);
  await page.waitForLoadState("load");
}

try {
  const admin = await signInApi(adminUser, adminPassword);
  const alice = await signInApi("alice", demoPassword);
  const bob = await signInApi("bob", demoPassword);

  // The scene: a live sale with a two-line name, one with a single unit, one
  // that opens in 30 minutes with a stock in the millions, an open poll.
  const longName = `E2E pages ${runId}: Stampede Phone X Pro Max, 512 GB, midnight blue`;
  const liveSale = await createSale(admin, longName, 50, -1, 600, "/static/products/phone.svg");
  const oneUnit = await createSale(admin, `E2E pages ${runId}: last unit`, 1, -1, 600);
  const upcoming = await createSale(admin, `E2E pages ${runId}: opens soon`, 10, 30, 600);
  await call("POST", `/api/admin/sales/${upcoming}/stock`, admin.token, { set: 1234567 });
  const closedSale = await createSale(admin, `E2E pages ${runId}: closed early`, 5, -1, 600);
  await call("POST", `/api/admin/sales/${closedSale}/close`, admin.token);
  const poll = await call("POST", "/api/admin/polls", admin.token, {
    question: `E2E pages ${runId}: which size?`,
    options: ["Small", "Large"],
    opens_at: new Date(Date.now() - 60000).toISOString(),
    closes_at: new Date(Date.now() + 3600000).toISOString(),
  });
  const pollId = poll.data.id;
  check(poll.status === 201, "the poll is created");

  // ---- signed out ----
  for (const [, viewport] of SIZES) {
    const page = await newPage(viewport);
    await goto(page, "/");
    const card = page.locator(`.sale-card[data-sale-id="${upcoming}"]`);
    await card.locator('[data-field="when"]').filter({ hasText: /Opens in \d\d:\d\d/ }).waitFor({ timeout: 5000 });
    check(true, "an upcoming card counts down to its opening");
    check((await card.locator('[data-field="stock-left"]').innerText()) === "1,234,567", "stock numbers are grouped on cards");
    await inspect(page, "home-anonymous");
    // Pictures: the sale's own, or the placeholder; both load.
    const loaded = async (img) => img.evaluate((el) => el.complete && el.naturalWidth > 0);
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

  // `next` survives the header's Sign up and the sign-up itself (on a phone).
  {
    const page = await newPage(PHONE);
    await goto(page, `/sales/${liveSale}`);
    const header = page.getByRole("navigation", { name: "Account" });
    check((await header.getByRole("link", { name: "Sign up" }).getAttribute("href")) === `/signup?next=%2Fsales%2F${liveSale}`, "the header's Sign up keeps the way back");
    await header.getByRole("link", { name: "Sign up" }).click();
    await page.waitForURL(/\/signup\?next=/);
    // Every problem at once, under its field, fields marked; fixed ones clear.
    await page.getByLabel("Username").fill("x");
    await page.getByLabel("Password").fill("short");
    await page.getByRole("button", { name: "Sign up" }).click();
    await page.locator("#username-error").filter({ hasText: /3 to 32/ }).waitFor({ timeout: 3000 });
    check(await page.locator("#password-error").filter({ hasText: /at least 8/ }).isVisible(), "sign-up shows both errors at once");
    check((await page.getByLabel("Username").getAttribute("aria-invalid")) === "true", "the bad username is marked");
    await inspect(page, "signup-errors");
    const name = `e2ep-${runId}`;
    await page.getByLabel("Username").fill(name);
    check((await page.locator("#username-error").innerText()) === "", "the username's error clears once fixed");
    await page.getByLabel("Password").fill(demoPassword);
    await Promise.all([page.waitForURL(`${base}/sales/${liveSale}`), page.getByRole("button", { name: "Sign up" }).click()]);
    check(true, "sign-up from the header returns to the sale");
    const buy = page.getByRole("button", { name: "Buy now" });
    await buy.waitFor({ timeout: 5000 });
    check(await inViewport(buy), "on a phone Buy is on screen without scrolling, even under a two-line name");
    await inspect(page, "sale-live");
    await buy.click();
    const outcome = page.locator('[data-field="outcome"]');
    await outcome.filter({ hasText: /Order placed|Order confirmed/ }).waitFor({ timeout: 5000 });
    await page.waitForTimeout(600); // the smooth scroll
    check(await inViewport(outcome), "the answer to Buy is scrolled into view on a phone");
    check(await outcome.evaluate((el) => el === document.activeElement), "after Buy the focus is on the answer, not the page");
    await outcome.filter({ hasText: "Order confirmed" }).waitFor({ timeout: 20000 });
    await inspect(page, "sale-bought");
    await goto(page, "/me/orders");
    await page.getByRole("link", { name: longName }).waitFor();
    check(await page.getByText("Confirmed", { exact: true }).first().isVisible(), "My orders shows the order's status");
    await inspect(page, "my-orders");
    await page.context().close();
  }

  // Sold out, then a top-up: the message goes and Buy comes back, without a reload.
  {
    const taken = await buyApi(oneUnit, bob.token);
    check(taken.status === 202, "bob takes the last unit");
    const page = await newPage(DESKTOP, alice);
    // The page follows the sale over its event stream: no polling of the sale.
    const asked = { polls: 0, streams: 0 };
    page.on("request", (r) => {
      const path = new URL(r.url()).pathname;
      if (path === `/api/sales/${oneUnit}`) asked.polls += 1;
      if (path === `/api/sales/${oneUnit}/events`) asked.streams += 1;
    });
    const followedSince = Date.now();
    await goto(page, `/sales/${oneUnit}`);
    // Her page loaded before it sold out? Either way the answer must be sold out.
    const button = page.locator('[data-action="buy"]');
    check((await button.innerText()) === "Sold out", "a sold-out sale's button says so");
    await call("POST", `/api/admin/sales/${oneUnit}/stock`, admin.token, { add: 1 });
    await page.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 6000 });
    await call("POST", `/api/admin/sales/${oneUnit}/stock`, admin.token, { set: 0 });
    await page.getByRole("button", { name: "Sold out" }).waitFor({ timeout: 6000 });
    // Now the refusal itself: a stale page presses Buy just after the last unit went.
    await call("POST", `/api/admin/sales/${oneUnit}/stock`, admin.token, { add: 1 });
    await page.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 6000 });
    const carol = await signUpApi(`e2ep-${runId}-c`);
    const last = await buyApi(oneUnit, carol.token);
    check(last.status === 202, "carol takes the topped-up unit");
    await page.getByRole("button", { name: "Buy now" }).click();
    const outcome = page.locator('[data-field="outcome"]');
    await outcome.filter({ hasText: "Sold out" }).waitFor({ timeout: 5000 });
    await inspect(page, "sale-sold-out");
    await call("POST", `/api/admin/sales/${oneUnit}/stock`, admin.token, { add: 2 });
    await page.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 6000 });
    check((await outcome.innerText()).trim() === "", "after a top-up the sold-out message is gone and Buy is back");
    await call("POST", `/api/admin/sales/${oneUnit}/close`, admin.token);
    await page.getByRole("button", { name: "Sale closed" }).waitFor({ timeout: 6000 });
    check(!(await page.getByText("Better luck next time").isVisible()), "after a close no sold-out message stays");
    const followedFor = Math.round((Date.now() - followedSince) / 1000);
    // One read after pressing Buy is the page's own; polling every 2 s would be many.
    check(
      asked.streams >= 1 && asked.polls <= 1,
      `the sale page followed ${followedFor} s of changes over its event stream (${asked.streams} stream, ${asked.polls} reads of the sale)`,
    );
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
    // Keyboard focus on a card is visible.
    let onCard = false;
    for (let i = 0; i < 12 && !onCard; i += 1) {
      await page.keyboard.press("Tab");
      onCard = await page.evaluate(() => document.activeElement?.classList.contains("sale-card") ?? false);
    }
    const ring = await page.evaluate(() => {
      const s = getComputedStyle(document.activeElement);
      return { style: s.outlineStyle, width: parseFloat(s.outlineWidth) };
    });
    check(onCard && ring.style !== "none" && ring.width >= 2, `a focused card shows a focus ring (${ring.style} ${ring.width}px)`);
    await page.screenshot({ path: `${out}/pages-home-card-focus-desktop.png` });
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

  // ---- the admin ----
  for (const [, viewport] of SIZES) {
    const page = await newPage(viewport, admin);
    await goto(page, "/admin");
    const row = (id) => page.locator(`tr[data-sale-id="${id}"]`);
    const closedRow = row(closedSale);
    check(!(await closedRow.getByRole("button", { name: "Close" }).isVisible()), "a closed sale offers no Close");
    check(await closedRow.getByRole("button", { name: "Reopen now" }).isVisible(), "a closed sale offers Reopen now");
    check(!(await row(liveSale).getByRole("button", { name: "Open now" }).isVisible()), "a live sale offers no Open now");
    check(await page.getByText("makes the units left equal").isVisible(), "the page says Set stock sets units left");
    await inspect(page, "admin");
    await page.context().close();
  }
  {
    const page = await newPage(DESKTOP, admin);
    await goto(page, "/admin");
    const order = () => page.locator('[data-field="admin-rows"] tr').evaluateAll((rows) => rows.map((r) => r.dataset.saleId).join(","));
    const before = await order();
    await page.locator(`tr[data-sale-id="${upcoming}"]`).getByRole("button", { name: "Open now" }).click();
    await page.getByText("is open.").waitFor({ timeout: 5000 });
    await page.waitForTimeout(3500); // one refresh of the table
    check((await order()) === before, "rows keep their place after Open now and a refresh");
    // Field errors in plain words, cleared when fixed.
    await page.getByLabel("Ends (your local time)", { exact: true }).fill("2020-01-01T10:00");
    await page.getByRole("button", { name: "Create sale" }).click();
    await page.locator("#sale-name-error").filter({ hasText: "Give the sale a name." }).waitFor({ timeout: 3000 });
    check(await page.locator("#sale-ends-error").filter({ hasText: "in the past" }).isVisible(), "the end in the past is said in plain words");
    check((await page.getByLabel("Name", { exact: true }).getAttribute("aria-invalid")) === "true", "the empty name is marked");
    await page.getByLabel("Name", { exact: true }).fill("Something");
    check((await page.locator("#sale-name-error").innerText()) === "", "the name's error clears once fixed");
    await page.screenshot({ path: `${out}/pages-admin-form-errors-desktop.png` });
    await page.context().close();
  }
  for (const [, viewport] of SIZES) {
    const page = await newPage(viewport, admin);
    await goto(page, `/admin/sales/${oneUnit}/orders`);
    const table = page.locator('[data-field="orders"]');
    await table.waitFor();
    for (const buyer of ["bob", `e2ep-${runId}-c`]) {
      check(await table.getByText(buyer, { exact: true }).isVisible(), `the orders page lists the buyer ${buyer}`);
    }
    await inspect(page, "admin-orders");
    await goto(page, `/admin/polls/${pollId}`);
    check(await page.locator('[data-field="tallies"]').getByText("Large").isVisible(), "the tallies page lists the options");
    await inspect(page, "admin-poll");
    await page.context().close();
  }
} catch (err) {
  problems.push(`aborted: ${err.stack || err.message}`);
} finally {
  await browser.close();
}

if (problems.length) {
  console.error(`\n${problems.length} problem(s):\n- ${problems.join("\n- ")}`);
  process.exit(1);
}
console.log(`\npages run passed; screenshots in ${out}`);
