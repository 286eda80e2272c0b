//! Reading the stream: each `chat.completion.chunk` fed to the [`Decoder`]
//! (text, reasoning, refusals, the finish reason, usage, `[DONE]`), and the
//! finished response with its stop reason.
//!
//! This is the [`StreamDecoder`] the shell drives; it hands tool-call
//! fragments to `calls.rs`, a chunk that is an error to `error.rs` and the
//! usage to `usage.rs`, so what is left here is the order of the response's
//! parts and the liberal reading of how the servers end a stream.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::calls::parse_fragment;
use super::error::{error_of, retryable, stream_failure};
use super::usage::parse_usage;
use super::{Decoder, Part};
use crate::config::ProviderKind;
use crate::input::{AssistantResponse, LlmFailure};
use crate::live::StreamDelta;
use crate::message::{AssistantBlock, StopReason};
use crate::wire::{SseEvent, StreamDecoder};

impl Decoder {
    fn fail(&mut self, failure: LlmFailure) -> Result<Vec<StreamDelta>, LlmFailure> {
        self.failure = Some(failure.clone());
        Err(failure)
    }

    /// What a chunk says beside its choices: the model, the response's id
    /// and creation time, and the usage so far.
    fn note_metadata(
        &mut self,
        model: Option<&str>,
        id: Option<&str>,
        created: Option<u64>,
        usage: Option<&Value>,
    ) {
        if let Some(model) = model.filter(|model| !model.is_empty()) {
            self.model = Some(model.to_owned());
        }
        if self.response_id.is_none() {
            self.response_id = id.filter(|id| !id.is_empty()).map(str::to_owned);
        }
        if self.created.is_none() {
            self.created = created;
        }
        if let Some(usage) = usage.filter(|usage| usage.is_object()) {
            self.usage = Some(parse_usage(usage));
        }
    }

    /// One choice of a chunk; keel asks for one choice, so any other index
    /// is not its answer.
    fn apply_choice(
        &mut self,
        index: Option<u64>,
        delta: Option<Delta<'_>>,
        finish_reason: Option<&str>,
        out: &mut Vec<StreamDelta>,
    ) {
        if index.unwrap_or(0) != 0 {
            return;
        }
        if let Some(delta) = delta {
            self.apply_delta(delta, out);
        }
        if let Some(reason) = finish_reason {
            self.finish_reason = Some(reason.to_owned());
        }
    }

    fn apply_delta(&mut self, delta: Delta<'_>, out: &mut Vec<StreamDelta>) {
        if let Some(text) = delta.reasoning.filter(|text| !text.is_empty()) {
            self.push_thinking(text, out);
        }
        match delta.content {
            Content::Text(text) => self.push_text(text, out),
            // A few servers (Mistral) send content as typed parts.
            Content::Parts(parts) => {
                for part in parts {
                    if part.get("type").and_then(Value::as_str) == Some("text") {
                        if let Some(text) = part.get("text").and_then(Value::as_str) {
                            self.push_text(text, out);
                        }
                    }
                }
            }
            Content::None => {}
        }
        if let Some(refusal) = delta.refusal.filter(|refusal| !refusal.is_empty()) {
            self.refused = true;
            self.push_text(refusal, out);
        }
        for fragment in delta.tool_calls {
            self.apply_fragment(parse_fragment(fragment), out);
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

    /// A chunk read as a `Value`: any shape a server may send.
    fn feed_value(&mut self, event: &str, data: &str) -> Result<Vec<StreamDelta>, LlmFailure> {
        let chunk: Value = match serde_json::from_str(data) {
            Ok(chunk @ Value::Object(_)) => chunk,
            Ok(_) => return self.fail(retryable("malformed stream chunk: not a JSON object")),
            Err(error) => return self.fail(retryable(format!("malformed stream chunk: {error}"))),
        };
        if let Some(error) = error_of(&chunk, event) {
            return self.fail(stream_failure(&error));
        }

        self.note_metadata(
            chunk.get("model").and_then(Value::as_str),
            chunk.get("id").and_then(Value::as_str),
            chunk.get("created").and_then(Value::as_u64),
            chunk.get("usage"),
        );
        let mut out = Vec::new();
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            self.apply_choice(
                choice.get("index").and_then(Value::as_u64),
                choice.get("delta").map(Delta::of_value),
                choice.get("finish_reason").and_then(Value::as_str),
                &mut out,
            );
        }
        Ok(out)
    }

    /// A chunk of the plain shape, read as [`Decoder::feed_value`] would
    /// read it.
    fn apply_plain(&mut self, chunk: PlainChunk<'_>) -> Vec<StreamDelta> {
        self.note_metadata(
            chunk.model.as_deref(),
            chunk.id.as_deref(),
            chunk.created,
            chunk.usage.as_ref(),
        );
        let mut out = Vec::new();
        for choice in chunk.choices.iter().flatten() {
            self.apply_choice(
                choice.index,
                choice.delta.as_ref().map(PlainDelta::parts),
                choice.finish_reason.as_deref(),
                &mut out,
            );
        }
        out
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
}

/// What keel reads of a choice's `delta`, from either reading of a chunk.
struct Delta<'a> {
    /// DeepSeek, SGLang and llama.cpp say `reasoning_content`; vLLM,
    /// Ollama and OpenRouter say `reasoning`. A server in transition may
    /// send both with the same text, so only the first is taken.
    reasoning: Option<&'a str>,
    content: Content<'a>,
    refusal: Option<&'a str>,
    tool_calls: &'a [Value],
}

enum Content<'a> {
    None,
    Text(&'a str),
    /// Typed parts (Mistral); only those of type `text` are text.
    Parts(&'a [Value]),
}

impl<'a> Delta<'a> {
    fn of_value(delta: &'a Value) -> Delta<'a> {
        let text = |key: &str| delta.get(key).and_then(Value::as_str);
        Delta {
            reasoning: text("reasoning_content").or_else(|| text("reasoning")),
            content: match delta.get("content") {
                Some(Value::String(text)) => Content::Text(text),
                Some(Value::Array(parts)) => Content::Parts(parts),
                _ => Content::None,
            },
            refusal: text("refusal"),
            tool_calls: delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .map_or(&[], Vec::as_slice),
        }
    }
}

/// A chunk whose every field keel reads has the type it expects: the
/// common case, read straight from the text. A field of another type (say
/// `content` as a list of parts) fails this reading, and the chunk is read
/// as a `Value` instead. Strings borrow from the chunk unless escaped.
#[derive(Deserialize)]
struct PlainChunk<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    /// Present and not `null`: an error, read as a `Value`.
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(borrow, default)]
    choices: Option<Vec<PlainChoice<'a>>>,
}

impl PlainChunk<'_> {
    /// Not an error of any kind `error_of` knows.
    fn is_plain(&self) -> bool {
        self.error.is_none() && self.object.as_deref() != Some("error")
    }
}

