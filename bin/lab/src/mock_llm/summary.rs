//! Summary requests: when keel compacts a conversation it asks the model,
//! in a request of its own, to summarise the older part. That request's
//! system prompt starts with `[keel:summary]` (keel-core's
//! `compaction::SUMMARY_MARKER`), it offers no tools, and its one user
//! message holds the older part as a transcript (`User: …`, `Assistant:
//! …`, `Assistant called the tool …`, `Tool result: …`, one paragraph
//! each).
//!
//! The fake answers one with a short summary made from the transcript, the
//! same for the same transcript, so compaction runs with no key and a test
//! can find the summary again in the prompts that follow. A summary
//! request is not a turn of the conversation: script entries are for turns
//! unless they say `"summary": true` (see `script`), so a compaction never
//! shifts the replies a script planned for the turns after it.
//!
//! Pure: the request in, a yes or no and a text out.

use serde_json::Value;

use super::script::WireApi;

/// What a summary request's system prompt starts with: keel-core's
/// `compaction::SUMMARY_MARKER`, written out because the lab speaks to
/// keel only over the wire, as a real provider does (a test holds the two
/// together).
pub const MARKER: &str = "[keel:summary]";

/// How every summary the fake writes begins.
pub const OPENING: &str = "Summary of the earlier conversation";

/// How many of the transcript's user lines the summary mentions, and how
/// many words of each.
const MENTIONS: usize = 3;
const WORDS_PER_MENTION: usize = 5;
/// The most bytes a summary has: well under 100 tokens.
const MAX_BYTES: usize = 280;

/// How keel's transcript starts each paragraph (`compaction::transcript`).
const SPEAKERS: &[&str] = &[
    "User: ",
    "Assistant: ",
    "Assistant called the tool ",
    "Tool result",
];

/// Whether `request` is a summary request: on Anthropic its top-level
/// `system` (a string, or the first of its text blocks), on OpenAI its
/// first `system` (or `developer`) message, starts with [`MARKER`].
pub fn is_summary_request(endpoint: WireApi, request: &Value) -> bool {
    let system = match endpoint {
        WireApi::Anthropic => first_text(&request["system"]),
        WireApi::Openai => request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|message| matches!(message["role"].as_str(), Some("system" | "developer")))
            .and_then(|message| first_text(&message["content"])),
    };
    system.is_some_and(|system| system.trim_start().starts_with(MARKER))
}

/// A content value's first text: the string itself, or its first text part.
fn first_text(content: &Value) -> Option<&str> {
    match content {
        Value::String(text) => Some(text),
        Value::Array(parts) => parts
            .iter()
            .find(|part| part["type"] == "text")
            .and_then(|part| part["text"].as_str()),
        _ => None,
    }
}

/// The summary of the transcript in `request`'s user messages: how many
/// paragraphs it has and how many are the user's, and the first words of
/// the user's first few, e.g. `Summary of the earlier conversation (4
/// transcript lines, 2 from the user). The user mentioned: list the files
/// in the…; now count them.`
pub fn summary(request: &Value) -> String {
    let mut n_lines = 0usize;
    let mut n_user = 0usize;
    let mut mentions = Vec::new();
    for text in user_texts(request) {
        for line in text.lines() {
            if !SPEAKERS.iter().any(|speaker| line.starts_with(speaker)) {
                continue;
            }
            n_lines += 1;
            if let Some(said) = line.strip_prefix("User: ") {
                n_user += 1;
                if mentions.len() < MENTIONS {
                    mentions.push(first_words(said));
                }
            }
        }
    }
    let mut summary = format!("{OPENING} ({n_lines} transcript lines, {n_user} from the user).");
    if !mentions.is_empty() {
        summary.push_str(" The user mentioned: ");
        summary.push_str(&mentions.join("; "));
        summary.push('.');
    }
    clip(summary, MAX_BYTES)
}

/// The texts of the user messages, in either wire format.
fn user_texts(request: &Value) -> impl Iterator<Item = &str> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|message| message["role"] == "user")
        .flat_map(|message| match &message["content"] {
            Value::String(text) => vec![text.as_str()],
            Value::Array(parts) => parts
                .iter()
                .filter(|part| part["type"] == "text")
                .filter_map(|part| part["text"].as_str())
                .collect(),
            _ => Vec::new(),
        })
}

/// The first words of `text`, with `…` when there were more.
fn first_words(text: &str) -> String {
    let mut words = text.split_whitespace();
    let kept: Vec<&str> = words.by_ref().take(WORDS_PER_MENTION).collect();
    let mut mention = kept.join(" ");
    if words.next().is_some() {
        mention.push('…');
    }
    mention
}

