// The poll page's ballot controls, one kind each: radios (single), checkboxes
// with a counter (multi), a stepper per option (budget) and tap-to-rank with
// up/down buttons (ranked). Each kind answers the same questions for poll.js:
// enable, what to send, and what the voter's ballot is now.

import { field, setText } from "./dom.js";

/** The options' labels by id, from the results list (text, never HTML). */
export function optionLabels(root) {
  const labels = new Map();
  for (const row of root.querySelectorAll(".results [data-option-id]")) {
    const label = row.querySelector(".result-label");
    labels.set(String(row.dataset.optionId), (label?.firstChild?.textContent || "").trim());
  }
  return labels;
}

function plural(n, one, many) {
  return n === 1 ? `${n} ${one}` : `${n} ${many}`;
}

/** Radios: one option. */
function single(form) {
  const radios = [...form.querySelectorAll('input[name="option"]')];
  return {
    enable(on) {
      for (const r of radios) r.disabled = !on;
    },
    bodies() {
      const picked = radios.find((r) => r.checked);
      if (!picked) return { error: "Pick an option first." };
      return { bodies: [{ option_id: Number(picked.value) }] };
    },
    show(choices) {
      for (const r of radios) r.checked = choices.includes(Number(r.value));
    },
    render() {},
  };
}

/** Checkboxes: 1 to `max` options, a live counter, the rest disabled at the max. */
function multi(form, d) {
  const boxes = [...form.querySelectorAll('input[name="option"]')];
  const max = Number(d.maxChoices) || boxes.length;
  const counter = field(form, "counter");
  let enabled = false;
  const chosen = () => boxes.filter((b) => b.checked).length;
  const api = {
    enable(on) {
      enabled = on;
      api.render();
    },
    bodies() {
      const ids = boxes.filter((b) => b.checked).map((b) => Number(b.value));
      if (!ids.length) return { error: "Pick at least one option first." };
      return { bodies: [{ option_ids: ids }] };
    },
    show(choices) {
      for (const b of boxes) b.checked = choices.includes(Number(b.value));
      api.render();
    },
    render() {
      const n = chosen();
      for (const b of boxes) b.disabled = !enabled || (!b.checked && n >= max);
      setText(counter, `${n} of ${max} chosen${n >= max && max < boxes.length ? ": that is the most" : ""}`);
    },
  };
  for (const b of boxes) b.addEventListener("change", api.render);
  return api;
}

/**
 * A stepper per option: how many votes to give each now. A voter spends over
 * several visits; `remaining` and each option's `given` come from the server.
 */
function budget(form, d) {
  const rows = [...form.querySelectorAll(".stepper-row")];
  const budgetTotal = Number(d.votesPerUser) || 0;
  const cap = Number(d.maxPerOption) || budgetTotal;
  const counter = field(form, "counter");
  const state = { remaining: Number(counter.dataset.remaining) || 0, enabled: false };
  const input = (row) => row.querySelector("input");
  const given = (row) => Number(row.dataset.given) || 0;
  const pending = () => rows.reduce((a, r) => a + (Number(input(r).value) || 0), 0);
  /** Most this row may take now: its cap, and what the others leave. */
  const most = (row) => {
    const others = pending() - (Number(input(row).value) || 0);
    return Math.max(0, Math.min(cap - given(row), state.remaining - others));
  };
  const clamp = (row) => {
    const el = input(row);
    const n = Math.floor(Number(el.value)) || 0;
    el.value = String(Math.max(0, Math.min(n, most(row))));
  };
  const api = {
    get remaining() {
      return state.remaining;
    },
    enable(on) {
      state.enabled = on;
      api.render();
    },
    bodies() {
      const bodies = rows
        .map((r) => ({ option_id: Number(r.dataset.optionId), count: Number(input(r).value) || 0 }))
        .filter((b) => b.count > 0);
      if (!bodies.length) return { error: "Use + to choose how many votes to give, then press the button." };
      return { bodies };
    },
    /** After a 202: the votes given, and what is left (the answer's numbers). */
    accepted(answer) {
      const row = rows.find((r) => r.dataset.optionId === String(answer.option_id));
      if (row) {
        row.dataset.given = String(given(row) + (Number(answer.count) || 0));
        input(row).value = "0";
      }
      if (Number.isFinite(Number(answer.remaining))) state.remaining = Number(answer.remaining);
      api.render();
    },
    /** A refusal's numbers (`budget_spent`, `over_budget`). */
    refused(data) {
      if (Number.isFinite(Number(data.remaining))) state.remaining = Number(data.remaining);
      api.render();
    },
    /** The votes given per option as this page knows them (`{option_id, count}`). */
    votes() {
      return rows.map((r) => ({ option_id: Number(r.dataset.optionId), count: given(r) }));
    },
    /** The voter's votes per option, from my-ballot. */
    showVotes(votes, remaining) {
      const by = new Map((votes || []).map((v) => [String(v.option_id), Number(v.count) || 0]));
      for (const r of rows) r.dataset.given = String(by.get(r.dataset.optionId) || 0);
      if (Number.isFinite(Number(remaining))) state.remaining = Number(remaining);
      api.render();
    },
    render() {
      for (const r of rows) {
        clamp(r);
        const n = Number(input(r).value) || 0;
        const on = state.enabled && state.remaining > 0;
        input(r).disabled = !on;
        input(r).max = String(Math.max(0, cap - given(r)));
        r.querySelector('[data-action="less"]').disabled = !on || n <= 0;
        r.querySelector('[data-action="more"]').disabled = !on || n >= most(r);
        const g = given(r);
        const full = g >= cap;
        setText(field(r, "given"), g > 0 ? `${g} given${full ? " (the most)" : ""}` : "");
      }
      const now = pending();
      setText(
        counter,
        `${state.remaining} of ${plural(budgetTotal, "vote", "votes")} left` + (now > 0 ? ` · giving ${now} now` : ""),
      );
    },
  };
  for (const r of rows) {
    const step = (by) => () => {
      input(r).value = String((Number(input(r).value) || 0) + by);
      api.render();
    };
    r.querySelector('[data-action="less"]').addEventListener("click", step(-1));
    r.querySelector('[data-action="more"]').addEventListener("click", step(1));
    input(r).addEventListener("input", api.render);
  }
  return api;
}

