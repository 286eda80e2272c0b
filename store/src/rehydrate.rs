//! Rebuilding a conversation from the store. The log decides: a stored
//! checkpoint of the working set is used only when the log continues it
//! (then only the events after it are read), and the snapshot is checked
//! against the result and rewritten when it is stale, missing or wrong.

use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};
use keel_core::reducer::{ReplayError, WorkingSet};
use keel_core::snapshot::FsmSnapshot;
use keel_core::state::Conversation;

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
    /// Events read and folded in: the whole log, or only those after the
    /// checkpoint the rebuild started from.
    pub replayed: usize,
    /// The rebuild started from a stored checkpoint of the working set.
    pub from_checkpoint: bool,
}

/// The working set of `conversation` as its log folds to, read only:
/// nothing is written (the snapshot is neither checked nor repaired), so
/// reading a conversation that no actor serves leaves the store as it was.
/// `None` if it does not exist.
pub async fn load(log: &dyn EventLog, conversation: &ConversationId) -> Result<Option<WorkingSet>> {
    Ok(fold(log, conversation)
        .await?
        .map(|(working, _, _)| working))
}

/// Rebuild `conversation` from its log, or `None` if it does not exist.
/// A stored checkpoint of the working set that fits the log saves reading
/// and replaying the events before it.
pub async fn rehydrate(
    log: &dyn EventLog,
    conversation: &ConversationId,
) -> Result<Option<Rehydrated>> {
    let Some((working, replayed, from_checkpoint)) = fold(log, conversation).await? else {
        return Ok(None);
    };
    let stored = log.load_snapshot(conversation).await?;
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
        replayed,
        from_checkpoint,
    }))
}

/// The working set, from the stored checkpoint and the events after it when
/// the log continues it, else from the whole log; with how many events were
/// folded and whether a checkpoint was the start.
async fn fold(
    log: &dyn EventLog,
    conversation: &ConversationId,
) -> Result<Option<(WorkingSet, usize, bool)>> {
    let last_seq = log.last_seq(conversation).await?;
    if last_seq == 0 {
        return Ok(None);
    }
    Ok(Some(
        match from_checkpoint(log, conversation, last_seq).await? {
            Some((working, replayed)) => (working, replayed, true),
            None => {
                let events = log.read_all(conversation).await?;
                let replayed = events.len();
                (replay(conversation, events)?, replayed, false)
            }
        },
    ))
}

/// The working set from the stored checkpoint and the events after it, if
/// there is a checkpoint of this conversation that the log continues.
/// Anything else (none, another conversation's, one ahead of the log, a
/// tail that does not follow it) is `None`: the log is replayed whole.
async fn from_checkpoint(
    log: &dyn EventLog,
    conversation: &ConversationId,
    last_seq: Seq,
) -> Result<Option<(WorkingSet, usize)>> {
    let Some(checkpoint) = log.load_checkpoint(conversation).await? else {
        return Ok(None);
    };
    if checkpoint.id != *conversation || checkpoint.last_seq > last_seq {
        return Ok(None);
    }
    let tail = log
        .read(conversation, checkpoint.last_seq + 1, usize::MAX)
        .await?;
    let replayed = tail.len();
    Ok(checkpoint
        .resume_owned(tail)
        .ok()
        .filter(|working| working.last_seq == last_seq)
        .map(|working| (working, replayed)))
}

fn replay(conversation: &ConversationId, events: Vec<Event>) -> Result<WorkingSet> {
    // The events are decoded only to be replayed: move them in.
    WorkingSet::replay_owned(events).map_err(|error| {
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
    })
}