#[derive(Deserialize)]
struct PlainChoice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<PlainDelta<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PlainDelta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Value>,
}

impl PlainDelta<'_> {
    fn parts(&self) -> Delta<'_> {
        Delta {
            reasoning: self
                .reasoning_content
                .as_deref()
                .or(self.reasoning.as_deref()),
            content: self.content.as_deref().map_or(Content::None, Content::Text),
            refusal: self.refusal.as_deref(),
            tool_calls: match &self.tool_calls {
                Some(Value::Array(fragments)) => fragments,
                _ => &[],
            },
        }
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
        // Most chunks have the plain shape: read them without building a
        // `Value` (a map and a string per key). Anything else, an error
        // among them, is read as a `Value`, with the same outcome.
        if event.event != "error" && data.starts_with('{') {
            if let Ok(chunk) = serde_json::from_str::<PlainChunk<'_>>(data) {
                if chunk.is_plain() {
                    return Ok(self.apply_plain(chunk));
                }
            }
        }
        self.feed_value(event.event, data)
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::wire::openai::testing::{done, feed_all, finish_chunk, tool_chunk};

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

    /// Whatever shape a chunk has, reading it on the plain path (when it
    /// fits) gives what reading it as a `Value` gives: the same deltas, the
    /// same failure, the same response.
    #[test]
    fn the_plain_reading_agrees_with_the_value_reading() {
        let streams: Vec<Vec<&str>> = vec![
            vec![
                r#"{"id":"c1","model":"m2","created":7,"choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":null}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"Hé \"quoted\" \u00e9"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":"","reasoning":"thinks"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":null,"reasoning":"more"}}]}"#,
                r#"{"choices":[{"index":1,"delta":{"content":"other choice"}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"t1","function":{"name":"bash","arguments":"{\"command\":"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"ls\"}"}}]},"finish_reason":"tool_calls"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#,
                "[DONE]",
            ],
            vec![
                r#"{"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"parts"}]}}]}"#,
                r#"{"choices":[{"index":"0","delta":{"content":"index as text"}}]}"#,
                r#"{"choices":{"index":0},"model":5,"created":-1}"#,
                r#"{"choices":[{"index":0,"delta":"not an object","finish_reason":3}]}"#,
                r#"{"choices":[{"index":0,"delta":{"refusal":"no","tool_calls":{"index":0}}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"a"}}],"choices":[{"index":0,"delta":{"content":"b"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null,"error":null}"#,
            ],
            vec![r#"[null, null, 5]"#],
            vec![
                r#"{"choices":[{"index":0,"delta":{"content":"x"}}]}"#,
                r#"{"error":{"message":"overloaded","type":"overloaded_error"}}"#,
            ],
            vec![r#"{"object":"error","message":"bad"}"#],
            vec![r#"{"error":"plain text error"}"#],
            vec![r#"{"choices":[{"index":0,"delta":{"content":"cut"}}]}"#],
        ];
        // The first stream is all of the plain shape: it is read that way.
        for data in streams[0].iter().filter(|data| **data != "[DONE]") {
            let chunk = serde_json::from_str::<PlainChunk<'_>>(data);
            assert!(chunk.is_ok_and(|chunk| chunk.is_plain()), "{data}");
        }
        for stream in streams {
            let mut plain = Decoder::new("m");
            let mut valued = Decoder::new("m");
            for data in &stream {
                let fed = plain.feed(SseEvent { event: "", data });
                let read = if *data == "[DONE]" {
                    valued.feed(SseEvent { event: "", data })
                } else {
                    valued.feed_value("", data)
                };
                assert_eq!(fed, read, "{data}");
            }
            let plain = Box::new(plain).finish();
            let valued = Box::new(valued).finish();
            assert_eq!(format!("{plain:?}"), format!("{valued:?}"), "{stream:?}");
        }
    }
}
