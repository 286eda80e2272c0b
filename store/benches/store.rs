#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Benchmarks of keel-store (see the keel-store section of docs/benchmarks.md at
//! the workspace root).
//!
//! - `fsync/raw/{sync_all,sync_data}`: the physical limit: append 256 bytes
//!   to a file and make them durable.
//! - `append/single/{backend}`: one writer, one ~300-byte event per append,
//!   each awaited until durable: latency per append.
//! - `append/concurrent/{backend}/{writers}`: that many tokio tasks, each
//!   appending to its own conversation in a loop; throughput in durable
//!   events per second (one "iteration" is one event from every writer).
//! - `rebuild/10k/{backend}`: `read_all` + `WorkingSet::replay_owned` of a
//!   10,000-event conversation (what `rehydrate` does);
//!   `rebuild/read_all_10k/{backend}` is the read alone;
//!   `rebuild/10k_open/{backend}` also opens the store first (a restart).
//!   `read_all` is awaited on a tokio runtime, so the read runs on its
//!   blocking pool and the figures include that hand-off, as in the runtime.
//!
//! With `KEEL_BENCH_DATABASE_URL` set, every group also runs on PostgreSQL
//! (`postgres`), in that database (keel's table in it is emptied first):
//! a server of the user's, with its own durability settings, since a
//! figure from a server that does not fsync says nothing (docs/postgres.md).
//!
//! Data directories live under cargo's target tmp dir, on the same disk as
//! the repository. Setup (creating conversations, filling logs) happens
//! outside the timed sections; the logs' text comes from keel-test-support's
//! `text` (the `WORDS` vocabulary), seeded, so every run writes the same.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use keel_core::codec;
use keel_core::{ConversationId, Event, EventKind, WorkingSet};
use keel_store::{open_memory, open_redb, open_sled, EventLog};
use keel_test_support::text::{Rng, WORDS};
use tempfile::TempDir;
use tokio::runtime::Runtime;

mod support;
use support::{created, event, realistic_log};

/// Encoded size of the events `append/*` writes.
const APPEND_EVENT_BYTES: usize = 300;

/// Events in the `rebuild` log.
const LOG_EVENTS: usize = 10_000;

/// Events per append while filling the `rebuild` log (setup only).
const FILL_BATCH: usize = 100;

const BACKENDS: [&str; 3] = ["sled", "redb", "memory"];

/// The PostgreSQL database to run on too, if any.
const DATABASE_ENV: &str = "KEEL_BENCH_DATABASE_URL";

/// The backends this run measures: [`BACKENDS`], and `postgres` when
/// [`DATABASE_ENV`] names a database.
fn backends() -> Vec<&'static str> {
    let mut all = BACKENDS.to_vec();
    if std::env::var_os(DATABASE_ENV).is_some() {
        all.push("postgres");
    }
    all
}

const WRITERS: [usize; 3] = [1, 100, 1_000];

/// Distinct conversation ids across the whole run.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn fresh_id(prefix: &str) -> ConversationId {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    ConversationId::new(format!("{prefix}-{n}")).unwrap()
}

fn scratch() -> TempDir {
    TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A store as it was left: `open` again for the embedded engines, and
/// the same database, not emptied, for PostgreSQL.
fn reopen(backend: &str, dir: &Path) -> Arc<dyn EventLog> {
    match backend {
        "postgres" => {
            Arc::new(keel_store::open_postgres(&std::env::var(DATABASE_ENV).unwrap()).unwrap())
        }
        _ => open(backend, dir),
    }
}

/// A fresh store of `backend`.
fn open(backend: &str, dir: &Path) -> Arc<dyn EventLog> {
    match backend {
        "sled" => Arc::new(open_sled(dir).unwrap()),
        "redb" => Arc::new(open_redb(dir).unwrap()),
        "memory" => Arc::new(open_memory().unwrap()),
        "postgres" => {
            let url = std::env::var(DATABASE_ENV).unwrap();
            empty_postgres(&url);
            Arc::new(keel_store::open_postgres(&url).unwrap())
        }
        other => panic!("unknown backend {other}"),
    }
}

/// Drops keel's tables in the database at `url`, so a run starts on an
/// empty one as on a fresh directory.
fn empty_postgres(url: &str) {
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let connection = tokio::spawn(connection);
        client
            .batch_execute("DROP TABLE IF EXISTS keel_kv; DROP TABLE IF EXISTS keel_schema;")
            .await
            .unwrap();
        drop(client);
        connection.await.unwrap().unwrap();
    });
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A user message whose encoded record is about `APPEND_EVENT_BYTES` long.
struct SizedMessage {
    text: String,
}

impl SizedMessage {
    fn new() -> SizedMessage {
        let probe = |text: String| {
            codec::encode(&event(
                1_000_000,
                None,
                true,
                EventKind::UserMessage {
                    text,
                    images: Vec::new(),
                },
            ))
            .len()
        };
        // A newline is escaped to two bytes in JSON: spaces keep the size
        // exact. The text's length prefix may grow with the text (in
        // MessagePack, one byte up to 31 bytes, two up to 255, three
        // beyond), so shrink the text by whatever the record overshoots.
        let mut len = APPEND_EVENT_BYTES - probe(String::new());
        loop {
            let text = Rng::new(7).text(WORDS, len, len).replace('\n', " ");
            let size = probe(text.clone());
            if size == APPEND_EVENT_BYTES {
                return SizedMessage { text };
            }
            assert!(size > APPEND_EVENT_BYTES, "{size} bytes for {len}");
            len -= size - APPEND_EVENT_BYTES;
        }
    }

