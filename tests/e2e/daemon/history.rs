//! What a user does to a conversation's history, through the daemon and
//! against the fake provider: compaction on demand (docs/compaction.md),
//! fork and rewind (docs/history.md). What the model is sent afterwards is
//! read from the fake's recording of the requests.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{kind, of_kind, Daemon, Site, Wire};
use crate::harness::MockLlm;

/// The texts of every message in a request body the fake recorded, both
/// wires, as one string.
fn prompt_of(record: &Value) -> String {
    record["body"]["messages"].to_string()
}

/// The request the fake got whose latest user text contains `marker`.
async fn request_with(mock: &MockLlm, marker: &str) -> Value {
    let records = mock.requests().await;
    records
        .into_iter()
        .rev()
        .find(|record| super::last_user_text(record).contains(marker))
        .unwrap_or_else(|| panic!("no request ends with {marker:?}"))
}

/// The seqs of the log's `turn_completed` events: turn boundaries.
fn turn_ends(log: &[Value]) -> Vec<u64> {
    of_kind(log, "turn_completed")
        .iter()
        .filter_map(|event| event["seq"].as_u64())
        .collect()
}

/// Two answered turns, "apple" then "banana"; the log.
async fn apple_then_banana(daemon: &Daemon, id: &str) -> Vec<Value> {
    daemon.send(id, "remember the word apple").await;
    daemon.wait_turn_done(id, 1).await;
    daemon.send(id, "remember the word banana").await;
    daemon.wait_turn_done(id, 2).await
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

async fn compact_on_demand(wire: Wire) {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, wire, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let path = format!("/v1/conversations/{id}/compact");

    daemon.send(&id, "run: echo one").await;
    daemon.wait_turn_done(&id, 1).await;
    let nothing = daemon.post_raw(&path, Vec::new(), None).await;
    assert_eq!(nothing.status, StatusCode::CONFLICT, "{nothing:?}");
    assert_eq!(error_code(&nothing.body), "nothing_to_compact");

    for n in 2..=4 {
        daemon.send(&id, &format!("run: echo turn {n}")).await;
        daemon.wait_turn_done(&id, n).await;
    }
    let before = daemon.conversation(&id).await;
    let accepted = daemon.post_raw(&path, Vec::new(), None).await;
    assert_eq!(
        accepted.status,
        StatusCode::ACCEPTED,
        "{wire:?}: {accepted:?}"
    );
    assert_eq!(accepted.body["state"], "compacting");
    let log = daemon
        .wait_log(&id, "the compaction", |event| kind(event) == "compacted")
        .await;
    let compacted = of_kind(&log, "compacted")[0];
    assert!(compacted["summary"].is_string(), "{compacted}");
    let after = daemon.wait_state(&id, "idle").await;
    assert_eq!(after["turn"], 4, "no turn ran for it");
    let messages = |detail: &Value| detail["messages"].as_array().map_or(0, Vec::len);
    assert!(
        messages(&after) < messages(&before),
        "{wire:?}: {} → {} messages",
        messages(&before),
        messages(&after)
    );
    let last = &after["last_compaction"];
    assert_eq!(last["seq"], compacted["seq"], "{after:#}");
    assert!(
        last["tokens_after"].as_u64() < last["tokens_before"].as_u64(),
        "{last}"
    );
    // The summary request went to the provider; the next turn carries the
    // summary instead of the turns it replaced.
    daemon.send(&id, "and after the compaction?").await;
    daemon.wait_turn_done(&id, 5).await;
    // The summary and turn 4 (a call, its result, the answer), then the
    // new message: turns 1 to 3 are not sent again.
    let request = request_with(&mock, "and after the compaction?").await;
    let prompt = prompt_of(&request);
    assert!(prompt.contains("[keel: the earlier part"), "{prompt}");
    let sent = request["body"]["messages"].as_array().map_or(0, Vec::len);
    assert_eq!(sent, 5, "{wire:?}: {prompt}");

    let unknown = daemon
        .post_raw("/v1/conversations/nobody/compact", Vec::new(), None)
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{unknown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_compacts_on_demand_anthropic() {
    compact_on_demand(Wire::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_compacts_on_demand_openai() {
    compact_on_demand(Wire::OpenAi).await;
}

/// Fork at a boundary: the fork answers from the history up to it, the
/// source is untouched; a seq inside a turn is 422 naming the nearest
/// boundaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_fork_answers_from_the_forked_history_and_leaves_the_source() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let mock = MockLlm::start();
        let site = Site::new();
        let daemon = Daemon::start(&site, wire, &mock, &[]);
        let id = daemon.create(&site, json!({})).await;
        let source_log = apple_then_banana(&daemon, &id).await;
        let ends = turn_ends(&source_log);
        let path = format!("/v1/conversations/{id}/fork");

        let forked = daemon.post(&path, &json!({"at_seq": ends[0]})).await;
        assert_eq!(forked.status, StatusCode::CREATED, "{wire:?}: {forked:?}");
        let fork = forked.body["id"].as_str().expect("an id").to_owned();
        assert_ne!(fork, id);
        assert_eq!(
            forked.body["forked_from"],
            json!({"conversation": id, "seq": ends[0]})
        );

        let fork_log = daemon.log(&fork).await;
        assert_eq!(fork_log.len() as u64, ends[0], "{fork_log:#?}");
        assert_eq!(fork_log[0]["forked_from"]["conversation"], id.as_str());
        let detail = daemon.conversation(&fork).await;
        assert_eq!(detail["forked_from"]["seq"], ends[0]);

        daemon.send(&fork, "which words do you remember?").await;
        daemon.wait_turn_done(&fork, 2).await;
        let prompt = prompt_of(&request_with(&mock, "which words do you remember?").await);
        assert!(prompt.contains("apple"), "{wire:?}: {prompt}");
        assert!(!prompt.contains("banana"), "{wire:?}: {prompt}");
        assert_eq!(daemon.log(&id).await, source_log, "the source changed");

        // Inside turn 2: refused, naming the boundaries around it.
        let inside = ends[0] + 2;
        let refused = daemon.post(&path, &json!({"at_seq": inside})).await;
        assert_eq!(
            refused.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{refused:?}"
        );
        assert_eq!(error_code(&refused.body), "not_a_boundary");
        let message = refused.body["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains(&ends[0].to_string()) && message.contains(&ends[1].to_string()),
            "{message}"
        );
        // No body: at the end of the log.
        let whole = daemon.post_raw(&path, Vec::new(), None).await;
        assert_eq!(whole.status, StatusCode::CREATED, "{whole:?}");
        assert_eq!(whole.body["forked_from"]["seq"], source_log.len() as u64);
        let unknown = daemon
            .post_raw("/v1/conversations/nobody/fork", Vec::new(), None)
            .await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{unknown:?}");
        let malformed = daemon
            .post_raw(
                &path,
                b"{\"at_seq\": \"x\"}".to_vec(),
                Some("application/json"),
            )
            .await;
        assert_eq!(malformed.status, StatusCode::BAD_REQUEST, "{malformed:?}");
    }
}

/// Rewind, then a new message: the model is sent the history up to the
/// boundary only; the log keeps the rewound turn; a restart keeps the
/// rewound prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_rewind_then_a_message_answers_without_the_rewound_turns() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let mock = MockLlm::start();
        let site = Site::new();
        let daemon = Daemon::start(&site, wire, &mock, &[]);
        let id = daemon.create(&site, json!({})).await;
        let log = apple_then_banana(&daemon, &id).await;
        let ends = turn_ends(&log);
        let path = format!("/v1/conversations/{id}/rewind");

        let inside = daemon.post(&path, &json!({"to_seq": ends[0] + 2})).await;
        assert_eq!(
            inside.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{inside:?}"
        );
        assert_eq!(error_code(&inside.body), "not_a_boundary");
        assert_eq!(daemon.log(&id).await, log, "a refusal records nothing");

        let rewound = daemon.post(&path, &json!({"to_seq": ends[0]})).await;
        assert_eq!(rewound.status, StatusCode::OK, "{wire:?}: {rewound:?}");
        assert_eq!(rewound.body, json!({"to_seq": ends[0], "state": "idle"}));
        let after = daemon.log(&id).await;
        let event = of_kind(&after, "rewound");
        assert_eq!(event.len(), 1, "{after:#?}");
        assert_eq!(event[0]["to_seq"], ends[0]);

        daemon.send(&id, "which words do you remember?").await;
        daemon.wait_turn_done(&id, 3).await;
        let prompt = prompt_of(&request_with(&mock, "which words do you remember?").await);
        assert!(prompt.contains("apple"), "{wire:?}: {prompt}");
        assert!(!prompt.contains("banana"), "{wire:?}: {prompt}");
        let log = daemon.log(&id).await;
        assert!(
            log.iter()
                .any(|event| event["text"].as_str() == Some("remember the word banana")),
            "the log keeps the rewound turn"
        );

        // The rewound prompt is the log's: a restart rebuilds it.
        let messages = daemon.conversation(&id).await["messages"].clone();
        let mut daemon = daemon;
        daemon.sigterm();
        daemon.wait_exit();
        let daemon = daemon.restart();
        assert_eq!(daemon.conversation(&id).await["messages"], messages);
    }
}

/// A turn waiting on an approval is called off by a rewind, its call
/// closed, and deciding it afterwards is refused; a rewind while a turn
/// runs is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_rewind_is_refused_mid_turn_and_closes_a_pending_call() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    daemon.send(&id, "hello").await;
    let log = daemon.wait_turn_done(&id, 1).await;
    let boundary = turn_ends(&log)[0];
    let path = format!("/v1/conversations/{id}/rewind");

    daemon.send(&id, "run: rm -rf build").await;
    let waiting = daemon.wait_state(&id, "awaiting_input").await;
    let call = waiting["pending"][0]["tool_call_id"]
        .as_str()
        .expect("a pending call")
        .to_owned();
    let rewound = daemon.post(&path, &json!({"to_seq": boundary})).await;
    assert_eq!(rewound.status, StatusCode::OK, "{rewound:?}");
    let log = daemon.log(&id).await;
    let closed = log.iter().any(|event| {
        kind(event) == "tool_result"
            && event["tool_call_id"] == call.as_str()
            && event["synthetic"] == true
    });
    assert!(closed, "the pending call is closed: {log:#?}");
    assert!(
        log.iter()
            .any(|event| kind(event) == "turn_interrupted" && event["reason"] == "rewound"),
        "{log:#?}"
    );
    // The call is gone from the prompt with its turn: approving it now
    // runs nothing and records nothing.
    let late = daemon.resolve(&id, &call, "approve").await;
    assert_eq!(late.status, StatusCode::NOT_FOUND, "{late:?}");
    assert_eq!(error_code(&late.body), "unknown_call");
    assert_eq!(daemon.log(&id).await, log);

    mock.push_script(json!([{"hang_after_events": 0}])).await;
    daemon.send(&id, "this one hangs").await;
    daemon.wait_state(&id, "streaming").await;
    let busy = daemon.post(&path, &json!({"to_seq": boundary})).await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    assert_eq!(error_code(&busy.body), "busy");
    daemon.cancel(&id).await;
    daemon.wait_state(&id, "idle").await;
}

