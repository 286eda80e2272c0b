//! Carrying out a step. `step` runs `transition()` and then its effects in
//! order: the `Append` (always first) is awaited until durable and only then
//! does the actor keep the new state and publish the events; a failed append
//! fails the actor, whose supervisor brings it back from the log, so memory
//! never runs ahead of disk.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use keel_core::compaction;
use keel_core::event::{Event, EventKind};
use keel_core::ids::{Seq, ToolCallId};
use keel_core::message::ToolCall;
use keel_core::snapshot::FsmSnapshot;
use keel_core::state::Slot;
use keel_core::{
    transition, Conversation, Effect, Generation, Input, LiveEvent, ModelRef, Phase, ProviderKind,
    Rejection, Step, Timestamp,
};

use super::state::{ConversationState, Worker};
use crate::mailbox::Mailbox;
use crate::message::ConversationMsg;
use crate::metrics::{self, RequestOutcome, TurnOutcome};
use crate::pubsub::Update;
use crate::stream_actor::{LlmStreamActor, StreamArgs, StreamRequest};
use crate::sub_agents::{self, SpawnArgs};
use crate::task::AbortOnDrop;
use crate::tool::ToolOutcome;
use crate::tool_actor::{ToolActor, ToolArgs};

/// What a step meant for the caller that caused it.
pub(crate) struct Stepped {
    pub(crate) rejection: Option<Rejection>,
    /// Seq of the user message this step recorded, if any.
    pub(crate) user_message: Option<Seq>,
}

/// A boxed step: every handler awaits one, and ractor keeps the largest
/// handler future inline in each actor for its whole life, so boxing keeps
/// an idle conversation small (about 2.5 KB less each).
pub(crate) fn step<'a>(
    myself: &'a ActorRef<ConversationMsg>,
    state: &'a mut ConversationState,
    input: Input,
) -> Pin<Box<dyn Future<Output = Result<Stepped, ActorProcessingErr>> + Send + 'a>> {
    Box::pin(run_step(myself, state, input))
}

async fn run_step(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
    input: Input,
) -> Result<Stepped, ActorProcessingErr> {
    let conversation = state
        .conversation
        .take()
        .ok_or("invariant: the conversation is present between steps")?;
    let now = state.shared.clock.now();
    let failed_request = failed_request(&conversation, &input);
    let step = transition(conversation, input, now);
    if let Some(provider) = failed_request {
        metrics::llm_request(provider, failure_outcome(&step));
    }
    apply(myself, state, step).await
}

/// The provider of the request `input` says failed, when that request is
/// the one streaming now (a stale failure is not the conversation's).
fn failed_request(conversation: &Conversation, input: &Input) -> Option<ProviderKind> {
    let (Input::StreamFailed { generation, .. }, Phase::Streaming { request, .. }) =
        (input, &conversation.phase)
    else {
        return None;
    };
    if request.generation != *generation {
        return None;
    }
    let config = &conversation.working.config;
    let model = match request.slot {
        Slot::Primary => &config.primary,
        Slot::Fallback => config.fallback.as_ref().unwrap_or(&config.primary),
    };
    Some(model.provider)
}

/// What the step made of a failed request: a retry, the fallback, or
/// neither (the turn failed).
fn failure_outcome(step: &Step) -> RequestOutcome {
    step.effects
        .iter()
        .find_map(|effect| match effect {
            Effect::Publish {
                event: LiveEvent::Retrying { .. },
            } => Some(RequestOutcome::Retried),
            Effect::Publish {
                event: LiveEvent::FallbackUsed { .. },
            } => Some(RequestOutcome::Fallback),
            _ => None,
        })
        .unwrap_or(RequestOutcome::Failed)
}

/// Carry out a step the core decided: its `Append` first, durably, then
/// keep its state, then its other effects in order. Every step goes through
/// here, a new conversation's first one (`keel_core::create`) too.
pub(crate) fn apply<'a>(
    myself: &'a ActorRef<ConversationMsg>,
    state: &'a mut ConversationState,
    step: Step,
) -> Pin<Box<dyn Future<Output = Result<Stepped, ActorProcessingErr>> + Send + 'a>> {
    Box::pin(run_apply(myself, state, step))
}

