//! The web console (docs/console.md): pages served by the daemon itself at
//! `/`, their assets embedded in the binary, talking to the same API as
//! every client.
//!
//! Signing in: the page posts the token once to `POST /console/session`,
//! which answers with the token in a cookie the page's scripts cannot read
//! (`HttpOnly`) and the browser never sends with a request another site
//! started (`SameSite=Strict`); from then on the API takes the cookie as it
//! takes `Authorization: Bearer` ([`session_token`]). A request that
//! changes something and carries only the cookie must also carry
//! `X-Keel-Console: 1`, which a page of another origin cannot add without
//! a CORS preflight the daemon never grants: a second guard against
//! cross-site requests. `DELETE /console/session` signs out.
//!
//! The pages themselves hold no data and no token: a strict
//! Content-Security-Policy allows scripts, styles and connections from
//! this origin only, no inline script, no framing.

use axum::extract::{Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, COOKIE, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

use super::error::ApiError;
use super::AppState;
use crate::token;
use keel_api::ErrorCode;

/// The cookie that holds the token.
pub const COOKIE_NAME: &str = "keel_token";

/// The header a cookie-authenticated request that changes something must
/// carry.
pub const CONSOLE_HEADER: &str = "x-keel-console";

/// The console's pages and assets, and its session.
pub fn router() -> Router<AppState> {
    let mut router = Router::new().route(
        "/",
        get(|| async { page(INDEX, "text/html; charset=utf-8") }),
    );
    for &(path, content_type, body) in ASSETS {
        router = router.route(path, get(move || async move { page(body, content_type) }));
    }
    router.route(
        "/console/session",
        axum::routing::post(sign_in).delete(sign_out),
    )
}

const INDEX: &str = include_str!("../../console/index.html");

const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// The files the page loads, embedded in the binary: the console's own
/// modules and style, and the one library it uses (markdown-it, MIT,
/// vendored as its authors publish it: `console/vendor/`).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/console/app.js",
        JAVASCRIPT,
        include_str!("../../console/app.js"),
    ),
    (
        "/console/lib.js",
        JAVASCRIPT,
        include_str!("../../console/lib.js"),
    ),
    (
        "/console/conversation.js",
        JAVASCRIPT,
        include_str!("../../console/conversation.js"),
    ),
    (
        "/console/pages.js",
        JAVASCRIPT,
        include_str!("../../console/pages.js"),
    ),
    (
        "/console/vendor/markdown-it.min.js",
        JAVASCRIPT,
        include_str!("../../console/vendor/markdown-it.min.js"),
    ),
    (
        "/console/app.css",
        "text/css; charset=utf-8",
        include_str!("../../console/app.css"),
    ),
];

/// What the console's pages may load and do: everything from this origin
/// only, no inline script or style, no plugins, never framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Whether `path` is the console's own, served without a token (the
/// pages hold no data; signing in checks the token itself).
pub fn is_public(method: &Method, path: &str) -> bool {
    match path {
        "/console/session" => method == Method::POST || method == Method::DELETE,
        _ => {
            method == Method::GET
                && (path == "/" || ASSETS.iter().any(|&(asset, _, _)| asset == path))
        }
    }
}

fn page(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Small, and changing with the binary: no stale script after an upgrade.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    secure(headers);
    response
}

/// The headers every console response carries.
fn secure(headers: &mut HeaderMap) {
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

#[derive(Deserialize)]
struct SignIn {
    token: String,
}

/// `POST /console/session {token}`: the token checked, then kept in the
/// cookie. Asked with the console's header like every change, so that no
/// other site's form can sign a browser in with its own token.
async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !from_console(&headers) {
        return csrf_refusal().into_response();
    }
    let Ok(SignIn { token }) = serde_json::from_slice::<SignIn>(&body) else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadJson,
            "sign in with a JSON body {\"token\": \"…\"}",
        )
        .into_response();
    };
    if !token::matches(token.trim().as_bytes(), &state.token) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "that is not this daemon's token (KEEL_TOKEN, or the token file in its data dir)",
        )
        .into_response();
    }
    let cookie = cookie::Cookie::build((COOKIE_NAME, token.trim().to_owned()))
        .path("/")
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .max_age(cookie::time::Duration::days(30))
        .build();
    session_response(StatusCode::NO_CONTENT, &cookie)
}

/// `DELETE /console/session`: the cookie cleared.
async fn sign_out() -> Response {
    let cookie = cookie::Cookie::build((COOKIE_NAME, ""))
        .path("/")
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .max_age(cookie::time::Duration::ZERO)
        .build();
    session_response(StatusCode::NO_CONTENT, &cookie)
}

fn session_response(status: StatusCode, cookie: &cookie::Cookie<'_>) -> Response {
    let mut response = status.into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&cookie.to_string()) {
        headers.insert(SET_COOKIE, value);
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    secure(headers);
    response
}

/// The token a request's console cookie holds, if any.
pub fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(cookie::Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|cookie| cookie.name() == COOKIE_NAME)
        .map(|cookie| cookie.value().to_owned())
}

/// Whether a request says it comes from the console's own pages.
pub fn from_console(headers: &HeaderMap) -> bool {
    headers
        .get(CONSOLE_HEADER)
        .is_some_and(|value| value.as_bytes() == b"1")
}

/// Whether `method` changes nothing (and so needs no guard against
/// cross-site requests beyond the cookie's `SameSite`).
pub fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

pub fn csrf_refusal() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        ErrorCode::CrossSite,
        "a change made with the console's cookie must carry `X-Keel-Console: 1` (sent by the \
         console's own pages); scripts use `Authorization: Bearer TOKEN`",
    )
}

/// Console responses carry the security headers on error too.
pub async fn headers_on_console(request: Request, next: Next) -> Response {
    let console = request.uri().path() == "/" || request.uri().path().starts_with("/console/");
    let mut response = next.run(request).await;
    if console {
        secure(response.headers_mut());
    }
    response
}
