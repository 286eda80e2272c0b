//! Tools the model can call: the [`Tool`] trait, what a tool gets to run one
//! call ([`ToolContext`]) and gives back ([`ToolOutcome`]), and the
//! [`ToolRegistry`] a runtime offers. The tools themselves live under `tool/`.
//!
//! A tool runs inside a `ToolActor`'s task. Cancelling the call drops the
//! future returned by [`Tool::run`], so a tool must release everything it
//! holds by RAII on drop: a tool that spawns processes holds them in a
//! [`ProcessGroup`](crate::process_group::ProcessGroup), whose drop kills them.
//! A tool that cannot do its work returns [`ToolOutcome::error`]: a failed
//! tool is a result for the model, never an error of the runtime.
//!
//! `ask_user` and `submit_result` are not tools here: keel-core turns those
//! calls into a pending question and a sub-agent's result itself, and owns
//! their names and specs (`keel_core::builtin`). The registry only tells the
//! model about them ([`ToolRegistry::specs`]).
//!
//! The registry checks every call's input against the tool's own JSON
//! schema before the tool runs ([`ToolRegistry::get`] hands out the tool
//! wrapped in that check): input that does not match becomes an error
//! result that says what is wrong, so the model can fix its call.

mod bash;
mod blocking;
mod edit_file;
mod files;
mod glob;
mod grep;
mod paths;
mod read_file;
pub(crate) mod schema;
mod walk;
mod write_file;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use keel_core::builtin;
use keel_core::message::ToolCall;
use keel_core::wire::{ToolSpec, ToolSpecs};
use tokio::sync::mpsc;

pub use bash::Bash;
pub use edit_file::EditFile;
pub use glob::Glob;
pub use grep::Grep;
pub use read_file::ReadFile;
pub use write_file::WriteFile;

use crate::image::ImageUpload;
use crate::process_group::ProcessLedger;
use crate::spawner::Spawner;
pub use crate::tool_groups::GroupNotes;
pub use crate::tool_sandbox::CallSandbox;

/// What a tool gets to run one call.
#[derive(Debug)]
pub struct ToolContext {
    pub call: ToolCall,
    /// The conversation's fixed working directory (REQ-BED-010). Tools never
    /// change it.
    pub cwd: PathBuf,
    /// The conversation's `tools_may_leave_cwd`: whether the file tools may
    /// reach paths outside `cwd`. When false (the default) a path that
    /// resolves outside it, `..`, absolute or through a symlink, is refused.
    pub may_leave_cwd: bool,
    /// Output as it is produced, for live display. Chunks, not lines.
    pub output: ToolOutput,
    /// Where process-spawning tools record their process groups so that a
    /// restarted runtime can kill any that outlived it. `None` in tests that
    /// don't care.
    pub ledger: Option<Arc<ProcessLedger>>,
    /// How process-spawning tools start their processes: through the
    /// runtime's spawner process, whose small descriptor table keeps a
    /// spawn's cost apart from the runtime's open connections
    /// (`spawner.rs`). `Spawner::direct()` starts them from this process.
    pub spawner: Spawner,
    /// Where process-spawning tools note their process groups, so that the
    /// conversation, rebuilt after a crash in the same process, waits for
    /// them to be gone before it runs a call again (`GroupNotes::default()`
    /// keeps no notes).
    pub groups: GroupNotes,
    /// The call's sandbox (docs/sandbox.md): how its processes are
    /// confined, and where the file tools may write.
    /// `CallSandbox::unconfined()` confines nothing.
    pub sandbox: CallSandbox,
}

/// Sends output chunks to whoever runs the tool. Cheap to clone. Never
/// blocks: the channel is unbounded, because a tool must not stall its
/// process's pipes waiting for a slow reader (tools bound what they send
/// instead). If the receiver is gone the chunk is dropped.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    /// `None` discards everything.
    sender: Option<mpsc::UnboundedSender<String>>,
}

impl ToolOutput {
    pub fn channel() -> (ToolOutput, mpsc::UnboundedReceiver<String>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (
            ToolOutput {
                sender: Some(sender),
            },
            receiver,
        )
    }

    /// An output nobody reads, for callers that want only the outcome.
    pub fn discard() -> ToolOutput {
        ToolOutput { sender: None }
    }

    /// Send one chunk; an empty chunk is not sent.
    pub fn send(&self, chunk: impl Into<String>) {
        let chunk = chunk.into();
        if chunk.is_empty() {
            return;
        }
        if let Some(sender) = &self.sender {
            // The receiver went away: nobody is watching, which is fine.
            let _ = sender.send(chunk);
        }
    }
}

/// What one call produced: the `tool_result` the model sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    pub content: String,
    pub is_error: bool,
    /// Images that go with the result, as the tool got them. The tool's
    /// worker checks, scales and stores each like a user's attachment
    /// before the result is recorded; one that fails is left out, with a
    /// note in `content` saying why (docs/mcp.md, "Images").
    pub images: Vec<ImageUpload>,
}

impl ToolOutcome {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutcome {
            content: content.into(),
            is_error: false,
            images: Vec::new(),
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        ToolOutcome {
            content: content.into(),
            is_error: true,
            images: Vec::new(),
        }
    }

    /// The outcome with `images` going with it.
    pub fn with_images(mut self, images: Vec<ImageUpload>) -> Self {
        self.images = images;
        self
    }
}

/// `n` and the noun that goes with it: "1 line", "2 lines".
pub(crate) fn counted(n: usize, singular: &str, plural: &str) -> String {
    if n == 1 {
        format!("{n} {singular}")
    } else {
        format!("{n} {plural}")
    }
}

