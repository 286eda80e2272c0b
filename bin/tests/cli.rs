//! The `keel` command line, run as a process: what a user sees and the exit
//! codes scripts rely on. Building this test also builds `target/*/keel`,
//! which the end-to-end tests in keel-tests run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn keel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .output()
        .expect("the keel binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

/// `(conversation, seq)` of a canonical event line `{conversation}:{seq}  {summary}`.
fn event_id(line: &str) -> Option<(&str, u64)> {
    let (id, _summary) = line.split_once("  ")?;
    let (conversation, seq) = id.rsplit_once(':')?;
    let well_formed = !conversation.is_empty()
        && conversation
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'));
    well_formed.then_some(())?;
    Some((conversation, seq.parse().ok()?))
}

#[test]
fn demo_runs_a_tool_cancels_a_turn_and_replays_to_the_same_state() {
    let output = keel(&["demo"]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "status {:?}\nstdout:\n{text}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("tool output call-1-1 \"hello from keel\\n\""),
        "{text}"
    );
    assert!(
        text.contains("The command printed: hello from keel"),
        "{text}"
    );
    assert!(
        text.contains("rejected: agent is busy (streaming)"),
        "{text}"
    );
    assert!(
        text.contains("turn_interrupted  turn 3 (cancelled) partial_text=\"count slowly\""),
        "{text}"
    );
    assert!(
        text.lines().any(|line| line.starts_with("replayed ")
            && line.contains("the working set equals the live one (state idle)")),
        "{text}"
    );
    assert!(text.contains("final state: idle"), "{text}");

    let ids: Vec<(&str, u64)> = text.lines().filter_map(event_id).collect();
    assert!(ids.len() >= 10, "too few events in:\n{text}");
    let conversation = ids[0].0;
    assert!(conversation.starts_with("demo-"), "{conversation}");
    assert!(ids.iter().all(|(id, _)| *id == conversation), "{ids:?}");
    let seqs: Vec<u64> = ids.iter().map(|(_, seq)| *seq).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(
        seqs, expected,
        "event ids must count up from 1 without gaps"
    );
}

#[test]
fn demo_json_prints_one_json_object_per_line() {
    let output = keel(&["demo", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}")))
        .collect();
    assert!(lines
        .iter()
        .all(|line| line.is_object() && line["kind"].is_string()));
    let last = lines.last().expect("some output");
    assert_eq!(last["kind"], "done");
    assert_eq!(last["state"], "idle");
    let replay = lines
        .iter()
        .find(|line| line["kind"] == "replay")
        .expect("a replay line");
    assert_eq!(replay["working_set_equal"], true);
}

#[test]
fn version_names_the_package_version() {
    let output = keel(&["--version"]);
    assert!(output.status.success());
    assert_eq!(
        stdout(&output).trim(),
        format!("keel {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn an_unknown_command_fails_with_a_usage_error() {
    let output = keel(&["nonsense"]);
    assert!(!output.status.success());
    assert_eq!(output.status.code(), Some(2), "clap's usage-error status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unrecognized subcommand 'nonsense'"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn event_id_parsing_accepts_only_event_lines() {
    assert_eq!(event_id("demo-x1:12  user_message"), Some(("demo-x1", 12)));
    assert_eq!(event_id("    ~ state -> idle"), None);
    assert_eq!(event_id("== 1. create a conversation"), None);
    assert_eq!(event_id("keel demo: one conversation"), None);
}
