//! `Store<B>`: the event log, snapshots, blobs and the index over any
//! [`Backend`], with group commit.
//!
//! All writes go through one committer thread. It takes every request that
//! is waiting, checks each append (contiguous seqs, `Created` first),
//! stages its events and index entry, writes the lot as one atomic batch,
//! makes it durable once, and only then answers each caller. Many
//! conversations appending at once therefore share a flush, while each
//! caller still waits for its own durability.
//!
//! A failed commit is never retried: the store records the failure and
//! refuses every later write (`Error::Fatal`); the runtime restarts and
//! recovers from the log.
//!
//! The checks each request goes through before it joins a batch are in
//! `staging.rs`.
//!
//! Reads do not go through the committer: each runs against the engine on
//! tokio's blocking pool (`reads.rs`), because an engine read blocks on
//! the disk and a long one is milliseconds of decoding, and a tokio worker
//! thread stalled by either stalls every task it serves. Reads decode
//! records straight from the engine's bytes ([`Backend::visit_range`]). A
//! long read (a rebuild of a long conversation) is mostly decoding, so it
//! copies the records out once and decodes them on every core
//! (`records.rs`).
//!
//! Deletes, blob sweeps and reclaiming space also go through the
//! committer, in order with the appends around them, but each run of them
//! waits for every commit before it and reads the engine itself
//! (`removal.rs`). Which conversations refer to which blobs is kept as
//! keys beside the events (`refs.rs`); uploads still waiting for their
//! message are kept in memory (`uploads.rs`).

mod reads;
mod records;
mod refs;
mod removal;
mod staging;
mod uploads;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{oneshot, watch};

use keel_core::codec;
use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};
use keel_core::reducer::WorkingSet;
use keel_core::snapshot::FsmSnapshot;

use crate::backend::{Backend, Write};
use crate::deletion::{Deleted, Reclaimed, Swept};
use crate::error::{Error, Result};
use crate::index::IndexEntry;
use crate::keys;
use crate::lock::DirLock;
use crate::log::{Availability, EventLog};

/// Most requests one commit takes, so a flood of writers cannot make one
/// batch (and its callers' wait) unbounded.
const MAX_BATCH: usize = 4096;

/// Batches up to this many requests commit on the committer's own thread
/// when no batch is in flight (see `Committer::run`).
const INLINE_BATCH: usize = 16;

type Reply<T = ()> = oneshot::Sender<Result<T>>;

enum Request {
    /// Staged with whatever else is waiting, and committed as one batch.
    Plain(Plain),
    /// Runs once every commit before it is durable (`removal.rs`).
    Alone(Alone),
}

enum Plain {
    Append {
        conversation: ConversationId,
        events: Vec<Event>,
        /// The events already encoded, by the caller: encoding is the one
        /// part of an append that parallelises, so it stays off the
        /// committer's single thread.
        encoded: Vec<Vec<u8>>,
        reply: Reply,
    },
    /// A snapshot or checkpoint: plain writes that ride along with the
    /// next batch. Dropped when `conversation` has no log (it was deleted,
    /// or never created): a cache of nothing, which a conversation created
    /// again under the same id would take for its own.
    Cache {
        conversation: ConversationId,
        writes: Vec<Write>,
        reply: Reply,
    },
    /// A blob: written unless the store has it, and either way counted as
    /// an upload whose message is still to come (`uploads.rs`).
    Blob {
        hash: String,
        bytes: Vec<u8>,
        reply: Reply,
    },
}

/// The requests that read the engine as the commits before them left it.
enum Alone {
    Delete {
        conversation: ConversationId,
        reply: Reply<Deleted>,
    },
    Sweep {
        older_than: Duration,
        reply: Reply<Swept>,
    },
    Reclaim {
        reply: Reply<Reclaimed>,
    },
}

