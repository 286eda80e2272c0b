//! Lifecycle: creating a conversation, an actor (re)starting on it and
//! recovering a turn the last one left in flight, timers, configuration
//! changes, and stopping.

use super::{cancel, message, stream, tools, Ctx, Step};
use crate::config::ConversationConfig;
use crate::effect::Effect;
use crate::event::{Event, EventKind, InterruptReason, RecoveryAction};
use crate::ids::ConversationId;
use crate::input::Timer;
use crate::recovery::{plan_recovery, RecoveryPlan};
use crate::rejection::Rejection;
use crate::state::{Conversation, Phase, Slot};
use crate::time::Timestamp;
use crate::working::WorkingSet;

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
    ctx.emit(EventKind::SessionStarted);
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
    ctx.emit(EventKind::SessionStarted);
    arm_deadline(ctx);
    match plan_recovery(&ctx.conv.working) {
        RecoveryPlan::Nothing => {}
        RecoveryPlan::RerunRequest => {
            ctx.emit(EventKind::Recovered {
                action: RecoveryAction::RerunRequest,
            });
            stream::send(ctx, Slot::Primary, 0);
        }
        RecoveryPlan::Redispatch => {
            ctx.emit(EventKind::Recovered {
                action: RecoveryAction::Redispatch,
            });
            tools::advance(ctx);
        }
        RecoveryPlan::Interrupt { reason } if ctx.conv.working.is_sub_agent() => {
            let why = "interrupted by restart".to_owned();
            stream::fail_sub_agent(ctx, reason, why, cancel::Stopped::default());
        }
        RecoveryPlan::Interrupt { reason } => {
            cancel::end_interrupted(ctx, reason, cancel::Stopped::default());
        }
        RecoveryPlan::StartTurn { trigger } => stream::begin_turn(ctx, trigger),
        RecoveryPlan::RepairOrphans => {
            cancel::close_open_calls(ctx, "interrupted by restart");
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
    let stopped = cancel::stop_work(ctx);
    let reason = format!(
        "timed out after {} s without submitting a result",
        timeout_ms / 1000
    );
    stream::fail_sub_agent(ctx, InterruptReason::Timeout, reason, stopped);
}

pub(super) fn change_config(ctx: &mut Ctx, config: ConversationConfig) {
    if ctx.conv.phase.is_terminal() {
        return ctx.reject(Rejection::Finished);
    }
    if ctx.conv.phase == Phase::Terminating {
        return ctx.reject(Rejection::ShuttingDown);
    }
    if config != ctx.conv.working.config {
        // Takes effect with the next request; a request in flight goes on.
        ctx.emit(EventKind::ConfigChanged { config });
    }
}

/// Stop serving: only from a clean state (seed 004: idle or awaiting input,
/// plus error and the terminal states). Mid-turn, cancel first.
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
