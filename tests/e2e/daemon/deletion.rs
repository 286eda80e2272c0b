//! `DELETE /v1/conversations/{id}` through the daemon: a conversation and
//! its sub-agents go, and their ids answer 404 everywhere after; a busy one
//! is refused (nothing deleted) unless `?force=true`, which cancels it.

use reqwest::StatusCode;
use serde_json::json;

use super::{Daemon, Site, Wire};
use crate::harness::MockLlm;

/// Every route of `id` answers 404 `not_found`.
async fn gone(daemon: &Daemon, id: &str) {
    let path = format!("/v1/conversations/{id}");
    for reply in [
        daemon.get(&path).await,
        daemon.get(&format!("{path}/log")).await,
        daemon
            .post(&format!("{path}/messages"), &json!({"text": "hello?"}))
            .await,
        daemon.post(&format!("{path}/cancel"), &json!({})).await,
        daemon.patch(&path, &json!({"max_tokens": 10})).await,
        daemon.delete(&path).await,
    ] {
        let (code, message) = reply.error(StatusCode::NOT_FOUND);
        assert_eq!(code, "not_found", "{message}");
    }
}

async fn listed(daemon: &Daemon) -> Vec<String> {
    let reply = daemon.get("/v1/conversations?all=true").await;
    reply.body["conversations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| entry["id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_deletes_a_conversation_and_its_sub_agents() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let kept = daemon.create(&site, json!({})).await;
    daemon.send(&kept, "stay").await;
    daemon.wait_turn_done(&kept, 1).await;
    let kept_log = daemon.log(&kept).await;

    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "run: echo hello").await;
    daemon.wait_turn_done(&id, 1).await;
    daemon.send(&id, "spawn: first task | second task").await;
    daemon.wait_turn_done(&id, 2).await;
    let children: Vec<String> = {
        let reply = daemon.get("/v1/conversations?all=true").await;
        reply.body["conversations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|entry| entry["parent"] == id.as_str())
            .filter_map(|entry| entry["id"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(children.len(), 2, "two sub-agents ran");

    let reply = daemon.delete(&format!("/v1/conversations/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let deleted: Vec<&str> = reply.body["deleted"]
        .as_array()
        .expect("deleted")
        .iter()
        .filter_map(|id| id.as_str())
        .collect();
    assert_eq!(deleted.len(), 3, "{reply:?}");
    assert_eq!(deleted.last(), Some(&id.as_str()), "the parent goes last");
    for child in &children {
        assert!(deleted.contains(&child.as_str()), "{child} went with it");
    }
    assert!(reply.body["events"].as_u64() > Some(10), "{reply:?}");
    for gone_id in children.iter().chain([&id]) {
        gone(&daemon, gone_id).await;
    }
    assert_eq!(listed(&daemon).await, vec![kept.clone()]);
    assert_eq!(
        daemon.log(&kept).await,
        kept_log,
        "the other one is untouched"
    );

    // After a restart too.
    let daemon = {
        let daemon = daemon;
        daemon.sigterm();
        daemon.restart()
    };
    gone(&daemon, &id).await;
    assert_eq!(listed(&daemon).await, vec![kept]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_refuses_to_delete_a_busy_conversation_unless_forced() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[]);
    let id = daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    daemon.send(&id, "run: echo waiting").await;
    daemon.wait_state(&id, "awaiting_input").await;
    let before = daemon.log(&id).await;

    let path = format!("/v1/conversations/{id}");
    let refused = daemon.delete(&path).await;
    let (code, message) = refused.error(StatusCode::CONFLICT);
    assert_eq!(code, "busy", "{message}");
    assert_eq!(daemon.log(&id).await, before, "nothing was deleted");

    let bad = daemon.delete(&format!("{path}?force=maybe")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");

    let forced = daemon.delete(&format!("{path}?force=true")).await;
    assert_eq!(forced.status, StatusCode::OK, "{forced:?}");
    gone(&daemon, &id).await;
}

/// `KEEL_RETENTION_DAYS`: a conversation untouched for longer is deleted by
/// the daemon's background sweep (here a retention of about a second and a
/// half, so the sweep runs every second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_deletes_conversations_past_their_retention() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_RETENTION_DAYS", "0.00002")],
    );
    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "hello").await;
    daemon.wait_turn_done(&id, 1).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let reply = daemon.get(&format!("/v1/conversations/{id}")).await;
        if reply.status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still there after 30 s: {reply:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    gone(&daemon, &id).await;
    assert!(listed(&daemon).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_refuses_a_retention_that_is_not_a_number_of_days() {
    let site = Site::new();
    let mut env = super::base_env(&site);
    env.push(("KEEL_RETENTION_DAYS".to_owned(), "forever".to_owned()));
    let output = std::process::Command::new(crate::harness::keel_bin())
        .arg("serve")
        .envs(env)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("KEEL_RETENTION_DAYS"), "{said}");
}

/// Deleting conversations frees space in the store; `POST /admin/reclaim`
/// gives it back to the disk (redb compacts its file), and what is left is
/// all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_reclaims_the_space_deleted_conversations_took() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let mut ids = Vec::new();
    for _ in 0..12 {
        let id = daemon.create(&site, json!({})).await;
        for turn in 1..=3 {
            daemon
                .send(
                    &id,
                    "run: for i in $(seq 1 400); do echo \"line $i of a long build log\"; done",
                )
                .await;
            daemon.wait_turn_done(&id, turn).await;
        }
        ids.push(id);
    }
    let kept = ids.pop().expect("one is kept");
    let kept_log = daemon.log(&kept).await;
    for id in &ids {
        let reply = daemon.delete(&format!("/v1/conversations/{id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    let reply = daemon.post("/admin/reclaim", &json!({})).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["action"], "compacted", "{reply:?}");
    let before = reply.body["disk_bytes_before"].as_u64().expect("a size");
    let after = reply.body["disk_bytes_after"].as_u64().expect("a size");
    assert!(after < before, "{before} → {after}");
    assert_eq!(daemon.log(&kept).await, kept_log);
    daemon.send(&kept, "still here?").await;
    daemon.wait_turn_done(&kept, 4).await;
}