pub struct Store<B: Backend> {
    /// Shared with the committer, the writer and every read running on the
    /// blocking pool.
    engine: Arc<Engine<B>>,
    /// `None` only while dropping.
    requests: Option<Sender<Request>>,
    committer: Option<JoinHandle<()>>,
    /// Commits what the committer staged; ends after it.
    writer: Option<JoinHandle<()>>,
    /// Set once, by the first failed commit.
    fatal: Arc<Halt>,
}

/// Why the store stopped taking writes, set once by the first failed
/// commit, and a watch that tells whoever waits on [`Availability`].
struct Halt {
    reason: OnceLock<String>,
    notify: watch::Sender<Option<Arc<str>>>,
}

impl Halt {
    fn new() -> Halt {
        Halt {
            reason: OnceLock::new(),
            notify: watch::Sender::new(None),
        }
    }

    fn get(&self) -> Option<&String> {
        self.reason.get()
    }

    /// Record the first failure; a later one changes nothing.
    fn set(&self, reason: String) {
        if self.reason.set(reason.clone()).is_ok() {
            self.notify.send_replace(Some(reason.into()));
        }
    }
}

/// The engine and the lock on its data directory, let go of together by
/// whoever holds them last, the engine first (fields drop in order). That
/// is the store once its threads have ended, unless a read whose caller
/// gave up on it is still running on the blocking pool: the directory then
/// stays locked until that read lets go of the engine, so that no other
/// store opens the engine's files while this one still has them open.
struct Engine<B> {
    backend: B,
    /// `None` when there is no directory (the memory backend).
    _lock: Option<DirLock>,
}

impl<B: Backend> Store<B> {
    /// Serve `backend`; `lock` is the data directory's lock, if it has one.
    pub fn new(backend: B, lock: Option<DirLock>) -> Result<Store<B>> {
        let engine = Arc::new(Engine {
            backend,
            _lock: lock,
        });
        let fatal = Arc::new(Halt::new());
        let mark_refs = refs::ensure_complete(&engine.backend)?;
        let (requests, receiver) = mpsc::channel();
        let (staged, to_write) = mpsc::sync_channel::<Staged>(1);
        let thread_error = |source| Error::Io {
            path: "committer thread".into(),
            source,
        };
        let in_flight = Arc::new(AtomicUsize::new(0));
        let writer = {
            let engine = Arc::clone(&engine);
            let fatal = Arc::clone(&fatal);
            let in_flight = Arc::clone(&in_flight);
            std::thread::Builder::new()
                .name(format!("keel-{}-write", engine.backend.name()))
                .spawn(move || write_batches(&engine.backend, &fatal, &in_flight, to_write))
                .map_err(thread_error)?
        };
        let committer = {
            let engine = Arc::clone(&engine);
            let fatal = Arc::clone(&fatal);
            std::thread::Builder::new()
                .name(format!("keel-{}-commit", engine.backend.name()))
                .spawn(move || {
                    Committer::new(engine, fatal, in_flight, mark_refs).run(receiver, staged)
                })
                .map_err(thread_error)?
        };
        Ok(Store {
            engine,
            requests: Some(requests),
            committer: Some(committer),
            writer: Some(writer),
            fatal,
        })
    }

    /// The engine underneath, for tests that need to reach past the log.
    pub fn backend(&self) -> &B {
        &self.engine.backend
    }

    /// Run `read` against the engine on tokio's blocking pool and await its
    /// result. An engine read blocks on the disk, and a long one decodes
    /// for milliseconds: on a runtime thread either would stall every task
    /// that thread serves. The read holds the engine (and with it the
    /// directory's lock) until it ends, even if the caller stops waiting.
    /// Polled outside any tokio runtime, there is no pool to use and no
    /// runtime thread to keep free, so the read runs on the caller's thread.
    async fn off_runtime<T: Send + 'static>(
        &self,
        read: impl FnOnce(&B) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let engine = Arc::clone(&self.engine);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return read(&engine.backend);
        };
        runtime
            .spawn_blocking(move || read(&engine.backend))
            .await
            .map_err(|source| Error::ReadAborted { source })?
    }

    /// Hand a request to the committer and wait for its answer.
    async fn submit<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<T> {
        if let Some(reason) = self.fatal.get() {
            return Err(Error::Fatal {
                reason: reason.clone(),
            });
        }
        let (reply, answer) = oneshot::channel();
        let requests = self.requests.as_ref().ok_or(Error::Closed)?;
        requests.send(make(reply)).map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }
}

