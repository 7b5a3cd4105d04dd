// My orders: while one is pending, the page looks again. An order awaiting
// payment counts down to its deadline and has a Pay button; an unpaid order has a
// Cancel order button. Order ids show their short form, with a button that
// copies the whole id.

import { api, messageOf, retryAfterSeconds } from "./api.js";
import { setUpCopyButtons } from "./copy.js";
import { field, setText, showOutcome } from "./dom.js";
import { formatPrice } from "./numbers.js";
import { presentAnswer } from "./refusals.js";
import { clockOffset, formatDuration, localTime } from "./time.js";

const RELOADS = "orders-reloads";
/** Answers `order_settling` waited out before giving up (each says how long). */
const SETTLING_TRIES = 30;

export function ordersPage() {
  const root = document.getElementById("orders");
  if (root) setUpCopyButtons(root);
  const payments = root ? setUpPayments(root) : { busy: () => false };
  followPending(payments);
}

/** The page is rendered by the server; while an order is pending, look again. */
function followPending(payments) {
  if (!document.querySelector("tr.is-pending")) {
    sessionStorage.removeItem(RELOADS);
    return;
  }
  const tries = Number(sessionStorage.getItem(RELOADS) || "0");
  if (tries >= 20) return;
  const again = () => {
    if (document.hidden) return;
    // A reload would drop the answer of a payment on its way (its key is kept).
    if (payments.busy()) {
      setTimeout(again, 1000);
      return;
    }
    sessionStorage.setItem(RELOADS, String(tries + 1));
    location.reload();
  };
  setTimeout(again, 3000);
}

/**
 * The Idempotency-Key of this order's payment: made once, kept for the tab's
 * session, so a retry (a double click, a reload, a lost answer) is the same
 * payment and never a second charge.
 */
function paymentKey(orderId) {
  const name = `pay-key:${orderId}`;
  let key = sessionStorage.getItem(name);
  if (!key) {
    key = newKey();
    sessionStorage.setItem(name, key);
  }
  return key;
}

function forgetKey(orderId) {
  sessionStorage.removeItem(`pay-key:${orderId}`);
}

/** The Idempotency-Key of this order's cancel: a retry is the same cancel (answered 200 again). */
function cancelKey(orderId) {
  const name = `cancel-key:${orderId}`;
  let key = sessionStorage.getItem(name);
  if (!key) {
    key = newKey();
    sessionStorage.setItem(name, key);
  }
  return key;
}

/** A random UUID; `crypto.randomUUID` exists only on https and localhost pages. */
function newKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** POST /pay or /cancel; an order accepted moments ago (`order_settling`) is asked again when the answer says. */
async function sendPayment(orderId, key, action = "pay") {
  for (let tries = 1; ; tries++) {
    const res = await api("POST", `/api/orders/${encodeURIComponent(orderId)}/${action}`, undefined, { "Idempotency-Key": key });
    if (res.status !== 503 || res.data.error !== "order_settling" || tries >= SETTLING_TRIES) return res;
    await sleep(retryAfterSeconds(res) * 1000);
  }
}

