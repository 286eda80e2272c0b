//! Requirement tests for keel-core: one or more per clause of the
//! requirements the core owns (docs/requirements.md), named after the
//! clause: `req_bed_…` after the REQ-BED ids, the others after the rule
//! they check (event ids and causal links, lifecycle, busy policies,
//! approvals, recovery, stop reasons, graceful stop). Each drives the real
//! `transition()` through a small harness that plays the shell: it keeps
//! the log and the state and answers effects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_core::config::{ModelRef, SubAgentLimits};
use keel_core::event::{NudgeReason, RecoveryAction};
use keel_core::live::ContextWarning;
use keel_core::message::{
    AssistantBlock, ContentBlock, ImageRef, Role, StopReason, ToolCall, Usage,
};
use keel_core::recovery::MAX_CONSECUTIVE_RESUMES;
use keel_core::reducer::RESOLUTIONS_KEPT;
use keel_core::state::{Request, Slot};
use keel_core::*;
use serde_json::json;

const T0: u64 = 1_700_000_000_000;

struct Harness {
    conv: Option<Conversation>,
    now: u64,
    log: Vec<Event>,
}

impl Harness {
    fn new(config: ConversationConfig) -> Harness {
        Harness::make(config, None)
    }

    fn sub_agent(config: ConversationConfig) -> Harness {
        Harness::make(config, Some(ConversationId::new("parent").unwrap()))
    }

    fn make(config: ConversationConfig, parent: Option<ConversationId>) -> Harness {
        let step = create(
            NewConversation {
                id: ConversationId::new("c1").unwrap(),
                cwd: "/work/project".to_owned(),
                config,
                parent_conversation: parent,
            },
            Timestamp(T0),
        );
        let mut harness = Harness {
            conv: None,
            now: T0,
            log: Vec::new(),
        };
        harness.absorb(step);
        harness
    }

    fn conv(&self) -> &Conversation {
        self.conv.as_ref().unwrap()
    }

    fn phase(&self) -> &Phase {
        &self.conv().phase
    }

    fn working(&self) -> &WorkingSet {
        &self.conv().working
    }

    fn absorb(&mut self, step: Step) -> Step {
        self.log.extend(step.appended().iter().cloned());
        self.conv = Some(step.state.clone());
        step
    }

    fn step(&mut self, input: Input) -> Step {
        let step = transition(self.conv.take().unwrap(), input, Timestamp(self.now));
        self.absorb(step)
    }

    fn advance(&mut self, millis: u64) {
        self.now += millis;
    }

    fn send(&mut self, text: &str) -> Step {
        self.step(Input::UserMessage {
            text: text.to_owned(),
            images: vec![],
        })
    }

    fn generation(&self) -> Generation {
        match self.phase() {
            Phase::Streaming { request, .. } => request.generation,
            other => panic!("not streaming: {other:?}"),
        }
    }

    fn delta(&mut self, text: &str) -> Step {
        let generation = self.generation();
        self.step(Input::StreamDelta {
            generation,
            delta: StreamDelta::Text {
                text: text.to_owned(),
            },
        })
    }

    fn respond(&mut self, blocks: Vec<AssistantBlock>, usage: Usage) -> Step {
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
                usage,
                provider: ProviderKind::Mock,
                model: "mock".to_owned(),
            },
        })
    }

    fn reply(&mut self, text: &str) -> Step {
        self.respond(vec![text_block(text)], Usage::default())
    }

    fn call_tools(&mut self, calls: &[(&str, &str)]) -> Step {
        let blocks = calls
            .iter()
            .map(|(id, name)| tool_block(id, name, json!({"command": "true"})))
            .collect();
        self.respond(blocks, Usage::default())
    }

    fn fail(&mut self, retryable: bool, retry_after_ms: Option<u64>) -> Step {
        let generation = self.generation();
        self.step(Input::StreamFailed {
            generation,
            failure: LlmFailure {
                retryable,
                retry_after_ms,
                message: "provider said no".to_owned(),
                prompt_too_long: false,
            },
            jitter: 1000,
        })
    }

    fn tool_done(&mut self, id: &str, content: &str, is_error: bool) -> Step {
        self.step(Input::ToolFinished {
            tool_call_id: ToolCallId::new(id),
            content: content.to_owned(),
            is_error,
            images: Vec::new(),
        })
    }

    fn fire(&mut self, step_with_timer: &Step) -> Step {
        let (timer, at) = timer_of(step_with_timer).expect("a timer was set");
        self.now = self.now.max(at.as_millis());
        self.step(Input::TimerFired { timer })
    }

    fn resolve(&mut self, id: &str, decision: Decision) -> Step {
        self.resolve_as(id, decision, None)
    }

    fn resolve_as(&mut self, id: &str, decision: Decision, by: Option<&str>) -> Step {
        self.step(Input::Resolve {
            tool_call_id: ToolCallId::new(id),
            decision,
            by: by.map(str::to_owned),
        })
    }

    /// Simulate a crash: rebuild from the log alone, then start an actor.
    fn restart(&mut self) -> Step {
        let conv = Conversation::replay(&self.log).unwrap();
        self.conv = Some(conv);
        self.step(Input::Started)
    }

    fn kinds(&self) -> Vec<&EventKind> {
        self.log.iter().map(|event| &event.kind).collect()
    }

    fn last_kind(&self) -> &EventKind {
        &self.log.last().unwrap().kind
    }
}

fn text_block(text: &str) -> AssistantBlock {
    AssistantBlock::Text {
        text: text.to_owned(),
    }
}

fn tool_block(id: &str, name: &str, input: serde_json::Value) -> AssistantBlock {
    AssistantBlock::ToolUse {
        call: ToolCall {
            id: ToolCallId::new(id),
            name: name.to_owned(),
            input,
        },
    }
}

fn timer_of(step: &Step) -> Option<(Timer, Timestamp)> {
    step.effects.iter().find_map(|effect| match effect {
        Effect::SetTimer { timer, at } => Some((*timer, *at)),
        _ => None,
    })
}

fn started_streams(step: &Step) -> Vec<(Generation, ModelRef)> {
    step.effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StartStream {
                generation, model, ..
            } => Some((*generation, model.clone())),
            _ => None,
        })
        .collect()
}

fn cancelled_timers(step: &Step) -> Vec<Timer> {
    step.effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::CancelTimer { timer } => Some(*timer),
            _ => None,
        })
        .collect()
}

fn started_tools(step: &Step) -> Vec<String> {
    step.effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StartTool { call } => Some(call.id.0.clone()),
            _ => None,
        })
        .collect()
}

fn published(step: &Step) -> Vec<&LiveEvent> {
    step.effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Publish { event } => Some(event),
            _ => None,
        })
        .collect()
}

fn tool_results(step: &Step) -> Vec<(String, String, bool, bool)> {
    step.appended()
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                synthetic,
                ..
            } => Some((
                tool_call_id.0.clone(),
                content.clone(),
                *is_error,
                *synthetic,
            )),
            _ => None,
        })
        .collect()
}

fn with_policy(policy: BusyPolicy) -> ConversationConfig {
    ConversationConfig {
        busy_policy: policy,
        ..ConversationConfig::default()
    }
}

fn fallback_config() -> ConversationConfig {
    ConversationConfig {
        fallback: Some(ModelRef {
            provider: ProviderKind::OpenAi,
            model: "backup".to_owned(),
        }),
        ..ConversationConfig::default()
    }
}

fn assert_idle_and_paired(harness: &Harness) {
    assert_eq!(harness.phase(), &Phase::Idle);
    assert!(harness.working().open_calls.is_empty());
    assert!(harness.working().pending.is_empty());
    assert!(harness.working().tool_uses_paired());
}

// --- REQ-BED-001: pure transitions -------------------------------------------------

#[test]
fn req_bed_001_identical_inputs_give_identical_outputs() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let state = harness.conv().clone();
    let input = Input::StreamDelta {
        generation: harness.generation(),
        delta: StreamDelta::Text {
            text: "hello".to_owned(),
        },
    };
    let first = transition(state.clone(), input.clone(), Timestamp(T0 + 5));
    let second = transition(state, input, Timestamp(T0 + 5));
    assert_eq!(first, second);
}

// --- REQ-BED-002: user message handling ---------------------------------------------

#[test]
fn req_bed_002_message_while_idle_starts_an_llm_request() {
    let mut harness = Harness::new(ConversationConfig::default());
    let step = harness.send("hello");
    assert!(step.rejection.is_none());
    let kinds: Vec<_> = step.appended().iter().map(|event| &event.kind).collect();
    assert!(matches!(kinds[0], EventKind::UserMessage { text, .. } if text == "hello"));
    assert!(matches!(kinds[1], EventKind::TurnStarted { turn: 1 }));
    assert_eq!(started_streams(&step).len(), 1);
    assert!(matches!(harness.phase(), Phase::Streaming { .. }));
    let last = harness.working().messages.last().unwrap();
    assert_eq!(last.role, Role::User);
}

#[test]
fn req_bed_002_message_while_busy_is_rejected_with_a_hint_to_cancel() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("first");
    let before = harness.conv().clone();
    let step = harness.send("second");
    let rejection = step.rejection.clone().expect("busy");
    assert_eq!(
        rejection,
        Rejection::Busy {
            state: StateName::Streaming
        }
    );
    let message = rejection.to_string();
    assert!(message.contains("agent is busy"), "{message}");
    assert!(message.contains("cancel"), "{message}");
    assert!(step.effects.is_empty());
    assert_eq!(harness.conv(), &before);
}

#[test]
fn req_bed_002_busy_rejection_applies_in_every_busy_state() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("gated".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("go");
    harness.call_tools(&[("t1", "bash"), ("t2", "gated")]);
    assert_eq!(
        harness.send("x").rejection,
        Some(Rejection::Busy {
            state: StateName::ExecutingTools
        })
    );
    harness.tool_done("t1", "ok", false);
    assert_eq!(
        harness.send("x").rejection,
        Some(Rejection::Busy {
            state: StateName::AwaitingInput
        })
    );
}

#[test]
fn empty_message_is_rejected_and_changes_nothing() {
    let mut harness = Harness::new(ConversationConfig::default());
    let before = harness.conv().clone();
    let step = harness.send("   ");
    assert_eq!(step.rejection, Some(Rejection::EmptyMessage));
    assert_eq!(harness.conv(), &before);
}

// --- REQ-BED-003: LLM response processing -------------------------------------------

#[test]
fn req_bed_003_text_with_end_turn_goes_idle_and_is_persisted() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.reply("hello there");
    assert_eq!(harness.phase(), &Phase::Idle);
    let kinds: Vec<_> = step.appended().iter().map(|event| &event.kind).collect();
    assert!(matches!(kinds[0], EventKind::AssistantMessage { .. }));
    assert!(matches!(kinds[1], EventKind::TurnCompleted { turn: 1, .. }));
    let last = harness.working().messages.last().unwrap();
    assert_eq!(last.role, Role::Assistant);
    assert_eq!(
        last.content,
        vec![ContentBlock::Text {
            text: "hello there".to_owned()
        }]
    );
}

#[test]
fn req_bed_003_tool_use_goes_to_executing_tools_with_the_first_call() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.call_tools(&[("t1", "bash"), ("t2", "bash")]);
    assert_eq!(started_tools(&step), vec!["t1"]);
    assert!(matches!(harness.phase(), Phase::ExecutingTools { current, .. } if current.0 == "t1"));
    let queued: Vec<_> = harness
        .working()
        .open_calls
        .iter()
        .map(|call| call.id.0.as_str())
        .collect();
    assert_eq!(queued, vec!["t1", "t2"]);
}

#[test]
fn req_bed_003_text_without_end_keeps_streaming() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.delta("par");
    harness.delta("tial");
    assert!(step.appended().is_empty(), "deltas are live only");
    match harness.phase() {
        Phase::Streaming { partial, .. } => assert_eq!(partial, "partial"),
        other => panic!("expected streaming, got {other:?}"),
    }
    assert!(published(&step)
        .iter()
        .any(|event| matches!(event, LiveEvent::Delta { .. })));
}

