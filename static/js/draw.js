// The sale page of a draw sale (issue 52): enter while entries are open, then the
// result of the draw. The page asks the shop where its entry stands
// (`GET .../entry/me`) once at load, once at the draw (spread over a second, then
// every RESULT_EVERY_MS until the draw is out), every WAITLIST_EVERY_MS while on
// the waiting list (a passed win may reach it), and when a win's time to buy runs
// out. A winner's standing carries the purchase ticket: Buy uses it.

import { api, messageOf, retryDelayMs } from "./api.js";
import { field, setText } from "./dom.js";
import { groupDigits } from "./numbers.js";
import { sharedAnswer } from "./refusals.js";
import { returnedWords } from "./returned.js";
import { clockTime, formatDuration, localTime } from "./time.js";
import { checkingWords, postWithProof } from "./pow.js";

const MY_ORDERS = { href: "/me/orders", text: "See my orders" };
// Not everyone asks in the same millisecond at the draw.
const DRAW_SPREAD_MS = 1000;
// While the draw is being made (or a read failed): asked again this often.
const RESULT_EVERY_MS = 2000;
// On the waiting list: asked again this often.
const WAITLIST_EVERY_MS = 5000;

/**
 * The draw of the sale page `root`, with the same face as the waiting room
 * (queue.js): `sale` is the page's state, `now` the server's clock, `show` the
 * page's answer box, `changed` re-renders the page.
 */
