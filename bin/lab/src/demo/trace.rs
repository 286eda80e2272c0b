//! What `keel demo` prints, as each step happens: short lines for people
//! (colour only on a terminal), or with `--json` one JSON object per line,
//! each tagged by `kind`, for scripts and the e2e test. Every line is
//! flushed at once, so streamed tokens show as they arrive.

use std::io::{self, Write};

use serde_json::{Map, Value};

/// How the demo prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
}

/// Longest quoted text in a line for people; the JSON lines carry all of it.
const QUOTE_CHARS: usize = 72;

pub struct Trace<W: Write> {
    out: W,
    format: Format,
    /// ANSI colours: only for people, and only on a terminal.
    color: bool,
    /// A line for people is open (tokens or tool output being streamed
    /// into it); anything else starts on a new line.
    open_line: bool,
}

const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const GREEN: &str = "\x1b[32m";
const CYAN: &str = "\x1b[36m";
const RESET: &str = "\x1b[0m";

impl<W: Write> Trace<W> {
    pub fn new(out: W, format: Format, color: bool) -> Self {
        Trace {
            out,
            format,
            color: color && format == Format::Human,
            open_line: false,
        }
    }

    /// What the demo is, for people; scripts know.
    pub fn intro(&mut self) -> io::Result<()> {
        if self.format == Format::Human {
            writeln!(
                self.out,
                "keel demo: a real daemon and a fake provider in this process, one conversation\n\
                 driven over HTTP and SSE as a user would. Each step prints as it happens."
            )?;
        }
        self.out.flush()
    }

    /// A step of the walk begins.
    pub fn step(&mut self, n: u32, title: &str) -> io::Result<()> {
        match self.format {
            Format::Json => self.json("step", [("n", n.into()), ("title", title.into())]),
            Format::Human => {
                self.close_line()?;
                let (bold, reset) = self.paint(BOLD);
                writeln!(self.out, "\n{bold}{n}. {title}{reset}")?;
                self.out.flush()
            }
        }
    }

    /// A fact the walk established or something it did: `fields` for
    /// scripts, `line` for people.
    pub fn fact(&mut self, kind: &str, fields: Value, line: &str) -> io::Result<()> {
        match self.format {
            Format::Json => {
                let mut object = Map::new();
                object.insert("kind".to_owned(), kind.into());
                if let Value::Object(fields) = fields {
                    object.extend(fields);
                }
                self.line(&Value::Object(object))
            }
            Format::Human => {
                self.close_line()?;
                writeln!(self.out, "   {line}")?;
                self.out.flush()
            }
        }
    }

    /// A check that held, for people marked as such.
    pub fn check(&mut self, kind: &str, fields: Value, line: &str) -> io::Result<()> {
        let (green, reset) = self.paint(GREEN);
        self.fact(kind, fields, &format!("{green}ok{reset} {line}"))
    }

    /// A text delta of the model's answer, as it arrives.
    pub fn token(&mut self, text: &str) -> io::Result<()> {
        match self.format {
            Format::Json => self.json("token", [("text", text.into())]),
            Format::Human => {
                if !self.open_line {
                    write!(self.out, "   model: ")?;
                    self.open_line = true;
                }
                let (cyan, reset) = self.paint(CYAN);
                write!(self.out, "{cyan}{text}{reset}")?;
                self.out.flush()
            }
        }
    }

    /// A chunk of a running tool's output, as it arrives.
    pub fn tool_output(&mut self, chunk: &str) -> io::Result<()> {
        match self.format {
            Format::Json => self.json("tool_output", [("chunk", chunk.into())]),
            Format::Human => {
                self.close_line()?;
                let (dim, reset) = self.paint(DIM);
                for line in chunk.lines() {
                    writeln!(self.out, "   {dim}| {line}{reset}")?;
                }
                self.out.flush()
            }
        }
    }

    /// End a streamed line: the answer it showed is complete.
    pub fn close_line(&mut self) -> io::Result<()> {
        if self.open_line {
            self.open_line = false;
            writeln!(self.out)?;
        }
        self.out.flush()
    }

    fn paint(&self, code: &'static str) -> (&'static str, &'static str) {
        if self.color {
            (code, RESET)
        } else {
            ("", "")
        }
    }

    fn json<const N: usize>(&mut self, kind: &str, fields: [(&str, Value); N]) -> io::Result<()> {
        let mut object = Map::new();
        object.insert("kind".to_owned(), kind.into());
        for (name, value) in fields {
            object.insert(name.to_owned(), value);
        }
        self.line(&Value::Object(object))
    }

    fn line(&mut self, value: &Value) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        writeln!(self.out)?;
        self.out.flush()
    }
}

/// `text` on one line, cut to `QUOTE_CHARS`, in quotes.
pub fn quote(text: &str) -> String {
    let flat = text.trim().replace('\n', " / ");
    let mut chars = flat.chars();
    let head: String = chars.by_ref().take(QUOTE_CHARS).collect();
    if chars.next().is_some() {
        format!("\"{head}…\"")
    } else {
        format!("\"{head}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_lines_carry_the_kind_and_the_fields() {
        let mut out = Vec::new();
        let mut trace = Trace::new(&mut out, Format::Json, true);
        trace.step(1, "start").unwrap();
        trace.token("Hello").unwrap();
        trace
            .fact("created", json!({"id": "c1"}), "ignored")
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines[0], json!({"kind": "step", "n": 1, "title": "start"}));
        assert_eq!(lines[1], json!({"kind": "token", "text": "Hello"}));
        assert_eq!(lines[2], json!({"kind": "created", "id": "c1"}));
        assert!(!text.contains('\x1b'), "no colour in JSON");
    }

    #[test]
    fn tokens_share_a_line_for_people_and_colour_is_off_the_terminal() {
        let mut out = Vec::new();
        let mut trace = Trace::new(&mut out, Format::Human, false);
        trace.token("Hello").unwrap();
        trace.token(" world").unwrap();
        trace.fact("x", json!({}), "next").unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, "   model: Hello world\n   next\n");
    }

    #[test]
    fn quotes_are_one_line_and_short() {
        assert_eq!(quote("a\nb"), "\"a / b\"");
        assert!(quote(&"x".repeat(200)).ends_with("…\""));
    }
}
