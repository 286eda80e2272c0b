//! The one thing a storage engine must do for keel: an ordered key-value
//! space with atomic, durable batches. `Store` builds the event log,
//! snapshots, blobs and the index on top, the same way for every engine.

mod memory;
mod redb_kv;
mod sled_kv;

pub use memory::MemoryBackend;
pub use redb_kv::RedbBackend;
pub use sled_kv::SledBackend;

use crate::error::Result;

pub type Entry = (Vec<u8>, Vec<u8>);

/// What [`Backend::visit_range`] calls on each entry: its key and value,
/// borrowed from the engine for the length of the call.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Write every entry atomically, and return only once they are durable.
    /// An error here is fatal to the store (a failed flush is never retried).
    fn commit(&self, writes: &[Entry]) -> Result<()>;

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
}
