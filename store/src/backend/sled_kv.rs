//! sled 0.34.7, the backend DESIGN.md names as the default.
//!
//! What sled promises, and what keel relies on: `apply_batch` is atomic, and
//! nothing is durable until `flush()`, which `commit` calls before it
//! returns. 0.34.7's flush uses `sync_file_range`, which survives a killed
//! process but not a power loss (README.md, "Storage backends").

use std::path::Path;

use super::{Backend, Entry};
use crate::error::{Error, Result};

pub struct SledBackend {
    db: sled::Db,
}

const NAME: &str = "sled";

fn backend_error(error: sled::Error) -> Error {
    match error {
        sled::Error::Io(io) => Error::from_io(NAME, io),
        sled::Error::Corruption { at, .. } => Error::CorruptMeta {
            what: "sled database".to_owned(),
            reason: format!("corruption at {at:?}"),
        },
        other => Error::Backend {
            backend: NAME,
            reason: other.to_string(),
        },
    }
}

impl SledBackend {
    pub fn open(dir: &Path) -> Result<SledBackend> {
        let db = sled::Config::new()
            .path(dir)
            .open()
            .map_err(backend_error)?;
        Ok(SledBackend { db })
    }
}

impl Backend for SledBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn commit(&self, writes: &[Entry]) -> Result<()> {
        let mut batch = sled::Batch::default();
        for (key, value) in writes {
            batch.insert(key.as_slice(), value.as_slice());
        }
        self.db.apply_batch(batch).map_err(backend_error)?;
        self.db.flush().map_err(backend_error)?;
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .db
            .get(key)
            .map_err(backend_error)?
            .map(|value| value.to_vec()))
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        self.db
            .range(start..end)
            .take(limit)
            .map(|item| {
                item.map(|(key, value)| (key.to_vec(), value.to_vec()))
                    .map_err(backend_error)
            })
            .collect()
    }

    fn last(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>> {
        Ok(self.tail(start, end, 1)?.pop())
    }

    fn tail(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let mut entries = self
            .db
            .range(start..end)
            .rev()
            .take(limit)
            .map(|item| {
                item.map(|(key, value)| (key.to_vec(), value.to_vec()))
                    .map_err(backend_error)
            })
            .collect::<Result<Vec<Entry>>>()?;
        entries.reverse();
        Ok(entries)
    }
}
