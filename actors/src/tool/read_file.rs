//! The `read_file` tool: a text file's lines, numbered like `cat -n`, from
//! a 1-based `offset` for up to `limit` lines.
//!
//! What comes back is bounded: at most [`MAX_LINES`] lines and
//! [`MAX_OUTPUT`] bytes, each line cut at [`MAX_LINE_CHARS`] characters, and
//! the result says plainly where it stopped and which `offset` reads on. The
//! file is read a line at a time, so a huge file costs only what is shown
//! (plus the lines skipped to reach `offset`). Binary files are refused: a
//! NUL byte in the first 8 KiB, or a line that is not UTF-8. So is anything
//! but a regular file (a FIFO, a device), which could block or never end.

use std::fs::File;
use std::io::{self, BufRead, BufReader};

use keel_core::wire::ToolSpec;
use serde::Deserialize;

use super::blocking::{self, Cancel};
use super::files::{self, OpenProblem};
use super::paths::Confinement;
use super::{Tool, ToolContext, ToolOutcome};

/// The tool's name, as the model calls it.
pub const NAME: &str = "read_file";
/// The most lines one call returns, and the default `limit`.
pub const MAX_LINES: usize = 2_000;
/// The most bytes of numbered output one call returns.
pub const MAX_OUTPUT: usize = 256 * 1024;
/// Longer lines are cut (minified code, data on one line).
pub const MAX_LINE_CHARS: usize = 2_000;
/// A file with a NUL byte this near its start is taken for binary.
const BINARY_PROBE: usize = 8 * 1024;
/// At most this much of one line is kept in memory: enough for
/// [`MAX_LINE_CHARS`] characters of any width.
const MAX_LINE_BYTES: usize = MAX_LINE_CHARS * 4;

/// `read_file`, see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadFile;

#[derive(Debug, Deserialize)]
struct ReadInput {
    path: String,
    /// 1-based line to start at.
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

#[async_trait::async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.to_owned(),
            description: format!(
                "Read a UTF-8 text file. Lines come numbered like `cat -n` (line number, a \
                 tab, the line), starting at line `offset` (1-based, default 1) for `limit` \
                 lines (default and most {MAX_LINES}). Output stops at {} KiB and lines \
                 longer than {MAX_LINE_CHARS} characters are cut; the result then says \
                 which offset to read on from. Binary files are refused. The path is \
                 relative to the working directory and must stay inside it.",
                MAX_OUTPUT / 1024
            ),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "The file, relative to the working directory."
                    },
                    "offset": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "The first line to read, 1-based."
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "How many lines to read at most."
                    }
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        }
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        blocking::run(&ctx, read).await
    }
}

fn read(input: ReadInput, confinement: &Confinement, cancel: &Cancel) -> ToolOutcome {
    let path = match confinement.resolve(&input.path) {
        Ok(path) => path,
        Err(problem) => return ToolOutcome::error(problem),
    };
    let shown = confinement.show(&path);
    match std::fs::metadata(&path) {
        Ok(metadata) if metadata.is_dir() => {
            return ToolOutcome::error(format!("{shown} is a directory; list its files with glob"))
        }
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return ToolOutcome::error(format!("{shown} does not exist"))
        }
        Err(error) => return ToolOutcome::error(format!("cannot read {shown}: {error}")),
    }
    let file = match files::open_regular(&path) {
        Ok(file) => file,
        Err(OpenProblem::Directory) => {
            return ToolOutcome::error(format!("{shown} is a directory; list its files with glob"))
        }
        Err(OpenProblem::NotRegular { kind }) => {
            return ToolOutcome::error(format!(
                "{shown} is {kind}, not a regular file; read_file reads regular files only"
            ))
        }
        Err(OpenProblem::Io(error)) => {
            return ToolOutcome::error(format!("cannot read {shown}: {error}"))
        }
    };
    let offset = input.offset.unwrap_or(1).max(1);
    let limit = input.limit.unwrap_or(MAX_LINES).clamp(1, MAX_LINES);
    match numbered_lines(file, offset, limit, cancel) {
        Ok(Read::Lines { text, next }) => ToolOutcome::ok(match next {
            None => text,
            Some(Next { line, why }) => format!(
                "{text}[{why}: shown lines {offset}-{}; read on with offset={line}]",
                line - 1
            ),
        }),
        Ok(Read::Empty) => ToolOutcome::ok(format!("({shown} is empty)")),
        Ok(Read::PastEnd { n_lines }) => ToolOutcome::error(format!(
            "{shown} has {n_lines} lines; offset {offset} is past its end"
        )),
        Ok(Read::Binary { line: None }) => ToolOutcome::error(format!(
            "{shown} looks binary (it has a NUL byte); read_file reads text only"
        )),
        Ok(Read::Binary { line: Some(line) }) => ToolOutcome::error(format!(
            "{shown} is not UTF-8 text (line {line}); read_file reads text only"
        )),
        Ok(Read::Cancelled) => ToolOutcome::error("cancelled"),
        Err(error) => ToolOutcome::error(format!("cannot read {shown}: {error}")),
    }
}

