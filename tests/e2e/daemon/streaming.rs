//! A whole turn over HTTP and SSE, in both wire formats: the snapshot
//! first, canonical frames numbered by seq without a gap, live deltas,
//! state changes and a real `bash` call's output; and resuming a stream
//! with `Last-Event-ID` or `?from=`, which misses nothing and doubles
//! nothing.

use serde_json::json;

use super::sse::{canonical, SseFrame};
use super::{assistant_texts, mock_requests, seqs, Daemon, Resume, Site, Wire};
use crate::harness::MockLlm;

/// The first frame of a stream: the snapshot, with no `id`; returns its
/// `last_seq`.
pub async fn expect_snapshot(stream: &mut super::sse::EventStream, id: &str) -> u64 {
    let first = stream.next().await.expect("a first frame");
    assert_eq!(
        first.event, "snapshot",
        "the snapshot comes first: {first:?}"
    );
    assert_eq!(first.id, None, "a snapshot has no id: {first:?}");
    let snapshot = first.json();
    assert_eq!(snapshot["id"], id);
    snapshot["last_seq"].as_u64().expect("last_seq")
}

/// The states of the `state_changed` frames, in order.
fn states(frames: &[SseFrame]) -> Vec<String> {
    frames
        .iter()
        .filter(|frame| frame.is_live("state_changed"))
        .map(|frame| frame.json()["state"].as_str().unwrap().to_owned())
        .collect()
}

