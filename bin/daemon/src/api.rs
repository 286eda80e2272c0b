//! The daemon's HTTP API (docs/daemon.md): its routes, their state, the
//! bearer-token check and the body limits. Handlers talk to the runtime
//! only through its library API (`Runtime`, `ConversationHandle`); request
//! and response shapes are in `types`, errors in `error`.
//!
//! Every route is registered through utoipa's router, so `/openapi.json`
//! is generated from the same handlers and types that serve requests.

pub mod admin;
pub mod agui;
pub mod console;
pub mod conversations;
pub mod deletion;
pub mod error;
pub mod events;
pub mod follow;
pub mod forward;
pub mod history;
pub mod images;
pub mod langgraph;
pub mod measure;
pub mod paging;
pub mod settings;

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::watch;
use tower_http::catch_panic::CatchPanicLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi;
use utoipa::{Modify, OpenApi as _};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use keel_actors::core::config::ModelRef;
use keel_actors::core::ConversationId;
use keel_actors::store::Availability;
use keel_actors::Runtime;

use crate::config::DEFAULT_MAX_MESSAGE_BYTES;
pub use crate::config::MESSAGE_BODY_LIMIT;
use crate::token;
use error::ApiError;
use keel_api::ErrorCode;

/// Largest body of every other route.
pub const BODY_LIMIT: usize = 64 * 1024;

/// Renders the process's metrics in Prometheus text.
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

/// What every handler shares. One pointer: axum clones the state for
/// every layer and handler of every request, and a clone of the fields
/// themselves (a dozen reference counts, two watch receivers) was a few
/// percent of the daemon's CPU on short requests (docs/benchmarks.md,
/// "Huge pages zeroed"). The fields read through `Deref`.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The fields of [`AppState`].
#[derive(Clone)]
pub struct Shared {
    pub runtime: Runtime,
    token: Arc<str>,
    /// The model a conversation uses unless its creation names another.
    pub default_model: Arc<ModelRef>,
    /// The working directory of a conversation created without one.
    pub default_cwd: Arc<PathBuf>,
    pub metrics: Option<MetricsRender>,
    /// Whether the runtime's store still takes writes.
    pub store: Availability,
    /// Turns true when the daemon starts to stop: event streams end.
    pub stopping: watch::Receiver<bool>,
    /// The most bytes a message's text may have (`KEEL_MAX_MESSAGE_BYTES`).
    /// The body limit is sized for images and would let a 60 MiB text in.
    pub max_message_bytes: usize,
    /// This daemon as one node among several (docs/nodes.md).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(
        runtime: Runtime,
        token: String,
        default_model: ModelRef,
        default_cwd: PathBuf,
        metrics: Option<MetricsRender>,
        stopping: watch::Receiver<bool>,
    ) -> AppState {
        AppState(Arc::new(Shared {
            store: runtime.store().availability(),
            runtime,
            token: token.into(),
            default_model: Arc::new(default_model),
            default_cwd: Arc::new(default_cwd),
            metrics,
            stopping,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            cluster: None,
        }))
    }

    /// The same state as node `cluster` among several.
    pub fn with_cluster(self, cluster: Option<Arc<crate::cluster::Cluster>>) -> AppState {
        let mut shared = Arc::unwrap_or_clone(self.0);
        shared.cluster = cluster;
        AppState(Arc::new(shared))
    }

    /// The same state with messages' text bounded at `bytes`.
    pub fn with_max_message_bytes(self, bytes: usize) -> AppState {
        let mut shared = Arc::unwrap_or_clone(self.0);
        shared.max_message_bytes = bytes;
        AppState(Arc::new(shared))
    }
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "keel",
        description = "keel runs LLM agent conversations that never get stuck, never lose state, and can always be stopped."
    ),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every route but `/healthz` and `/openapi.json`, with its documentation.
fn documented() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(conversations::create, conversations::list))
        .routes(routes!(
            conversations::get_one,
            settings::update,
            deletion::delete
        ))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(conversations::send))
                .layer(DefaultBodyLimit::max(MESSAGE_BODY_LIMIT)),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(agui::run))
                .layer(DefaultBodyLimit::max(MESSAGE_BODY_LIMIT)),
        )
        .routes(routes!(agui::reattach))
        .routes(routes!(conversations::cancel))
        .routes(routes!(history::compact))
        .routes(routes!(history::fork))
        .routes(routes!(history::rewind))
        .routes(routes!(conversations::resolve))
        .routes(routes!(conversations::log))
        .routes(routes!(images::get_image))
        .routes(routes!(events::events))
        .routes(routes!(admin::actors))
        .routes(routes!(admin::nodes))
        .routes(routes!(admin::writers))
        .routes(routes!(admin::evict))
        .routes(routes!(admin::kill))
        .routes(routes!(admin::reclaim))
        .routes(routes!(admin::mcp))
        .routes(routes!(admin::metrics))
        .routes(routes!(admin::healthz))
}

/// The OpenAPI document of every route.
pub fn openapi() -> OpenApi {
    let (_, mut api) = documented().split_for_parts();
    let (path, item) = openapi_route_doc();
    api.paths.paths.insert(path, item);
    api
}

