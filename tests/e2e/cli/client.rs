//! `keel::client` against a real daemon: every route returns the API's own
//! types (so the daemon's JSON deserialises into them), refusals become the
//! actionable errors, and the event follower resumes across a daemon
//! restart from the last seq it saw, with nothing missed or repeated.

use std::time::Instant;

use keel_api::client::{Client, Error, Events, Frame};
use keel_api::types::{
    ApiDecisionKind, ApiEventKind, ApiLiveEvent, ApiState, ApiToolPolicy, CreateConversation,
};

use super::{addr_of, free_port, Rig};
use crate::daemon::{Daemon, Site, Wire, PATIENCE};
use crate::harness::MockLlm;

fn client_of(daemon: &Daemon) -> Client {
    Client::new(&addr_of(daemon), Some(daemon.token.clone()))
}

fn create_in(site: &Site) -> CreateConversation {
    CreateConversation {
        cwd: Some(site.cwd().display().to_string()),
        ..CreateConversation::default()
    }
}

/// The next frame, bounded by `PATIENCE`.
async fn next(events: &mut Events) -> Frame {
    tokio::time::timeout(PATIENCE, events.next())
        .await
        .expect("a frame in time")
        .expect("the follower goes on")
}

/// Frames until a canonical one `done` accepts; every frame seen.
async fn until_canonical(events: &mut Events, done: impl Fn(&ApiEventKind) -> bool) -> Vec<Frame> {
    let deadline = Instant::now() + PATIENCE;
    let mut frames = Vec::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "not within {PATIENCE:?}: {frames:#?}"
        );
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, events.next())
            .await
            .unwrap_or_else(|_| panic!("not within {PATIENCE:?}: {frames:#?}"))
            .expect("the follower goes on");
        let finished = matches!(&frame, Frame::Canonical(event) if done(&event.kind));
        frames.push(frame);
        if finished {
            return frames;
        }
    }
}

