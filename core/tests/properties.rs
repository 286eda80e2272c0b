//! Property tests for the conversation state machine.
//!
//! A [`Driver`] plays the shell: it creates a conversation with a randomised
//! configuration, turns random abstract [`Action`]s into concrete [`Input`]s
//! that fit the current state (finish the stream that is running, finish the
//! tool that runs, resolve a pending call, fire the latest timer, restart the
//! actor, ...), feeds them to `transition()` and keeps the full log. Each
//! property walks such random runs and checks one of keel's rules after
//! every step (docs/requirements.md: the numbered "Invariants", and rules
//! such as "Recovery after a crash or restart"), often by probing the
//! reachable state with extra inputs on a copy of it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use keel_core::config::SubAgentLimits;
use keel_core::message::{AssistantBlock, ContentBlock, ImageRef, StopReason, ToolCall, Usage};
use keel_core::recovery::MAX_CONSECUTIVE_RESUMES;
use keel_core::retry::RetryPolicy;
use keel_core::state::Request;
use keel_core::{
    create, transition, AssistantResponse, BusyPolicy, Conversation, ConversationConfig,
    ConversationId, Decision, Effect, Event, EventKind, Generation, Input, LlmFailure, ModelRef,
    Phase, ProviderKind, RecoveryPolicy, Rejection, Seq, Step, StreamDelta, Timer, Timestamp,
    ToolCallId, ToolPolicy, WorkingSet,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::json;

// ---------------------------------------------------------------------------
// Test data: configurations and actions
// ---------------------------------------------------------------------------

/// The random part of a conversation's creation.
#[derive(Debug, Clone)]
struct Setup {
    busy_policy: BusyPolicy,
    recovery: RecoveryPolicy,
    fallback: bool,
    max_requests_per_turn: u32,
    max_retries: u32,
    /// `bash` needs approval (besides `gated`, which always does).
    bash_needs_approval: bool,
    /// Some: the conversation is a sub-agent with these limits.
    sub_agent: Option<SubAgentLimits>,
    /// A context window so small that prompts are compacted every few
    /// turns (docs/compaction.md).
    small_window: bool,
}

impl Setup {
    fn config(&self) -> ConversationConfig {
        let mut tools = BTreeMap::new();
        tools.insert(Tool::Gated.name().to_owned(), ToolPolicy::Approve);
        tools.insert(Tool::Client.name().to_owned(), ToolPolicy::Client);
        if self.bash_needs_approval {
            tools.insert(Tool::Bash.name().to_owned(), ToolPolicy::Approve);
        }
        ConversationConfig {
            fallback: self.fallback.then(fallback_model),
            busy_policy: self.busy_policy,
            recovery: self.recovery,
            retry: RetryPolicy {
                max_retries: self.max_retries,
                ..RetryPolicy::default()
            },
            tools,
            max_requests_per_turn: self.max_requests_per_turn,
            sub_agent: self.sub_agent.unwrap_or_default(),
            context_window: if self.small_window { 400 } else { 200_000 },
            compact_at_percent: if self.small_window { 50 } else { 80 },
            ..ConversationConfig::default()
        }
    }

    fn new_conversation(&self) -> keel_core::NewConversation {
        keel_core::NewConversation {
            id: ConversationId::new("conv-1").unwrap(),
            cwd: "/tmp/work".to_owned(),
            config: self.config(),
            parent_conversation: self
                .sub_agent
                .map(|_| ConversationId::new("parent-1").unwrap()),
        }
    }
}

fn fallback_model() -> ModelRef {
    ModelRef {
        provider: ProviderKind::OpenAi,
        model: "fallback".to_owned(),
    }
}

/// The tools a response may call; their names pick the path through the core.
#[derive(Debug, Clone, Copy)]
enum Tool {
    /// Runs at once (or needs approval when `Setup::bash_needs_approval`).
    Bash,
    /// A question to the user: an elicitation, exclusive in its response.
    AskUser,
    /// A sub-agent's result: exclusive, refused outside sub-agents.
    SubmitResult,
    /// Starts sub-agents; refused inside sub-agents.
    SpawnAgents,
    /// Policy `Approve`.
    Gated,
    /// Policy `Client`.
    Client,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Bash => "bash",
            Tool::AskUser => "ask_user",
            Tool::SubmitResult => "submit_result",
            Tool::SpawnAgents => "spawn_agents",
            Tool::Gated => "gated",
            Tool::Client => "client_tool",
        }
    }

    fn input(self) -> serde_json::Value {
        match self {
            Tool::Bash | Tool::Gated | Tool::Client => json!({"command": "ls"}),
            Tool::AskUser => json!({"question": "which one?"}),
            Tool::SubmitResult => json!({"result": "done"}),
            Tool::SpawnAgents => json!({"tasks": ["a", "b"]}),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum DecisionKind {
    Approve,
    Edit,
    Deny,
    Answer,
}

/// Which stream message a stale-generation action sends.
#[derive(Debug, Clone, Copy)]
enum StreamMessage {
    Delta,
    Finished,
    Failed,
}

/// What happens next, abstractly; [`Driver::input_for`] makes it concrete.
#[derive(Debug, Clone)]
enum Action {
    /// A user message (`empty`: one with no text, which is refused).
    UserMessage {
        empty: bool,
    },
    /// The latest stream finishes with text only.
    FinishText,
    /// The latest stream finishes with these tool calls.
    FinishTools(Vec<Tool>),
    /// The latest stream fails.
    FailStream {
        retryable: bool,
        retry_after_ms: Option<u64>,
        jitter: u16,
        /// The provider refuses the prompt as too long (not retryable).
        too_long: bool,
    },
    /// A text delta for the latest stream.
    Delta,
    /// A stream message for an older generation.
    StaleStream(StreamMessage),
    /// The latest started tool finishes, with this many images.
    ToolFinished {
        is_error: bool,
        images: usize,
    },
    /// The latest started tool writes output (`big`: more than the kept tail).
    ToolOutput {
        big: bool,
    },
    /// A tool message for an id that never ran.
    StaleTool {
        finished: bool,
    },
    /// Resolve the `pick`th pending call (or an unknown id when none is pending).
    Resolve {
        pick: usize,
        decision: DecisionKind,
    },
    ResolveUnknown,
    /// Resolve the `pick`th call that has its result (resolved, run,
    /// cancelled, refused) again: a retry, a change of mind, or too late.
    ResolveSettled {
        pick: usize,
        decision: DecisionKind,
    },
    Cancel,
    /// Fire the most recent debounce or retry timer that has not fired yet,
    /// at its time.
    FireTimer,
    /// Fire a sub-agent's deadline at its time.
    FireDeadline,
    /// Fire any timer ever set again (usually stale).
    FireOldTimer {
        pick: usize,
    },
    ChangeConfig {
        busy_policy: BusyPolicy,
        recovery: RecoveryPolicy,
        fallback: bool,
        bash_needs_approval: bool,
    },
    Stop,
    /// Compact now (docs/compaction.md).
    Compact,
    /// Rewind (docs/history.md) to the `pick`th end of a turn (`boundary`),
    /// or to any seq of the log or just past it (mostly not a boundary).
    Rewind {
        pick: usize,
        boundary: bool,
    },
    /// The actor dies: rebuild from the log and feed `Input::Started`.
    Restart,
}

/// One step of a run: time passes, then the action happens.
#[derive(Debug, Clone)]
struct Move {
    advance_ms: u64,
    action: Action,
}

fn busy_policy() -> impl Strategy<Value = BusyPolicy> {
    prop_oneof![
        Just(BusyPolicy::Reject),
        Just(BusyPolicy::Interrupt),
        Just(BusyPolicy::Queue),
    ]
}

fn recovery_policy() -> impl Strategy<Value = RecoveryPolicy> {
    prop_oneof![Just(RecoveryPolicy::Resume), Just(RecoveryPolicy::Idle)]
}

fn setup() -> impl Strategy<Value = Setup> {
    let sub_agent = proptest::option::weighted(
        0.35,
        (1u32..=3, 5_000u64..=120_000).prop_map(|(max_turns, timeout_ms)| SubAgentLimits {
            max_turns,
            timeout_ms,
            ..SubAgentLimits::default()
        }),
    );
    (
        busy_policy(),
        recovery_policy(),
        any::<bool>(),
        prop_oneof![Just(3u32), Just(50u32)],
        0u32..=2,
        any::<bool>(),
        sub_agent,
        prop::bool::weighted(0.4),
    )
        .prop_map(
            |(
                busy_policy,
                recovery,
                fallback,
                max_requests_per_turn,
                max_retries,
                bash_needs_approval,
                sub_agent,
                small_window,
            )| Setup {
                busy_policy,
                recovery,
                fallback,
                max_requests_per_turn,
                max_retries,
                bash_needs_approval,
                sub_agent,
                small_window,
            },
        )
}

fn tool() -> impl Strategy<Value = Tool> {
    prop_oneof![
        4 => Just(Tool::Bash),
        2 => Just(Tool::AskUser),
        2 => Just(Tool::SubmitResult),
        1 => Just(Tool::SpawnAgents),
        2 => Just(Tool::Gated),
        2 => Just(Tool::Client),
    ]
}

fn decision_kind() -> impl Strategy<Value = DecisionKind> {
    prop_oneof![
        Just(DecisionKind::Approve),
        Just(DecisionKind::Edit),
        Just(DecisionKind::Deny),
        Just(DecisionKind::Answer),
    ]
}

fn stream_message() -> impl Strategy<Value = StreamMessage> {
    prop_oneof![
        Just(StreamMessage::Delta),
        Just(StreamMessage::Finished),
        Just(StreamMessage::Failed),
    ]
}

/// Actions, weighted so that runs get deep into turns; `restart_weight`
/// tunes how often the actor dies.
fn action(restart_weight: u32) -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => prop::bool::weighted(0.05).prop_map(|empty| Action::UserMessage { empty }),
        4 => Just(Action::FinishText),
        4 => prop::collection::vec(tool(), 1..=1).prop_map(Action::FinishTools),
        2 => prop::collection::vec(tool(), 2..=3).prop_map(Action::FinishTools),
        2 => (
            any::<bool>(),
            proptest::option::of(0u64..90_000),
            0u16..=1000,
            prop::bool::weighted(0.2),
        )
            .prop_map(|(retryable, retry_after_ms, jitter, too_long)| Action::FailStream {
                retryable: retryable && !too_long,
                retry_after_ms,
                jitter,
                too_long,
            }),
        2 => Just(Action::Delta),
        1 => stream_message().prop_map(Action::StaleStream),
        5 => (any::<bool>(), 0usize..3).prop_map(|(is_error, images)| Action::ToolFinished { is_error, images }),
        2 => prop::bool::weighted(0.2).prop_map(|big| Action::ToolOutput { big }),
        1 => any::<bool>().prop_map(|finished| Action::StaleTool { finished }),
        5 => (0usize..4, decision_kind())
            .prop_map(|(pick, decision)| Action::Resolve { pick, decision }),
        1 => Just(Action::ResolveUnknown),
        2 => (0usize..4, decision_kind())
            .prop_map(|(pick, decision)| Action::ResolveSettled { pick, decision }),
        2 => Just(Action::Cancel),
        4 => Just(Action::FireTimer),
        1 => Just(Action::FireDeadline),
        1 => (0usize..8).prop_map(|pick| Action::FireOldTimer { pick }),
        1 => (busy_policy(), recovery_policy(), any::<bool>(), any::<bool>()).prop_map(
            |(busy_policy, recovery, fallback, bash_needs_approval)| Action::ChangeConfig {
                busy_policy,
                recovery,
                fallback,
                bash_needs_approval,
            }
        ),
        1 => Just(Action::Stop),
        1 => Just(Action::Compact),
        1 => (0usize..8, any::<bool>())
            .prop_map(|(pick, boundary)| Action::Rewind { pick, boundary }),
        restart_weight => Just(Action::Restart),
    ]
}

