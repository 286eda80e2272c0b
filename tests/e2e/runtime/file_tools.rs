//! The file tools through the runtime, against `keel mock-llm`: a scripted
//! model calls `write_file`, `read_file`, `edit_file`, `glob` and `grep`;
//! the tests check what each call put in the log, what the next request
//! carried back to the model, and the file system. Failures (no match,
//! several matches, a binary file, a missing file, a bad regex), paths
//! that escape the working directory (`../`, absolute, a symlink out) and
//! input that does not match a tool's schema all reach the model as error
//! results, and the turn completes. And an `edit_file` call that is run
//! again by recovery after its edit was made says so instead of failing.

use std::collections::BTreeMap;

use keel_actors::core::wire::ToolSpec;
use keel_actors::tool::{EditFile, Tool, ToolContext, ToolOutcome, ToolRegistry};
use serde_json::Value;

use super::*;

/// One tool call of a script, with a fixed id so results can be found.
fn call(id: &str, name: &str, input: Value) -> Value {
    json!({"id": id, "name": name, "input": input})
}

/// Every tool result of the log, by tool call id: (content, is_error).
fn results_by_id(events: &[Event]) -> BTreeMap<String, (String, bool)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                synthetic,
                ..
            } => {
                assert!(!synthetic, "a real tool result: {event:?}");
                Some((tool_call_id.to_string(), (content.clone(), *is_error)))
            }
            _ => None,
        })
        .collect()
}

