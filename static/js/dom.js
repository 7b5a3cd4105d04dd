// Small DOM helpers shared by the pages. Text from the server goes in with
// `textContent`, never as HTML.

import { localTime, utcTime, zoneName } from "./time.js";

/** The element of `root` marked `data-field="name"`. */
export function field(root, name) {
  return root.querySelector(`[data-field="${name}"]`);
}

/** Sets `el`'s text, leaving the DOM alone when it is already that. */
export function setText(el, text) {
  if (el && el.textContent !== String(text)) el.textContent = String(text);
}

/** `<time data-local>` in the visitor's time zone; `data-seconds` adds the seconds. */
export function showLocalTimes(root) {
  for (const el of root.querySelectorAll("time[data-local]")) {
    const at = new Date(el.dateTime);
    if (Number.isNaN(at.getTime())) continue;
    setText(el, localTime(at, el.hasAttribute("data-seconds")));
    el.title = utcTime(at);
  }
}

/**
 * Each `[data-zone]` names the visitor's time zone as the pages' times do:
 * "your local time, GMT+1". The zone is the one at the date its field
 * (`data-zone-for`, a `datetime-local`) holds, so a summer date says summer time.
 */
export function nameTimeZones(root) {
  for (const el of root.querySelectorAll("[data-zone]")) {
    const input = el.dataset.zoneFor ? document.getElementById(el.dataset.zoneFor) : null;
    const name = () => {
      const at = input?.value ? new Date(input.value) : new Date();
      const zone = zoneName(Number.isNaN(at.getTime()) ? new Date() : at);
      if (zone) setText(el, `your local time, ${zone}`);
    };
    name();
    input?.addEventListener("change", name);
  }
}

/** Scrolls `el` into view when it is not, gently unless motion is unwelcome. */
export function reveal(el) {
  const calm = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  el.scrollIntoView({ block: "nearest", behavior: calm ? "auto" : "smooth" });
}

const STATUS_LABELS = {
  upcoming: "Upcoming",
  live: "Live",
  sold_out: "Sold out",
  ended: "Ended",
  closed: "Closed",
  open: "Open",
  draw_over: "Draw over",
};

/**
 * The status a page shows of a sale: its own, or "draw_over" for a live draw
 * sale whose draw finished (`draw_finished_at`: every entry had its turn, so the
 * units left are not for sale to anyone).
 */
export function shownStatus(status, drawFinished) {
  return status === "live" && drawFinished ? "draw_over" : status;
}

/** A status badge: its colour class and its words. */
export function setBadge(el, status) {
  if (!el) return;
  el.className = `badge badge-${status}`;
  setText(el, STATUS_LABELS[status] || status);
}

/**
 * Replaces an outcome box with a title, an optional detail and an optional
 * link ({href, text}). `kind` picks the colour: success, pending, info,
 * warning or error.
 */
export function showOutcome(box, kind, title, detail, link) {
  box.replaceChildren();
  box.className = `outcome outcome-${kind}`;
  const p = document.createElement("p");
  p.textContent = title;
  box.append(p);
  if (detail || link) {
    const q = document.createElement("p");
    if (detail) q.append(document.createTextNode(detail + (link ? " " : "")));
    if (link) {
      const a = document.createElement("a");
      a.href = link.href;
      a.textContent = link.text;
      q.append(a);
    }
    box.append(q);
  }
}

/** Briefly highlights a table row that just changed. */
export function flash(row) {
  row.classList.remove("flash");
  void row.offsetWidth; // restart the animation
  row.classList.add("flash");
}

/** Sets each `<time data-field="name">` of `root` to its ISO value, in local time, when it changed. */
export function setTimes(root, times) {
  for (const [name, value] of times) {
    const t = field(root, name);
    if (t.dateTime !== value) {
      t.dateTime = value;
      setText(t, localTime(new Date(value)));
      t.title = utcTime(new Date(value));
    }
  }
}

/**
 * Shows `views` in the table body `rows`. Rows never move once shown (a change
 * can move an item in the API's order, and a row jumping under the pointer gets
 * the wrong click): known rows are updated where they are, new ones go on top.
 * `empty` names the field shown when there is nothing.
 */
export function showRows(rows, views, { rowOf, newRow, fillRow, empty }) {
  const fresh = [];
  for (const view of views) {
    let row = rowOf(view.id);
    if (!row) {
      row = newRow(view);
      fresh.push(row);
    }
    fillRow(row, view);
  }
  rows.prepend(...fresh);
  const none = field(document, empty);
  if (none) none.hidden = views.length > 0;
}
