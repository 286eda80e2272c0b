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
