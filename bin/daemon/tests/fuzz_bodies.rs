//! The stand-in, on stable and in CI, for the `request_bodies` fuzz target
//! (`fuzz/`, docs/fuzzing.md): the JSON bodies the daemon reads
//! (`CreateConversation`, `SendMessage`, `ResolveRequest`, through
//! `ApiJson`, which is `serde_json::from_slice`) get arbitrary bytes and
//! made-up JSON built from their own field names with values of any type.
//! Nothing panics, and a body that parses comes back the same through the
//! shape the client reads it with. A `SendMessage`'s images go the way the
//! handler sends them: standard base64 (trimmed), then the runtime's
//! validation (`image::prepare` under the upload limits, what
//! `prepare_uploads` runs for each image), with real images damaged,
//! truncated or declared as another type.
//!
//! With `KEEL_FUZZ_CORPUS=DIR` set, `seed_corpus` writes the target's seeds
//! into `DIR/request_bodies/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use base64::Engine as _;
use keel_actors::image::{prepare, ImageLimits};
use keel_api::types::{CreateConversation, ImageBody, ResolveRequest, SendMessage};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Number, Value};

/// A 4x3 RGB PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGP4z8AARww4OQD1MQv1NXv7ggAAAABJRU5ErkJggg==";
/// A 1x1 GIF.
const GIF: &str = "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAICRAEAOw==";

fn image(base64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(base64)
        .unwrap()
}

/// Field names of the three bodies and of what they nest.
const KEYS: &[&str] = &[
    "cwd",
    "system",
    "provider",
    "model",
    "busy_policy",
    "tools",
    "fallback",
    "retry",
    "max_retries",
    "base_delay_ms",
    "max_delay_ms",
    "retry_after_cap_ms",
    "request_timeout_ms",
    "tools_may_leave_cwd",
    "sandbox",
    "mode",
    "network",
    "text",
    "images",
    "media_type",
    "data",
    "tool_call_id",
    "decision",
    "by",
];

/// Values the bodies' enums and fields take.
const WORDS: &[&str] = &[
    "anthropic",
    "openai",
    "mock",
    "read-only",
    "workspace-write",
    "full-access",
    "all",
    "*:443",
    "reject",
    "interrupt",
    "queue",
    "auto",
    "approve",
    "client",
    "deny",
    "answer",
    "image/png",
    "image/gif",
    "image/jpeg",
    "image/webp",
    "/tmp",
    "",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => any::<String>(),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()].prop_map(Value::from),
        prop_oneof![Just(-1i64), any::<i64>()].prop_map(Value::from),
        any::<f64>().prop_map(|float| Number::from_f64(float).map_or(Value::Null, Value::Number)),
        prop_oneof![
            3 => prop::sample::select(WORDS).prop_map(str::to_owned),
            1 => any::<String>(),
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..5)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An object of the bodies' field names (mostly) holding anything.
fn body() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(key(), json_value(), 0..8)
        .prop_map(|map| Value::Object(map.into_iter().collect()))
}

/// `bytes` parsed as `T`; when it parses, what the daemon would write back
/// (the client reads the same shape) must parse to the same value.
fn check_body<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> Result<Option<T>, TestCaseError> {
    let Ok(parsed) = serde_json::from_slice::<T>(bytes) else {
        return Ok(None);
    };
    let written = serde_json::to_value(&parsed).unwrap();
    let again: T = serde_json::from_value(written.clone()).unwrap();
    prop_assert_eq!(serde_json::to_value(&again).unwrap(), written);
    Ok(Some(parsed))
}

/// Each body type from `bytes`; a `SendMessage`'s images on through the
/// handler's base64 and the runtime's validation.
fn check_bodies(bytes: &[u8]) -> Result<(), TestCaseError> {
    check_body::<CreateConversation>(bytes)?;
    check_body::<ResolveRequest>(bytes)?;
    if let Some(message) = check_body::<SendMessage>(bytes)? {
        for image in message.images {
            check_image(&image);
        }
    }
    Ok(())
}

/// What the handler and `prepare_uploads` do with one image; its verdict
/// is either a prepared image or a problem, and must not be a panic.
fn check_image(image: &ImageBody) -> bool {
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(image.data.trim()) else {
        return false;
    };
    prepare(bytes, &image.media_type, &ImageLimits::for_upload()).is_ok()
}

