//! Every client command of the `keel` binary against a real daemon, in
//! both output modes: tables checked for their columns, `--json` parsed;
//! `send`'s streaming and exit codes; and the errors a person sees (no
//! daemon, unknown conversation, busy).

use serde_json::{json, Value};

use super::{describe, free_port, Rig};
use crate::daemon::PATIENCE;

/// The header's column names and the rows of a table, split on runs of
/// two or more spaces (single spaces stay inside a cell: `LAST ACTIVITY`).
fn table(stdout: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = stdout.lines().filter(|line| !line.trim().is_empty());
    let split = |line: &str| -> Vec<String> {
        line.trim()
            .split("  ")
            .map(str::trim)
            .filter(|cell| !cell.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let header = split(lines.next().expect("a header line"));
    (header, lines.map(split).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_new_ls_send_log_inspect_in_both_modes() {
    let rig = Rig::start();
    // `keel new` prints the id alone; --json gives {"id"}.
    let plain = rig.ok(&["new"]);
    let first = plain.trim().to_owned();
    assert!(!first.is_empty() && !first.contains(' '), "{plain:?}");
    let second = rig.new_conversation(&["--busy-policy", "queue", "--model", "claude-mock"]);

    // `keel send` streams the echo and exits 0.
    let sent = rig.keel(&["send", &first, "hello keel"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let stdout = String::from_utf8_lossy(&sent.stdout);
    assert!(stdout.contains("hello keel"), "the echo streamed: {stdout}");
    // --json: one frame a line, ending with the completed turn.
    let sent = rig.keel(&["send", &second, "second one", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let frames: Vec<Value> = String::from_utf8_lossy(&sent.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(frames
        .iter()
        .any(|frame| frame["frame"] == "live" && frame["data"]["type"] == "text_delta"));
    let last = frames.last().unwrap();
    assert_eq!(
        (&last["frame"], &last["data"]["type"]),
        (&json!("canonical"), &json!("turn_completed")),
        "{frames:#?}"
    );

    // `keel ls`: a table of the two, and the same as JSON.
    let (header, rows) = table(&rig.ok(&["ls"]));
    assert_eq!(header, ["ID", "STATE", "TURNS", "LAST ACTIVITY", "CWD"]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let row = rows.iter().find(|row| row[0] == first).unwrap();
    assert_eq!(row[1], "idle");
    assert_eq!(row[2], "1");
    assert!(row[3].ends_with(" ago"), "{row:?}");
    assert_eq!(row[4], rig.site.cwd().display().to_string());
    let (header, _) = table(&rig.ok(&["ls", "--all"]));
    assert_eq!(header.last().map(String::as_str), Some("PARENT"));
    let listed = rig.json(&["ls"]);
    let listed = listed["conversations"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|conversation| conversation["turns"] == 1));

    // `keel log`: a line per event; --json an event per line.
    let log = rig.ok(&["log", &first]);
    assert!(
        log.lines()
            .any(|line| line.contains("user_message") && line.contains("hello keel")),
        "{log}"
    );
    assert!(
        log.lines().any(|line| line.contains("turn_completed")),
        "{log}"
    );
    let events: Vec<Value> = rig
        .ok(&["log", &first, "--json", "--from", "2"])
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events[0]["seq"], 2);
    assert!(events
        .iter()
        .any(|event| event["type"] == "assistant_message"));

    // `keel inspect`: fields for people, the API's JSON for scripts.
    let inspected = rig.ok(&["inspect", &second]);
    let (header, rows) = table(&inspected);
    assert_eq!(header, ["FIELD", "VALUE"]);
    let field = |name: &str| {
        rows.iter()
            .find(|row| row[0] == name)
            .map(|row| row.get(1).cloned().unwrap_or_default())
            .unwrap_or_else(|| panic!("no {name} in {inspected}"))
    };
    assert_eq!(field("state"), "idle");
    assert_eq!(field("busy policy"), "queue");
    assert!(field("context").contains(" tokens ("), "{inspected}");
    assert!(
        field("memory").ends_with('B'),
        "the live actor's memory: {inspected}"
    );
    assert_eq!(field("mailbox"), "0");
    let inspected = rig.json(&["inspect", &second]);
    assert_eq!(inspected["conversation"]["id"], second.as_str());
    assert_eq!(inspected["conversation"]["busy_policy"], "queue");
    assert_eq!(inspected["actor"]["id"], second.as_str());

    // `keel ps`: the live actors.
    let (header, rows) = table(&rig.ok(&["ps"]));
    assert_eq!(
        header,
        ["ID", "STATE", "IDLE", "MAILBOX", "MEMORY", "SUBSCRIBERS"]
    );
    assert!(rows.iter().any(|row| row[0] == first), "{rows:?}");
    let actors = rig.json(&["ps"]);
    assert!(actors["actors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|actor| actor["id"] == first.as_str()));

    // `keel cancel` on an idle conversation says where it rests.
    assert_eq!(
        rig.ok(&["cancel", &first]).trim(),
        format!("{first} is idle")
    );
    assert_eq!(rig.json(&["cancel", &first])["state"], "idle");

    // `keel evict`, then `ps` no longer lists it.
    assert_eq!(
        rig.ok(&["evict", &first]).trim(),
        format!("evicted {first}")
    );
    let evicted = rig.json(&["evict", &first]);
    assert_eq!(evicted, json!({"id": first, "was_live": false}));
    let actors = rig.json(&["ps"]);
    assert!(!actors["actors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|actor| actor["id"] == first.as_str()));

    // `keel rm` deletes it; then it is unknown.
    let removed = rig.ok(&["rm", &first]);
    assert!(
        removed.starts_with(&format!("deleted {first} (")),
        "{removed}"
    );
    let inspected = rig.keel(&["inspect", &first]);
    assert!(!inspected.status.success(), "{}", describe(&inspected));
    let said = String::from_utf8_lossy(&inspected.stderr);
    assert!(said.contains(first.as_str()), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_send_stops_at_a_pending_call_and_approve_runs_it() {
    let rig = Rig::start();
    let id = rig.new_conversation(&["--tool", "bash=approve"]);
    let sent = rig.keel(&["send", &id, "run: echo from-the-cli > approved.txt"]);
    assert_eq!(
        sent.status.code(),
        Some(5),
        "waits for a decision: {}",
        describe(&sent)
    );
    let stdout = String::from_utf8_lossy(&sent.stdout);
    let detail = rig.json(&["inspect", &id]);
    let call = detail["conversation"]["pending"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        stdout.contains(&format!("keel approve {id} {call}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("echo from-the-cli"),
        "the command is shown: {stdout}"
    );
    let inspected = rig.ok(&["inspect", &id]);
    assert!(
        inspected.contains("pending calls") && inspected.contains(&call),
        "{inspected}"
    );

    assert_eq!(
        rig.ok(&["approve", &id, &call]).trim(),
        format!("approved {call}")
    );
    rig.daemon.wait_turn_done(&id, 1).await;
    let written = std::fs::read_to_string(rig.site.cwd().join("approved.txt")).unwrap();
    assert_eq!(written, "from-the-cli\n");
    // The same decision again is accepted; another is refused.
    assert_eq!(rig.json(&["approve", &id, &call])["decision"], "approve");
    let denied = rig.keel(&["deny", &id, &call]);
    assert_eq!(denied.status.code(), Some(1));

    // A denied call, through --json.
    rig.keel(&["send", &id, "run: touch denied.txt"]);
    let detail = rig.json(&["inspect", &id]);
    let call = detail["conversation"]["pending"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let denied = rig.json(&["deny", &id, &call, "--by", "ada@ops"]);
    assert_eq!(denied, json!({"tool_call_id": call, "decision": "deny"}));
    let log = rig.daemon.wait_turn_done(&id, 2).await;
    assert!(!rig.site.cwd().join("denied.txt").exists());
    // Who decided is in the log with the decision.
    let resolved: Vec<&Value> = log
        .iter()
        .filter(|event| event["type"] == "resolved" && event["tool_call_id"] == call.as_str())
        .collect();
    assert_eq!(resolved.len(), 1, "{log:#?}");
    assert_eq!(resolved[0]["by"], "ada@ops");

    // Approved with a changed input: the call runs with it.
    rig.keel(&["send", &id, "run: echo as-asked > edited.txt"]);
    let detail = rig.json(&["inspect", &id]);
    let call = detail["conversation"]["pending"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let refused = rig.keel(&["approve", &id, &call, "--input", "not json"]);
    assert_ne!(refused.status.code(), Some(0), "{}", describe(&refused));
    assert_eq!(
        rig.ok(&[
            "approve",
            &id,
            &call,
            "--input",
            r#"{"command": "echo as-edited > edited.txt"}"#
        ])
        .trim(),
        format!("approved {call} with a changed input")
    );
    let log = rig.daemon.wait_turn_done(&id, 3).await;
    let written = std::fs::read_to_string(rig.site.cwd().join("edited.txt")).unwrap();
    assert_eq!(written, "as-edited\n");
    let edit = log
        .iter()
        .find(|event| event["type"] == "resolved" && event["tool_call_id"] == call.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(edit["decision"], "edit", "{edit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_send_exits_non_zero_on_a_failed_turn() {
    let rig = Rig::start();
    let id = rig.new_conversation(&[]);
    // A provider error that is not retried fails the turn.
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "status": 400}]))
        .await;
    let sent = rig.keel(&["send", &id, "this fails"]);
    assert_eq!(sent.status.code(), Some(3), "{}", describe(&sent));
    let stdout = String::from_utf8_lossy(&sent.stdout);
    assert!(stdout.contains("turn failed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_errors_say_what_to_do() {
    let rig = Rig::start();
    // No daemon at the address.
    let nobody = format!("127.0.0.1:{}", free_port());
    let output = rig
        .command(&["ls"])
        .env("KEEL_ADDR", &nobody)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        format!("error: no daemon at {nobody}: start one with `keel serve`")
    );
    // An unknown conversation, for every command that names one.
    for args in [
        vec!["inspect", "7f3c0000"],
        vec!["send", "7f3c0000", "hi"],
        vec!["log", "7f3c0000"],
        vec!["cancel", "7f3c0000"],
    ] {
        let output = rig.keel(&args);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {}",
            describe(&output)
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stderr).trim(),
            "error: conversation 7f3c0000 not found",
            "{args:?}"
        );
    }
    // Busy: a message while a turn runs.
    let id = rig.new_conversation(&[]);
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20", "drip_ms": 500}]))
        .await;
    rig.daemon.send(&id, "talk slowly").await;
    rig.daemon.wait_state(&id, "streaming").await;
    let output = rig.keel(&["send", &id, "interrupting"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        format!("error: busy (streaming): `keel cancel {id}` first")
    );
    // `keel cancel` ends the turn; a follower of it (`send` would be
    // one) sees it interrupted.
    assert_eq!(rig.ok(&["cancel", &id]).trim(), format!("{id} is idle"));
    // A bad token.
    let output = rig
        .command(&["ls"])
        .env("KEEL_TOKEN", "wrong")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("refused the token"),
        "{}",
        describe(&output)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_send_attaches_images_and_refuses_what_is_not_one() {
    let rig = Rig::start();
    let id = rig.new_conversation(&[]);
    let image = image::RgbImage::from_fn(8, 6, |x, y| image::Rgb([x as u8 * 30, y as u8 * 40, 90]));
    let path = rig.site.cwd().join("tiny.png");
    image.save(&path).unwrap();
    let sent = rig.keel(&["send", &id, "what is this?", "--image", "tiny.png"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let log = rig.daemon.log(&id).await;
    let message = log
        .iter()
        .find(|event| event["type"] == "user_message")
        .unwrap();
    assert_eq!(
        message["images"].as_array().map(Vec::len),
        Some(1),
        "{message:#}"
    );
    assert_eq!(message["images"][0]["media_type"], "image/png");

    std::fs::write(rig.site.cwd().join("notes.txt"), "not an image").unwrap();
    let refused = rig.keel(&["send", &id, "and this?", "--image", "notes.txt"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not a PNG, JPEG, GIF or WebP image"),
        "{}",
        describe(&refused)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_answer_gives_a_client_run_tool_its_output() {
    let rig = Rig::start();
    let id = rig.new_conversation(&["--tool", "bash=client"]);
    let sent = rig.keel(&["send", &id, "run: uname"]);
    assert_eq!(sent.status.code(), Some(5), "{}", describe(&sent));
    let detail = rig.json(&["inspect", &id]);
    let pending = &detail["conversation"]["pending"][0];
    assert_eq!(pending["kind"], "client_exec");
    let call = pending["tool_call_id"].as_str().unwrap().to_owned();
    let stdout = String::from_utf8_lossy(&sent.stdout);
    assert!(
        stdout.contains(&format!("keel answer {id} {call} TEXT")),
        "{stdout}"
    );

    let answered = rig.json(&["answer", &id, &call, "Plan 9"]);
    assert_eq!(
        answered,
        json!({"tool_call_id": call, "decision": "answer"})
    );
    let log = rig.daemon.wait_turn_done(&id, 1).await;
    let result = log
        .iter()
        .find(|event| event["type"] == "tool_result")
        .unwrap();
    assert_eq!(result["content"], "Plan 9", "{result:#}");
}

/// `keel log --follow` prints the log, then each new event as it is
/// stored; piped, its output has no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_log_follows_new_events() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;

    let rig = Rig::start();
    let id = rig.new_conversation(&[]);
    let mut follower = KillOnDrop::new(
        rig.command(&["log", &id, "--follow"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = follower.stdout();
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let wait_for = |needle: &str| {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = received
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("keel log --follow never printed {needle:?}"));
            assert!(!line.contains('\u{1b}'), "no colour in a pipe: {line:?}");
            if line.contains(needle) {
                return line;
            }
        }
    };
    wait_for("created");
    rig.daemon.send(&id, "followed message").await;
    let line = wait_for("user_message");
    assert!(line.contains("followed message"), "{line}");
    wait_for("turn_completed");
}

/// A child that may follow forever, killed whatever way the test ends.
struct KillOnDrop(Option<std::process::Child>);

impl KillOnDrop {
    fn new(child: std::process::Child) -> KillOnDrop {
        KillOnDrop(Some(child))
    }

    fn stdout(&mut self) -> std::process::ChildStdout {
        self.0
            .as_mut()
            .and_then(|child| child.stdout.take())
            .unwrap()
    }

    /// Waits for it to end on its own; what it printed.
    fn finish(mut self) -> std::process::Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A turn cancelled while `keel send` follows it: send exits 4, and says
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_send_exits_4_when_the_turn_is_interrupted() {
    let rig = Rig::start();
    let id = rig.new_conversation(&[]);
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20", "drip_ms": 500}]))
        .await;
    let sender = KillOnDrop::new(
        rig.command(&["send", &id, "talk slowly"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    rig.daemon.wait_state(&id, "streaming").await;
    assert_eq!(rig.ok(&["cancel", &id]).trim(), format!("{id} is idle"));
    let output = tokio::task::spawn_blocking(move || sender.finish())
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("interrupted (cancelled)"),
        "{}",
        describe(&output)
    );
}

#[test]
fn cli_send_help_documents_its_exit_statuses() {
    let output = crate::harness::keel(&["send", "--help"]);
    let help = String::from_utf8_lossy(&output.stdout);
    for line in [
        "0  the turn completed",
        "3  the turn failed",
        "4  the turn was interrupted",
        "5  the turn waits for a decision",
    ] {
        assert!(help.contains(line), "{line:?} in:\n{help}");
    }
}

/// A message queued behind a running turn (`busy_policy = queue`): `keel
/// send` follows the turn the message gets, not the one running when it
/// was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_send_of_a_queued_message_follows_its_own_turn() {
    let rig = Rig::start();
    let id = rig.new_conversation(&["--busy-policy", "queue"]);
    rig.mock
        .push_script(
            json!([{"endpoint": "anthropic", "text": "w1 w2 w3 w4 w5 w6", "drip_ms": 200}]),
        )
        .await;
    rig.daemon.send(&id, "first").await;
    rig.daemon.wait_state(&id, "streaming").await;
    let sent = rig.keel(&["send", &id, "the queued one"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let stdout = String::from_utf8_lossy(&sent.stdout);
    assert!(
        stdout.trim_end().ends_with("the queued one"),
        "the echo of the queued message, at the end: {stdout}"
    );
    let log = rig.daemon.log(&id).await;
    let completed = log
        .iter()
        .filter(|event| event["type"] == "turn_completed")
        .count();
    assert_eq!(
        completed, 2,
        "both turns ran before send returned: {log:#?}"
    );
}

/// `keel compact`, `keel fork` and `keel rewind` (docs/history.md), in
/// both output modes, and `keel inspect` showing the latest compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_compact_fork_and_rewind() {
    let rig = Rig::start();
    let id = rig.new_conversation(&[]);
    rig.ok(&["send", &id, "remember the word apple"]);
    rig.ok(&["send", &id, "remember the word banana"]);
    rig.ok(&["send", &id, "remember the word cherry"]);
    let log = rig.daemon.log(&id).await;
    let ends: Vec<u64> = crate::daemon::of_kind(&log, "turn_completed")
        .iter()
        .filter_map(|event| event["seq"].as_u64())
        .collect();
    assert_eq!(ends.len(), 3, "{log:#?}");

    let forked = rig.ok(&["fork", &id, "--at", &ends[0].to_string()]);
    let fork = forked
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(
        forked.contains(&format!("forked from {id} at seq {}", ends[0])),
        "{forked}"
    );
    let fork_log = rig.daemon.log(&fork).await;
    assert_eq!(fork_log.len() as u64, ends[0]);
    let as_json = rig.json(&["fork", &id]);
    assert_eq!(as_json["forked_from"]["seq"], log.len() as u64);
    let inside = rig.keel(&["fork", &id, "--at", &(ends[0] + 2).to_string()]);
    assert_eq!(inside.status.code(), Some(1), "{}", describe(&inside));
    let said = String::from_utf8_lossy(&inside.stderr);
    assert!(said.contains("turn boundary"), "{said}");

    let compacted = rig.ok(&["compact", &id]);
    assert!(
        compacted.starts_with(&format!("compacted {id}: ")),
        "{compacted}"
    );
    let inspected = rig.ok(&["inspect", &id]);
    assert!(inspected.contains("last compaction"), "{inspected}");
    let detail = rig.json(&["inspect", &id]);
    let last = &detail["conversation"]["last_compaction"];
    assert!(
        last["tokens_after"].as_u64() < last["tokens_before"].as_u64(),
        "{detail}"
    );

    let rewound = rig.ok(&["rewind", &id, "--to", &ends[1].to_string()]);
    assert_eq!(
        rewound.trim(),
        format!("rewound {id} to seq {}; it is idle", ends[1])
    );
    let again = rig.json(&["rewind", &id, "--to", &ends[0].to_string()]);
    assert_eq!(again, json!({"to_seq": ends[0], "state": "idle"}));
    let refused = rig.keel(&["rewind", &id, "--to", "100000"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    let nothing = rig.keel(&["compact", &fork]);
    assert_eq!(nothing.status.code(), Some(1), "{}", describe(&nothing));
    let said = String::from_utf8_lossy(&nothing.stderr);
    assert!(said.contains("nothing to compact"), "{said}");
}

/// A reader that stops early (`keel log ID | head`) ends the command
/// quietly, as it ends `ls` or `cat`: no panic on a closed pipe, success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_a_table_quietly() {
    let rig = Rig::start();
    let id = rig.new_conversation(&[]);
    for args in [vec!["ls"], vec!["log", id.as_str()]] {
        let (reader, writer) = std::io::pipe().unwrap();
        // Closed before keel writes: its first line meets a broken pipe.
        drop(reader);
        let output = rig.command(&args).stdout(writer).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "keel {args:?}: {}",
            describe(&output)
        );
        assert!(!stderr.contains("panicked"), "keel {args:?}: {stderr}");
    }
}
