//! The client commands that ask once and print: `ls`, `new`, `inspect`,
//! `log` (which may then follow), `cancel`, `approve` / `deny` / `answer`,
//! `evict` and `ps`. Each prints a table or a line for people, or with
//! `--json` the API's own JSON (one value; `log` prints one event a line).

use std::path::PathBuf;

use serde_json::{json, Value};

use super::output::{self, say, Paint};
use super::turn::tool_input;
use super::Exit;
use keel_api::client::{Client, Frame};
use keel_api::types::{
    ApiBusyPolicy, ApiDecisionKind, ApiEvent, ApiEventKind, ApiLiveEvent, ApiModelChoice,
    ApiNetwork, ApiProvider, ApiSandbox, ApiSandboxMode, ApiState, ApiToolPolicy,
    ConversationSummary, CreateConversation,
};

/// `keel ls`.
pub async fn ls(client: &Client, all: bool, json: bool) -> anyhow::Result<Exit> {
    let list = client.list(all).await?;
    if json {
        output::json_line(&list)?;
        return Ok(Exit::Ok);
    }
    let mut header = vec!["ID", "STATE", "TURNS", "LAST ACTIVITY", "CWD"];
    if all {
        header.push("PARENT");
    }
    let mut table = output::table(&header);
    let now = output::now_ms();
    for (is_child, conversation) in under_parents(&list.conversations) {
        let id = if is_child {
            format!("└ {}", conversation.id)
        } else {
            conversation.id.clone()
        };
        let mut row = vec![
            id,
            state_name(&conversation.state),
            conversation.turns.to_string(),
            output::ago(conversation.last_activity_ms, now),
            conversation.cwd.clone(),
        ];
        if all {
            row.push(
                conversation
                    .parent
                    .clone()
                    .unwrap_or_else(|| "-".to_owned()),
            );
        }
        table.add_row(row);
    }
    output::print_table(&table)?;
    Ok(Exit::Ok)
}

/// The listing in the order `ls` shows it: each conversation followed by
/// its sub-agents (marked `true`), in the listing's order; a sub-agent
/// whose parent is not listed comes where it is.
fn under_parents(conversations: &[ConversationSummary]) -> Vec<(bool, &ConversationSummary)> {
    let listed: std::collections::HashSet<&str> = conversations
        .iter()
        .map(|conversation| conversation.id.as_str())
        .collect();
    let has_listed_parent = |conversation: &ConversationSummary| {
        conversation
            .parent
            .as_deref()
            .is_some_and(|parent| listed.contains(parent))
    };
    let mut ordered = Vec::with_capacity(conversations.len());
    for conversation in conversations
        .iter()
        .filter(|conversation| !has_listed_parent(conversation))
    {
        ordered.push((conversation.parent.is_some(), conversation));
        ordered.extend(
            conversations
                .iter()
                .filter(|child| child.parent.as_deref() == Some(conversation.id.as_str()))
                .map(|child| (true, child)),
        );
    }
    ordered
}

/// What `keel new` asks for.
#[derive(Debug, Default, clap::Args)]
pub struct NewOptions {
    /// The directory its tools run in (default: this one).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// The model (default: the daemon's).
    #[arg(long)]
    pub model: Option<String>,
    /// The provider: anthropic, openai or mock (default: the daemon's).
    #[arg(long, value_parser = super::parse_provider)]
    pub provider: Option<ApiProvider>,
    /// What a message sent mid-turn does: reject (default), interrupt
    /// or queue.
    #[arg(long, value_parser = super::parse_busy_policy)]
    pub busy_policy: Option<ApiBusyPolicy>,
    /// The system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// How a tool runs, as NAME=POLICY with POLICY auto, approve, client
    /// or deny; repeatable (`--tool bash=approve`; an MCP tool by its full
    /// name, `--tool mcp__files__write=approve`).
    #[arg(long = "tool", value_name = "NAME=POLICY", value_parser = super::parse_tool)]
    pub tools: Vec<(String, ApiToolPolicy)>,
    /// Ask this provider (and model) once the primary's retries are
    /// exhausted: PROVIDER or PROVIDER/MODEL (`--fallback openai/gpt-4o`).
    #[arg(long, value_name = "PROVIDER[/MODEL]", value_parser = super::parse_fallback)]
    pub fallback: Option<ApiModelChoice>,
    /// Let the file tools reach paths outside the working directory
    /// (refused by default). Writing there is the sandbox's to allow.
    #[arg(long)]
    pub tools_may_leave_cwd: bool,
    /// How tools are confined: read-only, workspace-write or full-access
    /// (default: the daemon's; docs/sandbox.md).
    #[arg(long, value_name = "MODE", value_parser = super::parse_sandbox_mode)]
    pub sandbox: Option<ApiSandboxMode>,
    /// The network tools may use: off, all, or HOST:PORT[,HOST:PORT…] (HOST * for any host)
    /// (default: the daemon's).
    #[arg(long, value_name = "NETWORK", value_parser = super::parse_network)]
    pub network: Option<ApiNetwork>,
    /// Use this MCP server of the daemon's (`keel mcp ls`); repeatable.
    #[arg(long = "mcp", value_name = "NAME")]
    pub mcp: Vec<String>,
}

