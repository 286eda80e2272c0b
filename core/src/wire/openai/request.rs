//! The request: the body of `POST /v1/chat/completions`, built from keel's
//! history through borrowed structs and serialised once, to bytes (read
//! back as a JSON value for tests).
//!
//! Apart from the decoder because nothing is shared: encoding reads keel's
//! messages and writes the format, decoding reads the format and writes
//! keel's deltas. What the compatible servers accept decides its shapes: a
//! user message is a string unless it holds an image, a failed tool's result
//! says so in its text, and the output cap's name follows the model family.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::message::{ContentBlock, ImageRef, Message, Role, ToolResult};
use crate::wire::encoded::{self, EncodedHistory};
use crate::wire::{EncodeError, ImageData, PromptRequest, ToolsWire};

/// Texts of one message, when a server wants a single string, are joined by
/// a blank line so merged messages do not run into each other.
const TEXT_SEPARATOR: &str = "\n\n";

/// Prefix of a failed tool's result: Chat Completions has no `is_error`, so
/// the model learns of the failure only from the text.
const TOOL_ERROR_PREFIX: &str = "Error: ";

/// The JSON body of `POST /v1/chat/completions` for `request`, streaming.
///
/// The system prompt comes first as a `system` message. A keel user message
/// becomes its tool results, each a `tool` message (they must follow the
/// assistant message that called them), then one `user` message with its text
/// and images. Thinking blocks are dropped: Chat Completions has no way to
/// send reasoning back.
pub fn encode_request(request: &PromptRequest<'_>) -> Result<Value, EncodeError> {
    let bytes = encode_request_bytes(request)?;
    serde_json::from_slice(&bytes).map_err(|error| EncodeError::Json {
        reason: error.to_string(),
    })
}

/// The same body as [`encode_request`], as the JSON bytes that are sent.
///
/// Serialised straight from the request's messages, with no JSON tree in
/// between: a request carries the whole history, every turn.
pub fn encode_request_bytes(request: &PromptRequest<'_>) -> Result<Vec<u8>, EncodeError> {
    encode_request_reusing(request, 0, &mut EncodedHistory::default())
}

/// [`encode_request_bytes`], reusing the JSON of the messages an earlier
/// request from the same history sent (`history` and `edits` as
/// [`EncodedHistory`] says): the same bytes, with only the messages added
/// since encoded.
pub fn encode_request_reusing(
    request: &PromptRequest<'_>,
    edits: u64,
    history: &mut EncodedHistory,
) -> Result<Vec<u8>, EncodeError> {
    // The system prompt comes first, as a message.
    let mut leading = Vec::new();
    if let Some(system) = request.system.filter(|system| !system.is_empty()) {
        encoded::element(&WireMessage::System { content: system }, &mut leading)?;
    }
    let elements = history.update(
        ToolsWire::OpenAi,
        edits,
        request.messages,
        |message, out| {
            let mut wire = Vec::with_capacity(1);
            wire_messages(message, request.images, &mut wire)?;
            for message in &wire {
                encoded::element(message, out)?;
            }
            Ok(())
        },
    )?;
    encoded::body(&Head::of(request), &leading, elements, &Tail::of(request)?)
}

/// The fields of the body before `messages`, and after it (`Tail`): the
/// body is written around the messages' JSON ([`encode_request_reusing`]).
#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    stream: bool,
    stream_options: StreamOptions,
}

#[derive(Serialize)]
struct Tail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
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
    Text { text: Cow<'a, str> },
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

impl<'a> Head<'a> {
    /// The output cap is `max_tokens`, or `max_completion_tokens`
    /// ([`max_tokens_field`]).
    fn of(request: &PromptRequest<'a>) -> Head<'a> {
        let completion = max_tokens_field(request.model) == "max_completion_tokens";
        Head {
            model: request.model,
            max_tokens: (!completion).then_some(request.max_tokens),
            max_completion_tokens: completion.then_some(request.max_tokens),
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
        }
    }
}

impl<'a> Tail<'a> {
    /// The `tools` array, encoded once per [`ToolSpecs`](crate::wire::ToolSpecs).
    fn of(request: &PromptRequest<'a>) -> Result<Tail<'a>, EncodeError> {
        let tools = request.tools.encoded(ToolsWire::OpenAi, |specs| {
            let tools: Vec<WireTool> = specs
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
            serde_json::value::to_raw_value(&tools)
        })?;
        Ok(Tail { tools })
    }
}

/// The wire messages of one of keel's: a user message's tool results and
/// then the rest of it ([`encode_user`]), or the assistant's message.
fn wire_messages<'a>(
    message: &'a Message,
    images: &'a BTreeMap<String, ImageData>,
    out: &mut Vec<WireMessage<'a>>,
) -> Result<(), EncodeError> {
    match message.role {
        Role::User => encode_user(message, images, out),
        Role::Assistant => {
            out.push(encode_assistant(message));
            Ok(())
        }
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
    // A `tool` message holds text only: the images a tool returned follow
    // in the user message after the results, each group introduced by
    // the call it came from.
    let mut result_images = Vec::new();
    for block in &message.content {
        match block {
            ContentBlock::ToolResult { result } => {
                out.push(encode_tool_result(result));
                if !result.images.is_empty() {
                    result_images.push(WirePart::Text {
                        text: Cow::Owned(format!(
                            "The images returned by tool call {}:",
                            result.tool_call_id.as_str()
                        )),
                    });
                    for image in &result.images {
                        result_images.push(image_part(image, images)?);
                    }
                }
            }
            ContentBlock::Text { text } if text.is_empty() => {}
            ContentBlock::Text { text } => parts.push(WirePart::Text {
                text: Cow::Borrowed(text),
            }),
            ContentBlock::Image { image } => parts.push(image_part(image, images)?),
            // Reasoning is never sent back, and a user message holds no tool
            // calls; neither has a place in a `user` message.
            ContentBlock::Thinking { .. } | ContentBlock::ToolUse { .. } => {}
        }
    }
    result_images.append(&mut parts);
    let parts = result_images;
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
                // Without images every text is the message's own.
                WirePart::Text {
                    text: Cow::Borrowed(text),
                } => Some(*text),
                WirePart::Text {
                    text: Cow::Owned(_),
                }
                | WirePart::ImageUrl { .. } => None,
            })
            .collect();
        UserContent::Text(joined(&texts))
    };
    out.push(WireMessage::User { content });
    Ok(())
}

fn image_part<'a>(
    image: &ImageRef,
    images: &BTreeMap<String, ImageData>,
) -> Result<WirePart<'a>, EncodeError> {
    let data = images
        .get(&image.hash)
        .ok_or_else(|| EncodeError::MissingImage {
            hash: image.hash.clone(),
        })?;
    Ok(WirePart::ImageUrl {
        image_url: ImageUrl {
            url: format!("data:{};base64,{}", data.media_type, data.base64),
        },
    })
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

#[cfg(test)]
mod tests {
    use super::*;

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
