//! keel-store: where the log lives. The event log is the only truth about a
//! conversation; snapshots are a cache over it.
//!
//! For now this crate holds only the codec re-export the store will write
//! with; the `EventLog` trait and its sled, redb and in-memory backends come
//! next (see ARCHITECTURE.md).

pub use keel_core::codec::{decode, encode, DecodeError, CURRENT_VERSION};
