//! The tool layer against real processes: the `bash` tool (output, exit
//! status, working directory, caps, timeout, cancel, background children),
//! the process ledger that lets a restarted runtime kill what outlived it,
//! the specs the registry offers the model, and the file tools through the
//! registry: schema checks, a write-edit-read-search round, confinement.
//!
//! Every `bash` call here goes through the spawner process a runtime uses
//! (`keel-spawner`); the tests under "The spawner" also check what it adds
//! (no inherited descriptors, a dead spawner, the fallback) and the
//! direct spawn it falls back to.
//!
//! Commands that need the test to know their process group print `$$`: the
//! gate execs `bash -c`, so that shell's pid is the group's leader and id.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_actors::core::builtin::{ASK_USER, SPAWN_AGENTS, SUBMIT_RESULT};
use keel_actors::process_group::{ProcessGroup, ProcessLedger, Reaped};
use keel_actors::spawner::{Launch, Spawner, SpawnerCommand};
use keel_actors::tool::{Bash, Tool, ToolContext, ToolOutcome, ToolOutput, ToolRegistry};
use keel_core::message::ToolCall;
use keel_core::wire::ToolSpec;
use keel_core::ToolCallId;
use nix::errno::Errno;
use nix::sys::signal::killpg;
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

/// Longest wait for something that takes milliseconds: only a broken tool
/// (or a badly overloaded machine) reaches it.
const PATIENCE: Duration = Duration::from_secs(20);

fn context(input: Value, cwd: &Path, output: ToolOutput) -> ToolContext {
    ToolContext {
        call: ToolCall {
            id: ToolCallId::new("toolu_test"),
            name: "bash".to_owned(),
            input,
        },
        cwd: cwd.to_path_buf(),
        may_leave_cwd: false,
        output,
        ledger: None,
        spawner: spawner(),
        groups: Default::default(),
        // The sandbox has tests of its own (tests/sandbox.rs); these are
        // about running commands.
        sandbox: keel_actors::tool::CallSandbox::unconfined(),
    }
}

/// This crate's own spawner process (what a runtime starts), for one test:
/// it starts at the test's first spawn, on the test's tokio runtime.
fn spawner() -> Spawner {
    Spawner::new(spawner_command())
}

fn spawner_command() -> SpawnerCommand {
    SpawnerCommand {
        program: env!("CARGO_BIN_EXE_keel-spawner").into(),
        args: Vec::new(),
        hide: None,
    }
}

/// Run `command` to its end, output discarded, with a bound on how long that
/// may take.
async fn bash(input: Value) -> ToolOutcome {
    let cwd = std::env::temp_dir();
    let run = Bash.run(context(input, &cwd, ToolOutput::discard()));
    tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the bash tool did not return")
}

/// The next live chunk, or a failure if none comes.
async fn next_chunk(chunks: &mut UnboundedReceiver<String>) -> String {
    tokio::time::timeout(PATIENCE, chunks.recv())
        .await
        .expect("no output chunk arrived")
        .expect("the output channel closed")
}

fn pgid_of(text: &str) -> u32 {
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a pid: {text:?}"))
}

/// Whether no running process of group `pgid` is left. A killed process
/// whose parent died is reparented to init, which reaps it when it gets to
/// it (seconds, in some containers); such a zombie runs nothing, so it
/// counts as gone.
fn group_is_gone(pgid: u32) -> bool {
    match killpg(Pid::from_raw(pgid as i32), None) {
        Err(Errno::ESRCH) => true,
        _ => member_states(pgid).iter().all(|&state| state == 'Z'),
    }
}

/// The state letter of every process in group `pgid`, from /proc.
fn member_states(pgid: u32) -> Vec<char> {
    let mut states = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, fields)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = fields.split_whitespace().collect();
        // After the name: state (field 3), ppid (4), pgrp (5).
        if fields.get(2) == Some(&pgid.to_string().as_str()) {
            states.extend(fields[0].chars().next());
        }
    }
    states
}

