//! The index of conversations: one small entry per conversation, updated in
//! the same atomic batch as the events it summarises, so a restart knows
//! which conversations to recover without scanning every log.

use serde::{Deserialize, Serialize};

use keel_core::event::{Event, EventKind, SubAgentOutcome};
use keel_core::ids::{ConversationId, Seq, ToolCallId};
use keel_core::reducer::Status;
use keel_core::time::Timestamp;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub id: ConversationId,
    pub created_at: Timestamp,
    /// Set for sub-agents.
    pub parent: Option<ConversationId>,
    /// False for sub-agents, which normal listings leave out.
    pub user_initiated: bool,
    /// Time of the last event. Stored as of the last rewrite of the entry;
    /// `EventLog::index_entry` and `list` report it from the log.
    pub last_activity: Timestamp,
    /// Seq of the last event, kept current the same way.
    pub last_seq: Seq,
    /// A turn was in progress (streaming, running tools or waiting on a
    /// human) at the last append: a restart must look at this conversation.
    pub turn_in_flight: bool,
    /// A sub-agent reached `Completed` or `Failed`.
    pub finished: bool,
    /// A user message was acknowledged and no turn has started for it since,
    /// nor an `Unanswered` event let it go: a restart must give it its turn
    /// (or record why not) even though no turn is in flight.
    #[serde(default)]
    pub turn_owed: bool,
    /// The working directory, fixed at creation. (Empty in entries written
    /// before it was recorded.)
    #[serde(default)]
    pub cwd: String,
    /// The number of the latest turn started: how many turns there were.
    #[serde(default)]
    pub turns: u32,
    /// The calls of the turn in flight waiting on a human or a client.
    #[serde(default)]
    pub pending: Vec<ToolCallId>,
    /// The last turn failed (the conversation rests in `error`).
    #[serde(default)]
    pub last_turn_failed: bool,
    /// The sub-agent finished with `Failed` (with `finished`).
    #[serde(default)]
    pub failed: bool,
}

impl IndexEntry {
    /// The entry a `Created` event starts.
    pub fn created(event: &Event) -> Option<IndexEntry> {
        match &event.kind {
            EventKind::Created {
                conversation,
                cwd,
                parent_conversation,
                user_initiated,
                ..
            } => Some(IndexEntry {
                cwd: cwd.clone(),
                turns: 0,
                pending: Vec::new(),
                last_turn_failed: false,
                failed: false,
                id: conversation.clone(),
                created_at: event.at,
                parent: parent_conversation.clone(),
                user_initiated: *user_initiated,
                last_activity: event.at,
                last_seq: event.seq,
                turn_in_flight: false,
                finished: false,
                turn_owed: false,
            }),
            _ => None,
        }
    }

    /// Equal in everything but the log position and time, which readers
    /// take from the log.
    pub fn same_facts(&self, other: &IndexEntry) -> bool {
        self.id == other.id
            && self.created_at == other.created_at
            && self.parent == other.parent
            && self.user_initiated == other.user_initiated
            && self.turn_in_flight == other.turn_in_flight
            && self.finished == other.finished
            && self.turn_owed == other.turn_owed
            && self.cwd == other.cwd
            && self.turns == other.turns
            && self.pending == other.pending
            && self.last_turn_failed == other.last_turn_failed
            && self.failed == other.failed
    }

    /// The status the log implies, as `WorkingSet::status` gives it from
    /// the whole log: what a listing shows for a conversation no actor
    /// serves.
    pub fn status(&self) -> Status {
        match (self.finished, self.turn_in_flight) {
            (true, _) if self.failed => Status::Failed,
            (true, _) => Status::Completed,
            (false, true) if !self.pending.is_empty() => Status::AwaitingInput,
            (false, true) => Status::TurnInFlight,
            (false, false) if self.last_turn_failed => Status::Error,
            (false, false) => Status::Idle,
        }
    }

    /// Whether a runtime starting up must start this conversation: a turn
    /// was in flight, or a message is owed its turn, and it has not finished.
    pub fn needs_recovery(&self) -> bool {
        (self.turn_in_flight || self.turn_owed) && !self.finished
    }

