// A draw sale's panel on its admin page (issue 52): entries, winners, and the
// wins buying now, bought and passed on, from `GET /api/admin/sales/{id}/draw`
// every few seconds while the tab is visible.

import { api } from "./api.js";
import { field, flash, setText } from "./dom.js";
import { ADMIN_POLL_MS, pollWhileVisible } from "./live.js";
import { groupDigits } from "./numbers.js";
import { localTime } from "./time.js";

/**
 * "Drawn at ... from 12 entries: 3 wins so far." Once the draw is over (every
 * entry had its turn), units left are units no entrant can buy: it says so.
 */
function summary(n, unitsLeft, live) {
  if (!n.drawn_at) return `Not drawn yet: ${groupDigits(n.entries)} ${n.entries === 1 ? "entry" : "entries"} so far.`;
  const drawn = `Drawn at ${localTime(new Date(n.drawn_at), true)} from ${groupDigits(n.entries)} ${n.entries === 1 ? "entry" : "entries"}`;
  if (!n.finished_at) return `${drawn}: ${groupDigits(n.wins)} ${n.wins === 1 ? "win" : "wins"} so far.`;
  const over = `${drawn}: ${groupDigits(n.wins)} ${n.wins === 1 ? "win" : "wins"}. The draw is over: no more wins are given.`;
  // A draw also finishes when the sale closed or ended: then there is nothing to do.
  if (!(unitsLeft > 0) || !live) return over;
  return `${over} No entrant can buy the ${groupDigits(unitsLeft)} ${unitsLeft === 1 ? "unit" : "units"} left; close the sale to end it.`;
}

export function adminDrawPanel(root, saleId) {
  const panel = field(root, "draw-panel");
  if (!panel) return;
  async function refresh() {
    const res = await api("GET", `/api/admin/sales/${saleId}/draw`);
    if (!res.ok) return;
    const n = res.data;
    const left = Number((field(root, "stock-left")?.textContent || "").replace(/,/g, ""));
    const live = Boolean(field(root, "badge")?.classList.contains("badge-live"));
    setText(field(panel, "draw-summary"), summary(n, left, live));
    for (const dd of panel.querySelectorAll("[data-draw]")) {
      const value = n[dd.dataset.draw];
      if (!Number.isFinite(value)) continue;
      const text = groupDigits(value);
      if (dd.textContent !== text && dd.textContent !== "–") flash(dd);
      setText(dd, text);
    }
  }
  refresh();
  pollWhileVisible(refresh, ADMIN_POLL_MS);
}
