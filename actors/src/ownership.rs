//! Who may run a conversation when several processes share one store
//! (docs/nodes.md). The runtime asks, and never decides: an embedder
//! running one process gives no [`Ownership`] and everything is its own;
//! `keel serve` as a node gives one backed by PostgreSQL.
//!
//! - **Ownership is per tree**: a conversation and its sub-agents live in
//!   one process, under the root's claim, so a sub-agent never needs a
//!   claim of its own and never runs away from its parent.
//! - **No actor starts without a claim** (`activation.rs` asks before it
//!   spawns one, for a new conversation and an existing one alike), so two
//!   processes never run one conversation whatever requests reach them.
//! - **Nothing acts on the world without a current lease**: a tool is not
//!   started once [`Ownership::may_act`] says no (a process paused past its
//!   lease wakes up to find it gone), and its call ends with an error
//!   result instead, which the store then refuses to record if another
//!   node took over.

use async_trait::async_trait;

use keel_core::ids::ConversationId;

/// Asked before a conversation tree is started here, and before a tool
/// runs.
#[async_trait]
pub trait Ownership: Send + Sync {
    /// Make sure this process owns the tree rooted at `root`, claiming it
    /// if nobody does. `Err` says who owns it instead, or why it cannot be
    /// known; the conversation is then not started here.
    async fn claim(&self, root: &ConversationId) -> Result<(), String>;

    /// Whether this process may still act on the world: its lease is
    /// current by its own clock, with a margin.
    fn may_act(&self) -> bool;

    /// The roots this process owns, for boot to recover those and no
    /// others.
    async fn owned(&self) -> Result<Vec<ConversationId>, String>;
}

/// The root of `id`'s tree: `id` itself, or its first ancestor with no
/// parent, read from the store's index. An id the index lacks is its own
/// root.
pub(crate) async fn root_of(
    store: &dyn keel_store::EventLog,
    id: &ConversationId,
) -> Result<ConversationId, keel_store::Error> {
    let mut current = id.clone();
    // Sub-agents nest a few levels at most; the bound only stops a cycle
    // a corrupt index could make.
    for _ in 0..64 {
        match store.index_entry(&current).await? {
            Some(entry) => match entry.parent {
                Some(parent) => current = parent,
                None => return Ok(current),
            },
            None => return Ok(current),
        }
    }
    Ok(current)
}
