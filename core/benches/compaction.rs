#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Compaction of a conversation whose prompt holds about 100,000 tokens
//! (docs/compaction.md, docs/benchmarks.md).
//!
//! - `compaction/due_not_due`: `compaction::due` in a 200,000-token window
//!   (threshold 160,000): not due. What every request of a long
//!   conversation pays before it is sent.
//! - `compaction/due_due`: the same prompt in a 125,000-token window
//!   (threshold 100,000): due, so `due` plans as well.
//! - `compaction/plan`: `compaction::plan` alone, in the 125,000 window.
//! - `compaction/summary_request`: the transcript request of the messages
//!   that plan replaces (`compaction::summary_request`).
//! - `compaction/tokens_after`: the estimate the `Compacted` event records
//!   (`compaction::tokens_after`, which works on a copy of the prompt).
//! - `compaction/clone_working`: `WorkingSet::clone` of the working set
//!   the compaction is folded into, alone.
//! - `compaction/apply_compacted`: `WorkingSet::apply` of the `Compacted`
//!   event, each on a clone made before the clock starts.
//!
//! The conversation is built by driving real transitions: turns of a
//! user message, one to three `bash` calls with results of 2,000-6,000
//! bytes, and an answer, until the prompt passes 100,000 tokens. The
//! compaction is keel's own: a `ChangeConfig` to the smaller window and
//! the next user message make the state machine ask for a summary, and a
//! summary of about 300 characters ends in the `Compacted` event. The
//! text comes from keel-test-support's `text` (`CORE_WORDS`), seeded, so
//! every run builds the same conversation. Its sizes are printed once,
//! before the clock starts.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use keel_core::compaction;
use keel_core::config::ProviderKind;
use keel_core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_core::{
    create, transition, AssistantResponse, Conversation, ConversationConfig, ConversationId, Event,
    EventKind, Generation, Input, NewConversation, Phase, StateName, Timestamp, ToolCallId,
    WorkingSet,
};
use keel_test_support::text::{Rng, CORE_WORDS};

/// 2026-01-01T00:00:00Z, in milliseconds.
const T0: u64 = 1_767_225_600_000;

/// The prompt's estimated tokens the history is built up to.
const HISTORY_TOKENS: u64 = 100_000;

/// A window whose threshold (80%) the history passes: 100,000 tokens.
const SMALL_WINDOW: u64 = 125_000;

/// The model's summary: about 300 characters, as a real one might start.
const SUMMARY: &str = "The user asked to make the stream decoder's tests pass. We ran \
cargo test -p keel-core repeatedly; the delta and state tests failed on a serde field \
renamed in wire.rs line 42, which was fixed. The transition tests now pass. Still open: \
the replay bench is slower than before and the user wants it measured next.";

/// Drives a conversation through real transitions.
struct Driver {
    conv: Option<Conversation>,
    now: u64,
    rng: Rng,
    next_tool: u64,
    turns: usize,
    tool_calls: usize,
}

impl Driver {
    fn new(seed: u64) -> Driver {
        let config = ConversationConfig {
            system: Some("You are a careful coding agent working in a Rust repository.".into()),
            ..ConversationConfig::default()
        };
        let step = create(
            NewConversation {
                id: ConversationId::new("bench-compaction").unwrap(),
                cwd: "/home/user/project".to_owned(),
                config,
                parent_conversation: None,
            },
            Timestamp::from_millis(T0),
        );
        Driver {
            conv: Some(step.state),
            now: T0,
            rng: Rng::new(seed),
            next_tool: 0,
            turns: 0,
            tool_calls: 0,
        }
    }

    fn conv(&self) -> &Conversation {
        self.conv.as_ref().unwrap()
    }

    fn feed(&mut self, input: Input) -> Vec<Event> {
        self.now += 13;
        let step = transition(
            self.conv.take().unwrap(),
            input,
            Timestamp::from_millis(self.now),
        );
        assert!(step.rejection.is_none(), "rejected: {:?}", step.rejection);
        let appended = step.appended().to_vec();
        self.conv = Some(step.state);
        appended
    }

