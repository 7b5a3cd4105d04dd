// Sign in and sign up: one form each, checked here first, then by the API.

import { api, messageOf } from "./api.js";
import { field, setText } from "./dom.js";
import { focusFirstError, revalidateOnInput, showFieldErrors } from "./forms.js";

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

export function authPage() {
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

  // The account this page made whose sign-in then failed (busy, a network
  // error): pressing again signs in to it rather than making it again ("taken").
  let made = null;
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
      const again = made && made.username === credentials.username && made.password === credentials.password;
      if (kind === "signup" && !again) {
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
        made = credentials;
      }
      const signedIn = await api("POST", "/api/auth/signin", credentials);
      if (!signedIn.ok) {
        const wait = signedIn.headers.get("Retry-After");
        const retry = made && kind === "signup" ? " Your account is made: press again to sign in." : "";
        const after = wait ? ` Try again in ${wait} s.` : "";
        setText(error, `${messageOf(signedIn, "Could not sign in.")}${after}${retry}`);
        return;
      }
      location.assign(next);
    } finally {
      button.disabled = false;
    }
  });
}
