//! The conformance suite's part on deleting: the same checks asked of every
//! `EventLog` (sled, redb, memory) through the macro at the bottom. A
//! delete removes a conversation's events, snapshot, checkpoint, index
//! entry and the blobs only it referred to, in one commit ordered with the
//! appends around it; nothing of any other conversation changes; the id
//! can be created again; and on disk it all holds across a reopen.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_core::config::ConversationConfig;
use keel_core::event::{Event, EventKind};
use keel_core::ids::{ConversationId, Seq};
use keel_core::message::ImageRef;
use keel_core::reducer::WorkingSet;
use keel_core::time::Timestamp;
use keel_core::transition::{create, NewConversation};
use keel_store::backend::Write;
use keel_store::{rehydrate, Backend, Error, EventLog, Reclaim};

fn id(raw: &str) -> ConversationId {
    ConversationId::new(raw).unwrap()
}

/// `Created` and `SessionStarted` (seqs 1, 2), a sub-agent of `parent` if given.
fn created_under(raw: &str, parent: Option<&str>) -> Vec<Event> {
    create(
        NewConversation {
            id: id(raw),
            cwd: "/tmp".to_owned(),
            config: ConversationConfig::default(),
            parent_conversation: parent.map(id),
        },
        Timestamp(1_000),
    )
    .appended()
    .to_vec()
}

fn created(raw: &str) -> Vec<Event> {
    created_under(raw, None)
}

fn message(seq: Seq, text: String, hashes: &[&str]) -> Event {
    Event {
        seq,
        at: Timestamp(2_000 + seq),
        parent: None,
        triggers_turn: false,
        kind: EventKind::UserMessage {
            text,
            images: hashes
                .iter()
                .map(|hash| ImageRef {
                    hash: (*hash).to_owned(),
                    media_type: "image/png".to_owned(),
                    width: 1,
                    height: 1,
                    size: 3,
                })
                .collect(),
        },
    }
}

/// `n` plain user messages continuing after `after`.
fn messages(after: Seq, n: u64) -> Vec<Event> {
    (after + 1..=after + n)
        .map(|seq| message(seq, format!("message {seq}"), &[]))
        .collect()
}

/// A conversation of `n` messages after its first two events.
async fn seed(log: &dyn EventLog, raw: &str, n: u64) {
    log.append(&id(raw), created(raw)).await.unwrap();
    log.append(&id(raw), messages(2, n)).await.unwrap();
}

/// Store `bytes` as an upload and append a message naming it to `raw`.
async fn send_image(log: &dyn EventLog, raw: &str, bytes: &[u8]) -> String {
    let hash = log.put_blob(bytes.to_vec()).await.unwrap();
    let seq = log.last_seq(&id(raw)).await.unwrap() + 1;
    log.append(&id(raw), vec![message(seq, "see".to_owned(), &[&hash])])
        .await
        .unwrap();
    hash
}

/// Everything of `raw` is gone, as every read sees it.
async fn assert_gone(log: &dyn EventLog, raw: &str) {
    let conversation = id(raw);
    assert_eq!(log.last_seq(&conversation).await.unwrap(), 0, "{raw}");
    assert!(log.read_all(&conversation).await.unwrap().is_empty());
    assert!(log.read_tail(&conversation, 5).await.unwrap().is_empty());
    assert!(log.index_entry(&conversation).await.unwrap().is_none());
    assert!(log.load_snapshot(&conversation).await.unwrap().is_none());
    assert!(log.load_checkpoint(&conversation).await.unwrap().is_none());
    assert!(rehydrate(log, &conversation).await.unwrap().is_none());
    let listed = log.list(true).await.unwrap();
    assert!(listed.iter().all(|entry| entry.id != conversation), "{raw}");
}

