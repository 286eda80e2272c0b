#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Throughput of the provider stream decoders (target: over 100 MB/s of SSE
//! on one core).
//!
//! - `wire/{anthropic,openai}/decode`: the decoder alone, fed events already
//!   split out of the stream, from `Decoder::new` to `finish`.
//! - `wire/{anthropic,openai}/sse`: the SSE framing alone (`sseer`
//!   over 16 KiB chunks), to tell the two costs apart.
//! - `wire/{anthropic,openai}/sse+decode`: both, as keel-actors runs them
//!   (`provider::read::decode_events`): 16 KiB chunks of bytes through
//!   `sseer`, each event fed to a boxed `StreamDecoder`.
//!
//! Each provider's stream is about 1 MB of SSE, built in memory before the
//! clock starts: one response with a long text answer in deltas of 5 to 30
//! bytes (as providers send them), then a `write_file` tool call whose input
//! JSON arrives in fragments of 5 to 30 bytes. Throughput is the size of the
//! whole SSE stream, in decimal MB, for every variant, so the figures compare.

use std::convert::Infallible;
use std::hint::black_box;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use futures_util::{Stream, StreamExt};
use keel_core::message::AssistantBlock;
use keel_core::wire::{anthropic, openai, SseEvent, StreamDecoder};
use keel_core::AssistantResponse;
// xorshift64*: the same streams every run.
use keel_test_support::text::Rng;
use serde_json::{json, Value};
use sseer::EventStream;

/// The size of the byte chunks handed to the SSE parser.
const CHUNK: usize = 16 * 1024;

/// Bytes of answer text (before JSON escaping) and of the written file's
/// content (in the tool call's input) in each stream, so each comes to about
/// 1 MB of SSE: OpenAI's chunks repeat more metadata per delta.
const ANTHROPIC_CONTENT: (usize, usize) = (80_000, 40_000);
const OPENAI_CONTENT: (usize, usize) = (40_000, 20_000);

const TOOL_ID: &str = "toolu_01T1x1fJ34qAmk2tNTrN7Up6";
const TOOL_NAME: &str = "write_file";

// ---------------------------------------------------------------------------
// Stream construction
// ---------------------------------------------------------------------------

/// Words of a coding assistant's answer, some needing JSON escapes or
/// taking several UTF-8 bytes.
const WORDS: &[&str] = &[
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "is",
    "that",
    "it",
    "for",
    "this",
    "function",
    "returns",
    "`Result<T, E>`",
    "error",
    "value",
    "each",
    "call",
    "so",
    "we",
    "can",
    "file",
    "module",
    "stream",
    "decoder",
    "event",
    "which",
    "then",
    "when",
    "\"quoted\"",
    "naïve",
    "café",
    "—",
    "→",
    "✓",
    "日本語",
    "über",
    "path\\to",
    "`Vec<u8>`",
    "buffer",
    "borrowed",
    "owned",
];

/// Markdown prose of about `bytes` bytes.
fn prose(rng: &mut Rng, bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 64);
    while text.len() < bytes {
        match rng.below(40) {
            0 => text.push_str("\n\n"),
            1 => text.push_str("\n- "),
            2 => text.push_str("\n```rust\nlet x = f(\"y\")?;\n```\n"),
            3 => text.push_str(". "),
            4 => text.push_str(", "),
            _ => {
                text.push_str(rng.pick(WORDS));
                text.push(' ');
            }
        }
    }
    text
}

const CODE_LINES: &[&str] = &[
    "use std::collections::BTreeMap;",
    "pub fn parse(input: &str) -> Result<Value, Error> {",
    "    let mut out = Vec::with_capacity(input.len());",
    "    for (i, line) in input.lines().enumerate() {",
    "        if line.trim().is_empty() {",
    "            continue;",
    "        }",
    "        out.push(format!(\"{i}: {line}\\n\"));",
    "    }",
    "    Ok(json!({\"lines\": out, \"tab\": \"\\t\"}))",
    "}",
    "",
    "/// Docs with a quote: \"it's fine\" — and a path C:\\\\keel.",
    "#[derive(Debug, Clone, PartialEq)]",
    "struct Slot { index: u64, name: String }",
];

/// Rust source of about `bytes` bytes: the file a tool call writes.
fn source_file(rng: &mut Rng, bytes: usize) -> String {
    let mut code = String::with_capacity(bytes + 128);
    while code.len() < bytes {
        code.push_str(rng.pick(CODE_LINES));
        code.push('\n');
    }
    code
}