/// At most `max` bytes of `text`, cut at a character boundary and marked.
fn clip(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use keel_core::compaction::{self, SUMMARY_MARKER, SUMMARY_SYSTEM};
    use keel_core::ids::ToolCallId;
    use keel_core::message::{ContentBlock, Message, Role, ToolCall, ToolResult};
    use keel_core::wire::{self, PromptRequest, ToolSpecs};
    use serde_json::json;

    use super::*;

    #[test]
    fn the_marker_is_keels() {
        assert_eq!(MARKER, SUMMARY_MARKER);
        assert!(SUMMARY_SYSTEM.starts_with(MARKER));
    }

    fn text(role: Role, text: &str) -> Message {
        Message {
            role,
            content: vec![ContentBlock::Text {
                text: text.to_owned(),
            }],
        }
    }

    /// An older part of a conversation: two user texts, an answer, a tool
    /// call and its result.
    fn replaced() -> Vec<Message> {
        let call = ToolCall {
            id: ToolCallId::new("toolu_1"),
            name: "bash".to_owned(),
            input: json!({"command": "ls"}),
        };
        vec![
            text(Role::User, "list the files in the repository please"),
            Message {
                role: Role::Assistant,
                content: vec![ContentBlock::ToolUse { call }],
            },
            Message {
                role: Role::User,
                content: vec![ContentBlock::ToolResult {
                    result: ToolResult {
                        tool_call_id: ToolCallId::new("toolu_1"),
                        content: "a.txt\nb.txt".to_owned(),
                        is_error: false,
                        images: Vec::new(),
                    },
                }],
            },
            text(Role::Assistant, "There are two files."),
            text(Role::User, "thanks"),
        ]
    }

    /// keel's own summary request for `replaced()`, in `endpoint`'s wire.
    fn keels_summary_request(endpoint: WireApi) -> Value {
        let messages = compaction::summary_request(&replaced());
        let images = BTreeMap::new();
        let request = PromptRequest {
            model: "mock",
            system: Some(SUMMARY_SYSTEM),
            messages: &messages,
            tools: &ToolSpecs::default(),
            max_tokens: 1_000,
            images: &images,
        };
        match endpoint {
            WireApi::Anthropic => wire::anthropic::encode_request(&request).unwrap(),
            WireApi::Openai => wire::openai::encode_request(&request).unwrap(),
        }
    }

    #[test]
    fn keels_summary_requests_are_recognised_in_both_wire_formats() {
        for endpoint in [WireApi::Anthropic, WireApi::Openai] {
            let request = keels_summary_request(endpoint);
            assert!(is_summary_request(endpoint, &request), "{request}");
            let expected = "Summary of the earlier conversation (5 transcript lines, 2 from the \
                            user). The user mentioned: list the files in the…; thanks.";
            assert_eq!(summary(&request), expected, "{endpoint:?}");
        }
    }

    #[test]
    fn only_a_system_prompt_that_starts_with_the_marker_makes_a_summary_request() {
        let user = json!([{"role": "user", "content": "[keel:summary] in the user's text"}]);
        let cases = [
            (
                WireApi::Anthropic,
                json!({"system": "[keel:summary] sum up", "messages": []}),
                true,
            ),
            (
                WireApi::Anthropic,
                json!({"system": [{"type": "text", "text": "[keel:summary] sum up"}], "messages": []}),
                true,
            ),
            (
                WireApi::Anthropic,
                json!({"system": "be brief. [keel:summary]", "messages": []}),
                false,
            ),
            (WireApi::Anthropic, json!({"messages": user}), false),
            (
                WireApi::Openai,
                json!({"messages": [{"role": "system", "content": "[keel:summary] sum up"}, {"role": "user", "content": "x"}]}),
                true,
            ),
            (
                WireApi::Openai,
                json!({"messages": [{"role": "system", "content": [{"type": "text", "text": "[keel:summary]"}]}]}),
                true,
            ),
            (WireApi::Openai, json!({"messages": user}), false),
            // Each wire's own place only.
            (
                WireApi::Openai,
                json!({"system": "[keel:summary] sum up", "messages": []}),
                false,
            ),
        ];
        for (endpoint, request, expected) in cases {
            assert_eq!(
                is_summary_request(endpoint, &request),
                expected,
                "{request}"
            );
        }
    }

    #[test]
    fn a_summary_is_short_whatever_the_transcript() {
        let word = "supercalifragilistic".repeat(10);
        let long = format!("User: {}\n\n", [word.as_str(); 8].join(" ")).repeat(50);
        let request = json!({"messages": [{"role": "user", "content": long}]});
        let summary = summary(&request);
        assert!(summary.starts_with(OPENING), "{summary}");
        assert!(summary.len() <= MAX_BYTES, "{}", summary.len());
        assert!(summary.ends_with('…'));
        // Not keel's transcript: nothing to count, still an answer.
        let plain = json!({"messages": [{"role": "user", "content": "sum this up"}]});
        assert_eq!(
            super::summary(&plain),
            "Summary of the earlier conversation (0 transcript lines, 0 from the user)."
        );
    }
}
