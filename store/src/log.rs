//! The `EventLog` trait: everything the actors ask of the store.
//!
//! Every method that touches storage is async, reads as well as writes:
//! the actors (and later the daemon's HTTP handlers) call them from tokio
//! tasks, and a read that blocked would hold up every task its worker
//! thread serves. An implementation either does its I/O asynchronously (a network
//! database such as PostgreSQL) or hands it to a thread that may block:
//! [`Store`](crate::Store) runs its engine reads on tokio's blocking pool
//! and its writes on its committer thread.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use keel_core::event::{Event, EventKind};
use keel_core::ids::{ConversationId, Seq};
use keel_core::reducer::WorkingSet;
use keel_core::snapshot::FsmSnapshot;

use crate::deletion::{Deleted, Reclaimed, Swept};
use crate::error::Result;
use crate::index::IndexEntry;

#[async_trait]
pub trait EventLog: Send + Sync {
    /// Which engine holds the data: `sled`, `redb` or `memory`. The one
    /// method that is not async: it only names the engine, without I/O.
    fn backend(&self) -> &'static str;

    /// Whether the store still takes writes, and a way to wait until it
    /// stops. A store that cannot stop (memory) is always available.
    fn availability(&self) -> Availability {
        Availability::always()
    }

    /// Append `events` to `conversation`'s log. Returns only once they are
    /// durable. The first event must continue the log at `last_seq + 1` (a
    /// new conversation starts with `Created` at seq 1) and the rest follow
    /// without gaps; anything else is an error and nothing is written.
    async fn append(&self, conversation: &ConversationId, events: Vec<Event>) -> Result<()>;

