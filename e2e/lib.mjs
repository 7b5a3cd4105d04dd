// Shared by the browser checks (smoke.mjs, pages.mjs, redirect.mjs,
// waiting_room.mjs): the environment, the list of failed checks, Debian's Chromium
// with the flags the project allows (never a browser of playwright's own), the API
// calls that set a scene, and the page helpers (a watched page, a screenshot, the
// sideways-scroll and axe-core inspection of a page state). Every page made by
// `newContextPage` is measured for sideways scroll in every state it reaches (after
// its load and after every change to its DOM or size), not only where a script
// calls `inspect`.
import { chromium } from "playwright-core";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";

export function required(name) {
  const value = process.env[name];
  if (!value) {
    console.error(`set ${name}`);
    process.exit(2);
  }
  return value;
}

/** The server under test, without a trailing slash. */
export const base = (process.env.STAMPEDE_URL || "http://127.0.0.1:8080").replace(/\/$/, "");
/** Where screenshots go. */
export const out = process.env.E2E_OUT || "/tmp/stampede-e2e";

/** The seeded accounts' passwords and the admin's name, which the run must be given. */
export function accounts() {
  return {
    demoPassword: required("STAMPEDE_DEMO_PASSWORD"),
    adminUser: process.env.STAMPEDE_ADMIN_USERNAME || "admin",
    adminPassword: required("STAMPEDE_ADMIN_PASSWORD"),
  };
}

export const problems = [];

export function check(ok, what) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) problems.push(what);
}

/**
 * Ends a run: closes the browser, lists the problems and exits 1 if there are any,
 * else says the run passed.
 */
export async function finish(browser, run) {
  await browser.close();
  if (problems.length) {
    console.error(`\n${problems.length} problem(s):\n- ${problems.join("\n- ")}`);
    process.exit(1);
  }
  console.log(`\n${run} run passed; screenshots in ${out}`);
}

export function launchChromium() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-quic",
    ],
  });
}

// ---- the API, for setting the scene -----------------------------------------

/** A JSON call to the API: its status and parsed body (null when empty). */
export async function call(method, path, token, body) {
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

/** Signs in through the API (must answer 200): the sign-in answer (tokens). */
export async function signInApi(username, password) {
  const res = await call("POST", "/api/auth/signin", null, { username, password });
  if (res.status !== 200) throw new Error(`sign-in of ${username}: ${res.status}`);
  return res.data;
}

/** Signs up through the API (must answer 201), then signs in: the sign-in answer. */
export async function signUpApi(username, password) {
  const res = await call("POST", "/api/auth/signup", null, { username, password });
  if (res.status !== 201) throw new Error(`sign-up of ${username}: ${res.status}`);
  return signInApi(username, password);
}

/** Asks `cond` every 100 ms until it holds; fails after `timeout` ms. */
export async function until(what, cond, timeout = 10000) {
  const end = Date.now() + timeout;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// ---- the browser ------------------------------------------------------------

/**
 * Runs in every page before its own scripts: after the load, a resize and every
 * change to the DOM (measured two frames later, once the layout has settled), the
 * page's width (`documentElement.scrollWidth`) must not pass the viewport's
 * (`innerWidth`); a state that does is reported once to `__e2eSideways` with the
 * element that sticks out furthest. Only while the window is `width` wide, the
 * context's viewport: a full-page screenshot briefly lays the page out at other
 * sizes (a state no reader sees), and measured then it reported a page of 212 px
 * in a 1360 px viewport.
 */
function watchSidewaysScroll(width) {
  window.__e2eSidewaysWatch = true;
  const reported = new Set();
  let queued = false;
  const name = (el) =>
    `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ""}${[...el.classList].map((c) => `.${c}`).join("")}` +
    (el.dataset.field ? `[data-field=${el.dataset.field}]` : "") +
    ` "${(el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 40)}"`;
  const measure = () => {
    queued = false;
    const doc = document.documentElement;
    if (!doc || !document.body) return;
    const view = window.innerWidth;
    const scroll = doc.scrollWidth;
    if (view !== width || scroll <= view) return;
    // The deepest element whose box passes the viewport's right edge the furthest.
    let worst = null;
    let right = view;
    for (const el of document.body.querySelectorAll("*")) {
      const r = el.getBoundingClientRect().right + window.scrollX;
      if (r > right || (worst && r === right && worst.contains(el))) {
        worst = el;
        right = r;
      }
    }
    const what = worst ? name(worst) : "?";
    const key = `${location.pathname}${location.search}|${scroll}|${what}`;
    if (reported.has(key)) return;
    reported.add(key);
    window.__e2eSideways?.({ url: location.href, scroll, view, what, right: Math.round(right) });
  };
  const queue = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => requestAnimationFrame(measure));
  };
  new MutationObserver(queue).observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
  addEventListener("load", queue);
  addEventListener("resize", queue);
}

