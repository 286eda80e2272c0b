//! Turns and LLM requests: starting a turn, sending a request, streamed
//! deltas, a finished response (REQ-BED-003), and failures with retries,
//! backoff and fallback (REQ-BED-006).

use super::{cancel, tools, Ctx};
use crate::effect::Effect;
use crate::event::{EventKind, InterruptReason, NudgeReason, Outcome};
use crate::ids::Seq;
use crate::input::{AssistantResponse, LlmFailure, Timer};
use crate::live::{ContextWarning, LiveEvent, StreamDelta};
use crate::retry::JitterPermille;
use crate::state::{Generation, Phase, Request, Slot};

/// Tools that must be the only call in their response: their meaning (ask
/// the human; end the sub-agent) does not mix with other work.
pub const ASK_USER: &str = "ask_user";
pub const SUBMIT_RESULT: &str = "submit_result";

const NUDGE_SUBMIT: &str = "You are a sub-agent: your work ends only when you call submit_result with your result. Call it now if you are done.";
const NUDGE_TURN_CAP: &str = "You have reached your turn limit. This is your last turn: call submit_result now with the best result you have.";

/// Start turn `working.turn + 1`, triggered by the event at `trigger`.
pub(super) fn begin_turn(ctx: &mut Ctx, trigger: Seq) {
    let turn = ctx.conv.working.turn + 1;
    ctx.emit_with(EventKind::TurnStarted { turn }, Some(trigger), false);
    send(ctx, Slot::Primary, 0);
}

/// Send the working set's prompt as a new request. Only called with every
/// tool_use answered (invariant 3).
pub(super) fn send(ctx: &mut Ctx, slot: Slot, retries: u32) {
    debug_assert!(ctx.conv.working.open_calls.is_empty());
    let request = Request {
        generation: next_generation(ctx),
        slot,
        retries,
    };
    start(ctx, request);
}

fn next_generation(ctx: &mut Ctx) -> Generation {
    let attempt = ctx.conv.next_attempt;
    ctx.conv.next_attempt += 1;
    Generation {
        turn: ctx.conv.working.turn,
        attempt,
    }
}

fn start(ctx: &mut Ctx, request: Request) {
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
    ctx.effect(Effect::StartStream {
        generation: request.generation,
        model,
        timeout_ms,
    });
}

/// The request of `generation`, if it is the one streaming now.
fn current(ctx: &Ctx, generation: Generation) -> Option<Request> {
    match &ctx.conv.phase {
        Phase::Streaming { request, .. } if request.generation == generation => Some(*request),
        _ => None,
    }
}

pub(super) fn delta(ctx: &mut Ctx, generation: Generation, delta: StreamDelta) {
    // REQ-BED-003: text without an end keeps the conversation streaming.
    let Phase::Streaming { request, partial } = &mut ctx.conv.phase else {
        return;
    };
    if request.generation != generation {
        return;
    }
    if let StreamDelta::Text { text } = &delta {
        partial.push_str(text);
    }
    ctx.publish(LiveEvent::Delta { generation, delta });
}

pub(super) fn finished(ctx: &mut Ctx, generation: Generation, response: AssistantResponse) {
    if current(ctx, generation).is_none() {
        return;
    }
    let window = ctx.conv.working.config.context_window;
    let before = ContextWarning::level(ctx.conv.working.usage.context_tokens(), window);
    ctx.emit(EventKind::AssistantMessage {
        blocks: response.blocks,
        stop_reason: response.stop_reason,
        usage: response.usage,
        provider: response.provider,
        model: response.model,
    });
    let used = ctx.conv.working.usage.context_tokens();
    let after = ContextWarning::level(used, window);
    ctx.publish(LiveEvent::ContextUsage {
        used,
        limit: window,
        warning: after.filter(|level| Some(*level) > before),
    });

    let calls = ctx.conv.working.open_calls.clone();
    if calls.is_empty() {
        if ctx.conv.working.is_sub_agent() {
            // A sub-agent ends only by submitting; remind it and go on.
            ctx.emit(EventKind::Nudge {
                reason: NudgeReason::MissingSubmit,
                text: NUDGE_SUBMIT.to_owned(),
            });
            return next_request(ctx);
        }
        return end_turn(ctx);
    }
    let exclusive = calls
        .iter()
        .find(|call| call.name == ASK_USER || call.name == SUBMIT_RESULT);
    if let (Some(exclusive), true) = (exclusive, calls.len() > 1) {
        let reason = format!(
            "{} must be the only tool call in its response; none of the {} calls in this response ran. Call it again on its own.",
            exclusive.name,
            calls.len()
        );
        for call in calls {
            ctx.emit(EventKind::ToolResult {
                tool_call_id: call.id,
                content: reason.clone(),
                is_error: true,
                synthetic: true,
            });
        }
        return next_request(ctx);
    }
    tools::advance(ctx);
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
                return fail_sub_agent(ctx, limit, reason, cancel::Stopped::default());
            }
            ctx.emit(EventKind::Nudge {
                reason: NudgeReason::TurnCap,
                text: NUDGE_TURN_CAP.to_owned(),
            });
        }
    } else if responses >= config.max_requests_per_turn {
        // Nothing runs now: the last tool has finished.
        let limit = InterruptReason::RequestLimit {
            limit: config.max_requests_per_turn,
        };
        return cancel::end_interrupted(ctx, limit, cancel::Stopped::default());
    }
    send(ctx, Slot::Primary, 0);
}

