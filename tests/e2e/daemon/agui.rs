//! AG-UI against the real daemon: `tests/agui/run.mjs` drives `POST
//! /ag-ui` with the unmodified `@ag-ui/client` (npm, pinned in
//! `tests/agui/package-lock.json`, installed once under the target
//! directory) through a text answer, a bash call, a frontend tool round
//! trip, a question and an approval, each interrupt then its resume,
//! checking every frame
//! against `@ag-ui/core`'s schemas; this test then reads keel's logs to
//! see that nothing was taken twice. Reattaching from a seq and refused
//! inputs are checked over plain HTTP.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{of_kind, Daemon, Reply, Site, Wire, PATIENCE};
use crate::harness::{node, MockLlm};

/// The test project, installed once with `npm ci` under the target
/// directory (`KEEL_TEST_AGUI` names one installed elsewhere); returns
/// the directory holding `run.mjs` and its `node_modules`.
fn agui_client() -> PathBuf {
    static CLIENT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            if let Some(dir) = std::env::var_os("KEEL_TEST_AGUI") {
                return PathBuf::from(dir);
            }
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("agui");
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("agui-node");
            std::fs::create_dir_all(&dir).expect("the npm project's directory");
            for file in ["package.json", "package-lock.json", "run.mjs"] {
                std::fs::copy(source.join(file), dir.join(file))
                    .unwrap_or_else(|error| panic!("copying tests/agui/{file}: {error}"));
            }
            let lock = std::fs::read_to_string(source.join("package-lock.json"))
                .expect("tests/agui/package-lock.json");
            let ready = dir.join("installed");
            if std::fs::read_to_string(&ready).ok().as_deref() == Some(lock.as_str()) {
                return dir;
            }
            let output = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--silent"])
                .current_dir(&dir)
                .output()
                .unwrap_or_else(|error| panic!("npm: {error} (the AG-UI test needs node and npm)"));
            assert!(
                output.status.success(),
                "npm ci of tests/agui failed:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            std::fs::write(&ready, lock).expect("the install's marker");
            dir
        })
        .clone()
}

fn user_texts(log: &[Value]) -> Vec<String> {
    of_kind(log, "user_message")
        .into_iter()
        .filter_map(|event| event["text"].as_str())
        .map(str::to_owned)
        .collect()
}

/// The `(id, data)` of each frame of an SSE body.
fn frames(body: &str) -> Vec<(Option<u64>, Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let id = block
                .lines()
                .find_map(|line| line.strip_prefix("id: "))
                .map(|seq| seq.parse().expect("an id is a seq"));
            let data = block.lines().find_map(|line| line.strip_prefix("data: "))?;
            Some((id, serde_json::from_str(data).expect("data is JSON")))
        })
        .collect()
}

