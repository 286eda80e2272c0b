//! ConversationActor: owns one conversation. It feeds every input to
//! `keel_core::transition` and carries out the effects in order (see
//! `conversation_actor/effects.rs`): the appended events are durable before
//! anything else happens, then published, then workers are started or
//! stopped and timers set. It never waits on a provider or a tool: those run
//! in its child `LlmStreamActor` and `ToolActor`, which report back with
//! messages tagged by generation or tool call id.
//!
//! Cancel is handled ahead of queued work: `ConversationHandle::cancel` sets
//! the conversation's [`Control`] flag and kills the workers before its
//! message even reaches this mailbox, and every handler here looks at the
//! flag first, so deltas queued behind the cancel arrive already stale.

mod effects;
mod state;

pub(crate) use state::ConversationState;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;
use tracing::Instrument;

use keel_core::event::Decision;
use keel_core::history;
use keel_core::ids::{ConversationId, Seq, ToolCallId};
use keel_core::message::ContentBlock;
use keel_core::state::Phase;
use keel_core::ChildPendingCall;
use keel_core::{Input, LiveEvent, LlmFailure, NewConversation, Rejection};
use keel_store::{rehydrate, Rehydrated};

use crate::message::{ActorStats, ConversationMsg, Inspection, WorkerInfo};
use crate::pubsub::{Subscription, Update, View};
use crate::registry;
use crate::shared::Shared;

/// How the actor comes up.
pub(crate) enum Start {
    /// A new conversation: the actor runs `keel_core::create` through its
    /// effect pipeline before it is up, so its first events are durable
    /// (or the spawn fails) before anyone can address it.
    Create(Box<NewConversation>),
    /// Rebuild from the store (snapshot checked against the log), then feed
    /// `Input::Started` so that a turn left in flight is recovered.
    Rehydrate,
}

pub(crate) struct ConversationArgs {
    pub(crate) id: ConversationId,
    pub(crate) shared: Arc<Shared>,
    pub(crate) start: Start,
}

/// How long a rebuilt conversation waits for the tool worker and process
/// groups of the actor that crashed before it (as boot waits for the
/// groups of a crashed process).
const TOOL_GROUPS_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) struct ConversationActor;

