//! The reducer: folds canonical events into the working set, everything a
//! live conversation needs to carry on (seed 002's "ReducedContext").
//!
//! The transition function never edits the working set directly: it emits
//! events and applies them through [`WorkingSet::apply`], the same code replay
//! runs. That is what makes `replay(log) == live state` hold by construction.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::ConversationConfig;
use crate::event::{Decision, Event, EventKind, Outcome, PendingCall, RecoveryAction};
use crate::ids::{ConversationId, Seq, ToolCallId};
use crate::message::{ContentBlock, ImageRef, Message, Role, ToolCall, ToolResult, Usage};
use crate::time::Timestamp;

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
    /// The prompt as the LLM will see it. Interrupted partial text never enters.
    pub messages: Vec<Message>,
    pub last_seq: Seq,
    pub last_activity: Timestamp,
    /// Number of the latest turn started; 0 before the first.
    pub turn: u32,
    pub current_turn: Option<TurnInProgress>,
    /// Tool calls of the latest assistant message that have no result yet, in
    /// request order. Tools run serially, so the first is the one running or waiting.
    pub open_calls: Vec<ToolCall>,
    /// Open calls suspended on a human or a client, in order.
    pub pending: Vec<PendingCall>,
    /// Open calls a human approved that have not produced a result yet.
    pub approved: Vec<ToolCallId>,
    /// User messages that arrived mid-turn under `busy_policy = queue`; they
    /// join the prompt when the turn ends.
    pub queued: Vec<QueuedMessage>,
    /// Usage reported with the latest response.
    pub usage: Usage,
    /// Why the latest turn failed; cleared when a turn starts.
    pub last_error: Option<String>,
    /// Automatic resumes since the last user message (at most two in a row).
    pub consecutive_resumes: u32,
    /// Seq of a turn-triggering user message that no turn has picked up yet
    /// (`busy_policy = interrupt` waits 100 ms before starting the turn). A
    /// restart under `recovery = resume` starts the turn for it.
    pub untriggered: Option<Seq>,
    /// Set when a sub-agent reached its terminal state.
    pub outcome: Option<Outcome>,
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
            messages: Vec::new(),
            last_seq: 1,
            last_activity: event.at,
            turn: 0,
            current_turn: None,
            open_calls: Vec::new(),
            pending: Vec::new(),
            approved: Vec::new(),
            queued: Vec::new(),
            usage: Usage::default(),
            last_error: None,
            consecutive_resumes: 0,
            untriggered: None,
            outcome: None,
        })
    }

    /// Rebuild a working set from a whole log.
    pub fn replay<'a>(
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<WorkingSet, ReplayError> {
        let mut events = events.into_iter();
        let first = events.next().ok_or(ReplayError::Empty)?;
        let mut working =
            WorkingSet::from_created(first).ok_or(ReplayError::NotCreated { seq: first.seq })?;
        for event in events {
            let expected = working.last_seq + 1;
            if event.seq != expected {
                return Err(ReplayError::Gap {
                    expected,
                    found: event.seq,
                });
            }
            working.apply(event);
        }
        Ok(working)
    }

    pub fn is_sub_agent(&self) -> bool {
        self.parent_conversation.is_some()
    }

    pub fn status(&self) -> Status {
        match (&self.outcome, &self.current_turn) {
            (Some(Outcome::Completed { .. }), _) => Status::Completed,
            (Some(Outcome::Failed { .. }), _) => Status::Failed,
            (None, Some(_)) if !self.pending.is_empty() => Status::AwaitingInput,
            (None, Some(_)) => Status::TurnInFlight,
            (None, None) if self.last_error.is_some() => Status::Error,
            (None, None) => Status::Idle,
        }
    }

    /// Every `tool_use` in the prompt has its result: the prompt may be sent.
    pub fn tool_uses_paired(&self) -> bool {
        let mut open: Vec<&ToolCallId> = Vec::new();
        for message in &self.messages {
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
    pub fn apply(&mut self, event: &Event) {
        self.last_seq = event.seq;
        self.last_activity = event.at;
        match &event.kind {
            // Created only ever starts a log; `from_created` handles it.
            EventKind::Created { .. } | EventKind::SessionStarted | EventKind::SessionEnded => {}
            EventKind::UserMessage { text, images } => {
                self.consecutive_resumes = 0;
                if self.current_turn.is_some() {
                    self.queued.push(QueuedMessage {
                        seq: event.seq,
                        text: text.clone(),
                        images: images.clone(),
                    });
                } else {
                    self.push_user_text(text, images);
                    if event.triggers_turn {
                        self.untriggered = Some(event.seq);
                    }
                }
            }
            EventKind::TurnStarted { turn } => {
                self.turn = *turn;
                self.current_turn = Some(TurnInProgress {
                    turn: *turn,
                    started_seq: event.seq,
                    started_at: event.at,
                    responses: 0,
                    grace_used: false,
                });
                self.last_error = None;
                self.untriggered = None;
            }
            EventKind::AssistantMessage { blocks, usage, .. } => {
                self.messages.push(Message {
                    role: Role::Assistant,
                    content: blocks.iter().map(|block| block.to_content()).collect(),
                });
                self.open_calls = blocks
                    .iter()
                    .filter_map(|block| block.tool_call().cloned())
                    .collect();
                self.usage = *usage;
                if let Some(turn) = &mut self.current_turn {
                    turn.responses += 1;
                }
            }
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                ..
            } => {
                self.open_calls.retain(|call| call.id != *tool_call_id);
                self.pending
                    .retain(|pending| pending.call.id != *tool_call_id);
                self.approved.retain(|id| id != tool_call_id);
                self.push_user_block(ContentBlock::ToolResult {
                    result: ToolResult {
                        tool_call_id: tool_call_id.clone(),
                        content: content.clone(),
                        is_error: *is_error,
                    },
                });
            }
            EventKind::Suspended { pending } => self.pending.extend(pending.iter().cloned()),
            EventKind::Resolved {
                tool_call_id,
                decision,
            } => {
                self.pending
                    .retain(|pending| pending.call.id != *tool_call_id);
                if *decision == Decision::Approve {
                    self.approved.push(tool_call_id.clone());
                }
            }
            EventKind::TurnCompleted { .. } | EventKind::TurnInterrupted { .. } => self.end_turn(),
            EventKind::TurnFailed { error, .. } => {
                self.end_turn();
                self.last_error = Some(error.clone());
            }
            EventKind::ConfigChanged { config } => self.config = config.clone(),
            EventKind::Recovered { action } => match action {
                RecoveryAction::RerunRequest | RecoveryAction::Redispatch => {
                    self.consecutive_resumes += 1;
                }
            },
            EventKind::Nudge { reason, text } => {
                if *reason == crate::event::NudgeReason::TurnCap {
                    if let Some(turn) = &mut self.current_turn {
                        turn.grace_used = true;
                    }
                }
                self.push_user_block(ContentBlock::Text { text: text.clone() });
            }
            EventKind::Finished { outcome } => self.outcome = Some(outcome.clone()),
            EventKind::DebounceCancelled => self.untriggered = None,
        }
    }

    fn end_turn(&mut self) {
        self.current_turn = None;
        // Anything still open was closed by synthetic results before the turn
        // ended; clear defensively so a damaged log cannot wedge the state.
        self.pending.clear();
        self.approved.clear();
        for queued in std::mem::take(&mut self.queued) {
            self.push_user_text(&queued.text, &queued.images);
        }
    }

    fn push_user_text(&mut self, text: &str, images: &[ImageRef]) {
        if !text.is_empty() {
            self.push_user_block(ContentBlock::Text {
                text: text.to_owned(),
            });
        }
        for image in images {
            self.push_user_block(ContentBlock::Image {
                image: image.clone(),
            });
        }
    }

    /// Append to the last user message, or start one: roles must alternate.
    fn push_user_block(&mut self, block: ContentBlock) {
        match self.messages.last_mut() {
            Some(message) if message.role == Role::User => message.content.push(block),
            _ => self.messages.push(Message {
                role: Role::User,
                content: vec![block],
            }),
        }
    }
}
