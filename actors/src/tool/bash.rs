//! The `bash` tool: `bash -c <command>` in the conversation's working
//! directory, its output streamed live and returned (capped) to the model.
//!
//! The command leads its own process group, held by a [`ProcessGroup`], so
//! everything it starts dies with the call: on timeout, on cancel (the run
//! future is dropped, and with it the group) and when the command exits,
//! since background children it leaves behind would hold the output pipes
//! open and outlive the call unseen.
//!
//! The process is started through the runtime's [`Spawner`] (a small
//! process of its own, so that a spawn does not copy the runtime's
//! descriptor table of open connections); what it starts is the same
//! either way: `bash` in `cwd`, with this process's environment and
//! `$KEEL_TOOL_CALL_ID`, leading a new group, its stdio piped.
//!
//! Output is read from stdout and stderr concurrently and never stops being
//! read: a child writing into a full pipe would block forever. What is kept
//! is bounded instead: live chunks stop after [`LIVE_CAP`] bytes, and the
//! result keeps the head and the tail of [`RESULT_CAP`] bytes in all.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use keel_core::wire::ToolSpec;
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep_until, Instant};

use super::{Tool, ToolContext, ToolOutcome, ToolOutput};
use crate::process_group::ProcessGroup;
use crate::spawner::{Launch, Launched, Spawner};
use crate::tool_sandbox::{is_refusal, Prepared, UNCONFINED_HINT};

/// The tool's name, as the model calls it.
pub const NAME: &str = "bash";
/// How long a command may run when the call does not say.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
/// The most of the output the result keeps: half from the head, half from
/// the tail, which is where commands put what matters (the command line and
/// the error or summary).
pub const RESULT_CAP: usize = 64 * 1024;
/// The most output sent live. Past it nobody is reading along any more, and
/// each chunk costs every subscriber.
pub const LIVE_CAP: usize = 1024 * 1024;

/// Live output is held back until this much is pending ...
const CHUNK_BYTES: usize = 16 * 1024;
/// ... or it has waited this long, so a command printing a line at a time
/// produces a few chunks a second, not one event per line.
const CHUNK_DELAY: Duration = Duration::from_millis(50);
/// After the command exits (or times out) and its group is killed, how long
/// to wait for the pipes to close. They close at once unless a process that
/// left the group (`setsid`) still holds them; then reading stops.
const EXIT_GRACE: Duration = Duration::from_millis(250);
/// One read from a pipe; a pipe holds 64 KiB by default.
const READ_BYTES: usize = 32 * 1024;

/// The process bash is started as: it waits for the word `go` on stdin before
/// becoming (`exec`, same pid, same group) `bash -c <command>` with stdin
/// from /dev/null. The runtime writes `go` only once the group is in the
/// ledger, so no command does any work unrecorded; if the runtime dies before
/// that, stdin closes, `read` fails and the command never runs.
const GATE: &str = r#"read -r gate && [ "$gate" = go ] && exec bash -c "$1" </dev/null"#;

/// `bash -c <command>`, see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bash;

#[async_trait::async_trait]
impl Tool for Bash {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.to_owned(),
            description: format!(
                "Run a shell command with `bash -c` and return its stdout and stderr, \
                 interleaved. Every call starts in the conversation's working directory \
                 (a `cd` lasts for that call only). stdin is empty, so commands that \
                 prompt fail. The command is killed after timeout_ms milliseconds \
                 (default {DEFAULT_TIMEOUT_MS}), and processes it leaves running in the \
                 background are killed when it exits. Output over {} KiB is cut in the \
                 middle. $KEEL_TOOL_CALL_ID holds this call's id.",
                RESULT_CAP / 1024
            ),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "description": "The bash command line to run."
                    },
                    "timeout_ms": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Kill the command after this many milliseconds."
                    }
                },
                "required": ["command"]
            }),
        }
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        match BashInput::parse(&ctx.call.input) {
            Ok(input) => run_command(&input, &ctx).await,
            Err(problem) => ToolOutcome::error(problem),
        }
    }
}