async fn run_apply(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
    step: Step,
) -> Result<Stepped, ActorProcessingErr> {
    let Step {
        state: next,
        effects,
        rejection,
    } = step;
    let mut user_message = None;
    let mut effects = effects.into_iter().peekable();
    if let Some(Effect::Append { .. }) = effects.peek() {
        let Some(Effect::Append { events }) = effects.next() else {
            return Err("invariant: peeked an append".into());
        };
        user_message = events
            .iter()
            .find(|event| matches!(event.kind, EventKind::UserMessage { .. }))
            .map(|event| event.seq);
        append(state, events).await?;
    }
    state.conversation = Some(next);
    state.sync_turn_span();
    for effect in effects {
        carry_out(myself, state, effect).await?;
    }
    // What the step published goes out as one wave.
    state.publisher.send_wave();
    Ok(Stepped {
        rejection,
        user_message,
    })
}

/// Make `events` durable, then count and publish them. A store error fails
/// the actor.
async fn append(
    state: &mut ConversationState,
    events: Vec<Event>,
) -> Result<(), ActorProcessingErr> {
    // Kept for followers of the turn (`ConversationState::recent`), and
    // published to its subscribers: one copy, shared.
    let kept: Vec<Arc<Event>> = events.iter().cloned().map(Arc::new).collect();
    let endings = turn_endings(state, &events);
    let started = Instant::now();
    if let Err(error) = state.shared.store.append(&state.id, events).await {
        tracing::error!(parent: &state.span, %error, "append failed; the actor stops and recovers from the log");
        return Err(Box::new(error));
    }
    metrics::append(started.elapsed());
    // Counted once durable: a turn whose ending was lost to a failed
    // append is recovered from the log and ends again.
    for (outcome, duration) in endings {
        metrics::turn_ended(outcome, duration);
        if let Some(turn) = &state.turn_span {
            turn.span.record("keel.turn.outcome", outcome.as_str());
            if outcome == TurnOutcome::Failed {
                turn.span.record("error.type", "turn_failed");
                turn.span.record("otel.status_code", "error");
            }
        }
    }
    if state.publisher.subscribers() > 0 {
        for event in &kept {
            state.publisher.publish(Update::Event {
                event: event.clone(),
            });
        }
    }
    state.remember(&kept);
    Ok(())
}

/// The turns that `events` end, and how long each took when that is known:
/// `TurnCompleted` says; the other endings are measured from the open
/// turn's start, or from a `TurnStarted` of the same batch.
fn turn_endings(
    state: &ConversationState,
    events: &[Event],
) -> Vec<(TurnOutcome, Option<Duration>)> {
    let mut started_at = state.turn_span.as_ref().map(|turn| turn.started_at);
    let since_start = |started_at: Option<Timestamp>, event: &Event| {
        started_at.map(|at| Duration::from_millis(event.at.millis_since(at)))
    };
    let mut endings = Vec::new();
    for event in events {
        match &event.kind {
            EventKind::TurnStarted { .. } => started_at = Some(event.at),
            EventKind::TurnCompleted { duration_ms, .. } => endings.push((
                TurnOutcome::Completed,
                Some(Duration::from_millis(*duration_ms)),
            )),
            EventKind::TurnFailed { .. } => {
                endings.push((TurnOutcome::Failed, since_start(started_at, event)));
            }
            EventKind::TurnInterrupted { .. } => {
                endings.push((TurnOutcome::Interrupted, since_start(started_at, event)));
            }
            _ => {}
        }
    }
    endings
}

/// Carry out one effect (boxed, like [`step`]).
pub(crate) fn carry_out<'a>(
    myself: &'a ActorRef<ConversationMsg>,
    state: &'a mut ConversationState,
    effect: Effect,
) -> Pin<Box<dyn Future<Output = Result<(), ActorProcessingErr>> + Send + 'a>> {
    Box::pin(run_effect(myself, state, effect))
}

