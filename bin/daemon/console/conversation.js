// One conversation, live (docs/console.md, "One conversation").
//
// The view is built from the conversation's event stream alone, opened
// at seq 1: the log's canonical events in order (the whole history, not
// the compacted prompt), then each new one as it is appended, with the
// live-only updates between them (tokens, tool output, retries, state).
// Every canonical event is shown once, by its seq: after a dropped
// connection the stream resumes after the last seq shown
// (`Last-Event-ID`, or a new stream from that seq), so nothing is missed
// and nothing doubled.

import {
  api, conversationPath, el, guarded, imageUrl, leaving, markdownInto, show, stateBadge,
} from "./lib.js";

/** How long a closed stream waits before it opens again. */
const RECONNECT_MS = 1000;

/** `## Task 2 (c-…)` in a `spawn_agents` result names task 2's sub-agent. */
const TASK_LINE = /^## Task (\d+) \((c-[0-9a-f]+)\)[^\n]*\n(\w+)/gm;

/**
 * A conversation's messages, tool calls, sub-agents and notes, kept live.
 * `hooks`: `state(name)`, `changed()` after canonical events,
 * `context(usage)`, `pending()` when a sub-agent's waiting calls change,
 * `connected(yes)` when the stream opens or drops.
 */
export function conversationView(id, hooks = {}) {
  const messages = el("div", { class: "messages" });
  // Tool calls on the page, by id.
  const tools = new Map();
  // The reply streaming now.
  let streaming = null;
  let shownSeq = 0;
  let caughtUpAt = null;
  let closed = false;
  let source = null;
  const nested = [];

  const note = (text, kind, seq) => {
    const node = el("div", { class: `note ${kind || ""}`.trim(), "data-kind": kind || "", "data-seq": seq }, text);
    messages.append(node);
    return node;
  };

  const images = (list) => (list || []).map((image) => el("img", {
    class: "attached",
    src: imageUrl(id, image.hash),
    alt: `image ${image.width}×${image.height}`,
    width: image.width,
    height: image.height,
    loading: "lazy",
  }));

  const toolBox = (call) => {
    const output = el("pre", { class: "output" });
    const box = el("div", { class: "tool", "data-call": call.id, "data-name": call.name },
      el("div", { class: "mono" }, `${call.name} `, el("span", { class: "muted" }, JSON.stringify(call.input))),
      output);
    const tool = { box, output, children: null, rows: new Map(), done: false };
    if (call.name === "spawn_agents") {
      tool.children = el("div", { class: "children" });
      box.append(tool.children);
    }
    tools.set(call.id, tool);
    return box;
  };

  // A sub-agent under its parent's `spawn_agents` call: its state, and
  // its own view, opened on demand.
  const childRow = (tool, child, taskIdx, state) => {
    let row = tool.rows.get(child);
    if (!row) {
      const badge = el("span", {});
      const body = el("div", { class: "child-view" });
      const details = el("details", { class: "child", "data-child": child },
        el("summary", {},
          taskIdx === null ? "sub-agent " : `task ${taskIdx + 1} `,
          el("a", { href: `#/c/${encodeURIComponent(child)}`, class: "mono" }, child), " ", badge),
        body);
      let view = null;
      details.addEventListener("toggle", () => {
        if (details.open && !view) {
          view = conversationView(child, {});
          nested.push(view);
          body.replaceChildren(view.node);
        } else if (!details.open && view) {
          view.close();
          nested.splice(nested.indexOf(view), 1);
          view = null;
          body.replaceChildren();
        }
      });
      row = { details, badge };
      tool.rows.set(child, row);
      // In task order, whichever sub-agent is heard from first.
      const after = Array.from(tool.children.children)
        .find((other) => taskIdx !== null && Number(other.dataset.task ?? Infinity) > taskIdx);
      tool.children.insertBefore(details, after || null);
    }
    if (taskIdx !== null && row.details.dataset.task === undefined) row.details.dataset.task = String(taskIdx);
    if (state) row.badge.replaceChildren(stateBadge(state));
    return row;
  };

  const addMessage = (role, blocks, extra, seq) => {
    const node = el("div", { class: `message ${role}`, "data-seq": seq },
      el("div", { class: "who" }, role, extra ? ` · ${extra}` : ""));
    for (const block of blocks) {
      if (block.type === "text") {
        const text = el("div", { class: role === "assistant" ? "text markdown" : "text" });
        if (role === "assistant") markdownInto(text, block.text);
        else text.textContent = block.text;
        node.append(text);
      } else if (block.type === "thinking") {
        node.append(el("details", { class: "thinking" }, el("summary", {}, "thinking"), el("div", { class: "text" }, block.text)));
      } else if (block.type === "tool_use") {
        node.append(toolBox(block));
      } else if (block.type === "image") {
        node.append(...images([block.image]));
      }
    }
    messages.append(node);
    return node;
  };

  const setResult = (event) => {
    const tool = tools.get(event.tool_call_id);
    if (!tool) {
      messages.append(el("div", { class: "tool" + (event.is_error ? " error" : "") },
        el("pre", { class: "output" }, event.content), ...images(event.images)));
      return;
    }
    tool.done = true;
    tool.box.classList.toggle("error", Boolean(event.is_error));
    tool.output.textContent = event.content;
    if (event.synthetic) tool.box.append(el("div", { class: "note" }, "result made by keel, not the tool"));
    tool.box.append(...images(event.images));
    if (tool.children) {
      for (const match of event.content.matchAll(TASK_LINE)) {
        const outcome = match[3].toLowerCase().startsWith("completed") ? "completed" : "failed";
        childRow(tool, match[2], Number(match[1]) - 1, outcome);
      }
    }
  };

  const apply = (event) => {
    if (event.seq <= shownSeq) return;
    shownSeq = event.seq;
    messages.dataset.shownSeq = String(shownSeq);
    switch (event.type) {
      case "created":
        if (event.forked_from) note(`forked from ${event.forked_from.conversation} at seq ${event.forked_from.seq}`, "fork", event.seq);
        break;
      case "user_message":
        addMessage("user", [{ type: "text", text: event.text }]
          .concat((event.images || []).map((image) => ({ type: "image", image }))), null, event.seq);
        break;
      case "assistant_message":
        if (streaming) { streaming.node.remove(); streaming = null; }
        addMessage("assistant", event.content, `${event.provider}/${event.model}`, event.seq);
        break;
      case "tool_result":
        setResult(event);
        break;
      case "session_started":
      case "session_ended":
      case "turn_started":
        break;
      case "turn_completed":
        if (event.note) note(`turn ${event.turn} ended: ${event.note}`, "turn-note", event.seq);
        break;
      case "turn_interrupted":
        if (streaming) { streaming.node.remove(); streaming = null; }
        note(`turn ${event.turn} interrupted (${event.reason})${event.partial_text ? `; it had said: ${event.partial_text}` : ""}`, "interrupted", event.seq);
        break;
      case "turn_failed":
        if (streaming) { streaming.node.remove(); streaming = null; }
        note(`turn ${event.turn} failed: ${event.error}`, "failed", event.seq);
        break;
      case "suspended":
        note(`waiting for a human: ${(event.pending || []).map((call) => call.name || call.tool_call_id).join(", ")}`, "suspended", event.seq);
        break;
      case "resolved":
        note(`${event.decision} ${event.tool_call_id}${event.by ? ` by ${event.by}` : ""}${event.text ? `: ${event.text}` : ""}`, "resolved", event.seq);
        break;
      case "config_changed":
        note(`settings changed: ${event.provider}/${event.model}`, "config", event.seq);
        break;
      case "recovered":
        note(`recovered after a restart (${event.action})`, "recovered", event.seq);
        break;
      case "nudge":
        note(`keel nudged the model (${event.reason})`, "nudge", event.seq);
        break;
      case "unanswered":
        note(`messages ${event.messages.join(", ")} get no turn of their own (${event.reason})`, "unanswered", event.seq);
        break;
      case "debounce_cancelled":
        note("the waiting messages get no turn (cancelled)", "unanswered", event.seq);
        break;
      case "finished":
        note(`sub-agent ${event.status}: ${event.detail}`, "finished", event.seq);
        break;
      case "compacted": {
        const node = note(`compacted: ${event.replaced_messages} messages (through seq ${event.through_seq}) ${event.summary ? "replaced by a summary" : "left out without a summary"}; ${event.tokens_before} → ${event.tokens_after} tokens`, "compacted", event.seq);
        if (event.summary) node.append(el("details", {}, el("summary", {}, "summary"), el("div", { class: "text" }, event.summary)));
        break;
      }
      case "rewound":
        note(`rewound to seq ${event.to_seq}: the model sees ${event.messages} messages from here on`, "rewound", event.seq);
        break;
      default:
        note(`${event.type} · seq ${event.seq}`, event.type, event.seq);
    }
    if (hooks.changed) hooks.changed(event);
    caughtUp();
  };

  // Once the backlog is shown: sub-agents of a `spawn_agents` call still
  // running have told nothing yet on this stream; ask which there are.
  const caughtUp = () => {
    if (caughtUpAt === null || shownSeq < caughtUpAt) return;
    caughtUpAt = Infinity;
    const running = Array.from(tools.values()).filter((tool) => tool.children && !tool.done);
    if (running.length === 0) return;
    guarded(async () => {
      const page = await api("GET", `/v1/conversations?all=true&parent=${encodeURIComponent(id)}&limit=1000`);
      const named = new Set(Array.from(tools.values()).flatMap((tool) => Array.from(tool.rows.keys())));
      const latest = running[running.length - 1];
      for (const child of page.conversations) {
        if (!named.has(child.id)) childRow(latest, child.id, null, child.state);
      }
    }, messages);
  };

  const streamingNode = (generation) => {
    if (!streaming || streaming.generation !== generation) {
      if (streaming) streaming.node.remove();
      const textNode = el("div", { class: "text markdown" });
      const node = el("div", { class: "message assistant streaming", "data-generation": generation },
        el("div", { class: "who" }, "assistant · streaming"), textNode);
      messages.append(node);
      streaming = { generation, node, textNode, text: "", thinking: null, scheduled: false };
    }
    return streaming;
  };

  const live = (update) => {
    switch (update.type) {
      case "text_delta": {
        const current = streamingNode(update.generation);
        current.text += update.text;
        // Rendered once a frame, however fast the tokens come.
        if (!current.scheduled) {
          current.scheduled = true;
          requestAnimationFrame(() => {
            current.scheduled = false;
            markdownInto(current.textNode, current.text);
          });
        }
        break;
      }
      case "thinking_delta": {
        const current = streamingNode(update.generation);
        if (!current.thinking) {
          current.thinking = el("div", { class: "text muted" });
          current.node.insertBefore(current.thinking, current.textNode);
        }
        current.thinking.append(update.text);
        break;
      }
      case "tool_use_started":
        streamingNode(update.generation).node.append(el("div", { class: "note" }, `calling ${update.name}…`));
        break;
      case "attempt_discarded":
        // What a failed request streamed is dropped, as the runtime drops it.
        if (streaming && streaming.generation === update.generation) {
          if (streaming.text) note(`request ${update.generation} failed part-way: what it streamed is dropped`, "discarded");
          streaming.node.remove();
          streaming = null;
        }
        break;
      case "tool_output": {
        const tool = tools.get(update.tool_call_id);
        if (tool) tool.output.append(update.chunk);
        break;
      }
      case "state_changed":
        if (hooks.state) hooks.state(update.state);
        break;
      case "retrying":
        note(`retry ${update.retry} of ${update.max_retries} in ${update.delay_ms} ms (${update.provider}/${update.model}): ${update.error}`, "retrying");
        break;
      case "fallback_used":
        note(`fallback: ${update.from} → ${update.to}, after: ${update.error}`, "fallback");
        break;
      case "image_omitted":
        note(`an image was left out of request ${update.generation}: ${update.reason}`, "image-omitted");
        break;
      case "compaction_failed":
        note(`compaction failed, the prompt is as it was: ${update.error}`, "compaction-failed");
        break;
      case "context_usage":
        if (hooks.context) hooks.context(update);
        break;
      case "child_state": {
        const tool = tools.get(update.tool_call_id);
        if (tool && tool.children) childRow(tool, update.child, update.task_idx, update.state);
        break;
      }
      case "child_pending":
        if (hooks.pending) hooks.pending();
        break;
      case "lagged":
        note(`this page fell behind (${update.missed} updates lost); the log fills in what matters`, "lagged");
        break;
      default:
        break;
    }
  };

  // The stream, opened at seq 1 and reopened after the last seq shown.
  const open = () => {
    if (closed) return;
    source = new EventSource(`${conversationPath(id)}/events?from=${shownSeq + 1}`);
    source.addEventListener("snapshot", (message) => {
      const snapshot = JSON.parse(message.data);
      if (caughtUpAt === null) caughtUpAt = snapshot.last_seq;
      if (hooks.state) hooks.state(snapshot.state);
      caughtUp();
    });
    source.addEventListener("canonical", (message) => apply(JSON.parse(message.data)));
    source.addEventListener("live", (message) => live(JSON.parse(message.data)));
    source.addEventListener("open", () => { if (hooks.connected) hooks.connected(true); });
    source.addEventListener("error", () => {
      if (hooks.connected) hooks.connected(false);
      // The browser retries a dropped stream itself (with Last-Event-ID);
      // one it gave up on is opened again here.
      if (source.readyState === EventSource.CLOSED && !closed) setTimeout(open, RECONNECT_MS);
    });
  };
  open();

  return {
    node: messages,
    close() {
      closed = true;
      if (source) source.close();
      for (const view of nested.splice(0)) view.close();
    },
  };
}

