// Shared by the browser checks (smoke.mjs, pages.mjs, redirect.mjs): the
// environment, the list of failed checks, and Debian's Chromium with the flags the
// project allows (never a browser of playwright's own).
import { chromium } from "playwright-core";

export function required(name) {
  const value = process.env[name];
  if (!value) {
    console.error(`set ${name}`);
    process.exit(2);
  }
  return value;
}

export const problems = [];

export function check(ok, what) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) problems.push(what);
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