    pub fn apply(&mut self, event: &Event) {
        self.last_activity = event.at;
        self.last_seq = event.seq;
        match &event.kind {
            EventKind::TurnStarted { turn } => {
                self.turn_in_flight = true;
                self.turn_owed = false;
                self.turns = *turn;
                self.last_turn_failed = false;
            }
            EventKind::UserMessage { .. } if event.triggers_turn => self.turn_owed = true,
            EventKind::Unanswered { .. } | EventKind::DebounceCancelled => self.turn_owed = false,
            EventKind::TurnCompleted { .. } | EventKind::TurnInterrupted { .. } => {
                self.turn_in_flight = false;
                self.pending.clear();
            }
            EventKind::TurnFailed { .. } => {
                self.turn_in_flight = false;
                self.pending.clear();
                self.last_turn_failed = true;
            }
            EventKind::Suspended { pending } => self
                .pending
                .extend(pending.iter().map(|pending| pending.call.id.clone())),
            EventKind::ToolResult { tool_call_id, .. }
            | EventKind::Resolved { tool_call_id, .. } => {
                self.pending.retain(|id| id != tool_call_id);
            }
            // As the reducer: nothing of a turn is left, and the
            // conversation rests without an error.
            EventKind::Rewound { .. } => {
                self.turn_in_flight = false;
                self.turn_owed = false;
                self.pending.clear();
                self.last_turn_failed = false;
            }
            EventKind::Finished { outcome } => {
                self.finished = true;
                self.failed = matches!(outcome, SubAgentOutcome::Failed { .. });
            }
            EventKind::Created { .. }
            | EventKind::SessionStarted
            | EventKind::SessionEnded
            | EventKind::UserMessage { .. }
            | EventKind::AssistantMessage { .. }
            | EventKind::ConfigChanged { .. }
            | EventKind::Recovered { .. }
            | EventKind::Nudge { .. }
            | EventKind::Compacted { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use keel_core::config::BusyPolicy;
    use keel_core::{
        create, transition, ConversationConfig, ConversationId, Input, NewConversation, Timestamp,
    };

    use super::IndexEntry;

    fn message(text: &str) -> Input {
        Input::UserMessage {
            text: text.to_owned(),
            images: vec![],
        }
    }

    /// A message whose debounce has not started its turn yet, or one a
    /// graceful stop left owed, must bring the conversation back at boot
    /// though no turn is in flight; a turn that starts, or an `Unanswered`
    /// event, settles it.
    #[test]
    fn an_acknowledged_message_without_a_turn_needs_recovery() {
        let step = create(
            NewConversation {
                id: ConversationId::new("c").unwrap(),
                cwd: "/tmp".to_owned(),
                config: ConversationConfig {
                    busy_policy: BusyPolicy::Interrupt,
                    ..ConversationConfig::default()
                },
                parent_conversation: None,
            },
            Timestamp(1),
        );
        let mut entry = IndexEntry::created(&step.appended()[0]).unwrap();
        let apply = |step: &keel_core::Step, entry: &mut IndexEntry| {
            for event in step.appended() {
                entry.apply(event);
            }
        };
        apply(&step, &mut entry);
        assert!(!entry.needs_recovery());

        let debouncing = transition(step.state, message("hi"), Timestamp(2));
        apply(&debouncing, &mut entry);
        assert!(!entry.turn_in_flight);
        assert!(entry.turn_owed && entry.needs_recovery());

        let cancelled = transition(debouncing.state.clone(), Input::Cancel, Timestamp(3));
        let mut after_cancel = entry.clone();
        apply(&cancelled, &mut after_cancel);
        assert!(!after_cancel.needs_recovery(), "Unanswered lets it go");

        let timer = match debouncing.effects.iter().find_map(|effect| match effect {
            keel_core::Effect::SetTimer { timer, .. } => Some(*timer),
            _ => None,
        }) {
            Some(timer) => timer,
            None => panic!("no debounce timer"),
        };
        let started = transition(
            debouncing.state,
            Input::TimerFired { timer },
            Timestamp(200),
        );
        apply(&started, &mut entry);
        assert!(entry.turn_in_flight && !entry.turn_owed);
    }

    /// What a listing shows for a conversation no actor serves comes from
    /// the index alone: it must agree with the status, turn count and
    /// directory the whole log gives (`WorkingSet`), after every step of a
    /// turn that waits for an approval, one that fails, and one that
    /// completes.
    #[test]
    fn the_entry_knows_what_the_log_says_of_status_turns_and_cwd() {
        use keel_core::config::{ProviderKind, ToolPolicy};
        use keel_core::event::Decision;
        use keel_core::ids::ToolCallId;
        use keel_core::message::{AssistantBlock, StopReason, ToolCall, Usage};
        use keel_core::state::Phase;
        use keel_core::{AssistantResponse, Conversation, LlmFailure, Step};

        struct Run {
            conversation: Option<Conversation>,
            entry: IndexEntry,
            now: u64,
        }
        impl Run {
            fn step(&mut self, input: Input) {
                self.now += 10;
                let step: Step = transition(
                    self.conversation.take().unwrap(),
                    input,
                    Timestamp(self.now),
                );
                for event in step.appended() {
                    self.entry.apply(event);
                }
                self.conversation = Some(step.state);
                let working = &self.conversation.as_ref().unwrap().working;
                assert_eq!(self.entry.status(), working.status(), "{:?}", self.entry);
                assert_eq!(self.entry.turns, working.turn);
                assert_eq!(self.entry.cwd, working.cwd);
            }
            fn generation(&self) -> keel_core::Generation {
                match &self.conversation.as_ref().unwrap().phase {
                    Phase::Streaming { request, .. } => request.generation,
                    other => panic!("not streaming: {other:?}"),
                }
            }
            fn respond(&mut self, blocks: Vec<AssistantBlock>, stop_reason: StopReason) {
                let generation = self.generation();
                self.step(Input::StreamFinished {
                    generation,
                    response: AssistantResponse {
                        blocks,
                        stop_reason,
                        usage: Usage::default(),
                        provider: ProviderKind::Mock,
                        model: "mock".to_owned(),
                    },
                });
            }
        }

        let mut config = ConversationConfig::default();
        config.tools.insert("bash".to_owned(), ToolPolicy::Approve);
        let created = create(
            NewConversation {
                id: ConversationId::new("c").unwrap(),
                cwd: "/srv/work".to_owned(),
                config,
                parent_conversation: None,
            },
            Timestamp(1),
        );
        let mut entry = IndexEntry::created(&created.appended()[0]).unwrap();
        for event in created.appended() {
            entry.apply(event);
        }
        let mut run = Run {
            conversation: Some(created.state),
            entry,
            now: 1,
        };
        assert_eq!(run.entry.status(), keel_core::reducer::Status::Idle);

        // A call that waits for approval, approved, run, answered.
        run.step(message("run it"));
        let call = ToolCall {
            id: ToolCallId::new("t1"),
            name: "bash".to_owned(),
            input: serde_json::json!({"command": "true"}),
        };
        run.respond(vec![AssistantBlock::ToolUse { call }], StopReason::ToolUse);
        assert_eq!(
            run.entry.status(),
            keel_core::reducer::Status::AwaitingInput
        );
        run.step(Input::Resolve {
            tool_call_id: ToolCallId::new("t1"),
            decision: Decision::Approve,
            by: None,
        });
        run.step(Input::ToolFinished {
            tool_call_id: ToolCallId::new("t1"),
            content: "done".to_owned(),
            is_error: false,
            images: Vec::new(),
        });
        let text = AssistantBlock::Text {
            text: "ok".to_owned(),
        };
        run.respond(vec![text.clone()], StopReason::EndTurn);
        assert_eq!(run.entry.status(), keel_core::reducer::Status::Idle);

        // A turn that fails for good rests in error; the next one clears it.
        run.step(message("again"));
        let generation = run.generation();
        run.step(Input::StreamFailed {
            generation,
            failure: LlmFailure {
                retryable: false,
                retry_after_ms: None,
                message: "no".to_owned(),
                prompt_too_long: false,
            },
            jitter: 0,
        });
        assert_eq!(run.entry.status(), keel_core::reducer::Status::Error);
        run.step(message("once more"));
        assert_eq!(run.entry.status(), keel_core::reducer::Status::TurnInFlight);
        run.respond(vec![text], StopReason::EndTurn);
        assert_eq!(run.entry.turns, 3);

        // A denied call and a cancel while waiting both leave no pending call.
        run.step(message("run another"));
        let call = ToolCall {
            id: ToolCallId::new("t2"),
            name: "bash".to_owned(),
            input: serde_json::json!({"command": "true"}),
        };
        run.respond(vec![AssistantBlock::ToolUse { call }], StopReason::ToolUse);
        assert_eq!(run.entry.pending, vec![ToolCallId::new("t2")]);
        run.step(Input::Cancel);
        assert!(run.entry.pending.is_empty());
        assert_eq!(run.entry.status(), keel_core::reducer::Status::Idle);
    }
}