/// `keel new`: prints the new conversation's id.
pub async fn new(client: &Client, options: NewOptions, json: bool) -> anyhow::Result<Exit> {
    let request = create_request(options)?;
    let created = client.create(&request).await?;
    if json {
        output::json_line(&created)?;
    } else {
        say!("{}", created.id)?;
    }
    Ok(Exit::Ok)
}

/// The creation request: the working directory is this shell's unless
/// given (made absolute, as the daemon wants it).
pub fn create_request(options: NewOptions) -> anyhow::Result<CreateConversation> {
    let cwd = match options.cwd {
        Some(cwd) => cwd,
        None => std::env::current_dir()?,
    };
    let cwd = std::path::absolute(&cwd)?;
    Ok(CreateConversation {
        cwd: Some(cwd.display().to_string()),
        system: options.system,
        provider: options.provider,
        model: options.model,
        busy_policy: options.busy_policy,
        tools: options.tools.into_iter().collect(),
        fallback: options.fallback,
        tools_may_leave_cwd: options.tools_may_leave_cwd,
        mcp_servers: options.mcp,
        sandbox: (options.sandbox.is_some() || options.network.is_some()).then_some(ApiSandbox {
            mode: options.sandbox,
            network: options.network,
        }),
        ..CreateConversation::default()
    })
}

