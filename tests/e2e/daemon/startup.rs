//! Starting the daemon and reaching it: the bearer token (generated into
//! the data dir, mode 0600, or set with `KEEL_TOKEN`), the refusal to
//! listen beyond loopback without a set token, `/openapi.json` against the
//! routes the router serves, and the built-in fake provider when none is
//! configured.

use std::os::unix::fs::PermissionsExt as _;

use reqwest::header::WWW_AUTHENTICATE;
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{assistant_texts, error_parts, Daemon, Reply, Site, Wire, PATIENCE};
use crate::harness::{keel_bin, MockLlm};

/// Every route `bin/daemon/src/api.rs` serves (`documented()` and the router's
/// own `/openapi.json`), with its methods. A route added there and not
/// here, or not in the document, fails `daemon_openapi_lists_every_route`.
const ROUTES: &[(&str, &[&str])] = &[
    ("/v1/conversations", &["get", "post"]),
    ("/v1/conversations/{id}", &["delete", "get", "patch"]),
    ("/v1/conversations/{id}/messages", &["post"]),
    ("/v1/conversations/{id}/cancel", &["post"]),
    ("/v1/conversations/{id}/resolve", &["post"]),
    ("/v1/conversations/{id}/compact", &["post"]),
    ("/v1/conversations/{id}/fork", &["post"]),
    ("/v1/conversations/{id}/rewind", &["post"]),
    ("/v1/conversations/{id}/log", &["get"]),
    ("/v1/conversations/{id}/images/{hash}", &["get"]),
    ("/v1/conversations/{id}/events", &["get"]),
    ("/ag-ui", &["post"]),
    ("/ag-ui/{thread_id}/runs/{run_id}/events", &["get"]),
    ("/admin/actors", &["get"]),
    ("/admin/actors/{id}/evict", &["post"]),
    ("/admin/actors/{id}/kill", &["post"]),
    ("/admin/reclaim", &["post"]),
    ("/admin/mcp", &["get"]),
    ("/admin/nodes", &["get"]),
    ("/admin/conversations/{id}/writers", &["get"]),
    ("/metrics", &["get"]),
    ("/healthz", &["get"]),
    ("/openapi.json", &["get"]),
];

const HTTP_METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

