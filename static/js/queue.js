// The sale page's waiting room (issue 29): join the line, follow your place live,
// buy once admitted. The page learns its place once (`GET .../queue/me`) and then
// follows it over the sale's event stream: each event's `line.served` (places the
// admission has reached) moves "people ahead of you" on with no request. It asks
// the shop again only when its turn may have come (served reached its place), once
// at the opening (when the early joiners' order is drawn), when an admission runs
// out, and when the last unit goes. While waiting it asks again every
// ESTIMATE_EVERY_MS for a fresh estimate: a range ("about 40 s to 1 min") from
// what moves the line, and the shopper's chance when fewer units are left than
// people before them (issue 50). Let in, the shopper is called back (callback.js).

import { api, messageOf, retryDelayMs } from "./api.js";
import { returnedWords } from "./returned.js";
import { askToNotify, callBack, notifyPermission, unlockSound } from "./callback.js";
import { field, setText } from "./dom.js";
import { groupDigits } from "./numbers.js";
import { sharedAnswer } from "./refusals.js";
import { clockTime, formatDuration, localTime } from "./time.js";
import { checkingWords, postWithProof } from "./pow.js";

const MY_ORDERS = { href: "/me/orders", text: "See my orders" };
// Not everyone asks in the same millisecond at the opening.
const OPENING_SPREAD_MS = 500;
// A read that failed (503 while the sale is rebuilt, a dropped connection) is
// asked again after this long.
const RETRY_MS = 2000;
// A waiting shopper's estimate is asked again this often.
const ESTIMATE_EVERY_MS = 10000;

/** "12 s", "3 min", "1 h 05 min": a wait, roughly. */
function waitText(seconds) {
  seconds = Math.round(seconds);
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
}

/** "1 person", "1,204 people". */
function people(n) {
  return n === 1 ? "1 person" : `${groupDigits(n)} people`;
}

/** "1 unit", "29 units". */
function units(n) {
  return n === 1 ? "1 unit" : `${groupDigits(n)} units`;
}

/**
 * The wait as a range, counted down from when it was estimated: "about 40 s to
 * 1 min", "about 5 s", "1 min at the soonest"; "" when there is none.
 */
export function rangeText(est, elapsedS) {
  if (!est || !Number.isFinite(est.min)) return "";
  const min = Math.max(0, est.min - elapsedS);
  if (!Number.isFinite(est.max)) return `${waitText(Math.max(1, min))} at the soonest`;
  const max = Math.max(1, est.max - elapsedS);
  const [from, to] = [waitText(Math.max(1, min)), waitText(max)];
  return from === to ? `about ${to}` : `about ${from} to ${to}`;
}

/**
 * What the units left mean for this shopper, from the live numbers (units left,
 * shoppers let in and holding a turn, people ahead): "" when there is a unit for
 * everyone before them; else the warning, hopeful when the last estimate said
 * the recent passes make it `possible`.
 */
export function chanceText(est, { unitsLeft, open, ahead, perUser = 1 }) {
  if (!est || !Number.isFinite(unitsLeft)) return "";
  const before = ahead + (Number.isFinite(open) ? open : est.open);
  // Each before this shopper may buy up to `most` (the server's estimate says so too).
  const most = Math.max(1, Number(perUser) || 1);
  if (before * most < unitsLeft) return "";
  // Those let in hold a turn too: said apart, so the count agrees with "N ahead of you".
  const held = before - ahead;
  const who = held > 0 ? ` (${groupDigits(held)} let in${ahead > 0 ? `, ${groupDigits(ahead)} waiting` : ""})` : "";
  const each = most > 1 ? `, who may buy up to ${most} each` : "";
  const head = `${units(unitsLeft)} left for ${groupDigits(before)} ${before === 1 ? "shopper" : "shoppers"} before you${who}${each}`;
  return est.chance === "possible"
    ? `${head}: you get one only if some of them let their turn pass${most > 1 ? " or buy fewer" : ""}.`
    : `${head}: you may not get one.`;
}

/**
 * The waiting room of the sale page `root`. `sale` is the page's state (status,
 * signed in, bought, units left, opening), `now` the server's clock, `statusOf`
 * the sale's status now, `show` the page's answer box and `changed` re-renders the
 * page. Returns what the page asks of it.
 */