impl Actor for ConversationActor {
    type Msg = ConversationMsg;
    type State = ConversationState;
    type Arguments = ConversationArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ConversationMsg>,
        args: ConversationArgs,
    ) -> Result<ConversationState, ActorProcessingErr> {
        let ConversationArgs { id, shared, start } = args;
        let span = tracing::info_span!("conversation", id = %id);
        match start {
            Start::Create(new) => {
                let mut state = ConversationState::new(id, shared, None, 0, span);
                let step = keel_core::create(*new, state.shared.clock.now());
                effects::apply(&myself, &mut state, step).await?;
                Ok(state)
            }
            Start::Rehydrate => {
                // A crash of the actor before this one in this process may
                // have left its tool worker dying: nothing is re-dispatched
                // beside an old copy of itself (`tool_groups.rs`).
                let running = shared
                    .tool_groups
                    .settle(&id, TOOL_GROUPS_PATIENCE)
                    .instrument(span.clone())
                    .await;
                if !running.is_empty() {
                    tracing::error!(
                        parent: &span,
                        pgids = ?running,
                        "a tool process group of the crashed actor still runs; going on without it"
                    );
                }
                let rehydrated = rehydrate(shared.store.as_ref(), &id)
                    .instrument(span.clone())
                    .await?
                    .ok_or_else(|| format!("conversation {id} does not exist"))?;
                tracing::debug!(
                    parent: &span,
                    snapshot = ?rehydrated.snapshot,
                    from_checkpoint = rehydrated.from_checkpoint,
                    replayed = rehydrated.replayed,
                    "rehydrated"
                );
                let checkpoint_seq = checkpoint_seq(&rehydrated);
                let mut state = ConversationState::new(
                    id,
                    shared,
                    Some(rehydrated.conversation),
                    checkpoint_seq,
                    span,
                );
                state.recover_on_start = true;
                Ok(state)
            }
        }
    }

    async fn post_start(
        &self,
        myself: ActorRef<ConversationMsg>,
        state: &mut ConversationState,
    ) -> Result<(), ActorProcessingErr> {
        if std::mem::take(&mut state.recover_on_start) {
            // A cancel asked for before this life began (`activation::cancel`
            // starts the actor to carry it out) comes first: what the log
            // left in flight is called off, not resumed.
            cancel_if_requested(&myself, state).await?;
            effects::step(&myself, state, Input::Started).await?;
        }
        rest_at_once(state).await?;
        state.finish_publishing(&myself);
        state.seen_at_rest();
        registry::started(&state.shared, &state.id);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ConversationMsg>,
        state: &mut ConversationState,
    ) -> Result<(), ActorProcessingErr> {
        state.publisher.flush();
        tracing::debug!(parent: &state.span, "conversation actor stopped");
        registry::forget_control(&state.shared, &state.id, &state.control);
        // MCP servers started for this conversation alone stop with it.
        state.shared.mcp.release(&state.id);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ConversationMsg>,
        message: ConversationMsg,
        state: &mut ConversationState,
    ) -> Result<(), ActorProcessingErr> {
        state.control.taken();
        state
            .control
            .see(|seen| seen.handling_since = Some(std::time::Instant::now()));
        let was_hibernating = state.hibernated;
        if !matches!(
            message,
            ConversationMsg::IdleCheck
                | ConversationMsg::Unsubscribed
                | ConversationMsg::Stats { .. }
                | ConversationMsg::ChildState { .. }
                | ConversationMsg::ChildPending { .. }
                | ConversationMsg::FlushLive
        ) {
            hydrate(state).await?;
        }
        let is_cancel = matches!(message, ConversationMsg::Cancel { .. });
        if !is_cancel {
            cancel_if_requested(&myself, state).await?;
        }
        // Looking at a conversation is not activity: an inspect must not keep
        // an idle actor from hibernating again or from eviction.
        if !matches!(
            message,
            ConversationMsg::IdleCheck
                | ConversationMsg::Inspect { .. }
                | ConversationMsg::Stats { .. }
                | ConversationMsg::Unsubscribed
                | ConversationMsg::FlushLive
        ) {
            state.last_touched = Instant::now();
        }
        match message {
            ConversationMsg::Send { reply, .. } if state.draining => {
                let _ = reply.send(Err(Rejection::ShuttingDown));
            }
            ConversationMsg::Send {
                text,
                images,
                ticket,
                reply,
            } => {
                ticket.take(state.conversation()?.working.last_seq);
                let outcome =
                    effects::step(&myself, state, Input::UserMessage { text, images }).await?;
                let answer = match (outcome.rejection, outcome.user_message) {
                    (Some(rejection), _) => Err(rejection),
                    (None, Some(seq)) => Ok(state.id.event_id(seq)),
                    // Accepted without a new event cannot happen for a
                    // message; answer with the log position to be safe.
                    (None, None) => Ok(state.id.event_id(state.conversation()?.working.last_seq)),
                };
                let _ = reply.send(answer);
            }
            ConversationMsg::Resolve {
                tool_call_id,
                decision,
                by,
                reply,
            } if state.child_calls.iter().any(|(id, _)| *id == tool_call_id) => {
                forward_resolve(state, tool_call_id, decision, by, reply);
            }
            ConversationMsg::Resolve {
                tool_call_id,
                decision,
                by,
                reply,
            } => {
                let outcome = effects::step(
                    &myself,
                    state,
                    Input::Resolve {
                        tool_call_id,
                        decision,
                        by,
                    },
                )
                .await?;
                let _ = reply.send(outcome.rejection.map_or(Ok(()), Err));
            }
            ConversationMsg::Cancel { reply } => {
                state
                    .control
                    .cancel_requested
                    .store(false, Ordering::SeqCst);
                effects::step(&myself, state, Input::Cancel).await?;
                let _ = reply.send(state.conversation()?.state_name());
            }
            ConversationMsg::ChangeConfig { config, reply } => {
                let outcome =
                    effects::step(&myself, state, Input::ChangeConfig { config: *config }).await?;
                let _ = reply.send(outcome.rejection.map_or(Ok(()), Err));
            }
            ConversationMsg::Compact { reply } => {
                let outcome = effects::step(&myself, state, Input::Compact).await?;
                let _ = reply.send(outcome.rejection.map_or(Ok(()), Err));
            }
            ConversationMsg::Rewind { to_seq, reply } => {
                let answer = match state.shared.store.read_all(&state.id).await {
                    Ok(log) => {
                        let at = history::working_at(&log, to_seq).map(Box::new);
                        drop(log);
                        let outcome =
                            effects::step(&myself, state, Input::Rewind { to_seq, at }).await?;
                        outcome
                            .rejection
                            .map_or(Ok(()), |rejection| Err(crate::Error::Rejected(rejection)))
                    }
                    Err(error) => Err(error.into()),
                };
                let _ = reply.send(answer);
            }
            ConversationMsg::Subscribe { from, reply } => {
                let view = view(state)?;
                let receiver = state.publisher.subscribe();
                let store = state.shared.store.clone();
                let mailbox = state.mailbox(&myself);
                let on_drop = Box::new(move || {
                    let _ = mailbox.cast(ConversationMsg::Unsubscribed);
                });
                let mut subscription = Subscription::new(view, receiver, store, on_drop);
                if let Some(from) = from {
                    subscription.starting_in_memory(from, &state.recent);
                }
                let _ = reply.send(subscription);
            }
            ConversationMsg::Inspect { reply } => {
                let mut inspection = inspect(state)?;
                inspection.hibernated = was_hibernating;
                let _ = reply.send(inspection);
            }
            ConversationMsg::Stats { reply } => {
                let _ = reply.send(stats(state));
            }
            ConversationMsg::Evict { reply } => {
                let outcome = effects::step(&myself, state, Input::Stop).await?;
                if let Some(reply) = reply {
                    let _ = reply.send(outcome.rejection.map_or(Ok(()), Err));
                }
            }
            ConversationMsg::Crash => {
                tracing::warn!(parent: &state.span, "crashing on purpose (drill)");
                return Err("crash requested (drill)".into());
            }
            ConversationMsg::IdleCheck => idle_check(&myself, state).await?,
            ConversationMsg::Unsubscribed => state.publisher.release_if_unwatched(),
            ConversationMsg::Drain => state.draining = true,
            ConversationMsg::ShutdownNow => {
                state.draining = true;
                effects::step(&myself, state, Input::Shutdown).await?;
            }
            ConversationMsg::StreamDelta { generation, delta } => {
                effects::step(&myself, state, Input::StreamDelta { generation, delta }).await?;
            }
            ConversationMsg::StreamFinished {
                generation,
                response,
            } => {
                effects::finish_stream(state, generation);
                let input = Input::StreamFinished {
                    generation,
                    response: *response,
                };
                effects::step(&myself, state, input).await?;
            }
            ConversationMsg::StreamFailed {
                generation,
                failure,
            } => {
                effects::finish_stream(state, generation);
                let input = Input::StreamFailed {
                    generation,
                    failure,
                    jitter: fastrand::u16(0..=1000),
                };
                effects::step(&myself, state, input).await?;
            }
            ConversationMsg::ImageOmitted {
                generation,
                hash,
                reason,
            } => {
                // Not an input: the core has nothing to decide, and the
                // log records the image, not one request's view of it.
                if state
                    .stream
                    .as_ref()
                    .is_some_and(|worker| worker.key == generation)
                {
                    state.publisher.publish(Update::Live {
                        event: LiveEvent::ImageOmitted {
                            generation,
                            hash,
                            reason,
                        },
                    });
                }
            }
            ConversationMsg::ToolOutput {
                tool_call_id,
                chunk,
            } => {
                let input = Input::ToolOutput {
                    tool_call_id,
                    chunk,
                };
                effects::step(&myself, state, input).await?;
            }
            ConversationMsg::ToolFinished {
                tool_call_id,
                outcome,
                images,
            } => {
                effects::finish_tool(state, &tool_call_id);
                let input = Input::ToolFinished {
                    tool_call_id,
                    content: outcome.content,
                    is_error: outcome.is_error,
                    images,
                };
                effects::step(&myself, state, input).await?;
            }
            ConversationMsg::ChildState { event } => {
                let current = match (&event, &state.spawn) {
                    (LiveEvent::ChildState { tool_call_id, .. }, Some(spawn)) => {
                        *tool_call_id == spawn.key
                    }
                    _ => false,
                };
                if current {
                    state.publisher.publish(Update::Live { event });
                }
            }
            ConversationMsg::ChildPending {
                tool_call_id,
                child,
                pending,
            } => {
                let current = state
                    .spawn
                    .as_ref()
                    .is_some_and(|spawn| spawn.key == tool_call_id);
                if current {
                    state.child_pending.retain(|waiting| waiting.child != child);
                    for call in &pending {
                        if !state.child_calls.iter().any(|(id, _)| *id == call.call.id) {
                            state
                                .child_calls
                                .push((call.call.id.clone(), child.clone()));
                        }
                        state.child_pending.push(ChildPendingCall {
                            child: child.clone(),
                            pending: call.clone(),
                        });
                    }
                    state.publisher.publish(Update::Live {
                        event: LiveEvent::ChildPending {
                            tool_call_id,
                            child,
                            pending,
                        },
                    });
                }
            }
            ConversationMsg::TimerFired { timer } => {
                state.timers.remove(&timer);
                effects::step(&myself, state, Input::TimerFired { timer }).await?;
            }
            ConversationMsg::FlushLive => {
                state.live_flush = None;
                state.publisher.flush();
            }
        }
        settle_drain(&myself, state).await?;
        rest_at_once(state).await?;
        state.finish_publishing(&myself);
        state.seen_at_rest();
        Ok(())
    }

    /// A worker ended. One that ends while still current never sent its
    /// final report (it panicked or was stopped from outside), so the
    /// conversation hears of it as a failed request or tool; anything else
    /// is a worker this actor already let go.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ConversationMsg>,
        event: SupervisionEvent,
        state: &mut ConversationState,
    ) -> Result<(), ActorProcessingErr> {
        // A hibernating conversation has no workers: this is about one it
        // already let go, and not worth rebuilding the working set for.
        if state.hibernated {
            return Ok(());
        }
        cancel_if_requested(&myself, state).await?;
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, format!("crashed: {error}")),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                format!("stopped: {}", reason.unwrap_or_else(|| "no reason".into())),
            ),
            _ => return Ok(()),
        };
        let id = cell.get_id();
        if let Some(worker) = state
            .stream
            .as_ref()
            .filter(|worker| worker.cell.get_id() == id)
        {
            let generation = worker.key;
            tracing::warn!(parent: &state.span, %generation, "stream worker {why}");
            state.stream = None;
            let input = Input::StreamFailed {
                generation,
                failure: LlmFailure {
                    retryable: true,
                    retry_after_ms: None,
                    message: format!("the stream worker {why}"),
                    prompt_too_long: false,
                },
                jitter: fastrand::u16(0..=1000),
            };
            effects::step(&myself, state, input).await?;
        } else if let Some(worker) = state
            .tool
            .as_ref()
            .filter(|worker| worker.cell.get_id() == id)
        {
            let tool_call_id = worker.key.clone();
            tracing::warn!(parent: &state.span, %tool_call_id, "tool worker {why}");
            state.tool = None;
            let input = Input::ToolFinished {
                tool_call_id,
                content: format!("the tool {why}"),
                is_error: true,
                images: Vec::new(),
            };
            effects::step(&myself, state, input).await?;
        }
        settle_drain(&myself, state).await?;
        rest_at_once(state).await?;
        state.finish_publishing(&myself);
        Ok(())
    }
}

