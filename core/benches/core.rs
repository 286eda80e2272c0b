#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Benchmarks of keel-core's hot paths (see docs/benchmarks.md).
//!
//! - `transition/delta`: one streamed text delta through `transition()`.
//! - `transition/turn`: a whole tool-using turn, reported per input.
//! - `replay/10k`: `WorkingSet::replay` of a 10,000-event log.
//! - `replay/10k_owned`: `WorkingSet::replay_owned` of the same log, which
//!   it consumes (as a rebuild from the store does).
//! - `codec/decode_10k`, `codec/encode_10k`: the same log through the codec
//!   (record version 2); `codec/{decode,encode}_v1_10k`: through version 1.
//!
//! Every conversation, history and log here is built by driving real
//! transitions, so the benchmarks measure states keel can actually reach.
//! Inputs are built before the clock starts: the figures are the core's
//! cost, not the cost of making test data. Their text comes from
//! keel-test-support's `text` (the `CORE_WORDS` vocabulary), seeded, so
//! every run builds the same logs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use keel_core::codec;
use keel_core::config::ProviderKind;
use keel_core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_core::{
    create, transition, AssistantResponse, Conversation, ConversationConfig, ConversationId, Event,
    Generation, Input, NewConversation, Phase, StateName, StreamDelta, Timestamp, ToolCallId,
    WorkingSet,
};
use keel_test_support::text::{Rng, CORE_WORDS};

/// 2026-01-01T00:00:00Z, in milliseconds.
const T0: u64 = 1_767_225_600_000;

/// Events in the replay log.
const LOG_EVENTS: usize = 10_000;

/// Text deltas fed per `transition/delta` iteration (one response's worth).
const DELTAS_PER_BATCH: usize = 1_000;

/// Turns of history before the `transition/*` conversations.
const SHORT_HISTORY_TURNS: usize = 3;

/// Cut text into stream-sized pieces of 15..=25 bytes (ASCII only).
fn chunks(rng: &mut Rng, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let n = rng.range(15, 25).min(rest.len());
        let (head, tail) = rest.split_at(n);
        out.push(head.to_owned());
        rest = tail;
    }
    out
}

/// What a scripted turn looks like.
#[derive(Clone, Copy)]
struct TurnShape {
    /// Assistant responses that call tools before the final text answer.
    tool_rounds: usize,
    /// Tool calls per tool-using response.
    calls_per_round: usize,
    /// Feed the deltas a provider would stream (they append nothing).
    stream: bool,
}

/// Drives a conversation through real transitions, keeping the log and
/// recording every input it feeds.
struct Driver {
    conv: Option<Conversation>,
    now: u64,
    log: Vec<Event>,
    inputs: Vec<Input>,
    rng: Rng,
    next_tool: u64,
    input_tokens: u64,
}

impl Driver {
    fn new(seed: u64) -> Driver {
        let config = ConversationConfig {
            system: Some("You are a careful coding agent working in a Rust repository.".into()),
            ..ConversationConfig::default()
        };
        let step = create(
            NewConversation {
                id: ConversationId::new("bench-conversation").unwrap(),
                cwd: "/home/user/project".to_owned(),
                config,
                parent_conversation: None,
            },
            Timestamp::from_millis(T0),
        );
        Driver {
            log: step.appended().to_vec(),
            conv: Some(step.state),
            now: T0,
            inputs: Vec::new(),
            rng: Rng::new(seed),
            next_tool: 0,
            input_tokens: 1_500,
        }
    }

    fn conv(&self) -> &Conversation {
        self.conv.as_ref().unwrap()
    }

    fn feed(&mut self, input: Input) {
        self.now += 13;
        self.inputs.push(input.clone());
        let step = transition(
            self.conv.take().unwrap(),
            input,
            Timestamp::from_millis(self.now),
        );
        assert!(step.rejection.is_none(), "rejected: {:?}", step.rejection);
        self.log.extend_from_slice(step.appended());
        self.conv = Some(step.state);
    }

    fn generation(&self) -> Generation {
        match &self.conv().phase {
            Phase::Streaming { request, .. } => request.generation,
            other => panic!("expected streaming, found {:?}", other.name()),
        }
    }

    fn user_message(&mut self) {
        let text = self.rng.text(CORE_WORDS, 100, 500);
        self.feed(Input::UserMessage {
            text,
            images: Vec::new(),
        });
    }

    fn delta(&mut self, delta: StreamDelta) {
        let generation = self.generation();
        self.feed(Input::StreamDelta { generation, delta });
    }