fn canonical_seqs(frames: &[Frame]) -> Vec<u64> {
    frames
        .iter()
        .filter_map(|frame| match frame {
            Frame::Canonical(event) => Some(event.seq),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_every_route_answers_in_the_api_types() {
    let rig = Rig::start();
    let client = client_of(&rig.daemon);
    assert_eq!(client.health().await.unwrap().status, "ok");

    let mut create = create_in(&rig.site);
    create
        .tools
        .insert("bash".to_owned(), ApiToolPolicy::Approve);
    let id = client.create(&create).await.unwrap().id;
    let mut events = client.events(&id, None);
    let Frame::Snapshot(snapshot) = next(&mut events).await else {
        panic!("a snapshot first")
    };
    assert_eq!(
        (snapshot.id.as_str(), snapshot.state),
        (id.as_str(), ApiState::Idle)
    );

    let accepted = client.send_text(&id, "hello there").await.unwrap();
    let frames = until_canonical(&mut events, |kind| {
        matches!(kind, ApiEventKind::TurnCompleted { .. })
    })
    .await;
    assert!(
        frames
            .iter()
            .any(|frame| matches!(frame, Frame::Live(ApiLiveEvent::TextDelta { .. }))),
        "text streamed: {frames:#?}"
    );
    let seqs = canonical_seqs(&frames);
    assert!(seqs.contains(&accepted.seq), "{seqs:?}");
    assert!(
        seqs.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "{seqs:?}"
    );

    let detail = client.get(&id).await.unwrap();
    assert_eq!(detail.state, ApiState::Idle);
    assert_eq!(detail.turn, 1);
    let listed = client.list(false).await.unwrap();
    assert!(listed.conversations.iter().any(|summary| summary.id == id));
    let page = client.log(&id, 1, None).await.unwrap();
    assert_eq!(page.events.first().map(|event| event.seq), Some(1));
    assert!(page
        .events
        .iter()
        .any(|event| matches!(&event.kind, ApiEventKind::UserMessage { text, .. } if text == "hello there")));

    // A call that waits for approval, approved through the client.
    client.send_text(&id, "run: echo approved").await.unwrap();
    let frames = until_canonical(&mut events, |kind| {
        matches!(kind, ApiEventKind::Suspended { .. })
    })
    .await;
    let Some(Frame::Canonical(suspended)) = frames.last() else {
        unreachable!()
    };
    let ApiEventKind::Suspended { pending } = &suspended.kind else {
        unreachable!()
    };
    let call = pending[0].tool_call_id.clone();
    let resolved = client
        .decide(&id, &call, ApiDecisionKind::Approve, None, None)
        .await
        .unwrap();
    assert_eq!(resolved.decision, ApiDecisionKind::Approve);
    until_canonical(&mut events, |kind| {
        matches!(kind, ApiEventKind::TurnCompleted { turn: 2, .. })
    })
    .await;
    let again = client
        .decide(&id, &call, ApiDecisionKind::Deny, None, None)
        .await;
    assert_eq!(again.unwrap_err().code(), Some("already_resolved"));

    let actors = client.actors().await.unwrap();
    assert!(actors.actors.iter().any(|actor| actor.id == id));
    let cancelled = client.cancel(&id).await.unwrap();
    assert_eq!(cancelled.state, ApiState::Idle);
    // A drill: the actor is crashed and its supervisor restarts it; the
    // follower rides it out and gets the next life's snapshot.
    assert_eq!(client.kill(&id).await.unwrap().id, id);
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "no snapshot after the kill");
        if let Frame::Snapshot(snapshot) = next(&mut events).await {
            assert_eq!(snapshot.id, id);
            break;
        }
    }
    assert_eq!(client.get(&id).await.unwrap().state, ApiState::Idle);
    // A follower would wake it again (the stream follows the actor's next
    // life), so it goes first.
    drop(events);
    let evicted = client.evict(&id).await.unwrap();
    assert!(evicted.was_live);
    assert!(!client.get(&id).await.unwrap().live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_say_what_to_do() {
    let rig = Rig::start();
    let client = client_of(&rig.daemon);
    let missing = client.get("7f3c0000").await.unwrap_err();
    assert!(matches!(missing, Error::NotFound { .. }), "{missing:?}");
    assert_eq!(missing.to_string(), "conversation 7f3c0000 not found");

    let anonymous = Client::new(&rig.addr(), None);
    let refused = anonymous.list(false).await.unwrap_err();
    assert_eq!(refused.code(), Some("unauthorized"));
    assert!(refused.to_string().contains("KEEL_TOKEN"), "{refused}");

    let nobody = format!("127.0.0.1:{}", free_port());
    let away = Client::new(&nobody, None).list(false).await.unwrap_err();
    assert_eq!(
        away.to_string(),
        format!("no daemon at {nobody}: start one with `keel serve`")
    );
}

/// The follower sees the daemon go away, reconnects to its next life on
/// the same address with `Last-Event-ID`, and yields every canonical event
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_events_resume_after_a_daemon_restart() {
    let mock = MockLlm::start();
    let site = Site::new();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut env = Wire::Anthropic.env(&mock);
    env.push(("KEEL_ADDR".to_owned(), addr.clone()));
    let daemon = Daemon::start_with(&site, env);
    let client = client_of(&daemon);
    let id = client.create(&create_in(&site)).await.unwrap().id;
    let mut events = client.events(&id, None).with_patience(Some(PATIENCE));
    // The follower connects on its first `next`: listen before sending,
    // or a fast turn ends before the snapshot and is never seen.
    let mut seen = vec![next(&mut events).await];
    assert!(matches!(seen[0], Frame::Snapshot(_)), "a snapshot first");
    client.send_text(&id, "before").await.unwrap();
    seen.extend(
        until_canonical(&mut events, |kind| {
            matches!(kind, ApiEventKind::TurnCompleted { .. })
        })
        .await,
    );

    daemon.sigterm();
    let daemon = daemon.restart();
    assert_eq!(addr_of(&daemon), addr, "the same address again");
    // The follower notices, reconnects, and takes the next turn.
    let deadline = Instant::now() + PATIENCE;
    let mut reconnecting = false;
    loop {
        assert!(Instant::now() < deadline);
        let frame = tokio::time::timeout(PATIENCE, events.next())
            .await
            .unwrap_or_else(|_| panic!("no frame in time after the restart; seen: {seen:#?}"))
            .expect("the follower goes on");
        match frame {
            Frame::Reconnecting { .. } => reconnecting = true,
            Frame::Snapshot(_) if reconnecting => break,
            frame => seen.push(frame),
        }
    }
    client.send_text(&id, "after").await.unwrap();
    seen.extend(
        until_canonical(&mut events, |kind| {
            matches!(kind, ApiEventKind::TurnCompleted { turn: 2, .. })
        })
        .await,
    );
    let seqs = canonical_seqs(&seen);
    let expected: Vec<u64> = (seqs[0]..=*seqs.last().unwrap()).collect();
    assert_eq!(seqs, expected, "every event once, in order: {seen:#?}");
}

/// The listings come in pages: following `next_cursor` with a small
/// `limit` gives every conversation (and every live actor) once, in the
/// listing's order, and the last page has no cursor; `list` and `actors`
/// follow the pages themselves. A bad `limit` or `cursor` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_listings_come_in_pages_that_follow_each_other() {
    let rig = Rig::start();
    let client = client_of(&rig.daemon);
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(client.create(&create_in(&rig.site)).await.unwrap().id);
    }

    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list_page(false, Some(2), cursor.as_deref())
            .await
            .unwrap();
        assert!(page.conversations.len() <= 2);
        paged.extend(page.conversations.into_iter().map(|summary| summary.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let whole = client.list(false).await.unwrap();
    assert_eq!(whole.next_cursor, None);
    let listed: Vec<String> = whole
        .conversations
        .into_iter()
        .map(|summary| summary.id)
        .collect();
    assert_eq!(
        paged, listed,
        "the pages are the listing, once each, in order"
    );
    let mut sorted_created = created.clone();
    sorted_created.sort();
    let mut sorted_listed = listed.clone();
    sorted_listed.sort();
    assert_eq!(sorted_listed, sorted_created);

    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .actors_page(Some(2), cursor.as_deref())
            .await
            .unwrap();
        assert!(page.actors.len() <= 2);
        paged.extend(page.actors.into_iter().map(|actor| actor.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut sorted = paged.clone();
    sorted.sort();
    assert_eq!(paged, sorted, "actors come by id");
    let whole = client.actors().await.unwrap();
    assert_eq!(whole.next_cursor, None);
    let all: Vec<String> = whole.actors.into_iter().map(|actor| actor.id).collect();
    assert_eq!(paged, all);

    for refused in [
        client.list_page(false, Some(0), None).await.unwrap_err(),
        client.list_page(false, Some(1001), None).await.unwrap_err(),
        client
            .list_page(false, None, Some("not a cursor"))
            .await
            .unwrap_err(),
        client.actors_page(Some(0), None).await.unwrap_err(),
    ] {
        assert_eq!(refused.code(), Some("bad_request"), "{refused}");
    }
}