/// While the runtime drains, end the session as soon as no turn runs: at
/// rest, waiting on a human (pending calls survive), or with a debounce
/// not yet started (its messages stay owed and the next start answers
/// them). A turn in flight is left to finish until `ShutdownNow`.
async fn settle_drain(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
) -> Result<(), ActorProcessingErr> {
    if !state.draining {
        return Ok(());
    }
    hydrate(state).await?;
    let phase = &state.conversation()?.phase;
    if phase == &Phase::Terminating {
        return Ok(());
    }
    if is_clean(phase) || matches!(phase, Phase::Debouncing { .. }) {
        effects::step(myself, state, Input::Shutdown).await?;
    }
    Ok(())
}

/// Pass a resolution of a sub-agent's call on to the sub-agent, off this
/// actor's mailbox; the sub-agent's answer is the answer.
fn forward_resolve(
    state: &ConversationState,
    tool_call_id: ToolCallId,
    decision: Decision,
    by: Option<String>,
    reply: RpcReplyPort<Result<(), Rejection>>,
) {
    // A call that waits now first: two sub-agents may have had calls
    // under the same id (a provider that numbers its calls), and the one
    // still waiting is the one a person is deciding.
    let waiting = state
        .child_pending
        .iter()
        .find(|waiting| waiting.pending.call.id == tool_call_id)
        .map(|waiting| waiting.child.clone());
    let Some(child) = waiting.or_else(|| {
        state
            .child_calls
            .iter()
            .rfind(|(id, _)| *id == tool_call_id)
            .map(|(_, child)| child.clone())
    }) else {
        return;
    };
    let shared = state.shared.clone();
    let alive = shared.alive();
    tokio::spawn(async move {
        let _alive = alive;
        let answer = match registry::supervisor(&shared) {
            None => Err(Rejection::ShuttingDown),
            Some(supervisor) => match shared
                .activation
                .ensure_started(&shared, &supervisor, &child)
                .await
            {
                Err(_) => Err(Rejection::ShuttingDown),
                Ok(actor) => match actor
                    .call(
                        |reply| ConversationMsg::Resolve {
                            tool_call_id,
                            decision,
                            by,
                            reply,
                        },
                        Some(RESOLVE_PATIENCE),
                    )
                    .await
                {
                    Ok(ractor::rpc::CallResult::Success(answer)) => answer,
                    Ok(_) | Err(_) => Err(Rejection::ShuttingDown),
                },
            },
        };
        let _ = reply.send(answer);
    });
}

