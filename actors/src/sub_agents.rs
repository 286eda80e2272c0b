//! Carrying out a `spawn_agents` call (`Effect::SpawnSubAgents`): one task
//! per call, owned by the parent's actor, that brings up a sub-agent per
//! task through `activation.rs`, follows them in parallel and reports their
//! outcomes, gathered in task order, as the call's result.
//!
//! The core has decided everything about the call (its tasks, the cap on
//! how many); what is decided here is only how to carry it out so that it
//! survives a crash:
//!
//! - A child's id is derived from (parent, the seq of the response that
//!   made the call, the call's id, task index): unique in the parent's
//!   log, where a provider's tool call ids need not be (one that numbers
//!   its calls reuses them in later responses). A parent restarted mid-call re-dispatches the call from
//!   the same response (recovery `resume`), so the same children are
//!   found, not made again:
//!   a child is created only if its log is empty, and given its task only
//!   if it has no message yet. One that already finished is read from its
//!   log: results that arrived early are kept.
//! - Children are the runtime's conversations like any other (linked to
//!   the root supervisor, not to the parent), so a child's crash is
//!   restarted by the supervisor and only makes this task subscribe again,
//!   and a parent's crash leaves its children running for the next life of
//!   the call to find.
//! - A child inherits its parent's gates, and nobody watches the child: the
//!   calls it waits on are reported to the parent (`ChildPending`), which
//!   lists them, publishes them and passes a resolution of one on to the
//!   child.
//! - The result goes back as `ToolFinished` for the call's id through the
//!   parent's mailbox, the way a tool worker reports: a result for a call
//!   that is no longer running is ignored by the core.
//! - Cancelling the parent's call (a cancel, a deadline, a shutdown: the
//!   core's `AbortTool`) aborts the task and cancels every child through
//!   `activation.rs`, so each child's log records the cancel. So does a call an
//!   earlier life dispatched that recovery closed (`CancelSubAgents`):
//!   nobody waits for its children any more.

use std::fmt::Write as _;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::ActorCell;
use sha2::{Digest, Sha256};

use keel_core::builtin::{self, SpawnTask};
use keel_core::event::{EventKind, PendingCall, SubAgentOutcome};
use keel_core::ids::{ConversationId, Seq, ToolCallId};
use keel_core::message::ToolCall;
use keel_core::{ConversationConfig, LiveEvent, Rejection, StateName};

use crate::mailbox::Mailbox;
use crate::message::ConversationMsg;
use crate::pubsub::{Received, Subscription, Update};
use crate::registry;
use crate::shared::{Alive, NewConversationAt, Shared};
use crate::task::AbortOnDrop;
use crate::tool::ToolOutcome;
use crate::Error;

/// A `spawn_agents` call being carried out, held by the parent's actor.
/// Dropping it (the parent stops, crashes or moves on) aborts the task and
/// leaves the children running; [`SpawnWork::cancel`] stops them too.
pub(crate) struct SpawnWork {
    pub(crate) key: ToolCallId,
    /// The children of the call, in task order.
    children: Vec<ConversationId>,
    _task: AbortOnDrop,
}

/// How often following one child may lose it (its actor stopped or
/// crashed) before it is reported as lost: the supervisor restarts a
/// crashed conversation a few times, then leaves it stopped.
const MAX_REATTACHES: usize = 12;

/// The first wait before following a lost child again; it grows with each
/// loss, up to half a second.
const REATTACH_BACKOFF: Duration = Duration::from_millis(20);

/// How long one request to a child's actor may wait for its answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the parent's actor hands over to carry out one call.
pub(crate) struct SpawnArgs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) parent: ConversationId,
    /// The parent's working directory: the children's, and what a task's
    /// relative `cwd` is taken from.
    pub(crate) parent_cwd: String,
    /// The children are created with the parent's configuration (model,
    /// system prompt, limits).
    pub(crate) config: ConversationConfig,
    pub(crate) call: ToolCall,
    /// Seq of the parent's `AssistantMessage` holding the call: the
    /// children are named after it.
    pub(crate) call_seq: Seq,
    /// The parent's mailbox: child states and the call's result go there.
    pub(crate) report: Mailbox,
}

