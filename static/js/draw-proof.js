// "How this draw was made" (issue 52): once the draw is out, shows the published
// seed and winners, then checks them in the browser with WebCrypto, by the recipe
// of docs/api.md ("Draw sales"): SHA-256 of the seed is the commitment the sale
// carried from the start; the entries digest (recipe 2) is the SHA-256 of the CSV's
// entry ids, smallest first, one a line; the entries of the CSV ordered by
// HMAC-SHA-256(order key, decimal entry id), where the order key is
// HMAC-SHA-256(seed, hex entries digest) (recipe 1: the seed itself), bytes
// compared unsigned, ties by the smaller id, give the published winners in their
// ranks.

import { api } from "./api.js";
import { field, setText, showOutcome } from "./dom.js";
import { groupDigits } from "./numbers.js";
import { clockOffset, clockTime, localTime } from "./time.js";

// Rows of the winners' table; the check covers them all.
const SHOWN_WINNERS = 200;
// Before the draw is out: asked again this often.
const PENDING_EVERY_MS = 3000;

/** Bytes of a hex text; null unless whole bytes of hex. */
function unhex(text) {
  if (typeof text !== "string" || text.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(text)) return null;
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(text.slice(2 * i, 2 * i + 2), 16);
  return out;
}

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Unsigned bytes, first byte first; then the smaller id. */
function byKey(a, b) {
  for (let i = 0; i < a.key.length; i++) {
    if (a.key[i] !== b.key[i]) return a.key[i] - b.key[i];
  }
  return a.id - b.id;
}

/** The entry ids of `entries.csv` (`entry_id,entered_at` with a header line). */
function entryIds(csv) {
  const ids = [];
  for (const line of csv.split("\n").slice(1)) {
    const first = line.split(",")[0].trim();
    if (/^\d+$/.test(first)) ids.push(Number(first));
  }
  return ids;
}

async function hmac(keyBytes, message) {
  const key = await crypto.subtle.importKey("raw", keyBytes, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, new TextEncoder().encode(message)));
}

