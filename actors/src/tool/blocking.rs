//! Running a file tool's blocking work (file reads and writes, directory
//! walks) on threads of its own, under a deadline, and stopping it when
//! the call is cancelled or runs out of time.
//!
//! The work never runs on tokio's blocking pool: the store's reads run
//! there (`spawn_blocking`), and a file tool stuck on a slow disk must not
//! hold a thread they wait for. Each call gets a thread of its own named
//! [`THREAD_NAME`], and at most [`MAX_THREADS`] run at once in the process
//! (a call waits for a free one, under its deadline), so even work that
//! never returns holds a bounded number of threads.
//!
//! A call may take [`TIMEOUT`], `bash`'s default: then it is stopped as a
//! cancel would stop it, and its result says it ran out of time. (Under
//! tokio's paused test clock, which jumps ahead whenever the runtime has
//! nothing to do, a call whose thread is still working reaches its
//! deadline at once: the thread is not the runtime's.)
//!
//! Cancel drops the tool's future; a thread cannot be dropped, so the
//! future holds a guard that raises a [`Cancel`] flag on drop. Long loops
//! (walks, searches, reading lines) check it and stop; a write commits its
//! rename through [`Cancel::commit`], so a write whose call was cancelled
//! (or timed out) never lands.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, Semaphore};

use super::paths::Confinement;
use super::{ToolContext, ToolOutcome};

/// How long one file tool call may take, as `bash`'s default `timeout_ms`.
pub const TIMEOUT: Duration = Duration::from_secs(120);
/// The most file tool threads that run at once in the process.
pub const MAX_THREADS: usize = 8;
/// The name of every thread file tool work runs on.
pub const THREAD_NAME: &str = "keel-file-tool";

/// The permits for [`MAX_THREADS`]; a thread holds one until its work
/// ends, even when its call was given up on.
static THREADS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(MAX_THREADS)));

/// Raised when the call that started the work was cancelled, ran out of
/// time or is over.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cancel(Arc<CancelState>);

#[derive(Debug, Default)]
struct CancelState {
    raised: AtomicBool,
    /// Held while raising the flag and while committing, so a commit
    /// either happens before a raise returns or not at all.
    commit: Mutex<()>,
}

impl Cancel {
    pub(crate) fn is_raised(&self) -> bool {
        self.0.raised.load(Ordering::Acquire)
    }

    /// Raise the flag. Returns once no commit is in progress: what was not
    /// committed by now never will be.
    pub(crate) fn raise(&self) {
        let _commit = self.0.commit.lock().unwrap_or_else(PoisonError::into_inner);
        self.0.raised.store(true, Ordering::Release);
    }

    /// Run `step` (a write's final rename) unless the flag is raised;
    /// `None` when it was. A [`Cancel::raise`] waits for a `step` that has
    /// begun, so keep it short.
    pub(crate) fn commit<T>(&self, step: impl FnOnce() -> T) -> Option<T> {
        let _commit = self.0.commit.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_raised() {
            return None;
        }
        Some(step())
    }
}

/// Raises its [`Cancel`] when dropped, that is when the work is over or
/// its caller has gone.
struct RaiseOnDrop(Cancel);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.raise();
    }
}

/// Parse the call's input as `Input`, resolve the working directory, and
/// run `work` on a file tool thread within [`TIMEOUT`].
pub(crate) async fn run<Input, Work>(ctx: &ToolContext, work: Work) -> ToolOutcome
where
    Input: serde::de::DeserializeOwned + Send + 'static,
    Work: FnOnce(Input, &Confinement, &Cancel) -> ToolOutcome + Send + 'static,
{
    let input: Input = match serde_json::from_value(ctx.call.input.clone()) {
        Ok(input) => input,
        Err(error) => {
            return ToolOutcome::error(format!(
                "bad input for {}: {error}; input: {}",
                ctx.call.name, ctx.call.input
            ))
        }
    };
    let cwd = ctx.cwd.clone();
    let may_leave = ctx.may_leave_cwd;
    // The kernel's rules for the thread (docs/sandbox.md), and the paths
    // the tools refuse themselves.
    let kernel = match ctx.sandbox.file_confinement(&cwd) {
        Ok(kernel) => kernel,
        Err(problem) => {
            return ToolOutcome::error(format!("{} was not run: {problem}", ctx.call.name))
        }
    };
    let forbidden = ctx.sandbox.forbidden();
    let job = move |cancel: &Cancel| {
        if let Some(kernel) = &kernel {
            if let Err(error) = crate::sandbox::confine_files(kernel) {
                return ToolOutcome::error(format!(
                    "the tool was not run: {error}. {}",
                    crate::tool_sandbox::UNCONFINED_HINT
                ));
            }
        }
        let confinement = match Confinement::new(&cwd, may_leave) {
            Ok(confinement) => confinement.forbidding(&forbidden),
            Err(problem) => return ToolOutcome::error(problem),
        };
        work(input, &confinement, cancel)
    };
    match tokio::time::timeout(TIMEOUT, on_thread(job)).await {
        Ok(outcome) => outcome,
        // Dropping `on_thread`'s future raised the work's Cancel.
        Err(_elapsed) => ToolOutcome::error(format!(
            "{} did not finish within {} s and was stopped",
            ctx.call.name,
            TIMEOUT.as_secs()
        )),
    }
}

