//! Running a file tool's blocking work (file reads, directory walks) on
//! tokio's blocking pool, so it never holds up an async worker, and
//! stopping it when the call is cancelled.
//!
//! Cancel drops the tool's future; a blocking thread cannot be dropped, so
//! the future holds a guard that raises a [`Cancel`] flag on drop, and long
//! loops (walks, searches) check it and stop. Short work (one file read or
//! write) runs to its end; its result is simply not wanted any more.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::paths::Confinement;
use super::{ToolContext, ToolOutcome};

/// Raised when the call that started the work was cancelled.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub(crate) fn is_raised(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn raise_for_test(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Raises its [`Cancel`] when dropped, that is when the work is over or
/// its caller has gone.
struct RaiseOnDrop(Cancel);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        (self.0).0.store(true, Ordering::Relaxed);
    }
}

/// Parse the call's input as `Input`, resolve the working directory, and
/// run `work` on the blocking pool.
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
    let cancel = Cancel::default();
    let _raise = RaiseOnDrop(cancel.clone());
    let task = tokio::task::spawn_blocking(move || {
        let confinement = match Confinement::new(&cwd, may_leave) {
            Ok(confinement) => confinement,
            Err(problem) => return ToolOutcome::error(problem),
        };
        work(input, &confinement, &cancel)
    });
    match task.await {
        Ok(outcome) => outcome,
        // The ToolActor turns a panic in the tool itself into an error
        // result; one on the blocking thread arrives here instead.
        Err(error) => ToolOutcome::error(format!("the tool failed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use keel_core::message::ToolCall;
    use keel_core::ToolCallId;
    use serde_json::json;
    use tokio::sync::mpsc;

    use super::*;
    use crate::tool::ToolOutput;

    fn context(input: serde_json::Value) -> ToolContext {
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
        }
    }

    #[derive(serde::Deserialize)]
    struct Nothing {}

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
        let patience = Duration::from_secs(20);
        let mut call = Box::pin(call);
        tokio::select! {
            _ = &mut call => panic!("the work cannot end before it is cancelled"),
            started = heard.recv() => assert_eq!(started, Some("started")),
        }
        drop(call);
        let stopped = tokio::time::timeout(patience, heard.recv()).await;
        assert_eq!(stopped.expect("the work did not stop"), Some("stopped"));
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