fn types(frames: &[(Option<u64>, Value)]) -> Vec<&str> {
    frames
        .iter()
        .map(|(_, event)| event["type"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agui_client_runs_text_tools_frontend_tools_and_approvals() {
    let client = agui_client();
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    // A thread can be a conversation made with keel's own API: this one's
    // bash calls wait for approval.
    let approval_thread = daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;

    let mut command = Command::new(node());
    command
        .arg(client.join("run.mjs"))
        .current_dir(&client)
        .env("KEEL_URL", &daemon.url)
        .env("KEEL_TOKEN", &daemon.token)
        .env("KEEL_APPROVAL_THREAD", &approval_thread);
    let output = tokio::time::timeout(
        PATIENCE * 4,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("the AG-UI client finishes")
    .expect("the client's task")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the AG-UI client failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        daemon.output()
    );
    let summary: Value = serde_json::from_str(stdout.trim()).expect("the client's summary");
    assert!(summary["checked"].as_u64().unwrap() > 20, "{summary}");

    // The client sent its whole history on every run: keel took each
    // message once, and each result once.
    let chat = summary["chatThread"].as_str().unwrap();
    let log = daemon.log(chat).await;
    assert_eq!(
        user_texts(&log),
        [
            "hello from ag-ui",
            "run: echo keel-ran-this",
            r#"call: pick_color {"options":["teal","red"]}"#,
            r#"call: ask_user {"question":"Which size?"}"#,
        ],
        "{log:#?}"
    );
    let question = summary["questionCall"].as_str().unwrap();
    let answered: Vec<&Value> = of_kind(&log, "resolved")
        .into_iter()
        .filter(|event| event["tool_call_id"] == question)
        .collect();
    assert_eq!(answered.len(), 1, "{log:#?}");
    assert_eq!(answered[0]["text"], "large", "{log:#?}");
    let pick = summary["pickCall"].as_str().unwrap();
    let resolved: Vec<&Value> = of_kind(&log, "resolved")
        .into_iter()
        .filter(|event| event["tool_call_id"] == pick)
        .collect();
    assert_eq!(resolved.len(), 1, "{log:#?}");
    assert_eq!(resolved[0]["text"], "teal", "{log:#?}");

    // The frontend's tool was offered to the model, with its schema,
    // from the run that brought it on; the first run brought none.
    let requests = mock.requests().await;
    let offered = |request: &Value| {
        request["body"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|tool| tool["name"] == "pick_color")
            .cloned()
    };
    assert!(offered(&requests[0]).is_none(), "{:#}", requests[0]["body"]);
    let with_tool: Vec<Value> = requests.iter().filter_map(offered).collect();
    assert!(with_tool.len() >= 2, "{requests:#?}");
    assert_eq!(
        with_tool[0]["input_schema"],
        json!({"type": "object", "properties": {"options": {"type": "array", "items": {"type": "string"}}}})
    );

    let log = daemon.log(&approval_thread).await;
    assert_eq!(
        user_texts(&log),
        ["run: echo approved-by-ag-ui"],
        "{log:#?}"
    );
    let approval = summary["approvalCall"].as_str().unwrap();
    let resolved: Vec<&Value> = of_kind(&log, "resolved")
        .into_iter()
        .filter(|event| event["tool_call_id"] == approval)
        .collect();
    assert_eq!(resolved.len(), 1, "{log:#?}");
    assert_eq!(resolved[0]["decision"], "approve", "{log:#?}");
}

/// After a dropped connection, a client reattaches to the run from the
/// last SSE id it saw and gets every canonical frame after it once, and
/// the run's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agui_reattach_from_a_seq_misses_nothing_and_repeats_nothing() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let run = json!({
        "threadId": "agui-reattach",
        "runId": "run-1",
        "messages": [{"id": "m1", "role": "user", "content": "run: echo once"}],
    });
    let reply = daemon.post("/ag-ui", &run).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let original = frames(reply.body.as_str().expect("an SSE body"));
    let kinds = types(&original);
    assert_eq!(kinds.first(), Some(&"RUN_STARTED"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"RUN_FINISHED"), "{kinds:?}");
    let ids: Vec<u64> = original.iter().filter_map(|(id, _)| *id).collect();
    assert!(ids.len() >= 3, "{original:#?}");
    let seen = ids[0];

    let reattached = daemon
        .http
        .get(daemon.endpoint("/ag-ui/agui-reattach/runs/run-1/events"))
        .header("Last-Event-ID", seen.to_string())
        .timeout(PATIENCE)
        .send()
        .await
        .expect("the daemon answers");
    assert_eq!(reattached.status(), StatusCode::OK);
    let body = reattached.text().await.expect("the whole stream");
    let again = frames(&body);
    let kinds = types(&again);
    assert_eq!(kinds.first(), Some(&"RUN_STARTED"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"RUN_FINISHED"), "{kinds:?}");
    let again_ids: Vec<u64> = again.iter().filter_map(|(id, _)| *id).collect();
    let owed: Vec<u64> = ids.into_iter().filter(|id| *id > seen).collect();
    assert_eq!(again_ids, owed, "{body}");
    assert_eq!(again.last().unwrap().1["runId"], "run-1");
    assert_eq!(
        original.last().unwrap().1["outcome"],
        again.last().unwrap().1["outcome"]
    );

    // The same input again: the client lost the answer and retries. keel
    // has the message; nothing is sent twice, and the run ends at once.
    let reply = daemon.post("/ag-ui", &run).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let log = daemon.log("agui-reattach").await;
    assert_eq!(user_texts(&log), ["run: echo once"], "{log:#?}");
}