/// `keel inspect`: the conversation, and its live actor if it has one.
pub async fn inspect(client: &Client, id: &str, json: bool) -> anyhow::Result<Exit> {
    let detail = client.get(id).await?;
    let actor = client
        .actors()
        .await?
        .actors
        .into_iter()
        .find(|actor| actor.id == detail.id);
    if json {
        output::json_line(&json!({"conversation": detail, "actor": actor}))?;
        return Ok(Exit::Ok);
    }
    let paint = Paint::stdout();
    let mut table = output::table(&["FIELD", "VALUE"]);
    // The runtime's measure (`Usage::context_tokens`, what its
    // `context_usage` live event reports): the last response's whole
    // input, cached or not, plus its output, which the next request sends.
    let usage = detail.usage;
    let context = usage
        .input_tokens
        .saturating_add(usage.cache_creation_input_tokens)
        .saturating_add(usage.cache_read_input_tokens)
        .saturating_add(usage.output_tokens);
    let percent = context
        .saturating_mul(100)
        .checked_div(detail.context_window)
        .unwrap_or(0);
    let mut rows = vec![
        ("id", detail.id.clone()),
        ("state", state_name(&detail.state)),
        ("cwd", detail.cwd.clone()),
        (
            "model",
            format!("{} ({})", detail.model, enum_name(&detail.provider)),
        ),
        ("busy policy", enum_name(&detail.busy_policy)),
        ("sandbox", sandbox_line(detail.sandbox.as_ref())),
        ("turns", detail.turn.to_string()),
        ("last seq", detail.last_seq.to_string()),
        (
            "context",
            format!("{context} of {} tokens ({percent}%)", detail.context_window),
        ),
        (
            "prompt",
            format!(
                "about {} tokens (estimated)",
                detail.context_tokens.max(context)
            ),
        ),
        (
            "compaction",
            match detail.compact_at_percent {
                0 => "when a provider refuses the prompt as too long".to_owned(),
                at => format!("past {at}% of the window"),
            },
        ),
        (
            "last response",
            format!(
                "{} tokens in, {} out",
                usage.input_tokens, usage.output_tokens
            ),
        ),
        ("messages", detail.messages.len().to_string()),
        ("queued", detail.queued.to_string()),
        ("pending", detail.pending.len().to_string()),
        ("live", detail.live.to_string()),
        ("idle", output::duration(detail.idle_ms)),
        ("subscribers", detail.subscribers.to_string()),
    ];
    if let Some(error) = &detail.error {
        rows.push(("error", error.clone()));
    }
    if let Some(parent) = &detail.parent {
        rows.push(("parent", parent.clone()));
    }
    if let Some(compaction) = &detail.last_compaction {
        let how = if compaction.summarised {
            "summarised"
        } else {
            "left out without a summary"
        };
        rows.push((
            "last compaction",
            format!(
                "seq {}: about {} → {} tokens (seqs up to {} {how})",
                compaction.seq,
                compaction.tokens_before,
                compaction.tokens_after,
                compaction.through_seq
            ),
        ));
    }
    if !detail.mcp_servers.is_empty() {
        let servers: Vec<String> = detail
            .mcp_servers
            .iter()
            .map(|server| format!("{} ({})", server.name, server.state))
            .collect();
        rows.push(("mcp servers", servers.join(", ")));
    }
    if let Some(origin) = &detail.forked_from {
        rows.push((
            "forked from",
            format!("{} at seq {}", origin.conversation, origin.seq),
        ));
    }
    if let Some(actor) = &actor {
        rows.push(("mailbox", actor.mailbox.to_string()));
        rows.push((
            "memory",
            actor
                .memory_bytes
                .map(output::bytes)
                .unwrap_or_else(|| "unknown (not responding)".to_owned()),
        ));
        rows.push(("responding", actor.responding.to_string()));
    }
    for (field, value) in rows {
        table.add_row(vec![field.to_owned(), value]);
    }
    output::print_table(&table)?;
    if !detail.pending.is_empty() {
        say!()?;
        say!("{}", paint.bold("pending calls"))?;
        let mut calls = output::table(&["CALL", "TOOL", "KIND", "INPUT"]);
        for call in &detail.pending {
            calls.add_row(vec![
                call.tool_call_id.clone(),
                call.name.clone(),
                enum_name(&call.kind),
                call.prompt
                    .clone()
                    .unwrap_or_else(|| tool_input(&call.input)),
            ]);
        }
        output::print_table(&calls)?;
    }
    Ok(Exit::Ok)
}

/// `keel log`: the canonical events from `from`, page by page; with
/// `follow`, then every new one as it is stored, until interrupted.
pub async fn log(
    client: &Client,
    id: &str,
    from: u64,
    follow: bool,
    json: bool,
) -> anyhow::Result<Exit> {
    let paint = Paint::stdout();
    let mut from = from.max(1);
    loop {
        let page = client.log(id, from, None).await?;
        for event in &page.events {
            print_event(event, json, paint)?;
        }
        if page.events.is_empty() || page.next_from == from {
            break;
        }
        from = page.next_from;
    }
    if !follow {
        return Ok(Exit::Ok);
    }
    let mut events = client.events(id, Some(from)).with_patience(None);
    loop {
        match events.next().await? {
            Frame::Canonical(event) => print_event(&event, json, paint)?,
            Frame::Reconnecting { error } if !json => {
                eprintln!(
                    "{}",
                    paint.yellow(&format!("connection lost ({error}); reconnecting…"))
                );
            }
            _ => {}
        }
    }
}

fn print_event(event: &ApiEvent, json: bool, paint: Paint) -> anyhow::Result<()> {
    if json {
        return output::json_line(event);
    }
    let kind = serde_json::to_value(&event.kind)?;
    let name = kind["type"].as_str().unwrap_or_default().to_owned();
    say!(
        "{:>5}  {}  {:<18}  {}",
        event.seq,
        clock(event.at_ms),
        paint.bold(&name),
        summary(&event.kind, &kind)
    )?;
    Ok(())
}

/// `HH:MM:SS` (UTC) of a time in ms since the epoch.
fn clock(at_ms: u64) -> String {
    let seconds = (at_ms / 1000) % 86_400;
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        (seconds / 60) % 60,
        seconds % 60
    )
}

