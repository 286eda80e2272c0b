//! Golden tests of the OpenAI Chat Completions wire format: hand-written
//! streams in `tests/data/openai/*.sse` (one per server behaviour) decoded
//! through `keel_core::wire::openai::Decoder`, the same bytes re-chunked at
//! every boundary, and request bodies built by `encode_request`.
//!
//! The SSE framing is keel-actors' job; a tiny splitter here stands in for it
//! (blank-line-separated frames, `data:` lines; OpenAI sends no `event:`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use keel_core::ids::ToolCallId;
use keel_core::message::{
    AssistantBlock, ContentBlock, ImageRef, Message, Role, StopReason, ToolCall, ToolResult, Usage,
};
use keel_core::wire::openai::{encode_request, encode_request_bytes, Decoder};
use keel_core::wire::{
    EncodeError, ImageData, PromptRequest, SseEvent, StreamDecoder, ToolSpec, ToolSpecs,
};
use keel_core::{AssistantResponse, LlmFailure, ProviderKind, StreamDelta};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    event: String,
    data: String,
}

/// One SSE frame (the text between blank lines): its `event:` and its
/// `data:` lines joined by newlines. Comments and other fields are skipped.
fn parse_frame(block: &str) -> Option<Frame> {
    let mut event = String::new();
    let mut data: Option<String> = None;
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = value.to_owned(),
            "data" => match &mut data {
                Some(so_far) => {
                    so_far.push('\n');
                    so_far.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    data.map(|data| Frame { event, data })
}

fn frames(text: &str) -> Vec<Frame> {
    text.split("\n\n").filter_map(parse_frame).collect()
}

/// Accumulates bytes as they come off a socket and hands out complete frames
/// only. A frame ends at a blank line, and `\n` never occurs inside a
/// multi-byte UTF-8 sequence, so every complete frame is valid UTF-8.
#[derive(Default)]
struct ByteFramer {
    buffer: Vec<u8>,
}

impl ByteFramer {
    fn push(&mut self, bytes: &[u8]) -> Vec<Frame> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buffer.windows(2).position(|pair| pair == b"\n\n") {
            let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
            let block = String::from_utf8(block).expect("a complete frame is UTF-8");
            out.extend(parse_frame(&block));
        }
        out
    }
}

/// Everything a decoder said about one stream.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    deltas: Vec<StreamDelta>,
    complete: bool,
    result: Result<AssistantResponse, LlmFailure>,
}

/// Feed `frames` as the shell does: stop at the first failure, else finish
/// when the stream ends.
fn run(model: &str, frames: &[Frame]) -> Outcome {
    let mut decoder = Box::new(Decoder::new(model));
    let mut deltas = Vec::new();
    for frame in frames {
        match decoder.feed(SseEvent {
            event: &frame.event,
            data: &frame.data,
        }) {
            Ok(more) => deltas.extend(more),
            Err(failure) => {
                return Outcome {
                    deltas,
                    complete: decoder.is_complete(),
                    result: Err(failure),
                }
            }
        }
    }
    let complete = decoder.is_complete();
    Outcome {
        deltas,
        complete,
        result: decoder.finish(),
    }
}

const SAMPLES: [&str; 9] = [
    "text",
    "parallel_tool_calls",
    "stop_with_tool_calls",
    "ollama_parallel_tool_calls",
    "error_mid_stream",
    "reasoning_content",
    "reasoning",
    "missing_done",
    "cut_short",
];

