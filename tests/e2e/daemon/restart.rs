//! Stopping the daemon mid-turn and starting it again on the same data
//! dir. SIGTERM is a graceful stop (docs/requirements.md, "Graceful stop"):
//! a turn that finishes within `KEEL_SHUTDOWN_GRACE_MS` completes, a longer
//! one is interrupted with reason `shutdown`; either way every session
//! ends, the daemon exits 0 and nothing is sent to the provider twice.
//! SIGKILL is a crash: the next start re-runs the turn in flight (the
//! default `resume` recovery) and the conversation ends idle with its
//! reply.

use serde_json::{json, Value};

use super::streaming::expect_snapshot;
use super::{
    assistant_texts, kind, last_user_text, mock_requests, of_kind, seqs, Daemon, Resume, Site, Wire,
};
use crate::harness::MockLlm;

const TEN_WORDS: &str = "one two three four five six seven eight nine ten";

/// Forty words: ten seconds at 250 ms a word.
const FORTY_WORDS: &str = "w01 w02 w03 w04 w05 w06 w07 w08 w09 w10 w11 w12 w13 w14 w15 w16 \
     w17 w18 w19 w20 w21 w22 w23 w24 w25 w26 w27 w28 w29 w30 w31 w32 w33 w34 w35 w36 w37 w38 w39 w40";

/// A conversation on `daemon` streaming `text` from the mock, `drip_ms`
/// a word: returns once a delta has arrived, so the request is out.
async fn streaming(
    daemon: &Daemon,
    site: &Site,
    mock: &MockLlm,
    wire: Wire,
    text: &str,
    drip_ms: u64,
) -> (String, super::sse::EventStream) {
    let id = daemon.create(site, json!({})).await;
    let mut stream = daemon.events(&id, Resume::Now).await;
    expect_snapshot(&mut stream, &id).await;
    mock.push_script(json!([{"endpoint": wire.endpoint(), "text": text, "drip_ms": drip_ms}]))
        .await;
    daemon.send(&id, "talk slowly").await;
    stream
        .until("a text delta", |frame| frame.is_live("text_delta"))
        .await;
    (id, stream)
}

/// The position of each event of `wanted` kind in the log.
fn positions(log: &[Value], wanted: &str) -> Vec<usize> {
    log.iter()
        .enumerate()
        .filter(|(_, event)| kind(event) == wanted)
        .map(|(position, _)| position)
        .collect()
}

