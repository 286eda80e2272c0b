//! `keel drill nodes`: several `keel serve` nodes over one PostgreSQL
//! database (docs/nodes.md), faulted again and again while conversations
//! work through them, and checked after every fault (docs/drills.md).
//!
//! The drill starts a PostgreSQL server of its own
//! (`keel_test_support::postgres`: `initdb` in a temporary directory, a
//! private port), the fake provider in this process, and `--nodes` nodes
//! (this same binary's `keel serve`), each with its own data dir and port,
//! all with one token and a short lease (`--lease-ms`). The workers are
//! the crash drill's (`crash::worker`), one per conversation: each
//! conversation is created through a node picked at random, followed from
//! seq 1 through another with keel's resuming client (which reconnects
//! with `Last-Event-ID` across the loss of its node), and every message and
//! approval goes through a node picked at random each time.
//!
//! Each fault picks a node (one owning conversations, mostly) and either
//! SIGKILLs it (and restarts it at once, or once its conversations answer
//! elsewhere), or SIGSTOPs it for 2.5 leases and then SIGCONTs it: it
//! must find itself fenced, exit non-zero saying "fenced off", and is then
//! restarted. Every node but the one faulted runs throughout, so the
//! drill never faults the last live node. After each fault it checks what
//! `keel drill crash` checks (contiguous seqs, every acknowledged message
//! and every event a client received in the log and the same, one result
//! per `tool_use`, pending approvals still pending, no tool process of the
//! lost node left), plus, from `/admin/conversations/{id}/writers`: the
//! stretches of seqs each (node, epoch) appended follow each other from
//! seq 1 without overlap ("no two epochs interleave"), and along a log the
//! epochs of one node only grow ("no append under a stale epoch"); and
//! every client's stream delivers seq after seq with no gap. At the end no
//! side effect may have run under two different tool call ids.
//!
//! Time to resume: from the signal that lost a node (SIGKILL or SIGSTOP)
//! until each conversation it owned (the node named by `x-keel-node`
//! answering `GET /v1/conversations/{id}` just before) answers that GET
//! with 200 through another node; p50 and p99 over all faults. Each GET
//! waits at most [`PROBE_TIMEOUT`] (one to a paused owner hangs), so a
//! figure may be late by up to that much.
//!
//! Pauses land at any moment, tools running or not: a paused node's
//! spawner (not paused with it) kills its tools once the node's lease
//! lapses unrenewed (docs/nodes.md), and once the node's conversations
//! answer elsewhere, with the node still paused, none of its tool
//! processes may run any more.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use nix::sys::signal::Signal;
use serde::Serialize;

use super::approvals::Approvals;
use super::crash::checks::{check_effects, check_log, settle};
use super::crash::drill::{create, in_temp_dir, is_gated, queue_faults, with_children, Kept};
use super::crash::worker::Worker;
use super::crash::{described_survivors, Book, Shared, Violation};
use super::running::RUN_ENV;
use keel_api::client::Client;
use keel_test_support::{self as rig, stats::nearest_rank, ChildDaemon, Postgres, LIFE_ENV};

#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: usize,
    pub conversations: usize,
    pub kills: usize,
    pub seed: Option<u64>,
    pub lease_ms: u64,
    pub json: bool,
}

/// How long a lost node's conversations get to answer through another.
const RESUME_PATIENCE: Duration = Duration::from_secs(60);
/// How long one probe of a conversation waits for its answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a resumed, fenced node gets to exit.
const EXIT_PATIENCE: Duration = Duration::from_secs(30);
/// How long a lost node's tool processes get to be gone.
const GONE_PATIENCE: Duration = Duration::from_secs(10);
/// A pause lasts this many leases: past the lease, so the node is fenced.
const PAUSE_LEASES: f64 = 2.5;

/// Time to resume, over every conversation a lost node owned.
#[derive(Debug, Serialize)]
pub struct TimeToResume {
    pub samples: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub nodes: usize,
    pub lease_ms: u64,
    pub conversations: usize,
    /// Faults, of either kind.
    pub kills: usize,
    pub sigkills: usize,
    /// Nodes SIGSTOPped past the lease, fenced, resumed and stepped down.
    pub pauses: usize,
    /// Nodes that exited without being faulted (fenced under load, say):
    /// restarted, and not violations, but worth a look.
    pub unbidden_exits: usize,
    pub restarts: usize,
    pub turns: u64,
    pub tool_calls: usize,
    pub sub_agents: usize,
    pub approvals: u64,
    pub checks_passed: u64,
    pub time_to_resume: TimeToResume,
    pub violations: Vec<Violation>,
    pub seconds: f64,
    /// The drill's directory (nodes' data dirs and logs, side-effect
    /// file), kept when something failed; removed otherwise.
    pub kept: Option<String>,
}

