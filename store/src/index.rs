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
    }

    pub fn apply(&mut self, event: &Event) {
        self.last_activity = event.at;
        self.last_seq = event.seq;
        match &event.kind {
            EventKind::TurnStarted { .. } => self.turn_in_flight = true,
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
            | EventKind::Nudge { .. }
            | EventKind::DebounceCancelled => {}
        }
    }
}
