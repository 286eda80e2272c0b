//! Operating a daemon: `/admin/actors` with its mailbox and memory figures,
//! evict and kill (a crash, for drills) and what they leave behind,
//! `/metrics` after real turns, and the runtime's spans exported over OTLP
//! to a collector when `OTEL_EXPORTER_OTLP_ENDPOINT` says where.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

use super::*;

/// The entry of `id` in `GET /admin/actors`, if listed.
async fn listed(daemon: &Daemon, id: &str) -> Option<Value> {
    let reply = daemon.get("/admin/actors").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["actors"]
        .as_array()
        .expect("an actors array")
        .iter()
        .find(|actor| actor["id"] == id)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_admin_lists_evicts_and_kills_actors() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "run: echo admin").await;
    daemon.wait_turn_done(&id, 1).await;

    let deadline = Instant::now() + PATIENCE;
    let actor = loop {
        let actor = listed(&daemon, &id)
            .await
            .expect("the live actor is listed");
        if actor["mailbox"] == 0 || Instant::now() > deadline {
            break actor;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(actor["state"], "idle", "{actor}");
    assert_eq!(actor["responding"], true, "{actor}");
    assert_eq!(actor["mailbox"], 0, "nothing waits at rest: {actor}");
    assert!(actor["memory_bytes"].as_u64().unwrap() > 0, "{actor}");
    assert_eq!(actor["subscribers"], 0, "{actor}");
    assert!(actor["idle_ms"].is_u64(), "{actor}");

    // Evict: the actor stops, the conversation stays whole in the store.
    let before = daemon.log(&id).await;
    let evicted = daemon
        .post(&format!("/admin/actors/{id}/evict"), &json!({}))
        .await;
    assert_eq!(evicted.status, StatusCode::OK, "{evicted:?}");
    assert_eq!(evicted.body, json!({"id": id, "was_live": true}));
    assert_eq!(
        listed(&daemon, &id).await,
        None,
        "evicted actors are not listed"
    );
    let after = daemon.log(&id).await;
    assert_eq!(after[..before.len()], before[..]);
    let ended: Vec<&str> = after[before.len()..].iter().map(kind).collect();
    assert_eq!(
        ended,
        ["session_ended"],
        "an eviction ends the session, and only that"
    );
    let again = daemon
        .post(&format!("/admin/actors/{id}/evict"), &json!({}))
        .await;
    assert_eq!(again.body, json!({"id": id, "was_live": false}));

    // The next message brings it back from the store and it goes on.
    daemon.send(&id, "after the eviction").await;
    daemon.wait_turn_done(&id, 2).await;

    // Kill crashes the actor; its supervisor starts it again from the log,
    // which the crash does not touch, and the next turn works.
    let before = daemon.log(&id).await;
    let killed = daemon
        .post(&format!("/admin/actors/{id}/kill"), &json!({}))
        .await;
    assert_eq!(killed.status, StatusCode::ACCEPTED, "{killed:?}");
    assert_eq!(killed.body, json!({"id": id}));
    daemon.send(&id, "after the crash").await;
    let after = daemon.wait_turn_done(&id, 3).await;
    assert_eq!(
        after[..before.len()],
        before[..],
        "the crash changed no event"
    );
    assert_eq!(seqs(&after), (1..=after.len() as u64).collect::<Vec<_>>());

    for route in ["evict", "kill"] {
        let unknown = daemon
            .post(
                &format!("/admin/actors/c-0000000000000000000000000/{route}"),
                &json!({}),
            )
            .await;
        unknown.error(StatusCode::NOT_FOUND);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_an_evicted_conversation_stays_evicted_while_watched_and_cancelled() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "hello").await;
    daemon.wait_turn_done(&id, 1).await;
    let mut stream = daemon.events(&id, Resume::Now).await;
    stream
        .until("the snapshot", |frame| frame.event == "snapshot")
        .await;

    let evicted = daemon
        .post(&format!("/admin/actors/{id}/evict"), &json!({}))
        .await;
    assert_eq!(evicted.body, json!({"id": id, "was_live": true}));
    // The stream tells its client the session ended, and wakes nothing.
    stream
        .until("the session's end", |frame| {
            frame.is_canonical_of("session_ended")
        })
        .await;
    let log = daemon.log(&id).await;
    assert_eq!(kind(log.last().unwrap()), "session_ended");
    assert_eq!(listed(&daemon, &id).await, None, "the stream woke it");
    // Reads and a cancel of nothing touch nothing.
    let read = daemon.conversation(&id).await;
    assert_eq!(read["state"], "idle", "{read}");
    let cancelled = daemon.cancel(&id).await;
    assert_eq!(cancelled.status, StatusCode::ACCEPTED, "{cancelled:?}");
    assert_eq!(listed(&daemon, &id).await, None, "the cancel woke it");
    assert_eq!(daemon.log(&id).await, log, "a cancel of nothing wrote");

    // A message wakes it, and the open stream follows the new life from
    // the next seq it is owed: a fresh snapshot, then the turn.
    let sent = daemon.send(&id, "back again").await;
    let frames = stream
        .until("the second turn's end", |frame| {
            frame.is_canonical() && ends_turn(&frame.json(), 2)
        })
        .await;
    assert!(frames.iter().any(|frame| frame.event == "snapshot"));
    let seqs: Vec<u64> = frames
        .iter()
        .filter(|frame| frame.is_canonical())
        .map(|frame| frame.seq())
        .collect();
    let first = log.len() as u64 + 1;
    assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>());
    assert!(seqs.contains(&sent), "{seqs:?} lacks the message at {sent}");
}

