//! The LangGraph Agent Server API (docs/langgraph.md) through LangGraph's
//! own Python SDK, unmodified (`tests/langgraph/check.py`, `langgraph-sdk`
//! from PyPI): a chat streamed in every mode keel serves, approvals and a
//! question as interrupts resumed with decisions, a cancel that stops the
//! command, a stream cut mid-answer that the SDK's own reconnect resumes
//! with nothing missed or doubled, and refusals in keel's error shape.

use super::{Daemon, Site, Wire};
use crate::harness::{langgraph_python, MockLlm};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_langgraph_sdk_runs_a_chat_with_interrupts_cancels_and_reconnects() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let python = langgraph_python();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("langgraph/check.py");
    let (url, token, mock_url) = (
        daemon.url.clone(),
        daemon.token.clone(),
        mock.base_url().to_owned(),
    );
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .env("KEEL_URL", url)
            .env("KEEL_TOKEN", token)
            .env("MOCK_URL", mock_url)
            .output()
    })
    .await
    .expect("the SDK's run")
    .expect("python runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{printed}");
    for scenario in [
        "text_run",
        "approvals",
        "cancel",
        "dropped_connection",
        "refusals",
    ] {
        assert!(
            printed.contains(&format!("ok {scenario}\n")),
            "{scenario} ran: {printed}"
        );
    }
}

/// An interrupt is read off the log: it waits through a SIGKILL of the
/// daemon, and the decision taken after the restart runs the call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_langgraph_interrupt_waits_through_a_daemon_crash() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let created = daemon
        .post(
            "/v1/conversations",
            &serde_json::json!({"tools": {"bash": "approve"}}),
        )
        .await;
    let id = created.body["id"].as_str().unwrap_or_default().to_owned();
    let waited = daemon
        .post(
            &format!("/langgraph/threads/{id}/runs/wait"),
            &serde_json::json!({
                "assistant_id": "keel",
                "input": {"messages": [{"role": "user", "content": "run: echo after-restart"}]},
            }),
        )
        .await;
    assert_eq!(waited.status, reqwest::StatusCode::OK, "{waited:?}");
    let interrupt = waited.body["__interrupt__"][0].clone();
    assert_eq!(
        interrupt["value"]["action_requests"][0]["name"], "bash",
        "{waited:?}"
    );

    daemon.sigkill();
    let daemon = daemon.restart();
    let thread = daemon.get(&format!("/langgraph/threads/{id}")).await;
    assert_eq!(thread.body["status"], "interrupted", "{thread:?}");
    assert_eq!(
        thread.body["interrupts"]["tools"][0], interrupt,
        "{thread:?}"
    );

    let resumed = daemon
        .post(
            &format!("/langgraph/threads/{id}/runs/wait"),
            &serde_json::json!({
                "assistant_id": "keel",
                "command": {"resume": {"decisions": [{"type": "approve"}]}},
            }),
        )
        .await;
    let tools: Vec<&serde_json::Value> = resumed.body["messages"]
        .as_array()
        .map(|messages| messages.iter().filter(|m| m["type"] == "tool").collect())
        .unwrap_or_default();
    assert_eq!(tools.len(), 1, "{resumed:?}");
    assert_eq!(tools[0]["content"], "after-restart\n", "{resumed:?}");
    let thread = daemon.get(&format!("/langgraph/threads/{id}")).await;
    assert_eq!(thread.body["status"], "idle", "{thread:?}");
}