/// Wait (bounded) until group `pgid` has no running process left.
async fn assert_group_gone(pgid: u32) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !group_is_gone(pgid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "process group {pgid} is still running: {:?}",
            member_states(pgid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The groups the ledger's file records as running, read from disk.
fn ledger_records(ledger: &ProcessLedger) -> Vec<String> {
    ledger
        .recorded()
        .unwrap()
        .into_iter()
        .map(|(pgid, _)| pgid.to_string())
        .collect()
}

#[tokio::test]
async fn stdout_and_stderr_are_both_captured() {
    let outcome = bash(json!({"command": "echo to-stdout; echo to-stderr >&2"})).await;
    assert!(!outcome.is_error, "{outcome:?}");
    assert!(outcome.content.contains("to-stdout\n"), "{outcome:?}");
    assert!(outcome.content.contains("to-stderr\n"), "{outcome:?}");
}

#[tokio::test]
async fn the_command_reaches_bash_verbatim() {
    let outcome = bash(json!({"command": r#"printf '%s|' "it's" '$1' "$#" "$0""#})).await;
    assert_eq!(outcome, ToolOutcome::ok("it's|$1|0|bash|"));
}

#[tokio::test]
async fn the_command_knows_its_tool_call_id() {
    let outcome = bash(json!({"command": "printf %s \"$KEEL_TOOL_CALL_ID\""})).await;
    assert_eq!(outcome, ToolOutcome::ok("toolu_test"));
}

#[tokio::test]
async fn a_command_with_no_output_says_so() {
    let outcome = bash(json!({"command": "true"})).await;
    assert_eq!(outcome, ToolOutcome::ok("(no output)"));
}

#[tokio::test]
async fn a_nonzero_exit_is_an_error_that_names_the_code() {
    let outcome = bash(json!({"command": "echo failing; exit 3"})).await;
    assert_eq!(outcome, ToolOutcome::error("failing\nexit code 3"));
}

#[tokio::test]
async fn a_command_killed_by_a_signal_says_which() {
    let outcome = bash(json!({"command": "kill -TERM $$"})).await;
    assert_eq!(outcome, ToolOutcome::error("killed by signal 15 (SIGTERM)"));
}

#[tokio::test]
async fn the_command_runs_in_the_conversation_directory() {
    let dir = tempfile::tempdir().unwrap();
    let call = context(
        json!({"command": "pwd -P"}),
        dir.path(),
        ToolOutput::discard(),
    );
    let outcome = Bash.run(call).await;
    assert!(!outcome.is_error, "{outcome:?}");
    assert_eq!(
        Path::new(outcome.content.trim()),
        dir.path().canonicalize().unwrap()
    );
}

#[tokio::test]
async fn a_missing_working_directory_is_an_error_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let outcome = Bash
        .run(context(
            json!({"command": "true"}),
            &gone,
            ToolOutput::discard(),
        ))
        .await;
    assert!(outcome.is_error, "{outcome:?}");
    assert!(
        outcome.content.contains("cannot run bash in"),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn bad_input_is_an_error_outcome_not_a_panic() {
    for (input, says) in [
        (json!({}), "\"command\" is missing"),
        (json!({"command": 42}), "\"command\" must be a string"),
        (json!("ls"), "needs input"),
        (json!({"command": "ls", "timeout_ms": "soon"}), "timeout_ms"),
        (json!({"command": "ls", "timeout_ms": 0}), "timeout_ms"),
    ] {
        let outcome = bash(input.clone()).await;
        assert!(outcome.is_error, "{input}: {outcome:?}");
        assert!(outcome.content.contains(says), "{input}: {outcome:?}");
    }
}

#[tokio::test]
async fn output_chunks_arrive_on_the_channel() {
    let (output, mut chunks) = ToolOutput::channel();
    let cwd = std::env::temp_dir();
    let command = json!({"command": "echo one; echo two >&2"});
    let outcome = Bash.run(context(command, &cwd, output)).await;
    assert!(!outcome.is_error, "{outcome:?}");
    // The context, and with it the sender, is gone: the channel drains and closes.
    let mut live = String::new();
    while let Some(chunk) = chunks.recv().await {
        assert!(!chunk.is_empty());
        live.push_str(&chunk);
    }
    assert!(live.contains("one\n") && live.contains("two\n"), "{live:?}");
    assert_eq!(live.len(), outcome.content.len());
}

#[tokio::test]
async fn output_streams_while_the_command_is_still_running() {
    let (output, mut chunks) = ToolOutput::channel();
    let cwd = std::env::temp_dir();
    let command = json!({"command": "echo $$; sleep 30"});
    let mut run = Box::pin(Bash.run(context(command, &cwd, output)));
    let chunk = tokio::select! {
        chunk = next_chunk(&mut chunks) => chunk,
        outcome = &mut run => panic!("finished early: {outcome:?}"),
    };
    let pgid = pgid_of(&chunk);
    drop(run);
    assert_group_gone(pgid).await;
}

#[tokio::test]
async fn large_output_is_capped_keeping_head_and_tail() {
    let (output, mut chunks) = ToolOutput::channel();
    let cwd = std::env::temp_dir();
    let command =
        json!({"command": "echo START; head -c 300000 /dev/zero | tr '\\0' a; echo; echo END"});
    let run = Bash.run(context(command, &cwd, output));
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap();
    assert!(!outcome.is_error);
    let n_output = "START\n".len() + 300_000 + "\nEND\n".len();
    let marker = format!("\n[... {} bytes omitted ...]\n", n_output - 64 * 1024);
    assert!(outcome.content.starts_with("START\naaaa"));
    assert!(outcome.content.ends_with("aaaa\nEND\n"));
    assert!(outcome.content.contains(&marker));
    assert_eq!(outcome.content.len(), 64 * 1024 + marker.len());
    // Under the live cap, everything is streamed.
    let mut n_live = 0;
    while let Some(chunk) = chunks.recv().await {
        n_live += chunk.len();
    }
    assert_eq!(n_live, n_output);
}

#[tokio::test]
async fn live_output_stops_at_its_cap_but_the_command_still_finishes() {
    let (output, mut chunks) = ToolOutput::channel();
    let cwd = std::env::temp_dir();
    let command = json!({"command": "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo END"});
    let run = Bash.run(context(command, &cwd, output));
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap();
    assert!(!outcome.is_error);
    assert!(outcome.content.ends_with("aaaa\nEND\n"));
    let mut live = Vec::new();
    while let Some(chunk) = chunks.recv().await {
        live.push(chunk);
    }
    let n_live: usize = live.iter().map(String::len).sum();
    let last = live.last().unwrap();
    assert!(last.contains("[live output stops after 1 MiB"), "{last:?}");
    assert!(n_live < 1024 * 1024 + 200, "{n_live}");
    assert!(!live.concat().contains("END"));
}

#[tokio::test]
async fn a_timeout_kills_the_command_and_keeps_its_output() {
    let command = "sleep 30 & echo $$; sleep 30";
    let outcome = bash(json!({"command": command, "timeout_ms": 300})).await;
    assert!(outcome.is_error, "{outcome:?}");
    let (pgid, note) = outcome.content.split_once('\n').unwrap();
    assert_eq!(
        note,
        "timed out after 300 ms: the command and every process it started were killed"
    );
    assert_group_gone(pgid_of(pgid)).await;
}

#[tokio::test]
async fn dropping_the_call_kills_the_whole_process_tree() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(ProcessLedger::open(&dir.path().join("tools")).unwrap());
    let (output, mut chunks) = ToolOutput::channel();
    let mut call = context(
        json!({"command": "sleep 30 & sleep 30 & echo $$; wait"}),
        dir.path(),
        output,
    );
    call.ledger = Some(ledger.clone());
    let mut run = Box::pin(Bash.run(call));
    let chunk = tokio::select! {
        chunk = next_chunk(&mut chunks) => chunk,
        outcome = &mut run => panic!("finished early: {outcome:?}"),
    };
    let pgid = pgid_of(&chunk);
    // Both sleeps were forked before the echo, so the group has three members.
    assert_eq!(member_states(pgid).len(), 3, "{:?}", member_states(pgid));
    assert_eq!(ledger_records(&ledger), [pgid.to_string()]);

    drop(run);

    assert_group_gone(pgid).await;
    assert!(ledger_records(&ledger).is_empty());
}

#[tokio::test]
async fn background_children_die_when_the_command_exits() {
    let outcome = bash(json!({"command": "sleep 30 & echo $$"})).await;
    assert!(!outcome.is_error, "{outcome:?}");
    assert_group_gone(pgid_of(&outcome.content)).await;
}

#[tokio::test]
async fn the_ledger_holds_a_record_exactly_while_the_group_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(ProcessLedger::open(&dir.path().join("tools")).unwrap());
    let (output, mut chunks) = ToolOutput::channel();
    // The command waits for a file the test creates once it has looked.
    let mut call = context(
        json!({"command": "echo $$; while [ ! -e go ]; do sleep 0.01; done; echo done"}),
        dir.path(),
        output,
    );
    call.ledger = Some(ledger.clone());
    let mut run = Box::pin(Bash.run(call));
    let chunk = tokio::select! {
        chunk = next_chunk(&mut chunks) => chunk,
        outcome = &mut run => panic!("finished early: {outcome:?}"),
    };
    let pgid = pgid_of(&chunk);

    assert_eq!(
        ledger.recorded().unwrap(),
        [(pgid, "toolu_test".to_owned())]
    );

    std::fs::write(dir.path().join("go"), "").unwrap();
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap();
    assert!(outcome.content.ends_with("done\n"), "{outcome:?}");
    assert!(ledger_records(&ledger).is_empty());
}

// --- The spawner -----------------------------------------------------------

/// The lines of live output up to a whole line that starts with `last`.
async fn read_lines_until(chunks: &mut UnboundedReceiver<String>, last: &str) -> Vec<String> {
    let mut text = String::new();
    while !(text.ends_with('\n') && text.lines().any(|line| line.starts_with(last))) {
        text.push_str(&next_chunk(chunks).await);
    }
    text.lines().map(str::to_owned).collect()
}

/// This process's descriptors beyond stdio that are not close-on-exec: what
/// whoever started the test binary left open for it (a test harness, a
/// shell). Every process this one starts gets them, the spawner included,
/// which hands them on: they are not the runtime's own. Rust's standard
/// library and tokio open every descriptor close-on-exec.
fn handed_on_at_exec() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if ["0", "1", "2"].contains(&name.as_str()) {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue; // closed meanwhile (the directory's own descriptor)
        };
        let flags = info
            .lines()
            .find_map(|line| line.strip_prefix("flags:"))
            .and_then(|flags| u32::from_str_radix(flags.trim(), 8).ok())
            .unwrap();
        const O_CLOEXEC: u32 = 0o2_000_000;
        if flags & O_CLOEXEC == 0 {
            found.push(name);
        }
    }
    found
}

/// The state letter of process `pid` (field 3 of its stat line).
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The parent of process `pid` (field 4 of its stat line).
fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, fields) = stat.rsplit_once(')').unwrap();
    fields.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A descriptor of this process that is not close-on-exec, as a careless
/// library might leave one: a direct spawn hands it to the child.
fn leak_a_descriptor() -> (std::os::fd::OwnedFd, i32) {
    use std::os::fd::AsRawFd as _;
    let (read_end, _write_end) = rustix::pipe::pipe().unwrap();
    let number = read_end.as_raw_fd();
    (read_end, number)
}

/// Lists the command's own descriptors (`$$` is the shell the gate execs),
/// then its pid, then waits to be cancelled.
const LIST_FDS_THEN_WAIT: &str = "ls /proc/$$/fd; echo pid $$; sleep 30 & sleep 30 & wait";

#[tokio::test]
async fn a_command_started_by_the_spawner_inherits_nothing_and_dies_with_its_call() {
    // As a runtime does: the spawner starts before the descriptors that
    // stand for open connections exist.
    let spawner = Spawner::start(spawner_command()).await;
    assert!(spawner.uses_helper().await);
    // What the spawner could have inherited: at most this (other tests of
    // this binary run at the same time and may leak one too).
    let started_with = handed_on_at_exec();
    let (_leaked, leaked_number) = leak_a_descriptor();
    let connections: Vec<_> = (0..200)
        .map(|_| std::os::unix::net::UnixStream::pair().unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (output, mut chunks) = ToolOutput::channel();
    let mut call = context(json!({"command": LIST_FDS_THEN_WAIT}), dir.path(), output);
    call.spawner = spawner;
    let mut run = Box::pin(Bash.run(call));
    let lines = tokio::select! {
        lines = read_lines_until(&mut chunks, "pid ") => lines,
        outcome = &mut run => panic!("finished early: {outcome:?}"),
    };
    let fds = &lines[..lines.len() - 1];
    let pgid = pgid_of(lines[lines.len() - 1].trim_start_matches("pid "));
    for fd in ["0", "1", "2"] {
        assert!(fds.contains(&fd.to_owned()), "{fds:?}");
    }
    // Beyond stdio, at most what this process was itself started with
    // (not close-on-exec; see `handed_on_at_exec`): never the leaked
    // descriptor, nor any of the connections, which a direct spawn copies.
    assert!(!fds.contains(&leaked_number.to_string()), "{fds:?}");
    for fd in fds
        .iter()
        .filter(|fd| !["0", "1", "2"].contains(&fd.as_str()))
    {
        assert!(started_with.contains(fd), "{fd} of {fds:?} was handed on");
    }
    assert!(fds.len() <= 3 + started_with.len(), "{fds:?}");
    drop(connections);
    assert_ne!(parent_of(pgid), std::process::id(), "not started directly");

    // Cancel: the call's future is dropped, and the group dies with it.
    // (How fast is a benchmark's business, not a test's.)
    drop(run);
    assert_group_gone(pgid).await;
}

#[tokio::test]
async fn a_command_gets_the_runtime_environment_though_the_spawner_has_none() {
    let path = std::env::var("PATH").unwrap();
    let outcome = bash(json!({"command": "printf %s \"$PATH\"; echo; printenv | grep -c ."})).await;
    let (got_path, n_vars) = outcome.content.split_once('\n').unwrap();
    assert_eq!(got_path, path);
    // Ours but the secrets a tool never sees (`sandbox::is_secret`: KEEL_*
    // among them, which CI sets), plus the call id (and what bash sets
    // itself: PWD, SHLVL, _).
    let n_ours = std::env::vars_os()
        .filter(|(name, _)| {
            name.to_str()
                .is_some_and(|name| !keel_actors::sandbox::is_secret(name))
        })
        .count();
    let n_vars: usize = n_vars.trim().parse().unwrap();
    assert!(n_vars > n_ours, "{n_vars} variables, we have {n_ours}");
}

#[tokio::test]
async fn a_direct_spawn_hands_on_a_leaked_descriptor_which_is_why_there_is_a_spawner() {
    let (_leaked, leaked_number) = leak_a_descriptor();
    let dir = tempfile::tempdir().unwrap();
    let mut call = context(
        json!({"command": "ls /proc/$$/fd"}),
        dir.path(),
        ToolOutput::discard(),
    );
    call.spawner = Spawner::direct();
    let outcome = Bash.run(call).await;
    assert!(!outcome.is_error, "{outcome:?}");
    let fds: Vec<&str> = outcome.content.lines().collect();
    assert!(
        fds.contains(&leaked_number.to_string().as_str()),
        "{fds:?} lacks {leaked_number}"
    );
}

#[tokio::test]
async fn a_spawner_that_dies_mid_call_ends_the_call_with_an_error_and_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let spawner = Spawner::start(spawner_command()).await;
    let (output, mut chunks) = ToolOutput::channel();
    let mut call = context(
        json!({"command": "echo $$; sleep 30 & wait"}),
        dir.path(),
        output,
    );
    call.spawner = spawner.clone();
    let mut run = Box::pin(Bash.run(call));
    let chunk = tokio::select! {
        chunk = next_chunk(&mut chunks) => chunk,
        outcome = &mut run => panic!("finished early: {outcome:?}"),
    };
    let pgid = pgid_of(&chunk);
    let spawner_pid = parent_of(pgid);
    nix::sys::signal::kill(
        Pid::from_raw(spawner_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap();
    assert!(outcome.is_error, "{outcome:?}");
    assert!(
        outcome.content.contains("the process spawner died"),
        "{outcome:?}"
    );
    assert_group_gone(pgid).await;

    // The next call starts a new spawner and runs.
    let mut call = context(
        json!({"command": "echo $PPID"}),
        dir.path(),
        ToolOutput::discard(),
    );
    call.spawner = spawner.clone();
    let outcome = tokio::time::timeout(PATIENCE, Bash.run(call))
        .await
        .unwrap();
    assert!(!outcome.is_error, "{outcome:?}");
    assert!(spawner.uses_helper().await);
}

#[tokio::test]
async fn a_spawner_that_died_between_calls_is_started_again_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let spawner = Spawner::start(spawner_command()).await;
    let parent = |spawner: &Spawner| {
        let mut call = context(
            json!({"command": "echo $PPID"}),
            dir.path(),
            ToolOutput::discard(),
        );
        call.spawner = spawner.clone();
        async move {
            let outcome = tokio::time::timeout(PATIENCE, Bash.run(call))
                .await
                .unwrap();
            assert!(!outcome.is_error, "{outcome:?}");
            pgid_of(&outcome.content)
        }
    };
    let first = parent(&spawner).await;
    nix::sys::signal::kill(
        Pid::from_raw(first as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Dead (a zombie until the runtime reaps it) before the next call.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while state_of(first) != Some('Z') {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the spawner never died"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let second = parent(&spawner).await;
    assert_ne!(second, first);
    assert_ne!(second, std::process::id(), "not spawned directly");
}

#[tokio::test]
async fn a_spawner_that_cannot_start_leaves_spawning_direct_and_working() {
    let spawner = Spawner::start(SpawnerCommand {
        program: "/nonexistent/keel-spawner".into(),
        args: Vec::new(),
        hide: None,
    })
    .await;
    assert!(!spawner.uses_helper().await);
    let dir = tempfile::tempdir().unwrap();
    let mut call = context(
        json!({"command": "echo $PPID"}),
        dir.path(),
        ToolOutput::discard(),
    );
    call.spawner = spawner;
    let outcome = Bash.run(call).await;
    assert_eq!(
        outcome,
        ToolOutcome::ok(format!("{}\n", std::process::id()))
    );
}

#[tokio::test]
async fn the_spawner_keeps_an_exited_leader_unreaped_until_it_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let spawner = Spawner::start(spawner_command()).await;
    let argv = ["true".into()];
    let launched = spawner
        .spawn(&Launch {
            argv: &argv,
            env: &[],
            cwd: dir.path(),
            confinement: None,
        })
        .await
        .unwrap();
    let pid = launched.pid;
    let mut exit = launched.exit;
    let status = tokio::time::timeout(PATIENCE, exit.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    // Exited and reported, but still a zombie: its pid, and so its process
    // group id, cannot name another process yet.
    assert_eq!(member_states(pid), ['Z']);

    drop(exit);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    // Released, it is reaped (its pid cannot be handed out again in
    // between: that would take a wrap of the whole pid space).
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{pid} was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a restarted runtime's boot does: a new ledger over the same
/// directory reaps what the last one left.
fn reap_after_restart(dir: &std::path::Path) -> Vec<Reaped> {
    ProcessLedger::open(dir).unwrap().reap_survivors().unwrap()
}

/// A `sleep 30` leading its own group, as a tool would have started it.
fn spawn_group_leader() -> std::process::Child {
    use std::os::unix::process::CommandExt;
    std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap()
}

#[test]
fn reap_survivors_kills_a_recorded_group_that_is_still_running() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let ledger = ProcessLedger::open(dir.path()).unwrap();
    let mut leader = spawn_group_leader();
    ledger.record(leader.id(), "toolu_survivor").unwrap();

    let reaped = reap_after_restart(dir.path());

    assert_eq!(
        reaped,
        [Reaped {
            pgid: leader.id(),
            label: "toolu_survivor".to_owned(),
            killed: true,
        }]
    );
    assert_eq!(leader.wait().unwrap().signal(), Some(9));
    assert!(ledger_records(&ledger).is_empty());
}

#[test]
fn reap_survivors_spares_a_pid_whose_start_time_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ProcessLedger::open(dir.path()).unwrap();
    let mut stranger = spawn_group_leader();
    // As if the recorded group died and the kernel gave its pid to `stranger`.
    ledger.record(stranger.id(), "toolu_old").unwrap();
    let mut record: Value = serde_json::from_slice(&std::fs::read(ledger.path()).unwrap()).unwrap();
    record["start_time"] = json!(record["start_time"].as_u64().unwrap() - 1);
    std::fs::write(ledger.path(), format!("{record}\n")).unwrap();

    let reaped = ledger.reap_survivors().unwrap();

    assert_eq!(
        reaped,
        [Reaped {
            pgid: stranger.id(),
            label: "toolu_old".to_owned(),
            killed: false,
        }]
    );
    assert!(ledger_records(&ledger).is_empty());
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "the stranger was killed"
    );
    stranger.kill().unwrap();
    stranger.wait().unwrap();
}

#[test]
fn reap_survivors_deletes_an_unreadable_record_of_the_older_layout_without_killing() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ProcessLedger::open(dir.path()).unwrap();
    std::fs::write(dir.path().join("4242"), "{\"v\":1,\"pgid\":42").unwrap();
    let reaped = ledger.reap_survivors().unwrap();
    assert_eq!(
        reaped,
        [Reaped {
            pgid: 4242,
            label: String::new(),
            killed: false,
        }]
    );
    assert!(!dir.path().join("4242").exists());
}

#[test]
fn reap_survivors_kills_a_group_recorded_in_the_older_one_file_layout() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mut leader = spawn_group_leader();
    // What an earlier version wrote: one file per group, named after it.
    let scratch = tempfile::tempdir().unwrap();
    let recorder = ProcessLedger::open(scratch.path()).unwrap();
    recorder.record(leader.id(), "toolu_old_layout").unwrap();
    let line = std::fs::read_to_string(recorder.path()).unwrap();
    std::fs::write(dir.path().join(leader.id().to_string()), line.trim_end()).unwrap();

    let reaped = reap_after_restart(dir.path());

    assert_eq!(
        reaped,
        [Reaped {
            pgid: leader.id(),
            label: "toolu_old_layout".to_owned(),
            killed: true,
        }]
    );
    assert_eq!(leader.wait().unwrap().signal(), Some(9));
    assert!(!dir.path().join(leader.id().to_string()).exists());
}

#[test]
fn reap_survivors_kills_only_groups_without_an_end_line_and_skips_a_torn_one() {
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(ProcessLedger::open(dir.path()).unwrap());
    let mut ended = spawn_group_leader();
    let mut running = spawn_group_leader();
    ledger.record(ended.id(), "toolu_ended").unwrap();
    ledger.record(running.id(), "toolu_running").unwrap();
    // Forgotten without being killed: its end line must keep the reaper away.
    ledger.remove(ended.id()).unwrap();
    // A crash in the middle of writing a start line.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(ledger.path())
        .unwrap();
    file.write_all(b"{\"v\":1,\"pgid\":99999,\"start_ti")
        .unwrap();
    drop(file);

    let reaped = reap_after_restart(dir.path());

    assert_eq!(
        reaped,
        [Reaped {
            pgid: running.id(),
            label: "toolu_running".to_owned(),
            killed: true,
        }]
    );
    assert_eq!(running.wait().unwrap().signal(), Some(9));
    assert!(
        ended.try_wait().unwrap().is_none(),
        "an ended group was reaped"
    );
    assert_eq!(std::fs::read(ledger.path()).unwrap(), b"");
    ended.kill().unwrap();
    ended.wait().unwrap();
}

#[test]
fn the_ledger_file_is_emptied_once_nothing_runs_after_it_grew_past_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ProcessLedger::open(dir.path()).unwrap();
    let mut long_lived = spawn_group_leader();
    ledger.record(long_lived.id(), "toolu_long").unwrap();
    // Our own process stands for short-lived groups: recording it needs
    // only a live pid, and nothing here kills it.
    let me = std::process::id();
    let mut cycles = 0;
    while std::fs::metadata(ledger.path()).unwrap().len() < keel_actors::process_group::COMPACT_AT {
        ledger.record(me, "toolu_short").unwrap();
        ledger.remove(me).unwrap();
        cycles += 1;
    }
    assert!(cycles > 100, "{cycles} cycles");
    // Past the bound, but a group still runs: its line must stay.
    ledger.record(me, "toolu_short").unwrap();
    ledger.remove(me).unwrap();
    assert_eq!(ledger_records(&ledger), [long_lived.id().to_string()]);
    assert!(
        std::fs::metadata(ledger.path()).unwrap().len() >= keel_actors::process_group::COMPACT_AT
    );

    ledger.remove(long_lived.id()).unwrap();

    assert_eq!(std::fs::read(ledger.path()).unwrap(), b"");
    // Appends go on from the start of the emptied file.
    ledger.record(me, "toolu_after").unwrap();
    assert_eq!(ledger.recorded().unwrap(), [(me, "toolu_after".to_owned())]);
    long_lived.kill().unwrap();
    long_lived.wait().unwrap();
}

