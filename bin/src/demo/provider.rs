//! The scripted model that answers the demo's `StartStream` effects: the
//! rules of keel's future fake provider, as a pure function of the prompt.
//!
//! - The last user message holds tool results: a short text summary of them.
//! - Its text is `run: CMD`: one `bash` tool call for CMD.
//! - Anything else: the user's text, echoed.
//!
//! A reply is the deltas a streaming provider would send, then the complete
//! response, so the shell can deliver them one at a time (and cancel midway).

use keel_actors::core::message::{
    AssistantBlock, ContentBlock, Message, Role, StopReason, ToolCall, ToolResult, Usage,
};
use keel_actors::core::{AssistantResponse, Generation, ModelRef, StreamDelta, ToolCallId};
use serde_json::json;

/// The one tool the scripted model calls, and the demo runs.
pub const BASH: &str = "bash";

/// What the provider streams for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub deltas: Vec<StreamDelta>,
    pub response: AssistantResponse,
}

/// The scripted model's decision, before it is dressed as a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Text(String),
    Bash { command: String },
}

/// Answer the prompt `messages`, as request `generation` to `model`.
pub fn reply(messages: &[Message], generation: Generation, model: &ModelRef) -> Reply {
    let (deltas, blocks, stop_reason) = match answer(messages) {
        Answer::Text(text) => (
            chunks(&text)
                .into_iter()
                .map(|piece| StreamDelta::Text {
                    text: piece.to_owned(),
                })
                .collect(),
            vec![AssistantBlock::Text { text }],
            StopReason::EndTurn,
        ),
        Answer::Bash { command } => {
            // Unique per request, so a re-sent request never reuses a call id.
            let id = ToolCallId::new(format!("call-{}-{}", generation.turn, generation.attempt));
            let input = json!({ "command": command });
            (
                vec![
                    StreamDelta::ToolUseStarted {
                        id: id.clone(),
                        name: BASH.to_owned(),
                    },
                    StreamDelta::ToolInput {
                        id: id.clone(),
                        partial_json: input.to_string(),
                    },
                ],
                vec![AssistantBlock::ToolUse {
                    call: ToolCall {
                        id,
                        name: BASH.to_owned(),
                        input,
                    },
                }],
                StopReason::ToolUse,
            )
        }
    };
    let usage = Usage {
        input_tokens: messages.iter().map(message_words).sum(),
        output_tokens: blocks.iter().map(block_words).sum(),
        ..Usage::default()
    };
    Reply {
        deltas,
        response: AssistantResponse {
            blocks,
            stop_reason,
            usage,
            provider: model.provider,
            model: model.model.clone(),
        },
    }
}

fn answer(messages: &[Message]) -> Answer {
    let Some(last) = messages.last().filter(|message| message.role == Role::User) else {
        return Answer::Text("There is no question to answer.".to_owned());
    };
    let results: Vec<&ToolResult> = last
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolResult { result } => Some(result),
            ContentBlock::Text { .. }
            | ContentBlock::Thinking { .. }
            | ContentBlock::Image { .. }
            | ContentBlock::ToolUse { .. } => None,
        })
        .collect();
    if !results.is_empty() {
        let summaries: Vec<String> = results.into_iter().map(summarize).collect();
        return Answer::Text(summaries.join("\n"));
    }
    let text: Vec<&str> = last
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.as_str()),
            ContentBlock::Thinking { .. }
            | ContentBlock::Image { .. }
            | ContentBlock::ToolUse { .. }
            | ContentBlock::ToolResult { .. } => None,
        })
        .collect();
    let text = text.join("\n");
    let command = text.trim().strip_prefix("run:").map(str::trim);
    if let Some(command) = command.filter(|command| !command.is_empty()) {
        return Answer::Bash {
            command: command.to_owned(),
        };
    }
    if text.trim().is_empty() {
        return Answer::Text("I see no text to echo.".to_owned());
    }
    Answer::Text(text)
}

fn summarize(result: &ToolResult) -> String {
    let output = result.content.trim();
    match (result.is_error, output.is_empty()) {
        (false, true) => "The command succeeded and printed nothing.".to_owned(),
        (false, false) => format!("The command printed: {output}"),
        (true, true) => "The command failed without a message.".to_owned(),
        (true, false) => format!("The command failed: {output}"),
    }
}