/// A tool the model can call. Runs inside a `ToolActor`'s task; cancelling
/// the call DROPS the future returned by `run`, so every resource (child
/// processes!) must be released by RAII on drop.
///
/// # `ctx.call.id` (the `tool_call_id`) is the idempotency key
///
/// **The same call may run more than once.** If the process dies while a
/// call runs, recovery under `RecoveryPolicy::Resume` dispatches the
/// dangling call again, with the same `tool_call_id` and the same input,
/// and the model never sees the first run's result. A tool with side
/// effects must make that repeat harmless, or at least recognisable:
///
/// - `write_file` writes the same content again: same file.
/// - `edit_file` run again after it succeeded finds `old_string` gone and
///   `new_string` in its place, and says the edit is already applied
///   instead of failing.
/// - `bash` records its process group under the `tool_call_id` so that a
///   restarted runtime kills what outlived the first run. The command
///   itself runs again; it finds the id in `$KEEL_TOOL_CALL_ID`, so a
///   command with side effects can key them on it and skip a repeat.
///
/// A tool that talks to an outside service should pass the `tool_call_id`
/// on as that service's idempotency key where it takes one.
///
/// # Input
///
/// `run` is only called (through [`ToolRegistry::get`]) with input that
/// matches `spec().input_schema`; a tool still parses it without
/// panicking, since tests and embedders may call `run` directly.
#[async_trait::async_trait]
pub trait Tool: Send + Sync + 'static {
    /// How the model is told about this tool; `spec().name` is its name.
    fn spec(&self) -> ToolSpec;
    async fn run(&self, ctx: ToolContext) -> ToolOutcome;
}

/// The tools a runtime offers, by name. Cheap to clone: the map is shared,
/// and copied only when a clone registers a tool.
///
/// Each tool is kept wrapped in a `Checked` (`tool/schema.rs`): its input
/// schema is compiled once, at registration, and every call's input is
/// checked against it before the tool runs.
#[derive(Clone)]
pub struct ToolRegistry {
    /// Ordered by name, so specs come out in the same order on every request
    /// (a stable prompt prefix keeps the provider's prompt cache warm).
    tools: Arc<BTreeMap<String, Arc<dyn Tool>>>,
    /// What [`specs`](Self::specs) answers, built once per registration
    /// rather than on every request: every LLM request sends them.
    offered: Offered,
}

/// The specs offered to a user's conversation and to a sub-agent.
#[derive(Clone)]
struct Offered {
    user: Arc<ToolSpecs>,
    sub_agent: Arc<ToolSpecs>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        let tools = Arc::new(BTreeMap::new());
        let offered = Offered::of(&tools);
        ToolRegistry { tools, offered }
    }
}

impl Offered {
    fn of(tools: &BTreeMap<String, Arc<dyn Tool>>) -> Offered {
        Offered {
            user: Arc::new(offered_specs(tools, false).into()),
            sub_agent: Arc::new(offered_specs(tools, true).into()),
        }
    }
}

/// Every registered tool's spec plus the built-in tools keel-core offers
/// this kind of conversation, sorted by name.
fn offered_specs(tools: &BTreeMap<String, Arc<dyn Tool>>, sub_agent: bool) -> Vec<ToolSpec> {
    let mut specs: Vec<ToolSpec> = tools
        .iter()
        .filter(|(name, _)| !builtin::is_builtin(name))
        .map(|(_, tool)| tool.spec())
        .chain(builtin::offered(sub_agent))
        .collect();
    specs.sort_by(|left, right| left.name.cmp(&right.name));
    specs
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// No tools at all (keel-core's own, such as `ask_user`, are still
    /// offered by [`specs`](Self::specs)).
    pub fn new() -> Self {
        ToolRegistry::default()
    }

    /// The tools every conversation gets: `bash`, and the file tools
    /// `read_file`, `write_file`, `edit_file`, `glob` and `grep` (paths
    /// confined to the working directory, see docs/tools.md).
    pub fn with_defaults() -> Self {
        let mut registry = ToolRegistry::new();
        registry
            .register(Bash)
            .register(ReadFile)
            .register(WriteFile)
            .register(EditFile)
            .register(Glob)
            .register(Grep);
        registry
    }

    /// Add `tool`, replacing a tool of the same name. A tool named like one
    /// of keel-core's own (`ask_user`, `submit_result`, `spawn_agents`)
    /// would never run (keel-core answers those calls itself), so it is
    /// never offered either.
    pub fn register(&mut self, tool: impl Tool) -> &mut Self {
        let name = tool.spec().name;
        let checked = schema::Checked::new(Arc::new(tool));
        Arc::make_mut(&mut self.tools).insert(name, Arc::new(checked));
        self.offered = Offered::of(&self.tools);
        self
    }

    /// The names of the registered tools, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The tool named `name`, wrapped so that input not matching its schema
    /// becomes an error result instead of reaching it.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// Specs to send to the model, sorted by name: every registered tool
    /// plus the built-in tools keel-core offers this kind of conversation
    /// (`ask_user` to a user's, `submit_result` to a sub-agent, which has
    /// no human to ask).
    pub fn specs(&self, sub_agent: bool) -> Vec<ToolSpec> {
        self.offered(sub_agent).to_vec()
    }

    /// [`specs`](Self::specs), shared rather than copied: what each LLM
    /// request carries.
    pub(crate) fn offered(&self, sub_agent: bool) -> Arc<ToolSpecs> {
        if sub_agent {
            self.offered.sub_agent.clone()
        } else {
            self.offered.user.clone()
        }
    }
}
