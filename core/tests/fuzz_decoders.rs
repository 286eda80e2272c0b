//! Stand-ins, on stable and in CI, for the cargo-fuzz targets in `fuzz/`
//! (docs/fuzzing.md): the same input spaces, sampled by proptest.
//!
//! - Both stream decoders are fed real streams (`tests/data/*/*.sse`) cut
//!   into chunks anywhere and framed by sseer as keel-actors does, with
//!   their bytes damaged; event sequences edited (events dropped,
//!   repeated, swapped, their data cut short or replaced); and made-up
//!   events: JSON objects built from the keys the decoders read, holding
//!   values of every type (huge and negative numbers, floats, nesting),
//!   truncated JSON, numbers no type holds, arbitrary text. The decoder
//!   must not panic, a failure from `feed` must stick (every later `feed`
//!   and `finish` report it), and `finish` gives a response or a failure.
//! - The event record and checkpoint decoders get arbitrary bytes, real
//!   records and checkpoints with damaged bytes, and version 1 records with
//!   a node of their JSON replaced by anything. What they accept must come
//!   back equal through encode and decode.
//!
//! With `KEEL_FUZZ_CORPUS=DIR` set, `seed_corpus` also writes the seeds the
//! fuzz targets start from into `DIR/<target>/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use keel_core::codec::{self, checkpoint};
use keel_core::effect::Effect;
use keel_core::event::Event;
use keel_core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_core::wire::{anthropic, openai, SseEvent, StreamDecoder};
use keel_core::{
    create, transition, AssistantResponse, ConversationConfig, ConversationId, Input, LlmFailure,
    NewConversation, Timestamp, ToolCallId, WorkingSet,
};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

// ---------------------------------------------------------------------------
// Stream decoders

#[derive(Debug, Clone, Copy)]
enum Provider {
    Anthropic,
    OpenAi,
}

impl Provider {
    fn decoder(self) -> Box<dyn StreamDecoder> {
        match self {
            Provider::Anthropic => Box::new(anthropic::Decoder::new("claude-test")),
            Provider::OpenAi => Box::new(openai::Decoder::new("gpt-test")),
        }
    }

    fn fixtures(self) -> Vec<Vec<u8>> {
        let dir = data_dir().join(match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
        });
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "sse"))
            .collect();
        paths.sort();
        paths
            .iter()
            .map(|path| std::fs::read(path).unwrap())
            .collect()
    }
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn provider() -> impl Strategy<Value = Provider> {
    prop_oneof![Just(Provider::Anthropic), Just(Provider::OpenAi)]
}

/// `body` in `chunk`-byte pieces through sseer, named as keel-actors names
/// them (`message` is the empty name). Bytes that are not UTF-8 end the
/// events there: the reader fails the request at that point.
fn frame(body: &[u8], chunk: usize) -> Vec<(String, String)> {
    let body = Bytes::copy_from_slice(body);
    let chunks = (0..body.len())
        .step_by(chunk.max(1))
        .map(|start| Ok::<_, Infallible>(body.slice(start..body.len().min(start + chunk))));
    let mut stream = sseer::EventStream::new(futures_util::stream::iter(chunks));
    let mut events = Vec::new();
    while let Some(Ok(event)) = next_ready(&mut stream) {
        let name = match &*event.event {
            "message" => "",
            name => name,
        };
        events.push((name.to_owned(), event.data.to_string()));
    }
    events
}

fn next_ready<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(stream).poll_next_unpin(&mut cx) {
        Poll::Ready(item) => item,
        Poll::Pending => panic!("an in-memory stream is never pending"),
    }
}

/// Feeds every event (past `is_complete` too), then finishes; checks that a
/// failure sticks.
fn drive(provider: Provider, events: &[(String, String)]) -> Result<(), TestCaseError> {
    let mut decoder = provider.decoder();
    let mut failed: Option<LlmFailure> = None;
    for (name, data) in events {
        let fed = decoder.feed(SseEvent { event: name, data });
        match (&failed, fed) {
            (None, Ok(_)) => {}
            (None, Err(failure)) => failed = Some(failure),
            (Some(first), again) => prop_assert_eq!(again, Err(first.clone())),
        }
    }
    let finished = decoder.finish();
    if let Some(first) = failed {
        prop_assert_eq!(finished, Err(first));
    }
    Ok(())
}

