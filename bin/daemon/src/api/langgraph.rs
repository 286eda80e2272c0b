//! The LangGraph Agent Server API under `/langgraph` (docs/langgraph.md),
//! so that LangGraph's own SDKs (`langgraph-sdk`, `@langchain/langgraph-sdk`)
//! and the chat UIs built on them work against keel unmodified.
//!
//! A thread is a keel conversation, a run is a keel turn, and everything a
//! client reads is projected from the conversation's log (`project.rs`):
//! nothing here is stored on the side, so a thread reads the same after a
//! restart, and an interrupt that waited before one still waits. Requests
//! go through the runtime's library API, like keel's own routes, with the
//! same refusals (a busy thread, a decision already taken) in the same
//! error shape.
//!
//! The SDK's `x-api-key` header is accepted as keel's token on these routes
//! (`api.rs`, `require_token`).

pub mod project;

use std::time::{Duration, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, RawQuery, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use futures_util::{stream, StreamExt as _};
use serde::Deserialize;
use serde_json::{json, Value};

use keel_actors::core::config::{BusyPolicy, ConversationConfig, ModelRef};
use keel_actors::core::event::{Decision, Event, EventKind, PendingKind};
use keel_actors::core::{ConversationId, Seq};
use keel_actors::{ConversationHandle, ImageUpload, Update};
use keel_api::ErrorCode;

use super::error::{ApiError, ApiJson, ApiJsonOrEmpty};
use super::events::keep_alive::KeepAlive;
use super::events::KEEP_ALIVE;
use super::follow::{Follower, Item};
use super::{AppState, MESSAGE_BODY_LIMIT};
use project::{Frame, Modes, Projection, Run, RunStart, RunStatus};

/// The one assistant keel serves: the daemon's default agent.
pub const ASSISTANT_ID: &str = "keel";

/// Who a decision taken through this API is recorded as (`Resolved.by`).
const DECIDED_BY: &str = "langgraph";

/// The routes, relative to `/langgraph`.
pub fn router() -> Router<AppState> {
    // A run's input may carry images, as a message does.
    let runs = Router::new()
        .route("/threads/{thread}/runs", post(run_create).get(runs_list))
        .route("/threads/{thread}/runs/stream", post(run_stream))
        .route("/threads/{thread}/runs/wait", post(run_wait))
        .layer(DefaultBodyLimit::max(MESSAGE_BODY_LIMIT));
    Router::new()
        .merge(runs)
        .route("/assistants/search", post(assistants_search))
        .route("/assistants/{id}", get(assistant))
        .route("/threads", post(thread_create))
        .route("/threads/search", post(threads_search))
        .route("/threads/{thread}", get(thread_get).delete(thread_delete))
        .route("/threads/{thread}/state", get(thread_state))
        .route("/threads/{thread}/history", post(thread_history))
        .route("/threads/{thread}/runs/{run}", get(run_get))
        .route("/threads/{thread}/runs/{run}/join", get(run_join))
        .route("/threads/{thread}/runs/{run}/stream", get(run_join_stream))
        .route("/threads/{thread}/runs/{run}/cancel", post(run_cancel))
}

// ---- assistants ----------------------------------------------------------

fn assistant_json() -> Value {
    json!({
        "assistant_id": ASSISTANT_ID,
        "graph_id": ASSISTANT_ID,
        "name": ASSISTANT_ID,
        "description": "keel's agent: the daemon's default model with keel's tools",
        "config": {},
        "context": {},
        "metadata": {},
        "version": 1,
        "created_at": rfc3339(0),
        "updated_at": rfc3339(0),
    })
}

async fn assistants_search(ApiJsonOrEmpty(_query): ApiJsonOrEmpty<Value>) -> Json<Value> {
    Json(json!([assistant_json()]))
}

async fn assistant(Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    check_assistant(&id)?;
    Ok(Json(assistant_json()))
}

/// keel serves one assistant, named `keel` (its graph id too).
fn check_assistant(id: &str) -> Result<(), ApiError> {
    if id == ASSISTANT_ID {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("assistant {id} not found; keel serves one assistant, {ASSISTANT_ID:?}"),
        ))
    }
}

// ---- threads -------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
struct ThreadCreate {
    thread_id: Option<String>,
    /// `raise` (the default) or `do_nothing`.
    if_exists: Option<String>,
}