/// Start carrying out `args.call`.
pub(crate) fn start(args: SpawnArgs) -> SpawnWork {
    // The core accepted the call, so its tasks read; the cap was its to check.
    let tasks = builtin::spawn_tasks(&args.call, u32::MAX, true).unwrap_or_default();
    let children = children_of(&args.parent, args.call_seq, &args.call.id, tasks.len());
    let key = args.call.id.clone();
    let alive = args.shared.alive();
    let task = tokio::spawn(Counted {
        work: Box::pin(run(args, tasks, children.clone())),
        _alive: alive,
    });
    SpawnWork {
        key,
        children,
        _task: AbortOnDrop(task),
    }
}

impl SpawnWork {
    /// Stop the call: abort the task and cancel every child through the
    /// activation (its workers killed at once, the cancel recorded in its log).
    /// The cancels run off the parent's mailbox.
    pub(crate) fn cancel(self, shared: &Arc<Shared>) {
        let SpawnWork {
            children, _task, ..
        } = self;
        drop(_task);
        cancel_children(shared, children);
    }
}

/// Cancel the children of a call that nothing follows (`CancelSubAgents`:
/// an earlier life of the parent dispatched it, and recovery closed it).
pub(crate) fn cancel_unfollowed(
    shared: &Arc<Shared>,
    parent: &ConversationId,
    call: &ToolCall,
    call_seq: Seq,
) {
    let n_tasks = builtin::spawn_tasks(call, u32::MAX, true).map_or(0, |tasks| tasks.len());
    cancel_children(shared, children_of(parent, call_seq, &call.id, n_tasks));
}

/// Cancel each of `children` through activation, off the caller's mailbox.
fn cancel_children(shared: &Arc<Shared>, children: Vec<ConversationId>) {
    let alive = shared.alive();
    let shared = shared.clone();
    tokio::spawn(Counted {
        work: Box::pin(async move {
            let Some(supervisor) = registry::supervisor(&shared) else {
                return;
            };
            let cancels = children
                .iter()
                .map(|child| cancel_child(&shared, &supervisor, child));
            futures_util::future::join_all(cancels).await;
        }),
        _alive: alive,
    });
}

async fn cancel_child(shared: &Arc<Shared>, supervisor: &ActorCell, child: &ConversationId) {
    // A child never created (the call stopped before it) has nothing to cancel.
    if !matches!(shared.store.last_seq(child).await, Ok(seq) if seq > 0) {
        return;
    }
    match shared.activation.cancel(shared, supervisor, child).await {
        Ok(actor) => {
            let _ = actor
                .call(
                    |reply| ConversationMsg::Cancel { reply },
                    Some(CALL_TIMEOUT),
                )
                .await;
        }
        Err(error) => {
            tracing::warn!(conversation = %child, %error, "could not cancel the sub-agent");
        }
    }
}

/// The children of call `call` made by the response at `call_seq` in
/// `parent`, in task order.
pub(crate) fn children_of(
    parent: &ConversationId,
    call_seq: Seq,
    call: &ToolCallId,
    n_tasks: usize,
) -> Vec<ConversationId> {
    (0..n_tasks)
        .map(|task_idx| child_id(parent, call_seq, call, task_idx))
        .collect()
}

/// The id of the child for task `task_idx` of call `call` made by the
/// response at `call_seq` in `parent`: the same every time the call is
/// carried out, different for every call (the seq tells calls of
/// different responses apart whatever their tool call ids, the id tells
/// two calls of one response apart), and shaped like any other
/// conversation id (`c-` and 16 hex digits).
pub(crate) fn child_id(
    parent: &ConversationId,
    call_seq: Seq,
    call: &ToolCallId,
    task_idx: usize,
) -> ConversationId {
    let mut hasher = Sha256::new();
    hasher.update(b"keel sub-agent by seq\0");
    hasher.update(parent.as_str().as_bytes());
    hasher.update(b"\0");
    hasher.update(call_seq.to_be_bytes());
    hasher.update(b"\0");
    hasher.update(call.as_str().as_bytes());
    hasher.update(b"\0");
    hasher.update(task_idx.to_be_bytes());
    let digest = hasher.finalize();
    let mut raw = String::from("c-");
    for byte in &digest[..8] {
        let _ = write!(raw, "{byte:02x}");
    }
    ConversationId::new(raw).unwrap_or_else(|_| unreachable!("invariant: c- and hex is a valid id"))
}

