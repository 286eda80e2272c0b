//! What the demo prints: a trace for people, or one JSON object per line for
//! scripts. For people, each canonical event is `{conversation}:{seq}  {kind
//! summary}`, live events start with `~`, effects the shell carries out with
//! `->`, and what the user does with `>`. The JSON lines carry the core's own
//! types (`Input`, `Event`, `LiveEvent`, `Effect`) serialized as they are.

use std::io::{self, Write};

use keel_actors::core::message::AssistantBlock;
use keel_actors::core::{
    BusyPolicy, ConversationId, Decision, Effect, Event, EventKind, Input, InterruptReason,
    LiveEvent, Outcome, Rejection, StateName, StreamDelta, Timestamp, TurnNote,
};
use serde::Serialize;

/// How the demo prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
}

/// Longest quoted text in the human trace; the JSON lines carry all of it.
const QUOTE_CHARS: usize = 60;

/// One line of `--json` output, tagged by `kind`.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum JsonLine<'a> {
    /// A part of the walkthrough begins.
    Scene { title: &'a str },
    /// The shell fed this input to `transition` at `at`.
    Input { at: Timestamp, input: &'a Input },
    /// A canonical event, appended to the log; `id` is `{conversation}:{seq}`.
    Event { id: String, event: &'a Event },
    /// A live event the core asked to publish.
    Live { event: &'a LiveEvent },
    /// Any other effect the shell carried out.
    Effect { effect: &'a Effect },
    /// The core refused the input; the state did not change.
    Rejected {
        rejection: &'a Rejection,
        message: String,
    },
    /// A tool's process ended.
    ToolExited {
        tool_call_id: &'a str,
        exit_code: Option<i32>,
        duration_ms: u64,
    },
    /// The log was replayed and compared with the live working set.
    Replay {
        events: usize,
        working_set_equal: bool,
        state: StateName,
    },
    /// The walkthrough ended.
    Done { state: StateName, turns: u32 },
}

pub struct Trace<W: Write> {
    out: W,
    format: Format,
    conversation: ConversationId,
}

impl<W: Write> Trace<W> {
    pub fn new(out: W, format: Format, conversation: ConversationId) -> Self {
        Trace {
            out,
            format,
            conversation,
        }
    }

    pub fn intro(&mut self, cwd: &str) -> io::Result<()> {
        if self.format == Format::Human {
            writeln!(
                self.out,
                "keel demo: one conversation driven through keel-core, in this process.\n\
                 No daemon, no network: a scripted model answers, and its tool calls run\n\
                 for real (bash -c) in {cwd}.\n\
                 Legend: ID:SEQ canonical event (logged) | ~ live event | -> effect | > user"
            )?;
        }
        Ok(())
    }

    pub fn scene(&mut self, title: &str) -> io::Result<()> {
        match self.format {
            Format::Human => writeln!(self.out, "\n== {title}"),
            Format::Json => self.json(&JsonLine::Scene { title }),
        }
    }

    /// For people, only what the user does is shown; worker reports show up
    /// as the live events the core publishes for them.
    pub fn input(&mut self, input: &Input, at: Timestamp) -> io::Result<()> {
        match self.format {
            Format::Json => self.json(&JsonLine::Input { at, input }),
            Format::Human => match input {
                Input::UserMessage { text, .. } => writeln!(self.out, "> send {}", quote(text)),
                Input::Cancel => writeln!(self.out, "> cancel"),
                _ => Ok(()),
            },
        }
    }

    pub fn event(&mut self, event: &Event) -> io::Result<()> {
        let id = self.conversation.event_id(event.seq).to_string();
        match self.format {
            Format::Human => writeln!(self.out, "{id}  {}", event_summary(&event.kind)),
            Format::Json => self.json(&JsonLine::Event { id, event }),
        }
    }

    pub fn live(&mut self, event: &LiveEvent) -> io::Result<()> {
        match self.format {
            Format::Human => writeln!(self.out, "    ~ {}", live_summary(event)),
            Format::Json => self.json(&JsonLine::Live { event }),
        }
    }

    pub fn effect(&mut self, effect: &Effect) -> io::Result<()> {
        match self.format {
            Format::Human => writeln!(self.out, "    -> {}", effect_summary(effect)),
            Format::Json => self.json(&JsonLine::Effect { effect }),
        }
    }

    pub fn rejected(&mut self, rejection: &Rejection) -> io::Result<()> {
        match self.format {
            Format::Human => writeln!(self.out, "    rejected: {rejection}"),
            Format::Json => self.json(&JsonLine::Rejected {
                rejection,
                message: rejection.to_string(),
            }),
        }
    }

    pub fn tool_exited(
        &mut self,
        tool_call_id: &str,
        exit_code: Option<i32>,
        duration_ms: u64,
    ) -> io::Result<()> {
        match self.format {
            Format::Human => {
                let ending = match exit_code {
                    Some(code) => format!("exited with {code}"),
                    None => "did not exit normally".to_owned(),
                };
                writeln!(
                    self.out,
                    "    (tool {tool_call_id} {ending} after {duration_ms} ms)"
                )
            }
            Format::Json => self.json(&JsonLine::ToolExited {
                tool_call_id,
                exit_code,
                duration_ms,
            }),
        }
    }

    pub fn replay(&mut self, events: usize, equal: bool, state: StateName) -> io::Result<()> {
        match self.format {
            Format::Human => {
                let verdict = if equal {
                    "equals the live one"
                } else {
                    "DIFFERS from the live one"
                };
                writeln!(
                    self.out,
                    "replayed {events} events: the working set {verdict} (state {state})"
                )
            }
            Format::Json => self.json(&JsonLine::Replay {
                events,
                working_set_equal: equal,
                state,
            }),
        }
    }

    pub fn done(&mut self, state: StateName, turns: u32) -> io::Result<()> {
        match self.format {
            Format::Human => writeln!(
                self.out,
                "\nfinal state: {state} after {turns} turns\n\
                 (the daemon-backed demo, with a real store and the fake provider over HTTP, comes later)"
            ),
            Format::Json => self.json(&JsonLine::Done { state, turns }),
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn json(&mut self, line: &JsonLine<'_>) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, line)?;
        writeln!(self.out)
    }
}

/// Text for people: Rust's escaping, cut to `QUOTE_CHARS` characters.
pub fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_CHARS) {
        Some((cut, _)) => format!("{:?}...", &text[..cut]),
        None => format!("{text:?}"),
    }
}

pub fn event_summary(kind: &EventKind) -> String {
    match kind {
        EventKind::Created { cwd, config, .. } => format!(
            "created  cwd={cwd} model={} busy_policy={}",
            config.primary,
            busy_policy_name(config.busy_policy)
        ),
        EventKind::SessionStarted => "session_started".to_owned(),
        EventKind::SessionEnded => "session_ended".to_owned(),
        EventKind::UserMessage { text, images } if images.is_empty() => {
            format!("user_message  {}", quote(text))
        }
        EventKind::UserMessage { text, images } => {
            format!("user_message  {} + {} images", quote(text), images.len())
        }
        EventKind::TurnStarted { turn } => format!("turn_started  turn {turn}"),
        EventKind::AssistantMessage {
            blocks,
            stop_reason,
            ..
        } => {
            let blocks: Vec<String> = blocks.iter().map(block_summary).collect();
            let stop = serde_json::to_value(stop_reason)
                .ok()
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_default();
            format!("assistant_message  {}  stop={stop}", blocks.join(" + "))
        }
        EventKind::ToolResult {
            tool_call_id,
            content,
            is_error,
            synthetic,
        } => {
            let status = match (is_error, synthetic) {
                (false, false) => "ok",
                (true, false) => "error",
                (false, true) => "synthetic",
                (true, true) => "synthetic error",
            };
            format!("tool_result  {tool_call_id} {status} {}", quote(content))
        }
        EventKind::Suspended { pending } => {
            let ids: Vec<&str> = pending.iter().map(|call| call.call.id.as_str()).collect();
            format!("suspended  waiting on {}", ids.join(", "))
        }
        EventKind::Resolved {
            tool_call_id,
            decision,
            by,
        } => {
            let decision = match decision {
                Decision::Approve => "approve".to_owned(),
                Decision::Deny => "deny".to_owned(),
                Decision::Answer { text } => format!("answer {}", quote(text)),
            };
            let by = by
                .as_deref()
                .map(|by| format!(" by {}", quote(by)))
                .unwrap_or_default();
            format!("resolved  {tool_call_id} {decision}{by}")
        }
        EventKind::TurnCompleted {
            turn,
            duration_ms,
            note,
        } => {
            let note = match note {
                Some(TurnNote::MaxTokens { max_tokens }) => {
                    format!(" (cut off at max_tokens {max_tokens})")
                }
                Some(TurnNote::Refusal) => " (the model refused)".to_owned(),
                None => String::new(),
            };
            format!("turn_completed  turn {turn} in {duration_ms} ms{note}")
        }
        EventKind::TurnInterrupted {
            turn,
            reason,
            partial_text,
        } => {
            let partial = match partial_text {
                Some(text) => format!(" partial_text={}", quote(text)),
                None => String::new(),
            };
            format!(
                "turn_interrupted  turn {turn} ({}){partial}",
                interrupt_reason(*reason)
            )
        }
        EventKind::TurnFailed { turn, error } => {
            format!("turn_failed  turn {turn}: {}", quote(error))
        }
        EventKind::ConfigChanged { .. } => "config_changed".to_owned(),
        EventKind::Recovered { action } => format!("recovered  {action:?}"),
        EventKind::Nudge { text, .. } => format!("nudge  {}", quote(text)),
        EventKind::DebounceCancelled => "debounce_cancelled".to_owned(),
        EventKind::Unanswered { messages, reason } => {
            format!("unanswered  {messages:?} ({})", interrupt_reason(*reason))
        }
        EventKind::Finished { outcome } => match outcome {
            Outcome::Completed { result } => format!("finished  completed {}", quote(result)),
            Outcome::Failed { reason } => format!("finished  failed {}", quote(reason)),
        },
    }
}

fn block_summary(block: &AssistantBlock) -> String {
    match block {
        AssistantBlock::Text { text } => format!("text {}", quote(text)),
        AssistantBlock::Thinking { text, .. } => format!("thinking {}", quote(text)),
        AssistantBlock::ToolUse { call } => {
            format!("tool_use {} {} {}", call.id, call.name, call.input)
        }
    }
}

fn busy_policy_name(policy: BusyPolicy) -> &'static str {
    match policy {
        BusyPolicy::Reject => "reject",
        BusyPolicy::Interrupt => "interrupt",
        BusyPolicy::Queue => "queue",
    }
}

fn interrupt_reason(reason: InterruptReason) -> String {
    match reason {
        InterruptReason::Cancelled => "cancelled".to_owned(),
        InterruptReason::Superseded => "superseded".to_owned(),
        InterruptReason::Restart => "restart".to_owned(),
        InterruptReason::ResumeLimit => "resume limit".to_owned(),
        InterruptReason::RequestLimit { limit } => format!("request limit {limit}"),
        InterruptReason::Timeout => "timeout".to_owned(),
        InterruptReason::Shutdown => "shutdown".to_owned(),
    }
}

pub fn live_summary(event: &LiveEvent) -> String {
    match event {
        LiveEvent::StateChanged { state } => format!("state -> {state}"),
        LiveEvent::Delta { delta, .. } => match delta {
            StreamDelta::Text { text } => format!("delta {}", quote(text)),
            StreamDelta::Thinking { text } => format!("thinking {}", quote(text)),
            StreamDelta::ToolUseStarted { id, name } => format!("delta tool_use {name} ({id})"),
            StreamDelta::ToolInput { partial_json, .. } => {
                format!("delta tool input {}", quote(partial_json))
            }
        },
        LiveEvent::ToolOutput {
            tool_call_id,
            chunk,
        } => format!("tool output {tool_call_id} {}", quote(chunk)),
        LiveEvent::Retrying {
            retry,
            max_retries,
            delay_ms,
            error,
            model,
        } => format!("retry {retry}/{max_retries} of {model} in {delay_ms} ms: {error}"),
        LiveEvent::AttemptDiscarded { generation } => {
            format!("discard the deltas of {generation}")
        }
        LiveEvent::FallbackUsed { from, to, error } => {
            format!("fallback from {from} to {to}: {error}")
        }
        LiveEvent::ImageOmitted {
            generation,
            hash,
            reason,
        } => format!("image {hash} left out of {generation}: {reason}"),
        LiveEvent::ContextUsage {
            used,
            limit,
            warning,
        } => {
            let warning = match warning {
                Some(level) => format!(" ({level:?})"),
                None => String::new(),
            };
            format!("context {used}/{limit} tokens{warning}")
        }
    }
}

pub fn effect_summary(effect: &Effect) -> String {
    match effect {
        Effect::Append { events } => format!("append {} events", events.len()),
        Effect::Publish { event } => format!("publish {}", live_summary(event)),
        Effect::StartStream {
            generation, model, ..
        } => format!("start stream ({generation}) to {model}"),
        Effect::AbortStream { generation } => format!("abort stream ({generation})"),
        Effect::StartTool { call } => {
            format!("start tool {} {} {}", call.id, call.name, call.input)
        }
        Effect::SpawnSubAgents { call } => format!("spawn sub-agents for {}", call.id),
        Effect::AbortTool { tool_call_id } => format!("abort tool {tool_call_id}"),
        Effect::SetTimer { timer, at } => format!("set timer {timer:?} at {at}"),
        Effect::CancelTimer { timer } => format!("cancel timer {timer:?}"),
        Effect::SaveSnapshot => "save snapshot".to_owned(),
        Effect::Stop => "stop".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_actors::core::message::{StopReason, ToolCall, Usage};
    use keel_actors::core::{Generation, ProviderKind, ToolCallId};

    #[test]
    fn quote_escapes_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(quote("hi\n"), "\"hi\\n\"");
        let long = "é".repeat(QUOTE_CHARS + 5);
        assert_eq!(quote(&long), format!("{:?}...", "é".repeat(QUOTE_CHARS)));
        assert_eq!(
            quote(&"a".repeat(QUOTE_CHARS)),
            format!("{:?}", "a".repeat(QUOTE_CHARS))
        );
    }

    #[test]
    fn events_read_as_their_kind_and_the_essentials() {
        let tool_use = EventKind::AssistantMessage {
            blocks: vec![AssistantBlock::ToolUse {
                call: ToolCall {
                    id: ToolCallId::new("call-1-1"),
                    name: "bash".to_owned(),
                    input: serde_json::json!({ "command": "ls" }),
                },
            }],
            stop_reason: StopReason::ToolUse,
            usage: Usage::default(),
            provider: ProviderKind::Mock,
            model: "mock".to_owned(),
        };
        assert_eq!(
            event_summary(&tool_use),
            "assistant_message  tool_use call-1-1 bash {\"command\":\"ls\"}  stop=tool_use"
        );
        let interrupted = EventKind::TurnInterrupted {
            turn: 3,
            reason: InterruptReason::Cancelled,
            partial_text: Some("count slowly".to_owned()),
        };
        assert_eq!(
            event_summary(&interrupted),
            "turn_interrupted  turn 3 (cancelled) partial_text=\"count slowly\""
        );
        let result = EventKind::ToolResult {
            tool_call_id: ToolCallId::new("call-1-1"),
            content: "cancelled by the user".to_owned(),
            is_error: true,
            synthetic: true,
        };
        assert_eq!(
            event_summary(&result),
            "tool_result  call-1-1 synthetic error \"cancelled by the user\""
        );
    }

    #[test]
    fn live_events_and_effects_read_plainly() {
        let generation = Generation {
            turn: 1,
            attempt: 2,
        };
        assert_eq!(
            live_summary(&LiveEvent::StateChanged {
                state: StateName::ExecutingTools
            }),
            "state -> executing_tools"
        );
        assert_eq!(
            effect_summary(&Effect::AbortStream { generation }),
            "abort stream (turn 1 attempt 2)"
        );
    }

    #[test]
    fn json_lines_are_tagged_by_kind() {
        let mut out = Vec::new();
        let conversation = ConversationId::new("c-1").unwrap();
        let mut trace = Trace::new(&mut out, Format::Json, conversation);
        trace.scene("a scene").unwrap();
        trace.rejected(&Rejection::EmptyMessage).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines[0]["kind"], "scene");
        assert_eq!(lines[1]["kind"], "rejected");
        assert_eq!(lines[1]["rejection"]["code"], "empty_message");
    }
}
