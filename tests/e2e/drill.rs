//! `keel drill crash`, `keel drill faults` and `keel bench` as a user
//! runs them.
//!
//! The crash drill, short (the few dozen kills CI can afford): the real
//! binary kills its own daemon with SIGKILL while conversations stream, run
//! tools and wait for approvals, and must find no violation; its report
//! must show the kills landed where the work was.
//!
//! The nodes drill, short: the real binary starts PostgreSQL and three
//! nodes over it, SIGKILLs and pauses nodes while conversations work
//! through them, and must find no violation and report how long a lost
//! node's conversations took to answer again. Without PostgreSQL's server
//! binaries it is not run (NOT RUN), unless `KEEL_REQUIRE_POSTGRES` is set.
//!
//! `keel drill faults`: the real binary starts its own
//! daemon and fake provider, walks the fault matrix and exits 0 only if
//! every case reached its expected end state. Its `--json` lines are
//! checked here against the promises themselves, not only its verdict:
//! every fault in both wire formats with and without a fallback, a
//! retryable fault retried and then handed over, a final one never
//! retried, `retry-after` honoured up to its cap.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

use std::process::Command;

use crate::cli::free_port;
use crate::daemon::{Daemon, Site};
use crate::harness::{keel, keel_bin, keel_json_lines, MockLlm};

/// The cases of `fault` that ran in `wire` with or without a fallback, in
/// the "every request fails" mode.
fn case<'a>(cases: &'a [Value], fault: &str, wire: &str, fallback: bool) -> &'a Value {
    cases
        .iter()
        .find(|case| {
            case["fault"].as_str().unwrap().starts_with(fault)
                && case["wire"] == wire
                && case["fallback"].is_null() != fallback
                && case["mode"] == "always"
        })
        .unwrap_or_else(|| panic!("no case {fault} {wire} fallback={fallback}"))
}

