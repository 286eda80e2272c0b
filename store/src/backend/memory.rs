//! The in-memory backend, for tests and embedders that want no disk. It
//! keeps the same contract as the others except durability across processes.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use super::{Backend, Entry, Visit, Write};
use crate::error::{Error, Result};

#[derive(Default)]
pub struct MemoryBackend {
    map: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    fn map(&self) -> Result<MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>>> {
        self.map.lock().map_err(|_| Error::Backend {
            backend: "memory",
            reason: "lock poisoned by a panic".to_owned(),
        })
    }
}

fn bounds<'a>(start: &'a [u8], end: &'a [u8]) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
    (Bound::Included(start), Bound::Excluded(end))
}

impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn commit(&self, writes: &[Write]) -> Result<()> {
        let mut map = self.map()?;
        for write in writes {
            match write {
                Write::Put(key, value) => {
                    map.insert(key.clone(), value.clone());
                }
                Write::Remove(key) => {
                    map.remove(key);
                }
            }
        }
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.map()?.get(key).cloned())
    }

    /// Visits under the map's lock, so a long visit delays writers; this
    /// backend serves tests, where that does not matter.
    fn visit_range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let map = self.map()?;
        for (key, value) in map.range::<[u8], _>(bounds(start, end)).take(limit) {
            visit(key, value)?;
        }
        Ok(())
    }

    fn last(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>> {
        Ok(self.tail(start, end, 1)?.pop())
    }

    fn tail(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let map = self.map()?;
        let mut entries: Vec<Entry> = map
            .range::<[u8], _>(bounds(start, end))
            .rev()
            .take(limit)
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        entries.reverse();
        Ok(entries)
    }
}