fn moves(restart_weight: u32) -> impl Strategy<Value = Vec<Move>> {
    let advance = prop_oneof![4 => 0u64..500, 1 => 500u64..20_000];
    prop::collection::vec(
        (advance, action(restart_weight))
            .prop_map(|(advance_ms, action)| Move { advance_ms, action }),
        1..60,
    )
}

// ---------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------

/// A `SetTimer` the driver has seen.
#[derive(Debug, Clone, Copy)]
struct ArmedTimer {
    timer: Timer,
    at: Timestamp,
    /// Fired already, or died with the actor that set it.
    done: bool,
}

/// Plays the shell around one conversation: keeps its state, the full log,
/// the clock, and what the effects asked for (streams, tools, timers).
struct Driver {
    state: Conversation,
    /// `Created` and every event appended since.
    log: Vec<Event>,
    now: Timestamp,
    /// The generation of every `StartStream`, oldest first.
    generations: Vec<Generation>,
    /// The latest tool started by `StartTool` or `SpawnSubAgents`.
    running_tool: Option<ToolCallId>,
    /// Every timer ever set, oldest first.
    timers: Vec<ArmedTimer>,
    /// Numbers fresh tool call ids and message texts.
    counter: u32,
}

/// One input the driver fed and what came of it.
struct Performed {
    /// The state the input was applied to (for a restart: the rebuilt one).
    before: Conversation,
    /// For a restart: the live state the restart replaced.
    replaced: Option<Conversation>,
    input: Input,
    now: Timestamp,
    step: Step,
}

impl Driver {
    fn new(setup: &Setup) -> Driver {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let step = create(setup.new_conversation(), now);
        let mut driver = Driver {
            state: step.state.clone(),
            log: Vec::new(),
            now,
            generations: Vec::new(),
            running_tool: None,
            timers: Vec::new(),
            counter: 0,
        };
        driver.observe(&step);
        driver
    }

    fn fresh(&mut self) -> u32 {
        self.counter += 1;
        self.counter
    }

    /// The generation of the latest `StartStream` (a made-up one before any).
    fn latest_generation(&self) -> Generation {
        self.generations.last().copied().unwrap_or(Generation {
            turn: 0,
            attempt: 0,
        })
    }

    /// The generation streaming right now, if any.
    fn streaming(&self) -> Option<Generation> {
        match &self.state.phase {
            Phase::Streaming { request, .. } => Some(request.generation),
            _ => None,
        }
    }

    /// The tool running right now, if any.
    fn executing(&self) -> Option<ToolCallId> {
        match &self.state.phase {
            Phase::ExecutingTools { current, .. } => Some(current.clone()),
            _ => None,
        }
    }

    /// The request a retry timer would send now, if any.
    fn retry_due(&self) -> Option<Request> {
        match &self.state.phase {
            Phase::RetryWait { next, .. } => Some(*next),
            _ => None,
        }
    }

