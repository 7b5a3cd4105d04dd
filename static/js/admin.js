// The admin page: creating sales and the sales table (its polls: admin-polls.js).

import { api, messageOf } from "./api.js";
import { adminConsole } from "./admin-console.js";
import { field, flash, setBadge, setText, setTimes, showRows, shownStatus } from "./dom.js";
import { focusFirstError, revalidateOnInput, say, showFieldErrors } from "./forms.js";
import { ADMIN_POLL_MS, pollWhileVisible } from "./live.js";
import { formatPrice, groupDigits } from "./numbers.js";
import { toLocalInput } from "./time.js";
import {
  ACCOUNT_AGE_HINT,
  ADMIT_RATE_HINT,
  CLAIM_WINDOW_HINT,
  ENTRIES_OPEN_HINT,
  IMAGE_HINT,
  MAX_ADMIT_PER_SECOND,
  MAX_PAYMENT_WINDOW_S,
  MAX_PER_USER,
  MAX_PER_USER_HINT,
  NO_DRAW_ROOM,
  PAYMENT_WINDOW_HINT,
  PROOF_HINT,
  QUEUE_OPENS_HINT,
  parsePrice,
  parseUnits,
  refusalOf,
} from "./sale-form.js";
import { adminPolls } from "./admin-polls.js";
import { runSaleAction, showSaleActions } from "./sale-controls.js";