async fn thread_create(
    State(state): State<AppState>,
    ApiJsonOrEmpty(request): ApiJsonOrEmpty<ThreadCreate>,
) -> Result<Json<Value>, ApiError> {
    let id = match request.thread_id {
        Some(raw) => {
            let id = ConversationId::new(raw.clone())
                .map_err(|error| ApiError::bad_request(format!("thread_id {raw:?}: {error}")))?;
            let (_, created) = state
                .runtime
                .create_if_absent(
                    id.clone(),
                    state.default_cwd.as_ref(),
                    thread_config(&state),
                )
                .await
                .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
            if !created && request.if_exists.as_deref() != Some("do_nothing") {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    ErrorCode::AlreadyExists,
                    format!("thread {id} exists (if_exists: \"do_nothing\" returns it)"),
                ));
            }
            id
        }
        None => state
            .runtime
            .create(state.default_cwd.as_ref(), thread_config(&state))
            .await
            .map_err(|error| ApiError::from_runtime("(new)", error))?
            .id()
            .clone(),
    };
    thread_json(&state, &id).await.map(Json)
}

/// A new thread's settings: the daemon's defaults, with messages that
/// arrive while it is busy queued, so that `multitask_strategy: enqueue`
/// works as LangGraph's does (`reject` and `interrupt` are decided here,
/// before the message is sent).
fn thread_config(state: &AppState) -> ConversationConfig {
    ConversationConfig {
        primary: ModelRef::clone(&state.default_model),
        busy_policy: BusyPolicy::Queue,
        ..ConversationConfig::default()
    }
}

#[derive(Debug, Default, Deserialize)]
struct ThreadSearch {
    limit: Option<usize>,
    offset: Option<usize>,
    ids: Option<Vec<String>>,
    status: Option<String>,
}

async fn threads_search(
    State(state): State<AppState>,
    ApiJsonOrEmpty(query): ApiJsonOrEmpty<ThreadSearch>,
) -> Result<Json<Value>, ApiError> {
    let mut entries = state
        .runtime
        .list(false)
        .await
        .map_err(|error| ApiError::from_runtime("(list)", error))?;
    // Newest first, as LangGraph lists threads.
    entries.sort_by_key(|entry| std::cmp::Reverse(entry.created_at));
    if let Some(ids) = &query.ids {
        entries.retain(|entry| ids.iter().any(|id| id == entry.id.as_str()));
    }
    let offset = query.offset.unwrap_or(0);
    let limit = query.limit.unwrap_or(10).min(1000);
    let mut threads = Vec::new();
    for entry in entries.iter().skip(offset) {
        if threads.len() == limit {
            break;
        }
        let thread = thread_json(&state, &entry.id).await?;
        if query
            .status
            .as_deref()
            .is_some_and(|status| thread["status"] != status)
        {
            continue;
        }
        threads.push(thread);
    }
    Ok(Json(Value::Array(threads)))
}

async fn thread_get(
    State(state): State<AppState>,
    Path(thread): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = thread_id(&thread)?;
    thread_json(&state, &id).await.map(Json)
}

async fn thread_delete(
    State(state): State<AppState>,
    Path(thread): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = thread_id(&thread)?;
    // An unknown thread is 404 (the runtime's delete finds nothing).
    read_log(&state, &id).await?;
    // A thread's runs stop with it, as LangGraph deletes a busy thread.
    state
        .runtime
        .delete(&id, true)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok(StatusCode::NO_CONTENT)
}

async fn thread_state(
    State(state): State<AppState>,
    Path(thread): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = thread_id(&thread)?;
    let events = read_log(&state, &id).await?;
    let projection = Projection::of(id.as_str(), &events);
    Ok(Json(state_json(&id, &projection, &events)))
}

#[derive(Debug, Default, Deserialize)]
struct HistoryQuery {
    limit: Option<usize>,
    /// `{"checkpoint_id": "SEQ"}`: states before that one.
    before: Option<Value>,
}

/// The thread's states at the end of each run, newest first: a run's end
/// is a checkpoint a client can look back at.
async fn thread_history(
    State(state): State<AppState>,
    Path(thread): Path<String>,
    ApiJsonOrEmpty(query): ApiJsonOrEmpty<HistoryQuery>,
) -> Result<Json<Value>, ApiError> {
    let id = thread_id(&thread)?;
    let events = read_log(&state, &id).await?;
    let before: Option<Seq> = query
        .before
        .as_ref()
        .and_then(|before| before["checkpoint_id"].as_str())
        .and_then(|seq| seq.parse().ok());
    let mut ends: Vec<Seq> = project::runs(&events)
        .iter()
        .filter_map(|run| run.end)
        .collect();
    if let Some(last) = events.last() {
        ends.push(last.seq);
    }
    ends.sort_unstable();
    ends.dedup();
    let limit = query.limit.unwrap_or(10).min(1000);
    let mut states = Vec::new();
    for end in ends.into_iter().rev() {
        if before.is_some_and(|before| end >= before) {
            continue;
        }
        if states.len() == limit {
            break;
        }
        let upto = &events[..events.partition_point(|event| event.seq <= end)];
        let projection = Projection::of(id.as_str(), upto);
        states.push(state_json(&id, &projection, upto));
    }
    Ok(Json(Value::Array(states)))
}

