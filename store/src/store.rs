//! `Store<B>`: the event log, snapshots, blobs and the index over any
//! [`Backend`], with group commit.
//!
//! All writes go through one committer thread. It takes every request that
//! is waiting, checks each append (contiguous seqs, `Created` first),
//! stages its events and index entry, writes the lot as one atomic batch,
//! makes it durable once, and only then answers each caller. Many
//! conversations appending at once therefore share a flush, while each
//! caller still waits for its own durability. Reads go straight to the
//! backend.
//!
//! A failed commit is never retried: the store records the failure and
//! refuses every later write (`Error::Fatal`); the runtime restarts and
//! recovers from the log.
//!
//! Reads decode records straight from the engine's bytes
//! ([`Backend::visit_range`]). A long read (a rebuild of a long
//! conversation) is mostly decoding, so it copies the records out once and
//! decodes them on every core (`records.rs`).

mod records;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use keel_core::codec;
use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};
use keel_core::snapshot::FsmSnapshot;
use keel_core::working::WorkingSet;

use crate::backend::{Backend, Entry};
use crate::error::{Error, Result};
use crate::index::IndexEntry;
use crate::keys;
use crate::lock::DirLock;
use crate::log::EventLog;
use records::{decode_parallel, decode_record, decode_threads, Records, PARALLEL_READ_FROM};

/// Most requests one commit takes, so a flood of writers cannot make one
/// batch (and its callers' wait) unbounded.
const MAX_BATCH: usize = 4096;

/// Batches up to this many requests commit on the committer's own thread
/// when no batch is in flight (see `Committer::run`).
const INLINE_BATCH: usize = 16;

type Reply = oneshot::Sender<Result<()>>;

enum Request {
    Append {
        conversation: ConversationId,
        events: Vec<Event>,
        /// The events already encoded, by the caller: encoding is the one
        /// part of an append that parallelises, so it stays off the
        /// committer's single thread.
        encoded: Vec<Vec<u8>>,
        reply: Reply,
    },
    /// Snapshots and blobs: plain writes that ride along with the next batch.
    Put { writes: Vec<Entry>, reply: Reply },
}

pub struct Store<B: Backend> {
    backend: Arc<B>,
    /// `None` only while dropping.
    requests: Option<Sender<Request>>,
    committer: Option<JoinHandle<()>>,
    /// Commits what the committer staged; ends after it.
    writer: Option<JoinHandle<()>>,
    /// Set once, by the first failed commit.
    fatal: Arc<OnceLock<String>>,
    /// Released last, after the committer has finished.
    _lock: Option<DirLock>,
}

impl<B: Backend> Store<B> {
    /// Serve `backend`; `lock` is the data directory's lock, if it has one.
    pub fn new(backend: B, lock: Option<DirLock>) -> Result<Store<B>> {
        let backend = Arc::new(backend);
        let fatal = Arc::new(OnceLock::new());
        let (requests, receiver) = mpsc::channel();
        let (staged, to_write) = mpsc::sync_channel::<Staged>(1);
        let thread_error = |source| Error::Io {
            path: "committer thread".into(),
            source,
        };
        let in_flight = Arc::new(AtomicUsize::new(0));
        let writer = {
            let backend = Arc::clone(&backend);
            let fatal = Arc::clone(&fatal);
            let in_flight = Arc::clone(&in_flight);
            std::thread::Builder::new()
                .name(format!("keel-{}-write", backend.name()))
                .spawn(move || write_batches(backend.as_ref(), &fatal, &in_flight, to_write))
                .map_err(thread_error)?
        };
        let committer = {
            let backend = Arc::clone(&backend);
            let fatal = Arc::clone(&fatal);
            std::thread::Builder::new()
                .name(format!("keel-{}-commit", backend.name()))
                .spawn(move || Committer::new(backend, fatal, in_flight).run(receiver, staged))
                .map_err(thread_error)?
        };
        Ok(Store {
            backend,
            requests: Some(requests),
            committer: Some(committer),
            writer: Some(writer),
            fatal,
            _lock: lock,
        })
    }

    /// The engine underneath, for tests that need to reach past the log.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    async fn submit(&self, make: impl FnOnce(Reply) -> Request) -> Result<()> {
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

