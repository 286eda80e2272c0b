//! Rebuilding a conversation from the store. The log decides; the snapshot is
//! checked against it and rewritten when it is stale, missing or wrong.

use keel_core::ids::ConversationId;
use keel_core::snapshot::FsmSnapshot;
use keel_core::state::Conversation;
use keel_core::working::{ReplayError, WorkingSet};

use crate::error::{Error, Result};
use crate::log::EventLog;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotCheck {
    /// The snapshot agreed with the log.
    Valid,
    /// There was none (or none is taken in this state).
    Missing,
    /// It disagreed with the log and was rebuilt from it.
    Rebuilt,
}

#[derive(Debug)]
pub struct Rehydrated {
    /// Ready for `Input::Started`.
    pub conversation: Conversation,
    pub snapshot: SnapshotCheck,
}

/// Rebuild `conversation` from its log, or `None` if it does not exist.
pub async fn rehydrate(
    log: &dyn EventLog,
    conversation: &ConversationId,
) -> Result<Option<Rehydrated>> {
    let events = log.read_all(conversation)?;
    if events.is_empty() {
        return Ok(None);
    }
    // The events are decoded only to be replayed: move them in.
    let working = WorkingSet::replay_owned(events).map_err(|error| {
        let seq = match error {
            ReplayError::Empty => 0,
            ReplayError::NotCreated { seq } => seq,
            ReplayError::Gap { found, .. } => found,
        };
        Error::Corrupt {
            conversation: conversation.clone(),
            seq,
            reason: error.to_string(),
        }
    })?;
    let stored = log.load_snapshot(conversation)?;
    let derived = FsmSnapshot::of(&working);
    let check = match (&stored, &derived) {
        (Some(stored), Some(derived)) if stored == derived => SnapshotCheck::Valid,
        (None, None) => SnapshotCheck::Missing,
        (_, Some(derived)) => {
            log.save_snapshot(conversation, derived).await?;
            if stored.is_some() {
                SnapshotCheck::Rebuilt
            } else {
                SnapshotCheck::Missing
            }
        }
        // The log is mid-turn or finished: no snapshot applies, and a stored
        // one is simply ignored.
        (Some(_), None) => SnapshotCheck::Rebuilt,
    };
    Ok(Some(Rehydrated {
        conversation: Conversation::rehydrate(working),
        snapshot: check,
    }))
}
