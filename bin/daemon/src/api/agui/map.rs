//! keel's updates as AG-UI events: a state machine over one run's
//! canonical events and live updates, with no I/O, so that what a client
//! sees for any sequence of updates is a test's business (`tests.rs`
//! compares rendered frames to the files in `fixtures/`).
//!
//! Text and reasoning stream from live deltas and are settled by the
//! canonical `assistant_message`: what the deltas did not carry (a stream
//! joined late, a reattach, lost live updates) is sent then, and a message
//! that streamed nothing is sent whole. A tool call streams the same way
//! and its result comes from the canonical `tool_result`. The run ends at
//! the first point the conversation rests at (the turn completed, failed or
//! was interrupted, or a call waits on someone), with the outcome that
//! point means; AG-UI's verifier refuses a `RUN_FINISHED` while a message
//! or a tool call is open, so everything open is closed first.
//!
//! Message ids are keel's, so that the next run's history says what the
//! client already has (docs/ag-ui.md, "History"): `keel-SEQ` for a message
//! from the log at SEQ, and `keel-SEQ-tTURN.ATTEMPT` for one streamed live
//! after canonical seq SEQ, before its own seq was known (with `+` added
//! for text that goes on after a tool call, in a message of its own).

use std::collections::BTreeSet;

use keel_actors::core::event::{
    Event as KeelEvent, EventKind, InterruptReason, PendingCall, PendingKind,
};
use keel_actors::core::message::AssistantBlock;
use keel_actors::core::{Generation, LiveEvent, Seq, StreamDelta};
use keel_actors::Update;
use serde_json::json;

use super::wire::{Event, FunctionCall, Interrupt, Message, Outcome, ToolCall};

/// One AG-UI event and the SSE `id` it goes out with: the seq of the
/// canonical event it was derived from, on the last frame derived from it,
/// so that a client resuming after that id has had every frame of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub id: Option<Seq>,
    pub event: Event,
}

impl Frame {
    fn live(event: Event) -> Frame {
        Frame { id: None, event }
    }
}

/// How a run ended, once it has.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Finished {
        seq: Option<Seq>,
        outcome: Outcome,
    },
    Failed {
        seq: Option<Seq>,
        code: String,
        message: String,
    },
}

/// One run's projection.
pub struct RunMap {
    thread_id: String,
    run_id: String,
    /// The run sent a user message: turn endings before its turn starts
    /// belong to a turn before it (`busy_policy = queue`), not to the run.
    awaits_turn: bool,
    /// Calls whose results the client sent in this run's input: it has
    /// those tool messages already, so no `TOOL_CALL_RESULT` repeats them.
    answered_by_client: BTreeSet<String>,
    /// The last canonical seq seen.
    last_seq: Seq,
    /// The response streaming now, from its live deltas.
    streaming: Option<Streaming>,
    ending: Option<Ending>,
}

/// What the live deltas of one response have opened and sent.
struct Streaming {
    generation: Generation,
    /// `keel-SEQ-tTURN.ATTEMPT`; the reasoning message adds `-reasoning`.
    message_id: String,
    text: Segment,
    reasoning: Segment,
    /// Calls started, in order, with the input sent so far.
    calls: Vec<StreamedCall>,
    /// Live updates were lost while it streamed: what was sent may lack
    /// pieces, so the canonical message closes it without adding to it.
    gapped: bool,
}

#[derive(Default)]
struct Segment {
    open: bool,
    sent: String,
}

struct StreamedCall {
    id: String,
    input: String,
    open: bool,
}

impl RunMap {
    pub fn new(thread_id: String, run_id: String, from: Seq) -> RunMap {
        RunMap {
            thread_id,
            run_id,
            awaits_turn: false,
            answered_by_client: BTreeSet::new(),
            last_seq: from.saturating_sub(1),
            streaming: None,
            ending: None,
        }
    }

    /// The run sent a message: it ends with that message's turn.
    pub fn awaiting_turn(mut self) -> RunMap {
        self.awaits_turn = true;
        self
    }

    /// The client answered these calls in the run's input.
    pub fn answered_by_client(mut self, calls: impl IntoIterator<Item = String>) -> RunMap {
        self.answered_by_client.extend(calls);
        self
    }

    pub fn started(&self) -> Frame {
        Frame::live(Event::RunStarted {
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
        })
    }

