//! The Anthropic wire format against hand-recorded streams and request
//! bodies.
//!
//! Each `tests/data/anthropic/NAME.sse` is a response stream as it comes off
//! the socket; `NAME.expected.json` holds the deltas the decoder must emit
//! and how the stream must end. A tiny SSE frame splitter below stands in
//! for the SSE parser keel-actors uses in production (sseer), so the
//! same files also check that the decoded result does not depend on where
//! the network cut the bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_core::message::{ContentBlock, ImageRef, Message, Role, ToolCall, ToolResult};
use keel_core::wire::anthropic::{encode_request, encode_request_bytes, Decoder};
use keel_core::wire::{
    EncodeError, ImageData, PromptRequest, SseEvent, StreamDecoder, ToolSpec, ToolSpecs,
};
use keel_core::{AssistantResponse, LlmFailure, StreamDelta, ToolCallId};
use serde::Serialize;
use serde_json::{json, Value};

const SAMPLES: [&str; 7] = [
    "text_only",
    "tool_use",
    "thinking",
    "error_after_text",
    "pings",
    "missing_message_stop",
    "unknown_blocks",
];

// ---------------------------------------------------------------------------
// A test-only SSE frame splitter.

/// One server-sent event: its `event:` field and its `data:` lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    event: String,
    data: String,
}

/// Accumulates bytes as they arrive and yields only complete frames (those
/// ended by a blank line), so a chunk boundary may fall anywhere, inside a
/// line or inside a UTF-8 character, without changing what is decoded.
#[derive(Default)]
struct FrameSplitter {
    buffer: Vec<u8>,
}

impl FrameSplitter {
    fn push(&mut self, chunk: &[u8]) -> Vec<Frame> {
        // `\r` never appears raw inside JSON, so dropping it turns CRLF
        // line ends into LF ones.
        self.buffer
            .extend(chunk.iter().copied().filter(|byte| *byte != b'\r'));
        let mut frames = Vec::new();
        while let Some(end) = self
            .buffer
            .windows(2)
            .position(|pair| pair == b"\n\n".as_slice())
        {
            let raw: Vec<u8> = self.buffer.drain(..end + 2).collect();
            let text = std::str::from_utf8(&raw[..end]).expect("a complete frame is UTF-8");
            frames.extend(parse_frame(text));
        }
        frames
    }
}

/// Reads `event:` and `data:` fields; a frame without data (a lone comment)
/// dispatches nothing, as in the SSE specification.
fn parse_frame(text: &str) -> Option<Frame> {
    let mut event = String::new();
    let mut data = Vec::new();
    for line in text.split('\n') {
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut event),
            "data" => data.push(value),
            _ => {}
        }
    }
    if data.is_empty() {
        return None;
    }
    Some(Frame {
        event,
        data: data.join("\n"),
    })
}

fn frames_in_chunks(bytes: &[u8], cuts: impl IntoIterator<Item = usize>) -> Vec<Frame> {
    let mut splitter = FrameSplitter::default();
    let mut frames = Vec::new();
    let mut start = 0;
    for cut in cuts.into_iter().chain([bytes.len()]) {
        frames.extend(splitter.push(&bytes[start..cut]));
        start = cut;
    }
    assert!(
        splitter.buffer.iter().all(u8::is_ascii_whitespace),
        "a sample ends with a partial frame"
    );
    frames
}

// ---------------------------------------------------------------------------
// Decoding a whole stream.