/// A thread as LangGraph shows it.
async fn thread_json(state: &AppState, id: &ConversationId) -> Result<Value, ApiError> {
    let events = read_log(state, id).await?;
    let projection = Projection::of(id.as_str(), &events);
    let interrupts = projection.interrupts();
    let mut by_task = serde_json::Map::new();
    if !interrupts.is_empty() {
        by_task.insert(project::TOOLS_NODE.to_owned(), Value::Array(interrupts));
    }
    Ok(json!({
        "thread_id": id.as_str(),
        "created_at": rfc3339(events.first().map_or(0, |event| event.at.0)),
        "updated_at": rfc3339(events.last().map_or(0, |event| event.at.0)),
        "metadata": {"graph_id": ASSISTANT_ID, "assistant_id": ASSISTANT_ID},
        "status": thread_status(&projection, &project::runs(&events)),
        "values": projection.values(),
        "interrupts": by_task,
    }))
}

/// `idle`, `busy` (a run waits or runs), `interrupted` (calls wait for a
/// decision) or `error` (the latest run failed).
fn thread_status(projection: &Projection, runs: &[Run]) -> &'static str {
    if !projection.pending().is_empty() {
        return "interrupted";
    }
    match runs.last().map(|run| run.status) {
        Some(RunStatus::Pending | RunStatus::Running) => "busy",
        Some(RunStatus::Error) => "error",
        _ => "idle",
    }
}

/// A thread's state (`GET …/state`, an entry of `…/history`).
fn state_json(id: &ConversationId, projection: &Projection, events: &[Event]) -> Value {
    let interrupts = projection.interrupts();
    let waiting = !interrupts.is_empty();
    let last = events.last();
    json!({
        "values": projection.values(),
        "next": if waiting { json!([project::TOOLS_NODE]) } else { json!([]) },
        "tasks": if waiting {
            json!([{
                "id": project::interrupt_id(projection.last_seq()),
                "name": project::TOOLS_NODE,
                "error": null,
                "interrupts": interrupts,
                "checkpoint": null,
                "state": null,
                "result": null,
            }])
        } else {
            json!([])
        },
        "checkpoint": checkpoint(id, last.map_or(0, |event| event.seq)),
        "parent_checkpoint": null,
        "metadata": {"source": "loop", "step": last.map_or(0, |event| event.seq)},
        "created_at": rfc3339(last.map_or(0, |event| event.at.0)),
        "interrupts": interrupts,
    })
}

fn checkpoint(id: &ConversationId, seq: Seq) -> Value {
    json!({
        "thread_id": id.as_str(),
        "checkpoint_ns": "",
        "checkpoint_id": seq.to_string(),
        "checkpoint_map": null,
    })
}

// ---- runs ----------------------------------------------------------------

/// The body of `POST …/runs`, `…/runs/stream` and `…/runs/wait`. Fields
/// the SDK sends that keel has no use for (config, webhooks, durability)
/// are accepted and left alone.
#[derive(Debug, Default, Deserialize)]
struct RunRequest {
    assistant_id: Option<String>,
    input: Option<Value>,
    command: Option<Value>,
    stream_mode: Option<Value>,
    multitask_strategy: Option<String>,
}

async fn run_stream(
    State(state): State<AppState>,
    Path(thread): Path<String>,
    ApiJson(request): ApiJson<RunRequest>,
) -> Result<Response, ApiError> {
    let id = thread_id(&thread)?;
    let modes = Modes::parse(&stream_modes(request.stream_mode.as_ref())?);
    let started = start_run(&state, &id, request).await?;
    stream_run(state, id, started.run, started.follow_from, None, modes).await
}

async fn run_wait(
    State(state): State<AppState>,
    Path(thread): Path<String>,
    ApiJson(request): ApiJson<RunRequest>,
) -> Result<Response, ApiError> {
    let id = thread_id(&thread)?;
    let started = start_run(&state, &id, request).await?;
    let values = wait_run(&state, &id, started.run).await?;
    Ok((run_headers(&id, started.run, None), Json(values)).into_response())
}

