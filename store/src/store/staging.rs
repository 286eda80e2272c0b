//! The committer's checks: what each waiting request adds to the next
//! batch. An append must continue its log at `last_seq + 1` (a new log
//! starts with its own `Created`), and brings its index entry when a fact
//! the index keeps changed, and the blob references of the images its
//! messages name (`refs.rs`); a snapshot or checkpoint of a conversation
//! with no log is dropped; a blob is written only if the engine lacks it.
//! The committer's own caches (log ends, index entries) spare most checks
//! a read.

use keel_core::event::Event;
use keel_core::ids::{ConversationId, Seq};

use super::{decode_index, reads, refs, Committer, Plain, Reply, Staged};
use crate::backend::{Backend, Write};
use crate::error::{Error, Result};
use crate::index::IndexEntry;
use crate::keys;

impl<B: Backend> Committer<B> {
    /// Check and stage every request of `batch`; refused ones are answered
    /// at once. `None` when nothing is left to write.
    pub(super) fn stage_batch(&mut self, batch: Vec<Plain>) -> Option<Staged> {
        let mut writes = Vec::new();
        let mut waiting = Vec::with_capacity(batch.len());
        for request in batch {
            let (reply, outcome) = self.stage_one(request, &mut writes);
            match outcome {
                Ok(true) => waiting.push(reply),
                Ok(false) => {
                    let _ = reply.send(Ok(()));
                }
                Err(error) => {
                    let _ = reply.send(Err(error));
                }
            }
        }
        if waiting.is_empty() {
            return None;
        }
        if std::mem::take(&mut self.mark_refs) {
            writes.push(Write::Put(keys::blob_refs_complete(), b"1".to_vec()));
        }
        Some(Staged {
            writes,
            waiting,
            done: None,
        })
    }

    /// Check one request and add its writes. Its outcome is `true` when
    /// its caller waits for them, `false` when it wrote nothing and may be
    /// answered now; every request is refused once the store has stopped.
    fn stage_one(&mut self, request: Plain, writes: &mut Vec<Write>) -> (Reply, Result<bool>) {
        let stopped = self.fatal.get().map(|reason| Error::Fatal {
            reason: reason.clone(),
        });
        match request {
            Plain::Append {
                conversation,
                events,
                encoded,
                reply,
            } => {
                let outcome = match stopped {
                    Some(error) => Err(error),
                    None => self
                        .stage(&conversation, &events, encoded, writes)
                        .map(|()| true),
                };
                (reply, outcome)
            }
            Plain::Cache {
                conversation,
                writes: cache,
                reply,
            } => {
                let outcome = match stopped {
                    Some(error) => Err(error),
                    None => self.stage_cache(&conversation, cache, writes),
                };
                (reply, outcome)
            }
            Plain::Blob { hash, bytes, reply } => {
                let outcome = match stopped {
                    Some(error) => Err(error),
                    None => self.stage_blob(&hash, bytes, writes),
                };
                (reply, outcome)
            }
        }
    }

    /// A snapshot or checkpoint, unless its conversation has no log.
    fn stage_cache(
        &mut self,
        conversation: &ConversationId,
        cache: Vec<Write>,
        writes: &mut Vec<Write>,
    ) -> Result<bool> {
        if self.log_end(conversation)? == 0 {
            return Ok(false);
        }
        writes.extend(cache);
        Ok(true)
    }

    /// A blob, unless the engine has it (then its caller need not wait);
    /// an upload whose message is to come either way.
    fn stage_blob(&mut self, hash: &str, bytes: Vec<u8>, writes: &mut Vec<Write>) -> Result<bool> {
        let key = keys::blob(hash);
        // Only a delete or a sweep removes a blob, and each reads the
        // engine after every commit before it: a blob the engine has now
        // stays until the next of them, which will know of this upload.
        // One the engine lacks may be in a batch not yet committed;
        // writing it again is harmless.
        let missing = !self.engine.backend.contains(&key)?;
        if missing {
            writes.push(Write::Put(key, bytes));
        }
        self.uploads.stored(hash);
        Ok(missing)
    }

    /// The seq of `conversation`'s last event as staged so far: from what
    /// this committer staged, else from the engine (which then has every
    /// write of it: they all go through here).
    fn log_end(&self, conversation: &ConversationId) -> Result<Seq> {
        match self.last_seqs.get(conversation) {
            Some(seq) => Ok(*seq),
            None => reads::last_seq(&self.engine.backend, conversation),
        }
    }

    /// Check one append and add its writes; changes nothing if it is refused.
    fn stage(
        &mut self,
        conversation: &ConversationId,
        events: &[Event],
        encoded: Vec<Vec<u8>>,
        writes: &mut Vec<Write>,
    ) -> Result<()> {
        let invalid = |reason: &str| Error::InvalidAppend {
            conversation: conversation.clone(),
            reason: reason.to_owned(),
        };
        let first = events.first().ok_or_else(|| invalid("no events"))?;
        let last_seq = self.log_end(conversation)?;
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
                None => match self.engine.backend.get(&keys::index(conversation))? {
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
            writes.push(Write::Put(keys::event(conversation, event.seq), bytes));
        }
        // Most appends (messages, deltas' final text, tool results) change
        // no fact the index keeps beyond the log's end, which readers take
        // from the log itself: skip the second key and halve the writes.
        if before.is_none_or(|before| !before.same_facts(&entry)) {
            let index_bytes = serde_json::to_vec(&entry).map_err(|error| Error::CorruptMeta {
                what: format!("index entry of {conversation}"),
                reason: error.to_string(),
            })?;
            writes.push(Write::Put(keys::index(conversation), index_bytes));
        }
        for hash in refs::named_blobs(events) {
            writes.extend(refs::pair(conversation, hash));
            self.uploads.named(hash);
        }
        self.last_seqs
            .insert(conversation.clone(), last_seq + events.len() as Seq);
        self.index.insert(conversation.clone(), entry);
        Ok(())
    }
}
