// A purchase or a vote whose answer was lost (a 5xx, a dropped connection) may
// have been decided all the same: it is sent again with the same Idempotency-Key,
// never as a new request, so the shop answers what it decided and never counts it
// twice. A press whose tries all went unanswered keeps its key, and the next press
// of the same request (the same body) sends it again.

// Retried at most this long, waiting Retry-After (at least 1 s, at most 5 s)
// between tries.
const RETRY_FOR_MS = 60_000;

/** A new Idempotency-Key: one per request a press sends. */
export function newKey() {
  if (window.crypto && typeof window.crypto.randomUUID === "function") return window.crypto.randomUUID();
  const bytes = new Uint8Array(16);
  window.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Whether an answer leaves its request undecided as far as the page knows: no
 * answer or a 5xx (it may have been decided), or a 429 (which decided nothing;
 * after one of those, the limit refused the retry, not the request).
 */
export function undecided(res) {
  return unanswered(res) || res.status === 429;
}

/** No answer (a dropped connection: `api`'s status 0 `network`) or a 5xx. */
export function unanswered(res) {
  return (res.status === 0 && res.data.error === "network") || res.status >= 500;
}

/**
 * The keys of a page's requests not known to be decided, by what each sends (its
 * body, as JSON). In memory: after a reload the page reads what the shop holds.
 */
export function keyRing() {
  const open = new Map();
  return {
    /** The key `body` was last sent with undecided, else a new one. */
    keyFor(body) {
      return open.get(JSON.stringify(body ?? null)) || newKey();
    },
    /**
     * Forgets every key: once another ballot of a poll that allows changes is
     * accepted, an older undecided one sent again under its key would replay its
     * old 202 ("counted") while the newer ballot counts.
     */
    clear() {
      open.clear();
    },
    /** Records `res`, the answer to `body` sent with `key`. */
    answered(body, key, res) {
      const what = JSON.stringify(body ?? null);
      if (undecided(res)) open.set(what, key);
      else open.delete(what);
    },
  };
}

/**
 * Sends `once(key)` until it is decided, retrying a 5xx or a dropped connection
 * with the same key (calling `waiting()` before each wait), for at most a minute.
 * Returns the last answer; `ring` remembers the key when it is still undecided.
 */
export async function sendKeyed(ring, body, once, waiting) {
  const key = ring.keyFor(body);
  const until = Date.now() + RETRY_FOR_MS;
  for (;;) {
    const res = await once(key);
    const retry = unanswered(res) && Date.now() < until;
    if (!retry) {
      ring.answered(body, key, res);
      return res;
    }
    const seconds = Math.min(5, Math.max(1, parseInt(res.headers.get("Retry-After") || "1", 10) || 1));
    waiting();
    await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  }
}