async fn run_create(
    State(state): State<AppState>,
    Path(thread): Path<String>,
    ApiJson(request): ApiJson<RunRequest>,
) -> Result<Response, ApiError> {
    let id = thread_id(&thread)?;
    let started = start_run(&state, &id, request).await?;
    let events = read_log(&state, &id).await?;
    let run = find_run(&events, started.run)?;
    Ok((
        run_headers(&id, started.run, None),
        Json(run_json(&id, &run)),
    )
        .into_response())
}

async fn runs_list(
    State(state): State<AppState>,
    Path(thread): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = thread_id(&thread)?;
    let events = read_log(&state, &id).await?;
    // Newest first, as LangGraph lists them.
    let runs: Vec<Value> = project::runs(&events)
        .iter()
        .rev()
        .map(|run| run_json(&id, run))
        .collect();
    Ok(Json(Value::Array(runs)))
}

async fn run_get(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let id = thread_id(&thread)?;
    let seq = run_seq(&id, &run)?;
    let events = read_log(&state, &id).await?;
    Ok(Json(run_json(&id, &find_run(&events, seq)?)))
}

async fn run_join(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let id = thread_id(&thread)?;
    let seq = run_seq(&id, &run)?;
    find_run(&read_log(&state, &id).await?, seq)?;
    wait_run(&state, &id, seq).await.map(Json)
}

/// Join a run's stream: from the frame after `Last-Event-ID` (the SDK's own
/// reconnect), or from now.
async fn run_join_stream(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = thread_id(&thread)?;
    let seq = run_seq(&id, &run)?;
    let events = read_log(&state, &id).await?;
    let found = find_run(&events, seq)?;
    // `stream_mode` may come once per mode (the SDK's way) or as a list.
    let named: Vec<String> = query
        .as_deref()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.strip_prefix("stream_mode="))
        .flat_map(|modes| modes.split("%2C").flat_map(|mode| mode.split(',')))
        .map(str::to_owned)
        .collect();
    let modes = match named.is_empty() {
        false => Modes::parse(&named),
        // A joined run streams what a run started without modes does,
        // and its messages.
        true => Modes {
            values: true,
            messages_tuple: true,
            ..Modes::default()
        },
    };
    let resume = match headers.get("last-event-id") {
        Some(value) => Some(parse_last_event_id(value)?),
        None => None,
    };
    let from = match resume {
        Some((seq, _)) => seq + 1,
        // From now: nothing of what came before.
        None => events.last().map_or(1, |event| event.seq + 1),
    };
    // Nothing from before the run.
    let from = from.max(found.seq);
    stream_run(state, id, seq, from, resume.map(|(_, bytes)| bytes), modes).await
}

#[derive(Debug, Default, Deserialize)]
struct CancelQuery {
    wait: Option<String>,
    action: Option<String>,
}

async fn run_cancel(
    State(state): State<AppState>,
    Path((thread, run)): Path<(String, String)>,
    Query(query): Query<CancelQuery>,
) -> Result<Response, ApiError> {
    let id = thread_id(&thread)?;
    let seq = run_seq(&id, &run)?;
    if query.action.as_deref() == Some("rollback") {
        return Err(rollback_refused());
    }
    let events = read_log(&state, &id).await?;
    let found = find_run(&events, seq)?;
    if found.status.is_done() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::NotRunning,
            format!(
                "run {run} has ended ({}); there is nothing to cancel",
                found.status.as_str()
            ),
        ));
    }
    state
        .runtime
        .handle(id.clone())
        .cancel()
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    if matches!(query.wait.as_deref(), Some("1" | "true")) {
        wait_run(&state, &id, seq).await?;
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

fn rollback_refused() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::Unsupported,
        "keel keeps every event of a thread: `rollback` is not supported; use `interrupt`, or rewind the conversation (POST /v1/conversations/{id}/rewind)",
    )
}

/// What a request started: the run's seq, and the seq its stream follows
/// from (the message itself, or the first event after the decisions).
struct Started {
    run: Seq,
    follow_from: Seq,
}

