#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Deleting conversations and reclaiming space (docs/benchmarks.md,
//! "Deleting conversations and reclaiming space"). A plain `main`
//! (`harness = false`), no criterion: each step runs once, on a data
//! directory that the step before it left.
//!
//! For redb and sled: 10,000 conversations of 8 events each (the store
//! bench's realistic log: a user message, a turn with tool calls and
//! results), every tenth with an image of its own (16 KiB of noise) and
//! every hundredth also naming one image all of those share. Then:
//! the data directory's size; every other conversation deleted, the first
//! 500 one after another (each waits for its own durable commit) and the
//! rest from 100 tasks at once (deletes that meet at the committer share
//! a commit); the size again; `reclaim`; the size again; once more after
//! the store is closed and opened again; and after 5,000 new conversations
//! like the deleted ones are written (does the engine reuse what the
//! deleted ones left?).
//!
//! Sizes are the lengths of the files under the data directory. Data
//! directories live under cargo's target tmp dir.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_core::message::ImageRef;
use keel_core::{ConversationId, Event, EventKind};
use keel_store::{open_redb, open_sled, EventLog};
use tempfile::TempDir;

mod support;
use keel_test_support::text::Rng;
use support::realistic_log;

const CONVERSATIONS: usize = 10_000;
const EVENTS: usize = 8;
const IMAGE_BYTES: usize = 16 * 1024;
const ONE_BY_ONE: usize = 500;
const TASKS: usize = 100;

fn id(n: usize) -> ConversationId {
    ConversationId::new(format!("conversation-{n:05}")).unwrap()
}

fn open(backend: &str, dir: &Path) -> Arc<dyn EventLog> {
    match backend {
        "redb" => Arc::new(open_redb(dir).unwrap()),
        "sled" => Arc::new(open_sled(dir).unwrap()),
        other => panic!("unknown backend {other}"),
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => dir_bytes(&entry.path()),
            Ok(metadata) => metadata.len(),
            Err(_) => 0,
        })
        .sum()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn noise(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed | 1);
    (0..IMAGE_BYTES / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect()
}

fn image(hash: &str) -> ImageRef {
    ImageRef {
        hash: hash.to_owned(),
        media_type: "image/png".to_owned(),
        width: 64,
        height: 64,
        size: IMAGE_BYTES as u64,
    }
}

/// Conversation `n`'s log, its images stored first and named by its user
/// message.
async fn log_of(store: &dyn EventLog, n: usize, shared: &str) -> Vec<Event> {
    let mut log = realistic_log(&id(n), EVENTS);
    if n.is_multiple_of(10) {
        let mut images = vec![image(&store.put_blob(noise(n as u64)).await.unwrap())];
        if n.is_multiple_of(100) {
            store.put_blob(noise(u64::MAX)).await.unwrap();
            images.push(image(shared));
        }
        if let Some(EventKind::UserMessage { images: named, .. }) =
            log.iter_mut().map(|event| &mut event.kind).nth(1)
        {
            *named = images;
        }
    }
    log
}

/// Write conversations `ids`, from `TASKS` tasks at once.
async fn fill(store: &Arc<dyn EventLog>, ids: std::ops::Range<usize>) -> Duration {
    let shared = keel_store::blob_hash(&noise(u64::MAX));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let store = Arc::clone(store);
        let shared = shared.clone();
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            for n in (ids.start + task..ids.end).step_by(TASKS) {
                let log = log_of(&*store, n, &shared).await;
                store.append(&id(n), log).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed()
}

/// Delete every even-numbered conversation: the first `ONE_BY_ONE` one
/// after another, the rest from `TASKS` tasks at once. The time of each
/// part, and the blobs removed.
async fn delete_half(store: &Arc<dyn EventLog>) -> (Duration, Duration, usize) {
    let doomed: Vec<usize> = (0..CONVERSATIONS).step_by(2).collect();
    let (alone, together) = doomed.split_at(ONE_BY_ONE);
    let mut blobs = 0;
    let started = Instant::now();
    for n in alone {
        let deleted = store.delete(&id(*n)).await.unwrap();
        assert!(deleted.existed);
        blobs += deleted.blobs_removed.len();
    }
    let one_by_one = started.elapsed();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let store = Arc::clone(store);
        let mine: Vec<usize> = together.iter().copied().skip(task).step_by(TASKS).collect();
        tasks.push(tokio::spawn(async move {
            let mut blobs = 0;
            for n in mine {
                blobs += store.delete(&id(n)).await.unwrap().blobs_removed.len();
            }
            blobs
        }));
    }
    for task in tasks {
        blobs += task.await.unwrap();
    }
    (one_by_one, started.elapsed(), blobs)
}

async fn run(backend: &str) {
    let scratch = TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = scratch.path().join("data");
    let store = open(backend, &dir);
    let filled_in = fill(&store, 0..CONVERSATIONS).await;
    let full = dir_bytes(&dir);
    let (one_by_one, together, blobs) = delete_half(&store).await;
    let deleted = dir_bytes(&dir);
    let reclaimed = store.reclaim().await.unwrap();
    let after = dir_bytes(&dir);
    // A survivor reads back whole.
    assert_eq!(store.read_all(&id(1)).await.unwrap().len(), EVENTS);
    assert_eq!(
        store.list(false).await.unwrap().len(),
        CONVERSATIONS / 2,
        "the survivors are listed"
    );
    drop(store);
    let store = open(backend, &dir);
    let reopened = dir_bytes(&dir);
    assert_eq!(store.last_seq(&id(0)).await.unwrap(), 0);
    fill(&store, CONVERSATIONS..CONVERSATIONS + CONVERSATIONS / 2).await;
    let refilled = dir_bytes(&dir);
    drop(store);

    let alone = ONE_BY_ONE as f64;
    let rest = (CONVERSATIONS / 2 - ONE_BY_ONE) as f64;
    println!(
        "{backend}: {CONVERSATIONS} conversations of {EVENTS} events written in {:.1} s",
        filled_in.as_secs_f64()
    );
    println!(
        "{backend}: deleted {} conversations ({blobs} blobs with them): {ONE_BY_ONE} one after another in {:.2} s ({:.2} ms each), {} from {TASKS} tasks in {:.2} s ({:.0} per second)",
        CONVERSATIONS / 2,
        one_by_one.as_secs_f64(),
        one_by_one.as_secs_f64() * 1_000.0 / alone,
        rest as usize,
        together.as_secs_f64(),
        rest / together.as_secs_f64(),
    );
    println!(
        "{backend}: reclaim ({:?}) took {:.2} s; the engine's files {} -> {}",
        reclaimed.action,
        reclaimed.took.as_secs_f64(),
        mib(reclaimed.disk_bytes_before.unwrap_or(0)),
        mib(reclaimed.disk_bytes_after.unwrap_or(0)),
    );
    println!(
        "| {backend} | {} | {} | {} | {} | {} |",
        mib(full),
        mib(deleted),
        mib(after),
        mib(reopened),
        mib(refilled)
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| backend | full | half deleted | after reclaim | after reopen | 5,000 written again |"
    );
    println!("|---|---|---|---|---|---|");
    for backend in ["redb", "sled"] {
        runtime.block_on(run(backend));
    }
}
