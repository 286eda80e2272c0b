//! Decoding the event records a read takes from the engine: one at a time
//! from the engine's own bytes for an ordinary read, or, for a long read
//! (rebuilding a long conversation), copied out once and decoded in
//! contiguous chunks on every core. Decoding is most of a long read's cost,
//! and records decode independently of each other.
//!
//! Either way the result is the same: the events in seq order, or
//! `Error::Corrupt` naming the conversation and the seq of the first record
//! that does not decode or holds another seq than its key.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use keel_core::codec;
use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};

use crate::error::{Error, Result};
use crate::keys;

/// Reads of more records than this decode in parallel. Below it, starting
/// threads and copying the records out of the engine would cost more than
/// they save, and a short read stays on the caller's thread.
pub(super) const PARALLEL_READ_FROM: usize = 2_000;

/// Fewest records a decoding thread is given, so that a read just over
/// [`PARALLEL_READ_FROM`] on a many-core machine does not start a thread
/// per handful of records.
const MIN_RECORDS_PER_THREAD: usize = 1_000;

/// Decode the record stored under event key `key`, checking that it holds
/// the seq its key says.
pub(super) fn decode_record(
    conversation: &ConversationId,
    key: &[u8],
    value: &[u8],
) -> Result<Event> {
    decode_at(conversation, keys::seq_of(key).unwrap_or(0), value)
}

fn decode_at(conversation: &ConversationId, seq: Seq, value: &[u8]) -> Result<Event> {
    let corrupt = |reason: String| Error::Corrupt {
        conversation: conversation.clone(),
        seq,
        reason,
    };
    let event = codec::decode(value).map_err(|error| corrupt(error.to_string()))?;
    if event.seq != seq {
        return Err(corrupt(format!("record holds seq {}", event.seq)));
    }
    Ok(event)
}

/// Threads a long read may decode on: the cores this process may use. Asked
/// once, because `available_parallelism` reads cgroup files on Linux.
pub(super) fn decode_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Records per chunk of a long read: the unit a decoding thread takes at a
/// time. Small enough that a 10,000-record read makes about forty, so that
/// a thread whose core is busy with other work simply takes fewer: on a
/// two-core machine with other work running, decoding 10,000 records took
/// 7.5 ms on one thread, 7.1 ms in two equal halves, and 5.5-5.7 ms in
/// chunks of 250-500. Large enough that taking one (an atomic increment)
/// costs nothing next to decoding it.
const CHUNK_RECORDS: usize = 256;

/// Event records copied out of the engine, so that they can be decoded on
/// other threads once the engine's scan (and whatever it holds: a read
/// transaction, a lock) is over. Copied in chunks of [`CHUNK_RECORDS`],
/// each with its own buffer: no buffer grows to the size of the whole read,
/// and a chunk is what a thread decodes.
#[derive(Default)]
pub(super) struct Records {
    /// Chunks of [`CHUNK_RECORDS`] records.
    full: Vec<Chunk>,
    /// The chunk being filled.
    filling: Chunk,
}

#[derive(Default)]
struct Chunk {
    /// Its records' bytes, one after another.
    bytes: Vec<u8>,
    /// Each record's seq (from its key) and where its bytes are.
    records: Vec<(Seq, Range<usize>)>,
}

impl Records {
    pub(super) fn push(&mut self, key: &[u8], value: &[u8]) {
        if self.filling.records.len() == CHUNK_RECORDS {
            // The last chunk's size is a good guess at the next one's.
            let next = Chunk {
                bytes: Vec::with_capacity(self.filling.bytes.len()),
                records: Vec::with_capacity(CHUNK_RECORDS),
            };
            self.full.push(std::mem::replace(&mut self.filling, next));
        }
        let start = self.filling.bytes.len();
        self.filling.bytes.extend_from_slice(value);
        let seq = keys::seq_of(key).unwrap_or(0);
        self.filling
            .records
            .push((seq, start..self.filling.bytes.len()));
    }

    /// Every chunk, in seq order, and the number of records in them.
    fn into_chunks(self) -> (Vec<Chunk>, usize) {
        let Records { mut full, filling } = self;
        let n_records = full.len() * CHUNK_RECORDS + filling.records.len();
        if !filling.records.is_empty() {
            full.push(filling);
        }
        (full, n_records)
    }
}

