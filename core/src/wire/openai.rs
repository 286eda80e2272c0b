//! The OpenAI Chat Completions wire format, as spoken by OpenAI and by the
//! servers that imitate it (Ollama, vLLM, llama.cpp server, LM Studio,
//! DeepSeek, OpenRouter): the body of `POST /v1/chat/completions` and a
//! decoder for its `stream: true` answer.
//!
//! The stream is a run of SSE `data:` events without `event:` names, each a
//! `chat.completion.chunk` whose `choices[0].delta` carries a piece of text
//! (`content`), of reasoning (`reasoning_content` or `reasoning`, by server)
//! or of tool calls (`tool_calls[]`, assembled by `index`). A chunk sets
//! `finish_reason`; with `stream_options.include_usage` one more chunk with
//! empty `choices` carries `usage`; `data: [DONE]` ends the stream.
//!
//! The compatible servers disagree in small ways, and the decoder takes the
//! liberal reading of each: some say `finish_reason: "stop"` after tool calls,
//! some omit `[DONE]`, Ollama numbers every call of a parallel batch `index 0`
//! and tells them apart by `id`, some resend the name or send integer ids.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

use super::{classify, EncodeError, ImageData, PromptRequest, SseEvent, StreamDecoder};
use crate::config::ProviderKind;
use crate::ids::ToolCallId;
use crate::input::{AssistantResponse, LlmFailure};
use crate::live::StreamDelta;
use crate::message::{
    AssistantBlock, ContentBlock, Message, Role, StopReason, ToolCall, ToolResult, Usage,
};

/// Texts of one message, when a server wants a single string, are joined by
/// a blank line so merged messages do not run into each other.
const TEXT_SEPARATOR: &str = "\n\n";

/// Prefix of a failed tool's result: Chat Completions has no `is_error`, so
/// the model learns of the failure only from the text.
const TOOL_ERROR_PREFIX: &str = "Error: ";

// ---------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------

/// The JSON body of `POST /v1/chat/completions` for `request`, streaming.
///
/// The system prompt comes first as a `system` message. A keel user message
/// becomes its tool results, each a `tool` message (they must follow the
/// assistant message that called them), then one `user` message with its text
/// and images. Thinking blocks are dropped: Chat Completions has no way to
/// send reasoning back.
pub fn encode_request(request: &PromptRequest<'_>) -> Result<Value, EncodeError> {
    serde_json::to_value(Body::of(request)?).map_err(|error| EncodeError::Json {
        reason: error.to_string(),
    })
}

/// The same body as [`encode_request`], as the JSON bytes that are sent.
///
/// Serialised straight from the request's messages, with no JSON tree in
/// between: a request carries the whole history, every turn.
pub fn encode_request_bytes(request: &PromptRequest<'_>) -> Result<Vec<u8>, EncodeError> {
    serde_json::to_vec(&Body::of(request)?).map_err(|error| EncodeError::Json {
        reason: error.to_string(),
    })
}

/// The request body, borrowing from the [`PromptRequest`] where it can.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    stream: bool,
    stream_options: StreamOptions,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Tool {
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
    Assistant {
        /// `null` only next to tool calls.
        content: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
}

/// A user message's content: one string, or parts when it holds an image.
#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<WirePart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WirePart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Serialize)]
struct ImageUrl {
    url: String,
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    /// A JSON document in a string, as the API wants it.
    arguments: String,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolFunction<'a>,
}

#[derive(Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> Body<'a> {
    fn of(request: &PromptRequest<'a>) -> Result<Body<'a>, EncodeError> {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = request.system.filter(|system| !system.is_empty()) {
            messages.push(WireMessage::System { content: system });
        }
        for message in request.messages {
            match message.role {
                Role::User => encode_user(message, request.images, &mut messages)?,
                Role::Assistant => messages.push(encode_assistant(message)),
            }
        }
        let completion = max_tokens_field(request.model) == "max_completion_tokens";
        let tools = request
            .tools
            .iter()
            .map(|tool| WireTool {
                kind: "function",
                function: WireToolFunction {
                    name: &tool.name,
                    description: &tool.description,
                    parameters: &tool.input_schema,
                },
            })
            .collect();
        Ok(Body {
            model: request.model,
            max_tokens: (!completion).then_some(request.max_tokens),
            max_completion_tokens: completion.then_some(request.max_tokens),
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            messages,
            tools,
        })
    }
}

/// `texts` as one string: borrowed when there is just one.
fn joined<'a>(texts: &[&'a str]) -> Cow<'a, str> {
    match texts {
        [one] => Cow::Borrowed(one),
        _ => Cow::Owned(texts.join(TEXT_SEPARATOR)),
    }
}

/// The name of the output cap for `model`.
///
/// `max_tokens` is the field every compatible server reads (Ollama knows no
/// other) and OpenAI's own chat models still accept it. OpenAI's reasoning
/// models (o1, o3, o4, gpt-5) reject it with a 400 and want
/// `max_completion_tokens`, which Ollama would silently ignore, so the newer
/// name is sent only to those models. Sending both is no way out: the
/// reasoning models reject `max_tokens` even next to the other.
fn max_tokens_field(model: &str) -> &'static str {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    let reasoning = ["o1", "o3", "o4", "gpt-5"].iter().any(|family| {
        name.strip_prefix(family)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.', '_']))
    });
    if reasoning {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }
}