/// A real stream and a damaged copy: bytes overwritten, cut short, or
/// bytes inserted.
fn damaged_fixture(provider: Provider) -> impl Strategy<Value = Vec<u8>> {
    let fixtures = provider.fixtures();
    (0..fixtures.len(), prop::collection::vec(byte_edit(), 0..4)).prop_map(move |(pick, edits)| {
        let mut bytes = fixtures[pick].clone();
        for edit in edits {
            edit.apply(&mut bytes);
        }
        bytes
    })
}

#[derive(Debug, Clone)]
enum ByteEdit {
    Overwrite {
        at: prop::sample::Index,
        byte: u8,
    },
    Insert {
        at: prop::sample::Index,
        bytes: Vec<u8>,
    },
    Truncate {
        at: prop::sample::Index,
    },
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    let interesting = prop_oneof![
        any::<u8>(),
        Just(b'\n'),
        Just(b'\r'),
        Just(b':'),
        Just(b'{'),
        Just(b'"'),
        Just(0xff),
    ];
    prop_oneof![
        (any::<prop::sample::Index>(), interesting)
            .prop_map(|(at, byte)| ByteEdit::Overwrite { at, byte }),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 1..8)
        )
            .prop_map(|(at, bytes)| ByteEdit::Insert { at, bytes }),
        any::<prop::sample::Index>().prop_map(|at| ByteEdit::Truncate { at }),
    ]
}

impl ByteEdit {
    fn apply(self, bytes: &mut Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        match self {
            ByteEdit::Overwrite { at, byte } => {
                let at = at.index(bytes.len());
                bytes[at] = byte;
            }
            ByteEdit::Insert { at, bytes: new } => {
                let at = at.index(bytes.len());
                bytes.splice(at..at, new);
            }
            ByteEdit::Truncate { at } => bytes.truncate(at.index(bytes.len())),
        }
    }
}

/// Keys the decoders read, so that made-up objects reach their branches.
const KEYS: &[&str] = &[
    "type",
    "index",
    "delta",
    "content_block",
    "message",
    "model",
    "usage",
    "input_tokens",
    "output_tokens",
    "stop_reason",
    "text",
    "thinking",
    "signature",
    "partial_json",
    "id",
    "name",
    "input",
    "error",
    "choices",
    "content",
    "reasoning",
    "reasoning_content",
    "refusal",
    "tool_calls",
    "function",
    "arguments",
    "finish_reason",
    "created",
    "prompt_tokens",
    "completion_tokens",
    "code",
    "status",
];

/// String values the decoders match on.
const WORDS: &[&str] = &[
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
    "ping",
    "text",
    "thinking",
    "tool_use",
    "text_delta",
    "thinking_delta",
    "signature_delta",
    "input_json_delta",
    "redacted_thinking",
    "end_turn",
    "max_tokens",
    "stop",
    "length",
    "tool_calls",
    "content_filter",
    "overloaded_error",
    "rate_limit_error",
    "{\"a\":",
    "{}",
    "",
];

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(WORDS).prop_map(str::to_owned),
        1 => any::<String>(),
    ]
}

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
        prop_oneof![Just(0u64), Just(1), Just(2), Just(u64::MAX), any::<u64>()]
            .prop_map(Value::from),
        prop_oneof![Just(-1i64), Just(i64::MIN), any::<i64>()].prop_map(Value::from),
        prop_oneof![Just(1.5f64), Just(f64::MAX), Just(-0.0), any::<f64>()]
            .prop_map(|float| Number::from_f64(float).map_or(Value::Null, Value::Number)),
        word().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An event's data: JSON objects shaped like the providers' (with any
/// value anywhere), the same cut short, numbers no Rust type holds, the
/// OpenAI end marker, arbitrary text.
fn event_data() -> impl Strategy<Value = String> {
    let object = || {
        (
            word(),
            json_value(),
            prop::collection::btree_map(key(), json_value(), 0..5),
        )
            .prop_map(|(kind, index, rest)| {
                let mut map: Map<String, Value> = rest.into_iter().collect();
                map.insert("type".to_owned(), Value::String(kind));
                map.entry("index").or_insert(index);
                Value::Object(map).to_string()
            })
    };
    prop_oneof![
        6 => object(),
        2 => (object(), any::<prop::sample::Index>()).prop_map(|(mut text, cut)| {
            let mut cut = cut.index(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text
        }),
        1 => prop::sample::select(vec![
            r#"{"type":"content_block_start","index":18446744073709551616,"content_block":{"type":"text"}}"#,
            r#"{"type":"content_block_delta","index":1e999,"delta":{"type":"text_delta","text":"x"}}"#,
            r#"{"type":"message_delta","usage":{"output_tokens":-1e400}}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":99999999999999999999999,"function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"x"}}],"created":1e19}"#,
            "[DONE]",
            "",
        ])
        .prop_map(str::to_owned),
        1 => any::<String>(),
    ]
}

fn event_name() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        4 => prop::sample::select(WORDS).prop_map(str::to_owned),
        1 => any::<String>(),
    ]
}

