//! Deleting conversations, sweeping blobs no conversation refers to, and
//! reclaiming space: the committer's requests that run alone.
//!
//! Finding what to remove means reading the engine (a conversation's event
//! keys and blob references, who else refers to a blob), and writes staged
//! but not yet committed are not there to read. So each of these first
//! waits until every batch before it is committed (`drain`), then reads
//! the engine and commits its removals on the committer's own thread
//! before anything after it is staged. A delete is thereby ordered with
//! the appends around it like any write: an append staged before it is
//! removed with the rest; one staged after it finds the conversation gone
//! (a new log must start with `Created` at seq 1, so a stale actor's next
//! append is refused). Deletes that arrive one after another share one
//! commit, as appends do; the committer's caches of log ends and index
//! entries are updated once that commit is durable, before anything after
//! it is staged.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, SyncSender};
use std::time::{Duration, Instant};

use keel_core::ids::ConversationId;

use super::{refs, Alone, Committer, Reply, Staged};
use crate::backend::{Backend, Write};
use crate::deletion::{Deleted, Reclaimed, Swept};
use crate::error::{Error, Result};
use crate::keys;

/// How long a delete leaves alone a blob this process stored that no
/// message has named yet: longer than a message takes from its images
/// being stored to being appended (the runtime's `send` waits up to 30 s
/// for an actor, up to three times). A blob kept for this reason is left
/// for `sweep_unreferenced_blobs`.
pub(super) const UPLOAD_GRACE: Duration = Duration::from_secs(600);

/// What a run of deletes has staged so far.
#[derive(Default)]
struct Run {
    writes: Vec<Write>,
    /// The conversations it deletes.
    deleted: HashSet<ConversationId>,
    /// The (blob, conversation) references it removes.
    unreferenced: HashSet<(String, String)>,
}

impl<B: Backend> Committer<B> {
    /// Run a sweep or a reclaim, after every commit before it.
    pub(super) fn alone(&mut self, alone: Alone, staged: &SyncSender<Staged>) {
        match alone {
            Alone::Delete {
                conversation,
                reply,
            } => self.delete_run(vec![(conversation, reply)], staged),
            Alone::Sweep { older_than, reply } => {
                self.drain(staged);
                let _ = reply.send(self.sweep(older_than));
            }
            Alone::Reclaim { reply } => {
                self.drain(staged);
                let _ = reply.send(self.reclaim());
            }
        }
    }

    /// Delete each conversation of `deletes`, in one commit.
    pub(super) fn delete_run(
        &mut self,
        deletes: Vec<(ConversationId, Reply<Deleted>)>,
        staged: &SyncSender<Staged>,
    ) {
        if deletes.is_empty() {
            return;
        }
        self.drain(staged);
        let mut run = Run::default();
        let mut staged_deletes = Vec::with_capacity(deletes.len());
        for (conversation, reply) in deletes {
            let outcome = self
                .refuse_if_stopped()
                .and_then(|()| self.stage_delete(&conversation, &mut run));
            match outcome {
                Ok(deleted) => staged_deletes.push((conversation, deleted, reply)),
                Err(error) => {
                    let _ = reply.send(Err(error));
                }
            }
        }
        let committed = self.commit_alone(&run.writes);
        for (conversation, deleted, reply) in staged_deletes {
            let answer = match &committed {
                Ok(()) => {
                    // Known, not looked up: the log is empty now.
                    self.last_seqs.insert(conversation.clone(), 0);
                    self.index.remove(&conversation);
                    for hash in &deleted.blobs_removed {
                        self.uploads.forget(hash);
                    }
                    Ok(deleted)
                }
                Err(error) => Err(Error::Fatal {
                    reason: match error {
                        Error::Fatal { reason } => reason.clone(),
                        other => other.to_string(),
                    },
                }),
            };
            let _ = reply.send(answer);
        }
    }