impl<B: Backend> Drop for Store<B> {
    fn drop(&mut self) {
        // Closing the channel ends the committer once it has answered
        // everything already sent; every answered append is durable.
        self.requests = None;
        if let Some(committer) = self.committer.take() {
            let _ = committer.join();
        }
        // The committer dropped its end of the staged channel: the writer
        // finishes what is staged, answers, and ends. The engine and the
        // directory's lock go after this, with the last `Arc<Engine>`.
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotRecord {
    v: u32,
    snapshot: FsmSnapshot,
}

fn snapshot_bytes(conversation: &ConversationId, snapshot: &FsmSnapshot) -> Result<Vec<u8>> {
    let record = SnapshotRecord {
        v: 1,
        snapshot: snapshot.clone(),
    };
    serde_json::to_vec(&record).map_err(|error| Error::CorruptMeta {
        what: format!("snapshot of {conversation}"),
        reason: error.to_string(),
    })
}

pub fn blob_hash(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest.iter() {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

#[async_trait]
impl<B: Backend> EventLog for Store<B> {
    fn backend(&self) -> &'static str {
        self.engine.backend.name()
    }

    fn availability(&self) -> Availability {
        Availability::new(self.fatal.notify.subscribe())
    }

    async fn append(&self, conversation: &ConversationId, events: Vec<Event>) -> Result<()> {
        let conversation = conversation.clone();
        let encoded = events.iter().map(codec::encode).collect();
        self.submit(|reply| {
            Request::Plain(Plain::Append {
                conversation,
                events,
                encoded,
                reply,
            })
        })
        .await
    }

    async fn read(
        &self,
        conversation: &ConversationId,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let conversation = conversation.clone();
        self.off_runtime(move |backend| reads::events(backend, &conversation, from, limit))
            .await
    }

    async fn read_tail(&self, conversation: &ConversationId, n: usize) -> Result<Vec<Event>> {
        let conversation = conversation.clone();
        self.off_runtime(move |backend| reads::tail(backend, &conversation, n))
            .await
    }

    async fn last_seq(&self, conversation: &ConversationId) -> Result<Seq> {
        let conversation = conversation.clone();
        self.off_runtime(move |backend| reads::last_seq(backend, &conversation))
            .await
    }

    async fn save_snapshot(
        &self,
        conversation: &ConversationId,
        snapshot: &FsmSnapshot,
    ) -> Result<()> {
        let writes = vec![Write::Put(
            keys::snapshot(conversation),
            snapshot_bytes(conversation, snapshot)?,
        )];
        let conversation = conversation.clone();
        self.submit(|reply| {
            Request::Plain(Plain::Cache {
                conversation,
                writes,
                reply,
            })
        })
        .await
    }

    async fn save_checkpoint(
        &self,
        conversation: &ConversationId,
        working: &WorkingSet,
    ) -> Result<()> {
        let mut writes = vec![Write::Put(
            keys::checkpoint(conversation),
            codec::checkpoint::encode(working),
        )];
        if let Some(snapshot) = FsmSnapshot::of(working) {
            writes.push(Write::Put(
                keys::snapshot(conversation),
                snapshot_bytes(conversation, &snapshot)?,
            ));
        }
        let conversation = conversation.clone();
        self.submit(|reply| {
            Request::Plain(Plain::Cache {
                conversation,
                writes,
                reply,
            })
        })
        .await
    }

    async fn load_checkpoint(&self, conversation: &ConversationId) -> Result<Option<WorkingSet>> {
        let conversation = conversation.clone();
        self.off_runtime(move |backend| reads::checkpoint(backend, &conversation))
            .await
    }

    async fn load_snapshot(&self, conversation: &ConversationId) -> Result<Option<FsmSnapshot>> {
        let conversation = conversation.clone();
        self.off_runtime(move |backend| reads::snapshot(backend, &conversation))
            .await
    }

    /// The committer looks whether the blob is stored: only there is the
    /// answer sure to hold until the message naming it is appended (a
    /// delete or sweep running meanwhile knows of the upload).
    async fn put_blob(&self, bytes: Vec<u8>) -> Result<String> {
        let hash = blob_hash(&bytes);
        let for_committer = hash.clone();
        self.submit(|reply| {
            Request::Plain(Plain::Blob {
                hash: for_committer,
                bytes,
                reply,
            })
        })
        .await?;
        Ok(hash)
    }

    async fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>> {
        let key = keys::blob(hash);
        self.off_runtime(move |backend| backend.get(&key)).await
    }

    /// One key lookup: the `u` key the append naming the blob wrote
    /// (`refs.rs`), whatever the log's length.
    async fn uses_blob(&self, conversation: &ConversationId, hash: &str) -> Result<bool> {
        let key = keys::uses(conversation, hash);
        self.off_runtime(move |backend| backend.contains(&key))
            .await
    }

    async fn index_entry(&self, conversation: &ConversationId) -> Result<Option<IndexEntry>> {
        let conversation = conversation.clone();
        self.off_runtime(move |backend| reads::index_entry(backend, &conversation))
            .await
    }

    async fn list(&self, include_sub_agents: bool) -> Result<Vec<IndexEntry>> {
        self.off_runtime(move |backend| reads::list(backend, include_sub_agents))
            .await
    }

    async fn children(&self, parent: &ConversationId) -> Result<Vec<IndexEntry>> {
        let parent = parent.clone();
        self.off_runtime(move |backend| reads::children(backend, &parent))
            .await
    }

    async fn delete(&self, conversation: &ConversationId) -> Result<Deleted> {
        let conversation = conversation.clone();
        self.submit(|reply| {
            Request::Alone(Alone::Delete {
                conversation,
                reply,
            })
        })
        .await
    }

    async fn sweep_unreferenced_blobs(&self, older_than: Duration) -> Result<Swept> {
        self.submit(|reply| Request::Alone(Alone::Sweep { older_than, reply }))
            .await
    }

    async fn reclaim(&self) -> Result<Reclaimed> {
        self.submit(|reply| Request::Alone(Alone::Reclaim { reply }))
            .await
    }
}

fn decode_index(conversation: &str, bytes: &[u8]) -> Result<IndexEntry> {
    serde_json::from_slice(bytes).map_err(|error| Error::CorruptMeta {
        what: format!("index entry of {conversation}"),
        reason: error.to_string(),
    })
}

/// A checked batch: its writes, and the callers waiting on them.
struct Staged {
    writes: Vec<Write>,
    waiting: Vec<Reply>,
    /// Told once the batch is committed: how the committer waits for the
    /// writer before a delete (`Committer::drain`).
    done: Option<mpsc::Sender<()>>,
}

/// The writer thread: commit each staged batch in order.
fn write_batches<B: Backend>(
    backend: &B,
    fatal: &Halt,
    in_flight: &AtomicUsize,
    batches: Receiver<Staged>,
) {
    while let Ok(mut batch) = batches.recv() {
        let done = batch.done.take();
        commit_batch(backend, fatal, batch);
        in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }
}

/// Commit one batch durably and answer its callers. After a failed commit
/// nothing more is written (a failed flush is never retried): a batch staged
/// meanwhile assumed the failed one's seqs, and is refused with it.
fn commit_batch<B: Backend>(backend: &B, fatal: &Halt, batch: Staged) {
    let Staged {
        writes, waiting, ..
    } = batch;
    let outcome = match fatal.get() {
        Some(reason) => Err(reason.clone()),
        None if writes.is_empty() => Ok(()),
        None => backend.commit(&writes).map_err(|error| {
            let reason = error.to_string();
            fatal.set(reason.clone());
            reason
        }),
    };
    match outcome {
        Ok(()) => {
            for reply in waiting {
                let _ = reply.send(Ok(()));
            }
        }
        Err(reason) => {
            for reply in waiting {
                let _ = reply.send(Err(Error::Fatal {
                    reason: reason.clone(),
                }));
            }
        }
    }
}

/// The committer thread's state: what it knows of each conversation's log
/// end and index entry, so checking an append costs no read.
struct Committer<B: Backend> {
    engine: Arc<Engine<B>>,
    fatal: Arc<Halt>,
    /// Batches handed to the writer and not yet answered.
    in_flight: Arc<AtomicUsize>,
    last_seqs: HashMap<ConversationId, Seq>,
    index: HashMap<ConversationId, IndexEntry>,
    uploads: uploads::Uploads,
    /// The store's blob references are complete but not yet marked so
    /// (`refs::ensure_complete`): the first commit writes the mark.
    mark_refs: bool,
}

impl<B: Backend> Committer<B> {
    fn new(
        engine: Arc<Engine<B>>,
        fatal: Arc<Halt>,
        in_flight: Arc<AtomicUsize>,
        mark_refs: bool,
    ) -> Self {
        Committer {
            engine,
            fatal,
            in_flight,
            last_seqs: HashMap::new(),
            index: HashMap::new(),
            uploads: uploads::Uploads::default(),
            mark_refs,
        }
    }

    /// The first of two stages: take the waiting requests, check and stage
    /// them, and hand each batch to the writer thread, which commits it and
    /// answers its callers. While the engine commits (and waits on the disk)
    /// batch N, batch N+1 is being staged. At most one staged batch waits
    /// for the writer, so a caller's wait stays bounded.
    ///
    /// Deletes that arrive one after another form a run that commits as
    /// one batch of its own, after the batch before it and before the one
    /// after it; a sweep or a reclaim runs alone the same way.
    fn run(mut self, requests: Receiver<Request>, staged: SyncSender<Staged>) {
        while let Ok(first) = requests.recv() {
            let mut received = vec![first];
            while received.len() < MAX_BATCH {
                match requests.try_recv() {
                    Ok(request) => received.push(request),
                    Err(_) => break,
                }
            }
            let mut plain = Vec::new();
            let mut deletes = Vec::new();
            for request in received {
                match request {
                    Request::Alone(Alone::Delete {
                        conversation,
                        reply,
                    }) => {
                        self.dispatch(std::mem::take(&mut plain), &staged);
                        deletes.push((conversation, reply));
                    }
                    Request::Alone(alone) => {
                        self.dispatch(std::mem::take(&mut plain), &staged);
                        self.delete_run(std::mem::take(&mut deletes), &staged);
                        self.alone(alone, &staged);
                    }
                    Request::Plain(request) => {
                        self.delete_run(std::mem::take(&mut deletes), &staged);
                        plain.push(request);
                    }
                }
            }
            self.dispatch(plain, &staged);
            self.delete_run(deletes, &staged);
        }
    }

    /// Stage `batch` and commit it: here, or at the writer.
    fn dispatch(&mut self, batch: Vec<Plain>, staged: &SyncSender<Staged>) {
        if batch.is_empty() {
            return;
        }
        let Some(batch) = self.stage_batch(batch) else {
            return;
        };
        // A small batch with nothing in flight commits right here: the
        // hand-off to the writer would only add a thread wake-up to a
        // lone writer's latency. Batches commit in order either way,
        // because an inline commit happens only when none is pending.
        if batch.waiting.len() <= INLINE_BATCH && self.in_flight.load(Ordering::SeqCst) == 0 {
            commit_batch(&self.engine.backend, &self.fatal, batch);
        } else {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            if let Err(mpsc::SendError(batch)) = staged.send(batch) {
                // The writer is gone (it panicked): answer here.
                commit_batch(&self.engine.backend, &self.fatal, batch);
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if self.fatal.get().is_some() {
            self.last_seqs.clear();
            self.index.clear();
        }
    }
}
