//! The reducer: folds canonical events into the working set, everything a
//! live conversation needs to carry on. Everything in it is derived from
//! the log, so replaying the log gives the live working set
//! (docs/requirements.md, "Invariants", 1).
//!
//! The transition function never edits the working set directly: it emits
//! events and applies them through [`WorkingSet::apply`], the same code replay
//! runs. That is what makes `replay(log) == live state` hold by construction.
//!
//! A rebuild from the store owns the events it decoded and drops them after
//! replay, so [`WorkingSet::replay_owned`] moves their texts, tool calls and
//! results into the working set instead of copying them. Borrowed and owned
//! events go through the same reducer, `WorkingSet::fold`; they differ only
//! in how `Payload` takes the event apart.

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::ConversationConfig;
use crate::event::{
    Decision, Event, EventKind, ForkOrigin, NudgeReason, PendingCall, RecoveryAction,
    SubAgentOutcome,
};
use crate::ids::{ConversationId, Seq, ToolCallId};
use crate::message::{
    AssistantBlock, ContentBlock, ImageRef, Message, Role, ToolCall, ToolResult, Usage,
};
use crate::time::Timestamp;
use crate::tokens;

/// The version of what [`WorkingSet::apply`] makes of a log. Bump it
/// whenever the same events would give a different working set, or one
/// with other fields: checkpoints (`codec::checkpoint`) written by another
/// version are then ignored and the log replayed.
pub const REDUCER_VERSION: u32 = 9;

/// How many of the latest resolutions the working set keeps on record
/// (`WorkingSet::resolved`).
pub const RESOLUTIONS_KEPT: usize = 64;

/// Everything derived from the log. Two working sets are equal exactly when
/// they were built from the same events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkingSet {
    pub id: ConversationId,
    pub created_at: Timestamp,
    /// Fixed working directory of every tool call (REQ-BED-010).
    pub cwd: String,
    pub config: ConversationConfig,
    pub parent_conversation: Option<ConversationId>,
    pub user_initiated: bool,
    /// Set for a fork: where its history came from.
    #[serde(default)]
    pub forked_from: Option<ForkOrigin>,
    /// The prompt as the LLM will see it. Interrupted partial text never
    /// enters. Shared: a request in flight holds the history it was made
    /// from without a copy, and a change copies it only while one does
    /// (`Arc::make_mut`).
    pub messages: Arc<Vec<Message>>,
    /// For each of `messages`, the seq of the event that started it: where
    /// in the log a compaction cuts (`compaction.rs`).
    #[serde(default)]
    pub message_seqs: Vec<Seq>,
    /// How many times a message already in `messages` was changed other
    /// than by appending to the last one (an approval that edited a call,
    /// a compaction, a rewind). While it stands still, the history only
    /// grows at its end, so a request may reuse the encoding of every
    /// message but the last that an earlier request sent
    /// (`wire::EncodedHistory`).
    #[serde(default)]
    pub history_edits: u64,
    /// The estimated tokens of every message in `messages` but the last
    /// (`tokens::message_tokens`): a message is settled once another
    /// follows it, and changes after that are counted afresh (the changes
    /// `history_edits` counts). So a request's prompt is counted from this
    /// and its last message ([`WorkingSet::history_tokens`]) instead of
    /// the whole history. Not stored: counted when a checkpoint is read.
    #[serde(skip)]
    pub settled_tokens: u64,
    pub last_seq: Seq,
    pub last_activity: Timestamp,
    /// Number of the latest turn started; 0 before the first.
    pub turn: u32,
    pub current_turn: Option<TurnInProgress>,
    /// Tool calls of the latest assistant message that have no result yet, in
    /// request order. Tools run serially, so the first is the one running or waiting.
    pub open_calls: Vec<ToolCall>,
    /// Seq of the `AssistantMessage` that made the calls of `open_calls`
    /// (0 before the first): unique in the log where a provider's tool call
    /// ids need not be, so a `spawn_agents` call's children are named
    /// after it (`Effect::SpawnSubAgents`).
    #[serde(default)]
    pub calls_seq: Seq,
    /// Open calls suspended on a human or a client, in order.
    pub pending: Vec<PendingCall>,
    /// Open calls a human approved that have not produced a result yet.
    pub approved: Vec<ToolCallId>,
    /// The latest resolutions, in order, kept after the call's result so
    /// that a resolution asked for again (a client retrying after a lost
    /// answer) is told apart from a different one (`transition/tools.rs`),
    /// whatever happened in between: the resolution may have ended its
    /// turn and a queued message started the next one in the same step.
    /// At most [`RESOLUTIONS_KEPT`]: bounded, never by the length of the
    /// log; an older one counts as settled.
    #[serde(default)]
    pub resolved: Vec<(ToolCallId, Decision)>,
    /// User messages that arrived mid-turn under `busy_policy = queue`; they
    /// join the prompt when the turn ends.
    pub queued: Vec<QueuedMessage>,
    /// Usage reported with the latest response.
    pub usage: Usage,
    /// Why the latest turn failed; cleared when a turn starts.
    pub last_error: Option<String>,
    /// Automatic resumes since the last user message (at most two in a row).
    pub consecutive_resumes: u32,
    /// Seqs of acknowledged, turn-triggering user messages that no turn has
    /// answered yet and no `Unanswered` event has let go: a debounce
    /// (`busy_policy = interrupt` waits 100 ms before starting the turn) or
    /// messages queued behind a turn that ended without answering them (a
    /// graceful shutdown). A restart under `recovery = resume` starts the
    /// turn for them.
    pub untriggered: Vec<Seq>,
    /// Seq of the latest `SessionStarted`: the causal parent of events
    /// recorded outside a turn.
    pub session: Option<Seq>,
    /// Set when a sub-agent reached its terminal state.
    pub outcome: Option<SubAgentOutcome>,
    /// The latest compaction in the log, for people: what the prompt was
    /// before it and became after it.
    #[serde(default)]
    pub last_compaction: Option<CompactionRecord>,
}