fn openapi_route_doc() -> (String, utoipa::openapi::PathItem) {
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::ResponseBuilder;
    let operation = OperationBuilder::new()
        .summary(Some("This document: every route, generated from the code."))
        .response(
            "200",
            ResponseBuilder::new().description("OpenAPI 3.1 JSON"),
        )
        .build();
    (
        "/openapi.json".to_owned(),
        PathItem::new(HttpMethod::Get, operation),
    )
}

/// The daemon's whole router.
pub fn router(state: AppState) -> Router {
    let (routes, _) = documented().split_for_parts();
    let api = Arc::new(openapi());
    measure::register(&api);
    routes
        .route(
            "/openapi.json",
            get(move || {
                let api = api.clone();
                async move { Json(api.as_ref().clone()) }
            }),
        )
        .nest("/langgraph", langgraph::router())
        .merge(console::router())
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), storage_guard))
        // After the token check, so a request is refused where it came in;
        // before the storage guard, whose answer is the owner's to give.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            forward::to_owner,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(catch_panics())
        // Outermost, so refusals (a bad token, a body too large) and
        // panics are counted with the status the client got.
        .layer(middleware::from_fn(measure::count_requests))
        .layer(middleware::from_fn(console::headers_on_console))
        .with_state(state)
}

/// A handler that panics answers 500 in the API's error shape, and the
/// daemon goes on serving: no request can take it down. (The runtime's own
/// actors have their supervisor; this covers the HTTP layer.)
fn catch_panics() -> CatchPanicLayer<fn(Box<dyn Any + Send + 'static>) -> Response> {
    CatchPanicLayer::custom(panic_response as fn(Box<dyn Any + Send + 'static>) -> Response)
}

fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let why = panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    tracing::error!(panic = %why, "a request handler panicked");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Internal,
        "the request failed inside keel (a bug: the daemon logged it); nothing else is affected",
    )
    .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NoRoute, "no such route")
}

/// The bearer token, on every route but `/healthz` and the console's own
/// pages; or the console's cookie, with its header on a change
/// (`api/console.rs`).
async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if request.uri().path() == "/healthz"
        || console::is_public(request.method(), request.uri().path())
    {
        return next.run(request).await;
    }
    if request.headers().get(AUTHORIZATION).is_none() {
        if let Some(cookie) = console::session_token(request.headers()) {
            if token::matches(cookie.as_bytes(), &state.token) {
                if !console::is_safe(request.method()) && !console::from_console(request.headers())
                {
                    return console::csrf_refusal().into_response();
                }
                return next.run(request).await;
            }
        }
    }
    let header = request
        .headers()
        .get(AUTHORIZATION)
        .map(|value| value.as_bytes());
    // LangGraph's SDKs send the key as `x-api-key: KEY`; on their routes
    // that is keel's token too (docs/langgraph.md).
    let api_key = request
        .uri()
        .path()
        .starts_with("/langgraph/")
        .then(|| request.headers().get("x-api-key"))
        .flatten()
        .is_some_and(|key| token::matches(key.as_bytes(), &state.token));
    if api_key || token::authorizes(header, &state.token) {
        next.run(request).await
    } else {
        let mut response = ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "a valid `Authorization: Bearer TOKEN` header is required (KEEL_TOKEN, or the token file in the data dir)",
        )
        .into_response();
        response.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
        response
    }
}

/// Once the store has stopped taking writes, every request but `/healthz`
/// (which says so itself) and `/metrics` (`keel_store_available`) answers
/// 503 `storage_unavailable` with the cause and what to do, reads too: a
/// stopped engine answers reads with its own words ("Previous I/O error
/// occurred"), which would otherwise reach the client as a 500. A request
/// that was running when the store stopped and failed for it is answered
/// the same way.
async fn storage_guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if path == "/healthz" || path == "/metrics" {
        return next.run(request).await;
    }
    if let Some(reason) = state.store.stopped() {
        return ApiError::storage_unavailable(&reason).into_response();
    }
    let response = next.run(request).await;
    if response.status().is_server_error() {
        if let Some(reason) = state.store.stopped() {
            return ApiError::storage_unavailable(&reason).into_response();
        }
    }
    response
}

/// A conversation id from the path. An id that cannot be one names no
/// conversation: 404, like an unknown one.
pub struct ConversationPath(pub ConversationId);

impl<S: Send + Sync> FromRequestParts<S> for ConversationPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state).await?;
        ConversationId::new(raw.clone())
            .map(ConversationPath)
            .map_err(|_| ApiError::not_found(&raw))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A panicking handler becomes a 500 in the API's shape, and the
    /// server answers the next request.
    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_the_server_goes_on() {
        async fn boom() -> &'static str {
            panic!("boom")
        }
        let app: Router = Router::new()
            .route("/boom", get(boom))
            .route("/fine", get(|| async { "fine" }))
            .layer(catch_panics());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = keel_api::http::client();

        let failed = http
            .get(format!("http://{address}/boom"))
            .send()
            .await
            .unwrap();
        assert_eq!(failed.status(), reqwest::StatusCode::INTERNAL_SERVER_ERROR);
        let body: serde_json::Value = failed.json().await.unwrap();
        assert_eq!(body["error"]["code"], "internal");

        let fine = http
            .get(format!("http://{address}/fine"))
            .send()
            .await
            .unwrap();
        assert_eq!(fine.text().await.unwrap(), "fine");
    }
}
