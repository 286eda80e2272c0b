// The console across a network drop (docs/console.md): the browser
// reaches the daemon through a proxy this script runs, and the script
// cuts it (every open connection reset, new ones refused) while another
// client drives the conversation: a reply and a tool run happen unseen.
// When the proxy lets connections through again, the page resumes its
// event stream after the last seq it showed (the request says so) and
// shows every event it missed, once, without a reload.
"use strict";

const assert = require("node:assert/strict");
const net = require("node:net");
const { chromium } = require("playwright-core");

const url = process.env.KEEL_URL;
const token = process.env.KEEL_TOKEN;
const id = process.env.KEEL_CONVERSATION_ID;
const step = (what) => console.log(`- ${what}`);
let current = null;

/** The daemon's API with the token, not through the proxy. */
async function daemon(method, path, body) {
  const response = await fetch(url + path, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = await response.json().catch(() => null);
  assert.ok(response.ok, `${method} ${path}: ${response.status} ${JSON.stringify(answer)}`);
  return answer;
}

/** Waits until the conversation rests after `turns` turns. */
async function restsAfter(turns) {
  for (let i = 0; i < 300; i++) {
    const detail = await daemon("GET", `/v1/conversations/${encodeURIComponent(id)}`);
    if (detail.state === "idle" && detail.turn >= turns) return detail;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`the conversation did not rest after turn ${turns}`);
}

/** Waits until the page has shown the log up to seq `last`. */
async function shows(page, last, timeout = 30000) {
  try {
    await page.waitForFunction((last) => Number(document.querySelector("#messages").dataset.shownSeq) === last, last, { timeout });
  } catch (error) {
    const shown = await page.evaluate(() => document.querySelector("#messages").dataset.shownSeq);
    throw new Error(`the page shows the log up to seq ${shown}, not ${last}: ${error.message}`);
  }
}

/** A TCP proxy to the daemon that can be cut; it notes each event stream's request. */
async function startProxy() {
  const target = new URL(url);
  const open = new Set();
  const streams = [];
  const proxy = { cut: false, streams };
  const server = net.createServer((client) => {
    if (proxy.cut) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(Number(target.port), target.hostname);
    open.add(client);
    open.add(upstream);
    // Each request for an event stream that passes (a connection may
    // carry several requests; a request's head comes in one piece here).
    client.on("data", (chunk) => {
      for (const request of chunk.toString("latin1").matchAll(/^(GET \S*\/events\S* HTTP\/1\.1)\r\n([\s\S]*?)\r\n\r\n/gm)) {
        const resumed = /^last-event-id: *(\d+)/im.exec(request[2]);
        streams.push({ line: request[1], lastEventId: resumed ? Number(resumed[1]) : null });
      }
    });
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
      open.delete(upstream);
    };
    for (const socket of [client, upstream]) {
      socket.on("error", end);
      socket.on("close", end);
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  proxy.url = `http://127.0.0.1:${server.address().port}`;
  proxy.drop = () => {
    proxy.cut = true;
    for (const socket of open) socket.resetAndDestroy();
  };
  proxy.close = () => server.close();
  return proxy;
}

(async () => {
  const proxy = await startProxy();
  const browser = await chromium.launch({ executablePath: process.env.KEEL_CHROMIUM, args: ["--no-sandbox"] });
  const page = await browser.newPage();
  current = page;
  const problems = [];
  page.on("pageerror", (error) => problems.push(`page error: ${error}`));

  step("signing in through the proxy, a first turn");
  await page.goto(`${proxy.url}/#/sign-in`);
  await page.waitForSelector("#sign-in");
  await page.fill("#token", token);
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#conversations");
  await page.goto(`${proxy.url}/#/c/${encodeURIComponent(id)}`);
  await page.waitForSelector("#send");
  await page.fill("#message", "before the drop");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll("#messages .message.assistant:not(.streaming)").length === 1);
  const before = await restsAfter(1);
  await shows(page, before.last_seq);

  step("the network drops; another client drives the conversation");
  proxy.drop();
  await page.waitForSelector("#connection", { state: "visible" });
  await daemon("POST", `/v1/conversations/${encodeURIComponent(id)}/messages`, { text: "during the drop" });
  await restsAfter(2);
  await daemon("POST", `/v1/conversations/${encodeURIComponent(id)}/messages`, { text: "run: echo printed-during-the-drop" });
  const after = await restsAfter(3);

  step("the network is back: the page catches up, once");
  proxy.cut = false;
  await page.waitForSelector("#connection", { state: "hidden", timeout: 30000 });
  await shows(page, after.last_seq);
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#messages .tool .output")).some((n) => n.textContent.includes("printed-during-the-drop")));
  const log = await daemon("GET", `/v1/conversations/${encodeURIComponent(id)}/log?from=0&limit=1000`);
  const shownOnce = ["user_message", "assistant_message"];
  const expected = log.events.filter((event) => shownOnce.includes(event.type)).map((event) => event.seq);
  const shown = await page.$$eval("#messages .message[data-seq]", (nodes) => nodes.map((n) => Number(n.dataset.seq)));
  assert.deepEqual(shown, expected, "every message of the log, once, in order");
  const users = await page.$$eval("#messages .message.user .text", (nodes) => nodes.map((n) => n.textContent));
  assert.deepEqual(users, ["before the drop", "during the drop", "run: echo printed-during-the-drop"]);
  // The stream was resumed after the last seq shown, not read again from the start.
  const resumed = proxy.streams.slice(1);
  assert.ok(resumed.length >= 1, JSON.stringify(proxy.streams));
  const first = resumed[0];
  const fromQuery = /[?&]from=(\d+)/.exec(first.line);
  const resumedAfter = first.lastEventId ?? (fromQuery ? Number(fromQuery[1]) - 1 : 0);
  assert.equal(resumedAfter, before.last_seq, `the page had shown seq ${before.last_seq}: ${JSON.stringify(proxy.streams)}`);

  step("and the page still takes changes");
  await page.fill("#message", "after the drop");
  await page.click("#send");
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#messages .message.assistant")).some((n) => n.textContent.includes("after the drop")), null, { timeout: 15000 });
  assert.deepEqual(problems, []);
  await browser.close();
  proxy.close();
  console.log("ok");
  process.exit(0);
})().catch(async (error) => {
  console.error(error);
  if (current) {
    const shown = await current.evaluate(() => document.querySelector("main")?.innerText || "").catch(() => "");
    console.error(`the page showed:\n${shown.slice(-4000)}`);
  }
  process.exit(1);
});