/// Bad input answers as the rest of the API does, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agui_refuses_bad_input_and_changes_nothing() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);

    let reply = daemon
        .post_raw("/ag-ui", b"{not json".to_vec(), Some("application/json"))
        .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST).0, "bad_json");

    let reply = daemon
        .post("/ag-ui", &json!({"threadId": "agui-bad", "messages": []}))
        .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST).0, "bad_json");

    let reply = daemon
        .post(
            "/ag-ui",
            &json!({"threadId": "not a thread", "runId": "r", "messages": []}),
        )
        .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST).0, "bad_request");

    // A result for a call no thread holds: refused before the thread is
    // made.
    let reply = daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": "agui-new",
                "runId": "r",
                "messages": [{"id": "t1", "role": "tool", "toolCallId": "nope", "content": "x"}],
            }),
        )
        .await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "unknown_call");
    let reply = daemon.get("/v1/conversations/agui-new").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "not_found");

    // History from another thread: a keel id past this one's log.
    let reply = daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": "agui-new",
                "runId": "r",
                "messages": [
                    {"id": "keel-99", "role": "assistant", "content": "elsewhere"},
                    {"id": "u1", "role": "user", "content": "hi"},
                ],
            }),
        )
        .await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "not_found");
    let reply = daemon.get("/v1/conversations/agui-new").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "not_found");

    // A message over KEEL_MAX_MESSAGE_BYTES (1 MiB), refused as
    // `POST …/messages` refuses it.
    let reply = daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": "agui-new",
                "runId": "r",
                "messages": [{"id": "u1", "role": "user", "content": "x".repeat(1_100_000)}],
            }),
        )
        .await;
    assert_eq!(
        reply.error(StatusCode::PAYLOAD_TOO_LARGE).0,
        "payload_too_large"
    );
    let reply = daemon.get("/v1/conversations/agui-new").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "not_found");

    // A frontend tool named like one of keel's.
    let reply = daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": "agui-new",
                "runId": "r",
                "messages": [{"id": "u1", "role": "user", "content": "hi"}],
                "tools": [{"name": "bash", "description": "mine"}],
            }),
        )
        .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST).0, "bad_request");
    let reply = daemon.get("/v1/conversations/agui-new").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "not_found");

    // An answer to an interrupt an existing thread does not have.
    let id = daemon.create(&site, json!({})).await;
    let before = daemon.log(&id).await.len();
    let reply = daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": id,
                "runId": "r",
                "messages": [{"id": "u1", "role": "user", "content": "hi"}],
                "resume": [{"interruptId": "nope", "status": "resolved", "payload": {"approved": true}}],
            }),
        )
        .await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND).0, "unknown_call");
    assert_eq!(daemon.log(&id).await.len(), before, "nothing was written");

    // A message while the thread waits on an approval is busy (keel's
    // busy policy, `reject` by default), and the tools it brings are not
    // taken either.
    let gated = daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    let reply = daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": gated,
                "runId": "r1",
                "messages": [{"id": "u1", "role": "user", "content": "run: echo gated"}],
            }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let finished = frames(reply.body.as_str().unwrap()).pop().unwrap().1;
    assert_eq!(finished["outcome"]["type"], "interrupt", "{finished}");
    let before = daemon.log(&gated).await.len();
    let reply = daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": gated,
                "runId": "r2",
                "messages": [{"id": "u2", "role": "user", "content": "never mind"}],
                "tools": [{"name": "pick_color", "description": "mine"}],
            }),
        )
        .await;
    assert_eq!(reply.error(StatusCode::CONFLICT).0, "busy");
    assert_eq!(
        daemon.log(&gated).await.len(),
        before,
        "nothing was written"
    );

    let reply = Reply::of(
        daemon
            .anonymous()
            .post(daemon.endpoint("/ag-ui"))
            .json(&json!({"threadId": "t", "runId": "r", "messages": []}))
            .send()
            .await,
    )
    .await;
    assert_eq!(reply.error(StatusCode::UNAUTHORIZED).0, "unauthorized");
}

