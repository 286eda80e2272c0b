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

pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Write every entry atomically, and return only once they are durable.
    /// An error here is fatal to the store (a failed flush is never retried).
    fn commit(&self, writes: &[Entry]) -> Result<()>;

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Entries with `start <= key < end`, in key order, at most `limit`.
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>>;

    /// The entry with the greatest key in `start <= key < end`.
    fn last(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>>;

    /// Up to `limit` entries with the greatest keys in `start <= key < end`,
    /// in key order.
    fn tail(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>>;
}