// --- REQ-BED-004: tool execution coordination --------------------------------------

#[test]
fn req_bed_004_tools_run_serially_in_request_order() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let first = harness.call_tools(&[("t1", "bash"), ("t2", "bash"), ("t3", "bash")]);
    assert_eq!(started_tools(&first), vec!["t1"]);
    let second = harness.tool_done("t1", "one", false);
    assert_eq!(started_tools(&second), vec!["t2"]);
    assert!(started_streams(&second).is_empty());
    let third = harness.tool_done("t2", "two", false);
    assert_eq!(started_tools(&third), vec!["t3"]);
}

#[test]
fn req_bed_004_when_all_tools_complete_all_results_go_to_the_llm() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash"), ("t2", "bash")]);
    harness.tool_done("t1", "one", false);
    let step = harness.tool_done("t2", "two", false);
    assert_eq!(started_streams(&step).len(), 1);
    let last = harness.working().messages.last().unwrap();
    assert_eq!(last.role, Role::User);
    let ids: Vec<_> = last
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolResult { result } => Some(result.tool_call_id.0.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec!["t1", "t2"]);
}

#[test]
fn req_bed_004_a_failed_tool_reaches_the_llm_as_an_error_result() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    let step = harness.tool_done("t1", "command not found", true);
    assert_eq!(
        tool_results(&step),
        vec![("t1".to_owned(), "command not found".to_owned(), true, false)]
    );
    assert_eq!(
        started_streams(&step).len(),
        1,
        "the model handles the error"
    );
}

// --- REQ-BED-005: cancellation ------------------------------------------------------

#[test]
fn req_bed_005_cancel_while_streaming_aborts_and_keeps_no_partial_response() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let generation = harness.generation();
    harness.delta("half an ans");
    let step = harness.step(Input::Cancel);
    assert!(step.effects.contains(&Effect::AbortStream { generation }));
    assert_idle_and_paired(&harness);
    assert!(matches!(
        harness.last_kind(),
        EventKind::TurnInterrupted { reason: InterruptReason::Cancelled, partial_text: Some(text), .. } if text == "half an ans"
    ));
    // The partial text is for display only; the LLM never sees it.
    assert!(harness
        .working()
        .messages
        .iter()
        .all(|message| message.role == Role::User));
}

#[test]
fn req_bed_005_cancel_during_tools_kills_the_tool_and_answers_every_call() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash"), ("t2", "bash"), ("t3", "bash")]);
    harness.tool_done("t1", "done", false);
    harness.step(Input::ToolOutput {
        tool_call_id: ToolCallId::new("t2"),
        chunk: "progress 40%".to_owned(),
    });
    let step = harness.step(Input::Cancel);
    assert!(step.effects.contains(&Effect::AbortTool {
        tool_call_id: ToolCallId::new("t2")
    }));
    let results = tool_results(&step);
    assert_eq!(results.len(), 2);
    assert_eq!(results[0].0, "t2");
    assert!(results[0].1.contains("cancelled by the user"));
    assert!(
        results[0].1.contains("progress 40%"),
        "the output so far reaches the model"
    );
    assert_eq!(results[1].0, "t3");
    assert!(results.iter().all(|result| result.2 && result.3));
    assert_idle_and_paired(&harness);
}

#[test]
fn req_bed_005_cancel_is_not_queued_behind_the_operation() {
    // The abort is an effect of the cancel itself, not of the tool finishing:
    // a late result from the killed tool is stale and changes nothing.
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    harness.step(Input::Cancel);
    let after_cancel = harness.conv().clone();
    let late = harness.tool_done("t1", "finished anyway", false);
    assert!(late.effects.is_empty());
    assert_eq!(harness.conv(), &after_cancel);
}

#[test]
fn req_bed_005_cancel_preserves_history_including_synthetic_results() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    harness.step(Input::Cancel);
    let replayed = Conversation::replay(&harness.log).unwrap();
    assert_eq!(&replayed.working, harness.working());
    assert!(replayed.working.tool_uses_paired());
    assert_eq!(replayed.working.messages.len(), 3);
}

#[test]
fn req_bed_005_cancel_from_retry_wait_and_awaiting_input() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.fail(true, None);
    assert!(matches!(harness.phase(), Phase::RetryWait { .. }));
    harness.step(Input::Cancel);
    assert_idle_and_paired(&harness);

    harness.send("ask me");
    harness.respond(
        vec![tool_block("q1", "ask_user", json!({"question": "which?"}))],
        Usage::default(),
    );
    assert_eq!(harness.phase(), &Phase::AwaitingInput);
    let step = harness.step(Input::Cancel);
    let results = tool_results(&step);
    assert_eq!(results.len(), 1);
    assert!(results[0].1.contains("cancelled by the user"));
    assert_idle_and_paired(&harness);
}

// --- REQ-BED-006: error recovery -----------------------------------------------------

#[test]
fn req_bed_006_retryable_failures_retry_three_times_with_exponential_backoff() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let mut delays = Vec::new();
    for retry in 1..=3 {
        let step = harness.fail(true, None);
        let retrying = published(&step)
            .into_iter()
            .find_map(|event| match event {
                LiveEvent::Retrying {
                    retry,
                    delay_ms,
                    max_retries,
                    ..
                } => Some((*retry, *delay_ms, *max_retries)),
                _ => None,
            })
            .expect("a retry notice for the user");
        assert_eq!(retrying.0, retry);
        assert_eq!(retrying.2, 3);
        delays.push(retrying.1);
        assert!(matches!(harness.phase(), Phase::RetryWait { .. }));
        let resent = harness.fire(&step);
        assert_eq!(started_streams(&resent).len(), 1);
    }
    assert_eq!(delays, vec![1_000, 2_000, 4_000]);
    let step = harness.fail(true, None);
    assert!(
        matches!(harness.phase(), Phase::Error { message } if message.contains("failed 4 times"))
    );
    assert!(matches!(
        step.appended().last().map(|event| &event.kind),
        Some(EventKind::TurnFailed { .. })
    ));
}

#[test]
fn req_bed_006_retry_after_is_honoured() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.fail(true, Some(7_500));
    let (_, at) = timer_of(&step).unwrap();
    assert_eq!(at.as_millis() - harness.now, 7_500);
}

#[test]
fn req_bed_006_non_retryable_error_goes_straight_to_error_with_the_message() {
    let mut harness = Harness::new(fallback_config());
    harness.send("hi");
    let step = harness.fail(false, None);
    assert!(timer_of(&step).is_none());
    assert!(
        started_streams(&step).is_empty(),
        "no fallback for a fatal error"
    );
    assert!(
        matches!(harness.phase(), Phase::Error { message } if message.contains("provider said no"))
    );
}

#[test]
fn req_bed_006_message_in_error_state_continues_the_conversation() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.fail(false, None);
    let step = harness.send("try again");
    assert!(step.rejection.is_none());
    assert_eq!(started_streams(&step).len(), 1);
    assert!(harness.working().last_error.is_none());
    // Both user messages are in the prompt, merged into one user turn.
    let last = harness.working().messages.last().unwrap();
    assert_eq!(last.content.len(), 2);
}

#[test]
fn retries_exhausted_fall_back_to_the_fallback_provider_and_say_so() {
    let mut harness = Harness::new(fallback_config());
    harness.send("hi");
    let mut step = harness.fail(true, None);
    for _ in 0..3 {
        harness.fire(&step);
        step = harness.fail(true, None);
    }
    // The fourth failure exhausted the primary's three retries.
    let streams = started_streams(&step);
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].1.model, "backup");
    assert!(published(&step)
        .iter()
        .any(|event| matches!(event, LiveEvent::FallbackUsed { to, .. } if to.model == "backup")));
    assert!(matches!(
        harness.phase(),
        Phase::Streaming {
            request: Request {
                slot: Slot::Fallback,
                retries: 0,
                ..
            },
            ..
        }
    ));
}

#[test]
fn a_stream_that_fails_midway_is_retried_whole_and_clients_discard_its_deltas() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let generation = harness.generation();
    harness.delta("some text");
    let step = harness.fail(true, None);
    assert!(published(&step).contains(&&LiveEvent::AttemptDiscarded { generation }));
    assert!(step.appended().is_empty(), "nothing partial is persisted");
    let resent = harness.fire(&step);
    assert_ne!(started_streams(&resent)[0].0, generation);
    match harness.phase() {
        Phase::Streaming { partial, .. } => assert!(partial.is_empty()),
        other => panic!("{other:?}"),
    }
}

// --- REQ-BED-007: persistence ----------------------------------------------------------

#[test]
fn req_bed_007_state_is_persisted_before_any_other_effect() {
    let mut harness = Harness::new(ConversationConfig::default());
    let step = harness.send("hi");
    assert!(matches!(step.effects[0], Effect::Append { .. }));
    let step = harness.call_tools(&[("t1", "bash")]);
    assert!(matches!(step.effects[0], Effect::Append { .. }));
}

#[test]
fn req_bed_007_restart_under_idle_policy_restores_idle_with_history() {
    let mut harness = Harness::new(ConversationConfig {
        recovery: RecoveryPolicy::Idle,
        ..ConversationConfig::default()
    });
    harness.send("hi");
    harness.call_tools(&[("t1", "bash"), ("t2", "bash")]);
    let step = harness.restart();
    let results = tool_results(&step);
    assert_eq!(results.len(), 2);
    assert!(results
        .iter()
        .all(|result| result.1.contains("interrupted by restart")));
    assert_idle_and_paired(&harness);
    assert!(matches!(
        harness.last_kind(),
        EventKind::TurnInterrupted {
            reason: InterruptReason::Restart,
            ..
        }
    ));
    assert_eq!(harness.working().messages.len(), 3);
}

// --- Recovery under `resume` (docs/requirements.md, "Recovery after a crash or restart") ---

#[test]
fn resume_reruns_a_turn_whose_log_ends_in_a_user_message() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.delta("lost on crash");
    let step = harness.restart();
    assert!(step
        .appended()
        .iter()
        .any(|event| matches!(event.kind, EventKind::SessionStarted)));
    assert!(step.appended().iter().any(|event| matches!(
        event.kind,
        EventKind::Recovered {
            action: RecoveryAction::RerunRequest
        }
    )));
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn resume_redispatches_a_dangling_tool_call_with_the_same_id() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash"), ("t2", "bash")]);
    harness.tool_done("t1", "one", false);
    let step = harness.restart();
    assert_eq!(started_tools(&step), vec!["t2"]);
    assert!(
        started_streams(&step).is_empty(),
        "the model is not re-rolled"
    );
}

#[test]
fn resume_gives_up_after_two_automatic_resumes_without_user_input() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    for _ in 0..MAX_CONSECUTIVE_RESUMES {
        let step = harness.restart();
        assert_eq!(started_streams(&step).len(), 1);
    }
    harness.restart();
    assert_idle_and_paired(&harness);
    assert!(matches!(
        harness.last_kind(),
        EventKind::TurnInterrupted {
            reason: InterruptReason::ResumeLimit,
            ..
        }
    ));
    // New user input resets the count.
    harness.send("again");
    let step = harness.restart();
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn pending_approvals_survive_a_restart() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("ship it");
    harness.call_tools(&[("d1", "deploy")]);
    assert_eq!(harness.phase(), &Phase::AwaitingInput);
    let step = harness.restart();
    assert_eq!(harness.phase(), &Phase::AwaitingInput);
    assert!(started_tools(&step).is_empty());
    let step = harness.resolve("d1", Decision::Approve);
    assert_eq!(started_tools(&step), vec!["d1"]);
}

#[test]
fn an_approved_call_interrupted_by_a_crash_is_redispatched_not_re_asked() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("ship it");
    harness.call_tools(&[("d1", "deploy")]);
    harness.resolve("d1", Decision::Approve);
    let step = harness.restart();
    assert_eq!(started_tools(&step), vec!["d1"]);
}

// --- REQ-BED-008 / 009: sub-agents ---------------------------------------------------------

fn sub_agent_config(max_turns: u32) -> ConversationConfig {
    ConversationConfig {
        sub_agent: SubAgentLimits {
            max_turns,
            timeout_ms: 60_000,
            ..SubAgentLimits::default()
        },
        ..ConversationConfig::default()
    }
}