    /// How the run ended, once it has: the caller sends the thread's
    /// messages, then [`RunMap::finished`].
    pub fn ending(&self) -> Option<&Ending> {
        self.ending.as_ref()
    }

    /// The run's last frame.
    pub fn finished(&self) -> Option<Frame> {
        Some(match self.ending.as_ref()? {
            Ending::Finished { seq, outcome } => Frame {
                id: *seq,
                event: Event::RunFinished {
                    thread_id: self.thread_id.clone(),
                    run_id: self.run_id.clone(),
                    outcome: outcome.clone(),
                },
            },
            Ending::Failed { seq, code, message } => Frame {
                id: *seq,
                event: Event::RunError {
                    message: message.clone(),
                    code: code.clone(),
                },
            },
        })
    }

    /// End the run now, where the conversation already rests (nothing for
    /// it to do, or it waits on the calls `pending`).
    pub fn rest(&mut self, pending: &[PendingCall]) -> Vec<Frame> {
        let frames = self.close_all();
        self.ending = Some(Ending::Finished {
            seq: None,
            outcome: outcome_of(pending),
        });
        frames
    }

    /// End the run as failed: the follow broke, or the daemon stops.
    pub fn fail(&mut self, code: &str, message: &str) -> Vec<Frame> {
        let frames = self.close_all();
        if self.ending.is_none() {
            self.ending = Some(Ending::Failed {
                seq: None,
                code: code.to_owned(),
                message: message.to_owned(),
            });
        }
        frames
    }

    /// The frames of one update. Nothing once the run has ended.
    pub fn update(&mut self, update: &Update) -> Vec<Frame> {
        if self.ending.is_some() {
            return Vec::new();
        }
        match update {
            Update::Event { event } => self.canonical(event),
            Update::Live { event } => self.live(event),
        }
    }

    /// Live updates were dropped for this client.
    pub fn lagged(&mut self) {
        if let Some(streaming) = self.streaming.as_mut() {
            streaming.gapped = true;
        }
    }

    fn live(&mut self, event: &LiveEvent) -> Vec<Frame> {
        match event {
            LiveEvent::Delta { generation, delta } => self.delta(*generation, delta),
            LiveEvent::AttemptDiscarded { generation } => {
                // AG-UI cannot take back what was sent: the attempt's
                // message is closed as it stands, and the retry streams
                // under an id of its own. The thread's messages sent at
                // the run's end hold only what the log holds.
                if self
                    .streaming
                    .as_ref()
                    .is_some_and(|streaming| streaming.generation == *generation)
                {
                    let frames = self.close_all();
                    self.streaming = None;
                    return frames;
                }
                Vec::new()
            }
            LiveEvent::StateChanged { .. }
            | LiveEvent::ToolOutput { .. }
            | LiveEvent::Retrying { .. }
            | LiveEvent::FallbackUsed { .. }
            | LiveEvent::ImageOmitted { .. }
            | LiveEvent::ChildState { .. }
            | LiveEvent::ContextUsage { .. }
            | LiveEvent::CompactionFailed { .. }
            | LiveEvent::ChildPending { .. } => Vec::new(),
        }
    }