fn trail(case: &Value) -> Vec<&str> {
    case["seen"]["trail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| step.as_str().unwrap())
        .collect()
}

#[test]
fn the_fault_matrix_reaches_every_expected_end_state() {
    let lines = keel_json_lines(&["drill", "faults", "--json"]);
    let (summary, cases) = lines.split_last().unwrap();
    let failed: Vec<&Value> = cases.iter().filter(|case| case["passed"] != true).collect();
    assert!(failed.is_empty(), "cases that failed: {failed:#?}");
    assert_eq!(summary["summary"]["failed"], 0);
    assert_eq!(summary["summary"]["passed"], cases.len());

    // Every fault the issue names, in both formats, with and without a
    // fallback.
    for fault in [
        "429",
        "500",
        "502",
        "503",
        "529",
        "400",
        "401",
        "403",
        "404",
        "cut mid-stream",
        "malformed SSE",
        "error event",
        "hang",
        "stall",
        "slow drip",
    ] {
        for wire in ["anthropic", "openai"] {
            for fallback in [false, true] {
                let case = case(cases, fault, wire, fallback);
                assert_eq!(case["seen"]["end"], case["expected"]["end"], "{case:#}");
            }
        }
    }
    case(cases, "connection refused", "refused", false);
    case(cases, "connection refused", "refused", true);

    // A retryable fault: two retries, then the fallback answers.
    let handed_over = case(cases, "500", "anthropic", true);
    let steps = trail(handed_over);
    let expected = [
        "streaming",
        "retry_wait",
        "retry 1 in ",
        "streaming",
        "retry_wait",
        "retry 2 in ",
        "streaming",
        "fallback to openai/gpt-drill",
        "idle",
    ];
    assert_eq!(steps.len(), expected.len(), "{steps:?}");
    for (step, prefix) in steps.iter().zip(expected) {
        assert!(step.starts_with(prefix), "{steps:?}");
    }
    assert_eq!(handed_over["seen"]["answered_by"][0], "openai");
    assert_eq!(handed_over["seen"]["requests"]["anthropic"], 3);
    assert_eq!(handed_over["seen"]["requests"]["openai"], 1);
    // Without a fallback the turn fails, saying how often it tried.
    let failed = case(cases, "500", "openai", false);
    assert_eq!(failed["seen"]["state"], "error");
    assert!(failed["seen"]["error"]
        .as_str()
        .unwrap()
        .contains("failed 3 times"));
    // A final fault: one request, no retry, the fallback never asked.
    let refused = case(cases, "401", "anthropic", true);
    assert_eq!(trail(refused), ["streaming", "error"]);
    assert_eq!(refused["seen"]["requests"]["anthropic"], 1);
    assert!(refused["seen"]["requests"]["openai"].is_null());
    // retry-after (1 s) is honoured up to the conversation's cap (80 ms).
    let limited = case(cases, "429", "openai", false);
    assert_eq!(
        limited["seen"]["retry_delays_ms"],
        serde_json::json!([80, 80])
    );
    // A slow drip is no fault: it streams and completes on the primary.
    let slow = case(cases, "slow drip", "anthropic", true);
    assert_eq!(trail(slow), ["streaming", "idle"]);
    assert!(slow["seen"]["text_deltas"].as_u64().unwrap() >= 2);
}

#[test]
fn an_unknown_fault_is_refused_with_the_list() {
    let output = keel(&["drill", "faults", "--only", "no such fault"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no fault matches"), "{stderr}");
    assert!(stderr.contains("429 rate limited"), "{stderr}");
}

#[test]
fn a_short_crash_drill_finds_nothing_lost_doubled_or_stuck() {
    let lines = keel_json_lines(&[
        "drill",
        "crash",
        "--kills",
        "24",
        "--conversations",
        "4",
        "--seed",
        "11",
        "--json",
    ]);
    let report = &lines[0];
    assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["kills"], 24);
    assert_eq!(report["seed"], 11);
    assert!(report["kept"].is_null(), "{report:#}");
    for counted in [
        "turns",
        "tool_calls",
        "sub_agents",
        "approvals",
        "checks_passed",
    ] {
        assert!(
            report[counted].as_u64().unwrap() > 0,
            "{counted}: {report:#}"
        );
    }
    // The work was under way when the kills landed.
    let by_state = report["kills_by_state"].as_object().unwrap();
    assert!(
        by_state.contains_key("streaming") || by_state.contains_key("executing_tools"),
        "{report:#}"
    );
}

#[test]
fn a_short_nodes_drill_finds_nothing_lost_interleaved_or_stale() {
    // The drill starts a server of its own; this one only says whether
    // the machine can (NOT RUN, or a failure under KEEL_REQUIRE_POSTGRES).
    let Some(server) = keel_test_support::postgres::Postgres::start() else {
        return;
    };
    drop(server);
    let lines = keel_json_lines(&[
        "drill",
        "nodes",
        "--kills",
        "6",
        "--conversations",
        "4",
        "--seed",
        "5",
        "--json",
    ]);
    let report = &lines[0];
    assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["kills"], 6);
    assert_eq!(report["nodes"], 3);
    assert_eq!(
        report["sigkills"].as_u64().unwrap() + report["pauses"].as_u64().unwrap(),
        6,
        "{report:#}"
    );
    assert!(report["kept"].is_null(), "{report:#}");
    for counted in ["turns", "tool_calls", "checks_passed", "restarts"] {
        assert!(
            report[counted].as_u64().unwrap() > 0,
            "{counted}: {report:#}"
        );
    }
    // The first fault always lands on a node that owns conversations.
    let resume = &report["time_to_resume"];
    assert!(resume["samples"].as_u64().unwrap() > 0, "{report:#}");
    for figure in ["p50_ms", "p99_ms", "max_ms"] {
        assert!(resume[figure].is_f64(), "{figure}: {report:#}");
    }
}

#[test]
fn an_aimed_crash_drill_lands_every_kill_mid_tool() {
    let lines = keel_json_lines(&[
        "drill",
        "crash",
        "--kills",
        "5",
        "--conversations",
        "3",
        "--at",
        "mid-tool",
        "--json",
    ]);
    let report = &lines[0];
    assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["at"], "mid-tool");
    assert_eq!(report["missed_aims"], 0, "{report:#}");
    assert_eq!(report["kills_by_state"]["executing_tools"], 5, "{report:#}");
}

/// The other boundaries: each kill lands where it is aimed (the drill
/// counts a kill that waited in vain as a missed aim), and no promise
/// breaks there.
#[test]
fn crash_drills_aimed_at_children_and_appends_land_there() {
    for (at, seen) in [
        ("children-running", Some("children_running")),
        ("before-append", None),
        ("after-append", None),
    ] {
        let lines = keel_json_lines(&[
            "drill",
            "crash",
            "--kills",
            "4",
            "--conversations",
            "3",
            "--at",
            at,
            "--json",
        ]);
        let report = &lines[0];
        assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
        assert_eq!(report["at"], at);
        assert_eq!(report["missed_aims"], 0, "{report:#}");
        if let Some(state) = seen {
            assert_eq!(report["kills_by_state"][state], 4, "{report:#}");
            assert!(report["sub_agents"].as_u64().unwrap() > 0, "{report:#}");
        }
    }
}