/**
 * A page of a new context of `browser` (en-US, Berlin time), signed in as `session`
 * (the sign-in answer) if given. A console error other than Chrome's "Failed to load
 * resource" (which it logs for every 4xx answer, and the checks provoke those on
 * purpose), such as a CSP "Refused to ..." message, and any script error are
 * problems; dialogs are accepted. Every state of the page is watched for sideways
 * scroll (`watchSidewaysScroll`): one that scrolls is a problem.
 */
export async function newContextPage(browser, viewport, session) {
  const context = await browser.newContext({ viewport, locale: "en-US", timezoneId: "Europe/Berlin" });
  await context.exposeBinding("__e2eSideways", (_source, seen) => {
    check(
      false,
      `no sideways scroll at ${viewport.width} px on ${seen.url}: the page is ${seen.scroll} px wide; ${seen.what} reaches ${seen.right} px`,
    );
  });
  await context.addInitScript(watchSidewaysScroll, viewport.width);
  if (session) {
    await context.addCookies([
      { name: "stampede_session", value: session.token, url: base, httpOnly: true, sameSite: "Lax" },
      { name: "stampede_csrf", value: session.csrf_token, url: base, sameSite: "Lax" },
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

/** Loads `path` of the server and waits for the load event. */
export async function goto(page, path) {
  await page.goto(`${base}${path}`);
  await page.waitForLoadState("load");
}

/** A full-page screenshot from the top, to `path`. */
export async function screenshot(page, path) {
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path, fullPage: true });
  console.log(`     screenshot ${path}`);
}

let axeSource;

/**
 * Screenshot (`pages-<name>-<size>.png`), sideways-scroll check and axe scan of the
 * page as it is now; every axe violation fails the run.
 */
export async function inspect(page, name) {
  const size = page.viewportSize().width < 600 ? "phone" : "desktop";
  const label = `${name} (${size})`;
  const widths = await page.evaluate(() => ({
    scroll: document.documentElement.scrollWidth,
    view: window.innerWidth,
    watched: window.__e2eSidewaysWatch === true,
  }));
  check(widths.scroll <= widths.view, `${label}: no sideways scroll (${widths.scroll} <= ${widths.view} px)`);
  check(widths.watched, `${label}: every state of the page is watched for sideways scroll`);
  // A button the page's script has just enabled fades from its disabled colours
  // (a CSS transition): axe must read the settled page, not a frame mid-fade. A
  // transition still running after 10 s fails the run (axe would read a frame).
  const settled = await page
    .waitForFunction(
      () => !document.getAnimations().some((a) => a instanceof CSSTransition && a.playState === "running"),
      null,
      { timeout: 10000 },
    )
    .then(
      () => null,
      (err) => err.message.split("\n")[0],
    );
  check(settled === null, `${label}: transitions settled before axe${settled ? ` (${settled})` : ""}`);
  axeSource ??= await readFile(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
  if (!(await page.evaluate(() => typeof window.axe === "object"))) await page.evaluate(axeSource);
  const violations = await page.evaluate(async () => {
    const result = await window.axe.run(document, { resultTypes: ["violations"] });
    return result.violations.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
  });
  check(violations.length === 0, `${label}: axe finds no violation${violations.length ? `: ${violations.join("; ")}` : ""}`);
  await screenshot(page, `${out}/pages-${name}-${size}.png`);
}

/** Whether the element's box lies wholly inside the viewport as it is scrolled now. */
export function isInViewport(el) {
  const r = el.getBoundingClientRect();
  return r.top >= 0 && r.left >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth && r.height > 0;
}