    fn at(&self, seq: u64) -> Event {
        event(
            seq,
            None,
            true,
            EventKind::UserMessage {
                text: self.text.clone(),
                images: Vec::new(),
            },
        )
    }
}

fn fsync_raw(c: &mut Criterion) {
    let mut group = c.benchmark_group("fsync/raw");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(3));
    let dir = scratch();
    let record = [b'x'; 256];
    for (name, data_only) in [("sync_all", false), ("sync_data", true)] {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join(name))
            .unwrap();
        group.bench_function(name, |b| {
            b.iter(|| {
                file.write_all(&record).unwrap();
                if data_only {
                    file.sync_data().unwrap();
                } else {
                    file.sync_all().unwrap();
                }
            })
        });
    }
    group.finish();
}

fn append_single(c: &mut Criterion) {
    let rt = runtime();
    let message = SizedMessage::new();
    let mut group = c.benchmark_group("append/single");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    for backend in backends() {
        let dir = scratch();
        let store = open(backend, dir.path());
        let id = fresh_id("single");
        rt.block_on(store.append(&id, vec![created(&id)])).unwrap();
        let mut next = 2u64;
        group.bench_function(backend, |b| {
            b.iter_custom(|iters| {
                let events: Vec<Event> = (0..iters).map(|i| message.at(next + i)).collect();
                next += iters;
                rt.block_on(async {
                    let start = Instant::now();
                    for event in events {
                        store.append(&id, vec![event]).await.unwrap();
                    }
                    start.elapsed()
                })
            })
        });
        drop(store);
    }
    group.finish();
}

fn append_concurrent(c: &mut Criterion) {
    let rt = runtime();
    let message = Arc::new(SizedMessage::new());
    let mut group = c.benchmark_group("append/concurrent");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for backend in backends() {
        let dir = scratch();
        let store = open(backend, dir.path());
        for writers in WRITERS {
            // One iteration: every writer appends one durable event.
            group.throughput(Throughput::Elements(writers as u64));
            group.bench_with_input(BenchmarkId::new(backend, writers), &writers, |b, &n| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        // Setup, untimed: n new conversations, each created.
                        let ids: Vec<ConversationId> =
                            (0..n).map(|_| fresh_id("concurrent")).collect();
                        let mut creating = Vec::with_capacity(n);
                        for id in &ids {
                            let store = Arc::clone(&store);
                            let id = id.clone();
                            creating.push(tokio::spawn(async move {
                                store.append(&id, vec![created(&id)]).await.unwrap();
                            }));
                        }
                        for task in creating {
                            task.await.unwrap();
                        }

                        let start = Instant::now();
                        let mut writing = Vec::with_capacity(n);
                        for id in ids {
                            let store = Arc::clone(&store);
                            let message = Arc::clone(&message);
                            writing.push(tokio::spawn(async move {
                                for seq in 2..iters + 2 {
                                    store.append(&id, vec![message.at(seq)]).await.unwrap();
                                }
                            }));
                        }
                        for task in writing {
                            task.await.unwrap();
                        }
                        start.elapsed()
                    })
                })
            });
        }
        drop(store);
    }
    group.finish();
}

fn rebuild(c: &mut Criterion) {
    let rt = runtime();
    let id = ConversationId::new("rebuild-10k").unwrap();
    let log = realistic_log(&id, LOG_EVENTS);
    let bytes: usize = log.iter().map(|event| codec::encode(event).len()).sum();
    eprintln!(
        "rebuild log: {} events, {} bytes encoded ({} bytes/event on average)",
        log.len(),
        bytes,
        bytes / log.len()
    );
    let expected = WorkingSet::replay(&log).unwrap();

    let mut group = c.benchmark_group("rebuild");
    // Tens of milliseconds per iteration: flat sampling keeps the run short.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    let mut dirs = Vec::new();
    for backend in backends() {
        let dir = scratch();
        let store = open(backend, dir.path());
        rt.block_on(async {
            for chunk in log.chunks(FILL_BATCH) {
                store.append(&id, chunk.to_vec()).await.unwrap();
            }
        });
        let rebuilt = WorkingSet::replay(&rt.block_on(store.read_all(&id)).unwrap()).unwrap();
        assert_eq!(rebuilt, expected);

        group.bench_function(BenchmarkId::new("10k", backend), |b| {
            b.iter(|| {
                let events = rt.block_on(store.read_all(black_box(&id))).unwrap();
                WorkingSet::replay_owned(events).unwrap()
            })
        });
        group.bench_function(BenchmarkId::new("read_all_10k", backend), |b| {
            b.iter(|| rt.block_on(store.read_all(black_box(&id))).unwrap())
        });
        drop(store);
        dirs.push((backend, dir));
    }
    // A restart: open the store, then rebuild (the OS page cache stays warm).
    for (backend, dir) in dirs.iter().filter(|(backend, _)| *backend != "memory") {
        group.bench_function(BenchmarkId::new("10k_open", backend), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let store = reopen(backend, dir.path());
                    let events = rt.block_on(store.read_all(&id)).unwrap();
                    black_box(WorkingSet::replay_owned(events).unwrap());
                    total += start.elapsed();
                    drop(store);
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    fsync_raw,
    append_single,
    append_concurrent,
    rebuild
);
criterion_main!(benches);
