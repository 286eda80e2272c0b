//! The Anthropic Messages API as the mock speaks it (pure rendering).
//!
//! A stream is `message_start`; per content block `content_block_start`,
//! `content_block_delta`s (`text_delta`, or `input_json_delta` whose
//! `partial_json` pieces join to the tool input, the first piece empty) and
//! `content_block_stop`; then `message_delta` (stop reason, output tokens)
//! and `message_stop`. One `ping` follows the first `content_block_start`,
//! as in Anthropic's own example. Each event has an `event:` line naming its
//! type and a `data:` line with the JSON. Errors, in a stream or as a body,
//! are `{"type":"error","error":{"type":..,"message":..}}`.

use serde_json::{json, Value};

use super::plan::{Frames, PlannedEvent};
use super::reply::{json_fragments, text_deltas, Answer};
use super::script::{ErrorSpec, Stop};

/// Longest `partial_json` piece of a streamed tool input, in characters.
const JSON_PIECE: usize = 12;

fn sse(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn stop_reason(answer: &Answer) -> &'static str {
    match answer.stop {
        Some(Stop::MaxTokens) => "max_tokens",
        Some(Stop::PauseTurn) => "pause_turn",
        Some(Stop::Refusal) => "refusal",
        None if answer.tool_calls.is_empty() => "end_turn",
        None => "tool_use",
    }
}

/// The whole stream for `answer`, as message `message_id` of `model`.
pub fn stream(answer: &Answer, message_id: &str, model: &str) -> Frames {
    let mut events = vec![PlannedEvent::event(sse(
        "message_start",
        &json!({
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "input_tokens": answer.usage.input_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 1,
                },
            },
        }),
    ))];
    let ping = PlannedEvent::event(sse("ping", &json!({"type": "ping"})));
    let mut block_idx = 0;
    let mut last_block_stop = None;

    if let Some(text) = &answer.text {
        events.push(PlannedEvent::event(sse(
            "content_block_start",
            &json!({
                "type": "content_block_start",
                "index": block_idx,
                "content_block": {"type": "text", "text": ""},
            }),
        )));
        events.push(ping.clone());
        for piece in text_deltas(text) {
            events.push(PlannedEvent::delta(sse(
                "content_block_delta",
                &json!({
                    "type": "content_block_delta",
                    "index": block_idx,
                    "delta": {"type": "text_delta", "text": piece},
                }),
            )));
        }
        last_block_stop = Some(events.len());
        events.push(block_stop(block_idx));
        block_idx += 1;
    }
    for (call_idx, call) in answer.tool_calls.iter().enumerate() {
        events.push(PlannedEvent::event(sse(
            "content_block_start",
            &json!({
                "type": "content_block_start",
                "index": block_idx,
                "content_block": {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": {},
                },
            }),
        )));
        if block_idx == 0 {
            events.push(ping.clone());
        }
        let input = answer.wire_input(call_idx);
        let pieces = std::iter::once("").chain(json_fragments(&input, JSON_PIECE));
        for piece in pieces {
            events.push(PlannedEvent::delta(sse(
                "content_block_delta",
                &json!({
                    "type": "content_block_delta",
                    "index": block_idx,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }),
            )));
        }
        last_block_stop = Some(events.len());
        events.push(block_stop(block_idx));
        block_idx += 1;
    }
    if block_idx == 0 {
        events.push(ping);
    }

    let message_delta = events.len();
    events.push(PlannedEvent::event(sse(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(answer), "stop_sequence": null},
            "usage": {"output_tokens": answer.usage.output_tokens},
        }),
    )));
    events.push(PlannedEvent::event(sse(
        "message_stop",
        &json!({"type": "message_stop"}),
    )));
    Frames {
        events,
        closing: last_block_stop.unwrap_or(message_delta),
    }
}

fn block_stop(block_idx: usize) -> PlannedEvent {
    PlannedEvent::event(sse(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": block_idx}),
    ))
}

/// The non-streamed answer: one `message` object.
pub fn message(answer: &Answer, message_id: &str, model: &str) -> Value {
    let mut content = Vec::new();
    if let Some(text) = &answer.text {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in &answer.tool_calls {
        content.push(json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": call.input,
        }));
    }
    json!({
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(answer),
        "stop_sequence": null,
        "usage": {
            "input_tokens": answer.usage.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": answer.usage.output_tokens,
        },
    })
}

/// The `error` event that ends a stream early.
pub fn error_frames(error: &ErrorSpec) -> Vec<PlannedEvent> {
    vec![PlannedEvent::event(sse("error", &error_object(error)))]
}

