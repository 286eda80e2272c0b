//! One turn, as `keel send` and `keel chat` show it: [`Printer`] renders
//! the event stream's frames as they come (streamed text, tool calls and
//! their output, retries), or as JSON lines; [`TurnWatch`] tells from the
//! canonical events when the turn a message started has ended, and how.
//! `send` is here too: open the stream, post the message, follow to the
//! end, and turn the ending into the exit code.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use serde_json::Value;

use super::output::{self, Paint};
use super::Exit;
use keel_api::client::{self, Client, Events, Frame};
use keel_api::types::{
    ApiContent, ApiEventKind, ApiLiveEvent, ApiPendingCall, ApiPendingKind, ApiState, SendMessage,
};

/// How the turn a message started came to rest.
#[derive(Debug, Clone)]
pub enum Ending {
    Completed,
    Failed {
        error: String,
    },
    Interrupted {
        reason: String,
    },
    /// It waits for a decision on these calls.
    Pending {
        calls: Vec<ApiPendingCall>,
    },
}

impl Ending {
    /// The exit code `keel send` ends with.
    pub fn exit(&self) -> Exit {
        match self {
            Ending::Completed => Exit::Ok,
            Ending::Failed { .. } => Exit::TurnFailed,
            Ending::Interrupted { .. } => Exit::Interrupted,
            Ending::Pending { .. } => Exit::Pending,
        }
    }
}

/// Watches the canonical events after a message for the end of the turn
/// it started. That is not simply the next turn's end: a message queued
/// behind a running turn (`busy_policy = queue`), or one that interrupts
/// it, comes before that turn's end, so only the turn started after the
/// message counts.
#[derive(Debug)]
pub struct TurnWatch {
    /// The seq of the message: earlier events belong to other turns.
    message_seq: u64,
    /// A turn started after the message: it is the message's.
    started: bool,
    /// Its number, once seen (unknown when watching a turn already under
    /// way, [`TurnWatch::in_progress`]).
    turn: Option<u32>,
}

impl TurnWatch {
    /// The turn of the message stored at `message_seq`.
    pub fn new(message_seq: u64) -> TurnWatch {
        TurnWatch {
            message_seq,
            started: false,
            turn: None,
        }
    }

    /// The turn under way after seq `after_seq` (one that waits for a
    /// decision, say).
    pub fn in_progress(after_seq: u64) -> TurnWatch {
        TurnWatch {
            message_seq: after_seq,
            started: true,
            turn: None,
        }
    }

    /// The ending `frame` means, if it is one.
    pub fn observe(&mut self, frame: &Frame) -> Option<Ending> {
        // A sub-agent of the turn's `spawn_agents` call waits for a
        // decision: the turn waits on it as on its own calls (nobody
        // watches the sub-agent), and it is decided through this
        // conversation.
        if let Frame::Live(ApiLiveEvent::ChildPending { pending, .. }) = frame {
            return (self.started && !pending.is_empty()).then(|| Ending::Pending {
                calls: pending.clone(),
            });
        }
        let Frame::Canonical(event) = frame else {
            return None;
        };
        if event.seq <= self.message_seq {
            return None;
        }
        let mine = |turn: &u32| self.started && self.turn.is_none_or(|mine| mine == *turn);
        match &event.kind {
            ApiEventKind::TurnStarted { turn } if !self.started => {
                self.started = true;
                self.turn = Some(*turn);
                None
            }
            ApiEventKind::TurnCompleted { turn, .. } if mine(turn) => Some(Ending::Completed),
            ApiEventKind::TurnFailed { turn, error } if mine(turn) => Some(Ending::Failed {
                error: error.clone(),
            }),
            ApiEventKind::TurnInterrupted { turn, reason, .. } if mine(turn) => {
                Some(Ending::Interrupted {
                    reason: reason.clone(),
                })
            }
            ApiEventKind::Suspended { pending } if self.started => Some(Ending::Pending {
                calls: pending.clone(),
            }),
            // The message got no turn of its own (cancelled while it
            // waited, say).
            ApiEventKind::Unanswered { messages, reason }
                if messages.contains(&self.message_seq) =>
            {
                Some(Ending::Interrupted {
                    reason: reason.clone(),
                })
            }
            _ => None,
        }
    }
}

/// Renders frames for people (or as JSON lines) as they arrive.
pub struct Printer {
    json: bool,
    paint: Paint,
    /// Text deltas were printed since the last assistant message, so its
    /// text is already on screen.
    streamed_text: bool,
    /// Calls whose output was streamed, so their result need not repeat it.
    streamed_output: HashSet<String>,
    /// The cursor is at the start of a line.
    at_line_start: bool,
    /// An outage was reported and no frame has come since.
    reconnecting: bool,
}

