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

  /** "Nov 22, 3:09 PM" in the visitor's time zone; the year only when not this one. */
  function localTime(date) {
    return (date.getFullYear() === new Date().getFullYear() ? sameYear : otherYear).format(date);
  }

  function showLocalTimes(root) {
    for (const el of root.querySelectorAll("time[data-local]")) {
      const at = new Date(el.dateTime);
      if (!Number.isNaN(at.getTime())) setText(el, localTime(at));
    }
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
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      setText(error, "");
      const credentials = {
        username: form.elements.username.value.trim(),
        password: form.elements.password.value,
      };
      if (!credentials.username || !credentials.password) {
        setText(error, "Enter a username and a password.");
        return;
      }
      button.disabled = true;
      try {
        if (kind === "signup") {
          const created = await api("POST", "/api/auth/signup", credentials);
          if (!created.ok) {
            setText(error, messageOf(created, "Could not create the account."));
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
    };
    const state = {
      status: d.status,
      startsAt: Number(d.startsAt),
      endsAt: Number(d.endsAt),
      left: Number(el.left.textContent),
      total: Number(el.total.textContent),
      signedIn: d.signedIn === "true",
      bought: d.bought === "true",
      busy: false,
      retryUntil: 0, // client clock, after a 429
      following: false,
      rateLimited: false,
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

    function render() {
      const status = currentStatus();
      setBadge(el.badge, status);
      setText(el.left, state.left);
      setText(el.total, state.total);
      if (el.progress) {
        el.progress.max = Math.max(state.total, 1);
        el.progress.value = state.left;
      }
      const untilStart = state.startsAt - now();
      el.countdown.hidden = status !== "upcoming";
      if (status === "upcoming") setText(el.countdownTime, formatDuration(untilStart));
      const waitMs = state.retryUntil - Date.now();
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

    function show(kind, title, detail, link) {
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

    async function buy() {
      if (el.buy.disabled) return;
      state.busy = true;
      render();
      const res = await api("POST", `/api/sales/${saleId}/purchase`);
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
            show("warning", "This sale has not started yet.", messageOf(res, ""));
          } else {
            show("error", messageOf(res, "The shop refused this order."));
          }
          break;
        case 410:
          if (code === "ended") {
            state.status = "ended";
            show("error", "This sale has ended.");
          } else {
            state.status = "sold_out";
            state.left = 0;
            show("error", "Sold out.", "Every unit has been claimed. Better luck next time!");
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
      refresh();
    }

    el.buy.addEventListener("click", buy);
    if (state.bought) {
      show("info", "You already bought from this sale.", "", { href: "/me/orders", text: "See my orders" });
    }
    render();
    setInterval(render, 250);
    pollWhileVisible(refresh, SALE_POLL_MS);
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
      if (results.closed === true && state.status !== "closed") {
        state.status = "closed";
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
    }

    form.addEventListener("submit", vote);
    render();
    setInterval(render, 250);
    pollWhileVisible(refreshResults, RESULTS_POLL_MS);
  }

  // ---- my orders -----------------------------------------------------------

  async function ordersPage() {
    const table = document.querySelector('[data-field="orders"]');
    const body = table.tBodies[0];
    const error = document.querySelector('[data-field="error"]');
    const res = await api("GET", "/api/me/orders");
    body.replaceChildren();
    if (!res.ok) {
      setText(error, messageOf(res, "Could not load your orders."));
      return;
    }
    if (!Array.isArray(res.data) || res.data.length === 0) {
      const row = body.insertRow();
      const cell = row.insertCell();
      cell.colSpan = 4;
      cell.className = "muted";
      cell.append("No orders yet. ");
      const a = document.createElement("a");
      a.href = "/";
      a.textContent = "Browse the sales";
      cell.append(a);
      return;
    }
    for (const order of res.data) {
      const row = body.insertRow();
      const link = document.createElement("a");
      link.href = `/sales/${Number(order.sale_id)}`;
      link.textContent = order.sale_name;
      row.insertCell().append(link);
      row.insertCell().textContent = formatPrice(Number(order.price_cents));
      const when = document.createElement("time");
      when.dateTime = order.accepted_at;
      when.textContent = localTime(new Date(order.accepted_at));
      row.insertCell().append(when);
      const id = row.insertCell();
      id.className = "muted small";
      // The first bytes of an order id carry its sale id; the tail tells orders apart.
      id.textContent = String(order.id).slice(-12);
      id.title = String(order.id);
    }
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
      setText(field(row, "id"), `#${id}`);
      const units = field(row, "units");
      units.id = `units-${id}`;
      field(row, "units-label").htmlFor = units.id;
      return row;
    }

    function fillRow(row, view) {
      setText(field(row, "name"), view.name);
      setText(field(row, "units-label"), `Units for ${view.name}`);
      setBadge(field(row, "badge"), view.status);
      setText(field(row, "price"), formatPrice(Number(view.price_cents)));
      setText(field(row, "stock-left"), view.stock_left);
      setText(field(row, "sold"), view.sold);
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

    function showViews(views) {
      views.forEach((view, i) => {
        let row = rowOf(view.id);
        if (!row) row = newRow(view);
        fillRow(row, view);
        // Move only when out of place: moving a row would steal focus from its input.
        if (rows.children[i] !== row) rows.insertBefore(row, rows.children[i] || null);
      });
      const empty = field(document, "admin-empty");
      if (empty) empty.hidden = views.length > 0;
    }

    async function refresh() {
      const res = await api("GET", "/api/admin/sales");
      if (res.ok && Array.isArray(res.data)) showViews(res.data);
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const f = form.elements;
      const price = parsePrice(f.price.value);
      const stock = parseUnits(f.stock.value);
      const starts = new Date(f.starts_at.value);
      const ends = new Date(f.ends_at.value);
      let problem = "";
      if (!f.name.value.trim()) problem = "Give the sale a name.";
      else if (price === null) problem = "Enter the price as a number, like 499 or 19.99.";
      else if (stock === null) problem = "Enter the stock as a whole number.";
      else if (Number.isNaN(starts.getTime()) || Number.isNaN(ends.getTime()))
        problem = "Pick when the sale opens and ends.";
      if (problem) {
        say(createMessage, problem, false);
        return;
      }
      const button = form.querySelector('button[type="submit"]');
      button.disabled = true;
      const res = await api("POST", "/api/admin/sales", {
        name: f.name.value,
        description: f.description.value,
        price_cents: price,
        stock,
        // datetime-local is local wall time; the API takes UTC instants.
        starts_at: starts.toISOString(),
        ends_at: ends.toISOString(),
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
        say(createMessage, messageOf(res, "Could not create the sale."), false);
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
        done = `“${name}” is open.`;
      } else {
        if (!confirm(`Close “${name}”? Buyers will be turned away.`)) return;
        done = `“${name}” is closed.`;
      }
      button.disabled = true;
      const res = await api("POST", path, body);
      button.disabled = false;
      if (res.ok) {
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
      row.querySelector('[data-action="close-poll"]').disabled = view.status === "closed";
    }

    function showViews(views) {
      views.forEach((view, i) => {
        let row = rowOf(view.id);
        if (!row) row = newRow(view);
        fillRow(row, view);
        if (rows.children[i] !== row) rows.insertBefore(row, rows.children[i] || null);
      });
      const empty = field(document, "polls-empty");
      if (empty) empty.hidden = views.length > 0;
    }

    async function refresh() {
      const res = await api("GET", "/api/admin/polls");
      if (res.ok && Array.isArray(res.data)) showViews(res.data);
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const f = form.elements;
      const question = f.question.value.trim();
      const options = [...list.querySelectorAll("input")].map((input) => input.value.trim());
      const opens = new Date(f.opens_at.value);
      const closes = new Date(f.closes_at.value);
      let problem = "";
      if (!question) problem = "Write the question.";
      else if (options.some((o) => !o)) problem = "Fill in every option, or remove the empty ones.";
      else if (Number.isNaN(opens.getTime()) || Number.isNaN(closes.getTime()))
        problem = "Pick when the poll opens and closes.";
      if (problem) {
        say(createMessage, problem, false);
        return;
      }
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

  // ---- start ---------------------------------------------------------------

  const pages = {
    sale: salePage,
    poll: pollPage,
    signin: authPage,
    signup: authPage,
    orders: ordersPage,
    admin: adminPage,
  };

  setUpSignOut();
  showLocalTimes(document);
  const run = pages[document.body.dataset.page];
  if (run) run();
})();
