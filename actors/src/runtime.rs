//! The runtime an embedder opens: the root supervisor, what every actor of
//! it shares, the idle sweeper, and its graceful stop. Conversations are
//! found through `registry.rs` and started and created only through
//! `activation.rs`; boot recovery lives
//! in `runtime/boot.rs`.

mod boot;
mod deletion;
mod history;
pub use deletion::Deletion;
pub use history::Fork;
mod supervisor;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorRef};

use keel_core::ids::ConversationId;
use keel_core::ConversationConfig;
use keel_store::{EventLog, IndexEntry};

pub use crate::settings::{Settings, DEFAULT_LIVE_INTERVAL};
use crate::shared::Shared;
pub use boot::BootReport;

use crate::activation::{self, Starter};
use crate::clock::Clock;
use crate::conversation::{ActorStats, ConversationHandle};
use crate::mailbox::Mailbox;
use crate::message::ConversationMsg;
use crate::process_group::ProcessLedger;
use crate::provider::{ProviderClient, ProviderConfig};
use crate::registry;
use crate::spawner::{Spawner, SpawnerCommand};
use crate::tool::ToolRegistry;
use crate::tool_groups::ToolGroups;
use crate::Error;
use supervisor::{SupervisorActor, SupervisorMsg};

/// What a runtime is opened with.
pub struct RuntimeConfig {
    pub store: Arc<dyn EventLog>,
    pub providers: ProviderConfig,
    pub tools: ToolRegistry,
    /// Where running tools' process groups are recorded, so that a runtime
    /// opened after a crash can kill any that outlived it. `None` (tests with
    /// an in-memory store) records nothing.
    pub process_dir: Option<PathBuf>,
    /// The program tools start their processes through (see
    /// `spawner.rs`), started when the runtime opens. `None`, or one that
    /// cannot be started (logged), starts them directly from this process,
    /// which costs each spawn a copy of its whole descriptor table.
    pub spawner: Option<SpawnerCommand>,
    pub settings: Settings,
    /// The MCP servers conversations may use, by name (docs/mcp.md).
    pub mcp_servers: std::collections::BTreeMap<String, crate::mcp::McpServerConfig>,
    /// How tools are confined (docs/sandbox.md): by default
    /// `workspace-write` with no network.
    pub sandbox: crate::tool_sandbox::SandboxSettings,
}

impl RuntimeConfig {
    /// Defaults around `store`: providers from the environment (an unusable
    /// value there is an error naming the variable), the default tools, no
    /// process ledger, processes spawned directly.
    pub fn new(store: Arc<dyn EventLog>) -> Result<RuntimeConfig, Error> {
        Ok(RuntimeConfig {
            store,
            providers: ProviderConfig::from_env()?,
            tools: ToolRegistry::with_defaults(),
            process_dir: None,
            spawner: None,
            settings: Settings::default(),
            mcp_servers: std::collections::BTreeMap::new(),
            sandbox: crate::tool_sandbox::SandboxSettings::default(),
        })
    }
}

/// A running keel: cheap to clone, every clone the same runtime.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
}

static INSTANCES: AtomicU64 = AtomicU64::new(0);

impl Runtime {
    /// The runtime's tool sandbox (docs/sandbox.md): what the kernel
    /// provides, and the port tools may not connect to.
    pub fn sandbox(&self) -> &crate::tool_sandbox::ToolSandbox {
        &self.shared.sandbox
    }

    /// Open a runtime: start the supervisor, kill tool process groups that
    /// outlived a previous run, and recover every conversation the index
    /// says was mid-turn. What boot did is the returned [`BootReport`].
    pub async fn open(config: RuntimeConfig) -> Result<(Runtime, BootReport), Error> {
        Runtime::open_with_ownership(config, None).await
    }