impl Printer {
    pub fn new(json: bool) -> Printer {
        Printer {
            json,
            paint: Paint::stdout(),
            streamed_text: false,
            streamed_output: HashSet::new(),
            at_line_start: true,
            reconnecting: false,
        }
    }

    /// Print `frame`. In JSON mode every frame but the snapshot is one
    /// line (`{"frame": …, "data": …}`).
    pub fn frame(&mut self, frame: &Frame) -> anyhow::Result<()> {
        if self.json {
            if !matches!(frame, Frame::Snapshot(_)) {
                output::json_line(frame)?;
            }
            return Ok(());
        }
        if self.reconnecting && !matches!(frame, Frame::Reconnecting { .. }) {
            self.reconnecting = false;
            self.note(&self.paint.dim("(reconnected)"));
        }
        match frame {
            Frame::Snapshot(_) => {}
            Frame::Live(live) => self.live(live)?,
            Frame::Canonical(event) => self.canonical(&event.kind)?,
            Frame::Error(error) => {
                self.note(
                    &self
                        .paint
                        .yellow(&format!("stream error: {}", error.message)),
                );
            }
            Frame::Reconnecting { error } => {
                self.reconnecting = true;
                self.note(
                    &self
                        .paint
                        .yellow(&format!("connection lost ({error}); reconnecting…")),
                );
            }
        }
        Ok(())
    }

    fn live(&mut self, live: &ApiLiveEvent) -> anyhow::Result<()> {
        match live {
            ApiLiveEvent::TextDelta { text, .. } => {
                self.streamed_text = true;
                self.write(text)?;
            }
            ApiLiveEvent::ToolOutput {
                tool_call_id,
                chunk,
            } => {
                self.streamed_output.insert(tool_call_id.clone());
                let chunk = self.paint.dim(chunk);
                self.write(&chunk)?;
            }
            ApiLiveEvent::Retrying {
                retry,
                max_retries,
                delay_ms,
                error,
                ..
            } => self.note(&self.paint.yellow(&format!(
                "retrying ({retry}/{max_retries}) in {}: {error}",
                output::duration(*delay_ms)
            ))),
            ApiLiveEvent::AttemptDiscarded { .. } => {
                self.streamed_text = false;
                self.note(&self.paint.yellow("(that attempt is discarded; retrying)"));
            }
            ApiLiveEvent::FallbackUsed { to, error, .. } => {
                self.note(&self.paint.yellow(&format!("falling back to {to}: {error}")));
            }
            ApiLiveEvent::ContextUsage {
                used,
                limit,
                warning: Some(warning),
            } => self.note(
                &self
                    .paint
                    .yellow(&format!("context {warning}: {used} of {limit} tokens")),
            ),
            // A sub-agent's end is worth a line; its steps are in its own log.
            ApiLiveEvent::ChildState {
                task_idx,
                child,
                state: state @ (ApiState::Completed | ApiState::Failed),
                ..
            } => {
                let ended = if *state == ApiState::Completed {
                    "completed"
                } else {
                    "failed"
                };
                let line = format!("sub-agent {} ({child}) {ended}", task_idx + 1);
                self.note(&self.paint.dim(&line));
            }
            ApiLiveEvent::CompactionFailed { error } => {
                let note = format!("compaction failed; the conversation is as it was: {error}");
                self.note(&self.paint.red(&note));
            }
            // What it waits on is said where the turn stops for it
            // (`pending_help`, or `keel chat`'s question).
            ApiLiveEvent::StateChanged { .. }
            | ApiLiveEvent::ChildPending { .. }
            | ApiLiveEvent::ChildState { .. }
            | ApiLiveEvent::ThinkingDelta { .. }
            | ApiLiveEvent::ToolUseStarted { .. }
            | ApiLiveEvent::ToolInputDelta { .. }
            | ApiLiveEvent::ImageOmitted { .. }
            | ApiLiveEvent::ContextUsage { warning: None, .. }
            | ApiLiveEvent::Lagged { .. } => {}
        }
        Ok(())
    }