function setUpPayments(root) {
  const outcome = field(root, "pay-outcome");
  const offset = clockOffset(Number(root.dataset.serverNow));
  let inFlight = 0;

  const nameOf = (row) => field(row, "sale-name").textContent;
  /** Units of the row's order (`data-quantity`, only above 1). */
  const unitsOf = (row) => Number(row.dataset.quantity) || 1;
  const wentBack = (row) => (unitsOf(row) > 1 ? `its ${unitsOf(row)} units went back on sale` : "the unit went back on sale");
  // The sale's one rule for cancelled, refunded and expired orders.
  // (The server words it the same: `SettledOrder::returned_rule`.)
  const rebuyWords = (row) => {
    const max = Number(row.dataset.maxPerUser) || 1;
    if (row.dataset.gate) return `${row.dataset.gate === "draw" ? "A win" : "A turn in the line"} buys once: a returned order does not give another.`;
    if (row.dataset.rebuy === "true") return "You may buy from this sale again.";
    if (max > 1) return `Returned units still count toward this sale's limit of ${max} per customer.`;
    return "This sale allows one purchase per customer, cancelled or not: you will not be able to buy from it again.";
  };

  /** Replaces the row's status with one of the page's `<template id="pay-...">`. */
  function showState(row, state) {
    const box = field(row, "pay-state");
    const hadFocus = box.contains(document.activeElement);
    box.replaceChildren(document.getElementById(`pay-${state}`).content.cloneNode(true));
    if (state === "expired") setText(box.querySelector(".pay-note"), `Not paid in time; ${wentBack(row)}. ${rebuyWords(row)}`);
    row.dataset.payment = state === "confirmed" ? "none" : state;
    delete row.dataset.payBy;
    return { box, hadFocus };
  }

  function showPaid(row, paidAt) {
    const shown = showState(row, "paid");
    const time = field(shown.box, "paid-at");
    const at = new Date(paidAt);
    if (Number.isNaN(at.getTime())) {
      time.closest("p").remove();
    } else {
      time.dateTime = at.toISOString();
      setText(time, localTime(at));
    }
    return shown;
  }

  /** Says it in the page's live region. */
  const answer = (kind, title, detail, link) => showOutcome(outcome, kind, title, detail, link);

  async function pay(row, button) {
    if (row.dataset.paying) return;
    const orderId = row.dataset.orderId;
    const name = nameOf(row);
    const label = field(button, "pay-label");
    row.dataset.paying = "true";
    inFlight += 1;
    button.disabled = true;
    setText(label, "Paying…");
    const res = await sendPayment(orderId, paymentKey(orderId));
    inFlight -= 1;
    delete row.dataset.paying;
    button.disabled = false;
    setText(label, "Pay");
    const code = res.data.error;
    switch (res.status) {
      case 200: {
        forgetKey(orderId);
        const amount = Number(res.data.amount_cents);
        const paid = Number.isFinite(amount) ? `${formatPrice(amount)} paid` : "Paid";
        showPaid(row, res.data.paid_at);
        answer("success", `${paid} for “${name}”. Thank you!`);
        break;
      }
      case 409:
        forgetKey(orderId);
        if (code === "already_paid") {
          showPaid(row, null);
          answer("info", `“${name}” is already paid.`, messageOf(res, ""));
        } else {
          showState(row, "confirmed");
          answer("info", `“${name}” needs no payment.`, messageOf(res, ""));
        }
        break;
      case 410:
        forgetKey(orderId);
        showState(row, "expired");
        answer("error", `Too late to pay for “${name}”.`, messageOf(res, "The payment deadline has passed."));
        break;
      case 0:
        // Not known to have reached the shop: the same key pays at most once on a retry.
        answer("error", `Payment for “${name}” not sent.`, messageOf(res, "Check your connection and try again."));
        break;
      case 401:
        answer("warning", "Please sign in to pay.", "Your session has ended.", { href: "/signin?next=%2Fme%2Forders", text: "Sign in" });
        break;
      case 403:
        answer("warning", "Your session is out of date.", "Sign in again, then retry.", { href: "/signin?next=%2Fme%2Forders", text: "Sign in" });
        break;
      case 404:
        forgetKey(orderId);
        answer("error", `The order of “${name}” was not found.`, "Reload the page to see your orders as they are now.");
        break;
      default:
        answer("error", `Payment for “${name}” failed.`, messageOf(res, "Please try again in a moment."));
    }
    // The pressed button lost the focus when it was disabled: it gets it back, or,
    // gone with the answer, hands it to the answer (as the sale page does).
    if (!button.isConnected) presentAnswer(outcome);
    else if (!document.activeElement || document.activeElement === document.body) button.focus();
  }

  async function cancel(row, button) {
    if (row.dataset.paying) return;
    const orderId = row.dataset.orderId;
    const name = nameOf(row);
    const goesBack = wentBack(row).replace("went", "goes");
    if (!window.confirm(`Cancel your order of “${name}”? ${goesBack[0].toUpperCase()}${goesBack.slice(1)}. ${rebuyWords(row)}`)) return;
    const label = field(button, "cancel-label");
    row.dataset.paying = "true";
    inFlight += 1;
    button.disabled = true;
    setText(label, "Cancelling…");
    const res = await sendPayment(orderId, cancelKey(orderId), "cancel");
    inFlight -= 1;
    delete row.dataset.paying;
    button.disabled = false;
    setText(label, "Cancel order");
    switch (res.status) {
      case 200: {
        const shown = showState(row, "cancelled");
        setText(shown.box.querySelector(".pay-note"), `${wentBack(row)[0].toUpperCase()}${wentBack(row).slice(1)}. ${rebuyWords(row)}`);
        answer("success", `Your order of “${name}” is cancelled.`);
        break;
      }
      case 409:
        answer("info", `The order of “${name}” cannot be cancelled now.`, messageOf(res, "Reload the page to see it as it is now."));
        break;
      case 0:
        answer("error", `Cancel of “${name}” not sent.`, messageOf(res, "Check your connection and try again."));
        break;
      case 401:
      case 403:
        answer("warning", "Please sign in again to cancel.", "Your session has ended or is out of date.", { href: "/signin?next=%2Fme%2Forders", text: "Sign in" });
        break;
      case 404:
        answer("error", `The order of “${name}” was not found.`, "Reload the page to see your orders as they are now.");
        break;
      default:
        answer("error", `Cancel of “${name}” failed.`, messageOf(res, "Please try again in a moment."));
    }
    if (!button.isConnected) presentAnswer(outcome);
    else if (!document.activeElement || document.activeElement === document.body) button.focus();
  }

  /** Counts each deadline down; at zero the order shows expired, as the server will. */
  function tick() {
    const now = Date.now() + offset;
    for (const row of root.querySelectorAll('tr[data-payment="awaiting_payment"]')) {
      const left = Date.parse(row.dataset.payBy) - now;
      if (left > 0) {
        setText(field(row, "pay-left"), formatDuration(left));
      } else if (!row.dataset.paying) {
        // A payment on its way is decided by the shop: its answer says which.
        const { hadFocus } = showState(row, "expired");
        const back = wentBack(row);
        answer("warning", `Your order of “${nameOf(row)}” expired: it was not paid in time.`, `${back[0].toUpperCase()}${back.slice(1)}. ${rebuyWords(row)}`);
        if (hadFocus) presentAnswer(outcome);
      }
    }
  }

  root.addEventListener("click", (event) => {
    const button = event.target.closest('button[data-action="pay"]');
    if (button && !button.disabled) pay(button.closest("tr"), button);
    const cancelButton = event.target.closest('button[data-action="cancel"]');
    if (cancelButton && !cancelButton.disabled) cancel(cancelButton.closest("tr"), cancelButton);
  });
  tick();
  setInterval(tick, 250);
  return { busy: () => inFlight > 0 };
}