/// Everything a stream produced, as the golden files spell it.
#[derive(Debug, PartialEq, Serialize)]
struct Outcome {
    deltas: Vec<StreamDelta>,
    /// The frame whose `feed` failed; feeding stops there, as it does in the
    /// shell.
    failed_at: Option<usize>,
    complete: bool,
    ending: Ending,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Ending {
    Response(AssistantResponse),
    Failure(LlmFailure),
}

fn decode(frames: &[Frame]) -> Outcome {
    let mut decoder: Box<dyn StreamDecoder> = Box::new(Decoder::new("claude-requested"));
    let mut deltas = Vec::new();
    let mut failed = None;
    for (index, frame) in frames.iter().enumerate() {
        let event = SseEvent {
            event: &frame.event,
            data: &frame.data,
        };
        match decoder.feed(event) {
            Ok(more) => deltas.extend(more),
            Err(failure) => {
                failed = Some((index, failure));
                break;
            }
        }
    }
    let complete = decoder.is_complete();
    let ending = match decoder.finish() {
        Ok(response) => Ending::Response(response),
        Err(failure) => Ending::Failure(failure),
    };
    if let Some((_, failure)) = &failed {
        assert_eq!(
            ending,
            Ending::Failure(failure.clone()),
            "finish reports the failure feed reported"
        );
    }
    Outcome {
        deltas,
        failed_at: failed.map(|(index, _)| index),
        complete,
        ending,
    }
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/anthropic")
}

fn sample(name: &str) -> Vec<u8> {
    let path = data_dir().join(format!("{name}.sse"));
    std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn expected(name: &str) -> Value {
    let path = data_dir().join(format!("{name}.expected.json"));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn decode_whole(name: &str) -> Outcome {
    decode(&frames_in_chunks(&sample(name), []))
}

fn check_golden(name: &str) {
    let actual = serde_json::to_value(decode_whole(name)).unwrap();
    let expected = expected(name);
    assert!(
        actual == expected,
        "{name}: decoded\n{}\nbut {name}.expected.json says\n{}",
        serde_json::to_string_pretty(&actual).unwrap(),
        serde_json::to_string_pretty(&expected).unwrap(),
    );
}

#[test]
fn golden_text_only() {
    check_golden("text_only");
}

#[test]
fn golden_text_and_tool_use_with_split_input() {
    check_golden("tool_use");
}

#[test]
fn golden_thinking_with_signature() {
    check_golden("thinking");
}

#[test]
fn golden_error_event_after_some_text() {
    check_golden("error_after_text");
}

#[test]
fn golden_pings_anywhere() {
    check_golden("pings");
}

#[test]
fn golden_stream_missing_message_stop() {
    check_golden("missing_message_stop");
}

#[test]
fn golden_unknown_blocks_deltas_and_events_are_skipped() {
    check_golden("unknown_blocks");
}

#[test]
fn every_sample_is_covered_by_a_golden_file() {
    let mut on_disk: Vec<String> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter_map(|name| name.strip_suffix(".sse").map(str::to_owned))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = SAMPLES.iter().map(|name| (*name).to_owned()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

// ---------------------------------------------------------------------------
// Chunking.

#[test]
fn a_cut_at_any_byte_decodes_the_same() {
    for name in SAMPLES {
        let bytes = sample(name);
        let whole = decode_whole(name);
        for cut in 1..bytes.len() {
            let outcome = decode(&frames_in_chunks(&bytes, [cut]));
            assert_eq!(outcome, whole, "{name} cut at byte {cut}");
        }
    }
}

#[test]
fn small_chunks_of_every_size_decode_the_same() {
    for name in SAMPLES {
        let bytes = sample(name);
        let whole = decode_whole(name);
        for size in 1..=13 {
            let cuts = (size..bytes.len()).step_by(size);
            let outcome = decode(&frames_in_chunks(&bytes, cuts));
            assert_eq!(outcome, whole, "{name} in chunks of {size} bytes");
        }
    }
}

#[test]
fn the_samples_put_cuts_inside_multi_byte_characters() {
    let text = String::from_utf8(sample("text_only")).unwrap();
    assert!(text.contains("héllo ✓ 日本"));
    let inside = (1..text.len())
        .filter(|cut| !text.is_char_boundary(*cut))
        .count();
    // é (1 inner boundary), ✓ (2), 日 and 本 (2 each), ö (1), 🦀 (3).
    assert_eq!(inside, 11);
}

#[test]
fn the_splitter_reads_fields_like_an_sse_client() {
    let mut splitter = FrameSplitter::default();
    let frames = splitter.push(
        b"event: a\ndata: one\ndata:two\n\n: comment only\n\ndata: {}\r\n\r\nevent: b\ndata: cut",
    );
    // The last frame has no blank line yet: it waits for more bytes.
    assert_eq!(splitter.buffer, b"event: b\ndata: cut");
    assert_eq!(
        frames,
        vec![
            Frame {
                event: "a".to_owned(),
                data: "one\ntwo".to_owned()
            },
            Frame {
                event: String::new(),
                data: "{}".to_owned()
            },
        ]
    );
}

// ---------------------------------------------------------------------------
// Encoding.

fn text(text: &str) -> ContentBlock {
    ContentBlock::Text {
        text: text.to_owned(),
    }
}

fn request<'a>(
    messages: &'a [Message],
    tools: &'a ToolSpecs,
    images: &'a BTreeMap<String, ImageData>,
    system: Option<&'a str>,
) -> PromptRequest<'a> {
    PromptRequest {
        model: "claude-sonnet-4-5",
        system,
        messages,
        tools,
        max_tokens: 4096,
        images,
    }
}

#[test]
fn encode_a_text_conversation() {
    let messages = [
        Message {
            role: Role::User,
            content: vec![text("Hello, Claude")],
        },
        Message {
            role: Role::Assistant,
            content: vec![text("Hello!")],
        },
        Message {
            role: Role::User,
            content: vec![text("Two"), text("blocks")],
        },
    ];
    let images = BTreeMap::new();
    let body = encode_request(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(
        body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hello, Claude"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Two"},
                    {"type": "text", "text": "blocks"},
                ]},
            ],
            "stream": true,
        })
    );
}

