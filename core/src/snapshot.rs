//! The small persisted fsm_state (docs/requirements.md, "Snapshots and
//! checkpoints"): only ever taken in a clean state (idle or awaiting
//! input), with the pending calls and the log position it was built from.
//! It is a cache over the log: derived from the working set, checked against
//! it, and rebuilt whenever they disagree.

use serde::{Deserialize, Serialize};

use crate::event::PendingCall;
use crate::ids::Seq;
use crate::reducer::{Status, WorkingSet};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsmSnapshot {
    pub state: SnapshotState,
    pub pending: Vec<PendingCall>,
    /// The log position the snapshot describes.
    pub last_seq: Seq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    /// No turn in flight (a failed last turn counts: it is idle with a note).
    Idle,
    AwaitingInput,
}

impl FsmSnapshot {
    /// The snapshot of `working`, or `None` where none is taken (a turn
    /// streaming or running tools, or a finished sub-agent): a turn in
    /// flight is recovered from the log, never frozen and thawed.
    pub fn of(working: &WorkingSet) -> Option<FsmSnapshot> {
        let state = match working.status() {
            Status::Idle | Status::Error => SnapshotState::Idle,
            Status::AwaitingInput => SnapshotState::AwaitingInput,
            Status::TurnInFlight | Status::Completed | Status::Failed => return None,
        };
        Some(FsmSnapshot {
            state,
            pending: working.pending.clone(),
            last_seq: working.last_seq,
        })
    }
}
