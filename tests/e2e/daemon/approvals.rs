//! Tools that wait for a human: a conversation created with
//! `{"tools": {"bash": "approve"}}` stops at the model's `bash` call with
//! the call pending; approving runs it, denying gives the model an error
//! result. A resolution is recorded exactly once: the same one again
//! answers 200 and changes nothing, a different one answers 409, and so
//! does resolving a call a cancel already settled.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{assistant_texts, of_kind, Daemon, Site, Wire};
use crate::harness::MockLlm;

/// A new conversation whose `bash` calls need approval, stopped at the
/// model's call of `command`; returns its id and the call's id.
async fn awaiting_approval(daemon: &Daemon, site: &Site, command: &str) -> (String, String) {
    let id = daemon
        .create(site, json!({"tools": {"bash": "approve"}}))
        .await;
    // The mock turns `run: CMD` into a bash call of CMD.
    daemon.send(&id, &format!("run: {command}")).await;
    let conversation = daemon.wait_state(&id, "awaiting_input").await;
    let pending = conversation["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{conversation:#}");
    assert_eq!(pending[0]["kind"], "approval");
    assert_eq!(pending[0]["name"], "bash");
    assert_eq!(pending[0]["input"]["command"], command);
    let call = pending[0]["tool_call_id"].as_str().unwrap().to_owned();
    (id, call)
}

fn resolved_for<'a>(log: &'a [Value], call: &str) -> Vec<&'a Value> {
    of_kind(log, "resolved")
        .into_iter()
        .filter(|event| event["tool_call_id"] == call)
        .collect()
}

fn results_for<'a>(log: &'a [Value], call: &str) -> Vec<&'a Value> {
    of_kind(log, "tool_result")
        .into_iter()
        .filter(|event| event["tool_call_id"] == call)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_approving_a_call_runs_it() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let (id, call) = awaiting_approval(
        &daemon,
        &site,
        "echo approved-by-a-human | tee approved.txt",
    )
    .await;
    assert!(!site.cwd().join("approved.txt").exists(), "nothing ran yet");

    let reply = daemon.resolve(&id, &call, "approve").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(
        reply.body,
        json!({"tool_call_id": call, "decision": "approve"})
    );
    let log = daemon.wait_turn_done(&id, 1).await;

    let written = std::fs::read_to_string(site.cwd().join("approved.txt")).unwrap();
    assert_eq!(written, "approved-by-a-human\n");
    let suspended = of_kind(&log, "suspended");
    assert_eq!(suspended.len(), 1, "{log:#?}");
    assert_eq!(suspended[0]["pending"][0]["tool_call_id"], call);
    let resolved = resolved_for(&log, &call);
    assert_eq!(resolved.len(), 1, "{log:#?}");
    assert_eq!(resolved[0]["decision"], "approve");
    let results = results_for(&log, &call);
    assert_eq!(results.len(), 1, "{log:#?}");
    assert_eq!(results[0]["is_error"], false);
    assert!(results[0]["content"]
        .as_str()
        .unwrap()
        .contains("approved-by-a-human"));
    assert_eq!(of_kind(&log, "turn_completed").len(), 1, "{log:#?}");
    assert_eq!(
        assistant_texts(&log).last().map(String::as_str),
        Some("The command printed: approved-by-a-human")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_denying_a_call_gives_the_model_an_error_result() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[]);
    let (id, call) = awaiting_approval(&daemon, &site, "touch denied.txt").await;

    let reply = daemon.resolve(&id, &call, "deny").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(
        reply.body,
        json!({"tool_call_id": call, "decision": "deny"})
    );
    let log = daemon.wait_turn_done(&id, 1).await;

    assert!(
        !site.cwd().join("denied.txt").exists(),
        "a denied call never runs"
    );
    let resolved = resolved_for(&log, &call);
    assert_eq!(resolved.len(), 1, "{log:#?}");
    assert_eq!(resolved[0]["decision"], "deny");
    let results = results_for(&log, &call);
    assert_eq!(results.len(), 1, "{log:#?}");
    assert_eq!(results[0]["is_error"], true, "{log:#?}");
    assert_eq!(results[0]["synthetic"], false);
    // The model was told: the mock summarises a failed result so.
    let reply = assistant_texts(&log).last().cloned().unwrap();
    assert!(reply.starts_with("The command failed"), "{reply:?}");
    let requests = mock.wait_ended(2).await;
    assert!(
        requests[1]["body"].to_string().contains("denied"),
        "{:#}",
        requests[1]
    );
}