/** The page of one conversation: its view, what waits on a human, and the composer. */
export async function conversationPage(id) {
  const state = el("span", { id: "state" });
  const context = el("span", { id: "context", class: "muted" });
  const pending = el("div", { id: "pending" });
  const problem = el("div", { id: "problem" });
  const text = el("textarea", { id: "message", placeholder: "message (Ctrl-Enter sends)" });
  const files = el("input", { type: "file", id: "images", accept: "image/png,image/jpeg,image/gif,image/webp", multiple: true });
  const header = el("div", { class: "muted", id: "details" });
  const connection = el("span", { id: "connection", class: "warning", hidden: true }, "connection lost: reconnecting…");

  // What waits on a human, a box per call. A box stays while its call
  // waits, so an answer being typed survives the page reading the
  // conversation again.
  const waiting = new Map();
  const renderPending = (calls) => {
    const now = new Set((calls || []).map((call) => call.tool_call_id));
    for (const [callId, box] of waiting) {
      if (!now.has(callId)) { box.remove(); waiting.delete(callId); }
    }
    for (const call of calls || []) {
      if (waiting.has(call.tool_call_id)) continue;
      const answer = el("input", { type: "text", placeholder: "answer", class: "answer" });
      const decide = (decision) => guarded(async () => {
        const request = { tool_call_id: call.tool_call_id, decision, by: "console" };
        if (decision === "answer") request.text = answer.value;
        await api("POST", `${conversationPath(id)}/resolve`, request);
        await refresh();
      }, problem);
      const asks = call.kind === "approval"
        ? [el("button", { type: "button", class: "primary", onclick: () => decide("approve") }, "approve")]
        : [answer, el("button", { type: "button", class: "primary", onclick: () => decide("answer") }, "answer")];
      const box = el("div", { class: "pending", "data-call": call.tool_call_id },
        el("div", {}, el("strong", {}, `${call.name} waits for ${call.kind === "approval" ? "approval" : "an answer"}`),
          call.conversation ? el("span", { class: "muted" }, ` (sub-agent ${call.conversation})`) : ""),
        call.prompt ? el("div", { class: "text" }, call.prompt) : "",
        el("pre", {}, JSON.stringify(call.input, null, 2)),
        el("div", { class: "toolbar" }, asks, el("button", { type: "button", class: "danger", onclick: () => decide("deny") }, "deny")));
      waiting.set(call.tool_call_id, box);
      pending.append(box);
    }
  };

  const showContext = (used, limit, warning) => {
    if (!limit) return;
    context.textContent = `context ${used.toLocaleString()} of ${limit.toLocaleString()} tokens (${Math.round((100 * used) / limit)}%)`;
    context.className = warning ? `warning ${warning}` : "muted";
  };

  const refresh = async () => {
    const detail = await api("GET", conversationPath(id));
    state.replaceChildren(stateBadge(detail.state));
    const sandbox = detail.sandbox ? ` · sandbox ${detail.sandbox.mode}, network ${JSON.stringify(detail.sandbox.network)}` : "";
    header.textContent = `${detail.cwd} · ${detail.provider}/${detail.model}${sandbox} · turn ${detail.turn}${detail.parent ? ` · sub-agent of ${detail.parent}` : ""}${detail.error ? ` · error: ${detail.error}` : ""}`;
    showContext(detail.context_tokens, detail.context_window, null);
    renderPending(detail.pending);
    return detail;
  };
  // Many events in a row ask for one reading of the detail.
  let refreshing = null;
  const refreshSoon = () => {
    if (refreshing) return;
    refreshing = setTimeout(() => { refreshing = null; guarded(refresh, problem); }, 50);
  };

  const view = conversationView(id, {
    state: (name) => state.replaceChildren(stateBadge(name)),
    changed: refreshSoon,
    pending: refreshSoon,
    context: (usage) => showContext(usage.used, usage.limit, usage.warning),
    connected: (yes) => {
      connection.hidden = yes;
      // What failed while the connection was down is stale now.
      if (yes) problem.replaceChildren();
    },
  });
  view.node.id = "messages";
  leaving.push(() => view.close());

  const send = () => guarded(async () => {
    const images = await Promise.all(Array.from(files.files).map((file) => new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve({ media_type: file.type, data: String(reader.result).split(",")[1] || "" });
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    })));
    const request = { text: text.value };
    if (images.length) request.images = images;
    await api("POST", `${conversationPath(id)}/messages`, request);
    text.value = "";
    files.value = "";
  }, problem);
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) send();
  });

  show(
    el("h1", {}, el("span", { class: "mono" }, id), " ", state, " ", connection),
    header,
    el("div", { class: "toolbar" },
      el("a", { href: `#/c/${encodeURIComponent(id)}/log` }, "log"),
      context,
      el("button", { type: "button", id: "cancel", class: "danger", onclick: () => guarded(async () => {
        const answer = await api("POST", `${conversationPath(id)}/cancel`);
        state.replaceChildren(stateBadge(answer.state));
      }, problem) }, "cancel")),
    problem,
    view.node,
    pending,
    text,
    el("div", { class: "toolbar" }, files, el("button", { type: "button", id: "send", class: "primary", onclick: send }, "send")));
  await refresh();
}