/**
 * Tap-to-rank: tapping an option appends it to the ranking, tapping it again
 * takes it out; each ranked option has up, down and remove buttons, so the
 * order is keyboard operable and changeable before sending.
 */
function ranked(form, d, labels) {
  const picks = [...form.querySelectorAll(".rank-pick")];
  const list = field(form, "ranking");
  const counter = field(form, "counter");
  const max = Number(d.maxChoices) || picks.length;
  let ranking = [...list.querySelectorAll("li")].map((li) => Number(li.dataset.optionId));
  let enabled = false;

  function button(action, text, label, disabled) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "btn btn-small btn-quiet";
    b.dataset.action = action;
    b.textContent = text;
    b.setAttribute("aria-label", label);
    b.disabled = disabled;
    return b;
  }

  function move(id, by, focusAction) {
    const i = ranking.indexOf(id);
    const j = i + by;
    if (i < 0 || j < 0 || j >= ranking.length) return;
    [ranking[i], ranking[j]] = [ranking[j], ranking[i]];
    api.render();
    // Keep the keyboard where it was: on the moved option's button, or its other one at an end.
    const li = list.querySelector(`li[data-option-id="${id}"]`);
    const target = li.querySelector(`[data-action="${focusAction}"]:not(:disabled)`) || li.querySelector("button:not(:disabled)");
    target?.focus();
  }

  function toggle(id) {
    if (!enabled) return;
    const i = ranking.indexOf(id);
    if (i >= 0) ranking.splice(i, 1);
    else if (ranking.length < max) ranking.push(id);
    api.render();
  }

  const api = {
    enable(on) {
      enabled = on;
      api.render();
    },
    bodies() {
      if (!ranking.length) return { error: "Tap at least one option to rank it first." };
      return { bodies: [{ ranking: [...ranking] }] };
    },
    show(choices) {
      ranking = choices.map(Number);
      api.render();
    },
    render() {
      for (const p of picks) {
        const id = Number(p.dataset.optionId);
        const place = ranking.indexOf(id) + 1;
        p.setAttribute("aria-pressed", String(place > 0));
        p.disabled = !enabled || (place === 0 && ranking.length >= max);
        setText(field(p, "place"), place > 0 ? String(place) : "");
        // The name begins with the visible label (axe: label-content-name-mismatch).
        setText(field(p, "place-words"), place > 0 ? `, ranked ${place}` : "");
      }
      const items = ranking.map((id, i) => {
        const li = document.createElement("li");
        li.dataset.optionId = String(id);
        const name = labels.get(String(id)) || `Option ${id}`;
        const label = document.createElement("span");
        label.className = "ranking-label";
        label.textContent = name;
        const tools = document.createElement("span");
        tools.className = "ranking-tools";
        tools.append(
          button("up", "↑", `Move ${name} up`, !enabled || i === 0),
          button("down", "↓", `Move ${name} down`, !enabled || i === ranking.length - 1),
          button("remove", "✕", `Take ${name} out`, !enabled),
        );
        li.append(label, tools);
        return li;
      });
      list.replaceChildren(...items);
      const n = ranking.length;
      setText(
        counter,
        n === 0 ? `None ranked yet (up to ${max})` : `${n} of ${max} ranked${n >= max && max < picks.length ? ": that is the most" : ""}`,
      );
    },
  };
  for (const p of picks) p.addEventListener("click", () => toggle(Number(p.dataset.optionId)));
  list.addEventListener("click", (event) => {
    const b = event.target.closest("button[data-action]");
    if (!b || b.disabled) return;
    const id = Number(b.closest("li").dataset.optionId);
    if (b.dataset.action === "up") move(id, -1, "up");
    else if (b.dataset.action === "down") move(id, 1, "down");
    else {
      toggle(id);
      picks.find((p) => p.dataset.optionId === String(id))?.focus();
    }
  });
  return api;
}

/** The controls of this poll's kind (`data-ballot`). */
export function ballotControls(form, d, labels) {
  switch (d.ballot) {
    case "multi":
      return multi(form, d);
    case "budget":
      return budget(form, d);
    case "ranked":
      return ranked(form, d, labels);
    default:
      return single(form);
  }
}
