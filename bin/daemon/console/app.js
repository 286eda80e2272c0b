// keel's web console (docs/console.md): plain pages over the daemon's own
// API. Everything a model, a tool or a user wrote is put on the page as
// text (textContent), never as markup. The token lives in an HttpOnly
// cookie this script cannot read; every request that changes something
// carries X-Keel-Console: 1 (the daemon refuses a cookie-authenticated
// change without it).
"use strict";

const main = document.getElementById("main");
const signOutButton = document.getElementById("sign-out");
// What the current page holds open (an event stream), closed on leaving.
let leaving = [];

// --- small helpers -------------------------------------------------------

/** An element with attributes and children; strings become text nodes. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

function show(...nodes) {
  main.replaceChildren(...nodes);
}

function ago(ms) {
  if (!ms) return "";
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

function stateBadge(state) {
  return el("span", { class: `state ${state}`, "data-state": state }, state);
}

class SignInNeeded extends Error {}

/** A request to the daemon's API; its JSON answer, or an Error with the API's message. */
async function api(method, path, body) {
  const headers = { "X-Keel-Console": "1" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) throw new SignInNeeded();
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (!response.ok) {
    const message = json && json.error ? `${json.error.code}: ${json.error.message}` : `${response.status} ${text}`;
    throw new Error(message);
  }
  return json;
}

function errorBox(error) {
  return el("div", { class: "error-box", role: "alert" }, String(error.message || error));
}

async function guarded(work) {
  try {
    await work();
  } catch (error) {
    if (error instanceof SignInNeeded) {
      location.hash = "#/sign-in";
      return;
    }
    main.prepend(errorBox(error));
  }
}

// --- routing -------------------------------------------------------------

async function route() {
  for (const close of leaving) close();
  leaving = [];
  const hash = location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  signOutButton.hidden = parts[0] === "sign-in";
  await guarded(async () => {
    if (parts[0] === "sign-in") return signInPage();
    if (parts.length === 0) return conversationsPage();
    if (parts[0] === "new") return newConversationPage();
    if (parts[0] === "c" && parts[1] && parts[2] === "log") return logPage(parts[1]);
    if (parts[0] === "c" && parts[1]) return conversationPage(parts[1]);
    if (parts[0] === "actors") return actorsPage();
    if (parts[0] === "health") return healthPage();
    show(el("p", {}, "No such page. "), el("a", { href: "#/" }, "Conversations"));
  });
}

window.addEventListener("hashchange", route);
signOutButton.addEventListener("click", async () => {
  await fetch("/console/session", { method: "DELETE", headers: { "X-Keel-Console": "1" }, credentials: "same-origin" });
  location.hash = "#/sign-in";
});

// --- sign in -------------------------------------------------------------

function signInPage() {
  const token = el("input", { type: "password", id: "token", autocomplete: "current-password", placeholder: "token", required: true });
  const problem = el("div", { class: "error-box", role: "alert" });
  const form = el("form", { class: "sign-in", id: "sign-in" },
    el("h1", {}, "Sign in to keel"),
    el("label", { for: "token" }, "The daemon's token (KEEL_TOKEN, or the file token in its data directory):"),
    token,
    el("button", { type: "submit", class: "primary" }, "Sign in"),
    problem);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.textContent = "";
    const response = await fetch("/console/session", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Keel-Console": "1" },
      credentials: "same-origin",
      body: JSON.stringify({ token: token.value }),
    });
    token.value = "";
    if (response.ok) {
      location.hash = "#/";
    } else {
      const answer = await response.json().catch(() => null);
      problem.textContent = answer && answer.error ? answer.error.message : `sign-in failed (${response.status})`;
    }
  });
  show(form);
  token.focus();
}

// --- conversations -------------------------------------------------------

async function conversationsPage() {
  const filter = el("input", { type: "text", id: "filter", placeholder: "filter by id, state or directory" });
  const body = el("tbody");
  const more = el("button", { type: "button", id: "more", hidden: true }, "more");
  let all = [];
  let cursor = null;
  const render = () => {
    const wanted = filter.value.trim().toLowerCase();
    const rows = all
      .filter((c) => !wanted || `${c.id} ${c.state} ${c.cwd}`.toLowerCase().includes(wanted))
      // What waits for a human first, then the latest activity.
      .sort((a, b) => (b.state === "awaiting_input") - (a.state === "awaiting_input") || (b.last_activity_ms || 0) - (a.last_activity_ms || 0));
    body.replaceChildren(...rows.map((c) => el("tr", { "data-id": c.id },
      el("td", {}, el("a", { href: `#/c/${encodeURIComponent(c.id)}`, class: "mono" }, c.id)),
      el("td", {}, stateBadge(c.state)),
      el("td", {}, String(c.turns)),
      el("td", { class: "muted" }, ago(c.last_activity_ms)),
      el("td", { class: "mono" }, c.cwd))));
  };
  const load = async () => {
    const page = await api("GET", `/v1/conversations${cursor ? `?cursor=${encodeURIComponent(cursor)}` : ""}`);
    all = all.concat(page.conversations);
    cursor = page.next_cursor;
    more.hidden = !cursor;
    render();
  };
  filter.addEventListener("input", render);
  more.addEventListener("click", () => guarded(load));
  show(
    el("h1", {}, "Conversations"),
    el("div", { class: "toolbar" }, filter, el("a", { href: "#/new" }, "new conversation")),
    el("table", { id: "conversations" },
      el("thead", {}, el("tr", {}, ["id", "state", "turns", "last activity", "working directory"].map((h) => el("th", {}, h)))),
      body),
    more);
  await load();
}