/// What a `Compacted` event did, as [`WorkingSet::last_compaction`] keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// The `Compacted` event's seq.
    pub seq: Seq,
    pub through_seq: Seq,
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// False when the messages were left out without a summary.
    pub summarised: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnInProgress {
    pub turn: u32,
    /// Seq of this turn's `TurnStarted`: the parent of the events inside it.
    pub started_seq: Seq,
    pub started_at: Timestamp,
    /// LLM responses received in this turn.
    pub responses: u32,
    /// A sub-agent's one grace turn has been granted.
    pub grace_used: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedMessage {
    pub seq: Seq,
    pub text: String,
    pub images: Vec<ImageRef>,
}

/// The durable status a log implies, without anything that lives only in a
/// running actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Idle,
    Error,
    /// A turn is in progress: streaming, retrying or running tools.
    TurnInFlight,
    AwaitingInput,
    Completed,
    Failed,
}

/// Why a sequence of events is not a conversation's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayError {
    Empty,
    /// The first event must be `Created` with seq 1.
    NotCreated {
        seq: Seq,
    },
    /// Seqs must run 1, 2, 3, … without gaps or repeats.
    Gap {
        expected: Seq,
        found: Seq,
    },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Empty => write!(f, "log is empty"),
            ReplayError::NotCreated { seq } => {
                write!(
                    f,
                    "log starts at seq {seq} with something other than Created"
                )
            }
            ReplayError::Gap { expected, found } => {
                write!(f, "log expected seq {expected} but found seq {found}")
            }
        }
    }
}

impl std::error::Error for ReplayError {}

