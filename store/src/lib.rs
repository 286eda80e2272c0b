//! keel-store: where the log lives. The event log is the only truth about a
//! conversation; snapshots are a cache over it; blobs hold image bytes once
//! by content hash; the index lists conversations and says which were mid-turn.
//! A conversation can be deleted whole, its blobs with it when no other
//! conversation refers to them (`deletion.rs`, `store/removal.rs`).
//!
//! [`EventLog`] is what the actors use. [`Store`] implements it over any
//! [`Backend`]: redb (the default), sled, PostgreSQL (docs/postgres.md), or
//! memory (tests). `open` picks one by [`BackendKind`].

pub mod backend;
pub mod deletion;
pub mod error;
pub mod index;
pub mod keys;
pub mod lock;
pub mod log;
pub mod rehydrate;
pub mod store;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

pub use backend::postgres_nodes::{rendezvous, NodeRow, Nodes, Owner, Writer};
pub use backend::{Backend, MemoryBackend, PostgresBackend, Reclaim, RedbBackend, SledBackend};
pub use deletion::{Deleted, Reclaimed, Swept};
pub use error::{Error, Result};
pub use index::IndexEntry;
pub use keel_core::codec::{decode, encode, DecodeError, CURRENT_VERSION};
pub use log::{Availability, EventLog};
pub use rehydrate::{load, rehydrate, Rehydrated, SnapshotCheck};
pub use store::{blob_hash, Store};

use lock::DirLock;

pub type MemoryLog = Store<MemoryBackend>;
pub type SledLog = Store<SledBackend>;
pub type RedbLog = Store<RedbBackend>;
pub type PostgresLog = Store<PostgresBackend>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// Selectable, not the default: sled 0.34.7 sometimes refuses to reopen
    /// after a SIGKILL (found by `tests/crash.rs`; see the README).
    Sled,
    /// The default: every commit is a durable transaction, and the crash
    /// test never lost an acknowledged append or an open.
    #[default]
    Redb,
    /// A PostgreSQL database, named by a URL rather than a directory
    /// ([`open_postgres`]).
    Postgres,
    Memory,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Sled => "sled",
            BackendKind::Redb => "redb",
            BackendKind::Postgres => "postgres",
            BackendKind::Memory => "memory",
        })
    }
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(raw: &str) -> std::result::Result<Self, String> {
        match raw {
            "sled" => Ok(BackendKind::Sled),
            "redb" => Ok(BackendKind::Redb),
            "postgres" => Ok(BackendKind::Postgres),
            "memory" => Ok(BackendKind::Memory),
            other => Err(format!(
                "unknown store backend {other:?}; use redb, sled, postgres or memory"
            )),
        }
    }
}

pub fn open_memory() -> Result<MemoryLog> {
    Store::new(MemoryBackend::new(), None)
}

/// sled under `dir/sled`, `dir` locked to this process.
pub fn open_sled(dir: &Path) -> Result<SledLog> {
    let lock = DirLock::acquire(dir)?;
    Store::new(SledBackend::open(&dir.join("sled"))?, Some(lock))
}

/// redb in `dir/keel.redb`, `dir` locked to this process.
pub fn open_redb(dir: &Path) -> Result<RedbLog> {
    let lock = DirLock::acquire(dir)?;
    Store::new(RedbBackend::open(&dir.join("keel.redb"))?, Some(lock))
}

/// The PostgreSQL database at `url`, its schema brought up to date, held
/// by this process (one keel per database).
pub fn open_postgres(url: &str) -> Result<PostgresLog> {
    Store::new(PostgresBackend::open(url)?, None)
}

/// The PostgreSQL database at `url`, written by this process as the node
/// `node`, one of several, under a new epoch that every commit checks
/// (docs/postgres.md, "Fencing").
pub fn open_postgres_node(url: &str, node: &str) -> Result<PostgresLog> {
    Store::new(
        PostgresBackend::open_node(url, node, DEFAULT_NODE_LEASE)?,
        None,
    )
}

/// The lease of a node opened without one.
pub const DEFAULT_NODE_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// [`open_postgres_node`] for a daemon: `dir` (its token and its tools'
/// process records) locked to this process, and the node's handle on the
/// shared tables (heartbeats, ownership, takeover; docs/nodes.md).
pub fn open_postgres_node_with_dir(
    url: &str,
    dir: &Path,
    node: &str,
    lease: std::time::Duration,
) -> Result<(PostgresLog, backend::postgres_nodes::Nodes)> {
    let lock = DirLock::acquire(dir)?;
    let backend = PostgresBackend::open_node(url, node, lease)?;
    let nodes = backend.nodes().ok_or(Error::Closed)?;
    Ok((Store::new(backend, Some(lock))?, nodes))
}

/// [`open_postgres`], with `dir` (where a daemon keeps its token and its
/// tools' process records) locked to this process as the embedded
/// engines lock theirs: two keels never share one.
pub fn open_postgres_with_dir(url: &str, dir: &Path) -> Result<PostgresLog> {
    let lock = DirLock::acquire(dir)?;
    Store::new(PostgresBackend::open(url)?, Some(lock))
}

/// Open the store a runtime uses: `dir` for the embedded engines (ignored
/// for memory), `database_url` for PostgreSQL.
pub fn open(
    kind: BackendKind,
    dir: &Path,
    database_url: Option<&str>,
) -> Result<Arc<dyn EventLog>> {
    Ok(match kind {
        BackendKind::Sled => Arc::new(open_sled(dir)?),
        BackendKind::Redb => Arc::new(open_redb(dir)?),
        BackendKind::Postgres => match database_url {
            Some(url) => Arc::new(open_postgres_with_dir(url, dir)?),
            None => {
                return Err(Error::Backend {
                    backend: "postgres",
                    reason: "no database URL given (KEEL_DATABASE_URL)".to_owned(),
                })
            }
        },
        BackendKind::Memory => Arc::new(open_memory()?),
    })
}