/// `keel bench --quick`: the real binary measures a daemon of its own and
/// reports every figure (their values are for docs/benchmarks.md, not a test).
#[test]
fn keel_bench_quick_reports_every_figure() {
    let lines = keel_json_lines(&["bench", "--quick", "--json"]);
    let report = &lines[0];
    let turns = report["turns"].as_array().unwrap();
    for kind in ["text", "tool"] {
        let of_kind: Vec<&Value> = turns.iter().filter(|run| run["kind"] == kind).collect();
        assert!(of_kind.len() >= 2, "{report:#}");
        for run in of_kind {
            assert!(run["turns"].as_u64().unwrap() > 0, "{run:#}");
            for figure in ["turns_per_second", "cpu_ms_per_turn", "latency_p50_ms"] {
                assert!(run[figure].as_f64().unwrap() > 0.0, "{figure}: {run:#}");
            }
            // The spawner's CPU is read too (a few turns may take less
            // than one clock tick of it, so only its presence is sure).
            assert!(
                run["spawner_cpu_ms_per_turn"].as_f64().is_some(),
                "the spawner's CPU: {run:#}"
            );
        }
    }
    assert!(report["rss_per_idle_conversation_bytes"].as_f64().unwrap() > 0.0);
    assert!(report["restart_to_ready_ms"].as_f64().unwrap() > 0.0);
    assert!(report["stored_conversations"].as_u64().unwrap() > 200);
    assert_eq!(report["fanout_subscribers"], 50, "{report:#}");
    // The sandbox's cost, one at a time and many at once: both sides
    // measured (the spawner's share, in clock ticks over so few turns,
    // may read 0).
    let runs = report["sandbox"].as_array().expect("the sandbox's runs");
    assert_eq!(
        runs.iter()
            .map(|run| run["at_once"].as_u64())
            .collect::<Vec<_>>(),
        [Some(1), Some(10)],
        "{report:#}"
    );
    for sandbox in runs {
        for figure in ["confined_cpu_ms", "unconfined_cpu_ms"] {
            assert!(
                sandbox[figure].as_f64().unwrap() > 0.0,
                "{figure}: {sandbox:#}"
            );
        }
        for figure in ["overhead_cpu_ms", "confined_spawner_cpu_ms"] {
            assert!(sandbox[figure].is_number(), "{figure}: {sandbox:#}");
        }
    }
    assert_eq!(report["fanout"]["samples"], 50 * 3, "{report:#}");
    for latency in [
        "cold_load",
        "cancel_stream",
        "cancel_process_tree",
        "fanout",
    ] {
        assert!(
            report[latency]["samples"].as_u64().unwrap() > 0,
            "{latency}"
        );
        assert!(
            report[latency]["p50_ms"].as_f64().unwrap() > 0.0,
            "{latency}"
        );
    }
}

/// `keel bench --addr`: the real binary measures a daemon somebody else
/// started (against `keel mock-llm`, also a process of its own): it finds
/// the daemon's process by its port for CPU and memory, scripts the named
/// fake provider for the streaming cancel, loads evicted conversations
/// cold, and says that restart to ready was not measured.
#[test]
fn keel_bench_measures_a_running_daemon_at_addr() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = daemon_on(&site, &mock);
    let output = Command::new(keel_bin())
        .args(["bench", "--quick", "--json", "--addr", &daemon.url])
        .args(["--mock-url", mock.base_url()])
        .env("KEEL_TOKEN", &daemon.token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "keel bench --addr failed: {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["addr"], daemon.url.as_str());
    assert_eq!(report["pid"], daemon.pid(), "found by its port: {report:#}");
    for run in report["turns"].as_array().unwrap() {
        assert!(run["turns"].as_u64().unwrap() > 0, "{run:#}");
        assert!(run["cpu_ms_per_turn"].as_f64().unwrap() > 0.0, "{run:#}");
    }
    assert!(report["rss_per_idle_conversation_bytes"].as_f64().is_some());
    assert!(report["restart_to_ready_ms"].is_null(), "{report:#}");
    for latency in [
        "cold_load",
        "cancel_stream",
        "cancel_process_tree",
        "fanout",
    ] {
        assert!(
            report[latency]["samples"].as_u64().unwrap() > 0,
            "{latency}: {report:#}"
        );
    }
    // The conversations are the daemon's: it still lists them.
    let stored = report["stored_conversations"].as_u64().unwrap();
    assert!(stored > 200, "{report:#}");

    // Without the fake provider's address, the streaming cancel is left
    // out, and said to be.
    let output = Command::new(keel_bin())
        .args(["bench", "--quick", "--addr", &daemon.url])
        .env("KEEL_TOKEN", &daemon.token)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("cancel to idle, streaming: not measured (no --mock-url)"),
        "{text}"
    );
    assert!(text.contains(&format!("pid {}", daemon.pid())), "{text}");
}

