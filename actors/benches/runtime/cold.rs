//! 2. Cold start from the store.

use std::hint::black_box;
use std::time::Instant;

use keel_actors::core::{codec, Conversation, ConversationId, EventKind, StateName, WorkingSet};
use keel_actors::store::{self, BackendKind};
use keel_actors::Settings;

use crate::logs::{history, opening, push, seed};
use crate::plumbing::{fresh_id, open_runtime, print_row, scratch, workdir};
use crate::{Counts, LONG_EVENTS};

pub(crate) async fn cold(counts: &Counts, kind: BackendKind) {
    let dir = scratch();
    let store = store::open(kind, &dir.path().join("data"), None).unwrap();
    let runtime = open_runtime(store.clone(), dir.path(), Settings::default()).await;
    let cwd = workdir(dir.path(), "work");
    let ids: Vec<ConversationId> = (0..counts.cold_conversations)
        .map(|_| fresh_id("cold"))
        .collect();
    let mut events_before = 0;
    for (n, id) in ids.iter().enumerate() {
        let log = history(id, &cwd, LONG_EVENTS, 10 + n as u64);
        events_before += log.len();
        if n == 0 {
            let bytes: usize = log.iter().map(|event| codec::encode(event).len()).sum();
            println!(
                "  ({kind}: {} conversations of {}-{} events; the first: {} messages, {} KB encoded)",
                ids.len(),
                LONG_EVENTS,
                LONG_EVENTS + 20,
                Conversation::replay(&log).unwrap().working.messages.len(),
                bytes / 1000
            );
        }
        seed(store.as_ref(), &log).await;
    }
    // One untimed cold start each: the first rehydrate writes the snapshot.
    for id in &ids {
        let handle = runtime.open_conversation(id).await.unwrap();
        handle.inspect().await.unwrap();
        handle.evict().await.unwrap();
    }

    let mut opened = Vec::with_capacity(counts.cold);
    let mut answered = Vec::with_capacity(counts.cold);
    let mut evicted = Vec::with_capacity(counts.cold);
    for n in 0..counts.cold {
        let id = &ids[n % ids.len()];
        assert!(!runtime.is_live(id), "{id} is still live");
        let last_seq = store.last_seq(id).await.unwrap();
        let start = Instant::now();
        let handle = runtime.open_conversation(id).await.unwrap();
        opened.push(start.elapsed());
        let inspection = handle.inspect().await.unwrap();
        answered.push(start.elapsed());
        assert_eq!(inspection.state, StateName::Idle);
        assert_eq!(
            inspection.last_seq,
            last_seq + 1,
            "the actor appended SessionStarted"
        );
        drop(inspection);
        let start = Instant::now();
        handle.evict().await.unwrap();
        evicted.push(start.elapsed());
    }
    print_row(&format!("cold start, {kind}: open_conversation"), &opened);
    print_row(&format!("cold start, {kind}: open + inspect"), &answered);
    print_row(&format!("  context: evict, {kind}"), &evicted);

    // Where a cold start's time goes: the parts it is made of, alone.
    let mut reads = Vec::with_capacity(counts.cold);
    let mut replays = Vec::with_capacity(counts.cold);
    for n in 0..counts.cold {
        let id = &ids[n % ids.len()];
        let start = Instant::now();
        let events = store.read_all(id).await.unwrap();
        reads.push(start.elapsed());
        let start = Instant::now();
        let working = WorkingSet::replay(&events).unwrap();
        replays.push(start.elapsed());
        black_box((working, events));
    }
    // What a cold start does now: the checkpoint eviction saved, and the
    // events after it (the SessionEnded of that eviction).
    let mut rehydrates = Vec::with_capacity(counts.cold);
    for n in 0..counts.cold {
        let id = &ids[n % ids.len()];
        let start = Instant::now();
        let rehydrated = store::rehydrate(store.as_ref(), id).await.unwrap().unwrap();
        rehydrates.push(start.elapsed());
        assert!(rehydrated.from_checkpoint, "{id} has a checkpoint");
        black_box(rehydrated);
    }
    let scratch_id = fresh_id("append");
    let mut log = opening(&scratch_id, &cwd);
    store.append(&scratch_id, log.clone()).await.unwrap();
    let mut appends = Vec::with_capacity(counts.cold);
    for _ in 0..counts.cold {
        push(&mut log, None, false, EventKind::SessionStarted);
        let event = log[log.len() - 1].clone();
        let start = Instant::now();
        store.append(&scratch_id, vec![event]).await.unwrap();
        appends.push(start.elapsed());
    }
    print_row(
        &format!("  context: rehydrate from the checkpoint, {kind}"),
        &rehydrates,
    );
    print_row(&format!("  context: read_all of the log, {kind}"), &reads);
    print_row("  context: WorkingSet::replay of it", &replays);
    print_row(&format!("  context: one durable append, {kind}"), &appends);
    let mut events_after: u64 = 0;
    for id in &ids {
        events_after += store.last_seq(id).await.unwrap();
    }
    println!(
        "  ({kind}: the logs grew from {events_before} to {events_after} events over the run: \
         SessionStarted and SessionEnded per cold start)"
    );
    runtime.shutdown().await;
}