#[test]
fn req_bed_008_sub_agent_completes_by_submitting_its_result() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("find the bug");
    let step = harness.respond(
        vec![tool_block(
            "s1",
            "submit_result",
            json!({"result": "it is in parse()"}),
        )],
        Usage::default(),
    );
    assert_eq!(
        harness.phase(),
        &Phase::Completed {
            result: "it is in parse()".to_owned()
        }
    );
    assert!(started_tools(&step).is_empty());
    assert!(harness.working().tool_uses_paired());
    assert!(matches!(
        harness.last_kind(),
        EventKind::Finished {
            outcome: SubAgentOutcome::Completed { .. }
        }
    ));
}

#[test]
fn req_bed_008_parent_spawns_sub_agents_through_a_dedicated_effect() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("split the work");
    let step = harness.respond(
        vec![tool_block(
            "sp1",
            "spawn_agents",
            json!({"tasks": [{"task": "a"}, {"task": "b"}]}),
        )],
        Usage::default(),
    );
    assert!(step
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::SpawnSubAgents { call, .. } if call.id.0 == "sp1")));
    // The aggregated results come back as the call's result.
    let step = harness.tool_done("sp1", "[{\"task\":1,\"result\":\"ok\"}]", false);
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn req_bed_008_a_spawn_over_the_cap_or_without_tasks_is_refused_and_the_turn_goes_on() {
    let mut harness = Harness::new(ConversationConfig {
        sub_agent: SubAgentLimits {
            max_children: 2,
            ..SubAgentLimits::default()
        },
        ..ConversationConfig::default()
    });
    harness.send("split the work");
    let step = harness.respond(
        vec![tool_block(
            "sp1",
            "spawn_agents",
            json!({"tasks": ["a", "b", "c"]}),
        )],
        Usage::default(),
    );
    assert!(!step
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::SpawnSubAgents { .. })));
    let results = tool_results(&step);
    assert_eq!(results.len(), 1);
    assert!(results[0].1.contains("at most 2"), "{}", results[0].1);
    assert!(results[0].2, "an error result");
    // The model hears of it at once and may try again.
    assert_eq!(started_streams(&step).len(), 1);

    let step = harness.respond(
        vec![tool_block("sp2", "spawn_agents", json!({"tasks": []}))],
        Usage::default(),
    );
    assert!(tool_results(&step)[0].1.contains("at least one"));
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn req_bed_008_a_confined_parents_sub_agents_may_not_be_sent_out_of_its_directory() {
    let spawn_to = |harness: &mut Harness, id: &str, cwd: &str| {
        harness.respond(
            vec![tool_block(
                id,
                "spawn_agents",
                json!({"tasks": [{"task": "look", "cwd": cwd}]}),
            )],
            Usage::default(),
        )
    };
    let spawned = |step: &Step| {
        step.effects
            .iter()
            .any(|effect| matches!(effect, Effect::SpawnSubAgents { .. }))
    };
    let mut confined = Harness::new(ConversationConfig::default());
    confined.send("split the work");
    for (id, outside) in [("sp1", "/etc"), ("sp2", "../elsewhere")] {
        let step = spawn_to(&mut confined, id, outside);
        assert!(!spawned(&step), "{outside}");
        assert!(tool_results(&step)[0].1.contains("inside yours"));
    }
    let step = spawn_to(&mut confined, "sp3", "sub/dir");
    assert!(spawned(&step), "a directory inside is fine");

    let mut free = Harness::new(ConversationConfig {
        tools_may_leave_cwd: true,
        ..ConversationConfig::default()
    });
    free.send("split the work");
    assert!(spawned(&spawn_to(&mut free, "sp1", "/etc")));
}

#[test]
fn req_bed_008_sub_agent_failure_is_terminal_and_reported() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("task");
    harness.fail(false, None);
    assert!(
        matches!(harness.phase(), Phase::Failed { reason } if reason.contains("provider said no"))
    );
    assert!(matches!(
        harness.last_kind(),
        EventKind::Finished {
            outcome: SubAgentOutcome::Failed { .. }
        }
    ));
}

#[test]
fn req_bed_008_sub_agent_times_out_at_its_deadline() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("task");
    harness.call_tools(&[("t1", "bash")]);
    harness.advance(60_000);
    let step = harness.step(Input::TimerFired {
        timer: Timer::Deadline,
    });
    assert!(step.effects.contains(&Effect::AbortTool {
        tool_call_id: ToolCallId::new("t1")
    }));
    assert!(matches!(harness.phase(), Phase::Failed { reason } if reason.contains("timed out")));
    assert!(harness.working().tool_uses_paired());
}

#[test]
fn sub_agent_creation_arms_its_mandatory_deadline() {
    let step = create(
        NewConversation {
            id: ConversationId::new("child").unwrap(),
            cwd: "/tmp".to_owned(),
            config: sub_agent_config(5),
            parent_conversation: Some(ConversationId::new("parent").unwrap()),
        },
        Timestamp(T0),
    );
    assert_eq!(
        timer_of(&step),
        Some((Timer::Deadline, Timestamp(T0 + 60_000)))
    );
}

#[test]
fn sub_agent_gets_one_grace_turn_at_its_turn_cap_then_fails() {
    let mut harness = Harness::sub_agent(sub_agent_config(2));
    harness.send("task");
    harness.call_tools(&[("t1", "bash")]);
    harness.tool_done("t1", "x", false);
    harness.call_tools(&[("t2", "bash")]);
    let step = harness.tool_done("t2", "x", false);
    // Cap of 2 reached: one grace request, with a note telling it to submit.
    assert_eq!(started_streams(&step).len(), 1);
    assert!(step.appended().iter().any(|event| matches!(
        event.kind,
        EventKind::Nudge {
            reason: NudgeReason::TurnCap,
            ..
        }
    )));
    harness.call_tools(&[("t3", "bash")]);
    harness.tool_done("t3", "x", false);
    assert!(matches!(harness.phase(), Phase::Failed { reason } if reason.contains("turn cap")));
    assert!(harness.working().tool_uses_paired());
}

#[test]
fn sub_agent_answering_in_text_is_reminded_to_submit() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("task");
    let step = harness.reply("I think I am done");
    assert_eq!(started_streams(&step).len(), 1);
    assert!(step.appended().iter().any(|event| matches!(
        event.kind,
        EventKind::Nudge {
            reason: NudgeReason::MissingSubmit,
            ..
        }
    )));
}

#[test]
fn req_bed_009_sub_agents_cannot_spawn_and_are_not_user_initiated() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    assert!(!harness.working().user_initiated);
    harness.send("task");
    let step = harness.call_tools(&[("sp", "spawn_agents")]);
    let results = tool_results(&step);
    assert_eq!(results.len(), 1);
    assert!(results[0].1.contains("cannot spawn"));
    assert!(!step
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::SpawnSubAgents { .. })));
}

#[test]
fn submit_result_outside_a_sub_agent_is_an_error_result() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.call_tools(&[("s1", "submit_result")]);
    assert!(tool_results(&step)[0]
        .1
        .contains("only available to sub-agents"));
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn terminal_states_absorb_every_later_input() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("task");
    harness.respond(
        vec![tool_block("s1", "submit_result", json!({"result": "done"}))],
        Usage::default(),
    );
    let before = harness.conv().clone();
    for input in [
        Input::Cancel,
        Input::Started,
        Input::TimerFired {
            timer: Timer::Deadline,
        },
        Input::ChangeConfig {
            config: ConversationConfig::default(),
        },
    ] {
        let step = harness.step(input);
        assert!(step.appended().is_empty());
        assert_eq!(harness.conv(), &before);
    }
    assert_eq!(harness.send("more").rejection, Some(Rejection::Finished));
}

// --- REQ-BED-010: fixed working directory -------------------------------------------------

#[test]
fn req_bed_010_the_working_directory_is_fixed_at_creation() {
    let mut harness = Harness::new(ConversationConfig::default());
    assert_eq!(harness.working().cwd, "/work/project");
    assert!(
        matches!(&harness.log[0].kind, EventKind::Created { cwd, .. } if cwd == "/work/project")
    );
    harness.send("hi");
    harness.reply("ok");
    assert_eq!(
        Conversation::replay(&harness.log).unwrap().working.cwd,
        "/work/project"
    );
}

// --- REQ-BED-011: real-time events --------------------------------------------------------

#[test]
fn req_bed_011_every_state_change_is_published() {
    let mut harness = Harness::new(ConversationConfig::default());
    let step = harness.send("hi");
    assert!(published(&step).contains(&&LiveEvent::StateChanged {
        state: StateName::Streaming
    }));
    let step = harness.reply("ok");
    assert!(published(&step).contains(&&LiveEvent::StateChanged {
        state: StateName::Idle
    }));
    // A delta changes no state, so it announces none.
    harness.send("again");
    let step = harness.delta("x");
    assert!(!published(&step)
        .iter()
        .any(|event| matches!(event, LiveEvent::StateChanged { .. })));
}

// --- REQ-BED-012: context window tracking ---------------------------------------------------

#[test]
fn req_bed_012_usage_is_tracked_and_warnings_go_out_at_80_and_95_percent() {
    let mut harness = Harness::new(ConversationConfig {
        context_window: 1_000,
        // Warnings alone: compaction (tested below) would shrink the prompt.
        compact_at_percent: 0,
        ..ConversationConfig::default()
    });
    let mut warnings = Vec::new();
    for input_tokens in [500, 810, 820, 960, 970] {
        harness.send("more");
        let step = harness.respond(
            vec![text_block("ok")],
            Usage {
                input_tokens,
                ..Usage::default()
            },
        );
        let usage = published(&step)
            .into_iter()
            .find_map(|event| match event {
                LiveEvent::ContextUsage {
                    used,
                    limit,
                    warning,
                } => Some((*used, *limit, *warning)),
                _ => None,
            })
            .expect("usage is published with every response");
        assert_eq!(usage.0, input_tokens);
        assert_eq!(usage.1, 1_000);
        warnings.push(usage.2);
    }
    assert_eq!(
        warnings,
        vec![
            None,
            Some(ContextWarning::Approaching),
            None,
            Some(ContextWarning::Critical),
            None
        ]
    );
    assert_eq!(harness.working().usage.input_tokens, 970);
}

// --- REQ-BED-013: images ----------------------------------------------------------------------

#[test]
fn req_bed_013_image_references_flow_into_the_prompt_and_the_log() {
    let mut harness = Harness::new(ConversationConfig::default());
    let image = ImageRef {
        hash: "ab".repeat(32),
        media_type: "image/png".to_owned(),
        width: 800,
        height: 600,
        size: 12_345,
    };
    let step = harness.step(Input::UserMessage {
        text: "what is this?".to_owned(),
        images: vec![image.clone()],
    });
    assert!(
        matches!(&step.appended()[0].kind, EventKind::UserMessage { images, .. } if images == &vec![image.clone()])
    );
    let prompt = &harness.working().messages[0];
    assert!(prompt.content.contains(&ContentBlock::Image {
        image: image.clone()
    }));
    // An image alone is a valid message.
    harness.step(Input::Cancel);
    let step = harness.step(Input::UserMessage {
        text: String::new(),
        images: vec![image],
    });
    assert!(step.rejection.is_none());
}

// --- Event ids, causal links, session and turn lifecycle, busy policies ------------------------

#[test]
fn seed_002_event_ids_are_conversation_and_seq_from_one() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.reply("ok");
    let seqs: Vec<_> = harness.log.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(harness.working().id.event_id(3).to_string(), "c1:3");
}

#[test]
fn seed_002_events_in_a_turn_link_to_its_turn_started() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    harness.tool_done("t1", "x", false);
    harness.reply("done");
    let user = harness
        .log
        .iter()
        .find(|e| matches!(e.kind, EventKind::UserMessage { .. }))
        .unwrap();
    assert!(user.triggers_turn);
    let started = harness
        .log
        .iter()
        .find(|e| matches!(e.kind, EventKind::TurnStarted { .. }))
        .unwrap();
    assert_eq!(started.parent, Some(user.seq));
    for event in harness.log.iter().filter(|event| event.seq > started.seq) {
        assert_eq!(event.parent, Some(started.seq), "{event:?}");
        assert!(!event.triggers_turn);
    }
    assert_eq!(harness.log[0].parent, None);
}