function newConversationPage() {
  const cwd = el("input", { type: "text", id: "cwd", placeholder: "working directory (absolute; empty: the daemon's)", size: 50 });
  const mode = el("select", { id: "sandbox" },
    el("option", { value: "" }, "sandbox: the daemon's default"),
    ["read-only", "workspace-write", "full-access"].map((m) => el("option", { value: m }, m)));
  const network = el("input", { type: "text", id: "network", placeholder: "network: off, all, or host:port,… (empty: default)", size: 40 });
  const system = el("textarea", { id: "system", placeholder: "system prompt (optional)" });
  const form = el("form", { id: "new-conversation" },
    el("h1", {}, "New conversation"),
    el("div", { class: "toolbar" }, cwd),
    el("div", { class: "toolbar" }, mode, network),
    system,
    el("div", { class: "toolbar" }, el("button", { type: "submit", class: "primary" }, "Create")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(async () => {
      const request = {};
      if (cwd.value.trim()) request.cwd = cwd.value.trim();
      if (system.value.trim()) request.system = system.value;
      const sandbox = {};
      if (mode.value) sandbox.mode = mode.value;
      const net = network.value.trim();
      if (net) sandbox.network = net === "off" || net === "all" ? net : net.split(",").map((s) => s.trim()).filter(Boolean);
      if (Object.keys(sandbox).length) request.sandbox = sandbox;
      const created = await api("POST", "/v1/conversations", request);
      location.hash = `#/c/${encodeURIComponent(created.id)}`;
    });
  });
  show(form);
}

// --- one conversation, live ----------------------------------------------

function messageText(content) {
  return (content || []).filter((b) => b.type === "text").map((b) => b.text).join("");
}

