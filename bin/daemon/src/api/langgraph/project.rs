//! keel's log as LangGraph sees a thread: pure functions and one small
//! state machine, no I/O (docs/langgraph.md, "The projection").
//!
//! - [`Projection`] folds a conversation's canonical events, in seq order,
//!   into the thread's values (`{"messages": [...]}` in LangChain's shape)
//!   and its open interrupt, and turns each event and live update into the
//!   SSE frames of the stream modes a client asked for.
//! - [`runs`] reads a run (a keel turn, started by a message or by the
//!   decisions that resume a waiting turn) and its status off the log.
//!
//! Ids are derived from seqs, so the same log always projects the same way,
//! before and after a restart: a message is `keel-{seq}` of the event that
//! made it, an assistant message being streamed already has the id its
//! event will get (`keel-ai-{turn}-{n}`, the n-th answer of the turn that
//! started at seq `turn`), a run is named by the seq that started it.
//!
//! Resuming a stream exactly: every frame's SSE id is `SEQ` (the last
//! canonical event the client got) or `SEQ:BYTES` while an answer streams
//! (also how many bytes of its text the client got). A stream resumed from
//! `SEQ:BYTES` in the middle of an answer sends none of its later tokens
//! one by one (it cannot know which the client missed) but the rest of its
//! text, from byte BYTES, as one chunk when the answer is recorded: the
//! chunks a client joins are the answer's text, once.

use serde_json::{json, Map, Value};

use keel_actors::core::event::{Decision, Event, EventKind, PendingCall, PendingKind};
use keel_actors::core::live::{LiveEvent, StreamDelta};
use keel_actors::core::message::AssistantBlock;
use keel_actors::core::Seq;

/// The node names frames carry: the two nodes of LangChain's agent.
pub const MODEL_NODE: &str = "model";
pub const TOOLS_NODE: &str = "tools";

/// The stream modes keel serves; others a client names are accepted and
/// send nothing (docs/langgraph.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Modes {
    pub values: bool,
    pub updates: bool,
    /// `messages-tuple`: `event: messages`, `[chunk, metadata]`.
    pub messages_tuple: bool,
    /// The older `messages`: `messages/partial` and `messages/complete`.
    pub messages: bool,
}

impl Modes {
    /// The modes named in a request's `stream_mode` (a name or a list of
    /// them); `values` when none is named, as LangGraph does.
    pub fn parse(names: &[String]) -> Modes {
        if names.is_empty() {
            return Modes {
                values: true,
                ..Modes::default()
            };
        }
        let mut modes = Modes::default();
        for name in names {
            match name.as_str() {
                "values" => modes.values = true,
                "updates" => modes.updates = true,
                "messages-tuple" => modes.messages_tuple = true,
                "messages" => modes.messages = true,
                _ => {}
            }
        }
        modes
    }