/// One line about an event: its text for messages, else its fields.
fn summary(kind: &ApiEventKind, value: &Value) -> String {
    let text = match kind {
        ApiEventKind::UserMessage { text, images } if images.is_empty() => text.clone(),
        ApiEventKind::UserMessage { text, images } => {
            format!("{text} [{} image(s)]", images.len())
        }
        ApiEventKind::AssistantMessage { content, .. } => content
            .iter()
            .filter_map(|block| match block {
                keel_api::types::ApiContent::Text { text } => Some(text.clone()),
                keel_api::types::ApiContent::ToolUse { name, input, .. } => {
                    Some(format!("[{name}: {}]", tool_input(input)))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => value
            .as_object()
            .map(|fields| {
                fields
                    .iter()
                    .filter(|(name, value)| *name != "type" && !value.is_null())
                    .map(|(name, value)| match value {
                        Value::String(text) => format!("{name}={text}"),
                        other => format!("{name}={other}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default(),
    };
    one_line(&text, 120)
}

/// `text` on one line, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .trim()
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

/// `keel cancel`.
pub async fn cancel(client: &Client, id: &str, json: bool) -> anyhow::Result<Exit> {
    let spinner = output::spinner("cancelling");
    let cancelled = client.cancel(id).await;
    spinner.finish_and_clear();
    let cancelled = cancelled?;
    if json {
        output::json_line(&cancelled)?;
    } else {
        say!("{id} is {}", state_name(&cancelled.state))?;
    }
    Ok(Exit::Ok)
}

/// `keel approve --input JSON`: approve the call to run with that input.
pub async fn approve_edited(
    client: &Client,
    id: &str,
    call: &str,
    input: &str,
    by: Option<String>,
    json: bool,
) -> anyhow::Result<Exit> {
    let input: serde_json::Value = serde_json::from_str(input)
        .map_err(|error| anyhow::anyhow!("--input is not JSON: {error}"))?;
    anyhow::ensure!(
        input.is_object(),
        "--input must be a JSON object, the call's new input"
    );
    let request = keel_api::types::ResolveRequest {
        tool_call_id: call.to_owned(),
        decision: ApiDecisionKind::Edit,
        text: None,
        input: Some(input),
        by,
    };
    let resolved = client.resolve(id, &request).await?;
    if json {
        output::json_line(&resolved)?;
    } else {
        say!("approved {call} with a changed input")?;
    }
    Ok(Exit::Ok)
}

/// `keel approve`, `deny` and `answer`.
pub async fn resolve(
    client: &Client,
    id: &str,
    call: &str,
    decision: ApiDecisionKind,
    text: Option<String>,
    by: Option<String>,
    json: bool,
) -> anyhow::Result<Exit> {
    let resolved = client.decide(id, call, decision, text, by).await?;
    if json {
        output::json_line(&resolved)?;
    } else {
        let verb = match resolved.decision {
            ApiDecisionKind::Approve => "approved",
            ApiDecisionKind::Edit => "approved with a changed input",
            ApiDecisionKind::Deny => "denied",
            ApiDecisionKind::Answer => "answered",
        };
        say!("{verb} {call}")?;
    }
    Ok(Exit::Ok)
}

/// `keel compact`: ask for the compaction, then follow the stream until
/// it is recorded (or could not be had, which leaves the prompt as it was).
pub async fn compact(client: &Client, id: &str, json: bool) -> anyhow::Result<Exit> {
    // Follow first, so the `compacted` event cannot be missed: the
    // snapshot means the subscription is in place.
    let mut events = client.events(id, None);
    let spinner = output::spinner("connecting");
    loop {
        if let Frame::Snapshot(_) = events.next().await? {
            break;
        }
    }
    spinner.set_message("compacting");
    let accepted = client.compact(id).await;
    if let Err(error) = accepted {
        spinner.finish_and_clear();
        return Err(error.into());
    }
    loop {
        let frame = events.next().await?;
        match &frame {
            Frame::Canonical(event) => {
                if let ApiEventKind::Compacted {
                    replaced_messages,
                    summary,
                    tokens_before,
                    tokens_after,
                    ..
                } = &event.kind
                {
                    spinner.finish_and_clear();
                    if json {
                        output::json_line(event)?;
                    } else {
                        let how = if summary.is_some() {
                            "summarised"
                        } else {
                            "left out"
                        };
                        say!(
                            "compacted {id}: {replaced_messages} messages {how}, about {tokens_before} → {tokens_after} tokens"
                        )?;
                    }
                    return Ok(Exit::Ok);
                }
            }
            Frame::Live(ApiLiveEvent::CompactionFailed { error }) => {
                spinner.finish_and_clear();
                if json {
                    output::json_line(&frame)?;
                } else {
                    eprintln!("compaction failed; {id} is as it was: {error}");
                }
                return Ok(Exit::Failed);
            }
            // Cancelled meanwhile: it rests without a compaction.
            Frame::Live(ApiLiveEvent::StateChanged {
                state: ApiState::Idle | ApiState::Error,
            }) => {
                spinner.finish_and_clear();
                eprintln!("the compaction of {id} was called off; nothing changed");
                return Ok(Exit::Interrupted);
            }
            _ => {}
        }
    }
}

/// `keel mcp ls`.
pub async fn mcp_ls(client: &Client, json: bool) -> anyhow::Result<Exit> {
    let list = client.mcp_servers().await?;
    if json {
        output::json_line(&list)?;
        return Ok(Exit::Ok);
    }
    let mut table = output::table(&["NAME", "TRANSPORT", "STATE", "TOOLS"]);
    for server in &list.servers {
        table.add_row(vec![
            server.name.clone(),
            server.transport.clone(),
            server.state.clone(),
            server.tools.join(", "),
        ]);
    }
    output::print_table(&table)?;
    for server in &list.servers {
        if let Some(error) = &server.error {
            eprintln!("{}: {error}", server.name);
        }
        for problem in &server.problems {
            eprintln!("{}: left out: {problem}", server.name);
        }
    }
    Ok(Exit::Ok)
}

/// `keel reclaim`.
pub async fn reclaim(client: &Client, json: bool) -> anyhow::Result<Exit> {
    let spinner = output::spinner("reclaiming");
    let reclaimed = client.reclaim().await;
    spinner.finish_and_clear();
    let reclaimed = reclaimed?;
    if json {
        output::json_line(&reclaimed)?;
        return Ok(Exit::Ok);
    }
    match (reclaimed.disk_bytes_before, reclaimed.disk_bytes_after) {
        (Some(before), Some(after)) => say!(
            "{}: {} → {} on disk, in {}",
            reclaimed.action,
            output::bytes(before),
            output::bytes(after),
            output::duration(reclaimed.took_ms)
        )?,
        _ => say!("{}: nothing on disk to give back", reclaimed.action)?,
    }
    Ok(Exit::Ok)
}

/// `keel fork`.
pub async fn fork(client: &Client, id: &str, at: Option<u64>, json: bool) -> anyhow::Result<Exit> {
    let forked = client.fork(id, at).await?;
    if json {
        output::json_line(&forked)?;
    } else {
        say!(
            "{} (forked from {id} at seq {})",
            forked.id,
            forked.forked_from.seq
        )?;
    }
    Ok(Exit::Ok)
}

/// `keel rewind`.
pub async fn rewind(client: &Client, id: &str, to: u64, json: bool) -> anyhow::Result<Exit> {
    let rewound = client.rewind(id, to).await?;
    if json {
        output::json_line(&rewound)?;
    } else {
        say!(
            "rewound {id} to seq {}; it is {}",
            rewound.to_seq,
            state_name(&rewound.state)
        )?;
    }
    Ok(Exit::Ok)
}

/// `keel rm`: delete a conversation and its sub-agents.
pub async fn rm(client: &Client, id: &str, force: bool, json: bool) -> anyhow::Result<Exit> {
    let deleted = client.delete(id, force).await?;
    if json {
        output::json_line(&deleted)?;
    } else {
        let others = deleted.deleted.len().saturating_sub(1);
        let with = match others {
            0 => String::new(),
            1 => " and its sub-agent".to_owned(),
            n => format!(" and its {n} sub-agents"),
        };
        say!(
            "deleted {id}{with} ({} events, {} images)",
            deleted.events,
            deleted.blobs_removed
        )?;
    }
    Ok(Exit::Ok)
}

pub async fn evict(client: &Client, id: &str, json: bool) -> anyhow::Result<Exit> {
    let evicted = client.evict(id).await?;
    if json {
        output::json_line(&evicted)?;
    } else if evicted.was_live {
        say!("evicted {id}")?;
    } else {
        say!("{id} was not live")?;
    }
    Ok(Exit::Ok)
}

/// `keel ps`: the live actors.
pub async fn ps(client: &Client, json: bool) -> anyhow::Result<Exit> {
    let list = client.actors().await?;
    // A daemon that is one node of several also lists the nodes
    // (docs/nodes.md); one that is not, or an older one, lists none.
    let nodes = client
        .nodes()
        .await
        .ok()
        .filter(|nodes| nodes.this_node.is_some());
    if json {
        let mut value = serde_json::to_value(&list)?;
        if let (Some(nodes), Some(object)) = (&nodes, value.as_object_mut()) {
            object.insert("nodes".to_owned(), serde_json::to_value(nodes)?);
        }
        output::json_line(&value)?;
        return Ok(Exit::Ok);
    }
    if let Some(nodes) = &nodes {
        let mut table = output::table(&["NODE", "URL", "STATE", "EPOCH", "HEARD", "OWNS"]);
        for node in &nodes.nodes {
            let mut name = node.node.clone();
            if nodes.this_node.as_deref() == Some(node.node.as_str()) {
                name.push_str(" (this one)");
            }
            let state = match (node.live, node.fenced) {
                (true, _) => "live",
                (false, true) => "fenced",
                (false, false) => "not heard from",
            };
            table.add_row(vec![
                name,
                node.url.clone().unwrap_or_else(|| "-".to_owned()),
                state.to_owned(),
                node.epoch.to_string(),
                format!("{} ago", output::duration(node.heartbeat_age_ms)),
                node.owns.to_string(),
            ]);
        }
        output::print_table(&table)?;
        println!(
            "actors of node {}:",
            nodes.this_node.as_deref().unwrap_or("?")
        );
    }
    let mut table = output::table(&["ID", "STATE", "IDLE", "MAILBOX", "MEMORY", "SUBSCRIBERS"]);
    for actor in &list.actors {
        let mut state = state_name(&actor.state);
        if !actor.responding {
            state.push_str(" (not responding)");
        }
        table.add_row(vec![
            actor.id.clone(),
            state,
            output::duration(actor.idle_ms),
            actor.mailbox.to_string(),
            actor
                .memory_bytes
                .map(output::bytes)
                .unwrap_or_else(|| "-".to_owned()),
            actor
                .subscribers
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    output::print_table(&table)?;
    Ok(Exit::Ok)
}

/// An enum's wire name (`awaiting_input`, `reject`, …).
pub fn enum_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn state_name(state: &keel_api::types::ApiState) -> String {
    enum_name(state)
}

/// "workspace-write, network off (the daemon's default)".
fn sandbox_line(sandbox: Option<&keel_api::types::ApiSandboxState>) -> String {
    let Some(sandbox) = sandbox else {
        return "unknown (an older daemon)".to_owned();
    };
    let network = match &sandbox.network {
        ApiNetwork::One(one) => one.clone(),
        ApiNetwork::List(list) => list.join(","),
    };
    format!(
        "{}, network {network}{}",
        enum_name(&sandbox.mode),
        if sandbox.default {
            " (the daemon's default)"
        } else {
            ""
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ls_shows_each_sub_agent_under_its_parent() {
        let summary = |id: &str, parent: Option<&str>| ConversationSummary {
            id: id.to_owned(),
            state: keel_api::types::ApiState::Idle,
            cwd: "/".to_owned(),
            turns: 0,
            parent: parent.map(str::to_owned),
            user_initiated: parent.is_none(),
            created_at_ms: 0,
            last_activity_ms: 0,
            last_seq: 1,
            turn_in_flight: false,
            live: false,
        };
        let list = [
            summary("p1", None),
            summary("p2", None),
            summary("k1", Some("p1")),
            summary("k2", Some("p2")),
            summary("k3", Some("p1")),
            summary("orphan", Some("gone")),
        ];
        let shown: Vec<(bool, &str)> = under_parents(&list)
            .into_iter()
            .map(|(is_child, conversation)| (is_child, conversation.id.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                (false, "p1"),
                (true, "k1"),
                (true, "k3"),
                (false, "p2"),
                (true, "k2"),
                (true, "orphan"),
            ]
        );
    }

    #[test]
    fn events_read_on_one_line() {
        assert_eq!(clock(3_723_000), "01:02:03");
        assert_eq!(one_line("a\nb\n", 10), "a b");
        assert_eq!(one_line("abcdef", 3), "abc…");
        let kind = ApiEventKind::TurnFailed {
            turn: 2,
            error: "boom".to_owned(),
        };
        let value = serde_json::to_value(&kind).unwrap();
        assert_eq!(summary(&kind, &value), "error=boom turn=2");
    }
}