    fn delta(&mut self, generation: Generation, delta: &StreamDelta) -> Vec<Frame> {
        let mut frames = Vec::new();
        if self
            .streaming
            .as_ref()
            .is_some_and(|streaming| streaming.generation != generation)
        {
            frames.extend(self.close_all());
            self.streaming = None;
        }
        let last_seq = self.last_seq;
        let streaming = self.streaming.get_or_insert_with(|| Streaming {
            generation,
            message_id: format!(
                "keel-{last_seq}-t{}.{}",
                generation.turn, generation.attempt
            ),
            text: Segment::default(),
            reasoning: Segment::default(),
            calls: Vec::new(),
            gapped: false,
        });
        match delta {
            StreamDelta::Text { text } => {
                close_reasoning(streaming, &mut frames);
                close_calls(streaming, &mut frames);
                open_text(streaming, &mut frames);
                if !text.is_empty() {
                    streaming.text.sent.push_str(text);
                    frames.push(Frame::live(Event::TextMessageContent {
                        message_id: streaming.message_id.clone(),
                        delta: text.clone(),
                    }));
                }
            }
            StreamDelta::Thinking { text } => {
                if !streaming.reasoning.open && !streaming.text.open && streaming.calls.is_empty() {
                    open_reasoning(streaming, &mut frames);
                }
                if streaming.reasoning.open && !text.is_empty() {
                    streaming.reasoning.sent.push_str(text);
                    frames.push(Frame::live(Event::ReasoningMessageContent {
                        message_id: reasoning_id(&streaming.message_id),
                        delta: text.clone(),
                    }));
                }
            }
            StreamDelta::ToolUseStarted { id, name } => {
                close_reasoning(streaming, &mut frames);
                close_text(streaming, &mut frames);
                close_calls(streaming, &mut frames);
                if !streaming.calls.iter().any(|call| call.id == id.0) {
                    streaming.calls.push(StreamedCall {
                        id: id.0.clone(),
                        input: String::new(),
                        open: true,
                    });
                    frames.push(Frame::live(Event::ToolCallStart {
                        tool_call_id: id.0.clone(),
                        tool_call_name: name.clone(),
                        parent_message_id: streaming.message_id.clone(),
                    }));
                }
            }
            StreamDelta::ToolInput { id, partial_json } => {
                let open = streaming
                    .calls
                    .iter_mut()
                    .find(|call| call.id == id.0 && call.open);
                if let Some(call) = open {
                    if !partial_json.is_empty() {
                        call.input.push_str(partial_json);
                        frames.push(Frame::live(Event::ToolCallArgs {
                            tool_call_id: id.0.clone(),
                            delta: partial_json.clone(),
                        }));
                    }
                }
            }
        }
        frames
    }

    fn canonical(&mut self, event: &KeelEvent) -> Vec<Frame> {
        let seq = event.seq;
        if seq <= self.last_seq {
            // Seen already (a follower never repeats one; kept safe).
            return Vec::new();
        }
        self.last_seq = seq;
        let mut frames = match &event.kind {
            EventKind::AssistantMessage { blocks, .. } => self.assistant(seq, blocks),
            EventKind::ToolResult {
                tool_call_id,
                content,
                ..
            } => {
                if self.answered_by_client.contains(&tool_call_id.0) {
                    Vec::new()
                } else {
                    vec![Frame::live(Event::ToolCallResult {
                        message_id: format!("keel-{seq}"),
                        tool_call_id: tool_call_id.0.clone(),
                        content: content.clone(),
                        role: "tool",
                    })]
                }
            }
            EventKind::TurnStarted { .. } => {
                self.awaits_turn = false;
                Vec::new()
            }
            EventKind::Suspended { pending } if !self.awaits_turn => {
                let frames = self.close_all();
                self.ending = Some(Ending::Finished {
                    seq: Some(seq),
                    outcome: outcome_of(pending),
                });
                frames
            }
            EventKind::TurnCompleted { .. } if !self.awaits_turn => self.end(
                seq,
                Outcome::Success {
                    pending_tool_call_ids: Vec::new(),
                },
            ),
            EventKind::TurnInterrupted { reason, .. } if !self.awaits_turn => match reason {
                InterruptReason::Cancelled
                | InterruptReason::Superseded
                | InterruptReason::Rewound => self.end(seq, Outcome::Cancelled),
                other => self.end_failed(
                    seq,
                    "interrupted",
                    &format!("the turn was interrupted: {}", interrupt_words(*other)),
                ),
            },
            EventKind::TurnFailed { error, .. } if !self.awaits_turn => {
                self.end_failed(seq, "turn_failed", error)
            }
            // The run's message will get no turn: a cancel came first.
            EventKind::Unanswered { .. } => self.end(seq, Outcome::Cancelled),
            EventKind::Suspended { .. }
            | EventKind::TurnCompleted { .. }
            | EventKind::TurnInterrupted { .. }
            | EventKind::TurnFailed { .. }
            | EventKind::Created { .. }
            | EventKind::SessionStarted
            | EventKind::SessionEnded
            | EventKind::UserMessage { .. }
            | EventKind::Resolved { .. }
            | EventKind::ConfigChanged { .. }
            | EventKind::Recovered { .. }
            | EventKind::Nudge { .. }
            | EventKind::DebounceCancelled
            | EventKind::Finished { .. }
            | EventKind::Compacted { .. }
            | EventKind::Rewound { .. } => Vec::new(),
        };
        // The event's seq goes on the last frame made of it, unless that
        // frame is the run's end, which [`RunMap::finished`] sends later.
        if self.ending.is_none() {
            if let Some(last) = frames.last_mut() {
                last.id = Some(seq);
            }
        }
        frames
    }