/// The value of the sample `name{labels}` in Prometheus text, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
}

/// The metric families docs/daemon.md documents: the first column of
/// the table under "## Metrics".
fn documented_families() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/daemon.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let section = text
        .split("\n## ")
        .find(|section| section.starts_with("Metrics"))
        .expect("docs/daemon.md has a Metrics section");
    let families: Vec<String> = section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| name.to_owned())
        .collect();
    assert!(families.len() >= 10, "the table was read: {families:?}");
    families
}

/// The daemon's `/metrics` text.
async fn scrape(daemon: &Daemon) -> String {
    let reply = daemon.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body.as_str().expect("Prometheus text").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_metrics_list_every_documented_family_before_the_first_turn_and_count_it() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::OpenAi, &mock, &[]);

    // A fresh daemon: every family documented, each with its help and
    // type, and the series known up front at zero.
    let fresh = scrape(&daemon).await;
    for family in documented_families() {
        // Its series are per MCP server, and this daemon has none
        // (daemon::mcp counts a call).
        if family == "keel_mcp_calls_total" {
            continue;
        }
        assert!(
            fresh.contains(&format!("# TYPE {family} ")),
            "{family} is not listed before the first turn:\n{fresh}"
        );
    }
    let zero = |series: &str| {
        assert_eq!(sample(&fresh, series), Some(0.0), "{series} in:\n{fresh}");
    };
    zero(r#"keel_turns_total{outcome="failed"}"#);
    zero(r#"keel_llm_requests_total{provider="openai",outcome="fallback"}"#);
    zero(r#"keel_tool_runs_total{tool="bash",outcome="error"}"#);
    zero(r#"keel_store_errors_total{op="write"}"#);
    zero(
        r#"keel_http_requests_total{method="POST",route="/v1/conversations/{id}/messages",status="202"}"#,
    );
    zero(
        r#"gen_ai_client_token_usage_count{gen_ai_token_type="output",gen_ai_provider_name="openai"}"#,
    );
    zero("keel_event_streams_open");
    zero("keel_append_seconds_count");

    // A turn with a tool, followed over an event stream.
    let id = daemon.create(&site, json!({})).await;
    let stream = daemon.events(&id, Resume::Now).await;
    daemon.send(&id, "run: echo measured").await;
    daemon.wait_turn_done(&id, 1).await;
    let open = scrape(&daemon).await;
    assert_eq!(
        sample(&open, "keel_event_streams_open"),
        Some(1.0),
        "{open}"
    );
    drop(stream);
    let cancelled = daemon.cancel(&id).await;
    assert_eq!(cancelled.status, StatusCode::ACCEPTED, "{cancelled:?}");
    let deadline = Instant::now() + PATIENCE;
    let text = loop {
        let text = scrape(&daemon).await;
        if sample(&text, "keel_event_streams_open") == Some(0.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the stream is still counted open:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let expect = |series: &str, value: f64| {
        assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
    };
    expect(r#"keel_turns_total{outcome="completed"}"#, 1.0);
    expect(r#"keel_turns_total{outcome="failed"}"#, 0.0);
    expect(r#"keel_tool_runs_total{tool="bash",outcome="ok"}"#, 1.0);
    expect(
        r#"keel_llm_requests_total{provider="openai",outcome="ok"}"#,
        2.0,
    );
    expect("keel_cancels_total", 1.0);
    expect("keel_live_conversations", 1.0);
    expect(r#"keel_store_errors_total{op="write"}"#, 0.0);
    expect(
        r#"keel_http_requests_total{method="POST",route="/v1/conversations",status="201"}"#,
        1.0,
    );
    expect(
        r#"keel_http_requests_total{method="POST",route="/v1/conversations/{id}/messages",status="202"}"#,
        1.0,
    );
    expect(
        r#"keel_http_requests_total{method="GET",route="/v1/conversations/{id}/events",status="200"}"#,
        1.0,
    );
    let metrics_scrapes = sample(
        &text,
        r#"keel_http_requests_total{method="GET",route="/metrics",status="200"}"#,
    )
    .unwrap_or_default();
    assert!(
        metrics_scrapes >= 2.0,
        "earlier scrapes are counted:\n{text}"
    );
    for histogram in [
        "keel_append_seconds_count",
        r#"keel_turn_duration_seconds_count{outcome="completed"}"#,
        r#"keel_llm_time_to_first_token_seconds_count{provider="openai"}"#,
    ] {
        let count = sample(&text, histogram).unwrap_or_else(|| panic!("{histogram} in:\n{text}"));
        assert!(count >= 1.0, "{histogram} = {count}");
    }
    for token_type in ["input", "output"] {
        let series = |part: &str| {
            format!(
                r#"gen_ai_client_token_usage_{part}{{gen_ai_token_type="{token_type}",gen_ai_provider_name="openai"}}"#
            )
        };
        assert_eq!(sample(&text, &series("count")), Some(2.0), "{text}");
        let tokens = sample(&text, &series("sum")).unwrap_or_default();
        assert!(tokens > 0.0, "{token_type} tokens counted:\n{text}");
    }

    // A failed request is counted by what followed it: a retry, the
    // fallback model, or a failed turn.
    let retried = daemon
        .create(
            &site,
            json!({"retry": {"base_delay_ms": 1, "max_delay_ms": 1}}),
        )
        .await;
    mock.push_script(json!([{"endpoint": "openai", "status": 503}]))
        .await;
    daemon.send(&retried, "fails once").await;
    daemon.wait_turn_done(&retried, 1).await;
    let fallback = daemon
        .create(
            &site,
            json!({"retry": {"max_retries": 0}, "fallback": {"provider": "openai", "model": "gpt-mock-b"}}),
        )
        .await;
    mock.push_script(json!([{"endpoint": "openai", "status": 503}]))
        .await;
    daemon.send(&fallback, "the primary fails").await;
    daemon.wait_turn_done(&fallback, 1).await;
    let failed = daemon.create(&site, json!({})).await;
    mock.push_script(json!([{"endpoint": "openai", "status": 400}]))
        .await;
    daemon.send(&failed, "refused for good").await;
    daemon
        .wait_log(&failed, "the turn failed", |event| {
            kind(event) == "turn_failed"
        })
        .await;
    let text = scrape(&daemon).await;
    for (outcome, n) in [
        ("ok", 4.0),
        ("retried", 1.0),
        ("fallback", 1.0),
        ("failed", 1.0),
    ] {
        expect_sample(
            &text,
            &format!(r#"keel_llm_requests_total{{provider="openai",outcome="{outcome}"}}"#),
            n,
        );
    }
    expect_sample(&text, r#"keel_turns_total{outcome="failed"}"#, 1.0);

    // An id in a path is never a label: an unknown one counts under its
    // route's template, and a path no route knows under one value.
    daemon.get("/v1/conversations/nobody-here").await;
    daemon.get("/no/such/route").await;
    let text = scrape(&daemon).await;
    expect_sample(
        &text,
        r#"keel_http_requests_total{method="GET",route="/v1/conversations/{id}",status="404"}"#,
        1.0,
    );
    expect_sample(
        &text,
        r#"keel_http_requests_total{method="GET",route="unmatched",status="404"}"#,
        1.0,
    );
    assert!(!text.contains("nobody-here"), "{text}");
}

fn expect_sample(text: &str, series: &str, value: f64) {
    assert_eq!(sample(text, series), Some(value), "{series} in:\n{text}");
}

/// What the collector received: each request line and its body.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A stand-in OTLP collector: answers every HTTP request 200 and keeps
/// the request lines and bodies.
struct Collector {
    endpoint: String,
    received: Received,
}

impl Collector {
    fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let into = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let into = into.clone();
                std::thread::spawn(move || serve_collector(stream, &into));
            }
        });
        Collector { endpoint, received }
    }

    fn bodies_to(&self, path: &str) -> Vec<Vec<u8>> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|(line, _)| line.contains(path))
            .map(|(_, body)| body.clone())
            .collect()
    }
}

fn serve_collector(stream: std::net::TcpStream, into: &Mutex<Vec<(String, Vec<u8>)>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        into.lock()
            .unwrap()
            .push((request_line.trim_end().to_owned(), body));
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_exports_genai_spans_over_otlp_when_told_where() {
    let collector = Collector::start();
    let mock = MockLlm::start();
    let site = Site::new();
    let mut daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str())],
    );
    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "run: echo traced").await;
    daemon.wait_turn_done(&id, 1).await;
    // A graceful stop flushes the spans still batched.
    daemon.sigterm();
    assert!(daemon.wait_exit().success(), "{}", daemon.output());

    let bodies = collector.bodies_to("/v1/traces");
    assert!(
        !bodies.is_empty(),
        "no POST /v1/traces: {}",
        daemon.output()
    );
    let all: Vec<u8> = bodies.concat();
    for needle in [
        "invoke_agent keel",
        "chat claude-mock",
        "execute_tool bash",
        "gen_ai.operation.name",
        "gen_ai.conversation.id",
        id.as_str(),
    ] {
        assert!(
            contains(&all, needle),
            "{needle:?} not in the exported spans"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_exports_nothing_without_an_otlp_endpoint() {
    let collector = Collector::start();
    let mock = MockLlm::start();
    let site = Site::new();
    // The collector listens, but nothing tells the daemon about it.
    let mut daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "hello").await;
    daemon.wait_turn_done(&id, 1).await;
    daemon.sigterm();
    assert!(daemon.wait_exit().success());
    assert!(collector.received.lock().unwrap().is_empty());
}

/// The listing entry of `id` (`GET /v1/conversations`).
async fn summary(daemon: &Daemon, id: &str) -> Value {
    let reply = daemon.get("/v1/conversations").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["conversations"]
        .as_array()
        .expect("a conversations array")
        .iter()
        .find(|conversation| conversation["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} not listed: {}", reply.body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_lists_conversations_with_state_turns_and_cwd_live_or_not() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let cwd = site.cwd().display().to_string();
    let talked = daemon.create(&site, json!({})).await;
    daemon.send(&talked, "hello").await;
    daemon.wait_turn_done(&talked, 1).await;
    daemon.send(&talked, "hello again").await;
    daemon.wait_turn_done(&talked, 2).await;
    let waiting = daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    daemon.send(&waiting, "run: true").await;
    daemon.wait_state(&waiting, "awaiting_input").await;

    let listed = summary(&daemon, &talked).await;
    assert_eq!(
        (
            &listed["state"],
            &listed["turns"],
            &listed["cwd"],
            &listed["live"]
        ),
        (&json!("idle"), &json!(2), &json!(cwd), &json!(true)),
        "{listed}"
    );
    let listed = summary(&daemon, &waiting).await;
    assert_eq!(listed["state"], "awaiting_input", "{listed}");
    assert_eq!(listed["turns"], 1, "{listed}");

    // With no actor, the state comes from the index: the same answers,
    // after a restart too.
    let evicted = daemon
        .post(&format!("/admin/actors/{talked}/evict"), &json!({}))
        .await;
    assert_eq!(evicted.status, StatusCode::OK, "{evicted:?}");
    let mut daemon = daemon;
    daemon.sigterm();
    assert!(daemon.wait_exit().success());
    let daemon = daemon.restart();
    // (Boot recovery wakes the one waiting on a human; the other sleeps.)
    for (id, state, turns, live) in [
        (&talked, "idle", 2, false),
        (&waiting, "awaiting_input", 1, true),
    ] {
        let listed = summary(&daemon, id).await;
        assert_eq!(listed["live"], live, "{listed}");
        assert_eq!(listed["state"], state, "{listed}");
        assert_eq!(listed["turns"], turns, "{listed}");
        assert_eq!(listed["cwd"], cwd, "{listed}");
    }
}
