#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What one `bash` tool call costs the process that makes it, with and
//! without descriptors open beside it (docs/benchmarks.md, "Tool spawns and open
//! connections"). Run it with
//!
//! ```text
//! cargo bench -p keel-actors --bench spawn
//! KEEL_BENCH_QUICK=1 cargo bench -p keel-actors --bench spawn   # smoke run
//! KEEL_BENCH_WAY=spawner cargo bench -p keel-actors --bench spawn # one way only
//! ```
//!
//! One call is `Bash.run` of `true` to its result: spawn behind the gate,
//! adopt the group, write `go`, read both pipes to their end, wait for the
//! exit, kill the group. Two ways to spawn: `direct` (from this process, as
//! every call did before the spawner, and as a runtime without one still
//! does) and `spawner` (through `keel-spawner`, started before any extra
//! descriptor exists, as a runtime starts it at open). Two tables of
//! descriptors: as the process starts (about 10), and with 10,000 more
//! (5,000 Unix socket pairs, standing for a daemon's connected clients;
//! close-on-exec, as every descriptor Rust opens).
//!
//! Each case is measured twice: `Spawner::spawn` of `true` alone (until
//! the pid is known; a direct spawn holds its thread until the child has
//! exec'd, its inherited descriptors closed), its exit waited for; and a
//! whole `bash` call.
//!
//! The four cases are interleaved, round after round, so that a busy spell
//! of the (shared) machine falls on all of them. Per case and round: the
//! wall time of each call (p50, p90) and this process's CPU time (user +
//! system: `CLOCK_PROCESS_CPUTIME_ID`) per call, which is where the kernel's copy of the
//! descriptor table is charged. A summary gives the median over the rounds.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_actors::core::message::ToolCall;
use keel_actors::core::ToolCallId;
use keel_actors::spawner::{Launch, Spawner, SpawnerCommand};
use keel_actors::tool::{Bash, Tool, ToolContext, ToolOutcome, ToolOutput};
use keel_test_support::load_average;

/// Calls per case and round, rounds, extra descriptors; `KEEL_BENCH_QUICK=1`
/// selects the small set.
struct Counts {
    calls: usize,
    rounds: usize,
    extra_fds: usize,
}

const FULL: Counts = Counts {
    calls: 200,
    rounds: 5,
    extra_fds: 10_000,
};

const QUICK: Counts = Counts {
    calls: 10,
    rounds: 1,
    extra_fds: 1_000,
};

/// One case's samples in one round.
struct Sample {
    /// `Spawner::spawn` of `true` alone: until the pid is known.
    spawn_wall: Vec<Duration>,
    /// This process's CPU per spawn of `true`, its exit waited for.
    cpu_per_spawn: Duration,
    /// A whole `bash` call.
    wall: Vec<Duration>,
    cpu_per_call: Duration,
}

fn main() {
    let quick =
        std::env::var("KEEL_BENCH_QUICK").is_ok_and(|value| !value.is_empty() && value != "0");
    let counts = if quick { QUICK } else { FULL };
    raise_descriptor_limit(counts.extra_fds + 1_000);
    // Two workers, as on this machine's daemon (one per core).
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "keel-actors spawn benchmark ({}); load average at start: {}",
        if quick {
            "KEEL_BENCH_QUICK"
        } else {
            "full run"
        },
        load_average()
    );
    tokio.block_on(async {
        let helper = Spawner::start(SpawnerCommand {
            program: PathBuf::from(env!("CARGO_BIN_EXE_keel-spawner")),
            args: Vec::new(),
            hide: None,
        })
        .await;
        assert!(helper.uses_helper().await, "keel-spawner did not start");
        // `KEEL_BENCH_WAY=direct` or `=spawner` measures that way alone
        // (for a profile of one).
        let only = std::env::var("KEEL_BENCH_WAY").unwrap_or_default();
        let ways: Vec<(&str, Spawner)> = [("direct", Spawner::direct()), ("spawner", helper)]
            .into_iter()
            .filter(|(way, _)| only.is_empty() || only == *way)
            .collect();
        // (extra fds, way) -> samples of each round.
        let mut results: Vec<((usize, &str), Vec<Sample>)> = Vec::new();
        for extra in [0, counts.extra_fds] {
            for (way, _) in &ways {
                results.push(((extra, way), Vec::new()));
            }
        }
        println!(
            "\n{:>5} {:>7} {:>8} {:>6} {:>11} {:>11} {:>10} {:>10} {:>10}",
            "round",
            "fds",
            "way",
            "n",
            "spawn p50",
            "spawn CPU",
            "call p50",
            "call p90",
            "call CPU"
        );
        for round in 1..=counts.rounds {
            for extra in [0, counts.extra_fds] {
                let connections: Vec<(UnixStream, UnixStream)> = (0..extra / 2)
                    .map(|_| UnixStream::pair().unwrap())
                    .collect();
                let n_fds = open_descriptors();
                for (way, spawner) in &ways {
                    // One call untimed: warms the path (and the pipes' pages).
                    run_true(spawner).await;
                    let sample = measure(spawner, counts.calls).await;
                    println!(
                        "{round:>5} {n_fds:>7} {way:>8} {:>6} {:>11} {:>11} {:>10} {:>10} {:>10}",
                        counts.calls,
                        format_duration(percentile(&sample.spawn_wall, 50)),
                        format_duration(sample.cpu_per_spawn),
                        format_duration(percentile(&sample.wall, 50)),
                        format_duration(percentile(&sample.wall, 90)),
                        format_duration(sample.cpu_per_call),
                    );
                    let slot = results
                        .iter_mut()
                        .find(|((of_extra, of_way), _)| *of_extra == extra && of_way == way)
                        .unwrap();
                    slot.1.push(sample);
                }
                drop(connections);
            }
        }
        println!("\nmedian over {} rounds:", counts.rounds);
        println!(
            "{:>9} {:>8} {:>11} {:>11} {:>10} {:>10} {:>10}",
            "extra fds", "way", "spawn p50", "spawn CPU", "call p50", "call p90", "call CPU"
        );
        for ((extra, way), samples) in &results {
            let median = |of: &dyn Fn(&Sample) -> Duration| {
                let values: Vec<Duration> = samples.iter().map(of).collect();
                format_duration(percentile(&values, 50))
            };
            println!(
                "{extra:>9} {way:>8} {:>11} {:>11} {:>10} {:>10} {:>10}",
                median(&|s| percentile(&s.spawn_wall, 50)),
                median(&|s| s.cpu_per_spawn),
                median(&|s| percentile(&s.wall, 50)),
                median(&|s| percentile(&s.wall, 90)),
                median(&|s| s.cpu_per_call),
            );
        }
    });
}

