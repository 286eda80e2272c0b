//! A turn's life, in one place: beginning it, sending its requests, asking
//! the model again once the tools have answered, and ending it (completed,
//! failed or interrupted), with what each ending means for the messages
//! that arrived meanwhile. The handlers in the sibling modules, one per kind
//! of input, call these; nothing here calls back into them.
//!
//! Every acknowledged user message gets a turn or is named in an
//! `Unanswered` event with the reason (docs/requirements.md, "Every
//! acknowledged message"): a turn that completes, fails or reaches its
//! request cap starts the next turn for messages queued during it; one the
//! user cancelled, or that a restart under `recovery = idle` ended, records
//! them as unanswered; one ended by a graceful shutdown leaves them owed,
//! and the next start gives them their turn.

use crate::builtin;
use crate::compaction::{self, Plan};
use crate::effect::Effect;
use crate::event::{EventKind, InterruptReason, SubAgentOutcome, TurnNote};
use crate::ids::{Seq, ToolCallId};
use crate::input::Timer;
use crate::state::{Generation, Phase, Request, Slot};

use super::Ctx;

/// Start turn `working.turn + 1`, triggered by the event at `trigger`.
pub(super) fn begin(ctx: &mut Ctx, trigger: Seq) {
    let turn = ctx.conv.working.turn + 1;
    ctx.emit_turn_started(turn, trigger);
    send(ctx, Slot::Primary, 0);
}

/// Send the working set's prompt as a new request. Only called with every
/// tool_use answered (invariant 3). A prompt past the compaction threshold
/// is compacted first: a summary request goes out, and the prompt follows
/// once the summary is in (docs/compaction.md).
pub(super) fn send(ctx: &mut Ctx, slot: Slot, retries: u32) {
    debug_assert!(ctx.conv.working.open_calls.is_empty());
    if let Some(plan) = compaction::due(&ctx.conv.working) {
        return summarise(ctx, plan);
    }
    let request = Request {
        generation: next_generation(ctx),
        slot,
        retries,
        compaction: None,
    };
    start(ctx, request);
}

/// Ask for a summary of what `plan` replaces; the turn's request follows.
pub(super) fn summarise(ctx: &mut Ctx, plan: Plan) {
    let request = Request {
        generation: next_generation(ctx),
        slot: Slot::Primary,
        retries: 0,
        compaction: Some(plan),
    };
    start(ctx, request);
}

/// Record the compaction `plan` with `summary` (`None`: the messages are
/// left out with a note), then send the turn's request; a compaction asked
/// for outside a turn rests instead.
pub(super) fn compacted(ctx: &mut Ctx, plan: Plan, summary: Option<String>) {
    let tokens_after = compaction::tokens_after(&ctx.conv.working, &plan, summary.as_deref());
    ctx.emit(EventKind::Compacted {
        through_seq: plan.through_seq,
        replaced_messages: u32::try_from(plan.replaced_messages).unwrap_or(u32::MAX),
        summary,
        tokens_before: plan.tokens_before,
        tokens_after,
    });
    if plan.on_demand {
        return after_compaction(ctx);
    }
    let request = Request {
        generation: next_generation(ctx),
        slot: Slot::Primary,
        retries: 0,
        compaction: None,
    };
    start(ctx, request);
}

/// A compaction asked for outside a turn could not get its summary: the
/// prompt stays as it was (a user asked to compact, not to lose history),
/// and the conversation rests again.
pub(super) fn compaction_failed(ctx: &mut Ctx, error: String) {
    ctx.publish(crate::live::LiveEvent::CompactionFailed { error });
    after_compaction(ctx);
}

/// A compaction outside a turn is over: messages that came in meanwhile
/// (`busy_policy = queue`) get their turn now, or the conversation rests.
fn after_compaction(ctx: &mut Ctx) {
    match ctx.conv.working.untriggered.last() {
        Some(&trigger) => begin(ctx, trigger),
        None => ctx.set_phase(Phase::from_status(&ctx.conv.working)),
    }
}

