//! The conversation as the state machine sees it: the working set (derived
//! from the log) plus the phase, which holds what only a running actor knows
//! (which request is streaming, the partial text, the retry clock).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::compaction::Plan;
use crate::ids::{Seq, ToolCallId};
use crate::reducer::{Status, WorkingSet};
use crate::time::Timestamp;

#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub working: WorkingSet,
    pub phase: Phase,
    /// Attempt number of the next LLM request. Monotonic within one actor's
    /// life, so a late message from any earlier request of that life is
    /// recognisably stale. A rebuilt conversation starts again at 1: the
    /// workers of a previous life died with its actor and cannot report here.
    pub(crate) next_attempt: u32,
}

/// Names one LLM request: every message from its stream worker carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Generation {
    pub turn: u32,
    pub attempt: u32,
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "turn {} attempt {}", self.turn, self.attempt)
    }
}

/// Which configured provider a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    Primary,
    Fallback,
}

/// One LLM request and where it stands in its retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub generation: Generation,
    pub slot: Slot,
    /// Retries already spent on this slot.
    pub retries: u32,
    /// Set when this is a summary request: the compaction it serves
    /// (docs/compaction.md). The turn's own request follows it.
    pub compaction: Option<Plan>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    Idle,
    /// `busy_policy = interrupt`: a message came in; the turn starts when
    /// 100 ms pass without another, so a burst of messages gets one turn
    /// (docs/requirements.md, "Interrupt with a 100 ms debounce").
    Debouncing {
        /// Seq of the latest message; only its timer may start the turn.
        token: Seq,
    },
    Streaming {
        request: Request,
        /// Text streamed so far, recorded only if the turn is interrupted.
        partial: String,
    },
    RetryWait {
        /// The request to send when the timer fires.
        next: Request,
        until: Timestamp,
    },
    /// Running the first of `working.open_calls`; the rest wait their turn.
    ExecutingTools {
        current: ToolCallId,
        /// The end of the tool's output so far, for its result if cancelled.
        output_tail: String,
    },
    /// Waiting on `working.pending`.
    AwaitingInput,
    /// Rebuilt from a log that ends mid-turn; `Input::Started` decides.
    Recovering,
    /// The latest turn failed; a new message continues the conversation.
    Error {
        message: String,
    },
    Terminating,
    /// A sub-agent submitted its result. Terminal.
    Completed {
        result: String,
    },
    /// A sub-agent failed, timed out or was cancelled. Terminal.
    Failed {
        reason: String,
    },
}

/// The phase's name, as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    Idle,
    Debouncing,
    Streaming,
    RetryWait,
    ExecutingTools,
    AwaitingInput,
    Recovering,
    Error,
    Terminating,
    Completed,
    Failed,
    /// A compaction a user asked for is under way (its summary request
    /// streams or waits to be retried); no turn runs.
    Compacting,
}

impl StateName {
    pub fn as_str(self) -> &'static str {
        match self {
            StateName::Idle => "idle",
            StateName::Debouncing => "debouncing",
            StateName::Streaming => "streaming",
            StateName::RetryWait => "retry_wait",
            StateName::ExecutingTools => "executing_tools",
            StateName::AwaitingInput => "awaiting_input",
            StateName::Recovering => "recovering",
            StateName::Error => "error",
            StateName::Terminating => "terminating",
            StateName::Completed => "completed",
            StateName::Failed => "failed",
            StateName::Compacting => "compacting",
        }
    }
}

impl fmt::Display for StateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Phase {
    pub fn name(&self) -> StateName {
        if self.compacting_on_demand() {
            return StateName::Compacting;
        }
        match self {
            Phase::Idle => StateName::Idle,
            Phase::Debouncing { .. } => StateName::Debouncing,
            Phase::Streaming { .. } => StateName::Streaming,
            Phase::RetryWait { .. } => StateName::RetryWait,
            Phase::ExecutingTools { .. } => StateName::ExecutingTools,
            Phase::AwaitingInput => StateName::AwaitingInput,
            Phase::Recovering => StateName::Recovering,
            Phase::Error { .. } => StateName::Error,
            Phase::Terminating => StateName::Terminating,
            Phase::Completed { .. } => StateName::Completed,
            Phase::Failed { .. } => StateName::Failed,
        }
    }

    /// Whether this phase serves a compaction a user asked for, outside any
    /// turn (`Input::Compact`).
    pub fn compacting_on_demand(&self) -> bool {
        let request = match self {
            Phase::Streaming { request, .. } => request,
            Phase::RetryWait { next, .. } => next,
            _ => return false,
        };
        request.compaction.is_some_and(|plan| plan.on_demand)
    }

    /// Completed and Failed absorb every input.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Phase::Completed { .. } | Phase::Failed { .. })
    }

    /// The phase a freshly rebuilt conversation is in.
    pub fn from_status(working: &WorkingSet) -> Phase {
        match working.status() {
            Status::Idle => Phase::Idle,
            Status::Error => Phase::Error {
                message: working.last_error.clone().unwrap_or_default(),
            },
            Status::TurnInFlight => Phase::Recovering,
            Status::AwaitingInput => Phase::AwaitingInput,
            Status::Completed | Status::Failed => match &working.outcome {
                Some(crate::event::SubAgentOutcome::Completed { result }) => Phase::Completed {
                    result: result.clone(),
                },
                Some(crate::event::SubAgentOutcome::Failed { reason }) => Phase::Failed {
                    reason: reason.clone(),
                },
                None => Phase::Idle,
            },
        }
    }

    /// Whether this phase agrees with the durable status of the log. A
    /// debounce may sit over an idle or failed log; a request or tools need a
    /// turn in flight.
    pub fn agrees_with(&self, status: Status) -> bool {
        if self.compacting_on_demand() {
            return matches!(status, Status::Idle | Status::Error);
        }
        match self {
            Phase::Idle => status == Status::Idle,
            Phase::Debouncing { .. } => matches!(status, Status::Idle | Status::Error),
            Phase::Streaming { .. }
            | Phase::RetryWait { .. }
            | Phase::ExecutingTools { .. }
            | Phase::Recovering => status == Status::TurnInFlight,
            Phase::AwaitingInput => status == Status::AwaitingInput,
            Phase::Error { .. } => status == Status::Error,
            Phase::Terminating => {
                matches!(status, Status::Idle | Status::Error | Status::AwaitingInput)
            }
            Phase::Completed { .. } => status == Status::Completed,
            Phase::Failed { .. } => status == Status::Failed,
        }
    }
}

impl Conversation {
    /// A conversation rebuilt from its log, before `Input::Started`.
    pub fn rehydrate(working: WorkingSet) -> Conversation {
        let phase = Phase::from_status(&working);
        Conversation {
            working,
            phase,
            next_attempt: 1,
        }
    }

    /// Replay a whole log into a conversation ready for `Input::Started`.
    pub fn replay<'a>(
        events: impl IntoIterator<Item = &'a crate::event::Event>,
    ) -> Result<Conversation, crate::reducer::ReplayError> {
        WorkingSet::replay(events).map(Conversation::rehydrate)
    }

    pub fn state_name(&self) -> StateName {
        self.phase.name()
    }
}
