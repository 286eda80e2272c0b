//! The reads of `Store`, as plain blocking functions over the engine. The
//! `EventLog` methods of the same names run them on tokio's blocking pool
//! (`Store::off_runtime`); here they block for as long as the engine and
//! the decoding take, which is why nothing here may run on a runtime thread.

use keel_core::codec;
use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};
use keel_core::reducer::WorkingSet;
use keel_core::snapshot::FsmSnapshot;

use super::records::{decode_parallel, decode_record, decode_threads, Records, PARALLEL_READ_FROM};
use super::{decode_index, SnapshotRecord};
use crate::backend::Backend;
use crate::error::Result;
use crate::index::IndexEntry;
use crate::keys;

/// Up to `limit` events of `conversation` from seq `from` on, in order.
pub(super) fn events<B: Backend>(
    backend: &B,
    conversation: &ConversationId,
    from: Seq,
    limit: usize,
) -> Result<Vec<Event>> {
    let from = from.max(1);
    let (start, end) = keys::events_from(conversation, from);
    // Whether a read is long is known from the log's last seq (about 10 µs
    // to look up on redb), asked only when `limit` allows a long read; a
    // short read then decodes straight from the engine's bytes, without the
    // copy a parallel decode needs.
    let threads = decode_threads();
    if threads > 1
        && limit > PARALLEL_READ_FROM
        && expected_records(backend, conversation, from, limit)? > PARALLEL_READ_FROM
    {
        let mut records = Records::default();
        backend.visit_range(&start, &end, limit, &mut |key, value| {
            records.push(key, value);
            Ok(())
        })?;
        return decode_parallel(conversation, records, threads);
    }
    let mut events = Vec::new();
    backend.visit_range(&start, &end, limit, &mut |key, value| {
        events.push(decode_record(conversation, key, value)?);
        Ok(())
    })?;
    Ok(events)
}

/// How many records `events` would return, from the log's last seq (seqs
/// are contiguous). Only a hint for choosing how to decode: an append
/// landing meanwhile changes nothing but that choice.
fn expected_records<B: Backend>(
    backend: &B,
    conversation: &ConversationId,
    from: Seq,
    limit: usize,
) -> Result<usize> {
    let last = last_seq(backend, conversation)?;
    let count = last.checked_sub(from).map_or(0, |n| n.saturating_add(1));
    Ok(usize::try_from(count).unwrap_or(usize::MAX).min(limit))
}

/// The last `n` events of `conversation`, in order.
pub(super) fn tail<B: Backend>(
    backend: &B,
    conversation: &ConversationId,
    n: usize,
) -> Result<Vec<Event>> {
    let (start, end) = keys::events_from(conversation, 1);
    backend
        .tail(&start, &end, n)?
        .iter()
        .map(|(key, value)| decode_record(conversation, key, value))
        .collect()
}

/// The seq of `conversation`'s last event, 0 if it has none.
pub(super) fn last_seq<B: Backend>(backend: &B, conversation: &ConversationId) -> Result<Seq> {
    let (start, end) = keys::events_from(conversation, 1);
    Ok(backend
        .last(&start, &end)?
        .and_then(|(key, _)| keys::seq_of(&key))
        .unwrap_or(0))
}

pub(super) fn checkpoint<B: Backend>(
    backend: &B,
    conversation: &ConversationId,
) -> Result<Option<WorkingSet>> {
    // A cache: one that cannot be used counts as missing.
    Ok(backend
        .get(&keys::checkpoint(conversation))?
        .and_then(|bytes| codec::checkpoint::decode(&bytes).ok()))
}

pub(super) fn snapshot<B: Backend>(
    backend: &B,
    conversation: &ConversationId,
) -> Result<Option<FsmSnapshot>> {
    // A snapshot is only a cache: one that cannot be read counts as missing.
    Ok(backend
        .get(&keys::snapshot(conversation))?
        .and_then(|bytes| serde_json::from_slice::<SnapshotRecord>(&bytes).ok())
        .filter(|record| record.v == 1)
        .map(|record| record.snapshot))
}

pub(super) fn index_entry<B: Backend>(
    backend: &B,
    conversation: &ConversationId,
) -> Result<Option<IndexEntry>> {
    backend
        .get(&keys::index(conversation))?
        .map(|bytes| decode_index(conversation.as_str(), &bytes))
        .transpose()?
        .map(|entry| freshen(backend, entry))
        .transpose()
}

/// Conversations in the index, oldest first; sub-agents only when asked.
pub(super) fn list<B: Backend>(backend: &B, include_sub_agents: bool) -> Result<Vec<IndexEntry>> {
    entries(backend, |entry| include_sub_agents || entry.user_initiated)
}

/// The conversations `parent` started, oldest first.
pub(super) fn children<B: Backend>(
    backend: &B,
    parent: &ConversationId,
) -> Result<Vec<IndexEntry>> {
    entries(backend, |entry| entry.parent.as_ref() == Some(parent))
}

/// The index entries `keep` takes, freshened, oldest first.
fn entries<B: Backend>(backend: &B, keep: impl Fn(&IndexEntry) -> bool) -> Result<Vec<IndexEntry>> {
    let (start, end) = keys::index_range();
    let mut entries = Vec::new();
    for (key, value) in backend.range(&start, &end, usize::MAX)? {
        let entry = decode_index(&String::from_utf8_lossy(&key[1..]), &value)?;
        if keep(&entry) {
            entries.push(freshen(backend, entry)?);
        }
    }
    entries.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(entries)
}

/// The stored entry is rewritten only when a fact recovery needs changes
/// (creation, a turn starting or ending, a sub-agent finishing); its last
/// seq and last activity come from the log's last event, which is always
/// current.
fn freshen<B: Backend>(backend: &B, mut entry: IndexEntry) -> Result<IndexEntry> {
    let (start, end) = keys::events_from(&entry.id, entry.last_seq.max(1));
    if let Some(last) = backend.last(&start, &end)? {
        let event = decode_record(&entry.id, &last.0, &last.1)?;
        entry.last_seq = event.seq;
        entry.last_activity = event.at;
    }
    Ok(entry)
}
