//! `POST …/cancel` mid-stream and mid-tool: 202, the conversation comes to
//! rest idle, the log records the interruption, the provider's connection
//! is closed and the tool's processes are gone.

use reqwest::StatusCode;
use serde_json::json;

use super::streaming::expect_snapshot;
use super::{
    assistant_texts, kind, mock_requests, of_kind, process_is_gone, wait_file, wait_process_gone,
    Daemon, Resume, Site, Wire,
};
use crate::harness::MockLlm;

/// Forty words, a quarter of a second apart: ten seconds of streaming.
const LONG_STORY: &str = "w01 w02 w03 w04 w05 w06 w07 w08 w09 w10 w11 w12 w13 w14 w15 w16 w17 \
     w18 w19 w20 w21 w22 w23 w24 w25 w26 w27 w28 w29 w30 w31 w32 w33 w34 w35 w36 w37 w38 w39 w40";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_cancel_mid_stream_interrupts_the_turn_and_closes_the_request() {
    let mock = MockLlm::start();
    let site = Site::new();
    let wire = Wire::Anthropic;
    let daemon = Daemon::start(&site, wire, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let mut stream = daemon.events(&id, Resume::Now).await;
    expect_snapshot(&mut stream, &id).await;
    mock.push_script(json!([{"endpoint": wire.endpoint(), "text": LONG_STORY, "drip_ms": 250}]))
        .await;
    daemon.send(&id, "tell me a long story").await;
    stream
        .until("a text delta", |frame| frame.is_live("text_delta"))
        .await;

    let reply = daemon.cancel(&id).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    assert_eq!(reply.body["state"], "idle", "{reply:?}");
    stream.until("idle", |frame| frame.is_state("idle")).await;
    assert_eq!(daemon.conversation(&id).await["state"], "idle");

    let log = daemon.log(&id).await;
    let interrupted = of_kind(&log, "turn_interrupted");
    assert_eq!(interrupted.len(), 1, "{log:#?}");
    assert_eq!(interrupted[0]["turn"], 1);
    assert_eq!(interrupted[0]["reason"], "cancelled");
    if let Some(partial) = interrupted[0]["partial_text"].as_str() {
        assert!(LONG_STORY.starts_with(partial), "partial text {partial:?}");
    }
    assert!(of_kind(&log, "turn_completed").is_empty(), "{log:#?}");
    assert_eq!(kind(log.last().unwrap()), "turn_interrupted", "{log:#?}");
    let ended = mock.wait_ended(1).await;
    assert_eq!(ended[0]["outcome"], "disconnected", "the stream was closed");

    // It takes the next message.
    daemon.send(&id, "again").await;
    let log = daemon.wait_turn_done(&id, 2).await;
    // The mock echoes the last user turn, which holds the interrupted
    // message too: the model sees what was asked and never answered.
    let echo = assistant_texts(&log).last().cloned().unwrap();
    assert!(echo.ends_with("again"), "{echo:?}");
    assert_eq!(mock_requests(&mock, 2).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_cancel_mid_tool_kills_its_processes() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    // The mock turns `run: CMD` into a bash call of CMD. Each process says
    // its pid as `/proc/self/stat` has it: `$$` and `$!` are those of the
    // call's PID namespace (docs/sandbox.md).
    daemon
        .send(
            &id,
            "run: read -r pid _ < /proc/self/stat; echo $pid > bash.pid; \
             sh -c 'read -r pid _ < /proc/self/stat; echo $pid > sleep.pid; exec sleep 30' & wait",
        )
        .await;
    let bash: i32 = wait_file(&site.cwd().join("bash.pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    let sleep: i32 = wait_file(&site.cwd().join("sleep.pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(!process_is_gone(bash) && !process_is_gone(sleep));
    assert_eq!(daemon.conversation(&id).await["state"], "executing_tools");

    let reply = daemon.cancel(&id).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    assert_eq!(reply.body["state"], "idle", "{reply:?}");
    wait_process_gone(bash).await;
    wait_process_gone(sleep).await;
    assert_eq!(daemon.conversation(&id).await["state"], "idle");

    let log = daemon.log(&id).await;
    let results = of_kind(&log, "tool_result");
    assert_eq!(results.len(), 1, "one result for the one call: {log:#?}");
    assert_eq!(
        results[0]["synthetic"], true,
        "keel answered the cancelled call"
    );
    let interrupted = of_kind(&log, "turn_interrupted");
    assert_eq!(interrupted.len(), 1, "{log:#?}");
    assert_eq!(interrupted[0]["reason"], "cancelled");
    assert!(of_kind(&log, "turn_completed").is_empty(), "{log:#?}");
}
