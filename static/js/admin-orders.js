// A sale's orders (admin): each live order has a Cancel button (a paid one:
// Cancel and refund). The cancel carries an Idempotency-Key kept for the tab's
// session, so a retry (a double click, a lost answer) is the same cancel. After
// each cancel the page asks the API for the sale's totals, units left and status
// again, so units sold, returned, the revenue and a sold-out badge follow without a
// reload. Order ids show
// their short form, with a button that copies the whole id.

import { api, messageOf, retryAfterSeconds } from "./api.js";
import { setUpCopyButtons } from "./copy.js";
import { field, setBadge, setText, showOutcome, shownStatus } from "./dom.js";
import { formatPrice, groupDigits } from "./numbers.js";
import { presentAnswer } from "./refusals.js";

/** Answers `order_settling` waited out before giving up. */
const SETTLING_TRIES = 30;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function newKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

function cancelKey(orderId) {
  const name = `admin-cancel-key:${orderId}`;
  let key = sessionStorage.getItem(name);
  if (!key) {
    key = newKey();
    sessionStorage.setItem(name, key);
  }
  return key;
}

async function sendCancel(orderId) {
  for (let tries = 1; ; tries++) {
    const res = await api("POST", `/api/admin/orders/${encodeURIComponent(orderId)}/cancel`, undefined, {
      "Idempotency-Key": cancelKey(orderId),
    });
    if (res.status !== 503 || res.data.error !== "order_settling" || tries >= SETTLING_TRIES) return res;
    await sleep(retryAfterSeconds(res) * 1000);
  }
}

function badge(status) {
  const span = document.createElement("span");
  span.className = "badge badge-expired";
  span.textContent = status === "refunded" ? "Refunded" : "Cancelled";
  return span;
}

/** An order id's short form, as the server shows it: its last 8 hex digits. */
const shortId = (id) => `…${id.slice(-8)}`;

/** `SaleTotals` field -> the page's `data-field`, and how it is written. */
const TOTALS = [
  ["units_sold", "units-sold", groupDigits],
  ["units_returned", "units-returned", groupDigits],
  ["units_paid", "units-paid", groupDigits],
  ["units_awaiting", "units-awaiting", groupDigits],
  ["units_expired", "units-expired", groupDigits],
  ["units_cancelled", "units-cancelled", groupDigits],
  ["units_refunded", "units-refunded", groupDigits],
  ["revenue_paid_cents", "revenue-paid", formatPrice],
  ["revenue_awaiting_cents", "revenue-awaiting", formatPrice],
  ["revenue_refunded_cents", "revenue-refunded", formatPrice],
];

/**
 * The summary as the API has it now: the totals of every settled order
 * (`GET /api/admin/sales/{id}/orders`, one order listed) and the units left
 * (`GET /api/sales/{id}`). A failed read leaves the numbers as they were.
 */
async function refreshTotals(summary, saleId) {
  const [orders, sale] = await Promise.all([
    api("GET", `/api/admin/sales/${saleId}/orders?limit=1`),
    api("GET", `/api/sales/${saleId}`),
  ]);
  if (orders.status === 200 && orders.data.totals) {
    for (const [key, name, format] of TOTALS) {
      const value = Number(orders.data.totals[key]);
      if (Number.isFinite(value)) setText(field(summary, name), format(value));
    }
  }
  if (sale.status === 200) {
    setText(field(summary, "stock-left"), groupDigits(Number(sale.data.stock_left)));
    setText(field(summary, "stock-total"), groupDigits(Number(sale.data.stock_total)));
    // A cancel of a sold-out sale's order puts it back on sale.
    if (typeof sale.data.status === "string") setBadge(field(summary, "status"), shownStatus(sale.data.status, sale.data.draw_finished_at));
  }
}

export function adminOrdersPage() {
  setUpCopyButtons(document.querySelector("main") || document.body);
  const root = document.getElementById("admin-orders");
  const outcome = document.querySelector('[data-field="cancel-outcome"]');
  const summary = document.querySelector('[data-field="totals"]');
  if (!root || !outcome) return;
  root.addEventListener("click", async (event) => {
    const button = event.target.closest('button[data-action="cancel"]');
    if (!button || button.disabled) return;
    const row = button.closest("tr");
    const orderId = row.dataset.orderId;
    const refund = button.dataset.refund === "true";
    const what = refund ? "Cancel and refund" : "Cancel";
    if (!window.confirm(`${what} order ${shortId(orderId)}? Its units go back on sale.`)) return;
    button.disabled = true;
    const res = await sendCancel(orderId);
    if (res.status === 200) {
      const cell = field(row, "order-state");
      cell.replaceChildren(badge(res.data.status));
      const units = Number(res.data.units_returned) || 1;
      const refunded = res.data.status === "refunded" ? " and refunded" : "";
      showOutcome(outcome, "success", `Order ${shortId(orderId)} cancelled${refunded}.`, `${units} unit${units === 1 ? "" : "s"} went back on sale.`);
      presentAnswer(outcome);
      if (summary) await refreshTotals(summary, summary.dataset.saleId);
      return;
    }
    button.disabled = false;
    const title = res.status === 409 ? `Order ${shortId(orderId)} cannot be cancelled.` : `Cancel of order ${shortId(orderId)} failed.`;
    showOutcome(outcome, "error", title, messageOf(res, "Reload the page to see the orders as they are now."));
    presentAnswer(outcome);
    // Cancelled or refunded elsewhere meanwhile: the totals have moved.
    if (res.status === 409 && summary) await refreshTotals(summary, summary.dataset.saleId);
  });
}