fn sample(name: &str) -> String {
    let path = format!(
        "{}/tests/data/openai/{name}.sse",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
}

fn decode(name: &str) -> Outcome {
    run("requested-model", &frames(&sample(name)))
}

fn text(text: &str) -> StreamDelta {
    StreamDelta::Text { text: text.into() }
}

fn thinking(text: &str) -> StreamDelta {
    StreamDelta::Thinking { text: text.into() }
}

fn started(id: &str, name: &str) -> StreamDelta {
    StreamDelta::ToolUseStarted {
        id: ToolCallId::new(id),
        name: name.into(),
    }
}

fn input(id: &str, partial_json: &str) -> StreamDelta {
    StreamDelta::ToolInput {
        id: ToolCallId::new(id),
        partial_json: partial_json.into(),
    }
}

fn tool_use(id: &str, name: &str, input: Value) -> AssistantBlock {
    AssistantBlock::ToolUse {
        call: ToolCall {
            id: ToolCallId::new(id),
            name: name.into(),
            input,
        },
    }
}

fn usage(input: u64, output: u64, cache_read: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: cache_read,
    }
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

#[test]
fn text_streams_as_deltas_and_ends_the_turn() {
    let outcome = decode("text");
    assert_eq!(
        outcome.deltas,
        vec![text("héllo"), text(" ✓ "), text("日本")]
    );
    assert!(outcome.complete);
    assert_eq!(
        outcome.result.unwrap(),
        AssistantResponse {
            blocks: vec![AssistantBlock::Text {
                text: "héllo ✓ 日本".into()
            }],
            stop_reason: StopReason::EndTurn,
            // 1200 prompt tokens, 1024 of them from the cache.
            usage: usage(176, 4, 1024),
            provider: ProviderKind::OpenAi,
            model: "gpt-4o-2024-08-06".into(),
        }
    );
}

#[test]
fn parallel_tool_calls_are_assembled_by_index() {
    // The fragments of the two calls are interleaved on purpose: only the
    // index says which call a fragment belongs to.
    let outcome = decode("parallel_tool_calls");
    assert_eq!(
        outcome.deltas,
        vec![
            started("call_weather01", "get_weather"),
            input("call_weather01", "{\"ci"),
            input("call_weather01", "ty\": \"Pa"),
            started("call_time02", "get_time"),
            input("call_weather01", "ris\", \"unit\""),
            input("call_time02", "{\"zone\":"),
            input("call_weather01", ": \"°C\"}"),
            input("call_time02", " \"Europe/Paris\"}"),
        ]
    );
    let response = outcome.result.unwrap();
    assert_eq!(
        response.blocks,
        vec![
            tool_use(
                "call_weather01",
                "get_weather",
                json!({ "city": "Paris", "unit": "°C" })
            ),
            tool_use("call_time02", "get_time", json!({ "zone": "Europe/Paris" })),
        ]
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.usage, usage(82, 41, 0));
    assert_eq!(response.model, "gpt-4o-mini");
}

#[test]
fn the_input_deltas_of_a_call_add_up_to_its_arguments() {
    for name in [
        "parallel_tool_calls",
        "stop_with_tool_calls",
        "ollama_parallel_tool_calls",
    ] {
        let outcome = decode(name);
        let mut streamed: BTreeMap<ToolCallId, String> = BTreeMap::new();
        for delta in &outcome.deltas {
            match delta {
                StreamDelta::ToolUseStarted { id, .. } => {
                    streamed.insert(id.clone(), String::new());
                }
                StreamDelta::ToolInput { id, partial_json } => {
                    streamed.get_mut(id).unwrap().push_str(partial_json);
                }
                StreamDelta::Text { .. } | StreamDelta::Thinking { .. } => {}
            }
        }
        let response = outcome.result.unwrap();
        let calls: Vec<&ToolCall> = response
            .blocks
            .iter()
            .filter_map(AssistantBlock::tool_call)
            .collect();
        assert_eq!(calls.len(), streamed.len(), "{name}");
        for call in calls {
            let json: Value = serde_json::from_str(&streamed[&call.id]).unwrap();
            assert_eq!(json, call.input, "{name}");
        }
    }
}

#[test]
fn tool_calls_after_finish_reason_stop_still_mean_tool_use() {
    let response = decode("stop_with_tool_calls").result.unwrap();
    assert_eq!(
        response.blocks,
        vec![
            AssistantBlock::Text {
                text: "Let me look.".into()
            },
            tool_use(
                "chatcmpl-tool-4f1e",
                "read_file",
                json!({ "path": "src/main.rs" })
            ),
        ]
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.usage, usage(310, 28, 0));
    assert_eq!(response.model, "Qwen/Qwen2.5-7B-Instruct");
}

#[test]
fn ollama_parallel_calls_at_one_index_stay_apart() {
    let outcome = decode("ollama_parallel_tool_calls");
    assert_eq!(
        outcome.deltas,
        vec![
            started("call_wteop8bt", "run_command"),
            input("call_wteop8bt", "{\"command\":\"ls\"}"),
            started("call_rk2xye1l", "run_command"),
            input("call_rk2xye1l", "{\"command\":\"ls -l\"}"),
        ]
    );
    let response = outcome.result.unwrap();
    assert_eq!(
        response.blocks,
        vec![
            tool_use("call_wteop8bt", "run_command", json!({ "command": "ls" })),
            tool_use(
                "call_rk2xye1l",
                "run_command",
                json!({ "command": "ls -l" })
            ),
        ]
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.usage, usage(150, 40, 0));
}

#[test]
fn an_error_chunk_mid_stream_fails_retryably_with_the_provider_message() {
    let outcome = decode("error_mid_stream");
    assert_eq!(outcome.deltas, vec![text("Partial ans")]);
    assert!(!outcome.complete);
    assert_eq!(
        outcome.result,
        Err(LlmFailure {
            retryable: true,
            retry_after_ms: None,
            message: "server_error: The server had an error while processing your request. Sorry about that!"
                .into(),
            prompt_too_long: false,
        })
    );
}

#[test]
fn reasoning_content_streams_as_thinking() {
    let outcome = decode("reasoning_content");
    assert_eq!(
        outcome.deltas,
        vec![
            thinking("9.11 vs 9.8: "),
            thinking("0.80 > 0.11."),
            text("9.8 is greater."),
        ]
    );
    let response = outcome.result.unwrap();
    assert_eq!(
        response.blocks,
        vec![
            AssistantBlock::Thinking {
                text: "9.11 vs 9.8: 0.80 > 0.11.".into(),
                signature: None,
            },
            AssistantBlock::Text {
                text: "9.8 is greater.".into()
            },
        ]
    );
    assert_eq!(response.stop_reason, StopReason::MaxTokens);
    assert_eq!(response.usage, usage(20, 64, 0));
    assert_eq!(response.model, "deepseek-reasoner");
}

#[test]
fn ollama_reasoning_streams_as_thinking_and_usage_may_be_absent() {
    let response = decode("reasoning").result.unwrap();
    assert_eq!(
        response.blocks,
        vec![
            AssistantBlock::Thinking {
                text: "User wants three words.".into(),
                signature: None,
            },
            AssistantBlock::Text {
                text: "Fluffy, quick, shy.".into()
            },
        ]
    );
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.usage, Usage::default());
    assert_eq!(response.model, "gpt-oss:20b");
}

