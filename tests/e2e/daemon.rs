//! `keel serve`, the daemon, as a user runs it: the real binary as a child
//! process on a free loopback port, its data dir in a tempdir, talking to
//! a separate `keel mock-llm` in either wire format, driven over HTTP and
//! followed over SSE. The areas are in `daemon/`: streaming and resuming,
//! cancel, approvals, refused requests, access and start-up, restarts,
//! operations (admin routes, metrics, OTLP export), the file tools'
//! confinement as the create request sets it, and sub-agents.
//!
//! The harness here starts a daemon (and waits for its `keel listening on`
//! line), holds its token and an HTTP client that sends it, reads its event
//! streams (`sse`), signals it and starts it again on the same data dir.
//! Nothing sleeps to synchronise: tests wait for frames, states or files,
//! each wait bounded by [`PATIENCE`] so that a regression fails instead of
//! hanging. Each test starts its own mock and daemon, so tests run in
//! parallel.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agui;
mod approvals;
mod cancel;
mod compaction;
mod console;
mod deletion;
mod file_tools;
mod full_disk;
mod history;
mod images;
mod langgraph;
mod mcp;
mod nodes;
mod operations;
mod postgres;
mod refusals;
mod restart;
mod sandbox;
mod sse;
mod startup;
mod streaming;
mod sub_agents;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::harness::{keel_bin, MockLlm};
use sse::EventStream;

/// Longest any wait may take before the test fails: generous, for a
/// loaded two-core CI machine running tests in parallel.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The line `keel serve` prints once it accepts connections.
const BANNER: &str = "keel listening on ";

/// Which wire format the daemon speaks to the mock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Anthropic,
    OpenAi,
}

impl Wire {
    /// The mock's name for it, as script entries' `endpoint` say it.
    pub fn endpoint(self) -> &'static str {
        match self {
            Wire::Anthropic => "anthropic",
            Wire::OpenAi => "openai",
        }
    }

    /// The daemon's provider settings pointing at `mock`.
    pub fn env(self, mock: &MockLlm) -> Vec<(String, String)> {
        let pairs = match self {
            Wire::Anthropic => [
                ("KEEL_PROVIDER", "anthropic".to_owned()),
                ("ANTHROPIC_BASE_URL", mock.base_url().to_owned()),
                ("ANTHROPIC_API_KEY", "x".to_owned()),
                ("KEEL_MODEL", "claude-mock".to_owned()),
            ],
            Wire::OpenAi => [
                ("KEEL_PROVIDER", "openai".to_owned()),
                ("OPENAI_BASE_URL", format!("{}/v1", mock.base_url())),
                ("OPENAI_API_KEY", "x".to_owned()),
                ("KEEL_MODEL", "gpt-mock".to_owned()),
            ],
        };
        pairs
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect()
    }
}