fn encode_user<'a>(
    message: &'a Message,
    images: &'a BTreeMap<String, ImageData>,
    out: &mut Vec<WireMessage<'a>>,
) -> Result<(), EncodeError> {
    let mut parts = Vec::new();
    for block in &message.content {
        match block {
            ContentBlock::ToolResult { result } => out.push(encode_tool_result(result)),
            ContentBlock::Text { text } if text.is_empty() => {}
            ContentBlock::Text { text } => parts.push(WirePart::Text { text }),
            ContentBlock::Image { image } => {
                let data = images
                    .get(&image.hash)
                    .ok_or_else(|| EncodeError::MissingImage {
                        hash: image.hash.clone(),
                    })?;
                parts.push(WirePart::ImageUrl {
                    image_url: ImageUrl {
                        url: format!("data:{};base64,{}", data.media_type, data.base64),
                    },
                });
            }
            // Reasoning is never sent back, and a user message holds no tool
            // calls; neither has a place in a `user` message.
            ContentBlock::Thinking { .. } | ContentBlock::ToolUse { .. } => {}
        }
    }
    if parts.is_empty() {
        return Ok(());
    }
    let has_image = parts
        .iter()
        .any(|part| matches!(part, WirePart::ImageUrl { .. }));
    let content = if has_image {
        // Content parts only when needed: some servers' chat templates take
        // nothing but a string, and Ollama splits parts into messages.
        UserContent::Parts(parts)
    } else {
        let texts: Vec<&str> = parts
            .iter()
            .filter_map(|part| match part {
                WirePart::Text { text } => Some(*text),
                WirePart::ImageUrl { .. } => None,
            })
            .collect();
        UserContent::Text(joined(&texts))
    };
    out.push(WireMessage::User { content });
    Ok(())
}

fn encode_tool_result(result: &ToolResult) -> WireMessage<'_> {
    let content = if result.is_error {
        Cow::Owned(format!("{TOOL_ERROR_PREFIX}{}", result.content))
    } else {
        Cow::Borrowed(result.content.as_str())
    };
    WireMessage::Tool {
        tool_call_id: result.tool_call_id.as_str(),
        content,
    }
}

fn encode_assistant(message: &Message) -> WireMessage<'_> {
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for block in &message.content {
        match block {
            ContentBlock::Text { text } if text.is_empty() => {}
            ContentBlock::Text { text } => texts.push(text.as_str()),
            ContentBlock::ToolUse { call } => tool_calls.push(WireCall {
                id: call.id.as_str(),
                kind: "function",
                function: WireFunction {
                    name: &call.name,
                    arguments: call.input.to_string(),
                },
            }),
            ContentBlock::Thinking { .. }
            | ContentBlock::Image { .. }
            | ContentBlock::ToolResult { .. } => {}
        }
    }
    let content = match (texts.is_empty(), tool_calls.is_empty()) {
        (false, _) => Some(joined(&texts)),
        (true, false) => None,
        (true, true) => Some(Cow::Borrowed("")),
    };
    WireMessage::Assistant {
        content,
        tool_calls,
    }
}

// ---------------------------------------------------------------------------
// Response stream
// ---------------------------------------------------------------------------

/// Decodes one streamed Chat Completions response.
#[derive(Debug)]
pub struct Decoder {
    /// The model the request asked for; reported when no chunk names one.
    requested_model: String,
    /// The model the chunks name (servers may resolve an alias).
    model: Option<String>,
    /// The chunks' `id` and `created`: the seed of a tool call id when a
    /// server sends none.
    response_id: Option<String>,
    created: Option<u64>,
    /// The response so far, in the order it arrived.
    parts: Vec<Part>,
    calls: Vec<PendingCall>,
    /// The call each server-side `index` is filling now. Usually the index
    /// is the call's position; Ollama reuses index 0 for a parallel batch.
    slot_by_index: BTreeMap<u64, usize>,
    /// The last `finish_reason` seen.
    finish_reason: Option<String>,
    /// The model declined (`delta.refusal`).
    refused: bool,
    /// The last `usage` seen; the include_usage chunk is cumulative.
    usage: Option<Usage>,
    /// `[DONE]` arrived.
    done: bool,
    /// A failure reported by `feed`, reported again by `finish`.
    failure: Option<LlmFailure>,
}

/// A piece of the response, in arrival order.
#[derive(Debug)]
enum Part {
    Text(String),
    Thinking(String),
    /// The call at this position of `calls`.
    Tool(usize),
}

/// A tool call being assembled from its fragments.
#[derive(Debug, Default)]
struct PendingCall {
    /// The id keel uses: the server's first, or one made up when it sent none.
    id: Option<ToolCallId>,
    /// The last id the server sent for this call, to spot a new call that
    /// reuses the index.
    wire_id: Option<String>,
    name: String,
    /// The arguments JSON so far.
    arguments: String,
    /// `ToolUseStarted` was emitted (the name is known).
    started: bool,
}

/// One `tool_calls[]` entry of a delta.
struct Fragment {
    index: u64,
    id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
}

impl Decoder {
    pub fn new(model: &str) -> Decoder {
        Decoder {
            requested_model: model.to_owned(),
            model: None,
            response_id: None,
            created: None,
            parts: Vec::new(),
            calls: Vec::new(),
            slot_by_index: BTreeMap::new(),
            finish_reason: None,
            refused: false,
            usage: None,
            done: false,
            failure: None,
        }
    }

