//! `keel demo`, as a newcomer and a script see it: it exits 0, and its
//! `--json` lines show every step in order with the facts that prove it
//! (the streamed text, the bash output, the approval, the cancel with the
//! process tree gone, the crash and the recovery, a log with contiguous
//! seqs and every tool_use answered), and nothing it started is left.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use serde_json::Value;

use crate::harness::{group_is_gone, keel, keel_json_lines};

/// The lines of `kind`, in order.
fn all<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|line| line["kind"] == kind).collect()
}

/// The one line of `kind`, and where it is.
fn one<'a>(lines: &'a [Value], kind: &str) -> (usize, &'a Value) {
    let found: Vec<(usize, &Value)> = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} line in {lines:#?}");
    found[0]
}

/// No process `pid`, or only a zombie (dead, waiting to be reaped by a
/// parent that may be this machine's init).
fn pid_is_gone(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            stat.rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().next())
                == Some("Z")
        }
    }
}

#[test]
fn demo_exits_zero_and_shows_each_step_to_people() {
    let output = keel(&["demo"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "keel demo failed: {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for step in [
        "1. start the fake provider and a daemon",
        "2. create a conversation",
        "3. a text reply, streamed",
        "4. the model calls bash",
        "5. cancel while a command's process tree runs",
        "6. crash the daemon mid-turn",
        "7. read the log",
        "8. clean up",
    ] {
        assert!(stdout.contains(step), "{step:?} in\n{stdout}");
    }
    assert!(stdout.contains("done in"), "{stdout}");
    // Not a terminal: no colour codes.
    assert!(!stdout.contains('\x1b'), "{stdout}");
}

#[test]
fn demo_json_shows_every_step_in_order_with_its_proof_and_leaves_nothing() {
    let lines = keel_json_lines(&["demo", "--json"]);

    // Steps 1 to 8, in order, each fact inside its step.
    let steps: Vec<u64> = all(&lines, "step")
        .iter()
        .map(|line| line["n"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=8).collect::<Vec<_>>());
    let step_at = |n: u64| {
        lines
            .iter()
            .position(|line| line["kind"] == "step" && line["n"] == n)
            .unwrap()
    };
    let order = [
        ("created", 2),
        ("streamed", 3),
        ("awaiting_approval", 4),
        ("bash", 4),
        ("tree_running", 5),
        ("tree_gone", 5),
        ("crashed", 6),
        ("restarted", 6),
        ("recovered", 6),
        ("log", 7),
        ("cleaned_up", 8),
        ("done", 8),
    ];
    let mut previous = 0;
    for (kind, step) in order {
        let idx = lines
            .iter()
            .position(|line| line["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} line in {lines:#?}"));
        assert!(idx > previous, "{kind} comes after what precedes it");
        assert!(idx > step_at(step), "{kind} is in step {step}");
        if step < 8 {
            assert!(idx < step_at(step + 1), "{kind} is in step {step}");
        }
        previous = idx;
    }

    // Step 3: the text arrived in several tokens, before the turn ended.
    let (streamed_at, streamed) = one(&lines, "streamed");
    let tokens: String = lines[step_at(3)..streamed_at]
        .iter()
        .filter(|line| line["kind"] == "token")
        .map(|line| line["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed["text"], tokens.as_str());
    assert!(streamed["tokens"].as_u64().unwrap() > 1, "{streamed}");
    assert!(tokens.starts_with("Hello!"), "{tokens}");

    // Step 4: the call waited for a human, was approved, then ran.
    let (_, created) = one(&lines, "created");
    let cwd = created["cwd"].as_str().unwrap();
    let (waiting_at, waiting) = one(&lines, "awaiting_approval");
    assert_eq!(waiting["state"], "awaiting_input");
    let call = waiting["tool_call_id"].as_str().unwrap();
    let approved_at = lines
        .iter()
        .position(|line| line["kind"] == "approved" && line["tool_call_id"] == call)
        .expect("the waiting call is approved");
    let (bash_at, bash) = one(&lines, "bash");
    assert!(waiting_at < approved_at && approved_at < bash_at);
    assert_eq!(bash["tool_call_id"], call);
    assert_eq!(bash["is_error"], false);
    assert_eq!(bash["output"], format!("hello from keel in {cwd}\n"));

    // Step 5: the tree ran, the cancel interrupted the turn, and neither a
    // pid nor anything of its process group is left; checked here too,
    // after the demo exited, not only by the demo.
    let (_, running) = one(&lines, "tree_running");
    let (_, gone) = one(&lines, "tree_gone");
    let pids: Vec<u64> = running["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pid| pid.as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 3, "{running}");
    assert_eq!(gone["pids"], running["pids"]);
    assert_eq!(gone["running"], serde_json::json!([]));
    assert_eq!(gone["reason"], "cancelled");
    assert_eq!(gone["state"], "idle");
    let pgid = running["pgid"].as_u64().unwrap();
    assert!(group_is_gone(i32::try_from(pgid).unwrap()), "group {pgid}");
    for pid in &pids {
        assert!(pid_is_gone(*pid), "pid {pid} still runs");
    }

    // Step 6: the crash landed mid-stream; the new daemon recovered the
    // conversation at boot and the turn was re-run to its answer.
    let (_, crashed) = one(&lines, "crashed");
    assert_eq!(crashed["state"], "streaming");
    let (_, restarted) = one(&lines, "restarted");
    assert_eq!(restarted["recovered"], serde_json::json!([created["id"]]));
    assert_eq!(restarted["failed"], serde_json::json!([]));
    assert_ne!(restarted["url"], one(&lines, "daemon").1["url"]);
    let (_, recovered) = one(&lines, "recovered");
    assert_eq!(recovered["action"], "rerun_request");
    assert_eq!(recovered["state"], "idle");
    assert!(recovered["answer"]
        .as_str()
        .unwrap()
        .starts_with("Once upon a time"));

    // Step 7: the log.
    let (_, log) = one(&lines, "log");
    assert_eq!(log["contiguous"], true);
    assert_eq!(log["unanswered"], serde_json::json!([]));
    assert_eq!(log["tool_uses"], log["answered"]);
    assert_eq!(log["tool_uses"].as_array().unwrap().len(), 2);
    let (_, kinds) = one(&lines, "log_events");
    let kinds = kinds["types"].as_array().unwrap();
    assert_eq!(kinds.len() as u64, log["events"].as_u64().unwrap());
    for kind in [
        "resolved",
        "turn_interrupted",
        "recovered",
        "session_started",
    ] {
        assert!(kinds.iter().any(|seen| seen == kind), "{kind} in the log");
    }

    // Step 8: nothing left.
    let (_, cleaned) = one(&lines, "cleaned_up");
    assert_eq!(cleaned["removed"], true);
    assert_eq!(cleaned["processes_left"], serde_json::json!([]));
    let temp_dir = cleaned["temp_dir"].as_str().unwrap();
    assert!(!Path::new(temp_dir).exists(), "{temp_dir} is gone");
    assert!(
        cwd.starts_with(temp_dir),
        "the conversation worked inside it"
    );
}