/// `keel bench --addr` with nothing there says so and fails.
#[test]
fn keel_bench_at_an_address_nobody_answers_fails_clearly() {
    let port = free_port();
    let output = keel(&["bench", "--quick", "--addr", &format!("127.0.0.1:{port}")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("no keel daemon answers at 127.0.0.1:{port}")),
        "{stderr}"
    );
}

#[test]
fn keel_drill_crash_at_an_address_nobody_answers_fails_clearly() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let output = keel(&["drill", "crash", "--kills", "1", "--addr", &addr]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("no daemon at {addr}: start one with `keel serve`")),
        "{stderr}"
    );
    // Nothing was written, so no directory is kept and none is named.
    assert!(!stderr.contains("kept in"), "{stderr}");
    // Retries come only from faults queued at the fake provider.
    let output = keel(&["drill", "crash", "--addr", &addr, "--at", "retry-wait"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs --mock-url"), "{stderr}");
}

/// `keel drill crash --addr`: a daemon somebody else started (here, the
/// test), killed and brought back by `--restart` on its own data dir and
/// port, with the drill's checks passing, and left running at the end.
#[test]
fn keel_drill_crash_drills_a_running_daemon_at_addr() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = daemon_on(&site, &mock);
    let addr = daemon.url.trim_start_matches("http://").to_owned();
    let restart = format!(
        "cd '{}' && KEEL_DATA_DIR='{}' KEEL_ADDR={addr} KEEL_PROVIDER=mock KEEL_MOCK_URL={} exec '{}' serve",
        site.run_dir().display(),
        site.data_dir().display(),
        mock.base_url(),
        keel_bin().display()
    );
    let output = Command::new(keel_bin())
        .args([
            "drill",
            "crash",
            "--json",
            "--kills",
            "4",
            "--conversations",
            "3",
        ])
        .args([
            "--seed",
            "11",
            "--addr",
            &addr,
            "--mock-url",
            mock.base_url(),
        ])
        .args(["--restart", &restart])
        .env("KEEL_TOKEN", &daemon.token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| {
        panic!(
            "no report ({error}): {:?}\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    });
    // The last life is the drill's restart command's, left running: stop it
    // whatever the verdict (found by its port if the report does not say).
    let last = report["daemon_pid"]
        .as_u64()
        .and_then(|pid| u32::try_from(pid).ok());
    let running = keel_test_support::port_of(&addr).and_then(keel_test_support::listener_pid);
    for pid in [last, running].into_iter().flatten() {
        if pid != daemon.pid() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    assert!(output.status.success(), "{report:#}");
    assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["addr"], addr.as_str());
    assert_eq!(report["kills"], 4);
    assert_eq!(report["faults_queued"], true);
    assert!(report["turns"].as_u64().unwrap() > 0, "{report:#}");
    assert!(report["checks_passed"].as_u64().unwrap() > 4, "{report:#}");
    let last = last.expect("the report names the daemon's last pid");
    assert_ne!(last, daemon.pid(), "the first life was killed");
    assert_eq!(
        running,
        Some(last),
        "the report names the daemon now listening"
    );
}

/// The daemon `keel bench` (or a drill) starts dies with it, even when it
/// is killed and cannot stop the daemon itself (the OOM killer, say).
#[test]
fn a_daemon_started_by_keel_bench_dies_with_it() {
    // Killed, the bench cannot remove its temporary directory: it makes it
    // in one of the test's own, which goes when the test ends.
    let temp = tempfile::tempdir().unwrap();
    let mut bench = Command::new(keel_bin())
        .args(["bench", "--quick", "--json"])
        .env("TMPDIR", temp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let patience = std::time::Duration::from_secs(30);
    let daemon = loop {
        if let Some(pid) = serve_child_of(bench.id()) {
            break pid;
        }
        assert!(started.elapsed() < patience, "keel bench started no daemon");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    bench.kill().unwrap();
    bench.wait().unwrap();
    let killed = std::time::Instant::now();
    while keel_test_support::is_running(daemon) {
        assert!(
            killed.elapsed() < patience,
            "the daemon {daemon} outlived the killed keel bench"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A `keel serve` whose parent is `parent`, from `/proc`.
fn serve_child_of(parent: u32) -> Option<u32> {
    keel_test_support::pids().find(|pid| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|field| field.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        ppid == Some(parent) && cmdline.split(|byte| *byte == 0).any(|arg| arg == b"serve")
    })
}

/// `keel serve` on `site`, its provider the fake one at `mock`.
fn daemon_on(site: &Site, mock: &MockLlm) -> Daemon {
    Daemon::start_with(
        site,
        vec![
            ("KEEL_PROVIDER".to_owned(), "mock".to_owned()),
            ("KEEL_MOCK_URL".to_owned(), mock.base_url().to_owned()),
        ],
    )
}
