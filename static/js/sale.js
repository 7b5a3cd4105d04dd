// The sale page: status, stock and countdown follow the sale live, and Buy.

import { api, messageOf } from "./api.js";
import { field, setBadge, setText, showOutcome, shownStatus } from "./dom.js";
import { liveOrPoll } from "./live.js";
import { formatPrice, groupDigits } from "./numbers.js";
import { followRateLimit, presentAnswer, retryLabel, sharedAnswer } from "./refusals.js";
import { clockOffset, formatDuration, localTime } from "./time.js";
import { waitingRoom } from "./queue.js";
import { drawEntry } from "./draw.js";
import { returnedWords } from "./returned.js";
import { checkingWords, proofHeaders } from "./pow.js";
import { keyRing, sendKeyed, unanswered } from "./keyed.js";

const SALE_POLL_MS = 2000;
const MY_ORDERS = { href: "/me/orders", text: "See my orders" };
const PAY_ON_MY_ORDERS = { href: "/me/orders", text: "Go to My orders" };
export function salePage() {
  const root = document.getElementById("sale");
  if (!root) return;
  const d = root.dataset;
  const saleId = d.saleId;
  const offset = clockOffset(Number(d.serverNow));
  const now = () => Date.now() + offset;
  const el = {
    badge: field(root, "badge"),
    progress: field(root, "progress"),
    left: field(root, "stock-left"),
    total: field(root, "stock-total"),
    countdown: field(root, "countdown"),
    countdownTime: field(root, "countdown-time"),
    hint: field(root, "hint"),
    outcome: field(root, "outcome"),
    buy: root.querySelector('[data-action="buy"]'),
    signInToBuy: field(root, "signin-buy"),
    starts: field(root, "starts"),
    ends: field(root, "ends"),
    startsLabel: field(root, "starts-label"),
    endsLabel: field(root, "ends-label"),
    closedNote: field(root, "closed-note"),
    // Only on a sale of more than one per customer.
    quantity: field(root, "quantity"),
    buyRow: field(root, "buy-row"),
    heldNote: field(root, "held-note"),
    name: field(root, "name"),
    price: field(root, "price"),
    description: field(root, "description"),
    picture: field(root, "picture"),
  };
  // Most units per buyer; 1: no quantity is shown or sent.
  const maxPerUser = Number(d.maxPerUser) || 1;
  // The Idempotency-Keys of purchases not known to be decided, by quantity.
  const purchaseKeys = keyRing();
  const state = {
    status: d.status,
    startsAt: Number(d.startsAt),
    // After a 409 not_started: not open before this (this page's clock), however
    // the views that follow set startsAt (the shop's clock is behind this one).
    opensNotBefore: 0,
    endsAt: Number(d.endsAt),
    left: Number(d.stockLeft) || 0,
    total: Number(d.stockTotal) || 0,
    signedIn: d.signedIn === "true",
    bought: d.bought === "true",
    // Units this buyer holds, of a sale of more than one per customer.
    held: Number(d.held) || 0,
    // Units counted against max_per_user: held, plus returned ones on a sale that
    // does not let a buyer buy again.
    counted: Number(d.counted) || Number(d.held) || 0,
    // How this buyer's order ended when it holds nothing now (returnedWords).
    returned: d.returned || "",
    mayRebuy: d.rebuy === "true",
    // A draw whose every entry had its turn (the view's draw_finished_at): its
    // units left are not for sale, however the sale's status reads.
    drawOver: d.drawOver === "true",
    busy: false,
    retryUntil: 0, // client clock, after a 429
    following: false,
    rateLimited: false,
    // The status a shown message is about ("sold_out" for "Sold out."): when the
    // sale moves on (a top-up, a close, an opening), the message goes.
    outcomeFor: "",
  };

  // A sale with a waiting room: Buy only once admitted from its line (queue.js);
  // a draw: only with a running win (draw.js).
  const gate = {
    root,
    saleId,
    sale: state,
    now,
    show: (...args) => show(...args),
    clear: clearOutcome,
    changed: () => render(),
    signinUrl: d.signinUrl,
  };
  const isDraw = d.draw === "true";
  const queue = d.waitingRoom === "true" ? waitingRoom(gate) : isDraw ? drawEntry(gate) : null;
  // What a purchase uses up on a gated sale (returned.js).
  const gateKind = d.waitingRoom === "true" ? "line" : isDraw ? "draw" : null;

  /** The server's last word, moved on by the clock between polls. */
  function currentStatus() {
    let status = state.status;
    const t = now();
    if (status === "upcoming" && t >= Math.max(state.startsAt, state.opensNotBefore)) status = state.left > 0 ? "live" : "sold_out";
    if (status !== "closed" && t >= state.endsAt) status = "ended";
    return shownStatus(status, state.drawOver);
  }

  /**
   * What this buyer holds of a sale of more than one per customer, in words that
   * follow the sale: "buy more" only while it sells.
   */
  function heldText(status) {
    if (state.held <= 0) return "";
    const more = maxPerUser - state.counted;
    const have = `You have ${state.held} from this sale`;
    if (status !== "live" && status !== "upcoming") return `${have}.`;
    // The admission or win bought once: no more, whatever the cap.
    if (gateKind) return `${have}; ${gateKind === "draw" ? "a win" : "a turn in the line"} buys once.`;
    if (more <= 0 && state.counted > state.held) return `${have}; with the units returned, that is the most one customer may buy.`;
    if (more <= 0) return `${have}, the most one customer may buy.`;
    return `${have}. You may buy ${more} more.`;
  }

  function buttonLabel(status, waitMs) {
    if (state.busy) return "Placing order…";
    if (state.bought && state.returned && !state.mayRebuy) {
      return maxPerUser > 1 ? `Up to ${maxPerUser} per customer` : "One per customer";
    }
    if (state.bought) return maxPerUser > 1 && state.held > 0 ? `You have ${state.held}` : "Purchased";
    if (waitMs > 0) return retryLabel(waitMs);
    switch (status) {
      case "upcoming":
        return "Not open yet";
      case "sold_out":
        return "Sold out";
      case "ended":
        return "Sale ended";
      case "closed":
        return "Sale closed";
      case "draw_over":
        return "Draw over";
      default:
        return "Buy now";
    }
  }

  /** The facts under the description: when it opened or opens, ends or ended. */
  function renderFacts(status) {
    const t = now();
    for (const [timeEl, at] of [
      [el.starts, state.startsAt],
      [el.ends, state.endsAt],
    ]) {
      if (!timeEl) continue;
      const iso = new Date(at).toISOString().replace(/\.\d{3}Z$/, "Z");
      if (timeEl.dateTime !== iso) {
        timeEl.dateTime = iso;
        setText(timeEl, localTime(new Date(at)));
      }
    }
    if (isDraw) setText(el.startsLabel, t < state.startsAt ? "Drawn at" : "Drawn");
    else setText(el.startsLabel, t < state.startsAt ? "Opens" : "Opened");
    setText(el.endsLabel, status === "ended" ? "Ended" : "Ends");
    if (el.closedNote) el.closedNote.hidden = status !== "closed";
    if (el.ends) el.ends.hidden = status === "closed";
  }

  function render() {
    const status = currentStatus();
    setBadge(el.badge, status);
    setText(el.left, groupDigits(state.left));
    setText(el.total, groupDigits(state.total));
    if (el.progress) {
      el.progress.max = Math.max(state.total, 1);
      el.progress.value = state.left;
    }
    renderFacts(status);
    // A closed sale answers purchases "ended": one message serves both.
    const still = state.outcomeFor === status || (state.outcomeFor === "ended" && status === "closed");
    if (state.outcomeFor && !still) clearOutcome();
    const untilStart = Math.max(state.startsAt, state.opensNotBefore) - now();
    // A draw's panel says when entries open and when it is drawn.
    el.countdown.hidden = status !== "upcoming" || isDraw;
    if (status === "upcoming") setText(el.countdownTime, formatDuration(untilStart));
    const waitMs = state.retryUntil - Date.now();
    // Signed out, a sale that can still be bought offers signing in instead; a
    // draw only until it is drawn (then only its winners may buy: draw.js shows
    // the outcome).
    const offerSignIn = !state.signedIn && (status === "upcoming" || (status === "live" && !isDraw));
    if (el.signInToBuy) el.signInToBuy.hidden = !offerSignIn;
    // In a waiting room Buy is there only while admitted (or its answer awaited).
    const noBuy = offerSignIn || (queue !== null && !queue.canBuy() && !state.busy);
    el.buy.hidden = noBuy;
    el.buy.disabled =
      status !== "live" || !state.signedIn || state.bought || state.busy || waitMs > 0;
    if (el.quantity) {
      el.buyRow.hidden = noBuy;
      // Chosen ahead of the opening too; not once nothing more can be bought.
      el.quantity.disabled =
        !(status === "live" || status === "upcoming") || !state.signedIn || state.bought || state.busy;
      limitQuantities();
    }
    setText(el.buy, buttonLabel(status, waitMs));
    if (el.heldNote) {
      const text = heldText(status);
      el.heldNote.hidden = !text;
      setText(el.heldNote, text);
    }
    followRateLimit(state, waitMs, el.outcome, show);
    if (queue) queue.render(status);
  }

  function clearOutcome() {
    state.outcomeFor = "";
    el.outcome.replaceChildren();
    el.outcome.className = "outcome";
  }

  /** No more than this buyer may still take can be chosen (known units only: the shop decides). */
  function limitQuantities() {
    const most = Math.max(1, maxPerUser - state.counted);
    for (const option of el.quantity.options) option.disabled = Number(option.value) > most;
    if (Number(el.quantity.value) > most) el.quantity.value = String(most);
  }

  /** `about`: the status the message describes, if it stops being true with it. */
  function show(kind, title, detail, link, about) {
    state.outcomeFor = about || "";
    showOutcome(el.outcome, kind, title, detail, link);
  }

  /** An admin's edit reaches an open page with the next view (within a second). */
  function applyWords(view) {
    if (typeof view.name === "string" && el.name) {
      setText(el.name, view.name);
      document.title = `${view.name} · Stampede`;
    }
    if (typeof view.description === "string" && el.description) {
      setText(el.description, view.description);
      el.description.hidden = !view.description;
    }
    if (Number.isFinite(view.price_cents) && el.price) setText(el.price, formatPrice(view.price_cents));
    if (el.picture && "image_url" in view) {
      const src = view.image_url || "/static/products/placeholder.svg";
      if (el.picture.getAttribute("src") !== src) el.picture.setAttribute("src", src);
      el.picture.alt = view.image_url ? view.name || "" : "";
    }
  }

  function applyView(view) {
    if (!view || typeof view !== "object") return;
    applyWords(view);
    if (typeof view.status === "string") state.status = view.status;
    // A draw never un-finishes: a view without it (a read that failed) changes nothing.
    if (isDraw && typeof view.draw_finished_at === "string") state.drawOver = true;
    if (Number.isFinite(view.stock_left)) state.left = Math.max(0, view.stock_left);
    if (Number.isFinite(view.stock_total)) state.total = Math.max(view.stock_total, state.left);
    const starts = Date.parse(view.starts_at);
    const ends = Date.parse(view.ends_at);
    if (!Number.isNaN(starts)) state.startsAt = starts;
    if (!Number.isNaN(ends)) state.endsAt = ends;
  }

  async function refresh() {
    const res = await api("GET", `/api/sales/${saleId}`);
    if (res.ok) {
      applyView(res.data);
      if (queue) queue.onView(res.data);
    }
    render();
  }

  /** "the unit goes", "its 2 units go". */
  function unitsGo(quantity) {
    return quantity > 1 ? `its ${quantity} units go` : "the unit goes";
  }

  async function followOrder(orderId, quantity) {
    if (state.following) return;
    state.following = true;
    const started = Date.now();
    let tries = 0;
    while (Date.now() - started < 5 * 60 * 1000) {
      await new Promise((r) => setTimeout(r, tries < 30 ? 1000 : 5000));
      tries += 1;
      if (document.hidden) continue;
      const res = await api("GET", `/api/orders/${encodeURIComponent(orderId)}`);
      if (res.ok && res.data.status === "confirmed") {
        const payBy = new Date(res.data.pay_by);
        const payment = res.data.payment;
        if (payment === "awaiting_payment" && !Number.isNaN(payBy.getTime())) {
          show("success", `Order confirmed — pay by ${localTime(payBy, true)} on My orders.`, `Not paid by then, ${unitsGo(quantity)} back on sale.`, PAY_ON_MY_ORDERS);
        } else if (payment === "cancelled" || payment === "refunded" || payment === "expired") {
          // Returned before this page heard it was confirmed (another tab, an admin).
          const ended = { cancelled: "was cancelled", refunded: "was cancelled and refunded", expired: "expired unpaid" }[payment];
          show("warning", `Your order ${ended}.`, "", MY_ORDERS);
        } else {
          show("success", "Order confirmed. Thank you!", "", MY_ORDERS);
        }
        state.following = false;
        return;
      }
      if (res.status === 401) break;
    }
    state.following = false;
    show("pending", "Order placed, still pending confirmation.", "It will appear in your orders shortly.", MY_ORDERS);
  }

  // A sale that requires a purchase ticket: get one (the shop issues it only once
  // the sale is open), then buy with it, in the same click. A ticket that expired
  // on the way is fetched again, once. A refused ticket (not started, ended, sold
  // out, signed out) is answered like the purchase it stood for.
  // `quantity` goes only to a sale of more than one per customer. `key`: the
  // press's Idempotency-Key, the same on every retry of it.
  // `press` holds the press's ticket: a retry sends the same one (good for 30 s),
  // so a purchase whose answer was lost is answered by its key, not refused by a
  // ticket asked again after the sale sold out or the admission was used.
  async function purchaseOnce(quantity, key, press = {}) {
    const path = `/api/sales/${saleId}/purchase`;
    const units = el.quantity ? { quantity } : {};
    const headers = { "Idempotency-Key": key };
    if (d.requiresTicket !== "true") {
      return el.quantity ? api("POST", path, units, headers) : api("POST", path, undefined, headers);
    }
    for (let attempt = 0; ; attempt++) {
      // Admitted from the waiting room: the admission's ticket is at hand.
      const held = attempt === 0 ? press.ticket || (queue ? queue.ticket() : null) : null;
      const ticket = held ? { status: 200, data: { ticket: held } } : await askTicket();
      if (ticket.status !== 200) return ticket;
      press.ticket = ticket.data.ticket;
      const res = await api("POST", path, { ticket: ticket.data.ticket, ...units }, headers);
      if (res.status !== 422 || res.data.error !== "ticket_expired" || attempt > 0) return res;
    }
  }

  // A purchase ticket; a sale that asks for a proof of work with it (no waiting
  // room: there the join carried it) gets it solved first, in a worker.
  async function askTicket() {
    let proof = { headers: {} };
    if (Number(d.proofOfWork) > 0 && d.waitingRoom !== "true" && !isDraw) {
      proof = await proofHeaders("sales", saleId, (share) => show("info", ...checkingWords(share)));
      if (proof.failed) return proof.failed;
    }
    return api("POST", `/api/sales/${saleId}/ticket`, undefined, proof.headers);
  }

  // One press of Buy: its answer, retrying a 503 or a dropped connection with the
  // same key ("still trying"), so a purchase the shop decided but whose answer was
  // lost is answered, never made twice; a press that got no answer in time leaves
  // its key to the next press of the same quantity.
  function purchase(quantity) {
    const press = {};
    return sendKeyed(purchaseKeys, quantity, (key) => purchaseOnce(quantity, key, press), () => {
      show("info", "Still trying…", "The shop did not answer yet; your order is being retried, never placed twice.");
      presentAnswer(el.outcome);
    });
  }

  async function buy() {
    if (el.buy.disabled) return;
    const quantity = el.quantity ? Number(el.quantity.value) || 1 : 1;
    state.busy = true;
    render();
    const res = await purchase(quantity);
    state.busy = false;
    const code = res.data.error;
    const placed = quantity > 1 ? `Order for ${quantity} placed` : "Order placed";
    switch (res.status) {
      case 202:
        // A sale of more than one per customer may be bought from again, up to
        // its limit: the shop says when a purchase would pass it.
        state.held += quantity;
        state.counted += quantity;
        state.bought = maxPerUser > 1 ? state.counted >= maxPerUser : true;
        state.returned = "";
        state.left = Math.max(0, state.left - quantity);
        if (queue) queue.bought();
        if (res.headers.get("Idempotent-Replayed") === "true") {
          // The shop had taken this order already (its first answer was lost).
          show("pending", `${placed}.`, "Its first answer was lost on the way; sent again, it was not placed twice.", MY_ORDERS);
        } else if (d.payWithin) {
          show("pending", `${placed} — pay within ${d.payWithin} on My orders.`, "", PAY_ON_MY_ORDERS);
        } else {
          show("pending", `${placed}, pending confirmation.`, "We are confirming your order…");
        }
        followOrder(res.data.order_id, quantity);
        break;
      case 409:
        if (code === "already_bought") {
          state.bought = true;
          if (state.returned) show("warning", ...returnedWords(state.returned, false, maxPerUser, gateKind), MY_ORDERS);
          else show("warning", "You already bought this.", "It is one per customer.", MY_ORDERS);
        } else if (code === "per_user_limit") {
          show("warning", sentence(messageOf(res, "That would pass this sale's limit per customer.")), `Up to ${maxPerUser} per customer.`, MY_ORDERS);
        } else if (code === "not_enough_left") {
          show("warning", sentence(messageOf(res, "Not that many left.")), "Choose fewer and buy again.");
        } else if (code === "not_started") {
          // The shop's clock is behind this one: its Retry-After says when the
          // sale opens, so the page counts down to that and keeps this message.
          state.status = "upcoming";
          const seconds = parseInt(res.headers.get("Retry-After") || "", 10);
          if (seconds > 0) state.opensNotBefore = now() + seconds * 1000;
          show("warning", "This sale has not started yet.", messageOf(res, ""), null, "upcoming");
        } else {
          show("error", messageOf(res, "The shop refused this order."));
        }
        break;
      case 410:
        if (code === "ended") {
          state.status = "ended";
          show("error", "This sale has ended.", "", null, "ended");
        } else {
          state.status = "sold_out";
          state.left = 0;
          show("error", "Sold out.", "Every unit has been claimed. Better luck next time!", null, "sold_out");
        }
        break;
      default:
        if (res.status === 403 && code === "not_drawn") {
          show("warning", "Only the draw's winners may buy.", "You hold no win of this draw now, or your time to buy has passed.");
        } else if (res.status === 403 && code === "not_admitted") {
          show("warning", "It is not your turn to buy.", "Your turn has not come yet, or it has passed.");
        } else if (res.status === 422 && code === "invalid_quantity") {
          show("warning", sentence(messageOf(res, `Choose from 1 to ${maxPerUser}.`)));
        } else if (unanswered(res)) {
          // Retried for a minute with no answer: it may have gone through.
          show(
            "error",
            "We could not confirm your order.",
            "It may have gone through: check My orders. Buying the same quantity again sends the same order, never a second one.",
            MY_ORDERS,
          );
        } else {
          show(...sharedAnswer(res, state, { act: "buy", thing: "sale", signinUrl: d.signinUrl }));
        }
    }
    render();
    presentAnswer(el.outcome);
    refresh();
    // Refused in a waiting room: where this shopper stands now.
    if (queue && res.status !== 202) queue.recheck();
  }

  el.buy.addEventListener("click", buy);
  // A sale of more than one per customer says what the buyer holds under Buy.
  // A waiting room's or a draw's panel says it (queue.js, draw.js).
  if (state.returned && !queue) {
    show("info", ...returnedWords(state.returned, state.mayRebuy, maxPerUser), MY_ORDERS);
  } else if (state.bought && maxPerUser <= 1 && !queue) {
    show("info", "You already bought from this sale.", "", MY_ORDERS);
  }
  render();
  setInterval(render, 250);
  liveOrPoll(
    `/api/sales/${saleId}/events`,
    (view) => {
      applyView(view);
      if (queue) queue.onView(view);
      render();
    },
    refresh,
    SALE_POLL_MS,
  );
}

/** The server's message as a sentence: with its full stop. */
function sentence(text) {
  return /[.!?]$/.test(text) ? text : `${text}.`;
}