    fn fail(&mut self, failure: LlmFailure) -> Result<Vec<StreamDelta>, LlmFailure> {
        self.failure = Some(failure.clone());
        Err(failure)
    }

    fn note_metadata(&mut self, chunk: &Value) {
        if let Some(model) = chunk.get("model").and_then(Value::as_str) {
            if !model.is_empty() {
                self.model = Some(model.to_owned());
            }
        }
        if self.response_id.is_none() {
            self.response_id = chunk
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map(str::to_owned);
        }
        if self.created.is_none() {
            self.created = chunk.get("created").and_then(Value::as_u64);
        }
    }

    fn apply_delta(&mut self, delta: &Value, out: &mut Vec<StreamDelta>) {
        // DeepSeek, SGLang and llama.cpp say `reasoning_content`; vLLM,
        // Ollama and OpenRouter say `reasoning`. A server in transition may
        // send both with the same text, so only the first is taken.
        let reasoning = ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|key| delta.get(key).and_then(Value::as_str))
            .filter(|text| !text.is_empty());
        if let Some(text) = reasoning {
            self.push_thinking(text, out);
        }
        match delta.get("content") {
            Some(Value::String(text)) => self.push_text(text, out),
            // A few servers (Mistral) send content as typed parts.
            Some(Value::Array(parts)) => {
                for part in parts {
                    if part.get("type").and_then(Value::as_str) == Some("text") {
                        if let Some(text) = part.get("text").and_then(Value::as_str) {
                            self.push_text(text, out);
                        }
                    }
                }
            }
            _ => {}
        }
        if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
            if !refusal.is_empty() {
                self.refused = true;
                self.push_text(refusal, out);
            }
        }
        if let Some(fragments) = delta.get("tool_calls").and_then(Value::as_array) {
            for fragment in fragments {
                self.apply_fragment(parse_fragment(fragment), out);
            }
        }
    }

    fn push_text(&mut self, text: &str, out: &mut Vec<StreamDelta>) {
        if text.is_empty() {
            return;
        }
        match self.parts.last_mut() {
            Some(Part::Text(so_far)) => so_far.push_str(text),
            _ => self.parts.push(Part::Text(text.to_owned())),
        }
        out.push(StreamDelta::Text {
            text: text.to_owned(),
        });
    }

    fn push_thinking(&mut self, text: &str, out: &mut Vec<StreamDelta>) {
        match self.parts.last_mut() {
            Some(Part::Thinking(so_far)) => so_far.push_str(text),
            _ => self.parts.push(Part::Thinking(text.to_owned())),
        }
        out.push(StreamDelta::Thinking {
            text: text.to_owned(),
        });
    }

    fn apply_fragment(&mut self, fragment: Fragment, out: &mut Vec<StreamDelta>) {
        let current = self.slot_by_index.get(&fragment.index).copied();
        let slot = match current {
            Some(slot) if !self.calls[slot].is_followed_by_new_call(&fragment) => slot,
            _ => {
                let slot = self.calls.len();
                self.calls.push(PendingCall::default());
                self.parts.push(Part::Tool(slot));
                self.slot_by_index.insert(fragment.index, slot);
                slot
            }
        };
        let call = &mut self.calls[slot];
        if let Some(id) = fragment.id {
            if call.id.is_none() {
                call.id = Some(ToolCallId::new(id.clone()));
            }
            call.wire_id = Some(id);
        }
        if call.name.is_empty() {
            if let Some(name) = fragment.name {
                call.name = name;
            }
        }
        let arguments = fragment.arguments.unwrap_or_default();
        call.arguments.push_str(&arguments);

        if call.started {
            if let (Some(id), false) = (&call.id, arguments.is_empty()) {
                out.push(StreamDelta::ToolInput {
                    id: id.clone(),
                    partial_json: arguments,
                });
            }
            return;
        }
        if call.name.is_empty() {
            // Not started until its name is known; arguments wait here.
            return;
        }
        let id = match &call.id {
            Some(id) => id.clone(),
            None => {
                let id = self.fallback_id(slot);
                self.calls[slot].id = Some(id.clone());
                id
            }
        };
        let call = &mut self.calls[slot];
        call.started = true;
        out.push(StreamDelta::ToolUseStarted {
            id: id.clone(),
            name: call.name.clone(),
        });
        // Arguments that came before the name (from no server seen so far)
        // follow at once.
        if !call.arguments.is_empty() {
            out.push(StreamDelta::ToolInput {
                id,
                partial_json: call.arguments.clone(),
            });
        }
    }

    /// An id for the call at `slot` if the server sends none: derived from
    /// the response's id and creation time, so it differs between responses
    /// without keel-core drawing randomness.
    fn fallback_id(&self, slot: usize) -> ToolCallId {
        let mut hash = Fnv1a::new();
        hash.write(self.response_id.as_deref().unwrap_or("").as_bytes());
        hash.write(&self.created.unwrap_or(0).to_le_bytes());
        ToolCallId::new(format!("call_{:016x}_{slot}", hash.finish()))
    }

    fn stop_reason(&self, has_tool_calls: bool) -> StopReason {
        // A response cut off at max_tokens says so even with tool calls in
        // it: the last call's arguments may be incomplete, and none may run.
        if self.finish_reason.as_deref() == Some("length") {
            return StopReason::MaxTokens;
        }
        // Whether the model called tools is read from what it sent: vLLM,
        // llama.cpp and others say "stop" after tool calls.
        if has_tool_calls {
            return StopReason::ToolUse;
        }
        if self.refused {
            return StopReason::Refusal;
        }
        match self.finish_reason.as_deref() {
            Some("stop") | None => StopReason::EndTurn,
            Some("length") => StopReason::MaxTokens,
            Some("content_filter") => StopReason::Refusal,
            // "tool_calls" (or the deprecated "function_call") with no call
            // assembled is a reason keel cannot act on.
            Some(_) => StopReason::Other,
        }
    }

    fn finish_call(&self, call: &PendingCall, position: usize) -> Result<ToolCall, LlmFailure> {
        let id = call
            .id
            .clone()
            .unwrap_or_else(|| self.fallback_id(position));
        if call.name.is_empty() {
            return Err(retryable(format!(
                "tool call {id} arrived without a function name"
            )));
        }
        let input = match parse_arguments(&call.arguments) {
            Ok(input) => input,
            // Cut off by max_tokens: kept with empty arguments, because
            // keel-core runs no call of a cut-off response and the history
            // must still carry every call the model made.
            Err(_) if self.finish_reason.as_deref() == Some("length") => {
                Value::Object(serde_json::Map::new())
            }
            Err(problem) => {
                return Err(retryable(format!(
                    "tool {} (call {id}) sent arguments that are {problem}",
                    call.name
                )))
            }
        };
        Ok(ToolCall {
            id,
            name: call.name.clone(),
            input,
        })
    }
}