#[test]
fn seed_002_session_started_on_create_and_start_session_ended_on_stop() {
    let mut harness = Harness::new(ConversationConfig::default());
    assert!(matches!(harness.kinds()[1], EventKind::SessionStarted));
    let step = harness.step(Input::Stop);
    assert!(matches!(step.appended()[0].kind, EventKind::SessionEnded));
    assert!(step.effects.contains(&Effect::SaveSnapshot));
    assert!(step.effects.contains(&Effect::Stop));
    let step = harness.restart();
    assert!(matches!(step.appended()[0].kind, EventKind::SessionStarted));
    assert_eq!(harness.phase(), &Phase::Idle);
}

#[test]
fn seed_002_turns_are_numbered_and_completed_with_their_duration() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("one");
    harness.advance(250);
    harness.reply("ok");
    harness.send("two");
    harness.reply("ok");
    let turns: Vec<_> = harness
        .log
        .iter()
        .filter_map(|event| match event.kind {
            EventKind::TurnCompleted {
                turn, duration_ms, ..
            } => Some((turn, duration_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(turns, vec![(1, 250), (2, 0)]);
}

#[test]
fn seed_002_interrupt_policy_interrupts_the_turn_and_debounces_100ms() {
    let mut harness = Harness::new(with_policy(BusyPolicy::Interrupt));
    let step = harness.send("first");
    assert!(started_streams(&step).is_empty(), "debounced");
    let step = harness.fire(&step);
    assert_eq!(started_streams(&step).len(), 1);
    let generation = harness.generation();
    harness.delta("working on fir");

    let step = harness.send("actually, second");
    assert!(step.rejection.is_none());
    assert!(step.effects.contains(&Effect::AbortStream { generation }));
    assert!(step.appended().iter().any(|event| matches!(
        event.kind,
        EventKind::TurnInterrupted {
            reason: InterruptReason::Superseded,
            ..
        }
    )));
    let (first_timer, at) = timer_of(&step).unwrap();
    assert_eq!(at.as_millis(), harness.now + 100);
    harness.advance(50);
    let third = harness.send("and third");
    // The earlier debounce is now stale: only the latest message's timer starts the turn.
    let stale = harness.step(Input::TimerFired { timer: first_timer });
    assert!(stale.effects.is_empty());
    let step = harness.fire(&third);
    assert_eq!(started_streams(&step).len(), 1);
    let last_user = harness.working().messages.last().unwrap();
    // The interrupted turn produced no response, so all three messages form
    // one user turn of the prompt.
    assert_eq!(last_user.content.len(), 3);
}

#[test]
fn queue_policy_holds_messages_until_the_turn_ends_then_runs_them() {
    let mut harness = Harness::new(with_policy(BusyPolicy::Queue));
    harness.send("first");
    let step = harness.send("second");
    assert!(step.rejection.is_none());
    assert!(started_streams(&step).is_empty());
    assert_eq!(harness.working().queued.len(), 1);
    // The queued message is not in the prompt of the running turn.
    assert_eq!(harness.working().messages.len(), 1);
    let step = harness.reply("answer to first");
    assert_eq!(
        started_streams(&step).len(),
        1,
        "the queued message starts a turn"
    );
    assert!(harness.working().queued.is_empty());
    assert_eq!(harness.working().turn, 2);
    let last = harness.working().messages.last().unwrap();
    assert_eq!(last.role, Role::User);
}

#[test]
fn queue_policy_is_bounded() {
    let mut harness = Harness::new(with_policy(BusyPolicy::Queue));
    harness.send("first");
    for n in 0..32 {
        assert!(harness.send(&format!("queued {n}")).rejection.is_none());
    }
    assert_eq!(
        harness.send("one too many").rejection,
        Some(Rejection::QueueFull { limit: 32 })
    );
}

// --- Approvals and pending kinds (docs/requirements.md) -----------------------------------

#[test]
fn seed_003_gated_tool_waits_for_approval_then_runs() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("ship");
    let step = harness.call_tools(&[("d1", "deploy")]);
    assert!(started_tools(&step).is_empty());
    assert_eq!(harness.phase(), &Phase::AwaitingInput);
    assert_eq!(harness.working().pending[0].kind, PendingKind::Approval);
    let step = harness.resolve("d1", Decision::Approve);
    assert_eq!(started_tools(&step), vec!["d1"]);
}

/// An approval with a changed input runs the call with it, records the
/// decision with the input, and shows the model the call as it ran; the
/// same edit again is a no-op, another decision is refused, and a replay
/// of the log makes the same working set.
#[test]
fn an_edited_approval_runs_the_call_with_its_new_input() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy")]);
    let edited = json!({"target": "staging"});
    let edit = Decision::Edit {
        input: edited.clone(),
    };
    let step = harness.resolve("d1", edit.clone());
    let started: Vec<_> = step
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StartTool { call } => Some((call.id.0.clone(), call.input.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(started, vec![("d1".to_owned(), edited.clone())]);
    assert!(step.appended().iter().any(|event| matches!(
        &event.kind,
        EventKind::Resolved { decision, .. } if *decision == edit
    )));
    let shown: Vec<_> = harness
        .working()
        .messages
        .iter()
        .flat_map(|message| &message.content)
        .filter_map(|block| match block {
            ContentBlock::ToolUse { call } => Some(call.input.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        shown,
        vec![edited.clone()],
        "the model sees the call as it ran"
    );
    assert_eq!(
        WorkingSet::replay(&harness.log).unwrap(),
        harness.working().clone(),
        "replay equals live"
    );

    assert!(
        harness.resolve("d1", edit).rejection.is_none(),
        "the same edit again"
    );
    assert!(matches!(
        harness.resolve("d1", Decision::Approve).rejection,
        Some(Rejection::AlreadyResolved { .. })
    ));
}

#[test]
fn an_edit_is_only_for_approvals() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("ask");
    harness.respond(
        vec![tool_block("q1", "ask_user", json!({"question": "?"}))],
        Usage::default(),
    );
    let before = harness.conv().clone();
    assert!(matches!(
        harness
            .resolve("q1", Decision::Edit { input: json!({}) })
            .rejection,
        Some(Rejection::InvalidDecision { .. })
    ));
    assert_eq!(harness.conv(), &before);
}

#[test]
fn seed_003_denied_tool_tells_the_model_and_goes_on() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy"), ("t2", "bash")]);
    let step = harness.resolve("d1", Decision::Deny);
    assert_eq!(tool_results(&step)[0].1, "the user denied this tool call");
    assert_eq!(started_tools(&step), vec!["t2"], "the next call runs");
}

#[test]
fn resolving_an_unknown_call_or_with_the_wrong_decision_is_rejected() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("ask");
    harness.respond(
        vec![tool_block("q1", "ask_user", json!({"question": "?"}))],
        Usage::default(),
    );
    let before = harness.conv().clone();
    assert!(matches!(
        harness.resolve("nope", Decision::Approve).rejection,
        Some(Rejection::UnknownCall { .. })
    ));
    assert!(matches!(
        harness.resolve("q1", Decision::Approve).rejection,
        Some(Rejection::InvalidDecision { .. })
    ));
    assert_eq!(harness.conv(), &before);
}

#[test]
fn client_exec_tools_wait_for_the_client_answer() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("browser".to_owned(), ToolPolicy::Client)].into(),
        ..ConversationConfig::default()
    });
    harness.send("open it");
    harness.call_tools(&[("b1", "browser")]);
    assert_eq!(harness.working().pending[0].kind, PendingKind::ClientExec);
    let step = harness.resolve(
        "b1",
        Decision::Answer {
            text: "page title: keel".to_owned(),
        },
    );
    assert_eq!(tool_results(&step)[0].1, "page title: keel");
    assert_eq!(started_streams(&step).len(), 1);
}

/// A client's own tool (an AG-UI frontend's, `client_tools`) has no policy
/// of its own: a call of it waits for the client like a `client` policy.
#[test]
fn a_client_tool_waits_for_the_client_answer() {
    let mut harness = Harness::new(ConversationConfig {
        client_tools: vec![keel_core::ClientTool {
            name: "pick_color".to_owned(),
            description: "Let the user pick a color".to_owned(),
            input_schema: serde_json::json!({"type": "object"}),
        }],
        ..ConversationConfig::default()
    });
    harness.send("pick one");
    harness.call_tools(&[("p1", "pick_color")]);
    assert_eq!(harness.working().pending[0].kind, PendingKind::ClientExec);
    let step = harness.resolve(
        "p1",
        Decision::Answer {
            text: "teal".to_owned(),
        },
    );
    assert_eq!(tool_results(&step)[0].1, "teal");
    assert_eq!(started_streams(&step).len(), 1);
}

// --- Resolutions happen exactly once, and record who decided -----------------------

fn gated() -> ConversationConfig {
    ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    }
}

#[test]
fn a_resolution_records_who_decided() {
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy"), ("d2", "deploy")]);
    harness.resolve_as("d1", Decision::Approve, Some("alice"));
    assert!(matches!(
        harness.last_kind(),
        EventKind::Resolved { tool_call_id, decision: Decision::Approve, by: Some(by) }
            if tool_call_id.as_str() == "d1" && by == "alice"
    ));
    harness.tool_done("d1", "deployed", false);
    harness.resolve("d2", Decision::Deny);
    let resolved: Vec<_> = harness
        .log
        .iter()
        .filter(|event| matches!(event.kind, EventKind::Resolved { .. }))
        .collect();
    assert_eq!(resolved.len(), 2);
    assert!(matches!(
        &resolved[1].kind,
        EventKind::Resolved { by: None, .. }
    ));
    for event in resolved {
        let current = keel_core::codec::encode(event);
        assert_eq!(&keel_core::codec::decode(&current).unwrap(), event);
        let v1 = keel_core::codec::encode_v1(event);
        assert_eq!(&keel_core::codec::decode(&v1).unwrap(), event);
    }
}

#[test]
fn a_resolution_naming_who_decided_at_too_great_a_length_is_refused() {
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy")]);
    let before = harness.conv().clone();
    // Counted in characters, not bytes.
    let too_long = "é".repeat(keel_core::event::MAX_RESOLVED_BY_CHARS + 1);
    let step = harness.resolve_as("d1", Decision::Approve, Some(&too_long));
    let rejection = step.rejection.clone().expect("refused");
    assert_eq!(
        rejection,
        Rejection::ResolvedByTooLong {
            limit: keel_core::event::MAX_RESOLVED_BY_CHARS
        }
    );
    assert!(rejection.to_string().contains("at most 200 characters"));
    assert!(step.effects.is_empty());
    assert_eq!(harness.conv(), &before);
    let longest = "é".repeat(keel_core::event::MAX_RESOLVED_BY_CHARS);
    let step = harness.resolve_as("d1", Decision::Approve, Some(&longest));
    assert_eq!(step.rejection, None);
    assert_eq!(started_tools(&step), vec!["d1"]);
}

#[test]
fn resolving_again_with_the_same_decision_succeeds_and_changes_nothing() {
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy"), ("t2", "bash")]);
    harness.resolve_as("d1", Decision::Approve, Some("alice"));
    let log = harness.log.len();
    // While the approved call runs, after it finished, and after the turn
    // ended: a client that lost the answer may ask again at any point.
    let before = harness.conv().clone();
    let again = harness.resolve_as("d1", Decision::Approve, Some("bob"));
    assert_eq!(again.rejection, None);
    assert!(again.effects.is_empty(), "{:?}", again.effects);
    assert_eq!(harness.conv(), &before);
    assert_eq!(harness.log.len(), log);
    harness.tool_done("d1", "deployed", false);
    harness.tool_done("t2", "ok", false);
    let again = harness.resolve("d1", Decision::Approve);
    assert_eq!(again.rejection, None);
    assert!(again.effects.is_empty());
    harness.reply("shipped");
    let again = harness.resolve("d1", Decision::Approve);
    assert_eq!(again.rejection, None);
    assert!(again.effects.is_empty());
    let resolutions = harness
        .kinds()
        .into_iter()
        .filter(|kind| matches!(kind, EventKind::Resolved { .. }))
        .count();
    assert_eq!(resolutions, 1, "one Resolved event, however often asked");
}

