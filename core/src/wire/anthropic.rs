//! The Anthropic Messages API wire format: the body of `POST /v1/messages`
//! with `"stream": true`, and a decoder for the server-sent events it answers
//! with.
//!
//! A stream is `message_start`, then for each content block
//! `content_block_start`, any number of `content_block_delta`s and
//! `content_block_stop`, then `message_delta` (stop reason, cumulative usage)
//! and `message_stop`. `ping`s may come anywhere, an `error` event may end
//! the stream early, and event types, block types and delta types keel does
//! not know are skipped, as Anthropic's versioning policy asks.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::encoded::{self, EncodedHistory};
use super::{classify, EncodeError, ImageData, PromptRequest, SseEvent, StreamDecoder, ToolsWire};
use crate::config::ProviderKind;
use crate::ids::ToolCallId;
use crate::input::{AssistantResponse, LlmFailure};
use crate::live::StreamDelta;
use crate::message::{
    AssistantBlock, ContentBlock, ImageRef, Message, Role, StopReason, ToolCall, ToolResult, Usage,
};

/// The body of `POST /v1/messages` for `request`, streaming.
///
/// Blocks the API would refuse are left out rather than sent: empty text,
/// thinking without a signature (Anthropic accepts only the signed thinking
/// it produced), and a message left with no content at all. In a user
/// message, `tool_result` blocks are moved ahead of the other blocks, as the
/// API requires; their order among themselves is kept.
pub fn encode_request(request: &PromptRequest) -> Result<Value, EncodeError> {
    let bytes = encode_request_bytes(request)?;
    serde_json::from_slice(&bytes).map_err(|error| EncodeError::Json {
        reason: error.to_string(),
    })
}

/// The same body as [`encode_request`], as the JSON bytes that are sent:
/// serialised straight from the request's messages, with no JSON tree in
/// between (a request carries the whole history, every turn).
pub fn encode_request_bytes(request: &PromptRequest) -> Result<Vec<u8>, EncodeError> {
    encode_request_reusing(request, 0, &mut EncodedHistory::default())
}

/// [`encode_request_bytes`], reusing the JSON of the messages an earlier
/// request from the same history sent (`history` and `edits` as
/// [`EncodedHistory`] says): the same bytes, with only the messages added
/// since encoded.
pub fn encode_request_reusing(
    request: &PromptRequest,
    edits: u64,
    history: &mut EncodedHistory,
) -> Result<Vec<u8>, EncodeError> {
    let elements = history.update(
        ToolsWire::Anthropic,
        edits,
        request.messages,
        |message, out| match encode_message(message, request.images)? {
            Some(message) => encoded::element(&message, out),
            None => Ok(()),
        },
    )?;
    encoded::body(&Head::of(request), b"", elements, &Tail::of(request)?)
}

/// The fields of the body before `messages`, and after it (`Tail`): the
/// body is written around the messages' JSON ([`encode_request_reusing`]).
#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
}

#[derive(Serialize)]
struct Tail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    stream: bool,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<WireBlock<'a>>,
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock<'a> {
    Text {
        text: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Image {
        source: ImageSource<'a>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: ResultContent<'a>,
        is_error: bool,
    },
}

/// A `tool_result`'s content: its text alone, or, when the tool returned
/// images, text and image blocks (the Messages API takes both forms).
#[derive(Serialize)]
#[serde(untagged)]
enum ResultContent<'a> {
    Text(&'a str),
    Blocks(Vec<WireBlock<'a>>),
}

#[derive(Serialize)]
struct ImageSource<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    data: &'a str,
}

impl<'a> Head<'a> {
    fn of(request: &PromptRequest<'a>) -> Head<'a> {
        Head {
            model: request.model,
            max_tokens: request.max_tokens,
            system: request.system.filter(|system| !system.is_empty()),
        }
    }
}

impl<'a> Tail<'a> {
    /// The `tools` array, encoded once per [`ToolSpecs`](super::ToolSpecs).
    fn of(request: &PromptRequest<'a>) -> Result<Tail<'a>, EncodeError> {
        let tools = request.tools.encoded(ToolsWire::Anthropic, |specs| {
            let tools: Vec<WireTool> = specs
                .iter()
                .map(|tool| WireTool {
                    name: &tool.name,
                    description: &tool.description,
                    input_schema: &tool.input_schema,
                })
                .collect();
            serde_json::value::to_raw_value(&tools)
        })?;
        Ok(Tail {
            tools,
            stream: true,
        })
    }
}

fn encode_message<'a>(
    message: &'a Message,
    images: &'a BTreeMap<String, ImageData>,
) -> Result<Option<WireMessage<'a>>, EncodeError> {
    let mut content = Vec::with_capacity(message.content.len());
    for block in &message.content {
        if let Some(encoded) = encode_block(block, images)? {
            content.push(encoded);
        }
    }
    if content.is_empty() {
        return Ok(None);
    }
    let role = match message.role {
        Role::User => {
            // Tool results first, each group in its own order.
            let (mut results, rest): (Vec<WireBlock>, Vec<WireBlock>) = content
                .into_iter()
                .partition(|block| matches!(block, WireBlock::ToolResult { .. }));
            results.extend(rest);
            content = results;
            "user"
        }
        Role::Assistant => "assistant",
    };
    Ok(Some(WireMessage { role, content }))
}

