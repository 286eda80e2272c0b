//! Recovery planning: what a conversation rebuilt from its log must do after
//! a crash or restart, under its recovery policy (docs/requirements.md,
//! "Recovery after a crash or restart").

use crate::builtin::SPAWN_AGENTS;
use crate::config::RecoveryPolicy;
use crate::event::InterruptReason;
use crate::ids::Seq;
use crate::message::ToolCall;
use crate::reducer::{Status, WorkingSet};

/// Automatic resumes allowed in a row without new user input.
pub const MAX_CONSECUTIVE_RESUMES: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryPlan {
    /// Idle, failed, finished, or parked on a human (pending calls survive).
    Nothing,
    /// The log ends in a user message or tool results: nothing was
    /// dispatched, so the request is simply sent again.
    RerunRequest,
    /// The log ends in tool calls without results: run them again with the
    /// same `tool_call_id`, never re-rolling the model (that would mint new
    /// calls and repeat side effects).
    Redispatch,
    /// End the turn with synthetic results for open calls.
    Interrupt { reason: InterruptReason },
    /// No turn is in flight yet calls lack results (a damaged log): answer
    /// them so the history is valid again.
    RepairOrphans,
    /// User messages were acknowledged but no turn answered them yet (a
    /// debounce had not started it, or they were queued behind a turn a
    /// graceful shutdown interrupted), and `recovery = resume`: start the
    /// turn now, triggered by the latest of them.
    StartTurn { trigger: Seq },
    /// The same under `recovery = idle`: rest, and record plainly that they
    /// will get no turn of their own.
    LeaveUnanswered { reason: InterruptReason },
}

pub fn plan_recovery(working: &WorkingSet) -> RecoveryPlan {
    match working.status() {
        Status::Idle | Status::Error if !working.open_calls.is_empty() => {
            RecoveryPlan::RepairOrphans
        }
        Status::Idle | Status::Error => {
            match (working.config.recovery, working.untriggered.last()) {
                (_, None) => RecoveryPlan::Nothing,
                (RecoveryPolicy::Resume, Some(&trigger)) => RecoveryPlan::StartTurn { trigger },
                (RecoveryPolicy::Idle, Some(_)) => RecoveryPlan::LeaveUnanswered {
                    reason: InterruptReason::Restart,
                },
            }
        }
        Status::AwaitingInput | Status::Completed | Status::Failed => RecoveryPlan::Nothing,
        Status::TurnInFlight => match working.config.recovery {
            RecoveryPolicy::Idle => RecoveryPlan::Interrupt {
                reason: InterruptReason::Restart,
            },
            RecoveryPolicy::Resume if working.consecutive_resumes >= MAX_CONSECUTIVE_RESUMES => {
                RecoveryPlan::Interrupt {
                    reason: InterruptReason::ResumeLimit,
                }
            }
            RecoveryPolicy::Resume if working.open_calls.is_empty() => RecoveryPlan::RerunRequest,
            RecoveryPolicy::Resume => RecoveryPlan::Redispatch,
        },
    }
}

/// The `spawn_agents` call a parent's log says it still waits on, with the
/// seq of the response that made it (what its sub-agents are named after):
/// the first open call of a turn in flight. Its sub-agents are recovered
/// with it (the parent's own recovery re-dispatches the call, or closes it
/// and cancels them: `Effect::CancelSubAgents`); any other sub-agent of
/// this parent that a restart finds mid-turn is waited for by nobody (the
/// parent's cancel was durable, the cancel of its children was not) and is
/// cancelled, not resumed.
pub fn awaited_spawn(parent: &WorkingSet) -> Option<(Seq, &ToolCall)> {
    if parent.is_sub_agent() || parent.status() != Status::TurnInFlight {
        return None;
    }
    parent
        .open_calls
        .first()
        .filter(|call| call.name == SPAWN_AGENTS)
        .map(|call| (parent.calls_seq, call))
}