fn image_ref(hash: &str, media_type: &str) -> ImageRef {
    ImageRef {
        hash: hash.to_owned(),
        media_type: media_type.to_owned(),
        width: 64,
        height: 48,
        size: 1234,
    }
}

#[test]
fn encode_images_as_base64_sources() {
    let messages = [Message {
        role: Role::User,
        content: vec![
            text("What is in these?"),
            ContentBlock::Image {
                image: image_ref("aa11", "image/png"),
            },
            ContentBlock::Image {
                image: image_ref("bb22", "image/jpeg"),
            },
        ],
    }];
    let mut images = BTreeMap::new();
    images.insert(
        "aa11".to_owned(),
        ImageData {
            media_type: "image/png".to_owned(),
            base64: "iVBORw0KGgo=".to_owned(),
        },
    );
    images.insert(
        "bb22".to_owned(),
        ImageData {
            media_type: "image/jpeg".to_owned(),
            base64: "/9j/4AAQSkZJRg==".to_owned(),
        },
    );
    let body = encode_request(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=",
            }},
            {"type": "image", "source": {
                "type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQSkZJRg==",
            }},
        ]}])
    );

    images.remove("bb22");
    assert_eq!(
        encode_request(&request(&messages, &ToolSpecs::default(), &images, None)),
        Err(EncodeError::MissingImage {
            hash: "bb22".to_owned()
        })
    );
}

#[test]
fn encode_tool_use_and_tool_results() {
    let call = |id: &str, name: &str, input: Value| ContentBlock::ToolUse {
        call: ToolCall {
            id: ToolCallId::new(id),
            name: name.to_owned(),
            input,
        },
    };
    let result = |id: &str, content: &str, is_error: bool| ContentBlock::ToolResult {
        result: ToolResult {
            tool_call_id: ToolCallId::new(id),
            content: content.to_owned(),
            is_error,
            images: Vec::new(),
        },
    };
    let messages = [
        Message {
            role: Role::User,
            content: vec![text("Weather in Paris and Oslo?")],
        },
        Message {
            role: Role::Assistant,
            content: vec![
                ContentBlock::Thinking {
                    text: "Two cities, two calls.".to_owned(),
                    signature: Some("EqQBCgIYAh".to_owned()),
                },
                text("Checking both."),
                call("toolu_01", "get_weather", json!({"city": "Paris"})),
                call("toolu_02", "get_weather", json!({"city": "Oslo"})),
            ],
        },
        Message {
            role: Role::User,
            content: vec![
                result("toolu_01", "18°C, clear", false),
                result("toolu_02", "weather service timed out", true),
            ],
        },
    ];
    let images = BTreeMap::new();
    let body = encode_request(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Two cities, two calls.", "signature": "EqQBCgIYAh"},
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18°C, clear", "is_error": false},
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": "weather service timed out", "is_error": true},
            ]},
        ])
    );
}

