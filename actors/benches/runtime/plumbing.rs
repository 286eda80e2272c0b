//! Plumbing: ids, directories, the runtime, and the table the figures
//! are printed in.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_actors::core::ConversationId;
use keel_actors::store::EventLog;
use keel_actors::{Runtime, RuntimeConfig, Settings};
use keel_test_support::stats::nearest_rank;
use tempfile::TempDir;

/// Distinct conversation ids across the whole run.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

pub(crate) fn fresh_id(prefix: &str) -> ConversationId {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    ConversationId::new(format!("{prefix}-{n}")).unwrap()
}

pub(crate) fn scratch() -> TempDir {
    TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

pub(crate) fn workdir(root: &Path, name: &str) -> PathBuf {
    let cwd = root.join(name);
    std::fs::create_dir_all(&cwd).unwrap();
    cwd
}

/// A runtime over `store` with its process ledger under `root`. Providers
/// come from the environment; no benchmark makes an LLM request.
pub(crate) async fn open_runtime(
    store: Arc<dyn EventLog>,
    root: &Path,
    settings: Settings,
) -> Runtime {
    let mut config = RuntimeConfig::new(store).unwrap();
    config.process_dir = Some(root.join("processes"));
    config.settings = settings;
    let (runtime, report) = Runtime::open(config).await.unwrap();
    assert!(report.failed.is_empty(), "boot: {:?}", report.failed);
    runtime
}

pub(crate) fn print_header() {
    println!(
        "{:<44} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "benchmark", "n", "mean", "p50", "p90", "p99", "max"
    );
}

pub(crate) fn print_row(name: &str, samples: &[Duration]) {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let mean = sorted.iter().sum::<Duration>() / sorted.len() as u32;
    println!(
        "{:<44} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
        name,
        sorted.len(),
        human(mean),
        human(nearest_rank(&sorted, 0.50)),
        human(nearest_rank(&sorted, 0.90)),
        human(nearest_rank(&sorted, 0.99)),
        human(sorted[sorted.len() - 1]),
    );
}

fn human(duration: Duration) -> String {
    let micros = duration.as_secs_f64() * 1e6;
    if micros < 1_000.0 {
        format!("{micros:.1} µs")
    } else {
        format!("{:.2} ms", micros / 1_000.0)
    }
}