/// A call's input, checked.
#[derive(Debug)]
struct BashInput {
    command: String,
    timeout_ms: u64,
}

impl BashInput {
    /// The input, or a message telling the model what to send instead.
    fn parse(input: &serde_json::Value) -> Result<BashInput, String> {
        let Some(fields) = input.as_object() else {
            return Err(format!(
                "{NAME} needs input {{\"command\": \"...\"}}, got {input}"
            ));
        };
        let command = match fields.get("command") {
            Some(serde_json::Value::String(command)) => command.clone(),
            Some(other) => {
                return Err(format!("{NAME}: \"command\" must be a string, got {other}"));
            }
            None => return Err(format!("{NAME}: \"command\" is missing from {input}")),
        };
        let timeout_ms = match fields.get("timeout_ms") {
            None | Some(serde_json::Value::Null) => DEFAULT_TIMEOUT_MS,
            Some(value) => match value.as_u64() {
                Some(timeout_ms) if timeout_ms > 0 => timeout_ms,
                _ => {
                    return Err(format!(
                        "{NAME}: \"timeout_ms\" must be a positive integer (milliseconds), \
                         got {value}"
                    ));
                }
            },
        };
        Ok(BashInput {
            command,
            timeout_ms,
        })
    }
}

/// The environment variable a command finds its call's `tool_call_id`
/// in: the idempotency key of the call (a restart under `recovery =
/// resume` may run the same call again, with the same id), so a command
/// with side effects can make a repeat harmless.
pub const TOOL_CALL_ID_ENV: &str = "KEEL_TOOL_CALL_ID";

/// Start `bash` behind the [`GATE`], leading a new process group, through
/// the runtime's spawner (or directly, where it has none), as the call's
/// sandbox says.
async fn spawn(
    spawner: &Spawner,
    command: &str,
    cwd: &Path,
    prepared: &Prepared,
) -> io::Result<Launched> {
    let argv: [OsString; 5] = [
        "bash".into(),
        "-c".into(),
        GATE.into(),
        "keel-bash".into(),
        command.into(),
    ];
    spawner
        .spawn(&Launch {
            argv: &argv,
            env: &prepared.env,
            cwd,
            confinement: prepared.confinement.as_ref(),
        })
        .await
}