    /// Stream (optionally) and finish one response: text, then `calls` tool calls.
    fn respond(&mut self, calls: usize, stream: bool) -> Vec<ToolCallId> {
        let text = self.rng.text(CORE_WORDS, 100, 500);
        if stream {
            for chunk in chunks(&mut self.rng, &text) {
                self.delta(StreamDelta::Text { text: chunk });
            }
        }
        let mut blocks = vec![AssistantBlock::Text { text }];
        let mut ids = Vec::new();
        for _ in 0..calls {
            self.next_tool += 1;
            let id = ToolCallId::new(format!("toolu_{:020}", self.next_tool));
            let (name, input) = if self.rng.next_u64().is_multiple_of(3) {
                let path = format!("src/{}.rs", self.rng.pick(CORE_WORDS));
                ("read_file", serde_json::json!({ "path": path }))
            } else {
                let command = format!(
                    "cargo test -p keel-core -- {}",
                    self.rng.text(CORE_WORDS, 10, 120)
                );
                ("bash", serde_json::json!({ "command": command }))
            };
            if stream {
                self.delta(StreamDelta::ToolUseStarted {
                    id: id.clone(),
                    name: name.to_owned(),
                });
                for partial_json in chunks(&mut self.rng, &input.to_string()) {
                    self.delta(StreamDelta::ToolInput {
                        id: id.clone(),
                        partial_json,
                    });
                }
            }
            blocks.push(AssistantBlock::ToolUse {
                call: ToolCall {
                    id: id.clone(),
                    name: name.to_owned(),
                    input,
                },
            });
            ids.push(id);
        }
        let generation = self.generation();
        let output_tokens = 40 + self.rng.next_u64() % 400;
        self.input_tokens += 200 + self.rng.next_u64() % 600;
        self.feed(Input::StreamFinished {
            generation,
            response: AssistantResponse {
                blocks,
                stop_reason: if calls > 0 {
                    StopReason::ToolUse
                } else {
                    StopReason::EndTurn
                },
                usage: Usage {
                    input_tokens: 12,
                    output_tokens,
                    cache_creation_input_tokens: 300,
                    cache_read_input_tokens: self.input_tokens,
                },
                provider: ProviderKind::Anthropic,
                model: "claude-sonnet-4-5".to_owned(),
            },
        });
        ids
    }

    fn run_tool(&mut self, id: ToolCallId, stream: bool) {
        let content = self.rng.text(CORE_WORDS, 100, 500);
        let is_error = self.rng.next_u64().is_multiple_of(10);
        if stream {
            // A few chunks of output as the tool runs.
            for _ in 0..3 {
                let chunk = self.rng.text(CORE_WORDS, 40, 120);
                self.feed(Input::ToolOutput {
                    tool_call_id: id.clone(),
                    chunk,
                });
            }
        }
        self.feed(Input::ToolFinished {
            tool_call_id: id,
            content,
            is_error,
            images: Vec::new(),
        });
    }

    /// One whole turn from the user's message back to idle.
    fn turn(&mut self, shape: TurnShape) {
        self.user_message();
        for _ in 0..shape.tool_rounds {
            for id in self.respond(shape.calls_per_round, shape.stream) {
                self.run_tool(id, shape.stream);
            }
        }
        self.respond(0, shape.stream);
        assert_eq!(self.conv().state_name(), StateName::Idle);
    }
}

/// A conversation, idle after a few ordinary turns.
fn short_history() -> Driver {
    let mut driver = Driver::new(0x5eed_0001);
    for round in 0..SHORT_HISTORY_TURNS {
        driver.turn(TurnShape {
            tool_rounds: round % 2 + 1,
            calls_per_round: 1,
            stream: false,
        });
    }
    driver
}

/// A log of exactly `LOG_EVENTS` events: turns of one to three tool rounds
/// with one or two calls each, texts of 100-500 bytes.
fn replay_log() -> Vec<Event> {
    let mut driver = Driver::new(0x5eed_0002);
    while driver.log.len() < LOG_EVENTS {
        let shape = TurnShape {
            tool_rounds: driver.rng.range(0, 3),
            calls_per_round: driver.rng.range(1, 2),
            stream: false,
        };
        driver.turn(shape);
    }
    let mut log = driver.log;
    log.truncate(LOG_EVENTS);
    log
}

