//! The script: what the mock answers, in order, one entry per request, and
//! the same JSON when it comes per request in the `x-mock-fault` header.
//!
//! Everything here is pure: parsing an entry from JSON (strictly, so a typo
//! in a test's script fails loudly instead of silently serving the default)
//! and picking the next entry for a request.
//!
//! Entries are served in order, but an entry may name the requests it is
//! for: `"endpoint"` (one wire format) and `"when"`, a text the request's
//! prompt must contain (its system prompt or any of its users' texts; tool
//! results are not looked at). A request takes the first entry that fits
//! it; the entries it skips keep their place. `when` is how a script
//! answers conversations that ask at the same time, such as sub-agents
//! running in parallel, each by its task: `{"when": "count the files",
//! "tool_calls": [..]}`.
//!
//! Summary requests (keel's compaction asking for a summary, see `summary`)
//! are not turns: an entry serves them only with `"summary": true`, and
//! then serves nothing else. So a compaction between two turns never takes
//! the reply planned for the next turn, and a test can still script a
//! summary that fails or says something chosen (`{"summary": true,
//! "status": 500}`). A summary request no entry serves gets the fake's own
//! summary.
//!
//! A reply reports token counts estimated from the request and the answer
//! (`tokens`); `"usage": {"input_tokens": N, "output_tokens": M}` reports
//! these instead (either may be left out).

use std::collections::VecDeque;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Which wire format a request spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireApi {
    /// `POST /v1/messages`, the Anthropic Messages API.
    Anthropic,
    /// `POST /v1/chat/completions`, OpenAI Chat Completions.
    Openai,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Serve this entry only to requests on this endpoint; `None` serves it
    /// to whichever endpoint asks first.
    pub endpoint: Option<WireApi>,
    /// Serve this entry only to a request whose prompt (system prompt and
    /// user texts) contains this text; `None` serves it to any.
    pub when: Option<String>,
    /// Serve this entry to summary requests, and only to them.
    pub summary: bool,
    pub action: Action,
    /// The entry as it was given, for the recording and `GET /_mock/script`.
    pub source: Value,
}

/// What the mock does with a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Answer with this HTTP status and an error body, no stream.
    Status(StatusFault),
    /// Accept the request and never answer, not even the status line.
    Hang,
    /// Send one SSE frame whose data is not JSON, then end the body.
    Malformed,
    /// A normal answer, possibly paced or broken part way.
    Reply(Reply),
}

#[derive(Debug, Clone, PartialEq)]
pub struct StatusFault {
    pub status: u16,
    /// The `retry-after` header value (seconds, or an HTTP date), verbatim.
    pub retry_after: Option<String>,
    /// The `retry-after-ms` header OpenAI sends beside `retry-after`.
    pub retry_after_ms: Option<u64>,
    /// The response body; `None` means the provider's usual error body for
    /// the status.
    pub body: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub content: Content,
    /// Wait this long before each content delta (a slow token drip).
    pub drip_ms: Option<u64>,
    pub ending: Ending,
    /// Why the model says it stopped, when not the usual `end_turn` /
    /// `tool_use`.
    pub stop: Option<Stop>,
    /// Token counts to report instead of the estimates.
    pub usage: ScriptedUsage,
}

impl Reply {
    /// `content`, all at once, ending normally, with the usual stop reason
    /// and estimated usage.
    pub fn plain(content: Content) -> Reply {
        Reply {
            content,
            drip_ms: None,
            ending: Ending::Complete,
            stop: None,
            usage: ScriptedUsage::default(),
        }
    }
}

/// Token counts a reply reports instead of the ones estimated from the
/// request and the answer; each left out is estimated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// A stop reason a script can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Cut off at the request's max_tokens: the last tool call's input is
    /// sent only half (invalid JSON), as a real cut-off leaves it.
    /// Anthropic `max_tokens`, OpenAI `length`.
    MaxTokens,
    /// Anthropic `pause_turn` (OpenAI has none; it says `stop`).
    PauseTurn,
    /// Anthropic `refusal`, OpenAI `content_filter`.
    Refusal,
}