/// How one child ended, as the parent is told.
#[derive(Debug, Clone, PartialEq)]
enum ChildEnd {
    /// Its terminal outcome, from its log.
    Finished(SubAgentOutcome),
    /// It could not be created or followed; why, in words for the model.
    Lost(String),
    /// The runtime is stopping (it refused to start or create the child,
    /// or the child refused its task for that reason): the call is left
    /// for the next start to carry out again, and nothing is reported.
    Stopping,
}

/// A task's work that counts as alive ([`Runtime::crash`] and shutdown
/// wait for every count to go) from its spawn until the work, and the
/// runtime state it holds (the store among it), is dropped: fields drop in
/// declaration order, the work first. Counted inside the work instead, the
/// count would start only at its first poll and could end before the
/// work's captures are dropped, letting a restart find the store still
/// held.
///
/// [`Runtime::crash`]: crate::Runtime::crash
struct Counted {
    work: Pin<Box<dyn Future<Output = ()> + Send>>,
    _alive: Alive,
}

impl Future for Counted {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.work.as_mut().poll(cx)
    }
}

async fn run(args: SpawnArgs, tasks: Vec<SpawnTask>, children: Vec<ConversationId>) {
    let follows = tasks
        .iter()
        .zip(&children)
        .enumerate()
        .map(|(task_idx, (task, child))| follow(&args, task_idx, task, child));
    let ends = futures_util::future::join_all(follows).await;
    if ends.contains(&ChildEnd::Stopping) {
        return;
    }
    let outcome = aggregate(&tasks, &children, &ends);
    let _ = args.report.cast(ConversationMsg::ToolFinished {
        tool_call_id: args.call.id.clone(),
        outcome,
        images: Vec::new(),
    });
}

/// Bring up the child of one task (or find it) and follow it to its end.
async fn follow(
    args: &SpawnArgs,
    task_idx: usize,
    task: &SpawnTask,
    child: &ConversationId,
) -> ChildEnd {
    let shared = &args.shared;
    let Some(supervisor) = registry::supervisor(shared) else {
        return ChildEnd::Stopping;
    };
    match ensure_created(args, &supervisor, task, child).await {
        Ok(()) => {}
        Err(Error::ShuttingDown) => return ChildEnd::Stopping,
        Err(error) => return ChildEnd::Lost(format!("could not be started: {error}")),
    }
    let mut lost = 0;
    loop {
        match attach(args, &supervisor, task_idx, task, child, lost > 0).await {
            Attached::Ended(end) => return end,
            Attached::Closed(why) => {
                lost += 1;
                if lost > MAX_REATTACHES {
                    return ChildEnd::Lost(format!("was lost: {why}"));
                }
                tracing::debug!(conversation = %child, %why, "following the sub-agent again");
                // Give the supervisor time to bring a crashed child back
                // (its dead actor may still hold its name for a moment).
                let backoff = REATTACH_BACKOFF.saturating_mul(lost as u32);
                tokio::time::sleep(backoff.min(Duration::from_millis(500))).await;
            }
        }
    }
}

/// Create the child unless its log exists (this call was carried out
/// before: the parent restarted).
async fn ensure_created(
    args: &SpawnArgs,
    supervisor: &ActorCell,
    task: &SpawnTask,
    child: &ConversationId,
) -> Result<(), Error> {
    if args.shared.store.last_seq(child).await? > 0 {
        return Ok(());
    }
    // A relative directory is taken from the parent's; `join` keeps an
    // absolute one as it is.
    let parent_cwd = Path::new(&args.parent_cwd);
    let cwd = match &task.cwd {
        Some(cwd) => parent_cwd.join(cwd),
        None => parent_cwd.to_path_buf(),
    };
    if !args.config.tools_may_leave_cwd {
        stays_inside(parent_cwd, &cwd).await?;
    }
    let new = NewConversationAt {
        cwd,
        config: args.config.clone(),
        parent_conversation: Some(args.parent.clone()),
    };
    match args
        .shared
        .activation
        .create_as(&args.shared, supervisor, child.clone(), new)
        .await
    {
        // An earlier life of this call was creating it as it stopped.
        Err(Error::Spawn(ractor::SpawnErr::ActorAlreadyRegistered(_))) => Ok(()),
        other => other,
    }
}

