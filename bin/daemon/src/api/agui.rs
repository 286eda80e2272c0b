//! AG-UI (docs/ag-ui.md): `POST /ag-ui` runs the agent on a thread, a keel
//! conversation, and answers the run as AG-UI events over SSE; `GET
//! /ag-ui/{thread}/runs/{run}/events` is keel's own addition, the same
//! run's stream again from a seq after a dropped connection.
//!
//! A run takes what the input brings that the log does not hold yet
//! (`intake`): new user messages, frontend tool results, answers to
//! interrupts; then it follows the conversation (`follow.rs`) from the
//! first seq it could have written, and renders what it sees (`map`, pure)
//! until the conversation rests. Everything is checked before anything is
//! written: a refused input answers in keel's error shape and changes
//! nothing.

mod intake;
pub mod map;
pub mod wire;

use std::collections::HashSet;
use std::io::Write as _;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::stream;
use serde::Deserialize;
use utoipa::IntoParams;

use keel_actors::core::builtin;
use keel_actors::core::config::{BusyPolicy, ClientTool, ConversationConfig};
use keel_actors::core::event::{Decision, EventKind, PendingCall, PendingKind};
use keel_actors::core::{ConversationId, Rejection, Seq, StateName, ToolCallId};
use keel_actors::{ConversationHandle, ImageUpload, Inspection};
use keel_api::types::ErrorBody;
use keel_api::ErrorCode;

use super::error::{ApiError, ApiJson, ApiQuery};
use super::events::keep_alive::KeepAlive;
use super::events::KEEP_ALIVE;
use super::follow::{Follower, Item};
use super::AppState;
use map::{Frame, RunMap};
use wire::{InputTool, ResumeEntry, ResumeStatus, RunAgentInput};

/// Events read from the log per page for the thread's messages.
const LOG_PAGE: usize = 1000;

