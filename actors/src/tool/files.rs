//! How the file tools touch files: they read only regular files, opened so
//! that the open itself cannot hang, and they replace a file's content by
//! writing a temporary file beside it and renaming it over the target only
//! if the call is still wanted.
//!
//! *Why:* opening a FIFO for reading waits for a writer, possibly forever,
//! and reading a device (`/dev/zero`) never ends; either held a thread and
//! the turn. A write made in place lands even after its call was cancelled
//! (the blocking thread cannot be stopped mid-write), and a write cut short
//! leaves a half-written file. With the rename, a cancelled or failed write
//! leaves the target as it was.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;

use super::blocking::Cancel;

/// Why a file the tools were asked to read could not be opened.
#[derive(Debug)]
pub(crate) enum OpenProblem {
    Directory,
    /// It is a FIFO, a socket or a device: `kind` says which.
    NotRegular {
        kind: &'static str,
    },
    Io(io::Error),
}

/// What kind of non-regular file `kind` is, in words; `None` for a regular
/// file or a directory (which the tools report themselves).
pub(crate) fn special_kind(kind: std::fs::FileType) -> Option<&'static str> {
    if kind.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else {
        None
    }
}

/// Open `path` for reading if it is a regular file. The open does not
/// block (`O_NONBLOCK`: a FIFO opens at once instead of waiting for a
/// writer) and the type is checked on the opened file itself, so a file
/// swapped for a FIFO after an earlier check is still refused. On a
/// regular file `O_NONBLOCK` changes nothing.
pub(crate) fn open_regular(path: &Path) -> Result<File, OpenProblem> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(OpenProblem::Io)?;
    let kind = file.metadata().map_err(OpenProblem::Io)?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    Err(match special_kind(kind) {
        Some(kind) => OpenProblem::NotRegular { kind },
        None => OpenProblem::Directory,
    })
}

/// What [`replace`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Replaced {
    /// `content` is the file's content now.
    Landed,
    /// The call was cancelled before the rename: the target is unchanged.
    Cancelled,
}

/// Distinguishes the temporary files of writes running at once.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary file beside the target, removed on drop unless it was
/// renamed over the target.
struct Temp {
    path: PathBuf,
    renamed: bool,
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Make `content` the content of `path` (whose parent directory exists):
/// written to a temporary file in the same directory, flushed to disk, and
/// renamed over `path` only if `cancel` is not raised by then (checked and
/// renamed under [`Cancel::commit`], so once a cancel has returned the
/// rename cannot happen). An existing target's permissions are carried
/// over; its owner is the writer's and a hard link to the old file keeps
/// the old content (a rename makes a new file).
pub(crate) fn replace(path: &Path, content: &[u8], cancel: &Cancel) -> io::Result<Replaced> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path has no parent"))?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(
        ".keel-{}-{}.tmp",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut temp = Temp {
        path: dir.join(temp_name),
        renamed: false,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp.path)?;
    if let Ok(existing) = std::fs::metadata(path) {
        file.set_permissions(existing.permissions())?;
    }
    file.write_all(content)?;
    file.sync_data()?;
    drop(file);
    match cancel.commit(|| std::fs::rename(&temp.path, path)) {
        None => Ok(Replaced::Cancelled),
        Some(renamed) => {
            renamed?;
            temp.renamed = true;
            Ok(Replaced::Landed)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;
    use tokio::sync::mpsc;

    use super::*;
    use crate::tool::blocking::run;
    use crate::tool::blocking::tests::{context, Nothing, PATIENCE};
    use crate::tool::paths::Confinement;
    use crate::tool::ToolOutcome;

    /// A write whose call is cancelled while it runs does not land, and
    /// the cancel does not wait for the work: the call is gone at once.
    #[tokio::test]
    async fn a_write_cancelled_while_it_runs_leaves_the_target_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.txt");
        std::fs::write(&target, "old").unwrap();
        let (events, mut heard) = mpsc::unbounded_channel();
        let (open_gate, gate) = std::sync::mpsc::channel::<()>();
        let ctx = context(json!({}));
        let written = target.clone();
        let call = run(&ctx, move |_: Nothing, _: &Confinement, cancel: &Cancel| {
            let _ = events.send(None);
            // A slow disk: the write is held here until the test lets go.
            let _ = gate.recv();
            let _ = events.send(Some(replace(&written, b"new", cancel).unwrap()));
            ToolOutcome::ok("never seen")
        });
        let mut call = Box::pin(call);
        tokio::select! {
            _ = &mut call => panic!("the write cannot end before its gate opens"),
            started = heard.recv() => assert_eq!(started, Some(None)),
        }
        // The cancel: the call's future is dropped, and that returns with
        // the work still held at its gate.
        drop(call);
        open_gate.send(()).unwrap();
        let replaced = tokio::time::timeout(PATIENCE, heard.recv()).await;
        assert_eq!(
            replaced.expect("the write did not finish"),
            Some(Some(Replaced::Cancelled))
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "the temporary file is gone");
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_replace_lands_keeps_permissions_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.txt");
        std::fs::write(&target, "old").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
        let replaced = replace(&target, b"new", &Cancel::default()).unwrap();
        assert_eq!(replaced, Replaced::Landed);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(names_in(dir.path()), ["f.txt"]);
    }

    #[test]
    fn a_cancelled_replace_leaves_the_target_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.txt");
        std::fs::write(&target, "old").unwrap();
        let cancel = Cancel::default();
        cancel.raise();
        let replaced = replace(&target, b"new", &cancel).unwrap();
        assert_eq!(replaced, Replaced::Cancelled);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        assert_eq!(names_in(dir.path()), ["f.txt"]);
    }

    #[test]
    fn only_regular_files_open_and_a_fifo_does_not_block_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        match open_regular(&fifo) {
            Err(OpenProblem::NotRegular { kind }) => assert_eq!(kind, "a FIFO (named pipe)"),
            other => panic!("a FIFO opened: {other:?}"),
        }
        match open_regular(Path::new("/dev/null")) {
            Err(OpenProblem::NotRegular { kind }) => assert_eq!(kind, "a character device"),
            other => panic!("a device opened: {other:?}"),
        }
        let regular = dir.path().join("f.txt");
        std::fs::write(&regular, "text").unwrap();
        assert!(open_regular(&regular).is_ok());
    }
}