enum Read {
    Lines {
        text: String,
        next: Option<Next>,
    },
    Empty,
    PastEnd {
        n_lines: usize,
    },
    /// `line` is where invalid UTF-8 was found; `None` for a NUL byte near
    /// the start.
    Binary {
        line: Option<usize>,
    },
    Cancelled,
}

/// Where a cut-short read stopped.
struct Next {
    /// The first line not shown.
    line: usize,
    why: &'static str,
}

fn numbered_lines(file: File, offset: usize, limit: usize, cancel: &Cancel) -> io::Result<Read> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let head = reader.fill_buf()?;
    if head.is_empty() {
        return Ok(Read::Empty);
    }
    if head[..head.len().min(BINARY_PROBE)].contains(&0) {
        return Ok(Read::Binary { line: None });
    }
    let mut text = String::new();
    let mut line = Vec::new();
    let mut line_no = 0usize;
    loop {
        if line_no.is_multiple_of(4096) && cancel.is_raised() {
            return Ok(Read::Cancelled);
        }
        let Some(cut) = read_line_capped(&mut reader, &mut line)? else {
            break;
        };
        line_no += 1;
        if line_no < offset {
            continue;
        }
        if line_no >= offset + limit {
            let why = if limit == MAX_LINES {
                "the line cap was reached"
            } else {
                "limit reached"
            };
            return Ok(Read::Lines {
                text,
                next: Some(Next { line: line_no, why }),
            });
        }
        let Some(content) = decode(&line, cut) else {
            return Ok(Read::Binary {
                line: Some(line_no),
            });
        };
        let entry = render(line_no, content, cut);
        if text.len() + entry.len() > MAX_OUTPUT {
            let why = "the output cap was reached";
            return Ok(Read::Lines {
                text,
                next: Some(Next { line: line_no, why }),
            });
        }
        text.push_str(&entry);
    }
    if line_no < offset {
        return Ok(Read::PastEnd { n_lines: line_no });
    }
    Ok(Read::Lines { text, next: None })
}

/// One line, its `\n` dropped, as text: `None` if it is not UTF-8. A line
/// kept only in part may end inside a character; that part is left out.
fn decode(line: &[u8], cut: bool) -> Option<&str> {
    match std::str::from_utf8(line) {
        Ok(text) => Some(text),
        Err(error) if cut && error.error_len().is_none() => {
            std::str::from_utf8(&line[..error.valid_up_to()]).ok()
        }
        Err(_) => None,
    }
}

/// `cat -n`'s layout: the number right-aligned in six columns, a tab, the
/// line (cut at [`MAX_LINE_CHARS`] characters).
fn render(line_no: usize, content: &str, cut: bool) -> String {
    match content.char_indices().nth(MAX_LINE_CHARS) {
        Some((end, _)) => format!(
            "{line_no:>6}\t{} [line cut at {MAX_LINE_CHARS} characters]\n",
            &content[..end]
        ),
        None if cut => format!("{line_no:>6}\t{content} [line cut]\n"),
        None => format!("{line_no:>6}\t{content}\n"),
    }
}