export function drawEntry({ root, saleId, sale, now, show, clear, changed, signinUrl }) {
  const d = root.dataset;
  const el = {
    standing: field(root, "draw-standing"),
    status: field(root, "draw-status"),
    detail: field(root, "draw-detail"),
    expiry: field(root, "draw-expiry"),
    expiryTime: field(root, "draw-expiry-time"),
    link: field(root, "draw-link"),
    enter: root.querySelector('[data-action="enter"]'),
  };
  const opensAt = Number(d.entriesOpenAt) || 0;
  const e = {
    // Failed asks in a row (each waits longer: retryDelayMs).
    failures: 0,
    // null: not known yet; "none": no entry; else the standing's state.
    state: sale.bought ? "bought" : null,
    position: null,
    ticket: null,
    claimUntil: 0, // server clock
    asking: false,
    entering: false,
    nextAsk: 0, // Date.now() of the next planned ask, 0: none
  };

  /** "6:00 PM" today (the visitor's day), else "Dec 3, 6:00 PM GMT+1". */
  function when(ms) {
    const at = new Date(ms);
    return at.toDateString() === new Date(now()).toDateString() ? clockTime(at) : localTime(at);
  }
  const entriesOpen = () => now() >= opensAt;
  const drawn = () => now() >= sale.startsAt;

  function apply(me) {
    if (!me || typeof me.state !== "string") return;
    e.state = me.state;
    e.position = Number.isFinite(me.position) ? me.position : null;
    e.ticket = typeof me.ticket === "string" ? me.ticket : null;
    const until = Date.parse(me.claim_until);
    e.claimUntil = Number.isNaN(until) ? 0 : until;
    if (me.state === "bought") sale.bought = true;
  }

  /** Plans the next ask `ms` from now (the earliest plan wins). */
  function askIn(ms) {
    const at = Date.now() + ms;
    if (e.nextAsk === 0 || at < e.nextAsk) e.nextAsk = at;
  }

  /** Where this shopper's entry stands, from the shop. */
  async function ask() {
    e.nextAsk = 0;
    if (e.asking || !sale.signedIn) return;
    e.asking = true;
    const res = await api("GET", `/api/sales/${saleId}/entry/me`);
    e.asking = false;
    e.failures = res.ok ? 0 : e.failures + 1;
    if (res.ok) apply(res.data);
    else if (res.status === 404) e.state = "none";
    else if (res.status === 401) sale.signedIn = false;
    else askIn(retryDelayMs(res, e.failures, RESULT_EVERY_MS));
    changed();
  }

  async function enter() {
    if (e.entering) return;
    e.entering = true;
    changed();
    // A sale that asks for a proof of work: solved first, in a worker.
    const res = await postWithProof("sales", saleId, `/api/sales/${saleId}/entry`, d.proofOfWork, (share) =>
      show("info", ...checkingWords(share)),
    );
    e.entering = false;
    const code = res.data.error;
    if (res.ok) {
      apply(res.data);
      clear();
    } else if (res.status === 409 && code === "entries_not_open") {
      show("info", "Entries are not open yet.", messageOf(res, ""));
    } else if (res.status === 410) {
      e.state = "none";
      show("info", "Entries are closed.", "The draw has been made or is being made now.");
    } else if (res.status === 403 && code === "account_too_new") {
      show("warning", "Your account is too new for this draw.", messageOf(res, ""));
    } else {
      show(...sharedAnswer(res, sale, { act: "enter the draw", thing: "sale", signinUrl }));
    }
    changed();
    // The button is gone once entered: the focus goes to where the page says so.
    if (el.enter.hidden) (res.ok ? el.standing : field(root, "outcome")).focus({ preventScroll: true });
  }

  /** A live sale whose draw finished (the view's draw_finished_at): its units left. */
  const OVER = "No more wins will be given: the units left are not for sale.";

  /** What the panel says: [status, detail, detail link]. */
  function words(status) {
    const results = when(sale.startsAt);
    if (!sale.signedIn) {
      if (!drawn()) return ["Enter the draw for a chance to buy.", `Sign in and enter before ${results}, your local time; the winners are drawn then.`, null];
      if (status === "draw_over") return ["The draw is over.", OVER, null];
      return ["The draw has been made.", "Only its winners may buy.", null];
    }
    // An order returned: the win bought once.
    if (sale.returned) return [...returnedWords(sale.returned, sale.mayRebuy, Number(root.dataset.maxPerUser) || 1, "draw"), MY_ORDERS];
    if (e.state === "bought" || sale.bought) return ["You won the draw and bought this.", "Your order is on My orders.", MY_ORDERS];
    switch (e.state) {
      case null:
        return ["Checking your entry…", "", null];
      case "none":
        if (!entriesOpen()) {
          return [
            `Entries open at ${localTime(new Date(opensAt))}, your local time.`,
            `In ${formatDuration(opensAt - now())}. The winners are drawn at ${results}: entering early or late makes no difference.`,
            null,
          ];
        }
        if (!drawn()) {
          return ["Entries are open.", `Enter before ${results}, your local time: the winners are drawn at random then, whenever you entered.`, null];
        }
        return ["Entries are closed.", "You did not enter this draw.", null];
      case "entered":
        if (drawn()) return ["The draw is being made…", "Keep this page open: your result shows here.", null];
        return [`You're in the draw. Results at ${results}, your local time.`, "Keep this page open, or come back then: your result shows here.", null];
      case "won":
        if (now() >= e.claimUntil) return ["Your time to buy is up…", "", null];
        return [`You won! Buy before ${when(e.claimUntil)}.`, "A unit is held for you until then; after that it goes to the next on the list.", null];
      case "claim_passed":
        return ["Your time to buy passed.", "You won but did not buy in time; your win passed to the next on the list, if any was left.", null];
      case "waitlisted":
        return [
          e.position ? `You're number ${groupDigits(e.position)} on the waiting list.` : "You're on the waiting list.",
          "You were not drawn this time. If a winner does not buy in time, the next on the list wins. Keep this page open.",
          null,
        ];
      case "not_drawn":
        return ["You were not drawn this time.", status === "draw_over" ? OVER : "Every unit has gone to the draw's winners.", null];
      default:
        return ["", "", null];
    }
  }

  function render(status) {
    // Planned asks: the draw's result, a waiting list's moves, a win run out.
    if (e.state === "entered" && drawn() && e.nextAsk === 0 && !e.asking) askIn(RESULT_EVERY_MS);
    if (e.state === "waitlisted" && e.nextAsk === 0 && !e.asking) askIn(WAITLIST_EVERY_MS);
    if (e.state === "won" && now() >= e.claimUntil && e.nextAsk === 0 && !e.asking) askIn(RESULT_EVERY_MS);
    if (e.nextAsk !== 0 && Date.now() >= e.nextAsk && !document.hidden) ask();
    const [title, detail, link] = words(status);
    setText(el.status, title);
    showDetail(detail, link);
    const canEnter = sale.signedIn && e.state === "none" && entriesOpen() && !drawn();
    el.enter.hidden = !canEnter;
    el.enter.disabled = e.entering;
    setText(el.enter, e.entering ? "Entering…" : "Enter the draw");
    const winning = canBuy();
    el.expiry.hidden = !winning;
    if (winning) setText(el.expiryTime, formatDuration(e.claimUntil - now()));
    el.link.hidden = !drawn();
  }

  function showDetail(text, link) {
    const want = `${text}|${link ? link.href : ""}`;
    el.detail.hidden = !text;
    if (el.detail.dataset.shown === want) return;
    el.detail.dataset.shown = want;
    el.detail.replaceChildren(document.createTextNode(text + (link ? " " : "")));
    if (link) {
      const a = document.createElement("a");
      a.href = link.href;
      a.textContent = link.text;
      el.detail.append(a);
    }
  }

  /** A running win: the page offers Buy. */
  function canBuy() {
    return e.state === "won" && e.ticket !== null && now() < e.claimUntil;
  }

  el.enter.addEventListener("click", enter);
  if (sale.signedIn && !sale.bought) {
    if (entriesOpen()) ask();
    else e.state = "none";
  }
  // At the draw, an entrant asks for the result (spread, so not all at once).
  const untilDraw = sale.startsAt - now();
  if (untilDraw > 0) {
    setTimeout(() => {
      if (e.state === "entered") askIn(Math.random() * DRAW_SPREAD_MS);
    }, untilDraw);
  }

  return {
    onView() {},
    render,
    canBuy,
    /** The win's ticket, while it runs. */
    ticket: () => (canBuy() ? e.ticket : null),
    bought() {
      e.state = "bought";
      e.ticket = null;
    },
    /** After a purchase that was refused: where do we stand now? */
    recheck: ask,
  };
}
