// The console's other pages (docs/console.md): signing in, the
// conversations, a new one, a log, the live actors, health.

import {
  ago, api, conversationPath, el, guarded, leaving, show, SignInNeeded, stateBadge,
} from "./lib.js";

// --- sign in ---------------------------------------------------------------

export function signInPage() {
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

// --- conversations ---------------------------------------------------------

/** Conversations a page of the list asks for. */
const PAGE = 50;

export async function conversationsPage() {
  const filter = el("input", { type: "search", id: "filter", placeholder: "filter by id, state or directory" });
  const subAgents = el("input", { type: "checkbox", id: "sub-agents" });
  const body = el("tbody");
  const count = el("span", { class: "muted", id: "count" });
  const more = el("button", { type: "button", id: "more", hidden: true }, "more");
  let all = [];
  let cursor = null;
  const render = () => {
    const wanted = filter.value.trim().toLowerCase();
    const rows = all
      .filter((c) => !wanted || `${c.id} ${c.state} ${c.cwd}`.toLowerCase().includes(wanted))
      // What waits for a human first, then the latest activity.
      .sort((a, b) => (b.state === "awaiting_input") - (a.state === "awaiting_input") || (b.last_activity_ms || 0) - (a.last_activity_ms || 0));
    count.textContent = `${rows.length} of ${all.length} loaded${cursor ? ", more to load" : ""}`;
    body.replaceChildren(...rows.map((c) => el("tr", { "data-id": c.id },
      el("td", {}, el("a", { href: `#/c/${encodeURIComponent(c.id)}`, class: "mono" }, c.id),
        c.parent ? el("div", { class: "muted" }, `sub-agent of ${c.parent}`) : ""),
      el("td", {}, stateBadge(c.state)),
      el("td", {}, String(c.turns)),
      el("td", { class: "muted" }, ago(c.last_activity_ms)),
      el("td", { class: "mono" }, c.cwd))));
  };
  const load = async () => {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (subAgents.checked) query.set("all", "true");
    if (cursor) query.set("cursor", cursor);
    const page = await api("GET", `/v1/conversations?${query}`);
    all = all.concat(page.conversations);
    cursor = page.next_cursor;
    more.hidden = !cursor;
    render();
  };
  const reload = () => guarded(async () => {
    all = [];
    cursor = null;
    await load();
  });
  filter.addEventListener("input", render);
  subAgents.addEventListener("change", reload);
  more.addEventListener("click", () => guarded(load));
  show(
    el("h1", {}, "Conversations"),
    el("div", { class: "toolbar" }, filter,
      el("label", {}, subAgents, " sub-agents too"),
      el("a", { href: "#/new" }, "new conversation"), count),
    el("table", { id: "conversations" },
      el("thead", {}, el("tr", {}, ["id", "state", "turns", "last activity", "working directory"].map((h) => el("th", {}, h)))),
      body),
    more);
  await load();
}

// --- a new conversation ----------------------------------------------------

const PROVIDERS = ["anthropic", "openai", "mock"];
const POLICIES = ["auto", "approve", "client", "deny"];

function providerSelect(id, first) {
  return el("select", { id }, el("option", { value: "" }, first), PROVIDERS.map((p) => el("option", { value: p }, p)));
}

export function newConversationPage() {
  const cwd = el("input", { type: "text", id: "cwd", placeholder: "absolute path; empty: the daemon's", size: 50 });
  const provider = providerSelect("provider", "the daemon's default");
  const model = el("input", { type: "text", id: "model", placeholder: "model (empty: the provider's default)" });
  const fallbackProvider = providerSelect("fallback-provider", "none");
  const fallbackModel = el("input", { type: "text", id: "fallback-model", placeholder: "fallback model (empty: its default)" });
  const busy = el("select", { id: "busy-policy" },
    el("option", { value: "" }, "the default (reject)"),
    ["reject", "interrupt", "queue"].map((p) => el("option", { value: p }, p)));
  const mode = el("select", { id: "sandbox" },
    el("option", { value: "" }, "the daemon's default"),
    ["read-only", "workspace-write", "full-access"].map((m) => el("option", { value: m }, m)));
  const network = el("input", { type: "text", id: "network", placeholder: "off, all, or host:port,… (empty: default)", size: 40 });
  const mcp = el("input", { type: "text", id: "mcp-servers", placeholder: "MCP servers, comma-separated", size: 40 });
  const leave = el("input", { type: "checkbox", id: "tools-may-leave-cwd" });
  const system = el("textarea", { id: "system", placeholder: "system prompt (optional)" });
  // Tool policies: a row per tool named.
  const policies = el("div", { id: "tool-policies" });
  const addPolicy = (name, policy) => {
    const tool = el("input", { type: "text", class: "tool-name", placeholder: "tool (bash, mcp__server__tool…)", value: name || "" });
    const choice = el("select", { class: "tool-policy" }, POLICIES.map((p) => el("option", { value: p, selected: p === policy }, p)));
    const row = el("div", { class: "toolbar" }, tool, choice,
      el("button", { type: "button", onclick: () => row.remove() }, "remove"));
    policies.append(row);
  };
  addPolicy("bash", "auto");
  const row = (label, ...fields) => el("div", { class: "field" }, el("label", {}, label), ...fields);
  const form = el("form", { id: "new-conversation" },
    el("h1", {}, "New conversation"),
    row("working directory", cwd),
    row("model", provider, model),
    row("fallback", fallbackProvider, fallbackModel),
    row("a message while busy", busy),
    row("sandbox", mode, network),
    row("file tools", el("label", {}, leave, " may reach paths outside the working directory")),
    row("MCP servers", mcp),
    row("tools", policies, el("button", { type: "button", id: "add-tool", onclick: () => addPolicy("", "approve") }, "add a tool")),
    row("system prompt", system),
    el("div", { class: "toolbar" }, el("button", { type: "submit", class: "primary" }, "Create")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(async () => {
      const request = {};
      if (cwd.value.trim()) request.cwd = cwd.value.trim();
      if (system.value.trim()) request.system = system.value;
      if (provider.value) request.provider = provider.value;
      if (model.value.trim()) request.model = model.value.trim();
      if (fallbackProvider.value) {
        request.fallback = { provider: fallbackProvider.value };
        if (fallbackModel.value.trim()) request.fallback.model = fallbackModel.value.trim();
      }
      if (busy.value) request.busy_policy = busy.value;
      if (leave.checked) request.tools_may_leave_cwd = true;
      const servers = mcp.value.split(",").map((s) => s.trim()).filter(Boolean);
      if (servers.length) request.mcp_servers = servers;
      const tools = {};
      for (const line of policies.children) {
        const name = line.querySelector(".tool-name").value.trim();
        if (name) tools[name] = line.querySelector(".tool-policy").value;
      }
      if (Object.keys(tools).length) request.tools = tools;
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

// --- the log ---------------------------------------------------------------

export async function logPage(id) {
  const body = el("tbody");
  const more = el("button", { type: "button", hidden: true }, "more");
  const follow = el("input", { type: "checkbox", id: "follow" });
  let from = 0;
  let shown = 0;
  let stream = null;
  const row = (event) => {
    if (event.seq <= shown) return;
    shown = event.seq;
    body.append(el("tr", { "data-seq": event.seq },
      el("td", { class: "mono" }, String(event.seq)),
      el("td", { class: "muted" }, new Date(event.at_ms).toISOString()),
      el("td", {}, event.type),
      el("td", { class: "mono" }, event.parent === null || event.parent === undefined ? "" : String(event.parent)),
      el("td", {}, el("details", {}, el("summary", {}, "event"), el("pre", {}, JSON.stringify(event, null, 2))))));
  };
  const load = async () => {
    const page = await api("GET", `${conversationPath(id)}/log?from=${from}&limit=200`);
    for (const event of page.events) row(event);
    from = page.next_from;
    more.hidden = page.events.length === 0;
  };
  // Following: each event as it is appended, after the last one shown
  // (the pages before it are read first).
  const unfollow = () => { if (stream) stream.close(); stream = null; };
  follow.addEventListener("change", () => guarded(async () => {
    unfollow();
    if (!follow.checked) return;
    while (!more.hidden) await load();
    stream = new EventSource(`${conversationPath(id)}/events?from=${shown + 1}`);
    stream.addEventListener("canonical", (message) => row(JSON.parse(message.data)));
  }));
  leaving.push(unfollow);
  more.addEventListener("click", () => guarded(load));
  show(
    el("h1", {}, "Log of ", el("a", { href: `#/c/${encodeURIComponent(id)}`, class: "mono" }, id)),
    el("div", { class: "toolbar" }, el("label", {}, follow, " follow: show each event as it is appended")),
    el("table", { id: "log" },
      el("thead", {}, el("tr", {}, ["seq", "time", "kind", "parent", ""].map((h) => el("th", {}, h)))),
      body),
    more);
  await load();
}

// --- actors ----------------------------------------------------------------

/** How often the actors page reads the actors again. */
const ACTORS_EVERY_MS = 5000;

export async function actorsPage() {
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
  const timer = setInterval(() => guarded(load), ACTORS_EVERY_MS);
  leaving.push(() => clearInterval(timer));
  show(
    el("h1", {}, "Live actors"),
    el("table", { id: "actors" },
      el("thead", {}, el("tr", {}, ["conversation", "state", "idle", "mailbox", "memory", ""].map((h) => el("th", {}, h)))),
      body));
  await load();
}

// --- health ----------------------------------------------------------------

/** Prometheus' text format: each sample's name, labels and value. */
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2].replace(/\\(.)/g, "$1");
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

const sum = (samples, name, where = () => true) =>
  samples.filter((s) => s.name === name && where(s.labels)).reduce((total, s) => total + s.value, 0);

/**
 * A quantile of a histogram, as the bucket it falls in: `{ upTo }` (at
 * most that bound), or `{ over }` (past the last finite bound). Buckets
 * are all a histogram knows; interpolating inside one (as Prometheus'
 * `histogram_quantile` does) would show a precision there is not.
 */
export function quantile(q, buckets) {
  const sorted = buckets.slice().sort((a, b) => a.le - b.le);
  const total = sorted.length ? sorted[sorted.length - 1].count : 0;
  if (!total) return null;
  const rank = q * total;
  let lower = 0;
  for (const bucket of sorted) {
    if (bucket.count >= rank) return bucket.le === Infinity ? { over: lower } : { upTo: bucket.le };
    lower = bucket.le;
  }
  return { over: lower };
}

function latency(samples, name, where = () => true) {
  const byLe = new Map();
  for (const s of samples) {
    if (s.name !== `${name}_bucket` || !where(s.labels)) continue;
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    byLe.set(le, (byLe.get(le) || 0) + s.value);
  }
  const buckets = Array.from(byLe, ([le, count]) => ({ le, count }));
  const count = sum(samples, `${name}_count`, where);
  const mean = count ? sum(samples, `${name}_sum`, where) / count : null;
  return { count, mean, p50: quantile(0.5, buckets), p95: quantile(0.95, buckets), p99: quantile(0.99, buckets) };
}

const seconds = (value) => (value === null || value === undefined ? "–" : value < 1 ? `${Math.round(value * 1000)} ms` : `${value.toFixed(2)} s`);
const bucket = (found) => (!found ? "–" : found.over !== undefined ? `over ${seconds(found.over)}` : `≤ ${seconds(found.upTo)}`);

function figures(id, rows) {
  return el("table", { id, class: "figures" },
    el("tbody", {}, rows.map(([label, value]) => el("tr", {}, el("th", {}, label), el("td", { class: "mono" }, String(value))))));
}

/** How often the health page reads the metrics again. */
const HEALTH_EVERY_MS = 5000;

export async function healthPage() {
  const providers = el("tbody");
  const turns = el("div");
  const errors = el("div");
  const raw = el("pre", { id: "metrics" });
  const read = async () => {
    const response = await fetch("/metrics", { credentials: "same-origin" });
    if (response.status === 401) throw new SignInNeeded();
    const text = await response.text();
    const samples = parseMetrics(text);
    const names = new Set(samples.filter((s) => s.name === "keel_llm_requests_total").map((s) => s.labels.provider));
    providers.replaceChildren(...Array.from(names).sort().map((provider) => {
      const of = (outcome) => sum(samples, "keel_llm_requests_total", (l) => l.provider === provider && l.outcome === outcome);
      const ttft = latency(samples, "keel_llm_time_to_first_token_seconds", (l) => l.provider === provider);
      const tokens = (kind) => sum(samples, "gen_ai_client_token_usage_sum", (l) => l.gen_ai_provider_name === provider && l.gen_ai_token_type === kind);
      return el("tr", { "data-provider": provider },
        el("td", {}, provider),
        ...[of("ok"), of("retried"), of("fallback"), of("failed"), bucket(ttft.p50), tokens("input"), tokens("output")]
          .map((value) => el("td", { class: "mono" }, String(value))));
    }));
    const turn = latency(samples, "keel_turn_duration_seconds");
    turns.replaceChildren(figures("turns", [
      ["completed", sum(samples, "keel_turns_total", (l) => l.outcome === "completed")],
      ["failed", sum(samples, "keel_turns_total", (l) => l.outcome === "failed")],
      ["interrupted", sum(samples, "keel_turns_total", (l) => l.outcome === "interrupted")],
      ["latency p50", bucket(turn.p50)],
      ["latency p95", bucket(turn.p95)],
      ["latency p99", bucket(turn.p99)],
      ["latency mean", seconds(turn.mean)],
      ["live conversations", sum(samples, "keel_live_conversations")],
      ["open event streams", sum(samples, "keel_event_streams_open")],
    ]));
    const append = latency(samples, "keel_append_seconds");
    errors.replaceChildren(figures("errors", [
      ["store takes writes", sum(samples, "keel_store_available") ? "yes" : "NO"],
      ["store errors", sum(samples, "keel_store_errors_total")],
      ["store append p99", bucket(append.p99)],
      ["LLM requests failed", sum(samples, "keel_llm_requests_total", (l) => l.outcome === "failed")],
      ["LLM retries", sum(samples, "keel_llm_retries_total")],
      ["fallbacks", sum(samples, "keel_llm_fallbacks_total")],
      ["tool runs failed", sum(samples, "keel_tool_runs_total", (l) => l.outcome === "error")],
      ["HTTP 5xx answers", sum(samples, "keel_http_requests_total", (l) => String(l.status || "").startsWith("5"))],
    ]));
    raw.textContent = text;
  };
  show(
    el("h1", {}, "Health"),
    el("h2", {}, "Providers"),
    el("table", { id: "providers" },
      el("thead", {}, el("tr", {}, ["provider", "ok", "retried", "fallback", "failed", "first token p50", "tokens in", "tokens out"].map((h) => el("th", {}, h)))),
      providers),
    el("h2", {}, "Turns"),
    turns,
    el("h2", {}, "Errors"),
    errors,
    el("details", {}, el("summary", {}, "every metric"), raw));
  await read();
  const timer = setInterval(() => guarded(read), HEALTH_EVERY_MS);
  leaving.push(() => clearInterval(timer));
}
