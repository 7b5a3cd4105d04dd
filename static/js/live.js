// Keeping a page current: the server's event stream, or polling where there is none.

/** How often the admin pages ask again, while visible (they have no event stream). */
export const ADMIN_POLL_MS = 3000;

/** Runs `fn` every `ms` while the tab is visible, and at once when it comes back. */
export function pollWhileVisible(fn, ms) {
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
 * Returns `stop`, which ends both (a page that must follow another stream, e.g.
 * a voter's once their vote is in, stops this one and follows the new one).
 */
export function liveOrPoll(path, apply, poll, ms) {
  let stopped = false;
  const polling = () => (stopped ? undefined : poll());
  if (typeof EventSource !== "function") {
    pollWhileVisible(polling, ms);
    return () => {
      stopped = true;
    };
  }
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
    if (!stopped) apply(view);
  });
  source.addEventListener("error", () => {
    // The browser reconnects by itself after a dropped stream; an error answer
    // (CLOSED) or three failures in a row mean it will not work here.
    failures += 1;
    if (!stopped && (source.readyState === EventSource.CLOSED || failures >= 3)) {
      source.close();
      pollWhileVisible(polling, ms);
    }
  });
  return () => {
    stopped = true;
    source.close();
  };
}
