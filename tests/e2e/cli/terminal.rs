//! The CLI through a pseudo-terminal (expectrl), as a person sees it.
//! `keel chat`: type a message and see the reply stream, approve a tool
//! call at the inline question, press Ctrl-C mid-turn (the turn is
//! cancelled, the conversation comes to rest idle, the session goes on),
//! then Ctrl-C twice at the prompt to leave; and a session that rides out
//! a daemon restart. Colour: on a terminal, unless `NO_COLOR` is set.
//! Every step waits for what the terminal shows, bounded by `PATIENCE`.

use std::process::Stdio;

use expectrl::process::unix::WaitStatus;
use expectrl::session::OsSession;
use expectrl::{ControlCode, Eof, Expect, Session};
use serde_json::json;

use super::{addr_of, command_for, free_port, Rig};
use crate::daemon::{of_kind, Daemon, Site, Wire, PATIENCE};
use crate::harness::MockLlm;

/// Forty words, a quarter of a second apart: ten seconds of streaming,
/// long enough to be interrupted.
const LONG_STORY: &str = "w01 w02 w03 w04 w05 w06 w07 w08 w09 w10 w11 w12 w13 w14 w15 w16 w17 \
     w18 w19 w20 w21 w22 w23 w24 w25 w26 w27 w28 w29 w30 w31 w32 w33 w34 w35 w36 w37 w38 w39 w40";