impl PendingCall {
    /// Whether `fragment`, at this call's index, begins another call: it
    /// carries a new id and a name, and this call is over (its arguments are
    /// a complete JSON object) or plainly another (its name differs). Ollama
    /// sends each call of a parallel batch whole, all at index 0; LM Studio
    /// and Kimi send a fresh id with every fragment of one call, which this
    /// must not split.
    fn is_followed_by_new_call(&self, fragment: &Fragment) -> bool {
        let new_id = match (&fragment.id, &self.wire_id) {
            (Some(new), Some(old)) => new != old,
            _ => false,
        };
        let Some(name) = &fragment.name else {
            return false;
        };
        new_id
            && ((!self.name.is_empty() && *name != self.name)
                || (self.arguments.trim_end().ends_with('}')
                    && serde_json::from_str::<Value>(&self.arguments).is_ok()))
    }
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, event: SseEvent<'_>) -> Result<Vec<StreamDelta>, LlmFailure> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        let data = event.data.trim();
        if self.done || data.is_empty() {
            return Ok(Vec::new());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(chunk @ Value::Object(_)) => chunk,
            Ok(_) => return self.fail(retryable("malformed stream chunk: not a JSON object")),
            Err(error) => return self.fail(retryable(format!("malformed stream chunk: {error}"))),
        };
        if let Some(error) = error_of(&chunk, event.event) {
            return self.fail(stream_failure(&error));
        }

        self.note_metadata(&chunk);
        if let Some(usage) = chunk.get("usage").filter(|usage| usage.is_object()) {
            self.usage = Some(parse_usage(usage));
        }
        let mut out = Vec::new();
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            // keel asks for one choice; anything else is not its answer.
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.get("delta") {
                self.apply_delta(delta, &mut out);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        Ok(out)
    }

    fn is_complete(&self) -> bool {
        self.done
    }

    fn finish(self: Box<Self>) -> Result<AssistantResponse, LlmFailure> {
        let mut this = *self;
        if let Some(failure) = this.failure {
            return Err(failure);
        }
        // Some servers close the stream without `[DONE]`; a finish_reason
        // says the answer was whole all the same.
        if !this.done && this.finish_reason.is_none() {
            return Err(retryable(
                "stream ended early: no finish_reason and no [DONE] before the connection closed",
            ));
        }
        let mut blocks = Vec::with_capacity(this.parts.len());
        let mut has_tool_calls = false;
        for part in std::mem::take(&mut this.parts) {
            match part {
                // Whitespace between reasoning and tool calls (Qwen's "\n\n")
                // says nothing, and Anthropic rejects it should this history
                // ever be sent there.
                Part::Text(text) if text.trim().is_empty() => {}
                Part::Text(text) => blocks.push(AssistantBlock::Text { text }),
                Part::Thinking(text) => blocks.push(AssistantBlock::Thinking {
                    text,
                    signature: None,
                }),
                Part::Tool(slot) => {
                    let call = this.finish_call(&this.calls[slot], slot)?;
                    blocks.push(AssistantBlock::ToolUse { call });
                    has_tool_calls = true;
                }
            }
        }
        Ok(AssistantResponse {
            blocks,
            stop_reason: this.stop_reason(has_tool_calls),
            usage: this.usage.unwrap_or_default(),
            provider: ProviderKind::OpenAi,
            model: this.model.unwrap_or(this.requested_model),
        })
    }
}