/// Run the agent on a thread: AG-UI's `RunAgentInput` in, its events out.
#[utoipa::path(
    post,
    path = "/ag-ui",
    tag = "ag-ui",
    request_body(content = Object, description = "AG-UI's RunAgentInput (1.0): threadId (the conversation, created on first use), runId, messages, tools, resume", content_type = "application/json"),
    responses(
        (status = 200, content_type = "text/event-stream", description = "AG-UI events, one `data:` line each; frames made of a canonical event carry its seq as `id`"),
        (status = 400, body = ErrorBody),
        (status = 404, description = "A tool call or interrupt this thread does not know", body = ErrorBody),
        (status = 409, description = "Busy, or a call already decided otherwise", body = ErrorBody),
        (status = 422, body = ErrorBody),
    )
)]
pub async fn run(
    State(state): State<AppState>,
    ApiJson(input): ApiJson<RunAgentInput>,
) -> Result<Response, ApiError> {
    let id = ConversationId::new(input.thread_id.clone()).map_err(|error| {
        ApiError::bad_request(format!(
            "threadId {:?} cannot name a keel conversation ({error}): use letters, digits, `-`, `_` and `.`",
            input.thread_id
        ))
    })?;
    if input.run_id.is_empty() {
        return Err(ApiError::bad_request("runId is empty"));
    }
    let client_tools = client_tools(&state, &input.tools)?;
    let handle = state.runtime.handle(id.clone());
    let inspection = match handle.inspect().await {
        Ok(inspection) => inspection,
        Err(keel_actors::Error::NotFound(_)) => {
            // A new thread holds no calls: anything answering one is
            // refused before the thread is made.
            let anchor = intake::anchor(&input.messages);
            if anchor > 0 {
                return Err(past_the_log(id.as_str(), anchor, 0));
            }
            let taken = intake::take(&input.messages, &[]).map_err(ApiError::bad_request)?;
            if let Some((call, _)) = taken.answers.first() {
                return Err(unknown_call(call));
            }
            if let Some(entry) = input.resume.first() {
                return Err(unknown_call(&entry.interrupt_id));
            }
            new_message(&taken, state.max_message_bytes)?;
            let config = ConversationConfig {
                primary: state.default_model.as_ref().clone(),
                client_tools: client_tools.clone(),
                ..ConversationConfig::default()
            };
            state
                .runtime
                .create_if_absent(id.clone(), state.default_cwd.as_ref(), config)
                .await
                .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
            handle
                .inspect()
                .await
                .map_err(|error| ApiError::from_runtime(id.as_str(), error))?
        }
        Err(error) => return Err(ApiError::from_runtime(id.as_str(), error)),
    };
    let plan = plan(&handle, &inspection, &input, state.max_message_bytes).await?;
    if inspection.config.client_tools != client_tools {
        let config = ConversationConfig {
            client_tools,
            ..inspection.config.clone()
        };
        handle
            .change_config(config)
            .await
            .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    }
    // Followed before anything is written, from the first seq this run
    // could write: nothing it causes is missed.
    let from = inspection.last_seq + 1;
    let follower = Follower::open(&state, id.clone(), Some(from)).await?;
    let answered: Vec<String> = plan
        .answers
        .iter()
        .map(|(call, _)| call.0.clone())
        .collect();
    let sends = plan.sends();
    let took = carry_out(&handle, plan).await?;
    let mut map = RunMap::new(input.thread_id.clone(), input.run_id.clone(), from)
        .answered_by_client(answered);
    if sends {
        map = map.awaiting_turn();
    }
    let mut opening = vec![map.started()];
    let follower = if !took && at_rest(inspection.state) {
        // Nothing new, and nothing runs: the run ends where it stands.
        opening.extend(map.rest(&inspection.pending));
        None
    } else {
        Some(follower)
    };
    Ok(sse(RunStream {
        handle,
        follower,
        map,
        opening: Some(opening),
        done: false,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReattachQuery {
    /// The first seq to send frames of. `Last-Event-ID: N` means the
    /// same as `from=N+1`, and wins.
    pub from: Option<u64>,
}

/// keel's addition to AG-UI: a run's stream again after a dropped
/// connection, from a seq, with nothing missed or doubled (the frames of
/// canonical events carry their seq as the SSE `id`). It starts with its
/// own `RUN_STARTED` and ends where the conversation next rests.
#[utoipa::path(
    get,
    path = "/ag-ui/{thread_id}/runs/{run_id}/events",
    tag = "ag-ui",
    params(
        ("thread_id" = String, Path, description = "The thread (conversation) id"),
        ("run_id" = String, Path, description = "The run's id, echoed in RUN_STARTED and RUN_FINISHED"),
        ("Last-Event-ID" = Option<u64>, Header, description = "The last SSE id this client saw"),
        ReattachQuery
    ),
    responses(
        (status = 200, content_type = "text/event-stream", description = "AG-UI events"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn reattach(
    State(state): State<AppState>,
    Path((thread_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<ReattachQuery>,
) -> Result<Response, ApiError> {
    let id = ConversationId::new(thread_id.clone()).map_err(|_| ApiError::not_found(&thread_id))?;
    let from = match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map(|seen| seen.saturating_add(1))
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be a seq"))?,
        None => query.from.ok_or_else(|| {
            ApiError::bad_request("say where to go on from: `Last-Event-ID: SEQ` or `?from=SEQ`")
        })?,
    }
    .max(1);
    let handle = state.runtime.handle(id.clone());
    let inspection = handle
        .inspect()
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    let follower = Follower::open(&state, id, Some(from)).await?;
    let mut map = RunMap::new(thread_id, run_id, from);
    let mut opening = vec![map.started()];
    let follower = if at_rest(inspection.state) && inspection.last_seq < from {
        opening.extend(map.rest(&inspection.pending));
        None
    } else {
        Some(follower)
    };
    Ok(sse(RunStream {
        handle,
        follower,
        map,
        opening: Some(opening),
        done: false,
    }))
}

/// The frontend's tools as keel's client tools, checked: a name must be
/// one the model can call and not one of keel's own tools.
fn client_tools(state: &AppState, tools: &[InputTool]) -> Result<Vec<ClientTool>, ApiError> {
    let keel_tools = state.runtime.tools().names();
    let mut seen = HashSet::new();
    let mut client = Vec::with_capacity(tools.len());
    for tool in tools {
        let name = tool.name.as_str();
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            return Err(ApiError::bad_request(format!(
                "tool name {name:?}: 1 to 64 letters, digits, `_` or `-`, as the models take them"
            )));
        }
        if keel_tools.iter().any(|keel| keel == name) || builtin::is_builtin(name) {
            return Err(ApiError::bad_request(format!(
                "tool name {name:?} is one of keel's own tools; name the frontend's tool otherwise"
            )));
        }
        if !seen.insert(name) {
            return Err(ApiError::bad_request(format!("tool name {name:?} twice")));
        }
        let input_schema = match &tool.parameters {
            Some(schema @ serde_json::Value::Object(_)) => schema.clone(),
            None => serde_json::json!({"type": "object", "properties": {}}),
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "tool {name:?}: parameters must be a JSON Schema object"
                )))
            }
        };
        client.push(ClientTool {
            name: name.to_owned(),
            description: tool.description.clone(),
            input_schema,
        });
    }
    Ok(client)
}

/// What a run's input will do, checked against the conversation.
#[derive(Debug, Default)]
struct Plan {
    /// Resolutions of calls no longer pending: the same decision again is
    /// a no-op (keel's resolve is exactly once), another one a 409. Made
    /// first, so a refusal comes before anything is written.
    settled: Vec<(ToolCallId, Decision)>,
    /// Frontend tool results for pending client calls.
    answers: Vec<(ToolCallId, String)>,
    /// Decisions on pending approvals and questions.
    decisions: Vec<(ToolCallId, Decision)>,
    /// The new user message: texts joined, images.
    text: Option<String>,
    images: Vec<ImageUpload>,
}

impl Plan {
    fn sends(&self) -> bool {
        self.text.is_some()
    }
}

/// What `input` asks of the conversation `inspection` describes, every
/// part checked against it: which calls it answers (and whether they still
/// wait), the message it sends, and whether the busy policy lets it.
async fn plan(
    handle: &ConversationHandle,
    inspection: &Inspection,
    input: &RunAgentInput,
    max_message_bytes: usize,
) -> Result<Plan, ApiError> {
    let id = handle.id().as_str();
    let anchor = intake::anchor(&input.messages);
    if anchor > inspection.last_seq {
        return Err(past_the_log(id, anchor, inspection.last_seq));
    }
    let known = user_texts_after(handle, anchor).await?;
    let taken = intake::take(&input.messages, &known).map_err(ApiError::bad_request)?;
    let pending = |call: &str| {
        inspection
            .pending
            .iter()
            .find(|pending| pending.call.id.0 == call)
    };
    let mut plan = Plan::default();
    (plan.text, plan.images) = new_message(&taken, max_message_bytes)?;
    for (call, text) in taken.answers {
        match pending(&call).map(|pending| pending.kind) {
            Some(PendingKind::ClientExec) => plan.answers.push((ToolCallId::new(call), text)),
            Some(PendingKind::Approval | PendingKind::Elicitation) => {
                return Err(ApiError::bad_request(format!(
                    "tool call {call} waits for a decision: answer its interrupt in `resume`, not with a tool message"
                )))
            }
            None => plan
                .settled
                .push((ToolCallId::new(call), Decision::Answer { text })),
        }
    }
    for entry in &input.resume {
        let call = entry.interrupt_id.as_str();
        match pending(call) {
            Some(
                waiting @ PendingCall {
                    kind: PendingKind::Approval | PendingKind::Elicitation,
                    ..
                },
            ) => plan
                .decisions
                .push((ToolCallId::new(call), decision(entry, Some(waiting.kind))?)),
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "tool call {call} is the frontend's to run: answer it with a tool message"
                )))
            }
            None => plan
                .settled
                .push((ToolCallId::new(call), decision(entry, None)?)),
        }
    }
    let resolves = !plan.answers.is_empty() || !plan.decisions.is_empty();
    let rejects = inspection.config.busy_policy == BusyPolicy::Reject;
    let takes_messages = matches!(inspection.state, StateName::Idle | StateName::Error);
    if plan.sends() && rejects && !takes_messages && !resolves {
        // Refused here rather than by the send, so that nothing before it
        // (the tools' update) is written for a run that cannot be.
        return Err(ApiError::from_rejection(
            id,
            Rejection::Busy {
                state: inspection.state,
            },
        ));
    }
    if plan.sends() && resolves && rejects {
        let mut error = ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::Busy,
            format!(
                "thread {id} waits on its tool calls: the run that answers them continues the turn, so a new message with it would be refused as busy; send the message in a run of its own"
            ),
        );
        error.state = Some(inspection.state.as_str().to_owned());
        return Err(error);
    }
    Ok(plan)
}