    fn generation(&self) -> Generation {
        match &self.conv().phase {
            Phase::Streaming { request, .. } => request.generation,
            other => panic!("expected streaming, found {:?}", other.name()),
        }
    }

    fn finish(&mut self, blocks: Vec<AssistantBlock>, stop_reason: StopReason) -> Vec<Event> {
        let generation = self.generation();
        self.feed(Input::StreamFinished {
            generation,
            response: AssistantResponse {
                blocks,
                stop_reason,
                usage: Usage::default(),
                provider: ProviderKind::Anthropic,
                model: "claude-sonnet-4-5".to_owned(),
            },
        })
    }

    /// One turn: a message, `bash` calls one at a time with results of a
    /// few KB, and an answer.
    fn tool_turn(&mut self) {
        let text = self.rng.text(CORE_WORDS, 100, 500);
        self.feed(Input::UserMessage {
            text,
            images: Vec::new(),
        });
        for _ in 0..self.rng.range(1, 3) {
            self.next_tool += 1;
            let id = ToolCallId::new(format!("toolu_{:020}", self.next_tool));
            let command = format!(
                "cargo test -p keel-core -- {}",
                self.rng.text(CORE_WORDS, 10, 120)
            );
            let blocks = vec![
                AssistantBlock::Text {
                    text: self.rng.text(CORE_WORDS, 100, 500),
                },
                AssistantBlock::ToolUse {
                    call: ToolCall {
                        id: id.clone(),
                        name: "bash".to_owned(),
                        input: serde_json::json!({ "command": command }),
                    },
                },
            ];
            self.finish(blocks, StopReason::ToolUse);
            let content = self.rng.text(CORE_WORDS, 2_000, 6_000);
            let is_error = self.rng.next_u64().is_multiple_of(10);
            self.feed(Input::ToolFinished {
                tool_call_id: id,
                content,
                is_error,
                images: Vec::new(),
            });
            self.tool_calls += 1;
        }
        let answer = self.rng.text(CORE_WORDS, 100, 500);
        self.finish(
            vec![AssistantBlock::Text { text: answer }],
            StopReason::EndTurn,
        );
        assert_eq!(self.conv().state_name(), StateName::Idle);
        self.turns += 1;
    }
}

/// What the benchmarks run on.
struct Fixture {
    /// The prompt as `due` sees it before the next request, 200,000 window.
    not_due: WorkingSet,
    /// The same prompt, 125,000 window: the state the summary request is
    /// made in, and the `Compacted` event is folded into.
    due: WorkingSet,
    plan: compaction::Plan,
    compacted: Event,
}

