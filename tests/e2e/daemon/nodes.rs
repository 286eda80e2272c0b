//! Several `keel serve` nodes over one PostgreSQL database (docs/nodes.md),
//! against a server the test starts itself (`keel_test_support::postgres`;
//! without PostgreSQL's server binaries these tests say they were not
//! run). Any node answers any request; a node killed mid-turn is taken
//! over once its lease runs out, and the turn finishes on another with the
//! client's stream gap-free; a paused owner that comes back after a
//! takeover is fenced and steps down.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{ends_turn, of_kind, seqs, Daemon, Reply, Resume, Site, Wire, PATIENCE};
use crate::harness::MockLlm;
use keel_api::client::Frame;
use keel_test_support::postgres::Postgres;

/// Long enough that a node stalled by a loaded machine is not taken for
/// lost, short enough that a takeover comes well within a test's patience.
const LEASE_MS: &str = "3000";
const TOKEN: &str = "nodes-share-one-token";

struct Node {
    daemon: Daemon,
    _site: Site,
}

/// A node named `name` on the database at `url`.
fn node(name: &str, url: &str, mock: &MockLlm) -> Node {
    let site = Site::new();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        mock,
        &[
            ("KEEL_STORE", "postgres"),
            ("KEEL_DATABASE_URL", url),
            ("KEEL_NODE", name),
            ("KEEL_NODE_LEASE_MS", LEASE_MS),
            ("KEEL_TOKEN", TOKEN),
        ],
    );
    Node {
        daemon,
        _site: site,
    }
}

/// PostgreSQL, the fake provider, a site to work in and nodes of these
/// names; `None` (after saying NOT RUN) without PostgreSQL.
struct Nodes<const N: usize> {
    nodes: [Node; N],
    site: Site,
    mock: MockLlm,
    server: Postgres,
}

fn nodes<const N: usize>(names: [&str; N]) -> Option<Nodes<N>> {
    let server = Postgres::start()?;
    let url = server.url();
    let mock = MockLlm::start();
    let nodes = names.map(|name| node(name, &url, &mock));
    Some(Nodes {
        nodes,
        site: Site::new(),
        mock,
        server,
    })
}

/// `POST …/messages` of `text` through `daemon`, whatever it answers.
async fn send_through(daemon: &Daemon, id: &str, text: &str) -> Reply {
    daemon
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": text}),
        )
        .await
}

/// `GET path` on `daemon` until it answers 200 and `done` holds of the
/// body: a conversation whose node is being taken over answers 503
/// meanwhile.
async fn poll(daemon: &Daemon, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = daemon.get(path).await;
        if reply.status == StatusCode::OK && done(&reply.body) {
            return reply.body;
        }
        assert!(
            reply.status == StatusCode::OK || reply.status == StatusCode::SERVICE_UNAVAILABLE,
            "{what}: GET {path}: {reply:?}"
        );
        assert!(
            Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}: {reply:?}\n{}",
            daemon.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until turn `turn` of `id` has ended and it is idle; the log.
async fn turn_done(daemon: &Daemon, id: &str, turn: u64) -> Vec<Value> {
    poll(
        daemon,
        &format!("/v1/conversations/{id}"),
        &format!("turn {turn} done"),
        |conversation| {
            conversation["state"] == "idle" && conversation["turn"].as_u64() >= Some(turn)
        },
    )
    .await;
    let log = daemon.log(id).await;
    assert!(log.iter().any(|event| ends_turn(event, turn)), "{log:#?}");
    log
}

fn answered_by(reply: &Reply) -> String {
    reply
        .headers
        .get("x-keel-node")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Follows `id` on `daemon` with keel's own client from seq 1, collecting
/// canonical events until one ends turn `turn`: the seqs, in the order
/// they came.
/// Returns once the stream is open (its first frame, a snapshot, read):
/// the client gives up on a first connection that fails, and reconnects
/// only once it had one.
async fn follow(daemon: &Daemon, id: &str, turn: u64) -> tokio::task::JoinHandle<Vec<u64>> {
    let client = keel_api::client::Client::new(&daemon.url, Some(TOKEN.to_owned()));
    let mut events = client.events(id, Some(1)).with_patience(Some(PATIENCE));
    let first = tokio::time::timeout(PATIENCE, events.next())
        .await
        .expect("the stream opens")
        .expect("the stream opens");
    assert!(matches!(first, Frame::Snapshot(_)), "{first:?}");
    tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            let frame = tokio::time::timeout(PATIENCE, events.next())
                .await
                .expect("the stream goes on")
                .expect("the stream follows through a takeover");
            if let Frame::Canonical(event) = frame {
                seen.push(event.seq);
                let json = serde_json::to_value(&event).unwrap();
                if ends_turn(&json, turn) {
                    return seen;
                }
            }
        }
    })
}

