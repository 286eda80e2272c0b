//! sled 0.34.7, a selectable backend. redb is the default: the crash test
//! showed sled sometimes refusing to reopen after a SIGKILL.
//!
//! What sled promises, and what keel relies on: `apply_batch` is atomic, and
//! nothing is durable until `flush()`, which `commit` calls before it
//! returns. 0.34.7's flush uses `sync_file_range`, which survives a killed
//! process but not a power loss (README.md, "Storage backends").
//!
//! Space: sled 0.34.7 has no compaction to ask for (its cleanup settings
//! are deprecated no-ops). A removal writes a new version of the page it
//! touched; a segment is freed once none of its pages is live, and the file
//! is cut short only when its last segments are free. `reclaim` can only
//! flush and say so (`Reclaim::ByItself`); docs/benchmarks.md has what
//! that left on disk after deleting half of 10,000 conversations.

use std::path::{Path, PathBuf};

use super::{Backend, Entry, Reclaim, Visit, Write};
use crate::error::{Error, Result};

pub struct SledBackend {
    db: sled::Db,
    dir: PathBuf,
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
    /// Open sled in `dir`. Callers hold keel's own lock on the data dir
    /// first, so the only other holder of sled's file lock can be a store
    /// this process just dropped: sled releases it a little after the drop
    /// returns (seen up to ~80 ms under load). Wait that out briefly rather
    /// than fail.
    pub fn open(dir: &Path) -> Result<SledBackend> {
        const ATTEMPTS: u32 = 100;
        const PAUSE: std::time::Duration = std::time::Duration::from_millis(10);
        let mut attempt = 1;
        loop {
            match sled::Config::new().path(dir).open() {
                Ok(db) => {
                    return Ok(SledBackend {
                        db,
                        dir: dir.to_path_buf(),
                    })
                }
                // sled reports a held lock as an `Other` I/O error whose
                // text is the only sign of what it is.
                Err(sled::Error::Io(io))
                    if io.to_string().contains("could not acquire lock") && attempt < ATTEMPTS =>
                {
                    attempt += 1;
                    std::thread::sleep(PAUSE);
                }
                Err(error) => return Err(backend_error(error)),
            }
        }
    }
}

impl Backend for SledBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    /// A `sled::Batch` keeps the last change of each key, which is what
    /// applying them in order gives.
    fn commit(&self, writes: &[Write]) -> Result<()> {
        let mut batch = sled::Batch::default();
        for write in writes {
            match write {
                Write::Put(key, value) => batch.insert(key.as_slice(), value.as_slice()),
                Write::Remove(key) => batch.remove(key.as_slice()),
            }
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
        for item in self.db.range(start..end).take(limit) {
            let (key, value) = item.map_err(backend_error)?;
            visit(&key, &value)?;
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

    /// Every file under sled's directory: its log, its snapshots and the
    /// files it keeps large values in.
    fn disk_bytes(&self) -> Result<Option<u64>> {
        dir_bytes(&self.dir).map(Some)
    }

    /// Nothing to ask of sled but a flush (see the module doc).
    fn reclaim(&self) -> Result<Reclaim> {
        self.db.flush().map_err(backend_error)?;
        Ok(Reclaim::ByItself)
    }
}

/// The length of every file under `dir`, summed.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let metadata = match entry.metadata() {
            Ok(metadata) => metadata,
            // sled removes the file of a value it dropped in the background.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(io(&path)(error)),
        };
        total += if metadata.is_dir() {
            dir_bytes(&path)?
        } else {
            metadata.len()
        };
    }
    Ok(total)
}