fn transition_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("transition");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));

    // transition/delta: Streaming, fed text deltas of its own generation.
    let mut driver = short_history();
    driver.user_message();
    let streaming = driver.conv.take().unwrap();
    let generation = match &streaming.phase {
        Phase::Streaming { request, .. } => request.generation,
        other => panic!("expected streaming, found {:?}", other.name()),
    };
    let mut rng = Rng::new(0x5eed_0003);
    let deltas: Vec<Input> = (0..DELTAS_PER_BATCH)
        .map(|_| Input::StreamDelta {
            generation,
            delta: StreamDelta::Text {
                text: rng.text(CORE_WORDS, 15, 25),
            },
        })
        .collect();
    let now = Timestamp::from_millis(driver.now + 1_000);
    group.throughput(Throughput::Elements(DELTAS_PER_BATCH as u64));
    group.bench_function("delta", |b| {
        b.iter_batched(
            || (streaming.clone(), deltas.clone()),
            |(mut conv, deltas)| {
                for input in deltas {
                    let step = transition(conv, input, now);
                    black_box(&step.effects);
                    conv = step.state;
                }
                conv
            },
            BatchSize::SmallInput,
        );
    });

    // transition/turn: message, streamed tool call, tool run, streamed answer.
    let mut driver = short_history();
    let idle = driver.conv().clone();
    let start = driver.now;
    driver.inputs.clear();
    driver.turn(TurnShape {
        tool_rounds: 1,
        calls_per_round: 1,
        stream: true,
    });
    let turn: Vec<(Input, Timestamp)> = driver
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let at = Timestamp::from_millis(start + 13 * (i as u64 + 1));
            (input.clone(), at)
        })
        .collect();
    group.throughput(Throughput::Elements(turn.len() as u64));
    group.bench_function("turn", |b| {
        b.iter_batched(
            || (idle.clone(), turn.clone()),
            |(mut conv, inputs)| {
                for (input, at) in inputs {
                    let step = transition(conv, input, at);
                    assert!(step.rejection.is_none());
                    black_box(&step.effects);
                    conv = step.state;
                }
                conv
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn replay_benches(c: &mut Criterion) {
    let log = replay_log();
    let records: Vec<Vec<u8>> = log.iter().map(codec::encode).collect();
    let bytes: usize = records.iter().map(Vec::len).sum();
    let working = WorkingSet::replay(&log).unwrap();
    assert_eq!(codec::decode(&records[1]).unwrap(), log[1]);
    eprintln!(
        "replay log: {} events, {} turns, {} prompt messages, {} bytes encoded ({} bytes/event)",
        log.len(),
        working.turn,
        working.messages.len(),
        bytes,
        bytes / log.len()
    );

    let mut group = c.benchmark_group("replay");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(log.len() as u64));
    // Timed by hand so that dropping the rebuilt working set is left out.
    group.bench_function("10k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let working = WorkingSet::replay(black_box(&log));
                total += start.elapsed();
                drop(black_box(working));
            }
            total
        });
    });
    // The log is consumed, so each iteration replays a fresh copy, made
    // outside the timed section. What the events leave behind is dropped
    // inside it, as in a rebuild.
    group.bench_function("10k_owned", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let owned = log.clone();
                let start = Instant::now();
                let working = WorkingSet::replay_owned(black_box(owned));
                total += start.elapsed();
                drop(black_box(working));
            }
            total
        });
    });
    group.finish();

    // A checkpoint of the same working set: what a cold start decodes
    // instead of the log (then it replays only the events after it).
    let checkpoint = codec::checkpoint::encode(&working);
    assert_eq!(codec::checkpoint::decode(&checkpoint).unwrap(), working);
    eprintln!("checkpoint of the 10k log: {} bytes", checkpoint.len());
    let mut group = c.benchmark_group("checkpoint");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    // Dropping the decoded working set is left out, as for replay/10k.
    group.bench_function("decode_10k", |b| {
        b.iter_with_large_drop(|| codec::checkpoint::decode(black_box(&checkpoint)).unwrap());
    });
    group.bench_function("encode_10k", |b| {
        b.iter(|| black_box(codec::checkpoint::encode(black_box(&working))));
    });
    group.finish();

    let mut group = c.benchmark_group("codec");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(log.len() as u64));
    group.bench_function("decode_10k", |b| {
        b.iter(|| {
            for record in &records {
                black_box(codec::decode(black_box(record)).unwrap());
            }
        });
    });
    group.bench_function("encode_10k", |b| {
        b.iter(|| {
            for event in &log {
                black_box(codec::encode(black_box(event)));
            }
        });
    });
    // Version 1 (JSON), which older logs hold, for comparison.
    let records_v1: Vec<Vec<u8>> = log.iter().map(codec::encode_v1).collect();
    group.bench_function("decode_v1_10k", |b| {
        b.iter(|| {
            for record in &records_v1 {
                black_box(codec::decode(black_box(record)).unwrap());
            }
        });
    });
    group.bench_function("encode_v1_10k", |b| {
        b.iter(|| {
            for event in &log {
                black_box(codec::encode_v1(black_box(event)));
            }
        });
    });
    group.finish();
}

criterion_group!(benches, transition_benches, replay_benches);
criterion_main!(benches);
