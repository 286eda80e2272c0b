//! One process per data directory. sled and redb lock their own files, but
//! neither says who holds them; keel's own lock file records the holder's
//! pid so the error can name it.
//!
//! A lock whose holder just died can stay held for a moment: a child the
//! holder was forking when it was killed shares the lock's open file until
//! it execs (which closes it). A daemon restarted at once after a `SIGKILL`
//! (a crash drill does exactly that) would fail to open its own data dir,
//! so `acquire` waits up to [`LOCK_PATIENCE`] before saying the dir is in
//! use.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Held for as long as the store is open; the OS releases it if the process dies.
pub struct DirLock {
    _file: File,
}

/// How long `acquire` waits for a held lock to be let go.
pub const LOCK_PATIENCE: Duration = Duration::from_secs(2);

impl DirLock {
    /// Lock `dir`, waiting up to [`LOCK_PATIENCE`] if it is held.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        DirLock::acquire_within(dir, LOCK_PATIENCE)
    }

    /// Lock `dir`, waiting up to `patience` if it is held.
    pub fn acquire_within(dir: &Path, patience: Duration) -> Result<DirLock> {
        let io = |source| Error::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let path: PathBuf = dir.join("LOCK");
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < patience => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let pid = file
                        .read_to_string(&mut holder)
                        .ok()
                        .and_then(|_| holder.trim().parse().ok());
                    return Err(Error::InUse {
                        dir: dir.to_path_buf(),
                        pid,
                    });
                }
                Err(std::fs::TryLockError::Error(source)) => return Err(io(source)),
            }
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        write!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_held_lock_is_in_use_and_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let _held = DirLock::acquire(dir.path()).unwrap();
        let error = DirLock::acquire_within(dir.path(), Duration::ZERO)
            .err()
            .expect("a second lock of a held dir");
        assert!(
            matches!(error, Error::InUse { pid: Some(pid), .. } if pid == std::process::id()),
            "{error}"
        );
    }

    #[test]
    fn a_lock_let_go_while_waiting_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(dir.path()).unwrap();
        let (waiting, started) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        let waiter = std::thread::spawn(move || {
            waiting.send(()).unwrap();
            DirLock::acquire_within(&path, Duration::from_secs(60))
        });
        started.recv().unwrap();
        drop(held);
        assert!(waiter.join().unwrap().is_ok());
    }
}
