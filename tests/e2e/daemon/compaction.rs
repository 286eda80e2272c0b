//! Long conversations through the daemon (docs/compaction.md): the context
//! window and compaction threshold are set at creation and changed with
//! `PATCH /v1/conversations/{id}`, checked like creation and recorded in
//! the log; a refused change records nothing.

use reqwest::StatusCode;
use serde_json::json;

use super::{of_kind, Daemon, Site, Wire};
use crate::harness::MockLlm;

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