#[test]
fn dropping_a_process_group_kills_it_and_forgets_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(ProcessLedger::open(dir.path()).unwrap());
    let mut leader = spawn_group_leader();
    let group = ProcessGroup::adopt(leader.id(), Some(ledger.clone()), "toolu_drop").unwrap();
    assert_eq!(group.pgid(), leader.id());
    assert_eq!(ledger_records(&ledger), [leader.id().to_string()]);
    drop(group);
    assert!(leader.wait().unwrap().code().is_none());
    assert!(ledger_records(&ledger).is_empty());
}

#[test]
fn adopting_our_own_group_or_init_is_refused() {
    for pgid in [0, 1] {
        assert!(ProcessGroup::adopt(pgid, None, "toolu_bad").is_err());
    }
}

fn names(specs: &[ToolSpec]) -> Vec<&str> {
    specs.iter().map(|spec| spec.name.as_str()).collect()
}

#[test]
fn specs_are_sorted_and_offer_ask_user_to_users_and_submit_result_to_sub_agents() {
    let registry = ToolRegistry::with_defaults();
    assert_eq!(
        names(&registry.specs(false)),
        [
            ASK_USER,
            "bash",
            "edit_file",
            "glob",
            "grep",
            "read_file",
            SPAWN_AGENTS,
            "write_file"
        ]
    );
    assert_eq!(
        names(&registry.specs(true)),
        [
            "bash",
            "edit_file",
            "glob",
            "grep",
            "read_file",
            SUBMIT_RESULT,
            "write_file"
        ],
        "no human answers a sub-agent, and it spawns none: it is offered neither"
    );

    let spec = |sub_agent: bool, name: &str| {
        registry
            .specs(sub_agent)
            .into_iter()
            .find(|spec| spec.name == name)
            .unwrap()
    };
    assert_eq!(
        spec(false, ASK_USER).input_schema["required"],
        json!(["question"])
    );
    assert_eq!(
        spec(true, SUBMIT_RESULT).input_schema["required"],
        json!(["result"])
    );
    assert_eq!(
        spec(false, "bash").input_schema["required"],
        json!(["command"])
    );
    assert_eq!(
        spec(false, "edit_file").input_schema["required"],
        json!(["path", "old_string", "new_string"])
    );
}

