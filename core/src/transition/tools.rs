//! Tool calls: run serially in request order (REQ-BED-004), wait for a human
//! or a client where the tool's policy says so (an approval, a question to
//! the user, a tool the client runs: docs/requirements.md, "Approvals and
//! pending kinds"), and feed every result, errors included, back to the
//! model.

use super::{turn, Ctx};
use crate::builtin::{self, ASK_USER, SPAWN_AGENTS, SUBMIT_RESULT};
use crate::config::ToolPolicy;
use crate::effect::Effect;
use crate::event::{
    Decision, EventKind, PendingCall, PendingKind, SubAgentOutcome, MAX_RESOLVED_BY_CHARS,
};
use crate::ids::ToolCallId;
use crate::live::LiveEvent;
use crate::message::{ImageRef, ToolCall};
use crate::rejection::Rejection;
use crate::state::Phase;

/// How much of a running tool's output the core keeps for a cancelled result.
pub const OUTPUT_TAIL_BYTES: usize = 8 * 1024;

/// Move to the first open call: run it, suspend on it, or (with none left)
/// ask the model again.
pub(super) fn advance(ctx: &mut Ctx) {
    loop {
        let Some(call) = ctx.conv.working.open_calls.first().cloned() else {
            return turn::next_request(ctx);
        };
        let sub_agent = ctx.conv.working.is_sub_agent();
        if call.name == ASK_USER {
            if sub_agent {
                // No human answers a sub-agent, so it is not offered the
                // tool; a call to it anyway gets an answer it can act on.
                refuse(
                    ctx,
                    call,
                    "sub-agents cannot ask the user: no human answers them. Decide yourself, or submit_result saying what you need",
                );
                continue;
            }
            let prompt = builtin::question(&call);
            return suspend(ctx, call, PendingKind::Elicitation, Some(prompt));
        }
        if call.name == SUBMIT_RESULT {
            if sub_agent {
                return submit(ctx, call);
            }
            refuse(ctx, call, "submit_result is only available to sub-agents");
            continue;
        }
        if call.name == SPAWN_AGENTS {
            if sub_agent {
                // REQ-BED-009: sub-agents never spawn sub-agents.
                refuse(ctx, call, "sub-agents cannot spawn sub-agents");
                continue;
            }
            // The cap on sub-agents per call, and a task list the shell can
            // carry out, are decided here: the shell never refuses a call.
            let config = &ctx.conv.working.config;
            let (cap, may_leave_cwd) = (config.sub_agent.max_children, config.tools_may_leave_cwd);
            if let Err(why) = builtin::spawn_tasks(&call, cap, may_leave_cwd) {
                refuse(ctx, call, &why);
                continue;
            }
            return run(ctx, call, true);
        }
        let approved = ctx.conv.working.approved.contains(&call.id);
        match ctx.conv.working.config.tool_policy(&call.name) {
            ToolPolicy::Approve if !approved => {
                return suspend(ctx, call, PendingKind::Approval, None);
            }
            // No client is connected to a sub-agent: nobody would ever
            // run the call, so it is refused at once, not waited on.
            ToolPolicy::Client if sub_agent => {
                refuse(
                    ctx,
                    call,
                    "client tools are not available to sub-agents: no client runs them. Do without it, or submit_result saying what you need",
                );
                continue;
            }
            ToolPolicy::Client => return suspend(ctx, call, PendingKind::ClientExec, None),
            ToolPolicy::Deny => {
                let why = format!(
                    "{} is denied by this conversation's tool policy; do without it",
                    call.name
                );
                refuse(ctx, call, &why);
                continue;
            }
            ToolPolicy::Approve | ToolPolicy::Auto => return run(ctx, call, false),
        }
    }
}

fn run(ctx: &mut Ctx, call: ToolCall, spawn: bool) {
    ctx.set_phase(Phase::ExecutingTools {
        current: call.id.clone(),
        output_tail: String::new(),
    });
    ctx.effect(if spawn {
        let seq = ctx.conv.working.calls_seq;
        Effect::SpawnSubAgents { call, seq }
    } else {
        Effect::StartTool { call }
    });
}

fn suspend(ctx: &mut Ctx, call: ToolCall, kind: PendingKind, prompt: Option<String>) {
    ctx.emit(EventKind::Suspended {
        pending: vec![PendingCall { call, kind, prompt }],
    });
    ctx.set_phase(Phase::AwaitingInput);
}

fn refuse(ctx: &mut Ctx, call: ToolCall, why: &str) {
    ctx.emit(EventKind::ToolResult {
        tool_call_id: call.id,
        content: why.to_owned(),
        is_error: true,
        synthetic: true,
        images: Vec::new(),
    });
}

/// A sub-agent's `submit_result`: answer it, end the turn, and finish.
fn submit(ctx: &mut Ctx, call: ToolCall) {
    let result = builtin::submitted_result(&call);
    ctx.emit(EventKind::ToolResult {
        tool_call_id: call.id,
        content: "result submitted".to_owned(),
        is_error: false,
        synthetic: false,
        images: Vec::new(),
    });
    if let Some(turn) = ctx.conv.working.current_turn.clone() {
        ctx.emit(EventKind::TurnCompleted {
            turn: turn.turn,
            duration_ms: ctx.now.millis_since(turn.started_at),
            note: None,
        });
    }
    turn::finish_sub_agent(ctx, SubAgentOutcome::Completed { result });
}