export function waitingRoom({ root, saleId, sale, now, show, clear, changed, signinUrl }) {
  const d = root.dataset;
  const el = {
    standing: field(root, "queue-standing"),
    status: field(root, "queue-status"),
    detail: field(root, "queue-detail"),
    expiry: field(root, "queue-expiry"),
    expiryTime: field(root, "queue-expiry-time"),
    join: root.querySelector('[data-action="join"]'),
    notify: root.querySelector('[data-action="notify"]'),
    notifyNote: field(root, "queue-notify-note"),
    chance: field(root, "queue-chance"),
    opensLabel: field(root, "queue-opens-label"),
  };
  const opensAt = Number(d.queueOpensAt) || sale.startsAt;
  const q = {
    // null: not known yet (the first answer is on its way).
    state: sale.bought ? "bought" : null,
    position: null,
    served: null,
    waiting: null,
    rate: Number(d.admitPerSecond) || 1,
    ticket: null,
    expiresAt: 0, // server clock
    asking: false,
    joining: false,
    askedAtServed: -1,
    openingAsks: 0,
    // Failed asks in a row (each waits longer: retryDelayMs).
    failures: 0,
    askedAtExpiry: false,
    lastLeft: sale.left,
    retry: 0,
    // The last estimate (waiting): range, chance, and when it was read (Date.now()).
    est: null,
    paused: false,
    joinsClosed: false,
    open: null,
    refreshedAt: 0,
    notifyAsked: false,
  };

  const lineOpen = () => now() >= opensAt;
  const drawn = () => now() >= sale.startsAt;

  function apply(me) {
    if (!me || typeof me.state !== "string") return;
    if (me.state === "admitted" && q.state === "waiting") {
      callBack({ saleName: root.querySelector('[data-field="name"]')?.textContent || document.title, seconds: Math.max(0, Math.round((Date.parse(me.expires_at) - now()) / 1000)) });
    }
    q.state = me.state;
    q.paused = me.paused === true;
    q.joinsClosed = me.joins_closed === true;
    if (Number.isFinite(me.admissions_open)) q.open = me.admissions_open;
    q.est =
      me.state === "waiting" && Number.isFinite(me.ahead)
        ? {
            at: Date.now(),
            min: me.estimated_wait_min_s,
            max: me.estimated_wait_max_s,
            chance: me.chance,
            unitsLeft: me.units_left,
            open: me.admissions_open,
          }
        : null;
    q.position = Number.isFinite(me.position) ? me.position : null;
    if (Number.isFinite(me.waiting)) q.waiting = me.waiting;
    if (Number.isFinite(me.admit_per_second) && me.admit_per_second > 0) q.rate = me.admit_per_second;
    // Places reached, as this answer implies: the events take over from here.
    if (q.position !== null && Number.isFinite(me.ahead)) {
      q.served = Math.max(q.served ?? 0, q.position - me.ahead - 1);
    }
    q.ticket = me.state === "admitted" && typeof me.ticket === "string" ? me.ticket : null;
    const expires = Date.parse(me.expires_at);
    q.expiresAt = me.state === "admitted" && !Number.isNaN(expires) ? expires : 0;
    q.askedAtExpiry = false;
    if (me.state === "bought") sale.bought = true;
  }

  /** Where this shopper stands, from the shop. */
  async function ask() {
    if (q.asking || !sale.signedIn) return;
    q.asking = true;
    const res = await api("GET", `/api/sales/${saleId}/queue/me`);
    q.asking = false;
    if (res.ok) {
      apply(res.data);
      // At the opening the order may not be drawn yet on the shop's clock: once more.
      if (q.state === "waiting" && q.position === null && drawn() && q.openingAsks < 5) {
        q.openingAsks += 1;
        setTimeout(ask, 1000);
      }
    } else if (res.status === 401) {
      sale.signedIn = false;
    } else if (res.status === 404) {
      // The sale is gone: nothing more to ask.
      show(...sharedAnswer(res, sale, { act: "join the line", thing: "sale", signinUrl }));
    } else {
      q.failures += 1;
      clearTimeout(q.retry);
      q.retry = setTimeout(ask, retryDelayMs(res, q.failures, RETRY_MS));
    }
    if (res.ok) q.failures = 0;
    changed();
  }

  async function join() {
    unlockSound();
    if (q.joining) return;
    q.joining = true;
    changed();
    // A sale that asks for a proof of work: solved first, in a worker.
    const res = await postWithProof("sales", saleId, `/api/sales/${saleId}/queue`, d.proofOfWork, (share) =>
      show("info", ...checkingWords(share)),
    );
    q.joining = false;
    const code = res.data.error;
    if (res.ok) {
      apply(res.data);
      clear();
    } else if (res.status === 409 && code === "line_closed") {
      q.joinsClosed = true;
      show("info", "The line is closed.", "The shop has closed the line to new joins.");
    } else if (res.status === 409 && code === "queue_not_open") {
      show("info", "The line is not open yet.", messageOf(res, ""));
    } else if (res.status === 410) {
      sale.status = code === "ended" ? "ended" : "sold_out";
      if (code !== "ended") sale.left = 0;
      show("error", code === "ended" ? "This sale has ended." : "Sold out.", "", null, sale.status);
    } else {
      show(...sharedAnswer(res, sale, { act: "join the line", thing: "sale", signinUrl }));
    }
    changed();
    // The button is gone once in the line: the focus goes to where the page says
    // so (or to the refusal), not to the page's top.
    if (el.join.hidden) (res.ok ? el.standing : field(root, "outcome")).focus({ preventScroll: true });
  }

  /** Each view of the sale (the event stream's, or a poll's). */
  function onView(view) {
    if (view && view.line && Number.isFinite(view.line.served)) {
      q.served = view.line.served;
      q.waiting = view.line.waiting;
      // Paused or resumed by the shop: the words change, the estimate with them.
      q.joinsClosed = view.line.joins_closed === true;
      if (Number.isFinite(view.line.open)) q.open = view.line.open;
      if (typeof view.line.paused === "boolean" && view.line.paused !== q.paused) {
        q.paused = view.line.paused;
        if (q.state === "waiting") ask();
      }
    }
    if (!sale.signedIn) return;
    if (q.state === "waiting") {
      if (q.position !== null && q.served >= q.position && q.askedAtServed !== q.served) {
        // The admission reached our place: admitted (or passed, sold out).
        q.askedAtServed = q.served;
        ask();
      } else if (q.position === null && view && view.status && view.status !== "upcoming" && q.openingAsks === 0) {
        // The opening: the order is drawn now.
        q.openingAsks = 1;
        setTimeout(ask, Math.random() * OPENING_SPREAD_MS);
      }
    }
    if (sale.left === 0 && q.lastLeft !== 0 && (q.state === "waiting" || q.state === "admitted")) ask();
    q.lastLeft = sale.left;
  }

  /** What the panel says: [status, detail, detail link]. */
  function words(status) {
    const opening = clockTime(new Date(sale.startsAt));
    if (!sale.signedIn) {
      if (status === "live" || status === "upcoming") {
        return ["Join the line to buy.", "This sale sells through a waiting room: sign in, join the line, and buy when your turn comes.", null];
      }
    }
    // An order returned: the turn bought once, the line has nothing more for them
    // (queue/me still says "bought" when the sale keeps its buyers).
    if (sale.returned) return [...returnedWords(sale.returned, sale.mayRebuy, Number(root.dataset.maxPerUser) || 1, "line"), MY_ORDERS];
    if (q.state === "bought" || sale.bought) return ["You bought from this sale.", "Your order is on My orders.", MY_ORDERS];
    if (status === "ended" || status === "closed") return ["The line is closed: this sale is over.", "", null];
    if (!sale.signedIn) return ["This sale is sold out.", "", null];
    switch (q.state) {
      case null:
        return ["Checking your place in the line…", "", null];
      case "not_joined":
        if (status === "sold_out") return ["Sold out.", "Every unit is taken.", null];
        if (q.joinsClosed) return ["The line is closed.", "The shop has closed the line to new joins.", null];
        if (!lineOpen()) {
          return [
            `The line opens at ${localTime(new Date(opensAt))}.`,
            `In ${formatDuration(opensAt - now())}. Everyone who joins before the sale opens at ${opening} gets a place drawn at random then: no need to rush.`,
            null,
          ];
        }
        if (!drawn()) {
          return ["The line is open.", `Everyone who joins before the sale opens at ${opening} gets a place drawn at random then: no need to rush.`, null];
        }
        return [
          "The line is open.",
          q.waiting ? `${people(q.waiting)} waiting. Join now and you go to the end of the line.` : "Join now: nobody is waiting.",
          null,
        ];
      case "waiting": {
        if (q.position === null) {
          return [
            "You're in the line.",
            `The order is drawn at random when the sale opens at ${opening}. Keep this page open: it follows the line by itself.`,
            null,
          ];
        }
        const ahead = Math.max(0, q.position - (q.served ?? 0) - 1);
        const letIn = Math.max(0, q.position - 1 - ahead);
        const keep = "Keep this page open: it follows the line by itself.";
        if (q.served !== null && q.served >= q.position) return ["Your turn is coming…", keep, null];
        const place = `You were number ${groupDigits(q.position)} in the line; ${groupDigits(letIn)} let in before you.`;
        if (q.paused) {
          return [
            "The line is paused.",
            `The shop has paused the line: nobody is let in until it resumes. Your place is kept, with ${people(ahead)} ahead of you. ${place} ${keep}`,
            null,
          ];
        }
        const range = rangeText(q.est, (Date.now() - (q.est ? q.est.at : 0)) / 1000);
        const who = ahead === 0 ? "You're next" : `${people(ahead)} ahead of you`;
        return [
          range ? `${who}: ${range}.` : `${who}.`,
          `${place} Shoppers are let in at ${groupDigits(q.rate)} a second, and only while units are left that no one let in is holding. ${keep}`,
          null,
        ];
      }
      case "admitted":
        // One admission per unit left: a unit is held for each shopper let in only
        // where each may buy one; above that, those let in may take several each.
        if ((Number(d.maxPerUser) || 1) > 1) return ["You're in!", "Buy before your turn ends: units are not held for each shopper let in, as each may buy more than one.", null];
        return ["You're in!", "A unit is held for you: buy it before your turn ends.", null];
      case "passed":
        return ["Your turn passed.", "You were let in but did not buy in time; the line moved on.", null];
      case "sold_out":
        return ["Sold out.", "Every unit went to shoppers ahead of you in the line.", null];
      default:
        return ["You're not in the line.", "", null];
    }
  }

  function render(status) {
    // An admission that ran out: ask once what became of it.
    if (q.state === "admitted" && now() >= q.expiresAt && !q.askedAtExpiry) {
      q.askedAtExpiry = true;
      ask();
    }
    // Events lost at the opening (or no event stream): the clock asks instead.
    if (q.state === "waiting" && q.position === null && now() >= sale.startsAt + 2000 && q.openingAsks === 0) {
      q.openingAsks = 1;
      ask();
    }
    // A waiting shopper's estimate, asked again now and then.
    if (q.state === "waiting" && q.position !== null && q.est && Date.now() - Math.max(q.est.at, q.refreshedAt) > ESTIMATE_EVERY_MS) {
      q.refreshedAt = Date.now(); // asked once, not at every render
      ask();
    }
    const [status_, detail, link] = words(status);
    setText(el.status, status_);
    showDetail(detail, link);
    const waiting = q.state === "waiting" && q.position !== null && !sale.bought && status !== "ended" && status !== "closed";
    const ahead = Math.max(0, q.position - (q.served ?? 0) - 1);
    const chance = waiting && !q.paused ? chanceText(q.est, { unitsLeft: sale.left, open: q.open, ahead, perUser: d.maxPerUser }) : "";
    el.chance.hidden = !chance;
    setText(el.chance, chance);
    renderNotify(q.state === "waiting" && !sale.bought);
    const canJoin = sale.signedIn && q.state === "not_joined" && !q.joinsClosed && lineOpen() && (status === "live" || status === "upcoming");
    el.join.hidden = !canJoin;
    el.join.disabled = q.joining;
    setText(el.join, q.joining ? "Joining…" : "Join the line");
    setText(el.opensLabel, lineOpen() ? "Line opened" : "Line opens");
    const admitted = canBuy();
    el.expiry.hidden = !admitted;
    if (admitted) setText(el.expiryTime, formatDuration(q.expiresAt - now()));
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

  /** The opt-in to a notification when the turn comes, while waiting. */
  function renderNotify(waiting) {
    const permission = notifyPermission();
    el.notify.hidden = !waiting || permission !== "default";
    let note = "";
    if (waiting && q.notifyAsked && permission === "granted") note = "You'll get a notification when it's your turn.";
    if (waiting && q.notifyAsked && permission === "denied") note = "Notifications are blocked for this site: keep this tab open, its title blinks when it's your turn.";
    el.notifyNote.hidden = !note;
    setText(el.notifyNote, note);
  }

  async function notify() {
    el.notify.disabled = true;
    await askToNotify();
    el.notify.disabled = false;
    q.notifyAsked = true;
    changed();
  }

  /** Admitted, with time left: the page offers Buy. */
  function canBuy() {
    return q.state === "admitted" && now() < q.expiresAt;
  }

  el.join.addEventListener("click", join);
  el.notify.addEventListener("click", notify);
  // What the shop knows already: nothing to ask before the line opens (nobody can
  // have joined), after the end, or once bought.
  if (sale.signedIn && !sale.bought) {
    if (lineOpen()) ask();
    else q.state = "not_joined";
  }

  return {
    onView,
    render,
    canBuy,
    /** The admission's ticket, while it lasts. */
    ticket: () => (canBuy() ? q.ticket : null),
    bought() {
      q.state = "bought";
      q.ticket = null;
    },
    /** After a purchase that was refused: where do we stand now? */
    recheck: ask,
  };
}