/// A confined parent's child works inside the parent's directory: the core
/// refused `..` and absolute paths; this catches a symbolic link that
/// leads out.
async fn stays_inside(parent_cwd: &Path, cwd: &Path) -> Result<(), Error> {
    let refuse = |reason: &str| Error::InvalidCwd {
        cwd: cwd.display().to_string(),
        reason: reason.to_owned(),
    };
    let root = tokio::fs::canonicalize(parent_cwd)
        .await
        .map_err(|error| refuse(&error.to_string()))?;
    let target = tokio::fs::canonicalize(cwd)
        .await
        .map_err(|error| refuse(&error.to_string()))?;
    if target.starts_with(&root) {
        Ok(())
    } else {
        Err(refuse(
            "it leads outside the parent's directory, which its tools may not leave",
        ))
    }
}

/// One attachment to a child: it ended, or its actor went away.
enum Attached {
    Ended(ChildEnd),
    Closed(String),
}

async fn attach(
    args: &SpawnArgs,
    supervisor: &ActorCell,
    task_idx: usize,
    task: &SpawnTask,
    child: &ConversationId,
    reattached: bool,
) -> Attached {
    let actor = match args
        .shared
        .activation
        .ensure_started(&args.shared, supervisor, child)
        .await
    {
        Ok(actor) => actor,
        Err(Error::ShuttingDown) => return Attached::Ended(ChildEnd::Stopping),
        Err(error) => return Attached::Closed(error.to_string()),
    };
    let mut subscription: Subscription = match actor
        .call(
            |reply| ConversationMsg::Subscribe { from: None, reply },
            Some(CALL_TIMEOUT),
        )
        .await
    {
        Ok(CallResult::Success(subscription)) => subscription,
        Ok(CallResult::Timeout) => return Attached::Closed("it did not answer".to_owned()),
        Ok(CallResult::SenderError) | Err(_) => {
            return Attached::Closed("its actor stopped".to_owned())
        }
    };
    let state = subscription.view.state;
    report_state(args, task_idx, child, state);
    // What the child waits on, as of this attachment (a parent that
    // attached again after a crash learns it here; attached again, it
    // replaces what may have changed unseen), then kept up to date from
    // its events.
    let mut pending = subscription.view.pending.clone();
    if reattached || !pending.is_empty() {
        report_pending(args, child, &pending);
    }
    if matches!(state, StateName::Completed | StateName::Failed) {
        return Attached::Ended(finished_from_log(args, child).await);
    }
    // A new child has no message yet: give it its task. Subscribed first,
    // so nothing it does after is missed.
    if subscription.view.last_seq > 0 && subscription.view.recent_messages.is_empty() {
        let sent = actor
            .call(
                |reply| ConversationMsg::Send {
                    text: task.task.clone(),
                    images: Vec::new(),
                    // A lost answer is settled by re-reading the child.
                    ticket: Default::default(),
                    reply,
                },
                Some(CALL_TIMEOUT),
            )
            .await;
        match sent {
            Ok(CallResult::Success(Ok(_))) => {}
            Ok(CallResult::Success(Err(rejection))) => {
                return Attached::Ended(refused_task(rejection))
            }
            Ok(CallResult::Timeout) => return Attached::Closed("it did not answer".to_owned()),
            Ok(CallResult::SenderError) | Err(_) => {
                return Attached::Closed("its actor stopped".to_owned())
            }
        }
    }
    loop {
        match subscription.next().await {
            Received::Update(Update::Live {
                event: LiveEvent::StateChanged { state },
            }) => report_state(args, task_idx, child, state),
            Received::Update(Update::Event { event }) => {
                if follow_pending(&mut pending, &event.kind) {
                    report_pending(args, child, &pending);
                }
                if let EventKind::Finished { outcome } = &event.kind {
                    // Said now: the state change comes after the event, and
                    // this subscription ends here.
                    let state = match outcome {
                        SubAgentOutcome::Completed { .. } => StateName::Completed,
                        SubAgentOutcome::Failed { .. } => StateName::Failed,
                    };
                    report_state(args, task_idx, child, state);
                    return Attached::Ended(ChildEnd::Finished(outcome.clone()));
                }
            }
            Received::Update(Update::Live { .. }) | Received::Lagged { .. } => {}
            // The log still has everything: look there on the next attach.
            Received::CatchUpFailed { error } => return Attached::Closed(error),
            Received::Closed => return Attached::Closed("its actor stopped".to_owned()),
        }
    }
}