fn encode_block<'a>(
    block: &'a ContentBlock,
    images: &'a BTreeMap<String, ImageData>,
) -> Result<Option<WireBlock<'a>>, EncodeError> {
    let encoded = match block {
        ContentBlock::Text { text } if text.trim().is_empty() => return Ok(None),
        ContentBlock::Text { text } => WireBlock::Text { text },
        ContentBlock::Thinking { text, signature } => match signature {
            Some(signature) if !signature.is_empty() => WireBlock::Thinking {
                thinking: text,
                signature,
            },
            _ => return Ok(None),
        },
        ContentBlock::Image { image } => encode_image(image, images)?,
        ContentBlock::ToolUse { call } => WireBlock::ToolUse {
            id: call.id.as_str(),
            name: &call.name,
            input: &call.input,
        },
        ContentBlock::ToolResult { result } => WireBlock::ToolResult {
            tool_use_id: result.tool_call_id.as_str(),
            content: encode_result_content(result, images)?,
            is_error: result.is_error,
        },
    };
    Ok(Some(encoded))
}

fn encode_result_content<'a>(
    result: &'a ToolResult,
    images: &'a BTreeMap<String, ImageData>,
) -> Result<ResultContent<'a>, EncodeError> {
    if result.images.is_empty() {
        return Ok(ResultContent::Text(&result.content));
    }
    let mut blocks = Vec::with_capacity(result.images.len() + 1);
    // An empty text block is refused by the API; a result of images alone
    // is just its images.
    if !result.content.trim().is_empty() {
        blocks.push(WireBlock::Text {
            text: &result.content,
        });
    }
    for image in &result.images {
        blocks.push(encode_image(image, images)?);
    }
    Ok(ResultContent::Blocks(blocks))
}

fn encode_image<'a>(
    image: &ImageRef,
    images: &'a BTreeMap<String, ImageData>,
) -> Result<WireBlock<'a>, EncodeError> {
    let data = images
        .get(&image.hash)
        .ok_or_else(|| EncodeError::MissingImage {
            hash: image.hash.clone(),
        })?;
    Ok(WireBlock::Image {
        source: ImageSource {
            kind: "base64",
            media_type: &data.media_type,
            data: &data.base64,
        },
    })
}

/// Decodes one streamed Messages API response.
#[derive(Debug)]
pub struct Decoder {
    /// From `message_start`; the requested model until then.
    model: String,
    /// Content blocks by their `index`, which is their place in the message.
    blocks: BTreeMap<u64, Slot>,
    usage: Usage,
    stop_reason: Option<StopReason>,
    /// `message_stop` arrived.
    complete: bool,
    /// The stream failed; every later call reports the same failure.
    failure: Option<LlmFailure>,
}

#[derive(Debug)]
struct Slot {
    block: Block,
    /// `content_block_stop` arrived for it.
    closed: bool,
}

#[derive(Debug)]
enum Block {
    Text {
        text: String,
    },
    Thinking {
        text: String,
        signature: String,
    },
    ToolUse {
        id: ToolCallId,
        name: String,
        /// The concatenated `partial_json` fragments.
        json: String,
        /// The `input` of `content_block_start`, normally `{}`.
        initial: Value,
        /// Parsed at `content_block_stop`.
        input: Option<Value>,
    },
    /// A block keel does not use (`redacted_thinking`, `server_tool_use`,
    /// server tool results, future types); its deltas are skipped too.
    Skipped,
}

impl Decoder {
    /// A decoder for a response requested from `model`, the name reported
    /// if the stream does not say which model answered.
    pub fn new(model: &str) -> Decoder {
        Decoder {
            model: model.to_owned(),
            blocks: BTreeMap::new(),
            usage: Usage::default(),
            stop_reason: None,
            complete: false,
            failure: None,
        }
    }

