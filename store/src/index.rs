//! The index of conversations: one small entry per conversation, updated in
//! the same atomic batch as the events it summarises, so a restart knows
//! which conversations to recover without scanning every log.

use serde::{Deserialize, Serialize};

use keel_core::event::{Event, EventKind};
use keel_core::ids::{ConversationId, Seq};
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
}

impl IndexEntry {
    /// The entry a `Created` event starts.
    pub fn created(event: &Event) -> Option<IndexEntry> {
        match &event.kind {
            EventKind::Created {
                conversation,
                parent_conversation,
                user_initiated,
                ..
            } => Some(IndexEntry {
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
            EventKind::TurnStarted { .. } => {
                self.turn_in_flight = true;
                self.turn_owed = false;
            }
            EventKind::UserMessage { .. } if event.triggers_turn => self.turn_owed = true,
            EventKind::Unanswered { .. } | EventKind::DebounceCancelled => self.turn_owed = false,
            EventKind::TurnCompleted { .. }
            | EventKind::TurnInterrupted { .. }
            | EventKind::TurnFailed { .. } => self.turn_in_flight = false,
            EventKind::Finished { .. } => self.finished = true,
            EventKind::Created { .. }
            | EventKind::SessionStarted
            | EventKind::SessionEnded
            | EventKind::UserMessage { .. }
            | EventKind::AssistantMessage { .. }
            | EventKind::ToolResult { .. }
            | EventKind::Suspended { .. }
            | EventKind::Resolved { .. }
            | EventKind::ConfigChanged { .. }
            | EventKind::Recovered { .. }
            | EventKind::Nudge { .. } => {}
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
}
