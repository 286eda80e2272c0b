//! The `grep` tool: lines matching a regular expression (Rust `regex`
//! syntax, as ripgrep's) in the files under a directory, or in one file,
//! as `path:line:text`. It walks like `glob` (`.gitignore` respected,
//! hidden files skipped) and skips binary files.
//!
//! Output is bounded: at most [`MAX_MATCHES`] lines, each cut at
//! [`MAX_LINE_CHARS`] characters, files over [`MAX_FILE`] skipped, and at
//! most [`MAX_VISITED`](super::walk::MAX_VISITED) entries visited; the
//! result says when it was cut. Only regular files are searched (a FIFO
//! would block). The search runs on a file tool thread (`blocking`) and
//! stops when the call is cancelled or runs out of time.

use std::io;
use std::path::Path;

use globset::GlobMatcher;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder};
use keel_core::wire::ToolSpec;
use serde::Deserialize;

use super::blocking::{self, Cancel};
use super::files::{self, OpenProblem};
use super::paths::Confinement;
use super::walk::{self, MAX_VISITED};
use super::{counted, Tool, ToolContext, ToolOutcome};

/// The tool's name, as the model calls it.
pub const NAME: &str = "grep";
/// The most matching lines one call returns.
pub const MAX_MATCHES: usize = 500;
/// Matching lines longer than this are cut.
pub const MAX_LINE_CHARS: usize = 500;
/// Larger files are not searched (logs, data dumps).
pub const MAX_FILE: u64 = 16 * 1024 * 1024;

/// `grep`, see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grep;

#[derive(Debug, Deserialize)]
struct GrepInput {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
}

#[async_trait::async_trait]
impl Tool for Grep {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.to_owned(),
            description: format!(
                "Search file contents for a regular expression (Rust regex syntax, like \
                 ripgrep) and list the matching lines as `path:line:text`. Searches the \
                 files under `path` (a directory or one file; default: the working \
                 directory), leaving out files ignored by .gitignore, hidden files and \
                 binary files. `glob` keeps only files matching it (`*.rs` matches by \
                 file name anywhere; a glob with `/` matches the path). At most \
                 {MAX_MATCHES} lines come back, each cut at {MAX_LINE_CHARS} characters."
            ),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "pattern": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The regular expression to search for."
                    },
                    "path": {
                        "type": "string",
                        "description": "A directory or file to search, relative to the \
                                        working directory (default: the working directory)."
                    },
                    "glob": {
                        "type": "string",
                        "description": "Only search files matching this glob, e.g. `*.rs`."
                    },
                    "case_insensitive": {
                        "type": "boolean",
                        "description": "Match regardless of case."
                    }
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        blocking::run(&ctx, search).await
    }
}

/// The files to search: those whose name (for a glob without `/`) or
/// path below the search root matches.
struct FileFilter {
    matcher: GlobMatcher,
    by_name: bool,
}

impl FileFilter {
    fn keeps(&self, relative: &Path) -> bool {
        if self.by_name {
            relative
                .file_name()
                .is_some_and(|name| self.matcher.is_match(name))
        } else {
            self.matcher.is_match(relative)
        }
    }
}

fn search(input: GrepInput, confinement: &Confinement, cancel: &Cancel) -> ToolOutcome {
    let matcher = match RegexMatcherBuilder::new()
        .case_insensitive(input.case_insensitive)
        .build(&input.pattern)
    {
        Ok(matcher) => matcher,
        Err(error) => {
            return ToolOutcome::error(format!("bad regular expression: {error}"));
        }
    };
    let filter = match &input.glob {
        None => None,
        Some(glob) => match walk::glob(glob) {
            Ok(matcher) => Some(FileFilter {
                matcher,
                by_name: !glob.contains('/'),
            }),
            Err(problem) => return ToolOutcome::error(problem),
        },
    };
    let root = match confinement.resolve(input.path.as_deref().unwrap_or(".")) {
        Ok(root) => root,
        Err(problem) => return ToolOutcome::error(problem),
    };
    if !root.exists() {
        return ToolOutcome::error(format!("{} does not exist", confinement.show(&root)));
    }
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        .build();
    let mut found = Found::default();
    for (n_visited, entry) in walk::walk(&root, confinement.forbidden()).enumerate() {
        if cancel.is_raised() {
            return ToolOutcome::error("cancelled");
        }
        if n_visited >= MAX_VISITED {
            found.cut = Some(format!("stopped after visiting {MAX_VISITED} entries"));
            break;
        }
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_some_and(|kind| kind.is_file()) {
            continue;
        }
        let path = entry.path();
        // Below the root; a root that is a file is its own name.
        let relative = match path.strip_prefix(&root) {
            Ok(relative) if !relative.as_os_str().is_empty() => relative,
            _ => path.file_name().map_or(path, Path::new),
        };
        if filter
            .as_ref()
            .is_some_and(|filter| !filter.keeps(relative))
        {
            continue;
        }
        if entry
            .metadata()
            .is_ok_and(|metadata| metadata.len() > MAX_FILE)
        {
            found.n_skipped_large += 1;
            continue;
        }
        let shown = confinement.show(path);
        // A file that cannot be read is skipped, as ripgrep does.
        let _ = search_file(&mut searcher, &matcher, path, &shown, &mut found);
        if found.cut.is_some() {
            break;
        }
    }
    found.into_outcome(&input.pattern)
}