/// The new user message a run sends, checked as `POST …/messages` checks
/// one: its texts joined, within `KEEL_MAX_MESSAGE_BYTES` (the body limit
/// is sized for images and a whole history, not for one message's text),
/// and its images decoded.
fn new_message(
    taken: &intake::Taken,
    max_message_bytes: usize,
) -> Result<(Option<String>, Vec<ImageUpload>), ApiError> {
    let text = (!taken.texts.is_empty()).then(|| taken.texts.join("\n\n"));
    if let Some(text) = &text {
        if text.len() > max_message_bytes {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                format!(
                    "the new message's text is {} bytes; at most {max_message_bytes} (KEEL_MAX_MESSAGE_BYTES)",
                    text.len()
                ),
            ));
        }
    }
    let mut images = Vec::with_capacity(taken.images.len());
    for (media_type, data) in &taken.images {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|error| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::InvalidImage,
                    format!("an image's data is not standard base64 ({error})"),
                )
            })?;
        images.push(ImageUpload::new(media_type.clone(), bytes));
    }
    Ok((text, images))
}

/// A resume entry as keel's decision. `kind` is the pending call's, when
/// it still waits.
fn decision(entry: &ResumeEntry, kind: Option<PendingKind>) -> Result<Decision, ApiError> {
    let call = &entry.interrupt_id;
    if entry.status == ResumeStatus::Cancelled {
        return Ok(Decision::Deny);
    }
    let payload = entry.payload.as_ref();
    let approved = payload
        .and_then(|payload| payload.get("approved"))
        .and_then(serde_json::Value::as_bool);
    let answer = payload.and_then(|payload| match payload {
        serde_json::Value::String(text) => Some(text.clone()),
        other => other
            .get("answer")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
    });
    match (kind, approved, answer) {
        (Some(PendingKind::Approval) | None, Some(true), _) => Ok(Decision::Approve),
        (Some(PendingKind::Approval) | None, Some(false), _) => Ok(Decision::Deny),
        (Some(PendingKind::Elicitation) | None, None, Some(text)) => Ok(Decision::Answer { text }),
        (Some(PendingKind::Approval), None, _) => Err(ApiError::bad_request(format!(
            "interrupt {call} is an approval: resolve it with payload {{\"approved\": true|false}}, or cancel it"
        ))),
        _ => Err(ApiError::bad_request(format!(
            "interrupt {call} is a question: resolve it with payload {{\"answer\": \"…\"}}, or cancel it"
        ))),
    }
}

