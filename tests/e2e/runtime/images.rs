//! Images through the runtime, against `keel mock-llm`: an attached image
//! is checked, scaled down, stored and sent; a bad one refuses its message
//! and leaves no trace; and an image of the history that can no longer be
//! loaded is left out of the request with a note, a live warning follows,
//! and the turn completes instead of failing on it forever.

use std::io::Cursor;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use image::{ImageFormat as Codec, RgbImage};
use keel_actors::core::event::Event;
use keel_actors::core::ids::{ConversationId, Seq};
use keel_actors::core::message::{ContentBlock, ImageRef};
use keel_actors::core::reducer::WorkingSet;
use keel_actors::core::snapshot::FsmSnapshot;
use keel_actors::image::{content_hash, image_data, ImageProblem};
use keel_actors::store::{EventLog, IndexEntry};
use keel_actors::{Error, ImageUpload};
use serde_json::Value;

use super::*;

/// A PNG of a smooth gradient, `width`×`height`.
fn png(width: u32, height: u32) -> Vec<u8> {
    let image = RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x * 255 / width) as u8, (y * 255 / height) as u8, 128])
    });
    let mut bytes = Cursor::new(Vec::new());
    image.write_to(&mut bytes, Codec::Png).unwrap();
    bytes.into_inner()
}

