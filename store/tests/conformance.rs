//! The conformance suite: the same behaviour asked of every `EventLog`
//! (sled, redb, memory). Each check is a function over `&dyn EventLog`, or,
//! when it must reach past the log, over a `Store` of the backend's engine
//! wrapped in a [`Gated`] one; the macro at the bottom runs all of them
//! against each backend, so a backend cannot pass by being tested less.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use keel_core::config::ConversationConfig;
use keel_core::event::{Event, EventKind};
use keel_core::ids::{ConversationId, Seq};
use keel_core::input::Input;
use keel_core::message::ImageRef;
use keel_core::reducer::WorkingSet;
use keel_core::snapshot::{FsmSnapshot, SnapshotState};
use keel_core::state::Phase;
use keel_core::time::Timestamp;
use keel_core::transition::{create, transition, NewConversation, Step};
use keel_core::ToolPolicy;
use keel_store::backend::{Entry, Visit, Write};
use keel_store::lock::DirLock;
use keel_store::{rehydrate, Backend, Error, EventLog, SnapshotCheck, Store};

fn id(raw: &str) -> ConversationId {
    ConversationId::new(raw).unwrap()
}

fn new_conversation(raw: &str, parent: Option<&str>) -> Step {
    create(
        NewConversation {
            id: id(raw),
            cwd: "/tmp".to_owned(),
            config: ConversationConfig {
                tools: [("deploy".to_owned(), ToolPolicy::Approve)].into(),
                ..ConversationConfig::default()
            },
            parent_conversation: parent.map(id),
        },
        Timestamp(1_000),
    )
}

/// `Created` and `SessionStarted` (seqs 1, 2).
fn created(raw: &str) -> Vec<Event> {
    new_conversation(raw, None).appended().to_vec()
}

/// `n` user messages continuing after `after`.
fn messages(after: Seq, n: u64) -> Vec<Event> {
    (1..=n)
        .map(|offset| Event {
            seq: after + offset,
            at: Timestamp(2_000 + after + offset),
            parent: None,
            triggers_turn: false,
            kind: EventKind::UserMessage {
                text: format!("message {}", after + offset),
                images: vec![],
            },
        })
        .collect()
}

async fn seed(log: &dyn EventLog, raw: &str, n_messages: u64) {
    log.append(&id(raw), created(raw)).await.unwrap();
    log.append(&id(raw), messages(2, n_messages)).await.unwrap();
}

fn seqs(events: &[Event]) -> Vec<Seq> {
    events.iter().map(|event| event.seq).collect()
}

pub async fn appends_are_read_back_in_order(log: &dyn EventLog) {
    seed(log, "a", 10).await;
    let events = log.read_all(&id("a")).await.unwrap();
    assert_eq!(seqs(&events), (1..=12).collect::<Vec<_>>());
    assert!(matches!(events[0].kind, EventKind::Created { .. }));
    assert_eq!(events[5], messages(2, 10)[3]);
    assert_eq!(log.last_seq(&id("a")).await.unwrap(), 12);
}

pub async fn gaps_and_duplicates_are_refused_and_change_nothing(log: &dyn EventLog) {
    seed(log, "a", 3).await;
    let gap = log.append(&id("a"), messages(6, 1)).await.unwrap_err();
    assert!(
        matches!(
            gap,
            Error::NonContiguous {
                expected: 6,
                found: 7,
                ..
            }
        ),
        "{gap}"
    );
    let duplicate = log.append(&id("a"), messages(4, 1)).await.unwrap_err();
    assert!(matches!(
        duplicate,
        Error::NonContiguous {
            expected: 6,
            found: 5,
            ..
        }
    ));
    // A batch that goes wrong halfway writes none of itself.
    let mut torn = messages(5, 2);
    torn[1].seq = 9;
    assert!(log.append(&id("a"), torn).await.is_err());
    assert_eq!(log.last_seq(&id("a")).await.unwrap(), 5);
    assert!(log.append(&id("a"), vec![]).await.is_err());
    // The conversation carries on where it was.
    log.append(&id("a"), messages(5, 1)).await.unwrap();
    assert_eq!(log.last_seq(&id("a")).await.unwrap(), 6);
}

pub async fn a_log_must_start_with_its_own_created(log: &dyn EventLog) {
    let error = log.append(&id("b"), messages(0, 1)).await.unwrap_err();
    assert!(
        error.to_string().contains("must start with Created"),
        "{error}"
    );
    let error = log.append(&id("b"), created("other")).await.unwrap_err();
    assert!(
        error.to_string().contains("another conversation"),
        "{error}"
    );
    assert_eq!(log.last_seq(&id("b")).await.unwrap(), 0);
    assert!(log.index_entry(&id("b")).await.unwrap().is_none());
}

pub async fn range_and_tail_reads(log: &dyn EventLog) {
    seed(log, "a", 20).await;
    seed(log, "a-b", 3).await;
    assert_eq!(
        seqs(&log.read(&id("a"), 5, 3).await.unwrap()),
        vec![5, 6, 7]
    );
    assert_eq!(
        seqs(&log.read(&id("a"), 21, 100).await.unwrap()),
        vec![21, 22]
    );
    assert!(log.read(&id("a"), 23, 100).await.unwrap().is_empty());
    assert_eq!(seqs(&log.read(&id("a"), 0, 2).await.unwrap()), vec![1, 2]);
    assert_eq!(
        seqs(&log.read_tail(&id("a"), 3).await.unwrap()),
        vec![20, 21, 22]
    );
    assert_eq!(
        seqs(&log.read_tail(&id("a-b"), 100).await.unwrap()),
        vec![1, 2, 3, 4, 5]
    );
    assert!(log.read_all(&id("nobody")).await.unwrap().is_empty());
    assert_eq!(log.last_seq(&id("nobody")).await.unwrap(), 0);
}

/// Messages in the long conversations below: enough that reading all of
/// them takes the store's parallel decoding path (more than 2,000 records)
/// with more than one chunk per thread on any machine.
const LONG: u64 = 2_600;

