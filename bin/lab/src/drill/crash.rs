//! `keel drill crash`: SIGKILL a real daemon again and again while
//! conversations work, restart it on the same data dir, and check after
//! every restart that nothing was lost, doubled or left stuck
//! (docs/drills.md).
//!
//! The drill starts the fake provider in this process and `keel serve` (this
//! same binary) as a child process over a temporary data dir, on one
//! loopback port for every life. Workers, one per conversation, send
//! messages in a loop: plain text, or a `bash` call whose command appends
//! `$KEEL_TOOL_CALL_ID` and a nonce of its own to a side-effect file and
//! sleeps a little. Every third conversation has its `bash` calls wait for
//! an approval, which its worker gives after a random pause. Faults for
//! the fake provider are queued now and then, so requests retry. Each
//! worker follows its conversation's event stream (reconnecting across
//! restarts with `Last-Event-ID`) and keeps every canonical event it
//! received and the seq of every message the daemon acknowledged.
//!
//! Meanwhile the drill kills the daemon with SIGKILL, at a random moment or
//! (`--at`) the moment a conversation is in a given state, starts the next
//! life, and checks:
//!
//! - no tool process of an earlier life is still running (each life's
//!   processes carry its number in their environment);
//! - every conversation's log has contiguous seqs; every acknowledged
//!   message is in it; every canonical event a client received is in it,
//!   the same; every `tool_use` got exactly one result before the next
//!   model response;
//! - a call that waited for an approval nobody had given yet still waits.
//!
//! At the end the workers stop, the remaining approvals are given, and
//! every conversation must come to rest; then no nonce in the side-effect
//! file may have run under two different `tool_call_id`s (a recovered call
//! is re-dispatched with its original id, so a repeat is recognisable).
//! `--seed` fixes the workload and the kill schedule (the moments a kill
//! lands still depend on timing).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use serde::Serialize;
use serde_json::{json, Value};

use super::approvals::Approvals;
use super::running::{self, RunningDaemon, RUN_ENV};
use keel_api::client::{Client, Error as ClientError, Frame};
use keel_api::types::{
    ApiContent, ApiDecisionKind, ApiEvent, ApiEventKind, ApiLiveEvent, ApiProvider, ApiRetry,
    ApiState, ApiToolPolicy, CreateConversation,
};
use keel_test_support::{self as rig, ChildDaemon, LIFE_ENV};

pub(super) mod checks;
pub(super) mod drill;
pub(super) mod worker;
use checks::*;
use drill::*;

/// Where a kill is aimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Boundary {
    /// A random moment.
    Any,
    /// While a model's answer streams.
    Streaming,
    /// While a tool runs.
    MidTool,
    /// While a call waits for an approval.
    AwaitingApproval,
    /// While a failed request waits to be retried.
    RetryWait,
    /// While sub-agents of some conversation are at work.
    ChildrenRunning,
    /// While a message is being sent: the daemon is appending it, or about
    /// to, and has not answered yet.
    BeforeAppend,
    /// The moment a client receives a canonical event: it is durable, and
    /// whatever it leads to (a request, a tool, the next append) is
    /// starting.
    AfterAppend,
}

impl Boundary {
    /// Whether the drill's book shows the moment this boundary aims at,
    /// given the number of canonical events received when the aim began.
    fn reached(self, book: &Book, appended_before: u64) -> bool {
        let in_state = |state: ApiState| book.states.values().any(|now| *now == state);
        match self {
            Boundary::Any => true,
            Boundary::Streaming => in_state(ApiState::Streaming),
            Boundary::MidTool => in_state(ApiState::ExecutingTools),
            Boundary::AwaitingApproval => in_state(ApiState::AwaitingInput),
            Boundary::RetryWait => in_state(ApiState::RetryWait),
            Boundary::ChildrenRunning => book.children.values().any(|state| at_work(*state)),
            Boundary::BeforeAppend => book.sending > 0,
            Boundary::AfterAppend => book.appended > appended_before,
        }
    }
}

/// Whether a conversation in `state` is working (not at rest or finished).
pub(in crate::drill) fn at_work(state: ApiState) -> bool {
    matches!(
        state,
        ApiState::Debouncing
            | ApiState::Streaming
            | ApiState::RetryWait
            | ApiState::ExecutingTools
            | ApiState::Recovering
    )
}