/// Follows `watch` to the end of the turn in progress and returns the live
/// events heard on the way; a turn that fails fails the test.
async fn finish_turn(watch: &mut Watch) -> Vec<LiveEvent> {
    let followed = tokio::time::timeout(PATIENCE, async {
        let mut live = Vec::new();
        loop {
            match watch.next().await {
                Received::Update(Update::Event { event }) => match &event.kind {
                    EventKind::TurnCompleted { .. } => return live,
                    EventKind::TurnFailed { .. } => panic!("the turn failed: {event:?}"),
                    _ => {}
                },
                Received::Update(Update::Live { event }) => live.push(event),
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    followed.unwrap_or_else(|_| panic!("the turn did not end within {PATIENCE:?}"))
}

/// The content blocks of type `kind` in every message a recorded
/// Anthropic request carried.
fn blocks<'a>(record: &'a Value, kind: &str) -> Vec<&'a Value> {
    record["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|message| message["content"].as_array())
        .flatten()
        .filter(|block| block["type"] == kind)
        .collect()
}

/// The images the user messages of the log refer to.
fn logged_images(events: &[Event]) -> Vec<ImageRef> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::UserMessage { images, .. } => Some(images.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_png_is_downscaled_stored_and_sent() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut watch = watch(&conversation).await;

    let upload = ImageUpload::new("image/png", png(3000, 2000));
    conversation
        .send("what is in this picture?", vec![upload])
        .await
        .unwrap();
    finish_turn(&mut watch).await;

    // Scaled to the long edge every provider takes, aspect ratio kept.
    let images = logged_images(&log(&runtime, &conversation).await);
    assert_eq!(images.len(), 1, "{images:?}");
    let image = &images[0];
    assert_eq!(image.media_type, "image/png");
    assert_eq!((image.width, image.height), (1568, 1045));
    let stored = runtime
        .store()
        .get_blob(&image.hash)
        .await
        .unwrap()
        .expect("the blob is stored");
    assert_eq!(content_hash(&stored), image.hash);
    assert_eq!(stored.len() as u64, image.size);
    let decoded = image::load_from_memory(&stored).unwrap();
    assert_eq!((decoded.width(), decoded.height()), (1568, 1045));

    // The provider received exactly the stored bytes, beside the text.
    let records = rig.mock.wait_ended(1).await;
    let sent = blocks(&records[0], "image");
    assert_eq!(sent.len(), 1, "{}", records[0]["body"]);
    assert_eq!(sent[0]["source"]["media_type"], "image/png");
    assert_eq!(
        sent[0]["source"]["data"],
        image_data("image/png", &stored).base64
    );
    assert!(blocks(&records[0], "text")
        .iter()
        .any(|block| block["text"] == "what is in this picture?"));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_an_undecodable_image_is_refused_and_leaves_no_trace() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let last_seq = runtime.store().last_seq(conversation.id()).await.unwrap();

    // A good image first: it must not be stored either.
    let good = png(64, 48);
    let whole = png(200, 100);
    let truncated = whole[..whole.len() / 2].to_vec();
    let error = conversation
        .send(
            "two pictures",
            vec![
                ImageUpload::new("image/png", good.clone()),
                ImageUpload::new("image/png", truncated),
            ],
        )
        .await
        .unwrap_err();

    match &error {
        Error::InvalidImage {
            index: 1,
            count: 2,
            problem: ImageProblem::Undecodable { .. },
        } => {}
        other => panic!("expected image 1 to be refused as undecodable, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.starts_with("image 2 of 2 was refused: the PNG image cannot be decoded"),
        "{message}"
    );
    assert_eq!(
        runtime.store().last_seq(conversation.id()).await.unwrap(),
        last_seq,
        "nothing was logged"
    );
    assert_eq!(
        runtime
            .store()
            .get_blob(&content_hash(&good))
            .await
            .unwrap(),
        None,
        "no blob was stored"
    );
    assert!(rig.mock.requests().await.is_empty(), "nothing was sent");

    // Bytes that contradict their declared type are refused the same way.
    let error = conversation
        .send("a jpeg?", vec![ImageUpload::new("image/jpeg", good)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidImage {
                index: 0,
                count: 1,
                problem: ImageProblem::MediaTypeMismatch { .. },
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        runtime.store().last_seq(conversation.id()).await.unwrap(),
        last_seq
    );
    runtime.shutdown().await;
}

/// What goes wrong with a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlobFault {
    /// The store no longer has it.
    Missing,
    /// The store returns other bytes under its hash.
    Damaged,
}

/// A store whose blob `hash` goes bad on demand; everything else is the
/// wrapped store's.
struct FaultyBlobs {
    inner: Arc<dyn EventLog>,
    fault: Mutex<Option<(String, BlobFault)>>,
}

impl FaultyBlobs {
    fn set(&self, fault: Option<(String, BlobFault)>) {
        *self.fault.lock().unwrap() = fault;
    }
}

#[async_trait]
impl EventLog for FaultyBlobs {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn append(
        &self,
        conversation: &ConversationId,
        events: Vec<Event>,
    ) -> keel_actors::store::Result<()> {
        self.inner.append(conversation, events).await
    }

    async fn read(
        &self,
        conversation: &ConversationId,
        from: Seq,
        limit: usize,
    ) -> keel_actors::store::Result<Vec<Event>> {
        self.inner.read(conversation, from, limit).await
    }

    async fn read_tail(
        &self,
        conversation: &ConversationId,
        n: usize,
    ) -> keel_actors::store::Result<Vec<Event>> {
        self.inner.read_tail(conversation, n).await
    }

    async fn last_seq(&self, conversation: &ConversationId) -> keel_actors::store::Result<Seq> {
        self.inner.last_seq(conversation).await
    }

    async fn save_snapshot(
        &self,
        conversation: &ConversationId,
        snapshot: &FsmSnapshot,
    ) -> keel_actors::store::Result<()> {
        self.inner.save_snapshot(conversation, snapshot).await
    }

    async fn load_snapshot(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<Option<FsmSnapshot>> {
        self.inner.load_snapshot(conversation).await
    }

    async fn save_checkpoint(
        &self,
        conversation: &ConversationId,
        working: &WorkingSet,
    ) -> keel_actors::store::Result<()> {
        self.inner.save_checkpoint(conversation, working).await
    }

    async fn load_checkpoint(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<Option<WorkingSet>> {
        self.inner.load_checkpoint(conversation).await
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> keel_actors::store::Result<String> {
        self.inner.put_blob(bytes).await
    }

    async fn get_blob(&self, hash: &str) -> keel_actors::store::Result<Option<Vec<u8>>> {
        let fault = self.fault.lock().unwrap().clone();
        let bytes = self.inner.get_blob(hash).await?;
        Ok(match fault {
            Some((faulty, BlobFault::Missing)) if faulty == hash => None,
            Some((faulty, BlobFault::Damaged)) if faulty == hash => bytes.map(|mut bytes| {
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0xFF;
                bytes
            }),
            _ => bytes,
        })
    }

    async fn index_entry(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<Option<IndexEntry>> {
        self.inner.index_entry(conversation).await
    }

    async fn list(&self, include_sub_agents: bool) -> keel_actors::store::Result<Vec<IndexEntry>> {
        self.inner.list(include_sub_agents).await
    }

    async fn delete(
        &self,
        conversation: &ConversationId,
    ) -> keel_actors::store::Result<keel_actors::store::Deleted> {
        self.inner.delete(conversation).await
    }

    async fn sweep_unreferenced_blobs(
        &self,
        older_than: std::time::Duration,
    ) -> keel_actors::store::Result<keel_actors::store::Swept> {
        self.inner.sweep_unreferenced_blobs(older_than).await
    }

    async fn reclaim(&self) -> keel_actors::store::Result<keel_actors::store::Reclaimed> {
        self.inner.reclaim().await
    }
}

/// An image attached and sent once goes bad in the store; the next turn
/// must still complete, with a note where the image was and a warning for
/// the subscriber; once the blob reads again, the image is sent again.
async fn an_image_that_went_bad_is_left_out_and_the_turn_completes(fault: BlobFault, reason: &str) {
    let rig = Rig::new();
    let store = Arc::new(FaultyBlobs {
        inner: rig.store(BackendKind::Memory),
        fault: Mutex::new(None),
    });
    let runtime = rig.runtime(store.clone()).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut watch = watch(&conversation).await;

    let upload = ImageUpload::new("image/png", png(64, 48));
    conversation.send("look", vec![upload]).await.unwrap();
    finish_turn(&mut watch).await;
    let image = logged_images(&log(&runtime, &conversation).await).remove(0);
    assert_eq!(blocks(&rig.mock.wait_ended(1).await[0], "image").len(), 1);

    store.set(Some((image.hash.clone(), fault)));
    conversation.send("still there?", Vec::new()).await.unwrap();
    let live = finish_turn(&mut watch).await;

    let warnings: Vec<&LiveEvent> = live
        .iter()
        .filter(|event| matches!(event, LiveEvent::ImageOmitted { .. }))
        .collect();
    assert_eq!(warnings.len(), 1, "{live:?}");
    let LiveEvent::ImageOmitted {
        hash, reason: said, ..
    } = warnings[0]
    else {
        unreachable!()
    };
    assert_eq!(hash, &image.hash);
    assert_eq!(said, reason);

    let records = rig.mock.wait_ended(2).await;
    assert!(
        blocks(&records[1], "image").is_empty(),
        "{}",
        records[1]["body"]
    );
    let note = format!(
        "[image {} could not be included: {reason}]",
        &image.hash[..12]
    );
    assert!(
        blocks(&records[1], "text")
            .iter()
            .any(|block| block["text"] == note.as_str()),
        "the note stands in for the image: {}",
        records[1]["body"]
    );
    // The history still holds the image: the log is not rewritten.
    let inspection = conversation.inspect().await.unwrap();
    assert!(inspection.messages[0]
        .content
        .contains(&ContentBlock::Image {
            image: image.clone()
        }));
    assert_eq!(inspection.error, None);

    // Once the blob reads again, the next request carries the image.
    store.set(None);
    conversation.send("and now?", Vec::new()).await.unwrap();
    let live = finish_turn(&mut watch).await;
    assert!(
        !live
            .iter()
            .any(|event| matches!(event, LiveEvent::ImageOmitted { .. })),
        "{live:?}"
    );
    let records = rig.mock.wait_ended(3).await;
    assert_eq!(blocks(&records[2], "image").len(), 1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_blob_is_left_out_and_the_turn_completes() {
    an_image_that_went_bad_is_left_out_and_the_turn_completes(
        BlobFault::Missing,
        "it is missing from the store",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_image_blob_is_left_out_and_the_turn_completes() {
    an_image_that_went_bad_is_left_out_and_the_turn_completes(
        BlobFault::Damaged,
        "the stored bytes of the image are damaged (they no longer match its hash)",
    )
    .await;
}
