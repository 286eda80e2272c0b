//! What the mock says, decided from the request alone (pure): the default
//! answer the demo relies on, and the finished `Answer` (ids given, tokens
//! counted as `tokens` estimates them) that the wire modules render.
//!
//! The default answer looks at the last user turn of the conversation:
//! tool results are summarised ("The command printed: …"), a text starting
//! with `run: CMD` becomes one `bash` tool call with `{"command": CMD}`,
//! `spawn: TASK | TASK …` one `spawn_agents` call with those tasks (when
//! the request offers it), and any other text is echoed back. A sub-agent
//! (a request that offers `submit_result`) submits what it would have
//! answered as its result instead.

use serde_json::{json, Value};

use super::script::{Content, ScriptedCall, Stop, WireApi};
use super::tokens;

/// A reply ready to be put on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Sent first, as its own content block.
    pub text: Option<String>,
    pub tool_calls: Vec<AnswerCall>,
    pub usage: Usage,
    /// A stop reason the script asked for; `None`: `end_turn` / `tool_use`.
    pub stop: Option<Stop>,
}

impl Answer {
    /// A call's input as sent on the wire: whole, except the last call of
    /// an answer cut off at max_tokens, which stops halfway.
    pub fn wire_input(&self, call_idx: usize) -> String {
        let input = self.tool_calls[call_idx].input.to_string();
        if self.stop == Some(Stop::MaxTokens) && call_idx + 1 == self.tool_calls.len() {
            let mut cut = input.len() / 2;
            while !input.is_char_boundary(cut) {
                cut -= 1;
            }
            return input[..cut].to_owned();
        }
        input
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AnswerCall {
    pub id: String,
    pub name: String,
    pub input: Value,
}

/// Token counts: estimated from the request and the answer (`tokens`), or
/// as a script entry names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The answer to `body` on `endpoint`, whose prompt is estimated at
/// `prompt_tokens` (`tokens::prompt_tokens`). Tool calls without a scripted
/// id take the next number from `next_id`, so ids stay unique across
/// requests.
pub fn answer(
    endpoint: WireApi,
    body: &Value,
    prompt_tokens: u64,
    content: &Content,
    stop: Option<Stop>,
    mut next_id: impl FnMut() -> u64,
) -> Answer {
    let (text, calls) = match content {
        Content::Default => default_content(endpoint, body),
        Content::Given { text, tool_calls } => (text.clone(), tool_calls.clone()),
    };
    let prefix = match endpoint {
        WireApi::Anthropic => "toolu_mock_",
        WireApi::Openai => "call_mock_",
    };
    let tool_calls: Vec<AnswerCall> = calls
        .into_iter()
        .map(|call| AnswerCall {
            id: call.id.unwrap_or_else(|| format!("{prefix}{}", next_id())),
            name: call.name,
            input: call.input,
        })
        .collect();
    let output_tokens = tokens::output_tokens(
        text.as_deref(),
        tool_calls
            .iter()
            .map(|call| (call.name.as_str(), &call.input)),
    );
    Answer {
        text,
        tool_calls,
        usage: Usage {
            input_tokens: prompt_tokens,
            output_tokens,
        },
        stop,
    }
}

/// The demo's behaviour: summarise tool results, run `run: CMD`, or echo.
pub fn default_content(endpoint: WireApi, body: &Value) -> (Option<String>, Vec<ScriptedCall>) {
    let turn = match endpoint {
        WireApi::Anthropic => anthropic_last_turn(body),
        WireApi::Openai => openai_last_turn(body),
    };
    let Some(turn) = turn else {
        return (
            Some("There is no question to answer.".to_owned()),
            Vec::new(),
        );
    };
    let sub_agent = offers(endpoint, body, "submit_result");
    if !turn.results.is_empty() {
        let summary: Vec<String> = turn.results.iter().map(summarise).collect();
        return answer_or_submit(summary.join("\n"), sub_agent);
    }
    // keel's own notes in the prompt (a compaction's summary opens the
    // first message kept, docs/compaction.md) are not the user's words.
    let said: Vec<&str> = turn
        .texts
        .iter()
        .map(|text| without_keel_notes(text))
        .filter(|text| !text.trim().is_empty())
        .collect();
    let text = said.join("\n");
    if let Some(tasks) = text.trim_start().strip_prefix("spawn:") {
        let tasks: Vec<Value> = tasks
            .split('|')
            .map(str::trim)
            .filter(|task| !task.is_empty())
            .map(|task| json!({ "task": task }))
            .collect();
        if !tasks.is_empty() && offers(endpoint, body, "spawn_agents") {
            let call = ScriptedCall {
                name: "spawn_agents".to_owned(),
                input: json!({ "tasks": tasks }),
                id: None,
            };
            return (None, vec![call]);
        }
    }
    // `call: NAME {json}`: one call of any tool by name (an MCP tool, say),
    // with that input (`{}` when none is given).
    if let Some(call) = text.trim_start().strip_prefix("call:") {
        let call = call.trim();
        let (name, input) = call.split_once(char::is_whitespace).unwrap_or((call, "{}"));
        if !name.is_empty() {
            let input = serde_json::from_str::<Value>(input.trim()).unwrap_or_else(
                |error| json!({"unparsed": input.trim(), "error": error.to_string()}),
            );
            let call = ScriptedCall {
                name: name.to_owned(),
                input,
                id: None,
            };
            return (None, vec![call]);
        }
    }
    if let Some(command) = text.trim_start().strip_prefix("run:") {
        let command = command.trim();
        if !command.is_empty() {
            let call = ScriptedCall {
                name: "bash".to_owned(),
                input: json!({ "command": command }),
                id: None,
            };
            return (None, vec![call]);
        }
    }
    if text.trim().is_empty() {
        return (Some("I see no text to echo.".to_owned()), Vec::new());
    }
    answer_or_submit(text, sub_agent)
}

/// `text` without the keel notes that open it: a text that starts with
/// `[keel:` goes on after the line of its last `[keel:` note (the summary's
/// end, or the one note saying turns were left out). OpenAI's wire joins a
/// message's texts, so the note and the user's words may share one text.
fn without_keel_notes(text: &str) -> &str {
    if !text.trim_start().starts_with("[keel:") {
        return text;
    }
    let Some(last) = text.rfind("[keel:") else {
        return text;
    };
    match text[last..].find('\n') {
        Some(end) => &text[last + end + 1..],
        None => "",
    }
}

/// `text` as the answer; a sub-agent (offered `submit_result`) submits it
/// as its result instead.
fn answer_or_submit(text: String, sub_agent: bool) -> (Option<String>, Vec<ScriptedCall>) {
    if !sub_agent {
        return (Some(text), Vec::new());
    }
    let call = ScriptedCall {
        name: "submit_result".to_owned(),
        input: json!({ "result": text }),
        id: None,
    };
    (None, vec![call])
}

/// Whether the request offers the model a tool called `name`.
fn offers(endpoint: WireApi, body: &Value, name: &str) -> bool {
    let Some(tools) = body.get("tools").and_then(Value::as_array) else {
        return false;
    };
    tools.iter().any(|tool| {
        let named = match endpoint {
            WireApi::Anthropic => tool.get("name"),
            WireApi::Openai => tool
                .get("function")
                .and_then(|function| function.get("name")),
        };
        named.and_then(Value::as_str) == Some(name)
    })
}

/// The last user turn: its texts and the tool results it carries.
#[derive(Debug, Default)]
struct UserTurn {
    texts: Vec<String>,
    results: Vec<ToolOutput>,
}

#[derive(Debug)]
struct ToolOutput {
    text: String,
    is_error: bool,
}

fn summarise(output: &ToolOutput) -> String {
    let text = output.text.trim();
    match (output.is_error, text.is_empty()) {
        (false, true) => "The command succeeded and printed nothing.".to_owned(),
        (false, false) => format!("The command printed: {text}"),
        (true, true) => "The command failed without a message.".to_owned(),
        (true, false) => format!("The command failed: {text}"),
    }
}

/// Anthropic: the last message, if it is the user's; its `tool_result`
/// blocks and its text.
fn anthropic_last_turn(body: &Value) -> Option<UserTurn> {
    let mut turn = UserTurn::default();
    let last = body["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .filter(|last| last["role"] == "user")?;
    match &last["content"] {
        Value::String(text) => turn.texts.push(text.clone()),
        Value::Array(blocks) => {
            for block in blocks {
                match block["type"].as_str() {
                    Some("text") => turn.texts.extend(block["text"].as_str().map(str::to_owned)),
                    Some("tool_result") => turn.results.push(ToolOutput {
                        text: content_text(&block["content"]),
                        is_error: block["is_error"] == true,
                    }),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    Some(turn)
}

/// OpenAI: the messages after the last assistant message. Tool results are
/// `role: "tool"` messages there; a failed one is known only by its text,
/// which keel starts with "Error: ".
fn openai_last_turn(body: &Value) -> Option<UserTurn> {
    let mut turn = UserTurn::default();
    let messages = body["messages"].as_array()?;
    let start = messages
        .iter()
        .rposition(|message| message["role"] == "assistant")
        .map_or(0, |assistant_idx| assistant_idx + 1);
    let mut last_user_text = None;
    let mut found = false;
    for message in &messages[start..] {
        match message["role"].as_str() {
            Some("tool") => {
                found = true;
                let text = content_text(&message["content"]);
                turn.results.push(ToolOutput {
                    is_error: text.starts_with("Error: "),
                    text,
                });
            }
            Some("user") => {
                found = true;
                last_user_text = Some(content_text(&message["content"]));
            }
            _ => {}
        }
    }
    turn.texts.extend(last_user_text);
    found.then_some(turn)
}

/// The text of a content value: a string, or the `text` of its parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// `text` cut into the small pieces a stream sends: each word with the
/// whitespace before it (trailing whitespace stays with the last word), so
/// the pieces join back to the text exactly.
pub fn text_deltas(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut previous_is_space = true;
    for (byte_idx, ch) in text.char_indices() {
        let is_space = ch.is_whitespace();
        let rest_is_space = text[byte_idx..].trim_start().is_empty();
        if is_space && !previous_is_space && byte_idx > start && !rest_is_space {
            pieces.push(&text[start..byte_idx]);
            start = byte_idx;
        }
        previous_is_space = is_space;
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// A tool call's JSON input cut into pieces of at most `size` characters,
/// as providers stream arguments.
pub fn json_fragments(json: &str, size: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut n_chars = 0;
    for (byte_idx, _) in json.char_indices() {
        if n_chars == size {
            pieces.push(&json[start..byte_idx]);
            start = byte_idx;
            n_chars = 0;
        }
        n_chars += 1;
    }
    if start < json.len() {
        pieces.push(&json[start..]);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_text(endpoint: WireApi, body: Value) -> Option<String> {
        let (text, calls) = default_content(endpoint, &body);
        assert!(calls.is_empty(), "{calls:?}");
        text
    }

    #[test]
    fn a_sub_agent_submits_and_a_parent_spawns_by_default() {
        let offered = |name: &str| json!([{"name": name, "description": "", "input_schema": {}}]);
        let child = json!({
            "tools": offered("submit_result"),
            "messages": [{"role": "user", "content": "count the files"}]
        });
        let (text, calls) = default_content(WireApi::Anthropic, &child);
        assert_eq!(text, None);
        assert_eq!(calls[0].name, "submit_result");
        assert_eq!(calls[0].input, json!({"result": "count the files"}));
        let parent = json!({
            "tools": [{"type": "function", "function": {"name": "spawn_agents"}}],
            "messages": [{"role": "user", "content": "spawn: one | two |"}]
        });
        let (_, calls) = default_content(WireApi::Openai, &parent);
        assert_eq!(calls[0].name, "spawn_agents");
        assert_eq!(
            calls[0].input,
            json!({"tasks": [{"task": "one"}, {"task": "two"}]})
        );
        // Not offered: echoed, like any text.
        let plain = json!({"messages": [{"role": "user", "content": "spawn: one"}]});
        assert_eq!(
            default_text(WireApi::Anthropic, plain).as_deref(),
            Some("spawn: one")
        );
    }

    #[test]
    fn plain_text_is_echoed_on_both_endpoints() {
        let anthropic = json!({"messages": [{"role": "user", "content": "hello there"}]});
        assert_eq!(
            default_text(WireApi::Anthropic, anthropic).as_deref(),
            Some("hello there")
        );
        let blocks = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "in blocks"}]}]});
        assert_eq!(
            default_text(WireApi::Anthropic, blocks).as_deref(),
            Some("in blocks")
        );
        let openai = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "parts"}]}
        ]});
        assert_eq!(
            default_text(WireApi::Openai, openai).as_deref(),
            Some("parts")
        );
    }

    #[test]
    fn without_a_user_turn_there_is_nothing_to_answer() {
        let prefill = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hel"}
        ]});
        for endpoint in [WireApi::Anthropic, WireApi::Openai] {
            assert_eq!(
                default_text(endpoint, prefill.clone()).as_deref(),
                Some("There is no question to answer.")
            );
        }
        let blank = json!({"messages": [{"role": "user", "content": "  "}]});
        assert_eq!(
            default_text(WireApi::Openai, blank).as_deref(),
            Some("I see no text to echo.")
        );
    }

    #[test]
    fn run_becomes_one_bash_call() {
        for (endpoint, body) in [
            (
                WireApi::Anthropic,
                json!({"messages": [{"role": "user", "content": "run: echo hi"}]}),
            ),
            (
                WireApi::Openai,
                json!({"messages": [{"role": "user", "content": "  run:echo hi "}]}),
            ),
            // After a compaction the summary opens the message; it is
            // keel's note, not the user's words.
            (
                WireApi::Anthropic,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "text", "text": "[keel: the earlier part … A summary of it follows.]\nthings\n[keel: end of the summary.]"},
                    {"type": "text", "text": "run: echo hi"}
                ]}]}),
            ),
            (
                WireApi::Openai,
                json!({"messages": [{"role": "user", "content":
                    "[keel: compacted. A summary of it follows.]\nthe user ran ls\n[keel: end of the summary.]\n\nrun: echo hi"
                }]}),
            ),
        ] {
            let (text, calls) = default_content(endpoint, &body);
            assert_eq!(text, None);
            assert_eq!(
                calls,
                vec![ScriptedCall {
                    name: "bash".to_owned(),
                    input: json!({"command": "echo hi"}),
                    id: None
                }]
            );
        }
    }

    #[test]
    fn call_becomes_one_call_of_the_named_tool() {
        let body = json!({"messages": [{"role": "user", "content": "call: mcp__slow__echo {\"message\": \"hi\"}"}]});
        let (text, calls) = default_content(WireApi::Anthropic, &body);
        assert_eq!(text, None);
        assert_eq!(
            calls,
            [ScriptedCall {
                name: "mcp__slow__echo".to_owned(),
                input: json!({"message": "hi"}),
                id: None
            }]
        );
        let bare = json!({"messages": [{"role": "user", "content": "call: mcp__slow__ping"}]});
        let (_, calls) = default_content(WireApi::Openai, &bare);
        assert_eq!(calls[0].input, json!({}));
    }

    #[test]
    fn tool_results_are_summarised() {
        let anthropic = json!({"messages": [
            {"role": "user", "content": "run: echo hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_mock_1", "name": "bash", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_mock_1", "content": "hello from keel\n", "is_error": false}
            ]}
        ]});
        assert_eq!(
            default_text(WireApi::Anthropic, anthropic).as_deref(),
            Some("The command printed: hello from keel")
        );
        let failed = json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "no such file"}], "is_error": true}
        ]}]});
        assert_eq!(
            default_text(WireApi::Anthropic, failed).as_deref(),
            Some("The command failed: no such file")
        );
        let openai = json!({"messages": [
            {"role": "user", "content": "run: ls; false"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_mock_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_mock_1", "content": "a.txt"},
            {"role": "tool", "tool_call_id": "call_mock_2", "content": ""}
        ]});
        assert_eq!(
            default_text(WireApi::Openai, openai).as_deref(),
            Some("The command printed: a.txt\nThe command succeeded and printed nothing.")
        );
    }

    #[test]
    fn an_answer_numbers_its_calls_and_counts_its_tokens() {
        let body = json!({"system": "one two", "messages": [{"role": "user", "content": "run: echo a b"}]});
        let mut counter = 6;
        let answer = answer(
            WireApi::Anthropic,
            &body,
            42,
            &Content::Default,
            None,
            || {
                counter += 1;
                counter
            },
        );
        assert_eq!(answer.tool_calls[0].id, "toolu_mock_7");
        assert_eq!(answer.usage.input_tokens, 42, "the prompt's estimate");
        // "bash" and {"command":"echo a b"}: 4 + 22 bytes.
        assert_eq!(answer.usage.output_tokens, 7);

        let given = Content::Given {
            text: Some("three little words".to_owned()),
            tool_calls: vec![ScriptedCall {
                name: "bash".to_owned(),
                input: json!({}),
                id: Some("fixed".to_owned()),
            }],
        };
        let answer = super::answer(WireApi::Openai, &json!({}), 1, &given, None, || 99);
        assert_eq!(answer.tool_calls[0].id, "fixed");
        // 18 bytes of text, "bash" and {}: 24 bytes.
        assert_eq!(answer.usage.output_tokens, 6);
    }

    #[test]
    fn deltas_join_back_to_the_text() {
        for text in [
            "Hello world",
            "  lead and trail  ",
            "a\n\nb",
            "",
            "日本 語 ✓",
            "one",
        ] {
            let pieces = text_deltas(text);
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|piece| !piece.is_empty()));
        }
        assert_eq!(
            text_deltas("Hello big world"),
            vec!["Hello", " big", " world"]
        );
        assert_eq!(text_deltas("partial "), vec!["partial "]);
        assert_eq!(text_deltas(" a b\n"), vec![" a", " b\n"]);
        let json = r#"{"command":"echo São Paulo"}"#;
        let fragments = json_fragments(json, 5);
        assert_eq!(fragments.concat(), json);
        assert!(fragments.iter().all(|piece| piece.chars().count() <= 5));
    }
}
