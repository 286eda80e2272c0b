//! The runtime's views of a conversation, as the API shows them. keel-api
//! converts keel-core's types itself; what only the runtime and the store
//! have (an index entry, an inspection, a stream's view) is converted here,
//! on the daemon's side, which knows both.

use keel_actors::core::state::StateName;
use keel_actors::core::Status;
use keel_actors::store::IndexEntry;
use keel_actors::{Inspection, View};
use keel_api::types::{all_pending, ApiState, ConversationDetail, ConversationSummary, Snapshot};

/// `entry` from the index, with the state of its live actor if any.
pub fn summary(entry: IndexEntry, actor_state: Option<StateName>) -> ConversationSummary {
    let state = match actor_state {
        Some(state) => state.into(),
        None => match entry.status() {
            Status::Idle => ApiState::Idle,
            Status::Error => ApiState::Error,
            Status::TurnInFlight => ApiState::Recovering,
            Status::AwaitingInput => ApiState::AwaitingInput,
            Status::Completed => ApiState::Completed,
            Status::Failed => ApiState::Failed,
        },
    };
    ConversationSummary {
        id: entry.id.to_string(),
        state,
        cwd: entry.cwd,
        turns: entry.turns,
        parent: entry.parent.map(String::from),
        user_initiated: entry.user_initiated,
        created_at_ms: entry.created_at.as_millis(),
        last_activity_ms: entry.last_activity.as_millis(),
        last_seq: entry.last_seq,
        turn_in_flight: entry.turn_in_flight,
        live: actor_state.is_some(),
    }
}

/// What `GET /v1/conversations/{id}` answers for an inspected conversation.
/// `mcp` is what the daemon's MCP servers are doing (`McpHub::statuses`).
pub fn detail(
    inspection: Inspection,
    mcp: &[keel_actors::McpServerStatus],
    sandbox: &keel_actors::tool_sandbox::ToolSandbox,
) -> ConversationDetail {
    let policy = sandbox.policy_of(inspection.config.sandbox.as_ref());
    let sandbox = keel_api::types::ApiSandboxState {
        mode: policy.mode.into(),
        network: keel_api::types::ApiNetwork::from_core(&policy.network),
        default: inspection.config.sandbox.is_none(),
    };
    let mcp_servers = inspection
        .config
        .mcp_servers
        .iter()
        .map(|name| keel_api::types::ApiMcpServerState {
            name: name.clone(),
            state: mcp
                .iter()
                .find(|status| status.name == *name)
                .map_or("unknown", |status| status.state)
                .to_owned(),
        })
        .collect();
    ConversationDetail {
        mcp_servers,
        id: inspection.id.to_string(),
        state: inspection.state.into(),
        error: inspection.error,
        cwd: inspection.cwd,
        provider: inspection.config.primary.provider.into(),
        model: inspection.config.primary.model,
        busy_policy: inspection.config.busy_policy.into(),
        tools_may_leave_cwd: inspection.config.tools_may_leave_cwd,
        sandbox: Some(sandbox),
        last_seq: inspection.last_seq,
        turn: inspection.turn,
        usage: inspection.usage.into(),
        context_tokens: inspection.context_tokens,
        last_compaction: inspection.last_compaction.map(Into::into),
        forked_from: inspection.forked_from.map(Into::into),
        context_window: inspection.config.context_window,
        compact_at_percent: inspection.config.compact_at_percent,
        max_tokens: inspection.config.max_tokens,
        system: inspection.config.system,
        messages: inspection.messages.into_iter().map(Into::into).collect(),
        pending: all_pending(inspection.pending, inspection.child_pending),
        queued: inspection.queued,
        parent: inspection.parent.map(String::from),
        live: inspection.live,
        idle_ms: inspection.idle_ms,
        subscribers: inspection.subscribers,
    }
}

/// The snapshot an event stream starts with, from the conversation's view.
pub fn snapshot(view: View) -> Snapshot {
    Snapshot {
        id: view.id.to_string(),
        state: view.state.into(),
        last_seq: view.last_seq,
        cwd: view.cwd,
        usage: view.usage.into(),
        pending: all_pending(view.pending, view.child_pending),
        recent_messages: view.recent_messages.into_iter().map(Into::into).collect(),
        omitted_messages: view.omitted_messages,
    }
}
