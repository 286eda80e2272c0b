//! OpenAI Chat Completions as the mock speaks it (pure rendering).
//!
//! A stream is SSE `data:` lines without event names, each a
//! `chat.completion.chunk`: first a chunk whose delta has the role, then one
//! per text piece (`delta.content`) and per tool call piece
//! (`delta.tool_calls[{index, id, type, function: {name, arguments}}]`, the
//! id, type and name only in a call's first piece), then a chunk with an
//! empty delta and the `finish_reason`. With `stream_options.include_usage`
//! every chunk carries `"usage": null` and one more chunk with empty
//! `choices` carries the usage. `data: [DONE]` ends the stream. Errors, in a
//! stream or as a body, are `{"error":{"message","type","param","code"}}`.

use serde_json::{json, Value};

use super::plan::{Frames, PlannedEvent};
use super::reply::{json_fragments, text_deltas, Answer};
use super::script::{ErrorSpec, Stop};

/// Longest `arguments` piece of a streamed tool call, in characters.
const JSON_PIECE: usize = 12;

/// What every chunk of one response shares.
#[derive(Debug, Clone, Copy)]
pub struct ChunkMeta<'a> {
    pub id: &'a str,
    pub model: &'a str,
    /// Unix seconds, the same in every chunk.
    pub created: u64,
    pub include_usage: bool,
}

fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn finish_reason(answer: &Answer) -> &'static str {
    match answer.stop {
        Some(Stop::MaxTokens) => "length",
        Some(Stop::Refusal) => "content_filter",
        Some(Stop::PauseTurn) | None if answer.tool_calls.is_empty() => "stop",
        Some(Stop::PauseTurn) | None => "tool_calls",
    }
}

fn chunk(meta: ChunkMeta<'_>, delta: Value, finish_reason: Option<&str>) -> Value {
    let mut chunk = json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": "fp_mock",
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    });
    if meta.include_usage {
        chunk["usage"] = Value::Null;
    }
    chunk
}

/// The whole stream for `answer`.
pub fn stream(answer: &Answer, meta: ChunkMeta<'_>) -> Frames {
    let first_delta = if answer.text.is_some() {
        json!({"role": "assistant", "content": "", "refusal": null})
    } else {
        json!({"role": "assistant", "content": null, "refusal": null})
    };
    let mut events = vec![PlannedEvent::event(data(&chunk(meta, first_delta, None)))];
    if let Some(text) = &answer.text {
        for piece in text_deltas(text) {
            events.push(PlannedEvent::delta(data(&chunk(
                meta,
                json!({"content": piece}),
                None,
            ))));
        }
    }
    for (call_idx, call) in answer.tool_calls.iter().enumerate() {
        events.push(PlannedEvent::delta(data(&chunk(
            meta,
            json!({"tool_calls": [{
                "index": call_idx,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]}),
            None,
        ))));
        let arguments = answer.wire_input(call_idx);
        for piece in json_fragments(&arguments, JSON_PIECE) {
            events.push(PlannedEvent::delta(data(&chunk(
                meta,
                json!({"tool_calls": [{"index": call_idx, "function": {"arguments": piece}}]}),
                None,
            ))));
        }
    }

    let closing = events.len();
    events.push(PlannedEvent::event(data(&chunk(
        meta,
        json!({}),
        Some(finish_reason(answer)),
    ))));
    if meta.include_usage {
        events.push(PlannedEvent::event(data(&json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "system_fingerprint": "fp_mock",
            "choices": [],
            "usage": usage(answer),
        }))));
    }
    events.push(done());
    Frames { events, closing }
}

fn done() -> PlannedEvent {
    PlannedEvent::event("data: [DONE]\n\n".to_owned())
}

fn usage(answer: &Answer) -> Value {
    json!({
        "prompt_tokens": answer.usage.input_tokens,
        "completion_tokens": answer.usage.output_tokens,
        "total_tokens": answer.usage.input_tokens + answer.usage.output_tokens,
    })
}

/// The non-streamed answer: one `chat.completion` object.
pub fn completion(answer: &Answer, meta: ChunkMeta<'_>) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": answer.text,
        "refusal": null,
    });
    if !answer.tool_calls.is_empty() {
        message["tool_calls"] = answer
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.input.to_string()},
                })
            })
            .collect();
    }
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": "fp_mock",
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(answer),
        }],
        "usage": usage(answer),
    })
}

/// An error chunk, then `[DONE]`, as OpenAI ends a stream that failed.
pub fn error_frames(error: &ErrorSpec) -> Vec<PlannedEvent> {
    vec![
        PlannedEvent::event(data(&error_response_body(error))),
        done(),
    ]
}

/// A chunk whose data is cut off in the middle of its JSON.
pub fn malformed_frame() -> PlannedEvent {
    PlannedEvent::event(
        "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"unfinis\n\n"
            .to_owned(),
    )
}