    /// How many records `read` would return, from the log's last seq
    /// (seqs are contiguous). Only a hint for choosing how to decode: an
    /// append landing meanwhile changes nothing but that choice.
    fn expected_records(
        &self,
        conversation: &ConversationId,
        from: Seq,
        limit: usize,
    ) -> Result<usize> {
        let last = self.last_seq(conversation)?;
        let count = last.checked_sub(from).map_or(0, |n| n.saturating_add(1));
        Ok(usize::try_from(count).unwrap_or(usize::MAX).min(limit))
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
        // finishes what is staged, answers, and ends.
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
        self.backend.name()
    }

    async fn append(&self, conversation: &ConversationId, events: Vec<Event>) -> Result<()> {
        let conversation = conversation.clone();
        let encoded = events.iter().map(codec::encode).collect();
        self.submit(|reply| Request::Append {
            conversation,
            events,
            encoded,
            reply,
        })
        .await
    }

    fn read(&self, conversation: &ConversationId, from: Seq, limit: usize) -> Result<Vec<Event>> {
        let from = from.max(1);
        let (start, end) = keys::events_from(conversation, from);
        // Whether a read is long is known from the log's last seq (about
        // 10 µs to look up on redb), asked only when `limit` allows a long
        // read; a short read then decodes straight from the engine's bytes,
        // without the copy a parallel decode needs.
        let threads = decode_threads();
        if threads > 1
            && limit > PARALLEL_READ_FROM
            && self.expected_records(conversation, from, limit)? > PARALLEL_READ_FROM
        {
            let mut records = Records::default();
            self.backend
                .visit_range(&start, &end, limit, &mut |key, value| {
                    records.push(key, value);
                    Ok(())
                })?;
            return decode_parallel(conversation, records, threads);
        }
        let mut events = Vec::new();
        self.backend
            .visit_range(&start, &end, limit, &mut |key, value| {
                events.push(decode_record(conversation, key, value)?);
                Ok(())
            })?;
        Ok(events)
    }

    fn read_tail(&self, conversation: &ConversationId, n: usize) -> Result<Vec<Event>> {
        let (start, end) = keys::events_from(conversation, 1);
        self.backend
            .tail(&start, &end, n)?
            .iter()
            .map(|(key, value)| decode_record(conversation, key, value))
            .collect()
    }

    fn last_seq(&self, conversation: &ConversationId) -> Result<Seq> {
        let (start, end) = keys::events_from(conversation, 1);
        Ok(self
            .backend
            .last(&start, &end)?
            .and_then(|(key, _)| keys::seq_of(&key))
            .unwrap_or(0))
    }

    async fn save_snapshot(
        &self,
        conversation: &ConversationId,
        snapshot: &FsmSnapshot,
    ) -> Result<()> {
        let writes = vec![(
            keys::snapshot(conversation),
            snapshot_bytes(conversation, snapshot)?,
        )];
        self.submit(|reply| Request::Put { writes, reply }).await
    }

    async fn save_checkpoint(
        &self,
        conversation: &ConversationId,
        working: &WorkingSet,
    ) -> Result<()> {
        let mut writes = vec![(
            keys::checkpoint(conversation),
            codec::checkpoint::encode(working),
        )];
        if let Some(snapshot) = FsmSnapshot::of(working) {
            writes.push((
                keys::snapshot(conversation),
                snapshot_bytes(conversation, &snapshot)?,
            ));
        }
        self.submit(|reply| Request::Put { writes, reply }).await
    }

    fn load_checkpoint(&self, conversation: &ConversationId) -> Result<Option<WorkingSet>> {
        // A cache: one that cannot be used counts as missing.
        Ok(self
            .backend
            .get(&keys::checkpoint(conversation))?
            .and_then(|bytes| codec::checkpoint::decode(&bytes).ok()))
    }

