// Form messages: errors under their fields, and a form's one-line answer.

import { setText } from "./dom.js";

/**
 * Shows `errors` ({field name: text}) under the fields of `form` that have a
 * `[data-error-for]` line, marks those fields invalid and clears the others.
 */
export function showFieldErrors(form, errors) {
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
export function focusFirstError(form) {
  const bad = form.querySelector('[aria-invalid="true"]');
  if (bad) bad.focus();
}

/**
 * Re-checks a form's fields as they change, once an error has been shown, so a
 * message goes away as soon as its field is fixed.
 */
export function revalidateOnInput(form, validate) {
  const again = () => {
    if (form.querySelector('[aria-invalid="true"]')) showFieldErrors(form, validate());
  };
  form.addEventListener("input", again);
  form.addEventListener("change", again);
}

/** A form's message line: green when `ok`, red otherwise. */
export function say(target, text, ok) {
  target.className = `form-message ${ok ? "is-ok" : "is-error"}`;
  setText(target, text);
}