    /// [`open`](Self::open) as one of several processes over one store
    /// (docs/nodes.md): conversations start only once `ownership` says
    /// their tree is this process's, tools run only while it says this
    /// process may act, and boot recovers only the trees it owns.
    pub async fn open_with_ownership(
        config: RuntimeConfig,
        ownership: Option<Arc<dyn crate::ownership::Ownership>>,
    ) -> Result<(Runtime, BootReport), Error> {
        let RuntimeConfig {
            store,
            providers,
            tools,
            process_dir,
            spawner,
            settings,
            mcp_servers,
            sandbox,
        } = config;
        let ledger = match process_dir {
            Some(dir) => Some(Arc::new(ProcessLedger::open(&dir).map_err(|source| {
                Error::Io {
                    what: format!("cannot open the process ledger in {}", dir.display()),
                    source,
                }
            })?)),
            None => None,
        };
        // Every series known up front exists from the start, and every
        // store call's failure is counted, whoever makes it.
        crate::metrics::register(tools.names().iter().map(String::as_str));
        let store: Arc<dyn EventLog> = Arc::new(crate::metrics::MeteredLog::new(store));
        // Before anything else opens descriptors (the daemon binds its
        // listener after this returns), so its one spawn is cheap.
        let sandbox = Arc::new(crate::tool_sandbox::ToolSandbox::new(sandbox));
        let spawner = match spawner {
            Some(mut command) => {
                command.hide = sandbox.settings().data_dir.clone();
                Spawner::start(command).await
            }
            None => Spawner::direct(),
        };
        let instance = format!(
            "keel-{}-{}",
            std::process::id(),
            INSTANCES.fetch_add(1, Ordering::Relaxed)
        );
        let mcp = Arc::new(crate::mcp::McpHub::new(
            mcp_servers,
            ledger.clone(),
            sandbox.clone(),
        ));
        let shared = Arc::new(Shared {
            mcp,
            instance: instance.clone(),
            store,
            provider: ProviderClient::new(providers)?,
            tools,
            ledger,
            spawner,
            sandbox,
            clock: Clock::system(),
            settings,
            controls: Mutex::new(HashMap::new()),
            tool_groups: Arc::new(ToolGroups::default()),
            wakes: Mutex::new(HashMap::new()),
            alive: Arc::new(AtomicUsize::new(0)),
            closed: AtomicBool::new(false),
            deleting: Mutex::new(HashSet::new()),
            activation: &activation::Activation,
            ownership,
        });
        let (supervisor, _) = SupervisorActor::spawn(
            Some(registry::supervisor_name(&instance)),
            SupervisorActor,
            shared.clone(),
        )
        .await
        .map_err(Error::Spawn)?;
        spawn_idle_sweeper(&shared);
        let runtime = Runtime { shared, supervisor };
        let report = boot::recover(&runtime).await?;
        Ok((runtime, report))
    }

    /// This process may act for `length` more (a node's lease,
    /// docs/nodes.md): the tool spawner kills every tool process it started
    /// unless renewed by then, so a paused node's tools stop before another
    /// node may take its conversations over.
    pub async fn renew_tool_lease(&self, length: Duration) {
        self.shared.spawner.renew_lease(length).await;
    }

    /// The root of `id`'s tree: `id`, or its first ancestor with no parent
    /// (several nodes own conversations by tree, docs/nodes.md).
    pub async fn root_of(&self, id: &ConversationId) -> Result<ConversationId, Error> {
        Ok(crate::ownership::root_of(self.shared.store.as_ref(), id).await?)
    }

    /// Recover the trees rooted at `roots`, which this process has just
    /// taken over from another that is gone (docs/nodes.md): every
    /// conversation of them that was mid-turn or owed a turn is started
    /// and carries out its recovery policy, as at boot.
    pub async fn recover_taken_over(&self, roots: &[ConversationId]) -> Result<BootReport, Error> {
        let roots: HashSet<ConversationId> = roots.iter().cloned().collect();
        boot::recover_trees(self, &roots).await
    }

    /// Create a conversation working in `cwd` (fixed for its whole life,
    /// REQ-BED-010: made absolute and checked to be an existing directory
    /// with a UTF-8 path) and start its actor.
    pub async fn create(
        &self,
        cwd: impl AsRef<Path>,
        config: ConversationConfig,
    ) -> Result<ConversationHandle, Error> {
        let id = activation::create(
            &self.shared,
            &self.supervisor.get_cell(),
            cwd.as_ref(),
            config,
            None,
        )
        .await?;
        Ok(self.handle(id))
    }

    /// Conversation `id`, created as [`create`](Self::create) does if the
    /// store has none of that name: for a protocol whose clients name their
    /// threads (AG-UI's `threadId`). The `bool` says whether this call
    /// created it. Two callers racing to create one id get one
    /// conversation: the registry admits its actor once, and the loser
    /// finds it there.
    pub async fn create_if_absent(
        &self,
        id: ConversationId,
        cwd: impl AsRef<Path>,
        config: ConversationConfig,
    ) -> Result<(ConversationHandle, bool), Error> {
        if self.shared.store.index_entry(&id).await?.is_some() {
            return Ok((self.handle(id), false));
        }
        let created = activation::create_as(
            &self.shared,
            &self.supervisor.get_cell(),
            id.clone(),
            cwd.as_ref(),
            config,
            None,
        )
        .await;
        match created {
            Ok(()) => Ok((self.handle(id), true)),
            Err(Error::Spawn(ractor::SpawnErr::ActorAlreadyRegistered(_))) => {
                Ok((self.handle(id), false))
            }
            Err(error) => Err(error),
        }
    }