/// The turn ended normally. Messages queued meanwhile start the next one.
pub(super) fn end_turn(ctx: &mut Ctx) {
    let Some(turn) = ctx.conv.working.current_turn.clone() else {
        return;
    };
    let next_trigger = ctx.conv.working.queued.last().map(|queued| queued.seq);
    ctx.emit(EventKind::TurnCompleted {
        turn: turn.turn,
        duration_ms: ctx.now.millis_since(turn.started_at),
    });
    match next_trigger {
        Some(trigger) => begin_turn(ctx, trigger),
        None => ctx.set_phase(Phase::Idle),
    }
}

pub(super) fn failed(
    ctx: &mut Ctx,
    generation: Generation,
    failure: LlmFailure,
    jitter: JitterPermille,
) {
    let Some(request) = current(ctx, generation) else {
        return;
    };
    // Nothing of a failed attempt is kept: the request is retried whole.
    ctx.publish(LiveEvent::AttemptDiscarded { generation });
    let config = &ctx.conv.working.config;
    let retry = config.retry;
    let model = match request.slot {
        Slot::Primary => config.primary.clone(),
        Slot::Fallback => config
            .fallback
            .clone()
            .unwrap_or_else(|| config.primary.clone()),
    };
    if !failure.retryable {
        return fail_turn(ctx, format!("{model} failed: {}", failure.message));
    }
    if request.retries < retry.max_retries {
        let retries = request.retries + 1;
        let delay_ms = retry.delay_ms(retries, failure.retry_after_ms, jitter);
        let next = Request {
            generation: next_generation(ctx),
            slot: request.slot,
            retries,
        };
        let until = ctx.now.plus_millis(delay_ms);
        ctx.set_phase(Phase::RetryWait { next, until });
        ctx.effect(Effect::SetTimer {
            timer: Timer::Retry {
                generation: next.generation,
            },
            at: until,
        });
        ctx.publish(LiveEvent::Retrying {
            retry: retries,
            max_retries: retry.max_retries,
            delay_ms,
            error: failure.message,
            model,
        });
        return;
    }
    match (request.slot, ctx.conv.working.config.fallback.clone()) {
        (Slot::Primary, Some(fallback)) => {
            ctx.publish(LiveEvent::FallbackUsed {
                from: model,
                to: fallback,
                error: failure.message,
            });
            send(ctx, Slot::Fallback, 0);
        }
        (Slot::Primary, None) | (Slot::Fallback, _) => {
            let attempts = retry.max_retries + 1;
            fail_turn(
                ctx,
                format!(
                    "{model} failed {attempts} times; last error: {}",
                    failure.message
                ),
            );
        }
    }
}

pub(super) fn retry_due(ctx: &mut Ctx, generation: Generation) {
    match ctx.conv.phase {
        Phase::RetryWait { next, .. } if next.generation == generation => start(ctx, next),
        _ => {}
    }
}

/// The turn cannot go on: record why; a new message continues (REQ-BED-006).
fn fail_turn(ctx: &mut Ctx, error: String) {
    let Some(turn) = ctx.conv.working.current_turn.as_ref().map(|turn| turn.turn) else {
        return;
    };
    cancel::close_open_calls(ctx, "the turn failed before this tool ran");
    ctx.emit(EventKind::TurnFailed {
        turn,
        error: error.clone(),
    });
    if ctx.conv.working.is_sub_agent() {
        ctx.emit(EventKind::Finished {
            outcome: Outcome::Failed {
                reason: error.clone(),
            },
        });
        return ctx.set_phase(Phase::Failed { reason: error });
    }
    ctx.set_phase(Phase::Error { message: error });
}

/// End a sub-agent for good: end its turn, then record the failure.
pub(super) fn fail_sub_agent(
    ctx: &mut Ctx,
    reason: InterruptReason,
    message: String,
    stopped: cancel::Stopped,
) {
    cancel::end_interrupted(ctx, reason, stopped);
    ctx.emit(EventKind::Finished {
        outcome: Outcome::Failed {
            reason: message.clone(),
        },
    });
    ctx.set_phase(Phase::Failed { reason: message });
}
