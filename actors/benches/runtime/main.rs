#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Benchmarks of the actor runtime (see the `actors` section of docs/benchmarks.md
//! at the workspace root). Run them with
//!
//! ```text
//! cargo bench -p keel-actors --bench runtime
//! KEEL_BENCH_QUICK=1 cargo bench -p keel-actors --bench runtime   # smoke run
//! ```
//!
//! A plain `main`, not criterion: the targets are percentiles of one-off
//! operations (a cold start, a cancel), so every sample is kept and the
//! table gives n, mean, p50, p90, p99 and max.
//!
//! - **warm `ensure_started`**: `Runtime::open_conversation` on a live
//!   conversation (registry lookup and a handle), and for context a full
//!   `inspect()` round trip through the actor's mailbox, which clones the
//!   history it returns.
//! - **cold start**: a conversation with about 1,000 events of history,
//!   evicted; timed from `open_conversation` (rehydrate: read, decode,
//!   replay, snapshot check) to the answer of one `inspect()`, which the
//!   actor gives only after `Input::Started` (a durable `SessionStarted`).
//!   On sled and on redb (the default).
//! - **memory per live idle conversation**: heap bytes in use (a counting
//!   global allocator) before and after opening 2,000 conversations with a
//!   short history (about 3 turns), on redb on disk: just opened, and after
//!   the short-idle tier. For context: the same with no history, the
//!   replayed `Conversation` alone, and a trivial ractor actor.
//! - **cancel to idle**: a conversation running a real `bash` process tree
//!   (`sleep 30 & sleep 30 & wait`), timed from `cancel()` to its answer
//!   (`Idle`) and to the moment the process group is gone.
//!
//! Every log is written straight to the store with `EventLog::append` and
//! checked with the reducer first; no LLM is called. Logs and conversations
//! are built before the clock starts. Data directories are `tempfile`
//! directories under cargo's target tmp dir, on the same disk as the
//! repository. A full run takes about 20 s after the build.
//!
//! One module a benchmark (`warm`, `cold`, `memory`, `cancel`); the logs
//! they start from are built in `logs` (their text from keel-test-support's
//! `text`), and `plumbing` holds the runtime, ids, directories and the
//! table the figures are printed in.

use std::alloc::System;
use std::time::Instant;

use cap::Cap;
use keel_actors::store::BackendKind;
use keel_test_support::load_average;

mod cancel;
mod cold;
mod logs;
mod memory;
mod plumbing;
mod warm;

use cancel::cancel;
use cold::cold;
use memory::memory;
use plumbing::print_header;
use warm::warm;

/// Counts every live heap byte of the process (the size each allocation
/// asked for; the allocator's own overhead is not included). It costs one
/// atomic add per allocation and free, in every figure here.
#[global_allocator]
pub(crate) static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// Events of history for the cold start (whole turns, so a few more).
pub(crate) const LONG_EVENTS: usize = 1_000;

/// Events of history of a "short" conversation (whole turns: about 3).
pub(crate) const SHORT_EVENTS: usize = 20;

/// Sample counts; `KEEL_BENCH_QUICK=1` selects the small set.
pub(crate) struct Counts {
    pub(crate) warm_open: usize,
    pub(crate) warm_inspect: usize,
    pub(crate) cold: usize,
    /// Conversations the cold starts rotate over, so that the events each
    /// cold start appends (`SessionStarted`, then `SessionEnded` on
    /// eviction) grow each log by only a few percent.
    pub(crate) cold_conversations: usize,
    pub(crate) memory: usize,
    pub(crate) cancel: usize,
}

const FULL: Counts = Counts {
    warm_open: 200_000,
    warm_inspect: 20_000,
    cold: 500,
    cold_conversations: 20,
    memory: 2_000,
    cancel: 200,
};

const QUICK: Counts = Counts {
    warm_open: 20_000,
    warm_inspect: 2_000,
    cold: 40,
    cold_conversations: 4,
    memory: 200,
    cancel: 10,
};

fn main() {
    let quick =
        std::env::var("KEEL_BENCH_QUICK").is_ok_and(|value| !value.is_empty() && value != "0");
    let counts = if quick { QUICK } else { FULL };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    println!(
        "keel-actors runtime benchmarks ({}); load average at start: {}",
        if quick {
            "KEEL_BENCH_QUICK"
        } else {
            "full run"
        },
        load_average()
    );
    // The measuring code runs on this thread (`block_on`); the actors run on
    // the runtime's worker threads, one per core. Memory goes first, while
    // nothing else has run in the process.
    tokio.block_on(async {
        memory(&counts).await;
        println!();
        print_header();
        warm(&counts).await;
        cold(&counts, BackendKind::Sled).await;
        cold(&counts, BackendKind::Redb).await;
        cancel(&counts).await;
    });
    println!(
        "\nload average at end: {}; {:.1} s in all",
        load_average(),
        started.elapsed().as_secs_f64()
    );
}