    /// The names of these modes, as a request gives them.
    pub fn names(self) -> Vec<&'static str> {
        [
            (self.values, "values"),
            (self.updates, "updates"),
            (self.messages_tuple, "messages-tuple"),
            (self.messages, "messages"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// One SSE frame: `event`, its `id` (none for `metadata`), JSON data.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
}

/// The answer being streamed: what the client got of its text.
#[derive(Debug, Clone, Default, PartialEq)]
struct Streaming {
    /// The whole text streamed so far (the newest attempt's).
    text: String,
    /// Bytes of `text` the client got.
    sent: usize,
    /// Tokens are not sent one by one: this stream resumed in the middle
    /// of the answer, so the rest goes out whole when it is recorded.
    quiet: bool,
}

/// A thread as the log makes it, up to `last_seq`.
#[derive(Debug, Clone)]
pub struct Projection {
    thread_id: String,
    messages: Vec<Value>,
    /// The seq of the event each of `messages` came from.
    message_seqs: Vec<Seq>,
    /// Calls that wait on a human or a client, in the order they began to.
    pending: Vec<PendingCall>,
    /// The seq of the `Suspended` event that opened the current interrupt.
    interrupt_seq: Option<Seq>,
    /// The seq of the running turn's `TurnStarted`, and its answers so far.
    turn: Option<(Seq, u32)>,
    streaming: Option<Streaming>,
    last_seq: Seq,
}

impl Projection {
    pub fn new(thread_id: &str) -> Projection {
        Projection {
            thread_id: thread_id.to_owned(),
            messages: Vec::new(),
            message_seqs: Vec::new(),
            pending: Vec::new(),
            interrupt_seq: None,
            turn: None,
            streaming: None,
            last_seq: 0,
        }
    }

    /// The thread as `events` (its log from the start, in order) make it.
    pub fn of(thread_id: &str, events: &[Event]) -> Projection {
        let mut projection = Projection::new(thread_id);
        for event in events {
            projection.absorb(event);
        }
        projection
    }

    pub fn last_seq(&self) -> Seq {
        self.last_seq
    }

    /// Continue a stream whose client got `bytes` of the text of the answer
    /// being streamed after event `last_seq` (the `SEQ:BYTES` of its last
    /// frame id): the rest of that answer's text goes out when it is
    /// recorded, in one chunk.
    pub fn resume_mid_answer(&mut self, bytes: usize) {
        self.streaming = Some(Streaming {
            text: String::new(),
            sent: bytes,
            quiet: true,
        });
    }

    /// The thread's values: its messages, and the open interrupt under
    /// `__interrupt__` (as LangGraph's `values` carry it) when there is one.
    pub fn values(&self) -> Value {
        let mut values = Map::new();
        values.insert("messages".to_owned(), Value::Array(self.messages.clone()));
        let interrupts = self.interrupts();
        if !interrupts.is_empty() {
            values.insert("__interrupt__".to_owned(), Value::Array(interrupts));
        }
        Value::Object(values)
    }

    /// The thread's messages alone.
    pub fn messages(&self) -> &[Value] {
        &self.messages
    }

    /// The calls waiting now.
    pub fn pending(&self) -> &[PendingCall] {
        &self.pending
    }

    /// The open interrupt, as LangGraph lists interrupts: one, whose value
    /// is a human-in-the-loop request (LangChain's `HITLRequest`) with one
    /// action per waiting call. Empty when nothing waits.
    pub fn interrupts(&self) -> Vec<Value> {
        match (self.interrupt_seq, self.pending.is_empty()) {
            (Some(seq), false) => vec![json!({
                "value": hitl_request(&self.pending),
                "id": interrupt_id(seq),
            })],
            _ => Vec::new(),
        }
    }

    /// The id the frames of a stream carry after this event.
    pub fn frame_id(&self) -> String {
        match &self.streaming {
            Some(streaming) if streaming.sent > 0 => {
                format!("{}:{}", self.last_seq, streaming.sent)
            }
            _ => self.last_seq.to_string(),
        }
    }

    /// Fold `event` in without making frames (the history a stream starts
    /// from).
    pub fn absorb(&mut self, event: &Event) {
        self.frames(event, Modes::default(), &mut Vec::new());
    }

    /// Fold `event` in and push the frames it makes in `modes`.
    pub fn frames(&mut self, event: &Event, modes: Modes, out: &mut Vec<Frame>) {
        self.last_seq = event.seq;
        let seq = event.seq;
        match &event.kind {
            EventKind::UserMessage { text, images } => {
                let mut content = vec![json!({"type": "text", "text": text})];
                content.extend(images.iter().map(|image| {
                    json!({"type": "text", "text": format!("[an image, {}x{}]", image.width, image.height)})
                }));
                let content = if images.is_empty() {
                    json!(text)
                } else {
                    Value::Array(content)
                };
                self.push(seq, message("human", content, format!("keel-{seq}")));
                self.values_frame(modes, out);
            }
            EventKind::TurnStarted { .. } => self.turn = Some((seq, 0)),
            EventKind::AssistantMessage { blocks, .. } => {
                let id = self.answer_id();
                if let Some((_, answers)) = &mut self.turn {
                    *answers += 1;
                }
                let text: String = blocks
                    .iter()
                    .filter_map(|block| match block {
                        AssistantBlock::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("");
                let tool_calls: Vec<Value> = blocks
                    .iter()
                    .filter_map(AssistantBlock::tool_call)
                    .map(|call| {
                        json!({"name": call.name, "args": call.input, "id": call.id.as_str(), "type": "tool_call"})
                    })
                    .collect();
                let mut ai = message("ai", json!(text), id.clone());
                ai["tool_calls"] = Value::Array(tool_calls.clone());
                ai["invalid_tool_calls"] = json!([]);
                let streaming = self.streaming.take().unwrap_or_default();
                if modes.messages_tuple {
                    // The rest of the text the client has not got, and the
                    // calls, which are sent whole.
                    let rest = text.get(streaming.sent..).unwrap_or_default();
                    if !rest.is_empty() || !tool_calls.is_empty() {
                        let mut chunk = message("AIMessageChunk", json!(rest), id.clone());
                        chunk["tool_calls"] = Value::Array(tool_calls);
                        chunk["chunk_position"] = json!("last");
                        out.push(self.tuple_frame(chunk, MODEL_NODE));
                    }
                }
                self.push(seq, ai.clone());
                if modes.messages {
                    out.push(Frame {
                        event: "messages/complete".to_owned(),
                        id: Some(self.frame_id()),
                        data: json!([ai.clone()]),
                    });
                }
                self.update_frame(modes, MODEL_NODE, ai, out);
                self.values_frame(modes, out);
            }
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                images,
                ..
            } => {
                self.pending
                    .retain(|pending| pending.call.id != *tool_call_id);
                let name = self.tool_name(tool_call_id.as_str());
                let mut text = content.clone();
                for image in images {
                    text.push_str(&format!("\n[an image, {}x{}]", image.width, image.height));
                }
                let mut tool = message("tool", json!(text), format!("keel-{seq}"));
                tool["tool_call_id"] = json!(tool_call_id.as_str());
                tool["name"] = json!(name);
                tool["status"] = json!(if *is_error { "error" } else { "success" });
                self.push(seq, tool.clone());
                if modes.messages_tuple {
                    out.push(self.tuple_frame(tool.clone(), TOOLS_NODE));
                }
                if modes.messages {
                    out.push(Frame {
                        event: "messages/complete".to_owned(),
                        id: Some(self.frame_id()),
                        data: json!([tool.clone()]),
                    });
                }
                self.update_frame(modes, TOOLS_NODE, tool, out);
                self.values_frame(modes, out);
            }
            EventKind::Suspended { pending } => {
                if self.pending.is_empty() {
                    self.interrupt_seq = Some(seq);
                }
                self.pending.extend(pending.iter().cloned());
                let interrupts = self.interrupts();
                if modes.updates {
                    out.push(Frame {
                        event: "updates".to_owned(),
                        id: Some(self.frame_id()),
                        data: json!({"__interrupt__": interrupts}),
                    });
                }
                self.values_frame(modes, out);
            }
            // The call leaves `pending` with its result (a denial's, an
            // answer's, or the run's after an approval). An edit shows the
            // call as it runs, as keel's own history does.
            EventKind::Resolved {
                tool_call_id,
                decision: Decision::Edit { input },
                ..
            } => {
                let call = self
                    .messages
                    .iter_mut()
                    .rev()
                    .filter_map(|message| message["tool_calls"].as_array_mut())
                    .flatten()
                    .find(|call| call["id"] == tool_call_id.as_str());
                if let Some(call) = call {
                    call["args"] = input.clone();
                }
                self.values_frame(modes, out);
            }
            EventKind::TurnCompleted { .. }
            | EventKind::TurnFailed { .. }
            | EventKind::TurnInterrupted { .. } => {
                self.turn = None;
                self.streaming = None;
            }
            EventKind::Rewound { to_seq, .. } => {
                let keep = self
                    .message_seqs
                    .iter()
                    .take_while(|message_seq| **message_seq <= *to_seq)
                    .count();
                self.messages.truncate(keep);
                self.message_seqs.truncate(keep);
                self.pending.clear();
                self.values_frame(modes, out);
            }
            _ => {}
        }
    }

    /// The frames a live update makes in `modes`: an answer's text as it
    /// streams.
    pub fn live(&mut self, event: &LiveEvent, modes: Modes, out: &mut Vec<Frame>) {
        match event {
            LiveEvent::Delta {
                delta: StreamDelta::Text { text },
                ..
            } => {
                let streaming = self.streaming.get_or_insert_with(Streaming::default);
                streaming.text.push_str(text);
                if streaming.quiet {
                    return;
                }
                streaming.sent += text.len();
                let id = self.answer_id();
                if modes.messages_tuple {
                    let chunk = message("AIMessageChunk", json!(text), id.clone());
                    out.push(self.tuple_frame(chunk, MODEL_NODE));
                }
                if modes.messages {
                    let text = self
                        .streaming
                        .as_ref()
                        .map(|streaming| streaming.text.clone())
                        .unwrap_or_default();
                    out.push(Frame {
                        event: "messages/partial".to_owned(),
                        id: Some(self.frame_id()),
                        data: json!([message("ai", json!(text), id)]),
                    });
                }
            }
            // The attempt failed and is asked again whole.
            LiveEvent::AttemptDiscarded { .. } => {
                if let Some(streaming) = &mut self.streaming {
                    streaming.text.clear();
                }
            }
            _ => {}
        }
    }

    fn push(&mut self, seq: Seq, message: Value) {
        self.messages.push(message);
        self.message_seqs.push(seq);
    }

    /// The id of the answer being streamed or just recorded.
    fn answer_id(&self) -> String {
        match self.turn {
            Some((turn, answers)) => format!("keel-ai-{turn}-{answers}"),
            None => format!("keel-ai-{}", self.last_seq),
        }
    }

    /// The name of the tool call `id` of the thread, from its answer.
    fn tool_name(&self, id: &str) -> String {
        self.messages
            .iter()
            .rev()
            .filter_map(|message| message["tool_calls"].as_array())
            .flatten()
            .find(|call| call["id"] == id)
            .and_then(|call| call["name"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    fn tuple_frame(&self, message: Value, node: &str) -> Frame {
        Frame {
            event: "messages".to_owned(),
            id: Some(self.frame_id()),
            data: json!([message, {
                "thread_id": self.thread_id,
                "langgraph_node": node,
                "langgraph_checkpoint_ns": "",
            }]),
        }
    }

    fn update_frame(&self, modes: Modes, node: &str, message: Value, out: &mut Vec<Frame>) {
        if modes.updates {
            out.push(Frame {
                event: "updates".to_owned(),
                id: Some(self.frame_id()),
                data: json!({ node: {"messages": [message]} }),
            });
        }
    }

    fn values_frame(&self, modes: Modes, out: &mut Vec<Frame>) {
        if modes.values {
            out.push(Frame {
                event: "values".to_owned(),
                id: Some(self.frame_id()),
                data: self.values(),
            });
        }
    }
}

/// A message in LangChain's serialised shape.
fn message(kind: &str, content: Value, id: String) -> Value {
    json!({
        "type": kind,
        "content": content,
        "id": id,
        "additional_kwargs": {},
        "response_metadata": {},
    })
}

/// The id of the interrupt opened at seq `seq`.
pub fn interrupt_id(seq: Seq) -> String {
    format!("keel-interrupt-{seq}")
}

/// LangChain's human-in-the-loop request for `pending`: one action and one
/// review config per call. An approval may be approved, edited or
/// rejected; a question (`ask_user`) answered (`respond`) or declined
/// (`reject`); a client's tool answered with its result or declined.
pub fn hitl_request(pending: &[PendingCall]) -> Value {
    let actions: Vec<Value> = pending
        .iter()
        .map(|pending| {
            let description = match (&pending.kind, &pending.prompt) {
                (PendingKind::Elicitation, Some(question)) => question.clone(),
                (PendingKind::Approval, _) => format!(
                    "Tool execution requires approval\n\nTool: {}\nArgs: {}",
                    pending.call.name, pending.call.input
                ),
                (_, _) => format!("The client runs the tool {}", pending.call.name),
            };
            json!({
                "name": pending.call.name,
                "args": pending.call.input,
                "description": description,
                "id": pending.call.id.as_str(),
            })
        })
        .collect();
    let configs: Vec<Value> = pending
        .iter()
        .map(|pending| {
            let allowed = match pending.kind {
                PendingKind::Approval => json!(["approve", "edit", "reject"]),
                PendingKind::Elicitation | PendingKind::ClientExec => json!(["respond", "reject"]),
            };
            json!({"action_name": pending.call.name, "allowed_decisions": allowed})
        })
        .collect();
    json!({"action_requests": actions, "review_configs": configs})
}

/// How a run ended, or that it has not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Pending,
    Running,
    Success,
    Error,
    Interrupted,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Success => "success",
            RunStatus::Error => "error",
            RunStatus::Interrupted => "interrupted",
        }
    }

    pub fn is_done(self) -> bool {
        !matches!(self, RunStatus::Pending | RunStatus::Running)
    }
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStart {
    /// A user message (its seq names the run).
    Message,
    /// The first decision on a waiting turn.
    Resume,
}

/// One run as the log tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The seq of the event that started it: its name.
    pub seq: Seq,
    pub start: RunStart,
    pub status: RunStatus,
    /// The seq of the event that ended it (or paused it for a human).
    pub end: Option<Seq>,
    /// Milliseconds since the epoch of its first and latest events.
    pub created_at: u64,
    pub updated_at: u64,
}

/// Every run of a thread, oldest first.
pub fn runs(events: &[Event]) -> Vec<Run> {
    RunBook::of(events).runs
}

/// The runs of a thread, read off its events one at a time (a stream keeps
/// one as the events come).
#[derive(Debug, Clone)]
pub struct RunBook {
    runs: Vec<Run>,
    /// Runs not ended yet, by index into `runs`, and whether each runs: a
    /// message's run starts with its turn.
    open: Vec<(usize, bool)>,
    /// The latest interrupt has had its first decision.
    resumed: bool,
}

impl Default for RunBook {
    fn default() -> Self {
        RunBook {
            runs: Vec::new(),
            open: Vec::new(),
            resumed: true,
        }
    }
}

impl RunBook {
    /// The runs `events` (a log from the start, in order) tell.
    pub fn of(events: &[Event]) -> RunBook {
        let mut book = RunBook::default();
        for event in events {
            book.absorb(event);
        }
        book
    }

    /// The status of the run that started at `seq`, if there is one.
    pub fn status(&self, seq: Seq) -> Option<RunStatus> {
        self.runs
            .iter()
            .rev()
            .find(|run| run.seq == seq)
            .map(|run| run.status)
    }

    pub fn absorb(&mut self, event: &Event) {
        let at = event.at.0;
        match &event.kind {
            EventKind::UserMessage { .. } if event.triggers_turn => {
                self.begin(event, RunStart::Message)
            }
            EventKind::Suspended { .. } => {
                self.end_running(event, RunStatus::Success);
                self.resumed = false;
            }
            EventKind::Resolved { .. } if !self.resumed => {
                self.resumed = true;
                self.begin(event, RunStart::Resume);
            }
            EventKind::TurnStarted { .. } => {
                // The oldest message waiting for a turn gets this one (a
                // queued message's run waits behind the turn before).
                if let Some(slot) = self.open.iter_mut().find(|(_, running)| !running) {
                    slot.1 = true;
                    if let Some(run) = self.runs.get_mut(slot.0) {
                        run.status = RunStatus::Running;
                        run.updated_at = at;
                    }
                }
            }
            EventKind::TurnCompleted { .. } => self.end_running(event, RunStatus::Success),
            EventKind::TurnFailed { .. } => self.end_running(event, RunStatus::Error),
            EventKind::TurnInterrupted { .. } => self.end_running(event, RunStatus::Interrupted),
            EventKind::Unanswered { messages, .. } => {
                // Messages that will get no turn: their runs end here.
                let runs = &mut self.runs;
                self.open.retain(|(index, running)| {
                    let Some(run) = runs.get_mut(*index) else {
                        return false;
                    };
                    if !running && messages.contains(&run.seq) {
                        run.status = RunStatus::Interrupted;
                        run.end = Some(event.seq);
                        run.updated_at = at;
                        return false;
                    }
                    true
                });
            }
            _ => {}
        }
    }

    /// A run starts at `event`: a message's waits for its turn, a
    /// resumption runs at once.
    fn begin(&mut self, event: &Event, start: RunStart) {
        let running = start == RunStart::Resume;
        self.runs.push(Run {
            seq: event.seq,
            start,
            status: if running {
                RunStatus::Running
            } else {
                RunStatus::Pending
            },
            end: None,
            created_at: event.at.0,
            updated_at: event.at.0,
        });
        self.open.push((self.runs.len() - 1, running));
    }

    /// The running runs end with `event`, as `status`.
    fn end_running(&mut self, event: &Event, status: RunStatus) {
        let runs = &mut self.runs;
        self.open.retain(|(index, running)| {
            if !running {
                return true;
            }
            if let Some(run) = runs.get_mut(*index) {
                run.status = status;
                run.end = Some(event.seq);
                run.updated_at = event.at.0;
            }
            false
        });
    }
}