    fn load_snapshot(&self, conversation: &ConversationId) -> Result<Option<FsmSnapshot>> {
        // A snapshot is only a cache: one that cannot be read counts as missing.
        Ok(self
            .backend
            .get(&keys::snapshot(conversation))?
            .and_then(|bytes| serde_json::from_slice::<SnapshotRecord>(&bytes).ok())
            .filter(|record| record.v == 1)
            .map(|record| record.snapshot))
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> Result<String> {
        let hash = blob_hash(&bytes);
        let key = keys::blob(&hash);
        if self.backend.get(&key)?.is_none() {
            let writes = vec![(key, bytes)];
            self.submit(|reply| Request::Put { writes, reply }).await?;
        }
        Ok(hash)
    }

    fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>> {
        self.backend.get(&keys::blob(hash))
    }

    fn index_entry(&self, conversation: &ConversationId) -> Result<Option<IndexEntry>> {
        self.backend
            .get(&keys::index(conversation))?
            .map(|bytes| decode_index(conversation.as_str(), &bytes))
            .transpose()?
            .map(|entry| self.freshen(entry))
            .transpose()
    }

    fn list(&self, include_sub_agents: bool) -> Result<Vec<IndexEntry>> {
        let (start, end) = keys::index_range();
        let mut entries = Vec::new();
        for (key, value) in self.backend.range(&start, &end, usize::MAX)? {
            let entry = decode_index(&String::from_utf8_lossy(&key[1..]), &value)?;
            if include_sub_agents || entry.user_initiated {
                entries.push(self.freshen(entry)?);
            }
        }
        entries.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(entries)
    }
}

impl<B: Backend> Store<B> {
    /// The stored entry is rewritten only when a fact recovery needs
    /// changes (creation, a turn starting or ending, a sub-agent
    /// finishing); its last seq and last activity come from the log's last
    /// event, which is always current.
    fn freshen(&self, mut entry: IndexEntry) -> Result<IndexEntry> {
        let (start, end) = keys::events_from(&entry.id, entry.last_seq.max(1));
        if let Some(last) = self.backend.last(&start, &end)? {
            let event = decode_record(&entry.id, &last.0, &last.1)?;
            entry.last_seq = event.seq;
            entry.last_activity = event.at;
        }
        Ok(entry)
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
    writes: Vec<Entry>,
    waiting: Vec<Reply>,
}

/// The writer thread: commit each staged batch in order.
fn write_batches<B: Backend>(
    backend: &B,
    fatal: &OnceLock<String>,
    in_flight: &AtomicUsize,
    batches: Receiver<Staged>,
) {
    while let Ok(batch) = batches.recv() {
        commit_batch(backend, fatal, batch);
        in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Commit one batch durably and answer its callers. After a failed commit
/// nothing more is written (a failed flush is never retried): a batch staged
/// meanwhile assumed the failed one's seqs, and is refused with it.
fn commit_batch<B: Backend>(backend: &B, fatal: &OnceLock<String>, batch: Staged) {
    let Staged { writes, waiting } = batch;
    let outcome = match fatal.get() {
        Some(reason) => Err(reason.clone()),
        None if writes.is_empty() => Ok(()),
        None => backend.commit(&writes).map_err(|error| {
            let reason = error.to_string();
            let _ = fatal.set(reason.clone());
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
    backend: Arc<B>,
    fatal: Arc<OnceLock<String>>,
    /// Batches handed to the writer and not yet answered.
    in_flight: Arc<AtomicUsize>,
    last_seqs: HashMap<ConversationId, Seq>,
    index: HashMap<ConversationId, IndexEntry>,
}

impl<B: Backend> Committer<B> {
    fn new(backend: Arc<B>, fatal: Arc<OnceLock<String>>, in_flight: Arc<AtomicUsize>) -> Self {
        Committer {
            backend,
            fatal,
            in_flight,
            last_seqs: HashMap::new(),
            index: HashMap::new(),
        }
    }

    /// The first of two stages: take the waiting requests, check and stage
    /// them, and hand each batch to the writer thread, which commits it and
    /// answers its callers. While the engine commits (and waits on the disk)
    /// batch N, batch N+1 is being staged. At most one staged batch waits
    /// for the writer, so a caller's wait stays bounded.
    fn run(mut self, requests: Receiver<Request>, staged: SyncSender<Staged>) {
        while let Ok(first) = requests.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            let Some(batch) = self.stage_batch(batch) else {
                continue;
            };
            // A small batch with nothing in flight commits right here: the
            // hand-off to the writer would only add a thread wake-up to a
            // lone writer's latency. Batches commit in order either way,
            // because an inline commit happens only when none is pending.
            if batch.waiting.len() <= INLINE_BATCH && self.in_flight.load(Ordering::SeqCst) == 0 {
                commit_batch(self.backend.as_ref(), &self.fatal, batch);
            } else {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                if let Err(mpsc::SendError(batch)) = staged.send(batch) {
                    // The writer is gone (it panicked): answer here.
                    commit_batch(self.backend.as_ref(), &self.fatal, batch);
                    self.in_flight.fetch_sub(1, Ordering::SeqCst);
                }
            }
            if self.fatal.get().is_some() {
                self.last_seqs.clear();
                self.index.clear();
            }
        }
    }

    /// Check and stage every request of `batch`; refused ones are answered
    /// at once. `None` when nothing is left to write.
    fn stage_batch(&mut self, batch: Vec<Request>) -> Option<Staged> {
        let mut writes = Vec::new();
        let mut waiting = Vec::with_capacity(batch.len());
        for request in batch {
            if let Some(reason) = self.fatal.get() {
                let reply = match request {
                    Request::Append { reply, .. } | Request::Put { reply, .. } => reply,
                };
                let _ = reply.send(Err(Error::Fatal {
                    reason: reason.clone(),
                }));
                continue;
            }
            match request {
                Request::Append {
                    conversation,
                    events,
                    encoded,
                    reply,
                } => match self.stage(&conversation, &events, encoded, &mut writes) {
                    Ok(()) => waiting.push(reply),
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                },
                Request::Put {
                    writes: puts,
                    reply,
                } => {
                    writes.extend(puts);
                    waiting.push(reply);
                }
            }
        }
        if waiting.is_empty() {
            return None;
        }
        Some(Staged { writes, waiting })
    }

    /// Check one append and add its writes; changes nothing if it is refused.
    fn stage(
        &mut self,
        conversation: &ConversationId,
        events: &[Event],
        encoded: Vec<Vec<u8>>,
        writes: &mut Vec<Entry>,
    ) -> Result<()> {
        let invalid = |reason: &str| Error::InvalidAppend {
            conversation: conversation.clone(),
            reason: reason.to_owned(),
        };
        let first = events.first().ok_or_else(|| invalid("no events"))?;
        let last_seq = match self.last_seqs.get(conversation) {
            Some(seq) => *seq,
            None => {
                let (start, end) = keys::events_from(conversation, 1);
                self.backend
                    .last(&start, &end)?
                    .and_then(|(key, _)| keys::seq_of(&key))
                    .unwrap_or(0)
            }
        };
        for (offset, event) in events.iter().enumerate() {
            let expected = last_seq + 1 + offset as Seq;
            if event.seq != expected {
                return Err(Error::NonContiguous {
                    conversation: conversation.clone(),
                    expected,
                    found: event.seq,
                });
            }
        }
        let mut entry = if last_seq == 0 {
            let entry = IndexEntry::created(first)
                .ok_or_else(|| invalid("a new conversation's log must start with Created"))?;
            if entry.id != *conversation {
                return Err(invalid("Created names another conversation"));
            }
            entry
        } else {
            match self.index.get(conversation) {
                Some(entry) => entry.clone(),
                None => match self.backend.get(&keys::index(conversation))? {
                    Some(bytes) => decode_index(conversation.as_str(), &bytes)?,
                    None => {
                        return Err(Error::CorruptMeta {
                            what: format!("index of {conversation}"),
                            reason: "entry missing for a conversation with events".to_owned(),
                        })
                    }
                },
            }
        };
        let before = (last_seq > 0).then(|| entry.clone());
        for (event, bytes) in events.iter().zip(encoded) {
            if last_seq > 0 || event.seq > 1 {
                entry.apply(event);
            }
            writes.push((keys::event(conversation, event.seq), bytes));
        }
        // Most appends (messages, deltas' final text, tool results) change
        // no fact the index keeps beyond the log's end, which readers take
        // from the log itself: skip the second key and halve the writes.
        if before.is_none_or(|before| !before.same_facts(&entry)) {
            let index_bytes = serde_json::to_vec(&entry).map_err(|error| Error::CorruptMeta {
                what: format!("index entry of {conversation}"),
                reason: error.to_string(),
            })?;
            writes.push((keys::index(conversation), index_bytes));
        }
        self.last_seqs
            .insert(conversation.clone(), last_seq + events.len() as Seq);
        self.index.insert(conversation.clone(), entry);
        Ok(())
    }
}
