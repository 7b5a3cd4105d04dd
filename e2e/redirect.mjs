// Browser check of the sign-in page's `?next=` (issue 13): after signing in, the
// browser must stay on this site whatever `next` says. Runs with the system's
// Chromium against a running server (scripts/e2e-redirect starts one; scripts/test
// runs it in CI). It makes its own user through the API, so it needs no seed.
//
// Two layers are checked for each hostile `next`:
// - the server: loading /signin?next=<bad> answers a 303 to the bare /signin;
// - the page script: the sign-in page is served under the hostile address anyway
//   (intercepted, so the server's check is out of the way), the user signs in, and
//   the browser must land on "/" of this origin, never having asked another host.
// Good `next` values must still be followed.

import { base, check, launchChromium, problems } from "./lib.mjs";
import { randomBytes } from "node:crypto";

const origin = new URL(base).origin;

// Raw query values, as an attacker writes them in a link.
const hostile = [
  "/%09/evil.example",
  "/%0A/evil.example",
  "/%0D/evil.example",
  "/%09%5Cevil.example",
  "/%5Cevil.example",
  "/%5C%5Cevil.example",
  "%5C%5Cevil.example",
  "//evil.example",
  "%2F%2Fevil.example",
  "/%2F/evil.example",
  "/\\evil.example",
  "/%09/%09/evil.example",
  "%09//evil.example",
  "https://evil.example/",
  "http:evil.example",
  "javascript:alert(1)",
];
const friendly = [
  ["%2Fpolls", "/polls"],
  ["/me/orders", "/me/orders"],
  ["/%252F%252Fevil.example", "/%2F%2Fevil.example"],
];

const username = `redir-${randomBytes(4).toString("hex")}`;
const password = randomBytes(12).toString("hex");
const created = await fetch(`${base}/api/auth/signup`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ username, password }),
});
if (created.status !== 201) {
  console.error(`sign-up failed: ${created.status} ${await created.text()}`);
  process.exit(1);
}

const browser = await launchChromium();
try {
  const context = await browser.newContext();
  const foreign = [];
  let page;
  async function freshPage() {
    // A new tab per case: an aborted navigation leaves the old one on an error page.
    if (page) await page.close();
    page = await context.newPage();
    page.setDefaultTimeout(10_000);
    page.on("request", (r) => {
      if (new URL(r.url()).origin !== origin) foreign.push(r.url());
    });
  }
  // Never let a request leave for another host, whatever happens.
  await context.route((url) => url.origin !== origin, (route) => route.abort());

  const signinHtml = await (await fetch(`${base}/signin`)).text();

  async function signInVia(query) {
    // Serve the sign-in page itself under the hostile address: this tests the page
    // script alone, as if the server let the address through.
    const handler = (route) =>
      route.fulfill({ status: 200, contentType: "text/html; charset=utf-8", body: signinHtml });
    const matcher = (url) => url.origin === origin && url.pathname === "/signin" && url.search !== "";
    await context.route(matcher, handler);
    await freshPage();
    try {
      await page.goto(`${base}/signin?next=${query}`);
      await page.fill("#username", username);
      await page.fill("#password", password);
      try {
        await Promise.all([
          page.waitForURL((url) => url.pathname !== "/signin" || url.origin !== origin),
          page.click('button[type="submit"]'),
        ]);
        await page.waitForLoadState("domcontentloaded");
      } catch (e) {
        // A navigation to another host was aborted (see the route above).
        if (foreign.length) return new URL(foreign[0]);
        throw e;
      }
      return new URL(page.url());
    } finally {
      await context.unroute(matcher, handler);
    }
  }

  for (const bad of hostile) {
    // Server layer: the page is not even served with that `next`.
    await freshPage();
    const direct = await page.goto(`${base}/signin?next=${bad}`);
    check(
      direct.ok() && page.url() === `${base}/signin`,
      `server: /signin?next=${bad} goes to the bare /signin (at ${page.url()})`,
    );
    // Script layer.
    foreign.length = 0;
    const landed = await signInVia(bad);
    check(
      landed.origin === origin && landed.pathname === "/" && foreign.length === 0,
      `script: signing in with next=${bad} lands on ${origin}/ (at ${landed.href}; foreign requests: ${foreign.join(", ") || "none"})`,
    );
  }
  for (const [query, path] of friendly) {
    const landed = await signInVia(query);
    check(landed.origin === origin && landed.pathname === path, `script: next=${query} is followed to ${path} (at ${landed.href})`);
  }
} finally {
  await browser.close();
}

if (problems.length) {
  console.error(`\n${problems.length} redirect check(s) failed`);
  process.exit(1);
}
console.log(`\nall ${hostile.length * 2 + friendly.length} redirect checks passed`);
