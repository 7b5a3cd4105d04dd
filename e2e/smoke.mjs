// Browser smoke run of the Stampede pages against a running, seeded server, with
// the system's Chromium (never a downloaded one). CI runs it through scripts/browser-test; by hand, run it
// through scripts/e2e, which explains the settings.
//
// What it does:
// - alice signs in, opens the live demo sale and presses Buy, which must place her
//   order (only a re-run against a server she already bought on, E2E_RERUN=1 as
//   scripts/e2e sets it, may meet "already bought"; scripts/browser-test seeds a
//   fresh database, where the buy is mandatory);
// - a fresh shopper signs up (which signs in), buys, and waits for "confirmed";
// - the admin creates a sale through the form (first with a bad window, to see the
//   form's message), alice watches its countdown, the admin opens it and alice's Buy
//   button comes alive without a reload, the admin closes it again;
// - the admin creates a poll through the form (first with two equal options, to
//   see the field's message in plain words; adding and removing option rows on
//   the way); alice
//   votes, her results bar and an anonymous viewer's bars update, the admin's
//   table counts the voter; bob's page still offers Vote when the admin closes the
//   poll, and his vote gets "closed";
// - a failed sign-in, a 404 page, the 403 of /admin for alice, phone-sized sale
//   and poll pages, and signing out.
// Each run leaves one closed sale named "E2E smoke ...", one closed poll "E2E
// poll ..." and one user "e2e-..." behind. A browser console error (a CSP violation, say) fails the run.
// Screenshots go to E2E_OUT.

import { accounts, base, check, launchChromium, newContextPage, out, problems, screenshot, finish } from "./lib.mjs";
import { mkdir } from "node:fs/promises";
import { randomBytes } from "node:crypto";

const { demoPassword, adminUser, adminPassword } = accounts();
const runId = randomBytes(4).toString("hex");
const rerun = process.env.E2E_RERUN === "1";

await mkdir(out, { recursive: true });
const browser = await launchChromium();

const newPage = (viewport = { width: 1280, height: 860 }) => newContextPage(browser, viewport);
const shot = (page, name) => screenshot(page, `${out}/${name}.png`);

async function signIn(page, username, password) {
  await page.goto(`${base}/signin`);
  await page.getByLabel("Username").fill(username);
  await page.getByLabel("Password").fill(password);
  await Promise.all([
    page.waitForURL(`${base}/`),
    page.getByRole("button", { name: "Sign in" }).click(),
  ]);
  check(await page.getByText(`Signed in as ${username}`).isVisible(), `${username} is signed in`);
}

async function liveSaleId() {
  const resp = await fetch(`${base}/api/sales`);
  const sales = await resp.json();
  const live = sales.find((s) => s.status === "live" && s.stock_left > 0 && !s.name.startsWith("E2E smoke"));
  return live && live.id;
}

/** Presses Buy and waits for the answer; returns the outcome text. */
async function buy(page) {
  const button = page.getByRole("button", { name: "Buy now" });
  await button.waitFor({ timeout: 5000 });
  check(await button.isEnabled(), "Buy is enabled on a live sale when signed in");
  await button.click();
  const outcome = page.locator('[data-field="outcome"]');
  await outcome.filter({ hasText: /Order placed|already bought|Sold out|Too many/ }).waitFor({ timeout: 5000 });
  return outcome.innerText();
}