/// What the answer says.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// Decided from the request, as when no script is loaded.
    Default,
    /// Text first (if any), then tool calls, in order.
    Given {
        text: Option<String>,
        tool_calls: Vec<ScriptedCall>,
    },
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default = "empty_object")]
    pub input: Value,
    /// A fixed id instead of the next `toolu_mock_N` / `call_mock_N`.
    #[serde(default)]
    pub id: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// How a streamed answer ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// Every event, through `message_stop` / `[DONE]`.
    Complete,
    /// Send `after_events` SSE events, then drop the connection (or, with
    /// `clean_eof`, end the body properly, so only the events are missing).
    Cut {
        after_events: usize,
        clean_eof: bool,
    },
    /// Send `after_events` SSE events, then send nothing more, holding the
    /// connection open until the client goes away.
    Stall { after_events: usize },
    /// Send the content, then an in-stream error instead of the closing
    /// events.
    Error(ErrorSpec),
}

/// An error object as the providers put it inside a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorSpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// Why a script or an `x-mock-fault` header was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptError(String);

impl fmt::Display for ScriptError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for ScriptError {}

/// The fields an entry may have, all optional; `Entry::parse` checks which
/// combinations make sense.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    endpoint: Option<WireApi>,
    when: Option<String>,
    summary: Option<bool>,
    text: Option<String>,
    tool_calls: Option<Vec<ScriptedCall>>,
    status: Option<u16>,
    retry_after: Option<Value>,
    retry_after_ms: Option<u64>,
    body: Option<Value>,
    cut_after_events: Option<usize>,
    clean_eof: Option<bool>,
    malformed: Option<bool>,
    error_event: Option<ErrorSpec>,
    after_text: Option<String>,
    drip_ms: Option<u64>,
    hang: Option<bool>,
    hang_after_events: Option<usize>,
    stop_reason: Option<Stop>,
    usage: Option<ScriptedUsage>,
}

const STATUS_FIELDS: &[&str] = &[
    "endpoint",
    "when",
    "summary",
    "status",
    "retry_after",
    "retry_after_ms",
    "body",
];
const HANG_FIELDS: &[&str] = &["endpoint", "when", "summary", "hang"];
const MALFORMED_FIELDS: &[&str] = &["endpoint", "when", "summary", "malformed"];
const REPLY_FIELDS: &[&str] = &[
    "endpoint",
    "when",
    "summary",
    "text",
    "tool_calls",
    "drip_ms",
    "cut_after_events",
    "clean_eof",
    "hang_after_events",
    "error_event",
    "after_text",
    "stop_reason",
    "usage",
];