async fn run_effect(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
    effect: Effect,
) -> Result<(), ActorProcessingErr> {
    // The wave gathered so far goes out before the actor waits on anything
    // (a durable append, starting a worker, a checkpoint), so that nothing
    // published is held behind it.
    if !matches!(
        effect,
        Effect::Publish { .. }
            | Effect::AbortStream { .. }
            | Effect::AbortTool { .. }
            | Effect::CancelSubAgents { .. }
            | Effect::SetTimer { .. }
            | Effect::CancelTimer { .. }
    ) {
        state.publisher.send_wave();
    }
    match effect {
        Effect::Append { events } => append(state, events).await?,
        Effect::Publish { event } => {
            match &event {
                LiveEvent::Retrying { .. } => metrics::llm_retry(),
                LiveEvent::FallbackUsed { .. } => metrics::llm_fallback(),
                _ => {}
            }
            state.publisher.publish(Update::Live { event });
        }
        Effect::StartStream {
            generation,
            model,
            timeout_ms,
            summarise,
        } => start_stream(myself, state, generation, model, timeout_ms, summarise).await?,
        Effect::AbortStream { generation } => {
            if let Some(worker) = state.stream.take_if(|worker| worker.key == generation) {
                // Killing drops the worker's request future: the socket closes now.
                worker.cell.kill();
            }
        }
        Effect::StartTool { call } => start_tool(myself, state, call).await?,
        Effect::SpawnSubAgents { call, seq } => start_sub_agents(myself, state, call, seq)?,
        Effect::CancelSubAgents { call, seq } => {
            sub_agents::cancel_unfollowed(&state.shared, &state.id, &call, seq);
        }
        Effect::AbortTool { tool_call_id } => {
            if let Some(worker) = state.tool.take_if(|worker| worker.key == tool_call_id) {
                // Killing drops the tool's future, and with it the process
                // group guard: the whole group gets SIGKILL.
                worker.cell.kill();
            }
            if let Some(spawn) = state.spawn.take_if(|spawn| spawn.key == tool_call_id) {
                // No sub-agent outlives its parent's cancel.
                spawn.cancel(&state.shared);
                forget_children(state);
            }
        }
        Effect::SetTimer { timer, at } => {
            let delay = state.shared.clock.until(at);
            let target = state.mailbox(myself);
            let task = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = target.cast(ConversationMsg::TimerFired { timer });
            });
            state.timers.insert(timer, AbortOnDrop(task));
        }
        // Dropping the guard aborts the sleeping task.
        Effect::CancelTimer { timer } => drop(state.timers.remove(&timer)),
        Effect::SaveSnapshot => save_checkpoint(state).await,
        Effect::Stop => {
            tracing::debug!(parent: &state.span, "stopping");
            myself.stop(Some("stopped".into()));
        }
    }
    Ok(())
}

/// Save the snapshot and a checkpoint of the working set, unless the stored
/// checkpoint is already at the current log position. Both are caches over
/// the log: failing to write them loses nothing. The checkpoint lets the
/// next cold start or wake replay only the events after it. Only taken in
/// a clean state (idle or awaiting input), where a snapshot applies.
pub(crate) async fn save_checkpoint(state: &mut ConversationState) {
    let Some(conversation) = state.conversation.as_ref() else {
        return;
    };
    let working = &conversation.working;
    if FsmSnapshot::of(working).is_none() || working.last_seq == state.checkpoint_seq {
        return;
    }
    match state.shared.store.save_checkpoint(&state.id, working).await {
        Ok(()) => state.checkpoint_seq = working.last_seq,
        Err(error) => {
            tracing::warn!(parent: &state.span, %error, "could not save the checkpoint");
        }
    }
}

/// The tools a request offers: the runtime's, and the client's own tools
/// (`ConversationConfig::client_tools`) beside them, a client's tool taking
/// the place of one of the same name. A sub-agent has no client, so it is
/// offered none of them.
fn offered_tools(
    state: &ConversationState,
    working: &keel_core::WorkingSet,
) -> Arc<keel_core::wire::ToolSpecs> {
    let offered = state.shared.tools.offered(working.is_sub_agent());
    let client = &working.config.client_tools;
    if client.is_empty() || working.is_sub_agent() {
        return offered;
    }
    let mut tools: Vec<keel_core::wire::ToolSpec> = offered
        .iter()
        .filter(|spec| !client.iter().any(|tool| tool.name == spec.name))
        .cloned()
        .collect();
    tools.extend(client.iter().map(|tool| keel_core::wire::ToolSpec {
        name: tool.name.clone(),
        description: tool.description.clone(),
        input_schema: tool.input_schema.clone(),
    }));
    // Sorted like the registry's, so the prompt's prefix stays the same
    // from request to request.
    tools.sort_by(|left, right| left.name.cmp(&right.name));
    Arc::new(tools.into())
}

