//! The web console's side of the daemon (docs/console.md): its pages need
//! no token and hold none, with a strict Content-Security-Policy; signing
//! in keeps the token in an `HttpOnly`, `SameSite=Strict` cookie that the
//! API then takes; a change made with only the cookie needs the console's
//! header; signing out clears it. (The pages in a browser: the Playwright
//! tests, `tests/console/`.)

use reqwest::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE, COOKIE, SET_COOKIE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{Daemon, Site, Wire};
use crate::harness::MockLlm;

fn with_cookie(request: reqwest::RequestBuilder, token: &str) -> reqwest::RequestBuilder {
    request.header(COOKIE, format!("keel_token={token}"))
}

async fn status_and_body(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_signs_in_with_a_cookie_and_guards_changes() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let anonymous = daemon.anonymous();

    // The pages: no token needed, none in them, a strict policy.
    for (path, kind) in [
        ("/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let response = anonymous.get(daemon.endpoint(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers().clone();
        assert!(
            headers[CONTENT_TYPE].to_str().unwrap().starts_with(kind),
            "{path}: {headers:?}"
        );
        let policy = headers[CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(policy.contains("script-src 'self'"), "{policy}");
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        let body = response.text().await.unwrap();
        assert!(!body.contains(&daemon.token), "{path} holds the token");
    }
    let page = anonymous.get(daemon.endpoint("/")).send().await.unwrap();
    let html = page.text().await.unwrap();
    assert!(!html.contains("<script>"), "no inline script: {html}");

    // The API without a token or cookie: refused.
    let (status, _) = status_and_body(anonymous.get(daemon.endpoint("/v1/conversations"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Signing in: a wrong token is refused and sets nothing; the right one
    // comes back as an HttpOnly, SameSite=Strict cookie.
    let sign_in = |token: &str, header: bool| {
        let request = anonymous
            .post(daemon.endpoint("/console/session"))
            .json(&json!({ "token": token }));
        if header {
            request.header("x-keel-console", "1")
        } else {
            request
        }
    };
    let wrong = sign_in("not-the-token", true).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get(SET_COOKIE).is_none());
    let cross_site = sign_in(&daemon.token, false).send().await.unwrap();
    assert_eq!(cross_site.status(), StatusCode::FORBIDDEN);
    assert!(cross_site.headers().get(SET_COOKIE).is_none());
    let signed_in = sign_in(&daemon.token, true).send().await.unwrap();
    assert_eq!(signed_in.status(), StatusCode::NO_CONTENT);
    let cookie = signed_in.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        cookie.starts_with(&format!("keel_token={};", daemon.token)),
        "{cookie}"
    );
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }

    // The cookie reads; a change with it alone is refused and changes
    // nothing; with the console's header it goes through.
    let (status, listed) = status_and_body(with_cookie(
        anonymous.get(daemon.endpoint("/v1/conversations")),
        &daemon.token,
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["conversations"], json!([]));
    let create = || {
        with_cookie(
            anonymous.post(daemon.endpoint("/v1/conversations")),
            &daemon.token,
        )
        .json(&json!({"cwd": site.cwd().display().to_string()}))
    };
    let (status, refused) = status_and_body(create()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["code"], "cross_site");
    let (_, listed) = status_and_body(with_cookie(
        anonymous.get(daemon.endpoint("/v1/conversations")),
        &daemon.token,
    ))
    .await;
    assert_eq!(listed["conversations"], json!([]), "nothing was created");
    let (status, created) = status_and_body(create().header("x-keel-console", "1")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    // A cookie with another token is no sign-in.
    let (status, _) = status_and_body(with_cookie(
        anonymous.get(daemon.endpoint("/v1/conversations")),
        "forged",
    ))
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Signing out clears the cookie.
    let signed_out = anonymous
        .delete(daemon.endpoint("/console/session"))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_out.status(), StatusCode::NO_CONTENT);
    let cleared = signed_out.headers()[SET_COOKIE].to_str().unwrap();
    assert!(cleared.starts_with("keel_token=;"), "{cleared}");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
}