fn fixture() -> Fixture {
    let mut driver = Driver::new(0x5eed_c0c0);
    while compaction::prompt_tokens(&driver.conv().working) < HISTORY_TOKENS {
        driver.tool_turn();
    }
    let idle = driver.conv().clone();
    let message = driver.rng.text(CORE_WORDS, 100, 500);

    // The default window: the next message is sent as it is.
    driver.feed(Input::UserMessage {
        text: message.clone(),
        images: Vec::new(),
    });
    let not_due = driver.conv().working.clone();
    assert!(compaction::due(&not_due).is_none());
    match &driver.conv().phase {
        Phase::Streaming { request, .. } => assert!(request.compaction.is_none()),
        other => panic!("expected streaming, found {:?}", other.name()),
    }

    // The smaller window: the same message makes keel ask for a summary.
    driver.conv = Some(idle);
    let config = ConversationConfig {
        context_window: SMALL_WINDOW,
        ..driver.conv().working.config.clone()
    };
    driver.feed(Input::ChangeConfig { config });
    driver.feed(Input::UserMessage {
        text: message,
        images: Vec::new(),
    });
    let due = driver.conv().working.clone();
    let plan = match &driver.conv().phase {
        Phase::Streaming { request, .. } => request.compaction.expect("a summary request"),
        other => panic!("expected streaming, found {:?}", other.name()),
    };
    assert_eq!(compaction::due(&due), Some(plan));
    let appended = driver.finish(
        vec![AssistantBlock::Text {
            text: SUMMARY.to_owned(),
        }],
        StopReason::EndTurn,
    );
    let compacted = appended
        .into_iter()
        .find(|event| matches!(event.kind, EventKind::Compacted { .. }))
        .expect("a Compacted event");
    let mut folded = due.clone();
    folded.apply(&compacted);
    assert_eq!(folded.messages, driver.conv().working.messages);

    let history_bytes: usize = due
        .messages
        .iter()
        .flat_map(|message| &message.content)
        .map(|block| serde_json::to_string(block).unwrap().len())
        .sum();
    eprintln!(
        "history: {} turns, {} bash calls, {} prompt messages ({} bytes as JSON), \
         {} prompt tokens (compaction::prompt_tokens)",
        driver.turns,
        driver.tool_calls,
        due.messages.len(),
        history_bytes,
        compaction::prompt_tokens(&due),
    );
    let default_plan = compaction::plan(&not_due).unwrap();
    eprintln!(
        "plan in the 200,000 window (not due): replaces {} messages; in the {} window (due): \
         replaces {} of {} messages, through seq {}, tokens_before {}",
        default_plan.replaced_messages,
        SMALL_WINDOW,
        plan.replaced_messages,
        due.messages.len(),
        plan.through_seq,
        plan.tokens_before,
    );
    let request = compaction::summary_request(&due.messages[..plan.replaced_messages]);
    let keel_core::message::ContentBlock::Text { text } = &request[0].content[0] else {
        unreachable!()
    };
    eprintln!(
        "summary request: a transcript of {} characters ({} bytes), {} estimated tokens \
         (the replaced messages: {} tokens)",
        text.chars().count(),
        text.len(),
        compaction::messages_tokens(&request),
        compaction::messages_tokens(&due.messages[..plan.replaced_messages]),
    );
    let after = compaction::tokens_after(&due, &plan, Some(SUMMARY));
    let EventKind::Compacted {
        tokens_before,
        tokens_after,
        ..
    } = &compacted.kind
    else {
        unreachable!()
    };
    assert_eq!(*tokens_after, after);
    eprintln!(
        "after compaction with a {}-character summary: {} tokens (compaction::tokens_after; \
         the event: {} -> {}), {} prompt messages",
        SUMMARY.len(),
        after,
        tokens_before,
        tokens_after,
        folded.messages.len(),
    );

    Fixture {
        not_due,
        due,
        plan,
        compacted,
    }
}

fn compaction_benches(c: &mut Criterion) {
    let Fixture {
        not_due,
        due,
        plan,
        compacted,
    } = fixture();

    let mut group = c.benchmark_group("compaction");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("due_not_due", |b| {
        b.iter(|| compaction::due(black_box(&not_due)));
    });
    group.bench_function("due_due", |b| {
        b.iter(|| compaction::due(black_box(&due)));
    });
    group.bench_function("plan", |b| {
        b.iter(|| compaction::plan(black_box(&due)));
    });
    let replaced = &due.messages[..plan.replaced_messages];
    group.bench_function("summary_request", |b| {
        b.iter_with_large_drop(|| compaction::summary_request(black_box(replaced)));
    });
    group.bench_function("tokens_after", |b| {
        b.iter(|| compaction::tokens_after(black_box(&due), &plan, Some(SUMMARY)));
    });
    group.bench_function("clone_working", |b| {
        b.iter_with_large_drop(|| black_box(&due).clone());
    });
    group.bench_function("apply_compacted", |b| {
        b.iter_batched(
            || due.clone(),
            |mut working| {
                working.apply(black_box(&compacted));
                working
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

criterion_group!(benches, compaction_benches);
criterion_main!(benches);