fn made_up_events() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((event_name(), event_data()), 0..24)
}

#[derive(Debug, Clone)]
enum EventEdit {
    Drop(prop::sample::Index),
    Repeat(prop::sample::Index),
    Swap(prop::sample::Index, prop::sample::Index),
    Cut(prop::sample::Index, prop::sample::Index),
    Replace(prop::sample::Index, String),
    Insert(prop::sample::Index, String, String),
}

fn event_edit() -> impl Strategy<Value = EventEdit> {
    let index = any::<prop::sample::Index>;
    prop_oneof![
        index().prop_map(EventEdit::Drop),
        index().prop_map(EventEdit::Repeat),
        (index(), index()).prop_map(|(a, b)| EventEdit::Swap(a, b)),
        (index(), index()).prop_map(|(a, b)| EventEdit::Cut(a, b)),
        (index(), event_data()).prop_map(|(at, data)| EventEdit::Replace(at, data)),
        (index(), event_name(), event_data())
            .prop_map(|(at, name, data)| EventEdit::Insert(at, name, data)),
    ]
}

impl EventEdit {
    fn apply(self, events: &mut Vec<(String, String)>) {
        let n_events = events.len();
        if n_events == 0 {
            if let EventEdit::Insert(_, name, data) = self {
                events.push((name, data));
            }
            return;
        }
        match self {
            EventEdit::Drop(at) => {
                events.remove(at.index(n_events));
            }
            EventEdit::Repeat(at) => {
                let at = at.index(n_events);
                events.insert(at, events[at].clone());
            }
            EventEdit::Swap(a, b) => events.swap(a.index(n_events), b.index(n_events)),
            EventEdit::Cut(at, cut) => {
                let data = &mut events[at.index(n_events)].1;
                let mut cut = cut.index(data.len() + 1);
                while !data.is_char_boundary(cut) {
                    cut -= 1;
                }
                data.truncate(cut);
            }
            EventEdit::Replace(at, data) => events[at.index(n_events)].1 = data,
            EventEdit::Insert(at, name, data) => {
                events.insert(at.index(n_events + 1), (name, data));
            }
        }
    }
}

fn edited_fixture(provider: Provider) -> impl Strategy<Value = Vec<(String, String)>> {
    let fixtures: Vec<Vec<(String, String)>> = provider
        .fixtures()
        .iter()
        .map(|body| frame(body, body.len()))
        .collect();
    (0..fixtures.len(), prop::collection::vec(event_edit(), 1..5)).prop_map(move |(pick, edits)| {
        let mut events = fixtures[pick].clone();
        for edit in edits {
            edit.apply(&mut events);
        }
        events
    })
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

    /// Any bytes as a response body, in chunks of any size.
    #[test]
    fn decoders_take_any_body(
        provider in provider(),
        body in prop::collection::vec(any::<u8>(), 0..512),
        chunk in 1usize..64,
    ) {
        drive(provider, &frame(&body, chunk))?;
    }

    /// Real streams with damaged bytes, in chunks of any size.
    #[test]
    fn decoders_take_damaged_streams(
        (provider, body) in provider().prop_flat_map(|provider| (Just(provider), damaged_fixture(provider))),
        chunk in prop_oneof![1usize..16, Just(16 * 1024)],
    ) {
        drive(provider, &frame(&body, chunk))?;
    }

    /// Real streams with events dropped, repeated, swapped, cut short,
    /// replaced or added.
    #[test]
    fn decoders_take_edited_event_sequences(
        (provider, events) in provider().prop_flat_map(|provider| (Just(provider), edited_fixture(provider))),
    ) {
        drive(provider, &events)?;
    }

    /// Made-up events, JSON or not, that no SSE parser needs to have
    /// produced.
    #[test]
    fn decoders_take_made_up_events(provider in provider(), events in made_up_events()) {
        drive(provider, &events)?;
    }
}