/// An SSE body read as it comes.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    /// The next frame, or `None` at the body's end.
    async fn next(&mut self) -> Option<(Option<u64>, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                match frames(&block).pop() {
                    Some(frame) => return Some(frame),
                    None => continue,
                }
            }
            let chunk = tokio::time::timeout(PATIENCE, self.response.chunk())
                .await
                .expect("a frame within PATIENCE")
                .expect("the stream reads")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// Frames up to and including the first `TYPE`.
    async fn until(&mut self, wanted: &str) -> Vec<(Option<u64>, Value)> {
        let mut seen = Vec::new();
        while let Some(frame) = self.next().await {
            let done = frame.1["type"] == wanted;
            seen.push(frame);
            if done {
                return seen;
            }
        }
        panic!("the stream ended before {wanted}: {seen:#?}");
    }
}

async fn run_stream(daemon: &Daemon, body: &Value) -> Stream {
    let response = daemon
        .http
        .post(daemon.endpoint("/ag-ui"))
        .json(body)
        .send()
        .await
        .expect("the daemon answers");
    assert_eq!(response.status(), StatusCode::OK);
    Stream {
        response,
        buffer: String::new(),
    }
}

/// A bash command that runs until `file` appears in its working
/// directory: the test decides when the tool ends, with no clock.
fn until_file(file: &str) -> String {
    format!("run: while [ ! -f {file} ]; do sleep 0.02; done; echo went")
}

/// A connection dropped in the middle of a run: the client reattaches
/// from the last id it saw while the run still goes on, and gets the rest
/// of it once each, live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agui_reattach_mid_run_follows_the_rest_of_it_live() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let mut first = run_stream(
        &daemon,
        &json!({
            "threadId": id,
            "runId": "run-1",
            "messages": [{"id": "m1", "role": "user", "content": until_file("go")}],
        }),
    )
    .await;
    let seen = first.until("TOOL_CALL_END").await;
    let last_id = seen
        .last()
        .unwrap()
        .0
        .expect("TOOL_CALL_END carries its event's seq");
    drop(first);

    let response = daemon
        .http
        .get(daemon.endpoint(&format!("/ag-ui/{id}/runs/run-1/events")))
        .header("Last-Event-ID", last_id.to_string())
        .send()
        .await
        .expect("the daemon answers");
    assert_eq!(response.status(), StatusCode::OK);
    let mut again = Stream {
        response,
        buffer: String::new(),
    };
    let started = again.next().await.unwrap();
    assert_eq!(started.1["type"], "RUN_STARTED");
    std::fs::write(site.cwd().join("go"), "").unwrap();
    let rest = again.until("RUN_FINISHED").await;
    assert!(again.next().await.is_none(), "nothing after RUN_FINISHED");

    let kinds = types(&rest);
    let result = rest
        .iter()
        .find(|(_, event)| event["type"] == "TOOL_CALL_RESULT")
        .expect("the tool's result");
    assert!(
        result.1["content"].as_str().unwrap().contains("went"),
        "{rest:#?}"
    );
    assert!(kinds.contains(&"TEXT_MESSAGE_END"), "{kinds:?}");
    assert_eq!(rest.last().unwrap().1["outcome"]["type"], "success");
    // Every id after the one seen, once each, in order: the seqs of the
    // log's events that make frames.
    let ids: Vec<u64> = rest.iter().filter_map(|(id, _)| *id).collect();
    let log = daemon.log(&id).await;
    let owed: Vec<u64> = log
        .iter()
        .filter(|event| {
            matches!(
                event["type"].as_str(),
                Some("assistant_message" | "tool_result" | "turn_completed")
            )
        })
        .filter_map(|event| event["seq"].as_u64())
        .filter(|seq| *seq > last_id)
        .collect();
    assert_eq!(ids, owed, "{rest:#?}");
}

/// A cancel while the run's tool runs ends the run as cancelled, not
/// failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agui_a_cancelled_run_finishes_cancelled() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let mut run = run_stream(
        &daemon,
        &json!({
            "threadId": id,
            "runId": "run-1",
            "messages": [{"id": "m1", "role": "user", "content": until_file("never")}],
        }),
    )
    .await;
    run.until("TOOL_CALL_END").await;
    daemon.wait_state(&id, "executing_tools").await;
    let reply = daemon.cancel(&id).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let rest = run.until("RUN_FINISHED").await;
    assert_eq!(
        rest.last().unwrap().1["outcome"],
        json!({"type": "cancelled"})
    );
    assert!(run.next().await.is_none(), "nothing after RUN_FINISHED");
}
