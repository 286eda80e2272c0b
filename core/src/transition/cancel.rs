//! Cancellation from every state (REQ-BED-005): stop the workers or the
//! pending timer, give every open tool call a synthetic result, record the
//! turn as interrupted (with any partial text, for display only), and go
//! idle. A sub-agent fails instead, in every state but a terminal one:
//! also before its task arrived and while its task waits out a debounce. The interrupt itself is a turn's ending and lives in `turn.rs`.

use super::{turn, Ctx};
use crate::effect::Effect;
use crate::event::{InterruptReason, SubAgentOutcome};
use crate::input::Timer;
use crate::state::Phase;

pub(super) fn cancel(ctx: &mut Ctx) {
    let sub_agent = ctx.conv.working.is_sub_agent();
    match &ctx.conv.phase {
        // A sub-agent fails whatever it was doing, even before its task
        // arrived or while its task waits out a debounce: a cancelled
        // sub-agent never lingers until its deadline.
        Phase::Idle | Phase::Error { .. } if sub_agent => {
            let owed = ctx.conv.working.untriggered.clone();
            turn::unanswered(ctx, owed, InterruptReason::Cancelled);
            turn::finish_sub_agent(
                ctx,
                SubAgentOutcome::Failed {
                    reason: "cancelled".to_owned(),
                },
            );
        }
        // Nothing runs: cancel is a no-op, and Error keeps its message.
        Phase::Idle
        | Phase::Error { .. }
        | Phase::Terminating
        | Phase::Completed { .. }
        | Phase::Failed { .. } => {}
        // The messages are already durable; only the turn is called off, and
        // durably so, or a restart would start it. No turn started, so the
        // log still says what it said before the first message: Idle, or
        // Error if the last turn failed.
        Phase::Debouncing { token } => {
            let token = *token;
            ctx.effect(Effect::CancelTimer {
                timer: Timer::Debounce { token },
            });
            let owed = ctx.conv.working.untriggered.clone();
            turn::unanswered(ctx, owed, InterruptReason::Cancelled);
            if sub_agent {
                turn::finish_sub_agent(
                    ctx,
                    SubAgentOutcome::Failed {
                        reason: "cancelled".to_owned(),
                    },
                );
            } else {
                ctx.set_phase(Phase::from_status(&ctx.conv.working));
            }
        }
        // A compaction a user asked for: called off, nothing recorded.
        phase if phase.compacting_on_demand() => {
            turn::stop_compaction(ctx, InterruptReason::Cancelled);
        }
        Phase::Streaming { .. }
        | Phase::RetryWait { .. }
        | Phase::ExecutingTools { .. }
        | Phase::AwaitingInput
        | Phase::Recovering => {
            if sub_agent {
                let stopped = turn::stop_work(ctx);
                turn::fail_sub_agent(
                    ctx,
                    InterruptReason::Cancelled,
                    "cancelled".to_owned(),
                    stopped,
                );
            } else {
                turn::interrupt(ctx, InterruptReason::Cancelled);
            }
        }
    }
}
