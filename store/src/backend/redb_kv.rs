//! redb: a maintained embedded store whose commits are crash-safe by default
//! (`Durability::Immediate`: the commit returns after fsync, and a torn
//! commit is rolled back on open).
//!
//! Removed entries free their pages for reuse, but the file does not
//! shrink by itself: `reclaim` runs `Database::compact`, which moves live
//! pages down and cuts the file's free end off. Compacting needs the
//! database to itself (`&mut Database`, no read transaction open), so the
//! database sits behind a lock that every read and commit takes shared
//! and compaction takes alone: while it runs, reads and writes wait.

use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard};

use redb::{Database, TableDefinition};

use super::{Backend, Entry, Reclaim, Visit, Write};
use crate::error::{Error, Result};

const NAME: &str = "redb";
const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("keel");

pub struct RedbBackend {
    db: RwLock<Database>,
    path: PathBuf,
}

fn poisoned() -> Error {
    Error::Backend {
        backend: NAME,
        reason: "database lock poisoned by a panic".to_owned(),
    }
}

fn backend_error(error: impl Into<redb::Error>) -> Error {
    match error.into() {
        redb::Error::Io(io) => Error::from_io(NAME, io),
        redb::Error::Corrupted(reason) => Error::CorruptMeta {
            what: "redb database".to_owned(),
            reason,
        },
        other => Error::Backend {
            backend: NAME,
            reason: other.to_string(),
        },
    }
}

type Item<'a> = std::result::Result<
    (
        redb::AccessGuard<'a, &'static [u8]>,
        redb::AccessGuard<'a, &'static [u8]>,
    ),
    redb::StorageError,
>;

fn owned(item: Item<'_>) -> Result<Entry> {
    item.map(|(key, value)| (key.value().to_vec(), value.value().to_vec()))
        .map_err(backend_error)
}

/// Build a new, empty database at `path` such that a crash part-way leaves
/// nothing there. redb initialises a new file by sizing it, writing the
/// header and only then the magic number, and refuses any non-empty file
/// without one (`InvalidData`): a process killed inside `Database::create`
/// of a new file would leave a `keel.redb` that no later open accepts (found
/// by `tests/crash.rs`). So the file is made under a temporary name and
/// renamed into place once complete; a leftover temporary file is redone.
fn create_new(path: &Path) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let staging = path.with_extension("redb.new");
    match std::fs::remove_file(&staging) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(&staging)(error))
        }
        _ => {}
    }
    {
        let db = Database::create(&staging).map_err(backend_error)?;
        let txn = db.begin_write().map_err(backend_error)?;
        txn.open_table(TABLE).map_err(backend_error)?;
        txn.commit().map_err(backend_error)?;
    }
    std::fs::rename(&staging, path).map_err(io(path))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io(dir))?;
    }
    Ok(())
}

/// redb's page cache. Its default (1 GiB) lets a daemon's resident memory
/// grow with everything it ever wrote; conversations that run are served
/// by their actors' working sets, and a cold start reads one checkpoint and
/// a short tail, so a modest cache is enough.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

impl RedbBackend {
    pub fn open(path: &Path) -> Result<RedbBackend> {
        if !path.try_exists().map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })? {
            create_new(path)?;
        }
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(backend_error)?;
        // Create the table up front so readers never meet a missing table.
        let txn = db.begin_write().map_err(backend_error)?;
        txn.open_table(TABLE).map_err(backend_error)?;
        txn.commit().map_err(backend_error)?;
        Ok(RedbBackend {
            db: RwLock::new(db),
            path: path.to_path_buf(),
        })
    }

    /// The database, shared with every other read and commit; only
    /// `reclaim` takes it alone.
    fn db(&self) -> Result<RwLockReadGuard<'_, Database>> {
        self.db.read().map_err(|_| poisoned())
    }

    /// Up to `limit` entries with the greatest keys in `start <= key < end`,
    /// copied out, in key order.
    fn scan_back(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let db = self.db()?;
        let txn = db.begin_read().map_err(backend_error)?;
        let table = txn.open_table(TABLE).map_err(backend_error)?;
        let range = table.range(start..end).map_err(backend_error)?;
        let mut entries: Vec<Entry> = range.rev().take(limit).map(owned).collect::<Result<_>>()?;
        entries.reverse();
        Ok(entries)
    }
}

impl Backend for RedbBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn commit(&self, writes: &[Write]) -> Result<()> {
        let db = self.db()?;
        let txn = db.begin_write().map_err(backend_error)?;
        {
            let mut table = txn.open_table(TABLE).map_err(backend_error)?;
            for write in writes {
                match write {
                    Write::Put(key, value) => {
                        table
                            .insert(key.as_slice(), value.as_slice())
                            .map_err(backend_error)?;
                    }
                    Write::Remove(key) => {
                        table.remove(key.as_slice()).map_err(backend_error)?;
                    }
                }
            }
        }
        txn.commit().map_err(backend_error)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let db = self.db()?;
        let txn = db.begin_read().map_err(backend_error)?;
        let table = txn.open_table(TABLE).map_err(backend_error)?;
        let value = table.get(key).map_err(backend_error)?;
        Ok(value.map(|guard| guard.value().to_vec()))
    }

    /// Key and value are borrowed from the pages the read transaction holds
    /// (`AccessGuard::value`): nothing is copied.
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
        let db = self.db()?;
        let txn = db.begin_read().map_err(backend_error)?;
        let table = txn.open_table(TABLE).map_err(backend_error)?;
        let range = table.range(start..end).map_err(backend_error)?;
        for item in range.take(limit) {
            let (key, value) = item.map_err(backend_error)?;
            visit(key.value(), value.value())?;
        }
        Ok(())
    }

    fn last(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>> {
        Ok(self.scan_back(start, end, 1)?.pop())
    }

    fn tail(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>> {
        self.scan_back(start, end, limit)
    }

    fn disk_bytes(&self) -> Result<Option<u64>> {
        let metadata = std::fs::metadata(&self.path).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(Some(metadata.len()))
    }

    /// Compact the file, with every read and commit waiting meanwhile.
    /// redb repeats its passes until one moves nothing.
    fn reclaim(&self) -> Result<Reclaim> {
        let mut db = self.db.write().map_err(|_| poisoned())?;
        db.compact().map_err(backend_error)?;
        Ok(Reclaim::Compacted)
    }
}