/// What the search has found so far.
#[derive(Default)]
struct Found {
    lines: Vec<String>,
    /// Why the search stopped early, if it did.
    cut: Option<String>,
    n_skipped_large: usize,
}

impl Found {
    fn into_outcome(self, pattern: &str) -> ToolOutcome {
        let mut text = if self.lines.is_empty() {
            format!("no matches for {pattern:?}")
        } else {
            self.lines.join("\n")
        };
        if let Some(cut) = self.cut {
            text.push_str(&format!(
                "\n[{cut}; narrow the pattern, the path or the glob to see the rest]"
            ));
        }
        if self.n_skipped_large > 0 {
            text.push_str(&format!(
                "\n[{} over {} MiB not searched]",
                counted(self.n_skipped_large, "file", "files"),
                MAX_FILE / 1024 / 1024
            ));
        }
        ToolOutcome::ok(text)
    }
}

fn search_file(
    searcher: &mut Searcher,
    matcher: &RegexMatcher,
    path: &Path,
    shown: &str,
    found: &mut Found,
) -> io::Result<()> {
    // Only a regular file: a FIFO swapped in since the walk saw the entry
    // would block the search.
    let file = files::open_regular(path).map_err(|problem| match problem {
        OpenProblem::Io(error) => error,
        OpenProblem::Directory | OpenProblem::NotRegular { .. } => {
            io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")
        }
    })?;
    searcher.search_file(
        matcher,
        &file,
        Lossy(|line_number, line| {
            if found.lines.len() == MAX_MATCHES {
                found.cut = Some(format!("stopped at {MAX_MATCHES} matching lines"));
                return Ok(false);
            }
            let line = line.trim_end_matches(['\n', '\r']);
            let line = match line.char_indices().nth(MAX_LINE_CHARS) {
                Some((end, _)) => format!("{} [line cut]", &line[..end]),
                None => line.to_owned(),
            };
            found.lines.push(format!("{shown}:{line_number}:{line}"));
            Ok(true)
        }),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let files: [(&str, &[u8]); 6] = [
            ("a.rs", b"fn alpha() {}\nfn beta() {}\n"),
            ("notes.txt", b"Alpha and omega\n"),
            ("src/c.rs", b"// alpha here too\n"),
            ("target/gen.rs", b"fn alpha_generated() {}\n"),
            ("blob.bin", b"alpha\0binary"),
            (".gitignore", b"target/\n"),
        ];
        for (path, contents) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }
        dir
    }

    fn grep_in(dir: &Path, pattern: &str, glob: Option<&str>, path: Option<&str>) -> ToolOutcome {
        let confinement = Confinement::new(dir, false).unwrap();
        let input = GrepInput {
            pattern: pattern.to_owned(),
            path: path.map(str::to_owned),
            glob: glob.map(str::to_owned),
            case_insensitive: false,
        };
        search(input, &confinement, &Cancel::default())
    }

    #[test]
    fn matching_lines_come_with_path_and_number() {
        let dir = tree();
        assert_eq!(
            grep_in(dir.path(), "alpha", None, None),
            ToolOutcome::ok("a.rs:1:fn alpha() {}\nsrc/c.rs:1:// alpha here too")
        );
        assert_eq!(
            grep_in(dir.path(), "fn \\w+", Some("*.rs"), Some("a.rs")),
            ToolOutcome::ok("a.rs:1:fn alpha() {}\na.rs:2:fn beta() {}")
        );
        assert_eq!(
            grep_in(dir.path(), "alpha", Some("src/*.rs"), None),
            ToolOutcome::ok("src/c.rs:1:// alpha here too")
        );
        assert_eq!(
            grep_in(dir.path(), "zeta", None, None),
            ToolOutcome::ok("no matches for \"zeta\"")
        );
    }

    #[test]
    fn case_insensitive_search() {
        let dir = tree();
        let confinement = Confinement::new(dir.path(), false).unwrap();
        let input = GrepInput {
            pattern: "ALPHA AND".to_owned(),
            path: None,
            glob: None,
            case_insensitive: true,
        };
        assert_eq!(
            search(input, &confinement, &Cancel::default()),
            ToolOutcome::ok("notes.txt:1:Alpha and omega")
        );
    }

    #[test]
    fn the_match_cap_cuts_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("many"), "hit\n".repeat(MAX_MATCHES + 3)).unwrap();
        let outcome = grep_in(dir.path(), "hit", None, None);
        assert_eq!(outcome.content.lines().count(), MAX_MATCHES + 1);
        assert!(outcome
            .content
            .ends_with(&format!("[stopped at {MAX_MATCHES} matching lines; narrow the pattern, the path or the glob to see the rest]")));
    }

    #[test]
    fn bad_patterns_and_escapes_are_errors() {
        let dir = tree();
        let outcome = grep_in(dir.path(), "(unclosed", None, None);
        assert!(
            outcome.content.starts_with("bad regular expression"),
            "{outcome:?}"
        );
        assert!(grep_in(dir.path(), "x", None, Some("../")).is_error);
        assert!(grep_in(dir.path(), "x", None, Some("missing")).is_error);
    }
}