/// A fork shares the source's images: deleting the source leaves them to
/// the fork, whose next request still carries them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_fork_keeps_its_images_when_the_source_is_deleted() {
    use super::refusals::{base64, png};
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let sent = daemon
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": "look at this", "images": [{"media_type": "image/png", "data": base64(&png(8, 6))}]}),
        )
        .await;
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{sent:?}");
    daemon.wait_turn_done(&id, 1).await;
    let forked = daemon
        .post_raw(&format!("/v1/conversations/{id}/fork"), Vec::new(), None)
        .await;
    assert_eq!(forked.status, StatusCode::CREATED, "{forked:?}");
    let fork = forked.body["id"].as_str().expect("an id").to_owned();

    let deleted = daemon.delete(&format!("/v1/conversations/{id}")).await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
    assert_eq!(deleted.body["blobs_removed"], 0, "{deleted:?}");
    daemon.send(&fork, "what was in it?").await;
    daemon.wait_turn_done(&fork, 2).await;
    let request = request_with(&mock, "what was in it?").await;
    let images: Vec<&Value> = request["body"]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|message| message["content"].as_array().into_iter().flatten())
        .filter(|block| block["type"] == "image")
        .collect();
    assert_eq!(images.len(), 1, "{request:#}");
    assert!(images[0]["source"]["data"].is_string(), "{:#}", images[0]);
}