#[derive(Debug, Clone)]
pub struct Options {
    pub conversations: usize,
    pub kills: usize,
    pub seed: Option<u64>,
    pub at: Boundary,
    pub json: bool,
    /// A running daemon to drill instead of one of the drill's own.
    pub addr: Option<String>,
    /// The fake provider the daemon at `addr` uses, for queueing faults.
    pub mock_url: Option<String>,
    /// Run with `sh -c` after every kill of the daemon at `addr`.
    pub restart: Option<String>,
}

/// How long a kill aimed at a state waits for some conversation to be in
/// it before it lands anyway (and is counted as a miss).
pub(in crate::drill) const AIM_PATIENCE: Duration = Duration::from_secs(5);
/// How long a turn may stay unfinished (restarts included) before its
/// conversation counts as stuck.
pub(in crate::drill) const TURN_PATIENCE: Duration = Duration::from_secs(60);
/// How long every conversation gets to come to rest at the end.
pub(in crate::drill) const SETTLE_PATIENCE: Duration = Duration::from_secs(60);
/// Starts the nonce a side effect writes beside its `tool_call_id`.
const NONCE: &str = "nonce-";
/// Who decided, in every resolution the drill makes: the log must name
/// nobody else.
const DRILL: &str = "drill";

/// One broken promise.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub check: &'static str,
    pub conversation: Option<String>,
    pub seq: Option<u64>,
    pub detail: String,
    /// After which kill it was found (0: before any, or at the end).
    pub after_kill: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    /// The daemon drilled, when it was not the drill's own.
    pub addr: Option<String>,
    /// Whether provider faults were queued (always, but at `--addr` only
    /// with `--mock-url`).
    pub faults_queued: bool,
    /// The pid of the daemon at `addr` when the drill ended (its last
    /// life, left running).
    pub daemon_pid: Option<u32>,
    pub at: Boundary,
    pub conversations: usize,
    pub kills: usize,
    pub recoveries: usize,
    /// Kills by the states conversations were in when it landed.
    pub kills_by_state: BTreeMap<String, usize>,
    /// Aimed kills that found no conversation in the state in time.
    pub missed_aims: usize,
    pub turns: u64,
    pub tool_calls: usize,
    /// Sub-agents the conversations started.
    pub sub_agents: usize,
    pub approvals: u64,
    pub checks_passed: u64,
    pub violations: Vec<Violation>,
    pub seconds: f64,
    /// The drill's directory (data dir, daemon logs, side-effect file),
    /// kept when something failed; removed otherwise.
    pub kept: Option<String>,
}

pub fn run(mut out: impl Write, options: Options) -> anyhow::Result<Report> {
    if options.conversations == 0 {
        return Err(anyhow!("--conversations must be at least 1"));
    }
    if options.addr.is_some() && options.mock_url.is_none() && options.at == Boundary::RetryWait {
        return Err(anyhow!(
            "--at retry-wait at --addr needs --mock-url: retries come from faults the drill queues at the fake provider"
        ));
    }
    let seed = options.seed.unwrap_or_else(|| fastrand::u64(..));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(drill(&options, seed))?;
    if options.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        print_report(&mut out, &report)?;
    }
    Ok(report)
}

fn print_report(out: &mut impl Write, report: &Report) -> anyhow::Result<()> {
    writeln!(
        out,
        "keel drill crash: seed {}, {} conversations, {} kills (at {:?}) in {:.1} s",
        report.seed, report.conversations, report.kills, report.at, report.seconds
    )?;
    if let Some(addr) = &report.addr {
        let faults = if report.faults_queued {
            "provider faults queued"
        } else {
            "no provider faults queued (no --mock-url)"
        };
        let now = report
            .daemon_pid
            .map_or_else(String::new, |pid| format!(", now pid {pid}"));
        writeln!(out, "  the daemon at {addr}{now}; {faults}")?;
    }
    writeln!(
        out,
        "  recoveries {}, turns {}, tool calls {}, sub-agents {}, approvals {}, checks passed {}",
        report.recoveries,
        report.turns,
        report.tool_calls,
        report.sub_agents,
        report.approvals,
        report.checks_passed
    )?;
    let states: Vec<String> = report
        .kills_by_state
        .iter()
        .map(|(state, kills)| format!("{state} {kills}"))
        .collect();
    writeln!(
        out,
        "  kills landed while conversations were: {}",
        states.join(", ")
    )?;
    if report.missed_aims > 0 {
        writeln!(
            out,
            "  {} kills found no conversation in the aimed state within {AIM_PATIENCE:?}",
            report.missed_aims
        )?;
    }
    print_violations(
        out,
        &report.violations,
        "kill",
        report.seed,
        report
            .kept
            .as_deref()
            .map(|kept| format!("the data dir, daemon logs and side effects are kept in {kept}")),
    )
}

