//! AG-UI's shapes as keel reads and writes them (the 1.0 specification,
//! `@ag-ui/core` 1.0.0): the `RunAgentInput` a client posts and the events
//! keel answers with. Field names are camelCase on the wire; every event
//! carries its `type`.
//!
//! Only what keel reads is declared on the input: AG-UI's objects are
//! open (a newer client may add fields), so unknown fields are ignored,
//! unlike keel's own request bodies.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A request to run the agent on a thread (`POST /ag-ui`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    /// The keel conversation id; created on first use.
    pub thread_id: String,
    /// The client's name for this run; echoed in `RUN_STARTED` and
    /// `RUN_FINISHED`.
    pub run_id: String,
    /// The thread's messages as the client holds them: keel takes only
    /// what it does not already have (docs/ag-ui.md, "History").
    pub messages: Vec<InputMessage>,
    /// The frontend's tools: offered to the model, run by the client.
    #[serde(default)]
    pub tools: Vec<InputTool>,
    /// Answers to the interrupts the run before ended with.
    #[serde(default)]
    pub resume: Vec<ResumeEntry>,
}

/// A message of the client's history. Read by role; roles keel never
/// takes from a client (assistant, system, developer, reasoning, activity)
/// keep only their id, which may be one keel gave.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum InputMessage {
    User {
        id: String,
        content: Content,
    },
    #[serde(rename_all = "camelCase")]
    Tool {
        id: String,
        content: Content,
        tool_call_id: String,
        #[serde(default)]
        error: Option<String>,
    },
    Assistant {
        id: String,
    },
    System {
        id: String,
    },
    Developer {
        id: String,
    },
    Reasoning {
        id: String,
    },
    Activity {
        id: String,
    },
}

impl InputMessage {
    pub fn id(&self) -> &str {
        match self {
            InputMessage::User { id, .. }
            | InputMessage::Tool { id, .. }
            | InputMessage::Assistant { id }
            | InputMessage::System { id }
            | InputMessage::Developer { id }
            | InputMessage::Reasoning { id }
            | InputMessage::Activity { id } => id,
        }
    }
}

/// A message's content: a string, or parts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Part {
    Text { text: String },
    Image { source: Source },
    Audio {},
    Video {},
    Document {},
}

/// Where a media part's bytes are.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Source {
    /// Inline, base64.
    #[serde(rename_all = "camelCase")]
    Data {
        value: String,
        mime_type: String,
    },
    Url {},
    File {},
}

/// A tool the frontend offers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct InputTool {
    pub name: String,
    pub description: String,
    /// JSON Schema of the tool's arguments.
    #[serde(default)]
    pub parameters: Option<Value>,
}

/// An answer to one interrupt.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    pub interrupt_id: String,
    pub status: ResumeStatus,
    #[serde(default)]
    pub payload: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

/// An event keel sends. Only the kinds keel produces are declared.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "SCREAMING_SNAKE_CASE",
    rename_all_fields = "camelCase"
)]
pub enum Event {
    RunStarted {
        thread_id: String,
        run_id: String,
    },
    RunFinished {
        thread_id: String,
        run_id: String,
        outcome: Outcome,
    },
    RunError {
        message: String,
        code: String,
    },
    TextMessageStart {
        message_id: String,
        role: &'static str,
    },
    TextMessageContent {
        message_id: String,
        delta: String,
    },
    TextMessageEnd {
        message_id: String,
    },
    ReasoningStart {
        message_id: String,
    },
    ReasoningMessageStart {
        message_id: String,
        role: &'static str,
    },
    ReasoningMessageContent {
        message_id: String,
        delta: String,
    },
    ReasoningMessageEnd {
        message_id: String,
    },
    ReasoningEnd {
        message_id: String,
    },
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
        parent_message_id: String,
    },
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    ToolCallEnd {
        tool_call_id: String,
    },
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        role: &'static str,
    },
    MessagesSnapshot {
        messages: Vec<Message>,
    },
}

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Outcome {
    /// Done; `pending_tool_call_ids` names the frontend tool calls the
    /// client is to run and answer in the next run.
    Success {
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pending_tool_call_ids: Vec<String>,
    },
    /// Waiting for a human: the next run's `resume` answers these.
    Interrupt { interrupts: Vec<Interrupt> },
    /// Stopped before it completed (a cancel), not failed.
    Cancelled,
}

/// Something the run needs from a human before it can go on.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    /// The tool call's id: a resume entry answers it by this id.
    pub id: String,
    /// `tool_approval` or `input_required`.
    pub reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub tool_call_id: String,
    /// What the resume entry's `payload` is to hold.
    pub response_schema: Value,
    /// `{"keel": {"tool", "input"}}`: the call waiting.
    pub metadata: Value,
}

/// A message of a `MESSAGES_SNAPSHOT`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "role",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Message {
    User {
        id: String,
        content: String,
    },
    Assistant {
        id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Reasoning {
        id: String,
        content: String,
    },
    Tool {
        id: String,
        content: String,
        tool_call_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// A call an assistant message made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// The input as JSON text.
    pub arguments: String,
}