/// A whole script: an array of entries, `{"replies": [..]}`, or one entry.
pub fn parse_script(value: &Value) -> Result<Vec<Entry>, ScriptError> {
    let items = match value {
        Value::Array(items) => items.as_slice(),
        Value::Object(object) if object.contains_key("replies") => match object.get("replies") {
            Some(Value::Array(items)) if object.len() == 1 => items.as_slice(),
            _ => {
                return Err(ScriptError(
                    "a script object must be {\"replies\": [entries]} and nothing else".to_owned(),
                ))
            }
        },
        Value::Object(_) => std::slice::from_ref(value),
        _ => {
            return Err(ScriptError(
                "a script is an array of entries, {\"replies\": [..]} or one entry".to_owned(),
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(entry_idx, item)| {
            Entry::parse(item)
                .map_err(|err| ScriptError(format!("script entry {entry_idx}: {err}")))
        })
        .collect()
}

impl Entry {
    /// One entry, checked: exactly one kind (status, hang, malformed or a
    /// reply), and only the fields that kind uses.
    pub fn parse(value: &Value) -> Result<Entry, ScriptError> {
        let object = value
            .as_object()
            .ok_or_else(|| ScriptError("an entry is a JSON object".to_owned()))?;
        let raw: RawEntry = serde_json::from_value(value.clone())
            .map_err(|err| ScriptError(format!("bad entry {value}: {err}")))?;

        let kinds = [
            raw.status.is_some(),
            raw.hang.is_some(),
            raw.malformed.is_some(),
        ];
        if kinds.iter().filter(|is_kind| **is_kind).count() > 1 {
            return Err(ScriptError(
                "an entry is one of status, hang, malformed or a reply, not several".to_owned(),
            ));
        }
        let (allowed, action) = if let Some(status) = raw.status {
            (STATUS_FIELDS, Action::Status(status_fault(status, &raw)?))
        } else if let Some(hang) = raw.hang {
            require_true("hang", hang)?;
            (HANG_FIELDS, Action::Hang)
        } else if let Some(malformed) = raw.malformed {
            require_true("malformed", malformed)?;
            (MALFORMED_FIELDS, Action::Malformed)
        } else {
            (REPLY_FIELDS, Action::Reply(reply(raw_reply_fields(&raw))?))
        };
        if let Some(stray) = object.keys().find(|key| !allowed.contains(&key.as_str())) {
            return Err(ScriptError(format!(
                "field {stray:?} does not go with this kind of entry (allowed: {})",
                allowed.join(", ")
            )));
        }
        if raw.when.as_deref() == Some("") {
            return Err(ScriptError(
                "when is a text the prompt must contain; leave it out to match any".to_owned(),
            ));
        }
        if let Some(summary) = raw.summary {
            require_true("summary", summary)?;
        }
        Ok(Entry {
            endpoint: raw.endpoint,
            when: raw.when,
            summary: raw.summary.is_some(),
            action,
            source: value.clone(),
        })
    }

    /// Whether this entry may answer a request on `endpoint` whose
    /// prompt (see [`prompt_text`]) is `prompt`, and which is a summary
    /// request or not as `summary` says.
    pub fn serves(&self, endpoint: WireApi, prompt: &str, summary: bool) -> bool {
        self.summary == summary
            && self.endpoint.is_none_or(|wanted| wanted == endpoint)
            && self
                .when
                .as_deref()
                .is_none_or(|when| prompt.contains(when))
    }
}

fn require_true(field: &str, value: bool) -> Result<(), ScriptError> {
    if value {
        Ok(())
    } else {
        Err(ScriptError(format!(
            "{field} is only ever true; leave it out instead"
        )))
    }
}

fn status_fault(status: u16, raw: &RawEntry) -> Result<StatusFault, ScriptError> {
    if !(100..=999).contains(&status) {
        return Err(ScriptError(format!(
            "status {status} is not an HTTP status"
        )));
    }
    let retry_after = match &raw.retry_after {
        None => None,
        Some(Value::Number(seconds)) if seconds.as_f64().is_some_and(|secs| secs >= 0.0) => {
            Some(seconds.to_string())
        }
        Some(Value::String(header))
            if !header.is_empty()
                && header.chars().all(|ch| ch.is_ascii_graphic() || ch == ' ') =>
        {
            Some(header.clone())
        }
        Some(other) => {
            return Err(ScriptError(format!(
                "retry_after is seconds (a number) or a header value (a string), not {other}"
            )))
        }
    };
    Ok(StatusFault {
        status,
        retry_after,
        retry_after_ms: raw.retry_after_ms,
        body: raw.body.clone(),
    })
}

/// The fields of a reply entry, borrowed from the raw entry.
struct ReplyFields<'a> {
    text: Option<&'a String>,
    tool_calls: Option<&'a Vec<ScriptedCall>>,
    drip_ms: Option<u64>,
    cut_after_events: Option<usize>,
    clean_eof: Option<bool>,
    hang_after_events: Option<usize>,
    error_event: Option<&'a ErrorSpec>,
    after_text: Option<&'a String>,
    stop: Option<Stop>,
    usage: Option<ScriptedUsage>,
}

fn raw_reply_fields(raw: &RawEntry) -> ReplyFields<'_> {
    ReplyFields {
        text: raw.text.as_ref(),
        tool_calls: raw.tool_calls.as_ref(),
        drip_ms: raw.drip_ms,
        cut_after_events: raw.cut_after_events,
        clean_eof: raw.clean_eof,
        hang_after_events: raw.hang_after_events,
        error_event: raw.error_event.as_ref(),
        after_text: raw.after_text.as_ref(),
        stop: raw.stop_reason,
        usage: raw.usage,
    }
}

fn reply(fields: ReplyFields<'_>) -> Result<Reply, ScriptError> {
    let endings = [
        fields.cut_after_events.is_some(),
        fields.hang_after_events.is_some(),
        fields.error_event.is_some(),
    ];
    if endings.iter().filter(|is_ending| **is_ending).count() > 1 {
        return Err(ScriptError(
            "cut_after_events, hang_after_events and error_event exclude each other".to_owned(),
        ));
    }
    if fields.clean_eof.is_some() && fields.cut_after_events.is_none() {
        return Err(ScriptError(
            "clean_eof only goes with cut_after_events".to_owned(),
        ));
    }
    if fields.after_text.is_some() && fields.error_event.is_none() {
        return Err(ScriptError(
            "after_text only goes with error_event".to_owned(),
        ));
    }

    let content = if fields.error_event.is_some() {
        if fields.text.is_some() || fields.tool_calls.is_some() {
            return Err(ScriptError(
                "with error_event, the text before the error is after_text".to_owned(),
            ));
        }
        // An error with no text before it comes right after message_start.
        Content::Given {
            text: fields.after_text.filter(|text| !text.is_empty()).cloned(),
            tool_calls: Vec::new(),
        }
    } else if fields.text.is_none() && fields.tool_calls.is_none() {
        Content::Default
    } else {
        let tool_calls = fields.tool_calls.cloned().unwrap_or_default();
        if fields.text.is_none() && tool_calls.is_empty() {
            return Err(ScriptError(
                "a reply needs text or at least one tool call".to_owned(),
            ));
        }
        Content::Given {
            text: fields.text.cloned(),
            tool_calls,
        }
    };

    let ending = if let Some(after_events) = fields.cut_after_events {
        Ending::Cut {
            after_events,
            clean_eof: fields.clean_eof.unwrap_or(false),
        }
    } else if let Some(after_events) = fields.hang_after_events {
        Ending::Stall { after_events }
    } else if let Some(error) = fields.error_event {
        Ending::Error(error.clone())
    } else {
        Ending::Complete
    };
    Ok(Reply {
        content,
        drip_ms: fields.drip_ms,
        ending,
        stop: fields.stop,
        usage: fields.usage.unwrap_or_default(),
    })
}

/// What a request's `when` is matched against: its system prompt and the
/// texts of its user messages, one per line, in either wire format. Tool
/// results are left out, so a parent is not taken for the sub-agents whose
/// results it reads.
pub fn prompt_text(request: &Value) -> String {
    let mut texts: Vec<&str> = Vec::new();
    push_texts(&request["system"], &mut texts);
    for message in request["messages"].as_array().into_iter().flatten() {
        if matches!(message["role"].as_str(), Some("user" | "system")) {
            push_texts(&message["content"], &mut texts);
        }
    }
    texts.join("\n")
}

/// The texts of a content value: a string, or its `text` parts.
fn push_texts<'a>(content: &'a Value, texts: &mut Vec<&'a str>) {
    match content {
        Value::String(text) => texts.push(text),
        Value::Array(parts) => texts.extend(
            parts
                .iter()
                .filter(|part| part["type"] == "text")
                .filter_map(|part| part["text"].as_str()),
        ),
        _ => {}
    }
}