/// A drill's violations, one line each (`after` names its faults: a
/// kill, a fault), how to reproduce them and where the evidence was kept;
/// or that there were none.
pub(super) fn print_violations(
    out: &mut impl Write,
    violations: &[Violation],
    after: &str,
    seed: u64,
    kept: Option<String>,
) -> anyhow::Result<()> {
    if violations.is_empty() {
        writeln!(out, "  no violations")?;
        return Ok(());
    }
    writeln!(out, "  {} violations:", violations.len())?;
    for violation in violations {
        writeln!(
            out,
            "  ! {} (after {after} {}, conversation {}, seq {}): {}",
            violation.check,
            violation.after_kill,
            violation.conversation.as_deref().unwrap_or("-"),
            violation
                .seq
                .map_or_else(|| "-".to_owned(), |seq| seq.to_string()),
            violation.detail
        )?;
    }
    writeln!(out, "  reproduce with --seed {seed}")?;
    if let Some(kept) = kept {
        writeln!(out, "  {kept}")?;
    }
    Ok(())
}

// --- shared state ---------------------------------------------------------

/// What the workers and the killer share.
#[derive(Default)]
pub(in crate::drill) struct Book {
    /// Each conversation's latest state, from its stream.
    pub(in crate::drill) states: HashMap<String, ApiState>,
    /// Seqs of the messages the daemon acknowledged (202).
    pub(in crate::drill) acked: HashMap<String, Vec<u64>>,
    /// Every canonical event a client received, by conversation and seq.
    pub(in crate::drill) seen: HashMap<String, BTreeMap<u64, Value>>,
    /// Each sub-agent's latest state as its parent's stream told it
    /// (`child_state`), by (parent, child); a parent's go when it rests.
    pub(in crate::drill) children: HashMap<(String, String), ApiState>,
    /// Messages being sent (POSTed, not answered yet).
    pub(in crate::drill) sending: usize,
    /// Canonical events received by all clients so far.
    pub(in crate::drill) appended: u64,
    /// How far each conversation's log has been checked.
    pub(in crate::drill) checked: HashMap<String, Checked>,
    pub(in crate::drill) violations: Vec<Violation>,
    pub(in crate::drill) kills: usize,
    pub(in crate::drill) turns: u64,
    pub(in crate::drill) approvals: u64,
    pub(in crate::drill) checks_passed: u64,
}

#[derive(Clone)]
pub(in crate::drill) struct Shared {
    pub(in crate::drill) book: Arc<Mutex<Book>>,
    pub(in crate::drill) stop: Arc<AtomicBool>,
}

impl Shared {
    pub(in crate::drill) fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(in crate::drill) fn violation(
        &self,
        check: &'static str,
        conversation: Option<&str>,
        seq: Option<u64>,
        detail: String,
    ) {
        let mut book = self.book();
        let after_kill = book.kills;
        book.violations.push(Violation {
            check,
            conversation: conversation.map(str::to_owned),
            seq,
            detail,
            after_kill,
        });
    }

    pub(in crate::drill) fn passed(&self, checks: u64) {
        self.book().checks_passed += checks;
    }
}

// --- the daemon's lives ---------------------------------------------------

/// Processes of this run started by a life before `life` that still run:
/// `(pid, life, command line)`.
fn survivors(run_id: &str, life: u32) -> Vec<(u32, u32, String)> {
    rig::processes_with_env(&format!("{RUN_ENV}={run_id}"), LIFE_ENV)
        .into_iter()
        .filter(|(_, of_life, _)| *of_life < life)
        .collect()
}