#[test]
fn a_tool_results_images_go_inside_the_result_after_its_text() {
    let result = |id: &str, content: &str, hashes: &[&str]| ContentBlock::ToolResult {
        result: ToolResult {
            tool_call_id: ToolCallId::new(id),
            content: content.to_owned(),
            is_error: false,
            images: hashes
                .iter()
                .map(|hash| image_ref(hash, "image/png"))
                .collect(),
        },
    };
    let messages = [Message {
        role: Role::User,
        content: vec![
            result("toolu_01", "the screen:", &["aa11"]),
            result("toolu_02", "", &["aa11"]),
            result("toolu_03", "no picture", &[]),
        ],
    }];
    let mut images = BTreeMap::new();
    images.insert(
        "aa11".to_owned(),
        ImageData {
            media_type: "image/png".to_owned(),
            base64: "iVBORw0KGgo=".to_owned(),
        },
    );
    let body = encode_request(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    let png = json!({"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=",
    }});
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": false, "content": [
                {"type": "text", "text": "the screen:"},
                png,
            ]},
            // No empty text block: the API refuses those.
            {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": false, "content": [png]},
            {"type": "tool_result", "tool_use_id": "toolu_03", "is_error": false, "content": "no picture"},
        ]}])
    );

    images.clear();
    assert_eq!(
        encode_request(&request(&messages, &ToolSpecs::default(), &images, None)),
        Err(EncodeError::MissingImage {
            hash: "aa11".to_owned()
        })
    );
}

#[test]
fn encode_system_and_tools() {
    let messages = [Message {
        role: Role::User,
        content: vec![text("List the files")],
    }];
    let tools: ToolSpecs = vec![
        ToolSpec {
            name: "list_files".to_owned(),
            description: "List the files of a directory.".to_owned(),
            input_schema: json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            }),
        },
        ToolSpec {
            name: "now".to_owned(),
            description: "The current time.".to_owned(),
            input_schema: json!({"type": "object", "properties": {}}),
        },
    ]
    .into();
    let images = BTreeMap::new();
    let body = encode_request(&request(
        &messages,
        &tools,
        &images,
        Some("You are a careful assistant."),
    ))
    .unwrap();
    assert_eq!(
        body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "system": "You are a careful assistant.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "List the files"}]},
            ],
            "tools": [
                {
                    "name": "list_files",
                    "description": "List the files of a directory.",
                    "input_schema": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}},
                        "required": ["path"],
                    },
                },
                {
                    "name": "now",
                    "description": "The current time.",
                    "input_schema": {"type": "object", "properties": {}},
                },
            ],
            "stream": true,
        })
    ); // The tools are encoded once and kept: a second request with the same
       // list writes the same bytes, which say what the first one said.
    let prompt = request(
        &messages,
        &tools,
        &images,
        Some("You are a careful assistant."),
    );
    let first = encode_request_bytes(&prompt).unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&first).unwrap(),
        body
    );
    assert_eq!(encode_request_bytes(&prompt).unwrap(), first);
}

#[test]
fn a_decoded_response_encodes_back_as_the_next_request_expects() {
    let Ending::Response(response) = decode_whole("thinking").ending else {
        panic!("the thinking sample decodes to a response");
    };
    let messages = [
        Message {
            role: Role::User,
            content: vec![text("What is 27 * 453?")],
        },
        Message {
            role: Role::Assistant,
            content: response
                .blocks
                .iter()
                .map(|block| block.to_content())
                .collect(),
        },
    ];
    let images = BTreeMap::new();
    let body = encode_request(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(&messages, &ToolSpecs::default(), &images, None)).unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(
        body["messages"][1]["content"][0],
        json!({
            "type": "thinking",
            "thinking": "Let me solve this step by step:\n\n1. 27 * 453\n2. 27 * 400 + 27 * 53 = 10,800 + 1,431 = 12,231",
            "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds0123456789==",
        })
    );
}