/// How long a resolution passed on to a sub-agent waits for its answer.
const RESOLVE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Carry out a cancel that a handle asked for, before the message at hand.
async fn cancel_if_requested(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
) -> Result<(), ActorProcessingErr> {
    if state.control.cancel_requested.swap(false, Ordering::SeqCst) {
        // The message at hand may be one that leaves a hibernating
        // conversation asleep (an idle check): the cancel needs it awake.
        hydrate(state).await?;
        effects::step(myself, state, Input::Cancel).await?;
    }
    Ok(())
}

/// Idle eviction in two tiers (docs/requirements.md, "Idle eviction in two tiers").
/// Short idle while waiting on a human: release what can be rebuilt, stay
/// addressable. Long idle in a
/// clean state with nobody watching: save the snapshot and stop;
/// `ensure_started` brings the conversation back from the store.
async fn idle_check(
    myself: &ActorRef<ConversationMsg>,
    state: &mut ConversationState,
) -> Result<(), ActorProcessingErr> {
    // A turn's events outlive it until here: a follower opened just after
    // the turn ended (a busy daemon) still gets them from memory.
    state.forget_recent();
    let idle = state.last_touched.elapsed();
    let settings = state.shared.settings;
    // A hibernating conversation was in a clean state when it hibernated and
    // nothing has happened to it since.
    let clean = state.hibernated || is_clean(&state.conversation()?.phase);
    if clean && idle >= settings.long_idle && state.publisher.subscribers() == 0 {
        tracing::debug!(parent: &state.span, idle_ms = idle.as_millis() as u64, "evicting");
        hydrate(state).await?;
        effects::step(myself, state, Input::Stop).await?;
        return Ok(());
    }
    if idle >= settings.short_idle && at_rest(state)? {
        rest(state).await?;
    }
    Ok(())
}

