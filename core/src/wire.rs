//! Provider wire formats, as pure code: encode a request from the working
//! set, decode a response stream event by event, classify errors. The HTTP
//! (reqwest) and the SSE framing (sseer) live in keel-actors;
//! this module sees only parsed SSE events, so every byte of the formats is
//! testable without a socket.

pub mod anthropic;
pub mod classify;
pub mod openai;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::input::{AssistantResponse, LlmFailure};
use crate::live::StreamDelta;
use crate::message::Message;

/// A tool as the model is told about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the tool's input object.
    pub input_schema: serde_json::Value,
}

/// An image's bytes, already validated and sized for the provider, base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageData {
    pub media_type: String,
    pub base64: String,
}

/// Everything a request is built from.
#[derive(Debug, Clone, Copy)]
pub struct PromptRequest<'a> {
    pub model: &'a str,
    pub system: Option<&'a str>,
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
    pub max_tokens: u32,
    /// The bytes of every image the messages reference, by content hash.
    pub images: &'a BTreeMap<String, ImageData>,
}

/// Why a request could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// A message references an image whose bytes were not supplied.
    MissingImage { hash: String },
    /// The body could not be written as JSON (a tool input or schema that
    /// JSON cannot hold; not expected of values read as JSON).
    Json { reason: String },
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EncodeError::MissingImage { hash } => {
                write!(f, "image {hash} is referenced but its bytes are missing")
            }
            EncodeError::Json { reason } => write!(f, "the body is not JSON: {reason}"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// One parsed server-sent event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event:` field; empty when the server sent none (OpenAI).
    pub event: &'a str,
    pub data: &'a str,
}

/// Turns a provider's stream into keel's deltas and, at the end, one
/// complete assistant response.
pub trait StreamDecoder: Send {
    /// Feed the next event. Returns the deltas it carried, or the failure it
    /// reported (an error event mid-stream, a malformed payload).
    fn feed(&mut self, event: SseEvent<'_>) -> Result<Vec<StreamDelta>, LlmFailure>;

    /// The provider said the response is complete (Anthropic `message_stop`,
    /// OpenAI `[DONE]`); nothing more is expected.
    fn is_complete(&self) -> bool;

    /// The stream ended. A stream cut before its end is a retryable failure.
    fn finish(self: Box<Self>) -> Result<AssistantResponse, LlmFailure>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_errors_say_what_is_wrong() {
        let missing = EncodeError::MissingImage {
            hash: "ab12".to_owned(),
        };
        assert_eq!(
            missing.to_string(),
            "image ab12 is referenced but its bytes are missing"
        );
        let json = EncodeError::Json {
            reason: "key must be a string".to_owned(),
        };
        assert_eq!(
            json.to_string(),
            "the body is not JSON: key must be a string"
        );
    }
}