export function adminPage() {
  const form = document.querySelector('form[data-form="create-sale"]');
  const createMessage = field(document, "create-message");
  const adminMessage = field(document, "admin-message");
  const rows = field(document, "admin-rows");
  const rowTemplate = document.getElementById("admin-row");
  // Sales the rehearsal cleanup removed: a refresh already on its way must not
  // bring their rows back.
  const removed = new Set();

  function defaultWindow() {
    const start = new Date(Date.now() + 5 * 60 * 1000);
    start.setSeconds(0, 0);
    form.elements.starts_at.value = toLocalInput(start);
    form.elements.ends_at.value = toLocalInput(new Date(start.getTime() + 7 * 86400 * 1000));
    showQueueFields();
    showDrawFields();
  }

  /**
   * The waiting room's fields, only with the box ticked; the line opens with the
   * sale unless the admin says earlier.
   */
  function showQueueFields() {
    const f = form.elements;
    const on = f.waiting_room.checked;
    field(form, "queue-opens-field").hidden = !on;
    field(form, "admit-rate-field").hidden = !on;
    if (on && !f.queue_opens_at.value) f.queue_opens_at.value = f.starts_at.value;
  }
  form.elements.waiting_room.addEventListener("change", showQueueFields);

  /** A draw's fields, only for a draw; entries open now unless the admin says later. */
  function showDrawFields() {
    const f = form.elements;
    const draw = f.mode.value === "draw";
    field(form, "entries-opens-field").hidden = !draw;
    field(form, "claim-window-field").hidden = !draw;
    if (draw && !f.entries_open_at.value) f.entries_open_at.value = toLocalInput(new Date());
  }
  form.elements.mode.addEventListener("change", showDrawFields);

  function rowOf(id) {
    return rows.querySelector(`tr[data-sale-id="${CSS.escape(String(id))}"]`);
  }

  function newRow(view) {
    const row = rowTemplate.content.firstElementChild.cloneNode(true);
    const id = String(view.id);
    row.dataset.saleId = id;
    field(row, "name").href = `/sales/${encodeURIComponent(id)}`;
    field(row, "orders-link").href = `/admin/sales/${encodeURIComponent(id)}/orders`;
    field(row, "manage-link").href = `/admin/sales/${encodeURIComponent(id)}`;
    setText(field(row, "id"), `#${id}`);
    const units = field(row, "units");
    units.id = `units-${id}`;
    field(row, "units-label").htmlFor = units.id;
    return row;
  }

  function fillRow(row, view) {
    setText(field(row, "name"), view.name);
    const rehearsal = field(row, "rehearsal");
    if (rehearsal) rehearsal.hidden = !view.rehearsal;
    const archived = field(row, "archived");
    if (archived) archived.hidden = !view.archived_at;
    const label = field(row, "units-label") || row.querySelector("label");
    setText(label, `Units for ${view.name}`);
    setBadge(field(row, "badge"), shownStatus(view.status, view.draw_finished_at));
    setText(field(row, "price"), formatPrice(Number(view.price_cents)));
    setText(field(row, "stock-left"), groupDigits(Number(view.stock_left)));
    setText(field(row, "sold"), groupDigits(Number(view.sold)));
    showSaleActions(row, view);
    setTimes(row, [
      ["starts", view.starts_at],
      ["ends", view.ends_at],
    ]);
  }

  /** Rows stay where they are (opening a sale changes its place in the API's order). */
  function showViews(views) {
    showRows(rows, views, { rowOf, newRow, fillRow, empty: "admin-empty" });
  }

  async function refresh() {
    // The API page with the rows this table shows (`data-list-url`).
    const res = await api("GET", rows.dataset.listUrl || "/api/admin/sales");
    if (res.ok && Array.isArray(res.data)) showViews(res.data.filter((view) => !removed.has(String(view.id))));
  }

  /** Every problem of the form, in plain words, by field. */
  function validate() {
    const f = form.elements;
    const errors = {};
    const starts = new Date(f.starts_at.value);
    const ends = new Date(f.ends_at.value);
    if (!f.name.value.trim()) errors.name = "Give the sale a name.";
    if (parsePrice(f.price.value) === null) errors.price = "Enter the price as a number, like 499 or 19.99.";
    const image = f.image_url.value.trim();
    if (image && !/^(https:\/\/[^\s/?#@]+|\/(?!\/))[^\s"'<>\\`]*$/.test(image)) errors.image_url = IMAGE_HINT;
    const stock = parseUnits(f.stock.value);
    if (stock === null) errors.stock = "Enter the stock as a whole number, like 100.";
    else if (stock > 10000000) errors.stock = "The stock can be at most 10,000,000 units.";
    if (Number.isNaN(starts.getTime())) errors.starts_at = "Pick when the sale opens.";
    if (Number.isNaN(ends.getTime())) errors.ends_at = "Pick when the sale ends.";
    else if (ends.getTime() <= Date.now()) errors.ends_at = "The end is in the past: pick a later time.";
    else if (!errors.starts_at && ends <= starts) errors.ends_at = "The sale must end after it opens.";
    else if (!errors.starts_at && ends - starts > 366 * 86400000) errors.ends_at = "A sale can last at most 366 days.";
    const paymentWindow = parseUnits(f.payment_window_s.value);
    if (paymentWindow === null || paymentWindow > MAX_PAYMENT_WINDOW_S) errors.payment_window_s = PAYMENT_WINDOW_HINT;
    const perUser = parseUnits(f.max_per_user.value);
    if (perUser === null || perUser < 1 || perUser > MAX_PER_USER) errors.max_per_user = MAX_PER_USER_HINT;
    if (f.waiting_room.checked) {
      const opens = new Date(f.queue_opens_at.value);
      if (Number.isNaN(opens.getTime())) errors.queue_opens_at = "Pick when the line opens.";
      else if (!errors.starts_at && opens > starts) errors.queue_opens_at = QUEUE_OPENS_HINT;
      const rate = parseUnits(f.admit_per_second.value);
      if (rate === null || rate < 1 || rate > MAX_ADMIT_PER_SECOND) errors.admit_per_second = ADMIT_RATE_HINT;
    }
    if (f.mode.value === "draw") {
      if (f.waiting_room.checked) errors.mode = NO_DRAW_ROOM;
      const entries = new Date(f.entries_open_at.value);
      if (Number.isNaN(entries.getTime())) errors.entries_open_at = "Pick when entries open.";
      else if (!errors.starts_at && entries >= starts) errors.entries_open_at = ENTRIES_OPEN_HINT;
      const claim = parseUnits(f.claim_window_s.value);
      if (claim === null || claim < 60 || claim > 86400) errors.claim_window_s = CLAIM_WINDOW_HINT;
    }
    const proof = parseUnits(f.proof_of_work.value);
    if (proof === null || proof > 24) errors.proof_of_work = PROOF_HINT;
    const age = parseUnits(f.min_account_age_s.value);
    if (age === null || age > 31622400) errors.min_account_age_s = ACCOUNT_AGE_HINT;
    return errors;
  }
  revalidateOnInput(form, validate);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = form.elements;
    const errors = validate();
    showFieldErrors(form, errors);
    if (Object.keys(errors).length) {
      say(createMessage, "Check the fields marked above.", false);
      focusFirstError(form);
      return;
    }
    setText(createMessage, "");
    const price = parsePrice(f.price.value);
    const stock = parseUnits(f.stock.value);
    const starts = new Date(f.starts_at.value);
    const ends = new Date(f.ends_at.value);
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    const res = await api("POST", "/api/admin/sales", {
      name: f.name.value,
      description: f.description.value,
      image_url: f.image_url.value.trim() || null,
      price_cents: price,
      stock,
      // datetime-local is local wall time; the API takes UTC instants.
      starts_at: starts.toISOString(),
      ends_at: ends.toISOString(),
      requires_ticket: f.requires_ticket.checked,
      payment_window_s: parseUnits(f.payment_window_s.value),
      rebuy_after_expiry: f.rebuy_after_expiry.checked,
      max_per_user: parseUnits(f.max_per_user.value),
      proof_of_work: parseUnits(f.proof_of_work.value),
      min_account_age_s: parseUnits(f.min_account_age_s.value),
      // A draw is made when the sale opens.
      ...(f.mode.value === "draw"
        ? {
            mode: "draw",
            entries_open_at: new Date(f.entries_open_at.value).toISOString(),
            draw_at: starts.toISOString(),
            claim_window_s: parseUnits(f.claim_window_s.value),
          }
        : {}),
      ...(f.waiting_room.checked
        ? {
            waiting_room: true,
            queue_opens_at: new Date(f.queue_opens_at.value).toISOString(),
            admit_per_second: parseUnits(f.admit_per_second.value),
          }
        : {}),
    });
    button.disabled = false;
    if (res.status === 201) {
      say(createMessage, `Created “${res.data.name}” (#${res.data.id}).`, true);
      form.reset();
      defaultWindow();
      await refresh();
      const row = rowOf(res.data.id);
      if (row) flash(row);
    } else {
      const refusal = refusalOf(res);
      if (refusal) {
        showFieldErrors(form, refusal);
        focusFirstError(form);
        say(createMessage, "Check the fields marked above.", false);
      } else {
        say(createMessage, messageOf(res, "Could not create the sale."), false);
      }
    }
  });

  rows.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const row = button.closest("tr");
    const name = field(row, "name").textContent;
    const action = button.dataset.action;
    const units = field(row, "units");
    const done = await runSaleAction(button, { id: row.dataset.saleId, name, units });
    if (!done) return;
    if (done.focus) done.focus.focus();
    if (done.ok) {
      // Open and Close may disappear with the new state: keep the focus in the row.
      if (action === "open" || action === "close") field(row, "name").focus({ preventScroll: true });
      if (done.view) fillRow(row, done.view);
      flash(row);
    }
    say(adminMessage, done.message, done.ok);
  });

  const cleanup = document.querySelector('button[data-action="cleanup-rehearsals"]');
  const cleanupMessage = field(document, "rehearsals-message");
  cleanup?.addEventListener("click", async () => {
    if (!confirm("Remove every rehearsal sale with its orders, and the load tool's users? Real sales are not touched.")) return;
    cleanup.disabled = true;
    const res = await api("POST", "/api/admin/rehearsals/cleanup");
    cleanup.disabled = false;
    if (res.ok) {
      say(cleanupMessage, cleanedText(res.data), true);
      // Every row marked Rehearsal was one of them (the cleanup removes them all).
      for (const badge of document.querySelectorAll('tr [data-field="rehearsal"]:not([hidden])')) {
        const row = badge.closest("tr");
        removed.add(row.dataset.saleId || row.dataset.consoleSale);
        row.remove();
      }
      const none = field(document, "admin-empty");
      if (none && !rows.querySelector("tr")) none.hidden = false;
      await refresh();
      consoleRows.refresh();
    } else {
      say(cleanupMessage, messageOf(res, "Could not remove the rehearsals."), false);
    }
  });

  const consoleRows = adminConsole(() => removed);
  defaultWindow();
  pollWhileVisible(refresh, ADMIN_POLL_MS);
  adminPolls();
}

/** What a rehearsal cleanup removed, in words: "1 rehearsal sale, 2,000 orders and 2,000 users". */
export function cleanedText(d) {
  const count = (n, one, many) => `${groupDigits(Number(n))} ${Number(n) === 1 ? one : many}`;
  let text = `Removed ${count(d.sales, "rehearsal sale", "rehearsal sales")}, ${count(d.orders, "order", "orders")} and ${count(d.users, "user", "users")}`;
  if (d.admins > 0) text += ` (and the load tool's ${count(d.admins, "admin account", "admin accounts")})`;
  text += ".";
  if (d.users_kept > 0) text += ` ${count(d.users_kept, "rehearsal user was", "rehearsal users were")} kept: a real sale, poll or change names them.`;
  return text;
}
