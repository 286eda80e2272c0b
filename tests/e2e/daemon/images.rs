//! `GET /v1/conversations/{id}/images/{hash}`: a conversation's stored
//! image as the web console draws it. The bytes come back as they were
//! stored, with their media type and headers that let a browser keep them
//! for good and never sniff them; only a conversation whose log names the
//! hash serves it (a fork's copied history does); a malformed hash, an
//! unknown conversation and a missing token are refused in the API's one
//! error shape; and reading an image wakes no evicted conversation.

use reqwest::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::refusals::{base64, png};
use super::{error_parts, Daemon, Reply, Site, Wire, PATIENCE};
use crate::harness::MockLlm;

fn image_path(id: &str, hash: &str) -> String {
    format!("/v1/conversations/{id}/images/{hash}")
}

/// The images of the conversation's messages, as its detail shows them.
fn shown_images(detail: &Value) -> Vec<Value> {
    detail["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|message| message["content"].as_array().into_iter().flatten())
        .filter(|block| block["type"] == "image")
        .map(|block| block["image"].clone())
        .collect()
}

/// GET `path` with `token` (none: no `Authorization`), the body kept as
/// bytes.
async fn fetch(
    daemon: &Daemon,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let mut request = daemon
        .anonymous()
        .get(daemon.endpoint(path))
        .timeout(PATIENCE);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("the daemon answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("the whole body").to_vec();
    (status, headers, bytes)
}

fn header(headers: &reqwest::header::HeaderMap, name: impl reqwest::header::AsHeaderName) -> &str {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_serves_a_conversations_image_to_it_alone() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let sent = daemon
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": "look at this",
                    "images": [{"media_type": "image/png", "data": base64(&png(8, 6))}]}),
        )
        .await;
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{sent:?}");
    daemon.wait_turn_done(&id, 1).await;
    let detail = daemon.conversation(&id).await;
    let images = shown_images(&detail);
    assert_eq!(images.len(), 1, "{detail:#}");
    let shown = &images[0];
    let hash = shown["hash"].as_str().expect("a hash").to_owned();
    let size = shown["size"].as_u64().expect("a size");

    // Evicted, so the read below would show if it woke the conversation.
    let evicted = daemon
        .post_raw(&format!("/admin/actors/{id}/evict"), Vec::new(), None)
        .await;
    assert_eq!(evicted.status, StatusCode::OK, "{evicted:?}");

    let (status, headers, bytes) =
        fetch(&daemon, &image_path(&id, &hash), Some(&daemon.token)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(header(&headers, CONTENT_TYPE), "image/png");
    assert_eq!(shown["media_type"], "image/png");
    assert_eq!(header(&headers, CONTENT_LENGTH), size.to_string());
    assert_eq!(
        header(&headers, CACHE_CONTROL),
        "private, max-age=31536000, immutable"
    );
    assert_eq!(header(&headers, X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert_eq!(bytes.len() as u64, size);
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(digest, hash, "the bytes are the ones the hash names");
    let decoded = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
        .expect("the bytes are a PNG");
    assert_eq!(
        (u64::from(decoded.width()), u64::from(decoded.height())),
        (
            shown["width"].as_u64().unwrap(),
            shown["height"].as_u64().unwrap()
        )
    );
    assert_eq!(
        daemon.conversation(&id).await["live"],
        false,
        "reading the image woke no actor"
    );

    // A fork's history is its own: it shows the image too.
    let forked = daemon
        .post_raw(&format!("/v1/conversations/{id}/fork"), Vec::new(), None)
        .await;
    assert_eq!(forked.status, StatusCode::CREATED, "{forked:?}");
    let fork = forked.body["id"].as_str().expect("an id").to_owned();
    let (status, _, from_fork) =
        fetch(&daemon, &image_path(&fork, &hash), Some(&daemon.token)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(from_fork, bytes);

    // Another conversation does not serve it, though the store has it.
    let other = daemon.create(&site, json!({})).await;
    daemon.send(&other, "hello").await;
    daemon.wait_turn_done(&other, 1).await;
    let refusals = [
        (
            "another conversation's image",
            image_path(&other, &hash),
            StatusCode::NOT_FOUND,
            "unknown_image",
        ),
        (
            "an image nobody stored",
            image_path(&id, &"0".repeat(64)),
            StatusCode::NOT_FOUND,
            "unknown_image",
        ),
        (
            "an unknown conversation",
            image_path("c-nobody", &hash),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "a hash that is not hex",
            image_path(&id, "not-a-hash"),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "an uppercase hash",
            image_path(&id, &hash.to_uppercase()),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "a hash one digit short",
            image_path(&id, &hash[1..]),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
    ];
    for (what, path, status, code) in refusals {
        let reply: Reply = daemon.get(&path).await;
        let (got, message) = reply.error(status);
        assert_eq!(got, code, "{what}: {message}");
    }
    let reply = daemon.get(&image_path(&other, &hash)).await;
    let (_, message) = reply.error(StatusCode::NOT_FOUND);
    assert!(
        message.contains(&other) && message.contains(&hash),
        "the refusal names the conversation and the image: {message}"
    );

    // Without the token, nothing, not even whether the image exists.
    for token in [None, Some("not-the-token")] {
        let (status, _, body) = fetch(&daemon, &image_path(&id, &hash), token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        let body: Value = serde_json::from_slice(&body).expect("a JSON error");
        assert_eq!(error_parts(&body).0, "unauthorized");
    }
}
