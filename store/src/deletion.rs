//! What deleting a conversation, sweeping unreferenced blobs and reclaiming
//! space report. The work itself is the committer's (`store/removal.rs`):
//! a delete is ordered with the appends around it like any other write.
//!
//! Why these say what they did rather than only `Ok(())`: the caller (an
//! operator's DELETE, a cleanup job) wants to know whether the id was
//! there at all, which blobs went, and whether the disk got anything back.

use crate::backend::Reclaim;

/// What [`EventLog::delete`](crate::EventLog::delete) removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deleted {
    /// The conversation had a log or an index entry. When false, nothing
    /// of it was there and nothing was written.
    pub existed: bool,
    /// Events removed from its log.
    pub events: u64,
    /// Blobs removed with it: no other conversation refers to them (and no
    /// upload of this process still waits for its message).
    pub blobs_removed: Vec<String>,
    /// Blobs it referred to that stay: another conversation refers to
    /// them, or this process stored them moments ago for a message not yet
    /// recorded. A later sweep takes the latter once they are old enough.
    pub blobs_kept: Vec<String>,
}

/// What [`EventLog::sweep_unreferenced_blobs`](crate::EventLog::sweep_unreferenced_blobs) removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Swept {
    /// Hashes of the blobs removed.
    pub blobs: Vec<String>,
    /// Their bytes, summed.
    pub bytes: u64,
}

/// What [`EventLog::reclaim`](crate::EventLog::reclaim) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reclaimed {
    /// What the engine did: compacted, or nothing to ask (it frees space by
    /// itself, or has no disk).
    pub action: Reclaim,
    /// Bytes its files took on disk before and after; `None` without files.
    pub disk_bytes_before: Option<u64>,
    pub disk_bytes_after: Option<u64>,
    /// How long the engine took, writes waiting meanwhile.
    pub took: std::time::Duration,
}

impl Reclaimed {
    pub fn new(
        action: Reclaim,
        disk_bytes_before: Option<u64>,
        disk_bytes_after: Option<u64>,
        took: std::time::Duration,
    ) -> Reclaimed {
        Reclaimed {
            action,
            disk_bytes_before,
            disk_bytes_after,
            took,
        }
    }
}
