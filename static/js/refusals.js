// The answers a purchase (the sale page) and a vote (the poll page) share: how a
// refusal reads, what it changes in the page's state, and where the focus goes.
// Each page still handles its own answers (sold out, already voted, ...) first.

import { messageOf, retryAfterSeconds } from "./api.js";
import { reveal, setText } from "./dom.js";

const tooManyAttempts = (seconds) => `Too many attempts, retry in ${seconds} s.`;

/** The action button's label while a 429's wait runs. */
export function retryLabel(waitMs) {
  return `Retry in ${Math.ceil(waitMs / 1000)} s`;
}

/**
 * The answers that read the same on both pages, as `show`'s arguments
 * [kind, title, detail, link]: signed out (401), a stale session (403), an account
 * too new or a browser check refused (403, 428), gone (404), too many attempts
 * (429) and anything unexpected. `act` and `thing` name the
 * page's action ("buy", "sale"); `signinUrl` is the page's sign-in link. Records
 * on `state` what the answer means: `signedIn` false after a 401; after a 429, the
 * wait's end on the client clock (`retryUntil`) and `rateLimited` until it is over.
 */
export function sharedAnswer(res, state, { act, thing, signinUrl }) {
  const signIn = { href: signinUrl, text: "Sign in" };
  const code = res.data.error;
  // A proof of work the page solved but the shop refused (or one it did not
  // send): pressing again solves a new one.
  const proofFailed = ["warning", "The browser check did not pass.", "Please try again."];
  switch (res.status) {
    case 401:
      state.signedIn = false;
      return ["warning", `Please sign in to ${act}.`, "Your session has ended.", signIn];
    case 403:
      if (code === "account_too_new") return ["warning", "Your account is too new for this yet.", messageOf(res, "")];
      if (code === "proof_invalid" || code === "proof_used") return proofFailed;
      return ["warning", "Your session is out of date.", "Sign in again, then retry.", signIn];
    case 404:
      return ["error", `This ${thing} no longer exists.`];
    case 428:
      return proofFailed;
    case 429: {
      const seconds = retryAfterSeconds(res);
      state.retryUntil = Date.now() + seconds * 1000;
      state.rateLimited = true;
      return ["warning", tooManyAttempts(seconds)];
    }
    default:
      return ["error", "Something went wrong.", messageOf(res, "Please try again in a moment.")];
  }
}

/**
 * Keeps a 429's message true on each render: counts the wait down in the answer
 * `box`, then says once (through the page's `show`) that trying again is allowed.
 */
export function followRateLimit(state, waitMs, box, show) {
  if (state.rateLimited && waitMs <= 0) {
    state.rateLimited = false;
    show("info", "You can try again now.");
  } else if (state.rateLimited) {
    const first = box.querySelector("p");
    if (first) setText(first, tooManyAttempts(Math.ceil(waitMs / 1000)));
  }
}

/**
 * After an answer the action button may be disabled, which would drop the
 * keyboard focus to the page: hand it to the answer, and bring the answer into
 * view on a phone.
 */
export function presentAnswer(box) {
  box.focus({ preventScroll: true });
  reveal(box);
}