/// Stop a compaction asked for outside a turn (a cancel): nothing of it is
/// recorded; messages that came in meanwhile get what `reason` owes them.
pub(super) fn stop_compaction(ctx: &mut Ctx, reason: InterruptReason) {
    stop_work(ctx);
    let owed = ctx.conv.working.untriggered.clone();
    unanswered(ctx, owed, reason);
    ctx.set_phase(Phase::from_status(&ctx.conv.working));
}

/// A fresh generation for the next request of the current turn.
pub(super) fn next_generation(ctx: &mut Ctx) -> Generation {
    let attempt = ctx.conv.next_attempt;
    ctx.conv.next_attempt += 1;
    Generation {
        turn: ctx.conv.working.turn,
        attempt,
    }
}

/// Send `request` now.
pub(super) fn start(ctx: &mut Ctx, request: Request) {
    let config = &ctx.conv.working.config;
    let model = match (request.slot, &config.fallback) {
        (Slot::Fallback, Some(fallback)) => fallback.clone(),
        (Slot::Fallback, None) | (Slot::Primary, _) => config.primary.clone(),
    };
    let timeout_ms = config.request_timeout_ms;
    ctx.set_phase(Phase::Streaming {
        request,
        partial: String::new(),
    });
    let summarise = request
        .compaction
        .map(|plan| u32::try_from(plan.replaced_messages).unwrap_or(u32::MAX));
    ctx.effect(Effect::StartStream {
        generation: request.generation,
        model,
        timeout_ms,
        summarise,
    });
}

/// Every tool of the last response has its result: ask the model again,
/// unless the turn has used up its requests.
pub(super) fn next_request(ctx: &mut Ctx) {
    let Some(turn) = &ctx.conv.working.current_turn else {
        return;
    };
    let responses = turn.responses;
    let grace_used = turn.grace_used;
    let config = &ctx.conv.working.config;
    if ctx.conv.working.is_sub_agent() {
        let cap = config.sub_agent.max_turns;
        if responses >= cap {
            if grace_used {
                let reason = format!("exceeded its turn cap of {cap} without submitting a result");
                let limit = InterruptReason::RequestLimit { limit: cap };
                return fail_sub_agent(ctx, limit, reason, Stopped::default());
            }
            ctx.emit(EventKind::Nudge {
                reason: crate::event::NudgeReason::TurnCap,
                text: builtin::NUDGE_TURN_CAP.to_owned(),
            });
        }
    } else if responses >= config.max_requests_per_turn {
        // Nothing runs now: the last tool has finished.
        let limit = InterruptReason::RequestLimit {
            limit: config.max_requests_per_turn,
        };
        return end_interrupted(ctx, limit, Stopped::default());
    }
    send(ctx, Slot::Primary, 0);
}

/// The turn ended normally, with a note when the user should know why
/// (cut off at max_tokens, a refusal). Messages queued meanwhile start the
/// next turn.
pub(super) fn complete(ctx: &mut Ctx, note: Option<TurnNote>) {
    let Some(turn) = ctx.conv.working.current_turn.clone() else {
        return;
    };
    let queued = queued_seqs(ctx);
    ctx.emit(EventKind::TurnCompleted {
        turn: turn.turn,
        duration_ms: ctx.now.millis_since(turn.started_at),
        note,
    });
    answer_queued(ctx, &queued, Phase::Idle);
}

/// The turn cannot go on: record why; a new message continues
/// (REQ-BED-006), and so do messages queued during the failed turn.
pub(super) fn fail(ctx: &mut Ctx, error: String) {
    let Some(turn) = ctx.conv.working.current_turn.as_ref().map(|turn| turn.turn) else {
        return;
    };
    close_open_calls(ctx, "the turn failed before this tool ran");
    let queued = queued_seqs(ctx);
    ctx.emit(EventKind::TurnFailed {
        turn,
        error: error.clone(),
    });
    if ctx.conv.working.is_sub_agent() {
        return finish_sub_agent(ctx, SubAgentOutcome::Failed { reason: error });
    }
    answer_queued(ctx, &queued, Phase::Error { message: error });
}

