//! A conversation actor's state, and what the actor and the effects it
//! carries out (`effects.rs`) both do with it: the actor owns it, effects
//! are handed it, and neither calls the other back through it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ractor::{ActorCell, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq, ToolCallId};
use keel_core::state::{Conversation, StateName};
use keel_core::time::Timestamp;
use keel_core::wire::EncodedHistory;
use keel_core::{ChildPendingCall, Generation, Timer};

use crate::mailbox::Mailbox;
use crate::message::{Control, ConversationMsg};
use crate::pubsub::Publisher;
use crate::registry;
use crate::shared::{Alive, Shared};
use crate::sub_agents::SpawnWork;
use crate::task::AbortOnDrop;

/// A running worker and what it works on.
pub(crate) struct Worker<K> {
    pub(crate) key: K,
    pub(crate) cell: ActorCell,
}

/// What keel calls itself as an agent: `gen_ai.agent.name` of its turn spans.
const AGENT_NAME: &str = "keel";

/// The span of a turn in progress: an OpenTelemetry GenAI `invoke_agent`
/// span (its name for OpenTelemetry is `otel.name`; `turn` stays the
/// `tracing` name that logs show).
pub(crate) struct TurnSpan {
    pub(crate) turn: u32,
    /// When the turn started, by the conversation's clock (its
    /// `TurnStarted`): the turn metrics measure from it the endings that
    /// carry no duration of their own.
    pub(crate) started_at: Timestamp,
    pub(crate) span: tracing::Span,
}

pub(crate) struct ConversationState {
    pub(crate) id: ConversationId,
    pub(crate) shared: Arc<Shared>,
    pub(crate) control: Arc<Control>,
    /// `None` inside a step (between `transition()` and the append) and
    /// while hibernating (rebuilt from the log by `hydrate`).
    pub(crate) conversation: Option<Conversation>,
    pub(crate) stream: Option<Worker<Generation>>,
    pub(crate) tool: Option<Worker<ToolCallId>>,
    /// The `spawn_agents` call being carried out (`sub_agents.rs`).
    pub(crate) spawn: Option<SpawnWork>,
    /// The calls the sub-agents of `spawn` wait on now (they inherit this
    /// conversation's gates and nobody watches them).
    pub(crate) child_pending: Vec<ChildPendingCall>,
    /// Every call a sub-agent of `spawn` has waited on, and whose it is:
    /// where a resolution sent here for it goes (also when asked again
    /// after a lost answer, once the call no longer waits).
    pub(crate) child_calls: Vec<(ToolCallId, ConversationId)>,
    pub(crate) timers: HashMap<Timer, AbortOnDrop>,
    pub(crate) publisher: Publisher,
    /// The flush the publisher's held live updates are owed.
    pub(crate) live_flush: Option<AbortOnDrop>,
    /// `post_start` still has to feed `Input::Started` (a rebuilt
    /// conversation recovers what its log left in flight).
    pub(crate) recover_on_start: bool,
    /// Last time a user, a worker or a timer did something here.
    pub(crate) last_touched: Instant,
    /// Short-idle tier taken: the working set is released until the next
    /// message rebuilds it.
    pub(crate) hibernated: bool,
    /// The state the conversation rested in when it hibernated.
    pub(crate) rest_state: StateName,
    /// The runtime is stopping gracefully: new messages are refused, and
    /// the session ends as soon as no turn runs.
    pub(crate) draining: bool,
    /// The log position of the newest stored checkpoint this actor knows
    /// of (0: none): hibernating saves one only when it is behind.
    pub(crate) checkpoint_seq: Seq,
    pub(crate) span: tracing::Span,
    /// The span of the working set's turn in progress, under `span`; its
    /// requests and tools run in it. Kept in step by
    /// [`ConversationState::sync_turn_span`].
    pub(crate) turn_span: Option<TurnSpan>,
    /// The latest events appended (at most [`RECENT_EVENTS`]), oldest
    /// first: kept through a turn and after it until the next idle check
    /// finds no turn running, or the conversation hibernates. A follower
    /// that joins the turn from its message on is served from here
    /// instead of the log (docs/requirements.md, "A follower of a turn in
    /// progress is served from memory").
    pub(crate) recent: VecDeque<Arc<Event>>,
    /// The JSON of the history as the last request sent it, which the
    /// next request reuses (`keel_core::wire::EncodedHistory`); released
    /// with the working set when the conversation hibernates.
    pub(crate) encoded: Arc<std::sync::Mutex<EncodedHistory>>,
    /// Last, so that it drops after `shared`.
    pub(crate) _alive: Alive,
}

/// How many of a turn's latest events its actor keeps for followers.
pub(crate) const RECENT_EVENTS: usize = 32;

