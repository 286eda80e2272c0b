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
//! | `r` | blob hash, `0x00`, conversation id | empty: the conversation's log refers to the blob |
//! | `u` | conversation id, `0x00`, blob hash | empty: the same fact, found from the conversation |
//! | `m` | a name | facts about the store itself (`m` + `blob-refs`: the `r`/`u` keys cover every event) |
//!
//! Conversation ids never contain `0x00`, so a conversation's events are one
//! contiguous, seq-ordered range, and no id's range overlaps another's; the
//! same holds for its `u` keys and for a blob's `r` keys (hashes are 64 hex
//! digits).

use keel_core::ids::{ConversationId, Seq};

const EVENT: u8 = b'e';
const INDEX: u8 = b'i';
const SNAPSHOT: u8 = b's';
const CHECKPOINT: u8 = b'c';
const BLOB: u8 = b'b';
const REFERRED_BY: u8 = b'r';
const USES: u8 = b'u';
const META: u8 = b'm';

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

/// `[start, end)` covering every event of every conversation.
pub fn all_events() -> (Vec<u8>, Vec<u8>) {
    (vec![EVENT], vec![EVENT + 1])
}

/// The conversation id in an event key.
pub fn conversation_of_event(key: &[u8]) -> Option<&str> {
    let body = key.get(1..key.len().checked_sub(9)?)?;
    std::str::from_utf8(body).ok()
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

/// `[start, end)` covering every blob.
pub fn blob_range() -> (Vec<u8>, Vec<u8>) {
    (vec![BLOB], vec![BLOB + 1])
}

/// The hash in a blob key.
pub fn hash_of_blob(key: &[u8]) -> Option<&str> {
    std::str::from_utf8(key.strip_prefix(&[BLOB][..])?).ok()
}

/// `conversation` refers to blob `hash`, keyed by the blob.
pub fn referred_by(hash: &str, conversation: &ConversationId) -> Vec<u8> {
    let mut key = with_prefix(
        REFERRED_BY,
        hash.as_bytes(),
        1 + conversation.as_str().len(),
    );
    key.push(0);
    key.extend_from_slice(conversation.as_str().as_bytes());
    key
}

/// `[start, end)` covering the conversations that refer to blob `hash`.
pub fn referrers(hash: &str) -> (Vec<u8>, Vec<u8>) {
    let mut start = with_prefix(REFERRED_BY, hash.as_bytes(), 1);
    let mut end = start.clone();
    start.push(0);
    end.push(1);
    (start, end)
}

/// The conversation id in a `referred_by` key.
pub fn referrer_of(key: &[u8]) -> Option<&str> {
    let at = key.iter().position(|byte| *byte == 0)?;
    std::str::from_utf8(&key[at + 1..]).ok()
}

/// `conversation` uses blob `hash`, keyed by the conversation.
pub fn uses(conversation: &ConversationId, hash: &str) -> Vec<u8> {
    let mut key = with_prefix(USES, conversation.as_str().as_bytes(), 1 + hash.len());
    key.push(0);
    key.extend_from_slice(hash.as_bytes());
    key
}

/// `[start, end)` covering the blobs `conversation` uses.
pub fn used_by(conversation: &ConversationId) -> (Vec<u8>, Vec<u8>) {
    let mut start = with_prefix(USES, conversation.as_str().as_bytes(), 1);
    let mut end = start.clone();
    start.push(0);
    end.push(1);
    (start, end)
}

/// The blob hash in a `uses` key.
pub fn used_hash(key: &[u8]) -> Option<&str> {
    let at = key.iter().position(|byte| *byte == 0)?;
    std::str::from_utf8(&key[at + 1..]).ok()
}

/// Set once the `r` and `u` keys cover every event in the store.
pub fn blob_refs_complete() -> Vec<u8> {
    with_prefix(META, b"blob-refs", 0)
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
        assert_eq!(conversation_of_event(&event(&ab, 77)), Some("a-b"));
    }

    #[test]
    fn reference_keys_of_one_blob_or_conversation_never_take_in_another() {
        let a = ConversationId::new("a").unwrap();
        let ab = ConversationId::new("a-b").unwrap();
        let hash = "ab".repeat(32);
        let (start, end) = used_by(&a);
        let inside = |key: &[u8]| start.as_slice() <= key && key < end.as_slice();
        assert!(inside(&uses(&a, &hash)));
        assert!(!inside(&uses(&ab, &hash)));
        assert_eq!(used_hash(&uses(&a, &hash)), Some(hash.as_str()));

        let (start, end) = referrers(&hash);
        let inside = |key: &[u8]| start.as_slice() <= key && key < end.as_slice();
        assert!(inside(&referred_by(&hash, &ab)));
        assert!(!inside(&referred_by(&"ac".repeat(32), &a)));
        assert_eq!(referrer_of(&referred_by(&hash, &ab)), Some("a-b"));
        assert_eq!(hash_of_blob(&blob(&hash)), Some(hash.as_str()));
    }
}
