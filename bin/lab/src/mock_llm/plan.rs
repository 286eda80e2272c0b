//! A response body as data: the SSE frames to send, how fast, and what
//! happens after the last one (end, drop the connection, or stall). The wire
//! modules render frames; `plan` applies a scripted `Ending` to them; the
//! `body` module carries a plan out.

use std::time::Duration;

use super::script::{Ending, ErrorSpec};

/// One piece of a response body, usually one SSE event (`event:`/`data:`
/// lines and the blank line after them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub text: String,
    /// A content delta: a slow drip waits before each of these.
    pub is_delta: bool,
    /// Sending it completes the exchange, though frames may follow: an
    /// in-stream error, after which a client may go at once (OpenAI's
    /// `[DONE]` after it is a courtesy nobody need read). The last frame
    /// of a body that ends completes it too.
    pub completes: bool,
}

impl PlannedEvent {
    pub fn event(text: String) -> PlannedEvent {
        PlannedEvent {
            text,
            is_delta: false,
            completes: false,
        }
    }

    pub fn delta(text: String) -> PlannedEvent {
        PlannedEvent {
            text,
            is_delta: true,
            completes: false,
        }
    }
}

/// A whole stream as the provider would send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frames {
    pub events: Vec<PlannedEvent>,
    /// Index of the first closing event (`content_block_stop` of the last
    /// block, `message_delta`, `message_stop`; the finish, usage and
    /// `[DONE]` chunks): an in-stream error replaces everything from here.
    pub closing: usize,
}

/// What the body does once its frames are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// End the body properly.
    End,
    /// Fail the body, so the server drops the connection mid-response.
    Abort,
    /// Send nothing more and keep the connection open until the client
    /// goes away.
    Stall,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub frames: Vec<PlannedEvent>,
    pub drip: Option<Duration>,
    pub after: After,
}

impl Plan {
    /// Every frame at once, then the end.
    pub fn whole(frames: Vec<PlannedEvent>) -> Plan {
        Plan {
            frames,
            drip: None,
            after: After::End,
        }
    }
}

/// The plan for a stream that ends as `ending` says. `error_frames` renders
/// an in-stream error in the endpoint's format.
pub fn plan(
    stream: Frames,
    ending: &Ending,
    drip_ms: Option<u64>,
    error_frames: impl FnOnce(&ErrorSpec) -> Vec<PlannedEvent>,
) -> Plan {
    let Frames {
        mut events,
        closing,
    } = stream;
    let after = match ending {
        Ending::Complete => After::End,
        Ending::Cut {
            after_events,
            clean_eof,
        } => {
            events.truncate(*after_events);
            if *clean_eof {
                After::End
            } else {
                After::Abort
            }
        }
        Ending::Stall { after_events } => {
            events.truncate(*after_events);
            After::Stall
        }
        Ending::Error(error) => {
            events.truncate(closing);
            let mut error = error_frames(error);
            if let Some(first) = error.first_mut() {
                first.completes = true;
            }
            events.extend(error);
            After::End
        }
    };
    Plan {
        frames: events,
        drip: drip_ms.map(Duration::from_millis),
        after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Frames {
        Frames {
            events: vec![
                PlannedEvent::event("start".to_owned()),
                PlannedEvent::delta("a".to_owned()),
                PlannedEvent::delta("b".to_owned()),
                PlannedEvent::event("stop".to_owned()),
                PlannedEvent::event("done".to_owned()),
            ],
            closing: 3,
        }
    }

    fn texts(plan: &Plan) -> Vec<&str> {
        plan.frames
            .iter()
            .map(|frame| frame.text.as_str())
            .collect()
    }

    fn no_error(_: &ErrorSpec) -> Vec<PlannedEvent> {
        unreachable!("no error ending here")
    }

    #[test]
    fn each_ending_shapes_the_plan() {
        let complete = plan(frames(), &Ending::Complete, Some(5), no_error);
        assert_eq!(texts(&complete), ["start", "a", "b", "stop", "done"]);
        assert_eq!(complete.after, After::End);
        assert_eq!(complete.drip, Some(Duration::from_millis(5)));

        let cut = Ending::Cut {
            after_events: 2,
            clean_eof: false,
        };
        let cut = plan(frames(), &cut, None, no_error);
        assert_eq!((texts(&cut), cut.after), (vec!["start", "a"], After::Abort));

        let eof = Ending::Cut {
            after_events: 9,
            clean_eof: true,
        };
        let eof = plan(frames(), &eof, None, no_error);
        assert_eq!((eof.frames.len(), eof.after), (5, After::End));

        let stall = plan(frames(), &Ending::Stall { after_events: 0 }, None, no_error);
        assert_eq!((stall.frames.len(), stall.after), (0, After::Stall));

        let error = Ending::Error(ErrorSpec {
            kind: "overloaded_error".to_owned(),
            message: "Overloaded".to_owned(),
        });
        let error = plan(frames(), &error, None, |spec| {
            vec![PlannedEvent::event(format!("error {}", spec.kind))]
        });
        assert_eq!(texts(&error), ["start", "a", "b", "error overloaded_error"]);
        assert_eq!(error.after, After::End);
        let completing: Vec<bool> = error.frames.iter().map(|frame| frame.completes).collect();
        assert_eq!(completing, [false, false, false, true]);
    }
}