/// Write what the plan says, in its order. Whether anything new was
/// taken (a message sent, a pending call answered).
async fn carry_out(handle: &ConversationHandle, plan: Plan) -> Result<bool, ApiError> {
    let id = handle.id().as_str();
    let runtime = |error| ApiError::from_runtime(id, error);
    for (call, decision) in plan.settled {
        handle
            .resolve_as(call, decision, Some("ag-ui".to_owned()))
            .await
            .map_err(runtime)?;
    }
    let mut took = false;
    for (call, text) in plan.answers {
        handle
            .resolve_as(call, Decision::Answer { text }, Some("ag-ui".to_owned()))
            .await
            .map_err(runtime)?;
        took = true;
    }
    for (call, decision) in plan.decisions {
        handle
            .resolve_as(call, decision, Some("ag-ui".to_owned()))
            .await
            .map_err(runtime)?;
        took = true;
    }
    if let Some(text) = plan.text {
        handle.send(text, plan.images).await.map_err(runtime)?;
        took = true;
    }
    Ok(took)
}

/// The texts of the user messages the log holds after `seq`.
async fn user_texts_after(handle: &ConversationHandle, seq: Seq) -> Result<Vec<String>, ApiError> {
    let mut texts = Vec::new();
    let mut from = seq + 1;
    loop {
        let events = handle
            .log(from, LOG_PAGE)
            .await
            .map_err(|error| ApiError::from_runtime(handle.id().as_str(), error))?;
        let Some(last) = events.last() else {
            return Ok(texts);
        };
        from = last.seq + 1;
        texts.extend(events.into_iter().filter_map(|event| match event.kind {
            EventKind::UserMessage { text, .. } => Some(text),
            _ => None,
        }));
    }
}