/// Read one line into `line` (cleared first, without its `\n`), keeping at
/// most [`MAX_LINE_BYTES`] of it and skipping the rest. `None` at the end
/// of the file; else whether the line was cut.
fn read_line_capped(reader: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<Option<bool>> {
    line.clear();
    let mut any = false;
    let mut cut = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if available.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let (chunk, used, done) = match available.iter().position(|&byte| byte == b'\n') {
            Some(newline) => (&available[..newline], newline + 1, true),
            None => (available, available.len(), false),
        };
        let room = MAX_LINE_BYTES - line.len();
        if chunk.len() > room {
            cut = true;
        }
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        reader.consume(used);
        if done {
            return Ok(Some(cut));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn read_text(contents: &[u8], offset: Option<usize>, limit: Option<usize>) -> ToolOutcome {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), contents).unwrap();
        let confinement = Confinement::new(dir.path(), false).unwrap();
        let input = ReadInput {
            path: "f".to_owned(),
            offset,
            limit,
        };
        read(input, &confinement, &Cancel::default())
    }

    #[test]
    fn lines_come_numbered() {
        let outcome = read_text(b"one\ntwo\nthree", None, None);
        assert_eq!(
            outcome,
            ToolOutcome::ok("     1\tone\n     2\ttwo\n     3\tthree\n")
        );
    }

    #[test]
    fn offset_and_limit_pick_lines_and_say_how_to_read_on() {
        let outcome = read_text(b"a\nb\nc\nd\n", Some(2), Some(2));
        assert_eq!(
            outcome,
            ToolOutcome::ok(
                "     2\tb\n     3\tc\n[limit reached: shown lines 2-3; read on with offset=4]"
            )
        );
        // Exactly to the end: nothing more to say.
        let outcome = read_text(b"a\nb\nc\nd\n", Some(3), Some(2));
        assert_eq!(outcome, ToolOutcome::ok("     3\tc\n     4\td\n"));
        let outcome = read_text(b"a\nb\n", Some(5), None);
        assert!(outcome.is_error);
        assert!(outcome
            .content
            .contains("has 2 lines; offset 5 is past its end"));
    }

    #[test]
    fn the_line_cap_and_the_output_cap_cut_with_a_note() {
        let many: String = (1..=MAX_LINES + 5).map(|n| format!("{n}\n")).collect();
        let outcome = read_text(many.as_bytes(), None, None);
        assert!(!outcome.is_error);
        assert!(outcome.content.ends_with(&format!(
            "[the line cap was reached: shown lines 1-{MAX_LINES}; read on with offset={}]",
            MAX_LINES + 1
        )));
        let wide = format!("{}\n", "x".repeat(1_000)).repeat(400);
        let outcome = read_text(wide.as_bytes(), None, None);
        assert!(outcome.content.len() <= MAX_OUTPUT + 200);
        assert!(
            outcome
                .content
                .contains("[the output cap was reached: shown lines 1-"),
            "{}",
            &outcome.content[outcome.content.len() - 200..]
        );
    }

    #[test]
    fn long_lines_are_cut() {
        let long = "é".repeat(MAX_LINE_CHARS * 3);
        let outcome = read_text(format!("{long}\nnext\n").as_bytes(), None, None);
        assert!(!outcome.is_error, "{outcome:?}");
        let first = outcome.content.lines().next().unwrap();
        assert!(first.ends_with("[line cut at 2000 characters]"), "{first}");
        assert!(outcome.content.contains("     2\tnext\n"));
    }

    #[test]
    fn binary_and_non_utf8_files_are_refused() {
        let outcome = read_text(b"text\0more", None, None);
        assert!(outcome.is_error);
        assert!(outcome.content.contains("looks binary"), "{outcome:?}");
        let outcome = read_text(b"fine\n\xff\xfe bad\n", None, None);
        assert!(outcome.is_error);
        assert!(
            outcome.content.contains("not UTF-8 text (line 2)"),
            "{outcome:?}"
        );
    }

    #[test]
    fn empty_files_directories_and_missing_files() {
        let outcome = read_text(b"", None, None);
        assert_eq!(outcome, ToolOutcome::ok("(f is empty)"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let confinement = Confinement::new(dir.path(), false).unwrap();
        let outcome = read(
            ReadInput {
                path: "d".to_owned(),
                offset: None,
                limit: None,
            },
            &confinement,
            &Cancel::default(),
        );
        assert!(outcome.content.contains("d is a directory"), "{outcome:?}");
        let outcome = read(
            ReadInput {
                path: "nope".to_owned(),
                offset: None,
                limit: None,
            },
            &confinement,
            &Cancel::default(),
        );
        assert_eq!(outcome, ToolOutcome::error("nope does not exist"));
    }
}
