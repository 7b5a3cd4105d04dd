// An admin's poll tallies.

import { api, messageOf } from "./api.js";
import { field, setBadge, setText } from "./dom.js";
import { ballotFields, ballotRefusal } from "./ballot-form.js";
import { focusFirstError, say, showFieldErrors } from "./forms.js";
import { ADMIN_POLL_MS, pollWhileVisible } from "./live.js";
import { retireButtons } from "./retire.js";
import { toLocalInput } from "./time.js";
import { shares } from "./numbers.js";

/**
 * Live and settled tallies follow the poll without a reload: the page asks the
 * admin API (`GET /api/admin/polls/{id}`, which also reads Postgres's settled
 * counts, so it is not an event stream) every few seconds while visible.
 */
export function adminPollPage() {
  const root = document.getElementById("admin-poll");
  if (!root) return;
  const pollId = root.dataset.pollId;
  const rows = [...root.querySelectorAll("tr[data-option-id]")];

  function apply(view) {
    const results = view && view.results;
    if (!results || !Array.isArray(results.tallies) || !Array.isArray(view.settled)) return;
    const count = (list) => new Map(list.map((t) => [String(t.option_id), Math.max(0, Number(t.votes) || 0)]));
    const live = count(results.tallies);
    const settled = count(view.settled);
    const counted = [...live.values()].reduce((a, b) => a + b, 0);
    const voters = Math.max(0, Number(results.voters) || 0);
    // As the server's `option_results`: shares of the larger of voters and votes.
    const total = Math.max(voters, counted);
    const percents = shares([...rows].map((row) => live.get(row.dataset.optionId) || 0), total);
    for (const [k, row] of [...rows].entries()) {
      const id = row.dataset.optionId;
      const n = live.get(id) || 0;
      const done = settled.get(id) || 0;
      setText(field(row, "live"), n);
      setText(field(row, "percent"), `${percents[k]}%`);
      setText(field(row, "settled"), done);
      setText(field(row, "unsettled"), Math.max(0, n - done));
    }
    setText(field(root, "live-voters"), voters);
    if (Number.isFinite(view.settled_voters)) setText(field(root, "settled-voters"), view.settled_voters);
    if (typeof view.status === "string") setBadge(field(root, "badge"), view.status);
  }

  async function refresh() {
    const res = await api("GET", `/api/admin/polls/${encodeURIComponent(pollId)}`);
    if (res.ok) apply(res.data);
  }

  pollWhileVisible(refresh, ADMIN_POLL_MS);
  const base = `/api/admin/polls/${encodeURIComponent(pollId)}`;
  const title = root.querySelector("h1");
  retireButtons(root, base, "poll", () => title.textContent, "/admin#polls-heading");
  revealButton(root, base);
  editForm(base);
}

/** The reveal of an `on_reveal` poll's results, offered once it is closed. */
function revealButton(root, base) {
  const button = root.querySelector('[data-action="reveal"]');
  if (!button) return;
  const message = field(root, "reveal-message");
  button.addEventListener("click", async () => {
    if (!confirm("Reveal the results to everyone? This cannot be undone.")) return;
    button.disabled = true;
    const res = await api("POST", `${base}/reveal`);
    if (res.ok) {
      button.hidden = true;
      say(message, "Revealed: everyone now sees the results.", true);
      setTimeout(() => location.reload(), 600);
    } else {
      button.disabled = false;
      say(message, messageOf(res, "Could not reveal the results."), false);
    }
  });
}

/** The edit form of a poll not open yet: only what changed is sent. */
function editForm(base) {
  const form = document.querySelector('form[data-form="edit-poll"]');
  if (!form) return;
  const message = field(document, "edit-message");
  const f = form.elements;
  for (const name of ["opens_at", "closes_at"]) {
    const at = new Date(f[name].dataset.iso);
    if (!Number.isNaN(at.getTime())) f[name].value = toLocalInput(at);
  }
  const initial = {
    question: f.question.value,
    options: f.options.value,
    opens_at: f.opens_at.value,
    closes_at: f.closes_at.value,
    results: f.results.value,
  };
  const ballot = ballotFields(form);
  // The ballot settings go together: any change sends the kind and its fields.
  const initialBallot = JSON.stringify(ballot.values());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const changed = {};
    const errors = {};
    if (f.question.value !== initial.question) changed.question = f.question.value.trim();
    if (f.options.value !== initial.options) {
      changed.options = f.options.value.split("\n").map((o) => o.trim()).filter(Boolean);
    }
    for (const name of ["opens_at", "closes_at"]) {
      if (f[name].value === initial[name]) continue;
      const at = new Date(f[name].value);
      if (Number.isNaN(at.getTime())) errors[name] = "Pick a date and time.";
      else changed[name] = at.toISOString();
    }
    if (f.results.value !== initial.results) changed.results = f.results.value;
    Object.assign(errors, ballot.check());
    if (JSON.stringify(ballot.values()) !== initialBallot) Object.assign(changed, ballot.values());
    if (changed.question === "") errors.question = "Ask a question.";
    showFieldErrors(form, errors);
    if (Object.keys(errors).length) {
      say(message, "Check the fields marked above.", false);
      focusFirstError(form);
      return;
    }
    if (!Object.keys(changed).length) {
      say(message, "Nothing changed.", true);
      return;
    }
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    const res = await api("PATCH", base, changed);
    button.disabled = false;
    if (res.ok) {
      say(message, "Saved.", true);
      setTimeout(() => location.reload(), 400);
      return;
    }
    if (res.data.error === "invalid_ballot_settings") {
      showFieldErrors(form, ballotRefusal(res.data.message));
      focusFirstError(form);
      say(message, "Check the fields marked above.", false);
      return;
    }
    const where = {
      invalid_options: "options",
      invalid_text: "question",
      invalid_window: "closes_at",
    }[res.data.error];
    if (where) {
      showFieldErrors(form, { [where]: messageOf(res, "Check this field.") });
      focusFirstError(form);
    }
    say(message, messageOf(res, "Could not save the changes."), false);
  });
}