impl WorkingSet {
    /// The working set right after `Created`, or `None` if `event` is not a
    /// `Created` at seq 1.
    pub fn from_created(event: &Event) -> Option<WorkingSet> {
        let EventKind::Created {
            conversation,
            cwd,
            config,
            parent_conversation,
            user_initiated,
            forked_from,
        } = &event.kind
        else {
            return None;
        };
        if event.seq != 1 {
            return None;
        }
        Some(WorkingSet {
            id: conversation.clone(),
            created_at: event.at,
            cwd: cwd.clone(),
            config: config.clone(),
            parent_conversation: parent_conversation.clone(),
            user_initiated: *user_initiated,
            forked_from: forked_from.clone(),
            messages: Arc::default(),
            message_seqs: Vec::new(),
            history_edits: 0,
            settled_tokens: 0,
            last_seq: 1,
            last_activity: event.at,
            turn: 0,
            current_turn: None,
            open_calls: Vec::new(),
            calls_seq: 0,
            pending: Vec::new(),
            approved: Vec::new(),
            resolved: Vec::new(),
            queued: Vec::new(),
            usage: Usage::default(),
            last_error: None,
            consecutive_resumes: 0,
            untriggered: Vec::new(),
            session: None,
            outcome: None,
            last_compaction: None,
        })
    }

    /// Rebuild a working set from a whole log.
    pub fn replay<'a>(
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<WorkingSet, ReplayError> {
        WorkingSet::replay_with(events, WorkingSet::apply)
    }

    /// [`replay`](WorkingSet::replay) of a log the caller gives up: the same
    /// working set, but strings, tool calls and results move out of the
    /// events instead of being copied. For rebuilds, which decode the log
    /// only to replay it.
    pub fn replay_owned(
        events: impl IntoIterator<Item = Event>,
    ) -> Result<WorkingSet, ReplayError> {
        WorkingSet::replay_with(events, WorkingSet::apply_owned)
    }

