//! Blobs this process stored that no message has named since: uploads
//! whose message may still be on its way. The runtime stores an image's
//! blob, then starts the conversation's actor (a rebuild, perhaps) and
//! hands it the message, which the actor appends; until then nothing in
//! the store refers to the blob, and a delete of another conversation that
//! named the same bytes, or a sweep, must not take it.
//!
//! Kept by the committer only, in memory: it alone stores blobs and stages
//! appends, so it sees every upload and every message that names one. An
//! earlier process's uploads need no such care: nothing outside a process
//! holds a blob's hash (clients send bytes), so once the process that
//! stored a blob is gone, no message can name it any more.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Default)]
pub(super) struct Uploads(HashMap<String, Upload>);

struct Upload {
    /// Stores of the blob not yet matched by a message naming it.
    unnamed: u32,
    /// The latest store of it.
    last: Instant,
}

impl Uploads {
    /// The blob `hash` was stored (or found stored) for a message to come.
    pub(super) fn stored(&mut self, hash: &str) {
        let upload = self.0.entry(hash.to_owned()).or_insert(Upload {
            unnamed: 0,
            last: Instant::now(),
        });
        upload.unnamed += 1;
        upload.last = Instant::now();
    }

    /// A message naming blob `hash` is staged.
    pub(super) fn named(&mut self, hash: &str) {
        if let Some(upload) = self.0.get_mut(hash) {
            upload.unnamed = upload.unnamed.saturating_sub(1);
            if upload.unnamed == 0 {
                self.0.remove(hash);
            }
        }
    }

    /// Whether blob `hash` was stored less than `within` ago and no
    /// message has named it since.
    pub(super) fn waiting(&self, hash: &str, within: Duration) -> bool {
        self.0
            .get(hash)
            .is_some_and(|upload| upload.last.elapsed() < within)
    }

    /// The blob is gone: no message of this process can use it any more.
    pub(super) fn forget(&mut self, hash: &str) {
        self.0.remove(hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_waits_until_as_many_messages_named_it_as_it_was_stored() {
        let mut uploads = Uploads::default();
        let hour = Duration::from_secs(3_600);
        uploads.stored("h");
        uploads.stored("h");
        assert!(uploads.waiting("h", hour));
        assert!(!uploads.waiting("h", Duration::ZERO));
        uploads.named("h");
        assert!(uploads.waiting("h", hour));
        uploads.named("h");
        assert!(!uploads.waiting("h", hour));
        // A message naming a blob this process never stored changes nothing.
        uploads.named("other");
        assert!(!uploads.waiting("other", hour));
    }
}
