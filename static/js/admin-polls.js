// The admin page's polls.

import { api, messageOf } from "./api.js";
import { field, flash, setBadge, setText, setTimes, showRows } from "./dom.js";
import { ballotFields, ballotRefusal } from "./ballot-form.js";
import { focusFirstError, say, showFieldErrors } from "./forms.js";
import { ADMIN_POLL_MS, pollWhileVisible } from "./live.js";
import { toLocalInput } from "./time.js";

/** The admin page's polls: the create form with its option list, and the table. */
export function adminPolls() {
  const form = document.querySelector('form[data-form="create-poll"]');
  if (!form) return;
  const minOptions = Number(form.dataset.minOptions) || 2;
  const maxOptions = Number(form.dataset.maxOptions) || 20;
  const list = field(form, "option-list");
  const addButton = form.querySelector('[data-action="add-option"]');
  const optionTemplate = document.getElementById("poll-option-row");
  const createMessage = field(form, "poll-create-message");
  const adminMessage = field(document, "poll-admin-message");
  const rows = field(document, "poll-rows");
  const rowTemplate = document.getElementById("poll-row");
  const ballot = ballotFields(form);

  /** Numbers the option inputs 1..n and enables add/remove within the bounds. */
  function renumber() {
    const items = [...list.children];
    items.forEach((item, i) => {
      const n = i + 1;
      const input = item.querySelector("input");
      input.id = `poll-option-${n}`;
      input.placeholder = `Option ${n}`;
      const label = item.querySelector("label");
      label.htmlFor = input.id;
      setText(label, `Option ${n}`);
      const remove = item.querySelector('[data-action="remove-option"]');
      remove.setAttribute("aria-label", `Remove option ${n}`);
      remove.disabled = items.length <= minOptions;
    });
    addButton.disabled = items.length >= maxOptions;
  }

  function addOption() {
    if (list.children.length >= maxOptions) return null;
    const item = optionTemplate.content.firstElementChild.cloneNode(true);
    list.append(item);
    renumber();
    return item.querySelector("input");
  }

  function resetOptions() {
    while (list.children.length > minOptions) list.lastElementChild.remove();
    while (list.children.length < minOptions) addOption();
    for (const input of list.querySelectorAll("input")) input.value = "";
    renumber();
  }

  function defaultWindow() {
    // Open from this minute for a week: most polls start at once.
    const opens = new Date();
    opens.setSeconds(0, 0);
    form.elements.opens_at.value = toLocalInput(opens);
    form.elements.closes_at.value = toLocalInput(new Date(opens.getTime() + 7 * 86400 * 1000));
  }

  addButton.addEventListener("click", () => {
    const input = addOption();
    if (input) input.focus();
  });

  list.addEventListener("click", (event) => {
    const button = event.target.closest('[data-action="remove-option"]');
    if (!button || list.children.length <= minOptions) return;
    const item = button.closest("li");
    const next = item.nextElementSibling || item.previousElementSibling;
    item.remove();
    renumber();
    if (next) next.querySelector("input").focus();
  });

  function rowOf(id) {
    return rows.querySelector(`tr[data-poll-id="${CSS.escape(String(id))}"]`);
  }

  function newRow(view) {
    const row = rowTemplate.content.firstElementChild.cloneNode(true);
    const id = String(view.id);
    row.dataset.pollId = id;
    field(row, "question").href = `/polls/${encodeURIComponent(id)}`;
    field(row, "tallies-link").href = `/admin/polls/${encodeURIComponent(id)}`;
    setText(field(row, "id"), `#${id}`);
    return row;
  }

  /** `view` is a row of `GET /api/admin/polls`, or a poll with its `results`. */
  function fillRow(row, view) {
    setText(field(row, "question"), view.question);
    setBadge(field(row, "badge"), view.status);
    const voters = Number.isFinite(view.voters) ? view.voters : view.results && view.results.voters;
    if (Number.isFinite(voters)) setText(field(row, "voters"), voters);
    setTimes(row, [
      ["opens", view.opens_at],
      ["closes", view.closes_at],
    ]);
    const close = row.querySelector('[data-action="close-poll"]');
    if (!close.contains(document.activeElement)) close.hidden = view.status === "closed";
  }

  /** As with sales: rows stay where they are, new ones go on top. */
  function showViews(views) {
    showRows(rows, views, { rowOf, newRow, fillRow, empty: "polls-empty" });
    // The list came back: a poll being restored when the page was made is back.
    const restoring = field(document, "polls-restoring");
    if (restoring) restoring.hidden = true;
  }

  async function refresh() {
    // The API page with the rows this table shows (`data-list-url`).
    const res = await api("GET", rows.dataset.listUrl || "/api/admin/polls");
    if (res.ok && Array.isArray(res.data)) showViews(res.data);
  }

  /** The option inputs that are empty or repeat an earlier one (any case). */
  function badOptions() {
    const seen = new Set();
    const bad = { empty: [], repeated: [] };
    for (const input of list.querySelectorAll("input")) {
      const key = input.value.trim().toLowerCase();
      if (!key) bad.empty.push(input);
      else if (seen.has(key)) bad.repeated.push(input);
      seen.add(key);
    }
    return bad;
  }

  /** Every problem of the form, in plain words, by field. */
  function validate() {
    const f = form.elements;
    const errors = {};
    const opens = new Date(f.opens_at.value);
    const closes = new Date(f.closes_at.value);
    if (!f.question.value.trim()) errors.question = "Write the question.";
    const bad = badOptions();
    if (bad.empty.length) errors.options = "Fill in every option, or remove the empty ones.";
    else if (bad.repeated.length)
      errors.options = `“${bad.repeated[0].value.trim()}” is listed more than once: make each option different.`;
    if (Number.isNaN(opens.getTime())) errors.opens_at = "Pick when the poll opens.";
    if (Number.isNaN(closes.getTime())) errors.closes_at = "Pick when the poll closes.";
    else if (closes.getTime() <= Date.now()) errors.closes_at = "The closing time is in the past: pick a later time.";
    else if (!errors.opens_at && closes <= opens) errors.closes_at = "The poll must close after it opens.";
    else if (!errors.opens_at && closes - opens > 366 * 86400000) errors.closes_at = "A poll can stay open at most 366 days.";
    return errors;
  }

  /** The API's refusal, in plain words under the field it is about. */
  function refusalOf(res) {
    const message = String(res.data.message || "");
    switch (res.data.error) {
      case "invalid_options":
        if (message.includes("distinct")) return { options: "Make each option different from the others." };
        return { options: `A poll has ${minOptions} to ${maxOptions} options.` };
      case "invalid_window":
        if (message.includes("past")) return { closes_at: "The closing time is in the past: pick a later time." };
        if (message.includes("at most")) return { closes_at: "A poll can stay open at most 366 days." };
        return { closes_at: "The poll must close after it opens." };
      case "invalid_ballot_settings":
        return ballotRefusal(message);
      case "invalid_text":
        if (message.startsWith("option")) return { options: "Each option can have at most 200 characters." };
        return { question: "Write a question of at most 300 characters." };
      default:
        return null;
    }
  }

  /** Field messages, with the empty or repeated option inputs marked. */
  function showErrors(errors) {
    showFieldErrors(form, errors);
    const bad = badOptions();
    const marked = new Set(errors.options ? [...bad.empty, ...bad.repeated] : []);
    for (const input of list.querySelectorAll("input")) {
      if (marked.has(input)) {
        input.setAttribute("aria-invalid", "true");
        input.setAttribute("aria-describedby", "poll-options-error");
      } else {
        input.removeAttribute("aria-invalid");
        input.removeAttribute("aria-describedby");
      }
    }
  }

  const recheck = () => {
    if (form.querySelector('[aria-invalid="true"]')) showErrors(validate());
  };
  form.addEventListener("input", recheck);
  form.addEventListener("change", recheck);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = form.elements;
    const question = f.question.value.trim();
    const options = [...list.querySelectorAll("input")].map((input) => input.value.trim());
    const opens = new Date(f.opens_at.value);
    const closes = new Date(f.closes_at.value);
    const errors = { ...validate(), ...(ballot ? ballot.check() : {}) };
    showErrors(errors);
    if (Object.keys(errors).length) {
      say(createMessage, "Check the fields marked above.", false);
      focusFirstError(form);
      return;
    }
    setText(createMessage, "");
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    const res = await api("POST", "/api/admin/polls", {
      question,
      options,
      // datetime-local is local wall time; the API takes UTC instants.
      opens_at: opens.toISOString(),
      closes_at: closes.toISOString(),
      results: f.results.value,
      ...(ballot ? ballot.values() : {}),
    });
    button.disabled = false;
    if (res.status === 201) {
      say(createMessage, `Created poll “${res.data.question}” (#${res.data.id}).`, true);
      f.question.value = "";
      f.results.value = "live";
      ballot?.reset();
      resetOptions();
      defaultWindow();
      await refresh();
      const row = rowOf(res.data.id);
      if (row) flash(row);
    } else if (refusalOf(res)) {
      showErrors(refusalOf(res));
      focusFirstError(form);
      say(createMessage, "Check the fields marked above.", false);
    } else {
      say(createMessage, messageOf(res, "Could not create the poll."), false);
    }
  });

  rows.addEventListener("click", async (event) => {
    const button = event.target.closest('button[data-action="close-poll"]');
    if (!button) return;
    const row = button.closest("tr");
    const id = row.dataset.pollId;
    const question = field(row, "question").textContent;
    if (!confirm(`Close the poll “${question}”? Voting stops for everyone.`)) return;
    button.disabled = true;
    const res = await api("POST", `/api/admin/polls/${encodeURIComponent(id)}/close`);
    if (res.ok) {
      field(row, "question").focus({ preventScroll: true });
      fillRow(row, res.data);
      flash(row);
      say(adminMessage, `Poll “${question}” is closed.`, true);
    } else {
      button.disabled = false;
      say(adminMessage, `“${question}”: ${messageOf(res, "closing failed.")}`, false);
    }
  });

  renumber();
  defaultWindow();
  pollWhileVisible(refresh, ADMIN_POLL_MS);
}