/// `raw` is there whole: `n` messages, its index entry, listed.
async fn assert_whole(log: &dyn EventLog, raw: &str, last_seq: Seq) {
    let conversation = id(raw);
    let events = log.read_all(&conversation).await.unwrap();
    assert_eq!(
        events.iter().map(|event| event.seq).collect::<Vec<_>>(),
        (1..=last_seq).collect::<Vec<_>>(),
        "{raw}"
    );
    let entry = log.index_entry(&conversation).await.unwrap().unwrap();
    assert_eq!(entry.last_seq, last_seq);
    let listed = log.list(true).await.unwrap();
    assert!(listed.iter().any(|entry| entry.id == conversation), "{raw}");
}

pub async fn a_delete_removes_everything_of_the_conversation_and_nothing_else(log: &dyn EventLog) {
    seed(log, "a", 10).await;
    let a_image = send_image(log, "a", b"a's picture").await;
    let whole = log.read_all(&id("a")).await.unwrap();
    let working = WorkingSet::replay(&whole).unwrap();
    log.save_checkpoint(&id("a"), &working).await.unwrap();
    assert!(log.load_snapshot(&id("a")).await.unwrap().is_some());
    seed(log, "a-b", 3).await;
    let b_image = send_image(log, "a-b", b"b's picture").await;
    log.save_checkpoint(
        &id("a-b"),
        &WorkingSet::replay(&log.read_all(&id("a-b")).await.unwrap()).unwrap(),
    )
    .await
    .unwrap();

    let deleted = log.delete(&id("a")).await.unwrap();
    assert!(deleted.existed);
    assert_eq!(deleted.events, 13);
    assert_eq!(deleted.blobs_removed, vec![a_image.clone()]);
    assert!(deleted.blobs_kept.is_empty());

    assert_gone(log, "a").await;
    assert!(log.get_blob(&a_image).await.unwrap().is_none());
    // The other conversation, whose id starts with this one's, is whole.
    assert_whole(log, "a-b", 6).await;
    assert!(log.load_checkpoint(&id("a-b")).await.unwrap().is_some());
    assert!(log.load_snapshot(&id("a-b")).await.unwrap().is_some());
    assert_eq!(
        log.get_blob(&b_image).await.unwrap().as_deref(),
        Some(&b"b's picture"[..])
    );
}

pub async fn a_shared_blob_stays_until_its_last_referrer_goes(log: &dyn EventLog) {
    seed(log, "first", 1).await;
    seed(log, "second", 1).await;
    let shared = send_image(log, "first", b"shared").await;
    // Named twice by one conversation, once by the other.
    send_image(log, "first", b"shared").await;
    send_image(log, "second", b"shared").await;

    let deleted = log.delete(&id("first")).await.unwrap();
    assert_eq!(deleted.blobs_kept, vec![shared.clone()]);
    assert!(deleted.blobs_removed.is_empty());
    assert!(log.get_blob(&shared).await.unwrap().is_some());

    let deleted = log.delete(&id("second")).await.unwrap();
    assert_eq!(deleted.blobs_removed, vec![shared.clone()]);
    assert!(log.get_blob(&shared).await.unwrap().is_none());
}

/// An image a tool returned is named by its result, and keeps its blob as
/// a message's image does.
pub async fn a_tool_results_image_keeps_its_blob(log: &dyn EventLog) {
    seed(log, "tool", 1).await;
    seed(log, "user", 1).await;
    let shared = send_image(log, "user", b"a screenshot").await;
    let seq = log.last_seq(&id("tool")).await.unwrap() + 1;
    let image = match message(seq, String::new(), &[&shared]).kind {
        EventKind::UserMessage { images, .. } => images,
        _ => unreachable!("message() makes user messages"),
    };
    let result = Event {
        seq,
        at: Timestamp(2_000 + seq),
        parent: None,
        triggers_turn: false,
        kind: EventKind::ToolResult {
            tool_call_id: keel_core::ids::ToolCallId::new("call_1"),
            content: "the screen".to_owned(),
            is_error: false,
            synthetic: false,
            images: image,
        },
    };
    log.append(&id("tool"), vec![result]).await.unwrap();

    let deleted = log.delete(&id("user")).await.unwrap();
    assert_eq!(deleted.blobs_kept, vec![shared.clone()]);
    assert!(log.get_blob(&shared).await.unwrap().is_some());

    let deleted = log.delete(&id("tool")).await.unwrap();
    assert_eq!(deleted.blobs_removed, vec![shared.clone()]);
    assert!(log.get_blob(&shared).await.unwrap().is_none());
}