#[test]
fn a_stream_without_done_is_whole_when_it_gave_a_finish_reason() {
    let outcome = decode("missing_done");
    assert!(!outcome.complete);
    let response = outcome.result.unwrap();
    assert_eq!(
        response.blocks,
        vec![AssistantBlock::Text {
            text: "Hi there".into()
        }]
    );
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.usage, usage(9, 2, 0));
}

#[test]
fn a_stream_cut_before_its_end_fails_retryably() {
    let outcome = decode("cut_short");
    assert_eq!(
        outcome.deltas,
        vec![text("This answer never"), text(" fini")]
    );
    let failure = outcome.result.unwrap_err();
    assert!(failure.retryable);
    assert!(
        failure.message.starts_with("stream ended early"),
        "{}",
        failure.message
    );
}

#[test]
fn the_requested_model_is_reported_when_no_chunk_names_one() {
    let frames = frames(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    );
    let response = run("llama3.1:8b", &frames).result.unwrap();
    assert_eq!(response.model, "llama3.1:8b");
}

#[test]
fn rechunking_the_bytes_anywhere_changes_nothing() {
    for name in SAMPLES {
        let text = sample(name);
        let bytes = text.as_bytes();
        let whole = run("requested-model", &frames(&text));

        // Two reads, split at every byte boundary (inside "é", "✓", "日本" too).
        for split in 0..=bytes.len() {
            let mut framer = ByteFramer::default();
            let mut got = framer.push(&bytes[..split]);
            got.extend(framer.push(&bytes[split..]));
            assert_eq!(
                run("requested-model", &got),
                whole,
                "{name} split at {split}"
            );
        }
        // Many small reads.
        for size in [1, 2, 3, 7, 64] {
            let mut framer = ByteFramer::default();
            let got: Vec<Frame> = bytes
                .chunks(size)
                .flat_map(|chunk| framer.push(chunk))
                .collect();
            assert_eq!(got, frames(&text), "{name} in reads of {size}");
            assert_eq!(
                run("requested-model", &got),
                whole,
                "{name} in reads of {size}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

const PNG_HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

fn user(content: Vec<ContentBlock>) -> Message {
    Message {
        role: Role::User,
        content,
    }
}

fn assistant(content: Vec<ContentBlock>) -> Message {
    Message {
        role: Role::Assistant,
        content,
    }
}

fn text_block(text: &str) -> ContentBlock {
    ContentBlock::Text { text: text.into() }
}

fn image_block(hash: &str) -> ContentBlock {
    ContentBlock::Image {
        image: ImageRef {
            hash: hash.into(),
            media_type: "image/png".into(),
            width: 1,
            height: 1,
            size: 4,
        },
    }
}

fn call_block(id: &str, name: &str, input: Value) -> ContentBlock {
    ContentBlock::ToolUse {
        call: ToolCall {
            id: ToolCallId::new(id),
            name: name.into(),
            input,
        },
    }
}

fn result_block(id: &str, content: &str, is_error: bool) -> ContentBlock {
    ContentBlock::ToolResult {
        result: ToolResult {
            tool_call_id: ToolCallId::new(id),
            content: content.into(),
            is_error,
            images: Vec::new(),
        },
    }
}

fn images() -> BTreeMap<String, ImageData> {
    BTreeMap::from([(
        PNG_HASH.to_owned(),
        ImageData {
            media_type: "image/png".into(),
            base64: "iVBORw0KGgo=".into(),
        },
    )])
}

fn request<'a>(
    model: &'a str,
    system: Option<&'a str>,
    messages: &'a [Message],
    tools: &'a ToolSpecs,
    images: &'a BTreeMap<String, ImageData>,
) -> PromptRequest<'a> {
    PromptRequest {
        model,
        system,
        messages,
        tools,
        max_tokens: 4096,
        images,
    }
}

#[test]
fn a_text_prompt_with_system_and_tools_encodes_to_a_streaming_body() {
    let messages = [user(vec![text_block("What's the weather in Paris?")])];
    let tools: ToolSpecs = vec![ToolSpec {
        name: "get_weather".into(),
        description: "Current weather for a city.".into(),
        input_schema: json!({
            "type": "object",
            "properties": { "city": { "type": "string" } },
            "required": ["city"],
        }),
    }]
    .into();
    let images = BTreeMap::new();
    let body = encode_request(&request(
        "gpt-4o",
        Some("You are terse."),
        &messages,
        &tools,
        &images,
    ))
    .unwrap();
    assert_eq!(
        body,
        json!({
            "model": "gpt-4o",
            "max_tokens": 4096,
            "stream": true,
            "stream_options": { "include_usage": true },
            "messages": [
                { "role": "system", "content": "You are terse." },
                { "role": "user", "content": "What's the weather in Paris?" },
            ],
            "tools": [{
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": {
                        "type": "object",
                        "properties": { "city": { "type": "string" } },
                        "required": ["city"],
                    },
                },
            }],
        })
    ); // The tools are encoded once and kept: a second request with the same
       // list writes the same bytes, which say what the first one said.
    let prompt = request("gpt-4o", Some("You are terse."), &messages, &tools, &images);
    let first = encode_request_bytes(&prompt).unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&first).unwrap(),
        body
    );
    assert_eq!(encode_request_bytes(&prompt).unwrap(), first);
}