/// Resolve the call `first`, let the turn end, then resolve it the same
/// way again (200, nothing recorded) and the other way (409, nothing
/// recorded).
async fn resolved_once(wire: Wire, first: &str, other: &str) {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, wire, &mock, &[]);
    let (id, call) = awaiting_approval(&daemon, &site, "echo ran >> runs.txt").await;
    let reply = daemon.resolve(&id, &call, first).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let settled = daemon.wait_turn_done(&id, 1).await;

    let again = daemon.resolve(&id, &call, first).await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "the same resolution again: {again:?}"
    );
    assert_eq!(again.body, json!({"tool_call_id": call, "decision": first}));
    assert_eq!(
        daemon.log(&id).await,
        settled,
        "the repeat recorded nothing"
    );

    let otherwise = daemon.resolve(&id, &call, other).await;
    let (code, message) = otherwise.error(StatusCode::CONFLICT);
    assert_eq!(daemon.log(&id).await, settled, "{code}: {message}");

    assert_eq!(resolved_for(&settled, &call).len(), 1, "{settled:#?}");
    assert_eq!(results_for(&settled, &call).len(), 1, "{settled:#?}");
    let runs = std::fs::read_to_string(site.cwd().join("runs.txt")).unwrap_or_default();
    let expected_runs = usize::from(first == "approve");
    assert_eq!(runs.lines().count(), expected_runs, "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_an_approval_is_recorded_once_and_a_denial_after_it_conflicts() {
    resolved_once(Wire::Anthropic, "approve", "deny").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_a_denial_is_recorded_once_and_an_approval_after_it_conflicts() {
    resolved_once(Wire::OpenAi, "deny", "approve").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_resolving_a_call_a_cancel_settled_conflicts() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let (id, call) = awaiting_approval(&daemon, &site, "touch never.txt").await;
    let reply = daemon.cancel(&id).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    assert_eq!(reply.body["state"], "idle");
    let settled = daemon.log(&id).await;

    for decision in ["approve", "deny"] {
        let late = daemon.resolve(&id, &call, decision).await;
        let (code, message) = late.error(StatusCode::CONFLICT);
        assert_eq!(
            daemon.log(&id).await,
            settled,
            "{decision}: {code}: {message}"
        );
    }
    assert!(!site.cwd().join("never.txt").exists(), "the call never ran");
    // The cancel settled the call: one (synthetic) result, and no second
    // outcome from the late resolutions.
    let results = results_for(&settled, &call);
    assert_eq!(results.len(), 1, "{settled:#?}");
    assert_eq!(results[0]["synthetic"], true);
    assert!(resolved_for(&settled, &call).len() <= 1, "{settled:#?}");
    assert_eq!(daemon.conversation(&id).await["state"], "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_records_who_resolved_a_call_and_refuses_an_overlong_name() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[]);
    let (id, call) = awaiting_approval(&daemon, &site, "echo audited").await;
    let before = daemon.log(&id).await;

    let overlong = daemon
        .post(
            &format!("/v1/conversations/{id}/resolve"),
            &json!({"tool_call_id": call, "decision": "approve", "by": "x".repeat(10_000)}),
        )
        .await;
    let (code, _) = overlong.error(StatusCode::BAD_REQUEST);
    assert_eq!(code, "resolved_by_too_long");
    assert_eq!(
        daemon.log(&id).await,
        before,
        "a refused resolve changes nothing"
    );

    let reply = daemon
        .post(
            &format!("/v1/conversations/{id}/resolve"),
            &json!({"tool_call_id": call, "decision": "deny", "by": "ada@ops"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let log = daemon.wait_turn_done(&id, 1).await;
    let resolved = resolved_for(&log, &call);
    assert_eq!(resolved.len(), 1, "{log:#?}");
    assert_eq!(resolved[0]["decision"], "deny");
    assert_eq!(resolved[0]["by"], "ada@ops");
}
