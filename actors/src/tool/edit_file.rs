//! The `edit_file` tool: replace an exact string in a text file. The string
//! must occur exactly once, or `replace_all` must be set; zero or several
//! matches fail, saying how many there were, and change nothing.
//!
//! # A repeated call
//!
//! Recovery may run the same call again after it succeeded (its result was
//! never recorded). Run literally, the repeat would fail (`old_string` is
//! gone) or, when `new_string` contains `old_string`, apply the edit a
//! second time. So before failing on "no match" or applying an edit, the
//! tool asks whether the file already looks edited: `new_string` occurs
//! (exactly once, unless `replace_all`), and every occurrence of
//! `old_string` lies inside one of `new_string`. Then it changes nothing
//! and says so, as a success. The cost is that an edit whose every target
//! already sits inside its own replacement is taken as done (applying it
//! would only nest the replacement in itself), and that a model whose
//! `old_string` is wrong while its `new_string` is already in the file once
//! is told the file already has that text instead of "0 matches": true,
//! and as useful. Requiring exactly one occurrence keeps a common
//! `new_string` (a lone `}`) from passing for an applied edit.

use std::io::{self, Read as _};
use std::path::Path;

use keel_core::wire::ToolSpec;
use serde::Deserialize;

use super::blocking::{self, Cancel};
use super::files::{self, OpenProblem, Replaced};
use super::paths::Confinement;
use super::{counted, Tool, ToolContext, ToolOutcome};

/// The tool's name, as the model calls it.
pub const NAME: &str = "edit_file";
/// Larger files are refused: the whole file is held in memory, twice.
pub const MAX_FILE: u64 = 16 * 1024 * 1024;

/// `edit_file`, see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct EditFile;

#[derive(Debug, Deserialize)]
struct EditInput {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[async_trait::async_trait]
impl Tool for EditFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.to_owned(),
            description: "Replace `old_string` with `new_string` in a text file. The match is \
                          exact (whitespace and indentation included; read_file's line-number \
                          prefixes are not part of the file). `old_string` must occur exactly \
                          once: include enough surrounding lines to make it unique, or set \
                          `replace_all` to replace every occurrence. With no match or several \
                          the file is left unchanged and the result says how many matches \
                          there were. The path is relative to the working directory and must \
                          stay inside it."
                .to_owned(),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "The file, relative to the working directory."
                    },
                    "old_string": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The exact text to replace."
                    },
                    "new_string": {
                        "type": "string",
                        "description": "The text to put in its place."
                    },
                    "replace_all": {
                        "type": "boolean",
                        "description": "Replace every occurrence, not just a unique one."
                    }
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        if let Err(refused) = ctx.sandbox.may_write() {
            return ToolOutcome::error(format!("{NAME} was not run: {refused}"));
        }
        blocking::run(&ctx, edit).await
    }
}