/// Send the run's input (a message) or its command (decisions on the
/// waiting calls). A refused request changes nothing.
async fn start_run(
    state: &AppState,
    id: &ConversationId,
    request: RunRequest,
) -> Result<Started, ApiError> {
    if let Some(assistant) = &request.assistant_id {
        check_assistant(assistant)?;
    }
    let events = read_log(state, id).await?;
    if events.is_empty() {
        return Err(ApiError::not_found(id.as_str()));
    }
    let handle = state.runtime.handle(id.clone());
    let resume = request
        .command
        .as_ref()
        .and_then(|command| command.get("resume"))
        .filter(|resume| !resume.is_null());
    if let Some(resume) = resume {
        return resume_run(state, &handle, &events, resume).await;
    }
    let (text, images) = new_input(request.input.as_ref(), &events)?;
    let limit = state.max_message_bytes;
    if text.len() > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!(
                "the input's text is {} bytes; at most {limit} (KEEL_MAX_MESSAGE_BYTES)",
                text.len()
            ),
        ));
    }
    if images.len() > super::conversations::MAX_IMAGES {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidImage,
            format!(
                "{} images; a run's input may carry at most {}",
                images.len(),
                super::conversations::MAX_IMAGES
            ),
        ));
    }
    let projection = Projection::of(id.as_str(), &events);
    let busy = !matches!(
        thread_status(&projection, &project::runs(&events)),
        "idle" | "error"
    );
    match request.multitask_strategy.as_deref().unwrap_or("reject") {
        "reject" if busy => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::Busy,
                "the thread is busy (a run runs or waits for decisions); send with multitask_strategy \"enqueue\" or \"interrupt\", or resume its interrupt",
            ))
        }
        "interrupt" if busy => {
            handle
                .cancel()
                .await
                .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
        }
        "enqueue" if !projection.pending().is_empty() => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::Busy,
                "the thread waits for decisions on its interrupt; resume it with command.resume before sending, or interrupt it",
            ))
        }
        "reject" | "interrupt" | "enqueue" => {}
        "rollback" => return Err(rollback_refused()),
        other => {
            return Err(ApiError::bad_request(format!(
                "multitask_strategy {other:?}: use \"reject\", \"interrupt\" or \"enqueue\""
            )))
        }
    }
    let event = handle
        .send(text, images)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok(Started {
        run: event.seq,
        follow_from: event.seq,
    })
}

/// The text and images of the input's new human messages: those the
/// thread does not hold yet (a client may send the whole history again).
fn new_input(
    input: Option<&Value>,
    events: &[Event],
) -> Result<(String, Vec<ImageUpload>), ApiError> {
    let messages = input
        .and_then(|input| input.get("messages"))
        .and_then(Value::as_array)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::BadRequest,
                "a run needs input.messages (a list with a human message) or command.resume",
            )
        })?;
    let known: Vec<String> = events
        .iter()
        .map(|event| format!("keel-{}", event.seq))
        .collect();
    let mut texts = Vec::new();
    let mut images = Vec::new();
    for message in messages {
        let message = match message {
            // A bare string is a human message.
            Value::String(text) => json!({"type": "human", "content": text}),
            other => other.clone(),
        };
        let role = message["type"]
            .as_str()
            .or_else(|| message["role"].as_str())
            .unwrap_or_default();
        if !matches!(role, "human" | "user") {
            continue;
        }
        if message["id"]
            .as_str()
            .is_some_and(|id| known.iter().any(|known| known == id))
        {
            continue;
        }
        match &message["content"] {
            Value::String(text) => texts.push(text.clone()),
            Value::Array(parts) => {
                for part in parts {
                    match part["type"].as_str() {
                        Some("text") => texts.push(part["text"].as_str().unwrap_or_default().to_owned()),
                        Some("image_url") => {
                            let url = part["image_url"]["url"]
                                .as_str()
                                .or_else(|| part["image_url"].as_str())
                                .unwrap_or_default();
                            images.push(data_url_image(url)?);
                        }
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "content part of type {other:?}: keel takes \"text\" and \"image_url\" (a data: URL)"
                            )))
                        }
                    }
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "a human message's content must be a string or a list of parts, not {other}"
                )))
            }
        }
    }
    let text = texts.join("\n\n");
    if text.trim().is_empty() && images.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::EmptyMessage,
            "input.messages holds no new human message",
        ));
    }
    Ok((text, images))
}

/// An image given as a `data:` URL.
fn data_url_image(url: &str) -> Result<ImageUpload, ApiError> {
    let refused = || {
        ApiError::bad_request(
            "an image_url must be a data: URL (data:image/png;base64,...): keel does not fetch images",
        )
    };
    let rest = url.strip_prefix("data:").ok_or_else(refused)?;
    let (media_type, data) = rest.split_once(";base64,").ok_or_else(refused)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|error| ApiError::bad_request(format!("an image's base64 is invalid: {error}")))?;
    Ok(ImageUpload::new(media_type, bytes))
}

