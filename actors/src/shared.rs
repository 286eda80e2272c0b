//! What every actor of one runtime shares ([`Shared`]), and how the parts
//! below the conversation actor start conversations without naming the
//! module that spawns actors ([`Activate`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ractor::ActorCell;

use keel_core::ids::ConversationId;
use keel_core::ConversationConfig;
use keel_store::EventLog;

use crate::clock::Clock;
use crate::mailbox::Mailbox;
use crate::message::Control;
use crate::process_group::ProcessLedger;
use crate::provider::ProviderClient;
use crate::settings::Settings;
use crate::spawner::Spawner;
use crate::tool::ToolRegistry;
use crate::tool_groups::ToolGroups;
use crate::Error;

/// What every actor of one runtime shares.
pub(crate) struct Shared {
    /// Prefix of this runtime's registry names: the registry is
    /// process-global, and two runtimes in one process must not collide.
    pub(crate) instance: String,
    pub(crate) store: Arc<dyn EventLog>,
    pub(crate) provider: ProviderClient,
    pub(crate) tools: ToolRegistry,
    /// The MCP servers conversations may use (docs/mcp.md).
    pub(crate) mcp: Arc<crate::mcp::McpHub>,
    pub(crate) ledger: Option<Arc<ProcessLedger>>,
    /// How tools start processes.
    pub(crate) spawner: Spawner,
    /// How tools are confined (docs/sandbox.md).
    pub(crate) sandbox: Arc<crate::tool_sandbox::ToolSandbox>,
    pub(crate) clock: Clock,
    pub(crate) settings: Settings,
    /// Each live conversation's out-of-band control block (`registry::control`).
    pub(crate) controls: Mutex<HashMap<ConversationId, Arc<Control>>>,
    /// Tool workers alive and the process groups they started, by
    /// conversation: a rebuilt conversation waits for its old ones
    /// (`tool_groups.rs`).
    pub(crate) tool_groups: Arc<ToolGroups>,
    /// Followers waiting for a conversation at rest to be started by
    /// something else (`registry::woken`); taken and woken as its actor starts.
    pub(crate) wakes: Mutex<HashMap<ConversationId, Arc<tokio::sync::Notify>>>,
    /// Actors and workers that hold this `Shared` now (see [`Alive`]).
    pub(crate) alive: Arc<AtomicUsize>,
    /// The runtime is stopping: no conversation starts, background tasks end.
    pub(crate) closed: AtomicBool,
    /// Conversations being deleted (`Runtime::delete`): none of them
    /// starts again, so nothing is appended between its actor's stop and
    /// the store's delete.
    pub(crate) deleting: Mutex<std::collections::HashSet<ConversationId>>,
    /// How conversations are started (`activation.rs`), for what lives
    /// below it: a parent starting, resolving or cancelling its sub-agents.
    pub(crate) activation: &'static dyn Activate,
    /// Asked before a conversation starts and before a tool runs, when
    /// several processes share the store (`ownership.rs`).
    pub(crate) ownership: Option<Arc<dyn crate::ownership::Ownership>>,
}

/// Starting a conversation by id: `activation.rs` does it, and spawns the
/// conversation actor to do so. The actor and its sub-agent work need it
/// too (a parent starts and cancels its children), and reach it through
/// [`Shared::activation`] rather than naming the module that spawns them,
/// so that what the actor calls never calls the actor's module back.
#[async_trait::async_trait]
pub(crate) trait Activate: Send + Sync {
    /// The live actor of `id`, or one started from the store.
    async fn ensure_started(
        &self,
        shared: &Arc<Shared>,
        supervisor: &ActorCell,
        id: &ConversationId,
    ) -> Result<Mailbox, Error>;

    /// Create conversation `id` (new in the store) and start its actor.
    async fn create_as(
        &self,
        shared: &Arc<Shared>,
        supervisor: &ActorCell,
        id: ConversationId,
        new: NewConversationAt,
    ) -> Result<(), Error>;

    /// The out-of-band cancel: flag it, start the actor if need be, kill
    /// its workers; the actor still has to record the cancel.
    async fn cancel(
        &self,
        shared: &Arc<Shared>,
        supervisor: &ActorCell,
        id: &ConversationId,
    ) -> Result<Mailbox, Error>;
}

/// What a new conversation is created with, but its id.
pub(crate) struct NewConversationAt {
    pub(crate) cwd: std::path::PathBuf,
    pub(crate) config: ConversationConfig,
    pub(crate) parent_conversation: Option<ConversationId>,
}

/// Counts an actor or worker that holds the runtime's `Shared` for as long
/// as it lives. Declared as the last field of a state, it drops after the
/// state's `Arc<Shared>`, so `shutdown` knows when the store is let go.
pub(crate) struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub(crate) fn alive(&self) -> Alive {
        self.alive.fetch_add(1, Ordering::SeqCst);
        Alive(self.alive.clone())
    }
}