async function conversationPage(id) {
  const state = el("span", { id: "state" });
  const messages = el("div", { id: "messages" });
  const pending = el("div", { id: "pending" });
  const problem = el("div", { id: "problem" });
  const text = el("textarea", { id: "message", placeholder: "message (Ctrl-Enter sends)" });
  const files = el("input", { type: "file", id: "images", accept: "image/png,image/jpeg,image/gif,image/webp", multiple: true });
  const header = el("div", { class: "muted", id: "details" });
  // Tool calls on the page, by id: their box, to fill with output.
  const tools = new Map();
  // The reply streaming now, by generation.
  let streaming = null;

  const toolBox = (call) => {
    const output = el("pre", { class: "output" });
    const box = el("div", { class: "tool", "data-call": call.id },
      el("div", { class: "mono" }, `${call.name} `, el("span", { class: "muted" }, JSON.stringify(call.input))),
      output);
    tools.set(call.id, { box, output, streamed: false });
    return box;
  };
  const addMessage = (role, blocks, extra) => {
    const node = el("div", { class: `message ${role}` }, el("div", { class: "who" }, role, extra ? ` · ${extra}` : ""));
    for (const block of blocks) {
      if (block.type === "text") node.append(el("div", { class: "text" }, block.text));
      else if (block.type === "tool_use") node.append(toolBox(block));
      else if (block.type === "tool_result") setResult(block.tool_call_id, block.content, block.is_error);
      else if (block.type === "image") node.append(el("div", { class: "note" }, "[image]"));
    }
    if (node.childNodes.length > 1) messages.append(node);
    return node;
  };
  const setResult = (callId, content, isError) => {
    const tool = tools.get(callId);
    const shown = typeof content === "string" ? content : JSON.stringify(content);
    if (!tool) {
      messages.append(el("div", { class: "tool" + (isError ? " error" : "") }, el("pre", { class: "output" }, shown)));
      return;
    }
    tool.box.classList.toggle("error", Boolean(isError));
    tool.output.textContent = shown;
  };
  const note = (text) => messages.append(el("div", { class: "note" }, text));

  const renderPending = (calls) => {
    pending.replaceChildren(...(calls || []).map((call) => {
      const answer = el("input", { type: "text", placeholder: "answer", class: "answer" });
      const decide = (decision) => guarded(async () => {
        const request = { tool_call_id: call.tool_call_id, decision, by: "console" };
        if (decision === "answer") request.text = answer.value;
        await api("POST", `/v1/conversations/${encodeURIComponent(id)}/resolve`, request);
        await refresh();
      });
      const asks = call.kind === "approval"
        ? [el("button", { type: "button", class: "primary", onclick: () => decide("approve") }, "approve")]
        : [answer, el("button", { type: "button", class: "primary", onclick: () => decide("answer") }, "answer")];
      return el("div", { class: "pending", "data-call": call.tool_call_id },
        el("div", {}, el("strong", {}, `${call.name} waits for ${call.kind === "approval" ? "approval" : "an answer"}`),
          call.conversation ? el("span", { class: "muted" }, ` (sub-agent ${call.conversation})`) : ""),
        call.prompt ? el("div", { class: "text" }, call.prompt) : "",
        el("pre", {}, JSON.stringify(call.input, null, 2)),
        el("div", { class: "toolbar" }, asks, el("button", { type: "button", class: "danger", onclick: () => decide("deny") }, "deny")));
    }));
  };

  const refresh = async () => {
    const detail = await api("GET", `/v1/conversations/${encodeURIComponent(id)}`);
    state.replaceChildren(stateBadge(detail.state));
    header.textContent = `${detail.cwd} · ${detail.provider}/${detail.model} · sandbox ${detail.sandbox.mode}, network ${JSON.stringify(detail.sandbox.network)} · turn ${detail.turn}`;
    renderPending(detail.pending);
    return detail;
  };

  const render = (detail) => {
    messages.replaceChildren();
    tools.clear();
    for (const message of detail.messages) addMessage(message.role, message.content);
  };

  const send = () => guarded(async () => {
    const images = await Promise.all(Array.from(files.files).map((file) => new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve({ media_type: file.type, data: String(reader.result).split(",")[1] || "" });
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    })));
    const request = { text: text.value };
    if (images.length) request.images = images;
    await api("POST", `/v1/conversations/${encodeURIComponent(id)}/messages`, request);
    text.value = "";
    files.value = "";
  });
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) send();
  });

  show(
    el("h1", {}, el("span", { class: "mono" }, id), " ", state),
    header,
    el("div", { class: "toolbar" },
      el("a", { href: `#/c/${encodeURIComponent(id)}/log` }, "log"),
      el("button", { type: "button", id: "cancel", class: "danger", onclick: () => guarded(async () => {
        const answer = await api("POST", `/v1/conversations/${encodeURIComponent(id)}/cancel`);
        state.replaceChildren(stateBadge(answer.state));
      }) }, "cancel")),
    problem,
    messages,
    pending,
    text,
    el("div", { class: "toolbar" }, files, el("button", { type: "button", id: "send", class: "primary", onclick: send }, "send")));

  // The page shows the conversation up to `shownSeq`: rendered from its
  // detail, then each canonical event after it. Events that arrive while
  // the detail is being read wait, and those it already holds are skipped.
  let shownSeq = 0;
  let waiting = null;
  const renderFresh = async () => {
    waiting = waiting || [];
    try {
      const detail = await refresh();
      render(detail);
      shownSeq = detail.last_seq;
    } finally {
      const queued = waiting || [];
      waiting = null;
      for (const event of queued) apply(event);
    }
  };

  // The live stream: a snapshot, then every canonical event once (seq ids:
  // after a dropped connection the browser resumes with Last-Event-ID),
  // and what is never stored (tokens, tool output, state changes).
  const events = new EventSource(`/v1/conversations/${encodeURIComponent(id)}/events`);
  leaving.push(() => events.close());
  events.addEventListener("snapshot", () => guarded(renderFresh));
  events.addEventListener("canonical", (message) => {
    const event = JSON.parse(message.data);
    if (waiting) waiting.push(event);
    else apply(event);
  });
  const apply = (event) => {
    if (event.seq <= shownSeq) return;
    shownSeq = event.seq;
    switch (event.type) {
      case "user_message":
        addMessage("user", [{ type: "text", text: event.text }].concat((event.images || []).map(() => ({ type: "image" }))));
        break;
      case "assistant_message":
        if (streaming) { streaming.node.remove(); streaming = null; }
        addMessage("assistant", event.content, event.model);
        break;
      case "tool_result":
        setResult(event.tool_call_id, event.content, event.is_error);
        break;
      case "turn_started":
      case "turn_completed":
        break;
      case "suspended":
        note(`waiting for a human: ${(event.pending || []).map((call) => call.name || call.tool_call_id).join(", ")}`);
        break;
      case "resolved": {
        const decision = typeof event.decision === "string" ? event.decision : Object.keys(event.decision || {})[0] || "decided";
        note(`${decision} ${event.tool_call_id}${event.by ? ` by ${event.by}` : ""}`);
        break;
      }
      default:
        note(`${event.type} · seq ${event.seq}`);
    }
    guarded(refresh);
  };
  await renderFresh();
  events.addEventListener("live", (message) => {
    const update = JSON.parse(message.data);
    if (update.type === "text_delta") {
      if (!streaming || streaming.generation !== update.generation) {
        const textNode = el("div", { class: "text" });
        const node = el("div", { class: "message assistant streaming" }, el("div", { class: "who" }, "assistant · streaming"), textNode);
        messages.append(node);
        streaming = { generation: update.generation, node, textNode };
      }
      streaming.textNode.append(update.text);
    } else if (update.type === "tool_output") {
      const tool = tools.get(update.tool_call_id);
      if (tool) tool.output.append(update.chunk);
    } else if (update.type === "state_changed") {
      state.replaceChildren(stateBadge(update.state));
    } else if (update.type === "retrying" || update.type === "fallback" || update.type === "lagged") {
      note(`${update.type}: ${JSON.stringify(update)}`);
    }
  });
}

