//! Lifecycle: creating a conversation, an actor (re)starting on it and
//! recovering a turn the last one left in flight, timers, configuration
//! changes, and stopping.

use super::{message, stream, tools, turn, Ctx, Step};
use crate::config::ConversationConfig;
use crate::effect::Effect;
use crate::event::{Event, EventKind, InterruptReason, RecoveryAction};
use crate::ids::ConversationId;
use crate::input::Timer;
use crate::recovery::{plan_recovery, RecoveryPlan};
use crate::reducer::WorkingSet;
use crate::rejection::Rejection;
use crate::state::{Conversation, Phase, Slot};
use crate::time::Timestamp;

/// What a new conversation is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct NewConversation {
    pub id: ConversationId,
    pub cwd: String,
    pub config: ConversationConfig,
    /// Set for sub-agents.
    pub parent_conversation: Option<ConversationId>,
}

/// Create a conversation: `Created` and `SessionStarted`, and for a
/// sub-agent its mandatory deadline.
pub fn create(new: NewConversation, now: Timestamp) -> Step {
    let user_initiated = new.parent_conversation.is_none();
    let created = Event {
        seq: 1,
        at: now,
        parent: None,
        triggers_turn: false,
        kind: EventKind::Created {
            conversation: new.id,
            cwd: new.cwd,
            config: new.config,
            parent_conversation: new.parent_conversation,
            user_initiated,
            forked_from: None,
        },
    };
    let Some(working) = WorkingSet::from_created(&created) else {
        unreachable!("invariant: a Created event at seq 1 always starts a working set")
    };
    let mut ctx = Ctx::new(
        Conversation {
            working,
            phase: Phase::Idle,
            next_attempt: 1,
        },
        now,
    );
    ctx.events.push(created);
    ctx.emit_session_started();
    arm_deadline(&mut ctx);
    ctx.finish()
}

fn arm_deadline(ctx: &mut Ctx) {
    let working = &ctx.conv.working;
    if working.is_sub_agent() && working.outcome.is_none() {
        let at = working
            .created_at
            .plus_millis(working.config.sub_agent.timeout_ms);
        ctx.effect(Effect::SetTimer {
            timer: Timer::Deadline,
            at,
        });
    }
}

/// An actor took over the conversation: record the session, then carry out
/// the recovery plan for whatever the log left in flight.
pub(super) fn started(ctx: &mut Ctx) {
    match ctx.conv.phase {
        // What a conversation rebuilt from its log can be in.
        Phase::Idle | Phase::Error { .. } | Phase::AwaitingInput | Phase::Recovering => {}
        // Already running (a duplicate Started), stopping, or finished.
        Phase::Debouncing { .. }
        | Phase::Streaming { .. }
        | Phase::RetryWait { .. }
        | Phase::ExecutingTools { .. }
        | Phase::Terminating
        | Phase::Completed { .. }
        | Phase::Failed { .. } => return,
    }
    ctx.emit_session_started();
    arm_deadline(ctx);
    match plan_recovery(&ctx.conv.working) {
        RecoveryPlan::Nothing => {}
        RecoveryPlan::RerunRequest => {
            ctx.emit(EventKind::Recovered {
                action: RecoveryAction::RerunRequest,
            });
            turn::send(ctx, Slot::Primary, 0);
        }
        RecoveryPlan::Redispatch => {
            ctx.emit(EventKind::Recovered {
                action: RecoveryAction::Redispatch,
            });
            tools::advance(ctx);
        }
        RecoveryPlan::Interrupt { reason } if ctx.conv.working.is_sub_agent() => {
            let why = "interrupted by restart".to_owned();
            turn::fail_sub_agent(ctx, reason, why, turn::Stopped::default());
        }
        RecoveryPlan::Interrupt { reason } => {
            turn::end_interrupted(ctx, reason, turn::Stopped::default());
        }
        RecoveryPlan::StartTurn { trigger } => turn::begin(ctx, trigger),
        RecoveryPlan::LeaveUnanswered { reason } => {
            let owed = ctx.conv.working.untriggered.clone();
            turn::unanswered(ctx, owed, reason);
        }
        RecoveryPlan::RepairOrphans => {
            turn::close_open_calls(ctx, "interrupted by restart");
        }
    }
}

