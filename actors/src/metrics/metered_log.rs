//! `MeteredLog`: an [`EventLog`] that counts the failures of the one it
//! wraps in `keel_store_errors_total`, by op (a read or a write). The
//! runtime wraps its store in one, so every store call (the actors', a
//! rebuild's, the daemon's reads) is counted in one place, whichever
//! engine is underneath.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};
use keel_core::reducer::WorkingSet;
use keel_core::snapshot::FsmSnapshot;
use keel_store::{Availability, Deleted, EventLog, IndexEntry, Reclaimed, Result, Swept};

use super::{store_error, StoreOp};

pub struct MeteredLog {
    inner: Arc<dyn EventLog>,
}

impl MeteredLog {
    pub fn new(inner: Arc<dyn EventLog>) -> MeteredLog {
        MeteredLog { inner }
    }
}

/// `result`, its failure counted as a failed `op`.
fn counted<T>(op: StoreOp, result: Result<T>) -> Result<T> {
    if result.is_err() {
        store_error(op);
    }
    result
}

#[async_trait]
impl EventLog for MeteredLog {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn availability(&self) -> Availability {
        self.inner.availability()
    }

    async fn append(&self, conversation: &ConversationId, events: Vec<Event>) -> Result<()> {
        counted(
            StoreOp::Write,
            self.inner.append(conversation, events).await,
        )
    }

    async fn read(
        &self,
        conversation: &ConversationId,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<Event>> {
        counted(
            StoreOp::Read,
            self.inner.read(conversation, from, limit).await,
        )
    }

    async fn read_all(&self, conversation: &ConversationId) -> Result<Vec<Event>> {
        counted(StoreOp::Read, self.inner.read_all(conversation).await)
    }

    async fn read_tail(&self, conversation: &ConversationId, n: usize) -> Result<Vec<Event>> {
        counted(StoreOp::Read, self.inner.read_tail(conversation, n).await)
    }

    async fn last_seq(&self, conversation: &ConversationId) -> Result<Seq> {
        counted(StoreOp::Read, self.inner.last_seq(conversation).await)
    }

    async fn save_snapshot(
        &self,
        conversation: &ConversationId,
        snapshot: &FsmSnapshot,
    ) -> Result<()> {
        counted(
            StoreOp::Write,
            self.inner.save_snapshot(conversation, snapshot).await,
        )
    }

    async fn load_snapshot(&self, conversation: &ConversationId) -> Result<Option<FsmSnapshot>> {
        counted(StoreOp::Read, self.inner.load_snapshot(conversation).await)
    }

    async fn save_checkpoint(
        &self,
        conversation: &ConversationId,
        working: &WorkingSet,
    ) -> Result<()> {
        counted(
            StoreOp::Write,
            self.inner.save_checkpoint(conversation, working).await,
        )
    }

    async fn load_checkpoint(&self, conversation: &ConversationId) -> Result<Option<WorkingSet>> {
        counted(
            StoreOp::Read,
            self.inner.load_checkpoint(conversation).await,
        )
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> Result<String> {
        counted(StoreOp::Write, self.inner.put_blob(bytes).await)
    }

    async fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>> {
        counted(StoreOp::Read, self.inner.get_blob(hash).await)
    }

    async fn uses_blob(&self, conversation: &ConversationId, hash: &str) -> Result<bool> {
        counted(
            StoreOp::Read,
            self.inner.uses_blob(conversation, hash).await,
        )
    }

    async fn index_entry(&self, conversation: &ConversationId) -> Result<Option<IndexEntry>> {
        counted(StoreOp::Read, self.inner.index_entry(conversation).await)
    }

    async fn list(&self, include_sub_agents: bool) -> Result<Vec<IndexEntry>> {
        counted(StoreOp::Read, self.inner.list(include_sub_agents).await)
    }

    async fn children(&self, parent: &ConversationId) -> Result<Vec<IndexEntry>> {
        counted(StoreOp::Read, self.inner.children(parent).await)
    }

    async fn delete(&self, conversation: &ConversationId) -> Result<Deleted> {
        counted(StoreOp::Write, self.inner.delete(conversation).await)
    }

    async fn sweep_unreferenced_blobs(&self, older_than: Duration) -> Result<Swept> {
        counted(
            StoreOp::Write,
            self.inner.sweep_unreferenced_blobs(older_than).await,
        )
    }

    async fn reclaim(&self) -> Result<Reclaimed> {
        counted(StoreOp::Write, self.inner.reclaim().await)
    }
}
