//! The message model the LLM sees: what the reducer builds from the log and the
//! provider encoders (later) turn into each wire format.
//!
//! Images appear here only as references (content hash, type, size); their
//! bytes live in the store's blob area and are attached when a request is
//! rendered, so history stays small.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ToolCallId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

/// One message of the prompt. Consecutive messages of the same role are merged
/// by the reducer, so roles alternate as every provider expects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<ContentBlock>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// Model reasoning, kept so providers that sign it (Anthropic) accept the
    /// history back.
    Thinking {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    Image {
        image: ImageRef,
    },
    ToolUse {
        call: ToolCall,
    },
    ToolResult {
        result: ToolResult,
    },
}

/// An image stored once in the blob store, named by the SHA-256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageRef {
    /// Lowercase hex SHA-256 of the stored (already validated and downscaled) bytes.
    pub hash: String,
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub media_type: String,
    pub width: u32,
    pub height: u32,
    /// Size of the stored bytes, for per-request byte budgets.
    pub size: u64,
}

/// A tool invocation requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: ToolCallId,
    pub name: String,
    pub input: Value,
}

/// The answer to one [`ToolCall`], real or synthetic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    pub tool_call_id: ToolCallId,
    pub content: String,
    pub is_error: bool,
    /// Images that came with the result (an MCP tool's image content),
    /// shown to the model inside the result where the provider allows it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageRef>,
}

/// What an assistant message may contain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AssistantBlock {
    Text {
        text: String,
    },
    Thinking {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    ToolUse {
        call: ToolCall,
    },
}

impl AssistantBlock {
    /// The block as prompt content, copied (the caller keeps the block).
    pub fn to_content(&self) -> ContentBlock {
        match self {
            AssistantBlock::Text { text } => ContentBlock::Text { text: text.clone() },
            AssistantBlock::Thinking { text, signature } => ContentBlock::Thinking {
                text: text.clone(),
                signature: signature.clone(),
            },
            AssistantBlock::ToolUse { call } => ContentBlock::ToolUse { call: call.clone() },
        }
    }

    /// [`to_content`](AssistantBlock::to_content), moving instead of
    /// copying: replay of an owned log uses this so that texts and tool
    /// inputs are not copied.
    pub fn into_content(self) -> ContentBlock {
        match self {
            AssistantBlock::Text { text } => ContentBlock::Text { text },
            AssistantBlock::Thinking { text, signature } => {
                ContentBlock::Thinking { text, signature }
            }
            AssistantBlock::ToolUse { call } => ContentBlock::ToolUse { call },
        }
    }

    pub fn tool_call(&self) -> Option<&ToolCall> {
        match self {
            AssistantBlock::ToolUse { call } => Some(call),
            AssistantBlock::Text { .. } | AssistantBlock::Thinking { .. } => None,
        }
    }
}

/// Why the model stopped. OpenAI's `finish_reason`s map onto these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence,
    Refusal,
    /// Anthropic paused a long-running turn (server tools): the response is
    /// kept and sent back as it is, and the turn goes on with another request.
    PauseTurn,
    /// A reason keel does not know; treated like `end_turn`.
    Other,
}

/// Token counts reported by the provider for one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
}

impl Usage {
    /// Tokens of the context window this response occupied: everything sent
    /// (cached or not) plus what was generated, which the next request re-sends.
    pub fn context_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_creation_input_tokens)
            .saturating_add(self.cache_read_input_tokens)
            .saturating_add(self.output_tokens)
    }
}
