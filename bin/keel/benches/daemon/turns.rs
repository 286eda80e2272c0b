//! Part 3: CPU per tool turn, over HTTP + SSE against the library in
//! this process.

use super::client::{Api, Sse};
use super::processes::{self_cpu_seconds, Daemon};
use super::*;

pub(crate) struct Turns {
    pub(crate) cpu_ms: f64,
    pub(crate) wall_ms: f64,
}

/// The script of one turn: a `bash` call, then a text once it has run.
pub(crate) fn script(turns: usize) -> Value {
    let mut entries = Vec::with_capacity(turns * 2);
    for _ in 0..turns {
        entries.push(json!({"tool_calls": [{"name": "bash", "input": {"command": "true"}}]}));
        entries.push(json!({"text": "It ran."}));
    }
    Value::Array(entries)
}

pub(crate) async fn http_turns(mock_url: &str, sizes: &Sizes) -> Turns {
    let daemon = Daemon::start(mock_url);
    let api = Api::new(&daemon);
    let mut ids = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..sizes.turn_conversations {
        let id = api.create().await;
        streams.push(Sse::open(daemon.addr, &id).await);
        ids.push(id);
    }
    let warm_up = sizes.turn_conversations;
    push_script(mock_url, &script(warm_up + sizes.turns)).await;
    let mut tool_results = 0;
    for (id, sse) in ids.iter().zip(&mut streams) {
        api.send(id, "run the tool").await;
        tool_results += sse.until_turn_completed().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let cpu_before = daemon.cpu_seconds();
    let started = Instant::now();
    for turn in 0..sizes.turns {
        let at = turn % ids.len();
        api.send(&ids[at], "run the tool").await;
        tool_results += streams[at].until_turn_completed().await;
    }
    let wall = started.elapsed();
    let cpu = daemon.cpu_seconds() - cpu_before;
    assert_eq!(
        tool_results,
        warm_up + sizes.turns,
        "one tool result a turn"
    );
    assert_script_used(mock_url).await;
    Turns {
        cpu_ms: cpu * 1000.0 / sizes.turns as f64,
        wall_ms: wall.as_secs_f64() * 1000.0 / sizes.turns as f64,
    }
}

/// The same turns through the library, in this process, on a runtime set
/// up as `keel serve` sets up its own, with the telemetry `keel serve`
/// installs (the tracing subscriber filtered by `RUST_LOG`, logging to
/// stderr as the daemon's does, and the Prometheus recorder): what the
/// comparison leaves is the HTTP layer's own cost, not the logging and
/// metrics every embedder may install as well.
pub(crate) fn library_turns(mock_url: &str, sizes: &Sizes) -> Turns {
    install_daemon_telemetry();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let figures = tokio.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let config = RuntimeConfig {
            store: store::open(BackendKind::Redb, &data, None).unwrap(),
            providers: ProviderConfig {
                mock_url: Some(mock_url.to_owned()),
                ..ProviderConfig::default()
            },
            tools: ToolRegistry::with_defaults(),
            process_dir: Some(data.join("processes")),
            // As `keel serve` does, so that the two sides spawn alike.
            spawner: Some(keel_actors::spawner::SpawnerCommand {
                program: env!("CARGO_BIN_EXE_keel").into(),
                args: vec!["spawner".into()],
                hide: None,
            }),
            settings: Settings::default(),
            mcp_servers: Default::default(),
            sandbox: keel_actors::tool_sandbox::SandboxSettings {
                data_dir: Some(data.clone()),
                ..Default::default()
            },
        };
        let (runtime, _) = Runtime::open(config).await.unwrap();
        let conversation_config = ConversationConfig {
            primary: ModelRef {
                provider: ProviderKind::Mock,
                model: "mock".to_owned(),
            },
            ..ConversationConfig::default()
        };
        let mut conversations = Vec::new();
        for _ in 0..sizes.turn_conversations {
            let handle = runtime
                .create(&work, conversation_config.clone())
                .await
                .unwrap();
            let subscription = handle.subscribe().await.unwrap();
            conversations.push((handle, subscription));
        }
        let warm_up = sizes.turn_conversations;
        push_script(mock_url, &script(warm_up + sizes.turns)).await;
        let mut tool_results = 0;
        for (handle, subscription) in &mut conversations {
            tool_results += library_turn(handle, subscription).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;

        let cpu_before = self_cpu_seconds();
        let started = Instant::now();
        for turn in 0..sizes.turns {
            let at = turn % conversations.len();
            let (handle, subscription) = &mut conversations[at];
            tool_results += library_turn(handle, subscription).await;
        }
        let wall = started.elapsed();
        let cpu = self_cpu_seconds() - cpu_before;
        assert_eq!(
            tool_results,
            warm_up + sizes.turns,
            "one tool result a turn"
        );
        assert_script_used(mock_url).await;
        drop(conversations);
        runtime.shutdown().await;
        Turns {
            cpu_ms: cpu * 1000.0 / sizes.turns as f64,
            wall_ms: wall.as_secs_f64() * 1000.0 / sizes.turns as f64,
        }
    });
    drop(tokio);
    figures
}

/// Install `keel serve`'s tracing subscriber and metrics recorder in this
/// process, once (both are process-global). The HTTP client side of the
/// bench emits no spans or metrics, so only the library rounds pay for it.
pub(crate) fn install_daemon_telemetry() {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        let guard = keel_daemon::telemetry::init_tracing(keel_daemon::telemetry::LogFormat::Plain)
            .expect("install the daemon's tracing subscriber");
        // Kept for the life of the process, as the daemon keeps its own.
        std::mem::forget(guard);
        let _metrics =
            keel_daemon::telemetry::install_metrics().expect("install the metrics recorder");
    });
}

/// One turn through the library; returns how many tool results it had.
pub(crate) async fn library_turn(
    handle: &ConversationHandle,
    subscription: &mut keel_actors::Subscription,
) -> usize {
    handle.send("run the tool", Vec::new()).await.unwrap();
    let mut tool_results = 0;
    loop {
        match subscription.next().await {
            Received::Update(Update::Event { event }) => match event.kind {
                EventKind::ToolResult { .. } => tool_results += 1,
                EventKind::TurnCompleted { .. } => return tool_results,
                EventKind::TurnFailed { .. } | EventKind::TurnInterrupted { .. } => {
                    panic!("the turn did not complete: {event:?}")
                }
                _ => {}
            },
            Received::Closed => panic!("the conversation stopped"),
            _ => {}
        }
    }
}

pub(crate) async fn push_script(mock_url: &str, script: &Value) {
    let response = keel_api::http::client()
        .post(format!("{mock_url}/_mock/script"))
        .json(script)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "the mock took no script");
}

/// Every scripted answer was taken: each turn had its tool call and text.
pub(crate) async fn assert_script_used(mock_url: &str) {
    let script: Value = keel_api::http::client()
        .get(format!("{mock_url}/_mock/script"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(script["pending"], json!([]), "scripted answers left over");
}
