//! The `glob` tool: the files under a directory whose path (relative to
//! that directory) matches a glob such as `**/*.rs`, in name order, with
//! `.gitignore`d and hidden files left out (see `walk`).
//!
//! At most [`MAX_MATCHES`] paths come back and at most
//! [`MAX_VISITED`](super::walk::MAX_VISITED) entries are visited; the
//! result says when either cut it short. The walk runs on a file tool
//! thread (`blocking`) and stops when the call is cancelled or runs out of
//! time.

use keel_core::wire::ToolSpec;
use serde::Deserialize;

use super::blocking::{self, Cancel};
use super::paths::Confinement;
use super::walk::{self, MAX_VISITED};
use super::{Tool, ToolContext, ToolOutcome};

/// The tool's name, as the model calls it.
pub const NAME: &str = "glob";
/// The most paths one call returns.
pub const MAX_MATCHES: usize = 1_000;

/// `glob`, see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Glob;

#[derive(Debug, Deserialize)]
struct GlobInput {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

#[async_trait::async_trait]
impl Tool for Glob {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.to_owned(),
            description: format!(
                "List the files whose path matches a glob, such as `**/*.rs` or \
                 `src/*.{{js,ts}}`. The pattern is matched against the path relative to \
                 `path` (default: the working directory); `*` does not cross `/`, `**/` \
                 matches any number of directories. Files ignored by .gitignore and hidden \
                 files are left out. Paths come back relative to the working directory, in \
                 name order, at most {MAX_MATCHES}."
            ),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "pattern": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The glob to match, e.g. `**/*.md`."
                    },
                    "path": {
                        "type": "string",
                        "description": "The directory to search in, relative to the working \
                                        directory (default: the working directory)."
                    }
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        blocking::run(&ctx, find).await
    }
}

fn find(input: GlobInput, confinement: &Confinement, cancel: &Cancel) -> ToolOutcome {
    let matcher = match walk::glob(&input.pattern) {
        Ok(matcher) => matcher,
        Err(problem) => return ToolOutcome::error(problem),
    };
    let root = match confinement.resolve(input.path.as_deref().unwrap_or(".")) {
        Ok(root) => root,
        Err(problem) => return ToolOutcome::error(problem),
    };
    if !root.is_dir() {
        return ToolOutcome::error(format!("{} is not a directory", confinement.show(&root)));
    }
    let mut found = Vec::new();
    let mut cut = None;
    for (n_visited, entry) in walk::walk(&root, confinement.forbidden()).enumerate() {
        if cancel.is_raised() {
            return ToolOutcome::error("cancelled");
        }
        if n_visited >= MAX_VISITED {
            cut = Some(format!("stopped after visiting {MAX_VISITED} entries"));
            break;
        }
        // Unreadable directories and the like: skipped, as `find` would
        // after a complaint.
        let Ok(entry) = entry else { continue };
        if entry.file_type().is_none_or(|kind| kind.is_dir()) {
            continue;
        }
        let Ok(relative) = entry.path().strip_prefix(&root) else {
            continue;
        };
        if matcher.is_match(relative) {
            if found.len() == MAX_MATCHES {
                cut = Some(format!("stopped at {MAX_MATCHES} matches"));
                break;
            }
            found.push(confinement.show(entry.path()));
        }
    }
    if found.is_empty() && cut.is_none() {
        return ToolOutcome::ok(format!(
            "no files match {:?} under {}",
            input.pattern,
            confinement.show(&root)
        ));
    }
    let mut text = found.join("\n");
    if let Some(cut) = cut {
        text.push_str(&format!(
            "\n[{cut}; narrow the pattern or the path to see the rest]"
        ));
    }
    ToolOutcome::ok(text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for path in [
            "a.rs",
            "b.txt",
            "src/c.rs",
            "src/deep/d.rs",
            "target/e.rs",
            ".hidden/f.rs",
        ] {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "x").unwrap();
        }
        std::fs::write(dir.path().join(".gitignore"), "target/\n").unwrap();
        dir
    }

    fn glob_in(dir: &std::path::Path, pattern: &str, path: Option<&str>) -> ToolOutcome {
        let confinement = Confinement::new(dir, false).unwrap();
        let input = GlobInput {
            pattern: pattern.to_owned(),
            path: path.map(str::to_owned),
        };
        find(input, &confinement, &Cancel::default())
    }

    #[test]
    fn matches_respect_gitignore_and_hidden() {
        let dir = tree();
        assert_eq!(
            glob_in(dir.path(), "**/*.rs", None),
            ToolOutcome::ok("a.rs\nsrc/c.rs\nsrc/deep/d.rs")
        );
        assert_eq!(glob_in(dir.path(), "*.rs", None), ToolOutcome::ok("a.rs"));
        assert_eq!(
            glob_in(dir.path(), "*.rs", Some("src")),
            ToolOutcome::ok("src/c.rs")
        );
        assert_eq!(
            glob_in(dir.path(), "*.go", None),
            ToolOutcome::ok("no files match \"*.go\" under .")
        );
    }

    #[test]
    fn bad_globs_and_escapes_are_errors() {
        let dir = tree();
        assert!(glob_in(dir.path(), "a[", None).is_error);
        assert!(glob_in(dir.path(), "*", Some("..")).is_error);
        assert!(glob_in(dir.path(), "*", Some("a.rs")).is_error);
    }

    #[test]
    fn a_cancelled_walk_stops() {
        let dir = tree();
        let confinement = Confinement::new(dir.path(), false).unwrap();
        let cancel = Cancel::default();
        cancel.raise();
        let input = GlobInput {
            pattern: "**".to_owned(),
            path: None,
        };
        assert_eq!(
            find(input, &confinement, &cancel),
            ToolOutcome::error("cancelled")
        );
    }
}