/// Reads long enough to be decoded on several threads give exactly what
/// short reads give: every event, in order, and only this conversation's.
pub async fn long_reads_come_back_whole_and_in_order(log: &dyn EventLog) {
    log.append(&id("long"), created("long")).await.unwrap();
    let appended = messages(2, LONG);
    log.append(&id("long"), appended.clone()).await.unwrap();
    seed(log, "long-b", 3).await;
    let events = log.read_all(&id("long")).await.unwrap();
    assert_eq!(seqs(&events), (1..=LONG + 2).collect::<Vec<_>>());
    assert_eq!(&events[2..], appended.as_slice());
    assert_eq!(
        seqs(&log.read(&id("long"), 5, 2_500).await.unwrap()),
        (5..2_505).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(&log.read(&id("long"), 101, usize::MAX).await.unwrap()),
        (101..=LONG + 2).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(&log.read(&id("long"), LONG, usize::MAX).await.unwrap()),
        vec![LONG, LONG + 1, LONG + 2]
    );
    assert_eq!(log.read_all(&id("long-b")).await.unwrap().len(), 5);
}

pub async fn concurrent_writers_each_get_a_contiguous_log(log: Arc<dyn EventLog>) {
    let mut tasks = Vec::new();
    for writer in 0..32 {
        let log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            let raw = format!("w{writer}");
            log.append(&id(&raw), created(&raw)).await.unwrap();
            for round in 0..10 {
                log.append(&id(&raw), messages(2 + round * 2, 2))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for writer in 0..32 {
        let events = log.read_all(&id(&format!("w{writer}"))).await.unwrap();
        assert_eq!(seqs(&events), (1..=22).collect::<Vec<_>>());
    }
}

pub async fn snapshots_are_a_cache_the_log_overrules(log: &dyn EventLog) {
    // A conversation parked on an approval.
    let mut step = new_conversation("s", None);
    let mut all: Vec<Event> = step.appended().to_vec();
    step = transition(
        step.state,
        Input::UserMessage {
            text: "deploy".to_owned(),
            images: vec![],
        },
        Timestamp(2_000),
    );
    all.extend(step.appended().iter().cloned());
    let generation = match &step.state.phase {
        Phase::Streaming { request, .. } => request.generation,
        other => panic!("{other:?}"),
    };
    step = transition(
        step.state,
        Input::StreamFinished {
            generation,
            response: keel_core::AssistantResponse {
                blocks: vec![keel_core::message::AssistantBlock::ToolUse {
                    call: keel_core::message::ToolCall {
                        id: keel_core::ToolCallId::new("d1"),
                        name: "deploy".to_owned(),
                        input: serde_json::json!({}),
                    },
                }],
                stop_reason: keel_core::message::StopReason::ToolUse,
                usage: Default::default(),
                provider: keel_core::ProviderKind::Mock,
                model: "mock".to_owned(),
            },
        },
        Timestamp(3_000),
    );
    all.extend(step.appended().iter().cloned());
    assert_eq!(step.state.phase, Phase::AwaitingInput);
    log.append(&id("s"), all.clone()).await.unwrap();

    // No snapshot yet: rebuilt from the log and saved.
    let first = rehydrate(log, &id("s")).await.unwrap().unwrap();
    assert_eq!(first.snapshot, SnapshotCheck::Missing);
    assert_eq!(first.conversation.working, step.state.working);
    assert_eq!(first.conversation.phase, Phase::AwaitingInput);
    let saved = log.load_snapshot(&id("s")).await.unwrap().unwrap();
    assert_eq!(saved.state, SnapshotState::AwaitingInput);
    assert_eq!(saved.pending.len(), 1);
    assert_eq!(saved.last_seq, all.len() as Seq);
    assert_eq!(
        rehydrate(log, &id("s")).await.unwrap().unwrap().snapshot,
        SnapshotCheck::Valid
    );

    // A snapshot that disagrees (stale, or plain wrong) loses to the log.
    let wrong = FsmSnapshot {
        state: SnapshotState::Idle,
        pending: vec![],
        last_seq: 3,
    };
    log.save_snapshot(&id("s"), &wrong).await.unwrap();
    let again = rehydrate(log, &id("s")).await.unwrap().unwrap();
    assert_eq!(again.snapshot, SnapshotCheck::Rebuilt);
    assert_eq!(again.conversation.phase, Phase::AwaitingInput);
    assert_eq!(log.load_snapshot(&id("s")).await.unwrap(), Some(saved));
    assert!(rehydrate(log, &id("nobody")).await.unwrap().is_none());
}

/// A checkpoint of the working set spares a cold start the events before
/// it; the log still decides. One that does not fit the log (another
/// conversation's, ahead of the log) is passed over and the log replayed.
pub async fn checkpoints_spare_replay_and_never_overrule_the_log(log: &dyn EventLog) {
    seed(log, "k", 30).await;
    let whole = log.read_all(&id("k")).await.unwrap();
    let at_20 = WorkingSet::replay(&whole[..20]).unwrap();
    log.save_checkpoint(&id("k"), &at_20).await.unwrap();
    assert_eq!(
        log.load_checkpoint(&id("k")).await.unwrap(),
        Some(at_20.clone())
    );
    // The snapshot goes with it.
    assert_eq!(
        log.load_snapshot(&id("k")).await.unwrap(),
        FsmSnapshot::of(&at_20)
    );

    let from_checkpoint = rehydrate(log, &id("k")).await.unwrap().unwrap();
    assert!(from_checkpoint.from_checkpoint);
    assert_eq!(from_checkpoint.replayed, 12);
    let replayed = WorkingSet::replay(&whole).unwrap();
    assert_eq!(from_checkpoint.conversation.working, replayed);

    // Another conversation's checkpoint is not this one's.
    seed(log, "other", 1).await;
    let other = WorkingSet::replay(&log.read_all(&id("other")).await.unwrap()).unwrap();
    log.save_checkpoint(&id("k"), &other).await.unwrap();
    let rebuilt = rehydrate(log, &id("k")).await.unwrap().unwrap();
    assert!(!rebuilt.from_checkpoint);
    assert_eq!(rebuilt.replayed, 32);
    assert_eq!(rebuilt.conversation.working, replayed);

    // Nor is one ahead of the log (of events that were never appended).
    let mut ahead_log = whole.clone();
    ahead_log.extend(messages(32, 3));
    let ahead = WorkingSet::replay(&ahead_log).unwrap();
    log.save_checkpoint(&id("k"), &ahead).await.unwrap();
    let rebuilt = rehydrate(log, &id("k")).await.unwrap().unwrap();
    assert!(!rebuilt.from_checkpoint);
    assert_eq!(rebuilt.conversation.working, replayed);

    // A checkpoint at the end of the log replays nothing.
    log.save_checkpoint(&id("k"), &replayed).await.unwrap();
    let at_end = rehydrate(log, &id("k")).await.unwrap().unwrap();
    assert!(at_end.from_checkpoint);
    assert_eq!(at_end.replayed, 0);
    assert_eq!(at_end.conversation.working, replayed);
}

pub async fn blobs_are_stored_once_by_content_hash(log: &dyn EventLog) {
    let hash = log.put_blob(b"abc".to_vec()).await.unwrap();
    assert_eq!(
        hash,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(log.put_blob(b"abc".to_vec()).await.unwrap(), hash);
    assert_eq!(
        log.get_blob(&hash).await.unwrap().as_deref(),
        Some(&b"abc"[..])
    );
    assert!(log.get_blob(&"0".repeat(64)).await.unwrap().is_none());
}

/// An event at `seq` naming blob `hash` as an image: a user's attachment,
/// or, with `from_a_tool`, an image a tool returned.
fn naming(seq: Seq, hash: &str, from_a_tool: bool) -> Event {
    let images = vec![ImageRef {
        hash: hash.to_owned(),
        media_type: "image/png".to_owned(),
        width: 1,
        height: 1,
        size: 8,
    }];
    let kind = if from_a_tool {
        EventKind::ToolResult {
            tool_call_id: keel_core::ids::ToolCallId::new("call_1"),
            content: "a screenshot".to_owned(),
            is_error: false,
            synthetic: false,
            images,
        }
    } else {
        EventKind::UserMessage {
            text: "see".to_owned(),
            images,
        }
    };
    Event {
        seq,
        at: Timestamp(2_000 + seq),
        parent: None,
        triggers_turn: false,
        kind,
    }
}

/// `uses_blob` is true exactly for the blobs a conversation's own log
/// names, a user's or a tool's, however far back; a blob stored for
/// another conversation, or by nobody, is not its. The default answer
/// (reading the log a page at a time) agrees with the store's own.
pub async fn a_conversation_uses_the_blobs_its_log_names(log: &dyn EventLog) {
    // Longer than a page of the default scan, so it reads on.
    seed(log, "shows", 300).await;
    // An id that starts with the other's.
    seed(log, "shows-too", 1).await;
    let attached = log.put_blob(b"attached".to_vec()).await.unwrap();
    let returned = log.put_blob(b"returned".to_vec()).await.unwrap();
    let elsewhere = log.put_blob(b"elsewhere".to_vec()).await.unwrap();
    let nobodys = log.put_blob(b"nobody's".to_vec()).await.unwrap();
    let last = log.last_seq(&id("shows")).await.unwrap();
    log.append(
        &id("shows"),
        vec![
            naming(last + 1, &attached, false),
            naming(last + 2, &returned, true),
        ],
    )
    .await
    .unwrap();
    let last = log.last_seq(&id("shows-too")).await.unwrap();
    log.append(&id("shows-too"), vec![naming(last + 1, &elsewhere, false)])
        .await
        .unwrap();

    let expect = |conversation: &'static str, hash: &str, named: bool| {
        let hash = hash.to_owned();
        async move {
            let conversation = id(conversation);
            assert_eq!(
                log.uses_blob(&conversation, &hash).await.unwrap(),
                named,
                "uses_blob({conversation}, {hash})"
            );
            assert_eq!(
                keel_store::log::scan_for_blob(log, &conversation, &hash)
                    .await
                    .unwrap(),
                named,
                "scan_for_blob({conversation}, {hash})"
            );
        }
    };
    expect("shows", &attached, true).await;
    expect("shows", &returned, true).await;
    expect("shows", &elsewhere, false).await;
    expect("shows", &nobodys, false).await;
    expect("shows", &"0".repeat(64), false).await;
    expect("shows-too", &elsewhere, true).await;
    expect("shows-too", &attached, false).await;
    expect("never-created", &attached, false).await;

    // A deleted conversation names nothing any more.
    log.delete(&id("shows")).await.unwrap();
    expect("shows", &attached, false).await;
    expect("shows-too", &elsewhere, true).await;
}

pub async fn the_index_lists_conversations_and_marks_turns_in_flight(log: &dyn EventLog) {
    seed(log, "first", 1).await;
    let child = new_conversation("child", Some("first"));
    log.append(&id("child"), child.appended().to_vec())
        .await
        .unwrap();
    // A user turn left in flight: user message + TurnStarted, no end.
    let step = new_conversation("busy", None);
    let busy = step.appended().to_vec();
    let step = transition(
        step.state,
        Input::UserMessage {
            text: "hi".to_owned(),
            images: vec![],
        },
        Timestamp(5_000),
    );
    log.append(&id("busy"), busy).await.unwrap();
    log.append(&id("busy"), step.appended().to_vec())
        .await
        .unwrap();

    let listed: Vec<String> = log
        .list(false)
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.id.to_string())
        .collect();
    assert_eq!(listed, vec!["busy", "first"]);
    let all = log.list(true).await.unwrap();
    assert_eq!(all.len(), 3);
    let child = log.index_entry(&id("child")).await.unwrap().unwrap();
    assert_eq!(child.parent, Some(id("first")));
    assert!(!child.user_initiated);
    let busy = log.index_entry(&id("busy")).await.unwrap().unwrap();
    assert!(busy.turn_in_flight);
    assert_eq!(busy.last_seq, 4);
    assert_eq!(busy.last_activity, Timestamp(5_000));
    assert!(
        !log.index_entry(&id("first"))
            .await
            .unwrap()
            .unwrap()
            .turn_in_flight
    );
}

/// Write a record that does not decode at `seq`, straight into the backend.
fn corrupt<B: Backend>(backend: &B, conversation: &str, seq: Seq) {
    backend
        .commit(&[Write::Put(
            keel_store::keys::event(&id(conversation), seq),
            b"{not json".to_vec(),
        )])
        .unwrap();
}

async fn a_corrupted_record_is_named_and_the_rest_stays_readable<B: Backend>(
    store: &keel_store::Store<B>,
) {
    seed(store, "a", 8).await;
    seed(store, "b", 2).await;
    corrupt(store.backend(), "a", 6);
    let error = store.read_all(&id("a")).await.unwrap_err();
    assert!(
        matches!(&error, Error::Corrupt { conversation, seq: 6, .. } if conversation.as_str() == "a"),
        "{error}"
    );
    assert!(error.to_string().contains("a:6"), "{error}");
    assert_eq!(
        seqs(&store.read(&id("a"), 1, 5).await.unwrap()),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(
        seqs(&store.read(&id("a"), 7, 10).await.unwrap()),
        vec![7, 8, 9, 10]
    );
    assert_eq!(store.read_all(&id("b")).await.unwrap().len(), 4);
}

/// A checkpoint that does not decode counts as missing: the log is replayed.
async fn an_undecodable_checkpoint_is_passed_over<B: Backend>(store: &keel_store::Store<B>) {
    seed(store, "g", 5).await;
    store
        .backend()
        .commit(&[Write::Put(
            keel_store::keys::checkpoint(&id("g")),
            b"\x93garbage".to_vec(),
        )])
        .unwrap();
    assert_eq!(store.load_checkpoint(&id("g")).await.unwrap(), None);
    let rebuilt = rehydrate(store, &id("g")).await.unwrap().unwrap();
    assert!(!rebuilt.from_checkpoint);
    assert_eq!(
        rebuilt.conversation.working,
        WorkingSet::replay(&store.read_all(&id("g")).await.unwrap()).unwrap()
    );
}

/// A long read, decoded on several threads, names the first bad record in
/// seq order, as a short read does.
async fn a_corrupted_record_in_a_long_read_is_named<B: Backend>(store: &keel_store::Store<B>) {
    seed(store, "a", LONG).await;
    let named = |error: Error| match error {
        Error::Corrupt {
            conversation,
            seq,
            reason,
        } if conversation.as_str() == "a" => (seq, reason),
        other => panic!("expected a corrupted record of a, got {other}"),
    };
    corrupt(store.backend(), "a", 2_400);
    assert_eq!(named(store.read_all(&id("a")).await.unwrap_err()).0, 2_400);
    corrupt(store.backend(), "a", 300);
    assert_eq!(named(store.read_all(&id("a")).await.unwrap_err()).0, 300);
    assert_eq!(
        named(store.read(&id("a"), 301, usize::MAX).await.unwrap_err()).0,
        2_400
    );
    // A record under another seq's key is as corrupt as one that does not
    // decode.
    let misplaced = keel_store::encode(&messages(9, 1)[0]);
    store
        .backend()
        .commit(&[Write::Put(
            keel_store::keys::event(&id("a"), 1_200),
            misplaced,
        )])
        .unwrap();
    let (seq, reason) = named(store.read(&id("a"), 301, usize::MAX).await.unwrap_err());
    assert_eq!(seq, 1_200);
    assert!(reason.contains("record holds seq 10"), "{reason}");
    assert_eq!(store.read(&id("a"), 1, 299).await.unwrap().len(), 299);
}

/// How long a gated read waits for the gate before it gives up: only
/// reached when a read blocks the thread that would open the gate.
const GATE_PATIENCE: Duration = Duration::from_secs(10);

/// A gate in front of an engine's reads. Once armed, every read waits until
/// something opens the gate, or fails after [`GATE_PATIENCE`].
#[derive(Default)]
struct Gate {
    /// Reads wait only while this is set, so that setting up (appends,
    /// whose committer reads the engine too) never waits.
    armed: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
    /// Reads that went through the gate while it was armed.
    passed: AtomicUsize,
}

impl Gate {
    fn arm(&self) {
        *self.open.lock().unwrap() = false;
        self.passed.store(0, Ordering::SeqCst);
        self.armed.store(true, Ordering::SeqCst);
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    fn pass(&self) -> keel_store::Result<()> {
        if !self.armed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let open = self.open.lock().unwrap();
        let (open, _) = self
            .opened
            .wait_timeout_while(open, GATE_PATIENCE, |open| !*open)
            .unwrap();
        if !*open {
            return Err(Error::Backend {
                backend: "gated",
                reason: "nothing opened the gate: the read blocked the runtime's thread".to_owned(),
            });
        }
        self.passed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Any engine, with a [`Gate`] in front of its reads.
struct Gated<B> {
    inner: B,
    gate: Arc<Gate>,
}

impl<B: Backend> Gated<B> {
    fn new(inner: B) -> Gated<B> {
        Gated {
            inner,
            gate: Arc::default(),
        }
    }
}

impl<B: Backend> Backend for Gated<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn commit(&self, writes: &[Write]) -> keel_store::Result<()> {
        self.inner.commit(writes)
    }
    fn get(&self, key: &[u8]) -> keel_store::Result<Option<Vec<u8>>> {
        self.gate.pass()?;
        self.inner.get(key)
    }
    fn visit_range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        visit: &mut Visit<'_>,
    ) -> keel_store::Result<()> {
        self.gate.pass()?;
        self.inner.visit_range(start, end, limit, visit)
    }
    fn last(&self, start: &[u8], end: &[u8]) -> keel_store::Result<Option<Entry>> {
        self.gate.pass()?;
        self.inner.last(start, end)
    }
    fn tail(&self, start: &[u8], end: &[u8], limit: usize) -> keel_store::Result<Vec<Entry>> {
        self.gate.pass()?;
        self.inner.tail(start, end, limit)
    }
}

/// Await `read` with the gate armed and a task spawned just before it
/// that opens the gate. On a runtime with one thread that task runs only
/// while `read` leaves the thread free, so `read` can only get past the
/// gate if it waits for the engine off the runtime's thread; one that
/// blocked the thread would wait for the task in vain and fail.
async fn gated<T>(gate: &Arc<Gate>, read: impl Future<Output = T>) -> T {
    gate.arm();
    let opener = tokio::spawn({
        let gate = Arc::clone(gate);
        async move { gate.open() }
    });
    let value = read.await;
    opener.await.unwrap();
    assert!(
        gate.passed.load(Ordering::SeqCst) > 0,
        "the read went through the gate"
    );
    gate.disarm();
    value
}

/// Reads never block the thread of the runtime that awaits them: every
/// `EventLog` read, a long one (decoded in parallel) and `rehydrate`
/// among them, lets another task of a one-thread runtime run while it
/// waits for the engine. Needs a one-thread (`current_thread`) runtime.
async fn reads_leave_the_runtime_thread_free<B: Backend>(store: &Store<Gated<B>>) {
    seed(store, "long", LONG).await;
    seed(store, "short", 3).await;
    let hash = store.put_blob(b"image".to_vec()).await.unwrap();
    let short = store.read_all(&id("short")).await.unwrap();
    store
        .save_checkpoint(&id("short"), &WorkingSet::replay(&short).unwrap())
        .await
        .unwrap();
    let gate = Arc::clone(&store.backend().gate);

    let long = gated(&gate, store.read_all(&id("long"))).await.unwrap();
    assert_eq!(seqs(&long), (1..=LONG + 2).collect::<Vec<_>>());
    let events = gated(&gate, store.read(&id("long"), 10, 5)).await.unwrap();
    assert_eq!(seqs(&events), vec![10, 11, 12, 13, 14]);
    let tail = gated(&gate, store.read_tail(&id("long"), 2)).await.unwrap();
    assert_eq!(seqs(&tail), vec![LONG + 1, LONG + 2]);
    assert_eq!(
        gated(&gate, store.last_seq(&id("long"))).await.unwrap(),
        LONG + 2
    );
    assert!(gated(&gate, store.load_snapshot(&id("short")))
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        gated(&gate, store.load_checkpoint(&id("short")))
            .await
            .unwrap()
            .map(|working| working.last_seq),
        Some(5)
    );
    assert_eq!(
        gated(&gate, store.get_blob(&hash))
            .await
            .unwrap()
            .as_deref(),
        Some(&b"image"[..])
    );
    // Storing a blob first looks whether it is there.
    assert_eq!(
        gated(&gate, store.put_blob(b"image".to_vec()))
            .await
            .unwrap(),
        hash
    );
    assert_eq!(
        gated(&gate, store.index_entry(&id("short")))
            .await
            .unwrap()
            .map(|entry| entry.last_seq),
        Some(5)
    );
    assert_eq!(gated(&gate, store.list(false)).await.unwrap().len(), 2);
    let rebuilt = gated(&gate, rehydrate(store, &id("long")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        rebuilt.conversation.working,
        WorkingSet::replay(&long).unwrap()
    );
}

/// A read whose caller stopped waiting still runs to its end on the
/// blocking pool, with the engine open. The data directory stays locked
/// until it has let go of the engine, so that no second store opens the
/// engine's files while they are still open.
fn a_read_given_up_on_keeps_the_directory_locked_until_it_ends<B: Backend>(
    engine: impl FnOnce(&Path) -> B,
) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let lock = DirLock::acquire(dir.path()).unwrap();
    let store = Store::new(Gated::new(engine(dir.path())), Some(lock)).unwrap();
    runtime.block_on(seed(&store, "a", 3));
    let gate = Arc::clone(&store.backend().gate);
    gate.arm();
    runtime.block_on(async {
        let conversation = id("a");
        let mut read = store.read_all(&conversation);
        // Poll the read once, which hands it to the blocking pool, where
        // it waits at the gate; then give up on it.
        tokio::select! {
            biased;
            _ = &mut read => panic!("the read got past a closed gate"),
            () = std::future::ready(()) => {}
        }
    });
    drop(store);
    assert!(
        matches!(
            DirLock::acquire_within(dir.path(), std::time::Duration::ZERO),
            Err(Error::InUse { .. })
        ),
        "the directory was unlocked while a read still had the engine open"
    );
    gate.open();
    // Shutting the runtime down waits for its blocking pool to finish.
    drop(runtime);
    DirLock::acquire(dir.path()).unwrap();
}

/// What an engine's conformance tests need kept alive (a database
/// server), and how to open the engine in a directory.
type Fixture<B> = (Box<dyn std::any::Any>, Box<dyn Fn(&Path) -> B>);

macro_rules! conformance {
    ($backend:ident, $fixture:expr) => {
        mod $backend {
            use super::*;

            /// A fresh store of this engine, with what it needs kept alive
            /// (dropped after it); `None` when the engine cannot run here
            /// (it said why).
            #[allow(clippy::redundant_closure_call, clippy::type_complexity)]
            fn open() -> Option<(
                (Box<dyn std::any::Any>, tempfile::TempDir),
                Arc<dyn EventLog>,
            )> {
                let (keep, engine) = ($fixture)()?;
                let dir = tempfile::tempdir().unwrap();
                let log: Arc<dyn EventLog> =
                    Arc::new(Store::new(engine(dir.path()), None).unwrap());
                Some(((keep, dir), log))
            }

            #[tokio::test]
            async fn appends_are_read_back_in_order() {
                let Some((_kept, log)) = open() else { return };
                super::appends_are_read_back_in_order(&*log).await;
            }

            #[tokio::test]
            async fn gaps_and_duplicates_are_refused_and_change_nothing() {
                let Some((_kept, log)) = open() else { return };
                super::gaps_and_duplicates_are_refused_and_change_nothing(&*log).await;
            }

            #[tokio::test]
            async fn a_log_must_start_with_its_own_created() {
                let Some((_kept, log)) = open() else { return };
                super::a_log_must_start_with_its_own_created(&*log).await;
            }

            #[tokio::test]
            async fn range_and_tail_reads() {
                let Some((_kept, log)) = open() else { return };
                super::range_and_tail_reads(&*log).await;
            }

            #[tokio::test]
            async fn long_reads_come_back_whole_and_in_order() {
                let Some((_kept, log)) = open() else { return };
                super::long_reads_come_back_whole_and_in_order(&*log).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_writers_each_get_a_contiguous_log() {
                let Some((_kept, log)) = open() else { return };
                super::concurrent_writers_each_get_a_contiguous_log(log).await;
            }

            #[tokio::test]
            async fn snapshots_are_a_cache_the_log_overrules() {
                let Some((_kept, log)) = open() else { return };
                super::snapshots_are_a_cache_the_log_overrules(&*log).await;
            }

            #[tokio::test]
            async fn checkpoints_spare_replay_and_never_overrule_the_log() {
                let Some((_kept, log)) = open() else { return };
                super::checkpoints_spare_replay_and_never_overrule_the_log(&*log).await;
            }

            #[tokio::test]
            async fn blobs_are_stored_once_by_content_hash() {
                let Some((_kept, log)) = open() else { return };
                super::blobs_are_stored_once_by_content_hash(&*log).await;
            }

            #[tokio::test]
            async fn a_conversation_uses_the_blobs_its_log_names() {
                let Some((_kept, log)) = open() else { return };
                super::a_conversation_uses_the_blobs_its_log_names(&*log).await;
            }

            #[tokio::test]
            async fn the_index_lists_conversations_and_marks_turns_in_flight() {
                let Some((_kept, log)) = open() else { return };
                super::the_index_lists_conversations_and_marks_turns_in_flight(&*log).await;
            }

            #[tokio::test(flavor = "current_thread")]
            #[allow(clippy::redundant_closure_call)]
            async fn reads_leave_the_runtime_thread_free() {
                let Some((_kept, engine)) = ($fixture)() else {
                    return;
                };
                let dir = tempfile::tempdir().unwrap();
                let store = Store::new(Gated::new(engine(dir.path())), None).unwrap();
                super::reads_leave_the_runtime_thread_free(&store).await;
            }

            #[test]
            #[allow(clippy::redundant_closure_call)]
            fn a_read_given_up_on_keeps_the_directory_locked_until_it_ends() {
                let Some((_kept, engine)) = ($fixture)() else {
                    return;
                };
                super::a_read_given_up_on_keeps_the_directory_locked_until_it_ends(engine);
            }
        }
    };
}

/// Nothing to keep alive: an embedded engine lives in its directory.
fn embedded<B: Backend>(engine: fn(&Path) -> B) -> Option<Fixture<B>> {
    Some((Box::new(()), Box::new(engine)))
}

conformance!(memory, || embedded(|_| keel_store::MemoryBackend::new()));
conformance!(sled, || embedded(|dir| {
    keel_store::SledBackend::open(&dir.join("sled")).unwrap()
}));
conformance!(redb, || embedded(|dir| {
    keel_store::RedbBackend::open(&dir.join("keel.redb")).unwrap()
}));
// A server of the test's own (keel_test_support::postgres), each test
// on a database of its own; where PostgreSQL is not installed the tests
// say they were not run.
conformance!(postgres, || {
    let server = keel_test_support::postgres::Postgres::start()?;
    let url = server.url();
    let engine = move |_: &Path| keel_store::PostgresBackend::open(&url).unwrap();
    Some((
        Box::new(server) as Box<dyn std::any::Any>,
        Box::new(engine) as Box<dyn Fn(&Path) -> _>,
    ))
});

/// Polled outside any tokio runtime (another executor, or none), a read has
/// no blocking pool to go to and runs on the caller's thread: it is done on
/// its first poll, where `spawn_blocking` would have panicked.
#[test]
fn a_read_outside_a_tokio_runtime_runs_on_the_callers_thread() {
    let store = keel_store::open_memory().unwrap();
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(seed(&store, "a", 3));
    let conversation = id("a");
    let mut read = store.read_all(&conversation);
    match read.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(events) => assert_eq!(seqs(&events.unwrap()), vec![1, 2, 3, 4, 5]),
        Poll::Pending => panic!("a read outside a runtime waited"),
    }
}

// --- What only some backends can show ------------------------------------------------

#[tokio::test]
async fn memory_a_corrupted_record_is_named_and_the_rest_stays_readable() {
    let store = keel_store::open_memory().unwrap();
    a_corrupted_record_is_named_and_the_rest_stays_readable(&store).await;
}

#[tokio::test]
async fn sled_a_corrupted_record_is_named_and_the_rest_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let store = keel_store::open_sled(dir.path()).unwrap();
    a_corrupted_record_is_named_and_the_rest_stays_readable(&store).await;
}

#[tokio::test]
async fn redb_a_corrupted_record_is_named_and_the_rest_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let store = keel_store::open_redb(dir.path()).unwrap();
    a_corrupted_record_is_named_and_the_rest_stays_readable(&store).await;
}

#[tokio::test]
async fn memory_a_corrupted_record_in_a_long_read_is_named() {
    let store = keel_store::open_memory().unwrap();
    a_corrupted_record_in_a_long_read_is_named(&store).await;
}

#[tokio::test]
async fn sled_a_corrupted_record_in_a_long_read_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = keel_store::open_sled(dir.path()).unwrap();
    a_corrupted_record_in_a_long_read_is_named(&store).await;
}

