//! Compaction through the state machine (docs/compaction.md): a long
//! conversation in a small context window goes on turn after turn, a
//! provider's "too long" ends in a compaction and a completed turn, a
//! summary that cannot be had leaves the oldest turns out with a note, and
//! a crash mid-compaction redoes it. Each run's log replays to the live
//! state, and no tool result is ever parted from its call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use keel_core::compaction;
use keel_core::message::{
    AssistantBlock, ContentBlock, Message, Role, StopReason, ToolCall, Usage,
};
use keel_core::*;
use serde_json::json;

const T0: u64 = 1_700_000_000_000;

struct Harness {
    conv: Option<Conversation>,
    now: u64,
    log: Vec<Event>,
    /// The `summarise` of the latest StartStream.
    summarising: Option<u32>,
}

impl Harness {
    fn new(config: ConversationConfig) -> Harness {
        let step = create(
            NewConversation {
                id: ConversationId::new("c1").unwrap(),
                cwd: "/work/project".to_owned(),
                config,
                parent_conversation: None,
            },
            Timestamp(T0),
        );
        let mut harness = Harness {
            conv: None,
            now: T0,
            log: Vec::new(),
            summarising: None,
        };
        harness.absorb(step);
        harness
    }

    fn working(&self) -> &WorkingSet {
        &self.conv.as_ref().unwrap().working
    }

    fn absorb(&mut self, step: Step) -> Step {
        self.log.extend(step.appended().iter().cloned());
        for effect in &step.effects {
            if let Effect::StartStream { summarise, .. } = effect {
                self.summarising = *summarise;
            }
        }
        self.conv = Some(step.state.clone());
        step
    }

    fn step(&mut self, input: Input) -> Step {
        self.now += 10;
        let step = transition(self.conv.take().unwrap(), input, Timestamp(self.now));
        self.absorb(step)
    }

    fn generation(&self) -> Generation {
        match &self.conv.as_ref().unwrap().phase {
            Phase::Streaming { request, .. } => request.generation,
            other => panic!("not streaming: {other:?}"),
        }
    }

    fn send(&mut self, text: &str) {
        self.step(Input::UserMessage {
            text: text.to_owned(),
            images: vec![],
        });
    }

    fn respond(&mut self, blocks: Vec<AssistantBlock>) {
        let generation = self.generation();
        let stop_reason = if blocks.iter().any(|block| block.tool_call().is_some()) {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        };
        self.step(Input::StreamFinished {
            generation,
            response: AssistantResponse {
                blocks,
                stop_reason,
                usage: Usage::default(),
                provider: ProviderKind::Mock,
                model: "mock".to_owned(),
            },
        });
    }

    fn fail(&mut self, retryable: bool, prompt_too_long: bool) {
        let generation = self.generation();
        self.step(Input::StreamFailed {
            generation,
            failure: LlmFailure {
                retryable,
                retry_after_ms: None,
                message: if prompt_too_long {
                    "prompt is too long: 2100 tokens > 2000 maximum".to_owned()
                } else {
                    "invalid request".to_owned()
                },
                prompt_too_long,
            },
            jitter: 0,
        });
    }

    /// Answer a summary request, if one is streaming, with a summary.
    fn summarise_if_asked(&mut self) -> bool {
        if self.summarising.take().is_none() {
            return false;
        }
        self.respond(vec![AssistantBlock::Text {
            text: "The user asked for builds; each one ran and printed its output.".to_owned(),
        }]);
        true
    }

    /// One turn: a message, a `bash` call, its output, an answer; a
    /// summary request answered wherever one comes.
    fn tool_turn(&mut self, n: usize) {
        self.send(&format!(
            "turn {n}: {}",
            "please build the project again. ".repeat(6)
        ));
        self.summarise_if_asked();
        let id = format!("call-{n}");
        self.respond(vec![AssistantBlock::ToolUse {
            call: ToolCall {
                id: ToolCallId::new(&id),
                name: "bash".to_owned(),
                input: json!({"command": "make"}),
            },
        }]);
        self.step(Input::ToolFinished {
            tool_call_id: ToolCallId::new(&id),
            content: "compiling… ok\n".repeat(40),
            is_error: false,
        });
        self.summarise_if_asked();
        self.respond(vec![AssistantBlock::Text {
            text: format!("Build {n} finished without errors."),
        }]);
    }

    fn compactions(&self) -> Vec<&EventKind> {
        self.log
            .iter()
            .map(|event| &event.kind)
            .filter(|kind| matches!(kind, EventKind::Compacted { .. }))
            .collect()
    }

    fn completed_turns(&self) -> usize {
        self.log
            .iter()
            .filter(|event| matches!(event.kind, EventKind::TurnCompleted { .. }))
            .count()
    }

    fn assert_sound(&self) {
        let replayed = WorkingSet::replay(&self.log).unwrap();
        assert_eq!(
            &replayed,
            self.working(),
            "replay differs from the live state"
        );
        assert!(results_follow_their_calls(&self.working().messages));
        assert_eq!(
            self.working().messages.len(),
            self.working().message_seqs.len()
        );
    }
}

fn results_follow_their_calls(messages: &[Message]) -> bool {
    let mut called = HashSet::new();
    for block in messages.iter().flat_map(|message| &message.content) {
        match block {
            ContentBlock::ToolUse { call } => {
                called.insert(call.id.clone());
            }
            ContentBlock::ToolResult { result } if !called.contains(&result.tool_call_id) => {
                return false;
            }
            _ => {}
        }
    }
    true
}

fn small_window() -> ConversationConfig {
    ConversationConfig {
        context_window: 2_000,
        ..ConversationConfig::default()
    }
}

