//! User messages: start a turn when idle or failed (REQ-BED-002, REQ-BED-006),
//! and otherwise follow the conversation's busy policy.

use super::{turn, Ctx};
use crate::config::BusyPolicy;
use crate::effect::Effect;
use crate::event::InterruptReason;
use crate::input::Timer;
use crate::message::ImageRef;
use crate::rejection::Rejection;
use crate::state::Phase;

/// How long `busy_policy = interrupt` waits for the user to stop typing; fixed
/// (docs/requirements.md, "Interrupt with a 100 ms debounce").
pub const DEBOUNCE_MS: u64 = 100;

/// Most messages `busy_policy = queue` holds for one turn.
pub const MAX_QUEUED: usize = 32;

pub(super) fn user_message(ctx: &mut Ctx, text: String, images: Vec<ImageRef>) {
    if text.trim().is_empty() && images.is_empty() {
        return ctx.reject(Rejection::EmptyMessage);
    }
    let policy = ctx.conv.working.config.busy_policy;
    match &ctx.conv.phase {
        Phase::Completed { .. } | Phase::Failed { .. } => ctx.reject(Rejection::Finished),
        Phase::Terminating => ctx.reject(Rejection::ShuttingDown),
        Phase::Idle | Phase::Error { .. } => match policy {
            BusyPolicy::Interrupt => debounce(ctx, text, images),
            BusyPolicy::Reject | BusyPolicy::Queue => {
                let seq = ctx.emit_user_message(text, images);
                turn::begin(ctx, seq);
            }
        },
        Phase::Debouncing { .. } => debounce(ctx, text, images),
        Phase::Streaming { .. }
        | Phase::RetryWait { .. }
        | Phase::ExecutingTools { .. }
        | Phase::AwaitingInput
        | Phase::Recovering => match policy {
            BusyPolicy::Reject => {
                let state = ctx.conv.phase.name();
                ctx.reject(Rejection::Busy { state });
            }
            BusyPolicy::Interrupt => {
                turn::interrupt(ctx, InterruptReason::Superseded);
                debounce(ctx, text, images);
            }
            BusyPolicy::Queue => {
                let working = &ctx.conv.working;
                // Outside a turn (a compaction a user asked for), waiting
                // messages are owed a turn rather than queued.
                if working.queued.len().max(working.untriggered.len()) >= MAX_QUEUED {
                    return ctx.reject(Rejection::QueueFull { limit: MAX_QUEUED });
                }
                // The reducer holds a message that arrives mid-turn until the
                // turn ends; the turn's ending (`turn.rs`) answers it.
                ctx.emit_user_message(text, images);
            }
        },
    }
}

/// Record the message now (it is acknowledged, so it must be durable) and
/// start the turn only once no other message arrives for `DEBOUNCE_MS`.
fn debounce(ctx: &mut Ctx, text: String, images: Vec<ImageRef>) {
    // A later message re-arms the debounce: the earlier timer is of no use.
    if let Phase::Debouncing { token } = ctx.conv.phase {
        ctx.effect(Effect::CancelTimer {
            timer: Timer::Debounce { token },
        });
    }
    let token = ctx.emit_user_message(text, images);
    ctx.set_phase(Phase::Debouncing { token });
    let at = ctx.now.plus_millis(DEBOUNCE_MS);
    ctx.effect(Effect::SetTimer {
        timer: Timer::Debounce { token },
        at,
    });
}

pub(super) fn debounce_elapsed(ctx: &mut Ctx, token: crate::ids::Seq) {
    match ctx.conv.phase {
        Phase::Debouncing { token: current } if current == token => {
            turn::begin(ctx, token);
        }
        // A later message re-armed the debounce, or the turn was cancelled.
        _ => {}
    }
}
