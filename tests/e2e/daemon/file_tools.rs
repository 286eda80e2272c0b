//! The file tools' confinement over HTTP: `tools_may_leave_cwd` in the
//! create request reaches the conversation's config (and its detail), and
//! decides whether a `read_file` of `../` is refused or served.

use serde_json::{json, Value};

use super::{of_kind, Daemon, Site, Wire};
use crate::harness::MockLlm;

/// Create a conversation with `fields`, have the scripted model read
/// `../outside.txt` in it, and return the detail's flag and the result.
async fn read_outside(
    daemon: &Daemon,
    site: &Site,
    mock: &MockLlm,
    fields: Value,
) -> (Value, Value) {
    let id = daemon.create(site, fields).await;
    let detail = daemon.conversation(&id).await;
    mock.push_script(json!([
        {"endpoint": "anthropic",
         "tool_calls": [{"name": "read_file", "input": {"path": "../outside.txt"}}]},
        {"endpoint": "anthropic", "text": "read it"},
    ]))
    .await;
    daemon.send(&id, "read the file next door").await;
    let log = daemon.wait_turn_done(&id, 1).await;
    let results = of_kind(&log, "tool_result");
    assert_eq!(results.len(), 1, "{log:#?}");
    (detail["tools_may_leave_cwd"].clone(), results[0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_file_tools_leave_the_cwd_only_when_the_conversation_allows() {
    let mock = MockLlm::start();
    let site = Site::new();
    std::fs::write(
        site.cwd().parent().unwrap().join("outside.txt"),
        "next door\n",
    )
    .unwrap();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);

    let (flag, result) = read_outside(&daemon, &site, &mock, json!({})).await;
    assert_eq!(flag, json!(false));
    assert_eq!(result["is_error"], json!(true), "{result}");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("outside the working directory"),
        "{result}"
    );

    let (flag, result) =
        read_outside(&daemon, &site, &mock, json!({"tools_may_leave_cwd": true})).await;
    assert_eq!(flag, json!(true));
    assert_eq!(result["is_error"], json!(false), "{result}");
    assert_eq!(result["content"], json!("     1\tnext door\n"));
}
