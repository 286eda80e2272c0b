//! The `write_file` tool: a file's whole content, created or replaced, with
//! any missing parent directories made.
//!
//! Idempotent by nature: the same call run again (recovery re-dispatches a
//! call whose result was never recorded) writes the same bytes to the same
//! file. The content goes to a temporary file beside the target, which is
//! renamed over it only if the call is still wanted (`files::replace`): a
//! cancelled, timed-out or failed write leaves the file as it was. An
//! existing file keeps its permissions; a hard link to it keeps the old
//! content. Only regular files are written: a FIFO or a device is refused.

use std::io;

use keel_core::wire::ToolSpec;
use serde::Deserialize;

use super::blocking::{self, Cancel};
use super::files::{self, Replaced};
use super::paths::Confinement;
use super::{counted, Tool, ToolContext, ToolOutcome};

/// The tool's name, as the model calls it.
pub const NAME: &str = "write_file";

/// `write_file`, see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFile;

#[derive(Debug, Deserialize)]
struct WriteInput {
    path: String,
    content: String,
}

#[async_trait::async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.to_owned(),
            description: "Write a text file: create it, or replace everything in it, with \
                          `content`. Missing parent directories are created. To change part \
                          of an existing file use edit_file instead. The path is relative to \
                          the working directory and must stay inside it."
                .to_owned(),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "The file, relative to the working directory."
                    },
                    "content": {
                        "type": "string",
                        "description": "The whole new content of the file."
                    }
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        if let Err(refused) = ctx.sandbox.may_write() {
            return ToolOutcome::error(format!("{NAME} was not run: {refused}"));
        }
        blocking::run(&ctx, write).await
    }
}

fn write(input: WriteInput, confinement: &Confinement, cancel: &Cancel) -> ToolOutcome {
    let path = match confinement.resolve(&input.path) {
        Ok(path) => path,
        Err(problem) => return ToolOutcome::error(problem),
    };
    let shown = confinement.show(&path);
    let existed = match std::fs::metadata(&path) {
        Ok(metadata) if metadata.is_dir() => {
            return ToolOutcome::error(format!("{shown} is a directory"))
        }
        Ok(metadata) => match files::special_kind(metadata.file_type()) {
            Some(kind) => {
                return ToolOutcome::error(format!(
                    "{shown} is {kind}, not a regular file; write_file writes regular files only"
                ))
            }
            None => true,
        },
        Err(error) if error.kind() == io::ErrorKind::NotFound => false,
        Err(error) => return ToolOutcome::error(format!("cannot write {shown}: {error}")),
    };
    if let Some(parent) = path.parent() {
        if let Err(error) = std::fs::create_dir_all(parent) {
            return ToolOutcome::error(format!(
                "cannot create the directory {}: {error}",
                confinement.show(parent)
            ));
        }
    }
    match files::replace(&path, input.content.as_bytes(), cancel) {
        Ok(Replaced::Landed) => {}
        Ok(Replaced::Cancelled) => return ToolOutcome::error("cancelled; nothing was written"),
        Err(error) => return ToolOutcome::error(format!("cannot write {shown}: {error}")),
    }
    let verb = if existed { "replaced" } else { "created" };
    ToolOutcome::ok(format!(
        "{verb} {shown}: {}, {}",
        counted(input.content.len(), "byte", "bytes"),
        counted(input.content.lines().count(), "line", "lines")
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write_in(dir: &std::path::Path, path: &str, content: &str) -> ToolOutcome {
        let confinement = Confinement::new(dir, false).unwrap();
        let input = WriteInput {
            path: path.to_owned(),
            content: content.to_owned(),
        };
        write(input, &confinement, &Cancel::default())
    }

    #[test]
    fn creates_with_parents_then_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let outcome = write_in(dir.path(), "a/b/c.txt", "one\ntwo\n");
        assert_eq!(
            outcome,
            ToolOutcome::ok("created a/b/c.txt: 8 bytes, 2 lines")
        );
        let outcome = write_in(dir.path(), "a/b/c.txt", "three");
        assert_eq!(
            outcome,
            ToolOutcome::ok("replaced a/b/c.txt: 5 bytes, 1 line")
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(),
            "three"
        );
    }

    /// The call was cancelled (or ran out of time) before the write
    /// could land: the file keeps its old content, and a new one is not
    /// made.
    #[test]
    fn a_cancelled_write_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "old").unwrap();
        let confinement = Confinement::new(dir.path(), false).unwrap();
        let cancel = Cancel::default();
        cancel.raise();
        for path in ["f.txt", "new.txt"] {
            let input = WriteInput {
                path: path.to_owned(),
                content: "new".to_owned(),
            };
            assert_eq!(
                write(input, &confinement, &cancel),
                ToolOutcome::error("cancelled; nothing was written")
            );
        }
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f.txt")).unwrap(),
            "old"
        );
        assert!(!dir.path().join("new.txt").exists());
    }

    #[test]
    fn refuses_directories_and_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("sub")).unwrap();
        assert_eq!(
            write_in(&work, "sub", "x"),
            ToolOutcome::error("sub is a directory")
        );
        let outcome = write_in(&work, "../escaped.txt", "x");
        assert!(outcome.is_error);
        assert!(!dir.path().join("escaped.txt").exists());
    }
}
