// Stampede pages: plain JavaScript modules, no framework, no build step, nothing
// loaded from elsewhere (the CSP allows scripts from 'self' only). This is the
// entry, loaded on every page as `<script type="module">` (deferred, like any
// module); `<body data-page>` picks the page's code in `js/`. Pages carry their data
// in `data-` attributes (the CSP forbids inline script). All text from the server
// is put in with `textContent`, never as HTML.
//
// Static files are served with `Cache-Control: no-cache` and an ETag, so every
// module is revalidated on each page load (a 304 when unchanged): after a deploy
// the imports below are as fresh as this file, with no versioned URLs.

import { api } from "./js/api.js";
import { nameTimeZones, showLocalTimes } from "./js/dom.js";
import { adminPage } from "./js/admin.js";
import { adminOrdersPage } from "./js/admin-orders.js";
import { adminPollPage } from "./js/admin-poll.js";
import { adminSalePage } from "./js/admin-sale.js";
import { authPage } from "./js/auth.js";
import { drawProofPage } from "./js/draw-proof.js";
import { indexPage } from "./js/home.js";
import { ordersPage } from "./js/orders.js";
import { pollPage } from "./js/poll.js";
import { salePage } from "./js/sale.js";

/** The header's Sign out, on every page for a signed-in visitor. */
function setUpSignOut() {
  for (const form of document.querySelectorAll("form[data-signout]")) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const button = form.querySelector("button");
      if (button) button.disabled = true;
      const res = await api("POST", "/api/auth/signout");
      // Still signed in (no answer, or the shop could not end the session):
      // say so rather than leave as if signed out.
      if (!res.ok && res.status !== 401) {
        if (button) button.disabled = false;
        window.alert(`You are still signed in: ${res.data.message || "the shop could not sign you out"}. Try again.`);
        return;
      }
      location.assign("/");
    });
  }
}

const pages = {
  index: indexPage,
  sale: salePage,
  draw: drawProofPage,
  poll: pollPage,
  signin: authPage,
  signup: authPage,
  orders: ordersPage,
  admin: adminPage,
  "admin-orders": adminOrdersPage,
  "admin-poll": adminPollPage,
  "admin-sale": adminSalePage,
};

setUpSignOut();
showLocalTimes(document);
const run = pages[document.body.dataset.page];
if (run) run();
// After the page's code has filled its date fields: the zone is their dates'.
nameTimeZones(document);