async fn start_stream(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
    generation: Generation,
    model: ModelRef,
    timeout_ms: u64,
    summarise: Option<u32>,
) -> Result<(), ActorProcessingErr> {
    if let Some(old) = state.stream.take() {
        old.cell.kill();
    }
    let conversation = state
        .conversation
        .as_ref()
        .ok_or("invariant: the conversation is present between steps")?;
    let working = &conversation.working;
    let request = match summarise {
        // A summary request (docs/compaction.md): the replaced messages
        // as a transcript, keel's summary instructions, no tools.
        Some(replaced) => {
            let replaced = (replaced as usize).min(working.messages.len());
            StreamRequest {
                model,
                system: Some(compaction::SUMMARY_SYSTEM.to_owned()),
                messages: Arc::new(compaction::summary_request(&working.messages[..replaced])),
                tools: Arc::default(),
                mcp_servers: Vec::new(),
                denied: Vec::new(),
                conversation: state.id.clone(),
                max_tokens: working.config.max_tokens,
                timeout_ms,
                reuse: None,
            }
        }
        None => StreamRequest {
            model,
            system: working.config.system.clone(),
            messages: working.messages.clone(),
            tools: offered_tools(state, working),
            mcp_servers: working.config.mcp_servers.clone(),
            conversation: state.id.clone(),
            denied: working
                .config
                .tools
                .iter()
                .filter(|(_, policy)| **policy == keel_core::ToolPolicy::Deny)
                .map(|(name, _)| name.clone())
                .collect(),
            max_tokens: working.config.max_tokens,
            timeout_ms,
            reuse: Some((state.encoded.clone(), working.history_edits)),
        },
    };
    let span = chat_span(state, generation, &request);
    let args = StreamArgs {
        generation,
        request,
        shared: state.shared.clone(),
        report: state.mailbox(myself),
        span,
        _alive: state.shared.alive(),
    };
    match LlmStreamActor::spawn_linked(None, LlmStreamActor, args, myself.get_cell()).await {
        Ok((worker, _)) => {
            state.stream = Some(Worker {
                key: generation,
                cell: worker.get_cell(),
            });
        }
        Err(error) => {
            let _ = state.mailbox(myself).cast(ConversationMsg::StreamFailed {
                generation,
                failure: keel_core::LlmFailure {
                    retryable: true,
                    retry_after_ms: None,
                    message: format!("could not start the stream worker: {error}"),
                    prompt_too_long: false,
                },
            });
        }
    }
    Ok(())
}