/// How a child that refused its task ended, as far as the call is
/// concerned. A child refuses because keel is stopping when a graceful
/// stop began between its creation and its task: that is transient, not
/// the child's failure, so nothing is reported and the call is left for
/// recovery to carry out again (the child is found, and given its task
/// then). Any other refusal ends the child for this call.
fn refused_task(rejection: Rejection) -> ChildEnd {
    match rejection {
        Rejection::ShuttingDown => ChildEnd::Stopping,
        other => ChildEnd::Lost(format!("refused its task: {other}")),
    }
}

/// The outcome of a child that finished, from its log.
async fn finished_from_log(args: &SpawnArgs, child: &ConversationId) -> ChildEnd {
    match keel_store::load(args.shared.store.as_ref(), child).await {
        Ok(Some(working)) => match working.outcome {
            Some(outcome) => ChildEnd::Finished(outcome),
            None => ChildEnd::Lost("ended without an outcome in its log".to_owned()),
        },
        Ok(None) => ChildEnd::Lost("its log is gone".to_owned()),
        Err(error) => ChildEnd::Lost(format!("its log could not be read: {error}")),
    }
}

/// Keep `pending`, a child's calls that wait, in step with its event
/// `kind` as its reducer does; whether it changed.
fn follow_pending(pending: &mut Vec<PendingCall>, kind: &EventKind) -> bool {
    let before = pending.len();
    match kind {
        EventKind::Suspended { pending: more } => {
            pending.extend(more.iter().cloned());
            return true;
        }
        EventKind::Resolved { tool_call_id, .. } | EventKind::ToolResult { tool_call_id, .. } => {
            pending.retain(|waiting| waiting.call.id != *tool_call_id);
        }
        // A turn's end (or the child's) leaves nothing waiting.
        EventKind::TurnCompleted { .. }
        | EventKind::TurnInterrupted { .. }
        | EventKind::TurnFailed { .. }
        | EventKind::Rewound { .. }
        | EventKind::Finished { .. } => pending.clear(),
        EventKind::Created { .. }
        | EventKind::SessionStarted
        | EventKind::SessionEnded
        | EventKind::UserMessage { .. }
        | EventKind::TurnStarted { .. }
        | EventKind::AssistantMessage { .. }
        | EventKind::ConfigChanged { .. }
        | EventKind::Recovered { .. }
        | EventKind::Nudge { .. }
        | EventKind::DebounceCancelled
        | EventKind::Unanswered { .. }
        | EventKind::Compacted { .. } => {}
    }
    pending.len() != before
}

/// Tell the parent what a child waits on now (all of it).
fn report_pending(args: &SpawnArgs, child: &ConversationId, pending: &[PendingCall]) {
    let _ = args.report.cast(ConversationMsg::ChildPending {
        tool_call_id: args.call.id.clone(),
        child: child.clone(),
        pending: pending.to_vec(),
    });
}

/// Tell the parent's watchers that a child is in `state` now.
fn report_state(args: &SpawnArgs, task_idx: usize, child: &ConversationId, state: StateName) {
    let _ = args.report.cast(ConversationMsg::ChildState {
        event: LiveEvent::ChildState {
            tool_call_id: args.call.id.clone(),
            task_idx,
            child: child.clone(),
            state,
        },
    });
}

