//! Embedding keel: open a runtime over a store, register a custom tool,
//! create a conversation, follow its live updates and send it a message.
//!
//! With the fake provider (no API key needed), in two shells:
//!
//! ```text
//! cargo run -- mock-llm --port 7778
//! KEEL_MOCK_URL=http://127.0.0.1:7778 cargo run -p keel-actors --example embed -- "run: ls | head -3"
//! ```
//!
//! With a real provider: `KEEL_PROVIDER=anthropic KEEL_MODEL=claude-sonnet-4-5
//! ANTHROPIC_API_KEY=… cargo run -p keel-actors --example embed -- "hello"`
//! (or `openai` with `OPENAI_API_KEY` / `OPENAI_BASE_URL`).

use std::process::ExitCode;
use std::sync::Arc;

use keel_actors::core::config::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::core::event::EventKind;
use keel_actors::core::wire::ToolSpec;
use keel_actors::core::{LiveEvent, StateName, StreamDelta};
use keel_actors::store::{self, BackendKind};
use keel_actors::tool::{Tool, ToolContext, ToolOutcome, ToolRegistry};
use keel_actors::{Received, Runtime, RuntimeConfig, Update};

/// A custom tool: counts the words of its input. Any `Tool` registered with
/// the runtime is offered to the model beside `bash`.
struct WordCount;

#[async_trait::async_trait]
impl Tool for WordCount {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "word_count".to_owned(),
            description: "Count the words of a text.".to_owned(),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"]
            }),
        }
    }

    async fn run(&self, context: ToolContext) -> ToolOutcome {
        match context
            .call
            .input
            .get("text")
            .and_then(|text| text.as_str())
        {
            Some(text) => ToolOutcome::ok(text.split_whitespace().count().to_string()),
            None => ToolOutcome::error("word_count needs {\"text\": string}"),
        }
    }
}

fn model_from_env() -> Result<ModelRef, String> {
    let provider = match std::env::var("KEEL_PROVIDER").as_deref() {
        Ok("anthropic") => ProviderKind::Anthropic,
        Ok("openai") => ProviderKind::OpenAi,
        Ok("mock") | Err(_) => {
            if std::env::var("KEEL_MOCK_URL").is_err() {
                return Err("set KEEL_MOCK_URL to a running `keel mock-llm` (see the example's header), or KEEL_PROVIDER=anthropic|openai".to_owned());
            }
            ProviderKind::Mock
        }
        Ok(other) => return Err(format!("unknown KEEL_PROVIDER {other:?}")),
    };
    let model = std::env::var("KEEL_MODEL").unwrap_or_else(|_| "mock".to_owned());
    Ok(ModelRef { provider, model })
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let text = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "run: echo hello from bash".to_owned());
    let primary = model_from_env()?;

    // The store: redb in a scratch directory (a daemon uses KEEL_DATA_DIR).
    let data = tempfile::tempdir()?;
    let store = store::open(BackendKind::Redb, data.path())?;

    let mut tools = ToolRegistry::with_defaults();
    tools.register(WordCount);
    let mut config = RuntimeConfig::new(Arc::clone(&store))?;
    config.tools = tools;
    config.process_dir = Some(data.path().join("processes"));
    let (runtime, _boot) = Runtime::open(config).await?;

    let conversation = runtime
        .create(
            std::env::current_dir()?,
            ConversationConfig {
                primary,
                ..ConversationConfig::default()
            },
        )
        .await?;
    println!("conversation {}", conversation.id());

    // Subscribe before sending, so nothing is missed.
    let mut updates = conversation.subscribe().await?;
    let sent = conversation.send(text.clone(), Vec::new()).await?;
    println!("> {text}   ({sent})");

    let mut busy = false;
    loop {
        match updates.next().await {
            Received::Update(Update::Live { event }) => match event {
                LiveEvent::Delta {
                    delta: StreamDelta::Text { text },
                    ..
                } => print!("{text}"),
                LiveEvent::ToolOutput { chunk, .. } => print!("  | {chunk}"),
                LiveEvent::Retrying {
                    retry,
                    max_retries,
                    delay_ms,
                    error,
                    ..
                } => println!("\n[retrying in {delay_ms} ms ({retry} of {max_retries}): {error}]"),
                LiveEvent::StateChanged { state } => {
                    println!("\n[{state}]");
                    match state {
                        StateName::Idle | StateName::Error => {
                            if busy {
                                break;
                            }
                        }
                        _ => busy = true,
                    }
                }
                _ => {}
            },
            Received::Update(Update::Event { event }) => {
                if let EventKind::ToolResult { content, .. } = &event.kind {
                    println!("\n[tool result] {}", content.trim_end());
                }
            }
            Received::Lagged { missed } => {
                println!("\n[missed {missed} live updates; the events follow from the log]")
            }
            Received::CatchUpFailed { error } => println!("\n[could not read the log: {error}]"),
            Received::Closed => break,
        }
    }

    let inspection = conversation.inspect().await?;
    println!(
        "state {}, {} messages, {} events in the log",
        inspection.state,
        inspection.messages.len(),
        inspection.last_seq
    );
    if let Some(error) = inspection.error {
        println!("error: {error}");
    }
    drop(updates);
    drop(conversation);
    runtime.shutdown().await;
    Ok(())
}