/// A message id keel gave names a seq this thread's log does not reach:
/// the client holds another thread's history.
fn past_the_log(id: &str, seq: Seq, last_seq: Seq) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        format!(
            "a message id names seq {seq}, past the end of thread {id}'s log ({last_seq}): the messages are another thread's"
        ),
    )
}

fn unknown_call(call: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::UnknownCall,
        format!("no tool call {call} waits in this thread"),
    )
}

/// Whether a conversation in `state` does nothing until someone acts.
fn at_rest(state: StateName) -> bool {
    match state {
        StateName::Idle
        | StateName::Error
        | StateName::AwaitingInput
        | StateName::Completed
        | StateName::Failed => true,
        StateName::Debouncing
        | StateName::Streaming
        | StateName::RetryWait
        | StateName::ExecutingTools
        | StateName::Recovering
        | StateName::Terminating
        | StateName::Compacting => false,
    }
}

/// One run's stream: the follower's items through the run's map.
struct RunStream {
    handle: ConversationHandle,
    /// `None` when the run ended before following anything.
    follower: Option<Follower>,
    map: RunMap,
    /// `RUN_STARTED` and what goes with it, sent first.
    opening: Option<Vec<Frame>>,
    done: bool,
}

impl RunStream {
    async fn next_bytes(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut frames = self.opening.take().unwrap_or_default();
        while frames.is_empty() && self.map.ending().is_none() {
            let Some(follower) = self.follower.as_mut() else {
                break;
            };
            match follower.next().await {
                Some(Item::Snapshot(_)) => {}
                Some(Item::Logged(updates)) => {
                    for update in &updates {
                        frames.extend(self.map.update(update));
                    }
                }
                Some(Item::Wave(wave)) => {
                    for update in wave.updates() {
                        frames.extend(self.map.update(update));
                    }
                }
                Some(Item::Lagged { .. }) => self.map.lagged(),
                Some(Item::Failed { code, message }) => {
                    frames.extend(self.map.fail(code.as_str(), &message));
                }
                None => frames.extend(self.map.fail(
                    "stopping",
                    "keel is stopping; reattach to the run once it is back (GET /ag-ui/{thread}/runs/{run}/events)",
                )),
            }
        }
        if frames.is_empty() && self.map.ending().is_none() {
            // Nothing to follow and nothing to end: not expected (a run
            // without a follower has ended), but never a busy loop.
            return None;
        }
        if self.map.ending().is_some() {
            self.done = true;
            frames.push(Frame {
                id: None,
                event: wire::Event::MessagesSnapshot {
                    messages: self.messages().await,
                },
            });
            frames.extend(self.map.finished());
        }
        Some(render(&frames))
    }

