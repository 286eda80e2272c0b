//! A process that hosts a keel runtime, for the end-to-end tests that kill
//! it: it opens a runtime over a redb store, creates one conversation, sends
//! it a message and then waits until it is killed. A daemon stands in the
//! same place later; this host is the smallest thing a SIGKILL can hit.
//!
//! ```text
//! keel-runtime-host DATA_DIR MOCK_URL CWD RECOVERY MESSAGE
//! ```
//!
//! `RECOVERY` is `resume` or `idle`. The first line on stdout is
//! `conversation ID` once the message is accepted.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;

use keel_actors::core::config::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::core::RecoveryPolicy;
use keel_actors::provider::{Endpoint, ProviderConfig, Timeouts};
use keel_actors::store::{self, BackendKind};
use keel_actors::tool::ToolRegistry;
use keel_actors::{Runtime, RuntimeConfig, Settings};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data, mock_url, cwd, recovery, message] = args.as_slice() else {
        return Err("usage: keel-runtime-host DATA_DIR MOCK_URL CWD RECOVERY MESSAGE".into());
    };
    let recovery = match recovery.as_str() {
        "resume" => RecoveryPolicy::Resume,
        "idle" => RecoveryPolicy::Idle,
        other => return Err(format!("unknown recovery policy {other:?}").into()),
    };
    let data = PathBuf::from(data);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    tokio.block_on(async {
        let config = RuntimeConfig {
            store: store::open(BackendKind::Redb, &data, None)?,
            providers: ProviderConfig {
                anthropic: Endpoint {
                    base_url: mock_url.clone(),
                    api_key: Some("sk-ant-host".to_owned()),
                },
                openai: Endpoint {
                    base_url: format!("{mock_url}/v1"),
                    api_key: Some("sk-openai-host".to_owned()),
                },
                mock_url: None,
                timeouts: Timeouts::default(),
            },
            tools: ToolRegistry::with_defaults(),
            process_dir: Some(data.join("processes")),
            spawner: None,
            settings: Settings::default(),
            mcp_servers: Default::default(),
            sandbox: keel_actors::tool_sandbox::SandboxSettings {
                data_dir: Some(data.clone()),
                ..Default::default()
            },
        };
        let (runtime, _report) = Runtime::open(config).await?;
        let conversation = runtime
            .create(
                PathBuf::from(cwd),
                ConversationConfig {
                    primary: ModelRef {
                        provider: ProviderKind::Anthropic,
                        model: "claude-mock".to_owned(),
                    },
                    recovery,
                    ..ConversationConfig::default()
                },
            )
            .await?;
        conversation.send(message, Vec::new()).await?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "conversation {}", conversation.id())?;
        stdout.flush()?;
        drop(stdout);
        // Until killed: the test decides when this process dies, and how.
        std::future::pending::<()>().await;
        Ok(())
    })
}