/// A tool that answers with a fixed text, under any name.
struct Canned {
    name: &'static str,
    answer: &'static str,
}

#[async_trait::async_trait]
impl Tool for Canned {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.to_owned(),
            description: self.answer.to_owned(),
            input_schema: json!({"type": "object"}),
        }
    }

    async fn run(&self, _ctx: ToolContext) -> ToolOutcome {
        ToolOutcome::ok(self.answer)
    }
}

#[tokio::test]
async fn registering_a_tool_replaces_one_of_the_same_name() {
    let mut registry = ToolRegistry::new();
    registry.register(Bash);
    let before = registry.clone();
    registry
        .register(Canned {
            name: "bash",
            answer: "not really bash",
        })
        .register(Canned {
            name: "aardvark",
            answer: "first",
        })
        .register(Canned {
            name: ASK_USER,
            answer: "never runs",
        });

    let specs = registry.specs(false);
    assert_eq!(names(&specs), ["aardvark", ASK_USER, "bash", SPAWN_AGENTS]);
    assert_ne!(
        specs[1].description, "never runs",
        "the built-in ask_user wins"
    );
    let bash = registry.get("bash").unwrap();
    let cwd = std::env::temp_dir();
    let outcome = bash
        .run(context(json!({}), &cwd, ToolOutput::discard()))
        .await;
    assert_eq!(outcome, ToolOutcome::ok("not really bash"));
    // A registry cloned earlier keeps what it had.
    assert!(before.get("aardvark").is_none());
    assert!(registry.get("nonexistent").is_none());
}

