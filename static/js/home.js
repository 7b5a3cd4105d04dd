// The home page: the sale cards.

import { api } from "./api.js";
import { field, setBadge, setText, shownStatus } from "./dom.js";
import { pollWhileVisible } from "./live.js";
import { groupDigits } from "./numbers.js";
import { clockOffset, formatDuration, localTime } from "./time.js";

const HOME_POLL_MS = 5000;

/**
 * Cards count down to the opening and follow stock and status without a
 * reload. Cards keep their place; the order is the server's at load time.
 */
export function indexPage() {
  const grid = field(document, "sale-grid");
  if (!grid) return;
  const offset = clockOffset(Number(grid.dataset.serverNow));
  const now = () => Date.now() + offset;
  const cards = new Map();
  for (const card of grid.querySelectorAll(".sale-card[data-sale-id]")) {
    const d = card.dataset;
    cards.set(d.saleId, {
      card,
      status: d.status,
      startsAt: Number(d.startsAt),
      endsAt: Number(d.endsAt),
      left: Number(d.stockLeft) || 0,
      total: Number(d.stockTotal) || 0,
      drawOver: d.drawOver === "true",
      shown: "",
    });
  }

  function statusOf(c) {
    let status = c.status;
    const t = now();
    if (status === "upcoming" && t >= c.startsAt) status = c.left > 0 ? "live" : "sold_out";
    if (status !== "closed" && t >= c.endsAt) status = "ended";
    return shownStatus(status, c.drawOver);
  }

  function whenLine(c, status) {
    const t = now();
    const untilStart = c.startsAt - t;
    if (status === "upcoming")
      return untilStart < 86400000 ? ["Opens in ", formatDuration(untilStart)] : ["Opens ", localTime(new Date(c.startsAt))];
    if (status === "closed") return ["Closed by the shop", ""];
    if (status === "draw_over") return ["Draw over: the units left are not for sale", ""];
    if (status === "ended") return ["Ended ", localTime(new Date(c.endsAt))];
    return ["Ends ", localTime(new Date(c.endsAt))];
  }

  function render() {
    for (const c of cards.values()) {
      const status = statusOf(c);
      const card = c.card;
      for (const name of [...card.classList]) if (name.startsWith("status-")) card.classList.remove(name);
      card.classList.add(`status-${status}`);
      setBadge(field(card, "badge"), status);
      setText(field(card, "stock-left"), groupDigits(c.left));
      setText(field(card, "stock-total"), groupDigits(c.total));
      const bar = field(card, "progress");
      bar.max = Math.max(c.total, 1);
      bar.value = c.left;
      const [label, value] = whenLine(c, status);
      const key = label + value;
      if (c.shown !== key) {
        c.shown = key;
        const when = field(card, "when");
        when.replaceChildren(label);
        if (value) {
          const strong = document.createElement("strong");
          strong.className = "when-value";
          strong.textContent = value;
          when.append(strong);
        }
      }
    }
  }

  async function refresh() {
    // The API page with the sales this page shows (`data-list-url`).
    const res = await api("GET", grid.dataset.listUrl || "/api/sales");
    if (!res.ok || !Array.isArray(res.data)) return;
    for (const view of res.data) {
      const c = cards.get(String(view.id));
      if (!c) continue;
      if (typeof view.status === "string") c.status = view.status;
      if (typeof view.draw_finished_at === "string") c.drawOver = true;
      if (Number.isFinite(view.stock_left)) c.left = Math.max(0, view.stock_left);
      if (Number.isFinite(view.stock_total)) c.total = Math.max(view.stock_total, c.left);
      const starts = Date.parse(view.starts_at);
      const ends = Date.parse(view.ends_at);
      if (!Number.isNaN(starts)) c.startsAt = starts;
      if (!Number.isNaN(ends)) c.endsAt = ends;
    }
    render();
  }

  render();
  setInterval(render, 1000);
  pollWhileVisible(refresh, HOME_POLL_MS);
}