#[test]
fn a_resolution_asked_again_while_stopping_still_succeeds() {
    // It was applied, so the answer is success even though the
    // conversation takes no new input any more; anything else is refused.
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy")]);
    harness.resolve("d1", Decision::Approve);
    harness.step(Input::Shutdown);
    assert_eq!(harness.phase(), &Phase::Terminating);
    let before = harness.conv().clone();
    let again = harness.resolve("d1", Decision::Approve);
    assert_eq!(again.rejection, None);
    assert!(again.effects.is_empty());
    assert_eq!(harness.conv(), &before);
    assert_eq!(
        harness.resolve("d1", Decision::Deny).rejection,
        Some(Rejection::ShuttingDown)
    );
}

#[test]
fn repeating_an_answer_must_repeat_its_text() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("ask");
    harness.respond(
        vec![tool_block("q1", "ask_user", json!({"question": "color?"}))],
        Usage::default(),
    );
    let blue = || Decision::Answer {
        text: "blue".to_owned(),
    };
    harness.resolve("q1", blue());
    let before = harness.conv().clone();
    let again = harness.resolve("q1", blue());
    assert_eq!(again.rejection, None);
    assert!(again.effects.is_empty());
    let other = harness.resolve(
        "q1",
        Decision::Answer {
            text: "red".to_owned(),
        },
    );
    assert_eq!(
        other.rejection,
        Some(Rejection::AlreadyResolved {
            tool_call_id: ToolCallId::new("q1"),
            decision: blue(),
        })
    );
    assert_eq!(harness.conv(), &before);
}

#[test]
fn a_different_decision_for_a_resolved_call_is_refused_with_the_recorded_one() {
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy"), ("t2", "bash")]);
    harness.resolve("d1", Decision::Deny);
    let before = harness.conv().clone();
    let step = harness.resolve("d1", Decision::Approve);
    let rejection = step.rejection.clone().expect("refused");
    assert_eq!(
        rejection,
        Rejection::AlreadyResolved {
            tool_call_id: ToolCallId::new("d1"),
            decision: Decision::Deny,
        }
    );
    assert_eq!(
        rejection.to_string(),
        "tool call d1 was already resolved (deny); a resolution cannot be changed"
    );
    assert!(step.effects.is_empty());
    assert_eq!(harness.conv(), &before);
    // An answer's text stays out of what the user is shown.
    let secret = Rejection::AlreadyResolved {
        tool_call_id: ToolCallId::new("q1"),
        decision: Decision::Answer {
            text: "the password".to_owned(),
        },
    };
    assert!(!secret.to_string().contains("password"), "{secret}");
}

#[test]
fn resolving_a_call_settled_otherwise_is_refused() {
    let settled = |id: &str| {
        Some(Rejection::AlreadySettled {
            tool_call_id: ToolCallId::new(id),
        })
    };
    // Cancelled while it waited: keel answered it.
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy")]);
    harness.step(Input::Cancel);
    let before = harness.conv().clone();
    let step = harness.resolve("d1", Decision::Approve);
    assert_eq!(step.rejection, settled("d1"));
    assert!(step.effects.is_empty());
    assert_eq!(harness.conv(), &before);
    assert_eq!(
        step.rejection.unwrap().to_string(),
        "tool call d1 was already settled (it has its result: it ran, was cancelled or interrupted, or was resolved long ago); nothing to resolve"
    );
    // A call that never got to wait: the process restarted under
    // `recovery = idle` while the call before it ran.
    let mut harness = Harness::new(ConversationConfig {
        recovery: RecoveryPolicy::Idle,
        ..gated()
    });
    harness.send("ship");
    harness.call_tools(&[("t1", "bash"), ("d2", "deploy")]);
    harness.restart();
    assert_eq!(
        harness.resolve("d2", Decision::Approve).rejection,
        settled("d2")
    );
    // Resolved in an earlier turn: still on record, so the same decision
    // again is accepted and changes nothing, and another is refused.
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy")]);
    harness.resolve("d1", Decision::Deny);
    harness.reply("not shipped");
    harness.send("ship anyway");
    let before = harness.conv().clone();
    let step = harness.resolve("d1", Decision::Deny);
    assert_eq!(step.rejection, None);
    assert!(step.effects.is_empty());
    assert_eq!(harness.conv(), &before);
    assert_eq!(
        harness.resolve("d1", Decision::Approve).rejection,
        Some(Rejection::AlreadyResolved {
            tool_call_id: ToolCallId::new("d1"),
            decision: Decision::Deny,
        })
    );
    // Resolved so long ago that it is no longer on record: settled.
    harness.reply("ok");
    for index in 0..RESOLUTIONS_KEPT {
        let id = format!("n{index}");
        harness.send("ship again");
        harness.call_tools(&[(id.as_str(), "deploy")]);
        harness.resolve(&id, Decision::Deny);
        harness.reply("not shipped");
    }
    assert_eq!(harness.working().resolved.len(), RESOLUTIONS_KEPT);
    assert_eq!(
        harness.resolve("d1", Decision::Deny).rejection,
        settled("d1")
    );
    assert_eq!(harness.resolve("n0", Decision::Deny).rejection, None);
    // Never seen at all.
    assert_eq!(
        harness.resolve("nope", Decision::Deny).rejection,
        Some(Rejection::UnknownCall {
            tool_call_id: ToolCallId::new("nope")
        })
    );
}

#[test]
fn a_resolution_logged_before_by_existed_is_still_readable() {
    // Version 1 (JSON), as an older keel wrote it: no `by`.
    let v1 = br#"{"v":1,"event":{"seq":7,"at":5,"parent":4,"triggers_turn":false,
        "kind":{"type":"resolved","tool_call_id":"d1","decision":{"decision":"approve"}}}}"#;
    // Version 2 (MessagePack), likewise.
    let v2 = rmp_serde::to_vec_named(&json!({
        "v": 2,
        "event": {
            "seq": 7, "at": 5, "parent": 4, "triggers_turn": false,
            "kind": {"resolved": {"tool_call_id": "d1", "decision": {"decision": "approve"}}},
        },
    }))
    .unwrap();
    for record in [&v1[..], &v2[..]] {
        let event = keel_core::codec::decode(record).unwrap();
        assert_eq!(
            event.kind,
            EventKind::Resolved {
                tool_call_id: ToolCallId::new("d1"),
                decision: Decision::Approve,
                by: None,
            }
        );
    }
}

// --- Questions to the user, the request cap, stale reports, configuration, stop ----------

#[test]
fn ask_user_must_be_the_only_tool_in_its_response() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.respond(
        vec![
            tool_block("t1", "bash", json!({})),
            tool_block("q1", "ask_user", json!({"question": "ok?"})),
        ],
        Usage::default(),
    );
    let results = tool_results(&step);
    assert_eq!(results.len(), 2);
    assert!(results
        .iter()
        .all(|result| result.2 && result.1.contains("only tool call")));
    assert!(started_tools(&step).is_empty(), "none of them ran");
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn declining_a_question_answers_declined_and_the_model_goes_on() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.respond(
        vec![tool_block("q1", "ask_user", json!({"question": "color?"}))],
        Usage::default(),
    );
    assert_eq!(
        harness.working().pending[0].prompt.as_deref(),
        Some("color?")
    );
    assert_eq!(harness.working().pending[0].kind, PendingKind::Elicitation);
    let step = harness.resolve("q1", Decision::Deny);
    assert_eq!(
        tool_results(&step),
        vec![(
            "q1".to_owned(),
            "the user declined to answer".to_owned(),
            false,
            false
        )]
    );
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn the_cap_on_requests_per_turn_stops_a_runaway_tool_loop() {
    let mut harness = Harness::new(ConversationConfig {
        max_requests_per_turn: 2,
        ..ConversationConfig::default()
    });
    harness.send("loop");
    harness.call_tools(&[("t1", "bash")]);
    harness.tool_done("t1", "x", false);
    harness.call_tools(&[("t2", "bash")]);
    let step = harness.tool_done("t2", "x", false);
    assert!(started_streams(&step).is_empty());
    assert_idle_and_paired(&harness);
    assert!(matches!(
        harness.last_kind(),
        EventKind::TurnInterrupted {
            reason: InterruptReason::RequestLimit { limit: 2 },
            ..
        }
    ));
}

#[test]
fn stale_stream_messages_from_an_earlier_attempt_are_ignored() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let old = harness.generation();
    let step = harness.fail(true, None);
    harness.fire(&step);
    let before = harness.conv().clone();
    let stale = harness.step(Input::StreamFinished {
        generation: old,
        response: AssistantResponse {
            blocks: vec![text_block("late")],
            stop_reason: StopReason::EndTurn,
            usage: Usage::default(),
            provider: ProviderKind::Mock,
            model: "mock".to_owned(),
        },
    });
    assert!(stale.effects.is_empty());
    assert_eq!(harness.conv(), &before);
}

#[test]
fn config_changes_are_logged_and_survive_replay() {
    let mut harness = Harness::new(ConversationConfig::default());
    let step = harness.step(Input::ChangeConfig {
        config: with_policy(BusyPolicy::Queue),
    });
    assert!(matches!(
        step.appended()[0].kind,
        EventKind::ConfigChanged { .. }
    ));
    let replayed = Conversation::replay(&harness.log).unwrap();
    assert_eq!(replayed.working.config.busy_policy, BusyPolicy::Queue);
}

#[test]
fn stop_mid_turn_is_refused() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.step(Input::Stop);
    assert!(matches!(step.rejection, Some(Rejection::Busy { .. })));
}

// --- Encoding ------------------------------------------------------------------------------

#[test]
fn events_round_trip_through_the_versioned_encoding() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    harness.tool_done("t1", "x", false);
    harness.reply("ok");
    for event in &harness.log {
        let bytes = keel_core::codec::encode(event);
        assert_eq!(&keel_core::codec::decode(&bytes).unwrap(), event);
    }
}

/// A MessagePack record `{v, event}` whose event is only a string: from a
/// newer keel, in the wrong format, or broken, depending on `v`.
fn msgpack_record(v: u32, event: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Record<'a> {
        v: u32,
        event: &'a str,
    }
    rmp_serde::to_vec_named(&Record { v, event }).unwrap()
}

#[test]
fn an_unknown_future_encoding_version_is_a_clear_error() {
    let error = keel_core::codec::decode(br#"{"v":99,"event":{}}"#).unwrap_err();
    assert!(error.to_string().contains("version 99"), "{error}");
    let error = keel_core::codec::decode(b"not json").unwrap_err();
    assert!(error.to_string().contains("malformed"), "{error}");
    // A MessagePack record from a newer keel.
    let error = keel_core::codec::decode(&msgpack_record(3, "something new")).unwrap_err();
    assert!(error.to_string().contains("version 3"), "{error}");
    for garbage in [&b""[..], &[0xc1][..], &[0x82, 0xa1, b'v'][..]] {
        let error = keel_core::codec::decode(garbage).unwrap_err();
        assert!(
            error.to_string().contains("malformed"),
            "{garbage:?}: {error}"
        );
    }
}

#[test]
fn records_are_written_in_the_current_version_and_version_1_stays_readable() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    harness.tool_done("t1", "x", false);
    harness.reply("ok");
    for event in &harness.log {
        let current = keel_core::codec::encode(event);
        assert_ne!(
            current.first(),
            Some(&b'{'),
            "the current version is not JSON"
        );
        let v1 = keel_core::codec::encode_v1(event);
        assert!(v1.starts_with(br#"{"v":1,"#));
        assert_eq!(&keel_core::codec::decode(&v1).unwrap(), event);
        assert_eq!(&keel_core::codec::decode(&current).unwrap(), event);
    }
    assert_eq!(keel_core::codec::CURRENT_VERSION, 2);
}

#[test]
fn a_log_written_before_optional_fields_existed_is_still_readable() {
    // A v1 record as an older keel wrote it: no images, no partial_text, a
    // config with only some fields.
    let old = br#"{"v":1,"event":{"seq":1,"at":5,"parent":null,"triggers_turn":false,
        "kind":{"type":"created","conversation":"old","cwd":"/","config":{"busy_policy":"queue"},"user_initiated":true}}}"#;
    let event = keel_core::codec::decode(old).unwrap();
    let working = WorkingSet::from_created(&event).unwrap();
    assert_eq!(working.config.busy_policy, BusyPolicy::Queue);
    assert_eq!(working.config.retry.max_retries, 3);
    let message = br#"{"v":1,"event":{"seq":2,"at":6,"parent":null,"triggers_turn":true,"kind":{"type":"user_message","text":"hi"}}}"#;
    assert!(keel_core::codec::decode(message).is_ok());
}

