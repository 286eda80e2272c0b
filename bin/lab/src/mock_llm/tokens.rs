//! Token counts the fake provider reports and refuses by, estimated from
//! the request (pure). A real provider's count grows with the prompt, and
//! keel's compaction reads it (the larger of its own estimate and the
//! provider's count decides when to compact): a fake that reported a
//! fixed or word-based number would hide every path that depends on it.
//!
//! The rule, close to keel's own estimate (`keel_core::compaction`) so
//! that the two agree on plain conversations, with the tools added as a
//! real provider counts them:
//!
//! - the prompt's bytes: the text in `system` and in every message (a
//!   message's text, a tool call's name and its input as JSON text, a tool
//!   result; the framing words are not counted: `role`, `type`, ids,
//!   `cache_control`), and the `tools` array as JSON text;
//! - prompt tokens: those bytes / 4, rounded up, plus 4 a message and
//!   1,600 an image; at least 1;
//! - output tokens: the answer's text, and each tool call's name and input
//!   as JSON text, in bytes / 4, rounded up; at least 1.

use serde_json::{Map, Value};

/// Bytes counted as one token.
const BYTES_PER_TOKEN: u64 = 4;
/// Tokens counted for each message's framing.
const MESSAGE_TOKENS: u64 = 4;
/// Tokens counted for an image, whatever its size.
const IMAGE_TOKENS: u64 = 1_600;

/// Fields that frame a message rather than say something in it.
const FRAMING: &[&str] = &[
    "role",
    "type",
    "id",
    "tool_use_id",
    "tool_call_id",
    "cache_control",
];

/// The estimated tokens of a request's prompt: its system prompt, its
/// messages and the tools it offers.
pub fn prompt_tokens(request: &Value) -> u64 {
    let mut size = Size::default();
    size.walk(&request["system"]);
    let mut n_messages = 0u64;
    for message in request["messages"].as_array().into_iter().flatten() {
        n_messages += 1;
        size.walk(message);
    }
    if let Some(tools) = request.get("tools").filter(|tools| !tools.is_null()) {
        size.bytes += json_len(tools);
    }
    let tokens = size.bytes.div_ceil(BYTES_PER_TOKEN)
        + n_messages * MESSAGE_TOKENS
        + size.images * IMAGE_TOKENS;
    tokens.max(1)
}

/// The estimated tokens of an answer: its text and its tool calls, each a
/// name and an input.
pub fn output_tokens<'a>(
    text: Option<&str>,
    calls: impl IntoIterator<Item = (&'a str, &'a Value)>,
) -> u64 {
    let bytes = text.map_or(0, str::len) as u64
        + calls
            .into_iter()
            .map(|(name, input)| name.len() as u64 + json_len(input))
            .sum::<u64>();
    bytes.div_ceil(BYTES_PER_TOKEN).max(1)
}

fn json_len(value: &Value) -> u64 {
    value.to_string().len() as u64
}

/// What a part of the prompt adds up to.
#[derive(Debug, Default)]
struct Size {
    bytes: u64,
    images: u64,
}

impl Size {
    fn walk(&mut self, value: &Value) {
        match value {
            Value::String(text) => self.bytes += text.len() as u64,
            Value::Number(number) => self.bytes += number.to_string().len() as u64,
            Value::Array(items) => items.iter().for_each(|item| self.walk(item)),
            Value::Object(fields) if is_image(fields) => self.images += 1,
            Value::Object(fields) => {
                for (key, field) in fields {
                    match key.as_str() {
                        key if FRAMING.contains(&key) => {}
                        // Anthropic's tool call input is an object; count it
                        // as the JSON text OpenAI sends for the same call.
                        "input" if !field.is_string() => self.bytes += json_len(field),
                        _ => self.walk(field),
                    }
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }
}

/// An image block: Anthropic's `image`, OpenAI's `image_url` part.
fn is_image(fields: &Map<String, Value>) -> bool {
    matches!(
        fields.get("type").and_then(Value::as_str),
        Some("image" | "image_url")
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_prompt_counts_its_text_a_quarter_token_a_byte_and_four_a_message() {
        // 19 bytes of text: 5 tokens, and 4 for the one message.
        let one = json!({"messages": [{"role": "user", "content": "hello from the mock"}]});
        assert_eq!(prompt_tokens(&one), 9);
        // A system prompt of 8 bytes, as a string or in blocks: 27 bytes.
        let with_system = json!({
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello from the mock"}]}]
        });
        assert_eq!(prompt_tokens(&with_system), 7 + 4);
        let openai = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello from the mock"}
        ]});
        assert_eq!(prompt_tokens(&openai), 7 + 8);
        assert_eq!(prompt_tokens(&json!({})), 1, "never zero");
    }

    #[test]
    fn the_prompt_grows_with_each_message() {
        let mut messages = Vec::new();
        let mut last = 0;
        for n in 0..5 {
            messages.push(json!({"role": "user", "content": "x".repeat(40 * n)}));
            let tokens = prompt_tokens(&json!({ "messages": messages }));
            assert!(tokens > last, "{tokens} after {last}");
            last = tokens;
        }
        assert_eq!(last, (40 + 80 + 120 + 160) / 4 + 5 * 4);
    }

    #[test]
    fn a_tool_call_and_its_result_count_the_same_in_both_wire_formats() {
        let input = json!({"command": "ls -la"});
        let anthropic = json!({"messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": false}]}
        ]});
        let openai = json!({"messages": [
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": input.to_string()}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}
        ]});
        // "bash" 4, the input 20, "a.txt" 5: 29 bytes, 8 tokens; 2 messages.
        assert_eq!(prompt_tokens(&anthropic), 8 + 8);
        assert_eq!(prompt_tokens(&openai), 8 + 8);
    }

    #[test]
    fn tools_count_as_their_json_and_images_at_a_fixed_price() {
        let tools = json!([{"name": "bash", "description": "run a command", "input_schema": {}}]);
        let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
        let mut offered = plain.clone();
        offered["tools"] = tools.clone();
        let tools_bytes = tools.to_string().len() as u64;
        assert_eq!(
            prompt_tokens(&offered),
            (2 + tools_bytes).div_ceil(4) + 4,
            "{offered}"
        );
        let data = "A".repeat(100_000);
        let anthropic = json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            {"type": "text", "text": "what is it"}
        ]}]});
        assert_eq!(prompt_tokens(&anthropic), 3 + 4 + 1_600);
        let openai = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}},
            {"type": "text", "text": "what is it"}
        ]}]});
        assert_eq!(prompt_tokens(&openai), 3 + 4 + 1_600);
    }

    #[test]
    fn the_output_counts_the_text_and_each_call() {
        assert_eq!(output_tokens(Some("hello from the mock"), []), 5);
        assert_eq!(output_tokens(None, []), 1, "never zero");
        let input = json!({"command": "ls"});
        // "bash" 4 and {"command":"ls"} 16: 20 bytes.
        assert_eq!(output_tokens(None, [("bash", &input)]), 5);
        assert_eq!(output_tokens(Some("ok"), [("bash", &input)]), 6);
    }
}