/// The tool_result blocks the model was sent in the recorded (Anthropic)
/// request `record`, by tool_use_id: (content, is_error).
fn sent_results(record: &Value) -> BTreeMap<String, (String, bool)> {
    record["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|message| message["content"].as_array())
        .flatten()
        .filter(|block| block["type"] == "tool_result")
        .map(|block| {
            let content = match &block["content"] {
                Value::String(text) => text.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|part| part["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                other => panic!("unexpected tool_result content {other}"),
            };
            let id = block["tool_use_id"].as_str().unwrap().to_owned();
            (id, (content, block["is_error"] == json!(true)))
        })
        .collect()
}

/// A model that makes `calls` in one answer and then says it is done: the
/// turn is run to its end on a fresh runtime with `config`, in the rig's
/// working directory. Returns the log's results and the results the second
/// request carried back to the model, which must be the same.
async fn run_calls(
    rig: &Rig,
    config: ConversationConfig,
    calls: Vec<Value>,
) -> BTreeMap<String, (String, bool)> {
    run_calls_on(
        rig,
        rig.runtime_config(rig.store(BackendKind::Memory)),
        config,
        calls,
    )
    .await
}

/// [`run_calls`] on a runtime opened with `runtime_config`.
async fn run_calls_on(
    rig: &Rig,
    runtime_config: RuntimeConfig,
    config: ConversationConfig,
    calls: Vec<Value>,
) -> BTreeMap<String, (String, bool)> {
    let n_calls = calls.len();
    rig.mock
        .push_script(json!([
            {"endpoint": "anthropic", "tool_calls": calls},
            {"endpoint": "anthropic", "text": "done"},
        ]))
        .await;
    let runtime = rig.open(runtime_config).await;
    let conversation = runtime.create(rig.cwd(), config).await.unwrap();
    let mut watch = watch(&conversation).await;
    conversation
        .send("work on the files", Vec::new())
        .await
        .unwrap();
    let finished = tokio::time::timeout(PATIENCE, async {
        loop {
            match watch.next().await {
                Received::Update(Update::Event { event }) => match &event.kind {
                    EventKind::TurnCompleted { .. } => return,
                    EventKind::TurnFailed { .. } => panic!("the turn failed: {event:?}"),
                    _ => {}
                },
                Received::Closed => panic!("the conversation stopped"),
                _ => {}
            }
        }
    })
    .await;
    assert!(finished.is_ok(), "the turn did not end within {PATIENCE:?}");
    assert_paired(&conversation).await;

    let logged = results_by_id(&log(&runtime, &conversation).await);
    assert_eq!(logged.len(), n_calls, "{logged:#?}");
    let records = rig.mock.wait_ended(2).await;
    assert_eq!(
        sent_results(&records[1]),
        logged,
        "the model is sent exactly what the log holds"
    );
    logged
}

fn ok(results: &BTreeMap<String, (String, bool)>, id: &str) -> String {
    let (content, is_error) = &results[id];
    assert!(!is_error, "{id} should succeed: {content}");
    content.clone()
}

fn error(results: &BTreeMap<String, (String, bool)>, id: &str) -> String {
    let (content, is_error) = &results[id];
    assert!(is_error, "{id} should fail: {content}");
    content.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_file_tool_does_its_work_through_the_runtime() {
    let rig = Rig::new();
    let cwd = rig.cwd();
    std::fs::create_dir_all(cwd.join("src")).unwrap();
    std::fs::write(cwd.join("src/main.rs"), "fn main() {\n    greet();\n}\n").unwrap();
    std::fs::create_dir_all(cwd.join("target")).unwrap();
    std::fs::write(cwd.join("target/built.rs"), "fn greet() {}\n").unwrap();
    std::fs::write(cwd.join(".gitignore"), "target/\n").unwrap();

    let results = run_calls(
        &rig,
        config(),
        vec![
            call(
                "w",
                "write_file",
                json!({"path": "src/greet.rs", "content": "pub fn greet() {\n    println!(\"hi\");\n}\n"}),
            ),
            call(
                "e",
                "edit_file",
                json!({"path": "src/greet.rs", "old_string": "\"hi\"", "new_string": "\"hello\""}),
            ),
            call("r", "read_file", json!({"path": "src/greet.rs", "offset": 2, "limit": 1})),
            call("g", "glob", json!({"pattern": "**/*.rs"})),
            call("s", "grep", json!({"pattern": "greet\\(\\)", "glob": "*.rs"})),
        ],
    )
    .await;

    assert_eq!(ok(&results, "w"), "created src/greet.rs: 39 bytes, 3 lines");
    assert_eq!(
        ok(&results, "e"),
        "edited src/greet.rs: replaced 1 occurrence (at line 2)"
    );
    assert_eq!(
        ok(&results, "r"),
        "     2\t    println!(\"hello\");\n[limit reached: shown lines 2-2; read on with offset=3]"
    );
    // target/ is .gitignored; .gitignore itself is hidden.
    assert_eq!(ok(&results, "g"), "src/greet.rs\nsrc/main.rs");
    assert_eq!(
        ok(&results, "s"),
        "src/greet.rs:1:pub fn greet() {\nsrc/main.rs:2:    greet();"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.join("src/greet.rs")).unwrap(),
        "pub fn greet() {\n    println!(\"hello\");\n}\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tool_failures_and_schema_violations_reach_the_model_as_errors() {
    let rig = Rig::new();
    let cwd = rig.cwd();
    std::fs::write(cwd.join("twice.txt"), "x = 1;\nx = 1;\n").unwrap();
    std::fs::write(cwd.join("image.bin"), b"\x89PNG\r\n\x1a\n\0\0\0").unwrap();

    let results = run_calls(
        &rig,
        config(),
        vec![
            call(
                "none",
                "edit_file",
                json!({"path": "twice.txt", "old_string": "y = 2;", "new_string": "y = 3;"}),
            ),
            call(
                "several",
                "edit_file",
                json!({"path": "twice.txt", "old_string": "x = 1;", "new_string": "x = 2;"}),
            ),
            call("binary", "read_file", json!({"path": "image.bin"})),
            call("missing", "read_file", json!({"path": "nope.txt"})),
            call("regex", "grep", json!({"pattern": "(unclosed"})),
            call(
                "schema",
                "write_file",
                json!({"path": "new.txt", "contents": "typo"}),
            ),
            call("type", "read_file", json!({"path": ["twice.txt"]})),
        ],
    )
    .await;

    assert!(
        error(&results, "none").contains("old_string was not found in twice.txt (0 matches)"),
        "{results:#?}"
    );
    assert!(
        error(&results, "several")
            .contains("old_string occurs 2 times in twice.txt (at lines 1, 2)"),
        "{results:#?}"
    );
    assert!(error(&results, "binary").contains("image.bin looks binary"));
    assert_eq!(error(&results, "missing"), "nope.txt does not exist");
    assert!(error(&results, "regex").starts_with("bad regular expression"));
    let schema = error(&results, "schema");
    assert!(
        schema.starts_with("the input does not match the write_file tool's schema"),
        "{schema}"
    );
    assert!(schema.contains("missing properties 'content'"), "{schema}");
    assert!(
        schema.contains("\"contents\""),
        "names the stray field: {schema}"
    );
    let wrong_type = error(&results, "type");
    assert!(
        wrong_type.contains("- at /path: want string, but got array"),
        "{wrong_type}"
    );
    // Nothing was changed or created by the failed calls.
    assert_eq!(
        std::fs::read_to_string(cwd.join("twice.txt")).unwrap(),
        "x = 1;\nx = 1;\n"
    );
    assert!(!cwd.join("new.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_escape_the_working_directory_are_refused() {
    let rig = Rig::new();
    let cwd = rig.cwd();
    let outside = cwd.parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink(&outside, cwd.join("link-out")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), cwd.join("secret-link")).unwrap();
    let absolute = outside.join("secret.txt");
    let inside_absolute = cwd.join("inside.txt");

    let results = run_calls(
        &rig,
        config(),
        vec![
            call("dotdot", "read_file", json!({"path": "../outside/secret.txt"})),
            call("absolute", "read_file", json!({"path": absolute})),
            call("symlink", "read_file", json!({"path": "secret-link"})),
            call("through", "write_file", json!({"path": "link-out/planted.txt", "content": "x"})),
            call("edit", "edit_file", json!({"path": "../outside/secret.txt", "old_string": "secret", "new_string": "leaked"})),
            call("grep", "grep", json!({"pattern": "secret", "path": "link-out"})),
            call("glob", "glob", json!({"pattern": "*", "path": ".."})),
            call("inside", "write_file", json!({"path": inside_absolute, "content": "fine\n"})),
        ],
    )
    .await;

    for id in [
        "dotdot", "absolute", "symlink", "through", "edit", "grep", "glob",
    ] {
        let refused = error(&results, id);
        assert!(
            refused.contains("outside the working directory"),
            "{id}: {refused}"
        );
    }
    assert_eq!(
        ok(&results, "inside"),
        "created inside.txt: 5 bytes, 1 line"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "secret\n"
    );
    assert!(!outside.join("planted.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_may_let_its_file_tools_leave_the_working_directory() {
    let rig = Rig::new();
    let cwd = rig.cwd();
    let outside = cwd.parent().unwrap().join("beside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("notes.txt"), "notes beside\n").unwrap();

    let free = ConversationConfig {
        tools_may_leave_cwd: true,
        ..config()
    };
    let results = run_calls(
        &rig,
        free,
        vec![
            call("read", "read_file", json!({"path": "../beside/notes.txt"})),
            call(
                "write",
                "write_file",
                json!({"path": "../beside/more.txt", "content": "more\n"}),
            ),
        ],
    )
    .await;

    // Reading leaves it; writing does not, under the default sandbox
    // (workspace-write: the kernel refuses, docs/sandbox.md).
    assert_eq!(ok(&results, "read"), "     1\tnotes beside\n");
    let refused = error(&results, "write");
    assert!(refused.contains("denied"), "{refused}");
    assert!(!outside.join("more.txt").exists());
}

/// Under a read-only sandbox the file tools write nothing, even in the
/// working directory, and say why; they still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_conversation_s_file_tools_write_nothing() {
    let rig = Rig::new();
    std::fs::write(rig.cwd().join("notes.txt"), "notes\n").unwrap();
    let read_only = ConversationConfig {
        sandbox: Some(keel_actors::core::config::SandboxPolicy {
            mode: keel_actors::core::config::SandboxMode::ReadOnly,
            ..Default::default()
        }),
        ..config()
    };
    let results = run_calls(
        &rig,
        read_only,
        vec![
            call("read", "read_file", json!({"path": "notes.txt"})),
            call(
                "write",
                "write_file",
                json!({"path": "new.txt", "content": "x\n"}),
            ),
            call(
                "edit",
                "edit_file",
                json!({"path": "notes.txt", "old_string": "notes", "new_string": "changed"}),
            ),
        ],
    )
    .await;
    assert_eq!(ok(&results, "read"), "     1\tnotes\n");
    for id in ["write", "edit"] {
        let refused = error(&results, id);
        assert!(refused.contains("read-only"), "{id}: {refused}");
    }
    assert!(!rig.cwd().join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(rig.cwd().join("notes.txt")).unwrap(),
        "notes\n"
    );
}

/// The real `edit_file`, except that after making its edit it never
/// returns: the runtime is then crashed with the edit made and no result
/// recorded, as when the process dies between the two.
struct EditThenHang;

#[async_trait::async_trait]
impl Tool for EditThenHang {
    fn spec(&self) -> ToolSpec {
        EditFile.spec()
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        let _made = EditFile.run(ctx).await;
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_run_again_by_recovery_is_reported_as_already_applied() {
    let rig = Rig::new();
    let path = rig.cwd().join("config.toml");
    std::fs::write(&path, "retries = 1\n").unwrap();
    let edit = call(
        "toolu_edit",
        "edit_file",
        json!({"path": "config.toml", "old_string": "retries = 1", "new_string": "retries = 1\ntimeout = 5"}),
    );
    rig.mock
        .push_script(json!([
            {"endpoint": "anthropic", "tool_calls": [edit]},
            {"endpoint": "anthropic", "text": "done"},
        ]))
        .await;
    let id = {
        let mut tools = ToolRegistry::with_defaults();
        tools.register(EditThenHang);
        let runtime = rig
            .open(RuntimeConfig {
                tools,
                ..rig.runtime_config(rig.store(BackendKind::Redb))
            })
            .await;
        let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
        conversation
            .send("add a timeout", Vec::new())
            .await
            .unwrap();
        eventually("the first run made the edit", || {
            std::fs::read_to_string(&path).is_ok_and(|text| text.contains("timeout"))
        })
        .await;
        let id = conversation.id().clone();
        drop(conversation);
        runtime.crash().await;
        id
    };

    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let conversation = runtime.handle(id);
    let mut watch = watch(&conversation).await;
    watch.reach(StateName::Idle).await;
    let results = results_by_id(&log(&runtime, &conversation).await);
    let again = ok(&results, "toolu_edit");
    assert!(again.contains("already has this edit"), "{again}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "retries = 1\ntimeout = 5\n",
        "the edit was made once"
    );
    assert_paired(&conversation).await;
    drop(watch);
    drop(conversation);
    runtime.shutdown().await;
}

/// A kernel without Landlock (the runtime told so, as its probe would
/// find): nothing runs unconfined silently. `bash` and the file tools get
/// an error result that says so and names the setting that would let them
/// run unconfined, nothing is written, and the turn completes; a
/// `full-access` conversation, where the operator allows it, runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_that_cannot_confine_fails_closed() {
    use keel_actors::core::config::{SandboxMode, SandboxPolicy};
    use keel_actors::sandbox::Protections;
    use keel_actors::tool_sandbox::SandboxSettings;

    // A rig per run: each counts its fake provider's requests from the
    // start.
    let without_landlock = |rig: &Rig, allow_full_access: bool| RuntimeConfig {
        sandbox: SandboxSettings {
            data_dir: Some(rig.data_dir()),
            allow_full_access,
            protections: Some(Protections {
                landlock_abi: None,
                seccomp: true,
            }),
            ..SandboxSettings::default()
        },
        ..rig.runtime_config(rig.store(BackendKind::Memory))
    };
    let calls = || {
        vec![
            call("bash", "bash", json!({"command": "echo ran > ran.txt"})),
            call(
                "write",
                "write_file",
                json!({"path": "written.txt", "content": "x\n"}),
            ),
            call("read", "read_file", json!({"path": "."})),
        ]
    };
    let rig = Rig::new();
    let results = run_calls_on(&rig, without_landlock(&rig, false), config(), calls()).await;
    for id in ["bash", "write", "read"] {
        let refused = error(&results, id);
        assert!(refused.contains("no Landlock"), "{id}: {refused}");
        assert!(
            refused.contains("KEEL_SANDBOX_FULL_ACCESS=allow"),
            "{id} names the setting: {refused}"
        );
    }
    assert!(!rig.cwd().join("ran.txt").exists());
    assert!(!rig.cwd().join("written.txt").exists());

    let unconfined = ConversationConfig {
        sandbox: Some(SandboxPolicy {
            mode: SandboxMode::FullAccess,
            ..SandboxPolicy::default()
        }),
        ..config()
    };
    // Full access the operator did not allow is refused too.
    let rig = Rig::new();
    let results = run_calls_on(
        &rig,
        without_landlock(&rig, false),
        unconfined.clone(),
        calls(),
    )
    .await;
    assert!(error(&results, "bash").contains("does not allow"));
    assert!(!rig.cwd().join("ran.txt").exists());

    let rig = Rig::new();
    let results = run_calls_on(&rig, without_landlock(&rig, true), unconfined, calls()).await;
    assert_eq!(ok(&results, "bash"), "(no output)");
    assert!(rig.cwd().join("ran.txt").exists());
    assert!(ok(&results, "write").starts_with("created "));
}

/// Spawned straight from the runtime (no spawner process, so no namespace
/// of its own), a confined call still has its private temporary directory
/// and nothing else to write outside its working directory, and the
/// directory is emptied once the call is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confined_call_writes_its_own_temporary_directory() {
    let rig = Rig::new();
    let results = run_calls(
        &rig,
        config(),
        vec![
            call(
                "tmp",
                "bash",
                json!({"command": "echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo \"$TMPDIR\" > tmpdir"}),
            ),
            call("slash-tmp", "bash", json!({"command": "echo x > /tmp/keel-escape-test"})),
        ],
    )
    .await;
    assert!(ok(&results, "tmp").starts_with("t\n"));
    // Kept for a later call, emptied.
    let tmpdir = std::fs::read_to_string(rig.cwd().join("tmpdir")).unwrap();
    let left: Vec<_> = std::fs::read_dir(tmpdir.trim())
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{tmpdir} emptied: {left:?}");
    assert!(error(&results, "slash-tmp").contains("denied"));
    assert!(!std::path::Path::new("/tmp/keel-escape-test").exists());
}