pub(super) fn output(ctx: &mut Ctx, tool_call_id: ToolCallId, chunk: String) {
    let Phase::ExecutingTools {
        current,
        output_tail,
    } = &mut ctx.conv.phase
    else {
        return;
    };
    if *current != tool_call_id {
        return;
    }
    output_tail.push_str(&chunk);
    if output_tail.len() > OUTPUT_TAIL_BYTES {
        let mut cut = output_tail.len() - OUTPUT_TAIL_BYTES;
        while !output_tail.is_char_boundary(cut) {
            cut += 1;
        }
        output_tail.drain(..cut);
    }
    ctx.publish(LiveEvent::ToolOutput {
        tool_call_id,
        chunk,
    });
}

pub(super) fn finished(
    ctx: &mut Ctx,
    tool_call_id: ToolCallId,
    content: String,
    is_error: bool,
    images: Vec<ImageRef>,
) {
    match &ctx.conv.phase {
        Phase::ExecutingTools { current, .. } if *current == tool_call_id => {}
        // A result for a tool that is no longer running (cancelled, or from a
        // previous life of the actor) changes nothing.
        _ => return,
    }
    // REQ-BED-004: a failed tool's error goes to the model like any result.
    ctx.emit(EventKind::ToolResult {
        tool_call_id,
        content,
        is_error,
        synthetic: false,
        images,
    });
    advance(ctx);
}

/// Decide a pending call, exactly once. A client that lost the answer to a
/// resolution asks again: the same decision then succeeds without doing
/// anything, while a different one, or any decision on a call that got its
/// result otherwise, is refused, so that no call is decided twice.
pub(super) fn resolve(
    ctx: &mut Ctx,
    tool_call_id: ToolCallId,
    decision: Decision,
    by: Option<String>,
) {
    if by
        .as_ref()
        .is_some_and(|by| by.chars().count() > MAX_RESOLVED_BY_CHARS)
    {
        return ctx.reject(Rejection::ResolvedByTooLong {
            limit: MAX_RESOLVED_BY_CHARS,
        });
    }
    let working = &ctx.conv.working;
    let pending = working
        .pending
        .iter()
        .find(|pending| pending.call.id == tool_call_id)
        .cloned();
    // The resolution asked for again: it was applied, so the answer is
    // success, in whatever state that left the conversation (a sub-agent
    // it finished, a runtime now stopping). Who decides is left out of the
    // comparison: the decision is what was asked for, and the first one
    // to ask is on record.
    if pending.is_none() && working.resolution(&tool_call_id) == Some(&decision) {
        return;
    }
    if ctx.conv.phase.is_terminal() {
        return ctx.reject(Rejection::Finished);
    }
    if ctx.conv.phase == Phase::Terminating {
        return ctx.reject(Rejection::ShuttingDown);
    }
    let Some(pending) = pending else {
        let rejection = match working.resolution(&tool_call_id) {
            Some(recorded) => Rejection::AlreadyResolved {
                decision: recorded.clone(),
                tool_call_id,
            },
            None if working.has_result(&tool_call_id) => Rejection::AlreadySettled { tool_call_id },
            None => Rejection::UnknownCall { tool_call_id },
        };
        return ctx.reject(rejection);
    };
    let answer: Option<(String, bool)> = match (pending.kind, &decision) {
        (PendingKind::Approval, Decision::Approve | Decision::Edit { .. }) => None,
        (PendingKind::Approval, Decision::Deny) => {
            Some(("the user denied this tool call".to_owned(), true))
        }
        // Declining a question is an answer: the model learns and goes on.
        (PendingKind::Elicitation, Decision::Deny) => {
            Some(("the user declined to answer".to_owned(), false))
        }
        (PendingKind::ClientExec, Decision::Deny) => {
            Some(("the client declined to run this tool".to_owned(), true))
        }
        (PendingKind::Elicitation | PendingKind::ClientExec, Decision::Answer { text }) => {
            Some((text.clone(), false))
        }
        (PendingKind::Approval, Decision::Answer { .. })
        | (
            PendingKind::Elicitation | PendingKind::ClientExec,
            Decision::Approve | Decision::Edit { .. },
        ) => {
            return ctx.reject(Rejection::InvalidDecision {
                tool_call_id,
                kind: pending.kind,
                decision,
            });
        }
    };
    ctx.emit(EventKind::Resolved {
        tool_call_id: tool_call_id.clone(),
        decision,
        by,
    });
    if let Some((content, is_error)) = answer {
        ctx.emit(EventKind::ToolResult {
            tool_call_id,
            content,
            is_error,
            synthetic: false,
            images: Vec::new(),
        });
    }
    if ctx.conv.working.pending.is_empty() {
        advance(ctx);
    }
}
