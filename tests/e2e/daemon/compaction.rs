//! Long conversations through the daemon (docs/compaction.md), against the
//! fake provider in both wire formats: 50 tool turns in a 2,000-token
//! window all complete, compacted as they go, with no tool call parted
//! from its result; a provider's "too long" ends in a compaction and a
//! completed turn; a daemon killed while a summary is being written
//! compacts again after its restart. The window and threshold are set at
//! creation and changed with `PATCH`, checked like creation and recorded in
//! the log; a refused change records nothing.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{kind, of_kind, Daemon, Site, Wire};
use crate::harness::MockLlm;

/// Every tool result in a conversation's prompt (`GET …/{id}`'s
/// `messages`) comes after the call it answers.
fn results_follow_their_calls(conversation: &Value) -> bool {
    let mut called = std::collections::HashSet::new();
    let blocks = conversation["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|message| message["content"].as_array().into_iter().flatten());
    for block in blocks {
        match block["type"].as_str() {
            Some("tool_use") => {
                called.insert(block["id"].as_str().unwrap_or_default().to_owned());
            }
            Some("tool_result")
                if !called.contains(block["tool_call_id"].as_str().unwrap_or_default()) =>
            {
                return false;
            }
            _ => {}
        }
    }
    true
}

/// Turn `n`'s message: a `bash` call (the fake turns `run: CMD` into one)
/// that prints a few hundred bytes, so the prompt grows by a fair share of
/// the window every turn.
fn tool_turn(n: u64) -> String {
    format!("run: for i in 1 2 3 4 5 6; do echo \"turn {n} line $i of the build output\"; done")
}

async fn fifty_tool_turns(wire: Wire) {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, wire, &mock, &[]);
    let id = daemon.create(&site, json!({"context_window": 2000})).await;
    for n in 1..=50 {
        daemon.send(&id, &tool_turn(n)).await;
        let log = daemon.wait_turn_done(&id, n).await;
        let ended = log.iter().rev().find(|event| super::ends_turn(event, n));
        assert_eq!(
            ended.map(kind),
            Some("turn_completed"),
            "{wire:?} turn {n}: {ended:?}"
        );
        let conversation = daemon.conversation(&id).await;
        assert!(
            results_follow_their_calls(&conversation),
            "{wire:?} turn {n}: a tool result without its call: {conversation:#}"
        );
    }
    let log = daemon.log(&id).await;
    assert_eq!(of_kind(&log, "turn_completed").len(), 50, "{wire:?}");
    assert!(of_kind(&log, "turn_failed").is_empty(), "{wire:?}");
    assert_eq!(
        of_kind(&log, "tool_result").len(),
        50,
        "{wire:?}: every call ran: {:#?}",
        &log[..log.len().min(40)]
    );
    let compactions = of_kind(&log, "compacted");
    assert!(
        compactions.len() >= 3,
        "{wire:?}: {} compactions",
        compactions.len()
    );
    for compaction in &compactions {
        assert!(compaction["summary"].is_string(), "{compaction}");
        let before = compaction["tokens_before"].as_u64().unwrap_or_default();
        let after = compaction["tokens_after"].as_u64().unwrap_or(u64::MAX);
        assert!(after < before, "{compaction}");
    }
    // No request keel sent was over the window (the fake counts too).
    let over: Vec<Value> = mock
        .requests()
        .await
        .into_iter()
        .filter(|record| record["prompt_tokens"].as_u64() > Some(2000))
        .collect();
    assert!(
        over.is_empty(),
        "{wire:?}: requests over the window: {over:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_fifty_tool_turns_in_a_small_window_all_complete_anthropic() {
    fifty_tool_turns(Wire::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_fifty_tool_turns_in_a_small_window_all_complete_openai() {
    fifty_tool_turns(Wire::OpenAi).await;
}

/// The provider refuses a prompt as too long (with its real error) although
/// keel's own threshold is far: keel compacts and the turn completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_a_provider_too_long_ends_in_a_compaction_and_a_completed_turn() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let mock = MockLlm::start();
        let site = Site::new();
        let daemon = Daemon::start(&site, wire, &mock, &[]);
        let id = daemon.create(&site, json!({})).await;
        for n in 1..=4 {
            daemon.send(&id, &tool_turn(n)).await;
            daemon.wait_turn_done(&id, n).await;
        }
        let tokens = mock
            .requests()
            .await
            .iter()
            .filter_map(|record| record["prompt_tokens"].as_u64())
            .max()
            .unwrap_or_default();
        // The next request is over the fake's window; a summary of the
        // first turns is well under it.
        mock.set_context_window(Some(tokens + 20)).await;
        daemon.send(&id, &tool_turn(5)).await;
        let log = daemon.wait_turn_done(&id, 5).await;
        assert!(
            log.iter().any(|event| kind(event) == "compacted"),
            "{wire:?}: {log:#?}"
        );
        assert_eq!(
            of_kind(&log, "turn_completed").len(),
            5,
            "{wire:?}: {log:#?}"
        );
        let refused = mock
            .requests()
            .await
            .into_iter()
            .filter(|record| record["source"] == "too_long")
            .count();
        assert!(refused >= 1, "{wire:?}: the fake never refused");
    }
}

/// Killed while the summary is being written: nothing of it was recorded,
/// and the restarted daemon compacts again and completes the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_killed_during_compaction_compacts_again_after_restart() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({"context_window": 2000})).await;
    // The first summary request hangs.
    mock.push_script(json!([{"summary": true, "hang_after_events": 0}]))
        .await;
    let mut n = 0;
    let summary_requested = loop {
        n += 1;
        assert!(n <= 30, "no compaction within 30 turns");
        daemon.send(&id, &tool_turn(n)).await;
        let hung = wait_summary_or_turn(&daemon, &mock, &id, n).await;
        if hung {
            break n;
        }
    };
    let before = daemon.log(&id).await;
    assert!(of_kind(&before, "compacted").is_empty());
    daemon.sigkill();
    let mut daemon = daemon;
    daemon.wait_exit();
    let daemon = daemon.restart();
    let log = daemon.wait_turn_done(&id, summary_requested).await;
    assert_eq!(
        log[..before.len()],
        before[..],
        "the log before the kill is kept"
    );
    assert_eq!(of_kind(&log, "compacted").len(), 1, "{log:#?}");
    assert_eq!(
        of_kind(&log, "turn_completed").len(),
        summary_requested as usize,
        "{log:#?}"
    );
}