// --- the log -------------------------------------------------------------

async function logPage(id) {
  const body = el("tbody");
  const more = el("button", { type: "button", hidden: true }, "more");
  let from = 0;
  const load = async () => {
    const page = await api("GET", `/v1/conversations/${encodeURIComponent(id)}/log?from=${from}&limit=200`);
    for (const event of page.events) {
      body.append(el("tr", { "data-seq": event.seq },
        el("td", { class: "mono" }, String(event.seq)),
        el("td", { class: "muted" }, new Date(event.at_ms).toISOString()),
        el("td", {}, event.type),
        el("td", { class: "mono" }, event.parent === null || event.parent === undefined ? "" : String(event.parent)),
        el("td", {}, el("details", {}, el("summary", {}, "event"), el("pre", {}, JSON.stringify(event, null, 2))))));
    }
    from = page.next_from;
    more.hidden = page.events.length === 0;
  };
  more.addEventListener("click", () => guarded(load));
  show(
    el("h1", {}, "Log of ", el("a", { href: `#/c/${encodeURIComponent(id)}`, class: "mono" }, id)),
    el("table", { id: "log" },
      el("thead", {}, el("tr", {}, ["seq", "time", "kind", "parent", ""].map((h) => el("th", {}, h)))),
      body),
    more);
  await load();
}

// --- actors --------------------------------------------------------------

async function actorsPage() {
  const body = el("tbody");
  const load = async () => {
    const page = await api("GET", "/admin/actors");
    body.replaceChildren(...page.actors.map((actor) => {
      const act = (what) => guarded(async () => {
        if (!confirm(`${what} ${actor.id}?`)) return;
        await api("POST", `/admin/actors/${encodeURIComponent(actor.id)}/${what}`);
        await load();
      });
      return el("tr", { "data-id": actor.id },
        el("td", {}, el("a", { href: `#/c/${encodeURIComponent(actor.id)}`, class: "mono" }, actor.id)),
        el("td", {}, stateBadge(actor.state)),
        el("td", {}, `${Math.round(actor.idle_ms / 1000)} s`),
        el("td", {}, String(actor.mailbox)),
        el("td", {}, `${Math.round(actor.memory_bytes / 1024)} KiB`),
        el("td", {},
          el("button", { type: "button", class: "evict", onclick: () => act("evict") }, "evict"), " ",
          el("button", { type: "button", class: "danger kill", onclick: () => act("kill") }, "kill")));
    }));
  };
  show(
    el("h1", {}, "Live actors"),
    el("table", { id: "actors" },
      el("thead", {}, el("tr", {}, ["conversation", "state", "idle", "mailbox", "memory", ""].map((h) => el("th", {}, h)))),
      body));
  await load();
}

// --- health --------------------------------------------------------------

async function healthPage() {
  const response = await fetch("/metrics", { credentials: "same-origin" });
  if (response.status === 401) throw new SignInNeeded();
  const text = await response.text();
  const wanted = /^(keel_llm_requests_total|keel_llm_retries_total|keel_llm_fallbacks_total|keel_store_errors_total|keel_turns_total|keel_turn_duration_seconds_(sum|count)|keel_tool_runs_total|keel_store_available)/;
  const lines = text.split("\n").filter((line) => wanted.test(line));
  show(el("h1", {}, "Health"), el("pre", { id: "metrics" }, lines.join("\n") || "no figures yet"));
}

route();