/// After the restart: a message wakes the conversation (a new session)
/// and gets its answer; then the log's sessions alternate, the first one
/// ended before the restart's began, and the provider saw `expected`
/// requests in all: nothing was sent twice.
async fn after_a_graceful_restart(
    daemon: &Daemon,
    mock: &MockLlm,
    id: &str,
    expected: usize,
) -> Vec<Value> {
    daemon.send(id, "are you back?").await;
    let log = daemon.wait_turn_done(id, 2).await;
    seqs(&log);
    // The mock echoes the last user turn (with an interrupted turn's
    // message, if any, before it).
    let echo = assistant_texts(&log).last().cloned().unwrap();
    assert!(echo.ends_with("are you back?"), "{echo:?}");
    let started = positions(&log, "session_started");
    let ended = positions(&log, "session_ended");
    assert_eq!(started.len(), 2, "{log:#?}");
    assert_eq!(ended.len(), 1, "{log:#?}");
    assert!(started[0] < ended[0] && ended[0] < started[1], "{log:#?}");
    assert_eq!(
        ended[0] + 1,
        started[1],
        "nothing between the stop and the restart: {log:#?}"
    );
    let requests = mock.wait_ended(expected).await;
    assert_eq!(requests.len(), expected, "{requests:#?}");
    let first_turn = requests
        .iter()
        .filter(|request| last_user_text(request) == "talk slowly")
        .count();
    assert_eq!(
        first_turn, 1,
        "the first turn's request went out once: {requests:#?}"
    );
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_sigterm_lets_a_turn_finish_within_the_grace_then_restarts_clean() {
    let mock = MockLlm::start();
    let site = Site::new();
    let wire = Wire::Anthropic;
    // The default grace (10 s) is plenty for a one-second answer.
    let mut daemon = Daemon::start(&site, wire, &mock, &[]);
    let (id, mut stream) = streaming(&daemon, &site, &mock, wire, TEN_WORDS, 100).await;

    daemon.sigterm();
    stream.until_end().await;
    let status = daemon.wait_exit();
    assert_eq!(
        status.code(),
        Some(0),
        "a graceful stop exits 0\n{}",
        daemon.output()
    );
    assert!(
        daemon.stdout().iter().any(|line| line == "keel stopped"),
        "{:?}",
        daemon.stdout()
    );
    let ended = mock.wait_ended(1).await;
    assert_eq!(
        ended[0]["outcome"], "completed",
        "the answer was read whole"
    );

    let daemon = daemon.restart();
    let conversation = daemon.conversation(&id).await;
    assert_eq!(conversation["state"], "idle", "{conversation:#}");
    let log = daemon.log(&id).await;
    assert_eq!(kind(log.last().unwrap()), "session_ended", "{log:#?}");
    assert_eq!(
        of_kind(&log, "turn_completed").len(),
        1,
        "the turn finished: {log:#?}"
    );
    assert!(of_kind(&log, "turn_interrupted").is_empty(), "{log:#?}");
    assert_eq!(assistant_texts(&log), [TEN_WORDS]);
    assert!(
        of_kind(&log, "recovered").is_empty(),
        "nothing to recover: {log:#?}"
    );

    let log = after_a_graceful_restart(&daemon, &mock, &id, 2).await;
    assert!(of_kind(&log, "recovered").is_empty(), "{log:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_sigterm_interrupts_a_turn_past_the_grace_then_restarts_clean() {
    let mock = MockLlm::start();
    let site = Site::new();
    let wire = Wire::OpenAi;
    let mut daemon = Daemon::start(&site, wire, &mock, &[("KEEL_SHUTDOWN_GRACE_MS", "300")]);
    let (id, mut stream) = streaming(&daemon, &site, &mock, wire, FORTY_WORDS, 250).await;

    daemon.sigterm();
    stream.until_end().await;
    let status = daemon.wait_exit();
    assert_eq!(
        status.code(),
        Some(0),
        "a graceful stop exits 0\n{}",
        daemon.output()
    );
    let ended = mock.wait_ended(1).await;
    assert_eq!(
        ended[0]["outcome"], "disconnected",
        "the request was closed"
    );

    let daemon = daemon.restart();
    let log = daemon.log(&id).await;
    assert_eq!(kind(log.last().unwrap()), "session_ended", "{log:#?}");
    let interrupted = of_kind(&log, "turn_interrupted");
    assert_eq!(interrupted.len(), 1, "{log:#?}");
    assert_eq!(interrupted[0]["reason"], "shutdown");
    assert!(of_kind(&log, "turn_completed").is_empty(), "{log:#?}");
    assert_eq!(daemon.conversation(&id).await["state"], "idle");

    // Interrupted, and still not sent again: the log says the turn ended.
    let log = after_a_graceful_restart(&daemon, &mock, &id, 2).await;
    assert!(of_kind(&log, "recovered").is_empty(), "{log:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_sigkill_mid_turn_recovers_and_reruns_the_turn() {
    let mock = MockLlm::start();
    let site = Site::new();
    let wire = Wire::Anthropic;
    let mut daemon = Daemon::start(&site, wire, &mock, &[]);
    let (id, stream) = streaming(&daemon, &site, &mock, wire, FORTY_WORDS, 250).await;

    daemon.sigkill();
    let status = daemon.wait_exit();
    assert!(!status.success(), "{status:?}");
    drop(stream);
    let ended = mock.wait_ended(1).await;
    assert_eq!(ended[0]["outcome"], "disconnected");
    // The re-run gets the mock's default answer: the message echoed.
    let daemon = daemon.restart();
    let log = daemon.wait_turn_done(&id, 1).await;
    seqs(&log);
    assert_eq!(daemon.conversation(&id).await["state"], "idle");
    assert_eq!(assistant_texts(&log), ["talk slowly"], "{log:#?}");
    let recovered = of_kind(&log, "recovered");
    assert_eq!(recovered.len(), 1, "{log:#?}");
    assert_eq!(recovered[0]["action"], "rerun_request");
    assert_eq!(of_kind(&log, "turn_completed").len(), 1, "{log:#?}");
    assert!(of_kind(&log, "turn_interrupted").is_empty(), "{log:#?}");
    let recovered_at = positions(&log, "recovered")[0];
    assert!(
        !log[..recovered_at]
            .iter()
            .any(|event| kind(event) == "session_ended"),
        "a crash records no session end: {log:#?}"
    );
    let requests = mock_requests(&mock, 2).await;
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert!(requests
        .iter()
        .all(|request| last_user_text(request) == "talk slowly"));
}