fn edit(input: EditInput, confinement: &Confinement, cancel: &Cancel) -> ToolOutcome {
    if input.old_string.is_empty() {
        return ToolOutcome::error("old_string is empty; to write a whole file use write_file");
    }
    if input.old_string == input.new_string {
        return ToolOutcome::error("old_string and new_string are the same; nothing to do");
    }
    let path = match confinement.resolve(&input.path) {
        Ok(path) => path,
        Err(problem) => return ToolOutcome::error(problem),
    };
    let shown = confinement.show(&path);
    let text = match read_text(&path, &shown) {
        Ok(text) => text,
        Err(problem) => return ToolOutcome::error(problem),
    };
    let olds: Vec<usize> = text
        .match_indices(&input.old_string)
        .map(|(at, _)| at)
        .collect();
    if already_applied(
        &text,
        &olds,
        &input.old_string,
        &input.new_string,
        input.replace_all,
    ) {
        return ToolOutcome::ok(format!(
            "{shown} already has this edit (new_string is there and old_string only inside \
             it), so nothing was changed; this call probably ran before"
        ));
    }
    let n_matches = olds.len();
    let edited = match (n_matches, input.replace_all) {
        (0, _) => {
            return ToolOutcome::error(format!(
                "old_string was not found in {shown} (0 matches); nothing was changed. Read \
                 the file again and copy the text exactly."
            ))
        }
        (1, _) | (_, true) => text.replace(&input.old_string, &input.new_string),
        (n_matches, false) => {
            return ToolOutcome::error(format!(
                "old_string occurs {n_matches} times in {shown} (at lines {}); nothing was \
                 changed. Include more surrounding text to make it unique, or set \
                 replace_all to replace all {n_matches}.",
                lines_of(&text, &olds)
            ))
        }
    };
    match files::replace(&path, edited.as_bytes(), cancel) {
        Ok(Replaced::Landed) => {}
        Ok(Replaced::Cancelled) => return ToolOutcome::error("cancelled; the file is unchanged"),
        Err(error) => return ToolOutcome::error(format!("cannot write {shown}: {error}")),
    }
    let line_word = if n_matches == 1 { "line" } else { "lines" };
    ToolOutcome::ok(format!(
        "edited {shown}: replaced {} (at {line_word} {})",
        counted(n_matches, "occurrence", "occurrences"),
        lines_of(&text, &olds)
    ))
}