async fn run_command(input: &BashInput, ctx: &ToolContext) -> ToolOutcome {
    // Held until the call is over: its private temporary directory goes
    // with it.
    let prepared = match ctx.sandbox.prepare(
        &ctx.cwd,
        &[(
            OsString::from(TOOL_CALL_ID_ENV),
            OsString::from(ctx.call.id.as_str()),
        )],
    ) {
        Ok(prepared) => prepared,
        Err(why) => return ToolOutcome::error(format!("{NAME} was not run: {why}")),
    };
    let Launched {
        pid,
        stdin: mut gate,
        mut stdout,
        mut stderr,
        // Declared before `group`, so when the future is dropped the group
        // is killed first, while the unreaped leader still pins its pgid.
        exit: mut child,
    } = match spawn(&ctx.spawner, &input.command, &ctx.cwd, &prepared).await {
        Ok(launched) => launched,
        Err(error) if is_refusal(&error) => {
            return ToolOutcome::error(format!("{NAME} was not run: {error}. {UNCONFINED_HINT}"));
        }
        Err(error) => {
            return ToolOutcome::error(format!(
                "cannot run bash in {}: {error}",
                ctx.cwd.display()
            ));
        }
    };
    let mut group = match ProcessGroup::adopt(pid, ctx.ledger.clone(), ctx.call.id.as_str()) {
        Ok(group) => group,
        Err(error) => {
            return ToolOutcome::error(format!(
                "refusing to run: cannot record the command's process group: {error}"
            ));
        }
    };
    ctx.groups.started(group.pgid());
    // Three bytes into an empty pipe never block. If bash is already gone the
    // write fails, and its exit status below tells what happened.
    let _ = gate.write_all(b"go\n").await;
    drop(gate);

    let mut sink = Sink::new(ctx.output.clone());
    let mut stdout_text = Utf8Decoder::default();
    let mut stderr_text = Utf8Decoder::default();
    // Read into spare capacity (`read_buf`): a zeroed buffer would cost a
    // 32 KiB `memset` per pipe per call, for output that is mostly a line.
    let mut stdout_buf = Vec::with_capacity(READ_BYTES);
    let mut stderr_buf = Vec::with_capacity(READ_BYTES);
    let mut stdout_open = true;
    let mut stderr_open = true;
    let mut status: Option<io::Result<ExitStatus>> = None;
    let mut timed_out = false;
    // None: the timeout is too far away to represent, so it never fires.
    let timeout_at = Instant::now().checked_add(Duration::from_millis(input.timeout_ms));
    // Set once the group is dead: the last moment to wait for the pipes.
    let mut give_up_at: Option<Instant> = None;

    while status.is_none() || stdout_open || stderr_open {
        tokio::select! {
            read = stdout.read_buf(&mut stdout_buf), if stdout_open => match read {
                Ok(n_read) if n_read > 0 => {
                    sink.push(&stdout_text.decode(&stdout_buf));
                    stdout_buf.clear();
                }
                // End of file, or a read error, which only a closed pipe gives.
                _ => {
                    stdout_open = false;
                    sink.push(&stdout_text.finish());
                }
            },
            read = stderr.read_buf(&mut stderr_buf), if stderr_open => match read {
                Ok(n_read) if n_read > 0 => {
                    sink.push(&stderr_text.decode(&stderr_buf));
                    stderr_buf.clear();
                }
                _ => {
                    stderr_open = false;
                    sink.push(&stderr_text.finish());
                }
            },
            waited = child.wait(), if status.is_none() => {
                // Whatever the command left running in its group would keep
                // the pipes open and outlive the call. The leader was just
                // reaped, so if nothing else is left its pid is free again;
                // a killpg could only hit a stranger if the kernel handed the
                // pid out again in between, which takes a wrap of the whole
                // pid space (pids are allocated in increasing order).
                group.kill();
                status = Some(waited);
                give_up_at.get_or_insert(Instant::now() + EXIT_GRACE);
            }
            () = sleep_until_some(timeout_at), if !timed_out && status.is_none() => {
                timed_out = true;
                group.kill();
                // A process stuck in the kernel may take its time to die;
                // the call ends regardless.
                give_up_at.get_or_insert(Instant::now() + EXIT_GRACE);
            }
            () = sleep_until_some(give_up_at) => break,
            () = sleep_until_some(sink.flush_at()) => sink.flush(),
        }
    }
    sink.flush();

    let output = sink.into_result();
    if timed_out {
        return ToolOutcome::error(with_note(
            output,
            &format!(
                "timed out after {} ms: the command and every process it started were killed",
                input.timeout_ms
            ),
        ));
    }
    match status {
        Some(Ok(status)) if status.success() => {
            if output.is_empty() {
                ToolOutcome::ok("(no output)")
            } else {
                ToolOutcome::ok(output)
            }
        }
        Some(Ok(status)) => ToolOutcome::error(with_note(output, &describe_failure(status))),
        Some(Err(error)) => {
            ToolOutcome::error(with_note(output, &format!("cannot wait for bash: {error}")))
        }
        // The loop ends without a status only once `give_up_at` is set, which
        // only an exit or a timeout does; both are handled above.
        None => ToolOutcome::error(with_note(output, "bash did not finish")),
    }
}

/// Sleep until `at`, or forever if there is no `at`: a `select!` branch
/// that is off until its deadline exists.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// "exit code 2", "killed by signal 9 (SIGKILL)".
fn describe_failure(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    match status.signal() {
        Some(number) => match Signal::try_from(number) {
            Ok(signal) => format!("killed by signal {number} ({signal})"),
            Err(_) => format!("killed by signal {number}"),
        },
        None => format!("failed: {status}"),
    }
}

/// `output` with `note` on a line of its own after it.
fn with_note(mut output: String, note: &str) -> String {
    if !output.is_empty() && !output.ends_with('\n') {
        output.push('\n');
    }
    output.push_str(note);
    output
}