async fn start_tool(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
    call: ToolCall,
) -> Result<(), ActorProcessingErr> {
    if let Some(old) = state.tool.take() {
        old.cell.kill();
    }
    let mcp_servers = state
        .conversation
        .as_ref()
        .map(|conversation| conversation.working.config.mcp_servers.clone())
        .unwrap_or_default();
    let tool = match state.shared.tools.get(&call.name) {
        Some(tool) => Some(tool),
        // Resolved in the tool's worker: the server may have to start.
        None if crate::mcp::split_name(&call.name).is_some() => Some(crate::mcp::deferred(
            state.shared.mcp.clone(),
            &call.name,
            mcp_servers,
            state.id.clone(),
        )),
        None => None,
    };
    let Some(tool) = tool else {
        let known = state
            .shared
            .tools
            .offered(false)
            .iter()
            .map(|spec| spec.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let message = format!("there is no tool named {:?}; available: {known}", call.name);
        report_tool(state.mailbox(myself), call.id, ToolOutcome::error(message));
        return Ok(());
    };
    if let Some(ownership) = &state.shared.ownership {
        if !ownership.may_act() {
            // Paused or cut off past its lease: another node may run this
            // call now, so this one must not (docs/nodes.md).
            let message = "not run: this node's lease on the conversation lapsed, and another node may have taken it over".to_owned();
            report_tool(state.mailbox(myself), call.id, ToolOutcome::error(message));
            return Ok(());
        }
    }
    let (cwd, may_leave_cwd, policy) = state
        .conversation
        .as_ref()
        .map(|conversation| {
            let working = &conversation.working;
            (
                working.cwd.clone(),
                working.config.tools_may_leave_cwd,
                working.config.sandbox.clone(),
            )
        })
        .unwrap_or_default();
    let sandbox = crate::tool::CallSandbox {
        policy: state.shared.sandbox.policy_of(policy.as_ref()),
        runtime: state.shared.sandbox.clone(),
    };
    let tool_call_id = call.id.clone();
    let span = tool_span(state, &call);
    let (lease, groups) = state.shared.tool_groups.enter(&state.id);
    let args = ToolArgs {
        groups,
        call,
        tool,
        cwd: cwd.into(),
        may_leave_cwd,
        ledger: state.shared.ledger.clone(),
        spawner: state.shared.spawner.clone(),
        sandbox,
        store: state.shared.store.clone(),
        report: state.mailbox(myself),
        span,
    };
    match ToolActor::spawn_linked(None, ToolActor, (args, lease), myself.get_cell()).await {
        Ok((worker, _)) => {
            state.tool = Some(Worker {
                key: tool_call_id,
                cell: worker.get_cell(),
            });
        }
        Err(error) => report_tool(
            state.mailbox(myself),
            tool_call_id,
            ToolOutcome::error(format!("could not start the tool: {error}")),
        ),
    }
    Ok(())
}

/// Carry out a `spawn_agents` call: its sub-agents run on their own, and
/// a task of this actor follows them (`sub_agents.rs`).
fn start_sub_agents(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
    call: ToolCall,
    call_seq: Seq,
) -> Result<(), ActorProcessingErr> {
    let working = &state
        .conversation
        .as_ref()
        .ok_or("invariant: the conversation is present between steps")?
        .working;
    let args = SpawnArgs {
        shared: state.shared.clone(),
        parent: state.id.clone(),
        parent_cwd: working.cwd.clone(),
        config: working.config.clone(),
        call,
        call_seq,
        report: state.mailbox(myself),
    };
    // A call still followed is one the core moved on from: let it go
    // (its children keep running; only a cancel stops them).
    forget_children(state);
    state.spawn = Some(sub_agents::start(args));
    Ok(())
}

/// The span of one LLM request: an OpenTelemetry GenAI `chat` span under
/// the turn's. The stream worker records the response attributes (and
/// `error.type`) when the request ends.
fn chat_span(
    state: &ConversationState,
    generation: Generation,
    request: &StreamRequest,
) -> tracing::Span {
    let model = &request.model;
    tracing::info_span!(
        parent: state.work_span(),
        "llm_request",
        turn = generation.turn,
        attempt = generation.attempt,
        otel.name = format!("chat {}", model.model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = metrics::provider_label(model.provider),
        gen_ai.request.model = %model.model,
        gen_ai.request.max_tokens = request.max_tokens,
        gen_ai.conversation.id = %state.id,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// The span of one tool run: an OpenTelemetry GenAI `execute_tool` span
/// under the turn's. The tool worker records `error.type` on an error
/// result.
fn tool_span(state: &ConversationState, call: &ToolCall) -> tracing::Span {
    tracing::info_span!(
        parent: state.work_span(),
        "tool",
        id = %call.id,
        otel.name = format!("execute_tool {}", call.name),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
        gen_ai.conversation.id = %state.id,
        "error.type" = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Feed a tool's result back through the mailbox, like a worker would.
fn report_tool(mailbox: Mailbox, tool_call_id: ToolCallId, outcome: ToolOutcome) {
    let _ = mailbox.cast(ConversationMsg::ToolFinished {
        tool_call_id,
        outcome,
        images: Vec::new(),
    });
}

/// The stream of `generation` reported its end: let its worker go.
pub(crate) fn finish_stream(state: &mut ConversationState, generation: Generation) {
    if let Some(worker) = state.stream.take_if(|worker| worker.key == generation) {
        worker.cell.stop(None);
    }
}

/// The tool of `tool_call_id` reported its end: let its worker go (or the
/// task that followed its sub-agents).
pub(crate) fn finish_tool(state: &mut ConversationState, tool_call_id: &ToolCallId) {
    if let Some(worker) = state.tool.take_if(|worker| &worker.key == tool_call_id) {
        worker.cell.stop(None);
    }
    if state
        .spawn
        .take_if(|spawn| &spawn.key == tool_call_id)
        .is_some()
    {
        forget_children(state);
    }
}

/// The spawn call is over: what its sub-agents waited on is no longer
/// this conversation's to list or pass on.
fn forget_children(state: &mut ConversationState) {
    state.child_pending.clear();
    state.child_calls.clear();
}