    fn canonical(&mut self, kind: &ApiEventKind) -> anyhow::Result<()> {
        match kind {
            ApiEventKind::AssistantMessage { content, .. } => {
                for block in content {
                    match block {
                        ApiContent::Text { text } if !self.streamed_text => self.write(text)?,
                        ApiContent::ToolUse { name, input, .. } => {
                            let call = format!("▶ {name}: {}", tool_input(input));
                            self.note(&self.paint.cyan(&call));
                        }
                        _ => {}
                    }
                }
                self.streamed_text = false;
            }
            ApiEventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                images,
                ..
            } => {
                if !self.streamed_output.contains(tool_call_id) && !content.is_empty() {
                    let content = self.paint.dim(content);
                    self.write(&content)?;
                }
                let verdict = if *is_error {
                    self.paint.red("✗ failed")
                } else {
                    self.paint.green("✓ done")
                };
                let verdict = match images.len() {
                    0 => verdict,
                    1 => format!("{verdict} {}", self.paint.dim("(1 image)")),
                    n => format!("{verdict} {}", self.paint.dim(&format!("({n} images)"))),
                };
                self.note(&verdict);
            }
            ApiEventKind::Resolved {
                tool_call_id,
                decision,
                ..
            } => {
                let decision = serde_json::to_value(decision)
                    .ok()
                    .and_then(|value| value.as_str().map(str::to_owned))
                    .unwrap_or_default();
                self.note(&self.paint.dim(&format!("{tool_call_id}: {decision}")));
            }
            ApiEventKind::TurnFailed { error, .. } => {
                self.note(&self.paint.red(&format!("turn failed: {error}")));
            }
            ApiEventKind::TurnInterrupted { reason, .. } => {
                self.note(&self.paint.yellow(&format!("interrupted ({reason})")));
            }
            ApiEventKind::TurnCompleted { .. } => self.end_line()?,
            ApiEventKind::Compacted {
                summary,
                tokens_before,
                tokens_after,
                ..
            } => {
                let how = if summary.is_some() {
                    "compacted the earlier conversation into a summary"
                } else {
                    "left the earlier conversation out (no summary could be had)"
                };
                let note = format!("{how}: about {tokens_before} → {tokens_after} tokens");
                self.note(&self.paint.yellow(&note));
            }
            ApiEventKind::Rewound { to_seq, messages } => {
                let note = format!("rewound to seq {to_seq} ({messages} messages in the prompt)");
                self.note(&self.paint.yellow(&note));
            }
            _ => {}
        }
        Ok(())
    }

    /// Say which calls wait and how to decide them (`keel send`).
    pub fn pending_help(&mut self, id: &str, calls: &[ApiPendingCall]) {
        if self.json {
            return;
        }
        for call in calls {
            let how = match call.kind {
                ApiPendingKind::Approval => format!(
                    "keel approve {id} {call_id}   or   keel deny {id} {call_id}",
                    call_id = call.tool_call_id
                ),
                ApiPendingKind::Elicitation | ApiPendingKind::ClientExec => format!(
                    "keel answer {id} {call_id} TEXT   or   keel deny {id} {call_id}",
                    call_id = call.tool_call_id
                ),
            };
            let whose = match &call.conversation {
                Some(child) => format!(" (sub-agent {child})"),
                None => String::new(),
            };
            self.note(&self.paint.yellow(&format!(
                "waiting for a decision on {} {}{whose}: {}",
                call.name,
                call.tool_call_id,
                call.prompt.clone().unwrap_or_else(|| tool_input(&call.input))
            )));
            self.note(&format!("  {how}"));
        }
    }

    /// End the current line, if text was left on it.
    pub fn end_line(&mut self) -> anyhow::Result<()> {
        if !self.at_line_start {
            self.write("\n")?;
        }
        Ok(())
    }

    fn write(&mut self, text: &str) -> anyhow::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        self.at_line_start = text.ends_with('\n');
        Ok(())
    }

    /// A line of its own (starting a new one if text is on the current).
    fn note(&mut self, line: &str) {
        let _ = self.end_line();
        let _ = self.write(&format!("{line}\n"));
    }
}

/// A tool call's input for people: a bash command as it is, anything else
/// as compact JSON.
pub fn tool_input(input: &Value) -> String {
    match input.get("command").and_then(Value::as_str) {
        Some(command) => command.to_owned(),
        None => input.to_string(),
    }
}

/// `keel send`: stream the turn `text` starts; the exit code says how it
/// ended.
pub async fn send(
    client: &Client,
    id: &str,
    text: String,
    images: &[PathBuf],
    json: bool,
) -> anyhow::Result<Exit> {
    let images = images
        .iter()
        .map(|path| client::image_body(path))
        .collect::<Result<Vec<_>, _>>()?;
    // Follow first, so nothing of the turn is missed: the snapshot means
    // the subscription is in place.
    let mut events = client.events(id, None);
    let waiting = output::spinner("connecting");
    loop {
        if let Frame::Snapshot(_) = events.next().await? {
            break;
        }
    }
    waiting.set_message("waiting for the reply");
    let accepted = client.send(id, &SendMessage { text, images }).await;
    let accepted = match accepted {
        Ok(accepted) => accepted,
        Err(error) => {
            waiting.finish_and_clear();
            return Err(error.into());
        }
    };
    let mut printer = Printer::new(json);
    let ending = follow(&mut events, accepted.seq, &mut printer, Some(waiting)).await?;
    if let Ending::Pending { calls } = &ending {
        printer.pending_help(id, calls);
    }
    printer.end_line()?;
    Ok(ending.exit())
}

