//! The directory walk `glob` and `grep` share: `.gitignore` (and
//! `.ignore`, and git's global excludes) respected whether or not the
//! directory is a git repository, hidden files and directories skipped,
//! symlinks not followed (so a walk never leaves the directory it starts
//! in), entries in name order so that results and their cut are the same
//! on every run.

use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};

/// The most entries one walk visits; a tool that reaches it says so.
pub const MAX_VISITED: usize = 200_000;

/// The walk from `root` (a directory or a single file), never entering
/// one of `forbidden` (the daemon's data directory).
pub(crate) fn walk(root: &Path, forbidden: &[PathBuf]) -> ignore::Walk {
    let forbidden = forbidden.to_vec();
    ignore::WalkBuilder::new(root)
        .filter_entry(move |entry| {
            !forbidden
                .iter()
                .any(|forbidden| entry.path().starts_with(forbidden))
        })
        .hidden(true)
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|left, right| left.cmp(right))
        .build()
}

/// A glob as the tools take it: `*` and `?` stop at `/`, `**` crosses
/// directories, `{a,b}` picks either.
pub(crate) fn glob(pattern: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|error| format!("bad glob {pattern:?}: {error}"))
}
