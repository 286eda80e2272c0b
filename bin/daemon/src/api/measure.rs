//! The API's own metrics (their names are in `crate::telemetry`): every
//! request counted by its route template and status, and the event
//! streams open now. Each series a fresh daemon can name, each route's
//! success status, is registered at zero when the router is built, so a
//! dashboard's rates and ratios have a series from the first scrape.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use utoipa::openapi::OpenApi;

use crate::telemetry::{EVENT_STREAMS_OPEN, HTTP_REQUESTS_TOTAL};

/// The `route` label of a request no route matched: one value for every
/// unknown path, so a scan of random paths cannot grow the label set.
pub const UNMATCHED: &str = "unmatched";

/// Count the request once its response is ready: by method, by the route
/// template it matched (`/v1/conversations/{id}`, never the id itself) and
/// by status. An event stream counts when its response starts, not when it
/// ends.
pub async fn count_requests(request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED, MatchedPath::as_str)
        .to_owned();
    let response = next.run(request).await;
    metrics::counter!(
        HTTP_REQUESTS_TOTAL,
        "method" => method,
        "route" => route,
        "status" => response.status().as_str().to_owned()
    )
    .increment(1);
    response
}

/// Register, at zero, each route's requests with the first success status
/// its documentation names, and the open streams gauge.
pub fn register(api: &OpenApi) {
    for (path, item) in &api.paths.paths {
        for (method, operation) in [
            ("GET", &item.get),
            ("POST", &item.post),
            ("PUT", &item.put),
            ("DELETE", &item.delete),
            ("PATCH", &item.patch),
        ] {
            let Some(operation) = operation else {
                continue;
            };
            let success = operation
                .responses
                .responses
                .keys()
                .find(|status| status.starts_with('2'));
            if let Some(status) = success {
                metrics::counter!(
                    HTTP_REQUESTS_TOTAL,
                    "method" => method,
                    "route" => path.clone(),
                    "status" => status.clone()
                )
                .increment(0);
            }
        }
    }
    metrics::gauge!(EVENT_STREAMS_OPEN).increment(0.0);
    crate::telemetry::register_node_metrics();
}

/// One open event stream, counted in `keel_event_streams_open` from its
/// making to its drop (the client left, the daemon stopped, the stream
/// ended).
pub struct OpenStream(());

impl OpenStream {
    pub fn open() -> OpenStream {
        metrics::gauge!(EVENT_STREAMS_OPEN).increment(1.0);
        OpenStream(())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        metrics::gauge!(EVENT_STREAMS_OPEN).decrement(1.0);
    }
}