/// `error` as a whole body: `{"error": {message, type, param, code}}`.
pub fn error_response_body(error: &ErrorSpec) -> Value {
    json!({
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": null,
            "code": null,
        }
    })
}

/// The body of an error response with `status`, with the type and code
/// OpenAI uses for it.
pub fn error_body(status: u16, message: &str) -> Value {
    let (kind, code) = match status {
        401 => ("invalid_request_error", Some("invalid_api_key")),
        404 => ("invalid_request_error", Some("model_not_found")),
        429 => ("requests", Some("rate_limit_exceeded")),
        500..=599 => ("server_error", None),
        _ => ("invalid_request_error", None),
    };
    json!({
        "error": {
            "message": message,
            "type": kind,
            "param": null,
            "code": code,
        }
    })
}

/// The body of OpenAI's refusal of a prompt longer than the context
/// window (HTTP 400), in its own words.
pub fn too_long_body(prompt_tokens: u64, window: u64) -> Value {
    json!({
        "error": {
            "message": format!(
                "This model's maximum context length is {window} tokens. However, your \
                 messages resulted in {prompt_tokens} tokens. Please reduce the length of the \
                 messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    })
}

/// The status a non-streamed request gets for an error the script meant to
/// send in the stream.
pub fn error_status(error: &ErrorSpec) -> u16 {
    match error.kind.as_str() {
        "invalid_request_error" => 400,
        "requests" | "rate_limit_exceeded" | "rate_limit_error" => 429,
        "overloaded_error" => 503,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_llm::reply::{AnswerCall, Usage};

    fn chunks(frames: &Frames) -> Vec<String> {
        frames
            .events
            .iter()
            .map(|frame| {
                assert!(frame.text.ends_with("\n\n"));
                frame
                    .text
                    .trim_end()
                    .strip_prefix("data: ")
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    fn meta(include_usage: bool) -> ChunkMeta<'static> {
        ChunkMeta {
            id: "chatcmpl-mock-1",
            model: "gpt-test",
            created: 1_700_000_000,
            include_usage,
        }
    }

    #[test]
    fn tool_call_pieces_assemble_and_usage_comes_last_before_done() {
        let answer = Answer {
            text: None,
            tool_calls: vec![AnswerCall {
                id: "call_mock_1".to_owned(),
                name: "bash".to_owned(),
                input: json!({"command": "echo hello from keel"}),
            }],
            usage: Usage {
                input_tokens: 12,
                output_tokens: 5,
            },
            stop: None,
        };
        let frames = stream(&answer, meta(true));
        let chunks = chunks(&frames);
        assert_eq!(chunks.last().unwrap(), "[DONE]");
        let parsed: Vec<Value> = chunks[..chunks.len() - 1]
            .iter()
            .map(|chunk| serde_json::from_str(chunk).unwrap())
            .collect();
        assert_eq!(parsed[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(
            parsed[1]["choices"][0]["delta"]["tool_calls"][0]["id"],
            "call_mock_1"
        );
        let arguments: String = parsed
            .iter()
            .filter_map(|chunk| {
                chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&arguments).unwrap(),
            json!({"command": "echo hello from keel"})
        );
        let finish = &parsed[parsed.len() - 2];
        assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(frames.closing, parsed.len() - 2);
        let usage_chunk = &parsed[parsed.len() - 1];
        assert_eq!(usage_chunk["choices"], json!([]));
        assert_eq!(usage_chunk["usage"]["total_tokens"], 17);
        assert!(parsed[..parsed.len() - 1]
            .iter()
            .all(|chunk| chunk["usage"].is_null() && chunk.get("usage").is_some()));
    }

    #[test]
    fn without_include_usage_there_is_no_usage_chunk() {
        let answer = Answer {
            text: Some("hi there".to_owned()),
            tool_calls: vec![],
            usage: Usage {
                input_tokens: 1,
                output_tokens: 2,
            },
            stop: None,
        };
        let frames = stream(&answer, meta(false));
        let chunks = chunks(&frames);
        assert_eq!(chunks.len(), 1 + 2 + 1 + 1);
        assert!(!chunks[0].contains("usage"));
        assert!(chunks[3].contains("\"finish_reason\":\"stop\""));
    }

    #[test]
    fn error_bodies_have_the_openai_shape() {
        assert_eq!(
            error_body(429, "slow down")["error"]["code"],
            "rate_limit_exceeded"
        );
        let frames = error_frames(&ErrorSpec {
            kind: "server_error".to_owned(),
            message: "boom".to_owned(),
        });
        assert_eq!(frames.len(), 2);
        assert!(frames[0].text.starts_with("data: {\"error\":"));
        assert_eq!(frames[1].text, "data: [DONE]\n\n");
    }
}