#[test]
fn a_message_acknowledged_during_its_debounce_gets_its_turn_after_a_crash() {
    let mut harness = Harness::new(with_policy(BusyPolicy::Interrupt));
    harness.send("hello");
    // Crash before the 100 ms debounce fired: the message is durable, so
    // recovery owes it a turn.
    let step = harness.restart();
    assert_eq!(started_streams(&step).len(), 1);
    assert!(matches!(harness.phase(), Phase::Streaming { .. }));
}

#[test]
fn a_debounce_the_user_cancelled_is_not_started_by_a_restart() {
    let mut harness = Harness::new(with_policy(BusyPolicy::Interrupt));
    harness.send("hello");
    let step = harness.step(Input::Cancel);
    assert_eq!(
        step.appended()[0].kind,
        EventKind::Unanswered {
            messages: vec![3],
            reason: InterruptReason::Cancelled
        }
    );
    assert!(
        cancelled_timers(&step).contains(&Timer::Debounce { token: 3 }),
        "the debounce timer is dropped: {:?}",
        step.effects
    );
    let step = harness.restart();
    assert!(started_streams(&step).is_empty());
    assert_eq!(harness.phase(), &Phase::Idle);
}

#[test]
fn under_idle_recovery_a_debounced_message_is_recorded_unanswered() {
    let mut harness = Harness::new(ConversationConfig {
        busy_policy: BusyPolicy::Interrupt,
        recovery: RecoveryPolicy::Idle,
        ..ConversationConfig::default()
    });
    harness.send("hello");
    let step = harness.restart();
    assert!(started_streams(&step).is_empty());
    assert_eq!(harness.phase(), &Phase::Idle);
    assert_eq!(
        harness.last_kind(),
        &EventKind::Unanswered {
            messages: vec![3],
            reason: InterruptReason::Restart
        }
    );
    // Nothing is owed any more: the next restart does nothing.
    let step = harness.restart();
    assert!(started_streams(&step).is_empty());
    assert!(matches!(harness.last_kind(), EventKind::SessionStarted));
}

// --- Every acknowledged message gets a turn, or an event says why not --------------

fn queued_behind_a_running_turn() -> Harness {
    let mut harness = Harness::new(ConversationConfig {
        busy_policy: BusyPolicy::Queue,
        max_requests_per_turn: 2,
        ..ConversationConfig::default()
    });
    harness.send("first");
    assert!(harness.send("second").rejection.is_none());
    assert!(harness.send("third").rejection.is_none());
    harness
}

#[test]
fn messages_queued_behind_a_turn_that_hit_its_request_cap_get_their_turn() {
    let mut harness = queued_behind_a_running_turn();
    harness.call_tools(&[("t1", "bash")]);
    harness.tool_done("t1", "x", false);
    harness.call_tools(&[("t2", "bash")]);
    let step = harness.tool_done("t2", "x", false);
    assert_eq!(started_streams(&step).len(), 1, "{:?}", step.effects);
    assert_eq!(harness.working().turn, 2);
    assert!(harness.working().untriggered.is_empty());
}

#[test]
fn messages_queued_behind_a_failed_turn_get_their_turn() {
    let mut harness = queued_behind_a_running_turn();
    let step = harness.fail(false, None);
    assert!(step
        .appended()
        .iter()
        .any(|event| matches!(event.kind, EventKind::TurnFailed { turn: 1, .. })));
    assert_eq!(started_streams(&step).len(), 1);
    assert_eq!(harness.working().turn, 2);
    // The failed turn got no answer: the new turn's prompt is the first
    // message and both queued ones.
    let last = harness.working().messages.last().unwrap();
    assert_eq!(last.role, Role::User);
    assert_eq!(last.content.len(), 3);
}

#[test]
fn messages_queued_behind_a_cancelled_turn_are_recorded_unanswered() {
    let mut harness = queued_behind_a_running_turn();
    let step = harness.step(Input::Cancel);
    assert!(started_streams(&step).is_empty());
    assert_eq!(harness.phase(), &Phase::Idle);
    assert_eq!(
        harness.last_kind(),
        &EventKind::Unanswered {
            messages: vec![5, 6],
            reason: InterruptReason::Cancelled
        }
    );
    // A restart owes them nothing.
    let step = harness.restart();
    assert!(started_streams(&step).is_empty());
}

#[test]
fn messages_queued_behind_a_turn_a_restart_ended_under_idle_recovery_are_recorded_unanswered() {
    let mut harness = queued_behind_a_running_turn();
    let mut config = harness.working().config.clone();
    config.recovery = RecoveryPolicy::Idle;
    harness.step(Input::ChangeConfig { config });
    let step = harness.restart();
    assert!(started_streams(&step).is_empty());
    assert_eq!(
        harness.last_kind(),
        &EventKind::Unanswered {
            messages: vec![5, 6],
            reason: InterruptReason::Restart
        }
    );
}

// --- Stop reasons -------------------------------------------------------------------

#[test]
fn a_response_cut_off_at_max_tokens_ends_the_turn_with_a_note_and_runs_no_tool() {
    let mut harness = Harness::new(ConversationConfig {
        max_tokens: 100,
        ..ConversationConfig::default()
    });
    harness.send("write a lot");
    let generation = harness.generation();
    let step = harness.step(Input::StreamFinished {
        generation,
        response: AssistantResponse {
            blocks: vec![text_block("here goes"), tool_block("t1", "bash", json!({}))],
            stop_reason: StopReason::MaxTokens,
            usage: Usage::default(),
            provider: ProviderKind::Mock,
            model: "mock".to_owned(),
        },
    });
    assert!(started_tools(&step).is_empty(), "a cut-off call never runs");
    assert!(started_streams(&step).is_empty());
    let results = tool_results(&step);
    assert_eq!(results.len(), 1);
    assert!(
        results[0].1.contains("max_tokens (100)"),
        "{:?}",
        results[0]
    );
    assert!(results[0].2 && results[0].3, "an error, made by keel");
    assert!(matches!(
        harness.last_kind(),
        EventKind::TurnCompleted {
            note: Some(TurnNote::MaxTokens { max_tokens: 100 }),
            ..
        }
    ));
    assert_idle_and_paired(&harness);
}

#[test]
fn pause_turn_sends_the_response_back_and_the_turn_goes_on() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("search the web");
    let generation = harness.generation();
    let step = harness.step(Input::StreamFinished {
        generation,
        response: AssistantResponse {
            blocks: vec![text_block("searching…")],
            stop_reason: StopReason::PauseTurn,
            usage: Usage::default(),
            provider: ProviderKind::Anthropic,
            model: "claude".to_owned(),
        },
    });
    assert_eq!(started_streams(&step).len(), 1, "the turn continues");
    assert_eq!(harness.working().turn, 1, "in the same turn");
    let last = harness.working().messages.last().unwrap();
    assert_eq!(
        last.role,
        Role::Assistant,
        "the paused response is sent back"
    );
    harness.reply("found it");
    assert!(matches!(
        harness.last_kind(),
        EventKind::TurnCompleted { note: None, .. }
    ));
}

#[test]
fn a_refusal_is_recorded_as_such_and_runs_nothing() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("do something bad");
    let generation = harness.generation();
    let step = harness.step(Input::StreamFinished {
        generation,
        response: AssistantResponse {
            blocks: vec![text_block("I can't help with that.")],
            stop_reason: StopReason::Refusal,
            usage: Usage::default(),
            provider: ProviderKind::OpenAi,
            model: "gpt".to_owned(),
        },
    });
    assert!(started_streams(&step).is_empty());
    assert!(step.appended().iter().any(|event| matches!(
        event.kind,
        EventKind::AssistantMessage {
            stop_reason: StopReason::Refusal,
            ..
        }
    )));
    assert!(matches!(
        harness.last_kind(),
        EventKind::TurnCompleted {
            note: Some(TurnNote::Refusal),
            ..
        }
    ));
    assert_idle_and_paired(&harness);
}

// --- Timers, causal links, sub-agents -----------------------------------------------

#[test]
fn cancel_in_retry_wait_drops_the_retry_timer() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    let step = harness.fail(true, None);
    let (timer, _) = timer_of(&step).unwrap();
    let step = harness.step(Input::Cancel);
    assert_eq!(cancelled_timers(&step), vec![timer]);
}

#[test]
fn every_event_but_the_first_carries_its_causal_parent() {
    let mut harness = Harness::new(with_policy(BusyPolicy::Queue));
    harness.send("first");
    harness.send("queued");
    harness.call_tools(&[("t1", "bash")]);
    harness.tool_done("t1", "x", false);
    harness.reply("done");
    harness.reply("second done");
    harness.step(Input::ChangeConfig {
        config: ConversationConfig {
            context_window: 1000,
            ..harness.working().config.clone()
        },
    });
    harness.restart();
    harness.step(Input::Stop);
    let (first, rest) = harness.log.split_first().unwrap();
    assert_eq!(first.parent, None);
    for event in rest {
        let parent = event
            .parent
            .unwrap_or_else(|| panic!("no parent: {event:?}"));
        assert!(parent >= 1 && parent < event.seq, "{event:?}");
        let expected = match &event.kind {
            EventKind::SessionStarted => "the event before",
            EventKind::TurnStarted { .. } => "a user message",
            _ => "a turn or a session",
        };
        let parent_kind = &harness.log[parent as usize - 1].kind;
        let fits = match expected {
            "the event before" => parent == event.seq - 1,
            "a user message" => matches!(parent_kind, EventKind::UserMessage { .. }),
            _ => matches!(
                parent_kind,
                EventKind::TurnStarted { .. } | EventKind::SessionStarted
            ),
        };
        assert!(fits, "{event:?} links to {parent_kind:?}, not {expected}");
    }
}

#[test]
fn a_sub_agent_that_asks_the_user_anyway_is_told_no_human_answers() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("task");
    let step = harness.respond(
        vec![tool_block("q1", "ask_user", json!({"question": "which?"}))],
        Usage::default(),
    );
    assert!(
        harness.working().pending.is_empty(),
        "nothing waits on a human"
    );
    let results = tool_results(&step);
    assert_eq!(results.len(), 1);
    assert!(
        results[0].1.contains("no human answers"),
        "{:?}",
        results[0]
    );
    assert_eq!(started_streams(&step).len(), 1, "the sub-agent goes on");
}

// --- Graceful shutdown --------------------------------------------------------------

#[test]
fn shutdown_interrupts_a_running_turn_and_a_restart_sends_nothing_again() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("long job");
    harness.call_tools(&[("t1", "bash"), ("t2", "bash")]);
    let step = harness.step(Input::Shutdown);
    assert!(step
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::AbortTool { .. })));
    assert!(step.effects.contains(&Effect::Stop));
    assert_eq!(harness.phase(), &Phase::Terminating);
    assert!(matches!(harness.last_kind(), EventKind::SessionEnded));
    assert!(harness.kinds().iter().any(|kind| matches!(
        kind,
        EventKind::TurnInterrupted {
            reason: InterruptReason::Shutdown,
            ..
        }
    )));
    assert!(harness.working().tool_uses_paired());
    let step = harness.restart();
    assert!(started_streams(&step).is_empty());
    assert!(started_tools(&step).is_empty());
}