/// A test's directories: the daemon's data dir (kept across restarts),
/// the working directory its conversations' tools run in, and the
/// directory the daemon process runs in.
pub struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    pub fn new() -> Site {
        let site = Site {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(site.cwd()).unwrap();
        std::fs::create_dir_all(site.run_dir()).unwrap();
        site
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The working directory conversations are created with.
    pub fn cwd(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Where the daemon runs: empty, so no stray `./keel.toml` is read.
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }
}

/// Everything a daemon was started with, to start it again the same way.
#[derive(Clone)]
struct Launch {
    data_dir: PathBuf,
    run_dir: PathBuf,
    env: Vec<(String, String)>,
    /// A command the binary runs under (`nsenter … --`), if any; it must
    /// exec the binary, so that the child's pid is the daemon's.
    prefix: Vec<String>,
}

/// What a child process printed, gathered by reader threads.
#[derive(Default)]
struct Printed {
    stdout: Mutex<Vec<String>>,
    stderr: Mutex<Vec<String>>,
}

/// A `keel serve` child process. Dropping it kills the process; a test
/// that fails prints what the daemon logged.
pub struct Daemon {
    child: Child,
    launch: Launch,
    printed: Arc<Printed>,
    /// `http://127.0.0.1:PORT`, as the daemon announced it.
    pub url: String,
    pub token: String,
    http: reqwest::Client,
    exit: Option<ExitStatus>,
    /// stdout's lines as they come; disconnected once stdout is closed.
    lines: mpsc::Receiver<String>,
}

/// The environment every daemon gets: nothing from the test's own (no
/// provider key leaks in), a free loopback port and the site's data dir.
pub fn base_env(site: &Site) -> Vec<(String, String)> {
    let mut env = vec![
        ("KEEL_ADDR".to_owned(), "127.0.0.1:0".to_owned()),
        (
            "KEEL_DATA_DIR".to_owned(),
            site.data_dir().display().to_string(),
        ),
        ("RUST_BACKTRACE".to_owned(), "1".to_owned()),
    ];
    for name in ["PATH", "HOME"] {
        if let Ok(value) = std::env::var(name) {
            env.push((name.to_owned(), value));
        }
    }
    env
}

/// Start `keel serve` with `launch`, its output read by two threads; the
/// receiver gets each stdout line as it comes.
fn spawn(launch: &Launch) -> (Child, Arc<Printed>, mpsc::Receiver<String>) {
    let bin = keel_bin();
    let mut command = match launch.prefix.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(&bin);
            command
        }
        None => Command::new(&bin),
    };
    let mut child = command
        .arg("serve")
        .env_clear()
        .envs(launch.env.iter().map(|(name, value)| (name, value)))
        .current_dir(&launch.run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("could not start {} serve: {err}", bin.display()));
    let printed = Arc::new(Printed::default());
    let (lines, receiver) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let into = printed.clone();
    std::thread::spawn(move || {
        drain(stdout, |line| {
            into.stdout.lock().unwrap().push(line.clone());
            let _ = lines.send(line);
        });
    });
    let into = printed.clone();
    std::thread::spawn(move || drain(stderr, |line| into.stderr.lock().unwrap().push(line)));
    (child, printed, receiver)
}

/// Hands each line of `pipe` to `sink` until the pipe closes. Lines are
/// read as bytes: one that is not UTF-8 must not stop the reading, or the
/// daemon would block on a full pipe.
fn drain(pipe: impl Read, mut sink: impl FnMut(String)) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
        sink(String::from_utf8_lossy(&line).trim_end().to_owned());
        line.clear();
    }
}

impl Daemon {
    /// A daemon on `site` speaking `wire` to `mock`, with `extra`
    /// settings; waits until it listens.
    pub fn start(site: &Site, wire: Wire, mock: &MockLlm, extra: &[(&str, &str)]) -> Daemon {
        let mut env = wire.env(mock);
        env.extend(
            extra
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
        );
        Daemon::start_with(site, env)
    }

    /// A daemon on `site` with exactly these settings (beyond the address
    /// and the data dir); waits until it listens.
    pub fn start_with(site: &Site, env: Vec<(String, String)>) -> Daemon {
        let mut all = base_env(site);
        all.extend(env);
        Daemon::launch(Launch {
            data_dir: site.data_dir(),
            run_dir: site.run_dir(),
            env: all,
            prefix: Vec::new(),
        })
    }

    /// A daemon started as `prefix keel serve` (in another mount
    /// namespace, say), with these settings after the site's; waits until
    /// it listens. `env` must set `KEEL_TOKEN`: the site's data dir may not
    /// be where the daemon sees it.
    pub fn start_under(site: &Site, prefix: Vec<String>, env: Vec<(String, String)>) -> Daemon {
        let mut all = base_env(site);
        all.extend(env);
        Daemon::launch(Launch {
            data_dir: site.data_dir(),
            run_dir: site.run_dir(),
            env: all,
            prefix,
        })
    }

