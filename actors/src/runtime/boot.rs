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
//! are simply there again.

use keel_core::ids::ConversationId;

use super::Runtime;
use crate::process_group::{self, Reaped};
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
    for entry in runtime.shared.store.list(true).await? {
        if !entry.needs_recovery() {
            continue;
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
    Ok(report)
}