#[test]
fn shutdown_leaves_queued_and_debounced_messages_owed_and_the_next_start_answers_them() {
    let mut harness = queued_behind_a_running_turn();
    harness.step(Input::Shutdown);
    assert_eq!(harness.working().untriggered, vec![5, 6]);
    let step = harness.restart();
    assert_eq!(started_streams(&step).len(), 1);
    assert_eq!(
        harness.working().turn,
        2,
        "a new turn, not the old one again"
    );

    let mut harness = Harness::new(with_policy(BusyPolicy::Interrupt));
    harness.send("hello");
    let step = harness.step(Input::Shutdown);
    assert!(started_streams(&step).is_empty());
    let step = harness.restart();
    assert_eq!(started_streams(&step).len(), 1);
}

#[test]
fn shutdown_keeps_pending_approvals_pending() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("ship it");
    harness.call_tools(&[("d1", "deploy")]);
    harness.step(Input::Shutdown);
    assert!(matches!(harness.last_kind(), EventKind::SessionEnded));
    harness.restart();
    assert_eq!(harness.phase(), &Phase::AwaitingInput);
    assert_eq!(harness.working().pending.len(), 1);
}

// --- Checkpoints: the reducer's version ---------------------------------------------

/// Checkpoints are trusted only when written by the same reducer
/// (`reducer::REDUCER_VERSION`). This pins what the reducer makes of a fixed
/// log that touches every part of the working set: a change to the reducer
/// fails here until the version is bumped (so old checkpoints are passed
/// over) and the fixture rewritten with `KEEL_BLESS=1`.
#[test]
fn a_reducer_change_comes_with_a_new_reducer_version() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
        ..ConversationConfig::default()
    });
    harness.send("build it");
    harness.call_tools(&[("t1", "bash"), ("t2", "bash")]);
    harness.tool_done("t1", "built", false);
    harness.tool_done("t2", "command not found", true);
    harness.reply("done, with one error");
    harness.send("now ship");
    harness.call_tools(&[("d0", "deploy"), ("d1", "deploy"), ("t3", "bash")]);
    harness.resolve_as("d0", Decision::Deny, Some("alice"));
    let working = WorkingSet::replay(&harness.log).unwrap();
    assert_eq!(&working, harness.working());
    assert_eq!(working.pending.len(), 1);
    assert_eq!(working.resolved.len(), 1);

    let actual = json!({
        "reducer": keel_core::reducer::REDUCER_VERSION,
        "working": working,
    });
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/checkpoint/reducer.json");
    if std::env::var_os("KEEL_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let text = serde_json::to_string_pretty(&actual).unwrap();
        std::fs::write(&path, text + "\n").unwrap();
    }
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    if expected["reducer"] != actual["reducer"] {
        panic!("REDUCER_VERSION changed: rewrite the fixture with KEEL_BLESS=1");
    }
    assert!(
        expected["working"] == actual["working"],
        "the reducer makes something else of this log now: bump \
         reducer::REDUCER_VERSION so that older checkpoints are not used, \
         then rewrite the fixture with KEEL_BLESS=1"
    );
}

// --- Decisions pinned by mutation testing ----------------------------------------------
//
// `cargo mutants` (docs/mutation-testing.md) changed each of these decisions
// and no test noticed. Each test below fails under the mutant it names.

/// `codec::unsupported`: only a version above the current one is "from a
/// newer keel"; a known version in the other format is a malformed record.
#[test]
fn a_known_version_in_the_wrong_format_is_malformed_and_only_a_newer_one_unsupported() {
    use keel_core::codec::{decode, DecodeError, CURRENT_VERSION};
    let next = CURRENT_VERSION + 1;
    let current = CURRENT_VERSION;
    // JSON claiming the current (MessagePack) version: not from a newer keel.
    let error = decode(format!(r#"{{"v":{current},"event":{{}}}}"#).as_bytes()).unwrap_err();
    assert!(matches!(error, DecodeError::Malformed { .. }), "{error:?}");
    assert!(error.to_string().contains("wrong format"), "{error}");
    let error = decode(format!(r#"{{"v":{next},"event":{{}}}}"#).as_bytes()).unwrap_err();
    assert_eq!(
        error,
        DecodeError::UnsupportedVersion {
            found: next,
            supported: CURRENT_VERSION
        }
    );
    // MessagePack claiming version 1 (a JSON version).
    let error = decode(&msgpack_record(1, "x")).unwrap_err();
    assert!(error.to_string().contains("wrong format"), "{error}");
}

/// `codec::decode_json` / `decode_msgpack`: a record of the right version
/// whose event does not decode is malformed, and the error says what is
/// wrong with the event, not that the version is in the wrong format.
#[test]
fn a_record_of_the_right_version_with_a_broken_event_says_what_is_broken() {
    use keel_core::codec::decode;
    let error = decode(br#"{"v":1,"event":{"type":"no_such_event"}}"#).unwrap_err();
    assert!(!error.to_string().contains("wrong format"), "{error}");
    assert!(error.to_string().contains("missing field"), "{error}");
    let error = decode(&msgpack_record(2, "not an event")).unwrap_err();
    assert!(!error.to_string().contains("wrong format"), "{error}");
}

/// The names clients and logs see are the serialised names.
#[test]
fn names_shown_are_the_serialised_names() {
    for state in [
        StateName::Idle,
        StateName::Debouncing,
        StateName::Streaming,
        StateName::RetryWait,
        StateName::ExecutingTools,
        StateName::AwaitingInput,
        StateName::Recovering,
        StateName::Error,
        StateName::Terminating,
        StateName::Completed,
        StateName::Failed,
    ] {
        assert_eq!(json!(state), json!(state.as_str()));
        assert_eq!(state.to_string(), state.as_str());
    }
    for provider in [
        ProviderKind::Anthropic,
        ProviderKind::OpenAi,
        ProviderKind::Mock,
    ] {
        assert_eq!(json!(provider), json!(provider.to_string()));
    }
    let model = ModelRef {
        provider: ProviderKind::OpenAi,
        model: "gpt-x".to_owned(),
    };
    assert_eq!(model.to_string(), "openai/gpt-x");
    let generation = Generation {
        turn: 3,
        attempt: 2,
    };
    assert_eq!(generation.to_string(), "turn 3 attempt 2");
}

/// `Phase::agrees_with` is the invariant the property tests check; it must
/// also say no.
#[test]
fn a_phase_disagrees_with_a_status_it_cannot_have() {
    let pairs = [
        (Phase::Idle, Status::Idle, true),
        (Phase::Idle, Status::TurnInFlight, false),
        (Phase::Idle, Status::Error, false),
        (Phase::Recovering, Status::TurnInFlight, true),
        (Phase::Recovering, Status::Idle, false),
        (Phase::AwaitingInput, Status::AwaitingInput, true),
        (Phase::AwaitingInput, Status::TurnInFlight, false),
        (Phase::Terminating, Status::AwaitingInput, true),
        (Phase::Terminating, Status::TurnInFlight, false),
    ];
    for (phase, status, agrees) in pairs {
        assert_eq!(phase.agrees_with(status), agrees, "{phase:?} / {status:?}");
    }
}

/// `recovery::plan_recovery`: a log at rest whose last response has calls
/// without results (damaged: the turn ended without them) is repaired on
/// start, so the next request's history is valid.
#[test]
fn calls_left_without_results_in_a_log_at_rest_are_answered_on_start() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    let last = harness.log.last().unwrap().clone();
    let turn_started = harness
        .log
        .iter()
        .find(|event| matches!(event.kind, EventKind::TurnStarted { .. }))
        .unwrap()
        .seq;
    harness.log.push(Event {
        seq: last.seq + 1,
        at: last.at,
        parent: Some(turn_started),
        triggers_turn: false,
        kind: EventKind::TurnCompleted {
            turn: 1,
            duration_ms: 1,
            note: None,
        },
    });
    let working = WorkingSet::replay(&harness.log).unwrap();
    assert_eq!(working.status(), Status::Idle);
    assert_eq!(working.open_calls.len(), 1);
    assert_eq!(
        keel_core::recovery::plan_recovery(&working),
        keel_core::recovery::RecoveryPlan::RepairOrphans
    );
    let step = harness.restart();
    let results = tool_results(&step);
    assert_eq!(results.len(), 1, "{:?}", harness.kinds());
    assert_eq!(results[0].0, "t1");
    assert!(results[0].2 && results[0].3, "an error, and synthetic");
    assert!(harness.working().tool_uses_paired());
}

/// `FsmSnapshot::of`: a conversation at rest is snapshotted (what a cold
/// load reads instead of the log); one with a turn in flight is not.
#[test]
fn a_conversation_at_rest_has_a_snapshot_and_one_mid_turn_has_none() {
    use keel_core::snapshot::{FsmSnapshot, SnapshotState};
    let mut harness = Harness::new(ConversationConfig::default());
    let snapshot = FsmSnapshot::of(harness.working()).unwrap();
    assert_eq!(snapshot.state, SnapshotState::Idle);
    harness.send("hi");
    assert_eq!(FsmSnapshot::of(harness.working()), None);
    harness.reply("ok");
    let snapshot = FsmSnapshot::of(harness.working()).unwrap();
    assert_eq!(snapshot.last_seq, harness.working().last_seq);
}

/// `WorkingSet::fold` on a tool result: the call is no longer approved to
/// run (gated calls suspend one at a time, so the next one waits for its
/// own decision).
#[test]
fn a_tool_result_ends_its_call_s_approval() {
    let mut harness = Harness::new(gated());
    harness.send("ship");
    harness.call_tools(&[("d1", "deploy"), ("d2", "deploy")]);
    harness.resolve("d1", Decision::Approve);
    assert_eq!(harness.working().approved, [ToolCallId::new("d1")]);
    harness.tool_done("d1", "deployed", false);
    assert_eq!(harness.working().approved, Vec::<ToolCallId>::new());
    let pending: Vec<&str> = harness
        .working()
        .pending
        .iter()
        .map(|pending| pending.call.id.as_str())
        .collect();
    assert_eq!(pending, ["d2"]);
    assert_eq!(
        &WorkingSet::replay(&harness.log).unwrap(),
        harness.working()
    );
}

/// `WorkingSet::tool_uses_paired`, the invariant the property tests check,
/// must also say no: a call without its result is unpaired.
#[test]
fn a_call_without_its_result_is_unpaired() {
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    assert!(harness.working().tool_uses_paired());
    harness.call_tools(&[("t1", "bash"), ("t2", "bash")]);
    assert!(!harness.working().tool_uses_paired());
    harness.tool_done("t1", "x", false);
    assert!(!harness.working().tool_uses_paired(), "t2 is still open");
    harness.tool_done("t2", "y", false);
    assert!(harness.working().tool_uses_paired());
}

/// `arm_deadline`: only a sub-agent that has not finished has a deadline.
#[test]
fn only_an_unfinished_sub_agent_has_a_deadline() {
    let deadline = |step: &Step| {
        step.effects.iter().any(|effect| {
            matches!(
                effect,
                Effect::SetTimer {
                    timer: Timer::Deadline,
                    ..
                }
            )
        })
    };
    let mut user = Harness::new(ConversationConfig::default());
    assert!(!deadline(&user.restart()), "a user conversation has none");
    let created = create(
        NewConversation {
            id: ConversationId::new("c2").unwrap(),
            cwd: "/work/project".to_owned(),
            config: ConversationConfig::default(),
            parent_conversation: None,
        },
        Timestamp(T0),
    );
    assert!(!deadline(&created));
    let created = create(
        NewConversation {
            id: ConversationId::new("c3").unwrap(),
            cwd: "/work/project".to_owned(),
            config: ConversationConfig::default(),
            parent_conversation: Some(ConversationId::new("parent").unwrap()),
        },
        Timestamp(T0),
    );
    assert!(deadline(&created), "a sub-agent has one from its start");
    let mut child = Harness::sub_agent(ConversationConfig::default());
    assert!(deadline(&child.restart()), "and again in every life");
}

#[test]
fn a_log_that_is_no_log_says_why() {
    use keel_core::reducer::ReplayError;
    assert_eq!(ReplayError::Empty.to_string(), "log is empty");
    assert_eq!(
        ReplayError::NotCreated { seq: 2 }.to_string(),
        "log starts at seq 2 with something other than Created"
    );
    assert_eq!(
        ReplayError::Gap {
            expected: 3,
            found: 5
        }
        .to_string(),
        "log expected seq 3 but found seq 5"
    );
}

/// `deadline`: a deadline timer that fires early (a timer set by an
/// earlier life, a clock step) changes nothing; at the deadline it fails
/// the sub-agent.
#[test]
fn a_sub_agent_deadline_fired_early_changes_nothing() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("task");
    harness.advance(59_999);
    let before = harness.conv().clone();
    let step = harness.step(Input::TimerFired {
        timer: Timer::Deadline,
    });
    assert!(step.appended().is_empty());
    assert_eq!(harness.conv(), &before);
    harness.advance(1);
    harness.step(Input::TimerFired {
        timer: Timer::Deadline,
    });
    assert!(matches!(harness.phase(), Phase::Failed { .. }));
}

/// `started` under `recovery = idle`: a sub-agent interrupted by a restart
/// fails (its parent is told, and it takes no more work), where a user
/// conversation would only end its turn.
#[test]
fn a_sub_agent_interrupted_by_a_restart_under_idle_recovery_fails() {
    let config = ConversationConfig {
        recovery: RecoveryPolicy::Idle,
        ..sub_agent_config(5)
    };
    let mut harness = Harness::sub_agent(config.clone());
    harness.send("task");
    harness.restart();
    assert!(
        matches!(harness.phase(), Phase::Failed { reason } if reason.contains("restart")),
        "{:?}",
        harness.phase()
    );
    assert!(matches!(
        harness.last_kind(),
        EventKind::Finished {
            outcome: SubAgentOutcome::Failed { .. }
        }
    ));
    let mut user = Harness::new(config);
    user.send("hi");
    user.restart();
    assert_eq!(user.phase(), &Phase::Idle);
}

fn output_tail(harness: &Harness) -> &str {
    match harness.phase() {
        Phase::ExecutingTools { output_tail, .. } => output_tail,
        other => panic!("not running a tool: {other:?}"),
    }
}

fn tool_output(harness: &mut Harness, id: &str, chunk: &str) {
    harness.step(Input::ToolOutput {
        tool_call_id: ToolCallId::new(id),
        chunk: chunk.to_owned(),
    });
}

/// `tools::output`: a running tool's kept output (what a cancelled call's
/// result shows) is its last `OUTPUT_TAIL_BYTES`, cut at a character
/// boundary.
#[test]
fn a_running_tool_keeps_the_last_8_kib_of_its_output_whole_characters_only() {
    use keel_core::transition::OUTPUT_TAIL_BYTES;
    assert_eq!(OUTPUT_TAIL_BYTES, 8 * 1024);
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    let mut all = String::new();
    for line in 0..1_000 {
        let chunk = format!("line {line:04}\n");
        all.push_str(&chunk);
        tool_output(&mut harness, "t1", &chunk);
    }
    assert_eq!(output_tail(&harness), &all[all.len() - OUTPUT_TAIL_BYTES..]);

    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("hi");
    harness.call_tools(&[("t1", "bash")]);
    // 3,000 three-byte characters: 9,000 bytes, and the last 8,192 begin
    // inside a character, so the tail starts at the next one.
    tool_output(&mut harness, "t1", &"€".repeat(3_000));
    let tail = output_tail(&harness);
    assert_eq!(tail.len(), 8_190);
    assert!(tail.chars().all(|c| c == '€'));
}

// --- Sub-agents: ids, cancels, owed messages, deadlines --------------------------------------

fn spawn_effects(step: &Step) -> Vec<(String, Seq)> {
    step.effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::SpawnSubAgents { call, seq } => Some((call.id.0.clone(), *seq)),
            _ => None,
        })
        .collect()
}

fn assistant_seqs(harness: &Harness) -> Vec<Seq> {
    harness
        .log
        .iter()
        .filter(|event| matches!(event.kind, EventKind::AssistantMessage { .. }))
        .map(|event| event.seq)
        .collect()
}

/// A provider may reuse tool call ids (one that numbers its calls): a
/// spawn call is named by the seq of the response that made it, which is
/// unique in the log and the same when a restart re-dispatches the call.
#[test]
fn a_spawn_call_is_named_by_the_seq_of_its_response_not_its_tool_call_id() {
    let spawn = |harness: &mut Harness| {
        harness.respond(
            vec![tool_block("sp1", "spawn_agents", json!({"tasks": ["a"]}))],
            Usage::default(),
        )
    };
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("split the work");
    let first = spawn_effects(&spawn(&mut harness));
    harness.tool_done("sp1", "done", false);
    harness.reply("ok");
    harness.send("again");
    let second = spawn_effects(&spawn(&mut harness));
    let seqs = assistant_seqs(&harness);
    assert_eq!(first, vec![("sp1".to_owned(), seqs[0])]);
    assert_eq!(second, vec![("sp1".to_owned(), seqs[2])]);
    // A restart mid-call re-dispatches it under the same name.
    let step = harness.restart();
    assert_eq!(spawn_effects(&step), second);
}

/// A spawn call an earlier life dispatched and recovery closes (`recovery
/// = idle`) has sub-agents nobody waits for: they are cancelled at once.
/// Resumed, the call is carried out again and nothing is cancelled.
#[test]
fn a_spawn_call_closed_by_recovery_cancels_its_sub_agents() {
    let cancels = |step: &Step| -> Vec<(String, Seq)> {
        step.effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::CancelSubAgents { call, seq } => Some((call.id.0.clone(), *seq)),
                _ => None,
            })
            .collect()
    };
    for recovery in [RecoveryPolicy::Idle, RecoveryPolicy::Resume] {
        let mut harness = Harness::new(ConversationConfig {
            recovery,
            ..ConversationConfig::default()
        });
        harness.send("split the work");
        harness.respond(
            vec![tool_block("sp1", "spawn_agents", json!({"tasks": ["a"]}))],
            Usage::default(),
        );
        let seq = assistant_seqs(&harness)[0];
        let step = harness.restart();
        match recovery {
            RecoveryPolicy::Idle => {
                assert_eq!(cancels(&step), vec![("sp1".to_owned(), seq)]);
                assert!(spawn_effects(&step).is_empty());
            }
            RecoveryPolicy::Resume => {
                assert!(cancels(&step).is_empty());
                assert_eq!(spawn_effects(&step), vec![("sp1".to_owned(), seq)]);
            }
        }
    }
}