    fn input_for(&mut self, action: &Action) -> Input {
        match action {
            Action::UserMessage { empty } => {
                let n = self.fresh();
                Input::UserMessage {
                    text: if *empty {
                        "  ".to_owned()
                    } else {
                        format!("message {n}")
                    },
                    images: Vec::new(),
                }
            }
            Action::FinishText => Input::StreamFinished {
                generation: self.latest_generation(),
                response: text_response("the answer"),
            },
            Action::FinishTools(tools) => {
                let calls = tools
                    .iter()
                    .map(|tool| ToolCall {
                        id: ToolCallId::new(format!("call-{}", self.fresh())),
                        name: tool.name().to_owned(),
                        input: tool.input(),
                    })
                    .collect();
                Input::StreamFinished {
                    generation: self.latest_generation(),
                    response: tool_response(calls),
                }
            }
            Action::FailStream {
                retryable,
                retry_after_ms,
                jitter,
                too_long,
            } => Input::StreamFailed {
                generation: self.latest_generation(),
                failure: LlmFailure {
                    retryable: *retryable,
                    retry_after_ms: *retry_after_ms,
                    message: if *too_long {
                        "prompt is too long".to_owned()
                    } else {
                        "overloaded".to_owned()
                    },
                    prompt_too_long: *too_long,
                },
                jitter: *jitter,
            },
            Action::Delta => Input::StreamDelta {
                generation: self.latest_generation(),
                delta: StreamDelta::Text {
                    text: "partial ".to_owned(),
                },
            },
            Action::StaleStream(message) => {
                let generation = match self.generations.len() {
                    0 | 1 => Generation {
                        turn: 0,
                        attempt: 0,
                    },
                    n => self.generations[n - 2],
                };
                stream_message_for(*message, generation)
            }
            Action::ToolFinished { is_error, images } => Input::ToolFinished {
                tool_call_id: self
                    .running_tool
                    .clone()
                    .unwrap_or_else(|| ToolCallId::new("call-none")),
                content: "tool output".to_owned(),
                is_error: *is_error,
                images: (0..*images).map(tool_image).collect(),
            },
            Action::ToolOutput { big } => Input::ToolOutput {
                tool_call_id: self
                    .running_tool
                    .clone()
                    .unwrap_or_else(|| ToolCallId::new("call-none")),
                // Multi-byte characters past the kept tail exercise its cut.
                chunk: if *big {
                    "é".repeat(5_000)
                } else {
                    "line\n".to_owned()
                },
            },
            Action::StaleTool { finished } => {
                let tool_call_id = ToolCallId::new("call-never-issued");
                if *finished {
                    Input::ToolFinished {
                        tool_call_id,
                        content: "late".to_owned(),
                        is_error: false,
                        images: Vec::new(),
                    }
                } else {
                    Input::ToolOutput {
                        tool_call_id,
                        chunk: "late".to_owned(),
                    }
                }
            }
            Action::Resolve { pick, decision } => {
                let pending = &self.state.working.pending;
                let tool_call_id = if pending.is_empty() {
                    ToolCallId::new("call-unknown")
                } else {
                    pending[pick % pending.len()].call.id.clone()
                };
                Input::Resolve {
                    tool_call_id,
                    decision: decision_of(*decision),
                    by: (pick % 2 == 0).then(|| "tester".to_owned()),
                }
            }
            Action::ResolveUnknown => Input::Resolve {
                tool_call_id: ToolCallId::new("call-unknown"),
                decision: Decision::Approve,
                by: None,
            },
            Action::ResolveSettled { pick, decision } => {
                let settled = settled_ids(&self.state.working);
                let tool_call_id = if settled.is_empty() {
                    ToolCallId::new("call-unknown")
                } else {
                    settled[pick % settled.len()].clone()
                };
                Input::Resolve {
                    tool_call_id,
                    decision: decision_of(*decision),
                    by: None,
                }
            }
            Action::Cancel => Input::Cancel,
            Action::FireTimer => self.fire(|timer| timer != Timer::Deadline),
            Action::FireDeadline => self.fire(|timer| timer == Timer::Deadline),
            Action::FireOldTimer { pick } => {
                let timer = match self.timers.len() {
                    0 => Timer::Debounce { token: 0 },
                    n => self.timers[pick % n].timer,
                };
                Input::TimerFired { timer }
            }
            Action::ChangeConfig {
                busy_policy,
                recovery,
                fallback,
                bash_needs_approval,
            } => {
                let mut config = self.state.working.config.clone();
                config.busy_policy = *busy_policy;
                config.recovery = *recovery;
                config.fallback = fallback.then(fallback_model);
                if *bash_needs_approval {
                    config
                        .tools
                        .insert(Tool::Bash.name().to_owned(), ToolPolicy::Approve);
                } else {
                    config.tools.remove(Tool::Bash.name());
                }
                Input::ChangeConfig { config }
            }
            Action::Stop => Input::Stop,
            Action::Compact => Input::Compact,
            Action::Rewind { pick, boundary } => {
                let ends: Vec<Seq> = self
                    .log
                    .iter()
                    .filter(|event| {
                        matches!(
                            event.kind,
                            EventKind::TurnCompleted { .. }
                                | EventKind::TurnFailed { .. }
                                | EventKind::TurnInterrupted { .. }
                        )
                    })
                    .map(|event| event.seq)
                    .collect();
                let last = self.state.working.last_seq;
                let to_seq = match (boundary, ends.len()) {
                    (true, n) if n > 0 => ends[pick % n],
                    _ => 1 + (*pick as Seq * 7) % (last + 1),
                };
                let at = keel_core::history::working_at(&self.log, to_seq).map(Box::new);
                Input::Rewind { to_seq, at }
            }
            Action::Restart => Input::Started,
        }
    }

    /// Fire the most recent live timer that `wanted` picks, advancing the
    /// clock to its time; with none, a deadline (a no-op unless it is due).
    fn fire(&mut self, wanted: impl Fn(Timer) -> bool) -> Input {
        let armed = self
            .timers
            .iter_mut()
            .rev()
            .find(|armed| !armed.done && wanted(armed.timer));
        match armed {
            Some(armed) => {
                armed.done = true;
                self.now = self.now.max(armed.at);
                Input::TimerFired { timer: armed.timer }
            }
            None => Input::TimerFired {
                timer: Timer::Deadline,
            },
        }
    }

    /// Let time pass, then carry out `mv`.
    fn perform(&mut self, mv: &Move) -> Performed {
        self.now = self.now.plus_millis(mv.advance_ms);
        let mut replaced = None;
        if let Action::Restart = mv.action {
            let rebuilt = Conversation::replay(&self.log).expect("the log replays");
            replaced = Some(std::mem::replace(&mut self.state, rebuilt));
            // The old actor's workers and timers died with it.
            self.running_tool = None;
            for timer in &mut self.timers {
                timer.done = true;
            }
        }
        let input = self.input_for(&mv.action);
        let before = self.state.clone();
        let step = transition(before.clone(), input.clone(), self.now);
        self.observe(&step);
        Performed {
            before,
            replaced,
            input,
            now: self.now,
            step,
        }
    }

    /// Take the step's state and note what its effects started.
    fn observe(&mut self, step: &Step) {
        self.log.extend(step.appended().iter().cloned());
        for effect in &step.effects {
            match effect {
                Effect::StartStream { generation, .. } => self.generations.push(*generation),
                Effect::StartTool { call } | Effect::SpawnSubAgents { call, .. } => {
                    self.running_tool = Some(call.id.clone());
                }
                Effect::SetTimer { timer, at } => self.timers.push(ArmedTimer {
                    timer: *timer,
                    at: *at,
                    done: false,
                }),
                // The shell drops a cancelled timer: it never fires.
                Effect::CancelTimer { timer } => {
                    for armed in &mut self.timers {
                        if armed.timer == *timer {
                            armed.done = true;
                        }
                    }
                }
                Effect::Append { .. }
                | Effect::Publish { .. }
                | Effect::AbortStream { .. }
                | Effect::AbortTool { .. }
                | Effect::CancelSubAgents { .. }
                | Effect::SaveSnapshot
                | Effect::Stop => {}
            }
        }
        self.state = step.state.clone();
    }

    /// Apply `input` to a copy of the current state.
    fn probe(&self, input: Input) -> Step {
        transition(self.state.clone(), input, self.now)
    }

