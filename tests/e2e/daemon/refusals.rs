//! What a request that is refused leaves behind: nothing. Images that are
//! fine are taken; images that are not get 422. Malformed bodies, unknown
//! fields and conversations, a message while busy, bodies over the limit,
//! empty messages and resolutions that do not fit are refused with their
//! status and the one error shape, and the conversation's whole log is the
//! same after as before.

use std::io::Cursor;

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{assistant_texts, of_kind, Daemon, Reply, Site, Wire};
use crate::harness::MockLlm;

/// A small PNG.
pub(super) fn png(width: u32, height: u32) -> Vec<u8> {
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x * 255 / width) as u8, (y * 255 / height) as u8, 128])
    });
    let mut bytes = Cursor::new(Vec::new());
    image.write_to(&mut bytes, image::ImageFormat::Png).unwrap();
    bytes.into_inner()
}

pub(super) fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn messages(id: &str) -> String {
    format!("/v1/conversations/{id}/messages")
}

/// A conversation that has had one turn, so its log is not trivial.
async fn with_a_turn(daemon: &Daemon, site: &Site, fields: Value) -> String {
    let id = daemon.create(site, fields).await;
    daemon.send(&id, "hello").await;
    let log = daemon.wait_turn_done(&id, 1).await;
    assert_eq!(assistant_texts(&log), ["hello"]);
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_takes_a_valid_image_and_refuses_broken_ones_with_422() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = with_a_turn(&daemon, &site, json!({})).await;
    let before = daemon.log(&id).await;

    let refusals = [
        ("undecodable base64", "@@@ not base64 @@@".to_owned()),
        ("bytes that are no image", base64(b"plain text, not a PNG")),
    ];
    for (what, data) in refusals {
        let reply = daemon
            .post(
                &messages(&id),
                &json!({"text": "look", "images": [{"media_type": "image/png", "data": data}]}),
            )
            .await;
        let (code, message) = reply.error(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(code, "invalid_image", "{what}: {message}");
        assert_eq!(
            daemon.log(&id).await,
            before,
            "{what} left the log as it was"
        );
    }
    assert_eq!(mock.requests().await.len(), 1, "nothing was sent for them");

    let reply = daemon
        .post(
            &messages(&id),
            &json!({"text": "what is this?",
                    "images": [{"media_type": "image/png", "data": base64(&png(8, 6))}]}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let seq = reply.body["seq"].as_u64().unwrap();
    assert_eq!(seq, before.len() as u64 + 1);
    let log = daemon.wait_turn_done(&id, 2).await;
    let message = &log[seq as usize - 1];
    assert_eq!(message["type"], "user_message", "{message:#}");
    assert_eq!(message["text"], "what is this?");
    let images = message["images"].as_array().unwrap();
    assert_eq!(images.len(), 1, "{message:#}");
    assert_eq!(images[0]["media_type"], "image/png");
    assert_eq!(
        (images[0]["width"].as_u64(), images[0]["height"].as_u64()),
        (Some(8), Some(6))
    );
    assert!(!images[0]["hash"].as_str().unwrap().is_empty());
    // The model got the image.
    let requests = mock.wait_ended(2).await;
    let last = requests[1]["body"]["messages"]
        .as_array()
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    assert!(
        last["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|block| block["type"] == "image"),
        "{last:#}"
    );
}

/// `reply` is the refusal `status` with `code`, and the log of `id` is
/// still `before`.
async fn refused(
    daemon: &Daemon,
    id: &str,
    before: &[Value],
    what: &str,
    reply: Reply,
    status: StatusCode,
    code: &str,
) {
    let (got, message) = reply.error(status);
    assert_eq!(got, code, "{what}: {message}");
    assert_eq!(daemon.log(id).await, before, "{what} changed the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_refused_messages_change_nothing() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[]);
    let id = with_a_turn(&daemon, &site, json!({})).await;
    let before = daemon.log(&id).await;
    let path = messages(&id);
    let json = Some("application/json");

    let reply = daemon.post_raw(&path, b"{\"text\": ".to_vec(), json).await;
    refused(
        &daemon,
        &id,
        &before,
        "malformed JSON",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_json",
    )
    .await;
    let reply = daemon
        .post(&path, &json!({"text": "hi", "colour": "red"}))
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "an unknown field",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_json",
    )
    .await;
    let reply = daemon.post(&path, &json!({"text": ""})).await;
    refused(
        &daemon,
        &id,
        &before,
        "an empty message",
        reply,
        StatusCode::BAD_REQUEST,
        "empty_message",
    )
    .await;
    let reply = daemon.post(&path, &json!({})).await;
    refused(
        &daemon,
        &id,
        &before,
        "no text at all",
        reply,
        StatusCode::BAD_REQUEST,
        "empty_message",
    )
    .await;
    let reply = daemon
        .post_raw(&path, br#"{"text": "hi"}"#.to_vec(), None)
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "no content type",
        reply,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    )
    .await;

    // A text one byte over 1 MiB, the default limit of a message's text:
    // the body limit is sized for images and let 20 MiB of text in.
    let default_limit = 1024 * 1024;
    let reply = daemon
        .post(&path, &json!({"text": "a".repeat(default_limit + 1)}))
        .await;
    let (_, message) = reply.error(StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        message.contains("at most 1048576 (KEEL_MAX_MESSAGE_BYTES)"),
        "{message}"
    );
    refused(
        &daemon,
        &id,
        &before,
        "a text over 1 MiB",
        reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;

    // One byte over 64 MiB: the limit of a message's body.
    let limit = 64 * 1024 * 1024;
    let mut body = br#"{"text": ""#.to_vec();
    body.resize(limit + 1 - 2, b'a');
    body.extend_from_slice(b"\"}");
    assert_eq!(body.len(), limit + 1);
    let reply = daemon.post_raw(&path, body, json).await;
    refused(
        &daemon,
        &id,
        &before,
        "a body over 64 MiB",
        reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;

    // Resolutions that fit no pending call.
    let resolve = format!("/v1/conversations/{id}/resolve");
    let reply = daemon.resolve(&id, "toolu_nope", "approve").await;
    refused(
        &daemon,
        &id,
        &before,
        "resolving an unknown call",
        reply,
        StatusCode::NOT_FOUND,
        "unknown_call",
    )
    .await;
    let reply = daemon
        .post(
            &resolve,
            &json!({"tool_call_id": "toolu_nope", "decision": "approve", "text": "x"}),
        )
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "approve with text",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let reply = daemon
        .post(
            &resolve,
            &json!({"tool_call_id": "toolu_nope", "decision": "maybe"}),
        )
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "an unknown decision",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_json",
    )
    .await;

    // Other conversations' ids.
    for unknown in ["c-unknown", "no%20such"] {
        let reply = daemon
            .post(&messages(unknown), &json!({"text": "hi"}))
            .await;
        refused(
            &daemon,
            &id,
            &before,
            "a message to an unknown conversation",
            reply,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        for route in ["", "/log", "/events"] {
            let reply = daemon
                .get(&format!("/v1/conversations/{unknown}{route}"))
                .await;
            refused(
                &daemon,
                &id,
                &before,
                "reading an unknown conversation",
                reply,
                StatusCode::NOT_FOUND,
                "not_found",
            )
            .await;
        }
        let reply = daemon.cancel(unknown).await;
        refused(
            &daemon,
            &id,
            &before,
            "cancelling an unknown conversation",
            reply,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
    }

    // Nothing reached the provider for any of them.
    assert_eq!(mock.requests().await.len(), 1);
    assert_eq!(daemon.conversation(&id).await["state"], "idle");
}

/// `KEEL_MAX_MESSAGE_BYTES` sets the limit of a message's text: a text
/// at it is taken, one byte over is refused with 413 and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_bounds_a_message_text_by_its_setting() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_MAX_MESSAGE_BYTES", "100")],
    );
    let id = with_a_turn(&daemon, &site, json!({})).await;
    let before = daemon.log(&id).await;
    let reply = daemon
        .post(&messages(&id), &json!({"text": "é".repeat(50) + "x"}))
        .await;
    let (_, message) = reply.error(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        message,
        "the message's text is 101 bytes; at most 100 (KEEL_MAX_MESSAGE_BYTES)"
    );
    refused(
        &daemon,
        &id,
        &before,
        "a text over the limit",
        reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    let reply = daemon
        .post(&messages(&id), &json!({"text": "é".repeat(50)}))
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    daemon.wait_turn_done(&id, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_refused_creations_create_nothing() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = with_a_turn(&daemon, &site, json!({})).await;
    let before = daemon.log(&id).await;
    let listed = daemon.get("/v1/conversations").await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.body["conversations"].as_array().unwrap().len(), 1);
    let create = "/v1/conversations";
    let json = Some("application/json");

    let reply = daemon
        .post_raw(create, b"{\"system\": [".to_vec(), json)
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "malformed JSON",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_json",
    )
    .await;
    let reply = daemon.post(create, &json!({"sytsem": "typo"})).await;
    refused(
        &daemon,
        &id,
        &before,
        "an unknown field",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_json",
    )
    .await;
    let reply = daemon.post(create, &json!({"cwd": "relative/dir"})).await;
    refused(
        &daemon,
        &id,
        &before,
        "a relative cwd",
        reply,
        StatusCode::BAD_REQUEST,
        "invalid_cwd",
    )
    .await;
    let missing = site.cwd().join("does-not-exist").display().to_string();
    let reply = daemon.post(create, &json!({"cwd": missing})).await;
    refused(
        &daemon,
        &id,
        &before,
        "a cwd that does not exist",
        reply,
        StatusCode::BAD_REQUEST,
        "invalid_cwd",
    )
    .await;
    let reply = daemon
        .post(create, &json!({"tools": {"bash": "sometimes"}}))
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "an unknown tool policy",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_json",
    )
    .await;
    for (what, body) in [
        ("eleven retries", json!({"retry": {"max_retries": 11}})),
        (
            "a backoff that starts above its ceiling",
            json!({"retry": {"base_delay_ms": 5000, "max_delay_ms": 1000}}),
        ),
        (
            "a fallback with an empty model",
            json!({"fallback": {"provider": "openai", "model": " "}}),
        ),
    ] {
        let reply = daemon.post(create, &body).await;
        refused(
            &daemon,
            &id,
            &before,
            what,
            reply,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    let reply = daemon
        .post(create, &json!({"fallback": {"provider": "nobody"}}))
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "an unknown fallback provider",
        reply,
        StatusCode::BAD_REQUEST,
        "bad_json",
    )
    .await;
    // Over 64 KiB: the limit of every body but a message's.
    let reply = daemon
        .post(create, &json!({"system": "s".repeat(64 * 1024 + 1)}))
        .await;
    refused(
        &daemon,
        &id,
        &before,
        "a body over 64 KiB",
        reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;

    let listed = daemon.get("/v1/conversations").await;
    let conversations = listed.body["conversations"].as_array().unwrap();
    assert_eq!(
        conversations.len(),
        1,
        "no conversation was created: {listed:?}"
    );
    assert_eq!(conversations[0]["id"], id);
    assert_eq!(mock.requests().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_refuses_a_message_while_busy_and_a_resolution_that_does_not_fit() {
    let mock = MockLlm::start();
    let site = Site::new();
    let wire = Wire::Anthropic;
    let daemon = Daemon::start(&site, wire, &mock, &[]);

    // Busy under the default `reject` policy: the request is in flight.
    let busy = with_a_turn(&daemon, &site, json!({})).await;
    mock.push_script(json!([{"endpoint": wire.endpoint(), "hang": true}]))
        .await;
    daemon.send(&busy, "are you there?").await;
    daemon.wait_state(&busy, "streaming").await;
    // The hello, and the request that hangs.
    super::mock_requests(&mock, 2).await;
    let before = daemon.log(&busy).await;
    let reply = daemon
        .post(&messages(&busy), &json!({"text": "hurry up"}))
        .await;
    let (code, message) = reply.error(StatusCode::CONFLICT);
    assert_eq!(code, "busy", "{message}");
    assert!(
        message.contains("cancel"),
        "the refusal says how to cancel: {message}"
    );
    assert_eq!(
        daemon.log(&busy).await,
        before,
        "the refused message left no trace"
    );
    let reply = daemon.resolve(&busy, "toolu_nope", "approve").await;
    refused(
        &daemon,
        &busy,
        &before,
        "resolving no pending call while streaming",
        reply,
        StatusCode::NOT_FOUND,
        "unknown_call",
    )
    .await;
    assert_eq!(daemon.cancel(&busy).await.status, StatusCode::ACCEPTED);

    // Awaiting an approval: `answer` is not a decision an approval takes.
    let gated = daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    daemon.send(&gated, "run: touch gated.txt").await;
    let conversation = daemon.wait_state(&gated, "awaiting_input").await;
    let call = conversation["pending"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = daemon.log(&gated).await;
    let resolve = format!("/v1/conversations/{gated}/resolve");
    let reply = daemon
        .post(
            &resolve,
            &json!({"tool_call_id": call, "decision": "answer", "text": "yes"}),
        )
        .await;
    refused(
        &daemon,
        &gated,
        &before,
        "answering an approval",
        reply,
        StatusCode::CONFLICT,
        "invalid_decision",
    )
    .await;
    let reply = daemon.resolve(&gated, "toolu_nope", "approve").await;
    refused(
        &daemon,
        &gated,
        &before,
        "resolving an unknown call",
        reply,
        StatusCode::NOT_FOUND,
        "unknown_call",
    )
    .await;
    let reply = daemon
        .post(&messages(&gated), &json!({"text": "well?"}))
        .await;
    refused(
        &daemon,
        &gated,
        &before,
        "a message while awaiting input",
        reply,
        StatusCode::CONFLICT,
        "busy",
    )
    .await;
    assert_eq!(daemon.conversation(&gated).await["state"], "awaiting_input");
    assert_eq!(of_kind(&before, "resolved").len(), 0);
    assert!(!site.cwd().join("gated.txt").exists());
}
