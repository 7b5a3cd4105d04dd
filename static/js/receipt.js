// The poll page's account of the voter's own ballot (what counts, each
// receipt, recorded or being recorded) and of a ranked poll's count by rounds.

import { field, setText } from "./dom.js";

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (className) e.className = className;
  return e;
}

/** What counts now, in words, from my-ballot (or a 202). */
export function countsWords(kind, mine, labels) {
  const name = (id) => labels.get(String(id)) || `Option ${id}`;
  if (kind === "budget") {
    const votes = (mine.votes || []).filter((v) => v.count > 0);
    const given = votes.map((v) => `${name(v.option_id)}: ${v.count}`).join(", ");
    const left = Number.isFinite(Number(mine.remaining)) ? ` ${mine.remaining} left.` : "";
    return votes.length ? `Your votes: ${given}.${left}` : `No votes given yet.${left}`;
  }
  const choices = mine.choices || [];
  if (!choices.length) return "";
  if (kind === "ranked") return `Your ranking: ${choices.map((id, i) => `${i + 1}. ${name(id)}`).join(", ")}.`;
  if (kind === "multi") return `Your choices: ${choices.map(name).join(", ")}.`;
  return `Your vote: ${name(choices[0])}.`;
}

/**
 * Fills the receipt box: what counts, then each receipt (newest first) with
 * "recorded" or "being recorded", and "replaced" for a ballot a later one
 * replaced.
 */
export function showReceipts(box, kind, mine, labels) {
  setText(field(box, "counts"), countsWords(kind, mine, labels));
  const list = field(box, "receipts");
  const items = [...(mine.receipts || [])].reverse().map((r) => {
    const li = el("li");
    li.dataset.receipt = r.receipt;
    li.append(el("span", "Receipt ", "muted small"), el("code", r.receipt), document.createTextNode(" "));
    const words = r.replaced ? "replaced by a later vote" : r.settled ? "recorded" : "being recorded";
    const state = r.replaced ? "is-replaced" : r.settled ? "is-settled" : "is-pending";
    li.append(el("span", words, `receipt-state ${state}`));
    return li;
  });
  list.replaceChildren(...items);
  box.hidden = items.length === 0;
}

/**
 * A ranked poll's count, round by round, from `runoff` of the results (absent:
 * the box stays hidden). Each round: the tallies, high first, the options
 * eliminated, ballots with no choice left; then the winner.
 */
export function showRunoff(box, runoff, labels) {
  if (!runoff || !Array.isArray(runoff.rounds)) {
    box.hidden = true;
    return;
  }
  const name = (id) => labels.get(String(id)) || `Option ${id}`;
  const rounds = runoff.rounds.map((round) => {
    const wrap = el("div", undefined, "runoff-round");
    const table = el("table", undefined, "table runoff-table");
    table.append(el("caption", `Round ${round.round}`));
    const head = el("tr");
    const th1 = el("th", "Option");
    const th2 = el("th", "Votes", "num");
    th1.scope = "col";
    th2.scope = "col";
    head.append(th1, th2);
    table.append(el("thead"));
    table.tHead.append(head);
    const body = el("tbody");
    const out = new Set((round.eliminated || []).map(String));
    const tallies = [...(round.tallies || [])].sort((a, b) => b.votes - a.votes);
    for (const t of tallies) {
      const tr = el("tr");
      tr.dataset.optionId = String(t.option_id);
      const out_ = out.has(String(t.option_id));
      tr.append(el("td", name(t.option_id) + (out_ ? " (eliminated)" : "")), el("td", String(t.votes), "num"));
      if (out_) tr.className = "is-out";
      body.append(tr);
    }
    table.append(body);
    wrap.append(table);
    const notes = [];
    if (round.eliminated?.length) notes.push(`Eliminated: ${round.eliminated.map(name).join(", ")}.`);
    if (round.exhausted > 0) notes.push(`${round.exhausted} ${round.exhausted === 1 ? "ballot has" : "ballots have"} no choice left.`);
    if (notes.length) wrap.append(el("p", notes.join(" "), "muted small"));
    return wrap;
  });
  field(box, "runoff-rounds").replaceChildren(...rounds);
  const n = runoff.rounds.length;
  setText(
    field(box, "runoff-winner"),
    runoff.winner
      ? `Winner: ${name(runoff.winner)}, after ${n === 1 ? "1 round" : `${n} rounds`} of counting ${runoff.ballots} ${runoff.ballots === 1 ? "ballot" : "ballots"}.`
      : `No winner: ${runoff.ballots} ${runoff.ballots === 1 ? "ballot" : "ballots"} counted.`,
  );
  setText(field(box, "runoff-rule"), runoff.tie_rule ? `Ties: ${runoff.tie_rule}` : "");
  box.hidden = false;
}