    fn end(&mut self, seq: Seq, outcome: Outcome) -> Vec<Frame> {
        let frames = self.close_all();
        self.ending = Some(Ending::Finished {
            seq: Some(seq),
            outcome,
        });
        frames
    }

    fn end_failed(&mut self, seq: Seq, code: &str, message: &str) -> Vec<Frame> {
        let frames = self.close_all();
        self.ending = Some(Ending::Failed {
            seq: Some(seq),
            code: code.to_owned(),
            message: message.to_owned(),
        });
        frames
    }

    /// The canonical response: settles what streamed, and sends what did
    /// not.
    fn assistant(&mut self, seq: Seq, blocks: &[AssistantBlock]) -> Vec<Frame> {
        let mut frames = Vec::new();
        let text: String = blocks
            .iter()
            .filter_map(|block| match block {
                AssistantBlock::Text { text } => Some(text.as_str()),
                AssistantBlock::Thinking { .. } | AssistantBlock::ToolUse { .. } => None,
            })
            .collect();
        let thinking: String = blocks
            .iter()
            .filter_map(|block| match block {
                AssistantBlock::Thinking { text, .. } => Some(text.as_str()),
                AssistantBlock::Text { .. } | AssistantBlock::ToolUse { .. } => None,
            })
            .collect();
        let mut streaming = self.streaming.take().unwrap_or_else(|| Streaming {
            generation: Generation {
                turn: 0,
                attempt: 0,
            },
            message_id: format!("keel-{seq}"),
            text: Segment::default(),
            reasoning: Segment::default(),
            calls: Vec::new(),
            gapped: false,
        });
        // Reasoning: the rest of what streamed, or all of it.
        if !thinking.is_empty() {
            let streamed = !streaming.reasoning.sent.is_empty() || streaming.reasoning.open;
            if !streamed {
                open_reasoning(&mut streaming, &mut frames);
            }
            if streaming.reasoning.open && !streaming.gapped {
                if let Some(rest) = thinking.strip_prefix(streaming.reasoning.sent.as_str()) {
                    if !rest.is_empty() {
                        frames.push(Frame::live(Event::ReasoningMessageContent {
                            message_id: reasoning_id(&streaming.message_id),
                            delta: rest.to_owned(),
                        }));
                    }
                }
            }
        }
        close_reasoning(&mut streaming, &mut frames);
        if !text.is_empty() {
            let streamed = !streaming.text.sent.is_empty() || streaming.text.open;
            if !streamed {
                open_text(&mut streaming, &mut frames);
            }
            if streaming.text.open && !streaming.gapped {
                if let Some(rest) = text.strip_prefix(streaming.text.sent.as_str()) {
                    if !rest.is_empty() {
                        frames.push(Frame::live(Event::TextMessageContent {
                            message_id: streaming.message_id.clone(),
                            delta: rest.to_owned(),
                        }));
                    }
                }
            }
        }
        close_text(&mut streaming, &mut frames);
        for block in blocks {
            let AssistantBlock::ToolUse { call } = block else {
                continue;
            };
            let input = call.input.to_string();
            match streaming
                .calls
                .iter_mut()
                .find(|streamed| streamed.id == call.id.0)
            {
                Some(streamed) => {
                    if streamed.open {
                        if streamed.input.is_empty() {
                            frames.push(Frame::live(Event::ToolCallArgs {
                                tool_call_id: call.id.0.clone(),
                                delta: input,
                            }));
                        }
                        streamed.open = false;
                        frames.push(Frame::live(Event::ToolCallEnd {
                            tool_call_id: call.id.0.clone(),
                        }));
                    }
                }
                None => {
                    frames.push(Frame::live(Event::ToolCallStart {
                        tool_call_id: call.id.0.clone(),
                        tool_call_name: call.name.clone(),
                        parent_message_id: streaming.message_id.clone(),
                    }));
                    frames.push(Frame::live(Event::ToolCallArgs {
                        tool_call_id: call.id.0.clone(),
                        delta: input,
                    }));
                    frames.push(Frame::live(Event::ToolCallEnd {
                        tool_call_id: call.id.0.clone(),
                    }));
                }
            }
        }
        // A call that streamed but is not in the response (cut by
        // max_tokens, say) is closed all the same.
        close_calls(&mut streaming, &mut frames);
        frames
    }