// ---------------------------------------------------------------------------
// The file tools, through the registry as the runtime calls them.

/// Run the registry's tool `name` on `input` in `cwd`.
async fn call(name: &str, input: Value, cwd: &Path, may_leave_cwd: bool) -> ToolOutcome {
    let tool = ToolRegistry::with_defaults().get(name).unwrap();
    let mut ctx = context(input, cwd, ToolOutput::discard());
    ctx.call.name = name.to_owned();
    ctx.may_leave_cwd = may_leave_cwd;
    tokio::time::timeout(PATIENCE, tool.run(ctx))
        .await
        .expect("the tool did not return")
}

#[tokio::test]
async fn input_that_does_not_match_the_schema_never_reaches_the_tool() {
    let dir = tempfile::tempdir().unwrap();
    let outcome = call("write_file", json!({"path": "a.txt"}), dir.path(), false).await;
    assert!(outcome.is_error);
    assert!(
        outcome.content.starts_with(
            "the input does not match the write_file tool's schema, so the tool did not run:\n\
             - at /: missing properties 'content'"
        ),
        "{outcome:?}"
    );
    assert!(!dir.path().join("a.txt").exists());

    let outcome = call(
        "read_file",
        json!({"path": "a", "offset": "ten"}),
        dir.path(),
        false,
    )
    .await;
    assert!(
        outcome
            .content
            .contains("- at /offset: want integer, but got string"),
        "{outcome:?}"
    );
    let outcome = call(
        "grep",
        json!({"pattern": "x", "colour": true}),
        dir.path(),
        false,
    )
    .await;
    assert!(outcome.content.contains("colour"), "{outcome:?}");
    // bash is checked the same way, before its own parsing.
    let outcome = call("bash", json!({"command": 42}), dir.path(), false).await;
    assert!(
        outcome
            .content
            .contains("- at /command: want string, but got number"),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn write_read_edit_grep_and_glob_work_together() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let outcome = call(
        "write_file",
        json!({"path": "src/lib.rs", "content": "fn one() {}\nfn two() {}\n"}),
        cwd,
        false,
    )
    .await;
    assert_eq!(
        outcome,
        ToolOutcome::ok("created src/lib.rs: 24 bytes, 2 lines")
    );
    let outcome = call(
        "edit_file",
        json!({"path": "src/lib.rs", "old_string": "two", "new_string": "three"}),
        cwd,
        false,
    )
    .await;
    assert_eq!(
        outcome,
        ToolOutcome::ok("edited src/lib.rs: replaced 1 occurrence (at line 2)")
    );
    let outcome = call("read_file", json!({"path": "src/lib.rs"}), cwd, false).await;
    assert_eq!(
        outcome,
        ToolOutcome::ok("     1\tfn one() {}\n     2\tfn three() {}\n")
    );
    let outcome = call("grep", json!({"pattern": "fn t\\w+"}), cwd, false).await;
    assert_eq!(outcome, ToolOutcome::ok("src/lib.rs:2:fn three() {}"));
    let outcome = call("glob", json!({"pattern": "**/*.rs"}), cwd, false).await;
    assert_eq!(outcome, ToolOutcome::ok("src/lib.rs"));
}

#[tokio::test]
async fn the_working_directory_confines_paths_unless_the_conversation_allows_leaving() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("work");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::write(dir.path().join("outside.txt"), "secret\n").unwrap();
    let outcome = call("read_file", json!({"path": "../outside.txt"}), &cwd, false).await;
    assert!(outcome.is_error);
    assert!(
        outcome.content.contains("outside the working directory"),
        "{outcome:?}"
    );
    let outcome = call("read_file", json!({"path": "../outside.txt"}), &cwd, true).await;
    assert_eq!(outcome, ToolOutcome::ok("     1\tsecret\n"));
}