pub async fn deleting_an_unknown_conversation_changes_nothing(log: &dyn EventLog) {
    seed(log, "kept", 2).await;
    let image = send_image(log, "kept", b"kept's").await;
    let deleted = log.delete(&id("nobody")).await.unwrap();
    assert!(!deleted.existed);
    assert_eq!(deleted.events, 0);
    assert!(deleted.blobs_removed.is_empty() && deleted.blobs_kept.is_empty());
    assert_whole(log, "kept", 5).await;
    assert!(log.get_blob(&image).await.unwrap().is_some());
    // Deleting twice: the second finds nothing.
    log.delete(&id("kept")).await.unwrap();
    assert!(!log.delete(&id("kept")).await.unwrap().existed);
}

pub async fn a_deleted_id_can_be_created_again_from_seq_one(log: &dyn EventLog) {
    seed(log, "again", 10).await;
    let old = log.read_all(&id("again")).await.unwrap();
    log.save_checkpoint(&id("again"), &WorkingSet::replay(&old).unwrap())
        .await
        .unwrap();
    log.delete(&id("again")).await.unwrap();

    // The old log cannot be continued: the id has no log now.
    let refused = log.append(&id("again"), messages(12, 1)).await.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::NonContiguous {
                expected: 1,
                found: 13,
                ..
            }
        ),
        "{refused}"
    );
    // A cache of the gone conversation saved late is not kept.
    log.save_checkpoint(&id("again"), &WorkingSet::replay(&old).unwrap())
        .await
        .unwrap();
    assert!(log.load_checkpoint(&id("again")).await.unwrap().is_none());

    log.append(&id("again"), created("again")).await.unwrap();
    log.append(&id("again"), messages(2, 1)).await.unwrap();
    assert_whole(log, "again", 3).await;
    let rebuilt = rehydrate(log, &id("again")).await.unwrap().unwrap();
    assert!(!rebuilt.from_checkpoint);
    assert_eq!(rebuilt.conversation.working.last_seq, 3);
}