/// Where decoded output goes: the live channel, in coalesced and capped
/// chunks, and the capped copy that becomes the result.
struct Sink {
    output: ToolOutput,
    result: HeadTail,
    /// Live text not sent yet.
    pending: String,
    /// When the oldest pending text arrived; it goes out by `CHUNK_DELAY` after.
    pending_since: Option<Instant>,
    /// Bytes sent live so far, against `LIVE_CAP`.
    n_sent: usize,
    /// Set once `LIVE_CAP` is reached: nothing more goes out live.
    live_done: bool,
}

impl Sink {
    fn new(output: ToolOutput) -> Sink {
        Sink {
            output,
            result: HeadTail::default(),
            pending: String::new(),
            pending_since: None,
            n_sent: 0,
            live_done: false,
        }
    }

    fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.result.push(text);
        if self.live_done {
            return;
        }
        self.pending.push_str(text);
        self.pending_since.get_or_insert_with(Instant::now);
        if self.pending.len() >= CHUNK_BYTES {
            self.flush();
        }
    }

    fn flush_at(&self) -> Option<Instant> {
        self.pending_since.map(|since| since + CHUNK_DELAY)
    }

    /// Send what is pending, up to the live budget.
    fn flush(&mut self) {
        self.pending_since = None;
        if self.pending.is_empty() {
            return;
        }
        let budget = LIVE_CAP.saturating_sub(self.n_sent);
        let mut chunk = std::mem::take(&mut self.pending);
        if chunk.len() > budget {
            chunk.truncate(floor_char_boundary(&chunk, budget));
            chunk.push_str(&format!(
                "\n[live output stops after {} MiB; the result keeps the head and the tail]\n",
                LIVE_CAP / (1024 * 1024)
            ));
            self.live_done = true;
        }
        self.n_sent += chunk.len();
        self.output.send(chunk);
    }

    fn into_result(self) -> String {
        self.result.finish()
    }
}

/// Text capped at [`RESULT_CAP`] bytes by keeping its head and its tail.
#[derive(Default)]
struct HeadTail {
    /// The first `RESULT_CAP / 2` bytes (or a little less, at a char boundary).
    head: String,
    /// What came after the head; trimmed from the front to `RESULT_CAP / 2`
    /// whenever it reaches twice that, so trimming costs O(1) per byte.
    tail: String,
    /// Bytes trimmed from the front of `tail`.
    n_omitted: usize,
}

impl HeadTail {
    const HALF: usize = RESULT_CAP / 2;

    fn push(&mut self, mut text: &str) {
        // The head fills only until anything goes to the tail, so the two
        // together stay in order.
        if self.tail.is_empty() && self.head.len() < Self::HALF {
            let cut = floor_char_boundary(text, Self::HALF - self.head.len());
            let (to_head, rest) = text.split_at(cut);
            self.head.push_str(to_head);
            text = rest;
            if text.is_empty() {
                return;
            }
        }
        self.tail.push_str(text);
        if self.tail.len() >= 2 * Self::HALF {
            self.trim_tail();
        }
    }

    fn trim_tail(&mut self) {
        if self.tail.len() <= Self::HALF {
            return;
        }
        let cut = ceil_char_boundary(&self.tail, self.tail.len() - Self::HALF);
        self.tail.drain(..cut);
        self.n_omitted += cut;
    }

    fn finish(mut self) -> String {
        self.trim_tail();
        if self.n_omitted == 0 {
            self.head.push_str(&self.tail);
            return self.head;
        }
        format!(
            "{}\n[... {} bytes omitted ...]\n{}",
            self.head, self.n_omitted, self.tail
        )
    }
}

/// The largest char boundary of `text` at or below `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    (0..=index)
        .rev()
        .find(|&at| text.is_char_boundary(at))
        .unwrap_or(0)
}

/// The smallest char boundary of `text` at or above `index`.
fn ceil_char_boundary(text: &str, index: usize) -> usize {
    (index..text.len())
        .find(|&at| text.is_char_boundary(at))
        .unwrap_or(text.len())
}