/// `calls` spawns of `true`, then `calls` bash calls of `true`, one after
/// the other.
async fn measure(spawner: &Spawner, calls: usize) -> Sample {
    let argv = ["true".into()];
    let launch = Launch {
        argv: &argv,
        env: &[],
        cwd: Path::new("/"),
        confinement: None,
    };
    let mut spawn_wall = Vec::with_capacity(calls);
    let cpu_before = process_cpu();
    for _ in 0..calls {
        let started = Instant::now();
        let launched = spawner.spawn(&launch).await.unwrap();
        spawn_wall.push(started.elapsed());
        let mut exit = launched.exit;
        assert!(exit.wait().await.unwrap().success());
    }
    let cpu_per_spawn = process_cpu().saturating_sub(cpu_before) / u32::try_from(calls).unwrap();
    let mut wall = Vec::with_capacity(calls);
    let cpu_before = process_cpu();
    for _ in 0..calls {
        let started = Instant::now();
        run_true(spawner).await;
        wall.push(started.elapsed());
    }
    let cpu = process_cpu().saturating_sub(cpu_before);
    Sample {
        spawn_wall,
        cpu_per_spawn,
        wall,
        cpu_per_call: cpu / u32::try_from(calls).unwrap(),
    }
}

async fn run_true(spawner: &Spawner) {
    let outcome = Bash
        .run(ToolContext {
            call: ToolCall {
                id: ToolCallId::new("toolu_bench"),
                name: "bash".to_owned(),
                input: serde_json::json!({"command": "true"}),
            },
            cwd: std::env::temp_dir(),
            may_leave_cwd: false,
            output: ToolOutput::discard(),
            ledger: None,
            spawner: spawner.clone(),
            groups: Default::default(),
            sandbox: keel_actors::tool::CallSandbox::unconfined(),
        })
        .await;
    assert_eq!(outcome, ToolOutcome::ok("(no output)"));
}

/// User + system CPU time of this whole process so far (every thread).
fn process_cpu() -> Duration {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(time.tv_sec).unwrap(),
        u32::try_from(time.tv_nsec).unwrap(),
    )
}

/// How many descriptors this process has open.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Lift the soft limit on open descriptors to `wanted` (within the hard one).
fn raise_descriptor_limit(wanted: usize) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let wanted = u64::try_from(wanted).unwrap();
    let hard = limit.maximum.unwrap_or(u64::MAX);
    assert!(
        hard >= wanted,
        "this bench needs {wanted} open descriptors; the hard limit is {hard}"
    );
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(wanted.max(limit.current.unwrap_or(0))),
            maximum: limit.maximum,
        },
    )
    .unwrap();
}

fn percentile(samples: &[Duration], pct: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let index = (sorted.len() * pct / 100).min(sorted.len().saturating_sub(1));
    sorted.get(index).copied().unwrap_or_default()
}

fn format_duration(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1_000.0)
}