    /// One input of every kind, aimed at whatever runs now.
    fn probe_inputs(&self) -> Vec<Input> {
        let generation = self.latest_generation();
        let tool = self
            .running_tool
            .clone()
            .unwrap_or_else(|| ToolCallId::new("call-none"));
        let mut config = self.state.working.config.clone();
        config.busy_policy = match config.busy_policy {
            BusyPolicy::Reject => BusyPolicy::Queue,
            BusyPolicy::Interrupt | BusyPolicy::Queue => BusyPolicy::Reject,
        };
        let mut inputs = vec![
            Input::UserMessage {
                text: "probe".to_owned(),
                images: Vec::new(),
            },
            Input::UserMessage {
                text: String::new(),
                images: Vec::new(),
            },
            Input::Cancel,
            Input::Stop,
            Input::Started,
            stream_message_for(StreamMessage::Delta, generation),
            stream_message_for(StreamMessage::Finished, generation),
            stream_message_for(StreamMessage::Failed, generation),
            Input::StreamFinished {
                generation,
                response: tool_response(vec![ToolCall {
                    id: ToolCallId::new("call-probe"),
                    name: Tool::Bash.name().to_owned(),
                    input: Tool::Bash.input(),
                }]),
            },
            Input::ToolOutput {
                tool_call_id: tool.clone(),
                chunk: "probe".to_owned(),
            },
            Input::ToolFinished {
                tool_call_id: tool,
                content: "probe".to_owned(),
                is_error: false,
                images: Vec::new(),
            },
            Input::Resolve {
                tool_call_id: ToolCallId::new("call-unknown"),
                decision: Decision::Deny,
                by: None,
            },
            Input::TimerFired {
                timer: Timer::Deadline,
            },
            Input::ChangeConfig { config },
        ];
        let mut calls: Vec<ToolCallId> = self
            .state
            .working
            .pending
            .iter()
            .map(|pending| pending.call.id.clone())
            .collect();
        calls.extend(settled_ids(&self.state.working).into_iter().rev().take(3));
        for tool_call_id in calls {
            for decision in every_decision() {
                inputs.push(Input::Resolve {
                    tool_call_id: tool_call_id.clone(),
                    decision,
                    by: Some("probe".to_owned()),
                });
            }
        }
        for (tool_call_id, decision) in &self.state.working.resolved {
            inputs.push(Input::Resolve {
                tool_call_id: tool_call_id.clone(),
                decision: decision.clone(),
                by: None,
            });
        }
        for armed in &self.timers {
            inputs.push(Input::TimerFired { timer: armed.timer });
        }
        inputs
    }
}

fn decision_of(kind: DecisionKind) -> Decision {
    match kind {
        DecisionKind::Approve => Decision::Approve,
        DecisionKind::Edit => Decision::Edit {
            input: serde_json::json!({"command": "echo edited"}),
        },
        DecisionKind::Deny => Decision::Deny,
        DecisionKind::Answer => Decision::Answer {
            text: "yes".to_owned(),
        },
    }
}

/// One decision of each kind, and a second answer that differs only in
/// its text.
fn every_decision() -> Vec<Decision> {
    vec![
        Decision::Approve,
        Decision::Edit {
            input: serde_json::json!({"command": "echo edited"}),
        },
        Decision::Deny,
        Decision::Answer {
            text: "yes".to_owned(),
        },
        Decision::Answer {
            text: "no".to_owned(),
        },
    ]
}

/// The ids of the calls that have a result in the prompt, oldest first.
fn settled_ids(working: &WorkingSet) -> Vec<ToolCallId> {
    working
        .messages
        .iter()
        .flat_map(|message| &message.content)
        .filter_map(|block| match block {
            ContentBlock::ToolResult { result } => Some(result.tool_call_id.clone()),
            _ => None,
        })
        .collect()
}

fn text_response(text: &str) -> AssistantResponse {
    AssistantResponse {
        blocks: vec![AssistantBlock::Text {
            text: text.to_owned(),
        }],
        stop_reason: StopReason::EndTurn,
        usage: Usage {
            input_tokens: 1_000,
            output_tokens: 100,
            ..Usage::default()
        },
        provider: ProviderKind::Mock,
        model: "mock".to_owned(),
    }
}

fn tool_response(calls: Vec<ToolCall>) -> AssistantResponse {
    let mut blocks = vec![AssistantBlock::Text {
        text: "let me see".to_owned(),
    }];
    blocks.extend(
        calls
            .into_iter()
            .map(|call| AssistantBlock::ToolUse { call }),
    );
    AssistantResponse {
        blocks,
        stop_reason: StopReason::ToolUse,
        ..text_response("")
    }
}

fn stream_message_for(message: StreamMessage, generation: Generation) -> Input {
    match message {
        StreamMessage::Delta => Input::StreamDelta {
            generation,
            delta: StreamDelta::Text {
                text: "late ".to_owned(),
            },
        },
        StreamMessage::Finished => Input::StreamFinished {
            generation,
            response: text_response("late"),
        },
        StreamMessage::Failed => Input::StreamFailed {
            generation,
            failure: LlmFailure {
                retryable: true,
                retry_after_ms: None,
                message: "late".to_owned(),
                prompt_too_long: false,
            },
            jitter: 0,
        },
    }
}

/// Run `moves` from a conversation made by `setup`, calling `check` on the
/// initial state (with `None`) and after every move.
fn run(
    setup: &Setup,
    moves: &[Move],
    mut check: impl FnMut(&Driver, Option<&Performed>) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let mut driver = Driver::new(setup);
    check(&driver, None)?;
    for mv in moves {
        let performed = driver.perform(mv);
        check(&driver, Some(&performed))?;
    }
    Ok(())
}

fn stream_starts(step: &Step) -> Vec<Generation> {
    step.effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StartStream { generation, .. } => Some(*generation),
            _ => None,
        })
        .collect()
}

/// Recovered events since the last user message in `log`.
fn recovered_since_user_message(log: &[Event]) -> u32 {
    let mut count = 0;
    for event in log.iter().rev() {
        match event.kind {
            EventKind::UserMessage { .. } => break,
            EventKind::Recovered { .. } => count += 1,
            _ => {}
        }
    }
    count
}

/// Generations that are not streaming now: anything a late stream message
/// might carry.
fn stale_generations(driver: &Driver) -> Vec<Generation> {
    let current = driver.streaming();
    let turn = driver.state.working.turn;
    let mut candidates = vec![
        Generation { turn, attempt: 0 },
        Generation {
            turn: turn + 1,
            attempt: 1,
        },
    ];
    candidates.extend(driver.generations.iter().rev().take(4).copied());
    if let Some(next) = driver.retry_due() {
        candidates.push(next.generation);
    }
    if let Some(current) = current {
        candidates.push(Generation {
            turn: current.turn,
            attempt: current.attempt + 1,
        });
    }
    candidates.retain(|generation| Some(*generation) != current);
    candidates
}

/// Generations a retry timer might carry that are not the one waiting now.
fn stale_retry_generations(driver: &Driver) -> Vec<Generation> {
    let due = driver.retry_due().map(|next| next.generation);
    let mut candidates = stale_generations(driver);
    candidates.extend(driver.streaming());
    candidates.retain(|generation| Some(*generation) != due);
    candidates
}

/// Debounce tokens other than the one the debounce waits on now.
fn stale_tokens(driver: &Driver) -> Vec<Seq> {
    let current = match driver.state.phase {
        Phase::Debouncing { token } => Some(token),
        _ => None,
    };
    let last = driver.state.working.last_seq;
    let mut candidates = vec![0, last, last + 1];
    candidates.extend(driver.timers.iter().filter_map(|armed| match armed.timer {
        Timer::Debounce { token } => Some(token),
        Timer::Retry { .. } | Timer::Deadline => None,
    }));
    candidates.retain(|token| Some(*token) != current);
    candidates
}