/// `text` cut in pieces of 5 to 30 bytes, each ending on a char boundary.
fn pieces<'a>(rng: &mut Rng, text: &'a str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = (5 + rng.below(26)).min(rest.len());
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (piece, tail) = rest.split_at(end);
        out.push(piece);
        rest = tail;
    }
    out
}

fn push_event(sse: &mut String, event: Option<&str>, data: &str) {
    if let Some(event) = event {
        sse.push_str("event: ");
        sse.push_str(event);
        sse.push('\n');
    }
    sse.push_str("data: ");
    sse.push_str(data);
    sse.push_str("\n\n");
}

/// One provider's stream and what it must decode to.
struct Sample {
    name: &'static str,
    sse: Bytes,
    decoder: fn() -> Box<dyn StreamDecoder>,
    text: String,
    tool_input: Value,
}

/// The answer text, and the tool input as streamed and as parsed.
fn content((text_bytes, file_bytes): (usize, usize)) -> (String, String, Value) {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let text = prose(&mut rng, text_bytes);
    let input = json!({
        "path": "src/generated/parser.rs",
        "content": source_file(&mut rng, file_bytes),
    });
    (text, input.to_string(), input)
}

fn anthropic_sample() -> Sample {
    let (text, input_json, tool_input) = content(ANTHROPIC_CONTENT);
    let mut rng = Rng::new(0x0123_4567_89ab_cdef);
    let mut sse = String::new();
    let event = |sse: &mut String, data: Value| {
        let kind = data["type"].as_str().unwrap().to_owned();
        push_event(sse, Some(&kind), &data.to_string());
    };
    event(
        &mut sse,
        json!({"type": "message_start", "message": {
            "id": "msg_014p7gG3wDgGV9EUtLvnow3U", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5-20250929", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 4721, "output_tokens": 2},
        }}),
    );
    event(&mut sse, json!({"type": "ping"}));
    event(
        &mut sse,
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
    );
    for (n, piece) in pieces(&mut rng, &text).into_iter().enumerate() {
        event(
            &mut sse,
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": piece}}),
        );
        if n % 1000 == 999 {
            event(&mut sse, json!({"type": "ping"}));
        }
    }
    event(&mut sse, json!({"type": "content_block_stop", "index": 0}));
    event(
        &mut sse,
        json!({"type": "content_block_start", "index": 1, "content_block":
               {"type": "tool_use", "id": TOOL_ID, "name": TOOL_NAME, "input": {}}}),
    );
    for piece in std::iter::once("").chain(pieces(&mut rng, &input_json)) {
        event(
            &mut sse,
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": piece}}),
        );
    }
    event(&mut sse, json!({"type": "content_block_stop", "index": 1}));
    event(
        &mut sse,
        json!({"type": "message_delta",
               "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"output_tokens": 31_337}}),
    );
    event(&mut sse, json!({"type": "message_stop"}));
    Sample {
        name: "anthropic",
        sse: Bytes::from(sse),
        decoder: || Box::new(anthropic::Decoder::new("claude-sonnet-4-5")),
        text,
        tool_input,
    }
}

fn openai_sample() -> Sample {
    let (text, input_json, tool_input) = content(OPENAI_CONTENT);
    let mut rng = Rng::new(0x0123_4567_89ab_cdef);
    let mut sse = String::new();
    let chunk = |sse: &mut String, delta: Value, finish_reason: Value| {
        let data = json!({
            "id": "chatcmpl-AbC1xYz", "object": "chat.completion.chunk", "created": 1_718_000_000,
            "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_9b0abffe81",
            "choices": [{"index": 0, "delta": delta, "logprobs": null,
                         "finish_reason": finish_reason}],
            "usage": null,
        });
        push_event(sse, None, &data.to_string());
    };
    chunk(
        &mut sse,
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    );
    for piece in pieces(&mut rng, &text) {
        chunk(&mut sse, json!({"content": piece}), Value::Null);
    }
    chunk(
        &mut sse,
        json!({"tool_calls": [{"index": 0, "id": "call_Xb3kQ9fWm2LrP0aTzY7cVn1d", "type": "function",
                               "function": {"name": TOOL_NAME, "arguments": ""}}]}),
        Value::Null,
    );
    for piece in pieces(&mut rng, &input_json) {
        chunk(
            &mut sse,
            json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            Value::Null,
        );
    }
    chunk(&mut sse, json!({}), json!("tool_calls"));
    let usage = json!({
        "id": "chatcmpl-AbC1xYz", "object": "chat.completion.chunk", "created": 1_718_000_000,
        "model": "gpt-4o-2024-08-06", "choices": [],
        "usage": {"prompt_tokens": 4721, "completion_tokens": 31_337, "total_tokens": 36_058,
                  "prompt_tokens_details": {"cached_tokens": 4096}},
    });
    push_event(&mut sse, None, &usage.to_string());
    push_event(&mut sse, None, "[DONE]");
    Sample {
        name: "openai",
        sse: Bytes::from(sse),
        decoder: || Box::new(openai::Decoder::new("gpt-4o")),
        text,
        tool_input,
    }
}

// ---------------------------------------------------------------------------
// The measured work
// ---------------------------------------------------------------------------

/// The next item of a stream that is never pending (its bytes are in
/// memory), polled without an executor.
fn next_ready<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    let mut cx = Context::from_waker(Waker::noop());
    match stream.poll_next_unpin(&mut cx) {
        Poll::Ready(item) => item,
        Poll::Pending => unreachable!("an in-memory stream is never pending"),
    }
}

/// Frames `sse`, handed over in [`CHUNK`]-byte pieces, into events, and
/// gives each to `on_event` with keel-actors' naming (`message` is "")
/// until it says stop. Returns the number of events.
fn frame(sse: &Bytes, mut on_event: impl FnMut(SseEvent<'_>) -> bool) -> usize {
    let chunks = (0..sse.len())
        .step_by(CHUNK)
        .map(|start| Ok::<_, Infallible>(sse.slice(start..sse.len().min(start + CHUNK))));
    let mut events = EventStream::new(futures_util::stream::iter(chunks));
    let mut count = 0;
    while let Some(event) = next_ready(&mut events) {
        let event = event.unwrap();
        count += 1;
        let name = match &*event.event {
            "message" => "",
            name => name,
        };
        if !on_event(SseEvent {
            event: name,
            data: &event.data,
        }) {
            break;
        }
    }
    count
}

/// What keel-actors does with a response body: frame and decode.
fn sse_and_decode(sample: &Sample) -> (usize, AssistantResponse) {
    let mut decoder = (sample.decoder)();
    let mut deltas = 0;
    frame(&sample.sse, |event| {
        let out = decoder.feed(event).unwrap();
        deltas += out.len();
        black_box(out);
        !decoder.is_complete()
    });
    (deltas, decoder.finish().unwrap())
}

/// The decoder alone, over events split out beforehand.
fn decode(sample: &Sample, events: &[(String, String)]) -> (usize, AssistantResponse) {
    let mut decoder = (sample.decoder)();
    let mut deltas = 0;
    for (event, data) in events {
        let out = decoder.feed(SseEvent { event, data }).unwrap();
        deltas += out.len();
        black_box(out);
        if decoder.is_complete() {
            break;
        }
    }
    (deltas, decoder.finish().unwrap())
}

/// The response is the streamed text then the tool call, intact.
fn check(sample: &Sample, response: &AssistantResponse) {
    assert_eq!(response.blocks.len(), 2, "{}", sample.name);
    assert_eq!(
        response.blocks[0],
        AssistantBlock::Text {
            text: sample.text.clone()
        },
        "{}",
        sample.name
    );
    let call = response.blocks[1].tool_call().unwrap();
    assert_eq!(call.name, TOOL_NAME);
    assert_eq!(call.input, sample.tool_input, "{}", sample.name);
}

fn bench_wire(c: &mut Criterion) {
    let mut group = c.benchmark_group("wire");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5));
    for sample in [anthropic_sample(), openai_sample()] {
        let mut events = Vec::new();
        frame(&sample.sse, |event| {
            events.push((event.event.to_owned(), event.data.to_owned()));
            true
        });
        let (deltas, response) = decode(&sample, &events);
        check(&sample, &response);
        assert_eq!(sse_and_decode(&sample).1, response);
        eprintln!(
            "wire/{}: {} bytes of SSE, {} events, {} deltas",
            sample.name,
            sample.sse.len(),
            events.len(),
            deltas
        );

        group.throughput(Throughput::BytesDecimal(sample.sse.len() as u64));
        group.bench_function(format!("{}/decode", sample.name), |b| {
            b.iter(|| decode(&sample, black_box(&events)));
        });
        group.bench_function(format!("{}/sse", sample.name), |b| {
            b.iter(|| {
                frame(black_box(&sample.sse), |event| {
                    black_box(event).data != "\0"
                })
            });
        });
        group.bench_function(format!("{}/sse+decode", sample.name), |b| {
            b.iter(|| sse_and_decode(black_box(&sample)));
        });
    }
    group.finish();
}

criterion_group!(benches, bench_wire);
criterion_main!(benches);
