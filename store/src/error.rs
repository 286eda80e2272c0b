//! keel-store's one error type. Messages are lowercase and name what a user
//! can act on: which conversation and seq, which directory, which process.

use std::path::PathBuf;

use keel_core::ids::{ConversationId, Seq};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("data directory {dir} is in use by {}", match .pid { Some(pid) => format!("pid {pid}"), None => "another process".to_owned() })]
    InUse { dir: PathBuf, pid: Option<u32> },

    #[error("append to {conversation} must continue at seq {expected}, got seq {found}")]
    NonContiguous {
        conversation: ConversationId,
        expected: Seq,
        found: Seq,
    },

    #[error("invalid append to {conversation}: {reason}")]
    InvalidAppend {
        conversation: ConversationId,
        reason: String,
    },

    #[error("record {conversation}:{seq} is corrupted: {reason}")]
    Corrupt {
        conversation: ConversationId,
        seq: Seq,
        reason: String,
    },

    #[error("stored {what} is corrupted: {reason}")]
    CorruptMeta { what: String, reason: String },

    #[error("disk is full")]
    DiskFull {
        #[source]
        source: std::io::Error,
    },

    /// A flush or fsync failed. It is never retried (the kernel may already
    /// have dropped the dirty pages), so the store takes no more writes; the
    /// runtime must restart and recover from the log.
    #[error("store stopped after a failed flush; restart to recover from the log: {reason}")]
    Fatal { reason: String },

    #[error("store is closed")]
    Closed,

    /// This process writes the database as node `node` under `epoch`, and
    /// another node moved that epoch on (to `now`, or removed the node):
    /// it took this node's conversations over. Nothing was committed, and
    /// this node must write no more (docs/postgres.md, "Fencing").
    #[error("node {node} was fenced off: it writes under epoch {epoch}, and the database now says {}; another node took its conversations over", match .now { Some(now) => format!("epoch {now}"), None => "no such node".to_owned() })]
    Fenced {
        node: String,
        epoch: i64,
        now: Option<i64>,
    },

    /// A read handed to tokio's blocking pool (where every read of the
    /// engine runs, so that none holds up a runtime thread) did not finish:
    /// it panicked, or the runtime shut down before it ran.
    #[error("a store read on the blocking pool {}", if .source.is_panic() { "panicked" } else { "was cancelled" })]
    ReadAborted {
        #[source]
        source: tokio::task::JoinError,
    },

    #[error("{backend} error: {reason}")]
    Backend {
        backend: &'static str,
        reason: String,
    },

    #[error("i/o error on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Classify an I/O error from a backend: a full disk is worth naming.
    pub(crate) fn from_io(backend: &'static str, error: std::io::Error) -> Error {
        if error.kind() == std::io::ErrorKind::StorageFull {
            Error::DiskFull { source: error }
        } else {
            Error::Backend {
                backend,
                reason: error.to_string(),
            }
        }
    }
}