/// Tool call ids other than the tool running now.
fn stale_tool_ids(driver: &Driver) -> Vec<ToolCallId> {
    let running = driver.executing();
    let working = &driver.state.working;
    let mut candidates = vec![ToolCallId::new("call-never-issued")];
    candidates.extend(driver.running_tool.clone());
    candidates.extend(working.open_calls.iter().map(|call| call.id.clone()));
    candidates.extend(
        working
            .pending
            .iter()
            .map(|pending| pending.call.id.clone()),
    );
    candidates.retain(|id| Some(id) != running.as_ref());
    candidates
}

/// The state invariants that must hold once a turn was called off.
fn check_settled(state: &Conversation) -> Result<(), TestCaseError> {
    let working = &state.working;
    prop_assert!(
        working.open_calls.is_empty(),
        "open calls left: {:?}",
        working.open_calls
    );
    prop_assert!(
        working.pending.is_empty(),
        "pending left: {:?}",
        working.pending
    );
    prop_assert!(working.tool_uses_paired(), "a tool_use has no result");
    prop_assert!(
        state.phase.agrees_with(working.status()),
        "phase {:?} disagrees with status {:?}",
        state.phase,
        working.status()
    );
    Ok(())
}

/// A StartStream only goes out for a prompt every provider accepts, and
/// names the request the state now streams.
fn check_stream_start(step: &Step) -> Result<(), TestCaseError> {
    let starts = stream_starts(step);
    if starts.is_empty() {
        return Ok(());
    }
    let working = &step.state.working;
    prop_assert_eq!(starts.len(), 1, "more than one StartStream in one step");
    prop_assert!(
        working.open_calls.is_empty(),
        "StartStream with open calls {:?}",
        working.open_calls
    );
    prop_assert!(
        working.tool_uses_paired(),
        "StartStream while a tool_use lacks its result"
    );
    // Compaction never parts a result from its call, and a prompt starts
    // with the user (docs/compaction.md).
    prop_assert!(
        results_follow_their_calls(&working.messages),
        "a tool result without its call in the prompt"
    );
    prop_assert!(
        working
            .messages
            .first()
            .is_none_or(|first| first.role == keel_core::message::Role::User),
        "the prompt starts with the assistant"
    );
    prop_assert_eq!(working.messages.len(), working.message_seqs.len());
    let expected = if step.state.phase.compacting_on_demand() {
        keel_core::StateName::Compacting
    } else {
        keel_core::StateName::Streaming
    };
    prop_assert_eq!(step.state.phase.name(), expected);
    if let Phase::Streaming { request, .. } = &step.state.phase {
        prop_assert_eq!(request.generation, starts[0]);
    }
    Ok(())
}

/// Every tool result in `messages` comes after the call it answers.
fn results_follow_their_calls(messages: &[keel_core::message::Message]) -> bool {
    use keel_core::message::ContentBlock;
    let mut called = std::collections::HashSet::new();
    for block in messages.iter().flat_map(|message| &message.content) {
        match block {
            ContentBlock::ToolUse { call } => {
                called.insert(call.id.clone());
            }
            ContentBlock::ToolResult { result } => {
                if !called.contains(&result.tool_call_id) {
                    return false;
                }
            }
            ContentBlock::Text { .. }
            | ContentBlock::Thinking { .. }
            | ContentBlock::Image { .. } => {}
        }
    }
    true
}

/// A refused input leaves everything as it was.
fn check_rejection(before: &Conversation, step: &Step) -> Result<(), TestCaseError> {
    if step.rejection.is_some() {
        prop_assert_eq!(&step.state, before, "a rejection changed the state");
        prop_assert!(
            step.effects.is_empty(),
            "a rejection had effects: {:?}",
            step.effects
        );
    }
    Ok(())
}