    fn launch(launch: Launch) -> Daemon {
        let (child, printed, lines) = spawn(&launch);
        let mut daemon = Daemon {
            child,
            launch,
            printed,
            url: String::new(),
            token: String::new(),
            http: keel_api::http::client(),
            exit: None,
            lines,
        };
        let deadline = Instant::now() + PATIENCE;
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match daemon.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.trim().strip_prefix(BANNER) {
                        break url.to_owned();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = daemon.wait_exit();
                    panic!(
                        "keel serve exited before listening: {status:?}\n{}",
                        daemon.output()
                    )
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "keel serve did not listen within {PATIENCE:?}\n{}",
                        daemon.output()
                    )
                }
            }
        };
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "the daemon listens on loopback: {url}"
        );
        daemon.url = url;
        daemon.token = daemon.configured_token().unwrap_or_else(|| {
            let path = daemon.launch.data_dir.join("token");
            std::fs::read_to_string(&path)
                .unwrap_or_else(|err| panic!("reading the token in {}: {err}", path.display()))
                .trim()
                .to_owned()
        });
        let mut headers = HeaderMap::new();
        let bearer = HeaderValue::from_str(&format!("Bearer {}", daemon.token)).unwrap();
        headers.insert(AUTHORIZATION, bearer);
        daemon.http = keel_api::http::client_builder()
            .default_headers(headers)
            .build()
            .unwrap();
        daemon
    }

    fn configured_token(&self) -> Option<String> {
        self.launch
            .env
            .iter()
            .find(|(name, _)| name == "KEEL_TOKEN")
            .map(|(_, value)| value.clone())
    }

    pub fn data_dir(&self) -> &Path {
        &self.launch.data_dir
    }

    /// Everything the daemon printed on stdout so far.
    pub fn stdout(&self) -> Vec<String> {
        self.printed.stdout.lock().unwrap().clone()
    }

    /// stdout and stderr, for a failure message.
    pub fn output(&self) -> String {
        output_of(&self.printed)
    }

    // --- the process ----------------------------------------------------

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Ask for a graceful stop.
    pub fn sigterm(&self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
    }

    /// Crash it.
    pub fn sigkill(&self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
    }

    /// Pause it (as a stalled machine or a long GC pause would).
    pub fn sigstop(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// Let a paused daemon go on.
    pub fn sigcont(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    /// Waits (bounded) for the process to exit, and says how it did.
    pub fn wait_exit(&mut self) -> ExitStatus {
        if let Some(status) = self.exit {
            return status;
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.exit = Some(status);
                // Everything it printed is read once its stdout closes.
                let left = deadline.saturating_duration_since(Instant::now());
                while let Ok(_line) = self.lines.recv_timeout(left) {}
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "keel serve did not exit within {PATIENCE:?}\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The same daemon started again on the same data dir, with the same
    /// settings, once this one has exited (waited for, bounded).
    pub fn restart(mut self) -> Daemon {
        self.wait_exit();
        let launch = self.launch.clone();
        drop(self);
        Daemon::launch(launch)
    }

    // --- HTTP -------------------------------------------------------------

    pub fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// An HTTP client that sends no token.
    pub fn anonymous(&self) -> reqwest::Client {
        keel_api::http::client()
    }

    pub async fn get(&self, path: &str) -> Reply {
        Reply::of(
            self.http
                .get(self.endpoint(path))
                .timeout(PATIENCE)
                .send()
                .await,
        )
        .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        Reply::of(
            self.http
                .post(self.endpoint(path))
                .timeout(PATIENCE)
                .json(body)
                .send()
                .await,
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        Reply::of(
            self.http
                .delete(self.endpoint(path))
                .timeout(PATIENCE)
                .send()
                .await,
        )
        .await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> Reply {
        Reply::of(
            self.http
                .patch(self.endpoint(path))
                .timeout(PATIENCE)
                .json(body)
                .send()
                .await,
        )
        .await
    }

    /// POST `body` as it is, with `content_type` if any.
    pub async fn post_raw(&self, path: &str, body: Vec<u8>, content_type: Option<&str>) -> Reply {
        let mut request = self
            .http
            .post(self.endpoint(path))
            .timeout(PATIENCE)
            .body(body);
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        Reply::of(request.send().await).await
    }

    /// Create a conversation in the site's working directory with these
    /// fields added; returns its id.
    pub async fn create(&self, site: &Site, fields: Value) -> String {
        let mut body = json!({"cwd": site.cwd().display().to_string()});
        if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
            body.extend(fields.clone());
        }
        let reply = self.post("/v1/conversations", &body).await;
        assert_eq!(reply.status, StatusCode::CREATED, "create: {reply:?}");
        reply.body["id"].as_str().expect("an id").to_owned()
    }

    /// Send `text`; returns the seq of the stored message.
    pub async fn send(&self, id: &str, text: &str) -> u64 {
        let reply = self
            .post(
                &format!("/v1/conversations/{id}/messages"),
                &json!({"text": text}),
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::ACCEPTED,
            "send {text:?}: {reply:?}"
        );
        reply.body["seq"].as_u64().expect("the message's seq")
    }

    /// `POST …/cancel` (no body).
    pub async fn cancel(&self, id: &str) -> Reply {
        self.post_raw(&format!("/v1/conversations/{id}/cancel"), Vec::new(), None)
            .await
    }

    /// `POST …/resolve` of `call` with `decision`.
    pub async fn resolve(&self, id: &str, call: &str, decision: &str) -> Reply {
        self.post(
            &format!("/v1/conversations/{id}/resolve"),
            &json!({"tool_call_id": call, "decision": decision}),
        )
        .await
    }

    /// `GET /v1/conversations/{id}`.
    pub async fn conversation(&self, id: &str) -> Value {
        let reply = self.get(&format!("/v1/conversations/{id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "GET {id}: {reply:?}");
        reply.body
    }

    /// The whole log, every page of `GET …/log`.
    pub async fn log(&self, id: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut from = 1;
        loop {
            let reply = self
                .get(&format!("/v1/conversations/{id}/log?from={from}"))
                .await;
            assert_eq!(reply.status, StatusCode::OK, "log of {id}: {reply:?}");
            let page = reply.body["events"].as_array().expect("events").clone();
            let next = reply.body["next_from"].as_u64().expect("next_from");
            if page.is_empty() || next == from {
                return events;
            }
            events.extend(page);
            from = next;
        }
    }

    /// Polls the conversation until `done` holds of it; returns it.
    pub async fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let conversation = self.conversation(id).await;
            if done(&conversation) {
                return conversation;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {PATIENCE:?}; the conversation: {conversation:#}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until the conversation is in `state`.
    pub async fn wait_state(&self, id: &str, state: &str) -> Value {
        self.wait_for(id, &format!("state {state}"), |conversation| {
            conversation["state"] == state
        })
        .await
    }

    /// Polls until the log holds an event `done` accepts; returns the log.
    pub async fn wait_log(
        &self,
        id: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let log = self.log(id).await;
            if log.iter().any(&done) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not in the log within {PATIENCE:?}: {log:#?}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until a turn has ended (completed, interrupted or failed) and
    /// the conversation is idle; returns the log.
    pub async fn wait_turn_done(&self, id: &str, turn: u64) -> Vec<Value> {
        self.wait_for(id, &format!("turn {turn} done and idle"), |conversation| {
            conversation["state"] == "idle" && conversation["turn"].as_u64() >= Some(turn)
        })
        .await;
        self.wait_log(id, &format!("the end of turn {turn}"), |event| {
            ends_turn(event, turn)
        })
        .await
    }

    /// Follow the conversation's events.
    pub async fn events(&self, id: &str, resume: Resume) -> EventStream {
        let mut path = format!("/v1/conversations/{id}/events");
        if let Resume::From(from) = resume {
            path.push_str(&format!("?from={from}"));
        }
        let mut request = self.http.get(self.endpoint(&path));
        if let Resume::LastEventId(seq) = resume {
            request = request.header("last-event-id", seq.to_string());
        }
        let response = tokio::time::timeout(PATIENCE, request.send())
            .await
            .expect("the event stream answers in time")
            .expect("GET …/events");
        assert_eq!(response.status(), StatusCode::OK, "GET {path}");
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "an event stream: {content_type}"
        );
        EventStream::new(response)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- keel serve at {} ---\n{}", self.url, self.output());
        }
    }
}

fn output_of(printed: &Printed) -> String {
    let stdout = printed.stdout.lock().unwrap().join("\n");
    let stderr = printed.stderr.lock().unwrap();
    // The end of the log says most; a long run is cut at the head.
    let skip = stderr.len().saturating_sub(300);
    format!(
        "stdout:\n{stdout}\nstderr (last {} lines):\n{}",
        stderr.len() - skip,
        stderr[skip..].join("\n")
    )
}

/// Where an event stream starts.
#[derive(Debug, Clone, Copy)]
pub enum Resume {
    /// A new follower: a snapshot, then what happens next.
    Now,
    /// `?from=SEQ`.
    From(u64),
    /// `Last-Event-ID: SEQ`.
    LastEventId(u64),
}

/// An HTTP answer: its status and its body (JSON, or the text as a JSON
/// string when it is not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    pub async fn of(sent: reqwest::Result<reqwest::Response>) -> Reply {
        let response = sent.expect("the daemon answers");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("the whole body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply {
            status,
            headers,
            body,
        }
    }

    /// Checks this is an error of `status` in the API's one shape,
    /// `{"error": {"code", "message"}}`, and returns (code, message).
    pub fn error(&self, status: StatusCode) -> (String, String) {
        assert_eq!(self.status, status, "{self:?}");
        error_parts(&self.body)
    }
}

/// (code, message) of an error body, checked to be exactly
/// `{"error": {"code": "...", "message": "..."}}` with both non-empty.
pub fn error_parts(body: &Value) -> (String, String) {
    let outer = body
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {body}"));
    assert_eq!(outer.len(), 1, "only `error`: {body}");
    let inner = outer["error"]
        .as_object()
        .unwrap_or_else(|| panic!("`error` is an object: {body}"));
    let mut keys: Vec<&str> = inner.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let code = inner["code"].as_str().unwrap_or_default().to_owned();
    // `busy` says in which state, beside its message; nothing else adds a
    // field.
    if code == "busy" {
        assert_eq!(keys, ["code", "message", "state"], "{body}");
        assert!(
            inner["state"]
                .as_str()
                .is_some_and(|state| !state.is_empty()),
            "{body}"
        );
    } else {
        assert_eq!(keys, ["code", "message"], "{body}");
    }
    let message = inner["message"].as_str().unwrap_or_default().to_owned();
    assert!(!code.is_empty() && !message.is_empty(), "{body}");
    (code, message)
}

// --- reading logs and the mock --------------------------------------------

/// The event's `type`.
pub fn kind(event: &Value) -> &str {
    event["type"].as_str().unwrap_or_default()
}

/// The events of the log of `kind`.
pub fn of_kind<'a>(log: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    log.iter().filter(|event| kind(event) == wanted).collect()
}

/// Whether `event` ends turn `turn`.
pub fn ends_turn(event: &Value, turn: u64) -> bool {
    matches!(
        kind(event),
        "turn_completed" | "turn_interrupted" | "turn_failed"
    ) && event["turn"].as_u64() == Some(turn)
}

/// The text of the assistant messages of the log, in order.
pub fn assistant_texts(log: &[Value]) -> Vec<String> {
    of_kind(log, "assistant_message")
        .into_iter()
        .map(|event| {
            event["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|block| block["type"] == "text")
                .filter_map(|block| block["text"].as_str())
                .collect::<String>()
        })
        .collect()
}

/// The seqs of the log, checked to be 1, 2, … without a gap.
pub fn seqs(log: &[Value]) -> Vec<u64> {
    let seqs: Vec<u64> = log
        .iter()
        .map(|event| event["seq"].as_u64().expect("a seq"))
        .collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "the log's seqs run 1.. without a gap");
    seqs
}

/// Waits (bounded) until the mock has recorded `n` requests, ended or
/// not; returns them.
pub async fn mock_requests(mock: &MockLlm, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let requests = mock.requests().await;
        if requests.len() >= n {
            return requests;
        }
        assert!(
            Instant::now() < deadline,
            "the mock got {} requests, not {n}, within {PATIENCE:?}",
            requests.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The text of the last user message of a recorded provider request, in
/// either wire format.
pub fn last_user_text(request: &Value) -> String {
    let messages = request["body"]["messages"].as_array().expect("messages");
    let last = messages
        .iter()
        .rev()
        .find(|message| message["role"] == "user")
        .expect("a user message");
    match &last["content"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|block| block["type"] == "text")
            .filter_map(|block| block["text"].as_str())
            .collect(),
        other => panic!("unexpected content {other}"),
    }
}

/// Waits (bounded) for a file a tool writes, ending in a newline.
pub async fn wait_file(path: &Path) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} was never written",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether process `pid` no longer runs: gone, or a zombie (it runs
/// nothing; whoever reaps it gets to it in its own time).
pub fn process_is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, fields)| fields.split_whitespace().next())
            .is_some_and(|state| state == "Z"),
    }
}

/// Waits (bounded) until process `pid` is gone.
pub async fn wait_process_gone(pid: i32) {
    let deadline = Instant::now() + PATIENCE;
    while !process_is_gone(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} still runs after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
