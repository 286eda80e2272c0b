//! The runtime's tracing spans, as a subscriber sees them: a span per
//! conversation, one per turn under it, and the turn's LLM requests and
//! tools under the turn; the last three carry the OpenTelemetry GenAI
//! attributes (`invoke_agent`, `chat {model}`, `execute_tool {name}`). The
//! same run checks the metrics the daemon exports. Its own test binary,
//! because it installs a global subscriber and metrics recorder (the actors
//! run on the runtime's worker threads).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_actors::core::config::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::core::{LiveEvent, StateName};
use keel_actors::provider::Timeouts;
use keel_actors::store::{self, BackendKind};
use keel_actors::{Received, Runtime, RuntimeConfig, Settings, Update};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::harness::MockLlm;

/// One span: its name, its parent's name, the fields it was opened with
/// and those recorded later (a response's model and usage, say).
#[derive(Debug, Clone)]
struct Opened {
    id: u64,
    name: &'static str,
    parent: Option<u64>,
    fields: Vec<(String, String)>,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Opened>>>);

struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        attrs.record(&mut fields);
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent())
            .map(|parent| parent.id().into_u64());
        self.0.lock().unwrap().push(Opened {
            id: id.into_u64(),
            name: attrs.metadata().name(),
            parent,
            fields: fields.0,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        values.record(&mut fields);
        let mut spans = self.0.lock().unwrap();
        // The registry reuses the ids of closed spans: the live one with
        // this id is the newest.
        if let Some(span) = spans.iter_mut().rev().find(|span| span.id == id.into_u64()) {
            span.fields.extend(fields.0);
        }
    }
}

