//! Tool calls, assembled from the `tool_calls[]` fragments of the deltas
//! and finished into keel's [`ToolCall`]s when the stream ends.
//!
//! This is where the compatible servers differ most, so it has a file of
//! its own: fragments are matched to calls by `index`, except that Ollama
//! numbers every call of a parallel batch 0 and LM Studio sends a fresh id
//! with every fragment of one call; names may be resent, ids may be
//! integers or missing, and arguments may come as an object, as JSON in a
//! string, or as JSON in a string in a string.

use serde_json::{json, Value};

use super::error::retryable;
use super::{Decoder, Part};
use crate::ids::ToolCallId;
use crate::input::LlmFailure;
use crate::live::StreamDelta;
use crate::message::ToolCall;

/// A tool call being assembled from its fragments.
#[derive(Debug, Default)]
pub(super) struct PendingCall {
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
pub(super) struct Fragment {
    index: u64,
    id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
}

impl Decoder {
    pub(super) fn apply_fragment(&mut self, fragment: Fragment, out: &mut Vec<StreamDelta>) {
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

    pub(super) fn finish_call(
        &self,
        call: &PendingCall,
        position: usize,
    ) -> Result<ToolCall, LlmFailure> {
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

pub(super) fn parse_fragment(fragment: &Value) -> Fragment {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::StreamDelta;
    use crate::message::StopReason;
    use crate::wire::openai::testing::{calls, done, feed_all, finish_chunk, tool_chunk};
    use crate::wire::StreamDecoder;

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
}
