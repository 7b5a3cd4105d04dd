// A sale's admin page: the edit form (only the fields that changed are sent, so a
// sale that has opened accepts the form as long as its fixed fields are left
// alone; its waiting room as on the new-sale form), archive, unarchive and delete;
// a waiting room's line: its numbers against the units left, and its controls
// (pause, resume, close to new joins, reopen).

import { adminDrawPanel } from "./admin-draw.js";
import { api, messageOf } from "./api.js";
import { field, flash, setBadge, setText, shownStatus } from "./dom.js";
import { focusFirstError, revalidateOnInput, say, showFieldErrors } from "./forms.js";
import { ADMIN_POLL_MS, pollWhileVisible } from "./live.js";
import { groupDigits } from "./numbers.js";
import { retireButtons } from "./retire.js";
import { runSaleAction, showSaleActions } from "./sale-controls.js";
import { toLocalInput } from "./time.js";
import {
  ACCOUNT_AGE_HINT,
  ADMIT_RATE_HINT,
  CLAIM_WINDOW_HINT,
  ENTRIES_OPEN_HINT,
  IMAGE_HINT,
  MAX_ADMIT_PER_SECOND,
  MAX_PER_USER_HINT,
  PAYMENT_WINDOW_HINT,
  PROOF_HINT,
  QUEUE_OPENS_HINT,
  parsePrice,
  parseUnits,
  refusalOf,
} from "./sale-form.js";

/** The line's controls in words (as the page renders them: `line_state_words`). */
function lineStateWords(paused, joinsClosed) {
  return `${paused ? "Paused: nobody is let in" : "Letting shoppers in"}; ${joinsClosed ? "closed" : "open"} to new joins.`;
}

