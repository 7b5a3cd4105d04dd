// Stampede pages: plain JavaScript, no framework, no build step, nothing loaded from
// elsewhere. Loaded with `defer` on every page; `<body data-page>` picks the code to
// run. Pages carry their data in `data-` attributes (the CSP forbids inline script).
// All text from the server is put in with `textContent`, never as HTML.
(() => {
  "use strict";

  const CSRF_COOKIE = "stampede_csrf";
  const SALE_POLL_MS = 2000;
  const RESULTS_POLL_MS = 2000;
  const ADMIN_POLL_MS = 3000;

  // ---- helpers -------------------------------------------------------------

  function csrfToken() {
    for (const part of document.cookie.split(";")) {
      const [name, ...rest] = part.trim().split("=");
      if (name === CSRF_COOKIE) return decodeURIComponent(rest.join("="));
    }
    return "";
  }

  /** Calls the JSON API. Never throws: a network failure is status 0. */
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (method !== "GET") headers["X-CSRF-Token"] = csrfToken();
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch(path, {
        method,
        headers,
        credentials: "same-origin",
        cache: "no-store",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (_) {
      return {
        status: 0,
        ok: false,
        headers: new Headers(),
        data: { error: "network", message: "Could not reach the shop. Check your connection and try again." },
      };
    }
    let data = {};
    try {
      const text = await resp.text();
      if (text) data = JSON.parse(text);
    } catch (_) {
      data = {};
    }
    return { status: resp.status, ok: resp.ok, headers: resp.headers, data: data || {} };
  }

  /** The API's `message`, as a sentence ("wrong password" -> "Wrong password"). */
  function messageOf(res, fallback) {
    const m = res.data && res.data.message;
    return typeof m === "string" && m ? m[0].toUpperCase() + m.slice(1) : fallback;
  }

  function field(root, name) {
    return root.querySelector(`[data-field="${name}"]`);
  }

  function setText(el, text) {
    if (el && el.textContent !== String(text)) el.textContent = String(text);
  }

  const shortDate = { month: "short", day: "numeric", hour: "numeric", minute: "2-digit" };
  const sameYear = new Intl.DateTimeFormat(undefined, shortDate);
  const otherYear = new Intl.DateTimeFormat(undefined, { ...shortDate, year: "numeric" });

  const withSeconds = new Intl.DateTimeFormat(undefined, { ...shortDate, second: "2-digit" });
  const withSecondsOtherYear = new Intl.DateTimeFormat(undefined, { ...shortDate, second: "2-digit", year: "numeric" });

  /** "Nov 22, 3:09 PM" in the visitor's time zone; the year only when not this one. */
  function localTime(date, seconds = false) {
    const thisYear = date.getFullYear() === new Date().getFullYear();
    if (seconds) return (thisYear ? withSeconds : withSecondsOtherYear).format(date);
    return (thisYear ? sameYear : otherYear).format(date);
  }

  /** `<time data-local>` in the visitor's time zone; `data-seconds` adds the seconds. */
  function showLocalTimes(root) {
    for (const el of root.querySelectorAll("time[data-local]")) {
      const at = new Date(el.dateTime);
      if (!Number.isNaN(at.getTime())) setText(el, localTime(at, el.hasAttribute("data-seconds")));
    }
  }

  /** Same format as the server's `group_digits`: 1234567 -> "1,234,567". */
  function groupDigits(n) {
    const sign = n < 0 ? "-" : "";
    return sign + Math.floor(Math.abs(n)).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  }

  /** Scrolls `el` into view when it is not, gently unless motion is unwelcome. */
  function reveal(el) {
    const calm = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
    el.scrollIntoView({ block: "nearest", behavior: calm ? "auto" : "smooth" });
  }

  /**
   * Shows `errors` ({field name: text}) under the fields of `form` that have a
   * `[data-error-for]` line, marks those fields invalid and clears the others.
   */
  function showFieldErrors(form, errors) {
    for (const line of form.querySelectorAll("[data-error-for]")) {
      const name = line.dataset.errorFor;
      const text = errors[name] || "";
      setText(line, text);
      const input = form.elements[name];
      const inputs = input instanceof Element ? [input] : input ? [...input] : [];
      for (const one of inputs) {
        if (text) one.setAttribute("aria-invalid", "true");
        else one.removeAttribute("aria-invalid");
      }
    }
  }

  /** Focuses the first field that has an error. */
  function focusFirstError(form) {
    const bad = form.querySelector('[aria-invalid="true"]');
    if (bad) bad.focus();
  }

  /**
   * Re-checks a form's fields as they change, once an error has been shown, so a
   * message goes away as soon as its field is fixed.
   */
  function revalidateOnInput(form, validate) {
    const again = () => {
      if (form.querySelector('[aria-invalid="true"]')) showFieldErrors(form, validate());
    };
    form.addEventListener("input", again);
    form.addEventListener("change", again);
  }

  /** Same format as the server's `format_price`: $1,234.50. */
  function formatPrice(cents) {
    const sign = cents < 0 ? "-" : "";
    const abs = Math.abs(cents);
    const units = Math.floor(abs / 100).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    return `${sign}$${units}.${String(abs % 100).padStart(2, "0")}`;
  }

  const STATUS_LABELS = {
    upcoming: "Upcoming",
    live: "Live",
    sold_out: "Sold out",
    ended: "Ended",
    closed: "Closed",
    open: "Open",
  };

  function setBadge(el, status) {
    if (!el) return;
    el.className = `badge badge-${status}`;
    setText(el, STATUS_LABELS[status] || status);
  }

  /** A `datetime-local` value: the date's wall time in the visitor's time zone. */
  function toLocalInput(date) {
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
  }

  /** The seconds of a 429's `Retry-After`, at least 1. */
  function retryAfterSeconds(res) {
    return Math.max(1, parseInt(res.headers.get("Retry-After") || "1", 10) || 1);
  }

  /**
   * Replaces an outcome box with a title, an optional detail and an optional
   * link ({href, text}). `kind` picks the colour: success, pending, info,
   * warning or error.
   */
  function showOutcome(box, kind, title, detail, link) {
    box.replaceChildren();
    box.className = `outcome outcome-${kind}`;
    const p = document.createElement("p");
    p.textContent = title;
    box.append(p);
    if (detail || link) {
      const q = document.createElement("p");
      if (detail) q.append(document.createTextNode(detail + (link ? " " : "")));
      if (link) {
        const a = document.createElement("a");
        a.href = link.href;
        a.textContent = link.text;
        q.append(a);
      }
      box.append(q);
    }
  }

  /** A local path to return to after signing in, or "/". */
  function safeNext() {
    return localPath(new URLSearchParams(location.search).get("next") || "");
  }

  /**
   * `raw` as a path on this origin, or "/". The URL parser has the last word: it
   * drops tabs and newlines and reads "\\" as "/", so "/\t/evil.example" or "/\\evil"
   * would leave the site. Refuse those characters outright, then refuse whatever the
   * parser resolves to another origin. The server checks the same (src/web/pages.rs).
   */
  function localPath(raw) {
    if (!raw.startsWith("/") || raw.startsWith("//") || /[\u0000-\u001f\u007f-\u009f\\]/.test(raw)) {
      return "/";
    }
    let url;
    try {
      url = new URL(raw, location.origin);
    } catch {
      return "/";
    }
    return url.origin === location.origin ? url.pathname + url.search + url.hash : "/";
  }

  /** "1d 02:03:04", "02:03:04" or "03:04". */
  function formatDuration(ms) {
    let s = Math.max(0, Math.ceil(ms / 1000));
    const days = Math.floor(s / 86400);
    s -= days * 86400;
    const h = Math.floor(s / 3600);
    s -= h * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    const pad = (n) => String(n).padStart(2, "0");
    const clock = h > 0 || days > 0 ? `${pad(h)}:${pad(m)}:${pad(s)}` : `${pad(m)}:${pad(s)}`;
    return days > 0 ? `${days}d ${clock}` : clock;
  }

  /**
   * Server time minus client time. The server stamped `serverNow` just before
   * answering, so compare it with the moment the page's response began arriving.
   */
  function clockOffset(serverNow) {
    let received = Date.now();
    const nav = performance.getEntriesByType ? performance.getEntriesByType("navigation")[0] : null;
    if (nav && nav.responseStart > 0 && performance.timeOrigin) {
      received = performance.timeOrigin + nav.responseStart;
    }
    return serverNow - received;
  }

  /** Runs `fn` every `ms` while the tab is visible, and at once when it comes back. */
  function pollWhileVisible(fn, ms) {
    let timer = 0;
    let running = false;
    const tick = async () => {
      clearTimeout(timer);
      if (running) return;
      if (!document.hidden) {
        running = true;
        try {
          await fn();
        } finally {
          running = false;
        }
      }
      timer = setTimeout(tick, ms);
    };
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) tick();
    });
    timer = setTimeout(tick, ms);
    return tick;
  }

  /**
   * Follows `path`'s server-sent events, handing each event's JSON to `apply`;
   * where the stream cannot be had (no EventSource, a proxy that cuts it, an error
   * answer), falls back to running `poll` every `ms` while the tab is visible.
   */
  function liveOrPoll(path, apply, poll, ms) {
    if (typeof EventSource !== "function") return pollWhileVisible(poll, ms);
    const source = new EventSource(path);
    let failures = 0;
    source.addEventListener("message", (event) => {
      failures = 0;
      let view;
      try {
        view = JSON.parse(event.data);
      } catch {
        return;
      }
      apply(view);
    });
    source.addEventListener("error", () => {
      // The browser reconnects by itself after a dropped stream; an error answer
      // (CLOSED) or three failures in a row mean it will not work here.
      failures += 1;
      if (source.readyState === EventSource.CLOSED || failures >= 3) {
        source.close();
        pollWhileVisible(poll, ms);
      }
    });
    return poll;
  }

  // ---- every page ----------------------------------------------------------

  function setUpSignOut() {
    for (const form of document.querySelectorAll("form[data-signout]")) {
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const button = form.querySelector("button");
        if (button) button.disabled = true;
        await api("POST", "/api/auth/signout");
        location.assign("/");
      });
    }
  }

  // ---- sign in / sign up ---------------------------------------------------

  function authPage() {
    const form = document.querySelector("form[data-auth-form]");
    if (!form) return;
    const kind = form.dataset.authForm;
    const error = field(form, "error");
    const button = form.querySelector('button[type="submit"]');
    const next = safeNext();
    for (const link of document.querySelectorAll("a[data-keep-next]")) {
      if (next !== "/") link.search = `?next=${encodeURIComponent(next)}`;
    }
    /** Every problem at once, each under its field (sign-up states its rules). */
    function validate() {
      const errors = {};
      const username = form.elements.username.value.trim();
      const password = form.elements.password.value;
      if (kind !== "signup") return errors;
      if (!username) errors.username = "Choose a username.";
      else if (username.length < 3 || username.length > 32)
        errors.username = "A username has 3 to 32 characters.";
      else if (!/^[A-Za-z0-9_.-]+$/.test(username))
        errors.username = "Use only letters, digits, “_”, “.” and “-”.";
      if (!password) errors.password = "Choose a password.";
      else if (password.length < 8) errors.password = "A password has at least 8 characters.";
      else if (password.length > 128) errors.password = "A password has at most 128 characters.";
      return errors;
    }
    if (kind === "signup") revalidateOnInput(form, validate);

    /** The API's refusal of a sign-up, in plain words under the field it is about. */
    function signupRefusal(res) {
      switch (res.data.error) {
        case "username_taken":
          return { username: "That username is taken. Try another." };
        case "invalid_username":
          return { username: "Use 3 to 32 letters, digits, “_”, “.” or “-”." };
        case "invalid_password":
          return { password: messageOf(res, "That password cannot be used.") };
        default:
          return null;
      }
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      setText(error, "");
      const credentials = {
        username: form.elements.username.value.trim(),
        password: form.elements.password.value,
      };
      if (kind === "signup") {
        const errors = validate();
        showFieldErrors(form, errors);
        if (Object.keys(errors).length) {
          focusFirstError(form);
          return;
        }
      } else if (!credentials.username || !credentials.password) {
        setText(error, "Enter a username and a password.");
        return;
      }
      button.disabled = true;
      try {
        if (kind === "signup") {
          const created = await api("POST", "/api/auth/signup", credentials);
          if (!created.ok) {
            const refusal = signupRefusal(created);
            if (refusal) {
              showFieldErrors(form, refusal);
              focusFirstError(form);
            } else {
              setText(error, messageOf(created, "Could not create the account."));
            }
            return;
          }
        }
        const signedIn = await api("POST", "/api/auth/signin", credentials);
        if (!signedIn.ok) {
          setText(error, messageOf(signedIn, "Could not sign in."));
          return;
        }
        location.assign(next);
      } finally {
        button.disabled = false;
      }
    });
  }

  // ---- the sale page -------------------------------------------------------

  function salePage() {
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
    };
    const state = {
      status: d.status,
      startsAt: Number(d.startsAt),
      endsAt: Number(d.endsAt),
      left: Number(d.stockLeft) || 0,
      total: Number(d.stockTotal) || 0,
      signedIn: d.signedIn === "true",
      bought: d.bought === "true",
      busy: false,
      retryUntil: 0, // client clock, after a 429
      following: false,
      rateLimited: false,
      // The status a shown message is about ("sold_out" for "Sold out."): when the
      // sale moves on (a top-up, a close, an opening), the message goes.
      outcomeFor: "",
    };

    /** The server's last word, moved on by the clock between polls. */
    function currentStatus() {
      let status = state.status;
      const t = now();
      if (status === "upcoming" && t >= state.startsAt) status = state.left > 0 ? "live" : "sold_out";
      if (status !== "closed" && t >= state.endsAt) status = "ended";
      return status;
    }

    function buttonLabel(status, waitMs) {
      if (state.busy) return "Placing order…";
      if (state.bought) return "Purchased";
      if (waitMs > 0) return `Retry in ${Math.ceil(waitMs / 1000)} s`;
      switch (status) {
        case "upcoming":
          return "Not open yet";
        case "sold_out":
          return "Sold out";
        case "ended":
          return "Sale ended";
        case "closed":
          return "Sale closed";
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
      setText(el.startsLabel, t < state.startsAt ? "Opens" : "Opened");
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
      if (state.outcomeFor && !still) {
        state.outcomeFor = "";
        el.outcome.replaceChildren();
        el.outcome.className = "outcome";
      }
      const untilStart = state.startsAt - now();
      el.countdown.hidden = status !== "upcoming";
      if (status === "upcoming") setText(el.countdownTime, formatDuration(untilStart));
      const waitMs = state.retryUntil - Date.now();
      // Signed out, a sale that can still be bought offers signing in instead.
      const offerSignIn = !state.signedIn && (status === "live" || status === "upcoming");
      if (el.signInToBuy) el.signInToBuy.hidden = !offerSignIn;
      el.buy.hidden = offerSignIn;
      el.buy.disabled =
        status !== "live" || !state.signedIn || state.bought || state.busy || waitMs > 0;
      setText(el.buy, buttonLabel(status, waitMs));
      if (state.rateLimited && waitMs <= 0) {
        state.rateLimited = false;
        show("info", "You can try again now.");
      } else if (state.rateLimited) {
        const text = `Too many attempts, retry in ${Math.ceil(waitMs / 1000)} s.`;
        const first = el.outcome.querySelector("p");
        if (first) setText(first, text);
      }
    }

    /** `about`: the status the message describes, if it stops being true with it. */
    function show(kind, title, detail, link, about) {
      state.outcomeFor = about || "";
      showOutcome(el.outcome, kind, title, detail, link);
    }

    function applyView(view) {
      if (!view || typeof view !== "object") return;
      if (typeof view.status === "string") state.status = view.status;
      if (Number.isFinite(view.stock_left)) state.left = Math.max(0, view.stock_left);
      if (Number.isFinite(view.stock_total)) state.total = Math.max(view.stock_total, state.left);
      const starts = Date.parse(view.starts_at);
      const ends = Date.parse(view.ends_at);
      if (!Number.isNaN(starts)) state.startsAt = starts;
      if (!Number.isNaN(ends)) state.endsAt = ends;
    }

    async function refresh() {
      const res = await api("GET", `/api/sales/${saleId}`);
      if (res.ok) applyView(res.data);
      render();
    }

    async function followOrder(orderId) {
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
          show("success", "Order confirmed. Thank you!", "", {
            href: "/me/orders",
            text: "See my orders",
          });
          state.following = false;
          return;
        }
        if (res.status === 401) break;
      }
      state.following = false;
      show("pending", "Order placed, still pending confirmation.", "It will appear in your orders shortly.", {
        href: "/me/orders",
        text: "See my orders",
      });
    }

    // A sale that requires a purchase ticket: get one (the shop issues it only once
    // the sale is open), then buy with it, in the same click. A ticket that expired
    // on the way is fetched again, once. A refused ticket (not started, ended, sold
    // out, signed out) is answered like the purchase it stood for.
    async function purchase() {
      const path = `/api/sales/${saleId}/purchase`;
      if (d.requiresTicket !== "true") return api("POST", path);
      for (let attempt = 0; ; attempt++) {
        const ticket = await api("POST", `/api/sales/${saleId}/ticket`);
        if (ticket.status !== 200) return ticket;
        const res = await api("POST", path, { ticket: ticket.data.ticket });
        if (res.status !== 422 || res.data.error !== "ticket_expired" || attempt > 0) return res;
      }
    }

    async function buy() {
      if (el.buy.disabled) return;
      state.busy = true;
      render();
      const res = await purchase();
      state.busy = false;
      const code = res.data.error;
      const signIn = { href: d.signinUrl, text: "Sign in" };
      switch (res.status) {
        case 202:
          state.bought = true;
          state.left = Math.max(0, state.left - 1);
          show("pending", "Order placed, pending confirmation.", "We are confirming your order…");
          followOrder(res.data.order_id);
          break;
        case 409:
          if (code === "already_bought") {
            state.bought = true;
            show("warning", "You already bought this.", "It is one per customer.", {
              href: "/me/orders",
              text: "See my orders",
            });
          } else if (code === "not_started") {
            state.status = "upcoming";
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
        case 401:
          state.signedIn = false;
          show("warning", "Please sign in to buy.", "Your session has ended.", signIn);
          break;
        case 403:
          show("warning", "Your session is out of date.", "Sign in again, then retry.", signIn);
          break;
        case 404:
          show("error", "This sale no longer exists.");
          break;
        case 429: {
          const seconds = retryAfterSeconds(res);
          state.retryUntil = Date.now() + seconds * 1000;
          state.rateLimited = true;
          show("warning", `Too many attempts, retry in ${seconds} s.`);
          break;
        }
        default:
          show("error", "Something went wrong.", messageOf(res, "Please try again in a moment."));
      }
      render();
      // The button may now be disabled, which would drop the keyboard focus to the
      // page: hand it to the answer, and bring the answer into view on a phone.
      el.outcome.focus({ preventScroll: true });
      reveal(el.outcome);
      refresh();
    }

    el.buy.addEventListener("click", buy);
    if (state.bought) {
      show("info", "You already bought from this sale.", "", { href: "/me/orders", text: "See my orders" });
    }
    render();
    setInterval(render, 250);
    liveOrPoll(
      `/api/sales/${saleId}/events`,
      (view) => {
        applyView(view);
        render();
      },
      refresh,
      SALE_POLL_MS,
    );
  }

  // ---- the poll page -------------------------------------------------------

  function pollPage() {
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
      if (waitMs > 0) return `Retry in ${Math.ceil(waitMs / 1000)} s`;
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
      setText(el.resultsHeading, status === "closed" ? "Final results" : "Live results");
      setText(el.opensLabel, status === "upcoming" ? "Opens" : "Opened");
      setText(el.closesLabel, status === "closed" ? "Closed" : "Closes");
      if (el.closedNote) el.closedNote.hidden = !state.closedEarly;
      if (el.closes) el.closes.hidden = state.closedEarly;
      const waitMs = state.retryUntil - Date.now();
      const canChoose = status === "open" && state.signedIn && !state.voted;
      for (const radio of radios) radio.disabled = !canChoose || state.busy;
      el.vote.disabled = !canChoose || state.busy || waitMs > 0;
      setText(el.vote, buttonLabel(status, waitMs));
      if (state.rateLimited && waitMs <= 0) {
        state.rateLimited = false;
        show("info", "You can try again now.");
      } else if (state.rateLimited) {
        const first = el.outcome.querySelector("p");
        if (first) setText(first, `Too many attempts, retry in ${Math.ceil(waitMs / 1000)} s.`);
      }
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

    /** Bars, counts and percentages from `GET /api/polls/{id}/results`. */
    function applyResults(results) {
      if (!results || !Array.isArray(results.tallies)) return;
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
      const voters = Math.max(0, Number(results.voters) || 0);
      const total = Math.max(voters, counted);
      for (const row of el.results.children) {
        const n = votes.get(row.dataset.optionId) || 0;
        setText(field(row, "votes"), n);
        setText(field(row, "percent"), `${total > 0 ? Math.round((n * 100) / total) : 0}%`);
        const bar = field(row, "bar");
        bar.max = Math.max(total, 1);
        bar.value = n;
      }
      setText(el.voters, voters === 1 ? "1 voter" : `${voters} voters`);
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
      const signIn = { href: d.signinUrl, text: "Sign in" };
      switch (res.status) {
        case 202:
          state.voted = true;
          state.choice = optionId;
          markMine();
          show("success", "Thanks, your vote counted.", "The results update live.");
          refreshResults();
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
        case 401:
          state.signedIn = false;
          show("warning", "Please sign in to vote.", "Your session has ended.", signIn);
          break;
        case 403:
          show("warning", "Your session is out of date.", "Sign in again, then retry.", signIn);
          break;
        case 404:
          show("error", "This poll no longer exists.");
          break;
        case 429: {
          const seconds = retryAfterSeconds(res);
          state.retryUntil = Date.now() + seconds * 1000;
          state.rateLimited = true;
          show("warning", `Too many attempts, retry in ${seconds} s.`);
          break;
        }
        default:
          show("error", "Something went wrong.", messageOf(res, "Please try again in a moment."));
      }
      render();
      el.outcome.focus({ preventScroll: true });
      reveal(el.outcome);
    }

    form.addEventListener("submit", vote);
    render();
    setInterval(render, 250);
    liveOrPoll(`/api/polls/${pollId}/events`, applyResults, refreshResults, RESULTS_POLL_MS);
  }

  // ---- my orders ---------------------------------------------------------

  /** The page is rendered by the server; while an order is pending, look again. */
  function ordersPage() {
    if (!document.querySelector("tr.is-pending")) {
      sessionStorage.removeItem("orders-reloads");
      return;
    }
    const tries = Number(sessionStorage.getItem("orders-reloads") || "0");
    if (tries >= 20) return;
    setTimeout(() => {
      if (document.hidden) return;
      sessionStorage.setItem("orders-reloads", String(tries + 1));
      location.reload();
    }, 3000);
  }

  // ---- the home page -------------------------------------------------------

  const HOME_POLL_MS = 5000;

  /**
   * Cards count down to the opening and follow stock and status without a
   * reload. Cards keep their place; the order is the server's at load time.
   */
  function indexPage() {
    const grid = field(document, "sale-grid");
    if (!grid) return;
    const offset = clockOffset(Number(grid.dataset.serverNow));
    const now = () => Date.now() + offset;
    const cards = new Map();
    for (const card of grid.querySelectorAll(".sale-card[data-sale-id]")) {
      const d = card.dataset;
      cards.set(d.saleId, {
        card,
        status: d.status,
        startsAt: Number(d.startsAt),
        endsAt: Number(d.endsAt),
        left: Number(d.stockLeft) || 0,
        total: Number(d.stockTotal) || 0,
        shown: "",
      });
    }

    function statusOf(c) {
      let status = c.status;
      const t = now();
      if (status === "upcoming" && t >= c.startsAt) status = c.left > 0 ? "live" : "sold_out";
      if (status !== "closed" && t >= c.endsAt) status = "ended";
      return status;
    }

    function whenLine(c, status) {
      const t = now();
      const untilStart = c.startsAt - t;
      if (status === "upcoming")
        return untilStart < 86400000 ? ["Opens in ", formatDuration(untilStart)] : ["Opens ", localTime(new Date(c.startsAt))];
      if (status === "closed") return ["Closed by the shop", ""];
      if (status === "ended") return ["Ended ", localTime(new Date(c.endsAt))];
      return ["Ends ", localTime(new Date(c.endsAt))];
    }

    function render() {
      for (const c of cards.values()) {
        const status = statusOf(c);
        const card = c.card;
        for (const name of [...card.classList]) if (name.startsWith("status-")) card.classList.remove(name);
        card.classList.add(`status-${status}`);
        setBadge(field(card, "badge"), status);
        setText(field(card, "stock-left"), groupDigits(c.left));
        setText(field(card, "stock-total"), groupDigits(c.total));
        const bar = field(card, "progress");
        bar.max = Math.max(c.total, 1);
        bar.value = c.left;
        const [label, value] = whenLine(c, status);
        const key = label + value;
        if (c.shown !== key) {
          c.shown = key;
          const when = field(card, "when");
          when.replaceChildren(label);
          if (value) {
            const strong = document.createElement("strong");
            strong.className = "when-value";
            strong.textContent = value;
            when.append(strong);
          }
        }
      }
    }

    async function refresh() {
      const res = await api("GET", "/api/sales");
      if (!res.ok || !Array.isArray(res.data)) return;
      for (const view of res.data) {
        const c = cards.get(String(view.id));
        if (!c) continue;
        if (typeof view.status === "string") c.status = view.status;
        if (Number.isFinite(view.stock_left)) c.left = Math.max(0, view.stock_left);
        if (Number.isFinite(view.stock_total)) c.total = Math.max(view.stock_total, c.left);
        const starts = Date.parse(view.starts_at);
        const ends = Date.parse(view.ends_at);
        if (!Number.isNaN(starts)) c.startsAt = starts;
        if (!Number.isNaN(ends)) c.endsAt = ends;
      }
      render();
    }

    render();
    setInterval(render, 1000);
    pollWhileVisible(refresh, HOME_POLL_MS);
  }

  // ---- admin ---------------------------------------------------------------

  /** A form's message line: green when `ok`, red otherwise. */
  function say(target, text, ok) {
    target.className = `form-message ${ok ? "is-ok" : "is-error"}`;
    setText(target, text);
  }

  /** Briefly highlights a table row that just changed. */
  function flash(row) {
    row.classList.remove("flash");
    void row.offsetWidth; // restart the animation
    row.classList.add("flash");
  }

  function adminPage() {
    const form = document.querySelector('form[data-form="create-sale"]');
    const createMessage = field(document, "create-message");
    const adminMessage = field(document, "admin-message");
    const rows = field(document, "admin-rows");
    const rowTemplate = document.getElementById("admin-row");

    function defaultWindow() {
      const start = new Date(Date.now() + 5 * 60 * 1000);
      start.setSeconds(0, 0);
      form.elements.starts_at.value = toLocalInput(start);
      form.elements.ends_at.value = toLocalInput(new Date(start.getTime() + 7 * 86400 * 1000));
    }

    /** "19.99" -> 1999; null when it is not a price. */
    function parsePrice(text) {
      const m = /^\s*(\d{1,9})(?:[.,](\d{1,2}))?\s*$/.exec(text);
      if (!m) return null;
      return Number(m[1]) * 100 + Number((m[2] || "0").padEnd(2, "0"));
    }

    function parseUnits(text) {
      return /^\s*\d{1,9}\s*$/.test(text) ? Number(text) : null;
    }

    function rowOf(id) {
      return rows.querySelector(`tr[data-sale-id="${CSS.escape(String(id))}"]`);
    }

    function newRow(view) {
      const row = rowTemplate.content.firstElementChild.cloneNode(true);
      const id = String(view.id);
      row.dataset.saleId = id;
      field(row, "name").href = `/sales/${encodeURIComponent(id)}`;
      field(row, "orders-link").href = `/admin/sales/${encodeURIComponent(id)}/orders`;
      setText(field(row, "id"), `#${id}`);
      const units = field(row, "units");
      units.id = `units-${id}`;
      field(row, "units-label").htmlFor = units.id;
      return row;
    }

    /**
     * Only the actions that make sense in the sale's state (the server's
     * `SaleCard::can_*` decide the same for the first render): no Close on a
     * closed or ended sale, Open now before the opening, Reopen now on a closed
     * sale whose end is still ahead, no stock changes after the end.
     */
    function showActions(row, view) {
      const pastEnd = Date.parse(view.ends_at) <= Date.now();
      const status = view.status;
      const open = row.querySelector('[data-action="open"]');
      const close = row.querySelector('[data-action="close"]');
      const stock = field(row, "stock-actions");
      // Never hide the control that has the keyboard focus.
      const keep = (el) => el.contains(document.activeElement);
      const canOpen = (status === "upcoming" || status === "closed") && !pastEnd;
      if (!keep(open)) open.hidden = !canOpen;
      setText(open, status === "closed" ? "Reopen now" : "Open now");
      const canClose = status === "upcoming" || status === "live" || status === "sold_out";
      if (!keep(close)) close.hidden = !canClose;
      if (!keep(stock)) stock.hidden = pastEnd;
    }

    function fillRow(row, view) {
      setText(field(row, "name"), view.name);
      const label = field(row, "units-label") || row.querySelector("label");
      setText(label, `Units for ${view.name}`);
      setBadge(field(row, "badge"), view.status);
      setText(field(row, "price"), formatPrice(Number(view.price_cents)));
      setText(field(row, "stock-left"), groupDigits(Number(view.stock_left)));
      setText(field(row, "sold"), groupDigits(Number(view.sold)));
      showActions(row, view);
      for (const [name, value] of [
        ["starts", view.starts_at],
        ["ends", view.ends_at],
      ]) {
        const t = field(row, name);
        if (t.dateTime !== value) {
          t.dateTime = value;
          setText(t, localTime(new Date(value)));
        }
      }
    }

    /**
     * Rows never move once shown (opening a sale changes its place in the API's
     * order, and a row jumping under the pointer gets the wrong click): known rows
     * are updated where they are, new ones go on top.
     */
    function showViews(views) {
      const fresh = [];
      for (const view of views) {
        let row = rowOf(view.id);
        if (!row) {
          row = newRow(view);
          fresh.push(row);
        }
        fillRow(row, view);
      }
      rows.prepend(...fresh);
      const empty = field(document, "admin-empty");
      if (empty) empty.hidden = views.length > 0;
    }

    async function refresh() {
      const res = await api("GET", "/api/admin/sales");
      if (res.ok && Array.isArray(res.data)) showViews(res.data);
    }

    const IMAGE_HINT = "Use an https:// address or a path on this site starting with /, without spaces or quotes.";

    /** Every problem of the form, in plain words, by field. */
    function validate() {
      const f = form.elements;
      const errors = {};
      const starts = new Date(f.starts_at.value);
      const ends = new Date(f.ends_at.value);
      if (!f.name.value.trim()) errors.name = "Give the sale a name.";
      if (parsePrice(f.price.value) === null) errors.price = "Enter the price as a number, like 499 or 19.99.";
      const image = f.image_url.value.trim();
      if (image && !/^(https:\/\/[^\s/?#@]+|\/(?!\/))[^\s"'<>\\`]*$/.test(image)) errors.image_url = IMAGE_HINT;
      const stock = parseUnits(f.stock.value);
      if (stock === null) errors.stock = "Enter the stock as a whole number, like 100.";
      else if (stock > 10000000) errors.stock = "The stock can be at most 10,000,000 units.";
      if (Number.isNaN(starts.getTime())) errors.starts_at = "Pick when the sale opens.";
      if (Number.isNaN(ends.getTime())) errors.ends_at = "Pick when the sale ends.";
      else if (ends.getTime() <= Date.now()) errors.ends_at = "The end is in the past: pick a later time.";
      else if (!errors.starts_at && ends <= starts) errors.ends_at = "The sale must end after it opens.";
      else if (!errors.starts_at && ends - starts > 366 * 86400000) errors.ends_at = "A sale can last at most 366 days.";
      return errors;
    }
    revalidateOnInput(form, validate);

    /** The API's refusal, in plain words under the field it is about. */
    function refusalOf(res) {
      const message = String(res.data.message || "");
      switch (res.data.error) {
        case "invalid_window":
          if (message.includes("past")) return { ends_at: "The end is in the past: pick a later time." };
          if (message.includes("at most")) return { ends_at: "A sale can last at most 366 days." };
          return { ends_at: "The sale must end after it opens." };
        case "invalid_text":
          if (message.startsWith("description")) return { description: "The description can have at most 5,000 characters." };
          return { name: "Give the sale a name of at most 200 characters." };
        case "invalid_price":
          return { price: "Enter a price from 0 up, like 499 or 19.99." };
        case "invalid_image_url":
          return { image_url: IMAGE_HINT };
        case "invalid_stock":
        case "stock_too_large":
          return { stock: "The stock can be 0 to 10,000,000 units." };
        default:
          return null;
      }
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const f = form.elements;
      const errors = validate();
      showFieldErrors(form, errors);
      if (Object.keys(errors).length) {
        say(createMessage, "Check the fields marked above.", false);
        focusFirstError(form);
        return;
      }
      setText(createMessage, "");
      const price = parsePrice(f.price.value);
      const stock = parseUnits(f.stock.value);
      const starts = new Date(f.starts_at.value);
      const ends = new Date(f.ends_at.value);
      const button = form.querySelector('button[type="submit"]');
      button.disabled = true;
      const res = await api("POST", "/api/admin/sales", {
        name: f.name.value,
        description: f.description.value,
        image_url: f.image_url.value.trim() || null,
        price_cents: price,
        stock,
        // datetime-local is local wall time; the API takes UTC instants.
        starts_at: starts.toISOString(),
        ends_at: ends.toISOString(),
        requires_ticket: f.requires_ticket.checked,
      });
      button.disabled = false;
      if (res.status === 201) {
        say(createMessage, `Created “${res.data.name}” (#${res.data.id}).`, true);
        form.reset();
        defaultWindow();
        await refresh();
        const row = rowOf(res.data.id);
        if (row) flash(row);
      } else {
        const refusal = refusalOf(res);
        if (refusal) {
          showFieldErrors(form, refusal);
          focusFirstError(form);
          say(createMessage, "Check the fields marked above.", false);
        } else {
          say(createMessage, messageOf(res, "Could not create the sale."), false);
        }
      }
    });

    rows.addEventListener("click", async (event) => {
      const button = event.target.closest("button[data-action]");
      if (!button) return;
      const row = button.closest("tr");
      const id = row.dataset.saleId;
      const name = field(row, "name").textContent;
      const action = button.dataset.action;
      const path = `/api/admin/sales/${encodeURIComponent(id)}/${action === "open" || action === "close" ? action : "stock"}`;
      let body;
      let done;
      if (action === "set-stock" || action === "add-stock") {
        const units = parseUnits(field(row, "units").value);
        if (units === null) {
          say(adminMessage, `Enter a whole number of units for “${name}” first.`, false);
          field(row, "units").focus();
          return;
        }
        body = action === "set-stock" ? { set: units } : { add: units };
        done = action === "set-stock" ? `Stock of “${name}” set to ${units}.` : `Added ${units} to “${name}”.`;
      } else if (action === "open") {
        if (button.textContent.startsWith("Reopen") && !confirm(`Reopen “${name}”? Buyers can buy again at once, until its end time.`))
          return;
        done = `“${name}” is open.`;
      } else {
        if (!confirm(`Close “${name}”? Buyers will be turned away.`)) return;
        done = `“${name}” is closed.`;
      }
      button.disabled = true;
      const res = await api("POST", path, body);
      button.disabled = false;
      if (res.ok) {
        // Open and Close may disappear with the new state: keep the focus in the row.
        if (action === "open" || action === "close") field(row, "name").focus({ preventScroll: true });
        fillRow(row, res.data);
        flash(row);
        field(row, "units").value = "";
        say(adminMessage, done, true);
      } else {
        say(adminMessage, `“${name}”: ${messageOf(res, "the change failed.")}`, false);
      }
    });

    defaultWindow();
    pollWhileVisible(refresh, ADMIN_POLL_MS);
    adminPolls();
  }

  /** The admin page's polls: the create form with its option list, and the table. */
  function adminPolls() {
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
      for (const [name, value] of [
        ["opens", view.opens_at],
        ["closes", view.closes_at],
      ]) {
        const t = field(row, name);
        if (t.dateTime !== value) {
          t.dateTime = value;
          setText(t, localTime(new Date(value)));
        }
      }
      const close = row.querySelector('[data-action="close-poll"]');
      if (!close.contains(document.activeElement)) close.hidden = view.status === "closed";
    }

    /** As with sales: rows stay where they are, new ones go on top. */
    function showViews(views) {
      const fresh = [];
      for (const view of views) {
        let row = rowOf(view.id);
        if (!row) {
          row = newRow(view);
          fresh.push(row);
        }
        fillRow(row, view);
      }
      rows.prepend(...fresh);
      const empty = field(document, "polls-empty");
      if (empty) empty.hidden = views.length > 0;
    }

    async function refresh() {
      const res = await api("GET", "/api/admin/polls");
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
      const errors = validate();
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
      });
      button.disabled = false;
      if (res.status === 201) {
        say(createMessage, `Created poll “${res.data.question}” (#${res.data.id}).`, true);
        f.question.value = "";
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

  // ---- an admin's poll tallies ----------------------------------------------

  /**
   * Live and settled tallies follow the poll without a reload: the page asks the
   * admin API (`GET /api/admin/polls/{id}`, which also reads Postgres's settled
   * counts, so it is not an event stream) every few seconds while visible.
   */
  function adminPollPage() {
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

  // ---- start ---------------------------------------------------------------

  const pages = {
    index: indexPage,
    sale: salePage,
    poll: pollPage,
    signin: authPage,
    signup: authPage,
    orders: ordersPage,
    admin: adminPage,
    "admin-poll": adminPollPage,
  };

  setUpSignOut();
  showLocalTimes(document);
  const run = pages[document.body.dataset.page];
  if (run) run();
})();
