//! The control routes under `/_mock/`: what a test uses to steer the fake
//! provider and to read what it saw, apart from the provider routes, which
//! only answer as a provider would.
//!
//! `/_mock/script` queues, shows and clears scripted entries;
//! `/_mock/settings` shows and changes the settings (the context window);
//! `/_mock/requests` lists the recording (optionally waiting for requests
//! to end) and clears it.

use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use super::script::parse_script;
use super::settings::Settings;
use super::Mock;

/// How long `GET /_mock/requests?wait_ended=N` waits at most by default,
/// and at most at all.
const DEFAULT_WAIT: Duration = Duration::from_secs(5);
const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// A refusal of a control request: `{error: {code, message}}`, keel's shape.
fn control_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

pub async fn push_script(State(mock): State<Mock>, body: Bytes) -> Response {
    let value = match serde_json::from_slice::<Value>(&body) {
        Ok(value) => value,
        Err(err) => {
            let message = format!("the script is not JSON: {err}");
            return control_error(StatusCode::BAD_REQUEST, "bad_script", &message);
        }
    };
    match parse_script(&value) {
        Ok(entries) => {
            let n_added = entries.len();
            let mut script = mock.script();
            script.push(entries);
            Json(json!({"added": n_added, "queued": script.len()})).into_response()
        }
        Err(err) => control_error(StatusCode::BAD_REQUEST, "bad_script", &err.to_string()),
    }
}

pub async fn show_script(State(mock): State<Mock>) -> Json<Value> {
    Json(json!({"pending": mock.script().pending()}))
}

pub async fn clear_script(State(mock): State<Mock>) -> Json<Value> {
    let mut script = mock.script();
    let n_cleared = script.len();
    script.clear();
    Json(json!({"cleared": n_cleared}))
}

pub async fn show_settings(State(mock): State<Mock>) -> Json<Settings> {
    Json(*mock.settings())
}

/// Make the change the body names (`{"context_window": TOKENS or null}`)
/// and answer the settings as they now are; a bad change changes nothing.
pub async fn change_settings(State(mock): State<Mock>, body: Bytes) -> Response {
    let change = match serde_json::from_slice::<Value>(&body) {
        Ok(change) => change,
        Err(err) => {
            let message = format!("the settings are not JSON: {err}");
            return control_error(StatusCode::BAD_REQUEST, "bad_settings", &message);
        }
    };
    let mut settings = mock.settings();
    match settings.changed(&change) {
        Ok(changed) => {
            *settings = changed;
            Json(changed).into_response()
        }
        Err(err) => control_error(StatusCode::BAD_REQUEST, "bad_settings", &err),
    }
}

#[derive(Debug, Deserialize)]
pub struct RequestsQuery {
    /// Wait until at least this many requests are recorded and none is
    /// still pending.
    wait_ended: Option<usize>,
    /// How long to wait at most (default 5 s, at most 60 s).
    timeout_ms: Option<u64>,
}

pub async fn list_requests(
    State(mock): State<Mock>,
    Query(query): Query<RequestsQuery>,
) -> Response {
    let records = match query.wait_ended {
        None => mock.recorder.list(),
        Some(n_records) => {
            let timeout = query
                .timeout_ms
                .map_or(DEFAULT_WAIT, Duration::from_millis)
                .min(LONGEST_WAIT);
            mock.recorder.wait_ended(n_records, timeout).await
        }
    };
    Json(records).into_response()
}

pub async fn clear_requests(State(mock): State<Mock>) -> Json<Value> {
    Json(json!({"cleared": mock.recorder.clear()}))
}