/// What was running when work stopped.
#[derive(Debug, Default)]
pub(super) struct Stopped {
    /// Text the interrupted stream had produced.
    partial_text: Option<String>,
    /// The tool that was running and the end of its output.
    running_tool: Option<(ToolCallId, String)>,
}

/// Stop whatever runs and end the turn as interrupted.
pub(super) fn interrupt(ctx: &mut Ctx, reason: InterruptReason) {
    let stopped = stop_work(ctx);
    end_interrupted(ctx, reason, stopped);
}

/// Abort the running stream or tool, or the pending retry; the effects go
/// out at once, ahead of any queued work (REQ-BED-005).
pub(super) fn stop_work(ctx: &mut Ctx) -> Stopped {
    match &mut ctx.conv.phase {
        Phase::Streaming { request, partial } => {
            let generation = request.generation;
            let partial = std::mem::take(partial);
            ctx.effect(Effect::AbortStream { generation });
            Stopped {
                partial_text: (!partial.is_empty()).then_some(partial),
                running_tool: None,
            }
        }
        Phase::ExecutingTools {
            current,
            output_tail,
        } => {
            let running = (current.clone(), std::mem::take(output_tail));
            ctx.effect(Effect::AbortTool {
                tool_call_id: running.0.clone(),
            });
            Stopped {
                partial_text: None,
                running_tool: Some(running),
            }
        }
        Phase::RetryWait { next, .. } => {
            let generation = next.generation;
            ctx.effect(Effect::CancelTimer {
                timer: Timer::Retry { generation },
            });
            Stopped::default()
        }
        Phase::Idle
        | Phase::Debouncing { .. }
        | Phase::AwaitingInput
        | Phase::Recovering
        | Phase::Error { .. }
        | Phase::Terminating
        | Phase::Completed { .. }
        | Phase::Failed { .. } => Stopped::default(),
    }
}

/// End the turn as interrupted: the running tool's result carries its
/// output so far, every other open call gets a synthetic result, and the
/// messages queued during the turn get what `reason` owes them.
pub(super) fn end_interrupted(ctx: &mut Ctx, reason: InterruptReason, stopped: Stopped) {
    let why = synthetic_reason(reason);
    if let Some((tool_call_id, tail)) = stopped.running_tool {
        let content = if tail.is_empty() {
            format!("{why} while it ran; it had produced no output")
        } else {
            format!("{why} while it ran; its output until then:\n{tail}")
        };
        ctx.emit(EventKind::ToolResult {
            tool_call_id,
            content,
            is_error: true,
            synthetic: true,
            images: Vec::new(),
        });
    }
    close_open_calls(ctx, &why);
    let queued = queued_seqs(ctx);
    if let Some(turn) = ctx.conv.working.current_turn.as_ref().map(|turn| turn.turn) {
        ctx.emit(EventKind::TurnInterrupted {
            turn,
            reason,
            partial_text: stopped.partial_text,
        });
    }
    ctx.set_phase(Phase::Idle);
    match reason {
        // The cap stopped the model, not the user: what they sent
        // meanwhile still deserves an answer.
        InterruptReason::RequestLimit { .. } if !ctx.conv.working.is_sub_agent() => {
            answer_queued(ctx, &queued, Phase::Idle);
        }
        // The superseding message's turn answers them with it; after a
        // graceful shutdown they stay owed and the next start answers them.
        InterruptReason::Superseded | InterruptReason::Shutdown => {}
        InterruptReason::RequestLimit { .. }
        | InterruptReason::Cancelled
        | InterruptReason::Restart
        | InterruptReason::ResumeLimit
        | InterruptReason::Timeout
        | InterruptReason::Finished
        | InterruptReason::Rewound => unanswered(ctx, queued, reason),
    }
}

/// Record that the acknowledged messages `messages` get no turn, and why.
pub(super) fn unanswered(ctx: &mut Ctx, messages: Vec<Seq>, reason: InterruptReason) {
    if !messages.is_empty() {
        ctx.emit(EventKind::Unanswered { messages, reason });
    }
}

