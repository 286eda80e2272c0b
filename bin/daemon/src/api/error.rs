//! Every error the API answers: a status and `{"error": {"code",
//! "message"}}`, from the runtime's errors and from bodies that cannot be
//! read. A request that gets one of these changed nothing.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;

use keel_actors::core::history::HistoryError;
use keel_actors::core::Rejection;

use keel_api::types::{ErrorBody, ErrorDetail};
use keel_api::ErrorCode;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    /// The state of a `busy` conversation, sent beside the message.
    pub state: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            state: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
    }

    pub fn not_found(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("conversation {id} not found"),
        )
    }

    /// The store stopped taking writes (`reason`, the store's words: "disk
    /// is full", a failed fsync): nothing can be recorded or read
    /// reliably until the daemon is restarted on the same data.
    pub fn storage_unavailable(reason: &str) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StorageUnavailable,
            storage_unavailable_message(reason),
        )
    }

    /// A runtime error on conversation `id`.
    pub fn from_runtime(id: &str, error: keel_actors::Error) -> ApiError {
        use keel_actors::Error;
        match error {
            Error::NotFound(_) => ApiError::not_found(id),
            Error::InvalidImage { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::InvalidImage,
                error.to_string(),
            ),
            Error::Rejected(rejection) => ApiError::from_rejection(id, rejection),
            Error::History(error) => {
                let (status, code) = history_status(&error);
                ApiError::new(status, code, error.to_string())
            }
            Error::InvalidCwd { .. } => ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidCwd,
                error.to_string(),
            ),
            Error::NotOwner { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::OwnerUnavailable,
                error.to_string(),
            ),
            Error::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ShuttingDown,
                "keel is shutting down; try again once it is back",
            ),
            Error::Stopped => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Stopped,
                error.to_string(),
            ),
            Error::NotRecorded => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::NotRecorded,
                error.to_string(),
            ),
            Error::Store(
                ref store @ (keel_actors::store::Error::Fatal { .. }
                | keel_actors::store::Error::DiskFull { .. }),
            ) => ApiError::storage_unavailable(&store.to_string()),
            Error::Timeout => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                ErrorCode::Timeout,
                error.to_string(),
            ),
            other => {
                tracing::error!(conversation = id, error = %DisplayChain(&other), "request failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ErrorCode::Internal,
                    DisplayChain(&other).to_string(),
                )
            }
        }
    }

    pub fn from_rejection(id: &str, rejection: Rejection) -> ApiError {
        let (status, code) = match &rejection {
            Rejection::Busy { .. } => (StatusCode::CONFLICT, ErrorCode::Busy),
            Rejection::QueueFull { .. } => (StatusCode::CONFLICT, ErrorCode::QueueFull),
            Rejection::EmptyMessage => (StatusCode::BAD_REQUEST, ErrorCode::EmptyMessage),
            Rejection::Finished => (StatusCode::CONFLICT, ErrorCode::Finished),
            Rejection::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::ShuttingDown),
            Rejection::UnknownCall { .. } => (StatusCode::NOT_FOUND, ErrorCode::UnknownCall),
            Rejection::InvalidDecision { .. } => (StatusCode::CONFLICT, ErrorCode::InvalidDecision),
            Rejection::AlreadyResolved { .. } => (StatusCode::CONFLICT, ErrorCode::AlreadyResolved),
            Rejection::AlreadySettled { .. } => (StatusCode::CONFLICT, ErrorCode::AlreadySettled),
            Rejection::ResolvedByTooLong { .. } => {
                (StatusCode::BAD_REQUEST, ErrorCode::ResolvedByTooLong)
            }
            Rejection::NothingToCompact => (StatusCode::CONFLICT, ErrorCode::NothingToCompact),
            Rejection::SubAgentHistory => {
                (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::SubAgentHistory)
            }
            Rejection::History { error } => history_status(error),
        };
        let message = match &rejection {
            Rejection::Busy { state } => format!(
                "conversation {id} is busy ({state}): cancel it first (POST /v1/conversations/{id}/cancel, or `keel cancel {id}`), then send again"
            ),
            other => other.to_string(),
        };
        let mut error = ApiError::new(status, code, message);
        if let Rejection::Busy { state } = rejection {
            error.state = Some(state.to_string());
        }
        error
    }
}

/// What a client and `/healthz` are told once the store has stopped: the
/// cause, and what happens and what to do.
pub fn storage_unavailable_message(reason: &str) -> String {
    format!(
        "storage unavailable: the store stopped taking writes ({reason}); \
         keel exits so that its supervisor restarts it, and recovers every \
         acknowledged message from the log: free space for (or repair) \
         the disk of its data dir (KEEL_DATA_DIR), then retry"
    )
}

/// An error and its causes on one line.
struct DisplayChain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                state: self.state,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        let status = rejection.status();
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
            _ => ErrorCode::BadJson,
        };
        // 422 is axum's answer for JSON of the wrong shape; the body is
        // malformed for this route either way.
        let status = match status {
            StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
            other => other,
        };
        ApiError::new(status, code, rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> ApiError {
        ApiError::bad_request(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::bad_request(rejection.body_text())
    }
}

/// `axum::Json` whose rejections are [`ApiError`]s.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<T>::from_request(request, state).await?;
        Ok(ApiJson(value))
    }
}

/// [`ApiJson`] for a route whose body may be left out: an empty body is
/// `T::default()`.
pub struct ApiJsonOrEmpty<T>(pub T);

impl<T, S> FromRequest<S> for ApiJsonOrEmpty<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = request.into_parts();
        let bytes = axum::body::to_bytes(body, super::BODY_LIMIT)
            .await
            .map_err(|error| {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorCode::PayloadTooLarge,
                    error.to_string(),
                )
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(ApiJsonOrEmpty(T::default()));
        }
        let request = Request::from_parts(parts, axum::body::Body::from(bytes));
        let Json(value) = Json::<T>::from_request(request, state).await?;
        Ok(ApiJsonOrEmpty(value))
    }
}

/// `axum::extract::Query` whose rejections are [`ApiError`]s.
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(ApiQuery(value))
    }
}

/// The status and code of a fork or rewind the log does not allow.
pub fn history_status(error: &HistoryError) -> (StatusCode, ErrorCode) {
    match error {
        HistoryError::SubAgent => (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::SubAgentHistory),
        HistoryError::OutOfRange { .. }
        | HistoryError::NotABoundary { .. }
        | HistoryError::Replay { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::NotABoundary)
        }
    }
}
