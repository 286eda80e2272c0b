//! What travels to a conversation's actor: its messages
//! ([`ConversationMsg`]), the out-of-band control block handles share with
//! it ([`Control`]), and what it answers with ([`Inspection`],
//! [`ActorStats`], [`SendTicket`]). Everything that talks to the actor
//! (handles, workers, timers, subscriptions) depends on this module and
//! the actor does too; this module depends on none of them, so nothing
//! here calls back into the actor.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ractor::RpcReplyPort;
use serde::Serialize;

use keel_core::event::ForkOrigin;
use keel_core::event::{Decision, PendingCall};
use keel_core::ids::{ConversationId, EventId, Seq, ToolCallId};
use keel_core::message::{ImageRef, Message, Usage};
use keel_core::reducer::{CompactionRecord, WorkingSet};
use keel_core::state::{Phase, StateName};
use keel_core::time::Timestamp;
use keel_core::{
    AssistantResponse, ConversationConfig, Generation, LiveEvent, LlmFailure, Rejection,
    StreamDelta, Timer,
};

use crate::pubsub::Subscription;
use crate::tool::ToolOutcome;

/// Out-of-band signals from handles to the actor, read at the top of every
/// handler.
#[derive(Debug, Default)]
pub(crate) struct Control {
    /// A cancel was asked for and not yet carried out.
    pub(crate) cancel_requested: AtomicBool,
    /// Messages in the actor's mailbox, as counted by its `Mailbox`.
    pub(crate) queued: AtomicUsize,
    /// What the actor was last seen doing, readable while it is busy with
    /// one message (and cannot answer `Stats`): `Runtime::actors` lists a
    /// stuck actor from here.
    pub(crate) seen: std::sync::Mutex<Seen>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Seen {
    /// The conversation's state after the last message it finished.
    pub(crate) state: Option<StateName>,
    /// When it began the message it is handling now, if any.
    pub(crate) handling_since: Option<std::time::Instant>,
}

impl Control {
    pub(crate) fn see(&self, change: impl FnOnce(&mut Seen)) {
        change(
            &mut self
                .seen
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
    }

    pub(crate) fn seen(&self) -> Seen {
        *self
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) enum ConversationMsg {
    Send {
        text: String,
        images: Vec<ImageRef>,
        /// Marked when the actor takes the message (`ConversationHandle::send`).
        ticket: Arc<SendTicket>,
        reply: RpcReplyPort<Result<EventId, Rejection>>,
    },
    Resolve {
        tool_call_id: ToolCallId,
        decision: Decision,
        by: Option<String>,
        reply: RpcReplyPort<Result<(), Rejection>>,
    },
    Cancel {
        reply: RpcReplyPort<StateName>,
    },
    ChangeConfig {
        config: Box<ConversationConfig>,
        reply: RpcReplyPort<Result<(), Rejection>>,
    },
    /// Compact now (`Input::Compact`); answered once the summary request
    /// is sent, not when it is in.
    Compact {
        reply: RpcReplyPort<Result<(), Rejection>>,
    },
    /// Rewind to a turn boundary: the actor reads its log for it.
    Rewind {
        to_seq: Seq,
        reply: RpcReplyPort<Result<(), crate::Error>>,
    },
    /// A subscription; with `from`, its canonical events start there when
    /// the actor still holds them (`Subscription::starting_in_memory`).
    Subscribe {
        from: Option<Seq>,
        reply: RpcReplyPort<Subscription>,
    },
    Inspect {
        reply: RpcReplyPort<Inspection>,
    },
    /// What `Runtime::actors` lists; answered without waking a
    /// hibernating conversation.
    Stats {
        reply: RpcReplyPort<ActorStats>,
    },
    /// Save the snapshot and stop (long-idle eviction, or asked for).
    Evict {
        reply: Option<RpcReplyPort<Result<(), Rejection>>>,
    },
    /// Panic on purpose: the crash drill. The supervisor brings the
    /// conversation back from its log.
    Crash,
    /// The runtime stops gracefully: take no new messages, let the turn in
    /// flight finish, then end the session and stop.
    Drain,
    /// The runtime's grace period is over: end the session now,
    /// interrupting a turn still running.
    ShutdownNow,
    /// The runtime's idle sweeper: see whether to hibernate or evict.
    IdleCheck,
    /// A subscription was dropped: free the live channel if nobody else
    /// listens.
    Unsubscribed,
    // Reports from workers and timers.
    StreamDelta {
        generation: Generation,
        delta: StreamDelta,
    },
    StreamFinished {
        generation: Generation,
        response: Box<AssistantResponse>,
    },
    StreamFailed {
        generation: Generation,
        failure: LlmFailure,
    },
    /// The stream worker of `generation` left an image of the history out
    /// of its request; subscribers are told while that request is current.
    ImageOmitted {
        generation: Generation,
        hash: String,
        reason: String,
    },
    ToolOutput {
        tool_call_id: ToolCallId,
        chunk: String,
    },
    ToolFinished {
        tool_call_id: ToolCallId,
        /// Its `images` are empty: the worker stored them, as `images`.
        outcome: ToolOutcome,
        images: Vec<ImageRef>,
    },
    /// A sub-agent of the running `spawn_agents` call changed state
    /// (`LiveEvent::ChildState`): published to this conversation's
    /// watchers while that call runs. Not an input: the core has nothing
    /// to decide, and the child's own log records what it did.
    ChildState {
        event: LiveEvent,
    },
    /// What a sub-agent of the running `spawn_agents` call `tool_call_id`
    /// waits on now, all of it: listed with this conversation's own
    /// pending calls, published (`LiveEvent::ChildPending`), and a
    /// resolution of one of them is passed on to the sub-agent.
    ChildPending {
        tool_call_id: ToolCallId,
        child: ConversationId,
        pending: Vec<keel_core::event::PendingCall>,
    },
    TimerFired {
        timer: Timer,
    },
    /// The held live updates are due (`Publisher::finish_message`).
    FlushLive,
}

/// What `inspect` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    pub id: ConversationId,
    pub state: StateName,
    /// The failure that put the conversation in `error`.
    pub error: Option<String>,
    pub last_seq: Seq,
    pub cwd: String,
    pub config: ConversationConfig,
    pub usage: Usage,
    /// The prompt's estimated tokens now (`compaction::prompt_tokens`):
    /// what decides when it is compacted.
    pub context_tokens: u64,
    /// The latest compaction: the prompt's tokens before and after it.
    pub last_compaction: Option<CompactionRecord>,
    /// Set for a fork: where its history came from.
    pub forked_from: Option<ForkOrigin>,
    /// The history as the model sees it.
    pub messages: Vec<Message>,
    pub pending: Vec<PendingCall>,
    /// Calls the sub-agents of its running `spawn_agents` call wait on
    /// (empty when it is not live); resolved through this conversation.
    pub child_pending: Vec<keel_core::ChildPendingCall>,
    /// Messages waiting for a turn (`busy_policy = queue`).
    pub queued: usize,
    pub parent: Option<ConversationId>,
    /// Turns started so far.
    pub turn: u32,
    /// Time since a user, worker or timer last did something here.
    pub idle_ms: u64,
    pub subscribers: usize,
    /// The short-idle tier released this actor's buffers.
    pub hibernated: bool,
    /// An actor serves the conversation now. An inspection of one that has
    /// none is read from the store and wakes nothing.
    pub live: bool,
    /// What runs now.
    pub worker: Option<WorkerInfo>,
}

/// One live actor, as `Runtime::actors` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActorStats {
    pub id: ConversationId,
    /// The state it is in (a hibernating one: the state it rested in; one
    /// that is not responding: the state it was last seen in).
    pub state: StateName,
    /// It answered. An actor busy with one message for longer than
    /// `Runtime::actors` waits (a stuck store write, say) is listed all
    /// the same, from what it was last seen doing: its state, how long it
    /// has been on that message (`idle_ms`) and its mailbox; what only it
    /// can tell (subscribers, hibernation, memory) is `None`.
    pub responding: bool,
    /// Time since a user, worker or timer last did something here; for an
    /// actor not responding, time since it began the message it is on.
    pub idle_ms: u64,
    pub subscribers: Option<usize>,
    /// The short-idle tier released its working set.
    pub hibernated: Option<bool>,
    /// An estimate of the bytes the actor holds: its state and its working
    /// set's messages (text, tool inputs and results).
    pub memory_bytes: Option<u64>,
    /// Messages waiting in its mailbox (an estimate: see `mailbox.rs`);
    /// one that keeps growing is a conversation that cannot keep up.
    pub mailbox: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkerInfo {
    Stream { generation: Generation },
    Tool { tool_call_id: ToolCallId },
}

impl Inspection {
    /// The inspection of a conversation no actor serves: its working set as
    /// the log folds to, at rest.
    pub(crate) fn at_rest(working: WorkingSet, now: Timestamp) -> Inspection {
        let phase = Phase::from_status(&working);
        let context_tokens = keel_core::compaction::prompt_tokens(&working);
        Inspection {
            id: working.id.clone(),
            state: phase.name(),
            error: match &phase {
                Phase::Error { message } => Some(message.clone()),
                _ => None,
            },
            last_seq: working.last_seq,
            idle_ms: now.millis_since(working.last_activity),
            queued: working.queued.len(),
            turn: working.turn,
            parent: working.parent_conversation,
            cwd: working.cwd,
            config: working.config,
            usage: working.usage,
            context_tokens,
            last_compaction: working.last_compaction,
            forked_from: working.forked_from,
            messages: Arc::unwrap_or_clone(working.messages),
            pending: working.pending,
            child_pending: Vec::new(),
            subscribers: 0,
            hibernated: false,
            live: false,
            worker: None,
        }
    }
}

/// Travels with a message to the actor, so that a sender whose answer was
/// lost knows whether the actor took the message at all.
#[derive(Debug, Default)]
pub(crate) struct SendTicket {
    /// 0 until the actor takes the message; then the seq its log ended
    /// at, plus one (seqs start at 1, so 0 is free).
    taken: AtomicU64,
}

impl SendTicket {
    /// The actor takes the message; its log ends at `last_seq`.
    pub(crate) fn take(&self, last_seq: Seq) {
        self.taken.store(last_seq + 1, Ordering::SeqCst);
    }

    /// Where the log ended when the actor took the message, if it did.
    pub(crate) fn taken_after(&self) -> Option<Seq> {
        self.taken.load(Ordering::SeqCst).checked_sub(1)
    }
}
