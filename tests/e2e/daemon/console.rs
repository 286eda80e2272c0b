//! The web console's side of the daemon (docs/console.md): its pages need
//! no token and hold none, with a strict Content-Security-Policy; signing
//! in keeps the token in an `HttpOnly`, `SameSite=Strict` cookie that the
//! API then takes; a change made with only the cookie needs the console's
//! header; signing out clears it. (The pages in a browser: the Playwright
//! tests, `tests/console/`.)

use reqwest::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE, COOKIE, SET_COOKIE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{Daemon, Site, Wire, PATIENCE};
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

/// The version of `playwright-core` (npm) the browser test drives
/// Chromium with; the browser is the system's (Debian's `chromium`), as
/// Playwright's own download is not used.
const PLAYWRIGHT_VERSION: &str = "1.65.1";

/// The system's Chromium: `KEEL_TEST_CHROMIUM`, or the first of the usual
/// names on `PATH`.
fn chromium() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("KEEL_TEST_CHROMIUM") {
        return Some(path.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// `playwright-core`, installed once with npm under the target directory;
/// the `node_modules` directory that holds it.
/// The console's browser tests run in parallel threads of one process:
/// one installs while the others wait (two `npm install`s into one
/// directory replace each other's `node_modules` under a running script).
static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn playwright() -> std::path::PathBuf {
    let prefix = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-node");
    let modules = prefix.join("node_modules");
    let ready = prefix.join("installed");
    // A test that panicked while holding it leaves nothing half-done
    // that the `installed` mark would hide: the check below still holds.
    let _installing = INSTALLING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if std::fs::read_to_string(&ready).ok().as_deref() == Some(PLAYWRIGHT_VERSION) {
        return modules;
    }
    std::fs::create_dir_all(&prefix).unwrap();
    let output = std::process::Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(&prefix)
        .arg(format!("playwright-core@{PLAYWRIGHT_VERSION}"))
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .output()
        .unwrap_or_else(|error| {
            panic!("npm: {error} (the console's browser test needs node and npm)")
        });
    assert!(
        output.status.success() && modules.join("playwright-core").is_dir(),
        "npm install of playwright-core failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(&ready, PLAYWRIGHT_VERSION).unwrap();
    modules
}

/// The system's Chromium, or `None` after saying the browser tests are not
/// run (a failure where `KEEL_REQUIRE_BROWSER` is set: CI sets it, and
/// installs one).
fn browser_or_not_run() -> Option<std::path::PathBuf> {
    let found = chromium();
    if found.is_none() {
        assert!(
            std::env::var_os("KEEL_REQUIRE_BROWSER").is_none(),
            "KEEL_REQUIRE_BROWSER is set but no Chromium is installed (apt-get install chromium)"
        );
        eprintln!(
            "NOT RUN: the console's browser tests need Chromium (apt-get install chromium, or \
             KEEL_TEST_CHROMIUM=/path/to/chromium)"
        );
    }
    found
}

/// `node tests/console/SCRIPT` driving the system's Chromium with
/// Playwright against `daemon` (its address and token in the
/// environment), or `None` where no Chromium is installed
/// ([`browser_or_not_run`]).
async fn browser_script(script: &str, daemon: &Daemon) -> Option<tokio::process::Command> {
    let chromium = browser_or_not_run()?;
    let modules = tokio::task::spawn_blocking(playwright).await.unwrap();
    let mut node = tokio::process::Command::new("node");
    node.arg(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("console")
            .join(script),
    )
    .env("NODE_PATH", &modules)
    .env("KEEL_URL", &daemon.url)
    .env("KEEL_TOKEN", &daemon.token)
    .env("KEEL_CHROMIUM", &chromium)
    .kill_on_drop(true);
    Some(node)
}

/// The console's pages in Chromium, driven by Playwright
/// (`tests/console/console.spec.js`): sign in (a wrong token first), a
/// request without the cookie refused, a message streamed, a model's
/// markup shown as text, a long tool run cancelled, the log, a gated
/// `bash` call approved and its output shown, an actor evicted, signing
/// out. Where no Chromium is installed the test says so and is not run,
/// unless `KEEL_REQUIRE_BROWSER` is set (CI sets it, and installs one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_a_browser() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let Some(mut node) = browser_script("console.spec.js", &daemon).await else {
        return;
    };
    let gated = daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let output = node
        .env("KEEL_GATED_ID", &gated)
        .env("KEEL_MOCK_URL", mock.base_url())
        .env("KEEL_SCREENSHOTS", &shots)
        .output()
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the browser test failed:\n{said}");
    assert!(said.ends_with("ok\n"), "{said}");
}

/// The console across a crash of the daemon (`tests/console/restart.spec.js`):
/// a page open on a conversation whose turn runs a tool; the daemon
/// SIGKILLed mid-tool and started again on the same address; the page,
/// not reloaded, follows the recovered turn to its end and takes another
/// message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_rides_out_a_daemon_restart() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    let mock = MockLlm::start();
    let site = Site::new();
    let addr = format!("127.0.0.1:{}", crate::cli::free_port());
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[("KEEL_ADDR", &addr)]);
    let Some(mut node) = browser_script("restart.spec.js", &daemon).await else {
        return;
    };
    let id = daemon.create(&site, json!({})).await;
    let mut node = node
        .env("KEEL_CONVERSATION_ID", &id)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = tokio::io::BufReader::new(node.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(PATIENCE, said.next_line())
        .await
        .expect("the page reaches the running tool")
        .unwrap();
    assert_eq!(ready.as_deref(), Some("READY"));
    daemon.sigkill();
    let daemon = daemon.restart();
    let mut stdin = node.stdin.take().unwrap();
    stdin.write_all(b"GO\n").await.unwrap();
    stdin.flush().await.unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    let finished = tokio::time::timeout(2 * PATIENCE, async {
        while let Ok(Some(line)) = said.next_line().await {
            rest.push(line);
        }
        node.wait().await
    })
    .await;
    let Ok(status) = finished else {
        panic!("the page did not finish after the restart: {rest:?}");
    };
    let status = status.unwrap();
    assert!(
        status.success() && rest.last().map(String::as_str) == Some("ok"),
        "the page after the restart: {rest:?}"
    );
    assert_eq!(daemon.conversation(&id).await["state"], "idle");
}

/// The page resumes its stream after a network drop and shows what it
/// missed, once (tests/console/network.spec.js cuts its own proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_misses_nothing_across_a_network_drop() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let Some(mut node) = browser_script("network.spec.js", &daemon).await else {
        return;
    };
    let id = daemon.create(&site, json!({})).await;
    let output = tokio::time::timeout(2 * PATIENCE, node.env("KEEL_CONVERSATION_ID", &id).output())
        .await
        .expect("the network drop script finishes")
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.ends_with("ok\n"),
        "the browser test failed:\n{said}"
    );
}
