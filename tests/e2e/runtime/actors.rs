//! `Runtime::actors`, the list behind `/admin/actors` and `keel ps`: every
//! message sent to a conversation is counted into its mailbox and out as
//! the actor takes it, so a conversation at rest shows an empty mailbox
//! after a full turn (tool output, worker reports, subscriptions); and an
//! actor stuck on one message (here a store write that does not return)
//! is still listed, not responding, with the messages piling up behind it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use keel_actors::core::event::Event;
use keel_actors::core::ids::{ConversationId, Seq};
use keel_actors::core::snapshot::FsmSnapshot;
use keel_actors::store::IndexEntry;
use keel_actors::ActorStats;
use tokio::sync::watch as gate;

use super::*;

/// A store whose appends wait while its gate is shut, and that counts
/// the reads of events.
struct GatedAppends {
    inner: Arc<dyn EventLog>,
    open: gate::Sender<bool>,
    waiting: AtomicUsize,
    reads: AtomicUsize,
}

impl GatedAppends {
    fn over(inner: Arc<dyn EventLog>) -> GatedAppends {
        let (open, _) = gate::channel(true);
        GatedAppends {
            inner,
            open,
            waiting: AtomicUsize::new(0),
            reads: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl EventLog for GatedAppends {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn append(
        &self,
        conversation: &ConversationId,
        events: Vec<Event>,
    ) -> keel_actors::store::Result<()> {
        let mut open = self.open.subscribe();
        if !*open.borrow() {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let _ = open.wait_for(|open| *open).await;
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.inner.append(conversation, events).await
    }

    async fn read(
        &self,
        conversation: &ConversationId,
        from: Seq,
        limit: usize,
    ) -> keel_actors::store::Result<Vec<Event>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read(conversation, from, limit).await
    }

    async fn read_tail(
        &self,
        conversation: &ConversationId,
        n: usize,
    ) -> keel_actors::store::Result<Vec<Event>> {
        self.inner.read_tail(conversation, n).await
    }

    async fn last_seq(&self, conversation: &ConversationId) -> keel_actors::store::Result<Seq> {
        self.inner.last_seq(conversation).await
    }

    async fn save_snapshot(
        &self,
        conversation: &ConversationId,
        snapshot: &FsmSnapshot,
    ) -> keel_actors::store::Result<()> {
        self.inner.save_snapshot(conversation, snapshot).await
    }

    async fn load_snapshot(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<Option<FsmSnapshot>> {
        self.inner.load_snapshot(conversation).await
    }

    async fn save_checkpoint(
        &self,
        conversation: &ConversationId,
        working: &WorkingSet,
    ) -> keel_actors::store::Result<()> {
        self.inner.save_checkpoint(conversation, working).await
    }

    async fn load_checkpoint(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<Option<WorkingSet>> {
        self.inner.load_checkpoint(conversation).await
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> keel_actors::store::Result<String> {
        self.inner.put_blob(bytes).await
    }

    async fn get_blob(&self, hash: &str) -> keel_actors::store::Result<Option<Vec<u8>>> {
        self.inner.get_blob(hash).await
    }

    async fn index_entry(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<Option<IndexEntry>> {
        self.inner.index_entry(conversation).await
    }

    async fn list(&self, include_sub_agents: bool) -> keel_actors::store::Result<Vec<IndexEntry>> {
        self.inner.list(include_sub_agents).await
    }

    async fn delete(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<keel_actors::store::Deleted> {
        self.inner.delete(conversation).await
    }

    async fn sweep_unreferenced_blobs(
        &self,
        older_than: std::time::Duration,
    ) -> keel_actors::store::Result<keel_actors::store::Swept> {
        self.inner.sweep_unreferenced_blobs(older_than).await
    }

    async fn reclaim(&self) -> keel_actors::store::Result<keel_actors::store::Reclaimed> {
        self.inner.reclaim().await
    }
}

async fn stats_of(runtime: &Runtime, conversation: &ConversationHandle) -> ActorStats {
    let all = runtime.actors().await;
    let mut mine: Vec<ActorStats> = all
        .into_iter()
        .filter(|stats| &stats.id == conversation.id())
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    mine.remove(0)
}

/// Lists until `check` holds of the conversation's entry (bounded).
async fn listed_until(
    runtime: &Runtime,
    conversation: &ConversationHandle,
    what: &str,
    check: impl Fn(&ActorStats) -> bool,
) -> ActorStats {
    let listed = tokio::time::timeout(PATIENCE, async {
        loop {
            let stats = stats_of(runtime, conversation).await;
            if check(&stats) {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    listed.unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_actor_list_counts_the_mailbox_and_shows_a_stuck_actor() {
    let rig = Rig::new();
    let store = Arc::new(GatedAppends::over(rig.store(BackendKind::Memory)));
    let runtime = rig.runtime(store.clone()).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();

    // A full turn with a tool: the worker's reports, the tool's output and
    // a subscription all go through the mailbox and are all taken out.
    let mut watching = watch(&conversation).await;
    conversation
        .send("run: echo counted", Vec::new())
        .await
        .unwrap();
    watching.reach(StateName::ExecutingTools).await;
    watching.reach(StateName::Idle).await;
    drop(watching);
    let at_rest = listed_until(
        &runtime,
        &conversation,
        "an empty mailbox at rest",
        |stats| stats.mailbox == 0,
    )
    .await;
    assert!(at_rest.responding, "{at_rest:?}");
    assert_eq!(at_rest.state, StateName::Idle);
    assert!(
        at_rest.memory_bytes.is_some_and(|bytes| bytes > 0),
        "{at_rest:?}"
    );
    assert_eq!(at_rest.subscribers, Some(0), "{at_rest:?}");

    // Now the store stops answering in the middle of the next message.
    store.open.send_replace(false);
    let send = {
        let conversation = conversation.clone();
        tokio::spawn(async move { conversation.send("hello", Vec::new()).await })
    };
    eventually("the actor waits on its store", || {
        store.waiting.load(Ordering::SeqCst) == 1
    })
    .await;
    let mut inspections = Vec::new();
    for _ in 0..3 {
        let conversation = conversation.clone();
        inspections.push(tokio::spawn(async move { conversation.inspect().await }));
    }
    // Three inspections and (at least) the listing's own question wait.
    let stuck = listed_until(&runtime, &conversation, "a stuck actor listed", |stats| {
        !stats.responding && stats.mailbox >= 4
    })
    .await;
    assert_eq!(
        stuck.state,
        StateName::Idle,
        "the state it was last seen in"
    );
    assert_eq!(stuck.memory_bytes, None);
    assert_eq!(stuck.subscribers, None);

    // The store answers again: everything queued is taken, the turn runs.
    store.open.send_replace(true);
    send.await.unwrap().unwrap();
    for inspection in inspections {
        inspection.await.unwrap().unwrap();
    }
    let drained = listed_until(&runtime, &conversation, "the mailbox drained", |stats| {
        stats.responding && stats.mailbox == 0 && stats.state == StateName::Idle
    })
    .await;
    assert!(drained.memory_bytes.is_some(), "{drained:?}");
    runtime.shutdown().await;
}

/// Every canonical event from `from` through `last` that `conversation`'s
/// subscription yields, in order.
async fn heard_from(conversation: &ConversationHandle, from: Seq, last: Seq) -> Vec<Seq> {
    let mut following = conversation.subscribe_from(from).await.unwrap();
    let mut heard = Vec::new();
    while heard.last().is_none_or(|seq| *seq < last) {
        match tokio::time::timeout(PATIENCE, following.next()).await {
            Ok(Received::Update(Update::Event { event })) => heard.push(event.seq),
            Ok(Received::Update(_)) => {}
            other => panic!("following from {from} got {other:?}"),
        }
    }
    heard
}

/// Follow `conversation` from `from` to its log's end, check that exactly
/// the log came, and say how many reads of events the store made for it.
async fn follow_counting_reads(
    store: &GatedAppends,
    conversation: &ConversationHandle,
    from: Seq,
) -> usize {
    let log = store.inner.read_all(conversation.id()).await.unwrap();
    let expected: Vec<Seq> = log
        .iter()
        .map(|event| event.seq)
        .filter(|seq| *seq >= from)
        .collect();
    let last = conversation.inspect().await.unwrap().last_seq;
    let reads = store.reads.load(Ordering::SeqCst);
    assert_eq!(heard_from(conversation, from, last).await, expected);
    store.reads.load(Ordering::SeqCst) - reads
}

/// A conversation whose `bash` waits for an approval, started on
/// `runtime` with `text`: it, a watch of it, and the message's id, once the
/// turn waits.
async fn waiting_on_approval(
    rig: &Rig,
    runtime: &Runtime,
    text: &str,
) -> (ConversationHandle, Watch, keel_actors::core::ids::EventId) {
    let mut config = config();
    config.tools.insert("bash".to_owned(), ToolPolicy::Approve);
    let conversation = runtime.create(rig.cwd(), config).await.unwrap();
    let mut watching = watch(&conversation).await;
    let sent = conversation.send(text, Vec::new()).await.unwrap();
    watching.reach(StateName::AwaitingInput).await;
    (conversation, watching, sent)
}

/// Deny the call the turn waits on, and wait for the turn to end.
async fn deny_and_rest(conversation: &ConversationHandle, watching: &mut Watch) {
    let call = conversation.inspect().await.unwrap().pending[0]
        .call
        .id
        .clone();
    conversation.resolve(call, Decision::Deny).await.unwrap();
    watching.reach(StateName::Idle).await;
}

/// A client that sends and then follows from its message's seq, while the
/// turn it started runs or just after it ended (a busy daemon answers the
/// follow late), is served the turn's events from the actor's memory: the
/// store reads nothing, and it gets exactly the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_of_the_turn_in_progress_reads_nothing_from_the_store() {
    let rig = Rig::new();
    let store = Arc::new(GatedAppends::over(rig.store(BackendKind::Memory)));
    let runtime = rig.runtime(store.clone()).await;
    let (conversation, mut watching, sent) =
        waiting_on_approval(&rig, &runtime, "run: echo followed").await;
    assert_eq!(
        follow_counting_reads(&store, &conversation, sent.seq).await,
        0,
        "mid-turn: from memory"
    );

    // Denied, the turn ends; a follow just after is still served from memory.
    deny_and_rest(&conversation, &mut watching).await;
    assert_eq!(
        follow_counting_reads(&store, &conversation, sent.seq).await,
        0,
        "just after: from memory"
    );
    runtime.shutdown().await;
}

/// Once an idle check finds no turn running, the actor lets go of the
/// turn's events and a follow reads them from the log; while a turn runs
/// (here one waiting on an approval), idle checks keep them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_check_between_turns_lets_go_of_the_turns_events() {
    let rig = Rig::new();
    let store = Arc::new(GatedAppends::over(rig.store(BackendKind::Memory)));
    let runtime = rig
        .open(RuntimeConfig {
            settings: Settings {
                idle_check: Duration::from_millis(5),
                ..Settings::default()
            },
            ..rig.runtime_config(store.clone())
        })
        .await;
    let (conversation, mut watching, sent) =
        waiting_on_approval(&rig, &runtime, "run: echo kept").await;
    // Many idle checks pass while the turn waits on its approval.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        follow_counting_reads(&store, &conversation, sent.seq).await,
        0,
        "kept mid-turn"
    );

    deny_and_rest(&conversation, &mut watching).await;
    let read_from_log = tokio::time::timeout(PATIENCE, async {
        while follow_counting_reads(&store, &conversation, sent.seq).await == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(read_from_log.is_ok(), "an idle check let go of the events");
    runtime.shutdown().await;
}
