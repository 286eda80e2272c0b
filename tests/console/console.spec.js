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
const mockUrl = process.env.KEEL_MOCK_URL;
const step = (what) => console.log(`- ${what}`);
// The page under test, to show what it held when a step failed.
let current = null;

async function waitForText(page, selector, text, timeout = 15000) {
  await page.waitForFunction(
    ([selector, text]) => Array.from(document.querySelectorAll(selector)).some((n) => n.textContent.includes(text)),
    [selector, text],
    { timeout });
}

async function waitForState(page, wanted, timeout = 15000) {
  await page.waitForFunction((wanted) => document.querySelector("#state .state")?.dataset.state === wanted, wanted, { timeout });
}

/** The daemon's API with the token, as another client would call it. */
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

/** The texts of the page's assistant messages. */
async function answers(page) {
  return page.$$eval("#messages .message.assistant:not(.streaming) .text", (nodes) => nodes.map((n) => n.textContent));
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.KEEL_CHROMIUM,
    args: ["--no-sandbox"],
  });
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await context.newPage();
  current = page;
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
  // A tool's output, and the answer quoting it, the same.
  await page.fill("#message", "run: echo '<img src=x onerror=alert(3)><script>alert(4)</script>'");
  await page.click("#send");
  await waitForText(page, "#messages .tool .output", "<img src=x onerror=alert(3)><script>alert(4)</script>");
  await waitForText(page, "#messages .message.assistant", "The command printed");
  await waitForState(page, "idle");
  assert.equal(await page.$$eval("#messages img, #messages script", (nodes) => nodes.length), 0, "no <img> or <script> element");

  step("a model's markdown is rendered, and only as harmless elements");
  await page.fill("#message", "# A title\n\n**bold** and `code`\n\n- one\n- two\n\n[a site](https://example.com/) [a trap](javascript:alert(2))");
  await page.click("#send");
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#messages .message.assistant:not(.streaming)")).at(-1)?.textContent.includes("A title"));
  const rendered = await page.evaluate(() => {
    const node = Array.from(document.querySelectorAll("#messages .message.assistant:not(.streaming) .markdown")).at(-1);
    return {
      h1: node.querySelector("h1")?.textContent,
      strong: node.querySelector("strong")?.textContent,
      code: node.querySelector("code")?.textContent,
      items: node.querySelectorAll("li").length,
      links: Array.from(node.querySelectorAll("a")).map((a) => [a.getAttribute("href"), a.getAttribute("rel")]),
      text: node.textContent,
    };
  });
  assert.equal(rendered.h1, "A title");
  assert.equal(rendered.strong, "bold");
  assert.equal(rendered.code, "code");
  assert.equal(rendered.items, 2);
  assert.deepEqual(rendered.links, [["https://example.com/", "noopener noreferrer"]], "no javascript: link");
  assert.ok(rendered.text.includes("[a trap](javascript:alert(2))"), rendered.text);

  step("a failed request retried, as it happens");
  const scripted = await fetch(`${mockUrl}/_mock/script`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify([{ status: 500 }]),
  });
  assert.ok(scripted.ok);
  await page.fill("#message", "answered after a retry");
  await page.click("#send");
  await waitForText(page, "#messages .note.retrying", "retry 1 of");
  await waitForText(page, "#messages .message.assistant", "answered after a retry");
  await waitForState(page, "idle");

  step("a fallback shown as it happens, and who answered");
  const primaryFails = await daemon("POST", "/v1/conversations", {
    fallback: { provider: "anthropic", model: "claude-fallback" },
    retry: { max_retries: 0 },
  });
  await page.goto(`${url}/#/c/${encodeURIComponent(primaryFails.id)}`);
  await page.waitForSelector("#send");
  assert.ok((await fetch(`${mockUrl}/_mock/script`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify([{ status: 500 }]),
  })).ok);
  await page.fill("#message", "answered by the fallback");
  await page.click("#send");
  await waitForText(page, "#messages .note.fallback", "→ anthropic/claude-fallback");
  await waitForText(page, "#messages .message.assistant .who", "anthropic/claude-fallback");
  await waitForText(page, "#messages .message.assistant", "answered by the fallback");
  await waitForState(page, "idle");
  await page.goto(`${url}/#/c/${encodeURIComponent(id)}`);
  await page.waitForSelector("#send");
  await page.waitForFunction(() => document.querySelectorAll("#messages .message.assistant").length >= 4);

  step("a compaction shown as it is recorded");
  await daemon("POST", `/v1/conversations/${encodeURIComponent(id)}/compact`);
  await waitForText(page, "#messages .note.compacted", "replaced by a summary");
  await waitForState(page, "idle");

  step("sub-agents nested under their parent's call");
  await page.fill("#message", "spawn: alpha task | beta task");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll("#messages .tool[data-name=spawn_agents] .child").length === 2, null, { timeout: 15000 });
  await waitForText(page, "#messages .tool[data-name=spawn_agents] .output", "2 of 2 sub-agents completed");
  await waitForState(page, "idle");
  await page.click("#messages .tool[data-name=spawn_agents] .child[data-task=\"0\"] summary");
  assert.deepEqual(await page.$$eval("#messages .tool[data-name=spawn_agents] .child", (rows) => rows.map((row) => row.dataset.task)), ["0", "1"]);
  await waitForText(page, "#messages .child .child-view .message.user", "alpha task");
  await waitForText(page, "#messages .child .child-view .tool", "submit_result");
  if (shots) await page.screenshot({ path: `${shots}/console-sub-agents.png`, fullPage: true });

  step("a long tool run cancelled");
  await page.fill("#message", "run: sleep 30");
  await page.click("#send");
  await waitForState(page, "executing_tools");
  await page.click("#cancel");
  await waitForState(page, "idle");

  step("the log");
  await page.click("text=log");
  await page.waitForSelector("#log tbody tr");
  const kinds = await page.$$eval("#log tbody tr td:nth-child(3)", (cells) => cells.map((c) => c.textContent));
  assert.ok(kinds.includes("user_message") && kinds.includes("tool_result"), kinds.join(", "));
  await page.click("#log tbody tr:first-child summary");
  await waitForText(page, "#log tbody tr:first-child pre", '"seq": 1');
  // Followed: an event appended after the page opened shows up.
  const lastSeq = await page.$$eval("#log tbody tr", (rows) => Number(rows[rows.length - 1].dataset.seq));
  await page.check("#follow");
  await daemon("POST", `/v1/conversations/${encodeURIComponent(id)}/messages`, { text: "seen in the followed log" });
  await page.waitForSelector(`#log tbody tr[data-seq="${lastSeq + 1}"]`);
  await page.waitForFunction((last) => Array.from(document.querySelectorAll("#log tbody tr"))
    .some((row) => Number(row.dataset.seq) > last && row.children[2].textContent === "turn_completed"), lastSeq);
  const seqs = await page.$$eval("#log tbody tr", (rows) => rows.map((r) => Number(r.dataset.seq)));
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1), "every seq once, in order");
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

  step("a new conversation with its settings, an image sent");
  await page.goto(`${url}/#/new`);
  await page.waitForSelector("#new-conversation");
  await page.selectOption("#busy-policy", "queue");
  await page.selectOption("#tool-policies .tool-policy", "approve");
  await page.click("#new-conversation button[type=submit]");
  await page.waitForSelector("#send");
  const configured = decodeURIComponent(page.url().split("#/c/")[1]);
  const detail = await daemon("GET", `/v1/conversations/${encodeURIComponent(configured)}`);
  assert.equal(detail.busy_policy, "queue");
  const png = await page.evaluate(() => {
    const canvas = document.createElement("canvas");
    canvas.width = 24;
    canvas.height = 16;
    const context = canvas.getContext("2d");
    context.fillStyle = "#1f5fbf";
    context.fillRect(0, 0, 24, 16);
    return canvas.toDataURL("image/png").split(",")[1];
  });
  await page.setInputFiles("#images", { name: "square.png", mimeType: "image/png", buffer: Buffer.from(png, "base64") });
  await page.fill("#message", "what is in this picture?");
  await page.click("#send");
  await page.waitForFunction(() => {
    const image = document.querySelector("#messages .message.user img.attached");
    return image && image.complete && image.naturalWidth === 24 && image.naturalHeight === 16;
  }, null, { timeout: 15000 });
  await waitForText(page, "#messages .message.assistant", "what is in this picture?");
  await page.fill("#message", "run: echo denied-in-the-browser");
  await page.click("#send");
  await page.waitForSelector("#pending .pending button.danger", { timeout: 15000 });
  await page.click("#pending .pending button.danger");
  await waitForText(page, "#messages .note.resolved", "deny");
  await waitForText(page, "#messages .note.resolved", "by console");

  step("the list: paging and filter");
  for (let i = 0; i < 55; i++) await daemon("POST", "/v1/conversations", {});
  const total = (await daemon("GET", "/v1/conversations?limit=1000")).conversations.length;
  assert.ok(total > 55, `${total}`);
  await page.goto(`${url}/#/`);
  await page.waitForSelector("#conversations tbody tr");
  assert.equal(await page.$$eval("#conversations tbody tr", (rows) => rows.length), 50);
  assert.equal(await page.isVisible("#more"), true);
  await page.click("#more");
  await page.waitForFunction((total) => document.querySelectorAll("#conversations tbody tr").length === Math.min(total, 100), total);
  await page.fill("#filter", configured);
  await page.waitForFunction(() => document.querySelectorAll("#conversations tbody tr").length === 1);
  assert.equal(await page.getAttribute("#conversations tbody tr", "data-id"), configured);

  step("health: providers, turns and errors from the metrics");
  await page.goto(`${url}/#/health`);
  await page.waitForSelector("#providers tr[data-provider=anthropic]");
  const okCell = await page.textContent("#providers tr[data-provider=anthropic] td:nth-child(2)");
  assert.ok(Number(okCell) >= 5, `ok requests: ${okCell}`);
  const retried = await page.textContent("#providers tr[data-provider=anthropic] td:nth-child(3)");
  assert.ok(Number(retried) >= 1, `retried: ${retried}`);
  const fellBack = await page.textContent("#providers tr[data-provider=anthropic] td:nth-child(4)");
  assert.ok(Number(fellBack) >= 1, `fallback: ${fellBack}`);
  await waitForText(page, "#turns", "latency p50");
  const completed = await page.$eval("#turns tr:first-child td", (cell) => Number(cell.textContent));
  assert.ok(completed >= 5, `completed turns: ${completed}`);
  if (shots) await page.screenshot({ path: `${shots}/console-health.png`, fullPage: true });
  // The page's reading of Prometheus' text: labels with escapes, and a
  // quantile as the bucket it falls in.
  const reading = await page.evaluate(async () => {
    const { parseMetrics, quantile } = await import("/console/pages.js");
    const samples = parseMetrics([
      "# TYPE x histogram",
      'x_bucket{le="0.5"} 3',
      'x_bucket{le="1"} 9',
      'x_bucket{le="+Inf"} 10',
      'y{path="/a \\"b\\"",status="500"} 2',
    ].join("\n"));
    const buckets = samples.filter((s) => s.name === "x_bucket")
      .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), count: s.value }));
    return {
      labels: samples.find((s) => s.name === "y").labels,
      p25: quantile(0.25, buckets),
      p50: quantile(0.5, buckets),
      p99: quantile(0.99, buckets),
      none: quantile(0.5, []),
    };
  });
  assert.deepEqual(reading, {
    labels: { path: '/a "b"', status: "500" },
    p25: { upTo: 0.5 },
    p50: { upTo: 1 },
    p99: { over: 1 },
    none: null,
  });

  step("a question answered in the page");
  await page.goto(`${url}/#/c/${encodeURIComponent(gated)}`);
  await page.waitForSelector("#send");
  await page.fill("#message", 'call: ask_user {"question": "which colour?"}');
  await page.click("#send");
  await page.waitForSelector("#pending .pending input.answer", { timeout: 15000 });
  await waitForText(page, "#pending .pending", "which colour?");
  await page.fill("#pending .pending input.answer", "blue");
  await page.click("#pending .pending button.primary");
  await waitForText(page, "#messages .note.resolved", "answer");
  await waitForText(page, "#messages .note.resolved", "by console: blue");
  await waitForState(page, "idle");

  step("a sub-agent's gated call approved through its parent");
  await page.fill("#message", "spawn: run: echo from-the-child");
  await page.click("#send");
  await waitForText(page, "#pending .pending", "sub-agent c-", 15000);
  await page.click("#pending .pending button.primary");
  await waitForText(page, "#messages .tool[data-name=spawn_agents] .output", "1 of 1 sub-agent completed");
  await page.click("#messages .tool[data-name=spawn_agents] .child[data-task=\"0\"] summary");
  await waitForText(page, "#messages .child .child-view .tool .output", "from-the-child");
  await waitForState(page, "idle");

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
})().catch(async (error) => {
  console.error(error);
  if (current) {
    const shown = await current.evaluate(() => document.querySelector("main")?.innerText || "").catch(() => "");
    console.error(`the page showed:\n${shown.slice(-4000)}`);
  }
  process.exit(1);
});
