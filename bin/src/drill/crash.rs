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
use crate::api::types::{
    ApiContent, ApiDecisionKind, ApiEvent, ApiEventKind, ApiLiveEvent, ApiProvider, ApiRetry,
    ApiState, ApiToolPolicy, CreateConversation,
};
use crate::client::{Client, Error as ClientError, Frame};
use crate::lab::{self, ChildDaemon, LIFE_ENV};
use crate::serve;

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
fn at_work(state: ApiState) -> bool {
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
const AIM_PATIENCE: Duration = Duration::from_secs(5);
/// How long a turn may stay unfinished (restarts included) before its
/// conversation counts as stuck.
const TURN_PATIENCE: Duration = Duration::from_secs(60);
/// How long every conversation gets to come to rest at the end.
const SETTLE_PATIENCE: Duration = Duration::from_secs(60);
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
    if report.violations.is_empty() {
        writeln!(out, "  no violations")?;
    } else {
        writeln!(out, "  {} violations:", report.violations.len())?;
        for violation in &report.violations {
            writeln!(
                out,
                "  ! {} (after kill {}, conversation {}, seq {}): {}",
                violation.check,
                violation.after_kill,
                violation.conversation.as_deref().unwrap_or("-"),
                violation
                    .seq
                    .map_or_else(|| "-".to_owned(), |seq| seq.to_string()),
                violation.detail
            )?;
        }
        writeln!(out, "  reproduce with --seed {}", report.seed)?;
        if let Some(kept) = &report.kept {
            writeln!(
                out,
                "  the data dir, daemon logs and side effects are kept in {kept}"
            )?;
        }
    }
    Ok(())
}

// --- shared state ---------------------------------------------------------

/// What the workers and the killer share.
#[derive(Default)]
struct Book {
    /// Each conversation's latest state, from its stream.
    states: HashMap<String, ApiState>,
    /// Seqs of the messages the daemon acknowledged (202).
    acked: HashMap<String, Vec<u64>>,
    /// Every canonical event a client received, by conversation and seq.
    seen: HashMap<String, BTreeMap<u64, Value>>,
    /// Each sub-agent's latest state as its parent's stream told it
    /// (`child_state`), by (parent, child); a parent's go when it rests.
    children: HashMap<(String, String), ApiState>,
    /// Messages being sent (POSTed, not answered yet).
    sending: usize,
    /// Canonical events received by all clients so far.
    appended: u64,
    /// How far each conversation's log has been checked.
    checked: HashMap<String, Checked>,
    violations: Vec<Violation>,
    kills: usize,
    turns: u64,
    approvals: u64,
    checks_passed: u64,
}

#[derive(Clone)]
struct Shared {
    book: Arc<Mutex<Book>>,
    stop: Arc<AtomicBool>,
}

impl Shared {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn violation(
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

    fn passed(&self, checks: u64) {
        self.book().checks_passed += checks;
    }
}

// --- the daemon's lives ---------------------------------------------------

/// Processes of this run started by a life before `life` that still run:
/// `(pid, life, command line)`.
fn survivors(run_id: &str, life: u32) -> Vec<(u32, u32, String)> {
    lab::processes_with_env(&format!("{RUN_ENV}={run_id}"), LIFE_ENV)
        .into_iter()
        .filter(|(_, of_life, _)| *of_life < life)
        .collect()
}

/// [`survivors`], each said as a violation says it.
fn described_survivors(run_id: &str, life: u32) -> Vec<String> {
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

// --- the drill ------------------------------------------------------------

async fn drill(options: &Options, seed: u64) -> anyhow::Result<Report> {
    let started = Instant::now();
    let temp = tempfile::Builder::new()
        .prefix("keel-drill-crash-")
        .tempdir()
        .context("creating a temporary directory")?;
    // Keep the evidence of a failed drill (the data dir, the daemons' logs
    // and the side-effect file): on a violation, or when it could not go on.
    match drill_in(options, seed, started, temp.path()).await {
        Ok(mut report) => {
            if !report.violations.is_empty() {
                report.kept = Some(temp.keep().display().to_string());
            }
            Ok(report)
        }
        // A drill that stopped before anything was written (no daemon at
        // `--addr`, say) has nothing to keep.
        Err(error) if !holds_a_file(temp.path()) => {
            Err(error.context(format!("the drill stopped (seed {seed})")))
        }
        Err(error) => {
            let kept = temp.keep();
            Err(error.context(format!(
                "the drill stopped (seed {seed}); its directory is kept in {}",
                kept.display()
            )))
        }
    }
}

/// Whether `dir` or a directory under it holds a file.
fn holds_a_file(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            let path = entry.path();
            if path.is_dir() {
                holds_a_file(&path)
            } else {
                true
            }
        })
    })
}

