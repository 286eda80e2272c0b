//! Fork and rewind: a conversation's history taken back to a turn boundary
//! (docs/history.md).
//!
//! A boundary is a seq after which nothing of a turn is in flight: no turn
//! runs, no tool call waits for its result and no acknowledged message
//! waits for its turn. The working set there is whole: a fork copies the
//! log up to it, a rewind makes its prompt the conversation's prompt again.
//! Both are pure functions of the log here; the shell reads the log and
//! carries them out.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::{Event, EventKind, ForkOrigin};
use crate::ids::{ConversationId, Seq};
use crate::reducer::{ReplayError, WorkingSet};

/// Whether `working` stands at a turn boundary.
pub fn is_boundary(working: &WorkingSet) -> bool {
    working.current_turn.is_none()
        && working.open_calls.is_empty()
        && working.queued.is_empty()
        && working.untriggered.is_empty()
}

/// Why history cannot be taken back to a seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HistoryError {
    /// The log ends before `seq` (or `seq` is 0).
    OutOfRange { seq: Seq, last_seq: Seq },
    /// `seq` falls inside a turn; the nearest boundaries before and after
    /// it, where there are any.
    NotABoundary {
        seq: Seq,
        before: Option<Seq>,
        after: Option<Seq>,
    },
    /// A sub-agent's history belongs to the `spawn_agents` call that
    /// started it: it is neither forked nor rewound on its own.
    SubAgent,
    /// The events are not a conversation's log.
    Replay { reason: String },
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::OutOfRange { seq, last_seq } => {
                write!(f, "seq {seq} is not in the log, which runs from 1 to {last_seq}")
            }
            HistoryError::NotABoundary { seq, before, after } => {
                write!(f, "seq {seq} is inside a turn, not at a turn boundary")?;
                match (before, after) {
                    (Some(before), Some(after)) => {
                        write!(f, "; the nearest boundaries are {before} and {after}")
                    }
                    (Some(before), None) => write!(
                        f,
                        "; the nearest boundary is {before} (the turn after it is still in flight)"
                    ),
                    (None, Some(after)) => write!(f, "; the nearest boundary is {after}"),
                    (None, None) => Ok(()),
                }
            }
            HistoryError::SubAgent => write!(
                f,
                "a sub-agent's history belongs to the call that started it; fork or rewind its parent"
            ),
            HistoryError::Replay { reason } => write!(f, "the log cannot be replayed: {reason}"),
        }
    }
}

impl std::error::Error for HistoryError {}

/// The working set at `seq`, which must be a turn boundary: a replay of
/// the log up to it. The log is read no further than the first boundary
/// after `seq` (to name it when `seq` is none).
pub fn working_at<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    seq: Seq,
) -> Result<WorkingSet, HistoryError> {
    let mut events = events.into_iter();
    let first = events.next().ok_or(replay(ReplayError::Empty))?;
    let mut working = WorkingSet::from_created(first)
        .ok_or(replay(ReplayError::NotCreated { seq: first.seq }))?;
    if working.is_sub_agent() {
        return Err(HistoryError::SubAgent);
    }
    if seq == 0 {
        return Err(HistoryError::OutOfRange {
            seq,
            last_seq: last_seq_of(working, events)?,
        });
    }
    let mut before = None;
    loop {
        let at = working.last_seq;
        let boundary = is_boundary(&working);
        if at == seq && boundary {
            return Ok(working);
        }
        if at > seq && boundary {
            return Err(HistoryError::NotABoundary {
                seq,
                before,
                after: Some(at),
            });
        }
        if at < seq && boundary {
            before = Some(at);
        }
        let Some(event) = events.next() else {
            return Err(if at < seq {
                HistoryError::OutOfRange { seq, last_seq: at }
            } else {
                HistoryError::NotABoundary {
                    seq,
                    before,
                    after: None,
                }
            });
        };
        if event.seq != at + 1 {
            return Err(replay(ReplayError::Gap {
                expected: at + 1,
                found: event.seq,
            }));
        }
        working.apply(event);
    }
}

fn replay(error: ReplayError) -> HistoryError {
    HistoryError::Replay {
        reason: error.to_string(),
    }
}

fn last_seq_of<'a>(
    working: WorkingSet,
    events: impl Iterator<Item = &'a Event>,
) -> Result<Seq, HistoryError> {
    Ok(events.last().map_or(working.last_seq, |event| event.seq))
}

/// The log of a fork of `source` at `seq`, as the new conversation `id`:
/// the source's events 2 to `seq` after a `Created` that names `id` and
/// records where it came from. `seq` must be a turn boundary. The source
/// is not touched.
pub fn fork_log(
    source: &[Event],
    seq: Seq,
    id: ConversationId,
) -> Result<Vec<Event>, HistoryError> {
    working_at(source, seq)?;
    let mut events: Vec<Event> = source
        .iter()
        .take_while(|event| event.seq <= seq)
        .cloned()
        .collect();
    let Some(Event {
        kind:
            EventKind::Created {
                conversation,
                parent_conversation,
                user_initiated,
                forked_from,
                ..
            },
        ..
    }) = events.first_mut()
    else {
        // `working_at` checked that the log starts with `Created`.
        return Err(replay(ReplayError::Empty));
    };
    *forked_from = Some(ForkOrigin {
        conversation: std::mem::replace(conversation, id),
        seq,
    });
    *parent_conversation = None;
    *user_initiated = true;
    Ok(events)
}