/** A datetime-local value `minutes` from now, in the page's own time zone. */
function localInput(page, minutes) {
  return page.evaluate((m) => {
    const d = new Date(Date.now() + m * 60000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }, minutes);
}

try {
  const live = await liveSaleId();
  // Without it there is nothing to buy: the run stops here, failed.
  if (!live) throw new Error("no live sale with stock (run `stampede seed-demo`): the buy cannot run");
  check(true, `a live sale with stock exists (${live})`);

  // The list, signed out and signed in as alice.
  const alice = await newPage();
  await alice.goto(`${base}/`);
  check((await alice.locator(".sale-card").count()) > 0, "home lists sales");
  await shot(alice, "home-anonymous");
  await alice.goto(`${base}/signin`);
  await alice.getByLabel("Username").fill("alice");
  await alice.getByLabel("Password").fill("not-her-password");
  await alice.getByRole("button", { name: "Sign in" }).click();
  await alice.getByText("wrong username or password").waitFor({ timeout: 5000 });
  check(true, "a failed sign-in shows the API's message");
  await shot(alice, "signin-error");
  await signIn(alice, "alice", demoPassword);
  await shot(alice, "home");

  {
    await alice.goto(`${base}/sales/${live}`);
    await alice.locator(".buy-box").waitFor();
    await shot(alice, "sale-before-buy");
    if (await alice.getByRole("button", { name: "Purchased" }).isVisible()) {
      // Only a re-run may find her order there already; a fresh run must buy.
      check(rerun, `alice already bought here (Buy shows Purchased)${rerun ? ": a re-run" : " on a fresh run: the buy did not happen"}`);
    } else {
      const text = await buy(alice);
      const placed = rerun ? /Order placed|already bought/ : /Order placed/;
      check(placed.test(text), `alice's purchase placed: ${text.split("\n")[0]}`);
    }
    await alice.getByText(rerun ? /Order confirmed|already bought/ : /Order confirmed/).waitFor({ timeout: 20000 });
    await shot(alice, "sale-after-buy-alice");

    // A fresh shopper: sign up (which signs in), then buy and wait for confirmation.
    const shopper = await newPage();
    const name = `e2e-${runId}`;
    await shopper.goto(`${base}/signup?next=${encodeURIComponent(`/sales/${live}`)}`);
    await shopper.getByLabel("Username").fill(name);
    await shopper.getByLabel("Password").fill(demoPassword);
    await Promise.all([
      shopper.waitForURL(`${base}/sales/${live}`),
      shopper.getByRole("button", { name: "Sign up" }).click(),
    ]);
    check(await shopper.getByText(`Signed in as ${name}`).isVisible(), "sign-up signs in and returns to the sale");
    const text = await buy(shopper);
    check(/Order placed/.test(text), `new shopper's purchase placed: ${text.split("\n")[0]}`);
    await shopper.getByText("Order confirmed").waitFor({ timeout: 20000 });
    check(true, "order confirmed after settlement");
    await shot(shopper, "sale-after-buy");
    // The demo sale has a payment window: the link says where to pay.
    await shopper.getByRole("link", { name: /^(See|Go to) my orders$/i }).click();
    await shopper.locator("table tbody tr td a").first().waitFor();
    await shot(shopper, "my-orders");

    // The same page on a phone, signed out.
    const phone = await newPage({ width: 390, height: 844 });
    await phone.goto(`${base}/sales/${live}`);
    await phone.locator(".buy-box").waitFor();
    check(await phone.getByRole("link", { name: "Sign in to buy" }).isVisible(), "signed out, the sale offers Sign in to buy");
    await shot(phone, "sale-phone");
  }

  await alice.goto(`${base}/sales/not-a-number`);
  check(await alice.getByRole("heading", { name: "Page not found" }).isVisible(), "bad sale id shows the 404 page");
  await shot(alice, "not-found");
  await alice.goto(`${base}/admin`);
  check(await alice.getByRole("heading", { name: "Not allowed" }).isVisible(), "admin page refuses alice");

  // The admin creates an upcoming sale through the form.
  const admin = await newPage({ width: 1360, height: 900 });
  await signIn(admin, adminUser, adminPassword);
  await admin.goto(`${base}/admin`);
  check(await admin.getByRole("heading", { name: "Admin", exact: true }).isVisible(), "admin page opens for the admin");
  const saleName = `E2E smoke ${runId}`;
  // The form waits behind its button.
  check(!(await admin.getByLabel("Name", { exact: true }).isVisible()), "the new-sale form is closed at first");
  await admin.getByText("New sale", { exact: true }).click();
  await admin.getByLabel("Name", { exact: true }).fill(saleName);
  await admin.getByLabel("Description", { exact: true }).fill("Made by scripts/e2e, and closed again.");
  await admin.getByLabel("Price", { exact: true }).fill("19.99");
  await admin.getByLabel("Stock", { exact: true }).fill("5");
  await admin.getByLabel(/^Opens \(your local time, GMT\+[12]\)$/).fill(await localInput(admin, 120));
  await admin.getByLabel(/^Ends \(your local time, GMT\+[12]\)$/).fill(await localInput(admin, 60));
  await admin.getByRole("button", { name: "Create sale" }).click();
  await admin.getByText("The sale must end after it opens.").waitFor({ timeout: 5000 });
  check(true, "a bad window is explained under the end field");
  await admin.getByLabel(/^Opens \(your local time, GMT\+[12]\)$/).fill(await localInput(admin, 90));
  await admin.getByLabel(/^Ends \(your local time, GMT\+[12]\)$/).fill(await localInput(admin, 600));
  await admin.getByRole("button", { name: "Create sale" }).click();
  await admin.getByText(`Created “${saleName}”`).waitFor({ timeout: 5000 });
  const row = admin.locator('[data-field="admin-rows"] tr', { has: admin.getByRole("link", { name: saleName }) });
  await row.waitFor();
  const newId = await row.getAttribute("data-sale-id");
  check((await row.locator('[data-field="badge"]').innerText()) === "Upcoming", "the new sale is upcoming");
  check((await row.locator('[data-field="price"]').innerText()) === "$19.99", "price 19.99 became $19.99");

  // Alice watches the countdown; the admin opens the sale; her Buy comes alive.
  await alice.goto(`${base}/sales/${newId}`);
  const countdown = alice.locator('[data-field="countdown-time"]');
  await countdown.waitFor();
  const first = await countdown.innerText();
  // The next tick, whenever it comes (the page renders four times a second).
  await alice.waitForFunction(([el, was]) => el.textContent !== was, [await countdown.elementHandle(), first], { timeout: 3000 });
  const second = await countdown.innerText();
  check(first !== second && /^01:2\d:\d\d$/.test(second), `countdown ticks from 1h30 (${first} -> ${second})`);
  check(await alice.getByRole("button", { name: "Not open yet" }).isDisabled(), "Buy is disabled before the start");
  await shot(alice, "sale-upcoming");

  await row.getByRole("button", { name: "Open now" }).click();
  await admin.getByText(`“${saleName}” is open.`).waitFor({ timeout: 5000 });
  await alice.getByRole("button", { name: "Buy now" }).waitFor({ timeout: 5000 });
  check(await alice.getByRole("button", { name: "Buy now" }).isEnabled(), "Buy comes alive without a reload once opened");

  // One admin stock action through the API with the CSRF header.
  await row.locator('[data-field="units"]').fill("3");
  await row.getByRole("button", { name: "Top up" }).click();
  await admin.getByText(`Added 3 to “${saleName}”.`).waitFor({ timeout: 5000 });
  check((await row.locator('[data-field="stock-left"]').innerText()) === "8", "top-up 5 + 3 = 8 left");
  await shot(admin, "admin");

  await row.getByRole("button", { name: "Close" }).click();
  await admin.getByText(`“${saleName}” is closed.`).waitFor({ timeout: 5000 });
  await alice.getByRole("button", { name: "Sale closed" }).waitFor({ timeout: 5000 });
  check(true, "closing shows on the shopper's page without a reload");

  // ---- polls ----
  // The admin creates a poll: two equal options first, to see the field's message
  // in plain words (no API wording), which clears once the option is fixed.
  const question = `E2E poll ${runId}: which colour?`;
  await admin.goto(`${base}/admin`);
  await admin.getByText("New poll", { exact: true }).click();
  await admin.getByLabel("Question", { exact: true }).fill(question);
  await admin.getByLabel("Option 1", { exact: true }).fill("Red");
  await admin.getByLabel("Option 2", { exact: true }).fill("red");
  check(await admin.getByRole("button", { name: "Remove option 1" }).isDisabled(), "two options cannot be removed");
  await admin.getByRole("button", { name: "Create poll" }).click();
  const optionsError = admin.locator("#poll-options-error");
  await optionsError.filter({ hasText: "“red” is listed more than once: make each option different." }).waitFor({ timeout: 5000 });
  check(!/distinct|must be/.test(await optionsError.innerText()), "the repeated option is said in plain words, without the API's wording");
  check((await admin.getByLabel("Option 2", { exact: true }).getAttribute("aria-invalid")) === "true", "the repeated option is marked");
  await admin.getByLabel("Option 2", { exact: true }).fill("Green");
  check((await optionsError.innerText()) === "", "the options' message clears once fixed");
  for (const [n, label] of [
    [3, "Blue"],
    [4, "Mauve"],
  ]) {
    await admin.getByRole("button", { name: "Add option" }).click();
    check(await admin.getByLabel(`Option ${n}`, { exact: true }).evaluate((el) => el === document.activeElement), `a new option ${n} takes the focus`);
    await admin.getByLabel(`Option ${n}`, { exact: true }).fill(label);
  }
  await admin.getByRole("button", { name: "Remove option 4" }).click();
  check((await admin.locator('[data-field="option-list"] input').count()) === 3, "removing an option leaves three");
  await admin.getByRole("button", { name: "Create poll" }).click();
  await admin.getByText(`Created poll “${question}”`).waitFor({ timeout: 5000 });
  const pollRow = admin.locator("tr", { has: admin.getByRole("link", { name: question }) });
  await pollRow.waitFor();
  const pollId = await pollRow.getAttribute("data-poll-id");
  check((await pollRow.locator('[data-field="badge"]').innerText()) === "Open", "the new poll opens at once");
  check((await pollRow.locator('[data-field="voters"]').innerText()) === "0", "no voters yet");
  check((await admin.locator('[data-field="option-list"] input').count()) === 2, "the form is reset to two options");

  // The list, through the header's Polls link.
  await alice.goto(`${base}/`);
  await Promise.all([alice.waitForURL(`${base}/polls`), alice.getByRole("link", { name: "Polls", exact: true }).click()]);
  check(await alice.getByRole("link", { name: question }).isVisible(), "the header's Polls link lists the new poll");
  await shot(alice, "polls");

  // An anonymous viewer watches; bob keeps the page open to vote later.
  const viewer = await newPage();
  await viewer.goto(`${base}/polls/${pollId}`);
  check(await viewer.getByRole("button", { name: "Vote" }).isDisabled(), "Vote is disabled when signed out");
  check(await viewer.getByRole("link", { name: "Sign in" }).last().isVisible(), "a signed-out viewer is offered to sign in");
  const bob = await newPage();
  await signIn(bob, "bob", demoPassword);
  await bob.goto(`${base}/polls/${pollId}`);
  const greenOf = (page) => page.locator(".result", { hasText: "Green" });

  // Alice votes for Green.
  await alice.goto(`${base}/polls/${pollId}`);
  const voteButton = alice.getByRole("button", { name: "Vote" });
  await voteButton.click();
  await alice.getByText("Pick an option first.").waitFor({ timeout: 5000 });
  check(true, "voting without a choice asks for one");
  await alice.getByLabel("Green").check();
  await voteButton.click();
  await alice.getByText("Thanks, your vote counted").waitFor({ timeout: 5000 });
  check(true, "alice's vote counted (202)");
  await greenOf(alice).locator('[data-field="votes"]').filter({ hasText: /^1$/ }).waitFor({ timeout: 5000 });
  check((await greenOf(alice).locator('[data-field="percent"]').innerText()) === "100%", "her bar shows 1 vote, 100%");
  check(await greenOf(alice).getByText("Your vote").isVisible(), "her choice is marked");
  check(await alice.getByRole("button", { name: "Voted" }).isDisabled(), "the button says Voted");
  await shot(alice, "poll-after-vote");

  // The viewer's bars follow without a reload (the poll's event stream pushes the
  // change); so does the admin's table (it asks every 3 s).
  await greenOf(viewer).locator('[data-field="votes"]').filter({ hasText: /^1$/ }).waitFor({ timeout: 6000 });
  check((await viewer.locator('[data-field="voters"]').innerText()) === "1 voter", "the viewer's results update live");
  await pollRow.locator('[data-field="voters"]').filter({ hasText: /^1$/ }).waitFor({ timeout: 8000 });
  check(true, "the admin's table counts the voter");
  // From the top, so the sticky header stays out of the picture.
  await admin.evaluate(() => window.scrollTo(0, 0));
  const sections = await admin.evaluate(() => {
    const form = document.querySelector('form[data-form="create-poll"]').closest("section");
    const table = document.getElementById("polls-heading").closest("section");
    const a = form.getBoundingClientRect();
    const b = table.getBoundingClientRect();
    return { x: a.x + scrollX - 8, y: a.y + scrollY - 8, width: a.width + 16, height: b.bottom - a.top + 16 };
  });
  await admin.screenshot({ path: `${out}/admin-polls.png`, fullPage: true, clip: sections });
  console.log(`     screenshot ${out}/admin-polls.png`);

  // A reload knows she voted.
  await alice.reload();
  await alice.getByText("You already voted in this poll: “Green”.").waitFor({ timeout: 5000 });
  check(await alice.getByLabel("Green").isChecked(), "after a reload her choice stays checked");

  // The admin closes the poll; bob, whose page still offers Vote, is told it is closed.
  await pollRow.getByRole("button", { name: "Close" }).click();
  await admin.getByText(`Poll “${question}” is closed.`).waitFor({ timeout: 5000 });
  check((await pollRow.locator('[data-field="badge"]').innerText()) === "Closed", "the row shows Closed");
  // His page learns of the close from its live results (or their poll every 2 s);
  // if it has not yet, his vote is refused as closed. The close can also reach
  // the page between the check below and the click, which then does nothing: a
  // disabled button submits no vote. Either way the page must end up closed.
  if (await bob.getByLabel("Blue").isEnabled()) {
    try {
      await bob.getByLabel("Blue").check({ timeout: 2000 });
      await bob.getByRole("button", { name: "Vote" }).click({ timeout: 2000 });
    } catch {
      check(!(await bob.getByRole("button", { name: /Vote|Poll closed/ }).isEnabled()), "the close disabled the vote while bob was clicking");
    }
    await bob.getByText("This poll is closed.").or(bob.getByText("Closed early")).first().waitFor({ timeout: 5000 });
  }
  await bob.getByText("Closed early").waitFor({ timeout: 5000 });
  check(await bob.getByRole("button", { name: "Poll closed" }).isDisabled(), "after the close bob's page offers no vote and says Closed early");
  await shot(bob, "poll-closed");

  // The same poll on a phone, and a bad poll address.
  const phonePoll = await newPage({ width: 390, height: 844 });
  await phonePoll.goto(`${base}/polls/${pollId}`);
  await phonePoll.locator(".results-box").waitFor();
  await shot(phonePoll, "poll-phone");
  await alice.goto(`${base}/polls/not-a-number`);
  check(await alice.getByRole("heading", { name: "Page not found" }).isVisible(), "bad poll id shows the 404 page");

  await Promise.all([alice.waitForURL(`${base}/`), alice.getByRole("button", { name: "Sign out" }).click()]);
  check(await alice.getByRole("link", { name: "Sign in" }).isVisible(), "sign out signs out");
} catch (err) {
  problems.push(`aborted: ${err.message}`);
}
await finish(browser, "smoke");
