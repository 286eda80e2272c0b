//! Forking a conversation (docs/history.md): a new conversation whose log
//! is the source's up to a turn boundary, after a `Created` that names it
//! and records where it came from. The source is only read: whatever it
//! does meanwhile, the fork copies what its log held at that seq.

use keel_core::history;
use keel_core::{ConversationId, Seq};

use super::Runtime;
use crate::activation;
use crate::Error;

/// What [`Runtime::fork`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fork {
    /// The new conversation.
    pub id: ConversationId,
    /// The last seq of the source's log it copied.
    pub seq: Seq,
}

impl Runtime {
    /// Fork conversation `id` at `at_seq`, the end of its log when `None`.
    /// The seq must be a turn boundary (`Error::History` names the nearest
    /// ones otherwise); a sub-agent is not forked on its own. The fork
    /// rests until its first message, like a new conversation.
    pub async fn fork(&self, id: &ConversationId, at_seq: Option<Seq>) -> Result<Fork, Error> {
        if self.shared.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let store = &self.shared.store;
        let source = store.read_all(id).await?;
        let Some(last) = source.last() else {
            return Err(Error::NotFound(id.clone()));
        };
        let seq = at_seq.unwrap_or(last.seq);
        let fork = activation::new_id();
        let log = history::fork_log(&source, seq, fork.clone()).map_err(Error::History)?;
        drop(source);
        store.append(&fork, log).await?;
        tracing::info!(conversation = %fork, source = %id, seq, "forked");
        Ok(Fork { id: fork, seq })
    }
}