/// Give every tool call still open a synthetic error result, in order, so the
/// history stays valid for every provider (invariant 3). The first open call
/// is the one an earlier life of the actor may have dispatched: if it is a
/// parent's `spawn_agents`, its sub-agents are cancelled too, since nobody
/// waits for them any more (a running call is not open here: `stop_work`
/// aborted it and its result was recorded first).
pub(super) fn close_open_calls(ctx: &mut Ctx, why: &str) {
    let working = &ctx.conv.working;
    if let Some(call) = working.open_calls.first() {
        if call.name == builtin::SPAWN_AGENTS && !working.is_sub_agent() {
            let (call, seq) = (call.clone(), working.calls_seq);
            ctx.effect(Effect::CancelSubAgents { call, seq });
        }
    }
    let open: Vec<ToolCallId> = ctx
        .conv
        .working
        .open_calls
        .iter()
        .map(|call| call.id.clone())
        .collect();
    for tool_call_id in open {
        ctx.emit(EventKind::ToolResult {
            tool_call_id,
            content: why.to_owned(),
            is_error: true,
            synthetic: true,
            images: Vec::new(),
        });
    }
}

/// End a sub-agent for good: end its turn, then record the failure.
pub(super) fn fail_sub_agent(
    ctx: &mut Ctx,
    reason: InterruptReason,
    message: String,
    stopped: Stopped,
) {
    end_interrupted(ctx, reason, stopped);
    finish_sub_agent(ctx, SubAgentOutcome::Failed { reason: message });
}

/// A sub-agent reached its terminal state: record it, and drop its
/// deadline, which can no longer change anything. Messages still owed a
/// turn (queued behind the turn that submitted or failed, or left owed by
/// a graceful stop) never get one now: they are named `Unanswered`.
pub(super) fn finish_sub_agent(ctx: &mut Ctx, outcome: SubAgentOutcome) {
    let owed = ctx.conv.working.untriggered.clone();
    unanswered(ctx, owed, InterruptReason::Finished);
    ctx.emit(EventKind::Finished {
        outcome: outcome.clone(),
    });
    ctx.effect(Effect::CancelTimer {
        timer: Timer::Deadline,
    });
    ctx.set_phase(match outcome {
        SubAgentOutcome::Completed { result } => Phase::Completed { result },
        SubAgentOutcome::Failed { reason } => Phase::Failed { reason },
    });
}

/// The seqs of the messages queued during the turn in progress.
fn queued_seqs(ctx: &Ctx) -> Vec<Seq> {
    ctx.conv
        .working
        .queued
        .iter()
        .map(|queued| queued.seq)
        .collect()
}

/// A turn just ended: start the next one for the messages queued during it,
/// or rest in `otherwise`.
fn answer_queued(ctx: &mut Ctx, queued: &[Seq], otherwise: Phase) {
    match queued.last() {
        Some(&trigger) => begin(ctx, trigger),
        None => ctx.set_phase(otherwise),
    }
}

fn synthetic_reason(reason: InterruptReason) -> String {
    match reason {
        InterruptReason::Cancelled => "cancelled by the user".to_owned(),
        InterruptReason::Superseded => "cancelled: the user sent a new message".to_owned(),
        InterruptReason::Restart => "interrupted by restart".to_owned(),
        InterruptReason::ResumeLimit => {
            "interrupted by restart; automatic resume gave up after two attempts".to_owned()
        }
        InterruptReason::RequestLimit { limit } => {
            format!("not run: the turn reached its limit of {limit} requests")
        }
        InterruptReason::Timeout => "cancelled: the time limit passed".to_owned(),
        InterruptReason::Finished => "not run: the sub-agent had finished".to_owned(),
        InterruptReason::Rewound => {
            "not run: the user rewound the conversation to before this call".to_owned()
        }
        InterruptReason::Shutdown => {
            "interrupted: keel shut down before the turn finished".to_owned()
        }
    }
}