    fn decode(&mut self, event: SseEvent<'_>) -> Result<Vec<StreamDelta>, LlmFailure> {
        if self.complete {
            return Ok(Vec::new());
        }
        let name = event.event.trim();
        if name == "ping" || !(name.is_empty() || KNOWN_EVENTS.contains(&name)) {
            return Ok(Vec::new());
        }
        // Most events are text or tool-input deltas: read those without
        // building a `Value` (a map and a string per key). Any other shape
        // is read as a `Value`, with the same outcome.
        if name.is_empty() || name == "content_block_delta" {
            if let Ok(plain) = serde_json::from_str::<PlainBlockDelta<'_>>(event.data) {
                if plain.kind.as_deref().unwrap_or(name) == "content_block_delta" {
                    let delta = plain.delta;
                    let kind = delta.kind.as_deref().unwrap_or("");
                    return self.apply_block_delta(plain.index, kind, |key| match key {
                        "text" => delta.text.as_deref(),
                        "thinking" => delta.thinking.as_deref(),
                        "signature" => delta.signature.as_deref(),
                        "partial_json" => delta.partial_json.as_deref(),
                        _ => None,
                    });
                }
            }
        }
        let data: Value = serde_json::from_str(event.data)
            .map_err(|err| malformed(format_args!("{name}: {err}")))?;
        let kind = data.get("type").and_then(Value::as_str).unwrap_or(name);
        match kind {
            "message_start" => self.message_start(&data),
            "content_block_start" => self.block_start(&data),
            "content_block_delta" => self.block_delta(&data),
            "content_block_stop" => self.block_stop(&data),
            "message_delta" => {
                self.message_delta(&data);
                Ok(Vec::new())
            }
            "message_stop" => {
                self.complete = true;
                Ok(Vec::new())
            }
            "error" => Err(classify::classify_stream_error(
                data.get("error").unwrap_or(&Value::Null),
            )),
            _ => Ok(Vec::new()),
        }
    }

    fn message_start(&mut self, data: &Value) -> Result<Vec<StreamDelta>, LlmFailure> {
        let message = data
            .get("message")
            .ok_or_else(|| malformed("message_start without a message"))?;
        if let Some(model) = message
            .get("model")
            .and_then(Value::as_str)
            .filter(|model| !model.is_empty())
        {
            model.clone_into(&mut self.model);
        }
        if let Some(usage) = message.get("usage") {
            self.apply_usage(usage);
        }
        Ok(Vec::new())
    }

    fn block_start(&mut self, data: &Value) -> Result<Vec<StreamDelta>, LlmFailure> {
        let index = block_index(data, "content_block_start")?;
        let start = data
            .get("content_block")
            .ok_or_else(|| malformed("content_block_start without a content_block"))?;
        let mut deltas = Vec::new();
        let block = match start.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => {
                let text = optional_str(start, "text").to_owned();
                if !text.is_empty() {
                    deltas.push(StreamDelta::Text { text: text.clone() });
                }
                Block::Text { text }
            }
            "thinking" => {
                let text = optional_str(start, "thinking").to_owned();
                if !text.is_empty() {
                    deltas.push(StreamDelta::Thinking { text: text.clone() });
                }
                let signature = optional_str(start, "signature").to_owned();
                Block::Thinking { text, signature }
            }
            "tool_use" => {
                let id = required_str(start, "id", "tool_use block")?;
                let name = required_str(start, "name", "tool_use block")?;
                let id = ToolCallId::new(id);
                deltas.push(StreamDelta::ToolUseStarted {
                    id: id.clone(),
                    name: name.to_owned(),
                });
                Block::ToolUse {
                    id,
                    name: name.to_owned(),
                    json: String::new(),
                    initial: start.get("input").cloned().unwrap_or(Value::Null),
                    input: None,
                }
            }
            _ => Block::Skipped,
        };
        let slot = Slot {
            block,
            closed: false,
        };
        if self.blocks.insert(index, slot).is_some() {
            return Err(malformed(format_args!(
                "content block {index} started twice"
            )));
        }
        Ok(deltas)
    }

    fn block_delta(&mut self, data: &Value) -> Result<Vec<StreamDelta>, LlmFailure> {
        let index = block_index(data, "content_block_delta")?;
        let delta = data
            .get("delta")
            .ok_or_else(|| malformed("content_block_delta without a delta"))?;
        let kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
        self.apply_block_delta(index, kind, |key| delta.get(key).and_then(Value::as_str))
    }

    /// A `content_block_delta` of type `kind` for block `index`, whose
    /// string fields `field` gives (`None`: missing, or not a string).
    fn apply_block_delta<'a>(
        &mut self,
        index: u64,
        kind: &str,
        field: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Vec<StreamDelta>, LlmFailure> {
        let required =
            |key: &str| field(key).ok_or_else(|| malformed(format_args!("{kind} without {key}")));
        let slot = self.blocks.get_mut(&index).ok_or_else(|| {
            malformed(format_args!(
                "{kind} for content block {index}, which was never started"
            ))
        })?;
        if slot.closed {
            return Err(malformed(format_args!(
                "{kind} for content block {index} after its content_block_stop"
            )));
        }
        let delta = match (kind, &mut slot.block) {
            (_, Block::Skipped) => None,
            ("text_delta", Block::Text { text }) => {
                let piece = required("text")?;
                text.push_str(piece);
                Some(StreamDelta::Text {
                    text: piece.to_owned(),
                })
            }
            ("thinking_delta", Block::Thinking { text, .. }) => {
                let piece = required("thinking")?;
                text.push_str(piece);
                Some(StreamDelta::Thinking {
                    text: piece.to_owned(),
                })
            }
            ("signature_delta", Block::Thinking { signature, .. }) => {
                signature.push_str(required("signature")?);
                None
            }
            ("input_json_delta", Block::ToolUse { id, json, .. }) => {
                let piece = required("partial_json")?;
                json.push_str(piece);
                Some(StreamDelta::ToolInput {
                    id: id.clone(),
                    partial_json: piece.to_owned(),
                })
            }
            ("text_delta" | "thinking_delta" | "signature_delta" | "input_json_delta", _) => {
                return Err(malformed(format_args!(
                    "{kind} for content block {index}, which is of another type"
                )));
            }
            // `citations_delta` and types added later.
            _ => None,
        };
        Ok(delta
            .into_iter()
            .filter(|delta| !delta_is_empty(delta))
            .collect())
    }

    fn block_stop(&mut self, data: &Value) -> Result<Vec<StreamDelta>, LlmFailure> {
        let index = block_index(data, "content_block_stop")?;
        let slot = self.blocks.get_mut(&index).ok_or_else(|| {
            malformed(format_args!(
                "content_block_stop for content block {index}, which was never started"
            ))
        })?;
        slot.closed = true;
        if let Block::ToolUse {
            id,
            name,
            json,
            initial,
            input: input @ None,
        } = &mut slot.block
        {
            // Input that does not parse is judged at the end, once the stop
            // reason is known: cut off by max_tokens it is expected.
            *input = parse_input(id, name, json, initial).ok();
        }
        Ok(Vec::new())
    }

    fn message_delta(&mut self, data: &Value) {
        if let Some(reason) = data
            .get("delta")
            .and_then(|delta| delta.get("stop_reason"))
            .and_then(Value::as_str)
        {
            self.stop_reason = Some(stop_reason(reason));
        }
        if let Some(usage) = data.get("usage") {
            self.apply_usage(usage);
        }
    }

    /// Counts are cumulative: a later report replaces an earlier one.
    fn apply_usage(&mut self, usage: &Value) {
        let count = |key: &str| usage.get(key).and_then(Value::as_u64);
        if let Some(tokens) = count("input_tokens") {
            self.usage.input_tokens = tokens;
        }
        if let Some(tokens) = count("output_tokens") {
            self.usage.output_tokens = tokens;
        }
        if let Some(tokens) = count("cache_creation_input_tokens") {
            self.usage.cache_creation_input_tokens = tokens;
        }
        if let Some(tokens) = count("cache_read_input_tokens") {
            self.usage.cache_read_input_tokens = tokens;
        }
    }

    fn into_response(self) -> Result<AssistantResponse, LlmFailure> {
        let cut_off = self.stop_reason == Some(StopReason::MaxTokens);
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for slot in self.blocks.into_values() {
            match slot.block {
                Block::Text { text } => {
                    if !text.is_empty() {
                        blocks.push(AssistantBlock::Text { text });
                    }
                }
                Block::Thinking { text, signature } => {
                    if !text.is_empty() || !signature.is_empty() {
                        blocks.push(AssistantBlock::Thinking {
                            text,
                            signature: Some(signature).filter(|s| !s.is_empty()),
                        });
                    }
                }
                Block::ToolUse {
                    id,
                    name,
                    json,
                    initial,
                    input,
                } => {
                    let input = match input {
                        Some(input) => input,
                        // A call cut off mid-input by max_tokens is kept
                        // with an empty input: keel-core never runs a call
                        // of a cut-off response, and the provider expects
                        // every tool_use it sent back in the history.
                        None if cut_off => parse_input(&id, &name, &json, &initial)
                            .unwrap_or_else(|_| Value::Object(Map::new())),
                        None => parse_input(&id, &name, &json, &initial)?,
                    };
                    blocks.push(AssistantBlock::ToolUse {
                        call: ToolCall { id, name, input },
                    });
                }
                Block::Skipped => {}
            }
        }
        let has_calls = blocks.iter().any(|block| block.tool_call().is_some());
        let stop_reason = match self.stop_reason {
            Some(reason) => reason,
            None if has_calls => StopReason::ToolUse,
            None => StopReason::EndTurn,
        };
        Ok(AssistantResponse {
            blocks,
            stop_reason,
            usage: self.usage,
            provider: ProviderKind::Anthropic,
            model: self.model,
        })
    }
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, event: SseEvent<'_>) -> Result<Vec<StreamDelta>, LlmFailure> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        self.decode(event).inspect_err(|failure| {
            self.failure = Some(failure.clone());
        })
    }

    fn is_complete(&self) -> bool {
        self.complete
    }

    fn finish(mut self: Box<Self>) -> Result<AssistantResponse, LlmFailure> {
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        if !self.complete {
            return Err(retryable("stream ended before message_stop".to_owned()));
        }
        self.into_response()
    }
}

