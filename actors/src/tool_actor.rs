//! ToolActor: one tool call. Spawned linked to its ConversationActor; runs
//! the tool in its handler, forwards output chunks as they come and ends with
//! one `ToolFinished`. A tool that panics becomes an error result here; a
//! tool whose worker dies some other way is reported by the conversation's
//! supervision handler. Killing the actor (cancel) drops the tool's future,
//! and the tool's RAII guards (a bash call's process group) go with it.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use keel_core::message::ToolCall;

use crate::mailbox::Mailbox;
use crate::message::ConversationMsg;
use crate::metrics;
use crate::process_group::ProcessLedger;
use crate::spawner::Spawner;
use crate::tool::{GroupNotes, Tool, ToolContext, ToolOutcome, ToolOutput};
use crate::tool_groups::Lease;

pub(crate) struct ToolArgs {
    pub(crate) call: ToolCall,
    pub(crate) tool: Arc<dyn Tool>,
    pub(crate) cwd: PathBuf,
    /// The conversation's `tools_may_leave_cwd`, see [`ToolContext`].
    pub(crate) may_leave_cwd: bool,
    pub(crate) ledger: Option<Arc<ProcessLedger>>,
    /// How the tool starts processes, see [`ToolContext`].
    pub(crate) spawner: Spawner,
    /// Where the tool notes its process groups (the lease's notes).
    pub(crate) groups: GroupNotes,
    pub(crate) report: Mailbox,
    pub(crate) span: tracing::Span,
}

pub(crate) struct ToolState {
    /// Taken when the call runs.
    args: Option<ToolArgs>,
    /// Held for as long as the worker lives, and dropped with the state:
    /// after the tool's future and everything it held (its process group,
    /// killed on drop). A conversation rebuilt after a crash waits for it
    /// (`tool_groups.rs`).
    _lease: Lease,
}

pub(crate) enum ToolMsg {
    Run,
}

pub(crate) struct ToolActor;

impl Actor for ToolActor {
    type Msg = ToolMsg;
    type State = ToolState;
    type Arguments = (ToolArgs, Lease);

    async fn pre_start(
        &self,
        myself: ActorRef<ToolMsg>,
        (args, lease): (ToolArgs, Lease),
    ) -> Result<ToolState, ActorProcessingErr> {
        myself.cast(ToolMsg::Run)?;
        Ok(ToolState {
            args: Some(args),
            _lease: lease,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ToolMsg>,
        ToolMsg::Run: ToolMsg,
        state: &mut ToolState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(args) = state.args.take() else {
            return Ok(());
        };
        let span = args.span.clone();
        run(args).instrument(span).await;
        Ok(())
    }
}

async fn run(args: ToolArgs) {
    let ToolArgs {
        call,
        tool,
        cwd,
        may_leave_cwd,
        ledger,
        spawner,
        groups,
        report,
        span,
    } = args;
    let tool_call_id = call.id.clone();
    let tool_name = call.name.clone();
    let (output, mut chunks) = ToolOutput::channel();
    let context = ToolContext {
        call,
        cwd,
        may_leave_cwd,
        output,
        ledger,
        spawner,
        groups,
    };
    let forward = |chunk: String| {
        let _ = report.cast(ConversationMsg::ToolOutput {
            tool_call_id: tool_call_id.clone(),
            chunk,
        });
    };
    let running = AssertUnwindSafe(tool.run(context)).catch_unwind();
    tokio::pin!(running);
    let outcome = loop {
        tokio::select! {
            outcome = &mut running => break outcome,
            Some(chunk) = chunks.recv() => forward(chunk),
        }
    };
    while let Ok(chunk) = chunks.try_recv() {
        forward(chunk);
    }
    let outcome = outcome.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        tracing::warn!(panic = %why, "tool panicked");
        ToolOutcome::error(format!("the tool panicked: {why}"))
    });
    tracing::debug!(is_error = outcome.is_error, "tool finished");
    metrics::tool_run(&tool_name, outcome.is_error);
    if outcome.is_error {
        span.record("error.type", "tool_error");
        span.record("otel.status_code", "error");
    }
    let _ = report.cast(ConversationMsg::ToolFinished {
        tool_call_id,
        outcome,
    });
}
