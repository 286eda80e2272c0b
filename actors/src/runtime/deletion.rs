//! Deleting a conversation with everything of it (docs/requirements.md,
//! "Deleting a conversation"): its sub-agents first, then itself. Each one
//! is brought to rest (a busy one only when forced: it is cancelled, its
//! running tool killed), its actor stopped, and marked so that nothing
//! starts it again before the store removes its log, snapshot, checkpoint,
//! index entry and the blobs no other conversation names, in one durable
//! commit (`EventLog::delete`). The delete wins over what races it: a
//! message that arrives meanwhile is refused as for an unknown
//! conversation, or (reaching the live actor just before it stops) goes
//! with it.

use std::time::Duration;

use keel_core::{ConversationId, Rejection, StateName};

use super::Runtime;
use crate::registry;
use crate::Error;

/// What [`Runtime::delete`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deletion {
    /// The conversations deleted: its sub-agents (theirs first), then it.
    pub conversations: Vec<ConversationId>,
    /// Events removed from their logs.
    pub events: u64,
    /// Image blobs removed with them (no other conversation names them).
    pub blobs_removed: usize,
}

/// How long deleting waits for a conversation to come to rest or stop.
const STOPS: usize = 3;

impl Runtime {
    /// Delete conversation `id` and its sub-agents. A conversation in the
    /// middle of a turn (or waiting on a person) is refused with
    /// `Rejected(Busy)` and nothing is deleted, unless `force`: then it is
    /// cancelled first. An unknown id is `NotFound`.
    pub async fn delete(&self, id: &ConversationId, force: bool) -> Result<Deletion, Error> {
        let store = &self.shared.store;
        if store.index_entry(id).await?.is_none() {
            return Err(Error::NotFound(id.clone()));
        }
        // Every conversation below it, deepest first, so a parent never
        // outlives the check of its children.
        let mut order = Vec::new();
        let mut pending = vec![id.clone()];
        while let Some(parent) = pending.pop() {
            for child in store.children(&parent).await? {
                pending.push(child.id.clone());
            }
            order.push(parent);
        }
        order.reverse();

        if !force {
            let state = self.handle(id.clone()).inspect().await?.state;
            if !at_rest(state) {
                return Err(Error::Rejected(Rejection::Busy { state }));
            }
        }
        let mut deletion = Deletion::default();
        for conversation in order {
            self.stop_for_deletion(&conversation).await?;
            let deleted = store.delete(&conversation).await;
            registry::mark_deleting(&self.shared, &conversation, false);
            let deleted = deleted?;
            deletion.events += deleted.events;
            deletion.blobs_removed += deleted.blobs_removed.len();
            deletion.conversations.push(conversation);
        }
        Ok(deletion)
    }

    /// Keep `id` from starting again, bring it to rest and stop its actor.
    /// On an error it is unmarked and left as it is.
    async fn stop_for_deletion(&self, id: &ConversationId) -> Result<(), Error> {
        registry::mark_deleting(&self.shared, id, true);
        let stopped = self.stop_live(id).await;
        if stopped.is_err() {
            registry::mark_deleting(&self.shared, id, false);
        }
        stopped
    }

    /// Cancel and evict `id`'s live actor, if it has one. Marked as being
    /// deleted, it starts for nothing: a cancel or an evict of it when it is
    /// not live does nothing.
    async fn stop_live(&self, id: &ConversationId) -> Result<(), Error> {
        for _ in 0..STOPS {
            if registry::lookup(&self.shared, id).is_none() {
                return Ok(());
            }
            let handle = self.handle(id.clone());
            match handle.cancel().await {
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
            match handle.evict().await {
                Ok(()) => return Ok(()),
                // Busy again (a message that reached it first started a
                // turn): cancel once more.
                Err(Error::Rejected(Rejection::Busy { .. })) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(Error::Timeout)
    }
}

/// How long a blob stored for a message that was never recorded stays
/// before a retention sweep takes it (`EventLog::sweep_unreferenced_blobs`):
/// long enough for a client to send the message again.
const UNREFERENCED_BLOB_GRACE: Duration = Duration::from_secs(10 * 60);

impl Runtime {
    /// Retention (`KEEL_RETENTION_DAYS`): delete every conversation (with
    /// its sub-agents) whose last activity is older than `older_than`, and
    /// the blobs no message names. A busy one is left for a later sweep;
    /// nothing here waits on a turn. Returns the conversations deleted
    /// (their sub-agents not listed).
    pub async fn sweep_retention(
        &self,
        older_than: Duration,
    ) -> Result<Vec<ConversationId>, Error> {
        let now = self.shared.clock.now();
        let age = u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX);
        let mut deleted = Vec::new();
        for entry in self.shared.store.list(false).await? {
            if now.millis_since(entry.last_activity) < age {
                continue;
            }
            match self.delete(&entry.id, false).await {
                Ok(_) => deleted.push(entry.id),
                // In use again, or gone meanwhile: the next sweep decides.
                Err(Error::Rejected(_) | Error::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        self.shared
            .store
            .sweep_unreferenced_blobs(UNREFERENCED_BLOB_GRACE)
            .await?;
        Ok(deleted)
    }
}

impl Runtime {
    /// Give the store's freed space back to the disk (`EventLog::reclaim`):
    /// after deleting many conversations. Writes wait while the engine
    /// works (on redb, reads too), so this is an operator's call, not part
    /// of every delete or sweep.
    pub async fn reclaim(&self) -> Result<keel_store::Reclaimed, Error> {
        let reclaimed = self.shared.store.reclaim().await?;
        tracing::info!(
            action = ?reclaimed.action,
            before = ?reclaimed.disk_bytes_before,
            after = ?reclaimed.disk_bytes_after,
            took = ?reclaimed.took,
            "store space reclaimed"
        );
        Ok(reclaimed)
    }
}

/// Whether a conversation in `state` may be deleted without a cancel.
fn at_rest(state: StateName) -> bool {
    matches!(
        state,
        StateName::Idle | StateName::Error | StateName::Completed | StateName::Failed
    )
}
