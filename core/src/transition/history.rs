//! What a user does to a conversation's history rather than to its turn:
//! compact it now (docs/compaction.md) and rewind it to a turn boundary
//! (docs/history.md). Both are refused while a turn runs.

use std::sync::Arc;

use super::{turn, Ctx};
use crate::compaction;
use crate::event::{EventKind, InterruptReason};
use crate::history::{self, HistoryError};
use crate::ids::Seq;
use crate::reducer::WorkingSet;
use crate::rejection::Rejection;
use crate::state::Phase;

/// Refuse the input unless the conversation rests (`waiting_ok`: or waits
/// on a human); `true` when it may go on.
fn at_rest(ctx: &mut Ctx, waiting_ok: bool) -> bool {
    if ctx.conv.working.is_sub_agent() {
        ctx.reject(Rejection::SubAgentHistory);
        return false;
    }
    let rejection = match &ctx.conv.phase {
        Phase::Idle | Phase::Error { .. } => return true,
        Phase::AwaitingInput if waiting_ok => return true,
        Phase::Completed { .. } | Phase::Failed { .. } => Rejection::Finished,
        Phase::Terminating => Rejection::ShuttingDown,
        phase @ (Phase::Debouncing { .. }
        | Phase::Streaming { .. }
        | Phase::RetryWait { .. }
        | Phase::ExecutingTools { .. }
        | Phase::AwaitingInput
        | Phase::Recovering) => Rejection::Busy {
            state: phase.name(),
        },
    };
    ctx.reject(rejection);
    false
}

/// Summarise everything before the latest turn now; the conversation is
/// `compacting` until the summary is recorded (or could not be had, which
/// changes nothing), then rests again.
pub(super) fn compact(ctx: &mut Ctx) {
    if !at_rest(ctx, false) {
        return;
    }
    match compaction::plan_on_demand(&ctx.conv.working) {
        Some(plan) => turn::summarise(ctx, plan),
        None => ctx.reject(Rejection::NothingToCompact),
    }
}

/// Make the prompt the one at `to_seq` again. A turn waiting on a human is
/// called off first: its pending calls get synthetic results and the turn
/// ends interrupted. Rewinding to the end of the log changes nothing.
pub(super) fn rewind(ctx: &mut Ctx, to_seq: Seq, at: Result<Box<WorkingSet>, HistoryError>) {
    if !at_rest(ctx, true) {
        return;
    }
    let working = &ctx.conv.working;
    let last_seq = working.last_seq;
    let at = match at {
        Ok(at) if at.id == working.id && at.last_seq == to_seq && history::is_boundary(&at) => at,
        Ok(_) => {
            // Not what `working_at` makes: a shell's mistake, refused all the same.
            let error = HistoryError::NotABoundary {
                seq: to_seq,
                before: None,
                after: None,
            };
            return ctx.reject(Rejection::History { error });
        }
        Err(error) => return ctx.reject(Rejection::History { error }),
    };
    if to_seq >= last_seq {
        return;
    }
    if ctx.conv.phase == Phase::AwaitingInput {
        turn::interrupt(ctx, InterruptReason::Rewound);
    }
    ctx.emit(EventKind::Rewound {
        to_seq,
        messages: Arc::unwrap_or_clone(at.messages),
        message_seqs: at.message_seqs,
    });
    ctx.set_phase(Phase::Idle);
}