impl ConversationState {
    pub(super) fn new(
        id: ConversationId,
        shared: Arc<Shared>,
        conversation: Option<Conversation>,
        checkpoint_seq: Seq,
        span: tracing::Span,
    ) -> ConversationState {
        let control = registry::control(&shared, &id);
        // A new life of the actor has a new, empty mailbox, and is busy
        // starting until `post_start` ends.
        control.queued.store(0, Ordering::Relaxed);
        control.see(|seen| {
            seen.state = conversation.as_ref().map(Conversation::state_name);
            seen.handling_since = Some(std::time::Instant::now());
        });
        let mut state = ConversationState {
            control,
            id,
            conversation,
            stream: None,
            tool: None,
            spawn: None,
            child_pending: Vec::new(),
            child_calls: Vec::new(),
            timers: HashMap::new(),
            publisher: Publisher::new(shared.settings.live_interval),
            live_flush: None,
            recover_on_start: false,
            last_touched: Instant::now(),
            hibernated: false,
            rest_state: StateName::Idle,
            draining: false,
            checkpoint_seq,
            turn_span: None,
            span,
            recent: VecDeque::new(),
            encoded: Arc::default(),
            _alive: shared.alive(),
            shared,
        };
        state.sync_turn_span();
        state
    }

    /// Done with a message (or with starting): note the state it is in for
    /// `Runtime::actors` to read if the next message never ends.
    pub(super) fn seen_at_rest(&self) {
        let now_in = self
            .conversation
            .as_ref()
            .map_or(self.rest_state, Conversation::state_name);
        self.control.see(|seen| {
            seen.state = Some(now_in);
            seen.handling_since = None;
        });
    }

    /// Done with a message: let the publisher send what this message held
    /// back, or arm the flush it owes (one at a time; a flush that comes
    /// early sends early, which is only less batching).
    pub(super) fn finish_publishing(&mut self, myself: &ActorRef<ConversationMsg>) {
        match self.publisher.finish_message() {
            None => self.live_flush = None,
            Some(_) if self.live_flush.is_some() => {}
            Some(deadline) => {
                let target = self.mailbox(myself);
                self.live_flush = Some(AbortOnDrop(tokio::spawn(async move {
                    tokio::time::sleep_until(deadline).await;
                    let _ = target.cast(ConversationMsg::FlushLive);
                })));
            }
        }
    }

    /// This actor's mailbox, for its workers, timers and subscriptions to
    /// send through (counted: `crate::mailbox`).
    pub(crate) fn mailbox(&self, myself: &ActorRef<ConversationMsg>) -> Mailbox {
        Mailbox::new(myself.clone(), Some(self.control.clone()))
    }

    /// The span work runs in: the turn's, or the conversation's between turns.
    pub(crate) fn work_span(&self) -> &tracing::Span {
        self.turn_span
            .as_ref()
            .map_or(&self.span, |turn| &turn.span)
    }

    /// Open, keep or close the turn span to match the turn in progress of
    /// the working set (none while hibernating): after every step, and
    /// after a rebuild from the log (a restart mid-turn, or a wake while a
    /// human is asked).
    pub(crate) fn sync_turn_span(&mut self) {
        let turn = self
            .conversation
            .as_ref()
            .and_then(|conversation| conversation.working.current_turn.as_ref())
            .map(|turn| (turn.turn, turn.started_at));
        match (turn, &self.turn_span) {
            (Some((turn, _)), Some(open)) if open.turn == turn => {}
            (Some((turn, started_at)), _) => {
                let span = tracing::info_span!(
                    parent: &self.span,
                    "turn",
                    turn,
                    // `invoke_agent {gen_ai.agent.name}`, as the conventions name it.
                    otel.name = "invoke_agent keel",
                    gen_ai.operation.name = "invoke_agent",
                    gen_ai.agent.name = AGENT_NAME,
                    gen_ai.conversation.id = %self.id,
                    keel.turn.outcome = tracing::field::Empty,
                    "error.type" = tracing::field::Empty,
                    otel.status_code = tracing::field::Empty,
                );
                self.turn_span = Some(TurnSpan {
                    turn,
                    started_at,
                    span,
                });
            }
            (None, _) => self.turn_span = None,
        }
    }

    /// Let go of the latest events unless a turn is running (a
    /// hibernating conversation runs none).
    pub(crate) fn forget_recent(&mut self) {
        let mid_turn = self
            .conversation
            .as_ref()
            .is_some_and(|conversation| conversation.working.current_turn.is_some());
        if !mid_turn {
            self.recent = VecDeque::new();
        }
    }

    /// Keep `events`, just made durable, for followers of the turn.
    pub(crate) fn remember(&mut self, events: &[Arc<Event>]) {
        for event in events {
            if self.recent.len() == RECENT_EVENTS {
                self.recent.pop_front();
            }
            self.recent.push_back(event.clone());
        }
    }

    pub(super) fn conversation(&self) -> Result<&Conversation, ActorProcessingErr> {
        self.conversation
            .as_ref()
            .ok_or_else(|| "invariant: the conversation is present between steps".into())
    }
}
