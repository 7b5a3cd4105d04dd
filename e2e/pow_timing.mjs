// How long the pages' proof of work takes in headless Chromium (issue 52): the
// page's own worker (static/js/pow-worker.js), served with a blank page from a
// loopback server of this script's own, solves fresh random challenges of the
// shape the server issues at each difficulty; prints the median and the 90th
// percentile of each. Not part of the browser suite (a measurement, run by
// scripts/pow-timing). POW_BITS (default "8 12 14 16 18 20") and POW_RUNS (15).
import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { randomBytes } from "node:crypto";

const root = process.env.STAMPEDE_ROOT || process.cwd();
const bits = (process.env.POW_BITS || "8 12 14 16 18 20").split(/\s+/).filter(Boolean).map(Number);
const runs = Number(process.env.POW_RUNS || 15);
const worker = await readFile(`${root}/static/js/pow-worker.js`);

const server = createServer((req, res) => {
  if (req.url === "/static/js/pow-worker.js") {
    res.writeHead(200, { "Content-Type": "text/javascript" });
    res.end(worker);
  } else {
    res.writeHead(200, { "Content-Type": "text/html" });
    res.end("<!doctype html><title>pow</title>");
  }
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const { port } = server.address();

const browser = await chromium.launch({
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
const page = await browser.newPage();
await page.goto(`http://127.0.0.1:${port}/`);

/** A challenge of the server's shape and length (its MAC is random here). */
function challenge() {
  const b64 = (buf) => buf.toString("base64url");
  const payload = `w1:s42:1234567:${Date.now() + 300000}:${randomBytes(8).toString("hex")}`;
  return `${b64(Buffer.from(payload))}.${b64(randomBytes(32))}`;
}

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
console.log(`difficulty  runs  median_ms  p90_ms  hashes_per_s (median run)`);
for (const b of bits) {
  const times = [];
  const rates = [];
  for (let i = 0; i < runs; i++) {
    const c = challenge();
    const r = await page.evaluate(
      ([c, b]) =>
        new Promise((resolve) => {
          const t0 = performance.now();
          const w = new Worker("/static/js/pow-worker.js");
          w.onmessage = (e) => {
            if (e.data.progress !== undefined) return;
            w.terminate();
            resolve({ ms: performance.now() - t0, hashes: e.data.hashes });
          };
          w.postMessage({ challenge: c, bits: b });
        }),
      [c, b],
    );
    times.push(r.ms);
    rates.push((r.hashes / r.ms) * 1000);
  }
  times.sort((x, y) => x - y);
  rates.sort((x, y) => x - y);
  console.log(
    `${String(b).padStart(10)}  ${String(runs).padStart(4)}  ${quantile(times, 0.5).toFixed(0).padStart(9)}  ${quantile(times, 0.9).toFixed(0).padStart(6)}  ${quantile(rates, 0.5).toFixed(0)}`,
  );
}
await browser.close();
server.close();
