// A sale's orders (admin): each live order has a Cancel button (a paid one:
// Cancel and refund). The cancel carries an Idempotency-Key kept for the tab's
// session, so a retry (a double click, a lost answer) is the same cancel. Order
// ids show their short form, with a button that copies the whole id.

import { api, messageOf, retryAfterSeconds } from "./api.js";
import { setUpCopyButtons } from "./copy.js";
import { field, showOutcome } from "./dom.js";
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

export function adminOrdersPage() {
  setUpCopyButtons(document.querySelector("main") || document.body);
  const root = document.getElementById("admin-orders");
  const outcome = document.querySelector('[data-field="cancel-outcome"]');
  if (!root || !outcome) return;
  root.addEventListener("click", async (event) => {
    const button = event.target.closest('button[data-action="cancel"]');
    if (!button || button.disabled) return;
    const row = button.closest("tr");
    const orderId = row.dataset.orderId;
    const refund = button.dataset.refund === "true";
    const what = refund ? "Cancel and refund" : "Cancel";
    if (!window.confirm(`${what} order ${orderId}? Its units go back on sale.`)) return;
    button.disabled = true;
    const res = await sendCancel(orderId);
    if (res.status === 200) {
      const cell = field(row, "order-state");
      cell.replaceChildren(badge(res.data.status));
      const units = Number(res.data.units_returned) || 1;
      const refunded = res.data.status === "refunded" ? " and refunded" : "";
      showOutcome(outcome, "success", `Order ${orderId} cancelled${refunded}.`, `${units} unit${units === 1 ? "" : "s"} went back on sale.`);
      presentAnswer(outcome);
      return;
    }
    button.disabled = false;
    const title = res.status === 409 ? `Order ${orderId} cannot be cancelled.` : `Cancel of order ${orderId} failed.`;
    showOutcome(outcome, "error", title, messageOf(res, "Reload the page to see the orders as they are now."));
    presentAnswer(outcome);
  });
}