/// The whole of the regular file `path` as UTF-8 text, or why not (for the
/// model). The size is checked on the opened file and the read stops past
/// [`MAX_FILE`], so a file growing meanwhile costs no more.
fn read_text(path: &Path, shown: &str) -> Result<String, String> {
    let file = match files::open_regular(path) {
        Ok(file) => file,
        Err(OpenProblem::Directory) => return Err(format!("{shown} is a directory")),
        Err(OpenProblem::NotRegular { kind }) => {
            return Err(format!(
                "{shown} is {kind}, not a regular file; edit_file edits regular files only"
            ))
        }
        Err(OpenProblem::Io(error)) if error.kind() == io::ErrorKind::NotFound => {
            return Err(format!("{shown} does not exist; create it with write_file"))
        }
        Err(OpenProblem::Io(error)) => return Err(format!("cannot read {shown}: {error}")),
    };
    let too_large = |size: u64| {
        format!(
            "{shown} is {size} bytes; edit_file edits files up to {} MiB",
            MAX_FILE / 1024 / 1024
        )
    };
    let size = file
        .metadata()
        .map_err(|error| format!("cannot read {shown}: {error}"))?
        .len();
    if size > MAX_FILE {
        return Err(too_large(size));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("cannot read {shown}: {error}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes)
        .map_err(|_| format!("{shown} is not UTF-8 text; edit_file edits text only"))
}

/// Whether `text` looks like it already went through this edit: see the
/// module docs. `olds` are the byte offsets of `old`'s matches in `text`.
fn already_applied(text: &str, olds: &[usize], old: &str, new: &str, replace_all: bool) -> bool {
    if new.is_empty() {
        // A deletion leaves nothing to recognise it by.
        return false;
    }
    let news: Vec<usize> = text.match_indices(new).map(|(at, _)| at).collect();
    let expected = if replace_all {
        !news.is_empty()
    } else {
        news.len() == 1
    };
    expected
        && olds.iter().all(|&old_at| {
            news.iter()
                .any(|&new_at| new_at <= old_at && old_at + old.len() <= new_at + new.len())
        })
}

/// The 1-based line numbers of byte offsets `at` (ascending) in `text`,
/// comma-separated, at most ten.
fn lines_of(text: &str, at: &[usize]) -> String {
    let mut lines = Vec::new();
    let mut line = 1;
    let mut scanned = 0;
    for &offset in at.iter().take(10) {
        line += text.as_bytes()[scanned..offset]
            .iter()
            .filter(|&&byte| byte == b'\n')
            .count();
        scanned = offset;
        lines.push(line.to_string());
    }
    if at.len() > 10 {
        lines.push("…".to_owned());
    }
    lines.join(", ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    struct Case {
        dir: tempfile::TempDir,
    }

    impl Case {
        fn new(text: &str) -> Case {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("f.txt"), text).unwrap();
            Case { dir }
        }

        fn edit(&self, old: &str, new: &str, replace_all: bool) -> ToolOutcome {
            let confinement = Confinement::new(self.dir.path(), false).unwrap();
            let input = EditInput {
                path: "f.txt".to_owned(),
                old_string: old.to_owned(),
                new_string: new.to_owned(),
                replace_all,
            };
            edit(input, &confinement, &Cancel::default())
        }

        fn text(&self) -> String {
            std::fs::read_to_string(self.dir.path().join("f.txt")).unwrap()
        }
    }

    #[test]
    fn a_unique_match_is_replaced() {
        let case = Case::new("fn main() {\n    old();\n}\n");
        let outcome = case.edit("old()", "new()", false);
        assert_eq!(
            outcome,
            ToolOutcome::ok("edited f.txt: replaced 1 occurrence (at line 2)")
        );
        assert_eq!(case.text(), "fn main() {\n    new();\n}\n");
    }

    #[test]
    fn no_match_and_several_matches_fail_and_say_how_many() {
        let case = Case::new("a\nb\na\n");
        let outcome = case.edit("zzz", "y", false);
        assert!(outcome.is_error);
        assert!(
            outcome.content.contains("not found in f.txt (0 matches)"),
            "{outcome:?}"
        );
        let outcome = case.edit("a", "y", false);
        assert!(outcome.is_error);
        assert!(
            outcome
                .content
                .contains("occurs 2 times in f.txt (at lines 1, 3)"),
            "{outcome:?}"
        );
        assert_eq!(case.text(), "a\nb\na\n");
        let outcome = case.edit("a", "y", true);
        assert_eq!(
            outcome,
            ToolOutcome::ok("edited f.txt: replaced 2 occurrences (at lines 1, 3)")
        );
        assert_eq!(case.text(), "y\nb\ny\n");
    }

    #[test]
    fn a_repeated_edit_is_reported_as_already_applied() {
        let case = Case::new("let x = 1;\n");
        assert!(!case.edit("x = 1", "x = 2", false).is_error);
        let again = case.edit("x = 1", "x = 2", false);
        assert!(!again.is_error, "{again:?}");
        assert!(again.content.contains("already has this edit"), "{again:?}");
        assert_eq!(case.text(), "let x = 2;\n");

        // A replacement that contains its target is not applied twice.
        let case = Case::new("call(a);\n");
        assert!(!case.edit("call(a);", "call(a);\ncall(b);", false).is_error);
        let again = case.edit("call(a);", "call(a);\ncall(b);", false);
        assert!(again.content.contains("already has this edit"), "{again:?}");
        assert_eq!(case.text(), "call(a);\ncall(b);\n");

        // A new_string the file holds several times proves nothing.
        let case = Case::new("{\n}\n{\n}\n");
        let outcome = case.edit("{{", "}", false);
        assert!(outcome.is_error, "{outcome:?}");
        assert!(outcome.content.contains("(0 matches)"), "{outcome:?}");
        // Unless every occurrence was meant to be replaced.
        let case = Case::new("a = x; b = x;\n");
        assert!(!case.edit("x", "y", true).is_error);
        let again = case.edit("x", "y", true);
        assert!(again.content.contains("already has this edit"), "{again:?}");
    }

    #[test]
    fn bad_requests_change_nothing() {
        let case = Case::new("same\n");
        assert!(case.edit("same", "same", false).is_error);
        assert!(case.edit("", "x", false).is_error);
        let case = Case::new("");
        std::fs::write(case.dir.path().join("f.txt"), b"\xff\xfe").unwrap();
        let outcome = case.edit("a", "b", false);
        assert!(outcome.content.contains("not UTF-8"), "{outcome:?}");
    }
}