/// Every seq from 1 to the last, once each, in order.
fn assert_gap_free(seen: &[u64]) {
    let expected: Vec<u64> = (1..=seen.len() as u64).collect();
    assert_eq!(
        seen,
        expected.as_slice(),
        "the client saw every event once, in order"
    );
}

/// The writers of `id`'s log never interleave: each (node, epoch) wrote
/// one stretch of seqs, and the stretches follow each other.
async fn assert_writers_in_turn(daemon: &Daemon, id: &str) -> Vec<Value> {
    let reply = daemon
        .get(&format!("/admin/conversations/{id}/writers"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let writers = reply.body["writers"].as_array().unwrap().clone();
    assert!(!writers.is_empty(), "{reply:?}");
    let mut next = 1;
    for writer in &writers {
        let (first, last) = (
            writer["first_seq"].as_u64().unwrap(),
            writer["last_seq"].as_u64().unwrap(),
        );
        assert_eq!(first, next, "stretches follow each other: {writers:#?}");
        assert!(last >= first, "{writers:#?}");
        next = last + 1;
    }
    writers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_answers_any_request_about_any_conversation() {
    let Some(Nodes {
        nodes: [a, b, c],
        site,
        mock: _mock,
        server: _server,
    }) = nodes(["a", "b", "c"])
    else {
        return;
    };

    // Created on a (which owns it), sent on b, streamed from c.
    let id = a.daemon.create(&site, json!({})).await;
    let stream = follow(&c.daemon, &id, 1).await;
    let reply = send_through(&b.daemon, &id, "hello from b").await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    assert_eq!(answered_by(&reply), "a", "b forwarded the send to a");
    let log = turn_done(&c.daemon, &id, 1).await;
    let seen = stream.await.unwrap();
    assert_gap_free(&seen);
    assert_eq!(seen.len(), log.len(), "the stream from c saw the whole log");
    assert!(
        super::assistant_texts(&log)
            .iter()
            .any(|text| text.contains("hello from b")),
        "{log:#?}"
    );

    // AG-UI names its thread in the body: through c, the run is a's, and
    // its events stream back through c to the end of the run.
    let reply = c
        .daemon
        .post(
            "/ag-ui",
            &json!({
                "threadId": id,
                "runId": "r-through-c",
                "messages": [{"id": "agui-1", "role": "user", "content": "hello over ag-ui"}],
            }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(answered_by(&reply), "a", "c forwarded the run to a");
    let frames = reply.body.as_str().unwrap();
    assert!(frames.contains("RUN_FINISHED"), "{frames}");
    turn_done(&b.daemon, &id, 2).await;

    // An approval: asked on a, seen from b, resolved through c, and a
    // second answer through b refused, as on one node.
    let gated = a
        .daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    b.daemon
        .send(&gated, "run: echo approved-through-c > approved.txt")
        .await;
    let waiting = poll(
        &b.daemon,
        &format!("/v1/conversations/{gated}"),
        "awaiting input",
        |conversation| conversation["state"] == "awaiting_input",
    )
    .await;
    let call = waiting["pending"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let reply = c.daemon.resolve(&gated, &call, "approve").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(answered_by(&reply), "a");
    let again = b.daemon.resolve(&gated, &call, "deny").await;
    let (code, _) = again.error(StatusCode::CONFLICT);
    assert_eq!(code, "already_resolved", "{again:?}");
    let log = turn_done(&b.daemon, &gated, 1).await;
    assert_eq!(of_kind(&log, "resolved").len(), 1, "{log:#?}");
    assert_eq!(
        std::fs::read_to_string(site.cwd().join("approved.txt"))
            .unwrap()
            .trim(),
        "approved-through-c"
    );

    // A cancel through a node that does not own the conversation stops
    // the tool running on the one that does.
    b.daemon.send(&id, "run: sleep 30").await;
    poll(
        &c.daemon,
        &format!("/v1/conversations/{id}"),
        "running the tool",
        |conversation| conversation["state"] == "executing_tools",
    )
    .await;
    let reply = c.daemon.cancel(&id).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    assert_eq!(answered_by(&reply), "a");
    let log = turn_done(&b.daemon, &id, 3).await;
    let ended = log.last().unwrap();
    assert_eq!(ended["type"], "turn_interrupted", "{log:#?}");
    assert_eq!(seqs(&log), (1..=log.len() as u64).collect::<Vec<_>>());

    // Every node lists the three, alive, and who owns what.
    let nodes = b.daemon.get("/admin/nodes").await;
    assert_eq!(nodes.status, StatusCode::OK, "{nodes:?}");
    assert_eq!(nodes.body["this_node"], "b");
    let listed: Vec<(&str, bool, i64)> = nodes.body["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| {
            (
                node["node"].as_str().unwrap(),
                node["live"].as_bool().unwrap(),
                node["owns"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, vec![("a", true, 2), ("b", true, 0), ("c", true, 0)]);
    let writers = assert_writers_in_turn(&c.daemon, &id).await;
    assert!(
        writers.iter().all(|writer| writer["node"] == "a"),
        "{writers:#?}"
    );

    // b forwarded (the send, the second resolve, and more); a forwarded
    // nothing, and every node's lease is current.
    let forwarded = |metrics: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| {
                line.strip_prefix("keel_node_forwarded_requests_total{outcome=\"ok\"} ")
            })
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no forwarded series:\n{metrics}"))
    };
    let of_a = a.daemon.get("/metrics").await.body;
    let of_b = b.daemon.get("/metrics").await.body;
    let (of_a, of_b) = (of_a.as_str().unwrap(), of_b.as_str().unwrap());
    assert_eq!(forwarded(of_a), 0.0);
    assert!(forwarded(of_b) >= 2.0, "{of_b}");
    assert!(of_b.contains("keel_node_lease_current 1"), "{of_b}");

    // a stops gracefully and leaves: its conversations are taken over by
    // b and c at once, and go on there.
    let mut a = a;
    a.daemon.sigterm();
    assert!(a.daemon.wait_exit().success(), "{}", a.daemon.output());
    poll(
        &b.daemon,
        "/admin/nodes",
        "a left, its trees taken",
        |nodes| {
            let nodes = nodes["nodes"].as_array().unwrap();
            nodes[0]["fenced"] == true && nodes[0]["owns"] == 0
        },
    )
    .await;
    let reply = send_through(&c.daemon, &id, "after a left").await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    assert!(
        ["b", "c"].contains(&answered_by(&reply).as_str()),
        "{reply:?}"
    );
    let log = turn_done(&b.daemon, &id, 4).await;
    assert_eq!(log.last().unwrap()["type"], "turn_completed", "{log:#?}");
    assert_eq!(seqs(&log), (1..=log.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_turn_is_taken_over_and_the_turn_finishes_elsewhere() {
    let Some(Nodes {
        nodes: [a, b, c],
        site,
        mock: _mock,
        server: _server,
    }) = nodes(["a", "b", "c"])
    else {
        return;
    };

    let id = a.daemon.create(&site, json!({})).await;
    // Followed through c, which forwards to a until a is gone: by keel's
    // client (which reconnects itself), and on one plain connection that
    // must stay open through the takeover (c goes on from the new owner).
    let stream = follow(&c.daemon, &id, 1).await;
    let mut plain = c.daemon.events(&id, Resume::From(1)).await;
    b.daemon
        .send(
            &id,
            "run: sleep 1; echo ran >> runs.txt; echo survived-the-node",
        )
        .await;
    poll(
        &b.daemon,
        &format!("/v1/conversations/{id}"),
        "running the tool",
        |conversation| conversation["state"] == "executing_tools",
    )
    .await;
    a.daemon.sigkill();

    let log = turn_done(&b.daemon, &id, 1).await;
    let recovered = of_kind(&log, "recovered");
    assert_eq!(recovered.len(), 1, "{log:#?}");
    assert_eq!(recovered[0]["action"], "redispatch", "{log:#?}");
    assert!(
        super::assistant_texts(&log)
            .iter()
            .any(|text| text.contains("survived-the-node")),
        "{log:#?}"
    );
    // The call ran to its end once: a's copy died with a (its spawner
    // kills its groups), and only the taker's finished.
    assert_eq!(
        std::fs::read_to_string(site.cwd().join("runs.txt")).unwrap(),
        "ran\n"
    );
    let seen = stream.await.unwrap();
    assert_gap_free(&seen);
    assert_eq!(seen.len(), log.len());
    let mut on_one_connection = Vec::new();
    while on_one_connection.len() < log.len() {
        let frame = plain
            .next()
            .await
            .expect("c keeps the connection open through the takeover");
        if frame.is_canonical() {
            on_one_connection.push(frame.seq());
        }
    }
    assert_gap_free(&on_one_connection);

    // Taken by b or c; a's epoch moved on, and a fenced.
    let nodes = poll(&b.daemon, "/admin/nodes", "a fenced", |nodes| {
        nodes["nodes"][0]["fenced"] == true
    })
    .await;
    let owners: i64 = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .map(|node| node["owns"].as_i64().unwrap())
        .sum();
    assert_eq!(owners, 1, "{nodes:#}");
    let writers = assert_writers_in_turn(&c.daemon, &id).await;
    assert_eq!(writers[0]["node"], "a", "{writers:#?}");
    assert_ne!(writers.last().unwrap()["node"], "a", "{writers:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_that_comes_back_after_a_takeover_steps_down() {
    let Some(Nodes {
        nodes: [mut a, b],
        site,
        mock: _mock,
        server: _server,
    }) = nodes(["a", "b"])
    else {
        return;
    };

    // A call waiting for a human on a, when a stops answering.
    let id = a
        .daemon
        .create(&site, json!({"tools": {"bash": "approve"}}))
        .await;
    a.daemon
        .send(&id, "run: echo decided-on-b > decided.txt")
        .await;
    let waiting = a.daemon.wait_state(&id, "awaiting_input").await;
    let call = waiting["pending"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    a.daemon.sigstop();

    // b fences a once its lease has run out and takes the conversation,
    // its approval still pending.
    poll(
        &b.daemon,
        "/admin/nodes",
        "a fenced and its conversation taken",
        |nodes| nodes["nodes"][0]["fenced"] == true && nodes["nodes"][1]["owns"] == 1,
    )
    .await;
    let reply = b.daemon.resolve(&id, &call, "approve").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(answered_by(&reply), "b");
    let log = turn_done(&b.daemon, &id, 1).await;
    assert_eq!(
        std::fs::read_to_string(site.cwd().join("decided.txt"))
            .unwrap()
            .trim(),
        "decided-on-b"
    );

    // a wakes up, finds itself fenced, and exits: nothing of it lands.
    a.daemon.sigcont();
    let status = a.daemon.wait_exit();
    assert!(!status.success(), "{status:?}");
    assert!(
        a.daemon.output().contains("fenced off"),
        "{}",
        a.daemon.output()
    );
    let after = b.daemon.log(&id).await;
    assert_eq!(after, log, "nothing was appended after a came back");
    let writers = assert_writers_in_turn(&b.daemon, &id).await;
    let names: Vec<&str> = writers
        .iter()
        .map(|writer| writer["node"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"], "{writers:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owners_tool_stops_with_its_lease_and_runs_once_elsewhere() {
    let Some(Nodes {
        nodes: [a, b],
        site,
        mock: _mock,
        server: _server,
    }) = nodes(["a", "b"])
    else {
        return;
    };

    // A call that runs longer than the lease, on a, when a is paused: its
    // spawner (not paused) kills it once a's lease lapses unrenewed,
    // before b may take the conversation over and run the call again.
    let id = a.daemon.create(&site, json!({})).await;
    a.daemon
        .send(
            &id,
            "run: echo started >> runs.txt; sleep 6; echo finished >> runs.txt",
        )
        .await;
    a.daemon.wait_state(&id, "executing_tools").await;
    super::wait_file(&site.cwd().join("runs.txt")).await;
    a.daemon.sigstop();

    let log = turn_done(&b.daemon, &id, 1).await;
    let recovered = of_kind(&log, "recovered");
    assert_eq!(recovered.len(), 1, "{log:#?}");
    assert_eq!(recovered[0]["action"], "redispatch", "{log:#?}");
    // a's copy started and never finished; b's ran whole.
    assert_eq!(
        std::fs::read_to_string(site.cwd().join("runs.txt")).unwrap(),
        "started\nstarted\nfinished\n"
    );
    a.daemon.sigcont();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_nobody_owns_goes_to_the_node_rendezvous_hashing_picks() {
    let Some(server) = Postgres::start() else {
        return;
    };
    let url = server.url();
    let mock = MockLlm::start();
    let site = Site::new();

    // Written by a keel that was not a node: nobody owns them.
    let alone = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_STORE", "postgres"), ("KEEL_DATABASE_URL", &url)],
    );
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(alone.create(&site, json!({})).await);
    }
    let mut alone = alone;
    alone.sigterm();
    assert!(alone.wait_exit().success(), "{}", alone.output());

    let nodes = ["a", "b", "c"].map(|name| node(name, &url, &mock));
    let names: Vec<String> = ["a", "b", "c"].map(str::to_owned).to_vec();
    for (i, id) in ids.iter().enumerate() {
        let chosen = keel_actors::store::rendezvous(id, &names).unwrap();
        // Whichever node it is sent to, the chosen one runs it, and keeps
        // it.
        for (turn, entry) in [(1, &nodes[i % 3]), (2, &nodes[(i + 1) % 3])] {
            let reply = send_through(&entry.daemon, id, "who runs this?").await;
            assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
            assert_eq!(answered_by(&reply), chosen, "{id}");
            turn_done(&entry.daemon, id, turn).await;
        }
    }
    let listed = nodes[0].daemon.get("/admin/nodes").await.body;
    let owned: i64 = listed["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node["owns"].as_i64().unwrap())
        .sum();
    assert_eq!(owned, 6, "{listed:#}");
}
