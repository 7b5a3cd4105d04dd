// The poll page: live results, and the vote.

import { api, messageOf } from "./api.js";
import { field, setBadge, setText, showOutcome } from "./dom.js";
import { liveOrPoll } from "./live.js";
import { followRateLimit, presentAnswer, retryLabel, sharedAnswer } from "./refusals.js";
import { clockOffset, formatDuration } from "./time.js";

const RESULTS_POLL_MS = 2000;

/** What the page says instead of hidden tallies (as the server's `hidden_words`). */
function hiddenWords(until, closed) {
  if (until === "vote") return closed ? "Results are shown only to those who voted" : "Results after you vote";
  if (until === "close") return "Results at the end of the vote";
  return "Results when the organisers reveal them";
}

export function pollPage() {
  const root = document.getElementById("poll");
  if (!root) return;
  const d = root.dataset;
  const pollId = d.pollId;
  const offset = clockOffset(Number(d.serverNow));
  const now = () => Date.now() + offset;
  const form = root.querySelector('form[data-form="vote"]');
  const radios = [...form.querySelectorAll('input[name="option"]')];
  const el = {
    badge: field(root, "badge"),
    countdown: field(root, "countdown"),
    countdownTime: field(root, "countdown-time"),
    hint: field(root, "hint"),
    outcome: field(root, "outcome"),
    voters: field(root, "voters"),
    resultsHeading: field(root, "results-heading"),
    results: field(root, "results"),
    resultsHidden: field(root, "results-hidden"),
    vote: root.querySelector('[data-action="vote"]'),
    opensLabel: field(root, "opens-label"),
    closesLabel: field(root, "closes-label"),
    closes: field(root, "closes"),
    closedNote: field(root, "closed-note"),
  };
  const choice = Number(d.votedOption) || 0;
  const state = {
    status: d.status,
    opensAt: Number(d.opensAt),
    closesAt: Number(d.closesAt),
    signedIn: d.signedIn === "true",
    voted: choice > 0,
    choice, // the option voted for; 0 when unknown
    busy: false,
    retryUntil: 0, // client clock, after a 429
    rateLimited: false,
    // An admin closed the poll before its closing time.
    closedEarly: Boolean(el.closedNote && !el.closedNote.hidden),
    // What hidden results wait for (`vote`, `close`, `reveal`); "" once shown. A
    // page that has shown tallies never hides them again.
    hiddenUntil: d.hiddenUntil || "",
  };

  /** The server's last word, moved on by the clock. */
  function currentStatus() {
    let status = state.status;
    const t = now();
    if (status === "upcoming" && t >= state.opensAt) status = "open";
    if (status !== "closed" && t >= state.closesAt) status = "closed";
    return status;
  }

  function buttonLabel(status, waitMs) {
    if (state.busy) return "Sending your vote…";
    if (state.voted) return "Voted";
    if (waitMs > 0) return retryLabel(waitMs);
    if (status === "upcoming") return "Not open yet";
    if (status === "closed") return "Poll closed";
    return "Vote";
  }

  function render() {
    const status = currentStatus();
    setBadge(el.badge, status);
    el.countdown.hidden = status !== "upcoming";
    if (status === "upcoming") setText(el.countdownTime, formatDuration(state.opensAt - now()));
    // Signing in cannot help once the poll is closed.
    el.hint.hidden = status === "closed";
    if (state.hiddenUntil) {
      setText(el.resultsHeading, "Results");
      setText(el.resultsHidden, hiddenWords(state.hiddenUntil, status === "closed"));
    } else {
      setText(el.resultsHeading, status === "closed" ? "Final results" : "Live results");
    }
    el.resultsHidden.hidden = !state.hiddenUntil;
    el.results.hidden = Boolean(state.hiddenUntil);
    setText(el.opensLabel, status === "upcoming" ? "Opens" : "Opened");
    setText(el.closesLabel, status === "closed" ? "Closed" : "Closes");
    if (el.closedNote) el.closedNote.hidden = !state.closedEarly;
    if (el.closes) el.closes.hidden = state.closedEarly;
    const waitMs = state.retryUntil - Date.now();
    const canChoose = status === "open" && state.signedIn && !state.voted;
    for (const radio of radios) radio.disabled = !canChoose || state.busy;
    el.vote.disabled = !canChoose || state.busy || waitMs > 0;
    setText(el.vote, buttonLabel(status, waitMs));
    followRateLimit(state, waitMs, el.outcome, show);
  }

  function show(kind, title, detail, link) {
    showOutcome(el.outcome, kind, title, detail, link);
  }

  function markMine() {
    for (const row of el.results.children) {
      const mine = state.choice > 0 && row.dataset.optionId === String(state.choice);
      row.classList.toggle("is-mine", mine);
      field(row, "mine").hidden = !mine;
    }
  }

  function showVoters(n) {
    const voters = Math.max(0, Number(n) || 0);
    setText(el.voters, voters === 1 ? "1 voter" : `${voters} voters`);
    return voters;
  }

  /**
   * Bars, counts and percentages from `GET /api/polls/{id}/results`, or the words
   * for results this visitor may not see yet (`{hidden: true, until, voters}`).
   */
  function applyResults(results) {
    if (!results) return;
    if (results.hidden === true) {
      // Hidden again after tallies showed: a shared stream behind this visitor's
      // own view (their vote is in); keep what they saw.
      if (!state.hiddenUntil) return;
      state.hiddenUntil = String(results.until || "close");
      showVoters(results.voters);
      render();
      return;
    }
    if (!Array.isArray(results.tallies)) return;
    if (state.hiddenUntil) {
      state.hiddenUntil = "";
      render();
    }
    // Closed early by an admin: stop offering the vote without a reload.
    if (results.closed === true && (state.status !== "closed" || !state.closedEarly)) {
      state.status = "closed";
      state.closedEarly = now() < state.closesAt;
      // "The results update live" is no longer true.
      if (el.outcome.classList.contains("outcome-success")) {
        show("success", "Thanks, your vote counted.", "The poll is closed: these are the final results.");
      }
      render();
    }
    const votes = new Map(results.tallies.map((t) => [String(t.option_id), Math.max(0, Number(t.votes) || 0)]));
    const counted = [...votes.values()].reduce((a, b) => a + b, 0);
    const voters = showVoters(results.voters);
    const total = Math.max(voters, counted);
    for (const row of el.results.children) {
      const n = votes.get(row.dataset.optionId) || 0;
      setText(field(row, "votes"), n);
      setText(field(row, "percent"), `${total > 0 ? Math.round((n * 100) / total) : 0}%`);
      const bar = field(row, "bar");
      bar.max = Math.max(total, 1);
      bar.value = n;
    }
  }

  async function refreshResults() {
    const res = await api("GET", `/api/polls/${pollId}/results`);
    if (res.ok) applyResults(res.data);
  }

  async function vote(event) {
    event.preventDefault();
    if (el.vote.disabled) return;
    const picked = radios.find((r) => r.checked);
    if (!picked) {
      show("warning", "Pick an option first.");
      return;
    }
    const optionId = Number(picked.value);
    state.busy = true;
    render();
    const res = await api("POST", `/api/polls/${pollId}/votes`, { option_id: optionId });
    state.busy = false;
    const code = res.data.error;
    switch (res.status) {
      case 202:
        state.voted = true;
        state.choice = optionId;
        markMine();
        if (d.results === "after_vote") {
          // Now this voter may see the tallies: their own view, then the stream of
          // those who see them (the page's stream so far carries them to nobody).
          show("success", "Thanks, your vote counted.", "Here are the results so far; they update live.");
          refreshResults();
          follow();
        } else if (state.hiddenUntil) {
          show("success", "Thanks, your vote counted.", `${hiddenWords(state.hiddenUntil, false)}.`);
        } else {
          show("success", "Thanks, your vote counted.", "The results update live.");
          refreshResults();
        }
        break;
      case 409:
        if (code === "already_voted") {
          state.voted = true;
          show("warning", "You already voted in this poll.", "It is one vote per person.");
        } else if (code === "not_open") {
          state.status = "upcoming";
          show("warning", "This poll is not open yet.", messageOf(res, ""));
        } else {
          show("error", messageOf(res, "The vote was refused."));
        }
        break;
      case 422:
        show("error", "That option is not part of this poll.", "Reload the page to see the current options.");
        break;
      case 410:
        state.status = "closed";
        show("error", "This poll is closed.", "Votes are no longer counted.");
        break;
      default:
        show(...sharedAnswer(res, state, { act: "vote", thing: "poll", signinUrl: d.signinUrl }));
    }
    render();
    presentAnswer(el.outcome);
  }

  form.addEventListener("submit", vote);
  render();
  setInterval(render, 250);
  let stop = () => {};
  /** (Re)starts following the results: the server picks the stream for this visitor. */
  function follow() {
    stop();
    stop = liveOrPoll(`/api/polls/${pollId}/events`, applyResults, refreshResults, RESULTS_POLL_MS);
  }
  follow();
}
