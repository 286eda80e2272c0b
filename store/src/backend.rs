//! The one thing a storage engine must do for keel: an ordered key-value
//! space with atomic, durable batches of puts and removals. `Store` builds
//! the event log, snapshots, blobs and the index on top, the same way for
//! every engine. Giving space back after removals is the engine's own
//! business ([`Backend::reclaim`]): redb compacts its file on request,
//! sled frees its segments by itself, PostgreSQL vacuums, memory has
//! nothing to give back.

mod memory;
mod postgres_error;
mod postgres_kv;
pub mod postgres_nodes;
mod redb_kv;
mod sled_kv;

pub use memory::MemoryBackend;
pub use postgres_kv::PostgresBackend;
pub use redb_kv::RedbBackend;
pub use sled_kv::SledBackend;

use crate::error::Result;

pub type Entry = (Vec<u8>, Vec<u8>);

/// One change of a commit. A commit applies its changes in order, so a
/// key removed and then put again in one commit ends up put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

impl Write {
    /// The key this change is about.
    pub fn key(&self) -> &[u8] {
        match self {
            Write::Put(key, _) | Write::Remove(key) => key,
        }
    }
}

impl From<Entry> for Write {
    fn from((key, value): Entry) -> Write {
        Write::Put(key, value)
    }
}

/// What an engine did when asked to give space back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    /// The engine rewrote its file without the space removals freed
    /// (redb's `Database::compact`); writes (and, on redb, reads) waited.
    Compacted,
    /// The engine frees space by itself and has nothing to ask: sled 0.34
    /// frees a segment once its cleaner has moved the live pages out, and
    /// shortens its file when the last segments are free.
    ByItself,
    /// Nothing on disk: removals gave the memory back already.
    InMemory,
}

/// What [`Backend::visit_range`] calls on each entry: its key and value,
/// borrowed from the engine for the length of the call.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Apply every change atomically, in order, and return only once they
    /// are durable. Removing a key that is not there is no error. An error
    /// here is fatal to the store (a failed flush is never retried).
    fn commit(&self, writes: &[Write]) -> Result<()>;

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Call `visit` on the entries with `start <= key < end`, in key order,
    /// at most `limit`, with key and value borrowed from the engine: a
    /// reader that only decodes them (`Store::read`) then copies nothing.
    /// The first error, the engine's or `visit`'s, ends the scan and is
    /// returned. `visit` must not call back into the backend: the memory
    /// backend holds its lock while it runs.
    fn visit_range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        visit: &mut Visit<'_>,
    ) -> Result<()>;

    /// Entries with `start <= key < end`, in key order, at most `limit`,
    /// copied out of the engine.
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>> {
        let mut entries = Vec::new();
        self.visit_range(start, end, limit, &mut |key, value| {
            entries.push((key.to_vec(), value.to_vec()));
            Ok(())
        })?;
        Ok(entries)
    }

    /// The entry with the greatest key in `start <= key < end`.
    fn last(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>>;

    /// Up to `limit` entries with the greatest keys in `start <= key < end`,
    /// in key order.
    fn tail(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>>;

    /// Whether `key` is there, without copying its value out (a blob's
    /// value is an image).
    fn contains(&self, key: &[u8]) -> Result<bool> {
        let mut end = key.to_vec();
        end.push(0);
        let mut found = false;
        self.visit_range(key, &end, 1, &mut |_, _| {
            found = true;
            Ok(())
        })?;
        Ok(found)
    }

    /// Bytes the engine's files take on disk (their length), or `None` for
    /// an engine without files.
    fn disk_bytes(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Give back the space that removed entries took, as far as the engine
    /// can. Called only when no commit is under way and none will start
    /// until it returns (the store's committer calls it). The default is
    /// an engine with nothing on disk.
    fn reclaim(&self) -> Result<Reclaim> {
        Ok(Reclaim::InMemory)
    }
}