fn parse_fragment(fragment: &Value) -> Fragment {
    let function = fragment.get("function");
    Fragment {
        // Servers that send a single call sometimes leave out the index.
        index: fragment.get("index").and_then(Value::as_u64).unwrap_or(0),
        id: match fragment.get("id") {
            Some(Value::String(id)) if !id.is_empty() => Some(id.clone()),
            // Poolside sends integer ids.
            Some(Value::Number(id)) => Some(id.to_string()),
            _ => None,
        },
        name: function
            .and_then(|function| function.get("name"))
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .map(str::to_owned),
        arguments: match function.and_then(|function| function.get("arguments")) {
            Some(Value::String(arguments)) => Some(arguments.clone()),
            None | Some(Value::Null) => None,
            // Arguments as an object rather than a string of JSON.
            Some(other) => Some(other.to_string()),
        },
    }
}

/// The tool input in `arguments`: a JSON object. Empty means no arguments;
/// an object encoded twice (a string of JSON) is unwrapped.
fn parse_arguments(arguments: &str) -> Result<Value, String> {
    if arguments.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => Ok(object),
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(object @ Value::Object(_)) => Ok(object),
            _ => Err("not a JSON object".to_owned()),
        },
        Ok(_) => Err("not a JSON object".to_owned()),
        Err(error) => Err(format!("not valid JSON ({error})")),
    }
}

/// The error a chunk reports, if it is one: `{"error": {...}}` (OpenAI,
/// llama.cpp, newer vLLM), a bare `{"object": "error", ...}` (older vLLM),
/// or anything sent as an `error` event.
fn error_of(chunk: &Value, event: &str) -> Option<Value> {
    match chunk.get("error") {
        Some(Value::Null) | None => {}
        Some(Value::String(message)) => return Some(json!({ "message": message })),
        Some(error) => return Some(error.clone()),
    }
    let bare = chunk.get("object").and_then(Value::as_str) == Some("error");
    (bare || event == "error").then(|| chunk.clone())
}

/// Classify an in-stream error. vLLM and llama.cpp put the HTTP status in a
/// numeric `code` and a type the shared table does not know
/// ("BadRequestError"); the status then decides what is retried.
fn stream_failure(error: &Value) -> LlmFailure {
    let mut failure = classify::classify_stream_error(error);
    let status = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|code| u16::try_from(code).ok())
        .filter(|code| (400..=599).contains(code));
    if let Some(status) = status {
        failure.retryable = classify::classify_status(status, None, &failure.message).retryable;
    }
    failure
}

/// keel's usage from OpenAI's. `prompt_tokens` counts every input token,
/// cached or not, while keel counts uncached input, cache reads and cache
/// writes apart (their sum is the prompt): cached tokens are moved out of
/// `input_tokens` so nothing is counted twice.
fn parse_usage(usage: &Value) -> Usage {
    let count = |value: Option<&Value>| value.and_then(Value::as_u64);
    let details = usage.get("prompt_tokens_details");
    let prompt = count(usage.get("prompt_tokens")).unwrap_or(0);
    let cache_read = count(details.and_then(|details| details.get("cached_tokens")))
        // DeepSeek reports its cache hits at the top level.
        .or_else(|| count(usage.get("prompt_cache_hit_tokens")))
        .unwrap_or(0)
        .min(prompt);
    // OpenRouter reports cache writes (of providers that bill them).
    let cache_write = count(details.and_then(|details| details.get("cache_write_tokens")))
        .unwrap_or(0)
        .min(prompt - cache_read);
    Usage {
        input_tokens: prompt - cache_read - cache_write,
        output_tokens: count(usage.get("completion_tokens")).unwrap_or(0),
        cache_creation_input_tokens: cache_write,
        cache_read_input_tokens: cache_read,
    }
}

fn retryable(message: impl Into<String>) -> LlmFailure {
    LlmFailure {
        retryable: true,
        retry_after_ms: None,
        message: message.into(),
    }
}

