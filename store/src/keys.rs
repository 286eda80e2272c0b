//! Key layout, shared by every backend. One ordered key space, split by a
//! leading byte:
//!
//! | prefix | key | value |
//! | --- | --- | --- |
//! | `e` | conversation id, `0x00`, seq as big-endian u64 | an encoded event (`keel_core::codec`) |
//! | `i` | conversation id | its `IndexEntry` (JSON) |
//! | `s` | conversation id | its `FsmSnapshot` (JSON) |
//! | `c` | conversation id | a checkpoint of its working set (`keel_core::codec::checkpoint`) |
//! | `b` | SHA-256 hex of the bytes | the blob |
//!
//! Conversation ids never contain `0x00`, so a conversation's events are one
//! contiguous, seq-ordered range, and no id's range overlaps another's.

use keel_core::ids::{ConversationId, Seq};

const EVENT: u8 = b'e';
const INDEX: u8 = b'i';
const SNAPSHOT: u8 = b's';
const CHECKPOINT: u8 = b'c';
const BLOB: u8 = b'b';

fn with_prefix(prefix: u8, body: &[u8], extra: usize) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + body.len() + extra);
    key.push(prefix);
    key.extend_from_slice(body);
    key
}

pub fn event(conversation: &ConversationId, seq: Seq) -> Vec<u8> {
    let mut key = with_prefix(EVENT, conversation.as_str().as_bytes(), 9);
    key.push(0);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// `[start, end)` covering the events of `conversation` from seq `from` on.
pub fn events_from(conversation: &ConversationId, from: Seq) -> (Vec<u8>, Vec<u8>) {
    let start = event(conversation, from);
    let mut end = with_prefix(EVENT, conversation.as_str().as_bytes(), 1);
    end.push(1);
    (start, end)
}

/// The seq encoded in an event key.
pub fn seq_of(key: &[u8]) -> Option<Seq> {
    let tail: [u8; 8] = key.get(key.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(Seq::from_be_bytes(tail))
}

pub fn index(conversation: &ConversationId) -> Vec<u8> {
    with_prefix(INDEX, conversation.as_str().as_bytes(), 0)
}

/// `[start, end)` covering the whole index.
pub fn index_range() -> (Vec<u8>, Vec<u8>) {
    (vec![INDEX], vec![INDEX + 1])
}

pub fn snapshot(conversation: &ConversationId) -> Vec<u8> {
    with_prefix(SNAPSHOT, conversation.as_str().as_bytes(), 0)
}

pub fn checkpoint(conversation: &ConversationId) -> Vec<u8> {
    with_prefix(CHECKPOINT, conversation.as_str().as_bytes(), 0)
}

pub fn blob(hash: &str) -> Vec<u8> {
    with_prefix(BLOB, hash.as_bytes(), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_keys_sort_by_seq_and_never_overlap_between_conversations() {
        let a = ConversationId::new("a").unwrap();
        let ab = ConversationId::new("a-b").unwrap();
        assert!(event(&a, 2) < event(&a, 256));
        let (start, end) = events_from(&a, 1);
        assert!(start <= event(&a, 1) && event(&a, u64::MAX) < end);
        assert!(!(start <= event(&ab, 1) && event(&ab, 1) < end));
        assert_eq!(seq_of(&event(&a, 77)), Some(77));
    }
}
