// The poll page: live results, and the vote.

import { api, messageOf } from "./api.js";
import { ballotControls, optionLabels } from "./ballot.js";
import { field, setBadge, setText, showOutcome } from "./dom.js";
import { liveOrPoll } from "./live.js";
import { followRateLimit, presentAnswer, retryLabel, sharedAnswer } from "./refusals.js";
import { showReceipts, showRunoff } from "./receipt.js";
import { clockOffset, formatDuration } from "./time.js";
import { checkingWords, proofHeaders } from "./pow.js";
import { keyRing, sendKeyed, unanswered } from "./keyed.js";
import { shares } from "./numbers.js";

const RESULTS_POLL_MS = 2000;
// How far from the closing time a close reads as early (before it) or as one the
// page's clock cannot place (after it, see applyResults).
const CLOSE_MARGIN_MS = 2000;

// How long one press of a budget ballot over many options waits out the poll's
// per-voter rate limit, in all, before it stops with what went in.
const LIMIT_WAIT_MAX_S = 60;

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
  const kind = d.ballot || "single";
  const labels = optionLabels(root);
  const controls = ballotControls(form, d, labels);
  const allowChange = d.allowChange === "true";
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
    change: root.querySelector('[data-action="change"]'),
    receipt: field(root, "receipt"),
    runoff: field(root, "runoff"),
    opensLabel: field(root, "opens-label"),
    closesLabel: field(root, "closes-label"),
    closes: field(root, "closes"),
    closedNote: field(root, "closed-note"),
  };
  // The Idempotency-Keys of votes not known to be decided, by body.
  const voteKeys = keyRing();
  const choice = Number(d.votedOption) || 0;
  // The server rendered the poll closed: it said then whether early.
  const renderedClosed = d.status === "closed";
  const state = {
    status: d.status,
    opensAt: Number(d.opensAt),
    closesAt: Number(d.closesAt),
    signedIn: d.signedIn === "true",
    voted: d.voted === "true" || choice > 0,
    choice, // the option voted for (first choice); 0 when unknown
    // allow_change: the voter pressed "Change my vote" and is choosing again.
    changing: false,
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

  /** Whether this voter may send a ballot now (a budget: while votes are left). */
  function mayChoose(status) {
    if (status !== "open" || !state.signedIn) return false;
    if (kind === "budget") return controls.remaining > 0;
    return !state.voted || state.changing;
  }

  function buttonLabel(status, waitMs) {
    if (state.busy) return "Sending your vote…";
    if (kind === "budget") {
      if (waitMs > 0) return retryLabel(waitMs);
      if (status === "upcoming") return "Not open yet";
      if (status === "closed") return "Poll closed";
      return controls.remaining > 0 ? "Give these votes" : "All votes given";
    }
    if (state.changing && status === "open") return waitMs > 0 ? retryLabel(waitMs) : "Send my new vote";
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
    const canChoose = mayChoose(status);
    if (state.enabled !== (canChoose && !state.busy)) {
      state.enabled = canChoose && !state.busy;
      controls.enable(state.enabled);
    }
    el.vote.disabled = !canChoose || state.busy || waitMs > 0;
    // A closed ranked poll keeps the voter's ranking, not the controls to make one.
    const picks = field(root, "rank-picks");
    if (picks) picks.hidden = status === "closed";
    form.classList.toggle("is-closed", status === "closed");
    el.change.hidden = !(allowChange && kind !== "budget" && state.voted && !state.changing && status === "open");
    setText(el.vote, buttonLabel(status, waitMs));
    followRateLimit(state, waitMs, el.outcome, show);
  }

  function show(kind, title, detail, link) {
    showOutcome(el.outcome, kind, title, detail, link);
  }

  /**
   * Marks the voter's options in the results, each with its tag: "Your vote",
   * "Your choice", "Your #2" (ranked, in the order given), "Your 3 votes" (budget:
   * `ids` are `{option_id, count}`).
   */
  function markMine(ids) {
    const tags = new Map();
    (ids || (state.choice > 0 ? [state.choice] : [])).forEach((item, i) => {
      if (kind === "budget") {
        const n = Number(item.count);
        if (n > 0) tags.set(String(item.option_id), n === 1 ? "Your vote" : `Your ${n} votes`);
      } else if (kind === "ranked") tags.set(String(item), `Your #${i + 1}`);
      else tags.set(String(item), kind === "multi" ? "Your choice" : "Your vote");
    });
    for (const row of el.results.children) {
      const tag = tags.get(row.dataset.optionId);
      row.classList.toggle("is-mine", Boolean(tag));
      const mark = field(row, "mine");
      mark.hidden = !tag;
      if (tag) setText(mark, tag);
    }
  }

  function showVoters(n) {
    const voters = Math.max(0, Number(n) || 0);
    setText(el.voters, voters === 1 ? "1 voter" : `${voters} voters`);
    return voters;
  }

  /**
   * Whether the admin closed the poll before its closing time, from its
   * `closed_at` (none for a poll that closed on time). A record read a moment
   * before the close took effect everywhere (a cache refilled just then) says it
   * is open still: asked again a second later, a few times at most.
   */
  async function learnClosedAt(tries = 4) {
    const res = await api("GET", `/api/polls/${pollId}`);
    if (!res.ok || (res.data?.status !== "closed" && typeof res.data?.closed_at !== "string")) {
      if (tries > 1) setTimeout(() => learnClosedAt(tries - 1), 1000);
      return;
    }
    if (typeof res.data.closed_at !== "string") return;
    const early = Date.parse(res.data.closed_at) < state.closesAt;
    if (early && !state.closedEarly) {
      state.closedEarly = true;
      render();
    }
  }

  /**
   * Bars, counts and percentages from `GET /api/polls/{id}/results`, or the words
   * for results this visitor may not see yet (`{hidden: true, until, voters}`).
   */
  function applyResults(results) {
    if (!results) return;
    // Closed, early by an admin or on time (shown or hidden results both say
    // so): stop offering the vote without a reload. Once a page.
    if (results.closed === true && !state.closedSeen && (state.status !== "closed" || !state.closedEarly)) {
      state.closedSeen = true;
      state.status = "closed";
      // Early or on time, by the clock, with a margin for this page's clock
      // running behind the server's: around the closing time, on time (every page
      // open at a televote's close learns it at once: none asks anything more).
      // Long after it (a tab asleep through the close) the clock cannot tell: the
      // poll's `closed_at` says (see learnClosedAt). A page rendered closed knew
      // already.
      const t = now();
      if (t < state.closesAt - CLOSE_MARGIN_MS) state.closedEarly = true;
      else if (!renderedClosed && t > state.closesAt + CLOSE_MARGIN_MS && !state.closedAtAsked) {
        state.closedAtAsked = true;
        learnClosedAt();
      }
      // "The results update live" is no longer true.
      if (el.outcome.classList.contains("outcome-success") && results.hidden !== true) {
        show("success", "Thanks, your vote counted.", "The poll is closed: these are the final results.");
      }
      render();
    }
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
    if (results.runoff) {
      showRunoff(el.runoff, results.runoff, labels);
      // The count by rounds came (src/web/view/ballot.rs, RANKED_COUNTED_NOTE).
      const note = root.querySelector('[data-field="counts-note"]');
      if (note) note.textContent = "Counts first preferences; the count by rounds is below.";
    }
    if (state.hiddenUntil) {
      state.hiddenUntil = "";
      render();
    }
    const votes = new Map(results.tallies.map((t) => [String(t.option_id), Math.max(0, Number(t.votes) || 0)]));
    const counted = [...votes.values()].reduce((a, b) => a + b, 0);
    const voters = showVoters(results.voters);
    const total = Math.max(voters, counted);
    const rows = [...el.results.children];
    const percents = shares(rows.map((row) => votes.get(row.dataset.optionId) || 0), total);
    for (const [k, row] of rows.entries()) {
      const n = votes.get(row.dataset.optionId) || 0;
      setText(field(row, "votes"), n);
      setText(field(row, "percent"), `${percents[k]}%`);
      const bar = field(row, "bar");
      bar.max = Math.max(total, 1);
      bar.value = n;
    }
  }

  async function refreshResults() {
    const res = await api("GET", `/api/polls/${pollId}/results`);
    if (res.ok) applyResults(res.data);
  }

  /** The voter's ballot and receipts (`GET /api/polls/{id}/my-ballot`); again while some are being recorded. */
  let ballotTimer = 0;
  async function loadMyBallot(tries = 8) {
    clearTimeout(ballotTimer);
    const res = await api("GET", `/api/polls/${pollId}/my-ballot`);
    if (!res.ok) return;
    const mine = res.data;
    if (!mine.voted) return;
    state.voted = true;
    if (kind === "budget") {
      controls.showVotes(mine.votes, mine.remaining);
      markMine(mine.votes || []);
    } else if (!state.changing) {
      controls.show(mine.choices || []);
      state.choice = (mine.choices || [])[0] || 0;
      markMine(mine.choices || []);
    }
    showReceipts(el.receipt, kind, mine, labels);
    if (!mine.settled && tries > 0) ballotTimer = setTimeout(() => loadMyBallot(tries - 1), 1500);
    render();
  }

  /** Words after a 202, by kind and by whether it replaced a ballot. */
  function thanks(answer) {
    if (kind === "budget") {
      const left = Number(answer.remaining) || 0;
      return left > 0
        ? `Thanks, your votes counted. You have ${left} left to give.`
        : "Thanks, your votes counted. You have given them all.";
    }
    return answer.replaced ? "Your vote was changed." : "Thanks, your vote counted.";
  }

  /** After every 202 of this send: the results, as the poll's setting allows. */
  function afterAccepted(title) {
    if (d.results === "after_vote") {
      // Now this voter may see the tallies: their own view, then the stream of
      // those who see them (the page's stream so far carries them to nobody).
      show("success", title, "Here are the results so far; they update live.");
      refreshResults();
      follow();
    } else if (state.hiddenUntil) {
      show("success", title, `${hiddenWords(state.hiddenUntil, false)}.`);
    } else {
      show("success", title, "The results update live.");
      refreshResults();
    }
  }

  /** A refusal in plain words; returns false. */
  function refused(res) {
    const code = res.data.error;
    if (unanswered(res)) {
      // Retried for a minute with no answer: it may have counted.
      show(
        "error",
        "We could not confirm your vote.",
        "It may have counted: your ballot below shows what did. Sending the same again never counts it twice.",
      );
      if (state.signedIn) loadMyBallot();
      return false;
    }
    switch (res.status) {
      case 409:
        if (code === "already_voted") {
          state.voted = true;
          state.changing = false;
          show("warning", "You already voted in this poll.", allowChange ? "" : "It is one ballot per person.");
        } else if (code === "budget_spent") {
          controls.refused?.(res.data);
          show("warning", "You have given all your votes.", "There are none left to give in this poll.");
        } else if (code === "not_open") {
          state.status = "upcoming";
          show("warning", "This poll is not open yet.", messageOf(res, ""));
        } else {
          show("error", messageOf(res, "The vote was refused."));
        }
        break;
      case 422:
        if (code === "over_budget") {
          controls.refused?.(res.data);
          const left = Number(res.data.remaining) || 0;
          const forOption = Number(res.data.option_remaining) || 0;
          show(
            "warning",
            "That is more votes than you have left.",
            `You have ${left} left in all, and may give this option ${forOption} more. Nothing was spent.`,
          );
        } else if (code === "invalid_ballot") {
          show("error", "This ballot does not fit this poll.", messageOf(res, "Reload the page and try again."));
        } else if (code === "unknown_option") {
          show("error", "That option is not part of this poll.", "Reload the page to see the current options.");
        } else {
          show("error", "The vote was refused.", messageOf(res, "Reload the page and try again."));
        }
        break;
      case 410:
        state.status = "closed";
        state.changing = false;
        show("error", "This poll is closed.", "Votes are no longer counted.");
        break;
      default:
        show(...sharedAnswer(res, state, { act: "vote", thing: "poll", signinUrl: d.signinUrl }));
    }
    return false;
  }

  /** One try of one vote request: with a proof of work when the poll asks for one (solved in a worker). */
  async function voteOnce(body, key) {
    let proof = { headers: {} };
    if (Number(d.proofOfWork) > 0) {
      proof = await proofHeaders("polls", pollId, (share) => show("info", ...checkingWords(share)));
      if (proof.failed) return proof.failed;
    }
    return api("POST", `/api/polls/${pollId}/votes`, body, { ...proof.headers, "Idempotency-Key": key });
  }

  async function vote(event) {
    event.preventDefault();
    if (el.vote.disabled) return;
    const wanted = controls.bodies();
    if (wanted.error) {
      show("warning", wanted.error);
      presentAnswer(el.outcome);
      return;
    }
    state.busy = true;
    render();
    // A budget voter may give several options votes at once: one request each,
    // in order, stopping at the first refusal (each request is all or nothing).
    let last = null;
    let accepted = 0;
    // A 202 given again under its key: counted once, when first sent.
    let replayed = false;
    const receipts = [];
    const total = wanted.bodies.length;
    for (const body of wanted.bodies) {
      // Each request with its Idempotency-Key, retried with it when its answer is
      // lost (a budget voter's votes never spent twice).
      const send = () =>
        sendKeyed(voteKeys, body, (key) => voteOnce(body, key), () => {
          show("info", "Still trying…", "The poll did not answer yet; your vote is being sent again, never counted twice.");
          presentAnswer(el.outcome);
        });
      let res = await send();
      // One press of a budget ballot over many options is many requests, and the
      // poll's per-voter limit (5 in 10 s by default) may refuse the later ones
      // for a few seconds: a 429 decided nothing, so the rest waits it out and goes
      // on, under the same keys, rather than dropping half of what was chosen.
      let waited = 0;
      while (res.status === 429 && total > 1 && waited < LIMIT_WAIT_MAX_S) {
        const seconds = Math.min(10, Math.max(1, parseInt(res.headers.get("Retry-After") || "1", 10) || 1));
        show(
          "info",
          `Giving your votes: ${accepted} of ${total} sent…`,
          `This poll takes a few requests a moment from each voter; the next goes in ${seconds} s. Keep this page open.`,
        );
        presentAnswer(el.outcome);
        await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
        waited += seconds;
        res = await send();
      }
      if (res.status !== 202) {
        refused(res);
        last = null;
        break;
      }
      accepted += 1;
      last = res.data;
      receipts.push({ receipt: res.data.receipt, settled: false });
      replayed = replayed || res.headers.get("Idempotent-Replayed") === "true";
      controls.accepted?.(res.data);
    }
    state.busy = false;
    if (last) {
      // The ballot that counts now: an older one's key would replay its old 202.
      if (allowChange && kind !== "budget") voteKeys.clear();
      state.voted = true;
      state.changing = false;
      state.choice = last.option_id;
      if (kind !== "budget") markMine(last.option_ids || last.ranking || [last.option_id]);
      afterAccepted(replayed ? `${thanks(last)} (An answer was lost on the way; sent again, nothing counted twice.)` : thanks(last));
      // The receipt at once, then what Postgres holds.
      const sent = last.option_ids || last.ranking || [last.option_id];
      const now = kind === "budget" ? { votes: controls.votes(), remaining: last.remaining } : { choices: sent };
      showReceipts(el.receipt, kind, { ...now, receipts: kind === "budget" ? receipts : receipts.slice(-1) }, labels);
      ballotTimer = setTimeout(() => loadMyBallot(), 800);
    } else if (accepted > 0) {
      // Some of a budget voter's requests went in before one was refused: they
      // count, so the tallies a vote opens show now (the refusal's words stay).
      state.voted = true;
      if (d.results === "after_vote") {
        refreshResults();
        follow();
      }
      loadMyBallot();
    }
    render();
    presentAnswer(el.outcome);
  }

  el.change.addEventListener("click", () => {
    state.changing = true;
    show("info", "Choose again, then send your new vote.", "Your current vote counts until the new one is in.");
    render();
    form.querySelector("input:not(:disabled), button.rank-pick:not(:disabled)")?.focus();
  });
  form.addEventListener("submit", vote);
  render();
  if (state.voted && state.signedIn) loadMyBallot();
  // A closed ranked poll's count by rounds comes with the results.
  if (kind === "ranked" && !state.hiddenUntil) refreshResults();
  setInterval(render, 250);
  let stop = () => {};
  /** (Re)starts following the results: the server picks the stream for this visitor. */
  function follow() {
    stop();
    stop = liveOrPoll(`/api/polls/${pollId}/events`, applyResults, refreshResults, RESULTS_POLL_MS);
  }
  follow();
}
