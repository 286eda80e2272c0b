//! Where and in what order the store's commits happen (store.rs,
//! `Committer::run`): a lone small append commits on the committer's own
//! thread, and a batch staged while an earlier one is still with the
//! writer waits for it, so appends become durable, and are answered, in
//! the order they were staged. A delete waits for the batches before it
//! too, and removes what they wrote (store/removal.rs).
//!
//! The engine here is the memory backend behind a [`Probe`] that records
//! each commit with the thread it ran on, and can hold commits at a gate:
//! the next one on the committer's thread, or every one on the writer's.
//! Nothing waits on a clock: each step waits for the store to reach a
//! point the probe sees (the guard's timeout only turns a hang into a
//! failure).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use keel_core::config::ConversationConfig;
use keel_core::event::Event;
use keel_core::ids::ConversationId;
use keel_core::time::Timestamp;
use keel_core::transition::{create, NewConversation};
use keel_store::backend::{Entry, Visit, Write};
use keel_store::{Backend, EventLog, MemoryBackend, Store};

/// How long a step may wait for the store before the test calls it stuck.
const STUCK: Duration = Duration::from_secs(20);

fn id(raw: &str) -> ConversationId {
    ConversationId::new(raw).unwrap()
}

/// `Created` and `SessionStarted` of a new conversation.
fn created(raw: &str) -> Vec<Event> {
    create(
        NewConversation {
            id: id(raw),
            cwd: "/tmp".to_owned(),
            config: ConversationConfig::default(),
            parent_conversation: None,
        },
        Timestamp(1_000),
    )
    .appended()
    .to_vec()
}

/// One durable commit: the thread it ran on and the conversations whose
/// log it started.
#[derive(Debug, Clone)]
struct Commit {
    thread: String,
    started: Vec<String>,
    /// Keys it removed.
    removed: usize,
}

#[derive(Default)]
struct ProbeState {
    commits: Vec<Commit>,
    /// The next commit on the committer's thread waits while this is set.
    hold_committer: bool,
    committer_waiting: bool,
    /// Commits on the writer's thread wait while this is set.
    hold_writer: bool,
    writer_waiting: bool,
    /// The conversations whose log end was looked up (staging a first
    /// append does that), in order.
    looked_up: Vec<String>,
}

struct Probe {
    inner: MemoryBackend,
    state: Mutex<ProbeState>,
    changed: Condvar,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            inner: MemoryBackend::default(),
            state: Mutex::default(),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ProbeState> {
        self.state.lock().unwrap()
    }

    /// Change the state and wake whoever waits on it.
    fn set(&self, change: impl FnOnce(&mut ProbeState)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }

    /// Wait until `reached` holds.
    fn wait_for(&self, what: &str, reached: impl Fn(&ProbeState) -> bool) {
        let state = self.lock();
        let (_state, timeout) = self
            .changed
            .wait_timeout_while(state, STUCK, |state| !reached(state))
            .unwrap();
        assert!(!timeout.timed_out(), "the store never reached: {what}");
    }

    fn commits(&self) -> Vec<Commit> {
        self.lock().commits.clone()
    }
}

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("").to_owned()
}

/// The conversations among `candidates` whose `Created` (seq 1) is written.
fn started_by(writes: &[Write]) -> Vec<String> {
    writes
        .iter()
        .filter_map(|write| match write {
            Write::Put(key, _) => Some(key),
            Write::Remove(_) => None,
        })
        .filter(|key| key.first() == Some(&b'e') && key.ends_with(&1u64.to_be_bytes()))
        .map(|key| String::from_utf8_lossy(&key[1..key.len() - 9]).into_owned())
        .collect()
}

impl Backend for Probe {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn commit(&self, writes: &[Write]) -> keel_store::Result<()> {
        let thread = thread_name();
        {
            let mut state = self.lock();
            if thread.ends_with("-commit") && state.hold_committer {
                state.committer_waiting = true;
                self.changed.notify_all();
                state = self
                    .changed
                    .wait_while(state, |state| state.hold_committer)
                    .unwrap();
                state.committer_waiting = false;
            }
            if thread.ends_with("-write") && state.hold_writer {
                state.writer_waiting = true;
                self.changed.notify_all();
                state = self
                    .changed
                    .wait_while(state, |state| state.hold_writer)
                    .unwrap();
                state.writer_waiting = false;
            }
        }
        self.inner.commit(writes)?;
        self.set(|state| {
            state.commits.push(Commit {
                thread,
                started: started_by(writes),
                removed: writes
                    .iter()
                    .filter(|write| matches!(write, Write::Remove(_)))
                    .count(),
            })
        });
        Ok(())
    }

    fn get(&self, key: &[u8]) -> keel_store::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn visit_range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        visit: &mut Visit<'_>,
    ) -> keel_store::Result<()> {
        self.inner.visit_range(start, end, limit, visit)
    }

    fn last(&self, start: &[u8], end: &[u8]) -> keel_store::Result<Option<Entry>> {
        let looked_up = String::from_utf8_lossy(&start[1..start.len() - 9]).into_owned();
        let last = self.inner.last(start, end);
        self.set(|state| state.looked_up.push(looked_up));
        last
    }

    fn tail(&self, start: &[u8], end: &[u8], limit: usize) -> keel_store::Result<Vec<Entry>> {
        self.inner.tail(start, end, limit)
    }
}

type Append<'a> = Pin<Box<dyn Future<Output = keel_store::Result<()>> + Send + 'a>>;

/// Start an append: its first poll hands the request to the committer.
fn send<'a>(store: &'a Store<Probe>, raw: &str) -> Append<'a> {
    let (conversation, events) = (id(raw), created(raw));
    let mut append: Append<'a> = Box::pin(async move { store.append(&conversation, events).await });
    assert!(
        poll_once(&mut append).is_pending(),
        "an append is answered only once it is committed"
    );
    append
}