/// Appends to other conversations go on while conversations are deleted,
/// and an append racing the delete of its own conversation either lands
/// before it (and is deleted with it) or is refused: nothing of the old
/// log comes back.
pub async fn deletes_interleaved_with_concurrent_appends(log: Arc<dyn EventLog>) {
    for victim in 0..24 {
        seed(&*log, &format!("victim-{victim}"), 3).await;
    }
    let mut writers = Vec::new();
    for writer in 0..8 {
        let log = Arc::clone(&log);
        writers.push(tokio::spawn(async move {
            let raw = format!("writer-{writer}");
            log.append(&id(&raw), created(&raw)).await.unwrap();
            for round in 0..20 {
                log.append(&id(&raw), messages(2 + round * 2, 2))
                    .await
                    .unwrap();
            }
        }));
    }
    // Victims 0..8 keep appending until their delete refuses them.
    let mut racers = Vec::new();
    for victim in 0..8 {
        let log = Arc::clone(&log);
        racers.push(tokio::spawn(async move {
            let conversation = id(&format!("victim-{victim}"));
            let mut next = 6;
            while log
                .append(&conversation, messages(next - 1, 1))
                .await
                .is_ok()
            {
                next += 1;
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut deletes = Vec::new();
    for victim in 0..24 {
        let log = Arc::clone(&log);
        deletes.push(tokio::spawn(async move {
            tokio::task::yield_now().await;
            log.delete(&id(&format!("victim-{victim}"))).await.unwrap()
        }));
    }
    for delete in deletes {
        assert!(delete.await.unwrap().existed);
    }
    for task in writers.into_iter().chain(racers) {
        task.await.unwrap();
    }
    for victim in 0..24 {
        assert_gone(&*log, &format!("victim-{victim}")).await;
    }
    for writer in 0..8 {
        assert_whole(&*log, &format!("writer-{writer}"), 42).await;
    }
}

pub async fn children_are_the_sub_agents_a_parent_started(log: &dyn EventLog) {
    seed(log, "parent", 1).await;
    seed(log, "other", 1).await;
    for (child, parent) in [("c1", "parent"), ("c2", "parent"), ("c3", "other")] {
        log.append(&id(child), created_under(child, Some(parent)))
            .await
            .unwrap();
    }
    let names = |entries: Vec<keel_store::IndexEntry>| {
        entries
            .into_iter()
            .map(|entry| entry.id.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(log.children(&id("parent")).await.unwrap()),
        vec!["c1", "c2"]
    );
    assert!(log.children(&id("c1")).await.unwrap().is_empty());
    log.delete(&id("c1")).await.unwrap();
    assert_eq!(
        names(log.children(&id("parent")).await.unwrap()),
        vec!["c2"]
    );
    // Deleting the parent leaves its children to the caller.
    log.delete(&id("parent")).await.unwrap();
    assert_eq!(
        names(log.children(&id("parent")).await.unwrap()),
        vec!["c2"]
    );
}

/// A blob stored for a message not yet appended is an upload on its way:
/// neither a delete of another conversation naming the same bytes nor a
/// young-enough sweep takes it. Blobs nothing names go with a sweep.
pub async fn uploads_waiting_for_their_message_are_kept(log: &dyn EventLog) {
    seed(log, "old", 1).await;
    seed(log, "new", 1).await;
    let hash = send_image(log, "old", b"the same bytes").await;
    // The same bytes uploaded for "new", whose message is still to come.
    assert_eq!(
        log.put_blob(b"the same bytes".to_vec()).await.unwrap(),
        hash
    );
    let deleted = log.delete(&id("old")).await.unwrap();
    assert_eq!(deleted.blobs_kept, vec![hash.clone()]);
    assert!(log.get_blob(&hash).await.unwrap().is_some());
    // The message arrives; once its conversation goes, so does the blob.
    log.append(&id("new"), vec![message(4, "see".to_owned(), &[&hash])])
        .await
        .unwrap();
    let deleted = log.delete(&id("new")).await.unwrap();
    assert_eq!(deleted.blobs_removed, vec![hash.clone()]);

    // An upload never named: kept by a sweep while young, then swept.
    seed(log, "keeper", 1).await;
    let named = send_image(log, "keeper", b"named").await;
    let orphan = log.put_blob(b"orphan".to_vec()).await.unwrap();
    let swept = log
        .sweep_unreferenced_blobs(Duration::from_secs(3_600))
        .await
        .unwrap();
    assert!(swept.blobs.is_empty(), "{swept:?}");
    let swept = log.sweep_unreferenced_blobs(Duration::ZERO).await.unwrap();
    assert_eq!(swept.blobs, vec![orphan.clone()]);
    assert_eq!(swept.bytes, 6);
    assert!(log.get_blob(&orphan).await.unwrap().is_none());
    assert!(log.get_blob(&named).await.unwrap().is_some());
}

pub async fn reclaim_reports_what_the_engine_did(log: &dyn EventLog) {
    seed(log, "a", 20).await;
    log.delete(&id("a")).await.unwrap();
    let reclaimed = log.reclaim().await.unwrap();
    match reclaimed.action {
        Reclaim::InMemory => assert_eq!(reclaimed.disk_bytes_after, None),
        Reclaim::Compacted | Reclaim::ByItself => {
            assert!(reclaimed.disk_bytes_before.unwrap() > 0);
            assert!(reclaimed.disk_bytes_after.unwrap() > 0);
        }
    }
    // The store goes on as before.
    seed(log, "b", 2).await;
    assert_whole(log, "b", 4).await;
}

/// A delete is durable: after a reopen the conversation is still gone,
/// its blob too, the other one whole, and the id can be created again.
async fn a_delete_survives_a_reopen(open: impl Fn(&Path) -> Arc<dyn EventLog>) {
    let dir = tempfile::tempdir().unwrap();
    let (gone_image, kept_image) = {
        let log = open(dir.path());
        seed(&*log, "gone", 5).await;
        seed(&*log, "kept", 5).await;
        let gone_image = send_image(&*log, "gone", b"gone's").await;
        let kept_image = send_image(&*log, "kept", b"kept's").await;
        send_image(&*log, "gone", b"kept's").await;
        log.delete(&id("gone")).await.unwrap();
        (gone_image, kept_image)
    };
    let log = open(dir.path());
    assert_gone(&*log, "gone").await;
    assert!(log.get_blob(&gone_image).await.unwrap().is_none());
    assert_whole(&*log, "kept", 8).await;
    // The blob both named survived, and is still known to be "kept"'s.
    let deleted = log.delete(&id("kept")).await.unwrap();
    assert_eq!(deleted.blobs_removed, vec![kept_image.clone()]);
    log.append(&id("gone"), created("gone")).await.unwrap();
    assert_whole(&*log, "gone", 2).await;
}

/// A store written before blob references were kept (here: one whose
/// reference keys and mark were removed, and one record in the old JSON
/// encoding) gets them back from its log on open, so a delete still keeps
/// a blob another conversation shows.
async fn references_are_rebuilt_for_a_store_that_lacks_them<B: Backend>(
    open: impl Fn(&Path) -> Arc<dyn EventLog>,
    engine: impl Fn(&Path) -> B,
) {
    let dir = tempfile::tempdir().unwrap();
    let shared = {
        let log = open(dir.path());
        seed(&*log, "one", 1).await;
        seed(&*log, "two", 1).await;
        let shared = send_image(&*log, "one", b"both show it").await;
        send_image(&*log, "two", b"both show it").await;
        shared
    };
    {
        let backend = engine(dir.path());
        let mut writes: Vec<Write> = Vec::new();
        for prefix in [b'r', b'u', b'm'] {
            for (key, _) in backend.range(&[prefix], &[prefix + 1], usize::MAX).unwrap() {
                writes.push(Write::Remove(key));
            }
        }
        assert_eq!(writes.len(), 5, "two pairs of references and the mark");
        let old = message(4, "see".to_owned(), &[&shared]);
        writes.push(Write::Put(
            keel_store::keys::event(&id("two"), 4),
            keel_core::codec::encode_v1(&old),
        ));
        backend.commit(&writes).unwrap();
    }
    let log = open(dir.path());
    for raw in ["one", "two"] {
        assert!(
            log.uses_blob(&id(raw), &shared).await.unwrap(),
            "the rebuilt references say {raw} names the blob"
        );
    }
    let deleted = log.delete(&id("one")).await.unwrap();
    assert_eq!(deleted.blobs_kept, vec![shared.clone()]);
    assert!(log.get_blob(&shared).await.unwrap().is_some());
    let deleted = log.delete(&id("two")).await.unwrap();
    assert_eq!(deleted.blobs_removed, vec![shared]);
}

/// On redb, deleting most of many conversations and reclaiming gives the
/// data directory's space back.
#[tokio::test]
async fn redb_a_reclaim_after_deleting_most_conversations_shrinks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = keel_store::open_redb(dir.path()).unwrap();
    let text = "word ".repeat(200);
    for n in 0..200 {
        let raw = format!("c{n}");
        log.append(&id(&raw), created(&raw)).await.unwrap();
        let events = (3..23).map(|seq| message(seq, text.clone(), &[])).collect();
        log.append(&id(&raw), events).await.unwrap();
    }
    let before = dir_bytes(dir.path());
    for n in 0..180 {
        log.delete(&id(&format!("c{n}"))).await.unwrap();
    }
    let reclaimed = log.reclaim().await.unwrap();
    assert_eq!(reclaimed.action, Reclaim::Compacted);
    let after = dir_bytes(dir.path());
    assert!(
        after < before && reclaimed.disk_bytes_after < reclaimed.disk_bytes_before,
        "{before} -> {after} bytes; {reclaimed:?}"
    );
    for n in 180..200 {
        assert_whole(&log, &format!("c{n}"), 22).await;
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let metadata = entry.metadata().unwrap();
            if metadata.is_dir() {
                dir_bytes(&entry.path())
            } else {
                metadata.len()
            }
        })
        .sum()
}

macro_rules! deletion {
    ($backend:ident, $open:expr) => {
        mod $backend {
            use super::*;

            #[allow(clippy::redundant_closure_call)]
            fn open() -> (tempfile::TempDir, Arc<dyn EventLog>) {
                let dir = tempfile::tempdir().unwrap();
                let log: Arc<dyn EventLog> = ($open)(dir.path());
                (dir, log)
            }

            #[tokio::test]
            async fn a_delete_removes_everything_of_the_conversation_and_nothing_else() {
                let (_dir, log) = open();
                super::a_delete_removes_everything_of_the_conversation_and_nothing_else(&*log)
                    .await;
            }

            #[tokio::test]
            async fn a_shared_blob_stays_until_its_last_referrer_goes() {
                let (_dir, log) = open();
                super::a_shared_blob_stays_until_its_last_referrer_goes(&*log).await;
            }

            #[tokio::test]
            async fn a_tool_results_image_keeps_its_blob() {
                let (_dir, log) = open();
                super::a_tool_results_image_keeps_its_blob(&*log).await;
            }

            #[tokio::test]
            async fn deleting_an_unknown_conversation_changes_nothing() {
                let (_dir, log) = open();
                super::deleting_an_unknown_conversation_changes_nothing(&*log).await;
            }

            #[tokio::test]
            async fn a_deleted_id_can_be_created_again_from_seq_one() {
                let (_dir, log) = open();
                super::a_deleted_id_can_be_created_again_from_seq_one(&*log).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn deletes_interleaved_with_concurrent_appends() {
                let (_dir, log) = open();
                super::deletes_interleaved_with_concurrent_appends(log).await;
            }

            #[tokio::test]
            async fn children_are_the_sub_agents_a_parent_started() {
                let (_dir, log) = open();
                super::children_are_the_sub_agents_a_parent_started(&*log).await;
            }

            #[tokio::test]
            async fn uploads_waiting_for_their_message_are_kept() {
                let (_dir, log) = open();
                super::uploads_waiting_for_their_message_are_kept(&*log).await;
            }

            #[tokio::test]
            async fn reclaim_reports_what_the_engine_did() {
                let (_dir, log) = open();
                super::reclaim_reports_what_the_engine_did(&*log).await;
            }
        }
    };
}

deletion!(memory, |_dir: &Path| Arc::new(
    keel_store::open_memory().unwrap()
));
deletion!(sled, |dir: &Path| Arc::new(
    keel_store::open_sled(dir).unwrap()
));
deletion!(redb, |dir: &Path| Arc::new(
    keel_store::open_redb(dir).unwrap()
));

#[tokio::test]
async fn redb_a_delete_survives_a_reopen() {
    a_delete_survives_a_reopen(|dir| Arc::new(keel_store::open_redb(dir).unwrap())).await;
}

#[tokio::test]
async fn sled_a_delete_survives_a_reopen() {
    a_delete_survives_a_reopen(|dir| Arc::new(keel_store::open_sled(dir).unwrap())).await;
}

#[tokio::test]
async fn redb_references_are_rebuilt_for_a_store_that_lacks_them() {
    references_are_rebuilt_for_a_store_that_lacks_them(
        |dir| Arc::new(keel_store::open_redb(dir).unwrap()),
        |dir| keel_store::RedbBackend::open(&dir.join("keel.redb")).unwrap(),
    )
    .await;
}

#[tokio::test]
async fn sled_references_are_rebuilt_for_a_store_that_lacks_them() {
    references_are_rebuilt_for_a_store_that_lacks_them(
        |dir| Arc::new(keel_store::open_sled(dir).unwrap()),
        |dir| keel_store::SledBackend::open(&dir.join("sled")).unwrap(),
    )
    .await;
}