async fn a_turn_with_a_bash_call(wire: Wire) {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, wire, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let mut stream = daemon.events(&id, Resume::Now).await;
    let start = expect_snapshot(&mut stream, &id).await;
    assert!(start >= 1, "a new conversation's log holds its creation");

    let endpoint = wire.endpoint();
    mock.push_script(json!([
        {"endpoint": endpoint, "text": "Let me look.",
         "tool_calls": [{"name": "bash", "input": {"command": "echo e2e-tool-says-hi"}}]},
        {"endpoint": endpoint, "text": "The tool said hi, all done."},
    ]))
    .await;
    let message_seq = daemon.send(&id, "run the tool please").await;
    assert_eq!(message_seq, start + 1, "the message follows the snapshot");

    let (mut completed, mut state) = (false, String::new());
    let frames = stream
        .until("the turn completed and the conversation idle", |frame| {
            if frame.is_canonical_of("turn_completed") {
                completed = true;
            }
            if frame.is_live("state_changed") {
                state = frame.json()["state"].as_str().unwrap().to_owned();
            }
            completed && state == "idle"
        })
        .await;

    // Canonical frames: id = seq, from right after the snapshot, no gap;
    // live frames carry no id.
    let canonical = canonical(&frames);
    let canonical_seqs: Vec<u64> = canonical.iter().map(|frame| frame.seq()).collect();
    let expected: Vec<u64> = (start + 1..=start + canonical_seqs.len() as u64).collect();
    assert_eq!(
        canonical_seqs, expected,
        "canonical seqs follow on without a gap"
    );
    for frame in &frames {
        match frame.event.as_str() {
            "canonical" => {}
            "live" => assert_eq!(frame.id, None, "a live frame has no id: {frame:?}"),
            other => panic!("unexpected {other} frame mid-stream: {frame:?}"),
        }
    }
    let kinds: Vec<String> = canonical.iter().map(|frame| frame.kind()).collect();
    assert_eq!(
        kinds,
        [
            "user_message",
            "turn_started",
            "assistant_message",
            "tool_result",
            "assistant_message",
            "turn_completed"
        ],
        "{wire:?}"
    );

    // The call, its live output while it ran, and its result.
    let call = canonical[2].json()["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|block| block["type"] == "tool_use")
        .cloned()
        .expect("the first answer calls a tool");
    assert_eq!(call["name"], "bash");
    let call_id = call["id"].as_str().unwrap();
    let output_at = frames
        .iter()
        .position(|frame| {
            frame.is_live("tool_output")
                && frame.json()["tool_call_id"] == call_id
                && frame.json()["chunk"]
                    .as_str()
                    .unwrap()
                    .contains("e2e-tool-says-hi")
        })
        .unwrap_or_else(|| panic!("a live tool_output frame with the output: {frames:#?}"));
    let result_at = frames
        .iter()
        .position(|frame| frame.is_canonical_of("tool_result"))
        .unwrap();
    assert!(
        output_at < result_at,
        "the output streamed before the result"
    );
    let result = frames[result_at].json();
    assert_eq!(result["tool_call_id"], call_id);
    assert_eq!(result["is_error"], false);
    assert_eq!(result["synthetic"], false);
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("e2e-tool-says-hi"),
        "{result}"
    );

    // Text streamed live, as deltas, and the states it went through.
    let deltas: String = frames
        .iter()
        .filter(|frame| frame.is_live("text_delta"))
        .map(|frame| frame.json()["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, "Let me look.The tool said hi, all done.");
    let states = states(&frames);
    assert_eq!(
        states.first().map(String::as_str),
        Some("streaming"),
        "{states:?}"
    );
    assert!(
        states.iter().any(|state| state == "executing_tools"),
        "{states:?}"
    );
    assert_eq!(
        states.last().map(String::as_str),
        Some("idle"),
        "{states:?}"
    );

    // The stream and the log agree, event for event.
    let log = daemon.log(&id).await;
    seqs(&log);
    let from_stream: Vec<serde_json::Value> = canonical.iter().map(|frame| frame.json()).collect();
    assert_eq!(from_stream, log[start as usize..].to_vec());
    assert_eq!(
        assistant_texts(&log),
        ["Let me look.", "The tool said hi, all done."]
    );
    assert_eq!(daemon.conversation(&id).await["state"], "idle");

    // Both requests went out in this wire format; the second carried the
    // tool's result.
    let requests = mock_requests(&mock, 2).await;
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(request["endpoint"], endpoint, "{request:#}");
    }
    assert!(requests[1]["body"].to_string().contains("e2e-tool-says-hi"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_streams_a_turn_with_a_bash_call_anthropic() {
    a_turn_with_a_bash_call(Wire::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_streams_a_turn_with_a_bash_call_openai() {
    a_turn_with_a_bash_call(Wire::OpenAi).await;
}

/// Read part of a turn from seq 1, disconnect, let events happen, then
/// reconnect the way `reconnect` says from the last seq seen: the seqs of
/// both connections are exactly those of the log, and so are the events.
async fn resumed(wire: Wire, reconnect: fn(u64) -> Resume) {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, wire, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let endpoint = wire.endpoint();
    mock.push_script(json!([
        {"endpoint": endpoint,
         "tool_calls": [{"name": "bash", "input": {"command": "echo resumed"}}]},
        {"endpoint": endpoint, "text": "one two three four five six seven eight nine ten",
         "drip_ms": 50},
    ]))
    .await;

    let mut first = daemon.events(&id, Resume::From(1)).await;
    expect_snapshot(&mut first, &id).await;
    daemon.send(&id, "go").await;
    let frames = first
        .until("the tool's result", |frame| {
            frame.is_canonical_of("tool_result")
        })
        .await;
    let mut received: Vec<u64> = canonical(&frames).iter().map(|frame| frame.seq()).collect();
    let mut events: Vec<serde_json::Value> = canonical(&frames)
        .iter()
        .map(|frame| frame.json())
        .collect();
    let last_seen = *received.last().unwrap();
    drop(first);

    // The conversation goes on while nobody listens.
    daemon
        .wait_for(&id, "events after the disconnect", |conversation| {
            conversation["last_seq"].as_u64().unwrap() > last_seen
        })
        .await;
    let mut second = daemon.events(&id, reconnect(last_seen)).await;
    expect_snapshot(&mut second, &id).await;
    let log = daemon.wait_turn_done(&id, 1).await;
    let last = *seqs(&log).last().unwrap();
    let frames = second
        .until("the log's last event", |frame| {
            frame.is_canonical() && frame.seq() == last
        })
        .await;
    received.extend(canonical(&frames).iter().map(|frame| frame.seq()));
    events.extend(canonical(&frames).iter().map(|frame| frame.json()));

    assert_eq!(
        received,
        (1..=last).collect::<Vec<u64>>(),
        "every seq once, in order, across both connections"
    );
    assert_eq!(events, log, "the frames are the log's events");
    assert!(
        log.iter().any(|event| event["type"] == "turn_completed"),
        "{log:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_stream_resumes_after_last_event_id_without_gap_or_double() {
    resumed(Wire::Anthropic, Resume::LastEventId).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_stream_resumes_from_a_seq_without_gap_or_double() {
    resumed(Wire::OpenAi, |seen| Resume::From(seen + 1)).await;
}

/// `Last-Event-ID: 18446744073709551615` (u64::MAX, which has no next
/// seq) used to overflow in the handler. It is past the log's end like any
/// seq beyond it: the client missed nothing, so nothing is replayed and the
/// stream goes on with the next event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_stream_takes_the_largest_last_event_id_as_nothing_missed() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "hello").await;
    let mut log = daemon.wait_turn_done(&id, 1).await;

    for (turn, resume) in [
        (2, Resume::LastEventId(u64::MAX)),
        (3, Resume::From(u64::MAX)),
    ] {
        let last = *seqs(&log).last().unwrap();
        let mut stream = daemon.events(&id, resume).await;
        assert_eq!(expect_snapshot(&mut stream, &id).await, last);
        daemon.send(&id, "again").await;
        let next = stream
            .until("the next canonical event", SseFrame::is_canonical)
            .await;
        assert_eq!(
            canonical(&next)[0].seq(),
            last + 1,
            "nothing was replayed: the stream went on from the log's end"
        );
        drop(stream);
        log = daemon.wait_turn_done(&id, turn).await;
    }
}

/// Frames until the turn completed and the conversation is idle again.
async fn until_idle(stream: &mut super::sse::EventStream) -> Vec<SseFrame> {
    let (mut completed, mut state) = (false, String::new());
    stream
        .until("the turn completed and the conversation idle", |frame| {
            completed |= frame.is_canonical_of("turn_completed");
            if frame.is_live("state_changed") {
                state = frame.json()["state"].as_str().unwrap().to_owned();
            }
            completed && state == "idle"
        })
        .await
}

/// A frame's bytes as text, for assertions that show them.
fn raw(frame: &SseFrame) -> &str {
    std::str::from_utf8(&frame.raw).expect("SSE is UTF-8")
}

/// The daemon renders each published event once and sends those bytes to
/// every subscriber of the conversation. Two subscribers therefore get
/// byte-identical frames, each in the one format: `event`, then `id` (the
/// seq) on canonical frames only, then one `data` line. A third that
/// resumes from the log afterwards (frames rendered for it alone) gets
/// the same canonical bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_subscribers_of_a_conversation_get_byte_identical_frames() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let mut first = daemon.events(&id, Resume::Now).await;
    let mut second = daemon.events(&id, Resume::Now).await;
    let start = expect_snapshot(&mut first, &id).await;
    assert_eq!(expect_snapshot(&mut second, &id).await, start);

    mock.push_script(json!([
        {"endpoint": "anthropic", "text": "Looking.",
         "tool_calls": [{"name": "bash", "input": {"command": "echo same-bytes-for-all"}}]},
        {"endpoint": "anthropic", "text": "Done."},
    ]))
    .await;
    daemon.send(&id, "run it").await;
    let frames = until_idle(&mut first).await;
    let others = until_idle(&mut second).await;

    let bytes = |frames: &[SseFrame]| -> Vec<Vec<u8>> {
        frames.iter().map(|frame| frame.raw.clone()).collect()
    };
    assert_eq!(
        bytes(&frames),
        bytes(&others),
        "both subscribers got the same bytes"
    );
    assert!(frames.iter().any(|frame| frame.is_live("tool_output")));
    for frame in &frames {
        let expected = match frame.event.as_str() {
            "canonical" => format!(
                "event: canonical\nid: {}\ndata: {}\n\n",
                frame.seq(),
                frame.data
            ),
            "live" => format!("event: live\ndata: {}\n\n", frame.data),
            other => panic!("unexpected {other} frame mid-stream: {}", raw(frame)),
        };
        assert_eq!(raw(frame), expected);
    }

    let mut resumed = daemon.events(&id, Resume::From(start + 1)).await;
    expect_snapshot(&mut resumed, &id).await;
    let replayed = resumed
        .until("the turn's end, from the log", |frame| {
            frame.is_canonical_of("turn_completed")
        })
        .await;
    let live_canonical: Vec<&SseFrame> = canonical(&frames);
    assert_eq!(
        canonical(&replayed)
            .iter()
            .map(|frame| raw(frame))
            .collect::<Vec<_>>(),
        live_canonical
            .iter()
            .map(|frame| raw(frame))
            .collect::<Vec<_>>(),
        "frames read from the log are the same bytes as the live ones"
    );
}