export function adminSalePage() {
  const root = document.getElementById("admin-sale");
  const id = encodeURIComponent(root.dataset.saleId);
  const form = document.querySelector('form[data-form="edit-sale"]');
  const editMessage = field(document, "edit-message");
  const f = form.elements;
  adminDrawPanel(root, id);

  for (const name of ["starts_at", "ends_at", "queue_opens_at", "entries_open_at"]) {
    if (!f[name]) continue;
    const at = new Date(f[name].dataset.iso);
    if (f[name].dataset.iso && !Number.isNaN(at.getTime())) f[name].value = toLocalInput(at);
  }

  // Fixed once the sale has opened: the page renders them disabled.
  const opened = form.dataset.opened === "true";
  // A draw sale has no waiting room: the page leaves its fields out.
  const room = f.waiting_room;
  // The ticket box as the admin left it, for when the waiting room is unticked.
  let ticketChoice = f.requires_ticket.checked;

  /**
   * The waiting room's fields, only with the box ticked; the line opens with the
   * sale unless the admin says earlier. With a waiting room the sale requires a
   * ticket (the server insists), so the ticket box is ticked and held.
   */
  function showQueueFields() {
    if (!room) return;
    const on = room.checked;
    field(form, "queue-opens-field").hidden = !on;
    field(form, "admit-rate-field").hidden = !on;
    if (on && !f.queue_opens_at.value) f.queue_opens_at.value = f.starts_at.value;
    if (opened) return;
    if (on) {
      if (!f.requires_ticket.disabled) ticketChoice = f.requires_ticket.checked;
      f.requires_ticket.checked = true;
      f.requires_ticket.disabled = true;
      f.requires_ticket.setAttribute("aria-describedby", "edit-waiting-room-help");
    } else if (f.requires_ticket.disabled) {
      f.requires_ticket.checked = ticketChoice;
      f.requires_ticket.disabled = false;
      f.requires_ticket.removeAttribute("aria-describedby");
    }
  }
  if (room) room.addEventListener("change", showQueueFields);
  showQueueFields();

  /** The form's values as the API takes them; errors by field for the rest. */
  function read() {
    const errors = {};
    const values = {
      name: f.name.value.trim(),
      description: f.description.value.trim(),
      image_url: f.image_url.value.trim() || null,
      price_cents: parsePrice(f.price.value),
      max_per_user: parseUnits(f.max_per_user.value),
      payment_window_s: parseUnits(f.payment_window_s.value),
      requires_ticket: f.requires_ticket.checked,
      rebuy_after_expiry: f.rebuy_after_expiry.checked,
    };
    if (room) values.waiting_room = room.checked;
    if (!values.name) errors.name = "Give the sale a name.";
    if (values.price_cents === null) errors.price = "Enter the price as a number, like 499 or 19.99.";
    if (values.image_url && !/^(https:\/\/[^\s/?#@]+|\/(?!\/))[^\s"'<>\\`]*$/.test(values.image_url)) errors.image_url = IMAGE_HINT;
    if (values.max_per_user === null || values.max_per_user < 1 || values.max_per_user > 100) errors.max_per_user = MAX_PER_USER_HINT;
    if (values.payment_window_s === null || values.payment_window_s > 86400) errors.payment_window_s = PAYMENT_WINDOW_HINT;
    for (const [name, words] of [["starts_at", "opens"], ["ends_at", "ends"]]) {
      const at = new Date(f[name].value);
      if (Number.isNaN(at.getTime())) errors[name] = `Pick when the sale ${words}.`;
      // Minutes as the form shows them: unchanged unless the admin changed them.
      else values[name] = f[name].value === toLocalInput(new Date(f[name].dataset.iso)) ? f[name].dataset.iso : at.toISOString();
    }
    // The line's settings only with a waiting room (unticking it drops them).
    if (values.waiting_room) {
      const opens = f.queue_opens_at;
      const at = new Date(opens.value);
      if (Number.isNaN(at.getTime())) errors.queue_opens_at = "Pick when the line opens.";
      else {
        // Unchanged as above; the opening's own minute is the opening itself.
        if (opens.dataset.iso && opens.value === toLocalInput(new Date(opens.dataset.iso))) values.queue_opens_at = opens.dataset.iso;
        else if (opens.value === f.starts_at.value && values.starts_at) values.queue_opens_at = values.starts_at;
        else values.queue_opens_at = at.toISOString();
        if (values.starts_at && new Date(values.queue_opens_at) > new Date(values.starts_at)) errors.queue_opens_at = QUEUE_OPENS_HINT;
      }
      values.admit_per_second = parseUnits(f.admit_per_second.value);
      if (values.admit_per_second === null || values.admit_per_second < 1 || values.admit_per_second > MAX_ADMIT_PER_SECOND) {
        errors.admit_per_second = ADMIT_RATE_HINT;
      }
    }
    readFairness(values, errors);
    return { values, errors };
  }

  /** A draw's settings (a draw sale only), the proof of work and the account age. */
  function readFairness(values, errors) {
    if (f.entries_open_at) {
      const entries = f.entries_open_at;
      const at = new Date(entries.value);
      if (Number.isNaN(at.getTime())) errors.entries_open_at = "Pick when entries open.";
      else {
        values.entries_open_at = entries.value === toLocalInput(new Date(entries.dataset.iso)) ? entries.dataset.iso : at.toISOString();
        if (values.starts_at && new Date(values.entries_open_at) >= new Date(values.starts_at)) errors.entries_open_at = ENTRIES_OPEN_HINT;
      }
      values.claim_window_s = parseUnits(f.claim_window_s.value);
      if (values.claim_window_s === null || values.claim_window_s < 60 || values.claim_window_s > 86400) errors.claim_window_s = CLAIM_WINDOW_HINT;
    }
    values.proof_of_work = parseUnits(f.proof_of_work.value);
    if (values.proof_of_work === null || values.proof_of_work > 24) errors.proof_of_work = PROOF_HINT;
    values.min_account_age_s = parseUnits(f.min_account_age_s.value);
    if (values.min_account_age_s === null || values.min_account_age_s > 31622400) errors.min_account_age_s = ACCOUNT_AGE_HINT;
  }

  const initial = read().values;
  revalidateOnInput(form, () => {
    const { errors } = read();
    // Every field fixed: the form's "check the fields" goes too.
    if (!Object.keys(errors).length && editMessage.classList.contains("is-error")) setText(editMessage, "");
    return errors;
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const { values, errors } = read();
    showFieldErrors(form, errors);
    if (Object.keys(errors).length) {
      say(editMessage, "Check the fields marked above.", false);
      focusFirstError(form);
      return;
    }
    const changed = {};
    for (const [name, value] of Object.entries(values)) {
      if (value !== initial[name]) changed[name] = value;
    }
    if (!Object.keys(changed).length) {
      say(editMessage, "Nothing changed.", true);
      return;
    }
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    const res = await api("PATCH", `/api/admin/sales/${id}`, changed);
    button.disabled = false;
    if (res.ok) {
      say(editMessage, "Saved. The shop's pages show the change within a second.", true);
      // The page's facts and history follow from the server.
      setTimeout(() => location.reload(), 600);
      return;
    }
    const refusal = refusalOf(res);
    if (refusal) {
      showFieldErrors(form, refusal);
      focusFirstError(form);
      say(editMessage, "Check the fields marked above.", false);
    } else {
      say(editMessage, messageOf(res, "Could not save the changes."), false);
    }
  });

  // A waiting room's line: its numbers follow the sale's view.
  const lineFacts = field(root, "line-facts");
  /** The line's numbers, against the units left, and its controls as they are. */
  function showLine(line, unitsLeft) {
    for (const dd of lineFacts.querySelectorAll("[data-line]")) {
      const n = line[dd.dataset.line];
      if (Number.isFinite(n)) setText(dd, groupDigits(n));
    }
    if (Number.isFinite(line.waiting) && Number.isFinite(unitsLeft)) {
      setText(field(root, "line-summary"), `${groupDigits(line.waiting)} waiting for ${groupDigits(unitsLeft)} unit${unitsLeft === 1 ? "" : "s"} left`);
    }
    const controls = field(root, "line-controls");
    if (!controls || typeof line.paused !== "boolean") return;
    setText(field(controls, "line-state"), lineStateWords(line.paused, line.joins_closed));
    const shown = { pause: !line.paused, resume: line.paused, close: !line.joins_closed, reopen: line.joins_closed };
    for (const button of controls.querySelectorAll("[data-line-action]")) button.hidden = !shown[button.dataset.lineAction];
  }
  if (lineFacts) {
    pollWhileVisible(async () => {
      const res = await api("GET", `/api/sales/${id}`);
      const line = res.ok && res.data.line;
      if (line) showLine(line, res.data.stock_left);
    }, ADMIN_POLL_MS);
    const controls = field(root, "line-controls");
    const message = controls && field(controls, "line-message");
    const done = {
      pause: "Paused: nobody is let in until you resume.",
      resume: "Resumed: shoppers are let in again.",
      close: "Closed: new shoppers cannot join; those in line keep their places.",
      reopen: "Reopened: shoppers can join again.",
    };
    for (const button of controls ? controls.querySelectorAll("[data-line-action]") : []) {
      button.addEventListener("click", async () => {
        const action = button.dataset.lineAction;
        button.disabled = true;
        const res = await api("POST", `/api/admin/sales/${id}/line`, { action });
        button.disabled = false;
        if (!res.ok) {
          say(message, messageOf(res, "Could not change the line."), false);
          return;
        }
        showLine(res.data.line, res.data.units_left);
        say(message, done[action], true);
        // The button pressed is hidden now: the focus goes to its counterpart.
        const next = controls.querySelector(`[data-line-action]:not([hidden])[data-line-action="${{ pause: "resume", resume: "pause", close: "reopen", reopen: "close" }[action]}"]`);
        if (next) next.focus();
      });
    }
  }

  saleControls(root, id, () => f.name.defaultValue);
  retireButtons(root, `/api/admin/sales/${id}`, "sale", () => f.name.defaultValue, "/admin#sales-heading");
}

/**
 * The sale's Open now, Close and Top up (sale-controls.js), and the status and
 * numbers beside them, kept current from the sale's view.
 */
function saleControls(root, id, nameOf) {
  const box = field(root, "sale-controls");
  const message = field(box, "controls-message");
  const show = (view) => {
    setBadge(field(root, "badge"), shownStatus(view.status, view.draw_finished_at));
    setText(field(root, "stock-left"), groupDigits(Number(view.stock_left)));
    setText(field(root, "sold"), groupDigits(Number(view.sold)));
    showSaleActions(box, view);
  };
  box.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const done = await runSaleAction(button, { id: root.dataset.saleId, name: nameOf(), units: field(box, "units") });
    if (!done) return;
    if (done.focus) done.focus.focus();
    if (done.view) {
      show(done.view);
      flash(box);
    }
    // A button that went with the new state leaves the focus next to it.
    if (button.hidden) [...box.querySelectorAll("button, input")].find((el) => el.offsetParent !== null)?.focus({ preventScroll: true });
    say(message, done.message, done.ok);
  });
  pollWhileVisible(async () => {
    const res = await api("GET", `/api/sales/${id}`);
    if (res.ok) show(res.data);
  }, ADMIN_POLL_MS);
}
