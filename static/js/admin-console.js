// The sale-day console at the top of the admin page: the live and upcoming sales
// with sold, left, revenue paid and their line, kept current from
// `GET /api/admin/console`; Open now, Close and Top up through sale-controls.js.

import { api, messageOf } from "./api.js";
import { field, flash, setBadge, setText, shownStatus } from "./dom.js";
import { say } from "./forms.js";
import { ADMIN_POLL_MS, pollWhileVisible } from "./live.js";
import { formatPrice, groupDigits } from "./numbers.js";
import { runSaleAction, showSaleActions } from "./sale-controls.js";

/**
 * A waiting room's line in words, as the server words it
 * (`web::admin::console::line_text`): `state` is the console's `line_state`,
 * `line` the sale's `line` numbers.
 */
export function lineText(state, line, left) {
  const n = (name) => groupDigits(Number(line?.[name] ?? 0));
  const units = `${groupDigits(Number(left ?? 0))} ${Number(left) === 1 ? "unit" : "units"} left`;
  const paused = line?.paused ? ", paused" : "";
  const closed = line?.joins_closed ? ", closed to new joins" : "";
  switch (state) {
    case "not_open":
      return "Not open yet";
    case "joining":
      return `${n("line")} in line for ${units}, let in from the opening${paused}${closed}`;
    case "admitting":
      return `${n("waiting")} waiting for ${units}, ${n("open")} let in now${paused}${closed}`;
    case "over":
      return `Over, ${n("waiting")} never let in`;
    default:
      return "No line";
  }
}

/**
 * Runs the console, when the page has one. `removed()`: the ids of sales the
 * rehearsal cleanup removed, which a refresh already on its way must not bring
 * back. Answers `{refresh}`.
 */
export function adminConsole(removed) {
  const rows = field(document, "console-rows");
  const template = document.getElementById("console-row");
  if (!rows || !template) return { refresh() {} };
  const message = field(document, "console-message");

  function rowOf(id) {
    return rows.querySelector(`tr[data-console-sale="${CSS.escape(String(id))}"]`);
  }

  function newRow(view) {
    const row = template.content.firstElementChild.cloneNode(true);
    const id = String(view.id);
    row.dataset.consoleSale = id;
    field(row, "name").href = `/admin/sales/${encodeURIComponent(id)}`;
    field(row, "orders-link").href = `/admin/sales/${encodeURIComponent(id)}/orders`;
    setText(field(row, "id"), `#${id}`);
    const units = field(row, "units");
    units.id = `console-units-${id}`;
    field(row, "units-label").htmlFor = units.id;
    return row;
  }

  function fillRow(row, view) {
    setText(field(row, "name"), view.name);
    field(row, "rehearsal").hidden = !view.rehearsal;
    const archived = field(row, "archived");
    if (archived) archived.hidden = !view.archived_at;
    setText(field(row, "units-label"), `Units to add to ${view.name}`);
    setText(field(row, "orders-name"), ` of ${view.name}`);
    setBadge(field(row, "badge"), shownStatus(view.status, view.draw_finished_at));
    setText(field(row, "sold"), groupDigits(Number(view.sold)));
    setText(field(row, "stock-left"), groupDigits(Number(view.stock_left)));
    // An action's answer is the plain sale: its revenue and line wait for the console.
    if (view.revenue_paid_cents !== undefined) {
      setText(field(row, "revenue"), formatPrice(Number(view.revenue_paid_cents)));
      const line = field(row, "line");
      line.dataset.lineState = view.line_state || "";
      setText(line, lineText(view.line_state, view.line, view.stock_left));
    }
    showSaleActions(row, view);
    // A waiting room's line: Pause or Resume, whichever applies.
    const paused = Boolean(view.line?.paused);
    for (const button of row.querySelectorAll("[data-line-action]")) {
      button.hidden = !view.waiting_room || (button.dataset.lineAction === "pause") === paused;
      const name = button.querySelector(".visually-hidden");
      if (name) setText(name, ` of ${view.name}`);
    }
  }

  /** Rows stay where they are; a sale that is no longer live or upcoming goes. */
  async function refresh() {
    const res = await api("GET", "/api/admin/console");
    if (!res.ok || !Array.isArray(res.data?.live)) return;
    const gone = removed();
    const views = [...res.data.live, ...res.data.upcoming].filter((view) => !gone.has(String(view.id)));
    const listed = new Set(views.map((view) => String(view.id)));
    for (const row of rows.querySelectorAll("tr[data-console-sale]")) {
      if (!listed.has(row.dataset.consoleSale) && !row.contains(document.activeElement)) row.remove();
    }
    for (const view of views) {
      let row = rowOf(view.id);
      if (!row) {
        row = newRow(view);
        rows.append(row);
      }
      fillRow(row, view);
    }
    field(document, "console-empty").hidden = rows.querySelector("tr") !== null;
    field(document, "console-more").hidden = !(res.data.more_live || res.data.more_upcoming);
  }

  rows.addEventListener("click", async (event) => {
    const lineButton = event.target.closest("button[data-line-action]");
    if (lineButton) {
      const row = lineButton.closest("tr");
      const action = lineButton.dataset.lineAction;
      lineButton.disabled = true;
      const res = await api("POST", `/api/admin/sales/${encodeURIComponent(row.dataset.consoleSale)}/line`, { action });
      lineButton.disabled = false;
      const name = field(row, "name").textContent;
      if (res.ok) {
        const paused = Boolean(res.data.line?.paused);
        for (const b of row.querySelectorAll("[data-line-action]")) b.hidden = (b.dataset.lineAction === "pause") === paused;
        const other = row.querySelector(`[data-line-action="${paused ? "resume" : "pause"}"]`);
        if (other) other.focus();
        flash(row);
        refresh();
      }
      say(message, res.ok ? `${name}: line ${action === "pause" ? "paused, nobody is let in until you resume" : "resumed"}.` : messageOf(res, "Could not change the line."), res.ok);
      return;
    }
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const row = button.closest("tr");
    const name = field(row, "name").textContent;
    const action = button.dataset.action;
    const done = await runSaleAction(button, { id: row.dataset.consoleSale, name, units: field(row, "units") });
    if (!done) return;
    if (done.focus) done.focus.focus();
    if (done.ok) {
      // Open and Close may disappear with the new state: keep the focus in the row.
      if (action === "open" || action === "close") field(row, "name").focus({ preventScroll: true });
      if (done.view) fillRow(row, done.view);
      flash(row);
      // Revenue and the line come with the console, not with the action's answer.
      refresh();
    }
    say(message, done.message, done.ok);
  });

  pollWhileVisible(refresh, ADMIN_POLL_MS);
  return { refresh };
}
