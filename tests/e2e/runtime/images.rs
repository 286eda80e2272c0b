//! Images through the runtime, against `keel mock-llm`: an attached image
//! is checked, scaled down, stored and sent; a bad one refuses its message
//! and leaves no trace.

use std::io::Cursor;

use image::{ImageFormat as Codec, RgbImage};
use keel_actors::core::event::Event;
use keel_actors::core::message::ImageRef;
use keel_actors::image::{content_hash, image_data, ImageProblem};
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
    let images = logged_images(&log(&runtime, &conversation));
    assert_eq!(images.len(), 1, "{images:?}");
    let image = &images[0];
    assert_eq!(image.media_type, "image/png");
    assert_eq!((image.width, image.height), (1568, 1045));
    let stored = runtime
        .store()
        .get_blob(&image.hash)
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
    let last_seq = runtime.store().last_seq(conversation.id()).unwrap();

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
        runtime.store().last_seq(conversation.id()).unwrap(),
        last_seq,
        "nothing was logged"
    );
    assert_eq!(
        runtime.store().get_blob(&content_hash(&good)).unwrap(),
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
        runtime.store().last_seq(conversation.id()).unwrap(),
        last_seq
    );
    runtime.shutdown().await;
}