/// Split text into word-sized pieces the way a stream delivers it: each piece
/// after the first starts with its space, and the pieces join to the text.
pub fn chunks(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (idx, _) in text.match_indices(' ') {
        if idx > start {
            pieces.push(&text[start..idx]);
            start = idx;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// A stand-in for token counts: the scripted model has no tokenizer.
fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

fn message_words(message: &Message) -> u64 {
    message
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text { text } | ContentBlock::Thinking { text, .. } => words(text),
            ContentBlock::ToolUse { call } => words(&call.input.to_string()),
            ContentBlock::ToolResult { result } => words(&result.content),
            ContentBlock::Image { .. } => 0,
        })
        .sum()
}

fn block_words(block: &AssistantBlock) -> u64 {
    match block {
        AssistantBlock::Text { text } | AssistantBlock::Thinking { text, .. } => words(text),
        AssistantBlock::ToolUse { call } => words(&call.input.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_actors::core::ProviderKind;

    fn user(content: Vec<ContentBlock>) -> Message {
        Message {
            role: Role::User,
            content,
        }
    }

    fn text(text: &str) -> ContentBlock {
        ContentBlock::Text {
            text: text.to_owned(),
        }
    }

    fn mock() -> ModelRef {
        ModelRef {
            provider: ProviderKind::Mock,
            model: "mock".to_owned(),
        }
    }

    const GEN: Generation = Generation {
        turn: 2,
        attempt: 3,
    };

    #[test]
    fn plain_text_is_echoed_in_word_sized_deltas() {
        let reply = reply(&[user(vec![text("hello there")])], GEN, &mock());
        assert_eq!(
            reply.deltas,
            vec![
                StreamDelta::Text {
                    text: "hello".to_owned()
                },
                StreamDelta::Text {
                    text: " there".to_owned()
                },
            ]
        );
        assert_eq!(
            reply.response.blocks,
            vec![AssistantBlock::Text {
                text: "hello there".to_owned()
            }]
        );
        assert_eq!(reply.response.stop_reason, StopReason::EndTurn);
        assert_eq!(reply.response.usage.input_tokens, 2);
        assert_eq!(reply.response.provider, ProviderKind::Mock);
    }

    #[test]
    fn run_prefix_becomes_one_bash_call_named_after_the_request() {
        let reply = reply(&[user(vec![text("run:  ls -la ")])], GEN, &mock());
        let [AssistantBlock::ToolUse { call }] = reply.response.blocks.as_slice() else {
            panic!("expected one tool_use, got {:?}", reply.response.blocks);
        };
        assert_eq!(call.id.as_str(), "call-2-3");
        assert_eq!(call.name, BASH);
        assert_eq!(call.input, json!({ "command": "ls -la" }));
        assert_eq!(reply.response.stop_reason, StopReason::ToolUse);
        assert_eq!(reply.deltas.len(), 2);
    }

    #[test]
    fn a_bare_run_prefix_is_just_text() {
        assert_eq!(
            answer(&[user(vec![text("run:")])]),
            Answer::Text("run:".to_owned())
        );
    }

    #[test]
    fn tool_results_are_summarized() {
        let result = |content: &str, is_error| ContentBlock::ToolResult {
            result: ToolResult {
                tool_call_id: ToolCallId::new("call-1-1"),
                content: content.to_owned(),
                is_error,
            },
        };
        assert_eq!(
            answer(&[user(vec![result("hi\n", false)])]),
            Answer::Text("The command printed: hi".to_owned())
        );
        assert_eq!(
            answer(&[user(vec![result("boom\n[exit code 2]", true)])]),
            Answer::Text("The command failed: boom\n[exit code 2]".to_owned())
        );
        assert_eq!(
            answer(&[user(vec![result("", false)])]),
            Answer::Text("The command succeeded and printed nothing.".to_owned())
        );
    }

    #[test]
    fn a_prompt_not_ending_with_the_user_gets_a_polite_text() {
        assert!(matches!(answer(&[]), Answer::Text(_)));
        assert!(matches!(
            answer(&[user(vec![ContentBlock::Image {
                image: keel_actors::core::message::ImageRef {
                    hash: "00".to_owned(),
                    media_type: "image/png".to_owned(),
                    width: 1,
                    height: 1,
                    size: 1,
                },
            }])]),
            Answer::Text(text) if text == "I see no text to echo."
        ));
    }

    #[test]
    fn chunks_join_back_to_the_text() {
        for text in [
            "",
            "one",
            "hello from keel",
            "a  b",
            " lead",
            "trail ",
            "é ü",
        ] {
            assert_eq!(chunks(text).concat(), text, "{text:?}");
        }
        assert_eq!(chunks("count slowly to"), vec!["count", " slowly", " to"]);
    }
}