#[tokio::test]
async fn redb_a_corrupted_record_in_a_long_read_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = keel_store::open_redb(dir.path()).unwrap();
    a_corrupted_record_in_a_long_read_is_named(&store).await;
}

#[tokio::test]
async fn memory_an_undecodable_checkpoint_is_passed_over() {
    let store = keel_store::open_memory().unwrap();
    an_undecodable_checkpoint_is_passed_over(&store).await;
}

#[tokio::test]
async fn redb_an_undecodable_checkpoint_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = keel_store::open_redb(dir.path()).unwrap();
    an_undecodable_checkpoint_is_passed_over(&store).await;
}

async fn survives_reopen_and_refuses_a_second_opener(
    open: impl Fn(&std::path::Path) -> keel_store::Result<Arc<dyn EventLog>>,
) {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path()).unwrap();
        seed(&*log, "a", 5).await;
        log.put_blob(b"image".to_vec()).await.unwrap();
        let error = match open(dir.path()) {
            Ok(_) => panic!("a second store opened a locked data dir"),
            Err(error) => error,
        };
        assert!(
            matches!(&error, Error::InUse { pid: Some(pid), .. } if *pid == std::process::id()),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("in use by pid {}", std::process::id())),
            "{error}"
        );
    }
    let log = open(dir.path()).unwrap();
    assert_eq!(log.last_seq(&id("a")).await.unwrap(), 7);
    assert!(log
        .get_blob(&keel_store::blob_hash(b"image"))
        .await
        .unwrap()
        .is_some());
    // Appends carry on after a reopen, still checked for contiguity.
    assert!(log.append(&id("a"), messages(8, 1)).await.is_err());
    log.append(&id("a"), messages(7, 1)).await.unwrap();
    assert_eq!(log.list(false).await.unwrap()[0].last_seq, 8);
}