    /// Carry on from a working set built earlier (a checkpoint) with the
    /// events that followed it: the same working set as a replay of the
    /// whole log. The events must continue at `last_seq + 1` without gaps.
    pub fn resume_owned(
        self,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<WorkingSet, ReplayError> {
        self.fold_all(events, WorkingSet::apply_owned)
    }

    /// The checks both replays make (a log starts with `Created` and its
    /// seqs run without gaps), folding each event in with `apply`.
    fn replay_with<E: Borrow<Event>>(
        events: impl IntoIterator<Item = E>,
        apply: impl Fn(&mut WorkingSet, E),
    ) -> Result<WorkingSet, ReplayError> {
        let mut events = events.into_iter();
        let first = events.next().ok_or(ReplayError::Empty)?;
        let first = first.borrow();
        let working =
            WorkingSet::from_created(first).ok_or(ReplayError::NotCreated { seq: first.seq })?;
        working.fold_all(events, apply)
    }

    fn fold_all<E: Borrow<Event>>(
        mut self,
        events: impl IntoIterator<Item = E>,
        apply: impl Fn(&mut WorkingSet, E),
    ) -> Result<WorkingSet, ReplayError> {
        for event in events {
            let expected = self.last_seq + 1;
            let found = event.borrow().seq;
            if found != expected {
                return Err(ReplayError::Gap { expected, found });
            }
            apply(&mut self, event);
        }
        Ok(self)
    }

    pub fn is_sub_agent(&self) -> bool {
        self.parent_conversation.is_some()
    }

    pub fn status(&self) -> Status {
        match (&self.outcome, &self.current_turn) {
            (Some(SubAgentOutcome::Completed { .. }), _) => Status::Completed,
            (Some(SubAgentOutcome::Failed { .. }), _) => Status::Failed,
            (None, Some(_)) if !self.pending.is_empty() => Status::AwaitingInput,
            (None, Some(_)) => Status::TurnInFlight,
            (None, None) if self.last_error.is_some() => Status::Error,
            (None, None) => Status::Idle,
        }
    }

    /// The decision recorded for `tool_call_id` among the latest
    /// resolutions, if any.
    pub fn resolution(&self, tool_call_id: &ToolCallId) -> Option<&Decision> {
        self.resolved
            .iter()
            .find(|(id, _)| id == tool_call_id)
            .map(|(_, decision)| decision)
    }

    /// Whether the prompt holds a result for `tool_call_id`: the call was
    /// settled, by its tool, a resolution or keel (a cancel, a restart).
    pub fn has_result(&self, tool_call_id: &ToolCallId) -> bool {
        self.messages.iter().any(|message| {
            message.content.iter().any(|block| {
                matches!(block, ContentBlock::ToolResult { result } if result.tool_call_id == *tool_call_id)
            })
        })
    }

    /// Every `tool_use` in the prompt has its result: the prompt may be sent.
    pub fn tool_uses_paired(&self) -> bool {
        let mut open: Vec<&ToolCallId> = Vec::new();
        for message in self.messages.iter() {
            for block in &message.content {
                match block {
                    ContentBlock::ToolUse { call } => open.push(&call.id),
                    ContentBlock::ToolResult { result } => {
                        open.retain(|id| **id != result.tool_call_id);
                    }
                    ContentBlock::Text { .. }
                    | ContentBlock::Thinking { .. }
                    | ContentBlock::Image { .. } => {}
                }
            }
        }
        open.is_empty()
    }

    /// Fold one event in. Events must come in seq order; `replay` checks that.
    /// The caller keeps the event (the live path still has to append it), so
    /// whatever the working set keeps is copied.
    pub fn apply(&mut self, event: &Event) {
        self.fold(
            event.seq,
            event.at,
            event.triggers_turn,
            Payload::borrowed(&event.kind),
        );
    }

    /// [`apply`](WorkingSet::apply) of an event the caller gives up: the same
    /// result, with whatever the working set keeps moved out of the event.
    pub fn apply_owned(&mut self, event: Event) {
        let Event {
            seq,
            at,
            triggers_turn,
            kind,
            parent: _,
        } = event;
        self.fold(seq, at, triggers_turn, Payload::owned(kind));
    }

    /// The reducer itself, for borrowed and owned events alike.
    ///
    /// Inlined into `apply` and `apply_owned`, so that each is compiled for
    /// the payloads it makes and the `Cow`s cost nothing: called, `fold`
    /// made `replay` of a borrowed log run 2% more instructions than the
    /// reducer did before owned replay existed; inlined, 0.2%.
    #[inline(always)]
    fn fold(&mut self, seq: Seq, at: Timestamp, triggers_turn: bool, payload: Payload<'_>) {
        self.last_seq = seq;
        self.last_activity = at;
        match payload {
            // Created only ever starts a log; `from_created` handles it.
            Payload::Created | Payload::SessionEnded => {}
            Payload::SessionStarted => self.session = Some(seq),
            Payload::UserMessage { text, images } => {
                self.consecutive_resumes = 0;
                if self.current_turn.is_some() {
                    self.queued.push(QueuedMessage {
                        seq,
                        text: text.into_owned(),
                        images: images.into_owned(),
                    });
                } else {
                    self.push_user_text(seq, text.into_owned(), images.into_owned());
                    if triggers_turn {
                        self.untriggered.push(seq);
                    }
                }
            }
            Payload::TurnStarted { turn } => {
                self.turn = turn;
                self.current_turn = Some(TurnInProgress {
                    turn,
                    started_seq: seq,
                    started_at: at,
                    responses: 0,
                    grace_used: false,
                });
                self.last_error = None;
                // The turn answers every message owed so far: they are all
                // in the prompt it sends.
                self.untriggered.clear();
            }
            Payload::AssistantMessage { blocks, usage } => {
                // The calls are both prompt content and open calls: one of
                // the two is a copy even when the event is owned.
                self.open_calls = blocks
                    .iter()
                    .filter_map(|block| block.tool_call().cloned())
                    .collect();
                self.calls_seq = seq;
                let content = match blocks {
                    Cow::Borrowed(blocks) => {
                        blocks.iter().map(AssistantBlock::to_content).collect()
                    }
                    Cow::Owned(blocks) => blocks
                        .into_iter()
                        .map(AssistantBlock::into_content)
                        .collect(),
                };
                self.settle_last();
                Arc::make_mut(&mut self.messages).push(Message {
                    role: Role::Assistant,
                    content,
                });
                self.message_seqs.push(seq);
                self.usage = usage;
                if let Some(turn) = &mut self.current_turn {
                    turn.responses += 1;
                }
            }
            Payload::ToolResult {
                tool_call_id,
                content,
                is_error,
                images,
            } => {
                self.open_calls.retain(|call| call.id != *tool_call_id);
                self.pending
                    .retain(|pending| pending.call.id != *tool_call_id);
                self.approved.retain(|id| *id != *tool_call_id);
                self.push_user_block(
                    seq,
                    ContentBlock::ToolResult {
                        result: ToolResult {
                            tool_call_id: tool_call_id.into_owned(),
                            content: content.into_owned(),
                            is_error,
                            images: images.into_owned(),
                        },
                    },
                );
            }
            Payload::Suspended { pending } => self.pending.extend(pending.into_owned()),
            Payload::Resolved {
                tool_call_id,
                decision,
            } => {
                self.pending
                    .retain(|pending| pending.call.id != *tool_call_id);
                let tool_call_id = tool_call_id.into_owned();
                if let Decision::Edit { input } = decision.as_ref() {
                    self.edit_call(&tool_call_id, input);
                }
                if decision.runs_call() {
                    self.approved.push(tool_call_id.clone());
                }
                if self.resolved.len() == RESOLUTIONS_KEPT {
                    self.resolved.remove(0);
                }
                self.resolved.push((tool_call_id, decision.into_owned()));
            }
            Payload::TurnCompleted | Payload::TurnInterrupted => self.end_turn(),
            Payload::TurnFailed { error } => {
                self.end_turn();
                self.last_error = Some(error.into_owned());
            }
            Payload::ConfigChanged { config } => self.config = (*config).into_owned(),
            Payload::Recovered { action } => match action {
                RecoveryAction::RerunRequest | RecoveryAction::Redispatch => {
                    self.consecutive_resumes += 1;
                }
            },
            Payload::Nudge { reason, text } => {
                if reason == NudgeReason::TurnCap {
                    if let Some(turn) = &mut self.current_turn {
                        turn.grace_used = true;
                    }
                }
                self.push_user_block(
                    seq,
                    ContentBlock::Text {
                        text: text.into_owned(),
                    },
                );
            }
            Payload::Finished { outcome } => self.outcome = Some(outcome.into_owned()),
            Payload::DebounceCancelled => self.untriggered.clear(),
            Payload::Unanswered { messages } => {
                self.untriggered.retain(|seq| !messages.contains(seq));
            }
            Payload::Compacted {
                replaced_messages,
                summary,
                through_seq,
                tokens_before,
                tokens_after,
            } => {
                self.last_compaction = Some(CompactionRecord {
                    seq,
                    through_seq,
                    tokens_before,
                    tokens_after,
                    summarised: summary.is_some(),
                });
                self.history_edits += 1;
                compact(
                    Arc::make_mut(&mut self.messages),
                    &mut self.message_seqs,
                    replaced_messages as usize,
                    summary.as_deref(),
                );
                self.count_settled_tokens();
                // The provider's count described the prompt before.
                self.usage = Usage::default();
            }
            Payload::Rewound {
                messages,
                message_seqs,
            } => {
                // Rewinding is refused mid-turn, and a turn waiting on a
                // human is ended first: nothing of a turn is left to clear
                // but what a damaged log might hold.
                self.messages = Arc::new(messages.into_owned());
                self.message_seqs = message_seqs.into_owned();
                self.history_edits += 1;
                self.count_settled_tokens();
                self.current_turn = None;
                self.open_calls.clear();
                self.pending.clear();
                self.approved.clear();
                self.queued.clear();
                self.untriggered.clear();
                self.last_error = None;
                // The provider's count described the prompt before.
                self.usage = Usage::default();
            }
        }
    }

    /// An approval that changed the call's input: the call runs with it,
    /// and the history shows it so (the model's own message, as recorded,
    /// stays in the log).
    fn edit_call(&mut self, tool_call_id: &ToolCallId, input: &serde_json::Value) {
        for call in self
            .open_calls
            .iter_mut()
            .filter(|call| call.id == *tool_call_id)
        {
            call.input = input.clone();
        }
        let block = Arc::make_mut(&mut self.messages)
            .iter_mut()
            .rev()
            .filter(|message| message.role == Role::Assistant)
            .flat_map(|message| message.content.iter_mut())
            .find_map(|block| match block {
                ContentBlock::ToolUse { call } if call.id == *tool_call_id => Some(call),
                _ => None,
            });
        if let Some(call) = block {
            call.input = input.clone();
            self.history_edits += 1;
            self.count_settled_tokens();
        }
    }

    fn end_turn(&mut self) {
        self.current_turn = None;
        // Anything still open was closed by synthetic results before the turn
        // ended; clear defensively so a damaged log cannot wedge the state.
        self.pending.clear();
        self.approved.clear();
        // Messages queued during the turn join the prompt and are owed a
        // turn until one starts or an `Unanswered` event lets them go.
        for queued in std::mem::take(&mut self.queued) {
            self.untriggered.push(queued.seq);
            self.push_user_text(queued.seq, queued.text, queued.images);
        }
    }

    fn push_user_text(&mut self, seq: Seq, text: String, images: Vec<ImageRef>) {
        if !text.is_empty() {
            self.push_user_block(seq, ContentBlock::Text { text });
        }
        for image in images {
            self.push_user_block(seq, ContentBlock::Image { image });
        }
    }

    /// Append to the last user message, or start one (from the event at
    /// `seq`): roles must alternate.
    fn push_user_block(&mut self, seq: Seq, block: ContentBlock) {
        if let Some(message) = Arc::make_mut(&mut self.messages)
            .last_mut()
            .filter(|message| message.role == Role::User)
        {
            message.content.push(block);
            return;
        }
        self.settle_last();
        Arc::make_mut(&mut self.messages).push(Message {
            role: Role::User,
            content: vec![block],
        });
        self.message_seqs.push(seq);
    }

    /// The last message is about to be followed by another: its tokens
    /// join the settled ones.
    fn settle_last(&mut self) {
        if let Some(last) = self.messages.last() {
            self.settled_tokens += tokens::message_tokens(last);
        }
    }

    /// Count the settled messages' tokens afresh, after a change to a
    /// message before the last (or a working set read from a checkpoint).
    pub(crate) fn count_settled_tokens(&mut self) {
        let settled = self.messages.len().saturating_sub(1);
        self.settled_tokens = tokens::messages_tokens(&self.messages[..settled]);
    }

    /// The estimated tokens of the whole history (`tokens.rs`): the
    /// settled messages' and the last one's.
    pub fn history_tokens(&self) -> u64 {
        self.settled_tokens + self.messages.last().map_or(0, tokens::message_tokens)
    }
}

/// The text the model reads in place of the messages a compaction
/// replaced (docs/compaction.md); changing it changes the reducer.
pub fn summary_text(summary: Option<&str>) -> String {
    match summary {
        Some(summary) => format!(
            "[keel: the earlier part of this conversation was compacted to fit the context \
             window. A summary of it follows.]\n{summary}\n[keel: end of the summary; the \
             conversation goes on from here.]"
        ),
        None => "[keel: the earlier part of this conversation was left out to fit the context \
                 window; no summary of it could be made. Ask the user for anything you need \
                 from it.]"
            .to_owned(),
    }
}

/// A `Compacted` event folded in: the first `replaced` messages (and their seqs) go,
/// and the summary's text opens the first message kept (a user message, as
/// a plan's cut always is; one is made if a damaged log cut elsewhere).
pub(crate) fn compact(
    messages: &mut Vec<Message>,
    seqs: &mut Vec<Seq>,
    replaced: usize,
    summary: Option<&str>,
) {
    let replaced = replaced.min(messages.len());
    let first_replaced_seq = seqs.first().copied();
    messages.drain(..replaced);
    seqs.drain(..replaced.min(seqs.len()));
    let note = ContentBlock::Text {
        text: summary_text(summary),
    };
    match messages.first_mut() {
        Some(first) if first.role == Role::User => first.content.insert(0, note),
        _ => {
            messages.insert(
                0,
                Message {
                    role: Role::User,
                    content: vec![note],
                },
            );
            seqs.insert(0, first_replaced_seq.unwrap_or(0));
        }
    }
}

/// What the reducer reads of an event's kind, one variant per [`EventKind`].
/// Every value the working set keeps is a `Cow`: borrowed from an event the
/// caller keeps ([`WorkingSet::apply`]), owned when the caller gives the
/// event up ([`WorkingSet::apply_owned`]), so that `into_owned` copies only
/// in the first case. The two constructors only take the event apart; what
/// happens to each value is decided once, in [`WorkingSet::fold`].
enum Payload<'a> {
    Created,
    SessionStarted,
    SessionEnded,
    UserMessage {
        text: Cow<'a, str>,
        images: Cow<'a, [ImageRef]>,
    },
    TurnStarted {
        turn: u32,
    },
    AssistantMessage {
        blocks: Cow<'a, [AssistantBlock]>,
        usage: Usage,
    },
    ToolResult {
        tool_call_id: Cow<'a, ToolCallId>,
        content: Cow<'a, str>,
        is_error: bool,
        images: Cow<'a, [ImageRef]>,
    },
    Suspended {
        pending: Cow<'a, [PendingCall]>,
    },
    Resolved {
        tool_call_id: Cow<'a, ToolCallId>,
        decision: Cow<'a, Decision>,
    },
    TurnCompleted,
    TurnInterrupted,
    TurnFailed {
        error: Cow<'a, str>,
    },
    /// Boxed: a config is the largest value an event holds, and changes
    /// are rare; every other event's payload stays small.
    ConfigChanged {
        config: Box<Cow<'a, ConversationConfig>>,
    },
    Recovered {
        action: RecoveryAction,
    },
    Nudge {
        reason: NudgeReason,
        text: Cow<'a, str>,
    },
    Finished {
        outcome: Cow<'a, SubAgentOutcome>,
    },
    DebounceCancelled,
    Unanswered {
        messages: Cow<'a, [Seq]>,
    },
    Compacted {
        replaced_messages: u32,
        summary: Option<Cow<'a, str>>,
        through_seq: Seq,
        tokens_before: u64,
        tokens_after: u64,
    },
    Rewound {
        messages: Cow<'a, [Message]>,
        message_seqs: Cow<'a, [Seq]>,
    },
}