    /// Up to `limit` events from seq `from` on, in order.
    async fn read(
        &self,
        conversation: &ConversationId,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<Event>>;

    /// The whole log of `conversation` (empty if it does not exist).
    async fn read_all(&self, conversation: &ConversationId) -> Result<Vec<Event>> {
        self.read(conversation, 1, usize::MAX).await
    }

    /// The last `n` events, in order: what recovery looks at first.
    async fn read_tail(&self, conversation: &ConversationId, n: usize) -> Result<Vec<Event>>;

    /// The seq of the last event, 0 if the conversation does not exist.
    async fn last_seq(&self, conversation: &ConversationId) -> Result<Seq>;

    /// Persist the small fsm_state; a cache, so it may lag the log.
    async fn save_snapshot(
        &self,
        conversation: &ConversationId,
        snapshot: &FsmSnapshot,
    ) -> Result<()>;

    /// The stored fsm_state, or `None` if there is none or it cannot be
    /// read (a cache: the caller checks it against the log).
    async fn load_snapshot(&self, conversation: &ConversationId) -> Result<Option<FsmSnapshot>>;

    /// Persist a checkpoint of the whole working set, and its snapshot when
    /// it has one, in one durable write. A cache like the snapshot: a cold
    /// start decodes it and replays only the events after it.
    async fn save_checkpoint(
        &self,
        conversation: &ConversationId,
        working: &WorkingSet,
    ) -> Result<()>;

    /// The stored checkpoint, or `None` if there is none or it cannot be
    /// used (undecodable, or written by another format or reducer). Whether
    /// it fits the log is the caller's to check.
    async fn load_checkpoint(&self, conversation: &ConversationId) -> Result<Option<WorkingSet>>;

    /// Store bytes once under their SHA-256 (lowercase hex), durably; returns the hash.
    async fn put_blob(&self, bytes: Vec<u8>) -> Result<String>;

    /// The bytes stored under `hash`, or `None` if there are none.
    async fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>>;

    /// Whether `conversation`'s log names blob `hash` as an image (of a
    /// user message or a tool result): what decides that a client of the
    /// conversation may read the blob. `false` for a conversation that
    /// does not exist. By default the log is read a page at a time
    /// ([`scan_for_blob`]); a store that keeps an index of which
    /// conversation names which blob answers from it instead.
    async fn uses_blob(&self, conversation: &ConversationId, hash: &str) -> Result<bool> {
        scan_for_blob(self, conversation, hash).await
    }

    /// `conversation`'s index entry, its last seq and last activity taken
    /// from the log; `None` if the conversation does not exist.
    async fn index_entry(&self, conversation: &ConversationId) -> Result<Option<IndexEntry>>;

    /// Conversations in the index, oldest first; sub-agents only when asked.
    async fn list(&self, include_sub_agents: bool) -> Result<Vec<IndexEntry>>;

    /// The sub-agents `parent` started (its direct children), oldest
    /// first: what a caller deletes along with the parent. Sub-agents start
    /// none of their own (REQ-BED-009), so these are all of them.
    async fn children(&self, parent: &ConversationId) -> Result<Vec<IndexEntry>> {
        let mut all = self.list(true).await?;
        all.retain(|entry| entry.parent.as_ref() == Some(parent));
        Ok(all)
    }

    /// Remove `conversation` for good, in one durable commit ordered with
    /// the appends around it: its events, snapshot, checkpoint, index entry
    /// and every blob its log referred to that no other conversation does.
    /// Its children are not touched ([`EventLog::children`] finds them).
    /// Afterwards it does not exist: `last_seq` is 0, and the id may be
    /// created again from seq 1; an append continuing the old log is
    /// refused. An id with nothing stored gives `existed: false` and
    /// changes nothing. The disk gets the space back only on `reclaim`.
    async fn delete(&self, conversation: &ConversationId) -> Result<Deleted>;

    /// Remove every blob no conversation refers to that is older than
    /// `older_than`: uploads whose message was never recorded. A blob this
    /// process stored less than `older_than` ago, and no message has named
    /// since, is kept (its message may be on its way). Blobs stored by an
    /// earlier process count as old: nothing outside the process holds a
    /// blob's hash, so no message can name them any more.
    async fn sweep_unreferenced_blobs(&self, older_than: Duration) -> Result<Swept>;

    /// Ask the engine to give back the space removed entries took, and
    /// say how big its files were before and after. Writes wait while it
    /// runs (on redb, reads too): a maintenance call, not one for every
    /// delete.
    async fn reclaim(&self) -> Result<Reclaimed>;
}

/// Events [`scan_for_blob`] reads at a time: a long log is never held
/// whole.
const SCAN_PAGE: usize = 256;

/// Whether `conversation`'s log names blob `hash`, found by reading the log
/// a page at a time: [`EventLog::uses_blob`]'s default, for a store with no
/// index of the blobs a conversation names.
pub async fn scan_for_blob<L: EventLog + ?Sized>(
    log: &L,
    conversation: &ConversationId,
    hash: &str,
) -> Result<bool> {
    let mut from: Seq = 1;
    loop {
        let page = log.read(conversation, from, SCAN_PAGE).await?;
        let names = page.iter().any(|event| match &event.kind {
            EventKind::UserMessage { images, .. } | EventKind::ToolResult { images, .. } => {
                images.iter().any(|image| image.hash == hash)
            }
            _ => false,
        });
        if names {
            return Ok(true);
        }
        match page.last() {
            Some(last) if page.len() == SCAN_PAGE => from = last.seq + 1,
            _ => return Ok(false),
        }
    }
}

/// Whether a store still takes writes. A store stops for good after a
/// failed commit (a full disk, a failed fsync: `Error::Fatal`), and every
/// later write is refused; what it had acknowledged is in the log, and a
/// new store over the same data recovers from it. Cheap to clone; holds
/// nothing of the store open.
#[derive(Debug, Clone)]
pub struct Availability {
    stopped: watch::Receiver<Option<Arc<str>>>,
}

impl Availability {
    pub fn new(stopped: watch::Receiver<Option<Arc<str>>>) -> Availability {
        Availability { stopped }
    }

    /// A store that never stops.
    pub fn always() -> Availability {
        Availability::new(watch::channel(None).1)
    }

    /// Why the store stopped taking writes, if it has.
    pub fn stopped(&self) -> Option<Arc<str>> {
        self.stopped.borrow().clone()
    }

    /// Waits until the store stops and says why; never returns for a store
    /// that cannot stop (or is gone without stopping).
    pub async fn until_stopped(&mut self) -> Arc<str> {
        match self.stopped.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_else(|| Arc::from("")),
            Err(_) => std::future::pending().await,
        }
    }
}
