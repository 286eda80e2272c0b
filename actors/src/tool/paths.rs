//! Where the file tools may reach: a path the model gives is taken relative
//! to the conversation's working directory, and must resolve (symlinks
//! followed) to a place inside it, unless the conversation's config says
//! `tools_may_leave_cwd`.
//!
//! The check canonicalizes both sides: the working directory, and the
//! target or, for a file not yet there, its nearest existing ancestor with
//! the missing names appended. So `../x`, an absolute path elsewhere and a
//! symlink inside the directory that points out are all refused, while an
//! absolute path that lies inside is fine. A dangling symlink is refused
//! too: writing through it would create its target wherever it points.
//!
//! This keeps the model's file tools where the user put the conversation;
//! it is not a sandbox. `bash` runs any command anywhere, and a process
//! that swaps a directory for a symlink between the check and the use
//! wins the race. All of it blocks (it asks the file system), so callers
//! run it off the async workers.

use std::io;
use std::path::{Component, Path, PathBuf};

/// The working directory a call's paths are resolved against, and whether
/// they may leave it.
#[derive(Debug, Clone)]
pub(crate) struct Confinement {
    /// The working directory, canonical.
    root: PathBuf,
    /// The conversation's `tools_may_leave_cwd`.
    may_leave: bool,
    /// Where no path may lead, canonical: the daemon's data directory
    /// (docs/sandbox.md), which the kernel's rules cannot hide where it
    /// lies inside the working directory.
    forbidden: Vec<PathBuf>,
}

impl Confinement {
    /// The confinement of `cwd`; fails (with a message for the model) when
    /// the working directory itself cannot be resolved.
    pub(crate) fn new(cwd: &Path, may_leave: bool) -> Result<Confinement, String> {
        let root = std::fs::canonicalize(cwd).map_err(|error| {
            format!(
                "the working directory {} cannot be resolved: {error}",
                cwd.display()
            )
        })?;
        Ok(Confinement {
            root,
            may_leave,
            forbidden: Vec::new(),
        })
    }

    /// The same, refusing every path beneath one of `forbidden`.
    pub(crate) fn forbidding(mut self, forbidden: &[PathBuf]) -> Confinement {
        self.forbidden = forbidden
            .iter()
            .map(|path| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()))
            .collect();
        self
    }

    /// The paths no walk may enter.
    pub(crate) fn forbidden(&self) -> &[PathBuf] {
        &self.forbidden
    }

    /// Where `requested` leads, canonical (as far as it exists), or why the
    /// model may not go there.
    pub(crate) fn resolve(&self, requested: &str) -> Result<PathBuf, String> {
        if requested.is_empty() {
            return Err("the path is empty".to_owned());
        }
        let joined = self.root.join(requested);
        let resolved = resolve_lenient(&joined).map_err(|problem| match problem {
            Problem::Io(error) => format!("cannot resolve {requested:?}: {error}"),
            Problem::DanglingSymlink(link) => format!(
                "{requested:?} goes through {}, a symbolic link to nothing; \
                 refusing to write through it",
                link.display()
            ),
            Problem::ParentOfMissing => {
                format!("{requested:?} uses `..` below a directory that does not exist")
            }
        })?;
        if self
            .forbidden
            .iter()
            .any(|forbidden| resolved.starts_with(forbidden))
        {
            return Err(format!(
                "{requested:?} resolves to {}, inside the daemon's data directory, which \
                 tools may not reach",
                resolved.display()
            ));
        }
        if self.may_leave || resolved.starts_with(&self.root) {
            Ok(resolved)
        } else {
            Err(format!(
                "{requested:?} resolves to {}, outside the working directory {}; \
                 paths must stay inside it (symlinks are followed)",
                resolved.display(),
                self.root.display()
            ))
        }
    }

    /// `path` as the model should see it: relative to the working directory
    /// when it lies inside, else as it is.
    pub(crate) fn show(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(relative) if relative.as_os_str().is_empty() => ".".to_owned(),
            Ok(relative) => relative.display().to_string(),
            Err(_) => path.display().to_string(),
        }
    }
}