#[test]
fn no_system_and_no_tools_leave_both_out() {
    let messages = [user(vec![text_block("hi"), text_block("again")])];
    let images = BTreeMap::new();
    let body = encode_request(&request(
        "llama3.1:8b",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(
            "llama3.1:8b",
            None,
            &messages,
            &ToolSpecs::default(),
            &images,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(
        body["messages"],
        json!([{ "role": "user", "content": "hi\n\nagain" }])
    );
    assert!(body.get("tools").is_none());
}

#[test]
fn empty_text_blocks_are_left_out_of_a_user_message() {
    let messages = [
        user(vec![text_block(""), text_block("hi"), text_block("")]),
        user(vec![text_block(""), image_block(PNG_HASH)]),
        user(vec![text_block("")]),
    ];
    let images = images();
    let body = encode_request(&request(
        "gpt-4o",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    assert_eq!(
        body["messages"],
        json!([
            { "role": "user", "content": "hi" },
            {
                "role": "user",
                "content": [
                    { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } },
                ],
            },
        ])
    );
}

#[test]
fn a_tool_results_images_follow_the_tool_messages_in_a_user_message() {
    let with_image = ContentBlock::ToolResult {
        result: ToolResult {
            tool_call_id: ToolCallId::new("call_1"),
            content: "the screen:".into(),
            is_error: false,
            images: match image_block(PNG_HASH) {
                ContentBlock::Image { image } => vec![image],
                _ => unreachable!("image_block makes an image"),
            },
        },
    };
    let messages = [
        user(vec![text_block("look")]),
        Message {
            role: Role::Assistant,
            content: vec![
                call_block("call_1", "screenshot", json!({})),
                call_block("call_2", "echo", json!({})),
            ],
        },
        user(vec![with_image, result_block("call_2", "hi", false)]),
    ];
    let images = images();
    let body = encode_request(&request(
        "gpt-4o",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(
            "gpt-4o",
            None,
            &messages,
            &ToolSpecs::default(),
            &images,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    let sent_messages = body["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        sent_messages[2..],
        [
            json!({ "role": "tool", "tool_call_id": "call_1", "content": "the screen:" }),
            json!({ "role": "tool", "tool_call_id": "call_2", "content": "hi" }),
            json!({
                "role": "user",
                "content": [
                    { "type": "text", "text": "The images returned by tool call call_1:" },
                    { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } },
                ],
            }),
        ]
    );

    let none = BTreeMap::new();
    assert_eq!(
        encode_request(&request(
            "gpt-4o",
            None,
            &messages,
            &ToolSpecs::default(),
            &none
        )),
        Err(EncodeError::MissingImage {
            hash: PNG_HASH.to_owned()
        })
    );
}

#[test]
fn empty_text_blocks_are_left_out_of_an_assistant_message() {
    let messages = [
        user(vec![text_block("go")]),
        assistant(vec![text_block(""), call_block("call_4", "run", json!({}))]),
        user(vec![result_block("call_4", "done", false)]),
        assistant(vec![text_block(""), text_block("ok"), text_block("")]),
    ];
    let images = BTreeMap::new();
    let body = encode_request(&request(
        "gpt-4o",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    assert_eq!(body["messages"][1]["content"], Value::Null, "{body:#}");
    assert_eq!(body["messages"][3]["content"], "ok", "{body:#}");
}

#[test]
fn images_become_data_url_parts() {
    let messages = [user(vec![
        text_block("What is this?"),
        image_block(PNG_HASH),
    ])];
    let images = images();
    let body = encode_request(&request(
        "gpt-4o",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(
            "gpt-4o",
            None,
            &messages,
            &ToolSpecs::default(),
            &images,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(
        body["messages"],
        json!([{
            "role": "user",
            "content": [
                { "type": "text", "text": "What is this?" },
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } },
            ],
        }])
    );
}

#[test]
fn an_image_without_its_bytes_is_an_error() {
    let messages = [user(vec![image_block("deadbeef")])];
    let images = images();
    assert_eq!(
        encode_request(&request(
            "gpt-4o",
            None,
            &messages,
            &ToolSpecs::default(),
            &images
        )),
        Err(EncodeError::MissingImage {
            hash: "deadbeef".into()
        })
    );
}

#[test]
fn tool_calls_and_results_keep_the_order_the_api_requires() {
    let messages = [
        user(vec![text_block("List the files, then the date.")]),
        assistant(vec![
            ContentBlock::Thinking {
                text: "Two tools.".into(),
                signature: Some("sig".into()),
            },
            text_block("Checking."),
            call_block("call_1", "run", json!({ "command": "ls" })),
            call_block("call_2", "run", json!({ "command": "date" })),
        ]),
        // Text typed while the tools ran, merged after their results.
        user(vec![
            result_block("call_1", "a.txt\nb.txt", false),
            result_block("call_2", "date: not found", true),
            text_block("Also, what is this?"),
            image_block(PNG_HASH),
        ]),
        assistant(vec![call_block("call_3", "look", json!({}))]),
        user(vec![result_block("call_3", "a cat", false)]),
        assistant(vec![text_block("Done.")]),
    ];
    let images = images();
    let body = encode_request(&request(
        "gpt-4o",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(
            "gpt-4o",
            None,
            &messages,
            &ToolSpecs::default(),
            &images,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(
        body["messages"],
        json!([
            { "role": "user", "content": "List the files, then the date." },
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    { "id": "call_1", "type": "function",
                      "function": { "name": "run", "arguments": "{\"command\":\"ls\"}" } },
                    { "id": "call_2", "type": "function",
                      "function": { "name": "run", "arguments": "{\"command\":\"date\"}" } },
                ],
            },
            { "role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt" },
            { "role": "tool", "tool_call_id": "call_2", "content": "Error: date: not found" },
            {
                "role": "user",
                "content": [
                    { "type": "text", "text": "Also, what is this?" },
                    { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } },
                ],
            },
            {
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    { "id": "call_3", "type": "function",
                      "function": { "name": "look", "arguments": "{}" } },
                ],
            },
            { "role": "tool", "tool_call_id": "call_3", "content": "a cat" },
            { "role": "assistant", "content": "Done." },
        ])
    );
}

#[test]
fn openai_reasoning_models_get_max_completion_tokens() {
    let messages = [user(vec![text_block("hi")])];
    let images = BTreeMap::new();
    let body = encode_request(&request(
        "o3-mini",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(
            "o3-mini",
            None,
            &messages,
            &ToolSpecs::default(),
            &images,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    assert_eq!(body["max_completion_tokens"], json!(4096));
    assert!(body.get("max_tokens").is_none());
}

#[test]
fn a_decoded_response_encodes_back_as_history() {
    // What the decoder produced is what the next request sends back.
    let response = decode("parallel_tool_calls").result.unwrap();
    let messages = [
        user(vec![text_block("Weather and time in Paris?")]),
        assistant(
            response
                .blocks
                .iter()
                .map(AssistantBlock::to_content)
                .collect(),
        ),
    ];
    let images = BTreeMap::new();
    let body = encode_request(&request(
        "gpt-4o-mini",
        None,
        &messages,
        &ToolSpecs::default(),
        &images,
    ))
    .unwrap();
    let sent: Value = serde_json::from_slice(
        &encode_request_bytes(&request(
            "gpt-4o-mini",
            None,
            &messages,
            &ToolSpecs::default(),
            &images,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(sent, body, "the bytes sent are the body");
    let calls = body["messages"][1]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["id"], "call_weather01");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({ "city": "Paris", "unit": "°C" }));
}
