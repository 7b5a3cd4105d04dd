// Archive, unarchive and delete on an admin page of one sale or poll.

import { api, messageOf } from "./api.js";
import { field } from "./dom.js";
import { say } from "./forms.js";

/**
 * The `[data-action]` buttons archive, unarchive and delete inside `root`:
 * `base` is the API address (`/api/admin/sales/7`), `what` the words for the
 * subject ("sale", "poll"), `name()` its current name, `gone` where to go after a
 * delete.
 */
export function retireButtons(root, base, what, name, gone) {
  const message = field(document, "retire-message");
  root.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button || !["archive", "unarchive", "delete"].includes(button.dataset.action)) return;
    const action = button.dataset.action;
    if (action === "delete" && !confirm(`Delete the ${what} “${name()}” for good? This cannot be undone.`)) return;
    if (action === "archive" && !confirm(`Archive “${name()}”? It leaves the public lists.`)) return;
    button.disabled = true;
    const res = action === "delete" ? await api("DELETE", base) : await api("POST", `${base}/${action}`);
    button.disabled = false;
    if (!res.ok) {
      say(message, messageOf(res, "That did not work."), false);
      return;
    }
    if (action === "delete") {
      location.assign(gone);
      return;
    }
    say(message, action === "archive" ? "Archived." : "Back on the list.", true);
    setTimeout(() => location.reload(), 400);
  });
}
