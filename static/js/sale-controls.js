// A sale's buttons of the day: Open now (Reopen now), Close, Top up and Set stock.
// The sales table (admin.js), the sale-day console (admin-console.js) and a sale's
// own admin page (admin-sale.js) show them by the same rules and run them here.

import { api, messageOf } from "./api.js";
import { field, setText } from "./dom.js";
import { parseUnits } from "./sale-form.js";

/**
 * Only the actions that make sense in the sale's state (the server's
 * `SaleCard::can_*` decide the same for the first render): no Close on a
 * closed or ended sale, Open now before the opening, Reopen now on a closed
 * sale whose end is still ahead, no stock changes after the end. `box` holds
 * the buttons (`data-action`) and the stock field (`data-field="stock-actions"`);
 * a button it lacks is skipped.
 */
export function showSaleActions(box, view) {
  const pastEnd = Date.parse(view.ends_at) <= Date.now();
  const status = view.status;
  const open = box.querySelector('[data-action="open"]');
  const close = box.querySelector('[data-action="close"]');
  const stock = field(box, "stock-actions");
  // Never hide the control that has the keyboard focus.
  const show = (el, on) => {
    if (el && !el.contains(document.activeElement)) el.hidden = !on;
  };
  show(open, (status === "upcoming" || status === "closed") && !pastEnd);
  if (open) setText(open, status === "closed" ? "Reopen now" : "Open now");
  show(close, status === "upcoming" || status === "live" || status === "sold_out");
  show(stock, !pastEnd);
}

/**
 * Runs `button`'s action (`open`, `close`, `add-stock`, `set-stock`) on sale
 * `id`, called `name`, with the units typed in `units` (an input) for a stock
 * change; a close or a reopen is confirmed first. Answers null when nothing was
 * sent (the admin said no), else `{ok, view, message, focus}`: the sale as it
 * is now when `ok`, the words to say, and the field to focus when the units are
 * missing.
 */
export async function runSaleAction(button, { id, name, units }) {
  const action = button.dataset.action;
  const sale = encodeURIComponent(id);
  let path = `/api/admin/sales/${sale}/${action}`;
  let body;
  let done;
  if (action === "set-stock" || action === "add-stock") {
    const n = parseUnits(units.value);
    if (n === null || (action === "add-stock" && n === 0)) {
      return { ok: false, message: `Enter a whole number of units for “${name}” first.`, focus: units };
    }
    path = `/api/admin/sales/${sale}/stock`;
    body = action === "set-stock" ? { set: n } : { add: n };
    done = action === "set-stock" ? `Stock of “${name}” set to ${n}.` : `Added ${n} to “${name}”.`;
  } else if (action === "open") {
    if (button.textContent.startsWith("Reopen") && !confirm(`Reopen “${name}”? Buyers can buy again at once, until its end time.`)) {
      return null;
    }
    done = `“${name}” is open.`;
  } else if (action === "close") {
    if (!confirm(`Close “${name}”? Buyers will be turned away.`)) return null;
    done = `“${name}” is closed.`;
  } else {
    return null;
  }
  button.disabled = true;
  const res = await api("POST", path, body);
  button.disabled = false;
  if (res.status === 202) {
    if (units) units.value = "";
    return { ok: true, view: null, message: `The change to “${name}” is recorded and applies in a moment.` };
  }
  if (!res.ok) return { ok: false, message: `“${name}”: ${messageOf(res, "the change failed.")}` };
  if (units) units.value = "";
  return { ok: true, view: res.data, message: done };
}
