//! 1. Warm `ensure_started`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use keel_actors::core::StateName;
use keel_actors::store::{self, BackendKind};
use keel_actors::{ConversationHandle, Settings};

use crate::logs::{history, seed};
use crate::plumbing::{fresh_id, open_runtime, print_row, scratch, workdir};
use crate::{Counts, LONG_EVENTS, SHORT_EVENTS};

pub(crate) async fn warm(counts: &Counts) {
    let dir = scratch();
    let store = store::open(BackendKind::Redb, &dir.path().join("data"), None).unwrap();
    let runtime = open_runtime(store.clone(), dir.path(), Settings::default()).await;
    let cwd = workdir(dir.path(), "work");
    let short = fresh_id("warm-short");
    let long = fresh_id("warm-long");
    seed(store.as_ref(), &history(&short, &cwd, SHORT_EVENTS, 1)).await;
    seed(store.as_ref(), &history(&long, &cwd, LONG_EVENTS, 2)).await;
    let short_handle = runtime.open_conversation(&short).await.unwrap();
    let long_handle = runtime.open_conversation(&long).await.unwrap();
    assert_eq!(short_handle.inspect().await.unwrap().state, StateName::Idle);
    assert_eq!(long_handle.inspect().await.unwrap().state, StateName::Idle);

    for _ in 0..counts.warm_open / 10 {
        black_box(runtime.open_conversation(&short).await.unwrap());
    }
    let mut samples = Vec::with_capacity(counts.warm_open);
    for _ in 0..counts.warm_open {
        let start = Instant::now();
        let handle = runtime.open_conversation(&short).await.unwrap();
        samples.push(start.elapsed());
        black_box(handle);
    }
    print_row("warm open_conversation", &samples);

    inspect_rows("warm inspect", &short_handle, &long_handle, counts).await;
    drop((short_handle, long_handle));
    runtime.shutdown().await;

    // With short_idle = 0 a conversation at rest holds no working set, so
    // every message rebuilds it (checkpoint and tail, or the short log)
    // and lets it go again: what that costs, through inspect.
    let settings = Settings {
        short_idle: Duration::ZERO,
        ..Settings::default()
    };
    let runtime = open_runtime(store.clone(), dir.path(), settings).await;
    let short_handle = runtime.open_conversation(&short).await.unwrap();
    let long_handle = runtime.open_conversation(&long).await.unwrap();
    inspect_rows(
        "short_idle = 0: inspect (rebuild)",
        &short_handle,
        &long_handle,
        counts,
    )
    .await;
    assert!(long_handle.inspect().await.unwrap().hibernated);
    drop((short_handle, long_handle));
    runtime.shutdown().await;
}

/// Round trips of `inspect` to a conversation with a short history and to
/// one with 1,000 events.
async fn inspect_rows(
    what: &str,
    short: &ConversationHandle,
    long: &ConversationHandle,
    counts: &Counts,
) {
    for (history, handle, n) in [
        ("short history", short, counts.warm_inspect),
        ("1,000 events", long, counts.warm_inspect / 10),
    ] {
        for _ in 0..n / 10 {
            black_box(handle.inspect().await.unwrap());
        }
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let inspection = handle.inspect().await.unwrap();
            samples.push(start.elapsed());
            black_box(inspection);
        }
        print_row(&format!("{what} ({history})"), &samples);
    }
}