#[tokio::test]
async fn sled_survives_reopen_and_refuses_a_second_opener() {
    survives_reopen_and_refuses_a_second_opener(|dir| {
        keel_store::open_sled(dir).map(|log| Arc::new(log) as Arc<dyn EventLog>)
    })
    .await;
}

#[tokio::test]
async fn redb_survives_reopen_and_refuses_a_second_opener() {
    survives_reopen_and_refuses_a_second_opener(|dir| {
        keel_store::open_redb(dir).map(|log| Arc::new(log) as Arc<dyn EventLog>)
    })
    .await;
}

/// A backend whose commits fail from a given moment, like a disk whose
/// fsync reports EIO, and whose scans panic when told to, like an engine
/// with a bug.
struct FailingBackend {
    inner: keel_store::MemoryBackend,
    fail: std::sync::atomic::AtomicBool,
    panic_in_scans: std::sync::atomic::AtomicBool,
}

impl Backend for FailingBackend {
    fn name(&self) -> &'static str {
        "failing"
    }
    fn commit(&self, writes: &[Write]) -> keel_store::Result<()> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::DiskFull {
                source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            });
        }
        self.inner.commit(writes)
    }
    fn get(&self, key: &[u8]) -> keel_store::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }
    fn visit_range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        visit: &mut keel_store::backend::Visit<'_>,
    ) -> keel_store::Result<()> {
        if self
            .panic_in_scans
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            panic!("the engine has a bug");
        }
        self.inner.visit_range(start, end, limit, visit)
    }
    fn last(
        &self,
        start: &[u8],
        end: &[u8],
    ) -> keel_store::Result<Option<keel_store::backend::Entry>> {
        self.inner.last(start, end)
    }
    fn tail(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> keel_store::Result<Vec<keel_store::backend::Entry>> {
        self.inner.tail(start, end, limit)
    }
}