/// Wait for `needle` on the terminal, failing with what was seen.
fn expect(session: &mut OsSession, needle: &str) {
    if let Err(error) = session.expect(needle) {
        panic!("keel chat never showed {needle:?}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_approves_cancels_and_leaves_on_two_ctrl_c() {
    let rig = Rig::start();
    let id = rig.new_conversation(&["--tool", "bash=approve"]);
    let mut command = rig.command(&["chat", &id]);
    // The pty is its terminal: no stdio of the command's own.
    command
        .env("TERM", "xterm")
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let mut session = Session::spawn(command).unwrap();
    session.set_expect_timeout(Some(PATIENCE));
    expect(&mut session, &format!("conversation {id}"));
    expect(&mut session, "> ");

    // A message: the reply streams in.
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": "a reply streamed to the terminal"}]))
        .await;
    session.send_line("hello").unwrap();
    expect(&mut session, "a reply streamed to the terminal");
    expect(&mut session, "> ");

    // A tool call that waits: asked inline, approved with `y`.
    session
        .send_line("run: echo approved-in-chat > approved.txt")
        .unwrap();
    expect(
        &mut session,
        "bash wants to run: echo approved-in-chat > approved.txt",
    );
    expect(&mut session, "approve? [y/n]");
    session.send_line("y").unwrap();
    expect(&mut session, "The command printed");
    expect(&mut session, "> ");
    let written = std::fs::read_to_string(rig.site.cwd().join("approved.txt")).unwrap();
    assert_eq!(written, "approved-in-chat\n");

    // Ctrl-C mid-turn: cancelled, idle, and the session goes on.
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": LONG_STORY, "drip_ms": 250}]))
        .await;
    session.send_line("tell me a long story").unwrap();
    expect(&mut session, "w02");
    session.send(ControlCode::EndOfText).unwrap();
    expect(&mut session, "interrupted (cancelled)");
    expect(&mut session, "> ");
    assert_eq!(rig.daemon.conversation(&id).await["state"], "idle");
    let log = rig.daemon.log(&id).await;
    let interrupted = of_kind(&log, "turn_interrupted");
    assert_eq!(interrupted.len(), 1, "{log:#?}");
    assert_eq!(interrupted[0]["reason"], "cancelled");

    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": "still here after the cancel"}]))
        .await;
    session.send_line("are you there?").unwrap();
    expect(&mut session, "still here after the cancel");
    expect(&mut session, "> ");

    // Ctrl-C at the prompt warns; a second one leaves, with status 0.
    session.send(ControlCode::EndOfText).unwrap();
    expect(&mut session, "Ctrl-C again");
    // The prompt is drawn once the terminal is raw again: a Ctrl-C before
    // it would be a signal, not a key.
    expect(&mut session, "> ");
    session.send(ControlCode::EndOfText).unwrap();
    session.expect(Eof).unwrap();
    let status = session.get_process().wait().unwrap();
    assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
}

/// The daemon stops and starts again on the same address while a chat
/// session is open: a message typed meanwhile is refused with the error
/// that says so, the session goes on, and once the daemon is back the
/// next turn streams over a resumed event stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_rides_out_a_daemon_restart() {
    let mock = MockLlm::start();
    let site = Site::new();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut env = Wire::Anthropic.env(&mock);
    env.push(("KEEL_ADDR".to_owned(), addr.clone()));
    let mut daemon = Daemon::start_with(&site, env);
    let mut command = command_for(&daemon, &site, &["chat"]);
    command
        .env("TERM", "xterm")
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let mut session = Session::spawn(command).unwrap();
    session.set_expect_timeout(Some(PATIENCE));
    expect(&mut session, "conversation ");
    expect(&mut session, "> ");
    session.send_line("before the restart").unwrap();
    expect(&mut session, "before the restart\r\n");
    expect(&mut session, "> ");

    daemon.sigterm();
    daemon.wait_exit();
    session.send_line("anyone?").unwrap();
    expect(
        &mut session,
        &format!("no daemon at {addr}: start one with `keel serve`"),
    );
    expect(&mut session, "> ");

    let daemon = daemon.restart();
    assert_eq!(addr_of(&daemon), addr);
    mock.push_script(json!([{"endpoint": "anthropic", "text": "back after the restart"}]))
        .await;
    session.send_line("are you back?").unwrap();
    expect(&mut session, "reconnecting");
    expect(&mut session, "back after the restart");
    expect(&mut session, "> ");
    session.send(ControlCode::EndOfTransmission).unwrap();
    session.expect(Eof).unwrap();
}

/// What `keel log` prints on a terminal: colour, unless `NO_COLOR` is set.
/// (In a pipe there is none: `commands::cli_log_follows_new_events`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colour_only_on_a_terminal_without_no_color() {
    let rig = Rig::start();
    let id = rig.new_conversation(&[]);
    let on_a_terminal = |no_color: Option<&str>| -> String {
        let mut command = rig.command(&["log", &id]);
        command
            .env("TERM", "xterm")
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        if let Some(value) = no_color {
            command.env("NO_COLOR", value);
        }
        let mut session = Session::spawn(command).unwrap();
        session.set_expect_timeout(Some(PATIENCE));
        let printed = session.expect(Eof).unwrap();
        // Eof's match is everything printed.
        String::from_utf8_lossy(printed.get(0).unwrap_or_default()).into_owned()
    };
    let coloured = on_a_terminal(None);
    assert!(coloured.contains("created"), "{coloured:?}");
    assert!(
        coloured.contains("\u{1b}["),
        "colour on a terminal: {coloured:?}"
    );
    let plain = on_a_terminal(Some("1"));
    assert!(plain.contains("created"), "{plain:?}");
    assert!(!plain.contains("\u{1b}["), "NO_COLOR: {plain:?}");
}

/// A chat opened on a conversation whose client-run call already waits
/// asks for the answer at once; the answer becomes the tool's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_asks_for_a_pending_answer_when_it_opens() {
    let rig = Rig::start();
    let id = rig.new_conversation(&["--tool", "bash=client"]);
    let sent = rig.keel(&["send", &id, "run: hostname"]);
    assert_eq!(sent.status.code(), Some(5), "{}", super::describe(&sent));

    let mut command = rig.command(&["chat", &id]);
    command
        .env("TERM", "xterm")
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let mut session = Session::spawn(command).unwrap();
    session.set_expect_timeout(Some(PATIENCE));
    expect(&mut session, "bash wants to run: hostname");
    expect(&mut session, "answer (empty to deny): ");
    session.send_line("answered-from-chat").unwrap();
    expect(&mut session, "The command printed: answered-from-chat");
    expect(&mut session, "> ");
    let log = rig.daemon.log(&id).await;
    let results = of_kind(&log, "tool_result");
    assert_eq!(results.len(), 1, "{log:#?}");
    assert_eq!(results[0]["content"], "answered-from-chat");
    session.send(ControlCode::EndOfTransmission).unwrap();
    session.expect(Eof).unwrap();
}