/// [`survivors`], each said as a violation says it.
pub(in crate::drill) fn described_survivors(run_id: &str, life: u32) -> Vec<String> {
    survivors(run_id, life)
        .into_iter()
        .map(|(pid, life, cmdline)| format!("pid {pid} of life {life} still runs: {cmdline}"))
        .collect()
}

/// The daemon whose lives the drill ends: a child of its own, or the one
/// at `--addr`, brought back by somebody else.
enum Lives {
    Own(ChildDaemon),
    Running(RunningDaemon),
}

impl Lives {
    fn life(&self) -> u32 {
        match self {
            Lives::Own(lab) => lab.life(),
            Lives::Running(daemon) => daemon.life(),
        }
    }

    async fn kill(&mut self) -> anyhow::Result<()> {
        match self {
            Lives::Own(lab) => lab.kill(),
            Lives::Running(daemon) => daemon.kill().await,
        }
    }

    /// Start (or wait for) the next life until it answers.
    async fn next_life(&mut self, client: &Client) -> anyhow::Result<()> {
        match self {
            Lives::Own(lab) => {
                lab.spawn()?;
                lab.ready(client).await.map(drop)
            }
            Lives::Running(daemon) => daemon.next_life(client).await.map(drop),
        }
    }

    /// Processes of an earlier life that still run, described.
    fn survivors(&self, run_id: &str) -> Vec<String> {
        match self {
            Lives::Own(lab) => described_survivors(run_id, lab.life()),
            Lives::Running(daemon) => running::survivors(run_id, daemon.killed())
                .into_iter()
                .map(|(pid, of, cmdline)| {
                    format!("pid {pid}, started by the killed daemon {of}, still runs: {cmdline}")
                })
                .collect(),
        }
    }

    /// The drill is over: its own daemon stops (gracefully) and nothing
    /// of any of its lives may run; the one at `--addr` keeps running, and
    /// nothing of the daemons killed may.
    fn finish(&mut self, run_id: &str) -> anyhow::Result<Vec<String>> {
        if let Lives::Own(lab) = self {
            lab.stop()?;
            return Ok(described_survivors(run_id, lab.life() + 1));
        }
        Ok(self.survivors(run_id))
    }
}

/// A state as the API names it.
pub(in crate::drill) fn state_name(state: ApiState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{state:?}"))
}

pub(in crate::drill) fn is_at_rest(state: ApiState) -> bool {
    matches!(
        state,
        ApiState::Idle
            | ApiState::AwaitingInput
            | ApiState::Error
            | ApiState::Completed
            | ApiState::Failed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_directory_with_a_file_somewhere_under_it_is_worth_keeping() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(dir.path().join("work/deeper")).expect("directories");
        assert!(!holds_a_file(dir.path()));
        std::fs::write(dir.path().join("work/deeper/effects.log"), "x").expect("a file");
        assert!(holds_a_file(dir.path()));
    }

    #[test]
    fn a_process_of_an_earlier_life_is_found_and_one_of_this_life_is_not() {
        let run_id = format!("test-{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env(RUN_ENV, &run_id)
            .env(LIFE_ENV, "3")
            .spawn()
            .expect("sleep runs");
        let pid = child.id();
        // Until the fork has exec'd `sleep`, its environment is still ours.
        let started = Instant::now();
        while !survivors(&run_id, 4)
            .iter()
            .any(|(found, ..)| *found == pid)
            && started.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let of_later = survivors(&run_id, 4);
        let of_same = survivors(&run_id, 3);
        let of_other_run = survivors("another-run", 4);
        child.kill().ok();
        child.wait().ok();
        assert!(
            of_later
                .iter()
                .any(|(found, life, _)| *found == pid && *life == 3),
            "{of_later:?}"
        );
        assert!(
            of_same.iter().all(|(found, ..)| *found != pid),
            "{of_same:?}"
        );
        assert!(of_other_run.iter().all(|(found, ..)| *found != pid));
        assert!(survivors(&run_id, 4)
            .iter()
            .all(|(found, ..)| *found != pid));
    }
}
