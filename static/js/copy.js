// Copy buttons: `<button data-action="copy" data-copy="text">` puts its text on the
// clipboard (an order id shown in its short form, copyable whole). The button says
// "Copied" for a moment, and a polite live region tells screen readers. Where the
// browser refuses, the id's `<code>` beside the button shows the whole id,
// selected, to copy by hand.

/** How long the button says "Copied" (or "Copy failed"). */
const SAID_MS = 2000;

async function copyText(text) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch {
    // Refused (no permission, no focus): the older way below may still work.
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "visually-hidden";
  document.body.append(area);
  area.select();
  let done = false;
  try {
    done = document.execCommand("copy");
  } catch {
    done = false;
  }
  area.remove();
  return done;
}

/** The whole id in the `<code>` beside the button, selected. */
function showWhole(button) {
  const code = button.parentElement && button.parentElement.querySelector("code");
  if (!code) return;
  code.textContent = button.dataset.copy;
  code.classList.add("is-whole");
  const range = document.createRange();
  range.selectNodeContents(code);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}

/** Wires every copy button under `root`, now and later (one listener). */
export function setUpCopyButtons(root = document.body) {
  const status = document.createElement("p");
  status.className = "visually-hidden";
  status.setAttribute("role", "status");
  status.setAttribute("aria-live", "polite");
  document.body.append(status);
  root.addEventListener("click", async (event) => {
    const button = event.target.closest('button[data-action="copy"]');
    if (!button) return;
    const label = button.querySelector('[data-field="copy-label"]');
    const ok = await copyText(button.dataset.copy);
    status.textContent = ok ? `Copied ${button.dataset.copy}` : "Copy failed: the whole id is shown and selected.";
    if (!ok) showWhole(button);
    if (label) {
      label.textContent = ok ? "Copied" : "Copy failed";
      clearTimeout(Number(button.dataset.timer));
      button.dataset.timer = String(setTimeout(() => (label.textContent = "Copy"), SAID_MS));
    }
  });
}