/// Whether turn `n` is waiting on a summary request the fake is holding
/// (else it waits for the turn to end and says no).
async fn wait_summary_or_turn(daemon: &Daemon, mock: &MockLlm, id: &str, n: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let summary_pending = mock.requests().await.iter().any(|record| {
            record["outcome"] == "pending" && record["body"].to_string().contains("[keel:summary]")
        });
        if summary_pending {
            return true;
        }
        let conversation = daemon.conversation(id).await;
        if conversation["state"] == "idle" && conversation["turn"].as_u64() >= Some(n) {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("turn {n} neither ended nor asked for a summary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_settings_are_set_at_creation_and_changed_by_patch() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[]);
    let id = daemon
        .create(
            &site,
            json!({"context_window": 4000, "compact_at_percent": 70}),
        )
        .await;
    let path = format!("/v1/conversations/{id}");
    let detail = daemon.get(&path).await;
    assert_eq!(detail.body["context_window"], 4000, "{detail:?}");
    assert_eq!(detail.body["compact_at_percent"], 70);

    let changed = daemon
        .patch(
            &path,
            &json!({"compact_at_percent": 50, "max_tokens": 1024, "system": "Be brief."}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{changed:?}");
    assert_eq!(changed.body["compact_at_percent"], 50);
    assert_eq!(changed.body["max_tokens"], 1024);
    assert_eq!(changed.body["system"], "Be brief.");
    assert_eq!(changed.body["context_window"], 4000, "left as it was");
    let log = daemon.log(&id).await;
    let changes = of_kind(&log, "config_changed");
    assert_eq!(changes.len(), 1, "{log:?}");
    assert_eq!(changes[0]["compact_at_percent"], 50, "{:?}", changes[0]);

    // Refused changes record nothing and say what is wrong.
    let refusals = [
        (json!({"compact_at_percent": 100}), "compact_at_percent"),
        (json!({"context_window": 10}), "context_window"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"context_window": "big"}), "context_window"),
        (json!({"cwd": "/elsewhere"}), "cwd"),
    ];
    for (body, named) in refusals {
        let reply = daemon.patch(&path, &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {reply:?}");
        let message = reply.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(named), "{body}: {message}");
    }
    assert_eq!(daemon.log(&id).await, log, "refusals changed the log");

    let unknown = daemon
        .patch("/v1/conversations/nobody", &json!({"max_tokens": 10}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{unknown:?}");

    // Creation checks the same values.
    let bad = daemon
        .post(
            "/v1/conversations",
            &json!({"cwd": site.cwd().display().to_string(), "compact_at_percent": 120}),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
}