/// No turn is running: the conversation waits on a user or a human, or has
/// ended.
fn is_clean(phase: &Phase) -> bool {
    matches!(
        phase,
        Phase::Idle
            | Phase::Error { .. }
            | Phase::AwaitingInput
            | Phase::Completed { .. }
            | Phase::Failed { .. }
    )
}

/// In a clean state with no worker and no timer, where the working set and
/// the phase are exactly what the log folds to, and not hibernating yet.
fn at_rest(state: &ConversationState) -> Result<bool, ActorProcessingErr> {
    if state.hibernated {
        return Ok(false);
    }
    let clean = is_clean(&state.conversation()?.phase);
    let running = state.stream.is_some()
        || state.tool.is_some()
        || state.spawn.is_some()
        || !state.timers.is_empty();
    Ok(clean && !running)
}

/// Hibernate, first saving a checkpoint if the stored one lags: waking
/// reads the checkpoint and the events after it, so keep those few.
async fn rest(state: &mut ConversationState) -> Result<(), ActorProcessingErr> {
    let lag = state
        .conversation()?
        .working
        .last_seq
        .saturating_sub(state.checkpoint_seq);
    if lag > state.shared.settings.checkpoint_lag {
        effects::save_checkpoint(state).await;
    }
    hibernate(state);
    Ok(())
}