impl Chunk {
    fn decode(&self, conversation: &ConversationId) -> Result<Vec<Event>> {
        self.records
            .iter()
            .map(|(seq, range)| {
                decode_at(
                    conversation,
                    *seq,
                    self.bytes.get(range.clone()).unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// Decode `records` on up to `threads` threads (the caller's among them),
/// each taking the next chunk nobody has taken until none is left. The
/// result is what decoding them one by one gives: the events in order, or
/// the error of the first record (in seq order) that does not decode.
pub(super) fn decode_parallel(
    conversation: &ConversationId,
    records: Records,
    threads: usize,
) -> Result<Vec<Event>> {
    let (chunks, n_records) = records.into_chunks();
    let chunks = chunks.as_slice();
    let n_threads = threads.min(n_records / MIN_RECORDS_PER_THREAD).max(1);
    let next = AtomicUsize::new(0);
    let work = || {
        let mut decoded = Vec::new();
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(chunk) = chunks.get(index) else {
                return decoded;
            };
            decoded.push((index, chunk.decode(conversation)));
        }
    };
    let mut slots: Vec<Option<Result<Vec<Event>>>> = chunks.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        // A thread that cannot be started leaves its share to the others.
        let helpers: Vec<_> = (1..n_threads)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("keel-decode".to_owned())
                    .spawn_scoped(scope, work)
                    .ok()
            })
            .collect();
        let mut decoded = work();
        for helper in helpers {
            let more = helper
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            decoded.extend(more);
        }
        for (index, chunk) in decoded {
            if let Some(slot) = slots.get_mut(index) {
                *slot = Some(chunk);
            }
        }
    });
    let mut events = Vec::with_capacity(n_records);
    for (slot, chunk) in slots.into_iter().zip(chunks) {
        // Every chunk was taken by some thread; decoding a missing one here
        // keeps that an assumption about speed, not about correctness.
        events.extend(slot.unwrap_or_else(|| chunk.decode(conversation))?);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use keel_core::event::EventKind;
    use keel_core::time::Timestamp;

    use super::*;

    fn message(seq: Seq) -> Event {
        Event {
            seq,
            at: Timestamp(seq),
            parent: None,
            triggers_turn: true,
            kind: EventKind::UserMessage {
                text: format!("message {seq}"),
                images: Vec::new(),
            },
        }
    }

    /// Records for seqs `1..=n`, with `bad` seqs replaced by bytes that do
    /// not decode.
    fn records(n: Seq, bad: &[Seq]) -> Records {
        let conversation = ConversationId::new("c").unwrap();
        let mut records = Records::default();
        for seq in 1..=n {
            let value = if bad.contains(&seq) {
                b"{not a record".to_vec()
            } else {
                codec::encode(&message(seq))
            };
            records.push(&keys::event(&conversation, seq), &value);
        }
        records
    }

    /// Chunking is invisible: for any number of threads, including more
    /// than the records allow, the events come back in order, and the error
    /// is that of the first bad record in seq order, wherever the chunks
    /// begin and end.
    #[test]
    fn parallel_decoding_equals_decoding_in_order() {
        let conversation = ConversationId::new("c").unwrap();
        let expected: Vec<Event> = (1..=4_500).map(message).collect();
        for threads in [1, 2, 3, 4, 16] {
            assert_eq!(
                decode_parallel(&conversation, records(4_500, &[]), threads).unwrap(),
                expected,
                "{threads} threads"
            );
        }
        let first_of_chunk = CHUNK_RECORDS as Seq * 8 + 1;
        for (bad, first) in [
            (vec![4_400, 2_300, 3_999], 2_300),
            (vec![4_500, first_of_chunk], first_of_chunk),
            (vec![1], 1),
        ] {
            for threads in [1, 2, 3, 4, 16] {
                match decode_parallel(&conversation, records(4_500, &bad), threads) {
                    Err(Error::Corrupt { seq, .. }) => {
                        assert_eq!(seq, first, "{bad:?}, {threads} threads")
                    }
                    other => panic!("{bad:?}, {threads} threads: got {other:?}"),
                }
            }
        }
        assert!(decode_parallel(&conversation, Records::default(), 4)
            .unwrap()
            .is_empty());
    }
}