/// FNV-1a, 64 bits: a stable hash without a dependency, for made-up ids.
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(decoder: &mut Decoder, chunks: &[Value]) -> Vec<StreamDelta> {
        let mut deltas = Vec::new();
        for chunk in chunks {
            let data = chunk.to_string();
            deltas.extend(
                decoder
                    .feed(SseEvent {
                        event: "",
                        data: &data,
                    })
                    .unwrap(),
            );
        }
        deltas
    }

    fn done(decoder: &mut Decoder) {
        decoder
            .feed(SseEvent {
                event: "",
                data: "[DONE]",
            })
            .unwrap();
    }

    fn tool_chunk(fragments: Value) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{ "index": 0, "delta": { "tool_calls": fragments }, "finish_reason": null }],
        })
    }

    fn finish_chunk(reason: &str) -> Value {
        json!({ "choices": [{ "index": 0, "delta": {}, "finish_reason": reason }] })
    }

    fn calls(response: &AssistantResponse) -> Vec<(String, String, Value)> {
        response
            .blocks
            .iter()
            .filter_map(AssistantBlock::tool_call)
            .map(|call| (call.id.to_string(), call.name.clone(), call.input.clone()))
            .collect()
    }

    #[test]
    fn usage_moves_cached_tokens_out_of_input() {
        let usage = parse_usage(&json!({
            "prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
            "prompt_tokens_details": { "cached_tokens": 800 },
        }));
        assert_eq!(
            usage,
            Usage {
                input_tokens: 200,
                output_tokens: 50,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 800,
            }
        );
        assert_eq!(usage.context_tokens(), 1050);
    }

    #[test]
    fn usage_reads_deepseek_and_openrouter_cache_fields_and_never_underflows() {
        let deepseek = parse_usage(&json!({
            "prompt_tokens": 100, "completion_tokens": 5,
            "prompt_cache_hit_tokens": 60, "prompt_cache_miss_tokens": 40,
        }));
        assert_eq!(
            (deepseek.input_tokens, deepseek.cache_read_input_tokens),
            (40, 60)
        );
        let openrouter = parse_usage(&json!({
            "prompt_tokens": 100, "completion_tokens": 5,
            "prompt_tokens_details": { "cached_tokens": 30, "cache_write_tokens": 10 },
        }));
        assert_eq!(
            (
                openrouter.input_tokens,
                openrouter.cache_read_input_tokens,
                openrouter.cache_creation_input_tokens
            ),
            (60, 30, 10)
        );
        let nonsense = parse_usage(&json!({
            "prompt_tokens": 5, "prompt_tokens_details": { "cached_tokens": 9, "cache_write_tokens": 9 },
        }));
        assert_eq!(nonsense.context_tokens(), 5);
        assert_eq!(parse_usage(&json!({})), Usage::default());
    }

    #[test]
    fn finish_reasons_map_to_stop_reasons() {
        for (reason, expected) in [
            ("stop", StopReason::EndTurn),
            ("length", StopReason::MaxTokens),
            ("content_filter", StopReason::Refusal),
            ("tool_calls", StopReason::Other),
            ("something_new", StopReason::Other),
        ] {
            let mut decoder = Decoder::new("m");
            feed_all(&mut decoder, &[finish_chunk(reason)]);
            let response = Box::new(decoder).finish().unwrap();
            assert_eq!(response.stop_reason, expected, "{reason}");
        }
    }

    #[test]
    fn a_refusal_is_shown_as_text_and_ends_as_refusal() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[
                json!({ "choices": [{ "index": 0, "delta": { "refusal": "I can't help with that." } }] }),
                finish_chunk("stop"),
            ],
        );
        assert_eq!(
            deltas,
            vec![StreamDelta::Text {
                text: "I can't help with that.".into()
            }]
        );
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(response.stop_reason, StopReason::Refusal);
    }

    #[test]
    fn ollama_parallel_calls_that_share_index_zero_are_told_apart_by_id() {
        let mut decoder = Decoder::new("qwen");
        let deltas = feed_all(
            &mut decoder,
            &[
                tool_chunk(json!([{ "id": "call_a", "index": 0, "type": "function",
                    "function": { "name": "run", "arguments": "{\"command\":\"ls\"}" } }])),
                tool_chunk(json!([{ "id": "call_b", "index": 0, "type": "function",
                    "function": { "name": "run", "arguments": "{\"command\":\"ls -l\"}" } }])),
                finish_chunk("tool_calls"),
            ],
        );
        assert_eq!(deltas.len(), 4);
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![
                ("call_a".into(), "run".into(), json!({ "command": "ls" })),
                ("call_b".into(), "run".into(), json!({ "command": "ls -l" })),
            ]
        );
    }

    #[test]
    fn a_fresh_id_on_every_fragment_does_not_split_a_call() {
        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": "x1", "index": 0, "function": { "name": "read", "arguments": "{\"pa" } }]),
                ),
                tool_chunk(
                    json!([{ "id": "x2", "index": 0, "function": { "name": "read", "arguments": "th\":" } }]),
                ),
                tool_chunk(
                    json!([{ "id": "x3", "index": 0, "function": { "arguments": "\"a\"}" } }]),
                ),
                finish_chunk("tool_calls"),
            ],
        );
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![("x1".into(), "read".into(), json!({ "path": "a" }))]
        );
    }

    #[test]
    fn integer_ids_missing_ids_and_missing_indexes_still_make_calls() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": 7, "index": 0, "function": { "name": "a", "arguments": "" } }]),
                ),
                tool_chunk(json!([{ "index": 1, "function": { "name": "b", "arguments": "{}" } }])),
            ],
        );
        done(&mut decoder);
        let StreamDelta::ToolUseStarted {
            id: synthesized, ..
        } = &deltas[1]
        else {
            panic!("expected the second call to start: {deltas:?}");
        };
        assert!(synthesized.as_str().starts_with("call_"));
        assert!(synthesized.as_str().len() <= 40, "a made-up id stays short");
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![
                ("7".into(), "a".into(), json!({})),
                (synthesized.to_string(), "b".into(), json!({})),
            ]
        );

        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[tool_chunk(
                json!([{ "id": "c", "function": { "name": "only", "arguments": "{\"x\":1}" } }]),
            )],
        );
        done(&mut decoder);
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![("c".into(), "only".into(), json!({ "x": 1 }))]
        );
    }

    #[test]
    fn the_made_up_ids_hash_is_fnv_1a() {
        // Test vectors of FNV-1a, 64 bits: the ids must stay the same
        // across versions, so the hash may not drift.
        let hash = |bytes: &[u8]| {
            let mut hash = Fnv1a::new();
            hash.write(bytes);
            hash.finish()
        };
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn an_empty_id_is_no_id_and_the_call_gets_a_made_up_one() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[tool_chunk(
                json!([{ "id": "", "index": 0, "function": { "name": "t", "arguments": "{}" } }]),
            )],
        );
        let StreamDelta::ToolUseStarted { id, .. } = &deltas[0] else {
            panic!("expected the call to start: {deltas:?}");
        };
        assert!(id.as_str().starts_with("call_"), "{id}");
    }

    #[test]
    fn a_name_resent_with_the_same_id_after_whole_arguments_is_the_same_call() {
        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": "c", "index": 0, "function": { "name": "run", "arguments": "{\"a\":1}" } }]),
                ),
                tool_chunk(json!([{ "id": "c", "index": 0, "function": { "name": "run" } }])),
            ],
        );
        done(&mut decoder);
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![("c".into(), "run".into(), json!({ "a": 1 }))]
        );
    }

    #[test]
    fn a_fresh_id_after_arguments_that_only_look_finished_does_not_split_the_call() {
        // `{"a":{"b":1}` ends with `}` but is not yet a JSON object.
        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": "x1", "index": 0, "function": { "name": "run", "arguments": "{\"a\":{\"b\":1}" } }]),
                ),
                tool_chunk(
                    json!([{ "id": "x2", "index": 0, "function": { "name": "run", "arguments": "}" } }]),
                ),
            ],
        );
        done(&mut decoder);
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![("x1".into(), "run".into(), json!({ "a": { "b": 1 } }))]
        );
    }

    #[test]
    fn content_sent_as_typed_parts_is_text() {
        let mut decoder = Decoder::new("m");
        let chunk = json!({ "choices": [{ "index": 0, "delta": { "content": [
            { "type": "text", "text": "Bonjour" },
            { "type": "reference", "text": "not said" },
            { "type": "text", "text": " !" },
        ] } }] });
        let deltas = feed_all(&mut decoder, &[chunk, finish_chunk("stop")]);
        assert_eq!(
            deltas,
            vec![
                StreamDelta::Text {
                    text: "Bonjour".to_owned()
                },
                StreamDelta::Text {
                    text: " !".to_owned()
                },
            ]
        );
    }

    #[test]
    fn made_up_ids_differ_between_responses() {
        let made_up = |response_id: &str| {
            let mut decoder = Decoder::new("m");
            let chunk = json!({ "id": response_id, "created": 5, "choices": [{ "index": 0,
                "delta": { "tool_calls": [{ "index": 0, "function": { "name": "t" } }] } }] });
            match &feed_all(&mut decoder, &[chunk])[0] {
                StreamDelta::ToolUseStarted { id, .. } => id.clone(),
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_ne!(made_up("chatcmpl-1"), made_up("chatcmpl-2"));
        assert_eq!(made_up("chatcmpl-1"), made_up("chatcmpl-1"));
    }

    #[test]
    fn calls_without_arguments_at_one_index_split_on_a_new_name() {
        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": "a", "index": 0, "function": { "name": "now", "arguments": "" } }]),
                ),
                tool_chunk(
                    json!([{ "id": "b", "index": 0, "function": { "name": "whoami", "arguments": "" } }]),
                ),
            ],
        );
        done(&mut decoder);
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![
                ("a".into(), "now".into(), json!({})),
                ("b".into(), "whoami".into(), json!({})),
            ]
        );
    }

    #[test]
    fn whitespace_only_text_is_streamed_but_not_kept() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[
                json!({ "choices": [{ "index": 0, "delta": { "content": "\n\n" } }] }),
                tool_chunk(
                    json!([{ "id": "a", "index": 0, "function": { "name": "t", "arguments": "{}" } }]),
                ),
                finish_chunk("tool_calls"),
            ],
        );
        assert_eq!(
            deltas[0],
            StreamDelta::Text {
                text: "\n\n".into()
            }
        );
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(response.blocks.len(), 1);
        assert_eq!(response.stop_reason, StopReason::ToolUse);
    }

    #[test]
    fn a_resent_name_is_not_appended() {
        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": "c", "index": 0, "function": { "name": "read_file", "arguments": "{" } }]),
                ),
                tool_chunk(
                    json!([{ "index": 0, "function": { "name": "read_file", "arguments": "}" } }]),
                ),
            ],
        );
        done(&mut decoder);
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(
            calls(&response),
            vec![("c".into(), "read_file".into(), json!({}))]
        );
    }

    #[test]
    fn arguments_must_be_a_json_object() {
        assert_eq!(parse_arguments("  "), Ok(json!({})));
        assert_eq!(parse_arguments(r#"{"a":1}"#), Ok(json!({ "a": 1 })));
        assert_eq!(parse_arguments(r#""{\"a\":1}""#), Ok(json!({ "a": 1 })));
        assert!(parse_arguments("[1]").is_err());
        assert!(parse_arguments(r#"{"a":"#)
            .unwrap_err()
            .starts_with("not valid JSON"));
    }

    #[test]
    fn arguments_that_are_not_json_fail_retryably_naming_the_tool() {
        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": "c1", "index": 0, "function": { "name": "write", "arguments": "{\"text\": \"abc" } }]),
                ),
                finish_chunk("tool_calls"),
            ],
        );
        let failure = Box::new(decoder).finish().unwrap_err();
        assert!(failure.retryable);
        assert!(
            failure
                .message
                .starts_with("tool write (call c1) sent arguments that are not valid JSON"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn arguments_cut_off_at_max_tokens_are_kept_empty_and_the_response_says_so() {
        let mut decoder = Decoder::new("m");
        feed_all(
            &mut decoder,
            &[
                tool_chunk(
                    json!([{ "id": "c1", "index": 0, "function": { "name": "write", "arguments": "{\"text\": \"abc" } }]),
                ),
                finish_chunk("length"),
            ],
        );
        let response = Box::new(decoder).finish().unwrap();
        assert_eq!(response.stop_reason, StopReason::MaxTokens);
        let call = response.blocks[0].tool_call().unwrap();
        assert_eq!(call.id.as_str(), "c1");
        assert_eq!(call.input, json!({}));
    }

    #[test]
    fn a_call_without_a_name_fails() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[tool_chunk(
                json!([{ "id": "c1", "index": 0, "function": { "arguments": "{}" } }]),
            )],
        );
        assert!(deltas.is_empty());
        done(&mut decoder);
        let failure = Box::new(decoder).finish().unwrap_err();
        assert!(failure.retryable);
        assert_eq!(
            failure.message,
            "tool call c1 arrived without a function name"
        );
    }

    #[test]
    fn errors_in_every_shape_fail_the_stream() {
        let cases = [
            // OpenAI: a transient server error.
            (
                "",
                r#"{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}"#,
                true,
                "server_error: The server had an error",
            ),
            // Newer vLLM: the status in a numeric code.
            (
                "",
                r#"{"error":{"message":"prompt too long","type":"BadRequestError","param":null,"code":400}}"#,
                false,
                "BadRequestError: prompt too long",
            ),
            // Older vLLM: a bare error object.
            (
                "",
                r#"{"object":"error","message":"engine died","type":"InternalServerError","param":null,"code":500}"#,
                true,
                "InternalServerError: engine died",
            ),
            // A proxy with a plain string.
            (
                "",
                r#"{"error":"upstream timed out"}"#,
                true,
                "upstream timed out",
            ),
            // An `error` event.
            (
                "error",
                r#"{"message":"Overloaded","type":"overloaded_error"}"#,
                true,
                "overloaded_error: Overloaded",
            ),
        ];
        for (event, data, retryable, message) in cases {
            let mut decoder = Decoder::new("m");
            let failure = decoder.feed(SseEvent { event, data }).unwrap_err();
            assert_eq!(failure.retryable, retryable, "{data}");
            assert_eq!(failure.message, message, "{data}");
            // The failure sticks.
            assert_eq!(
                decoder.feed(SseEvent {
                    event: "",
                    data: "[DONE]"
                }),
                Err(failure.clone())
            );
            assert_eq!(Box::new(decoder).finish(), Err(failure));
        }
    }

    #[test]
    fn a_quota_error_in_the_stream_is_not_retried() {
        let mut decoder = Decoder::new("m");
        let failure = decoder
            .feed(SseEvent {
                event: "",
                data: r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            })
            .unwrap_err();
        assert!(!failure.retryable);
    }

    #[test]
    fn malformed_chunks_fail_retryably() {
        for data in ["{\"choices\": [", "42", "not json"] {
            let mut decoder = Decoder::new("m");
            let failure = decoder.feed(SseEvent { event: "", data }).unwrap_err();
            assert!(failure.retryable);
            assert!(
                failure.message.starts_with("malformed stream chunk"),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn empty_data_and_everything_after_done_are_ignored() {
        let mut decoder = Decoder::new("m");
        assert_eq!(
            decoder.feed(SseEvent {
                event: "",
                data: "  "
            }),
            Ok(vec![])
        );
        assert!(!decoder.is_complete());
        done(&mut decoder);
        assert!(decoder.is_complete());
        assert_eq!(
            decoder.feed(SseEvent {
                event: "",
                data: "garbage"
            }),
            Ok(vec![])
        );
        let response = Box::new(decoder).finish().unwrap();
        assert!(response.blocks.is_empty());
        assert_eq!(response.model, "m");
        assert_eq!(response.provider, ProviderKind::OpenAi);
    }

    #[test]
    fn only_the_first_choice_is_the_answer() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[json!({ "choices": [
                { "index": 1, "delta": { "content": "other" } },
                { "index": 0, "delta": { "content": "mine" } },
            ] })],
        );
        assert_eq!(
            deltas,
            vec![StreamDelta::Text {
                text: "mine".into()
            }]
        );
    }

    #[test]
    fn reasoning_is_taken_once_even_when_both_names_are_sent() {
        let mut decoder = Decoder::new("m");
        let deltas = feed_all(
            &mut decoder,
            &[json!({ "choices": [{ "index": 0,
                "delta": { "reasoning_content": "hmm", "reasoning": "hmm", "content": "" } }] })],
        );
        assert_eq!(deltas, vec![StreamDelta::Thinking { text: "hmm".into() }]);
    }

    #[test]
    fn the_output_cap_field_follows_the_model_family() {
        for model in [
            "gpt-4o",
            "gpt-4.1-mini",
            "llama3.1:8b",
            "qwen2.5-coder",
            "gpt-oss:20b",
            "o1x",
        ] {
            assert_eq!(max_tokens_field(model), "max_tokens", "{model}");
        }
        for model in [
            "o1",
            "o1-mini",
            "o3-mini",
            "o4-mini",
            "gpt-5",
            "gpt-5.1",
            "GPT-5-mini",
            "openai/o3",
        ] {
            assert_eq!(max_tokens_field(model), "max_completion_tokens", "{model}");
        }
    }
}