/// The case: 50 tool turns in a 2,000-token window all complete,
/// with compactions in the log and every prompt under the window.
#[test]
fn fifty_tool_turns_in_a_small_window_all_complete() {
    let mut harness = Harness::new(small_window());
    for n in 1..=50 {
        harness.tool_turn(n);
        assert_eq!(harness.completed_turns(), n, "turn {n} did not complete");
        harness.assert_sound();
        assert!(
            compaction::prompt_tokens(harness.working()) < 2_000,
            "turn {n}: the prompt outgrew the window"
        );
    }
    let compactions = harness.compactions();
    assert!(compactions.len() >= 5, "{} compactions", compactions.len());
    for kind in compactions {
        let EventKind::Compacted {
            summary,
            tokens_before,
            tokens_after,
            replaced_messages,
            ..
        } = kind
        else {
            unreachable!()
        };
        assert!(summary.is_some());
        assert!(tokens_after < tokens_before);
        assert!(*replaced_messages > 0);
    }
    // The prompt opens with the latest summary, as a user message.
    let first = &harness.working().messages[0];
    assert_eq!(first.role, Role::User);
    let ContentBlock::Text { text } = &first.content[0] else {
        panic!("the prompt does not open with the summary: {first:?}");
    };
    assert!(text.contains("The user asked for builds"), "{text}");
}

/// A provider's "too long" mid-conversation: keel compacts and the turn
/// completes instead of failing.
#[test]
fn a_prompt_too_long_is_compacted_and_the_turn_completes() {
    let mut harness = Harness::new(ConversationConfig {
        compact_at_percent: 0,
        ..small_window()
    });
    for n in 1..=3 {
        harness.tool_turn(n);
    }
    assert!(harness.compactions().is_empty());
    harness.send("and once more");
    harness.fail(false, true);
    // The oldest turn (four messages) is summarised: the three after it
    // fit in half the threshold, which the plan keeps.
    assert_eq!(harness.summarising, Some(4));
    assert!(harness.summarise_if_asked());
    assert_eq!(harness.compactions().len(), 1);
    harness.respond(vec![AssistantBlock::Text {
        text: "done".to_owned(),
    }]);
    assert_eq!(harness.completed_turns(), 4);
    harness.assert_sound();
}

/// A summary request the provider refuses: the oldest turns are left out
/// with a note to the model, and the turn goes on.
#[test]
fn a_summary_that_cannot_be_had_leaves_the_oldest_turns_out_with_a_note() {
    let mut harness = Harness::new(ConversationConfig {
        compact_at_percent: 0,
        ..small_window()
    });
    for n in 1..=3 {
        harness.tool_turn(n);
    }
    harness.send("and once more");
    harness.fail(false, true);
    assert!(harness.summarising.is_some());
    harness.summarising = None;
    // The summary request itself is too long.
    harness.fail(false, true);
    let compactions = harness.compactions();
    assert!(matches!(
        compactions[..],
        [EventKind::Compacted { summary: None, .. }]
    ));
    let first = &harness.working().messages[0];
    let ContentBlock::Text { text } = &first.content[0] else {
        panic!("no note: {first:?}");
    };
    assert!(text.contains("left out"), "{text}");
    harness.respond(vec![AssistantBlock::Text {
        text: "done".to_owned(),
    }]);
    assert_eq!(harness.completed_turns(), 4);
    harness.assert_sound();
}

/// Too long with nothing before the latest turn: nothing can be replaced
/// without parting the turn, so the turn fails with a message that says so,
/// and the conversation takes the next message.
#[test]
fn too_long_with_one_turn_fails_that_turn_clearly() {
    let mut harness = Harness::new(small_window());
    harness.send("a huge paste");
    harness.fail(false, true);
    let failed = harness.log.iter().find_map(|event| match &event.kind {
        EventKind::TurnFailed { error, .. } => Some(error.clone()),
        _ => None,
    });
    let error = failed.expect("the turn failed");
    assert!(error.contains("latest turn alone"), "{error}");
    harness.send("something shorter");
    harness.respond(vec![AssistantBlock::Text {
        text: "ok".to_owned(),
    }]);
    assert_eq!(harness.completed_turns(), 1);
    harness.assert_sound();
}

/// A crash while the summary is being written leaves the log as it was
/// (nothing of the summary request is recorded); the restarted
/// conversation compacts again and the turn completes.
#[test]
fn a_crash_during_compaction_redoes_it() {
    let mut harness = Harness::new(small_window());
    let mut n = 0;
    while harness.summarising.is_none() {
        n += 1;
        harness.send(&format!(
            "turn {n}: {}",
            "tell me more about it. ".repeat(12)
        ));
        if harness.summarising.is_some() {
            break;
        }
        harness.respond(vec![AssistantBlock::Text {
            text: "more about it ".repeat(20),
        }]);
    }
    let log_before = harness.log.clone();
    // The process dies: a new life rebuilds from the log.
    let rebuilt = Conversation::replay(&harness.log).unwrap();
    assert!(harness.compactions().is_empty());
    harness.conv = Some(rebuilt);
    harness.summarising = None;
    harness.step(Input::Started);
    assert!(
        harness.summarising.is_some(),
        "the restarted turn compacts again"
    );
    assert_eq!(harness.log[..log_before.len()], log_before[..]);
    assert!(harness.summarise_if_asked());
    harness.respond(vec![AssistantBlock::Text {
        text: "ok".to_owned(),
    }]);
    assert_eq!(harness.compactions().len(), 1);
    assert_eq!(harness.completed_turns(), n);
    harness.assert_sound();
}