fn error_object(error: &ErrorSpec) -> Value {
    json!({
        "type": "error",
        "error": {"type": error.kind, "message": error.message},
    })
}

/// A frame whose data is cut off in the middle of its JSON.
pub fn malformed_frame() -> PlannedEvent {
    PlannedEvent::event(
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"unfinis\n\n"
            .to_owned(),
    )
}

/// The error type Anthropic documents for `status`.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The body of an error response with `status`.
pub fn error_body(status: u16, message: &str) -> Value {
    error_object(&ErrorSpec {
        kind: error_type(status).to_owned(),
        message: message.to_owned(),
    })
}

/// The body of Anthropic's refusal of a prompt longer than the context
/// window (HTTP 400), in its own words.
pub fn too_long_body(prompt_tokens: u64, window: u64) -> Value {
    error_body(
        400,
        &format!("prompt is too long: {prompt_tokens} tokens > {window} maximum"),
    )
}

/// The status a non-streamed request gets for an error the script meant to
/// send in the stream.
pub fn error_status(error: &ErrorSpec) -> u16 {
    match error.kind.as_str() {
        "overloaded_error" => 529,
        "rate_limit_error" => 429,
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "timeout_error" => 504,
        _ => 500,
    }
}

/// `error` as a whole response body.
pub fn error_response_body(error: &ErrorSpec) -> Value {
    error_object(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_llm::reply::{AnswerCall, Usage};

    fn event_names(frames: &Frames) -> Vec<String> {
        frames
            .events
            .iter()
            .map(|frame| {
                let (first, _) = frame.text.split_once('\n').unwrap();
                first.strip_prefix("event: ").unwrap().to_owned()
            })
            .collect()
    }

    fn data(frame: &PlannedEvent) -> Value {
        let line = frame.text.lines().nth(1).unwrap();
        serde_json::from_str(line.strip_prefix("data: ").unwrap()).unwrap()
    }

    #[test]
    fn a_text_and_tool_answer_streams_in_the_documented_order() {
        let answer = Answer {
            text: Some("Let me look".to_owned()),
            tool_calls: vec![AnswerCall {
                id: "toolu_mock_1".to_owned(),
                name: "bash".to_owned(),
                input: json!({"command": "ls -la /tmp"}),
            }],
            usage: Usage {
                input_tokens: 10,
                output_tokens: 7,
            },
            stop: None,
        };
        let frames = stream(&answer, "msg_mock_1", "claude-test");
        let names = event_names(&frames);
        let expected_start = [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
        ];
        assert_eq!(names[..expected_start.len()], expected_start);
        assert_eq!(
            names[names.len() - 3..],
            ["content_block_stop", "message_delta", "message_stop"]
        );
        assert_eq!(names[frames.closing], "content_block_stop");
        assert_eq!(data(&frames.events[frames.closing])["index"], 1);

        let partial: String = frames
            .events
            .iter()
            .map(data)
            .filter(|event| event["delta"]["type"] == "input_json_delta")
            .map(|event| event["delta"]["partial_json"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&partial).unwrap(),
            json!({"command": "ls -la /tmp"})
        );
        let message_delta = data(&frames.events[names.len() - 2]);
        assert_eq!(message_delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(message_delta["usage"]["output_tokens"], 7);
        assert!(frames
            .events
            .iter()
            .all(|frame| frame.text.ends_with("\n\n")));
    }

    #[test]
    fn an_empty_answer_still_pings_and_closes_after_message_start() {
        let answer = Answer {
            text: None,
            tool_calls: vec![],
            usage: Usage {
                input_tokens: 1,
                output_tokens: 1,
            },
            stop: None,
        };
        let frames = stream(&answer, "msg", "m");
        assert_eq!(
            event_names(&frames),
            ["message_start", "ping", "message_delta", "message_stop"]
        );
        assert_eq!(frames.closing, 2);
    }

    #[test]
    fn error_types_follow_the_documented_statuses() {
        assert_eq!(error_type(400), "invalid_request_error");
        assert_eq!(error_type(429), "rate_limit_error");
        assert_eq!(error_type(529), "overloaded_error");
        assert_eq!(error_type(503), "api_error");
        assert_eq!(
            error_body(401, "bad key"),
            json!({"type": "error", "error": {"type": "authentication_error", "message": "bad key"}})
        );
        let malformed = malformed_frame();
        let line = malformed.text.lines().nth(1).unwrap();
        assert!(serde_json::from_str::<Value>(line.strip_prefix("data: ").unwrap()).is_err());
    }
}