async fn drill_in(
    options: &Options,
    seed: u64,
    started: Instant,
    dir: &Path,
) -> anyhow::Result<Report> {
    let dir = dir.to_path_buf();
    let workdir = dir.join("work");
    std::fs::create_dir_all(&workdir).context("creating the conversations' directory")?;
    let run_id = format!("{}-{seed:x}", std::process::id());
    let effects = workdir.join("effects.log");
    let (mut lives, client, mock_url) = match &options.addr {
        None => {
            let mock_url = serve::start_builtin_mock().await?;
            let mut lab = ChildDaemon::new(&dir, &mock_url, &format!("drill-{seed:x}"))?;
            lab.env(RUN_ENV, &run_id);
            let client = lab.client();
            lab.spawn()?;
            lab.ready(&client).await?;
            (Lives::Own(lab), client, Some(mock_url))
        }
        Some(addr) => {
            let client = Client::from_env_at(addr);
            let daemon = RunningDaemon::find(addr, options.restart.clone(), &dir, &client).await?;
            (Lives::Running(daemon), client, options.mock_url.clone())
        }
    };
    // The commands a daemon of somebody else's runs mark themselves.
    let mark = matches!(lives, Lives::Running(_)).then(|| run_id.clone());
    let http = reqwest::Client::new();

    let shared = Shared {
        book: Arc::new(Mutex::new(Book::default())),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let mut ids = Vec::new();
    for index in 0..options.conversations {
        ids.push(create(&client, index, &workdir).await?);
    }
    let mut workers = tokio::task::JoinSet::new();
    // Each worker says when its event stream is open (or drops its end
    // when it could not open it): no kill lands before, so that a stream
    // refused by a daemon between lives is never the drill's own doing.
    let (opened, mut streams_open) = tokio::sync::mpsc::channel(ids.len().max(1));
    for (index, id) in ids.iter().enumerate() {
        let worker = Worker {
            opened: Some(opened.clone()),
            approvals: Approvals::default(),
            client: client.clone(),
            shared: shared.clone(),
            id: id.clone(),
            rng: fastrand::Rng::with_seed(seed.wrapping_add(index as u64 + 1)),
            effects: effects.clone(),
            mark: mark.clone(),
            nonce: 0,
            index,
            gated: is_gated(index),
            // Aimed at sub-agents: spawn them in half the messages.
            spawn_per_256: if options.at == Boundary::ChildrenRunning {
                128
            } else {
                40
            },
        };
        workers.spawn(worker.run());
    }
    drop(opened);
    for _ in 0..ids.len() {
        if streams_open.recv().await.is_none() {
            break;
        }
    }

    let bar = if options.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(options.kills as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} kills {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let log_progress = !options.json && !std::io::stderr().is_terminal();
    let progress_every = (options.kills / 20).max(1);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills_by_state: BTreeMap<String, usize> = BTreeMap::new();
    let mut missed_aims = 0;
    for kill in 1..=options.kills {
        if let Some(mock_url) = mock_url.as_ref().filter(|_| rng.u8(..) < 80) {
            let faults: Vec<Value> = (0..rng.u32(1..3))
                .map(|_| {
                    let status = [500, 503, 529][rng.usize(..3)];
                    json!({ "status": status })
                })
                .collect();
            // The fake provider is in this process (or was named with
            // --mock-url); a failure here is the drill's, not keel's.
            http.post(format!("{mock_url}/_mock/script"))
                .json(&faults)
                .send()
                .await
                .context("queueing faults at the fake provider")?;
        }
        match options.at {
            Boundary::Any => tokio::time::sleep(Duration::from_millis(rng.u64(20..400))).await,
            aimed => {
                // Not the moment right after the restart: let work begin.
                tokio::time::sleep(Duration::from_millis(rng.u64(0..100))).await;
                if !aim(&shared, aimed).await {
                    missed_aims += 1;
                }
            }
        }
        let states: BTreeSet<String> = {
            let book = shared.book();
            let mut states: BTreeSet<String> = book
                .states
                .values()
                .map(|state| state_name(*state))
                .collect();
            if book.children.values().any(|state| at_work(*state)) {
                states.insert("children_running".to_owned());
            }
            states
        };
        for state in states {
            *kills_by_state.entry(state).or_default() += 1;
        }
        let killed_life = lives.life();
        lives.kill().await?;
        shared.book().kills = kill;
        lives.next_life(&client).await?;
        // Boot reaped what the killed life left: nothing of it runs.
        let left = lives.survivors(&run_id);
        if left.is_empty() {
            shared.passed(1);
        }
        for survivor in left {
            shared.violation(
                "no tool process outlives its daemon",
                None,
                None,
                format!("{survivor} (killed life {killed_life})"),
            );
        }
        // A finished sub-agent's log is whole once checked to its end: it
        // is checked once more at the end, not after every kill (there are
        // hundreds after a long drill, and the check is per kill).
        for id in with_children(&client, &ids).await {
            let done = shared
                .book()
                .checked
                .get(&id)
                .is_some_and(|checked| checked.finished);
            if !done {
                check_log(&client, &shared, &id, false).await;
            }
        }
        bar.inc(1);
        let violations = shared.book().violations.len();
        bar.set_message(format!("{violations} violations"));
        // Where nobody sees the bar (a log, CI), a line now and then.
        if log_progress && (kill % progress_every == 0 || kill == options.kills) {
            eprintln!(
                "keel drill crash: {kill}/{} kills, {violations} violations, {:.0} s",
                options.kills,
                started.elapsed().as_secs_f64()
            );
        }
    }
    bar.finish_and_clear();

    shared.stop.store(true, Ordering::SeqCst);
    while let Some(joined) = workers.join_next().await {
        if let Err(error) = joined {
            shared.violation(
                "the drill's workers run to the end",
                None,
                None,
                format!("a worker panicked: {error}"),
            );
        }
    }
    settle(&client, &shared, &ids).await;
    let all = with_children(&client, &ids).await;
    settle(&client, &shared, &all).await;
    for id in &all {
        // What is new since the last kill, then the whole log once more.
        check_log(&client, &shared, id, false).await;
        check_log(&client, &shared, id, true).await;
    }
    let tool_calls = check_effects(&client, &shared, &all, &effects).await;
    for survivor in lives.finish(&run_id)? {
        shared.violation(
            "no tool process outlives its daemon",
            None,
            None,
            format!("{survivor} after the last stop"),
        );
    }

    let book = shared.book();
    Ok(Report {
        kept: None,
        seed,
        addr: options.addr.clone(),
        faults_queued: mock_url.is_some(),
        daemon_pid: match &lives {
            Lives::Own(_) => None,
            Lives::Running(daemon) => Some(daemon.pid()),
        },
        at: options.at,
        conversations: options.conversations,
        kills: options.kills,
        recoveries: options.kills,
        kills_by_state,
        missed_aims,
        turns: book.turns,
        tool_calls,
        sub_agents: all.len() - ids.len(),
        approvals: book.approvals,
        checks_passed: book.checks_passed,
        violations: book.violations.clone(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Wait until the book shows `boundary`; false if it did not in time.
async fn aim(shared: &Shared, boundary: Boundary) -> bool {
    let started = Instant::now();
    let appended_before = shared.book().appended;
    while started.elapsed() < AIM_PATIENCE {
        if boundary.reached(&shared.book(), appended_before) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    false
}

/// Every third conversation's `bash` calls wait for an approval.
fn is_gated(index: usize) -> bool {
    index % 3 == 2
}

async fn create(client: &Client, index: usize, workdir: &Path) -> anyhow::Result<String> {
    let mut tools = BTreeMap::new();
    if is_gated(index) {
        tools.insert("bash".to_owned(), ApiToolPolicy::Approve);
    }
    // The fake provider, named: a daemon at `--addr` configured with a
    // real provider refuses instead of being billed.
    let request = CreateConversation {
        cwd: Some(workdir.display().to_string()),
        provider: Some(ApiProvider::Mock),
        tools,
        retry: Some(ApiRetry {
            max_retries: Some(3),
            base_delay_ms: Some(20),
            max_delay_ms: Some(100),
            retry_after_cap_ms: Some(100),
        }),
        ..CreateConversation::default()
    };
    Ok(client.create(&request).await?.id)
}

fn state_name(state: ApiState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{state:?}"))
}

/// `ids` and every sub-agent they started.
async fn with_children(client: &Client, ids: &[String]) -> Vec<String> {
    let mut all = ids.to_vec();
    if let Ok(list) = client.list(true).await {
        all.extend(
            list.conversations
                .into_iter()
                .filter(|conversation| {
                    conversation
                        .parent
                        .as_ref()
                        .is_some_and(|parent| ids.contains(parent))
                })
                .map(|conversation| conversation.id),
        );
    }
    all
}

fn is_at_rest(state: ApiState) -> bool {
    matches!(
        state,
        ApiState::Idle
            | ApiState::AwaitingInput
            | ApiState::Error
            | ApiState::Completed
            | ApiState::Failed
    )
}

// --- a worker: one conversation's client ----------------------------------

struct Worker {
    client: Client,
    /// Told once the event stream is open; the first kill waits for every
    /// worker's.
    opened: Option<tokio::sync::mpsc::Sender<()>>,
    /// The calls it approves, and those that wait untouched.
    approvals: Approvals,
    shared: Shared,
    id: String,
    rng: fastrand::Rng,
    effects: PathBuf,
    /// The run id its commands mark themselves with, at `--addr`
    /// (`running::mark_command`).
    mark: Option<String>,
    nonce: u64,
    index: usize,
    /// Its `bash` calls wait for an approval.
    gated: bool,
    /// How many messages in 256 spawn sub-agents (ungated conversations).
    spawn_per_256: u8,
}

impl Worker {
    async fn run(mut self) {
        let mut events = self.client.events(&self.id, None).with_patience(None);
        // Open before the first message, so nothing of its turn is missed.
        loop {
            match events.next().await {
                Ok(Frame::Snapshot(snapshot)) => {
                    self.set_state(snapshot.state);
                    if let Some(opened) = self.opened.take() {
                        // The drill stops waiting for this worker either
                        // way; a closed channel means it stopped already.
                        let _ = opened.send(()).await;
                    }
                    break;
                }
                Ok(_) => {}
                Err(error) => {
                    self.shared.violation(
                        "the event stream opens",
                        Some(&self.id),
                        None,
                        error.to_string(),
                    );
                    return;
                }
            }
        }
        while !self.shared.stop.load(Ordering::SeqCst) {
            let text = self.next_message();
            self.shared.book().sending += 1;
            let sent = self.client.send_text(&self.id, &text).await;
            self.shared.book().sending -= 1;
            match sent {
                Ok(accepted) => {
                    self.shared
                        .book()
                        .acked
                        .entry(self.id.clone())
                        .or_default()
                        .push(accepted.seq);
                    let after = accepted.seq;
                    let ended = self
                        .follow_until(&mut events, |event| event.seq > after && ends_a_turn(event))
                        .await;
                    match ended {
                        Ok(()) => self.shared.book().turns += 1,
                        Err(error) => {
                            // The log says whether the turn ended: if it
                            // did, what failed is the stream's delivery.
                            let ended_in_log = read_log(&self.client, &self.id, after + 1)
                                .await
                                .is_ok_and(|events| events.iter().any(ends_a_turn));
                            let check = if ended_in_log {
                                "every event in the log reaches the client's stream"
                            } else {
                                "no conversation stays busy"
                            };
                            self.shared
                                .violation(check, Some(&self.id), Some(after), error);
                            return;
                        }
                    }
                }
                // A recovered turn runs, or the daemon is between lives:
                // wait a little and send again.
                Err(ClientError::Busy { .. }) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    fn next_message(&mut self) -> String {
        self.nonce += 1;
        // Sub-agents inherit the parent's tool policies, so only a
        // conversation whose calls need no approval spawns them: one task
        // that answers, one that runs a side effect of its own.
        if !self.gated && self.rng.u8(..) < self.spawn_per_256 {
            let nonce = format!("{NONCE}{}-{}", self.index, self.nonce);
            let command = self.command(&format!(
                "echo \"$KEEL_TOOL_CALL_ID {nonce}\" >> {}; sleep 0.05",
                self.effects.display()
            ));
            return format!(
                "spawn: hello from a sub-agent of worker {} | run: {command}",
                self.index
            );
        }
        if self.rng.bool() {
            let nonce = format!("{NONCE}{}-{}", self.index, self.nonce);
            let pause = self.rng.u32(5..30);
            let command = self.command(&format!(
                "echo \"$KEEL_TOOL_CALL_ID {nonce}\" >> {}; sleep 0.{pause:02}",
                self.effects.display()
            ));
            format!("run: {command}")
        } else {
            format!("hello {} from worker {}", self.nonce, self.index)
        }
    }

    /// `command` as the daemon should run it: marked at `--addr`.
    fn command(&self, command: &str) -> String {
        match &self.mark {
            Some(run) => running::mark_command(command, run),
            None => command.to_owned(),
        }
    }

    /// Read the stream until `done` says an event ends the wait, giving
    /// approvals as calls suspend. `Err` (why) if that takes too long.
    async fn follow_until(
        &mut self,
        events: &mut crate::client::Events,
        mut done: impl FnMut(&ApiEvent) -> bool,
    ) -> Result<(), String> {
        let started = Instant::now();
        let mut reconnecting = false;
        loop {
            // One `next` is polled until it gives a frame, approvals given
            // as they fall due meanwhile. It is never dropped half-way: a
            // reconnection in progress (a connect, a backoff) that was
            // started over every few milliseconds would never finish on a
            // loaded machine, and the drill would call its own impatience
            // a stuck conversation.
            let next = {
                let next = events.next();
                tokio::pin!(next);
                loop {
                    if started.elapsed() > TURN_PATIENCE {
                        return Err(format!("no end of the turn within {TURN_PATIENCE:?}"));
                    }
                    if let Some(call) = self.approvals.next_due(Instant::now()) {
                        self.approve(&call).await;
                    }
                    if let Ok(next) =
                        tokio::time::timeout(Duration::from_millis(10), &mut next).await
                    {
                        break next;
                    }
                }
            };
            let frame = match next {
                Ok(frame) => frame,
                Err(error) => return Err(format!("the event stream failed: {error}")),
            };
            match frame {
                Frame::Snapshot(snapshot) => {
                    self.set_state(snapshot.state);
                    let pending: HashSet<&str> = snapshot
                        .pending
                        .iter()
                        .map(|call| call.tool_call_id.as_str())
                        .collect();
                    if reconnecting {
                        self.check_untouched(&pending);
                    }
                    reconnecting = false;
                    for call in &snapshot.pending {
                        self.approvals.pending(&call.tool_call_id, Instant::now());
                    }
                }
                Frame::Reconnecting { .. } | Frame::Error(_) => reconnecting = true,
                Frame::Live(ApiLiveEvent::StateChanged { state }) => self.set_state(state),
                Frame::Live(ApiLiveEvent::ChildState { child, state, .. }) => {
                    self.shared
                        .book()
                        .children
                        .insert((self.id.clone(), child), state);
                }
                Frame::Live(_) => {}
                Frame::Canonical(event) => {
                    let value = serde_json::to_value(&event).unwrap_or(Value::Null);
                    let mut book = self.shared.book();
                    book.appended += 1;
                    book.seen
                        .entry(self.id.clone())
                        .or_default()
                        .insert(event.seq, value);
                    drop(book);
                    if let ApiEventKind::Suspended { pending } = &event.kind {
                        for call in pending {
                            let pause = Duration::from_millis(self.rng.u64(0..150));
                            self.approvals
                                .suspended(&call.tool_call_id, Instant::now() + pause);
                        }
                    }
                    if done(&event) {
                        return Ok(());
                    }
                }
            }
        }
    }

    fn set_state(&self, state: ApiState) {
        let mut book = self.shared.book();
        book.states.insert(self.id.clone(), state);
        if !at_work(state) {
            // Its turn is over (or waits for a person): so are its
            // children's, whatever their last word was.
            book.children.retain(|(parent, _), _| *parent != self.id);
        }
    }

    /// After a restart: every call that waited for an approval nobody had
    /// tried to give still waits (or got its result in the meantime,
    /// which the log check sees).
    fn check_untouched(&self, pending: &HashSet<&str>) {
        let reconnected = self.approvals.reconnected(pending);
        self.shared.passed(reconnected.still_pending as u64);
        for call in reconnected.gone {
            self.shared.violation(
                "pending approvals stay pending",
                Some(&self.id),
                None,
                format!("call {call} waited for an approval before the kill and not after"),
            );
        }
    }

    async fn approve(&mut self, call: &str) {
        match self
            .client
            .decide(
                &self.id,
                call,
                ApiDecisionKind::Approve,
                None,
                Some(DRILL.to_owned()),
            )
            .await
        {
            Ok(_) => self.shared.book().approvals += 1,
            // Settled meanwhile (a cancel, a restart under `idle`): done.
            Err(ClientError::Api { status: 409, .. } | ClientError::NotFound { .. }) => {}
            // The daemon is between lives: try again soon.
            Err(_) => self
                .approvals
                .retry(call, Instant::now() + Duration::from_millis(50)),
        }
    }
}

// --- the checks ------------------------------------------------------------

/// The log of `id` from `from` on, page by page.
async fn read_log(client: &Client, id: &str, from: u64) -> Result<Vec<ApiEvent>, ClientError> {
    let mut events = Vec::new();
    let mut from = from;
    loop {
        let page = client.log(id, from, None).await?;
        let empty = page.events.is_empty();
        events.extend(page.events);
        if empty || page.next_from == from {
            return Ok(events);
        }
        from = page.next_from;
    }
}

/// How far a conversation's log has been checked, so that a check after a
/// restart reads only what is new; the final check starts over from seq 1.
#[derive(Debug, Clone)]
struct Checked {
    next_seq: u64,
    /// Calls of the latest response without a result yet.
    open: Vec<String>,
    answered: HashSet<String>,
    /// The log ends with the conversation's `finished` event (a sub-agent
    /// that completed or failed): nothing more can be appended.
    finished: bool,
}

impl Default for Checked {
    fn default() -> Self {
        Checked {
            next_seq: 1,
            open: Vec::new(),
            answered: HashSet::new(),
            finished: false,
        }
    }
}

/// Check `id`'s log from where the last check of it stopped (`full`: from
/// seq 1): seqs contiguous, every acknowledged message and every event a
/// client received in it and the same, every `tool_use` answered once
/// before the next response.
async fn check_log(client: &Client, shared: &Shared, id: &str, full: bool) {
    let mut checked = if full {
        Checked::default()
    } else {
        shared.book().checked.get(id).cloned().unwrap_or_default()
    };
    // What the clients had before the log is read: all of it must be there
    // (what arrives while it is read may be newer than the read).
    let (acked, seen) = {
        let book = shared.book();
        let acked: Vec<u64> = book.acked.get(id).cloned().unwrap_or_default();
        let seen: BTreeMap<u64, Value> = book.seen.get(id).cloned().unwrap_or_default();
        (acked, seen)
    };
    let events = match read_log(client, id, checked.next_seq).await {
        Ok(events) => events,
        Err(error) => {
            shared.violation("the log can be read", Some(id), None, format!("{error}"));
            return;
        }
    };
    let mut passed = 0;
    let mut contiguous = true;
    for (offset, event) in events.iter().enumerate() {
        let expected = checked.next_seq + offset as u64;
        if event.seq != expected {
            shared.violation(
                "seqs are contiguous",
                Some(id),
                Some(event.seq),
                format!("seq {expected} is followed by seq {}", event.seq),
            );
            contiguous = false;
            break;
        }
    }
    if contiguous {
        passed += 1;
    }
    let by_seq: HashMap<u64, &ApiEvent> = events.iter().map(|event| (event.seq, event)).collect();
    for seq in acked.into_iter().filter(|seq| *seq >= checked.next_seq) {
        match by_seq.get(&seq) {
            Some(event) if matches!(event.kind, ApiEventKind::UserMessage { .. }) => passed += 1,
            Some(event) => shared.violation(
                "every acknowledged event is in the log",
                Some(id),
                Some(seq),
                format!(
                    "the acknowledged message's seq holds {:?}",
                    kind_name(event)
                ),
            ),
            None => shared.violation(
                "every acknowledged event is in the log",
                Some(id),
                Some(seq),
                "an acknowledged message is missing from the log".to_owned(),
            ),
        }
    }
    for (seq, received) in seen.range(checked.next_seq..) {
        let stored = by_seq
            .get(seq)
            .and_then(|event| serde_json::to_value(event).ok());
        if stored.as_ref() == Some(received) {
            passed += 1;
        } else {
            shared.violation(
                "every acknowledged event is in the log",
                Some(id),
                Some(*seq),
                format!("a client received {received} but the log has {stored:?}"),
            );
        }
    }
    for event in &events {
        match &event.kind {
            ApiEventKind::AssistantMessage { content, .. } => {
                if !checked.open.is_empty() {
                    shared.violation(
                        "every tool_use has one result before the next request",
                        Some(id),
                        Some(event.seq),
                        format!("a response came while {:?} had no result", checked.open),
                    );
                }
                checked.open = content
                    .iter()
                    .filter_map(|block| match block {
                        ApiContent::ToolUse { id, .. } => Some(id.clone()),
                        _ => None,
                    })
                    .collect();
            }
            ApiEventKind::Resolved {
                tool_call_id, by, ..
            } => {
                if by.as_deref() == Some(DRILL) {
                    passed += 1;
                } else {
                    shared.violation(
                        "only the drill resolves calls",
                        Some(id),
                        Some(event.seq),
                        format!("{tool_call_id} was resolved by {by:?}"),
                    );
                }
            }
            ApiEventKind::ToolResult { tool_call_id, .. } => {
                if let Some(position) = checked.open.iter().position(|call| call == tool_call_id) {
                    checked.open.remove(position);
                    checked.answered.insert(tool_call_id.clone());
                    passed += 1;
                } else {
                    let why = if checked.answered.contains(tool_call_id) {
                        "a second result"
                    } else {
                        "a result for no open call"
                    };
                    shared.violation(
                        "every tool_use has one result before the next request",
                        Some(id),
                        Some(event.seq),
                        format!("{why}: {tool_call_id}"),
                    );
                }
            }
            _ => {}
        }
    }
    if contiguous {
        if let Some(last) = events.last() {
            checked.next_seq = last.seq + 1;
            checked.finished = matches!(last.kind, ApiEventKind::Finished { .. });
        }
    }
    let mut book = shared.book();
    book.checks_passed += passed;
    // What was checked need not be kept.
    let next_seq = checked.next_seq;
    if let Some(acked) = book.acked.get_mut(id) {
        acked.retain(|seq| *seq >= next_seq);
    }
    if let Some(seen) = book.seen.get_mut(id) {
        *seen = seen.split_off(&next_seq);
    }
    book.checked.insert(id.to_owned(), checked);
}

/// Whether `event` ends the turn of a message (or says it got none).
fn ends_a_turn(event: &ApiEvent) -> bool {
    matches!(
        event.kind,
        ApiEventKind::TurnCompleted { .. }
            | ApiEventKind::TurnFailed { .. }
            | ApiEventKind::TurnInterrupted { .. }
            | ApiEventKind::Unanswered { .. }
    )
}

fn kind_name(event: &ApiEvent) -> String {
    serde_json::to_value(event)
        .ok()
        .and_then(|value| value.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// Give the approvals still owed and wait for every conversation to rest.
async fn settle(client: &Client, shared: &Shared, ids: &[String]) {
    let started = Instant::now();
    let mut restless: Vec<String> = ids.to_vec();
    while !restless.is_empty() && started.elapsed() < SETTLE_PATIENCE {
        let mut still = Vec::new();
        for id in restless {
            match client.get(&id).await {
                Ok(detail) if detail.pending.is_empty() && is_at_rest(detail.state) => {}
                Ok(detail) => {
                    for call in &detail.pending {
                        if client
                            .decide(
                                &id,
                                &call.tool_call_id,
                                ApiDecisionKind::Approve,
                                None,
                                Some(DRILL.to_owned()),
                            )
                            .await
                            .is_ok()
                        {
                            shared.book().approvals += 1;
                        }
                    }
                    still.push(id);
                }
                Err(_) => still.push(id),
            }
        }
        restless = still;
        if !restless.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if restless.is_empty() {
        shared.passed(ids.len() as u64);
    }
    for id in restless {
        let state = client
            .get(&id)
            .await
            .map(|detail| state_name(detail.state))
            .unwrap_or_else(|error| error.to_string());
        shared.violation(
            "no conversation stays busy once its work is done",
            Some(&id),
            None,
            format!("still {state} {SETTLE_PATIENCE:?} after the workload stopped"),
        );
    }
}

/// Every side effect ran under one `tool_call_id` per nonce, and that id
/// is the call's in the log. Returns how many calls the logs hold.
async fn check_effects(client: &Client, shared: &Shared, ids: &[String], effects: &Path) -> usize {
    // The ids each nonce's command was called with, from the logs.
    let mut calls: HashMap<String, String> = HashMap::new();
    for id in ids {
        let Ok(events) = read_log(client, id, 1).await else {
            continue;
        };
        for event in events {
            if let ApiEventKind::AssistantMessage { content, .. } = event.kind {
                for block in content {
                    if let ApiContent::ToolUse { id, input, .. } = block {
                        let command = input.get("command").and_then(Value::as_str).unwrap_or("");
                        if let Some(nonce) = command
                            .split(|c: char| c.is_whitespace() || c == '"')
                            .find(|word| word.starts_with(NONCE))
                        {
                            calls.insert(nonce.to_owned(), id);
                        }
                    }
                }
            }
        }
    }
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut ran: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for line in text.lines() {
        if let Some((call, nonce)) = line.split_once(' ') {
            ran.entry(nonce).or_default().insert(call);
        }
    }
    let mut passed = 0;
    for (nonce, run_as) in &ran {
        let expected = calls.get(*nonce);
        let only_its_own =
            run_as.len() == 1 && expected.is_some_and(|id| run_as.contains(id.as_str()));
        if only_its_own {
            passed += 1;
        } else {
            shared.violation(
                "no side effect runs twice under different ids",
                None,
                None,
                format!("nonce {nonce} ran as {run_as:?}; the log's call is {expected:?}"),
            );
        }
    }
    shared.passed(passed);
    calls.len()
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
