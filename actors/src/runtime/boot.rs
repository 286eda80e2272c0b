//! Recovery at boot. A tool's process group survives the SIGKILL of the
//! process that started it, so first every group the ledger says was
//! running is killed (unless its pid now belongs to another process) and
//! waited for until nothing of it runs, and only then are conversations
//! recovered: nothing is re-dispatched while an
//! old copy of it may still run. Then every conversation the index marks as
//! mid-turn, or as owing a turn to an acknowledged message (a debounce that
//! had not fired, messages queued behind a turn a graceful stop ended), is
//! started; `Input::Started` carries out its recovery policy (`resume`
//! re-runs the request, re-dispatches the dangling tool calls with the same
//! ids or starts the owed turn; `idle` closes open calls with synthetic
//! results and records owed messages as unanswered), and pending approvals
//! are simply there again. A sub-agent whose parent's log no longer waits
//! for it (a crash came between the parent's durable cancel and the cancel
//! of its sub-agents) is cancelled instead: nobody would read its result.

use std::collections::{HashMap, HashSet};

use keel_core::builtin;
use keel_core::ids::ConversationId;
use keel_core::recovery::awaited_spawn;
use keel_store::IndexEntry;

use super::Runtime;
use crate::activation;
use crate::message::ConversationMsg;
use crate::process_group::{self, Reaped};
use crate::registry;
use crate::sub_agents;
use crate::Error;

/// How long boot waits for the groups it killed to be gone.
const REAP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// What boot recovery did.
#[derive(Debug, Default)]
pub struct BootReport {
    /// Tool process groups found in the ledger, and whether each was still
    /// alive and killed.
    pub reaped: Vec<Reaped>,
    /// Conversations that were mid-turn or owed a turn, started again.
    pub recovered: Vec<ConversationId>,
    /// Sub-agents found mid-turn whose parent no longer waits for them
    /// (its cancel was durable, the cancel of its sub-agents was not):
    /// cancelled instead of resumed.
    pub cancelled: Vec<ConversationId>,
    /// Conversations that could not be started, with why.
    pub failed: Vec<(ConversationId, String)>,
}

pub(super) async fn recover(runtime: &Runtime) -> Result<BootReport, Error> {
    let mut report = BootReport::default();
    if let Some(ledger) = &runtime.shared.ledger {
        report.reaped = ledger.reap_survivors().map_err(|source| Error::Io {
            what: "cannot read the process ledger".to_owned(),
            source,
        })?;
        for reaped in report.reaped.iter().filter(|reaped| reaped.killed) {
            tracing::warn!(pgid = reaped.pgid, label = %reaped.label, "killed a tool process group that outlived the last run");
        }
        // Not up until what was killed is dead: nothing re-dispatched below
        // may run beside an old copy of itself.
        let killed: Vec<u32> = report
            .reaped
            .iter()
            .filter(|reaped| reaped.killed)
            .map(|reaped| reaped.pgid)
            .collect();
        for pgid in process_group::wait_gone(&killed, REAP_PATIENCE).await {
            tracing::error!(
                pgid,
                "a killed tool process group still runs; going on without it"
            );
        }
    }
    let owned = match &runtime.shared.ownership {
        None => None,
        Some(ownership) => Some(
            ownership
                .owned()
                .await
                .map_err(|reason| Error::Config {
                    name: "ownership",
                    reason: format!("cannot read which conversations this node owns: {reason}"),
                })?
                .into_iter()
                .collect::<HashSet<_>>(),
        ),
    };
    recover_conversations(runtime, owned.as_ref(), &mut report).await?;
    Ok(report)
}

/// Recover the trees rooted at `roots` (taken over from a node that is
/// gone): what boot does for its conversations, but for those only.
pub(super) async fn recover_trees(
    runtime: &Runtime,
    roots: &HashSet<ConversationId>,
) -> Result<BootReport, Error> {
    let mut report = BootReport::default();
    recover_conversations(runtime, Some(roots), &mut report).await?;
    Ok(report)
}