/// With `short_idle` zero, a conversation releases its working set as soon
/// as it comes to rest, not at the next idle check.
async fn rest_at_once(state: &mut ConversationState) -> Result<(), ActorProcessingErr> {
    if state.shared.settings.short_idle.is_zero() && at_rest(state)? {
        rest(state).await?;
    }
    Ok(())
}

/// The short-idle tier: give back everything the log can rebuild. The
/// working set (the history above all) is dropped and rebuilt from the
/// store by `hydrate` when the next message arrives, so a conversation
/// parked on a human costs about as much as one with no history. Only
/// taken in a clean state with no worker and no timer, where the working
/// set and the phase are exactly what the log folds to.
fn hibernate(state: &mut ConversationState) {
    if let Some(conversation) = &state.conversation {
        state.rest_state = conversation.state_name();
    }
    state.publisher.flush();
    state.publisher.release_if_unwatched();
    state.timers.shrink_to_fit();
    state.conversation = None;
    state.sync_turn_span();
    state.forget_recent();
    state.encoded = Arc::default();
    state.hibernated = true;
    tracing::debug!(parent: &state.span, "hibernated");
}

/// The log position of the checkpoint a rebuild started from, 0 if none.
fn checkpoint_seq(rehydrated: &Rehydrated) -> Seq {
    if rehydrated.from_checkpoint {
        rehydrated.conversation.working.last_seq - rehydrated.replayed as Seq
    } else {
        0
    }
}

/// Rebuild the working set of a hibernating conversation from the store.
/// Boxed, and only entered when there is something to rebuild: ractor keeps
/// the largest handler future inline in each actor for its whole life, and
/// a rebuild's future (every store read it awaits) would make every idle
/// conversation pay for it.
async fn hydrate(state: &mut ConversationState) -> Result<(), ActorProcessingErr> {
    if state.conversation.is_some() {
        return Ok(());
    }
    Box::pin(rebuild(state)).await
}

async fn rebuild(state: &mut ConversationState) -> Result<(), ActorProcessingErr> {
    let rehydrated = rehydrate(state.shared.store.as_ref(), &state.id)
        .await?
        .ok_or_else(|| format!("conversation {} vanished from the store", state.id))?;
    state.checkpoint_seq = checkpoint_seq(&rehydrated);
    state.conversation = Some(rehydrated.conversation);
    state.sync_turn_span();
    state.hibernated = false;
    tracing::debug!(parent: &state.span, "woke from hibernation");
    Ok(())
}