/// Bytes to text for one stream. A read can end inside a multibyte
/// character; those bytes wait for the next read instead of becoming two
/// replacement characters. Bytes that are not UTF-8 at all become U+FFFD.
#[derive(Default)]
struct Utf8Decoder {
    /// The start of a character the last read cut off (at most 3 bytes).
    pending: Vec<u8>,
}

impl Utf8Decoder {
    fn decode(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let complete = complete_prefix_len(&self.pending);
        let text =
            String::from_utf8_lossy(self.pending.get(..complete).unwrap_or_default()).into_owned();
        self.pending.drain(..complete);
        text
    }

    /// At end of stream: whatever is left, replaced if incomplete.
    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// How many of `bytes` can be decoded now: all but a multibyte character
/// that the end of `bytes` cuts short.
fn complete_prefix_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    // A character is at most 4 bytes, so its lead byte is among the last 3
    // if it is cut short.
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: the lead is further back
        }
        let char_len = match byte {
            0xF0..=0xFF => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if char_len > back { len - back } else { len };
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_reads_is_decoded_whole() {
        let bytes = "aé€😀z".as_bytes();
        for split in 0..=bytes.len() {
            let mut decoder = Utf8Decoder::default();
            let (first, second) = bytes.split_at(split);
            let mut text = decoder.decode(first);
            text.push_str(&decoder.decode(second));
            text.push_str(&decoder.finish());
            assert_eq!(text, "aé€😀z", "split at {split}");
        }
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut decoder = Utf8Decoder::default();
        let mut text = decoder.decode(b"a\xffb\xe2\x82");
        text.push_str(&decoder.finish());
        assert_eq!(text, "a\u{fffd}b\u{fffd}");
    }

    #[test]
    fn short_output_is_kept_whole() {
        let mut result = HeadTail::default();
        result.push("hello ");
        result.push("world");
        assert_eq!(result.finish(), "hello world");
    }

    #[test]
    fn output_at_exactly_the_cap_is_kept_whole() {
        let mut result = HeadTail::default();
        for _ in 0..RESULT_CAP / 1024 {
            result.push(&"x".repeat(1024));
        }
        assert_eq!(result.finish().len(), RESULT_CAP);
    }

    #[test]
    fn long_output_keeps_head_and_tail_in_order() {
        let mut result = HeadTail::default();
        result.push("HEAD");
        for _ in 0..1000 {
            result.push(&"é".repeat(500));
        }
        result.push("TAIL");
        let text = result.finish();
        let n_total = 4 + 1000 * 500 * 2 + 4;
        let marker = format!("\n[... {} bytes omitted ...]\n", n_total - RESULT_CAP);
        assert!(text.starts_with("HEAD"));
        assert!(text.ends_with("TAIL"));
        assert!(text.contains(&marker), "{}", &text[RESULT_CAP / 2 - 10..]);
        assert_eq!(text.len(), RESULT_CAP + marker.len());
    }

    #[test]
    fn failures_name_the_exit_code_or_the_signal() {
        assert_eq!(
            describe_failure(ExitStatus::from_raw(2 << 8)),
            "exit code 2"
        );
        assert_eq!(
            describe_failure(ExitStatus::from_raw(9)),
            "killed by signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn bad_input_is_explained() {
        let missing = BashInput::parse(&serde_json::json!({})).unwrap_err();
        assert!(missing.contains("\"command\" is missing"), "{missing}");
        let wrong = BashInput::parse(&serde_json::json!({"command": 1})).unwrap_err();
        assert!(wrong.contains("must be a string"), "{wrong}");
        let timeout =
            BashInput::parse(&serde_json::json!({"command": "ls", "timeout_ms": -1})).unwrap_err();
        assert!(timeout.contains("positive integer"), "{timeout}");
        let not_object = BashInput::parse(&serde_json::json!("ls")).unwrap_err();
        assert!(not_object.contains("needs input"), "{not_object}");
    }
}