    /// Close whatever the response streaming now left open.
    fn close_all(&mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        if let Some(streaming) = self.streaming.as_mut() {
            close_reasoning(streaming, &mut frames);
            close_text(streaming, &mut frames);
            close_calls(streaming, &mut frames);
        }
        frames
    }
}

fn reasoning_id(message_id: &str) -> String {
    format!("{message_id}-reasoning")
}

fn open_text(streaming: &mut Streaming, frames: &mut Vec<Frame>) {
    if streaming.text.open {
        return;
    }
    if !streaming.text.sent.is_empty() {
        // Text again after a tool call: AG-UI messages do not reopen, so
        // it goes on in a message of its own.
        streaming.message_id = format!("{}+", streaming.message_id);
        streaming.text.sent.clear();
    }
    streaming.text.open = true;
    frames.push(Frame::live(Event::TextMessageStart {
        message_id: streaming.message_id.clone(),
        role: "assistant",
    }));
}

fn close_text(streaming: &mut Streaming, frames: &mut Vec<Frame>) {
    if streaming.text.open {
        streaming.text.open = false;
        frames.push(Frame::live(Event::TextMessageEnd {
            message_id: streaming.message_id.clone(),
        }));
    }
}

fn open_reasoning(streaming: &mut Streaming, frames: &mut Vec<Frame>) {
    if streaming.reasoning.open || !streaming.reasoning.sent.is_empty() {
        return;
    }
    streaming.reasoning.open = true;
    let message_id = reasoning_id(&streaming.message_id);
    frames.push(Frame::live(Event::ReasoningStart {
        message_id: message_id.clone(),
    }));
    frames.push(Frame::live(Event::ReasoningMessageStart {
        message_id,
        role: "reasoning",
    }));
}

fn close_reasoning(streaming: &mut Streaming, frames: &mut Vec<Frame>) {
    if streaming.reasoning.open {
        streaming.reasoning.open = false;
        let message_id = reasoning_id(&streaming.message_id);
        frames.push(Frame::live(Event::ReasoningMessageEnd {
            message_id: message_id.clone(),
        }));
        frames.push(Frame::live(Event::ReasoningEnd { message_id }));
    }
}

fn close_calls(streaming: &mut Streaming, frames: &mut Vec<Frame>) {
    for call in streaming.calls.iter_mut().filter(|call| call.open) {
        call.open = false;
        frames.push(Frame::live(Event::ToolCallEnd {
            tool_call_id: call.id.clone(),
        }));
    }
}

/// The outcome of a run that rests with `pending` calls: the client's
/// own tools to run (a success naming them), or interrupts for a human.
pub fn outcome_of(pending: &[PendingCall]) -> Outcome {
    let interrupts: Vec<Interrupt> = pending.iter().filter_map(interrupt).collect();
    if !interrupts.is_empty() {
        return Outcome::Interrupt { interrupts };
    }
    Outcome::Success {
        pending_tool_call_ids: pending
            .iter()
            .map(|pending| pending.call.id.0.clone())
            .collect(),
    }
}

/// The interrupt of a call waiting on a human; `None` for a client's
/// tool, which the client runs without being asked.
fn interrupt(pending: &PendingCall) -> Option<Interrupt> {
    let call = &pending.call;
    let metadata = json!({"keel": {"tool": call.name, "input": call.input}});
    match pending.kind {
        PendingKind::Approval => Some(Interrupt {
            id: call.id.0.clone(),
            reason: "tool_approval",
            message: Some(format!("approve running {}?", call.name)),
            tool_call_id: call.id.0.clone(),
            response_schema: json!({
                "type": "object",
                "properties": {"approved": {"type": "boolean"}},
                "required": ["approved"],
            }),
            metadata,
        }),
        PendingKind::Elicitation => Some(Interrupt {
            id: call.id.0.clone(),
            reason: "input_required",
            message: pending.prompt.clone(),
            tool_call_id: call.id.0.clone(),
            response_schema: json!({
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            }),
            metadata,
        }),
        PendingKind::ClientExec => None,
    }
}