impl<'a> Payload<'a> {
    fn borrowed(kind: &'a EventKind) -> Payload<'a> {
        match kind {
            EventKind::Created { .. } => Payload::Created,
            EventKind::SessionStarted => Payload::SessionStarted,
            EventKind::SessionEnded => Payload::SessionEnded,
            EventKind::UserMessage { text, images } => Payload::UserMessage {
                text: Cow::Borrowed(text.as_str()),
                images: Cow::Borrowed(images.as_slice()),
            },
            EventKind::TurnStarted { turn } => Payload::TurnStarted { turn: *turn },
            EventKind::AssistantMessage { blocks, usage, .. } => Payload::AssistantMessage {
                blocks: Cow::Borrowed(blocks.as_slice()),
                usage: *usage,
            },
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                images,
                ..
            } => Payload::ToolResult {
                tool_call_id: Cow::Borrowed(tool_call_id),
                content: Cow::Borrowed(content.as_str()),
                is_error: *is_error,
                images: Cow::Borrowed(images.as_slice()),
            },
            EventKind::Suspended { pending } => Payload::Suspended {
                pending: Cow::Borrowed(pending.as_slice()),
            },
            EventKind::Resolved {
                tool_call_id,
                decision,
                ..
            } => Payload::Resolved {
                tool_call_id: Cow::Borrowed(tool_call_id),
                decision: Cow::Borrowed(decision),
            },
            EventKind::TurnCompleted { .. } => Payload::TurnCompleted,
            EventKind::TurnInterrupted { .. } => Payload::TurnInterrupted,
            EventKind::TurnFailed { error, .. } => Payload::TurnFailed {
                error: Cow::Borrowed(error.as_str()),
            },
            EventKind::ConfigChanged { config } => Payload::ConfigChanged {
                config: Box::new(Cow::Borrowed(config)),
            },
            EventKind::Recovered { action } => Payload::Recovered { action: *action },
            EventKind::Nudge { reason, text } => Payload::Nudge {
                reason: *reason,
                text: Cow::Borrowed(text.as_str()),
            },
            EventKind::Finished { outcome } => Payload::Finished {
                outcome: Cow::Borrowed(outcome),
            },
            EventKind::DebounceCancelled => Payload::DebounceCancelled,
            EventKind::Unanswered { messages, .. } => Payload::Unanswered {
                messages: Cow::Borrowed(messages.as_slice()),
            },
            EventKind::Compacted {
                replaced_messages,
                summary,
                through_seq,
                tokens_before,
                tokens_after,
            } => Payload::Compacted {
                replaced_messages: *replaced_messages,
                summary: summary.as_deref().map(Cow::Borrowed),
                through_seq: *through_seq,
                tokens_before: *tokens_before,
                tokens_after: *tokens_after,
            },
            EventKind::Rewound {
                messages,
                message_seqs,
                ..
            } => Payload::Rewound {
                messages: Cow::Borrowed(messages.as_slice()),
                message_seqs: Cow::Borrowed(message_seqs.as_slice()),
            },
        }
    }