    /// Stage the removal of everything of `conversation`; changes nothing
    /// if a read fails.
    fn stage_delete(&self, conversation: &ConversationId, run: &mut Run) -> Result<Deleted> {
        if run.deleted.contains(conversation) {
            return Ok(Deleted::default());
        }
        let backend = &self.engine.backend;
        let mut writes = Vec::new();
        let mut events = 0;
        let (start, end) = keys::events_from(conversation, 1);
        backend.visit_range(&start, &end, usize::MAX, &mut |key, _| {
            writes.push(Write::Remove(key.to_vec()));
            events += 1;
            Ok(())
        })?;
        let indexed = backend.contains(&keys::index(conversation))?;
        for key in [
            keys::index(conversation),
            keys::snapshot(conversation),
            keys::checkpoint(conversation),
        ] {
            if backend.contains(&key)? {
                writes.push(Write::Remove(key));
            }
        }
        let mut deleted = Deleted {
            existed: events > 0 || indexed,
            events,
            ..Deleted::default()
        };
        let mut unreferenced = Vec::new();
        for hash in refs::used_by(backend, conversation)? {
            writes.push(Write::Remove(keys::uses(conversation, &hash)));
            writes.push(Write::Remove(keys::referred_by(&hash, conversation)));
            let gone = |other: &str| {
                other == conversation.as_str()
                    || run.unreferenced.contains(&(hash.clone(), other.to_owned()))
            };
            let kept = self.uploads.waiting(&hash, UPLOAD_GRACE)
                || refs::referred_by_any(backend, &hash, gone)?;
            if kept {
                deleted.blobs_kept.push(hash.clone());
            } else if backend.contains(&keys::blob(&hash))? {
                writes.push(Write::Remove(keys::blob(&hash)));
                deleted.blobs_removed.push(hash.clone());
            }
            unreferenced.push((hash, conversation.as_str().to_owned()));
        }
        run.writes.extend(writes);
        run.unreferenced.extend(unreferenced);
        run.deleted.insert(conversation.clone());
        Ok(deleted)
    }

    /// Remove every blob nothing refers to, but an upload of this process
    /// younger than `older_than` that no message has named yet.
    fn sweep(&mut self, older_than: Duration) -> Result<Swept> {
        self.refuse_if_stopped()?;
        let backend = &self.engine.backend;
        let (start, end) = keys::blob_range();
        let mut blobs = Vec::new();
        backend.visit_range(&start, &end, usize::MAX, &mut |key, value| {
            if let Some(hash) = keys::hash_of_blob(key) {
                blobs.push((hash.to_owned(), value.len() as u64));
            }
            Ok(())
        })?;
        let mut swept = Swept::default();
        let mut writes = Vec::new();
        for (hash, bytes) in blobs {
            if self.uploads.waiting(&hash, older_than)
                || refs::referred_by_any(backend, &hash, |_| false)?
            {
                continue;
            }
            writes.push(Write::Remove(keys::blob(&hash)));
            swept.bytes += bytes;
            swept.blobs.push(hash);
        }
        self.commit_alone(&writes)?;
        for hash in &swept.blobs {
            self.uploads.forget(hash);
        }
        Ok(swept)
    }

    /// Ask the engine to give space back, measuring its files around it.
    /// A failure is a failed commit (compacting is commits): the store stops.
    fn reclaim(&mut self) -> Result<Reclaimed> {
        self.refuse_if_stopped()?;
        let backend = &self.engine.backend;
        let before = backend.disk_bytes()?;
        let started = Instant::now();
        let action = match backend.reclaim() {
            Ok(action) => action,
            Err(error) => return Err(self.stop(error.to_string())),
        };
        let took = started.elapsed();
        let after = backend.disk_bytes()?;
        Ok(Reclaimed::new(action, before, after, took))
    }

    /// Wait until the writer has committed every batch handed to it.
    fn drain(&self, staged: &SyncSender<Staged>) {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return;
        }
        let (done, committed) = mpsc::channel();
        let barrier = Staged {
            writes: Vec::new(),
            waiting: Vec::new(),
            done: Some(done),
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if staged.send(barrier).is_err() {
            // The writer is gone (it panicked): nothing is in flight.
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        // An error means the writer ended without reaching the barrier:
        // nothing more will be committed there either.
        let _ = committed.recv();
    }

    /// Commit `writes` here and now; nothing is in flight.
    fn commit_alone(&mut self, writes: &[Write]) -> Result<()> {
        self.refuse_if_stopped()?;
        if writes.is_empty() {
            return Ok(());
        }
        match self.engine.backend.commit(writes) {
            Ok(()) => Ok(()),
            Err(error) => Err(self.stop(error.to_string())),
        }
    }

    fn refuse_if_stopped(&self) -> Result<()> {
        match self.fatal.get() {
            Some(reason) => Err(Error::Fatal {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// A commit failed: the store takes no more writes.
    fn stop(&mut self, reason: String) -> Error {
        self.fatal.set(reason);
        self.last_seqs.clear();
        self.index.clear();
        let reason = self.fatal.get().cloned().unwrap_or_default();
        Error::Fatal { reason }
    }
}
