// The web console in a real browser (docs/console.md): Playwright driving
// Chromium against a daemon the Rust test started (tests/e2e/daemon/console.rs),
// which passes it the daemon's address and token, a conversation whose
// `bash` calls wait for approval, and where to put screenshots.
"use strict";

const assert = require("node:assert/strict");
const { chromium } = require("playwright-core");

const url = process.env.KEEL_URL;
const token = process.env.KEEL_TOKEN;
const gated = process.env.KEEL_GATED_ID;
const shots = process.env.KEEL_SCREENSHOTS;
const step = (what) => console.log(`- ${what}`);

async function waitForText(page, selector, text, timeout = 15000) {
  await page.waitForFunction(
    ([selector, text]) => Array.from(document.querySelectorAll(selector)).some((n) => n.textContent.includes(text)),
    [selector, text],
    { timeout });
}

async function state(page) {
  return page.getAttribute("#state .state", "data-state");
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.KEEL_CHROMIUM,
    args: ["--no-sandbox"],
  });
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await context.newPage();
  const problems = [];
  page.on("pageerror", (error) => problems.push(`page error: ${error}`));
  // A model's answer must never run as script.
  page.on("dialog", async (dialog) => {
    if (dialog.type() === "alert") problems.push(`an alert ran: ${dialog.message()}`);
    await dialog.accept();
  });

  step("signing in");
  await page.goto(url + "/");
  await page.waitForSelector("#sign-in");
  if (shots) await page.screenshot({ path: `${shots}/console-sign-in.png` });
  await page.fill("#token", "not-the-token");
  await page.click("#sign-in button[type=submit]");
  await waitForText(page, "#sign-in .error-box", "not this daemon's token");
  await page.fill("#token", token);
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#conversations");
  assert.equal(await page.evaluate(() => document.cookie), "", "the cookie is HttpOnly");
  assert.ok(!(await page.content()).includes(token), "no token in the page");

  step("a request without the cookie is refused");
  const stranger = await browser.newContext();
  const strangerPage = await stranger.newPage();
  await strangerPage.goto(url + "/");
  const status = await strangerPage.evaluate(async () => (await fetch("/v1/conversations")).status);
  assert.equal(status, 401);
  await stranger.close();

  step("a new conversation, a message streamed");
  await page.click("text=new conversation");
  await page.click("#new-conversation button[type=submit]");
  await page.waitForSelector("#send");
  const id = decodeURIComponent(page.url().split("#/c/")[1]);
  await page.fill("#message", "hello from the console");
  await page.click("#send");
  await waitForText(page, "#messages .message.assistant", "hello from the console");

  step("a model's markup is shown as text");
  await page.fill("#message", "<img src=x onerror=alert(1)>");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll("#messages .message.assistant").length >= 2);
  await waitForText(page, "#messages .message.assistant", "<img src=x onerror=alert(1)>");
  assert.equal(await page.$$eval("#messages img", (nodes) => nodes.length), 0, "no <img> element");

  step("a long tool run cancelled");
  await page.fill("#message", "run: sleep 30");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelector("#state .state")?.dataset.state === "executing_tools");
  await page.click("#cancel");
  await page.waitForFunction(() => document.querySelector("#state .state")?.dataset.state === "idle", null, { timeout: 15000 });

  step("the log");
  await page.click("text=log");
  await page.waitForSelector("#log tbody tr");
  const kinds = await page.$$eval("#log tbody tr td:nth-child(3)", (cells) => cells.map((c) => c.textContent));
  assert.ok(kinds.includes("user_message") && kinds.includes("tool_result"), kinds.join(", "));
  await page.click("#log tbody tr:first-child summary");
  await waitForText(page, "#log tbody tr:first-child pre", '"seq": 1');
  if (shots) await page.screenshot({ path: `${shots}/console-log.png` });

  step("a gated bash call approved in the page");
  await page.goto(`${url}/#/c/${encodeURIComponent(gated)}`);
  await page.waitForSelector("#send");
  await page.fill("#message", "run: echo approved-in-the-browser");
  await page.click("#send");
  await page.waitForSelector("#pending .pending button.primary", { timeout: 15000 });
  if (shots) await page.screenshot({ path: `${shots}/console-approval.png` });
  await page.click("#pending .pending button.primary");
  await waitForText(page, "#messages .tool .output", "approved-in-the-browser");
  await waitForText(page, "#messages .note", "by console");
  await waitForText(page, "#messages .message.assistant", "The command printed");
  assert.equal(await page.$$eval("#pending .pending", (nodes) => nodes.length), 0);
  if (shots) await page.screenshot({ path: `${shots}/console-conversation.png` });

  step("the actors: evict one");
  await page.goto(`${url}/#/actors`);
  await page.waitForSelector(`#actors tr[data-id="${id}"]`);
  if (shots) await page.screenshot({ path: `${shots}/console-actors.png` });
  await page.click(`#actors tr[data-id="${id}"] button.evict`);
  await page.waitForSelector(`#actors tr[data-id="${id}"]`, { state: "detached" });

  step("the conversations, and signing out");
  await page.goto(`${url}/#/`);
  await page.waitForSelector(`#conversations tr[data-id="${id}"]`);
  if (shots) await page.screenshot({ path: `${shots}/console-conversations.png` });
  await page.click("#sign-out");
  await page.waitForSelector("#sign-in");
  const after = await page.evaluate(async () => (await fetch("/v1/conversations")).status);
  assert.equal(after, 401, "signed out");

  assert.deepEqual(problems, []);
  await browser.close();
  console.log("ok");
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