/// A cancel fails a sub-agent in every moment, also before its task came
/// and while its task waits out `busy_policy = interrupt`'s debounce:
/// nobody would ever give it work again, and it must not idle until its
/// deadline.
#[test]
fn a_sub_agent_cancelled_before_its_task_or_while_it_debounces_fails() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    let step = harness.step(Input::Cancel);
    assert_eq!(
        harness.phase(),
        &Phase::Failed {
            reason: "cancelled".to_owned()
        }
    );
    assert!(cancelled_timers(&step).contains(&Timer::Deadline));

    let mut harness = Harness::sub_agent(ConversationConfig {
        busy_policy: BusyPolicy::Interrupt,
        ..sub_agent_config(5)
    });
    harness.send("task");
    let task = harness.log.last().unwrap().seq;
    assert!(matches!(harness.phase(), Phase::Debouncing { .. }));
    let step = harness.step(Input::Cancel);
    assert_eq!(
        harness.phase(),
        &Phase::Failed {
            reason: "cancelled".to_owned()
        }
    );
    assert!(cancelled_timers(&step).contains(&Timer::Debounce { token: task }));
    assert!(harness.kinds().iter().any(|kind| matches!(kind,
        EventKind::Unanswered { messages, reason: InterruptReason::Cancelled } if messages == &[task])));
    assert!(harness.working().untriggered.is_empty());
    // And a restart leaves it failed, owing nothing.
    harness.restart();
    assert!(matches!(harness.phase(), Phase::Failed { .. }));
}

/// Messages queued behind a sub-agent's last turn get no turn (it
/// submitted, failed or was stopped): they are named `Unanswered`, as
/// every acknowledged message that gets no turn is.
#[test]
fn a_sub_agent_that_finishes_names_its_queued_messages_unanswered() {
    for ending in ["submit", "fail", "shutdown"] {
        let mut harness = Harness::sub_agent(ConversationConfig {
            busy_policy: BusyPolicy::Queue,
            ..sub_agent_config(5)
        });
        harness.send("task");
        harness.send("and this too");
        let queued = harness.log.last().unwrap().seq;
        match ending {
            "submit" => {
                harness.respond(
                    vec![tool_block("s1", "submit_result", json!({"result": "done"}))],
                    Usage::default(),
                );
            }
            "fail" => {
                harness.fail(false, None);
            }
            _ => {
                harness.step(Input::Shutdown);
            }
        }
        assert!(harness.phase().is_terminal(), "{ending}");
        assert!(
            harness.kinds().iter().any(|kind| matches!(kind,
                EventKind::Unanswered { messages, .. } if messages.contains(&queued))),
            "{ending}: {:?}",
            harness.kinds()
        );
        assert!(harness.working().untriggered.is_empty(), "{ending}");
    }
}

/// A sub-agent's deadline follows a changed timeout at once; another
/// change arms nothing.
#[test]
fn a_changed_sub_agent_timeout_re_arms_its_deadline() {
    let mut harness = Harness::sub_agent(sub_agent_config(5));
    harness.send("task");
    let mut config = sub_agent_config(5);
    config.sub_agent.timeout_ms = 120_000;
    let step = harness.step(Input::ChangeConfig {
        config: config.clone(),
    });
    assert_eq!(
        timer_of(&step),
        Some((Timer::Deadline, Timestamp(T0 + 120_000)))
    );
    config.max_requests_per_turn += 1;
    let step = harness.step(Input::ChangeConfig { config });
    assert_eq!(step.appended().len(), 1);
    assert_eq!(timer_of(&step), None);
}

/// `recovery::awaited_spawn`: a parent's log waits for the sub-agents of
/// the spawn call its turn in flight has open, and for no others: not
/// once a cancel closed the call, and never a sub-agent's.
#[test]
fn a_parent_waits_for_the_sub_agents_of_its_open_spawn_call_only() {
    use keel_core::recovery::awaited_spawn;
    let mut harness = Harness::new(ConversationConfig::default());
    harness.send("split the work");
    assert_eq!(awaited_spawn(harness.working()), None);
    harness.respond(
        vec![tool_block("sp1", "spawn_agents", json!({"tasks": ["a"]}))],
        Usage::default(),
    );
    let seq = assistant_seqs(&harness)[0];
    let awaited = awaited_spawn(harness.working()).map(|(seq, call)| (seq, call.id.0.clone()));
    assert_eq!(awaited, Some((seq, "sp1".to_owned())));
    harness.step(Input::Cancel);
    assert_eq!(awaited_spawn(harness.working()), None);

    let mut child = Harness::sub_agent(sub_agent_config(5));
    child.send("task");
    child.call_tools(&[("sp", "spawn_agents")]);
    assert_eq!(awaited_spawn(child.working()), None);
}

/// No client is connected to a sub-agent: a call to a client tool it
/// inherited from its parent is refused at once with a result it can act
/// on, never left waiting until its deadline.
#[test]
fn a_sub_agent_calling_a_client_tool_is_told_it_is_not_available() {
    let mut config = sub_agent_config(5);
    config
        .tools
        .insert("client_tool".to_owned(), ToolPolicy::Client);
    let mut harness = Harness::sub_agent(config);
    harness.send("task");
    let step = harness.call_tools(&[("c1", "client_tool")]);
    let results = tool_results(&step);
    assert_eq!(results.len(), 1);
    assert!(
        results[0]
            .1
            .contains("client tools are not available to sub-agents"),
        "{results:?}"
    );
    assert!(harness.working().pending.is_empty());
    assert_eq!(
        started_streams(&step).len(),
        1,
        "the model hears of it at once"
    );
}