/// 256 cases per property, unless `PROPTEST_CASES` asks for another number.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// REQ-BED-001: `transition` is a pure function. The same state, input
    /// and time give equal steps, for every step of a run and for an input of
    /// every kind probed from every reachable state; replaying a log is
    /// deterministic too.
    #[test]
    fn transition_is_deterministic(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, performed| {
            if let Some(p) = performed {
                let first = transition(p.before.clone(), p.input.clone(), p.now);
                let second = transition(p.before.clone(), p.input.clone(), p.now);
                prop_assert_eq!(&first, &second);
                prop_assert_eq!(&first, &p.step);
            }
            for input in driver.probe_inputs() {
                prop_assert_eq!(driver.probe(input.clone()), driver.probe(input));
            }
            let once = Conversation::replay(&driver.log).expect("the log replays");
            let twice = Conversation::replay(&driver.log).expect("the log replays");
            prop_assert_eq!(once, twice);
            Ok(())
        })?;
    }

    /// A sub-agent takes no turn once it has finished, so it owes none:
    /// every message it acknowledged got a turn or was named `Unanswered`
    /// (a submission, a failure, a cancel or a stop with messages queued).
    #[test]
    fn a_finished_sub_agent_owes_no_message(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, _| {
            if driver.state.phase.is_terminal() {
                let working = &driver.state.working;
                prop_assert!(
                    working.untriggered.is_empty() && working.queued.is_empty(),
                    "a finished sub-agent owes {:?}, queued {:?}",
                    working.untriggered,
                    working.queued.len()
                );
            }
            Ok(())
        })?;
    }

    /// The log's encoding: every event a random run appends decodes back to
    /// itself, from the current record version and from version 1.
    #[test]
    fn every_event_round_trips_through_both_record_versions(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, performed| {
            let fresh: &[Event] = match performed {
                Some(p) => p.step.appended(),
                None => &driver.log,
            };
            for event in fresh {
                let current = keel_core::codec::decode(&keel_core::codec::encode(event));
                prop_assert_eq!(current.as_ref(), Ok(event));
                let v1 = keel_core::codec::decode(&keel_core::codec::encode_v1(event));
                prop_assert_eq!(v1.as_ref(), Ok(event));
            }
            Ok(())
        })?;
    }

    /// "Append is always first: nothing happens before it is durable." At
    /// most one Append per step, always the first effect, never empty, and
    /// the log's seqs run 1, 2, 3, … from `Created` without gaps.
    #[test]
    fn append_comes_first_and_seqs_are_contiguous(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, performed| {
            if let Some(p) = performed {
                for (index, effect) in p.step.effects.iter().enumerate() {
                    if let Effect::Append { events } = effect {
                        prop_assert_eq!(index, 0, "Append is not first: {:?}", p.step.effects);
                        prop_assert!(!events.is_empty(), "an empty Append");
                    }
                }
            }
            let starts_with_created = matches!(
                driver.log.first().map(|event| &event.kind),
                Some(EventKind::Created { .. })
            );
            prop_assert!(starts_with_created, "the log does not start with Created");
            for (index, event) in driver.log.iter().enumerate() {
                prop_assert_eq!(event.seq, index as Seq + 1, "seq gap in the log");
            }
            prop_assert_eq!(driver.state.working.last_seq, driver.log.len() as Seq);
            Ok(())
        })?;
    }

    /// Invariant 3: every tool_use has its result before the next LLM request.
    /// No step (of the run, or a cancel or message probed from any reachable
    /// state) starts a stream while a tool call is open or unanswered; the
    /// stream it starts is the one the state now waits on.
    #[test]
    fn no_stream_starts_with_open_tool_calls(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, performed| {
            if let Some(p) = performed {
                check_stream_start(&p.step)?;
            }
            for input in driver.probe_inputs() {
                check_stream_start(&driver.probe(input))?;
            }
            Ok(())
        })?;
    }

    /// Invariant 4 and REQ-BED-005: cancel leaves every state. From any
    /// reachable state a Cancel is accepted; a running turn ends (Idle, or
    /// Failed for a sub-agent); Idle, Error, Terminating and the terminal
    /// states stay as they are; and afterwards no tool call is open or
    /// pending and every tool_use has its result.
    #[test]
    fn cancel_settles_every_state(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, _| {
            let before = &driver.state;
            let step = driver.probe(Input::Cancel);
            prop_assert!(step.rejection.is_none(), "cancel rejected: {:?}", step.rejection);
            let after = &step.state;
            let sub_agent = before.working.is_sub_agent();
            match &before.phase {
                // A sub-agent fails in every state but a terminal one:
                // before its task came too.
                Phase::Idle | Phase::Error { .. } | Phase::Debouncing { .. } if sub_agent => {
                    prop_assert!(matches!(after.phase, Phase::Failed { .. }),
                        "cancelled sub-agent is {:?}", after.phase);
                    prop_assert!(after.working.untriggered.is_empty(), "owes {:?}", after.working.untriggered);
                }
                Phase::Idle
                | Phase::Error { .. }
                | Phase::Terminating
                | Phase::Completed { .. }
                | Phase::Failed { .. } => {
                    prop_assert_eq!(after, before, "cancel changed a resting state");
                    prop_assert!(step.effects.is_empty(), "effects: {:?}", step.effects);
                }
                Phase::Debouncing { .. } => {
                    prop_assert!(
                        matches!(after.phase, Phase::Idle | Phase::Error { .. }),
                        "cancel while debouncing gave {:?}",
                        after.phase
                    );
                }
                Phase::Streaming { .. }
                | Phase::RetryWait { .. }
                | Phase::ExecutingTools { .. }
                | Phase::AwaitingInput
                | Phase::Recovering => {
                    if before.phase.compacting_on_demand() {
                        // Nothing of a turn ran: it rests as the log says.
                        prop_assert_eq!(&after.phase, &Phase::from_status(&after.working));
                    } else if sub_agent {
                        prop_assert!(matches!(after.phase, Phase::Failed { .. }),
                            "cancelled sub-agent is {:?}", after.phase);
                    } else {
                        prop_assert_eq!(&after.phase, &Phase::Idle);
                    }
                }
            }
            // A stopping actor keeps what it had: pending approvals survive.
            if before.phase != Phase::Terminating {
                check_settled(after)?;
            }
            // A timer waiting for what the cancel ended is dropped with it.
            let dropped = match before.phase {
                Phase::RetryWait { next, .. } => Some(Timer::Retry { generation: next.generation }),
                Phase::Debouncing { token } => Some(Timer::Debounce { token }),
                _ => None,
            };
            if let Some(timer) = dropped {
                prop_assert!(step.effects.contains(&Effect::CancelTimer { timer }),
                    "cancel kept {:?}: {:?}", timer, step.effects);
            }
            Ok(())
        })?;
    }

    /// Causal links: the first event has no parent; every other event
    /// links to an earlier one.
    #[test]
    fn every_event_but_the_first_has_an_earlier_parent(setup in setup(), moves in moves(4)) {
        run(&setup, &moves, |driver, _| {
            let Some((first, rest)) = driver.log.split_first() else {
                return Ok(());
            };
            prop_assert_eq!(first.parent, None);
            for event in rest {
                let parent = event.parent;
                prop_assert!(
                    parent.is_some_and(|parent| parent >= 1 && parent < event.seq),
                    "event {:?} has parent {:?}", event.kind, parent
                );
            }
            Ok(())
        })?;
    }

    /// Every acknowledged message gets a turn, or an event says why not.
    /// Whenever the conversation rests (idle or failed), nothing is owed,
    /// and every turn-triggering user message in the log was followed by a
    /// `TurnStarted` or named in an `Unanswered` event.
    #[test]
    fn every_acknowledged_message_is_answered_or_let_go(setup in setup(), moves in moves(4)) {
        run(&setup, &moves, |driver, _| {
            if !matches!(driver.state.phase, Phase::Idle | Phase::Error { .. }) {
                return Ok(());
            }
            prop_assert!(driver.state.working.untriggered.is_empty(),
                "resting with owed messages {:?}", driver.state.working.untriggered);
            for message in driver.log.iter().filter(|event| {
                event.triggers_turn && matches!(event.kind, EventKind::UserMessage { .. })
            }) {
                let settled = driver.log.iter().any(|later| {
                    later.seq > message.seq
                        && match &later.kind {
                            EventKind::TurnStarted { .. } => true,
                            EventKind::Unanswered { messages, .. } => messages.contains(&message.seq),
                            _ => false,
                        }
                });
                prop_assert!(settled, "message {} got no turn and no Unanswered", message.seq);
            }
            Ok(())
        })?;
    }

    /// A graceful shutdown ends every state: from any reachable state it is
    /// accepted, starts nothing, ends in Terminating (or the terminal state
    /// it was in) with a Stop, leaves no call open unless it waits behind a
    /// pending approval or question (those survive), and a start
    /// from the resulting log sends nothing to a provider again: a request
    /// it sends belongs to a new turn for owed messages.
    #[test]
    fn shutdown_ends_every_state_and_nothing_is_sent_twice(setup in setup(), moves in moves(4)) {
        run(&setup, &moves, |driver, _| {
            let before = &driver.state;
            let step = driver.probe(Input::Shutdown);
            prop_assert!(step.rejection.is_none());
            prop_assert!(stream_starts(&step).is_empty(), "shutdown started a stream");
            prop_assert!(!step.effects.iter().any(|effect| matches!(
                effect,
                Effect::StartTool { .. } | Effect::SpawnSubAgents { .. } | Effect::SetTimer { .. }
            )), "shutdown started work: {:?}", step.effects);
            if before.phase != Phase::Terminating {
                prop_assert!(step.effects.contains(&Effect::Stop), "no Stop: {:?}", step.effects);
                prop_assert!(
                    step.state.phase == Phase::Terminating || step.state.phase.is_terminal(),
                    "shutdown left {:?}", step.state.phase
                );
                // Calls wait only behind a pending approval or question.
                let working = &step.state.working;
                prop_assert!(working.open_calls.is_empty() || !working.pending.is_empty(),
                    "open calls with nothing pending: {:?}", working.open_calls);
            }
            let mut log = driver.log.clone();
            log.extend(step.appended().iter().cloned());
            let rebuilt = Conversation::replay(&log).expect("the log replays");
            let turn_before = rebuilt.working.turn;
            let started = transition(rebuilt, Input::Started, driver.now);
            prop_assert!(
                !started.appended().iter().any(|event| matches!(event.kind, EventKind::Recovered { .. })),
                "a start after a graceful stop resumed the old turn"
            );
            if !stream_starts(&started).is_empty() {
                prop_assert_eq!(started.state.working.turn, turn_before + 1,
                    "a request after a graceful stop that is not a new turn");
            }
            Ok(())
        })?;
    }

    /// Invariant 6: a stale worker message never changes state. From any
    /// reachable state, stream messages of a generation that is not
    /// streaming, tool messages for an id that is not running, and retry or
    /// debounce timers that are not the awaited one change nothing and ask
    /// for nothing.
    #[test]
    fn stale_messages_change_nothing(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, _| {
            let mut stale = Vec::new();
            for generation in stale_generations(driver) {
                for message in [StreamMessage::Delta, StreamMessage::Finished, StreamMessage::Failed] {
                    stale.push(stream_message_for(message, generation));
                }
            }
            for generation in stale_retry_generations(driver) {
                stale.push(Input::TimerFired { timer: Timer::Retry { generation } });
            }
            for token in stale_tokens(driver) {
                stale.push(Input::TimerFired { timer: Timer::Debounce { token } });
            }
            for tool_call_id in stale_tool_ids(driver) {
                stale.push(Input::ToolOutput { tool_call_id: tool_call_id.clone(), chunk: "late".to_owned() });
                stale.push(Input::ToolFinished { tool_call_id, content: "late".to_owned(), is_error: false, images: Vec::new() });
            }
            for input in stale {
                let step = driver.probe(input.clone());
                prop_assert_eq!(&step.state, &driver.state, "stale {:?} changed the state", input);
                prop_assert!(step.effects.is_empty(), "stale {:?} had effects {:?}", input, step.effects);
                prop_assert!(step.rejection.is_none(), "stale {:?} was rejected", input);
            }
            Ok(())
        })?;
    }

    /// Invariant 4: no state is a dead end. In every reachable state that is
    /// not terminal and not shutting down, a user message is accepted or a
    /// cancel moves the conversation on; and after a cancel, a message is
    /// accepted unless the cancel ended a sub-agent for good.
    #[test]
    fn no_dead_ends(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, _| {
            let phase = &driver.state.phase;
            if phase.is_terminal() || *phase == Phase::Terminating {
                return Ok(());
            }
            let message = || Input::UserMessage { text: "hello".to_owned(), images: Vec::new() };
            let accepted = driver.probe(message()).rejection.is_none();
            let cancelled = driver.probe(Input::Cancel);
            prop_assert!(
                accepted || cancelled.state.phase.name() != phase.name(),
                "dead end in {:?}: message refused and cancel did nothing", phase
            );
            if !cancelled.state.phase.is_terminal() {
                let after = transition(cancelled.state, message(), driver.now);
                prop_assert!(after.rejection.is_none(),
                    "message refused after cancel: {:?}", after.rejection);
            }
            Ok(())
        })?;
    }

    /// A rewind (docs/history.md) that is accepted makes the prompt the one
    /// a replay of the log up to its seq makes, whatever came between
    /// (compactions, tools, failures, restarts); one that is refused
    /// records nothing. The conversation rests after it.
    #[test]
    fn a_rewind_restores_the_prompt_at_its_boundary(setup in setup(), moves in moves(2)) {
        run(&setup, &moves, |driver, performed| {
            let Some(p) = performed else { return Ok(()) };
            let Input::Rewind { to_seq, at } = &p.input else { return Ok(()) };
            if p.step.rejection.is_some() {
                prop_assert!(p.step.appended().is_empty());
                return Ok(());
            }
            let Ok(at) = at else {
                return Err(TestCaseError::fail("a rewind to no boundary was accepted"));
            };
            if *to_seq >= p.before.working.last_seq {
                prop_assert!(p.step.appended().is_empty());
                return Ok(());
            }
            let log = &driver.log[..p.before.working.last_seq as usize];
            let expected = keel_core::history::working_at(log, *to_seq).expect("a boundary");
            prop_assert_eq!(&expected.messages, &at.messages);
            prop_assert_eq!(&driver.state.working.messages, &expected.messages);
            prop_assert_eq!(&driver.state.working.message_seqs, &expected.message_seqs);
            prop_assert_eq!(driver.state.phase.name(), keel_core::StateName::Idle);
            prop_assert!(keel_core::history::is_boundary(&driver.state.working));
            Ok(())
        })?;
    }

    /// Invariant 1: the log is the truth. After every step, replaying the log
    /// gives exactly the live working set, and the live phase agrees with
    /// the status the log implies.
    #[test]
    fn replay_matches_live_state(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, _| {
            let replayed = WorkingSet::replay(&driver.log).expect("the log replays");
            prop_assert_eq!(&replayed, &driver.state.working);
            prop_assert!(
                driver.state.phase.agrees_with(driver.state.working.status()),
                "phase {:?} disagrees with status {:?}",
                driver.state.phase,
                driver.state.working.status()
            );
            Ok(())
        })?;
    }

    /// A rebuild from the store replays a log it owns
    /// (`WorkingSet::replay_owned`, which moves strings instead of copying
    /// them): after every step of random runs, restarts included, that gives
    /// the same working set as replaying the borrowed log, and a log that is
    /// not a conversation's (no `Created` first, a gap) is refused alike.
    #[test]
    fn owned_replay_matches_borrowed_replay(setup in setup(), moves in moves(12)) {
        run(&setup, &moves, |driver, _| {
            let log = &driver.log;
            prop_assert_eq!(
                WorkingSet::replay_owned(log.clone()),
                WorkingSet::replay(log)
            );
            let headless = &log[1..];
            prop_assert_eq!(
                WorkingSet::replay_owned(headless.to_vec()),
                WorkingSet::replay(headless)
            );
            if log.len() > 2 {
                let mut gapped = log.clone();
                gapped.remove(log.len() / 2);
                prop_assert_eq!(
                    WorkingSet::replay_owned(gapped.clone()),
                    WorkingSet::replay(&gapped)
                );
            }
            Ok(())
        })?;
    }

    /// A cold start from a checkpoint: the working set of any prefix of the
    /// log, through the checkpoint encoding, resumed with the rest of the
    /// log, is the working set of the whole log; a tail that does not follow
    /// the checkpoint is refused.
    #[test]
    fn checkpoint_and_tail_match_replay(setup in setup(), moves in moves(12)) {
        run(&setup, &moves, |driver, _| {
            let log = &driver.log;
            let whole = WorkingSet::replay(log).unwrap();
            for cut in 1..=log.len() {
                let prefix = WorkingSet::replay(&log[..cut]).unwrap();
                let bytes = keel_core::codec::checkpoint::encode(&prefix);
                let checkpoint = keel_core::codec::checkpoint::decode(&bytes).unwrap();
                prop_assert_eq!(&checkpoint, &prefix);
                let resumed = checkpoint.clone().resume_owned(log[cut..].to_vec());
                prop_assert_eq!(resumed.as_ref(), Ok(&whole));
                if cut + 1 < log.len() {
                    prop_assert!(checkpoint.resume_owned(log[cut + 1..].to_vec()).is_err());
                }
            }
            Ok(())
        })?;
    }

    /// Rejection contract: keel-core answers an ill-timed input with a
    /// Rejection and leaves the conversation as it was, with no effects, for
    /// every step of a run and every kind of input probed from every state.
    #[test]
    fn rejections_change_nothing(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, performed| {
            if let Some(p) = performed {
                check_rejection(&p.before, &p.step)?;
            }
            for input in driver.probe_inputs() {
                check_rejection(&driver.state, &driver.probe(input))?;
            }
            Ok(())
        })?;
    }

    /// The history only grows at its end unless `history_edits` counts the
    /// change: every message before the last one stays as it was, and none
    /// goes. A request reuses the JSON of those messages on that promise
    /// (`wire::EncodedHistory`), and does so here: after every step, a
    /// request encoded with the encodings kept from the requests before is
    /// the request encoded afresh, on both wires. The prompt's tokens are
    /// kept on the same promise (`WorkingSet::settled_tokens`), and equal
    /// a count afresh after every step.
    #[test]
    fn the_history_changes_only_at_its_end_unless_counted(setup in setup(), moves in moves(2)) {
        let mut openai = keel_core::wire::EncodedHistory::default();
        let mut anthropic = keel_core::wire::EncodedHistory::default();
        let tools = keel_core::wire::ToolSpecs::new(vec![keel_core::wire::ToolSpec {
            name: "bash".to_owned(),
            description: "Runs a command.".to_owned(),
            input_schema: json!({ "type": "object" }),
        }]);
        let images = BTreeMap::new();
        run(&setup, &moves, |driver, performed| {
            let after = &driver.state.working;
            if let Some(p) = performed {
                let before = &p.replaced.as_ref().unwrap_or(&p.before).working;
                if after.history_edits == before.history_edits {
                    let kept = before.messages.len().saturating_sub(1);
                    prop_assert!(after.messages.len() >= before.messages.len());
                    prop_assert_eq!(&after.messages[..kept], &before.messages[..kept]);
                } else {
                    prop_assert!(after.history_edits > before.history_edits);
                }
            }
            // The settled messages' tokens, kept as the history changes,
            // are what counting them afresh gives.
            let settled = after.messages.len().saturating_sub(1);
            prop_assert_eq!(
                after.settled_tokens,
                keel_core::compaction::messages_tokens(&after.messages[..settled])
            );
            let has_images = after.messages.iter().flat_map(|message| &message.content).any(
                |block| match block {
                    ContentBlock::Image { .. } => true,
                    ContentBlock::ToolResult { result } => !result.images.is_empty(),
                    _ => false,
                },
            );
            if has_images {
                // The runtime reuses nothing for a history with images.
                return Ok(());
            }
            let request = keel_core::wire::PromptRequest {
                model: "gpt-4o",
                system: after.config.system.as_deref().or(Some("Be brief.")),
                messages: &after.messages,
                tools: &tools,
                max_tokens: 1024,
                images: &images,
            };
            let edits = after.history_edits;
            let reused = keel_core::wire::openai::encode_request_reusing(&request, edits, &mut openai)
                .expect("encoded");
            prop_assert_eq!(&reused, &keel_core::wire::openai::encode_request_bytes(&request).expect("encoded"));
            let reused =
                keel_core::wire::anthropic::encode_request_reusing(&request, edits, &mut anthropic)
                    .expect("encoded");
            prop_assert_eq!(&reused, &keel_core::wire::anthropic::encode_request_bytes(&request).expect("encoded"));
            Ok(())
        })?;
    }

    /// Completed and Failed are terminal: every input, a restart included,
    /// leaves the conversation as it is and appends nothing; the only effect
    /// ever asked for is `Stop` in answer to `Input::Stop`.
    #[test]
    fn terminal_states_absorb(setup in setup(), moves in moves(1)) {
        run(&setup, &moves, |driver, performed| {
            if let Some(p) = performed {
                let was = p.replaced.as_ref().unwrap_or(&p.before);
                if was.phase.is_terminal() {
                    prop_assert_eq!(&p.step.state.phase, &was.phase);
                    prop_assert_eq!(&p.step.state.working, &was.working);
                    prop_assert!(p.step.appended().is_empty());
                }
            }
            if !driver.state.phase.is_terminal() {
                return Ok(());
            }
            for input in driver.probe_inputs() {
                let step = driver.probe(input.clone());
                prop_assert_eq!(&step.state, &driver.state, "{:?} changed a terminal state", input);
                prop_assert!(step.appended().is_empty(), "{:?} appended to a finished log", input);
                if input == Input::Stop {
                    prop_assert_eq!(&step.effects, &vec![Effect::Stop]);
                } else {
                    prop_assert!(step.effects.is_empty(), "{:?} had effects {:?}", input, step.effects);
                }
            }
            // The deadline is long past: still nothing.
            let late = transition(
                driver.state.clone(),
                Input::TimerFired { timer: Timer::Deadline },
                driver.now.plus_millis(10 * 60 * 60 * 1000),
            );
            prop_assert_eq!(&late.state, &driver.state);
            prop_assert!(late.effects.is_empty());
            Ok(())
        })?;
    }

    /// Recovery after a restart: automatic resumption must not loop
    /// (docs/requirements.md, "Recovery after a crash or restart"). After
    /// rebuilding from the log and `Started`, the phase agrees with the
    /// log, any request it sends has every tool_use answered, and the log
    /// never holds more than MAX_CONSECUTIVE_RESUMES `Recovered` events
    /// since the last user message. Restarts are frequent here.
    #[test]
    fn restarts_recover_without_looping(setup in setup(), moves in moves(12)) {
        run(&setup, &moves, |driver, performed| {
            if let Some(p) = performed {
                if p.replaced.is_some() {
                    let state = &p.step.state;
                    prop_assert!(
                        state.phase.agrees_with(state.working.status()),
                        "after restart phase {:?} disagrees with status {:?}",
                        state.phase,
                        state.working.status()
                    );
                    prop_assert!(p.step.rejection.is_none());
                    prop_assert!(state.phase != Phase::Recovering, "Started left it recovering");
                    check_stream_start(&p.step)?;
                }
            }
            let recovered = recovered_since_user_message(&driver.log);
            prop_assert!(
                recovered <= MAX_CONSECUTIVE_RESUMES,
                "{} Recovered events since the last user message",
                recovered
            );
            prop_assert_eq!(driver.state.working.consecutive_resumes, recovered);
            Ok(())
        })?;
    }
    /// A resolution happens exactly once. Resolving a call again with the
    /// decision it got gives the same log as resolving it once: accepted,
    /// no event, no effect, from every reachable state (a finished
    /// sub-agent included) for every resolution on record, also when the
    /// resolution ended its turn and a queued message started the next one
    /// in the same step. In a state that still takes input, any other
    /// decision is refused with `AlreadyResolved` naming the recorded one;
    /// a call that got its result without a resolution on record is
    /// `AlreadySettled`; an id never seen is `UnknownCall`.
    #[test]
    fn resolutions_happen_exactly_once(setup in setup(), moves in moves(4)) {
        run(&setup, &moves, |driver, performed| {
            if let Some(p) = performed {
                let accepted = p.step.rejection.is_none() && !p.step.appended().is_empty();
                if matches!(p.input, Input::Resolve { .. }) && accepted {
                    let again = transition(p.step.state.clone(), p.input.clone(), p.now);
                    prop_assert_eq!(again.rejection, None);
                    prop_assert!(again.effects.is_empty(), "a repeat had effects {:?}", again.effects);
                    prop_assert_eq!(&again.state, &p.step.state);
                }
            }
            let phase = &driver.state.phase;
            let takes_input = !phase.is_terminal() && *phase != Phase::Terminating;
            let working = &driver.state.working;
            let is_pending = |id: &ToolCallId| working.pending.iter().any(|pending| pending.call.id == *id);
            for (tool_call_id, recorded) in &working.resolved {
                prop_assert!(!is_pending(tool_call_id), "{} is resolved and pending", tool_call_id);
                for decision in every_decision() {
                    let step = driver.probe(Input::Resolve {
                        tool_call_id: tool_call_id.clone(),
                        decision: decision.clone(),
                        by: Some("someone else".to_owned()),
                    });
                    if decision == *recorded {
                        prop_assert_eq!(step.rejection, None);
                        prop_assert!(step.effects.is_empty(), "a repeat had effects {:?}", step.effects);
                        prop_assert_eq!(&step.state, &driver.state);
                    } else if takes_input {
                        prop_assert_eq!(step.rejection, Some(Rejection::AlreadyResolved {
                            tool_call_id: tool_call_id.clone(),
                            decision: recorded.clone(),
                        }));
                    }
                }
            }
            if !takes_input {
                return Ok(());
            }
            for tool_call_id in settled_ids(working) {
                if is_pending(&tool_call_id) || working.resolution(&tool_call_id).is_some() {
                    continue;
                }
                for decision in every_decision() {
                    let step = driver.probe(Input::Resolve {
                        tool_call_id: tool_call_id.clone(),
                        decision,
                        by: None,
                    });
                    prop_assert_eq!(step.rejection, Some(Rejection::AlreadySettled {
                        tool_call_id: tool_call_id.clone(),
                    }));
                }
            }
            let step = driver.probe(Input::Resolve {
                tool_call_id: ToolCallId::new("call-never-issued"),
                decision: Decision::Approve,
                by: None,
            });
            prop_assert_eq!(step.rejection, Some(Rejection::UnknownCall {
                tool_call_id: ToolCallId::new("call-never-issued"),
            }));
            Ok(())
        })?;
    }
}

/// The `n`th image a tool returns: distinct per `n`, the same every run.
fn tool_image(n: usize) -> ImageRef {
    ImageRef {
        hash: format!("{n:064x}"),
        media_type: "image/png".to_owned(),
        width: 16,
        height: 16,
        size: 64,
    }
}