/// The call's result: every task's outcome in task order, said plainly,
/// so the model can tell what to use and what to do again. An error
/// result only when no child completed.
fn aggregate(tasks: &[SpawnTask], children: &[ConversationId], ends: &[ChildEnd]) -> ToolOutcome {
    let n_tasks = tasks.len();
    let n_completed = ends
        .iter()
        .filter(|end| matches!(end, ChildEnd::Finished(SubAgentOutcome::Completed { .. })))
        .count();
    let mut text = format!(
        "{n_completed} of {n_tasks} sub-agent{} completed.",
        if n_tasks == 1 { "" } else { "s" }
    );
    for (task_idx, ((task, child), end)) in tasks.iter().zip(children).zip(ends).enumerate() {
        let number = task_idx + 1;
        let _ = write!(
            text,
            "\n\n## Task {number} ({child}): {}\n",
            headline(&task.task)
        );
        match end {
            ChildEnd::Finished(SubAgentOutcome::Completed { result }) => {
                let _ = write!(text, "Completed. Result:\n{result}");
            }
            ChildEnd::Finished(SubAgentOutcome::Failed { reason }) => {
                let _ = write!(text, "Failed, no result: {reason}.");
            }
            ChildEnd::Lost(why) => {
                let _ = write!(text, "Failed, no result: the sub-agent {why}.");
            }
            // Never reported (see `run`).
            ChildEnd::Stopping => text.push_str("Not finished: keel is stopping."),
        }
    }
    ToolOutcome {
        content: text,
        is_error: n_completed == 0,
        images: Vec::new(),
    }
}

/// The start of a task, on one line, to tell the tasks apart.
fn headline(task: &str) -> String {
    const LONGEST: usize = 80;
    let line = task.lines().next().unwrap_or_default().trim();
    if line.chars().count() > LONGEST || task.lines().nth(1).is_some() {
        let cut: String = line.chars().take(LONGEST).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(raw: &str) -> ConversationId {
        ConversationId::new(raw).unwrap()
    }

    #[test]
    fn a_child_id_is_the_same_for_the_same_call_and_task_and_differs_otherwise() {
        let parent = id("c-parent");
        let call = ToolCallId::new("call_1");
        let first = child_id(&parent, 7, &call, 0);
        assert_eq!(first, child_id(&parent, 7, &call, 0));
        assert_ne!(first, child_id(&parent, 7, &call, 1));
        // The same tool call id in a later response (a provider that
        // numbers its calls), and two calls of one response.
        assert_ne!(first, child_id(&parent, 12, &call, 0));
        assert_ne!(first, child_id(&parent, 7, &ToolCallId::new("call_2"), 0));
        assert_ne!(first, child_id(&id("c-other"), 7, &call, 0));
        assert_eq!(
            children_of(&parent, 7, &call, 2),
            [first.clone(), child_id(&parent, 7, &call, 1)]
        );
        assert!(first.as_str().starts_with("c-") && first.as_str().len() == 18);
    }

    /// A child refuses its task when keel is stopping (a graceful stop
    /// began between its creation and its task): that is no failure of the
    /// child, and the call is left for the next start to carry out again.
    /// Any other refusal is the child's end.
    #[test]
    fn a_task_refused_because_keel_is_stopping_is_no_failure() {
        assert_eq!(refused_task(Rejection::ShuttingDown), ChildEnd::Stopping);
        assert!(matches!(
            refused_task(Rejection::Finished),
            ChildEnd::Lost(why) if why.starts_with("refused its task")
        ));
    }

    #[test]
    fn the_aggregate_says_every_outcome_in_task_order() {
        let task = |text: &str| SpawnTask {
            task: text.to_owned(),
            cwd: None,
        };
        let tasks = [
            task("count files"),
            task("find bugs\nin depth"),
            task("third"),
        ];
        let children = [id("c-1"), id("c-2"), id("c-3")];
        let ends = [
            ChildEnd::Finished(SubAgentOutcome::Completed {
                result: "42".to_owned(),
            }),
            ChildEnd::Finished(SubAgentOutcome::Failed {
                reason: "timed out after 1 s without submitting a result".to_owned(),
            }),
            ChildEnd::Lost("could not be started: no such directory".to_owned()),
        ];
        let outcome = aggregate(&tasks, &children, &ends);
        assert!(!outcome.is_error);
        let text = outcome.content;
        assert!(text.starts_with("1 of 3 sub-agents completed."), "{text}");
        let first = text.find("## Task 1 (c-1): count files\nCompleted. Result:\n42");
        let second = text.find("## Task 2 (c-2): find bugs…\nFailed, no result: timed out");
        let third = text.find("## Task 3 (c-3): third\nFailed, no result: the sub-agent could not");
        assert!(
            first.is_some() && second.is_some() && third.is_some(),
            "{text}"
        );
        assert!(first < second && second < third);
        assert!(aggregate(&tasks[2..], &children[2..], &ends[2..]).is_error);
    }
}
