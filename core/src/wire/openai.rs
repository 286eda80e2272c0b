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
//!
//! The format is split by concern. `request.rs` builds the body. The
//! [`Decoder`] is declared here and its work is spread by what it reads:
//! `stream.rs` the chunks and the finished response, `calls.rs` the tool
//! calls, `call_ids.rs` the ids of calls sent without one, `error.rs` a
//! chunk that reports an error and `usage.rs` the token counts. Only this
//! module and `request.rs` are seen from outside (`encode_request`,
//! `encode_request_bytes`, `Decoder`).

mod call_ids;
mod calls;
mod error;
mod request;
mod stream;
mod usage;

pub use request::{encode_request, encode_request_bytes, encode_request_reusing};

use std::collections::BTreeMap;

use calls::PendingCall;

use crate::input::LlmFailure;
use crate::message::Usage;

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
}

/// Chunks and readings shared by the decoder's unit tests.
#[cfg(test)]
mod testing {
    use serde_json::{json, Value};

    use super::Decoder;
    use crate::input::AssistantResponse;
    use crate::live::StreamDelta;
    use crate::message::AssistantBlock;
    use crate::wire::{SseEvent, StreamDecoder};

    pub(super) fn feed_all(decoder: &mut Decoder, chunks: &[Value]) -> Vec<StreamDelta> {
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

    pub(super) fn done(decoder: &mut Decoder) {
        decoder
            .feed(SseEvent {
                event: "",
                data: "[DONE]",
            })
            .unwrap();
    }

    pub(super) fn tool_chunk(fragments: Value) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{ "index": 0, "delta": { "tool_calls": fragments }, "finish_reason": null }],
        })
    }

    pub(super) fn finish_chunk(reason: &str) -> Value {
        json!({ "choices": [{ "index": 0, "delta": {}, "finish_reason": reason }] })
    }

    pub(super) fn calls(response: &AssistantResponse) -> Vec<(String, String, Value)> {
        response
            .blocks
            .iter()
            .filter_map(AssistantBlock::tool_call)
            .map(|call| (call.id.to_string(), call.name.clone(), call.input.clone()))
            .collect()
    }
}
