//! What a provider's stream reports: deltas, a finished response
//! (REQ-BED-003) read by its stop reason, and failures with retries,
//! backoff and fallback (REQ-BED-006). A turn's life itself (begin, send,
//! end) is in `turn.rs`.

use super::{tools, turn, Ctx};
use crate::builtin;
use crate::compaction;
use crate::effect::Effect;
use crate::event::{EventKind, NudgeReason, TurnNote};
use crate::input::{AssistantResponse, LlmFailure, Timer};
use crate::live::{ContextWarning, LiveEvent, StreamDelta};
use crate::message::StopReason;
use crate::retry::JitterPermille;
use crate::state::{Generation, Phase, Request, Slot};

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
    // A summary request's text is not the conversation's: clients see the
    // `Compacted` event it ends in.
    if request.compaction.is_some() {
        return;
    }
    if let StreamDelta::Text { text } = &delta {
        partial.push_str(text);
    }
    ctx.publish(LiveEvent::Delta { generation, delta });
}

pub(super) fn finished(ctx: &mut Ctx, generation: Generation, response: AssistantResponse) {
    let Some(request) = current(ctx, generation) else {
        return;
    };
    if let Some(plan) = request.compaction {
        return turn::compacted(ctx, plan, summary_of(&response));
    }
    let window = ctx.conv.working.config.context_window;
    let before = ContextWarning::level(ctx.conv.working.usage.context_tokens(), window);
    let stop_reason = response.stop_reason;
    ctx.emit(EventKind::AssistantMessage {
        blocks: response.blocks,
        stop_reason,
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

    // A response cut off at max_tokens may end inside a tool call's input,
    // and a refusal is no request for work: none of their calls runs.
    let note = match stop_reason {
        StopReason::MaxTokens => Some(TurnNote::MaxTokens {
            max_tokens: ctx.conv.working.config.max_tokens,
        }),
        StopReason::Refusal => Some(TurnNote::Refusal),
        StopReason::EndTurn
        | StopReason::ToolUse
        | StopReason::StopSequence
        | StopReason::PauseTurn
        | StopReason::Other => None,
    };
    if let Some(note) = note {
        let why = match note {
            TurnNote::MaxTokens { max_tokens } => format!(
                "not run: the response was cut off at max_tokens ({max_tokens}), so this call's input may be incomplete"
            ),
            TurnNote::Refusal => "not run: the model refused to answer".to_owned(),
        };
        turn::close_open_calls(ctx, &why);
    }

    let calls = ctx.conv.working.open_calls.clone();
    if calls.is_empty() {
        // Paused by the provider mid-turn: send the response back as it is
        // and let the model go on.
        if stop_reason == StopReason::PauseTurn {
            return turn::next_request(ctx);
        }
        if ctx.conv.working.is_sub_agent() {
            // A sub-agent ends only by submitting; remind it and go on.
            ctx.emit(EventKind::Nudge {
                reason: NudgeReason::MissingSubmit,
                text: builtin::NUDGE_SUBMIT.to_owned(),
            });
            return turn::next_request(ctx);
        }
        return turn::complete(ctx, note);
    }
    let exclusive = calls.iter().find(|call| builtin::is_exclusive(&call.name));
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
                images: Vec::new(),
            });
        }
        return turn::next_request(ctx);
    }
    tools::advance(ctx);
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
    // The prompt is longer than the model takes: compact and send it again,
    // if anything before the latest turn can be replaced.
    if failure.prompt_too_long && request.compaction.is_none() {
        return match compaction::plan(&ctx.conv.working) {
            Some(plan) => turn::summarise(ctx, plan),
            None => turn::fail(
                ctx,
                format!(
                    "the prompt is too long for the model, and the latest turn alone fills it: {}",
                    failure.message
                ),
            ),
        };
    }
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
        if request.compaction.is_some_and(|plan| plan.on_demand) {
            return turn::compaction_failed(ctx, format!("{model} failed: {}", failure.message));
        }
        if let Some(plan) = request.compaction {
            // No summary to be had (the summary request itself may be too
            // long): the messages are left out with a note instead.
            return turn::compacted(ctx, plan, None);
        }
        return turn::fail(ctx, format!("{model} failed: {}", failure.message));
    }
    if request.retries < retry.max_retries {
        let retries = request.retries + 1;
        let delay_ms = retry.delay_ms(retries, failure.retry_after_ms, jitter);
        let next = Request {
            generation: turn::next_generation(ctx),
            slot: request.slot,
            retries,
            compaction: request.compaction,
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
            match request.compaction {
                Some(plan) => {
                    let next = Request {
                        generation: turn::next_generation(ctx),
                        slot: Slot::Fallback,
                        retries: 0,
                        compaction: Some(plan),
                    };
                    turn::start(ctx, next);
                }
                None => turn::send(ctx, Slot::Fallback, 0),
            }
        }
        // The summary could not be had: left out with a note.
        (Slot::Primary, None) | (Slot::Fallback, _) => match request.compaction {
            Some(plan) if plan.on_demand => {
                let attempts = retry.max_retries + 1;
                turn::compaction_failed(
                    ctx,
                    format!(
                        "{model} failed {attempts} times; last error: {}",
                        failure.message
                    ),
                );
            }
            Some(plan) => turn::compacted(ctx, plan, None),
            None => {
                let attempts = retry.max_retries + 1;
                turn::fail(
                    ctx,
                    format!(
                        "{model} failed {attempts} times; last error: {}",
                        failure.message
                    ),
                );
            }
        },
    }
}

/// The text of a summary response; `None` when it holds none (then the
/// messages are left out with a note rather than replaced by nothing).
fn summary_of(response: &AssistantResponse) -> Option<String> {
    let text: Vec<&str> = response
        .blocks
        .iter()
        .filter_map(|block| match block {
            crate::message::AssistantBlock::Text { text } => Some(text.trim()),
            _ => None,
        })
        .filter(|text| !text.is_empty())
        .collect();
    (!text.is_empty()).then(|| text.join("\n\n"))
}

pub(super) fn retry_due(ctx: &mut Ctx, generation: Generation) {
    match ctx.conv.phase {
        Phase::RetryWait { next, .. } if next.generation == generation => turn::start(ctx, next),
        _ => {}
    }
}