/** Hex SHA-256 of the entry ids, smallest first, each followed by a newline. */
export async function entriesDigest(ids) {
  const sorted = [...ids].sort((a, b) => a - b);
  const text = sorted.map((id) => `${id}\n`).join("");
  return hex(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
}

/** The key the entries are keyed with: recipe 2, HMAC-SHA-256(seed, hex digest); 1, the seed. */
export async function orderKey(recipe, seed, digestHex) {
  return recipe === 2 ? hmac(seed, digestHex) : seed;
}

/** The entry ids in the draw's order under `orderKey` (see `orderKey`). */
export async function drawOrder(orderKeyBytes, ids) {
  const key = await crypto.subtle.importKey("raw", orderKeyBytes, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const encoder = new TextEncoder();
  const keyed = await Promise.all(
    ids.map(async (id) => ({ id, key: new Uint8Array(await crypto.subtle.sign("HMAC", key, encoder.encode(String(id)))) })),
  );
  keyed.sort(byKey);
  return keyed.map((k) => k.id);
}

/** The checks of a published draw: [{ok, text}]. */
async function check(root, draw, csv) {
  const d = root.dataset;
  const checks = [];
  const seed = unhex(draw.seed);
  if (!seed || seed.length !== 32) return [{ ok: false, text: "The published seed is not 32 bytes of hex." }];
  const hash = hex(await crypto.subtle.digest("SHA-256", seed));
  checks.push({
    ok: hash === d.commitment && hash === draw.commitment,
    text: hash === d.commitment ? `SHA-256 of the seed is the commitment published from the start (${hash.slice(0, 16)}…).` : `SHA-256 of the seed is ${hash}, not the commitment ${d.commitment}.`,
  });
  const ids = entryIds(csv);
  // Each entry once: a list that repeats one entry where another was left out keeps the count.
  const seen = new Set();
  const twice = ids.find((id) => seen.has(id) || !seen.add(id));
  checks.push({
    ok: ids.length === draw.entries && twice === undefined,
    text:
      twice !== undefined
        ? `Entry ${twice} is listed twice in the CSV.`
        : ids.length === draw.entries
          ? `The CSV lists all ${groupDigits(ids.length)} entries, each once.`
          : `The CSV lists ${groupDigits(ids.length)} entries; the draw says ${groupDigits(draw.entries)}.`,
  });
  // A draw published before recipes were: recipe 1.
  const recipe = draw.recipe === undefined ? 1 : draw.recipe;
  if (recipe !== 1 && recipe !== 2) {
    checks.push({ ok: false, text: `The draw names recipe ${recipe}, which this page does not know.` });
    return checks;
  }
  const digest = await entriesDigest(ids);
  if (recipe === 2) {
    checks.push({
      ok: digest === draw.entries_digest,
      text: digest === draw.entries_digest ? `SHA-256 of the entry ids is the draw's entries digest (${digest.slice(0, 16)}…).` : `SHA-256 of the entry ids is ${digest.slice(0, 16)}…, not the draw's entries digest ${String(draw.entries_digest).slice(0, 16)}…: the CSV is not the entries the draw ordered.`,
    });
  }
  const order = await drawOrder(await orderKey(recipe, seed, digest), ids);
  const per = Math.max(1, Number(d.maxPerUser) || 1);
  // The stock the draw divided (a later top-up, cancel or refund moves the sale's).
  const stock = Number.isInteger(draw.stock_at_draw) ? draw.stock_at_draw : Number(d.stock);
  const first = Math.min(Math.ceil(Math.max(0, stock) / per), ids.length);
  checks.push({
    ok: first === draw.winners_at_draw,
    text: first === draw.winners_at_draw ? `${groupDigits(first)} ${first === 1 ? "winner" : "winners"} at the draw, as the stock gives.` : `The stock gives ${groupDigits(first)} first winners; the draw says ${groupDigits(draw.winners_at_draw)}.`,
  });
  // Ranks 1, 2, 3, ... in turn (a rank left out is an entry never offered its win),
  // each the entry the recipe puts there.
  const wrong = draw.winners.filter((w, i) => w.rank !== i + 1 || order[i] !== w.entry_id);
  checks.push({
    ok: wrong.length === 0,
    text: wrong.length === 0
      ? draw.winners.length === 1
        ? "The winner is the entry the recipe puts first."
        : `Each of the ${groupDigits(draw.winners.length)} winners is the entry the recipe puts at its rank.`
      : `The winner listed at rank ${wrong[0].rank} is entry ${wrong[0].entry_id}; the recipe puts entry ${order[draw.winners.indexOf(wrong[0])] ?? "none"} at rank ${draw.winners.indexOf(wrong[0]) + 1} (${wrong.length} wrong).`,
  });
  return checks;
}

function outcomeText(w, now) {
  if (w.outcome === "bought") return "Bought";
  if (w.outcome === "passed") return "Passed";
  const until = Date.parse(w.claim_until);
  return until > now ? `Buying until ${clockTime(new Date(until))}` : "Time to buy up";
}

function showDraw(root, draw, now) {
  field(root, "pending").hidden = true;
  field(root, "result").hidden = false;
  setText(field(root, "seed"), draw.seed);
  const drawnAt = field(root, "drawn-at");
  drawnAt.dateTime = draw.drawn_at;
  setText(drawnAt, localTime(new Date(draw.drawn_at), true));
  setText(field(root, "entries"), groupDigits(draw.entries));
  setText(field(root, "winners-at-draw"), groupDigits(draw.winners_at_draw));
  // A draw of recipe 1 (made before the entries digest was part of it): the seed keys the entries.
  if (draw.recipe === undefined || draw.recipe === 1) {
    field(root, "recipe-digest").hidden = true;
    field(root, "recipe-digest-note").hidden = true;
    field(root, "recipe-entry-key").hidden = true;
    field(root, "recipe-seed-key").hidden = false;
  }
  // The recipe names the stock the draw divided, not the sale's stock today.
  if (Number.isInteger(draw.stock_at_draw)) setText(field(root, "recipe-stock"), groupDigits(draw.stock_at_draw));
  const rows = draw.winners.slice(0, SHOWN_WINNERS).map((w) => {
    const tr = document.createElement("tr");
    for (const text of [String(w.rank), String(w.entry_id), outcomeText(w, now)]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  });
  field(root, "winners").replaceChildren(...rows);
  const more = field(root, "winners-more");
  more.hidden = draw.winners.length <= SHOWN_WINNERS;
  setText(more, `And ${groupDigits(draw.winners.length - SHOWN_WINNERS)} more in the JSON.`);
}

function showChecks(root, checks) {
  const verdict = field(root, "verdict");
  const list = field(root, "checks");
  list.replaceChildren(
    ...checks.map((c) => {
      const li = document.createElement("li");
      li.className = c.ok ? "check-ok" : "check-fail";
      li.textContent = `${c.ok ? "✓" : "✗"} ${c.text}`;
      return li;
    }),
  );
  list.hidden = false;
  const failed = checks.filter((c) => !c.ok);
  if (failed.length === 0) {
    showOutcome(verdict, "success", "Verified: the seed matches its commitment and the winners follow from the entries.");
  } else {
    showOutcome(verdict, "error", `Does not match: ${failed.length} of ${checks.length} checks failed.`, failed[0].text);
  }
}

export function drawProofPage() {
  const root = document.getElementById("draw-proof");
  if (!root) return;
  const d = root.dataset;
  const offset = clockOffset(Number(d.serverNow));
  const now = () => Date.now() + offset;
  const verdict = field(root, "verdict");

  async function load() {
    const res = await api("GET", `/api/sales/${d.saleId}/draw`);
    if (res.status === 409 && res.data.error === "draw_pending") {
      setTimeout(load, Math.min(3_600_000, Math.max(PENDING_EVERY_MS, Number(d.drawAt) - now())));
      return;
    }
    if (!res.ok) {
      showOutcome(verdict, "error", "The draw could not be read.", res.data.message || "Please try again in a moment.");
      return;
    }
    showDraw(root, res.data, now());
    if (!window.crypto || !crypto.subtle) {
      showOutcome(verdict, "warning", "This browser cannot check the draw here (it needs HTTPS).", "Use the command below.");
      return;
    }
    showOutcome(verdict, "info", "Checking…");
    let csv = "";
    try {
      const resp = await fetch(`/api/sales/${d.saleId}/draw/entries.csv`, { credentials: "same-origin", cache: "no-store" });
      if (!resp.ok) throw new Error(String(resp.status));
      csv = await resp.text();
    } catch (_) {
      showOutcome(verdict, "error", "The entries could not be read.", "Please try again in a moment.");
      return;
    }
    showChecks(root, await check(root, res.data, csv));
  }

  if (Number(d.drawAt) <= now()) load();
  else setTimeout(load, Math.min(3_600_000, Number(d.drawAt) - now()));
}