/// An image's data: a real one, damaged or not, re-encoded; or text that
/// is not base64 at all.
fn image_data() -> impl Strategy<Value = String> {
    let real = prop_oneof![Just(image(PNG)), Just(image(GIF))];
    let damaged = (
        real.clone(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        prop::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(|(mut bytes, overwrites, cut)| {
            for (at, byte) in overwrites {
                let at = at.index(bytes.len());
                bytes[at] = byte;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            bytes
        });
    prop_oneof![
        4 => damaged.prop_map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)),
        1 => prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)),
        1 => any::<String>(),
        1 => real.prop_map(|bytes| {
            format!(" \n{}\t", base64::engine::general_purpose::STANDARD.encode(bytes))
        }),
    ]
}

fn media_type() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(&WORDS[11..15]).prop_map(str::to_owned),
        1 => any::<String>(),
    ]
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn bodies_take_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_bodies(&bytes)?;
    }

    /// Objects of the bodies' own field names holding values of any type,
    /// and the same cut short.
    #[test]
    fn bodies_take_made_up_json(body in body(), cut in any::<prop::sample::Index>()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        check_bodies(&bytes)?;
        check_bodies(&bytes[..cut.index(bytes.len() + 1)])?;
    }

    /// Messages with images, real, damaged, truncated, mislabelled or not
    /// base64.
    #[test]
    fn message_images_are_refused_or_prepared(
        images in prop::collection::vec((media_type(), image_data()), 0..4),
        text in any::<String>(),
    ) {
        let images: Vec<Value> = images
            .into_iter()
            .map(|(media_type, data)| json!({ "media_type": media_type, "data": data }))
            .collect();
        let bytes = serde_json::to_vec(&json!({ "text": text, "images": images })).unwrap();
        check_bodies(&bytes)?;
    }
}

/// The real images the properties damage are accepted intact, padded with
/// whitespace as clients send them, and refused under another media type.
#[test]
fn intact_images_are_prepared() {
    for (media_type, data) in [("image/png", PNG), ("image/gif", GIF)] {
        let padded = format!(" {data}\n");
        assert!(check_image(&ImageBody {
            media_type: media_type.to_owned(),
            data: padded,
        }));
        assert!(!check_image(&ImageBody {
            media_type: "image/webp".to_owned(),
            data: data.to_owned(),
        }));
    }
}

/// The seeds of the `request_bodies` fuzz target: each body type in full
/// and in brief, messages with images, and (after a `0xff` byte) the raw
/// images. Written to `$KEEL_FUZZ_CORPUS/request_bodies/` when set.
#[test]
fn seed_corpus() {
    let bodies = [
        ("create-empty", json!({})),
        (
            "create-full",
            json!({
                "cwd": "/tmp", "system": "Be terse.", "provider": "anthropic",
                "model": "claude-sonnet-4-5", "busy_policy": "queue",
                "tools": { "bash": "approve", "read_file": "auto", "deploy": "client" },
                "fallback": { "provider": "openai", "model": "gpt-4o" },
                "retry": { "max_retries": 5, "base_delay_ms": 500, "max_delay_ms": 20000, "retry_after_cap_ms": 60000 },
                "request_timeout_ms": 120000, "tools_may_leave_cwd": true,
                "sandbox": { "mode": "read-only", "network": ["*:443"] },
            }),
        ),
        ("send-text", json!({ "text": "hello" })),
        (
            "send-images",
            json!({ "text": "what is this?", "images": [
                { "media_type": "image/png", "data": PNG },
                { "media_type": "image/gif", "data": GIF },
                { "media_type": "image/jpeg", "data": "not base64!" },
            ]}),
        ),
        (
            "resolve-approve",
            json!({ "tool_call_id": "toolu_01", "decision": "approve", "by": "alice" }),
        ),
        (
            "resolve-answer",
            json!({ "tool_call_id": "call_1", "decision": "answer", "text": "42" }),
        ),
    ];
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, body) in &bodies {
        let bytes = serde_json::to_vec(body).unwrap();
        let parsed = match name.split('-').next().unwrap() {
            "create" => check_body::<CreateConversation>(&bytes).unwrap().is_some(),
            "send" => check_body::<SendMessage>(&bytes).unwrap().is_some(),
            _ => check_body::<ResolveRequest>(&bytes).unwrap().is_some(),
        };
        assert!(parsed, "{name} does not parse");
        seeds.push((name.to_string(), bytes));
    }
    for (name, data) in [("image-png", PNG), ("image-gif", GIF)] {
        let mut bytes = vec![0xff];
        bytes.extend(image(data));
        seeds.push((name.to_owned(), bytes));
    }

    let Some(corpus) = std::env::var_os("KEEL_FUZZ_CORPUS") else {
        return;
    };
    let dir = PathBuf::from(corpus).join("request_bodies");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