/// Opening a FIFO for reading waits for a writer, maybe forever: it held
/// the turn and a blocking thread. `read_file`, `edit_file` and `grep`
/// refuse it at once instead, as they do a device.
#[tokio::test]
async fn a_fifo_is_refused_at_once_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    nix::unistd::mkfifo(&cwd.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let outcome = call("read_file", json!({"path": "pipe"}), cwd, false).await;
    assert_eq!(
        outcome,
        ToolOutcome::error(
            "pipe is a FIFO (named pipe), not a regular file; read_file reads regular files only"
        )
    );
    let outcome = call(
        "edit_file",
        json!({"path": "pipe", "old_string": "a", "new_string": "b"}),
        cwd,
        false,
    )
    .await;
    assert_eq!(
        outcome,
        ToolOutcome::error(
            "pipe is a FIFO (named pipe), not a regular file; edit_file edits regular files only"
        )
    );
    let outcome = call("grep", json!({"pattern": "x", "path": "pipe"}), cwd, false).await;
    assert_eq!(outcome, ToolOutcome::ok("no matches for \"x\""));
    let outcome = call(
        "write_file",
        json!({"path": "pipe", "content": "x"}),
        cwd,
        false,
    )
    .await;
    assert_eq!(
        outcome,
        ToolOutcome::error(
            "pipe is a FIFO (named pipe), not a regular file; write_file writes regular files only"
        )
    );
}