#[tokio::test]
async fn a_failed_flush_is_fatal_and_never_retried() {
    let store = keel_store::Store::new(
        FailingBackend {
            inner: keel_store::MemoryBackend::new(),
            fail: false.into(),
            panic_in_scans: false.into(),
        },
        None,
    )
    .unwrap();
    seed(&store, "a", 2).await;
    store
        .backend()
        .fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let error = store.append(&id("a"), messages(4, 1)).await.unwrap_err();
    assert!(
        matches!(&error, Error::Fatal { reason } if reason.contains("disk is full")),
        "{error}"
    );
    // Even once the disk "recovers", the store takes no more writes: the
    // runtime must restart and recover from the log.
    store
        .backend()
        .fail
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(
        store.append(&id("a"), messages(4, 1)).await,
        Err(Error::Fatal { .. })
    ));
    assert!(matches!(
        store.put_blob(b"x".to_vec()).await,
        Err(Error::Fatal { .. })
    ));
    // What was durable stays readable.
    assert_eq!(store.last_seq(&id("a")).await.unwrap(), 4);
}

/// A read that panics on the blocking pool is an error of the read, not a
/// crash of the caller, and the store goes on serving.
#[tokio::test]
async fn a_read_that_panics_is_an_error_and_the_store_goes_on() {
    let store = keel_store::Store::new(
        FailingBackend {
            inner: keel_store::MemoryBackend::new(),
            fail: false.into(),
            panic_in_scans: false.into(),
        },
        None,
    )
    .unwrap();
    seed(&store, "a", 2).await;
    store
        .backend()
        .panic_in_scans
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let error = store.read_all(&id("a")).await.unwrap_err();
    assert!(matches!(&error, Error::ReadAborted { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "a store read on the blocking pool panicked"
    );
    store
        .backend()
        .panic_in_scans
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(store.read_all(&id("a")).await.unwrap().len(), 4);
    store.append(&id("a"), messages(4, 1)).await.unwrap();
}

/// `Store::drop` returns only once its threads are done and the engine and
/// the data dir's lock are let go: a daemon stopping then starting again
/// (or a test reopening at once) finds the dir free, with no wait.
#[tokio::test]
async fn a_dropped_store_has_let_go_of_its_data_dir() {
    for kind in [keel_store::BackendKind::Redb, keel_store::BackendKind::Sled] {
        let dir = tempfile::tempdir().unwrap();
        let log = keel_store::open(kind, dir.path(), None).unwrap();
        assert_eq!(log.backend(), kind.to_string(), "the backend says its name");
        seed(&*log, "a", 3).await;
        drop(log);
        DirLock::acquire_within(dir.path(), Duration::ZERO)
            .unwrap_or_else(|error| panic!("{kind}: {error}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_reopen_and_refuses_a_second_opener() {
    let Some(server) = keel_test_support::postgres::Postgres::start() else {
        return;
    };
    let url = server.url();
    // As a daemon opens it: its data dir locked as the embedded engines'.
    survives_reopen_and_refuses_a_second_opener(|dir| {
        keel_store::open_postgres_with_dir(&url, dir).map(|log| Arc::new(log) as Arc<dyn EventLog>)
    })
    .await;
    // Whatever the directory, the database itself is held by one keel,
    // and free again the moment that keel lets go.
    let first = keel_store::open_postgres(&url).unwrap();
    let error = match keel_store::open_postgres(&url) {
        Ok(_) => panic!("a second keel opened a held database"),
        Err(error) => error,
    };
    assert!(
        error.to_string().contains("in use by another keel"),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains(&format!("127.0.0.1:{}", server.port())),
        "the message names the database: {error}"
    );
    drop(first);
    let again = keel_store::open_postgres(&url).unwrap();
    assert_eq!(again.last_seq(&id("a")).await.unwrap(), 8);
}

/// A database whose schema a newer keel wrote is refused, and left as it
/// was; one with no schema gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_schema_from_a_newer_keel() {
    let Some(server) = keel_test_support::postgres::Postgres::start() else {
        return;
    };
    let url = server.url();
    drop(keel_store::open_postgres(&url).unwrap());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    client
        .execute("UPDATE keel_schema SET version = 99", &[])
        .await
        .unwrap();
    let error = match keel_store::open_postgres(&url) {
        Ok(_) => panic!("a schema from a newer keel was taken"),
        Err(error) => error,
    };
    assert!(error.to_string().contains("schema version 99"), "{error}");
    let version: i32 = client
        .query_one("SELECT version FROM keel_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 99, "the refusal changed nothing");
    drop(client);
    connection.await.unwrap().unwrap();
}

/// A node whose epoch another node moved on (taking its conversations
/// over) commits nothing more: the append that finds it fails, the store
/// stops, and the log keeps what was committed before and nothing of the
/// refused append. Started again, the node writes under a new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_fenced_node_writes_no_more() {
    let Some(server) = keel_test_support::postgres::Postgres::start() else {
        return;
    };
    let url = server.url();
    let a = keel_store::open_postgres_node(&url, "node-a").unwrap();
    assert_eq!(a.backend().epoch(), Some(1));
    seed(&a, "c", 3).await;
    let committed = a.last_seq(&id("c")).await.unwrap();

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let moved = client
        .execute(
            "UPDATE keel_nodes SET epoch = epoch + 1 WHERE node = 'node-a'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(moved, 1);

    let error = a
        .append(&id("c"), messages(committed, 1))
        .await
        .expect_err("a fenced node's append");
    assert!(
        error.to_string().contains("node node-a was fenced off")
            && error.to_string().contains("epoch 2"),
        "{error}"
    );
    assert!(
        a.append(&id("c"), messages(committed, 1)).await.is_err(),
        "the store stopped"
    );
    drop(a);

    let again = keel_store::open_postgres_node(&url, "node-a").unwrap();
    assert_eq!(
        again.backend().epoch(),
        Some(3),
        "a new epoch at each start"
    );
    assert_eq!(again.last_seq(&id("c")).await.unwrap(), committed);
    again
        .append(&id("c"), messages(committed, 1))
        .await
        .unwrap();
    assert_eq!(again.last_seq(&id("c")).await.unwrap(), committed + 1);

    // A node another one removed is fenced off as well.
    client
        .execute("DELETE FROM keel_nodes WHERE node = 'node-a'", &[])
        .await
        .unwrap();
    let error = again
        .append(&id("c"), messages(committed + 1, 1))
        .await
        .expect_err("a removed node's append");
    assert!(error.to_string().contains("no such node"), "{error}");
    drop(again);
    drop(client);
    connection.await.unwrap().unwrap();
}

/// A database an older keel wrote (schema version 1: only `keel_kv`) is
/// brought up to date at open, its data kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_brings_an_older_schema_up_to_date() {
    let Some(server) = keel_test_support::postgres::Postgres::start() else {
        return;
    };
    let url = server.url();
    {
        let log = keel_store::open_postgres(&url).unwrap();
        seed(&log, "a", 2).await;
    }
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    client
        .batch_execute(
            "DROP TABLE keel_nodes, keel_owners, keel_writers; UPDATE keel_schema SET version = 1;",
        )
        .await
        .unwrap();
    let node = keel_store::open_postgres_node(&url, "n").unwrap();
    assert_eq!(node.last_seq(&id("a")).await.unwrap(), 4);
    let version: i32 = client
        .query_one("SELECT version FROM keel_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 3);
    drop(node);
    drop(client);
    connection.await.unwrap().unwrap();
}

/// Nodes over one database (docs/nodes.md): one owner per tree, whoever
/// asks; a node not heard from within the lease is fenced by another (its
/// heartbeats, claims and commits refused from then on) and its trees are
/// shared out among the live nodes by rendezvous hashing, each taken by
/// exactly one; a fenced node started again owns nothing it lost, and the
/// writers' record says who appended which seqs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nodes_claim_fence_and_take_over() {
    let Some(server) = keel_test_support::postgres::Postgres::start() else {
        return;
    };
    let url = server.url();
    let lease = std::time::Duration::from_secs(30);
    let a = keel_store::open_postgres_node(&url, "node-a").unwrap();
    let b = keel_store::open_postgres_node(&url, "node-b").unwrap();
    let c = keel_store::open_postgres_node(&url, "node-c").unwrap();
    let [na, nb, nc] = [&a, &b, &c].map(|log| log.backend().nodes().unwrap());
    for (nodes, port) in [(&na, 1), (&nb, 2), (&nc, 3)] {
        nodes
            .heartbeat(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap();
    }

    // One owner, whoever claims first; the others are told who.
    assert_eq!(na.claim("first", lease).await.unwrap().node, "node-a");
    let told = nb.claim("first", lease).await.unwrap();
    assert_eq!(told.node, "node-a");
    assert_eq!(told.addr.as_deref(), Some("http://127.0.0.1:1"));
    assert!(told.live);
    let roots: Vec<String> = (0..40).map(|i| format!("root-{i}")).collect();
    for root in &roots {
        assert_eq!(na.claim(root, lease).await.unwrap().node, "node-a");
    }
    assert_eq!(na.owned().await.unwrap().len(), 41);
    seed(&a, "first", 3).await;
    assert!(
        nb.fence_stale(lease).await.unwrap().is_empty(),
        "everyone is fresh"
    );

    // a falls silent past its lease (by PostgreSQL's clock).
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    client
        .execute(
            "UPDATE keel_nodes SET heartbeat_at = now() - interval '1 hour' WHERE node = 'node-a'",
            &[],
        )
        .await
        .unwrap();
    let listed = nb.list(lease).await.unwrap();
    assert!(
        !listed[0].live && listed[1].live && listed[2].live,
        "{listed:?}"
    );
    assert_eq!(
        nb.fence_stale(lease).await.unwrap(),
        vec!["node-a".to_owned()]
    );
    assert!(
        nc.fence_stale(lease).await.unwrap().is_empty(),
        "fenced once"
    );
    for refused in [
        na.heartbeat("http://127.0.0.1:1").await.map(|_| ()),
        na.claim("new", lease).await.map(|_| ()),
        na.take_over(lease).await.map(|_| ()),
    ] {
        let error = refused.expect_err("a fenced node is refused");
        assert!(error.to_string().contains("fenced off"), "{error}");
    }
    let committed = a.last_seq(&id("first")).await.unwrap();
    assert!(a
        .append(&id("first"), messages(committed, 1))
        .await
        .is_err());

    // b and c share a's trees out: each root taken once, by the node
    // rendezvous hashing gives it.
    let by_b = nb.take_over(lease).await.unwrap();
    let by_c = nc.take_over(lease).await.unwrap();
    assert!(nb.take_over(lease).await.unwrap().is_empty(), "taken once");
    let live = vec!["node-b".to_owned(), "node-c".to_owned()];
    for root in &by_b {
        assert_eq!(keel_store::rendezvous(root, &live), Some("node-b"));
    }
    for root in &by_c {
        assert_eq!(keel_store::rendezvous(root, &live), Some("node-c"));
    }
    let mut all: Vec<String> = by_b.iter().chain(&by_c).cloned().collect();
    all.sort();
    let mut expected: Vec<String> = roots.iter().cloned().chain(["first".to_owned()]).collect();
    expected.sort();
    assert_eq!(all, expected);
    assert!(!by_b.is_empty() && !by_c.is_empty(), "{by_b:?} {by_c:?}");

    // The new owner appends; the record names both writers, in turn.
    let owner = nb.owner("first", lease).await.unwrap().unwrap().node;
    let writer = if owner == "node-b" { &b } else { &c };
    writer
        .append(&id("first"), messages(committed, 2))
        .await
        .unwrap();
    let writers = nb.writers("first").await.unwrap();
    let stretches: Vec<(&str, i64, i64, i64)> = writers
        .iter()
        .map(|w| (w.node.as_str(), w.epoch, w.first_seq, w.last_seq))
        .collect();
    let committed = i64::try_from(committed).unwrap();
    assert_eq!(
        stretches,
        vec![
            ("node-a", 1, 1, committed),
            (owner.as_str(), 1, committed + 1, committed + 2)
        ]
    );

    // a started again: a new epoch, live, owning nothing it lost.
    drop(a);
    let again = keel_store::open_postgres_node(&url, "node-a").unwrap();
    let na = again.backend().nodes().unwrap();
    assert_eq!(na.epoch(), 3);
    na.heartbeat("http://127.0.0.1:1").await.unwrap();
    assert!(na.owned().await.unwrap().is_empty());
    assert!(na.list(lease).await.unwrap()[0].live);
    assert_eq!(na.claim("new", lease).await.unwrap().node, "node-a");
    drop((again, b, c, client));
    connection.await.unwrap().unwrap();
}