/// A `content_block_delta` whose every field keel reads has the type it
/// expects, read straight from the text; strings borrow from it unless
/// escaped. A field of another type fails this reading, and the event is
/// read as a `Value` instead.
#[derive(serde::Deserialize)]
struct PlainBlockDelta<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    index: u64,
    #[serde(borrow)]
    delta: PlainDeltaBody<'a>,
}

#[derive(serde::Deserialize)]
struct PlainDeltaBody<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    signature: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    partial_json: Option<Cow<'a, str>>,
}

/// Event types of the Messages stream. Named events outside this list are
/// skipped without reading their data.
const KNOWN_EVENTS: [&str; 7] = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
];

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "end_turn" => StopReason::EndTurn,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "refusal" => StopReason::Refusal,
        "pause_turn" => StopReason::PauseTurn,
        _ => StopReason::Other,
    }
}

/// A tool's input from its fragments: nothing streamed means the input of
/// `content_block_start` (`{}` unless it is an object).
fn parse_input(
    id: &ToolCallId,
    name: &str,
    json: &str,
    initial: &Value,
) -> Result<Value, LlmFailure> {
    if json.trim().is_empty() {
        return Ok(match initial {
            Value::Object(_) => initial.clone(),
            _ => Value::Object(Map::new()),
        });
    }
    serde_json::from_str(json).map_err(|err| {
        retryable(format!(
            "the input of tool call {name} ({id}) is not valid JSON: {err}"
        ))
    })
}