fn view(state: &ConversationState) -> Result<View, ActorProcessingErr> {
    let conversation = state.conversation()?;
    let mut view = View::of(&conversation.working, conversation.state_name());
    view.child_pending = state.child_pending.clone();
    Ok(view)
}

fn stats(state: &ConversationState) -> ActorStats {
    // (Read while handling `Stats`: `seen` is for when no answer comes.)
    let (state_name, memory_bytes) = match &state.conversation {
        Some(conversation) => (
            conversation.state_name(),
            working_set_bytes(&conversation.working),
        ),
        None => (state.rest_state, 0),
    };
    ActorStats {
        id: state.id.clone(),
        state: state_name,
        responding: true,
        idle_ms: state.last_touched.elapsed().as_millis() as u64,
        subscribers: Some(state.publisher.subscribers()),
        hibernated: Some(state.hibernated),
        memory_bytes: Some(memory_bytes + std::mem::size_of::<ConversationState>() as u64),
        mailbox: state.control.mailbox_len(),
    }
}

/// An estimate of the heap a working set holds: the text of its messages,
/// tool inputs and results, and a fixed cost per block and message. Good
/// enough to find the actor that holds a lot; not an allocator's count.
fn working_set_bytes(working: &keel_core::WorkingSet) -> u64 {
    const PER_BLOCK: u64 = 64;
    const PER_MESSAGE: u64 = 48;
    let mut bytes = std::mem::size_of::<keel_core::WorkingSet>() as u64;
    for message in working.messages.iter() {
        bytes += PER_MESSAGE;
        for block in &message.content {
            bytes += PER_BLOCK
                + match block {
                    ContentBlock::Text { text } => text.len() as u64,
                    ContentBlock::Thinking { text, signature } => {
                        (text.len() + signature.as_ref().map_or(0, String::len)) as u64
                    }
                    ContentBlock::Image { image } => {
                        (image.hash.len() + image.media_type.len()) as u64
                    }
                    ContentBlock::ToolUse { call } => {
                        (call.id.0.len() + call.name.len() + call.input.to_string().len()) as u64
                    }
                    ContentBlock::ToolResult { result } => {
                        (result.tool_call_id.0.len() + result.content.len()) as u64
                    }
                };
        }
    }
    bytes
}

fn inspect(state: &ConversationState) -> Result<Inspection, ActorProcessingErr> {
    let conversation = state.conversation()?;
    let working = &conversation.working;
    Ok(Inspection {
        id: state.id.clone(),
        state: conversation.state_name(),
        error: match &conversation.phase {
            Phase::Error { message } => Some(message.clone()),
            _ => None,
        },
        last_seq: working.last_seq,
        cwd: working.cwd.clone(),
        config: working.config.clone(),
        usage: working.usage,
        context_tokens: keel_core::compaction::prompt_tokens(working),
        last_compaction: working.last_compaction,
        forked_from: working.forked_from.clone(),
        messages: working.messages.to_vec(),
        pending: working.pending.clone(),
        child_pending: state.child_pending.clone(),
        queued: working.queued.len(),
        parent: working.parent_conversation.clone(),
        turn: working.turn,
        idle_ms: state.last_touched.elapsed().as_millis() as u64,
        subscribers: state.publisher.subscribers(),
        hibernated: state.hibernated,
        live: true,
        worker: match (&state.stream, &state.tool, &state.spawn) {
            (Some(stream), _, _) => Some(WorkerInfo::Stream {
                generation: stream.key,
            }),
            (None, Some(tool), _) => Some(WorkerInfo::Tool {
                tool_call_id: tool.key.clone(),
            }),
            (None, None, Some(spawn)) => Some(WorkerInfo::Tool {
                tool_call_id: spawn.key.clone(),
            }),
            (None, None, None) => None,
        },
    })
}
