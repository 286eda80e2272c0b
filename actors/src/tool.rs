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
//! calls into a pending question and a sub-agent's result itself. The
//! registry only tells the model about them ([`ToolRegistry::specs`]).

mod bash;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use keel_core::message::ToolCall;
use keel_core::wire::ToolSpec;
use tokio::sync::mpsc;

pub use bash::Bash;

use crate::process_group::ProcessLedger;

/// The call keel-core turns into a question for the user. Must equal
/// `keel_core::transition::stream::ASK_USER` (private to keel-core), and the
/// question is read from the input field `"question"` as core reads it.
pub const ASK_USER: &str = "ask_user";
/// A sub-agent's final answer, handled by keel-core. Must equal
/// `keel_core::transition::stream::SUBMIT_RESULT`; core reads the input field
/// `"result"`.
pub const SUBMIT_RESULT: &str = "submit_result";

/// What a tool gets to run one call.
#[derive(Debug)]
pub struct ToolContext {
    pub call: ToolCall,
    /// The conversation's fixed working directory (REQ-BED-010). Tools never
    /// change it.
    pub cwd: PathBuf,
    /// Output as it is produced, for live display. Chunks, not lines.
    pub output: ToolOutput,
    /// Where process-spawning tools record their process groups so that a
    /// restarted runtime can kill any that outlived it. `None` in tests that
    /// don't care.
    pub ledger: Option<Arc<ProcessLedger>>,
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
}

impl ToolOutcome {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutcome {
            content: content.into(),
            is_error: false,
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        ToolOutcome {
            content: content.into(),
            is_error: true,
        }
    }
}

/// A tool the model can call. Runs inside a `ToolActor`'s task; cancelling
/// the call DROPS the future returned by `run`, so every resource (child
/// processes!) must be released by RAII on drop.
#[async_trait::async_trait]
pub trait Tool: Send + Sync + 'static {
    /// How the model is told about this tool; `spec().name` is its name.
    fn spec(&self) -> ToolSpec;
    async fn run(&self, ctx: ToolContext) -> ToolOutcome;
}

/// The tools a runtime offers, by name. Cheap to clone: the map is shared,
/// and copied only when a clone registers a tool.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    /// Ordered by name, so specs come out in the same order on every request
    /// (a stable prompt prefix keeps the provider's prompt cache warm).
    tools: Arc<BTreeMap<String, Arc<dyn Tool>>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// No tools at all (`ask_user` is still offered by [`specs`](Self::specs)).
    pub fn new() -> Self {
        ToolRegistry::default()
    }

    /// The tools every conversation gets: `bash`.
    pub fn with_defaults() -> Self {
        let mut registry = ToolRegistry::new();
        registry.register(Bash);
        registry
    }

    /// Add `tool`, replacing a tool of the same name. A tool named `ask_user`
    /// or `submit_result` would never run (keel-core answers those calls
    /// itself), so the built-in spec is what the model sees.
    pub fn register(&mut self, tool: impl Tool) -> &mut Self {
        let name = tool.spec().name;
        Arc::make_mut(&mut self.tools).insert(name, Arc::new(tool));
        self
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// Specs to send to the model, sorted by name: every registered tool plus
    /// the built-in `ask_user`, and `submit_result` for a sub-agent.
    pub fn specs(&self, sub_agent: bool) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self
            .tools
            .iter()
            .filter(|(name, _)| name.as_str() != ASK_USER && name.as_str() != SUBMIT_RESULT)
            .map(|(_, tool)| tool.spec())
            .collect();
        specs.push(ask_user_spec());
        if sub_agent {
            specs.push(submit_result_spec());
        }
        specs.sort_by(|left, right| left.name.cmp(&right.name));
        specs
    }
}

/// `ask_user`: keel-core suspends the turn until the user answers (or
/// declines), and core refuses it alongside other calls, so the description
/// says so.
fn ask_user_spec() -> ToolSpec {
    ToolSpec {
        name: ASK_USER.to_owned(),
        description: "Ask the user a question and wait for the answer. Use it when you \
                      cannot go on without the user's input. It must be the only tool call \
                      in its response. The user may decline to answer."
            .to_owned(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {
                "question": {
                    "type": "string",
                    "description": "The question, as the user will read it."
                }
            },
            "required": ["question"]
        }),
    }
}

/// `submit_result`: a sub-agent's answer to its parent; the sub-agent ends.
fn submit_result_spec() -> ToolSpec {
    ToolSpec {
        name: SUBMIT_RESULT.to_owned(),
        description: "Finish your task and hand its result to the agent that started you. \
                      Call it once, when the task is done; it must be the only tool call in \
                      its response, and you stop after it."
            .to_owned(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {
                "result": {
                    "type": "string",
                    "description": "The result of your task, complete: the parent sees only this."
                }
            },
            "required": ["result"]
        }),
    }
}