/// Run `job` on a thread of its own once one of the [`MAX_THREADS`] is
/// free. Dropping the future raises the job's [`Cancel`].
async fn on_thread<Job>(job: Job) -> ToolOutcome
where
    Job: FnOnce(&Cancel) -> ToolOutcome + Send + 'static,
{
    let Ok(permit) = THREADS.clone().acquire_owned().await else {
        return ToolOutcome::error("the file tools are shut down");
    };
    let cancel = Cancel::default();
    let raise = RaiseOnDrop(cancel.clone());
    let (done, outcome) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(THREAD_NAME.to_owned())
        .spawn(move || {
            let _permit = permit;
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| job(&cancel)))
                .unwrap_or_else(|panic| {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|text| (*text).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "no message".to_owned());
                    ToolOutcome::error(format!("the tool failed: {why}"))
                });
            let _ = done.send(outcome);
        });
    if let Err(error) = spawned {
        return ToolOutcome::error(format!("the tool could not start a thread: {error}"));
    }
    let outcome = outcome.await.unwrap_or_else(|_| {
        ToolOutcome::error("the tool failed: its thread ended without a result")
    });
    drop(raise);
    outcome
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use keel_core::message::ToolCall;
    use keel_core::ToolCallId;
    use serde_json::json;
    use tokio::sync::mpsc;

    use super::*;
    use crate::tool::ToolOutput;

    /// Only a broken tool (or a badly overloaded machine) waits this long.
    pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

    pub(crate) fn context(input: serde_json::Value) -> ToolContext {
        ToolContext {
            groups: Default::default(),
            call: ToolCall {
                id: ToolCallId::new("toolu_blocking"),
                name: "walker".to_owned(),
                input,
            },
            cwd: std::env::temp_dir(),
            may_leave_cwd: false,
            output: ToolOutput::discard(),
            ledger: None,
            spawner: crate::spawner::Spawner::direct(),
            sandbox: crate::tool::CallSandbox::unconfined(),
        }
    }

    #[derive(serde::Deserialize)]
    pub(crate) struct Nothing {}

    /// Dropping the call's future (cancel) raises the flag the blocking
    /// work watches, so a long walk stops instead of running on unseen.
    #[tokio::test]
    async fn dropping_the_call_stops_the_blocking_work() {
        let (events, mut heard) = mpsc::unbounded_channel();
        let ctx = context(json!({}));
        let call = run(&ctx, move |_: Nothing, _: &Confinement, cancel: &Cancel| {
            let _ = events.send("started");
            while !cancel.is_raised() {
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = events.send("stopped");
            ToolOutcome::ok("never seen")
        });
        let mut call = Box::pin(call);
        tokio::select! {
            _ = &mut call => panic!("the work cannot end before it is cancelled"),
            started = heard.recv() => assert_eq!(started, Some("started")),
        }
        drop(call);
        let stopped = tokio::time::timeout(PATIENCE, heard.recv()).await;
        assert_eq!(stopped.expect("the work did not stop"), Some("stopped"));
    }

    /// Work that outlives the deadline is stopped like a cancel and the
    /// result says so. Paused time: the clock jumps to the deadline while
    /// the work is held at its gate.
    #[tokio::test(start_paused = true)]
    async fn work_past_the_deadline_is_stopped_and_says_so() {
        let (stopped_tx, mut stopped) = mpsc::unbounded_channel();
        let (open_gate, gate) = std::sync::mpsc::channel::<()>();
        let ctx = context(json!({}));
        let started_at = tokio::time::Instant::now();
        let outcome = run(&ctx, move |_: Nothing, _: &Confinement, cancel: &Cancel| {
            let _ = gate.recv();
            let _ = stopped_tx.send(cancel.is_raised());
            ToolOutcome::ok("too late")
        })
        .await;
        assert_eq!(
            outcome,
            ToolOutcome::error("walker did not finish within 120 s and was stopped")
        );
        assert_eq!(started_at.elapsed(), TIMEOUT);
        open_gate.send(()).unwrap();
        assert_eq!(
            stopped.recv().await,
            Some(true),
            "the work was told to stop"
        );
    }

    /// The work runs on a file tool thread, never on tokio's blocking pool,
    /// where the store's reads run.
    #[tokio::test]
    async fn the_work_runs_on_a_file_tool_thread() {
        let ctx = context(json!({}));
        let outcome = run(&ctx, |_: Nothing, _: &Confinement, _: &Cancel| {
            ToolOutcome::ok(std::thread::current().name().unwrap_or("unnamed"))
        })
        .await;
        assert_eq!(outcome, ToolOutcome::ok(THREAD_NAME));
    }

    #[tokio::test]
    async fn a_panic_in_the_work_is_an_error_result() {
        let ctx = context(json!({}));
        let outcome = run(&ctx, |_: Nothing, _: &Confinement, _: &Cancel| {
            panic!("boom");
        })
        .await;
        assert_eq!(outcome, ToolOutcome::error("the tool failed: boom"));
    }

    #[tokio::test]
    async fn input_the_tool_cannot_parse_is_an_error_result() {
        let ctx = context(json!("not an object"));
        let outcome = run(&ctx, |_: Nothing, _: &Confinement, _: &Cancel| {
            ToolOutcome::ok("never runs")
        })
        .await;
        assert!(outcome.is_error);
        assert!(
            outcome.content.starts_with("bad input for walker"),
            "{outcome:?}"
        );
    }
}