/// Every recorded stream frames into the same events whether sseer gets it
/// whole or a byte at a time (what the damaged-stream properties and the
/// fuzz targets' chunking rely on), and decodes without breaking the
/// contract.
#[test]
fn recorded_streams_frame_the_same_in_any_chunks() {
    for provider in [Provider::Anthropic, Provider::OpenAi] {
        for body in provider.fixtures() {
            let whole = frame(&body, body.len());
            assert!(!whole.is_empty());
            assert_eq!(frame(&body, 1), whole);
            drive(provider, &whole).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------
// Event records and checkpoints

/// The log of a conversation whose first turn retried a failed request,
/// ran a tool call and was cancelled, and whose second turn was answered:
/// events of many kinds, through the real state machine.
fn sample_log() -> Vec<Event> {
    let mut at = 1_700_000_000_000;
    let mut now = || {
        at += 1_000;
        Timestamp::from_millis(at)
    };
    let step = create(
        NewConversation {
            id: ConversationId::new("fuzz-1").unwrap(),
            cwd: "/tmp/work".to_owned(),
            config: ConversationConfig::default(),
            parent_conversation: None,
        },
        now(),
    );
    let mut log = Vec::new();
    let mut generation = None;
    collect(&step.effects, &mut log, &mut generation);
    let mut conversation = step.state;
    let call_id = ToolCallId::new("toolu_fuzz_1");
    let inputs: Vec<Box<dyn Fn(Option<keel_core::Generation>) -> Input>> = vec![
        Box::new(|_| Input::UserMessage {
            text: "What is in São Paulo's weather? \u{1F326}".to_owned(),
            images: Vec::new(),
        }),
        Box::new(|generation| Input::StreamFailed {
            generation: generation.unwrap(),
            failure: LlmFailure {
                retryable: true,
                message: "overloaded".to_owned(),
                retry_after_ms: Some(1_500),
                prompt_too_long: false,
            },
            jitter: 500,
        }),
        Box::new(|generation| Input::TimerFired {
            timer: keel_core::Timer::Retry {
                generation: generation.unwrap(),
            },
        }),
        Box::new(|generation| Input::StreamFinished {
            generation: generation.unwrap(),
            response: AssistantResponse {
                blocks: vec![
                    AssistantBlock::Thinking {
                        text: "look it up".to_owned(),
                        signature: Some("c2ln".to_owned()),
                    },
                    AssistantBlock::ToolUse {
                        call: ToolCall {
                            id: ToolCallId::new("toolu_fuzz_1"),
                            name: "bash".to_owned(),
                            input: serde_json::json!({"command": "curl wttr.in", "n": [1, -2, 3.5, u64::MAX]}),
                        },
                    },
                ],
                stop_reason: StopReason::ToolUse,
                usage: Usage {
                    input_tokens: 472,
                    output_tokens: 90,
                    ..Usage::default()
                },
                provider: keel_core::ProviderKind::Anthropic,
                model: "claude-test".to_owned(),
            },
        }),
        Box::new(move |_| Input::ToolFinished {
            tool_call_id: call_id.clone(),
            content: "sunny, 24°C".to_owned(),
            is_error: false,
            images: Vec::new(),
        }),
        Box::new(|generation| Input::StreamDelta {
            generation: generation.unwrap(),
            delta: keel_core::StreamDelta::Text {
                text: "Sunny".to_owned(),
            },
        }),
        Box::new(|_| Input::Cancel),
        Box::new(|_| Input::UserMessage {
            text: "and tomorrow?".to_owned(),
            images: Vec::new(),
        }),
        Box::new(|generation| Input::StreamFinished {
            generation: generation.unwrap(),
            response: AssistantResponse {
                blocks: vec![AssistantBlock::Text {
                    text: "Rain.".to_owned(),
                }],
                stop_reason: StopReason::EndTurn,
                usage: Usage::default(),
                provider: keel_core::ProviderKind::OpenAi,
                model: "gpt-test".to_owned(),
            },
        }),
        Box::new(|_| Input::Stop),
    ];
    for input in inputs {
        let input = input(generation);
        let step = transition(conversation, input, now());
        collect(&step.effects, &mut log, &mut generation);
        conversation = step.state;
    }
    log
}

/// The events `effects` append, into `log`; the generation of a stream
/// they start or schedule a retry of, into `generation`.
fn collect(
    effects: &[Effect],
    log: &mut Vec<Event>,
    generation: &mut Option<keel_core::Generation>,
) {
    for effect in effects {
        match effect {
            Effect::Append { events } => log.extend(events.iter().cloned()),
            Effect::StartStream {
                generation: started,
                ..
            }
            | Effect::SetTimer {
                timer:
                    keel_core::Timer::Retry {
                        generation: started,
                    },
                ..
            } => *generation = Some(*started),
            _ => {}
        }
    }
}

fn sample_records() -> Vec<Vec<u8>> {
    let log = sample_log();
    log.iter()
        .map(codec::encode)
        .chain(log.iter().map(codec::encode_v1))
        .collect()
}

fn sample_checkpoints() -> Vec<Vec<u8>> {
    let log = sample_log();
    (1..=log.len())
        .map(|cut| checkpoint::encode(&WorkingSet::replay(&log[..cut]).unwrap()))
        .collect()
}

/// A record the decoder accepts comes back equal through both encodings.
fn check_record(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(event) = codec::decode(bytes) {
        prop_assert_eq!(codec::decode(&codec::encode(&event)), Ok(event.clone()));
        prop_assert_eq!(codec::decode(&codec::encode_v1(&event)), Ok(event));
    }
    Ok(())
}

fn check_checkpoint(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(working) = checkpoint::decode(bytes) {
        prop_assert_eq!(
            checkpoint::decode(&checkpoint::encode(&working)),
            Ok(working)
        );
    }
    Ok(())
}

/// Replaces the `target`th node (in depth-first order) of `value`.
fn replace_node(value: &mut Value, target: &mut usize, new: &Value) -> bool {
    if *target == 0 {
        *value = new.clone();
        return true;
    }
    *target -= 1;
    match value {
        Value::Array(items) => items.iter_mut().any(|item| replace_node(item, target, new)),
        Value::Object(map) => map.values_mut().any(|item| replace_node(item, target, new)),
        _ => false,
    }
}

fn count_nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn record_decoder_takes_any_bytes(
        first in prop_oneof![Just(b'{'), Just(0x82u8), any::<u8>()],
        rest in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = vec![first];
        bytes.extend(rest);
        check_record(&bytes)?;
    }

    /// Real records of both versions with damaged bytes.
    #[test]
    fn record_decoder_takes_damaged_records(
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec(byte_edit(), 1..4),
    ) {
        let records = sample_records();
        let mut bytes = records[pick.index(records.len())].clone();
        for edit in edits {
            edit.apply(&mut bytes);
        }
        check_record(&bytes)?;
    }

    /// Version 1 records with one node of their JSON (a field, the kind,
    /// the version) replaced by a value of any type.
    #[test]
    fn record_decoder_takes_wrong_types(
        pick in any::<prop::sample::Index>(),
        node in any::<prop::sample::Index>(),
        new in json_value(),
    ) {
        let log = sample_log();
        let event = &log[pick.index(log.len())];
        let mut record: Value = serde_json::from_slice(&codec::encode_v1(event)).unwrap();
        let mut target = node.index(count_nodes(&record));
        replace_node(&mut record, &mut target, &new);
        check_record(&serde_json::to_vec(&record).unwrap())?;
    }

    #[test]
    fn checkpoint_decoder_takes_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_checkpoint(&bytes)?;
    }

    /// Real checkpoints with damaged bytes.
    #[test]
    fn checkpoint_decoder_takes_damaged_checkpoints(
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec(byte_edit(), 1..4),
    ) {
        let checkpoints = sample_checkpoints();
        let mut bytes = checkpoints[pick.index(checkpoints.len())].clone();
        for edit in edits {
            edit.apply(&mut bytes);
        }
        check_checkpoint(&bytes)?;
    }
}

/// The seeds are what they claim to be: every record and checkpoint decodes
/// and round-trips, and the sample log has the kinds it is meant to cover.
/// With `KEEL_FUZZ_CORPUS=DIR`, they are written to `DIR/<target>/` for
/// the fuzz targets (docs/fuzzing.md).
#[test]
fn seed_corpus() {
    let log = sample_log();
    assert!(log.len() >= 12, "the sample log is too short: {log:#?}");
    let records = sample_records();
    for record in &records {
        let event = codec::decode(record).unwrap();
        check_record(record).unwrap();
        assert!(log.contains(&event));
    }
    let checkpoints = sample_checkpoints();
    for bytes in &checkpoints {
        checkpoint::decode(bytes).unwrap();
    }

    let Some(corpus) = std::env::var_os("KEEL_FUZZ_CORPUS") else {
        return;
    };
    let corpus = PathBuf::from(corpus);
    let write = |target: &str, name: String, bytes: &[u8]| {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    for (n_record, record) in records.iter().enumerate() {
        write("event_record", format!("record-{n_record:02}"), record);
    }
    for (n_checkpoint, bytes) in checkpoints.iter().enumerate() {
        write("checkpoint", format!("checkpoint-{n_checkpoint:02}"), bytes);
    }
    // Stream seeds: the body with a 0x0e byte in front (16 KiB chunks, see
    // fuzz/src/lib.rs), and the same in 1-byte chunks.
    for (provider, target) in [
        (Provider::Anthropic, "anthropic_stream"),
        (Provider::OpenAi, "openai_stream"),
    ] {
        for (n_body, body) in provider.fixtures().iter().enumerate() {
            for (mode, chunks) in [(0x0e_u8, "whole"), (0x00, "bytewise")] {
                let mut seed = vec![mode];
                seed.extend_from_slice(body);
                write(target, format!("fixture-{n_body:02}-{chunks}"), &seed);
            }
        }
    }
}

/// A tool result's images read back in both record versions, and a
/// result without any is written as before they existed.
#[test]
fn a_tool_results_images_read_back() {
    let result = |images: Vec<keel_core::message::ImageRef>| Event {
        seq: 7,
        at: Timestamp(1_700_000_007_000),
        parent: Some(6),
        triggers_turn: false,
        kind: keel_core::event::EventKind::ToolResult {
            tool_call_id: ToolCallId::new("toolu_1"),
            content: "the screen".to_owned(),
            is_error: false,
            synthetic: false,
            images,
        },
    };
    let with = result(vec![keel_core::message::ImageRef {
        hash: "ab".repeat(32),
        media_type: "image/png".to_owned(),
        width: 8,
        height: 6,
        size: 99,
    }]);
    assert_eq!(codec::decode(&codec::encode_v1(&with)), Ok(with.clone()));
    assert_eq!(codec::decode(&codec::encode(&with)), Ok(with));
    let without = result(Vec::new());
    let v1 = String::from_utf8(codec::encode_v1(&without)).unwrap_or_default();
    assert!(!v1.contains("images"), "{v1}");
    assert_eq!(codec::decode(&codec::encode(&without)), Ok(without));
}

/// A number in a tool call's input reads back from the log exactly, in
/// both record versions: the fuzz test above once found one that JSON
/// records changed in its last digit (serde_json needs `float_roundtrip`).
#[test]
fn a_tool_inputs_numbers_read_back_exactly() {
    for number in [
        -6.601467273491322e-159,
        0.1 + 0.2,
        1e300,
        -2.2250738585072014e-308,
    ] {
        let event = Event {
            seq: 5,
            at: Timestamp(1_700_000_005_000),
            parent: Some(4),
            triggers_turn: false,
            kind: keel_core::event::EventKind::AssistantMessage {
                blocks: vec![AssistantBlock::ToolUse {
                    call: ToolCall {
                        id: ToolCallId::new("toolu_1"),
                        name: "bash".to_owned(),
                        input: serde_json::json!({"n": number}),
                    },
                }],
                stop_reason: StopReason::ToolUse,
                usage: Usage::default(),
                provider: keel_core::config::ProviderKind::Anthropic,
                model: "claude-test".to_owned(),
            },
        };
        assert_eq!(
            codec::decode(&codec::encode_v1(&event)),
            Ok(event.clone()),
            "{number:e}"
        );
        assert_eq!(
            codec::decode(&codec::encode(&event)),
            Ok(event),
            "{number:e}"
        );
    }
}