fn field<'a>(span: &'a Opened, name: &str) -> Option<&'a str> {
    span.fields
        .iter()
        .find(|(field, _)| field == name)
        .map(|(_, value)| value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_requests_and_tools_have_their_spans() {
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .unwrap();
    let metrics = keel_daemon::telemetry::install_metrics().unwrap();

    let mock = MockLlm::start();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let (runtime, _) = Runtime::open(RuntimeConfig {
        store: store::open(BackendKind::Memory, &dir.path().join("data"), None).unwrap(),
        providers: mock.provider_config(Timeouts::default()),
        tools: keel_actors::tool::ToolRegistry::with_defaults(),
        process_dir: None,
        spawner: None,
        settings: Settings::default(),
        mcp_servers: Default::default(),
        sandbox: Default::default(),
    })
    .await
    .unwrap();
    let conversation = runtime
        .create(
            &cwd,
            ConversationConfig {
                primary: ModelRef {
                    provider: ProviderKind::Anthropic,
                    model: "claude-mock".to_owned(),
                },
                ..ConversationConfig::default()
            },
        )
        .await
        .unwrap();
    let mut subscription = conversation.subscribe().await.unwrap();
    conversation.send("run: echo hi", Vec::new()).await.unwrap();
    // The tool call, its result and the summary: back to Idle after a turn.
    let mut left_idle = false;
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match subscription.next().await {
                Received::Update(Update::Live {
                    event: LiveEvent::StateChanged { state },
                }) => {
                    if state != StateName::Idle {
                        left_idle = true;
                    } else if left_idle {
                        break;
                    }
                }
                Received::Closed => panic!("the conversation stopped"),
                _ => {}
            }
        }
    })
    .await;
    assert!(waited.is_ok(), "the turn did not end");
    drop(subscription);
    let id = conversation.id().to_string();
    runtime.shutdown().await;

    let spans = recorder.0.lock().unwrap().clone();
    let by_id = |wanted: u64| spans.iter().find(|span| span.id == wanted);
    let root = spans
        .iter()
        .find(|span| span.name == "conversation" && field(span, "id") == Some(id.as_str()))
        .expect("a span for the conversation");
    let turns: Vec<&Opened> = spans
        .iter()
        .filter(|span| span.name == "turn" && span.parent == Some(root.id))
        .collect();
    assert_eq!(turns.len(), 1, "one turn: {spans:#?}");
    assert_eq!(field(turns[0], "turn"), Some("1"));
    let under_turn = |name: &str| {
        spans
            .iter()
            .filter(|span| span.name == name)
            .filter(|span| span.parent.and_then(by_id).map(|p| p.id) == Some(turns[0].id))
            .count()
    };
    assert_eq!(
        under_turn("llm_request"),
        2,
        "the request that called the tool and the one that summarised it: {spans:#?}"
    );
    assert_eq!(under_turn("tool"), 1, "{spans:#?}");

    // The OpenTelemetry GenAI view of the same spans: their `otel.name`s
    // and a few attributes, set at opening or recorded at the end.
    let turn = turns[0];
    assert_eq!(field(turn, "otel.name"), Some("invoke_agent keel"));
    assert_eq!(field(turn, "gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(field(turn, "gen_ai.agent.name"), Some("keel"));
    assert_eq!(field(turn, "gen_ai.conversation.id"), Some(id.as_str()));
    assert_eq!(field(turn, "keel.turn.outcome"), Some("completed"));
    let chats: Vec<&Opened> = spans
        .iter()
        .filter(|span| span.name == "llm_request" && span.parent == Some(turn.id))
        .collect();
    for chat in &chats {
        assert_eq!(field(chat, "otel.name"), Some("chat claude-mock"));
        assert_eq!(field(chat, "gen_ai.operation.name"), Some("chat"));
        assert_eq!(field(chat, "gen_ai.provider.name"), Some("anthropic"));
        assert_eq!(field(chat, "gen_ai.request.model"), Some("claude-mock"));
        assert_eq!(field(chat, "gen_ai.conversation.id"), Some(id.as_str()));
        assert_eq!(field(chat, "gen_ai.response.model"), Some("claude-mock"));
        assert!(
            field(chat, "gen_ai.usage.output_tokens").is_some(),
            "{chat:#?}"
        );
        assert_eq!(field(chat, "error.type"), None, "{chat:#?}");
    }
    let reasons: Vec<_> = chats
        .iter()
        .map(|chat| field(chat, "gen_ai.response.finish_reasons"))
        .collect();
    assert_eq!(reasons, [Some("tool_use"), Some("end_turn")]);
    let tool = spans
        .iter()
        .find(|span| span.name == "tool" && span.parent == Some(turn.id))
        .expect("the tool's span");
    assert_eq!(field(tool, "otel.name"), Some("execute_tool bash"));
    assert_eq!(field(tool, "gen_ai.operation.name"), Some("execute_tool"));
    assert_eq!(field(tool, "gen_ai.tool.name"), Some("bash"));
    assert_eq!(field(tool, "gen_ai.tool.call.id"), field(tool, "id"));
    assert!(field(tool, "gen_ai.tool.call.id").is_some_and(|id| !id.is_empty()));

    // The metrics of the same run, as Prometheus would scrape them.
    let text = metrics.render();
    for line in [
        r#"keel_turns_total{outcome="completed"} 1"#,
        r#"keel_turn_duration_seconds_count{outcome="completed"} 1"#,
        r#"keel_tool_runs_total{tool="bash",outcome="ok"} 1"#,
        r#"keel_llm_requests_total{provider="anthropic",outcome="ok"} 2"#,
        r#"keel_llm_time_to_first_token_seconds_count{provider="anthropic"} 2"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    let appends = text
        .lines()
        .find_map(|l| l.strip_prefix("keel_append_seconds_count "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(appends.is_some_and(|n| n >= 5), "{text}");
    for quiet in [
        "keel_llm_retries_total",
        "keel_llm_fallbacks_total",
        "keel_cancels_total",
    ] {
        // Registered at zero when the runtime opened, and still zero.
        let zero = format!("{quiet} 0");
        assert!(
            text.lines().any(|line| line == zero),
            "{quiet} is not exported at zero:\n{text}"
        );
    }
}
