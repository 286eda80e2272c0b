//! How the client commands print: tables for people (comfy-table), JSON
//! for scripts, colour only when stdout is a terminal and `NO_COLOR` is
//! unset, a spinner on stderr only when stderr is a terminal, and the
//! small formatting helpers (ages, durations) they share.

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comfy_table::{presets, ContentArrangement, Table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// `println!` that gives a failed write back (a reader that stopped early:
/// `BrokenPipe`, which ends a command quietly, `cli.rs`) instead of
/// panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}
pub(crate) use say;

/// Print `value` as one line of JSON on stdout.
pub fn json_line<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, value)?;
    stdout.write_all(b"\n")?;
    stdout.flush()?;
    Ok(())
}

/// A table for people with these column names: no borders, a header, as
/// `ps` prints, so it reads in a terminal and splits in a pipe.
pub fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|name| name.to_owned()));
    // Flush left, two spaces between columns: a cell may hold one space
    // (`LAST ACTIVITY`), so two or more always part columns.
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Print a table, each line trimmed of the padding after its last column.
/// A reader that stops early (`keel log ID | head`) is an error of kind
/// `BrokenPipe`, which the command ends on quietly (`cli.rs`).
pub fn print_table(table: &Table) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    for line in table.lines() {
        writeln!(stdout, "{}", line.trim_end())?;
    }
    stdout.flush()
}

/// Colour for stdout: on a terminal, unless `NO_COLOR` is set (to
/// anything non-empty, as no-color.org says).
#[derive(Debug, Clone, Copy)]
pub struct Paint {
    enabled: bool,
}

impl Paint {
    pub fn stdout() -> Paint {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
        Paint {
            enabled: !no_color && std::io::stdout().is_terminal(),
        }
    }

    fn wrap(self, code: &str, text: &str) -> String {
        if self.enabled {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub fn dim(self, text: &str) -> String {
        self.wrap("2", text)
    }

    pub fn bold(self, text: &str) -> String {
        self.wrap("1", text)
    }

    pub fn red(self, text: &str) -> String {
        self.wrap("31", text)
    }

    pub fn green(self, text: &str) -> String {
        self.wrap("32", text)
    }

    pub fn yellow(self, text: &str) -> String {
        self.wrap("33", text)
    }

    pub fn cyan(self, text: &str) -> String {
        self.wrap("36", text)
    }
}

/// A spinner with `message` on stderr while something is awaited; drawn
/// only when stderr is a terminal (indicatif hides it otherwise), so
/// scripts and pipes never see it.
pub fn spinner(message: &str) -> ProgressBar {
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
        spinner.set_style(style);
    }
    spinner.set_message(message.to_owned());
    spinner.enable_steady_tick(Duration::from_millis(100));
    spinner
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// How long ago `at_ms` was, for people: `12s ago`, `5m ago`, `3h ago`,
/// `2d ago`.
pub fn ago(at_ms: u64, now_ms: u64) -> String {
    format!("{} ago", duration(now_ms.saturating_sub(at_ms)))
}

/// A duration in the largest whole unit: `850ms`, `12s`, `5m`, `3h`, `2d`.
pub fn duration(ms: u64) -> String {
    let seconds = ms / 1000;
    match seconds {
        0 => format!("{ms}ms"),
        1..=59 => format!("{seconds}s"),
        60..=3599 => format!("{}m", seconds / 60),
        3600..=86_399 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// A byte count for people: `512B`, `12.3KiB`, `4.5MiB`.
pub fn bytes(n: u64) -> String {
    // Shown to one decimal: f64's precision is more than enough.
    let value = n as f64;
    if n < 1024 {
        format!("{n}B")
    } else if n < 1024 * 1024 {
        format!("{:.1}KiB", value / 1024.0)
    } else {
        format!("{:.1}MiB", value / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_their_largest_unit() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(12_000), "12s");
        assert_eq!(duration(5 * 60_000 + 1), "5m");
        assert_eq!(duration(3 * 3_600_000), "3h");
        assert_eq!(duration(2 * 86_400_000), "2d");
        assert_eq!(ago(1_000, 13_000), "12s ago");
        assert_eq!(
            ago(13_000, 1_000),
            "0ms ago",
            "a clock skew is no negative age"
        );
    }

    #[test]
    fn byte_counts_read_for_people() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(12_595), "12.3KiB");
        assert_eq!(bytes(4_718_592), "4.5MiB");
    }

    #[test]
    fn tables_have_a_header_and_no_trailing_padding() {
        let mut table = table(&["ID", "STATE"]);
        table.add_row(vec!["a", "idle"]);
        let lines: Vec<String> = table
            .lines()
            .map(|line| line.trim_end().to_owned())
            .collect();
        assert!(
            lines[0].contains("ID") && lines[0].contains("STATE"),
            "{lines:?}"
        );
        assert!(lines[1].contains("idle"), "{lines:?}");
    }
}
