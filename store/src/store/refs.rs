//! Which conversations refer to which blobs, kept as keys so a delete
//! knows which blobs go with it without reading its log.
//!
//! The choice: a set of (blob, conversation) pairs, written twice, as an
//! `r` key (blob first: "who else refers to this blob?" is one short
//! range scan) and a `u` key (conversation first: "which blobs did it
//! refer to?", another). Not a count per blob: a count must know whether
//! a conversation is already counted (a second message with the same
//! image), which needs the pairs anyway, and a pair written twice is still
//! one pair, so appends write them without reading anything.
//!
//! Crash safety: the pairs are written in the same atomic commit as the
//! events that name the blob, and removed in the same commit as the
//! conversation's events, so after any crash they agree with the log.
//!
//! Stores written before the pairs existed have none: on open, a store
//! without the `m`+`blob-refs` mark rebuilds them from its log (only
//! records that hold an image are decoded) and sets the mark, so a delete
//! never takes a blob an older conversation still shows. The mark is what
//! makes the pairs trusted; removing it makes the next open rebuild them.

use std::collections::BTreeSet;

use keel_core::codec;
use keel_core::event::{Event, EventKind};
use keel_core::ids::ConversationId;

use crate::backend::{Backend, Write};
use crate::error::Result;
use crate::keys;

/// The blob hashes `events` name, each once.
pub(super) fn named_blobs(events: &[Event]) -> BTreeSet<&str> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::UserMessage { images, .. } | EventKind::ToolResult { images, .. } => {
                Some(images)
            }
            _ => None,
        })
        .flatten()
        .map(|image| image.hash.as_str())
        .collect()
}

/// The two keys that say `conversation` refers to blob `hash`.
pub(super) fn pair(conversation: &ConversationId, hash: &str) -> [Write; 2] {
    [
        Write::Put(keys::referred_by(hash, conversation), Vec::new()),
        Write::Put(keys::uses(conversation, hash), Vec::new()),
    ]
}

/// The blobs `conversation` refers to.
pub(super) fn used_by<B: Backend>(
    backend: &B,
    conversation: &ConversationId,
) -> Result<Vec<String>> {
    let (start, end) = keys::used_by(conversation);
    let mut hashes = Vec::new();
    backend.visit_range(&start, &end, usize::MAX, &mut |key, _| {
        if let Some(hash) = keys::used_hash(key) {
            hashes.push(hash.to_owned());
        }
        Ok(())
    })?;
    Ok(hashes)
}

/// Whether a conversation for which `gone` is false refers to blob `hash`.
pub(super) fn referred_by_any<B: Backend>(
    backend: &B,
    hash: &str,
    gone: impl Fn(&str) -> bool,
) -> Result<bool> {
    let (start, end) = keys::referrers(hash);
    let mut referred = false;
    backend.visit_range(&start, &end, usize::MAX, &mut |key, _| {
        referred |= keys::referrer_of(key).is_some_and(|conversation| !gone(conversation));
        Ok(())
    })?;
    Ok(referred)
}

/// Set by a record that may hold an image: every encoding of an image
/// reference so far (JSON in version 1, MessagePack maps in version 2)
/// spells out this field name. A record without it names no blob, and is
/// not decoded.
const IMAGE_FIELD: &[u8] = b"media_type";

/// Make sure the pairs cover every event in the store. With the mark set,
/// nothing to do. Otherwise rebuild them from the log: if any are found,
/// they are committed with the mark now; if none, `true` asks the caller
/// to write the mark with its first commit (a new store then costs no
/// extra commit). A record that does not decode is passed over: the blobs
/// it may name are not known, and are not protected by it.
pub(super) fn ensure_complete<B: Backend>(backend: &B) -> Result<bool> {
    if backend.contains(&keys::blob_refs_complete())? {
        return Ok(false);
    }
    let mut found: BTreeSet<(ConversationId, String)> = BTreeSet::new();
    let (start, end) = keys::all_events();
    backend.visit_range(&start, &end, usize::MAX, &mut |key, value| {
        if !value
            .windows(IMAGE_FIELD.len())
            .any(|window| window == IMAGE_FIELD)
        {
            return Ok(());
        }
        let conversation =
            keys::conversation_of_event(key).and_then(|raw| ConversationId::new(raw).ok());
        let (Some(conversation), Ok(event)) = (conversation, codec::decode(value)) else {
            return Ok(());
        };
        for hash in named_blobs(std::slice::from_ref(&event)) {
            found.insert((conversation.clone(), hash.to_owned()));
        }
        Ok(())
    })?;
    if found.is_empty() {
        return Ok(true);
    }
    let mut writes: Vec<Write> = found
        .iter()
        .flat_map(|(conversation, hash)| pair(conversation, hash))
        .collect();
    writes.push(Write::Put(keys::blob_refs_complete(), b"1".to_vec()));
    backend.commit(&writes)?;
    Ok(false)
}