/// Decide the waiting calls as `resume` says: `{"decisions": [...]}` in
/// the order of the interrupt's actions (or that keyed by the interrupt's
/// id), or, when one question waits, its answer as a string.
async fn resume_run(
    state: &AppState,
    handle: &ConversationHandle,
    events: &[Event],
    resume: &Value,
) -> Result<Started, ApiError> {
    let id = handle.id();
    let projection = Projection::of(id.as_str(), events);
    let pending = projection.pending().to_vec();
    if pending.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::NothingWaits,
            "nothing on this thread waits for a decision; send input instead of command.resume",
        ));
    }
    let resume = match resume.as_object() {
        // Keyed by interrupt id: the one interrupt keel has open.
        Some(map) if !map.contains_key("decisions") && map.len() == 1 => {
            map.values().next().cloned().unwrap_or(Value::Null)
        }
        _ => resume.clone(),
    };
    let decisions: Vec<Value> = match &resume {
        Value::String(answer) => vec![json!({"type": "respond", "message": answer})],
        other => other["decisions"]
            .as_array()
            .cloned()
            .ok_or_else(|| {
                ApiError::bad_request(
                    "command.resume must be {\"decisions\": [...]} (one per action of the interrupt) or, for one question, its answer",
                )
            })?,
    };
    if decisions.len() != pending.len() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidDecision,
            format!(
                "the interrupt has {} actions and the resume {} decisions: give one per action, in order",
                pending.len(),
                decisions.len()
            ),
        ));
    }
    let mut resolutions = Vec::new();
    for (call, decision) in pending.iter().zip(&decisions) {
        resolutions.push((
            call.call.id.clone(),
            decision_of(call.kind, &call.call.name, decision)?,
        ));
    }
    let before = events.last().map_or(0, |event| event.seq);
    for (tool_call_id, decision) in resolutions {
        handle
            .resolve_as(tool_call_id, decision, Some(DECIDED_BY.to_owned()))
            .await
            .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    }
    // The run the decisions started: the resumption after the interrupt
    // (found again when the same decisions are sent twice).
    let events = read_log(state, id).await?;
    let run = project::runs(&events)
        .into_iter()
        .rev()
        .find(|run| run.start == RunStart::Resume)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::NothingWaits,
                "the decisions were taken, but no run resumed",
            )
        })?;
    Ok(Started {
        run: run.seq,
        follow_from: run.seq.min(before + 1),
    })
}

/// A LangChain decision as keel's, for a call of `kind`.
fn decision_of(kind: PendingKind, call_name: &str, decision: &Value) -> Result<Decision, ApiError> {
    let text = |decision: &Value| {
        decision["message"]
            .as_str()
            .or_else(|| decision["args"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| decision["args"].to_string())
    };
    match (decision["type"].as_str(), kind) {
        (Some("approve"), PendingKind::Approval) => Ok(Decision::Approve),
        (Some("reject"), _) => Ok(Decision::Deny),
        (Some("respond" | "response"), PendingKind::Elicitation | PendingKind::ClientExec) => {
            Ok(Decision::Answer {
                text: text(decision),
            })
        }
        (Some("edit"), PendingKind::Approval) => {
            let input = decision["edited_action"]["args"].clone();
            if !input.is_object() {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::InvalidDecision,
                    "an edit needs edited_action.args, the call's new arguments (an object)",
                ));
            }
            if decision["edited_action"]["name"]
                .as_str()
                .is_some_and(|name| name != call_name)
            {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::InvalidDecision,
                    format!("an edit keeps the tool: edited_action.name must be {call_name:?}"),
                ));
            }
            Ok(Decision::Edit { input })
        }
        (other, kind) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidDecision,
            format!(
                "decision {:?} does not fit a call waiting for {}: an approval takes approve or reject, a question or a client's tool respond or reject",
                other.unwrap_or("(no type)"),
                match kind {
                    PendingKind::Approval => "approval",
                    PendingKind::Elicitation => "an answer",
                    PendingKind::ClientExec => "a client's result",
                }
            ),
        )),
    }
}