    fn owned(kind: EventKind) -> Payload<'static> {
        match kind {
            EventKind::Created { .. } => Payload::Created,
            EventKind::SessionStarted => Payload::SessionStarted,
            EventKind::SessionEnded => Payload::SessionEnded,
            EventKind::UserMessage { text, images } => Payload::UserMessage {
                text: Cow::Owned(text),
                images: Cow::Owned(images),
            },
            EventKind::TurnStarted { turn } => Payload::TurnStarted { turn },
            EventKind::AssistantMessage { blocks, usage, .. } => Payload::AssistantMessage {
                blocks: Cow::Owned(blocks),
                usage,
            },
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                images,
                ..
            } => Payload::ToolResult {
                tool_call_id: Cow::Owned(tool_call_id),
                content: Cow::Owned(content),
                is_error,
                images: Cow::Owned(images),
            },
            EventKind::Suspended { pending } => Payload::Suspended {
                pending: Cow::Owned(pending),
            },
            EventKind::Resolved {
                tool_call_id,
                decision,
                ..
            } => Payload::Resolved {
                tool_call_id: Cow::Owned(tool_call_id),
                decision: Cow::Owned(decision),
            },
            EventKind::TurnCompleted { .. } => Payload::TurnCompleted,
            EventKind::TurnInterrupted { .. } => Payload::TurnInterrupted,
            EventKind::TurnFailed { error, .. } => Payload::TurnFailed {
                error: Cow::Owned(error),
            },
            EventKind::ConfigChanged { config } => Payload::ConfigChanged {
                config: Box::new(Cow::Owned(config)),
            },
            EventKind::Recovered { action } => Payload::Recovered { action },
            EventKind::Nudge { reason, text } => Payload::Nudge {
                reason,
                text: Cow::Owned(text),
            },
            EventKind::Finished { outcome } => Payload::Finished {
                outcome: Cow::Owned(outcome),
            },
            EventKind::DebounceCancelled => Payload::DebounceCancelled,
            EventKind::Unanswered { messages, .. } => Payload::Unanswered {
                messages: Cow::Owned(messages),
            },
            EventKind::Compacted {
                replaced_messages,
                summary,
                through_seq,
                tokens_before,
                tokens_after,
            } => Payload::Compacted {
                replaced_messages,
                summary: summary.map(Cow::Owned),
                through_seq,
                tokens_before,
                tokens_after,
            },
            EventKind::Rewound {
                messages,
                message_seqs,
                ..
            } => Payload::Rewound {
                messages: Cow::Owned(messages),
                message_seqs: Cow::Owned(message_seqs),
            },
        }
    }
}