impl Kept for Report {
    fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    fn keep(&mut self, dir: String) {
        self.kept = Some(dir);
    }
}

pub fn run(mut out: impl Write, options: Options) -> anyhow::Result<Report> {
    if options.nodes < 2 {
        return Err(anyhow!(
            "--nodes must be at least 2: one is faulted while another carries on"
        ));
    }
    if options.conversations == 0 {
        return Err(anyhow!("--conversations must be at least 1"));
    }
    if options.lease_ms < 300 {
        return Err(anyhow!(
            "--lease-ms must be at least 300 (KEEL_NODE_LEASE_MS)"
        ));
    }
    let seed = options.seed.unwrap_or_else(|| fastrand::u64(..));
    let postgres = Postgres::start().ok_or_else(|| {
        anyhow!(
            "keel drill nodes needs PostgreSQL's server binaries (initdb, postgres) to start \
             a database of its own: install them (Debian: apt-get install postgresql), or name \
             their directory in KEEL_TEST_PG_BIN"
        )
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let url = postgres.url();
    let started = Instant::now();
    let report = runtime.block_on(in_temp_dir("keel-drill-nodes-", seed, |dir| {
        let options = &options;
        async move { drill_in(options, seed, started, &dir, &url).await }
    }));
    drop(runtime);
    drop(postgres);
    let report = report?;
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
        "keel drill nodes: seed {}, {} nodes (lease {} ms), {} conversations, {} faults \
         ({} SIGKILL, {} SIGSTOP past the lease) in {:.1} s",
        report.seed,
        report.nodes,
        report.lease_ms,
        report.conversations,
        report.kills,
        report.sigkills,
        report.pauses,
        report.seconds
    )?;
    writeln!(
        out,
        "  restarts {}, turns {}, tool calls {}, sub-agents {}, approvals {}, checks passed {}",
        report.restarts,
        report.turns,
        report.tool_calls,
        report.sub_agents,
        report.approvals,
        report.checks_passed
    )?;
    let ms = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0} ms"));
    writeln!(
        out,
        "  time to resume (node lost to its conversation answering elsewhere): p50 {}, p99 {}, max {} over {} conversations",
        ms(report.time_to_resume.p50_ms),
        ms(report.time_to_resume.p99_ms),
        ms(report.time_to_resume.max_ms),
        report.time_to_resume.samples
    )?;
    if report.unbidden_exits > 0 {
        writeln!(
            out,
            "  {} times a node exited without being faulted (restarted; see its log)",
            report.unbidden_exits
        )?;
    }
    super::crash::print_violations(
        out,
        &report.violations,
        "fault",
        report.seed,
        report
            .kept
            .as_deref()
            .map(|kept| format!("the nodes' data dirs, logs and side effects are kept in {kept}")),
    )
}

/// One node: its daemon, a client of it, and the mark its processes (and
/// its tools') carry.
struct Node {
    name: String,
    daemon: ChildDaemon,
    client: Client,
    /// `KEEL_DRILL_RUN`'s value in its processes.
    mark: String,
}

impl Node {
    async fn start(&mut self) -> anyhow::Result<()> {
        self.daemon.spawn()?;
        self.daemon
            .ready(&self.client)
            .await
            .with_context(|| format!("starting node {}", self.name))?;
        Ok(())
    }

    /// Tool processes of its current life (not itself, not its spawner).
    fn tools(&self) -> Vec<u32> {
        let me = self.daemon.pid();
        rig::processes_with_env(&format!("{RUN_ENV}={}", self.mark), LIFE_ENV)
            .into_iter()
            .filter(|(pid, life, cmdline)| {
                *life == self.daemon.life() && Some(*pid) != me && !cmdline.contains(" spawner")
            })
            .map(|(pid, ..)| pid)
            .collect()
    }