/// The run's values once it has ended (or paused for a decision).
async fn wait_run(state: &AppState, id: &ConversationId, run: Seq) -> Result<Value, ApiError> {
    let events = read_log(state, id).await?;
    let mut projection = Projection::of(id.as_str(), &events);
    let mut book = project::RunBook::of(&events);
    if book.status(run).is_some_and(RunStatus::is_done) {
        return Ok(projection.values());
    }
    let mut follower = Follower::open(state, id.clone(), Some(projection.last_seq() + 1)).await?;
    while let Some(item) = follower.next().await {
        for update in updates(&item) {
            if let Update::Event { event } = update {
                projection.absorb(event);
                book.absorb(event);
            }
        }
        if let Item::Failed { message, .. } = &item {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ConversationUnavailable,
                message.clone(),
            ));
        }
        if book.status(run).is_some_and(RunStatus::is_done) {
            return Ok(projection.values());
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::ShuttingDown,
        "keel is stopping; join the run again",
    ))
}

/// The updates an item carries, in order (none for a snapshot, a lag or
/// a failure).
fn updates(item: &Item) -> &[Update] {
    match item {
        Item::Logged(updates) => updates,
        Item::Wave(wave) => wave.updates(),
        Item::Snapshot(_) | Item::Lagged { .. } | Item::Failed { .. } => &[],
    }
}

/// A run's stream: `metadata`, then the frames of `modes` from seq `from`
/// on, until the run ends (or pauses for a decision). `resume_bytes` is
/// the `BYTES` of a `SEQ:BYTES` Last-Event-ID.
async fn stream_run(
    state: AppState,
    id: ConversationId,
    run: Seq,
    from: Seq,
    resume_bytes: Option<usize>,
    modes: Modes,
) -> Result<Response, ApiError> {
    let events = read_log(&state, &id).await?;
    let history = &events[..events.partition_point(|event| event.seq < from)];
    let mut projection = Projection::of(id.as_str(), history);
    let book = project::RunBook::of(history);
    if let Some(bytes) = resume_bytes.filter(|bytes| *bytes > 0) {
        projection.resume_mid_answer(bytes);
    }
    let follower = Follower::open(&state, id.clone(), Some(from)).await?;
    let metadata = render(&Frame {
        event: "metadata".to_owned(),
        id: None,
        data: json!({"run_id": run_id(&id, run), "attempt": 1}),
    });
    let done = book.status(run).is_some_and(RunStatus::is_done);
    let stream = RunStream {
        follower,
        projection,
        book,
        run,
        modes,
        done,
    };
    let frames = stream::once(async move { metadata }).chain(stream::unfold(
        Box::new(stream),
        |mut stream| async move {
            let bytes = stream.next_frames().await?;
            Some((bytes, stream))
        },
    ));
    let body = Body::from_stream(KeepAlive::new(frames, KEEP_ALIVE));
    let mut response = (
        [
            (CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response();
    response
        .headers_mut()
        .extend(run_headers(&id, run, Some(modes)));
    Ok(response)
}

/// One client's stream of one run.
struct RunStream {
    follower: Follower,
    projection: Projection,
    book: project::RunBook,
    run: Seq,
    modes: Modes,
    done: bool,
}

impl RunStream {
    /// The next frames, rendered; `None` once the run has ended.
    async fn next_frames(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let item = self.follower.next().await?;
            let mut frames = Vec::new();
            if let Item::Failed { code, message } = &item {
                self.done = true;
                frames.push(Frame {
                    event: "error".to_owned(),
                    id: None,
                    data: json!({"error": code.as_str(), "message": message}),
                });
            }
            for update in updates(&item) {
                if self.done {
                    break;
                }
                match update {
                    Update::Event { event } => {
                        self.projection.frames(event, self.modes, &mut frames);
                        self.book.absorb(event);
                        if let Some(status) =
                            self.book.status(self.run).filter(|status| status.is_done())
                        {
                            self.done = true;
                            if let (RunStatus::Error, EventKind::TurnFailed { error, .. }) =
                                (status, &event.kind)
                            {
                                frames.push(Frame {
                                    event: "error".to_owned(),
                                    id: Some(self.projection.frame_id()),
                                    data: json!({"error": "TurnFailed", "message": error}),
                                });
                            }
                        }
                    }
                    Update::Live { event } => {
                        // Tokens of this run only: an earlier run's end
                        // is still ahead while it has not started.
                        if self.book.status(self.run) == Some(RunStatus::Running) {
                            self.projection.live(event, self.modes, &mut frames);
                        }
                    }
                }
            }
            if !frames.is_empty() {
                let mut bytes = Vec::new();
                for frame in &frames {
                    bytes.extend_from_slice(&render(frame));
                }
                return Some(Bytes::from(bytes));
            }
        }
    }
}

/// One SSE frame as bytes.
fn render(frame: &Frame) -> Bytes {
    let mut out = format!("event: {}\n", frame.event);
    if let Some(id) = &frame.id {
        out.push_str(&format!("id: {id}\n"));
    }
    out.push_str(&format!("data: {}\n\n", frame.data));
    Bytes::from(out)
}

/// `Content-Location` (where the SDK reads the run's id) and, for a
/// stream in `modes`, `Location`: where the SDK reconnects it, in the same
/// modes (it sends no body then), relative to the API's base as the SDK
/// resolves it.
fn run_headers(id: &ConversationId, run: Seq, modes: Option<Modes>) -> HeaderMap {
    let path = format!("/threads/{}/runs/{}", id.as_str(), run_id(id, run));
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_str(&path) {
        headers.insert(HeaderName::from_static("content-location"), value);
    }
    if let Some(modes) = modes {
        let query: Vec<String> = modes
            .names()
            .iter()
            .map(|mode| format!("stream_mode={mode}"))
            .collect();
        let location = format!("{path}/stream?{}", query.join("&"));
        if let Ok(value) = HeaderValue::from_str(&location) {
            headers.insert(axum::http::header::LOCATION, value);
        }
    }
    headers
}

fn run_json(id: &ConversationId, run: &Run) -> Value {
    json!({
        "run_id": run_id(id, run.seq),
        "thread_id": id.as_str(),
        "assistant_id": ASSISTANT_ID,
        "created_at": rfc3339(run.created_at),
        "updated_at": rfc3339(run.updated_at),
        "status": run.status.as_str(),
        "metadata": {},
        "kwargs": {},
        "multitask_strategy": "reject",
    })
}

fn find_run(events: &[Event], seq: Seq) -> Result<Run, ApiError> {
    project::runs(events)
        .into_iter()
        .find(|run| run.seq == seq)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                format!("run at seq {seq} not found"),
            )
        })
}