pub(super) fn timer(ctx: &mut Ctx, timer: Timer) {
    match timer {
        Timer::Debounce { token } => message::debounce_elapsed(ctx, token),
        Timer::Retry { generation } => stream::retry_due(ctx, generation),
        Timer::Deadline => deadline(ctx),
    }
}

fn deadline(ctx: &mut Ctx) {
    let working = &ctx.conv.working;
    let timeout_ms = working.config.sub_agent.timeout_ms;
    let due = working.created_at.plus_millis(timeout_ms);
    if !working.is_sub_agent() || ctx.conv.phase.is_terminal() || ctx.now < due {
        return;
    }
    let stopped = turn::stop_work(ctx);
    let reason = format!(
        "timed out after {} s without submitting a result",
        timeout_ms / 1000
    );
    turn::fail_sub_agent(ctx, InterruptReason::Timeout, reason, stopped);
}

pub(super) fn change_config(ctx: &mut Ctx, config: ConversationConfig) {
    if ctx.conv.phase.is_terminal() {
        return ctx.reject(Rejection::Finished);
    }
    if ctx.conv.phase == Phase::Terminating {
        return ctx.reject(Rejection::ShuttingDown);
    }
    if config != ctx.conv.working.config {
        let timeout_changed =
            config.sub_agent.timeout_ms != ctx.conv.working.config.sub_agent.timeout_ms;
        // Takes effect with the next request; a request in flight goes on.
        ctx.emit(EventKind::ConfigChanged { config });
        // A sub-agent's deadline moves with its timeout, at once: the timer
        // armed for the old one would fire early and change nothing, or
        // late (`SetTimer` replaces it).
        if timeout_changed {
            arm_deadline(ctx);
        }
    }
}

/// Stop serving (idle eviction): only from a clean state (idle or awaiting
/// input, plus error and the terminal states). Mid-turn, cancel first.
pub(super) fn stop(ctx: &mut Ctx) {
    match &ctx.conv.phase {
        Phase::Idle | Phase::Error { .. } | Phase::AwaitingInput => {
            ctx.emit(EventKind::SessionEnded);
            ctx.set_phase(Phase::Terminating);
            ctx.effect(Effect::SaveSnapshot);
            ctx.effect(Effect::Stop);
        }
        // Terminal states stay what they are; the actor may still go.
        Phase::Completed { .. } | Phase::Failed { .. } => ctx.effect(Effect::Stop),
        Phase::Terminating => {}
        Phase::Debouncing { .. }
        | Phase::Streaming { .. }
        | Phase::RetryWait { .. }
        | Phase::ExecutingTools { .. }
        | Phase::Recovering => {
            let state = ctx.conv.phase.name();
            ctx.reject(crate::rejection::Rejection::Busy { state });
        }
    }
}

/// The runtime stops gracefully and this conversation's time is up
/// (docs/requirements.md, "Graceful stop"): a turn still running is
/// interrupted, so that nothing is sent to a provider again after the
/// restart; messages whose debounce had not yet started a turn, or that
/// were queued behind the interrupted turn, stay owed, and the next start
/// answers them; pending approvals stay pending. Then the session ends.
pub(super) fn shutdown(ctx: &mut Ctx) {
    match &ctx.conv.phase {
        Phase::Idle | Phase::Error { .. } | Phase::AwaitingInput => {}
        Phase::Debouncing { token } => {
            let token = *token;
            ctx.effect(Effect::CancelTimer {
                timer: Timer::Debounce { token },
            });
            ctx.set_phase(Phase::from_status(&ctx.conv.working));
        }
        Phase::Streaming { .. }
        | Phase::RetryWait { .. }
        | Phase::ExecutingTools { .. }
        | Phase::Recovering => {
            if ctx.conv.working.is_sub_agent() {
                let stopped = turn::stop_work(ctx);
                let why = "interrupted: keel shut down".to_owned();
                turn::fail_sub_agent(ctx, InterruptReason::Shutdown, why, stopped);
                return ctx.effect(Effect::Stop);
            }
            turn::interrupt(ctx, InterruptReason::Shutdown);
        }
        Phase::Completed { .. } | Phase::Failed { .. } => return ctx.effect(Effect::Stop),
        Phase::Terminating => return,
    }
    ctx.emit(EventKind::SessionEnded);
    ctx.set_phase(Phase::Terminating);
    ctx.effect(Effect::SaveSnapshot);
    ctx.effect(Effect::Stop);
}
