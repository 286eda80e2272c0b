//! Which conversations still have a tool worker alive, and the process
//! groups their workers started: so that a conversation rebuilt in the same
//! process (its actor crashed and the supervisor restarted it, or it was
//! killed for a drill) re-dispatches a call only once every copy of it the
//! old actor started is dead (docs/requirements.md, "Crash semantics":
//! never two copies of one call).
//!
//! Boot has the same promise across processes and keeps it with the
//! on-disk ledger (`runtime/boot.rs`). In process the danger is different:
//! when a conversation actor dies, ractor kills its tool worker with a
//! signal the worker handles on its own task, and the worker's process
//! group is sent `SIGKILL` when the tool's future is dropped there. All of
//! that is asynchronous, and the supervisor's restart can rebuild the
//! conversation and start the call again before it happened. So a tool
//! worker holds a [`Lease`] for as long as it lives, a process-spawning
//! tool notes its groups through [`GroupNotes`], and a rebuilt conversation
//! first [`ToolGroups::settle`]s: it waits until no worker of its old life
//! holds a lease, and until nothing of the groups they started runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use keel_core::ids::ConversationId;
use tokio::sync::Notify;

use crate::process_group;

/// The registry, one per runtime.
#[derive(Debug, Default)]
pub(crate) struct ToolGroups {
    by_conversation: Mutex<HashMap<ConversationId, Workers>>,
    /// Woken whenever a lease ends.
    changed: Notify,
}

#[derive(Debug, Default)]
struct Workers {
    /// Tool workers of the conversation that are alive.
    alive: usize,
    /// Process groups its workers started that may still run.
    groups: Vec<u32>,
}

/// Held by a tool worker for as long as it lives (declared in its state,
/// so it drops after the tool's future and whatever that future held).
#[derive(Debug)]
pub(crate) struct Lease {
    registry: Arc<ToolGroups>,
    conversation: ConversationId,
}

/// Where a tool notes the process groups it starts. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct GroupNotes {
    /// `None`: nobody keeps notes (a tool run outside a runtime, in tests).
    lease: Option<(Arc<ToolGroups>, ConversationId)>,
}

impl ToolGroups {
    /// A worker of `conversation` starts: its lease, and the notes its tool
    /// keeps its process groups in. Groups of earlier workers that are gone
    /// are forgotten here, so the list stays as short as what may run.
    pub(crate) fn enter(self: &Arc<Self>, conversation: &ConversationId) -> (Lease, GroupNotes) {
        let mut by_conversation = self.lock();
        let workers = by_conversation.entry(conversation.clone()).or_default();
        workers.alive += 1;
        workers
            .groups
            .retain(|pgid| process_group::group_exists(*pgid));
        drop(by_conversation);
        let lease = Lease {
            registry: self.clone(),
            conversation: conversation.clone(),
        };
        let notes = GroupNotes {
            lease: Some((self.clone(), conversation.clone())),
        };
        (lease, notes)
    }

    /// Wait until no worker of `conversation` is alive and nothing of the
    /// process groups they started runs, or `patience` has passed. Returns
    /// the groups that still ran then (a group past its patience is logged
    /// by the caller; the conversation goes on rather than hang).
    pub(crate) async fn settle(
        &self,
        conversation: &ConversationId,
        patience: Duration,
    ) -> Vec<u32> {
        let deadline = tokio::time::Instant::now() + patience;
        let groups = loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a lease that ends between
            // the check and the wait still wakes it.
            changed.as_mut().enable();
            {
                let mut by_conversation = self.lock();
                match by_conversation.get(conversation) {
                    None => break Vec::new(),
                    Some(workers) if workers.alive == 0 => {
                        break by_conversation
                            .remove(conversation)
                            .map(|workers| workers.groups)
                            .unwrap_or_default();
                    }
                    Some(workers) => {
                        if tokio::time::Instant::now() >= deadline {
                            break workers.groups.clone();
                        }
                    }
                }
            }
            // Woken by a lease's end or by the deadline; either way the
            // loop looks again.
            let _ = tokio::time::timeout_at(deadline, changed).await;
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        process_group::wait_gone(&groups, left).await
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ConversationId, Workers>> {
        self.by_conversation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut by_conversation = self.registry.lock();
        if let Some(workers) = by_conversation.get_mut(&self.conversation) {
            workers.alive = workers.alive.saturating_sub(1);
            if workers.alive == 0 && workers.groups.is_empty() {
                by_conversation.remove(&self.conversation);
            }
        }
        drop(by_conversation);
        self.registry.changed.notify_waiters();
    }
}

impl GroupNotes {
    /// The tool started process group `pgid`.
    pub fn started(&self, pgid: u32) {
        if let Some((registry, conversation)) = &self.lease {
            registry
                .lock()
                .entry(conversation.clone())
                .or_default()
                .groups
                .push(pgid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    fn conversation() -> ConversationId {
        ConversationId::new("c-tool-groups").expect("a valid id")
    }

    #[tokio::test]
    async fn settle_waits_for_the_lease_and_then_for_the_group() {
        let registry = Arc::new(ToolGroups::default());
        let id = conversation();
        // A real group: `sleep` leads its own.
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep starts");
        let pgid = sleeper.id();
        let (lease, notes) = registry.enter(&id);
        notes.started(pgid);

        let settling = tokio::spawn({
            let registry = registry.clone();
            let id = id.clone();
            async move { registry.settle(&id, Duration::from_secs(60)).await }
        });
        // The worker lives: settling waits.
        tokio::task::yield_now().await;
        assert!(!settling.is_finished());
        // The worker ended, but its group still runs: settling waits.
        drop(lease);
        tokio::task::yield_now().await;
        assert!(!settling.is_finished());
        // The group dies: settled, nothing left running.
        sleeper.kill().expect("sleep is killed");
        let left = settling.await.expect("settle does not panic");
        assert_eq!(left, Vec::<u32>::new());
        let _ = sleeper.wait();
        // The conversation is forgotten once settled.
        assert!(registry.lock().is_empty());
    }

    #[tokio::test]
    async fn a_conversation_without_workers_settles_at_once() {
        let registry = Arc::new(ToolGroups::default());
        let left = registry
            .settle(&conversation(), Duration::from_secs(60))
            .await;
        assert!(left.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_never_ends_is_waited_for_until_the_patience() {
        let registry = Arc::new(ToolGroups::default());
        let id = conversation();
        let (_lease, notes) = registry.enter(&id);
        // The test's own process group runs, and stands for a group that
        // will not die.
        let own = nix::unistd::getpgrp().as_raw().unsigned_abs();
        notes.started(own);
        let left = registry.settle(&id, Duration::from_secs(5)).await;
        assert_eq!(left, vec![own]);
    }

    #[test]
    fn groups_that_are_gone_are_forgotten_when_the_next_worker_starts() {
        let registry = Arc::new(ToolGroups::default());
        let id = conversation();
        let mut quick = std::process::Command::new("true")
            .process_group(0)
            .spawn()
            .expect("true starts");
        let gone = quick.id();
        quick.wait().expect("true is reaped");
        {
            let (_lease, notes) = registry.enter(&id);
            notes.started(gone);
        }
        let (_lease, _notes) = registry.enter(&id);
        assert_eq!(registry.lock()[&id].groups, Vec::<u32>::new());
    }
}