/// Start every conversation that needs recovery, of the trees rooted in
/// `roots` if given (a node recovers only what it owns).
async fn recover_conversations(
    runtime: &Runtime,
    roots: Option<&HashSet<ConversationId>>,
    report: &mut BootReport,
) -> Result<(), Error> {
    let entries = runtime.shared.store.list(true).await?;
    let wanted = wanted(&entries, roots);
    for entry in wanted {
        if let Some(parent) = &entry.parent {
            if !parent_waits(runtime, parent, &entry.id).await {
                match cancel_orphan(runtime, &entry.id).await {
                    Ok(()) => report.cancelled.push(entry.id),
                    Err(error) => {
                        tracing::error!(conversation = %entry.id, %error, "could not cancel");
                        report.failed.push((entry.id, error.to_string()));
                    }
                }
                continue;
            }
        }
        match runtime.ensure_started(&entry.id).await {
            Ok(_) => report.recovered.push(entry.id),
            Err(error) => {
                tracing::error!(conversation = %entry.id, %error, "could not recover");
                report.failed.push((entry.id, error.to_string()));
            }
        }
    }
    if !report.recovered.is_empty() {
        tracing::info!(
            n = report.recovered.len(),
            "recovered conversations that were mid-turn"
        );
    }
    Ok(())
}

/// The entries that need recovery, of the trees rooted in `roots` if
/// given.
fn wanted(entries: &[IndexEntry], roots: Option<&HashSet<ConversationId>>) -> Vec<IndexEntry> {
    let parents: HashMap<&ConversationId, &ConversationId> = entries
        .iter()
        .filter_map(|entry| entry.parent.as_ref().map(|parent| (&entry.id, parent)))
        .collect();
    let root = |id: &ConversationId| -> ConversationId {
        let mut current = id;
        for _ in 0..64 {
            match parents.get(current) {
                Some(parent) => current = *parent,
                None => break,
            }
        }
        current.clone()
    };
    entries
        .iter()
        .filter(|entry| entry.needs_recovery())
        .filter(|entry| roots.is_none_or(|roots| roots.contains(&root(&entry.id))))
        .cloned()
        .collect()
}

/// Whether `parent`'s log still waits for `child`: its open `spawn_agents`
/// call (`keel_core::recovery::awaited_spawn`) is the one `child` was
/// created for. A parent that cannot be read is given the benefit of the
/// doubt: the child is recovered as before.
async fn parent_waits(runtime: &Runtime, parent: &ConversationId, child: &ConversationId) -> bool {
    let working = match keel_store::load(runtime.shared.store.as_ref(), parent).await {
        Ok(Some(working)) => working,
        Ok(None) => return false,
        Err(error) => {
            tracing::warn!(conversation = %child, %parent, %error, "cannot read the parent; recovering the sub-agent");
            return true;
        }
    };
    awaited_spawn(&working).is_some_and(|(call_seq, call)| {
        let n_tasks = builtin::spawn_tasks(call, u32::MAX, true).map_or(0, |tasks| tasks.len());
        sub_agents::children_of(parent, call_seq, &call.id, n_tasks).contains(child)
    })
}

/// Cancel a sub-agent nobody waits for: its actor is started to record the
/// cancel, which it carries out before recovering anything.
async fn cancel_orphan(runtime: &Runtime, child: &ConversationId) -> Result<(), Error> {
    let supervisor = registry::supervisor(&runtime.shared).ok_or(Error::ShuttingDown)?;
    let actor = activation::cancel(&runtime.shared, &supervisor, child).await?;
    let _ = actor
        .call(
            |reply| ConversationMsg::Cancel { reply },
            Some(CANCEL_PATIENCE),
        )
        .await;
    tracing::info!(conversation = %child, "cancelled a sub-agent its parent no longer waits for");
    Ok(())
}

/// How long boot waits for an orphaned sub-agent to record its cancel.
const CANCEL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