    /// Processes of its earlier lives still running, once given
    /// [`GONE_PATIENCE`] to go.
    async fn survivors(&self, before: u32) -> Vec<String> {
        let started = Instant::now();
        loop {
            let left = described_survivors(&self.mark, before);
            if left.is_empty() || started.elapsed() > GONE_PATIENCE {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The node that carried out `GET /v1/conversations/{id}` asked of
/// `client`'s node, if it answered 200 within [`PROBE_TIMEOUT`].
async fn answered_by(
    http: &reqwest::Client,
    client: &Client,
    token: &str,
    id: &str,
) -> Option<String> {
    let response = http
        .get(format!("http://{}/v1/conversations/{id}", client.addr()))
        .bearer_auth(token)
        .timeout(PROBE_TIMEOUT)
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let node = response
        .headers()
        .get("x-keel-node")?
        .to_str()
        .ok()?
        .to_owned();
    Some(node)
}

/// Poll every conversation of `ids` through nodes other than `except`
/// until it answers; how long after `since` each did. Those that did not
/// within [`RESUME_PATIENCE`] are left out.
async fn answers(
    http: &reqwest::Client,
    clients: &[Client],
    token: &str,
    ids: &[String],
    since: Instant,
) -> HashMap<String, Duration> {
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let (http, clients, token, id) =
            (http.clone(), clients.to_vec(), token.to_owned(), id.clone());
        tasks.spawn(async move {
            let mut rng = fastrand::Rng::new();
            while since.elapsed() < RESUME_PATIENCE {
                let client = &clients[rng.usize(..clients.len())];
                if answered_by(&http, client, &token, &id).await.is_some() {
                    return Some((id, since.elapsed()));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        });
    }
    let mut answered = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Some((id, after))) = joined {
            answered.insert(id, after);
        }
    }
    answered
}

async fn drill_in(
    options: &Options,
    seed: u64,
    started: Instant,
    dir: &Path,
    database_url: &str,
) -> anyhow::Result<Report> {
    let workdir = dir.join("work");
    std::fs::create_dir_all(&workdir).context("creating the conversations' directory")?;
    let effects = workdir.join("effects.log");
    let run_id = format!("{}-{seed:x}", std::process::id());
    let token = format!("drill-nodes-{seed:x}");
    let lease_ms = options.lease_ms.to_string();
    let mock_url = crate::mock_llm::start_in_process(crate::mock_llm::Settings::default()).await?;
    let mut nodes = Vec::new();
    for index in 0..options.nodes {
        let name = format!("node-{}", index + 1);
        let node_dir = dir.join(&name);
        std::fs::create_dir_all(&node_dir).context("creating a node's directory")?;
        let mut daemon = ChildDaemon::new(&node_dir, &mock_url, &token)?;
        let mark = format!("{run_id}-{name}");
        for (variable, value) in [
            ("KEEL_STORE", "postgres"),
            ("KEEL_DATABASE_URL", database_url),
            ("KEEL_NODE", name.as_str()),
            ("KEEL_NODE_LEASE_MS", lease_ms.as_str()),
            (RUN_ENV, mark.as_str()),
        ] {
            daemon.env(variable, value);
        }
        let client = daemon.client();
        nodes.push(Node {
            name,
            daemon,
            client,
            mark,
        });
    }
    for node in &mut nodes {
        node.start().await?;
    }
    let clients: Vec<Client> = nodes.iter().map(|node| node.client.clone()).collect();
    let http = keel_api::http::client();
    let mut rng = fastrand::Rng::with_seed(seed);
    let any = |rng: &mut fastrand::Rng| clients[rng.usize(..clients.len())].clone();

    let shared = Shared {
        book: Arc::new(Mutex::new(Book::default())),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let mut ids = Vec::new();
    for index in 0..options.conversations {
        ids.push(create(&any(&mut rng), index, &workdir).await?);
    }
    let mut workers = tokio::task::JoinSet::new();
    let (opened, mut streams_open) = tokio::sync::mpsc::channel(ids.len().max(1));
    for (index, id) in ids.iter().enumerate() {
        let worker = Worker {
            opened: Some(opened.clone()),
            approvals: Approvals::default(),
            client: any(&mut rng),
            senders: clients.clone(),
            stream_from: Some(1),
            shared: shared.clone(),
            id: id.clone(),
            rng: fastrand::Rng::with_seed(seed.wrapping_add(index as u64 + 1)),
            effects: effects.clone(),
            mark: None,
            nonce: 0,
            index,
            gated: is_gated(index),
            spawn_per_256: 40,
        };
        workers.spawn(worker.run());
    }
    drop(opened);
    for _ in 0..ids.len() {
        if streams_open.recv().await.is_none() {
            break;
        }
    }

    let lease = Duration::from_millis(options.lease_ms);
    let pause_for = lease.mul_f64(PAUSE_LEASES);
    let progress_every = (options.kills / 20).max(1);
    let mut samples: Vec<Duration> = Vec::new();
    let (mut sigkills, mut pauses, mut unbidden, mut restarts) = (0, 0, 0, 0);
    for kill in 1..=options.kills {
        queue_faults(&http, &mock_url, &mut rng).await?;
        tokio::time::sleep(Duration::from_millis(rng.u64(20..400))).await;
        // A node that exited by itself (fenced under load) comes back.
        for node in &mut nodes {
            if let Some(status) = node.daemon.exited(Duration::ZERO).await? {
                unbidden += 1;
                let output = node.daemon.output();
                let tail: Vec<&str> = output.lines().rev().take(3).collect();
                eprintln!(
                    "keel drill nodes: {} exited unbidden ({status}): {}",
                    node.name,
                    tail.join(" | ")
                );
                node.start().await?;
                restarts += 1;
            }
        }
        // Who owns what, as the nodes say just before the fault.
        let mut owners: HashMap<String, String> = HashMap::new();
        for id in &ids {
            if let Some(node) = answered_by(&http, &any(&mut rng), &token, id).await {
                owners.insert(id.clone(), node);
            }
        }
        let owning: Vec<usize> = (0..nodes.len())
            .filter(|index| owners.values().any(|owner| *owner == nodes[*index].name))
            .collect();
        // Mostly a node that owns conversations (always, the first time:
        // every drill measures a time to resume).
        let target = if !owning.is_empty() && (kill == 1 || rng.u8(..) < 192) {
            owning[rng.usize(..owning.len())]
        } else {
            rng.usize(..nodes.len())
        };
        let owned: Vec<String> = owners
            .iter()
            .filter(|(_, owner)| **owner == nodes[target].name)
            .map(|(id, _)| id.clone())
            .collect();
        let others: Vec<Client> = (0..nodes.len())
            .filter(|index| *index != target)
            .map(|index| clients[index].clone())
            .collect();
        let life = nodes[target].daemon.life();

        // The fault, at whatever moment it lands: a paused node's tools
        // must stop with its lease (its spawner's watchdog), checked below.
        let pause = rng.bool();
        let restart_now = rng.bool();
        let lost = Instant::now();
        if pause {
            nodes[target].daemon.signal(Signal::SIGSTOP)?;
        } else {
            nodes[target].daemon.kill()?;
        }
        shared.book().kills = kill;
        let mut restarted = false;
        if !pause && restart_now {
            nodes[target].start().await?;
            restarts += 1;
            restarted = true;
        }
        let answered = answers(&http, &others, &token, &owned, lost).await;
        samples.extend(answered.values());
        if pause && !owned.is_empty() && answered.len() == owned.len() {
            // Taken over while the node is still paused: nothing of it may
            // run any more, or a re-dispatched call runs beside its copy.
            let running = nodes[target].tools();
            if running.is_empty() {
                shared.passed(1);
            } else {
                shared.violation(
                    "a paused node's tools stop with its lease",
                    None,
                    None,
                    format!(
                        "{} is paused and its conversations answer elsewhere, but its tool processes {running:?} still run",
                        nodes[target].name
                    ),
                );
            }
        }
        for id in owned.iter().filter(|id| !answered.contains_key(*id)) {
            shared.violation(
                "a lost node's conversations answer again",
                Some(id),
                None,
                format!(
                    "{} was lost and its conversation did not answer through another node within {RESUME_PATIENCE:?}",
                    nodes[target].name
                ),
            );
        }
        if pause {
            pauses += 1;
            tokio::time::sleep(pause_for.saturating_sub(lost.elapsed())).await;
            nodes[target].daemon.signal(Signal::SIGCONT)?;
            match nodes[target].daemon.exited(EXIT_PATIENCE).await? {
                Some(status)
                    if !status.success()
                        && nodes[target].daemon.output().contains("fenced off") =>
                {
                    shared.passed(1);
                }
                Some(status) => shared.violation(
                    "a node paused past its lease steps down when resumed",
                    None,
                    None,
                    format!(
                        "{} exited with {status} without saying it was fenced off",
                        nodes[target].name
                    ),
                ),
                None => {
                    shared.violation(
                        "a node paused past its lease steps down when resumed",
                        None,
                        None,
                        format!(
                            "{} still runs {EXIT_PATIENCE:?} after SIGCONT",
                            nodes[target].name
                        ),
                    );
                    nodes[target].daemon.kill()?;
                }
            }
        } else {
            sigkills += 1;
        }
        if !restarted {
            nodes[target].start().await?;
            restarts += 1;
        }
        let left = nodes[target].survivors(life + 1).await;
        if left.is_empty() {
            shared.passed(1);
        }
        for survivor in left {
            shared.violation(
                "no tool process outlives its node",
                None,
                None,
                format!("{survivor} ({} lost)", nodes[target].name),
            );
        }

        // Every conversation answers before its log is read.
        let everyone = answers(&http, &clients, &token, &ids, Instant::now()).await;
        for id in ids.iter().filter(|id| !everyone.contains_key(*id)) {
            shared.violation(
                "every conversation answers after a fault",
                Some(id),
                None,
                format!("no answer through any node within {RESUME_PATIENCE:?}"),
            );
        }
        for id in with_children(&any(&mut rng), &ids).await {
            let done = shared
                .book()
                .checked
                .get(&id)
                .is_some_and(|checked| checked.finished);
            if !done {
                let client = any(&mut rng);
                check_log(&client, &shared, &id, false).await;
                check_writers(&client, &shared, &id).await;
            }
        }
        if !options.json && (kill % progress_every == 0 || kill == options.kills) {
            eprintln!(
                "keel drill nodes: {kill}/{} faults, {} violations, {:.0} s",
                options.kills,
                shared.book().violations.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }

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
    let client = any(&mut rng);
    settle(&client, &shared, &ids).await;
    let all = with_children(&client, &ids).await;
    settle(&client, &shared, &all).await;
    for id in &all {
        check_log(&client, &shared, id, false).await;
        check_log(&client, &shared, id, true).await;
        check_writers(&client, &shared, id).await;
    }
    let tool_calls = check_effects(&client, &shared, &all, &effects).await;
    for node in &mut nodes {
        node.daemon.stop()?;
        for survivor in node.survivors(node.daemon.life() + 1).await {
            shared.violation(
                "no tool process outlives its node",
                None,
                None,
                format!("{survivor} after the last stop of {}", node.name),
            );
        }
    }

    let millis =
        |at: f64| (!samples.is_empty()).then(|| nearest_rank(&samples, at).as_secs_f64() * 1000.0);
    let book = shared.book();
    Ok(Report {
        seed,
        nodes: options.nodes,
        lease_ms: options.lease_ms,
        conversations: options.conversations,
        kills: options.kills,
        sigkills,
        pauses,
        unbidden_exits: unbidden,
        restarts,
        turns: book.turns,
        tool_calls,
        sub_agents: all.len() - ids.len(),
        approvals: book.approvals,
        checks_passed: book.checks_passed,
        time_to_resume: TimeToResume {
            samples: samples.len(),
            p50_ms: millis(0.5),
            p99_ms: millis(0.99),
            max_ms: millis(1.0),
        },
        violations: book.violations.clone(),
        seconds: started.elapsed().as_secs_f64(),
        kept: None,
    })
}

/// The writers of `id`'s log (`/admin/conversations/{id}/writers`): each
/// (node, epoch)'s stretch of seqs follows the one before from seq 1, with
/// no overlap, and covers every seq checked so far; along the log, each
/// node's epochs only grow.
async fn check_writers(client: &Client, shared: &Shared, id: &str) {
    let writers = match client.writers(id).await {
        Ok(list) => list.writers,
        Err(error) => {
            shared.violation(
                "the writers can be read",
                Some(id),
                None,
                format!("{error}"),
            );
            return;
        }
    };
    let mut next = 1;
    let mut epochs: HashMap<&str, i64> = HashMap::new();
    let mut seen: HashSet<(&str, i64)> = HashSet::new();
    let mut passed = 0;
    for writer in &writers {
        let stretch = format!(
            "{} under epoch {} wrote {}..={}",
            writer.node, writer.epoch, writer.first_seq, writer.last_seq
        );
        if writer.first_seq == next && writer.last_seq >= writer.first_seq {
            passed += 1;
        } else {
            shared.violation(
                "no two epochs interleave in a log",
                Some(id),
                Some(writer.first_seq),
                format!("{stretch} where seq {next} was next"),
            );
        }
        next = writer.last_seq + 1;
        let stale = epochs
            .get(writer.node.as_str())
            .is_some_and(|latest| writer.epoch <= *latest)
            || !seen.insert((writer.node.as_str(), writer.epoch));
        if stale {
            shared.violation(
                "no append under a stale epoch",
                Some(id),
                Some(writer.first_seq),
                format!("{stretch} after a later or the same epoch of it wrote"),
            );
        } else {
            passed += 1;
        }
        epochs.insert(writer.node.as_str(), writer.epoch);
    }
    let checked = shared
        .book()
        .checked
        .get(id)
        .map_or(1, |checked| checked.next_seq);
    if next >= checked {
        passed += 1;
    } else {
        shared.violation(
            "every append has its writer",
            Some(id),
            Some(next),
            format!(
                "the writers end at seq {} but the log goes on to {}",
                next - 1,
                checked - 1
            ),
        );
    }
    shared.passed(passed);
}
