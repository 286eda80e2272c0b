// The console across a daemon restart (docs/console.md): a conversation's
// page open while its turn runs a tool; the Rust test
// (tests/e2e/daemon/console.rs) kills the daemon when this says READY and
// starts it again on the same address, then says GO; the page, without
// a reload, follows the recovered turn to its end and still takes
// changes (the cookie still signs it in).
"use strict";

const assert = require("node:assert/strict");
const readline = require("node:readline");
const { chromium } = require("playwright-core");

const url = process.env.KEEL_URL;
const token = process.env.KEEL_TOKEN;
const id = process.env.KEEL_CONVERSATION_ID;

function nextLine() {
  const lines = readline.createInterface({ input: process.stdin });
  return new Promise((resolve) => lines.once("line", (line) => { lines.close(); resolve(line); }));
}

(async () => {
  const browser = await chromium.launch({ executablePath: process.env.KEEL_CHROMIUM, args: ["--no-sandbox"] });
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (error) => problems.push(`page error: ${error}`));
  await page.goto(url + "/#/sign-in");
  await page.waitForSelector("#sign-in");
  await page.fill("#token", token);
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#conversations");
  await page.goto(`${url}/#/c/${encodeURIComponent(id)}`);
  await page.waitForSelector("#send");
  await page.fill("#message", "run: sleep 1; echo survived-the-restart");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelector("#state .state")?.dataset.state === "executing_tools");
  console.log("READY");
  assert.equal(await nextLine(), "GO");
  // The recovered turn, on the same page: the call run again, its output,
  // the reply.
  await page.waitForFunction(
    () => Array.from(document.querySelectorAll("#messages .message.assistant")).some((n) => n.textContent.includes("The command printed")),
    null,
    { timeout: 30000 });
  await page.waitForFunction(() => document.querySelector("#state .state")?.dataset.state === "idle");
  // And the page still works: another turn from it.
  await page.fill("#message", "after the restart");
  await page.click("#send");
  await page.waitForFunction(
    () => Array.from(document.querySelectorAll("#messages .message.assistant")).some((n) => n.textContent.includes("after the restart")),
    null,
    { timeout: 15000 });
  assert.deepEqual(problems, []);
  await browser.close();
  console.log("ok");
  // stdin stays open (the test's pipe): leave without waiting for it.
  process.exit(0);
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
