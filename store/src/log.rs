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

use async_trait::async_trait;
use tokio::sync::watch;

use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};
use keel_core::reducer::WorkingSet;
use keel_core::snapshot::FsmSnapshot;

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

    /// `conversation`'s index entry, its last seq and last activity taken
    /// from the log; `None` if the conversation does not exist.
    async fn index_entry(&self, conversation: &ConversationId) -> Result<Option<IndexEntry>>;

    /// Conversations in the index, oldest first; sub-agents only when asked.
    async fn list(&self, include_sub_agents: bool) -> Result<Vec<IndexEntry>>;
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
