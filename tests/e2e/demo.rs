//! `keel demo --json`: the walkthrough's log, read as a script would, obeys
//! the log's invariants.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use serde_json::Value;

use crate::harness::keel_json_lines;

/// The canonical events of the demo, in the order they were appended.
fn events(lines: &[Value]) -> Vec<&Value> {
    lines
        .iter()
        .filter(|line| line["kind"] == "event")
        .collect()
}

#[test]
fn demo_log_is_contiguous_pairs_every_tool_use_and_records_the_cancel() {
    let lines = keel_json_lines(&["demo", "--json"]);
    let events = events(&lines);
    assert!(!events.is_empty(), "no events in {lines:?}");

    // Seqs run 1, 2, 3, … and each id is `{conversation}:{seq}`.
    let conversation = events[0]["event"]["kind"]["conversation"]
        .as_str()
        .expect("the first event is Created and names the conversation");
    for (idx, line) in events.iter().enumerate() {
        let seq = line["event"]["seq"].as_u64().expect("a numeric seq");
        assert_eq!(seq, idx as u64 + 1, "seqs must be contiguous from 1");
        assert_eq!(line["id"], format!("{conversation}:{seq}"));
    }

    // Invariant 3: every tool_use has a ToolResult.
    let kinds: Vec<&Value> = events.iter().map(|line| &line["event"]["kind"]).collect();
    let tool_uses: BTreeSet<&str> = kinds
        .iter()
        .filter(|kind| kind["type"] == "assistant_message")
        .flat_map(|kind| kind["blocks"].as_array().unwrap())
        .filter(|block| block["type"] == "tool_use")
        .map(|block| block["call"]["id"].as_str().unwrap())
        .collect();
    let results: BTreeSet<&str> = kinds
        .iter()
        .filter(|kind| kind["type"] == "tool_result")
        .map(|kind| kind["tool_call_id"].as_str().unwrap())
        .collect();
    assert!(!tool_uses.is_empty(), "the demo runs a tool");
    assert_eq!(tool_uses, results, "every tool_use has exactly its result");
    let bash = kinds
        .iter()
        .find(|kind| kind["type"] == "tool_result")
        .unwrap();
    assert_eq!(bash["content"], "hello from keel\n");
    assert_eq!(bash["is_error"], false);

    // The cancelled turn is recorded, with what had streamed so far.
    let interrupted = kinds
        .iter()
        .find(|kind| kind["type"] == "turn_interrupted")
        .expect("a TurnInterrupted event");
    assert_eq!(interrupted["reason"]["kind"], "cancelled");
    assert_eq!(interrupted["partial_text"], "count slowly");

    // The conversation ends idle, and the replay agrees with the live state.
    let replay = lines
        .iter()
        .find(|line| line["kind"] == "replay")
        .expect("a replay line");
    assert_eq!(replay["working_set_equal"], true);
    assert_eq!(replay["events"], events.len());
    assert_eq!(replay["state"], "idle");
}