fn interrupt_words(reason: InterruptReason) -> &'static str {
    match reason {
        InterruptReason::Cancelled => "cancelled",
        InterruptReason::Superseded => "a newer message took its place",
        InterruptReason::Restart => "keel restarted and does not resume turns (recovery = idle)",
        InterruptReason::ResumeLimit => "keel restarted during it too many times",
        InterruptReason::RequestLimit { .. } => "it reached its cap of LLM requests",
        InterruptReason::Timeout => "its deadline passed",
        InterruptReason::Shutdown => "keel stopped before it finished",
        InterruptReason::Finished => "the agent finished",
        InterruptReason::Rewound => "the conversation was rewound",
    }
}

/// The thread's messages as the log holds them, with keel's ids: what a
/// `MESSAGES_SNAPSHOT` sends at a run's end, so that the client's history
/// is keel's and its next run says what it already has.
pub fn messages<'a>(events: impl IntoIterator<Item = &'a KeelEvent>) -> Vec<Message> {
    // Each message with the seq it came from, so a rewind can drop those
    // after the seq it went back to.
    let mut messages: Vec<(Seq, Message)> = Vec::new();
    for event in events {
        let seq = event.seq;
        match &event.kind {
            EventKind::UserMessage { text, .. } => messages.push((
                seq,
                Message::User {
                    id: format!("keel-{seq}"),
                    content: text.clone(),
                },
            )),
            EventKind::AssistantMessage { blocks, .. } => {
                let thinking: String = blocks
                    .iter()
                    .filter_map(|block| match block {
                        AssistantBlock::Thinking { text, .. } => Some(text.as_str()),
                        AssistantBlock::Text { .. } | AssistantBlock::ToolUse { .. } => None,
                    })
                    .collect();
                if !thinking.is_empty() {
                    messages.push((
                        seq,
                        Message::Reasoning {
                            id: reasoning_id(&format!("keel-{seq}")),
                            content: thinking,
                        },
                    ));
                }
                let text: String = blocks
                    .iter()
                    .filter_map(|block| match block {
                        AssistantBlock::Text { text } => Some(text.as_str()),
                        AssistantBlock::Thinking { .. } | AssistantBlock::ToolUse { .. } => None,
                    })
                    .collect();
                let tool_calls: Vec<ToolCall> = blocks
                    .iter()
                    .filter_map(AssistantBlock::tool_call)
                    .map(|call| ToolCall {
                        id: call.id.0.clone(),
                        kind: "function",
                        function: FunctionCall {
                            name: call.name.clone(),
                            arguments: call.input.to_string(),
                        },
                    })
                    .collect();
                if text.is_empty() && tool_calls.is_empty() {
                    continue;
                }
                messages.push((
                    seq,
                    Message::Assistant {
                        id: format!("keel-{seq}"),
                        content: (!text.is_empty()).then_some(text),
                        tool_calls,
                    },
                ));
            }
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                ..
            } => messages.push((
                seq,
                Message::Tool {
                    id: format!("keel-{seq}"),
                    content: content.clone(),
                    tool_call_id: tool_call_id.0.clone(),
                    error: is_error.then(|| content.clone()),
                },
            )),
            EventKind::Rewound { to_seq, .. } => {
                messages.retain(|(from, _)| from <= to_seq);
            }
            EventKind::Created { .. }
            | EventKind::SessionStarted
            | EventKind::SessionEnded
            | EventKind::TurnStarted { .. }
            | EventKind::Suspended { .. }
            | EventKind::Resolved { .. }
            | EventKind::TurnCompleted { .. }
            | EventKind::TurnInterrupted { .. }
            | EventKind::TurnFailed { .. }
            | EventKind::ConfigChanged { .. }
            | EventKind::Recovered { .. }
            | EventKind::Nudge { .. }
            | EventKind::DebounceCancelled
            | EventKind::Unanswered { .. }
            | EventKind::Finished { .. }
            | EventKind::Compacted { .. } => {}
        }
    }
    messages.into_iter().map(|(_, message)| message).collect()
}

/// The seq a message id keel gave says the client has seen the log up
/// to: `keel-SEQ` or `keel-SEQ-…`; `None` for an id keel did not give.
pub fn seen_through(message_id: &str) -> Option<Seq> {
    let rest = message_id.strip_prefix("keel-")?;
    let digits = rest.split(['-', '+']).next()?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests;