fn poll_once(append: &mut Append<'_>) -> Poll<keel_store::Result<()>> {
    append
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

#[tokio::test]
async fn a_lone_small_append_commits_on_the_committers_thread() {
    let store = Store::new(Probe::new(), None).unwrap();
    store.append(&id("alone"), created("alone")).await.unwrap();
    let commits = store.backend().commits();
    assert_eq!(commits.len(), 1, "{commits:?}");
    assert_eq!(commits[0].started, ["alone"]);
    assert!(
        commits[0].thread.ends_with("-commit"),
        "with nothing in flight, a small batch skips the hand-off to the writer: {commits:?}"
    );
}

#[tokio::test]
async fn a_batch_staged_behind_one_at_the_writer_commits_after_it() {
    let store = Store::new(Probe::new(), None).unwrap();
    let probe = store.backend();

    // Hold the committer in its (inline) commit of `a`, so the next
    // appends queue up and are staged as one batch too big to commit inline.
    probe.set(|state| state.hold_committer = true);
    let first = send(&store, "a");
    probe.wait_for("the commit of `a`", |state| state.committer_waiting);
    let crowd: Vec<String> = (0..20).map(|n| format!("crowd-{n}")).collect();
    let mut waiting: Vec<Append<'_>> = crowd.iter().map(|raw| send(&store, raw)).collect();
    probe.set(|state| {
        state.hold_writer = true;
        state.hold_committer = false;
    });
    probe.wait_for("the crowd's batch at the writer", |state| {
        state.writer_waiting
    });

    // With the crowd's batch held at the writer, stage `late`, then
    // `later`: once the committer looks up `later`'s log end, it is done
    // with `late`, which must not be durable before the crowd.
    waiting.push(send(&store, "late"));
    waiting.push(send(&store, "later"));
    probe.wait_for("`later` staged", |state| {
        state.looked_up.iter().any(|raw| raw == "later")
    });
    let commits = probe.commits();
    assert_eq!(
        commits
            .iter()
            .map(|c| c.started.clone())
            .collect::<Vec<_>>(),
        [["a"]],
        "nothing commits while an earlier batch is still with the writer: {commits:?}"
    );
    assert!(
        poll_once(&mut waiting[20]).is_pending(),
        "`late` answered early"
    );

    probe.set(|state| state.hold_writer = false);
    first.await.unwrap();
    for append in waiting {
        append.await.unwrap();
    }
    let order: Vec<String> = probe
        .commits()
        .into_iter()
        .flat_map(|commit| commit.started)
        .collect();
    let mut expected = vec!["a".to_owned()];
    expected.extend(crowd);
    expected.extend(["late".to_owned(), "later".to_owned()]);
    assert_eq!(order, expected, "durable in the order staged");
    // Every log is whole.
    for raw in &expected {
        assert_eq!(store.last_seq(&id(raw)).await.unwrap(), 2, "{raw}");
    }
}

/// A delete sent while the batch before it is still with the writer waits
/// for that batch, then removes the events it wrote: it commits after it,
/// never before, and the conversation is gone whole.
#[tokio::test]
async fn a_delete_waits_for_the_batch_before_it_and_removes_what_it_wrote() {
    let store = Store::new(Probe::new(), None).unwrap();
    let probe = store.backend();
    store
        .append(&id("victim"), created("victim"))
        .await
        .unwrap();

    // As above: a crowd's batch held at the writer, here with a message
    // of the victim's in it.
    probe.set(|state| state.hold_committer = true);
    let first = send(&store, "a");
    probe.wait_for("the commit of `a`", |state| state.committer_waiting);
    let crowd: Vec<String> = (0..20).map(|n| format!("crowd-{n}")).collect();
    let mut waiting: Vec<Append<'_>> = crowd.iter().map(|raw| send(&store, raw)).collect();
    let mut message = created("victim")[1].clone();
    message.seq = 3;
    let mut more: Append<'_> = Box::pin(async { store.append(&id("victim"), vec![message]).await });
    assert!(poll_once(&mut more).is_pending());
    waiting.push(more);
    probe.set(|state| {
        state.hold_writer = true;
        state.hold_committer = false;
    });
    probe.wait_for("the crowd's batch at the writer", |state| {
        state.writer_waiting
    });

    let victim = id("victim");
    let mut delete = Box::pin(store.delete(&victim));
    assert!(
        delete
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending(),
        "a delete is answered only once it is committed"
    );
    // Nothing may commit while the crowd is held: a delete that did not
    // wait would commit here, ahead of the batch with the victim's message
    // (a clock bounds only how long this looks for that mistake).
    let commits = {
        let (state, _) = probe
            .changed
            .wait_timeout_while(probe.lock(), Duration::from_millis(300), |state| {
                state.commits.len() < 3
            })
            .unwrap();
        state.commits.clone()
    };
    assert_eq!(commits.len(), 2, "{commits:?}");

    probe.set(|state| state.hold_writer = false);
    first.await.unwrap();
    for append in waiting {
        append.await.unwrap();
    }
    let deleted = delete.await.unwrap();
    assert_eq!(
        deleted.events, 3,
        "the message from the held batch went too"
    );
    let commits = probe.commits();
    let last = commits.last().unwrap();
    assert_eq!(
        last.removed, 4,
        "three events and the index entry: {commits:?}"
    );
    assert!(last.thread.ends_with("-commit"), "{commits:?}");
    assert_eq!(store.last_seq(&victim).await.unwrap(), 0);
    // The id is free again.
    store.append(&victim, created("victim")).await.unwrap();
}
