//! The test harness the state machine's scenario tests share: one
//! conversation driven input by input, its log kept beside it.

#![allow(dead_code)]

use std::collections::HashSet;

use keel_core::message::{AssistantBlock, ContentBlock, Message, StopReason, ToolCall, Usage};
use keel_core::*;
use serde_json::json;

pub const T0: u64 = 1_700_000_000_000;

pub struct Harness {
    pub conv: Option<Conversation>,
    pub now: u64,
    pub log: Vec<Event>,
    /// The `summarise` of the latest StartStream.
    pub summarising: Option<u32>,
}

impl Harness {
    pub fn new(config: ConversationConfig) -> Harness {
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

    pub fn working(&self) -> &WorkingSet {
        &self.conv.as_ref().unwrap().working
    }

    pub fn absorb(&mut self, step: Step) -> Step {
        self.log.extend(step.appended().iter().cloned());
        for effect in &step.effects {
            if let Effect::StartStream { summarise, .. } = effect {
                self.summarising = *summarise;
            }
        }
        self.conv = Some(step.state.clone());
        step
    }

    pub fn step(&mut self, input: Input) -> Step {
        self.now += 10;
        let step = transition(self.conv.take().unwrap(), input, Timestamp(self.now));
        self.absorb(step)
    }

    pub fn generation(&self) -> Generation {
        match &self.conv.as_ref().unwrap().phase {
            Phase::Streaming { request, .. } => request.generation,
            other => panic!("not streaming: {other:?}"),
        }
    }

    pub fn send(&mut self, text: &str) {
        self.step(Input::UserMessage {
            text: text.to_owned(),
            images: vec![],
        });
    }

    pub fn respond(&mut self, blocks: Vec<AssistantBlock>) {
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

    pub fn fail(&mut self, retryable: bool, prompt_too_long: bool) {
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
    pub fn summarise_if_asked(&mut self) -> bool {
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
    pub fn tool_turn(&mut self, n: usize) {
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
            images: Vec::new(),
        });
        self.summarise_if_asked();
        self.respond(vec![AssistantBlock::Text {
            text: format!("Build {n} finished without errors."),
        }]);
    }

    pub fn compactions(&self) -> Vec<&EventKind> {
        self.log
            .iter()
            .map(|event| &event.kind)
            .filter(|kind| matches!(kind, EventKind::Compacted { .. }))
            .collect()
    }

    pub fn completed_turns(&self) -> usize {
        self.log
            .iter()
            .filter(|event| matches!(event.kind, EventKind::TurnCompleted { .. }))
            .count()
    }

    pub fn assert_sound(&self) {
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

pub fn results_follow_their_calls(messages: &[Message]) -> bool {
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
