//! MCP servers as a tool source (docs/mcp.md), through the daemon, against
//! a server nobody here wrote the SDK of: `tests/mcp/slow_server.py` on the
//! official Python SDK, over stdio. The fake provider's `call: NAME {JSON}`
//! makes the model call a tool by name.

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{kind, of_kind, Daemon, Site, Wire};
use crate::harness::{keel_bin, mcp_python, mcp_slow_server, MockLlm};

/// `KEEL_MCP_SERVERS` naming the slow server `slow`, noting into `log`.
fn servers_env(log: &Path) -> (String, String) {
    let servers = json!({
        "slow": {
            "command": mcp_python().display().to_string(),
            "args": [mcp_slow_server().display().to_string()],
            "env": {"SLOW_LOG": log.display().to_string()},
        }
    });
    ("KEEL_MCP_SERVERS".to_owned(), servers.to_string())
}

/// A daemon with the slow server, and where the server notes things.
fn start(site: &Site, mock: &MockLlm) -> (Daemon, PathBuf) {
    let log = site.run_dir().join("slow.log");
    let (name, value) = servers_env(&log);
    let daemon = Daemon::start(site, Wire::Anthropic, mock, &[(&name, &value)]);
    (daemon, log)
}

fn noted(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Polls the server's notes until `wanted` is in them.
async fn wait_noted(log: &Path, wanted: &str) -> String {
    let deadline = std::time::Instant::now() + super::PATIENCE;
    loop {
        let text = noted(log);
        if text.contains(wanted) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server never noted {wanted:?}: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the server notes a `slow` call running; its request id.
async fn wait_started(log: &Path) -> String {
    let started = wait_noted(log, "started ").await;
    started
        .lines()
        .find_map(|line| line.strip_prefix("started "))
        .expect("a started line")
        .trim()
        .to_owned()
}

/// Waits until the server has noted `wanted` `times` times.
async fn wait_noted_times(log: &Path, wanted: &str, times: usize) {
    let deadline = std::time::Instant::now() + super::PATIENCE;
    while noted(log).matches(wanted).count() < times {
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server never noted {wanted:?} {times} times: {}",
            noted(log)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The pids the server noted at its starts.
fn server_pids(log: &Path) -> Vec<i32> {
    noted(log)
        .lines()
        .filter_map(|line| line.strip_prefix("pid "))
        .filter_map(|pid| pid.trim().parse().ok())
        .collect()
}

fn tool_results(log: &[Value]) -> Vec<&Value> {
    of_kind(log, "tool_result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_offers_and_calls_an_mcp_servers_tools() {
    let mock = MockLlm::start();
    let site = Site::new();
    let (daemon, _) = start(&site, &mock);
    let id = daemon.create(&site, json!({"mcp_servers": ["slow"]})).await;
    daemon
        .send(
            &id,
            r#"call: mcp__slow__echo {"message": "hello from mcp"}"#,
        )
        .await;
    let log = daemon.wait_turn_done(&id, 1).await;
    let results = tool_results(&log);
    assert_eq!(results.len(), 1, "{log:#?}");
    assert_eq!(results[0]["content"], "hello from mcp", "{log:#?}");
    assert_eq!(results[0]["is_error"], false);
    // The model was offered the server's tools by their full names.
    let requests = mock.requests().await;
    let offered = requests[0]["body"]["tools"].to_string();
    assert!(offered.contains("mcp__slow__echo"), "{offered}");
    assert!(offered.contains("mcp__slow__slow"), "{offered}");

    // Input that does not fit the server's schema never reaches it.
    daemon
        .send(&id, r#"call: mcp__slow__echo {"text": 7}"#)
        .await;
    let log = daemon.wait_turn_done(&id, 2).await;
    let refused = tool_results(&log)[1];
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(
        refused["content"]
            .as_str()
            .unwrap_or_default()
            .contains("schema"),
        "{refused}"
    );

    // A conversation that did not name the server is not offered it.
    let other = daemon.create(&site, json!({})).await;
    daemon.send(&other, "hello").await;
    daemon.wait_turn_done(&other, 1).await;
    let last = mock.requests().await;
    let offered = last
        .last()
        .map(|record| record["body"]["tools"].to_string());
    assert!(!offered.unwrap_or_default().contains("mcp__"));

    // `/metrics` counts the call by server and outcome.
    let metrics = daemon.get("/metrics").await;
    let text = metrics.body.as_str().unwrap_or_default().to_owned();
    let counted = text.lines().find(|line| {
        line.starts_with("keel_mcp_calls_total{")
            && line.contains(r#"server="slow""#)
            && line.contains(r#"outcome="ok""#)
    });
    assert_eq!(
        counted.and_then(|line| line.rsplit(' ').next()),
        Some("1"),
        "{text}"
    );

    // The conversation shows the servers it uses.
    let detail = daemon.conversation(&id).await;
    assert_eq!(
        detail["mcp_servers"],
        json!([{"name": "slow", "state": "ready"}]),
        "{detail:#}"
    );

    // `GET /admin/mcp` says what runs.
    let servers = daemon.get("/admin/mcp").await;
    assert_eq!(servers.status, StatusCode::OK, "{servers:?}");
    let slow = &servers.body["servers"][0];
    assert_eq!(slow["name"], "slow");
    assert_eq!(slow["state"], "ready", "{slow}");
    assert!(
        slow["tools"].to_string().contains("mcp__slow__crash"),
        "{slow}"
    );
    // A tool whose name a provider would refuse is left out, and said so.
    assert!(
        !slow["tools"].to_string().contains("far_too_long"),
        "{slow}"
    );
    let problems = slow["problems"].to_string();
    assert!(
        problems.contains("far_too_long") && problems.contains("64"),
        "{slow}"
    );

    // An unknown server is refused at creation.
    let refused = daemon
        .post(
            "/v1/conversations",
            &json!({"cwd": site.cwd().display().to_string(), "mcp_servers": ["nope"]}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("slow"), "{message}");
}

/// A long call cancelled: the server hears `notifications/cancelled`, the
/// turn is idle, the call's result says it was cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_cancel_reaches_the_mcp_server() {
    let mock = MockLlm::start();
    let site = Site::new();
    let (daemon, log) = start(&site, &mock);
    let id = daemon.create(&site, json!({"mcp_servers": ["slow"]})).await;
    daemon
        .send(&id, r#"call: mcp__slow__slow {"seconds": 60}"#)
        .await;
    let request = wait_started(&log).await;
    let reply = daemon.cancel(&id).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    daemon.wait_state(&id, "idle").await;
    wait_noted(&log, &format!("cancelled {request}")).await;
    let events = daemon.log(&id).await;
    let result = tool_results(&events)[0];
    assert_eq!(result["synthetic"], true, "{result}");
    // The server's progress was the call's live output, kept in its result.
    let content = result["content"].as_str().unwrap_or_default();
    assert!(content.contains("[progress "), "{content}");
    assert!(
        events
            .iter()
            .any(|event| kind(event) == "turn_interrupted" && event["reason"] == "cancelled"),
        "{events:#?}"
    );
    // The server goes on serving.
    let other = daemon.create(&site, json!({"mcp_servers": ["slow"]})).await;
    daemon
        .send(
            &other,
            r#"call: mcp__slow__echo {"message": "still there"}"#,
        )
        .await;
    let events = daemon.wait_turn_done(&other, 1).await;
    assert_eq!(tool_results(&events)[0]["content"], "still there");
    assert_eq!(
        server_pids(&log).len(),
        1,
        "the same server: {}",
        noted(&log)
    );
}

/// The server dies mid-call: the call's result is an error naming it and
/// what it printed last; the next call starts it again and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_survives_an_mcp_server_that_dies_mid_call() {
    let mock = MockLlm::start();
    let site = Site::new();
    let (daemon, log) = start(&site, &mock);
    let id = daemon.create(&site, json!({"mcp_servers": ["slow"]})).await;
    daemon.send(&id, "call: mcp__slow__crash").await;
    let events = daemon.wait_turn_done(&id, 1).await;
    let result = tool_results(&events)[0];
    assert_eq!(result["is_error"], true, "{result}");
    let content = result["content"].as_str().unwrap_or_default();
    assert!(content.contains("\"slow\""), "{content}");
    assert!(content.contains("last words"), "{content}");
    assert_eq!(
        of_kind(&events, "turn_completed").len(),
        1,
        "the turn goes on: {events:#?}"
    );

    daemon
        .send(&id, r#"call: mcp__slow__echo {"message": "back again"}"#)
        .await;
    let events = daemon.wait_turn_done(&id, 2).await;
    assert_eq!(
        tool_results(&events)[1]["content"],
        "back again",
        "{events:#?}"
    );
    assert!(server_pids(&log).len() >= 2, "{}", noted(&log));
}

/// An `approve` policy covers an MCP tool by its full name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_an_mcp_tool_waits_for_approval() {
    let mock = MockLlm::start();
    let site = Site::new();
    let (daemon, _) = start(&site, &mock);
    let id = daemon
        .create(
            &site,
            json!({"mcp_servers": ["slow"], "tools": {"mcp__slow__echo": "approve", "mcp__slow__crash": "deny"}}),
        )
        .await;
    daemon
        .send(&id, r#"call: mcp__slow__echo {"message": "approved"}"#)
        .await;
    let waiting = daemon.wait_state(&id, "awaiting_input").await;
    let call = waiting["pending"][0]["tool_call_id"]
        .as_str()
        .expect("a pending call")
        .to_owned();
    let reply = daemon.resolve(&id, &call, "approve").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let events = daemon.wait_turn_done(&id, 1).await;
    assert_eq!(tool_results(&events)[0]["content"], "approved");

    // A denied tool is not offered, and a call of it anyway is refused.
    let offered = mock.requests().await[0]["body"]["tools"].to_string();
    assert!(!offered.contains("mcp__slow__crash"), "{offered}");
    daemon.send(&id, "call: mcp__slow__crash").await;
    let events = daemon.wait_turn_done(&id, 2).await;
    let refused = tool_results(&events)[1];
    assert!(
        refused["content"]
            .as_str()
            .unwrap_or_default()
            .contains("denied"),
        "{refused}"
    );
}

/// A daemon killed mid-call leaves no MCP server running once it is
/// back: the server's process group was in the ledger and is reaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_killed_mid_mcp_call_leaves_no_server_running() {
    let mock = MockLlm::start();
    let site = Site::new();
    let (daemon, log) = start(&site, &mock);
    let id = daemon.create(&site, json!({"mcp_servers": ["slow"]})).await;
    daemon
        .send(&id, r#"call: mcp__slow__slow {"seconds": 60}"#)
        .await;
    wait_noted(&log, "started ").await;
    let first = server_pids(&log);
    assert!(!first.is_empty());
    daemon.sigkill();
    let mut daemon = daemon;
    daemon.wait_exit();
    let daemon = daemon.restart();
    for pid in first {
        super::wait_process_gone(pid).await;
    }
    // The call in flight is recovered like any tool call: under the
    // default `recovery = resume` it is dispatched again (same id), on a
    // server started again; a cancel then ends it.
    let events = daemon
        .wait_log(&id, "the call dispatched again", |event| {
            kind(event) == "recovered" && event["action"] == "redispatch"
        })
        .await;
    assert!(tool_results(&events).is_empty(), "{events:#?}");
    wait_noted_times(&log, "started ", 2).await;
    assert_eq!(server_pids(&log).len(), 2, "{}", noted(&log));
    daemon.cancel(&id).await;
    daemon.wait_state(&id, "idle").await;
}

/// Configuration a daemon cannot use stops it at start, naming the server.
#[test]
fn daemon_refuses_an_mcp_server_it_cannot_start() {
    for servers in [
        json!({"gone": {"command": "/no/such/mcp-server"}}),
        json!({"web": {"url": "ftp://example.com/mcp"}}),
        json!({"both": {"command": "true", "url": "http://127.0.0.1:1/mcp"}}),
        json!({"bad__name": {"command": "true"}}),
    ] {
        let site = Site::new();
        let mut env = super::base_env(&site);
        env.push(("KEEL_MCP_SERVERS".to_owned(), servers.to_string()));
        let output = std::process::Command::new(keel_bin())
            .arg("serve")
            .envs(env)
            .output()
            .expect("keel serve runs");
        assert!(!output.status.success(), "{servers}");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains("KEEL_MCP_SERVERS"), "{servers}: {said}");
    }
}

/// An MCP server over streamable HTTP, as a process of the test's,
/// killed with the test.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl HttpServer {
    /// `command` serving on a free port (given as `$PORT`) at `/mcp`,
    /// once it listens.
    async fn start(mut command: std::process::Command) -> HttpServer {
        let port = crate::cli::free_port();
        let child = command
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the MCP server starts");
        let deadline = std::time::Instant::now() + super::PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the MCP server never listened on {port}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Over streamable HTTP: the bearer token from the environment reaches the
/// server, a call's result is recorded, and a cancel reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_uses_an_mcp_server_over_streamable_http() {
    let mock = MockLlm::start();
    let site = Site::new();
    let log = site.run_dir().join("http.log");
    let mut command = std::process::Command::new(mcp_python());
    command
        .arg(mcp_slow_server())
        .arg("http")
        .env("SLOW_LOG", &log);
    let server = HttpServer::start(command).await;
    let servers = json!({
        "web": {"url": server.url, "bearer_token_env": "WEB_MCP_TOKEN", "headers": {"X-Team": "keel"}}
    })
    .to_string();
    let daemon = Daemon::start(
        &site,
        Wire::OpenAi,
        &mock,
        &[
            ("KEEL_MCP_SERVERS", &servers),
            ("WEB_MCP_TOKEN", "s3cret-token"),
        ],
    );
    let id = daemon.create(&site, json!({"mcp_servers": ["web"]})).await;
    daemon.send(&id, "call: mcp__web__whoami").await;
    let events = daemon.wait_turn_done(&id, 1).await;
    assert_eq!(
        tool_results(&events)[0]["content"],
        "Bearer s3cret-token",
        "{events:#?}"
    );
    // The token is in no event of the log but the tool's own answer (and
    // the model's, which repeats it).
    for event in daemon.log(&id).await {
        if !matches!(kind(&event), "tool_result" | "assistant_message") {
            assert!(!event.to_string().contains("s3cret-token"), "{event}");
        }
    }

    let other = daemon.create(&site, json!({"mcp_servers": ["web"]})).await;
    daemon
        .send(&other, r#"call: mcp__web__slow {"seconds": 60}"#)
        .await;
    let request = wait_started(&log).await;
    daemon.cancel(&other).await;
    daemon.wait_state(&other, "idle").await;
    wait_noted(&log, &format!("cancelled {request}")).await;
}

/// A server that changes its tools says so; the next request offers the
/// new list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_follows_an_mcp_servers_changed_tool_list() {
    let mock = MockLlm::start();
    let site = Site::new();
    let (daemon, _) = start(&site, &mock);
    let id = daemon.create(&site, json!({"mcp_servers": ["slow"]})).await;
    daemon.send(&id, "call: mcp__slow__add_tool").await;
    daemon.wait_turn_done(&id, 1).await;
    let deadline = std::time::Instant::now() + super::PATIENCE;
    loop {
        let servers = daemon.get("/admin/mcp").await;
        if servers.body["servers"][0]["tools"]
            .to_string()
            .contains("mcp__slow__extra")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{servers:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    daemon.send(&id, "call: mcp__slow__extra").await;
    let events = daemon.wait_turn_done(&id, 2).await;
    assert_eq!(tool_results(&events)[1]["content"], "extra", "{events:#?}");
    let offered = mock
        .requests()
        .await
        .last()
        .map(|record| record["body"]["tools"].to_string())
        .unwrap_or_default();
    assert!(offered.contains("mcp__slow__extra"), "{offered}");
}

/// The protocol authors' reference server over stdio: a call's text and
/// image content, and a long operation whose progress is the call's live
/// output, cancelled mid-way with the turn idle and nothing left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_uses_the_reference_mcp_server_over_stdio() {
    let mock = MockLlm::start();
    let site = Site::new();
    let servers = json!({
        "everything": {
            "command": crate::harness::node().display().to_string(),
            "args": [crate::harness::everything_server().display().to_string(), "stdio"],
        }
    })
    .to_string();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_MCP_SERVERS", &servers)],
    );
    let id = daemon
        .create(&site, json!({"mcp_servers": ["everything"]}))
        .await;
    daemon
        .send(
            &id,
            r#"call: mcp__everything__echo {"message": "hi there"}"#,
        )
        .await;
    let events = daemon.wait_turn_done(&id, 1).await;
    let echoed = tool_results(&events)[0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(echoed.contains("hi there"), "{events:#?}");

    daemon
        .send(&id, "call: mcp__everything__get-tiny-image")
        .await;
    let events = daemon.wait_turn_done(&id, 2).await;
    let image = stored_image(tool_results(&events)[1]);
    // The model got it inside the result: Anthropic's `tool_result`
    // holds image blocks.
    let sent = last_request_body(&mock).await;
    let result = sent["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .and_then(|message| message["content"].as_array())
        .and_then(|blocks| blocks.iter().find(|block| block["type"] == "tool_result"))
        .cloned()
        .unwrap_or_default();
    let block = result["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|block| block["type"] == "image"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(block["source"]["media_type"], "image/png", "{result}");
    assert_eq!(
        base64_sha256(&block["source"]["data"]),
        image["hash"],
        "the stored bytes are the bytes sent: {result}"
    );

    let long = daemon
        .create(&site, json!({"mcp_servers": ["everything"]}))
        .await;
    daemon
        .send(
            &long,
            r#"call: mcp__everything__trigger-long-running-operation {"duration": 60, "steps": 120}"#,
        )
        .await;
    // Running once its first progress is out (a step is half a second).
    let mut stream = daemon.events(&long, super::Resume::Now).await;
    stream
        .until("the operation's progress", |frame| {
            format!("{frame:?}").contains("[progress ")
        })
        .await;
    daemon.cancel(&long).await;
    daemon.wait_state(&long, "idle").await;
    let events = daemon.log(&long).await;
    let result = tool_results(&events)[0];
    assert_eq!(result["synthetic"], true, "{result}");
    assert!(
        result["content"]
            .as_str()
            .unwrap_or_default()
            .contains("[progress "),
        "{result}"
    );
}

/// The reference server over streamable HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_uses_the_reference_mcp_server_over_streamable_http() {
    let mock = MockLlm::start();
    let site = Site::new();
    let mut command = std::process::Command::new(crate::harness::node());
    command
        .arg(crate::harness::everything_server())
        .arg("streamableHttp");
    let server = HttpServer::start(command).await;
    let servers = json!({"everything": {"url": server.url}}).to_string();
    let daemon = Daemon::start(
        &site,
        Wire::OpenAi,
        &mock,
        &[("KEEL_MCP_SERVERS", &servers)],
    );
    let id = daemon
        .create(&site, json!({"mcp_servers": ["everything"]}))
        .await;
    daemon
        .send(&id, r#"call: mcp__everything__get-sum {"a": 2, "b": 40}"#)
        .await;
    let events = daemon.wait_turn_done(&id, 1).await;
    let sum = tool_results(&events)[0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(sum.contains("42"), "{events:#?}");

    // OpenAI's `tool` message holds text only: the image follows in a user
    // message, introduced by the call it came from.
    daemon
        .send(&id, "call: mcp__everything__get-tiny-image")
        .await;
    let events = daemon.wait_turn_done(&id, 2).await;
    let result = tool_results(&events)[1];
    let image = stored_image(result);
    let sent = last_request_body(&mock).await;
    let messages = sent["messages"].as_array().cloned().unwrap_or_default();
    let at = messages
        .iter()
        .position(|message| {
            message["role"] == "tool" && message["tool_call_id"] == result["tool_call_id"]
        })
        .unwrap_or_else(|| panic!("the result is sent: {sent}"));
    let next = &messages.get(at + 1).cloned().unwrap_or_default();
    assert_eq!(next["role"], "user", "{sent}");
    let url = next["content"]
        .as_array()
        .and_then(|parts| parts.iter().find(|part| part["type"] == "image_url"))
        .map(|part| part["image_url"]["url"].clone())
        .unwrap_or_default();
    let data = url
        .as_str()
        .and_then(|url| url.strip_prefix("data:image/png;base64,"))
        .unwrap_or_else(|| panic!("a PNG data URL: {next}"));
    assert_eq!(base64_sha256(&json!(data)), image["hash"], "{next}");
}

/// The one image a tool result of the log holds: stored as PNG, and
/// nothing of it left in the text.
fn stored_image(result: &Value) -> Value {
    let images = result["images"].as_array().cloned().unwrap_or_default();
    assert_eq!(images.len(), 1, "one image: {result}");
    assert_eq!(images[0]["media_type"], "image/png", "{result}");
    assert!(
        !result["content"].to_string().contains("base64"),
        "{result}"
    );
    images[0].clone()
}

async fn last_request_body(mock: &MockLlm) -> Value {
    mock.requests()
        .await
        .last()
        .map(|record| record["body"].clone())
        .unwrap_or_default()
}

/// The SHA-256, in hex, of the bytes a base64 string holds.
fn base64_sha256(data: &Value) -> Value {
    use base64::Engine as _;
    use sha2::Digest as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.as_str().unwrap_or_default())
        .unwrap_or_default();
    let hash: String = sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    json!(hash)
}

/// `per_conversation`: each conversation gets its own server process,
/// which stops with the conversation's actor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_runs_a_per_conversation_mcp_server_for_each() {
    let mock = MockLlm::start();
    let site = Site::new();
    let log = site.run_dir().join("own.log");
    let servers = json!({
        "own": {
            "command": mcp_python().display().to_string(),
            "args": [mcp_slow_server().display().to_string()],
            "env": {"SLOW_LOG": log.display().to_string()},
            "per_conversation": true,
        }
    })
    .to_string();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_MCP_SERVERS", &servers)],
    );
    let first = daemon.create(&site, json!({"mcp_servers": ["own"]})).await;
    let second = daemon.create(&site, json!({"mcp_servers": ["own"]})).await;
    for id in [&first, &second] {
        daemon
            .send(id, r#"call: mcp__own__echo {"message": "mine"}"#)
            .await;
        let events = daemon.wait_turn_done(id, 1).await;
        assert_eq!(tool_results(&events)[0]["content"], "mine");
    }
    let pids = server_pids(&log);
    assert_eq!(pids.len(), 2, "one server each: {}", noted(&log));

    let evicted = daemon
        .post_raw(&format!("/admin/actors/{first}/evict"), Vec::new(), None)
        .await;
    assert_eq!(evicted.status, StatusCode::OK, "{evicted:?}");
    super::wait_process_gone(pids[0]).await;
    assert!(
        !super::process_is_gone(pids[1]),
        "the other conversation's server runs on"
    );
    daemon
        .send(&second, r#"call: mcp__own__echo {"message": "still mine"}"#)
        .await;
    let events = daemon.wait_turn_done(&second, 2).await;
    assert_eq!(tool_results(&events)[1]["content"], "still mine");
}

/// A server's own children (what `npx` and `uvx` leave) go with it: the
/// whole process group is killed when the daemon stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_stop_takes_an_mcp_servers_children_too() {
    let mock = MockLlm::start();
    let site = Site::new();
    let log = site.run_dir().join("slow.log");
    let children = site.run_dir().join("children");
    let script = format!(
        "sleep 600 & echo $! > {children}; exec {python} {server}",
        children = children.display(),
        python = mcp_python().display(),
        server = mcp_slow_server().display(),
    );
    let servers = json!({
        "slow": {
            "command": "/bin/sh",
            "args": ["-c", script],
            "env": {"SLOW_LOG": log.display().to_string()},
        }
    })
    .to_string();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_MCP_SERVERS", &servers)],
    );
    let id = daemon.create(&site, json!({"mcp_servers": ["slow"]})).await;
    daemon
        .send(&id, r#"call: mcp__slow__echo {"message": "hi"}"#)
        .await;
    daemon.wait_turn_done(&id, 1).await;
    let child: i32 = std::fs::read_to_string(&children)
        .expect("the server's child noted its pid")
        .trim()
        .parse()
        .expect("a pid");
    let server = server_pids(&log)[0];
    assert!(!super::process_is_gone(child));
    let mut daemon = daemon;
    daemon.sigterm();
    daemon.wait_exit();
    super::wait_process_gone(server).await;
    super::wait_process_gone(child).await;
}

/// A stdio server whose configuration asks for the sandbox
/// (docs/sandbox.md) is confined as a `bash` call is: it writes in its
/// working directory and nowhere else, and the daemon's secrets are not in
/// its environment, while the variables its configuration gives are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_stdio_server_writes_only_in_its_directory() {
    let mock = MockLlm::start();
    let site = Site::new();
    let outside = site.cwd().parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let servers = json!({
        "boxed": {
            "command": mcp_python().display().to_string(),
            "args": [mcp_slow_server().display().to_string()],
            "env": {"SLOW_LOG": site.cwd().join("slow.log").display().to_string(), "GIVEN": "yes"},
            "cwd": site.cwd().display().to_string(),
            "sandbox": {"mode": "workspace-write", "network": "off"},
        }
    });
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[
            ("KEEL_MCP_SERVERS", &servers.to_string()),
            ("KEEL_TOKEN", "kt-mcp-secret"),
        ],
    );
    let id = daemon
        .create(&site, json!({"mcp_servers": ["boxed"]}))
        .await;
    let mut turn = 0;
    let mut call = |text: String| {
        turn += 1;
        let (daemon, id) = (&daemon, id.clone());
        async move {
            daemon.send(&id, &text).await;
            let log = daemon.wait_turn_done(&id, turn).await;
            of_kind(&log, "tool_result")
                .last()
                .copied()
                .cloned()
                .unwrap()
        }
    };
    let write = |path: &Path| {
        format!(
            "call: mcp__boxed__write_file {}",
            json!({"path": path.display().to_string(), "text": "x"})
        )
    };
    let inside = call(write(&site.cwd().join("inside.txt"))).await;
    assert_eq!(inside["is_error"], json!(false), "{inside}");
    assert!(site.cwd().join("inside.txt").exists());
    assert!(
        inside["content"].to_string().contains("written"),
        "{inside}"
    );
    let refused = call(write(&outside.join("victim"))).await;
    assert!(
        refused["content"]
            .to_string()
            .contains("not written: [Errno 13] Permission denied"),
        "{refused}"
    );
    assert!(!outside.join("victim").exists());
    for (name, wanted) in [
        ("KEEL_TOKEN", "(unset)"),
        ("ANTHROPIC_API_KEY", "(unset)"),
        ("GIVEN", "yes"),
    ] {
        let got = call(format!(
            "call: mcp__boxed__getenv {}",
            json!({"name": name})
        ))
        .await;
        assert!(got["content"].to_string().contains(wanted), "{name}: {got}");
    }
}
