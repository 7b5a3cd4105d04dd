// An admin's poll tallies.

import { api } from "./api.js";
import { field, setBadge, setText } from "./dom.js";
import { ADMIN_POLL_MS, pollWhileVisible } from "./live.js";

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
    for (const row of rows) {
      const id = row.dataset.optionId;
      const n = live.get(id) || 0;
      const done = settled.get(id) || 0;
      setText(field(row, "live"), n);
      setText(field(row, "percent"), `${total > 0 ? Math.round((n * 100) / total) : 0}%`);
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
}