fn block_index(data: &Value, event: &str) -> Result<u64, LlmFailure> {
    data.get("index")
        .and_then(Value::as_u64)
        .ok_or_else(|| malformed(format_args!("{event} without an index")))
}

fn required_str<'a>(value: &'a Value, key: &str, what: &str) -> Result<&'a str, LlmFailure> {
    value
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(format_args!("{what} without {key}")))
}

fn optional_str<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn delta_is_empty(delta: &StreamDelta) -> bool {
    match delta {
        StreamDelta::Text { text } | StreamDelta::Thinking { text } => text.is_empty(),
        StreamDelta::ToolInput { partial_json, .. } => partial_json.is_empty(),
        StreamDelta::ToolUseStarted { .. } => false,
    }
}

fn malformed(detail: impl fmt::Display) -> LlmFailure {
    retryable(format!("malformed stream event: {detail}"))
}

fn retryable(message: String) -> LlmFailure {
    LlmFailure {
        retryable: true,
        retry_after_ms: None,
        message,
        prompt_too_long: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ImageRef, ToolResult};
    use crate::wire::{ToolSpec, ToolSpecs};
    use serde_json::json;

    fn feed_all(decoder: &mut Decoder, events: &[(&str, &str)]) -> Vec<StreamDelta> {
        let mut deltas = Vec::new();
        for (event, data) in events {
            deltas.extend(decoder.feed(SseEvent { event, data }).unwrap());
        }
        deltas
    }

    const START: (&str, &str) = (
        "message_start",
        r#"{"type":"message_start","message":{"model":"claude-test","usage":{"input_tokens":10,"output_tokens":1}}}"#,
    );
    const STOP: (&str, &str) = ("message_stop", r#"{"type":"message_stop"}"#);

    fn tool_start(index: u32, id: &str, name: &str) -> String {
        format!(
            r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"tool_use","id":"{id}","name":"{name}","input":{{}}}}}}"#
        )
    }

    fn json_delta(index: u32, partial: &str) -> String {
        let delta = json!({
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": partial},
        });
        delta.to_string()
    }

    fn block_stop(index: u32) -> String {
        format!(r#"{{"type":"content_block_stop","index":{index}}}"#)
    }

    fn finish(decoder: Decoder) -> Result<AssistantResponse, LlmFailure> {
        Box::new(decoder).finish()
    }

    #[test]
    fn every_stop_reason_is_mapped() {
        for (wire, reason) in [
            ("end_turn", StopReason::EndTurn),
            ("tool_use", StopReason::ToolUse),
            ("max_tokens", StopReason::MaxTokens),
            ("stop_sequence", StopReason::StopSequence),
            ("refusal", StopReason::Refusal),
            ("pause_turn", StopReason::PauseTurn),
            ("something_new", StopReason::Other),
        ] {
            let mut decoder = Decoder::new("m");
            let delta = format!(
                r#"{{"type":"message_delta","delta":{{"stop_reason":"{wire}"}},"usage":{{"output_tokens":3}}}}"#
            );
            feed_all(&mut decoder, &[START, ("message_delta", &delta), STOP]);
            assert_eq!(finish(decoder).unwrap().stop_reason, reason, "{wire}");
        }
    }

    #[test]
    fn an_empty_tool_input_is_an_empty_object() {
        let mut decoder = Decoder::new("m");
        let start = tool_start(0, "toolu_1", "list");
        let deltas = feed_all(
            &mut decoder,
            &[
                START,
                ("content_block_start", &start),
                ("content_block_delta", &json_delta(0, "")),
                ("content_block_stop", &block_stop(0)),
                STOP,
            ],
        );
        assert_eq!(
            deltas,
            vec![StreamDelta::ToolUseStarted {
                id: ToolCallId::new("toolu_1"),
                name: "list".to_owned(),
            }]
        );
        let response = finish(decoder).unwrap();
        assert_eq!(response.blocks[0].tool_call().unwrap().input, json!({}));
        // No message_delta: the blocks decide.
        assert_eq!(response.stop_reason, StopReason::ToolUse);
    }

    #[test]
    fn a_tool_input_given_whole_at_its_start_is_kept() {
        let mut decoder = Decoder::new("m");
        let start = r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_2","name":"read_file","input":{"path":"a.txt"}}}"#;
        feed_all(
            &mut decoder,
            &[
                START,
                ("content_block_start", start),
                ("content_block_stop", &block_stop(0)),
                STOP,
            ],
        );
        let response = finish(decoder).unwrap();
        assert_eq!(
            response.blocks[0].tool_call().unwrap().input,
            json!({"path": "a.txt"})
        );
    }

    #[test]
    fn thinking_is_kept_when_it_has_text_or_a_signature_and_dropped_when_empty() {
        let mut decoder = Decoder::new("m");
        let thinking = |index: u32, text: &str, signature: &str| {
            json!({
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "thinking", "thinking": text, "signature": signature},
            })
            .to_string()
        };
        let (plan, signed, empty) = (
            thinking(0, "plan", ""),
            thinking(1, "", "sig"),
            thinking(2, "", ""),
        );
        feed_all(
            &mut decoder,
            &[
                START,
                ("content_block_start", &plan),
                ("content_block_start", &signed),
                ("content_block_start", &empty),
                STOP,
            ],
        );
        assert_eq!(
            finish(decoder).unwrap().blocks,
            [
                AssistantBlock::Thinking {
                    text: "plan".to_owned(),
                    signature: None,
                },
                AssistantBlock::Thinking {
                    text: String::new(),
                    signature: Some("sig".to_owned()),
                },
            ]
        );
    }

    #[test]
    fn unparsable_tool_input_is_a_retryable_failure_naming_the_tool() {
        let mut decoder = Decoder::new("m");
        let start = tool_start(0, "toolu_9", "write_file");
        feed_all(
            &mut decoder,
            &[
                START,
                ("content_block_start", &start),
                ("content_block_delta", &json_delta(0, "{\"path\": \"a")),
                ("content_block_stop", &block_stop(0)),
                (
                    "message_delta",
                    r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":3}}"#,
                ),
                STOP,
            ],
        );
        let failure = finish(decoder).unwrap_err();
        assert!(failure.retryable);
        assert!(
            failure.message.contains("write_file"),
            "{}",
            failure.message
        );
        assert!(failure.message.contains("toolu_9"), "{}", failure.message);
    }

    #[test]
    fn a_tool_input_cut_off_at_max_tokens_is_kept_empty_not_failed() {
        let mut decoder = Decoder::new("m");
        let start = tool_start(0, "toolu_9", "write_file");
        feed_all(
            &mut decoder,
            &[
                START,
                ("content_block_start", &start),
                ("content_block_delta", &json_delta(0, "{\"path\": \"a")),
                ("content_block_stop", &block_stop(0)),
                (
                    "message_delta",
                    r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":3}}"#,
                ),
                STOP,
            ],
        );
        let response = finish(decoder).unwrap();
        assert_eq!(response.stop_reason, StopReason::MaxTokens);
        let call = response.blocks[0].tool_call().unwrap();
        assert_eq!(call.id.as_str(), "toolu_9");
        assert_eq!(call.input, json!({}));
    }

    #[test]
    fn a_tool_block_never_stopped_is_parsed_at_the_end() {
        let mut decoder = Decoder::new("m");
        let start = tool_start(0, "toolu_1", "read");
        feed_all(
            &mut decoder,
            &[
                START,
                ("content_block_start", &start),
                ("content_block_delta", &json_delta(0, "{\"a\":")),
                ("content_block_delta", &json_delta(0, "1}")),
                STOP,
            ],
        );
        let response = finish(decoder).unwrap();
        assert_eq!(
            response.blocks[0].tool_call().unwrap().input,
            json!({"a": 1})
        );
    }

    #[test]
    fn malformed_data_is_a_retryable_failure() {
        let mut decoder = Decoder::new("m");
        let failure = decoder
            .feed(SseEvent {
                event: "content_block_delta",
                data: "{\"type\":\"content_block_delta\",",
            })
            .unwrap_err();
        assert!(failure.retryable);
        assert!(
            failure.message.starts_with("malformed stream event"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn structural_violations_are_malformed_events() {
        let cases: [&[(&str, &str)]; 4] = [
            // A delta for a block that never started.
            &[(
                "content_block_delta",
                r#"{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}"#,
            )],
            // A text delta without text.
            &[
                (
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta"}}"#,
                ),
            ],
            // Tool input for a text block.
            &[
                (
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
                ),
            ],
            // A delta after the block stopped.
            &[
                (
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                ),
                (
                    "content_block_stop",
                    r#"{"type":"content_block_stop","index":0}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"late"}}"#,
                ),
            ],
        ];
        for events in cases {
            let mut decoder = Decoder::new("m");
            let mut result = Ok(Vec::new());
            for (event, data) in events {
                result = decoder.feed(SseEvent { event, data });
                if result.is_err() {
                    break;
                }
            }
            let failure = result.unwrap_err();
            assert!(failure.retryable);
            assert!(
                failure.message.starts_with("malformed stream event"),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn an_error_event_is_classified() {
        let mut decoder = Decoder::new("m");
        let failure = decoder
            .feed(SseEvent {
                event: "error",
                data: r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long"}}"#,
            })
            .unwrap_err();
        assert!(!failure.retryable);
        assert_eq!(failure.message, "invalid_request_error: prompt is too long");
    }

    #[test]
    fn unknown_events_and_events_after_message_stop_are_ignored() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[
                ("ping", ""),
                ("future_event", "not even json"),
                START,
                ("", r#"{"type":"another_future_event"}"#),
                STOP,
            ],
        );
        assert!(deltas.is_empty());
        assert!(decoder.is_complete());
        assert!(decoder
            .feed(SseEvent {
                event: "error",
                data: r#"{"type":"error","error":{"type":"api_error","message":"late"}}"#,
            })
            .unwrap()
            .is_empty());
        let response = finish(decoder).unwrap();
        assert!(response.blocks.is_empty());
        assert_eq!(response.stop_reason, StopReason::EndTurn);
        assert_eq!(response.model, "claude-test");
        assert_eq!(response.usage.input_tokens, 10);
    }

    #[test]
    fn the_requested_model_is_kept_when_the_stream_names_none() {
        let mut decoder = Decoder::new("claude-requested");
        feed_all(
            &mut decoder,
            &[
                ("message_start", r#"{"type":"message_start","message":{}}"#),
                STOP,
            ],
        );
        let response = finish(decoder).unwrap();
        assert_eq!(response.model, "claude-requested");
        assert_eq!(response.provider, ProviderKind::Anthropic);
        assert_eq!(response.usage, Usage::default());
    }

    #[test]
    fn finish_before_message_stop_is_a_retryable_failure() {
        let mut decoder = Decoder::new("m");
        feed_all(&mut decoder, &[START]);
        assert!(!decoder.is_complete());
        let failure = finish(decoder).unwrap_err();
        assert!(failure.retryable);
        assert_eq!(failure.message, "stream ended before message_stop");
    }

    #[test]
    fn blocks_come_out_in_index_order() {
        let mut decoder = Decoder::new("m");
        let tool = tool_start(1, "toolu_1", "t");
        feed_all(
            &mut decoder,
            &[
                START,
                ("content_block_start", &tool),
                (
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"first"}}"#,
                ),
                ("content_block_stop", &block_stop(1)),
                ("content_block_stop", &block_stop(0)),
                STOP,
            ],
        );
        let response = finish(decoder).unwrap();
        assert_eq!(
            response.blocks[0],
            AssistantBlock::Text {
                text: "first".to_owned()
            }
        );
        assert!(response.blocks[1].tool_call().is_some());
    }

    #[test]
    fn unsigned_thinking_empty_text_and_empty_messages_are_not_sent() {
        let images = BTreeMap::new();
        let messages = [
            Message {
                role: Role::User,
                content: vec![ContentBlock::Text {
                    text: "hi".to_owned(),
                }],
            },
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentBlock::Thinking {
                        text: "unsigned".to_owned(),
                        signature: None,
                    },
                    ContentBlock::Text {
                        text: String::new(),
                    },
                ],
            },
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentBlock::Thinking {
                        text: "signed".to_owned(),
                        signature: Some("sig".to_owned()),
                    },
                    ContentBlock::Thinking {
                        text: "empty signature".to_owned(),
                        signature: Some(String::new()),
                    },
                    ContentBlock::Text {
                        text: "answer".to_owned(),
                    },
                ],
            },
        ];
        let request = PromptRequest {
            model: "m",
            system: Some(""),
            messages: &messages,
            tools: &ToolSpecs::default(),
            max_tokens: 10,
            images: &images,
        };
        let body = encode_request(&request).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "m",
                "max_tokens": 10,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "signed", "signature": "sig"},
                        {"type": "text", "text": "answer"},
                    ]},
                ],
                "stream": true,
            })
        );
    }

    #[test]
    fn tool_results_lead_their_user_message() {
        let images = BTreeMap::new();
        let result = |id: &str| ContentBlock::ToolResult {
            result: ToolResult {
                tool_call_id: ToolCallId::new(id),
                content: format!("out {id}"),
                is_error: false,
                images: Vec::new(),
            },
        };
        let messages = [Message {
            role: Role::User,
            content: vec![
                ContentBlock::Text {
                    text: "note".to_owned(),
                },
                result("a"),
                result("b"),
            ],
        }];
        let tools: ToolSpecs = vec![ToolSpec {
            name: "t".to_owned(),
            description: "d".to_owned(),
            input_schema: json!({"type": "object"}),
        }]
        .into();
        let request = PromptRequest {
            model: "m",
            system: None,
            messages: &messages,
            tools: &tools,
            max_tokens: 10,
            images: &images,
        };
        let body = encode_request(&request).unwrap();
        let types: Vec<&str> = body["messages"][0]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|block| {
                block["tool_use_id"]
                    .as_str()
                    .unwrap_or(block["type"].as_str().unwrap())
            })
            .collect();
        assert_eq!(types, ["a", "b", "text"]);
    }

    #[test]
    fn a_missing_image_is_an_encode_error() {
        let images = BTreeMap::new();
        let messages = [Message {
            role: Role::User,
            content: vec![ContentBlock::Image {
                image: ImageRef {
                    hash: "feed".to_owned(),
                    media_type: "image/png".to_owned(),
                    width: 1,
                    height: 1,
                    size: 1,
                },
            }],
        }];
        let request = PromptRequest {
            model: "m",
            system: None,
            messages: &messages,
            tools: &ToolSpecs::default(),
            max_tokens: 10,
            images: &images,
        };
        assert_eq!(
            encode_request(&request),
            Err(EncodeError::MissingImage {
                hash: "feed".to_owned()
            })
        );
    }

    /// A delta read on the plain path (when it fits) gives what reading it
    /// as a `Value` gives. Each event's twin repeats its `index` key, which
    /// the plain reading refuses (a duplicate field) and the `Value`
    /// reading takes, so the twins go the `Value` way.
    #[test]
    fn the_plain_reading_of_a_delta_agrees_with_the_value_reading() {
        let block_start = |index: u32, block: &str| {
            format!(r#"{{"type":"content_block_start","index":{index},"content_block":{block}}}"#)
        };
        let streams: Vec<Vec<(&str, String)>> = vec![
            vec![
                (START.0, START.1.to_owned()),
                ("content_block_start", block_start(0, r#"{"type":"text","text":""}"#)),
                ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hé \"quoted\" \u00e9"}}"#.to_owned()),
                ("", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" more"}}"#.to_owned()),
                ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{}}}"#.to_owned()),
                ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.to_owned()),
                ("content_block_start", block_start(1, r#"{"type":"thinking","thinking":""}"#)),
                ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"thinking_delta","thinking":"hm"}}"#.to_owned()),
                ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"signature_delta","signature":"sig"}}"#.to_owned()),
                ("content_block_stop", r#"{"type":"content_block_stop","index":1}"#.to_owned()),
                ("content_block_start", block_start(2, r#"{"type":"tool_use","id":"t1","name":"bash","input":{}}"#)),
                ("content_block_delta", r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"command\":"}}"#.to_owned()),
                ("content_block_delta", r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"ls\"}"}}"#.to_owned()),
                ("content_block_stop", r#"{"type":"content_block_stop","index":2}"#.to_owned()),
                ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}"#.to_owned()),
                (STOP.0, STOP.1.to_owned()),
            ],
            vec![
                (START.0, START.1.to_owned()),
                ("content_block_start", block_start(0, r#"{"type":"text","text":""}"#)),
                ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta"}}"#.to_owned()),
            ],
            vec![
                (START.0, START.1.to_owned()),
                ("content_block_delta", r#"{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}"#.to_owned()),
            ],
            vec![
                (START.0, START.1.to_owned()),
                ("content_block_start", block_start(0, r#"{"type":"text","text":""}"#)),
                ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#.to_owned()),
            ],
            vec![
                (START.0, START.1.to_owned()),
                ("content_block_start", block_start(0, r#"{"type":"text","text":""}"#)),
                ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.to_owned()),
                ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"late"}}"#.to_owned()),
            ],
        ];
        let twin = |data: &str| match data.find(r#""index":"#) {
            Some(at) if data.contains("content_block_delta") => {
                let end = at + data[at..].find(',').unwrap();
                format!("{{{},{}", &data[at..end], &data[1..])
            }
            _ => data.to_owned(),
        };
        // The first stream's deltas are read the plain way; their twins not.
        for (_, data) in streams[0]
            .iter()
            .filter(|(_, data)| data.contains("content_block_delta"))
        {
            assert!(
                serde_json::from_str::<PlainBlockDelta<'_>>(data).is_ok(),
                "{data}"
            );
            assert!(
                serde_json::from_str::<PlainBlockDelta<'_>>(&twin(data)).is_err(),
                "{data}"
            );
        }
        for stream in streams {
            let mut plain = Decoder::new("m");
            let mut valued = Decoder::new("m");
            for (event, data) in &stream {
                let fed = plain.feed(SseEvent { event, data });
                let read = valued.feed(SseEvent {
                    event,
                    data: &twin(data),
                });
                assert_eq!(fed, read, "{data}");
            }
            let plain = Box::new(plain).finish();
            let valued = Box::new(valued).finish();
            assert_eq!(format!("{plain:?}"), format!("{valued:?}"), "{stream:?}");
        }
    }
}
