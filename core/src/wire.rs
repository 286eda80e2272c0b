//! Provider wire formats, as pure code: encode a request from the working
//! set, decode a response stream event by event, classify errors. The HTTP
//! (reqwest) and the SSE framing (sseer) live in keel-actors;
//! this module sees only parsed SSE events, so every byte of the formats is
//! testable without a socket.

pub mod anthropic;
pub mod classify;
mod encoded;
pub mod openai;

pub use encoded::EncodedHistory;

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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

/// The tools offered to a model, with their `tools` array as each wire
/// writes it, encoded the first time a request needs it and kept: the
/// same list goes with every request of every conversation, and writing
/// its descriptions and schemas again each time was most of what a short
/// history's request cost to encode (docs/benchmarks.md, "A turn's own
/// events from memory; tools encoded once; the history shared").
#[derive(Debug, Default)]
pub struct ToolSpecs {
    specs: Vec<ToolSpec>,
    anthropic: OnceLock<Box<RawValue>>,
    openai: OnceLock<Box<RawValue>>,
}

/// Which wire a [`ToolSpecs`] (or an [`EncodedHistory`]) keeps an
/// encoding for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolsWire {
    Anthropic,
    OpenAi,
}

impl ToolSpecs {
    pub fn new(specs: Vec<ToolSpec>) -> ToolSpecs {
        ToolSpecs {
            specs,
            anthropic: OnceLock::new(),
            openai: OnceLock::new(),
        }
    }

    /// The `tools` array for `wire`, from `encode` the first time; `None`
    /// when there are no tools (the field is then left out).
    pub(crate) fn encoded(
        &self,
        wire: ToolsWire,
        encode: impl FnOnce(&[ToolSpec]) -> serde_json::Result<Box<RawValue>>,
    ) -> Result<Option<&RawValue>, EncodeError> {
        if self.specs.is_empty() {
            return Ok(None);
        }
        let slot = match wire {
            ToolsWire::Anthropic => &self.anthropic,
            ToolsWire::OpenAi => &self.openai,
        };
        if let Some(encoded) = slot.get() {
            return Ok(Some(encoded));
        }
        let encoded = encode(&self.specs).map_err(|error| EncodeError::Json {
            reason: error.to_string(),
        })?;
        Ok(Some(slot.get_or_init(|| encoded)))
    }
}

impl Deref for ToolSpecs {
    type Target = [ToolSpec];

    fn deref(&self) -> &[ToolSpec] {
        &self.specs
    }
}

impl From<Vec<ToolSpec>> for ToolSpecs {
    fn from(specs: Vec<ToolSpec>) -> ToolSpecs {
        ToolSpecs::new(specs)
    }
}

/// A copy encodes again when asked: the copy is usually about to change.
impl Clone for ToolSpecs {
    fn clone(&self) -> ToolSpecs {
        ToolSpecs::new(self.specs.clone())
    }
}

impl PartialEq for ToolSpecs {
    fn eq(&self, other: &ToolSpecs) -> bool {
        self.specs == other.specs
    }
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
    pub tools: &'a ToolSpecs,
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

    /// Each wire's array is encoded once, whatever the number of requests;
    /// a copy (about to change) and an empty list keep nothing.
    #[test]
    fn tools_are_encoded_once_per_wire() {
        let specs: ToolSpecs = vec![ToolSpec {
            name: "now".to_owned(),
            description: "The time.".to_owned(),
            input_schema: serde_json::json!({"type": "object"}),
        }]
        .into();
        let mut encodings = 0;
        let mut encode = |wire| {
            specs
                .encoded(wire, |specs| {
                    encodings += 1;
                    serde_json::value::to_raw_value(&specs[0].name)
                })
                .unwrap()
                .map(|raw| raw.get().to_owned())
        };
        assert_eq!(encode(ToolsWire::Anthropic).as_deref(), Some("\"now\""));
        assert_eq!(encode(ToolsWire::Anthropic).as_deref(), Some("\"now\""));
        assert_eq!(encode(ToolsWire::OpenAi).as_deref(), Some("\"now\""));
        assert_eq!(encodings, 2, "once for each wire");

        let copy = specs.clone();
        assert_eq!(copy, specs);
        assert!(copy.anthropic.get().is_none() && copy.openai.get().is_none());
        let empty = ToolSpecs::default();
        let none = empty
            .encoded(ToolsWire::OpenAi, |_| panic!("nothing to encode"))
            .unwrap();
        assert!(none.is_none());
    }

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
