// The JSON API, as every page calls it: the CSRF header on every change, JSON in
// and out, and one answer shape ({status, ok, headers, data}) whatever happens.

const CSRF_COOKIE = "stampede_csrf";

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === CSRF_COOKIE) return decodeURIComponent(rest.join("="));
  }
  return "";
}

/**
 * Calls the JSON API. Never throws: a network failure is status 0. `extra`:
 * more request headers ({"Idempotency-Key": ...}).
 */
export async function api(method, path, body, extra = {}) {
  const sent = method !== "GET" ? csrfToken() : "";
  const res = await call(method, path, body, extra, sent);
  // A session whose CSRF cookie the server set right with this refusal (a page
  // opened before the token was bound to the session): once more, with it.
  if (res.status === 403 && res.data.error === "csrf_failed" && sent !== csrfToken()) {
    return call(method, path, body, extra, csrfToken());
  }
  return res;
}

async function call(method, path, body, extra, csrf) {
  const headers = { ...extra, Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
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
export function messageOf(res, fallback) {
  const m = res.data && res.data.message;
  return typeof m === "string" && m ? m[0].toUpperCase() + m.slice(1) : fallback;
}

/** The seconds of a 429's `Retry-After`, at least 1. */
export function retryAfterSeconds(res) {
  return Math.max(1, parseInt(res.headers.get("Retry-After") || "1", 10) || 1);
}

/**
 * How long to wait before asking again after `failures` failed asks in a row
 * (the last answer `res`): its `Retry-After` when it names one, else `baseMs`
 * doubled per failure up to 30 s; spread by a fifth either way, so the phones of
 * a waiting room that all failed at once (a failover) do not ask again in step.
 */
export function retryDelayMs(res, failures, baseMs) {
  const after = parseInt(res.headers.get("Retry-After") || "", 10);
  const wait = after > 0 ? after * 1000 : Math.min(30_000, baseMs * 2 ** Math.max(0, failures - 1));
  return Math.round(wait * (0.8 + Math.random() * 0.4));
}