/// Print frames until the turn of the message at `message_seq` ends;
/// `spinner` is cleared at the first frame of the turn.
pub async fn follow(
    events: &mut Events,
    message_seq: u64,
    printer: &mut Printer,
    mut spinner: Option<indicatif::ProgressBar>,
) -> anyhow::Result<Ending> {
    let mut watch = TurnWatch::new(message_seq);
    loop {
        let frame = events.next().await?;
        if is_output(&frame) {
            if let Some(spinner) = spinner.take() {
                spinner.finish_and_clear();
            }
        }
        printer.frame(&frame)?;
        if let Some(ending) = watch.observe(&frame) {
            if let Some(spinner) = spinner.take() {
                spinner.finish_and_clear();
            }
            return Ok(ending);
        }
    }
}

/// A frame that prints something (the spinner gives way to it).
pub fn is_output(frame: &Frame) -> bool {
    match frame {
        Frame::Live(live) => matches!(
            live,
            ApiLiveEvent::TextDelta { .. }
                | ApiLiveEvent::ToolOutput { .. }
                | ApiLiveEvent::Retrying { .. }
        ),
        Frame::Canonical(event) => matches!(
            event.kind,
            ApiEventKind::AssistantMessage { .. } | ApiEventKind::ToolResult { .. }
        ),
        Frame::Reconnecting { .. } | Frame::Error(_) => true,
        Frame::Snapshot(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_api::types::ApiEvent;

    fn canonical(seq: u64, kind: ApiEventKind) -> Frame {
        Frame::Canonical(ApiEvent {
            id: format!("c:{seq}"),
            seq,
            at_ms: 0,
            parent: None,
            triggers_turn: false,
            kind,
        })
    }

    fn completed(seq: u64, turn: u32) -> Frame {
        canonical(
            seq,
            ApiEventKind::TurnCompleted {
                turn,
                duration_ms: 1,
                note: None,
            },
        )
    }

    #[test]
    fn only_the_turn_started_after_the_message_ends_its_watch() {
        let mut watch = TurnWatch::new(10);
        assert!(
            watch.observe(&completed(9, 1)).is_none(),
            "a previous turn's end"
        );
        // Queued behind turn 1: its end comes after the message.
        assert!(
            watch.observe(&completed(11, 1)).is_none(),
            "the running turn's end"
        );
        assert!(watch
            .observe(&canonical(12, ApiEventKind::TurnStarted { turn: 2 }))
            .is_none());
        let failed = canonical(
            13,
            ApiEventKind::TurnFailed {
                turn: 2,
                error: "boom".to_owned(),
            },
        );
        let ending = watch.observe(&failed);
        assert!(matches!(ending, Some(Ending::Failed { .. })), "{ending:?}");
        assert_eq!(ending.map(|ending| ending.exit()), Some(Exit::TurnFailed));
    }

    #[test]
    fn a_message_that_got_no_turn_ends_its_watch() {
        let mut watch = TurnWatch::new(10);
        let other = canonical(
            11,
            ApiEventKind::Unanswered {
                messages: vec![7],
                reason: "cancelled".to_owned(),
            },
        );
        assert!(watch.observe(&other).is_none(), "another message's");
        let unanswered = canonical(
            12,
            ApiEventKind::Unanswered {
                messages: vec![10],
                reason: "cancelled".to_owned(),
            },
        );
        assert!(matches!(
            watch.observe(&unanswered),
            Some(Ending::Interrupted { .. })
        ));
    }

    #[test]
    fn a_turn_under_way_ends_at_its_next_end() {
        let mut watch = TurnWatch::in_progress(20);
        assert!(matches!(
            watch.observe(&completed(21, 4)),
            Some(Ending::Completed)
        ));
    }

    #[test]
    fn a_bash_call_shows_its_command() {
        assert_eq!(
            tool_input(&serde_json::json!({"command": "ls -l"})),
            "ls -l"
        );
        assert_eq!(tool_input(&serde_json::json!({"q": 1})), r#"{"q":1}"#);
    }
}