    /// The thread's messages, read from the log. A read that fails leaves
    /// them out: the run's own frames have said what happened.
    async fn messages(&self) -> Vec<wire::Message> {
        let mut events = Vec::new();
        let mut from = 1;
        loop {
            match self.handle.log(from, LOG_PAGE).await {
                Ok(page) if page.is_empty() => return map::messages(&events),
                Ok(page) => {
                    from = page.last().map_or(from, |event| event.seq + 1);
                    events.extend(page);
                }
                Err(error) => {
                    tracing::warn!(conversation = %self.handle.id(), %error, "could not read the thread's messages for AG-UI");
                    return map::messages(&events);
                }
            }
        }
    }
}

/// The SSE response of a run.
fn sse(run: RunStream) -> Response {
    let frames = stream::unfold(Box::new(run), |mut run| async move {
        let bytes = run.next_bytes().await?;
        Some((bytes, run))
    });
    (
        StatusCode::OK,
        [
            (CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(KeepAlive::new(frames, KEEP_ALIVE)),
    )
        .into_response()
}

/// Frames as SSE: `id: SEQ` when the frame has one, and the event as one
/// `data:` line of compact JSON (which holds no raw line break).
pub fn render(frames: &[Frame]) -> Bytes {
    let mut out = Vec::with_capacity(256 * frames.len());
    for frame in frames {
        if let Some(seq) = frame.id {
            // Writing into a Vec cannot fail.
            let _ = writeln!(out, "id: {seq}");
        }
        out.extend_from_slice(b"data: ");
        if serde_json::to_writer(&mut out, &frame.event).is_err() {
            // Not expected: every event is plain data.
            out.extend_from_slice(b"{}");
        }
        out.extend_from_slice(b"\n\n");
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn entry(json: serde_json::Value) -> ResumeEntry {
        serde_json::from_value(json).unwrap()
    }

    /// How each resume entry reads as keel's decision, for the kind of
    /// call that waits (or none, for a call already decided).
    #[test]
    fn a_resume_entry_is_the_decision_its_payload_says() {
        let approve =
            entry(json!({"interruptId": "c", "status": "resolved", "payload": {"approved": true}}));
        let deny = entry(
            json!({"interruptId": "c", "status": "resolved", "payload": {"approved": false}}),
        );
        let cancelled = entry(json!({"interruptId": "c", "status": "cancelled"}));
        let answer = entry(
            json!({"interruptId": "c", "status": "resolved", "payload": {"answer": "large"}}),
        );
        let bare = entry(json!({"interruptId": "c", "status": "resolved", "payload": "large"}));
        let empty = entry(json!({"interruptId": "c", "status": "resolved"}));
        let approval = Some(PendingKind::Approval);
        let question = Some(PendingKind::Elicitation);
        assert_eq!(decision(&approve, approval).unwrap(), Decision::Approve);
        assert_eq!(decision(&deny, approval).unwrap(), Decision::Deny);
        assert_eq!(decision(&cancelled, approval).unwrap(), Decision::Deny);
        assert_eq!(decision(&cancelled, question).unwrap(), Decision::Deny);
        let large = Decision::Answer {
            text: "large".to_owned(),
        };
        assert_eq!(decision(&answer, question).unwrap(), large);
        assert_eq!(decision(&bare, question).unwrap(), large);
        assert_eq!(decision(&answer, None).unwrap(), large);
        assert_eq!(decision(&approve, None).unwrap(), Decision::Approve);
        assert!(decision(&answer, approval).is_err());
        assert!(decision(&approve, question).is_err());
        assert!(decision(&empty, approval).is_err());
        assert!(decision(&empty, None).is_err());
    }
}
