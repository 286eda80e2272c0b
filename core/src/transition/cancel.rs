//! Cancellation from every state (REQ-BED-005, seed 004) and the interrupt
//! path it shares with superseding messages, restarts and caps: stop the
//! workers, give every open tool call a synthetic result, record the turn as
//! interrupted (with any partial text, for display only), and go idle.

use super::{stream, Ctx};
use crate::effect::Effect;
use crate::event::{EventKind, InterruptReason};
use crate::ids::ToolCallId;
use crate::state::Phase;

/// What was running when work stopped.
#[derive(Debug, Default)]
pub(super) struct Stopped {
    /// Text the interrupted stream had produced.
    partial_text: Option<String>,
    /// The tool that was running and the end of its output.
    running_tool: Option<(ToolCallId, String)>,
}

pub(super) fn cancel(ctx: &mut Ctx) {
    match &ctx.conv.phase {
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
        Phase::Debouncing { .. } => {
            ctx.emit(EventKind::DebounceCancelled);
            ctx.set_phase(Phase::from_status(&ctx.conv.working));
        }
        Phase::Streaming { .. }
        | Phase::RetryWait { .. }
        | Phase::ExecutingTools { .. }
        | Phase::AwaitingInput
        | Phase::Recovering => {
            if ctx.conv.working.is_sub_agent() {
                let stopped = stop_work(ctx);
                stream::fail_sub_agent(
                    ctx,
                    InterruptReason::Cancelled,
                    "cancelled".to_owned(),
                    stopped,
                );
            } else {
                interrupt_turn(ctx, InterruptReason::Cancelled);
            }
        }
    }
}

/// Stop whatever runs and end the turn as interrupted.
pub(super) fn interrupt_turn(ctx: &mut Ctx, reason: InterruptReason) {
    let stopped = stop_work(ctx);
    end_interrupted(ctx, reason, stopped);
}

/// Abort the running stream or tool; the effects go out at once, ahead of
/// any queued work (REQ-BED-005).
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
        Phase::Idle
        | Phase::Debouncing { .. }
        | Phase::RetryWait { .. }
        | Phase::AwaitingInput
        | Phase::Recovering
        | Phase::Error { .. }
        | Phase::Terminating
        | Phase::Completed { .. }
        | Phase::Failed { .. } => Stopped::default(),
    }
}

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
        });
    }
    close_open_calls(ctx, &why);
    if let Some(turn) = ctx.conv.working.current_turn.as_ref().map(|turn| turn.turn) {
        ctx.emit(EventKind::TurnInterrupted {
            turn,
            reason,
            partial_text: stopped.partial_text,
        });
    }
    ctx.set_phase(Phase::Idle);
}

/// Give every tool call still open a synthetic error result, in order, so the
/// history stays valid for every provider (invariant 3).
pub(super) fn close_open_calls(ctx: &mut Ctx, why: &str) {
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
        });
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
    }
}