    /// A handle on conversation `id`. Every call through it goes through
    /// `ensure_started`; an unknown id is an error on first use.
    pub fn handle(&self, id: ConversationId) -> ConversationHandle {
        ConversationHandle::new(self.starter(), id)
    }

    /// Start conversation `id` if it is not running, and return a handle.
    pub async fn open_conversation(
        &self,
        id: &ConversationId,
    ) -> Result<ConversationHandle, Error> {
        self.ensure_started(id).await?;
        Ok(self.handle(id.clone()))
    }

    pub(crate) async fn ensure_started(&self, id: &ConversationId) -> Result<Mailbox, Error> {
        self.starter().ensure_started(id).await
    }

    /// What starts this runtime's conversations, as a handle holds it.
    fn starter(&self) -> Starter {
        Starter {
            shared: self.shared.clone(),
            supervisor: self.supervisor.get_cell(),
        }
    }

    /// Conversations in the store, oldest first; sub-agents only if asked.
    pub async fn list(&self, include_sub_agents: bool) -> Result<Vec<IndexEntry>, Error> {
        Ok(self.shared.store.list(include_sub_agents).await?)
    }

    /// Ids of the conversations with a live actor now.
    pub fn live(&self) -> Vec<ConversationId> {
        registry::live(&self.shared)
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    /// Every live actor now, by conversation id: its state, idle time,
    /// mailbox, subscribers and an estimate of its memory. Asking wakes no
    /// hibernating conversation; an actor that stops meanwhile is left out.
    /// All are asked at once, and one that does not answer within
    /// `STATS_TIMEOUT` (stuck on one message) is listed from what it was
    /// last seen doing, `responding: false`: the actor an operator most
    /// needs to see.
    pub async fn actors(&self) -> Vec<ActorStats> {
        self.actors_where(|_| true).await
    }

    /// The same as [`Runtime::actors`], asking only the live actors whose
    /// id `wanted` accepts (a page of a listing).
    pub async fn actors_where(&self, wanted: impl Fn(&ConversationId) -> bool) -> Vec<ActorStats> {
        let asks = registry::live(&self.shared)
            .into_iter()
            .filter(|(id, _)| wanted(id))
            .map(|(id, actor)| async move {
                let answer = actor
                    .call(
                        |reply| ConversationMsg::Stats { reply },
                        Some(STATS_TIMEOUT),
                    )
                    .await;
                match answer {
                    Ok(ractor::rpc::CallResult::Success(mut stats)) => {
                        // Messages that arrived while it answered count too.
                        stats.mailbox = actor.len();
                        Some(stats)
                    }
                    Ok(ractor::rpc::CallResult::Timeout) => Some(not_responding(id, &actor)),
                    Ok(ractor::rpc::CallResult::SenderError) | Err(_) => None,
                }
            });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Whether conversation `id` has a live actor now.
    pub fn is_live(&self, id: &ConversationId) -> bool {
        registry::lookup(&self.shared, id).is_some()
    }

    /// How many times the supervisor restarted a failed conversation.
    pub async fn restarts(&self) -> Result<u64, Error> {
        match self
            .supervisor
            .call(|reply| SupervisorMsg::Restarts { reply }, None)
            .await
        {
            Ok(ractor::rpc::CallResult::Success(count)) => Ok(count),
            _ => Err(Error::Stopped),
        }
    }

    pub fn store(&self) -> &Arc<dyn EventLog> {
        &self.shared.store
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.shared.tools
    }

    /// Send `message` to a conversation's actor found as the supervisor's
    /// child, counted in its mailbox like any other.
    fn tell(&self, conversation: &ActorCell, message: ConversationMsg) {
        let id = conversation
            .get_name()
            .and_then(|name| registry::conversation_of(&self.shared.instance, &name));
        let actor: ActorRef<ConversationMsg> = conversation.clone().into();
        let _ = match id {
            Some(id) => registry::mailbox(&self.shared, &id, actor).cast(message),
            None => actor.cast(message),
        };
    }

    /// Stop gracefully (docs/requirements.md, "Graceful stop"), and return
    /// once every actor has let go of the runtime: a disk store is then
    /// closed and its lock free, unless the caller still holds a handle or a
    /// clone of this runtime (both keep the store open).
    ///
    /// The rule: no conversation starts any more and live ones refuse new
    /// messages (`Rejection::ShuttingDown`); a conversation with no turn
    /// running ends its session at once; a turn in flight has
    /// `Settings::shutdown_grace` to finish (approvals and answers still
    /// reach it), after which it is interrupted (`TurnInterrupted`, reason
    /// `shutdown`, its tools killed and their calls answered). Every
    /// conversation then writes `SessionEnded` and its checkpoint. Pending
    /// approvals stay pending, and messages no turn has answered yet stay
    /// owed: the next `open` answers them. Nothing that was sent to a
    /// provider is sent again after the restart.
    pub async fn shutdown(self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        let conversations = self.supervisor.get_children();
        for conversation in &conversations {
            self.tell(conversation, ConversationMsg::Drain);
        }
        let grace = self.shared.settings.shutdown_grace;
        let late = wait_stopped(&conversations, grace).await;
        for conversation in &late {
            self.tell(conversation, ConversationMsg::ShutdownNow);
        }
        let stuck = wait_stopped(&late, PATIENCE).await;
        if !stuck.is_empty() {
            tracing::warn!(
                n = stuck.len(),
                "conversations did not stop within {PATIENCE:?} of the shutdown deadline; killing them"
            );
        }
        kill(&stuck).await;
        self.shared.mcp.shutdown().await;
        self.close().await;
    }

    /// The MCP servers conversations may use (docs/mcp.md).
    pub fn mcp(&self) -> &crate::mcp::McpHub {
        &self.shared.mcp
    }

    /// Stop as a crash would (drills, tests): every conversation and its
    /// workers are killed where they stand, running tools with their process
    /// groups. Turns in flight stay in flight in the log, and the next
    /// `open` recovers them under their recovery policy.
    pub async fn crash(self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        kill(&self.supervisor.get_children()).await;
        self.close().await;
    }

    /// Stop the supervisor and wait until every actor has dropped its
    /// hold on the runtime.
    async fn close(self) {
        let _ = self
            .supervisor
            .stop_and_wait(Some("shutdown".into()), Some(PATIENCE))
            .await;
        // An actor's state (which holds `Shared`) is dropped just after the
        // actor reports that it stopped; wait for the last of them.
        let alive = self.shared.alive.clone();
        drop(self);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while alive.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let left = alive.load(Ordering::SeqCst);
        if left > 0 {
            tracing::warn!(left, "some actors did not stop within {PATIENCE:?}");
        }
    }
}

/// How long `actors` waits for one actor's answer: a busy actor answers
/// after the step it is in.
const STATS_TIMEOUT: Duration = Duration::from_secs(1);

/// How long shutting down waits for an actor that was told to stop.
const PATIENCE: Duration = Duration::from_secs(5);

/// Wait until every actor of `actors` has stopped or `within` has passed;
/// returns those still running.
async fn wait_stopped(actors: &[ActorCell], within: Duration) -> Vec<ActorCell> {
    let deadline = tokio::time::Instant::now() + within;
    let mut running = Vec::new();
    for actor in actors {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if actor.wait(Some(left)).await.is_err() {
            running.push(actor.clone());
        }
    }
    running
}

/// Kill conversations and their workers where they stand: a worker's
/// future is dropped (a stream's socket closes, a tool's process group is
/// killed) without the conversation recording anything.
async fn kill(conversations: &[ActorCell]) {
    for conversation in conversations {
        let workers = conversation.get_children();
        let _ = conversation.kill_and_wait(Some(PATIENCE)).await;
        for worker in workers {
            let _ = worker.kill_and_wait(Some(PATIENCE)).await;
        }
    }
}

/// One task per runtime, not one per conversation, tells every live
/// conversation to look at its idle time every `idle_check`. It holds only a
/// weak reference, and ends with the runtime.
fn spawn_idle_sweeper(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    let every = shared.settings.idle_check;
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let Some(shared) = weak.upgrade() else {
                return;
            };
            if shared.closed.load(Ordering::SeqCst) {
                return;
            }
            for (_, actor) in registry::live(&shared) {
                let _ = actor.cast(ConversationMsg::IdleCheck);
            }
        }
    });
}

/// An actor that did not answer `Stats`, as its control block saw it last.
fn not_responding(id: ConversationId, actor: &Mailbox) -> ActorStats {
    let seen = actor.seen();
    ActorStats {
        id,
        state: seen.state.unwrap_or(keel_core::StateName::Idle),
        responding: false,
        idle_ms: seen
            .handling_since
            .map_or(0, |since| since.elapsed().as_millis() as u64),
        subscribers: None,
        hibernated: None,
        memory_bytes: None,
        mailbox: actor.len(),
    }
}
