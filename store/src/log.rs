//! The `EventLog` trait: everything the actors ask of the store.

use async_trait::async_trait;

use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};
use keel_core::snapshot::FsmSnapshot;
use keel_core::working::WorkingSet;

use crate::error::Result;
use crate::index::IndexEntry;

#[async_trait]
pub trait EventLog: Send + Sync {
    /// Which engine holds the data: `sled`, `redb` or `memory`.
    fn backend(&self) -> &'static str;

    /// Append `events` to `conversation`'s log. Returns only once they are
    /// durable. The first event must continue the log at `last_seq + 1` (a
    /// new conversation starts with `Created` at seq 1) and the rest follow
    /// without gaps; anything else is an error and nothing is written.
    async fn append(&self, conversation: &ConversationId, events: Vec<Event>) -> Result<()>;

    /// Up to `limit` events from seq `from` on, in order.
    fn read(&self, conversation: &ConversationId, from: Seq, limit: usize) -> Result<Vec<Event>>;

    /// The whole log of `conversation` (empty if it does not exist).
    fn read_all(&self, conversation: &ConversationId) -> Result<Vec<Event>> {
        self.read(conversation, 1, usize::MAX)
    }

    /// The last `n` events, in order: what recovery looks at first.
    fn read_tail(&self, conversation: &ConversationId, n: usize) -> Result<Vec<Event>>;

    /// The seq of the last event, 0 if the conversation does not exist.
    fn last_seq(&self, conversation: &ConversationId) -> Result<Seq>;

    /// Persist the small fsm_state; a cache, so it may lag the log.
    async fn save_snapshot(
        &self,
        conversation: &ConversationId,
        snapshot: &FsmSnapshot,
    ) -> Result<()>;

    fn load_snapshot(&self, conversation: &ConversationId) -> Result<Option<FsmSnapshot>>;

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
    fn load_checkpoint(&self, conversation: &ConversationId) -> Result<Option<WorkingSet>>;

    /// Store bytes once under their SHA-256 (lowercase hex), durably; returns the hash.
    async fn put_blob(&self, bytes: Vec<u8>) -> Result<String>;

    fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>>;

    fn index_entry(&self, conversation: &ConversationId) -> Result<Option<IndexEntry>>;

    /// Conversations in the index, oldest first; sub-agents only when asked.
    fn list(&self, include_sub_agents: bool) -> Result<Vec<IndexEntry>>;
}