enum Problem {
    Io(io::Error),
    DanglingSymlink(PathBuf),
    ParentOfMissing,
}

/// `path` canonicalized as far as it exists, with the names below the
/// nearest existing ancestor appended as they are.
fn resolve_lenient(path: &Path) -> Result<PathBuf, Problem> {
    let mut existing = path.to_path_buf();
    // The names below `existing`, innermost last once reversed.
    let mut missing = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(canonical) => {
                let mut resolved = canonical;
                for name in missing.iter().rev() {
                    resolved.push(name);
                }
                return Ok(resolved);
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                // Missing, or a symlink whose target is missing.
                if std::fs::symlink_metadata(&existing).is_ok() {
                    return Err(Problem::DanglingSymlink(existing));
                }
                match existing.components().next_back() {
                    Some(Component::Normal(name)) => missing.push(name.to_owned()),
                    Some(Component::CurDir) => {}
                    Some(Component::ParentDir) => return Err(Problem::ParentOfMissing),
                    // The root or a prefix always exists: the error was real.
                    Some(Component::RootDir | Component::Prefix(_)) | None => {
                        return Err(Problem::Io(error))
                    }
                }
                if !existing.pop() {
                    return Err(Problem::Io(error));
                }
            }
            Err(error) => return Err(Problem::Io(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn setup() -> (tempfile::TempDir, Confinement) {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("sub")).unwrap();
        std::fs::write(work.join("sub/file.txt"), "x").unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        let confinement = Confinement::new(&work, false).unwrap();
        (dir, confinement)
    }

    #[test]
    fn relative_and_absolute_paths_inside_resolve() {
        let (_dir, confinement) = setup();
        let root = confinement.root.clone();
        assert_eq!(
            confinement.resolve("sub/file.txt").unwrap(),
            root.join("sub/file.txt")
        );
        assert_eq!(
            confinement.resolve("./sub/../sub/file.txt").unwrap(),
            root.join("sub/file.txt")
        );
        let absolute = root.join("sub/file.txt");
        assert_eq!(
            confinement.resolve(absolute.to_str().unwrap()).unwrap(),
            absolute
        );
        assert_eq!(
            confinement.resolve("new/deeper/file").unwrap(),
            root.join("new/deeper/file")
        );
        assert_eq!(confinement.resolve(".").unwrap(), root);
    }

    #[test]
    fn escapes_are_refused() {
        let (dir, confinement) = setup();
        let outside = dir.path().join("secret");
        for requested in [
            "../secret",
            "sub/../../secret",
            outside.to_str().unwrap(),
            "/etc",
        ] {
            let refused = confinement.resolve(requested).unwrap_err();
            assert!(
                refused.contains("outside the working directory"),
                "{refused}"
            );
        }
        assert!(confinement.resolve("../not-there/file").is_err());
        let refused = confinement.resolve("missing/../../secret").unwrap_err();
        assert!(refused.contains("`..`"), "{refused}");
    }

    #[test]
    fn symlinks_out_are_refused_and_symlinks_in_followed() {
        let (dir, confinement) = setup();
        let root = confinement.root.clone();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link-out")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("dir-out")).unwrap();
        std::os::unix::fs::symlink(root.join("sub"), root.join("dir-in")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("nothing"), root.join("dangling")).unwrap();
        assert!(confinement.resolve("link-out").is_err());
        assert!(confinement.resolve("dir-out/secret").is_err());
        assert!(confinement.resolve("dir-out/new-file").is_err());
        assert_eq!(
            confinement.resolve("dir-in/file.txt").unwrap(),
            root.join("sub/file.txt")
        );
        let refused = confinement.resolve("dangling").unwrap_err();
        assert!(refused.contains("symbolic link to nothing"), "{refused}");
    }

    #[test]
    fn a_conversation_may_be_allowed_out() {
        let (dir, confinement) = setup();
        let free = Confinement {
            may_leave: true,
            ..confinement
        };
        assert_eq!(
            free.resolve("../secret").unwrap(),
            std::fs::canonicalize(dir.path().join("secret")).unwrap()
        );
    }
}