/// A run's id: UUID-shaped (clients store it as one), unique per thread
/// and seq, and read back to both.
pub fn run_id(id: &ConversationId, seq: Seq) -> String {
    format!("{:08x}-0000-4000-8000-{seq:012x}", thread_hash(id))
}

/// The seq a run id of thread `id` names.
fn run_seq(id: &ConversationId, run: &str) -> Result<Seq, ApiError> {
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("run {run} not found in thread {id}"),
        )
    };
    let (Some((prefix, _)), Some((_, seq))) = (run.split_once('-'), run.rsplit_once('-')) else {
        return Err(not_found());
    };
    if prefix != format!("{:08x}", thread_hash(id)) {
        return Err(not_found());
    }
    Seq::from_str_radix(seq, 16).map_err(|_| not_found())
}

/// FNV-1a of the thread's id: a run id's first part.
fn thread_hash(id: &ConversationId) -> u32 {
    id.as_str().bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

// ---- helpers -------------------------------------------------------------

fn thread_id(raw: &str) -> Result<ConversationId, ApiError> {
    ConversationId::new(raw.to_owned()).map_err(|_| ApiError::not_found(raw))
}

/// The whole log of thread `id`; an unknown thread is 404.
async fn read_log(state: &AppState, id: &ConversationId) -> Result<Vec<Event>, ApiError> {
    let events = state
        .runtime
        .store()
        .read_all(id)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error.into()))?;
    if events.is_empty() {
        return Err(ApiError::not_found(id.as_str()));
    }
    Ok(events)
}

/// `stream_mode`: a name or a list of names.
fn stream_modes(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(mode)) => Ok(vec![mode.clone()]),
        Some(Value::Array(modes)) => modes
            .iter()
            .map(|mode| {
                mode.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ApiError::bad_request("stream_mode must list names"))
            })
            .collect(),
        Some(other) => Err(ApiError::bad_request(format!(
            "stream_mode must be a name or a list of names, not {other}"
        ))),
    }
}

/// `SEQ` or `SEQ:BYTES`.
fn parse_last_event_id(value: &HeaderValue) -> Result<(Seq, usize), ApiError> {
    let bad =
        || ApiError::bad_request("Last-Event-ID must be an id this stream sent (SEQ or SEQ:BYTES)");
    let text = value.to_str().map_err(|_| bad())?.trim();
    let (seq, bytes) = match text.split_once(':') {
        Some((seq, bytes)) => (seq, bytes.parse().map_err(|_| bad())?),
        None => (text, 0),
    };
    Ok((seq.parse().map_err(|_| bad())?, bytes))
}

/// Milliseconds since the epoch as RFC 3339, as LangGraph's times are.
fn rfc3339(millis: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}