/// The queue of scripted entries.
#[derive(Debug, Default)]
pub struct Script {
    entries: VecDeque<Entry>,
}

impl Script {
    pub fn push(&mut self, entries: Vec<Entry>) {
        self.entries.extend(entries);
    }

    /// The first entry that serves a request on `endpoint` with this
    /// `prompt` (a summary request or not, as `summary` says), removed from
    /// the queue. Entries meant for other requests keep their place.
    pub fn take_for(&mut self, endpoint: WireApi, prompt: &str, summary: bool) -> Option<Entry> {
        let entry_idx = self
            .entries
            .iter()
            .position(|entry| entry.serves(endpoint, prompt, summary))?;
        self.entries.remove(entry_idx)
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries still waiting, as they were given.
    pub fn pending(&self) -> Vec<Value> {
        self.entries
            .iter()
            .map(|entry| entry.source.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: Value) -> Entry {
        Entry::parse(&value).unwrap()
    }

    fn refusal(value: Value) -> String {
        Entry::parse(&value).unwrap_err().to_string()
    }

    #[test]
    fn each_documented_entry_parses_to_its_action() {
        assert_eq!(
            entry(json!({"text": "hi"})).action,
            Action::Reply(Reply {
                content: Content::Given {
                    text: Some("hi".to_owned()),
                    tool_calls: vec![]
                },
                drip_ms: None,
                ending: Ending::Complete,
                stop: None,
                usage: ScriptedUsage::default(),
            })
        );
        let calls = entry(json!({"tool_calls": [{"name": "bash", "input": {"command": "ls"}}]}));
        assert_eq!(
            calls.action,
            Action::Reply(Reply {
                content: Content::Given {
                    text: None,
                    tool_calls: vec![ScriptedCall {
                        name: "bash".to_owned(),
                        input: json!({"command": "ls"}),
                        id: None,
                    }],
                },
                drip_ms: None,
                ending: Ending::Complete,
                stop: None,
                usage: ScriptedUsage::default(),
            })
        );
        assert_eq!(
            entry(json!({"status": 429, "retry_after": 2})).action,
            Action::Status(StatusFault {
                status: 429,
                retry_after: Some("2".to_owned()),
                retry_after_ms: None,
                body: None,
            })
        );
        assert_eq!(entry(json!({"hang": true})).action, Action::Hang);
        assert_eq!(entry(json!({"malformed": true})).action, Action::Malformed);

        let Action::Reply(cut) = entry(json!({"cut_after_events": 3, "text": "a b"})).action else {
            panic!("a cut is a reply")
        };
        assert_eq!(
            cut.ending,
            Ending::Cut {
                after_events: 3,
                clean_eof: false
            }
        );
        let Action::Reply(stall) = entry(json!({"hang_after_events": 2})).action else {
            panic!("a stall is a reply")
        };
        assert_eq!(stall.ending, Ending::Stall { after_events: 2 });
        assert_eq!(stall.content, Content::Default);

        let Action::Reply(drip) = entry(json!({"drip_ms": 200, "text": "slow"})).action else {
            panic!("a drip is a reply")
        };
        assert_eq!(drip.drip_ms, Some(200));

        let Action::Reply(error) = entry(json!({
            "error_event": {"type": "overloaded_error", "message": "Overloaded"},
            "after_text": "partial "
        }))
        .action
        else {
            panic!("an error event is a reply")
        };
        assert_eq!(
            error.content,
            Content::Given {
                text: Some("partial ".to_owned()),
                tool_calls: vec![]
            }
        );
        assert_eq!(
            error.ending,
            Ending::Error(ErrorSpec {
                kind: "overloaded_error".to_owned(),
                message: "Overloaded".to_owned(),
            })
        );
    }

    #[test]
    fn a_status_keeps_its_retry_after_and_raw_body() {
        let fault = entry(json!({
            "status": 503, "retry_after": "Wed, 21 Oct 2015 07:28:00 GMT",
            "retry_after_ms": 150, "body": {"anything": true}
        }));
        assert_eq!(
            fault.action,
            Action::Status(StatusFault {
                status: 503,
                retry_after: Some("Wed, 21 Oct 2015 07:28:00 GMT".to_owned()),
                retry_after_ms: Some(150),
                body: Some(json!({"anything": true})),
            })
        );
    }

    #[test]
    fn mistakes_in_an_entry_are_refused_with_a_reason() {
        assert!(refusal(json!({"txt": "typo"})).contains("unknown field"));
        assert!(refusal(json!({"status": 500, "hang": true})).contains("not several"));
        assert!(refusal(json!({"status": 500, "text": "x"})).contains("\"text\""));
        assert!(refusal(json!({"hang": true, "drip_ms": 5})).contains("\"drip_ms\""));
        assert!(refusal(json!({"hang": false})).contains("only ever true"));
        assert!(
            refusal(json!({"cut_after_events": 1, "hang_after_events": 1}))
                .contains("exclude each other")
        );
        assert!(refusal(json!({"after_text": "x"})).contains("only goes with error_event"));
        assert!(refusal(json!({"clean_eof": true})).contains("only goes with cut_after_events"));
        assert!(refusal(json!({"tool_calls": []})).contains("needs text"));
        assert!(refusal(json!({"endpoint": "gemini", "text": "x"})).contains("unknown variant"));
        assert!(refusal(json!({"status": 429, "retry_after": -1})).contains("retry_after"));
        assert!(refusal(json!({"status": 429, "retry_after": "a\nb"})).contains("retry_after"));
        assert!(refusal(json!("text")).contains("JSON object"));
    }

    #[test]
    fn a_script_is_an_array_a_replies_object_or_one_entry() {
        assert_eq!(
            parse_script(&json!([{"text": "a"}, {"hang": true}]))
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            parse_script(&json!({"replies": [{"text": "a"}]}))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(parse_script(&json!({"text": "a"})).unwrap().len(), 1);
        let err = parse_script(&json!([{"text": "a"}, {"bogus": 1}])).unwrap_err();
        assert!(err.to_string().starts_with("script entry 1: "), "{err}");
        assert!(parse_script(&json!(3)).is_err());
        assert!(parse_script(&json!({"replies": [], "text": "a"})).is_err());
    }

    #[test]
    fn entries_are_served_in_order_and_skipped_only_by_the_other_endpoint() {
        let mut script = Script::default();
        script.push(
            parse_script(&json!([
                {"endpoint": "openai", "text": "for openai"},
                {"text": "for anyone"},
                {"endpoint": "anthropic", "text": "for anthropic"},
            ]))
            .unwrap(),
        );
        let text = |entry: Option<Entry>| entry.map(|entry| entry.source["text"].clone());
        assert_eq!(
            text(script.take_for(WireApi::Anthropic, "", false)),
            Some(json!("for anyone"))
        );
        assert_eq!(script.len(), 2);
        assert_eq!(
            text(script.take_for(WireApi::Anthropic, "", false)),
            Some(json!("for anthropic"))
        );
        assert_eq!(script.take_for(WireApi::Anthropic, "", false), None);
        assert_eq!(
            text(script.take_for(WireApi::Openai, "", false)),
            Some(json!("for openai"))
        );
        assert_eq!(script.take_for(WireApi::Openai, "", false), None);
    }

    #[test]
    fn an_entry_with_when_serves_only_prompts_that_contain_it() {
        let mut script = Script::default();
        script.push(
            parse_script(&json!([
                {"when": "task B", "text": "for B"},
                {"when": "task A", "text": "for A"},
                {"text": "for anyone"},
            ]))
            .unwrap(),
        );
        let text = |entry: Option<Entry>| entry.map(|entry| entry.source["text"].clone());
        assert_eq!(
            text(script.take_for(WireApi::Anthropic, "do task A now", false)),
            Some(json!("for A"))
        );
        assert_eq!(
            text(script.take_for(WireApi::Anthropic, "no match", false)),
            Some(json!("for anyone"))
        );
        assert_eq!(
            script.take_for(WireApi::Anthropic, "task A again", false),
            None
        );
        assert_eq!(
            text(script.take_for(WireApi::Openai, "then task B", false)),
            Some(json!("for B"))
        );
        assert!(refusal(json!({"when": "", "text": "x"})).contains("leave it out"));
        assert_eq!(
            entry(json!({"when": "x", "hang": true})).action,
            Action::Hang
        );
    }

    #[test]
    fn summary_entries_serve_only_summary_requests_and_others_never_do() {
        let mut script = Script::default();
        script.push(
            parse_script(&json!([
                {"text": "turn one"},
                {"summary": true, "status": 500},
                {"text": "turn two"},
                {"summary": true, "when": "the files", "text": "they listed files"},
            ]))
            .unwrap(),
        );
        let source = |entry: Option<Entry>| entry.map(|entry| entry.source);
        // A summary request skips the turns' entries, whatever its place.
        assert_eq!(
            source(script.take_for(WireApi::Anthropic, "about the files", true)),
            Some(json!({"summary": true, "status": 500}))
        );
        assert_eq!(
            source(script.take_for(WireApi::Openai, "", false)),
            Some(json!({"text": "turn one"}))
        );
        assert_eq!(
            script.take_for(WireApi::Openai, "nothing alike", true),
            None,
            "the fake's own summary then"
        );
        assert_eq!(
            source(script.take_for(WireApi::Openai, "about the files", false)),
            Some(json!({"text": "turn two"})),
            "a turn never takes a summary entry"
        );
        assert_eq!(
            script.take_for(WireApi::Openai, "about the files", false),
            None
        );
        assert_eq!(
            source(script.take_for(WireApi::Openai, "about the files", true)),
            Some(json!({"summary": true, "when": "the files", "text": "they listed files"}))
        );
        assert!(refusal(json!({"summary": false, "text": "x"})).contains("only ever true"));
        assert!(entry(json!({"summary": true, "hang": true})).summary);
        assert!(!entry(json!({"text": "x"})).summary);
    }

    #[test]
    fn a_reply_may_name_the_usage_it_reports() {
        let Action::Reply(reply) =
            entry(json!({"text": "x", "usage": {"input_tokens": 150000}})).action
        else {
            panic!("a reply")
        };
        assert_eq!(
            reply.usage,
            ScriptedUsage {
                input_tokens: Some(150_000),
                output_tokens: None
            }
        );
        assert!(refusal(json!({"text": "x", "usage": {"input": 1}})).contains("unknown field"));
        assert!(refusal(json!({"status": 500, "usage": {}})).contains("\"usage\""));
    }

    #[test]
    fn the_prompt_is_the_system_prompt_and_user_texts_without_tool_results() {
        let anthropic = json!({
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "task A"},
                {"role": "assistant", "content": [{"type": "text", "text": "assistant says"}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "task B result"},
                    {"type": "text", "text": "go on"}
                ]}
            ]
        });
        assert_eq!(prompt_text(&anthropic), "be brief\ntask A\ngo on");
        let openai = json!({
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "task C"},
                {"role": "tool", "tool_call_id": "t", "content": "task D result"}
            ]
        });
        assert_eq!(prompt_text(&openai), "sys\ntask C");
    }
}