async fn anonymous_get(daemon: &Daemon, path: &str, token: Option<&str>) -> Reply {
    let mut request = daemon.anonymous().get(format!("{}{path}", daemon.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.timeout(PATIENCE).send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_requires_its_token_except_for_healthz() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);

    // The generated token is the owner's alone.
    let path = daemon.data_dir().join("token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{} has mode {mode:o}", path.display());
    assert!(
        daemon
            .stdout()
            .iter()
            .any(|line| line.contains(&path.display().to_string())),
        "the daemon says where its token is: {:?}",
        daemon.stdout()
    );
    assert!(daemon.token.len() >= 32, "a long random token");

    for (what, token) in [("no token", None), ("a wrong token", Some("not-the-token"))] {
        for route in [
            "/v1/conversations",
            "/openapi.json",
            "/metrics",
            "/admin/actors",
        ] {
            let reply = anonymous_get(&daemon, route, token).await;
            let (code, message) = reply.error(StatusCode::UNAUTHORIZED);
            assert_eq!(code, "unauthorized", "{what} on {route}: {message}");
            assert_eq!(
                reply
                    .headers
                    .get(WWW_AUTHENTICATE)
                    .map(|value| value.as_bytes()),
                Some(&b"Bearer"[..])
            );
        }
    }
    let post = daemon
        .anonymous()
        .post(format!("{}/v1/conversations", daemon.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        daemon.get("/v1/conversations").await.body["conversations"],
        json!([]),
        "the refused creation created nothing"
    );

    let health = anonymous_get(&daemon, "/healthz", None).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.body, json!({"status": "ok"}));
    let listed = anonymous_get(&daemon, "/v1/conversations", Some(&daemon.token)).await;
    assert_eq!(listed.status, StatusCode::OK, "{listed:?}");

    // The same token after a restart: it is kept in the data dir.
    let token = daemon.token.clone();
    daemon.sigterm();
    let mut daemon = daemon;
    assert!(daemon.wait_exit().success());
    let daemon = daemon.restart();
    assert_eq!(daemon.token, token);
    assert_eq!(daemon.get("/v1/conversations").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_takes_the_token_it_is_given() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[("KEEL_TOKEN", "e2e-s3cret")]);
    assert_eq!(daemon.token, "e2e-s3cret");
    assert_eq!(daemon.get("/v1/conversations").await.status, StatusCode::OK);
    let wrong = anonymous_get(&daemon, "/v1/conversations", Some("e2e-s3cre")).await;
    wrong.error(StatusCode::UNAUTHORIZED);
    assert!(
        !daemon.data_dir().join("token").exists(),
        "no token is generated when one is set"
    );
}

#[test]
fn daemon_refuses_to_listen_beyond_loopback_without_a_set_token() {
    let mock = MockLlm::start();
    let site = Site::new();
    let mut env: Vec<(String, String)> = super::base_env(&site)
        .into_iter()
        .filter(|(name, _)| name != "KEEL_ADDR")
        .collect();
    env.push(("KEEL_ADDR".to_owned(), "0.0.0.0:0".to_owned()));
    env.extend(Wire::Anthropic.env(&mock));
    let bin = keel_bin();
    let mut child = std::process::Command::new(&bin)
        .arg("serve")
        .env_clear()
        .envs(env)
        .current_dir(site.cwd())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a daemon that started listening instead would hang here.
    let deadline = std::time::Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("keel serve on 0.0.0.0 without KEEL_TOKEN did not exit");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{:?}", output.status);
    assert!(
        stderr.contains("KEEL_TOKEN") || stdout.contains("KEEL_TOKEN"),
        "the refusal names KEEL_TOKEN:\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(!stdout.contains("keel listening"), "{stdout}");
    assert!(
        !site.data_dir().join("token").exists(),
        "no token was generated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_openapi_lists_every_route() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let reply = daemon.get("/openapi.json").await;
    assert_eq!(reply.status, StatusCode::OK);
    let document = reply.body;
    assert!(
        document["openapi"]
            .as_str()
            .unwrap_or_default()
            .starts_with("3."),
        "{document:#}"
    );
    let paths = document["paths"].as_object().expect("paths");

    let mut documented: Vec<(String, Vec<String>)> = paths
        .iter()
        .map(|(path, item)| {
            let mut methods: Vec<String> = HTTP_METHODS
                .iter()
                .filter(|method| item.get(**method).is_some())
                .map(|method| (*method).to_owned())
                .collect();
            methods.sort();
            (path.clone(), methods)
        })
        .collect();
    documented.sort();
    let mut expected: Vec<(String, Vec<String>)> = ROUTES
        .iter()
        .map(|(path, methods)| {
            let mut methods: Vec<String> =
                methods.iter().map(|method| (*method).to_owned()).collect();
            methods.sort();
            ((*path).to_owned(), methods)
        })
        .collect();
    expected.sort();
    assert_eq!(documented, expected, "the document's routes and methods");
    for (path, item) in paths {
        for method in HTTP_METHODS {
            if let Some(operation) = item.get(method) {
                let responses = operation["responses"].as_object();
                assert!(
                    responses.is_some_and(|responses| !responses.is_empty()),
                    "{method} {path} documents its responses: {operation:#}"
                );
            }
        }
    }

    // Every documented route is served: none answers "no such route" or
    // "method not allowed" (unknown ids answer 404 not_found instead).
    for (path, methods) in &expected {
        for method in methods {
            let concrete = path.replace("{id}", "c-openapi-probe");
            let url = format!("{}{concrete}", daemon.url);
            let request = match method.as_str() {
                "get" => keel_api::http::client().get(url),
                "post" => keel_api::http::client().post(url).json(&json!({})),
                "patch" => keel_api::http::client().patch(url).json(&json!({})),
                "delete" => keel_api::http::client().delete(url),
                other => panic!("no probe for {other}"),
            };
            let request = if concrete.ends_with("/events") {
                // Reading headers is enough: a stream would not end.
                request
            } else {
                request.timeout(PATIENCE)
            };
            let response = request.bearer_auth(&daemon.token).send().await.unwrap();
            let status = response.status();
            assert_ne!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {concrete}"
            );
            if status == StatusCode::NOT_FOUND {
                let body: Value = response.json().await.unwrap();
                let (code, _) = error_parts(&body);
                assert_ne!(code, "no_route", "{method} {concrete} is not served");
            }
        }
    }
    // And the probe can tell: a route that does not exist says so.
    let reply = daemon.get("/v1/nowhere").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "no_route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_without_a_provider_runs_the_builtin_fake_one() {
    let site = Site::new();
    let daemon = Daemon::start_with(&site, Vec::new());
    let stdout = daemon.stdout();
    let said = stdout
        .iter()
        .find(|line| line.contains("built-in fake provider"))
        .unwrap_or_else(|| panic!("the daemon says it uses the fake provider: {stdout:?}"));
    assert!(said.contains("http://127.0.0.1:"), "{said}");
    let listening = stdout
        .iter()
        .position(|line| line.starts_with("keel listening on "));
    assert!(
        stdout.iter().position(|line| line == said) < listening,
        "said before listening: {stdout:?}"
    );

    let id = daemon.create(&site, json!({})).await;
    assert_eq!(daemon.conversation(&id).await["provider"], "mock");
    daemon.send(&id, "hello from the e2e test").await;
    let log = daemon.wait_turn_done(&id, 1).await;
    assert_eq!(super::of_kind(&log, "turn_completed").len(), 1, "{log:#?}");
    assert_eq!(assistant_texts(&log), ["hello from the e2e test"]);
}
