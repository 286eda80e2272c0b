//! Any bytes as the body of each JSON request the daemon reads
//! (`ApiJson<T>` is `axum::Json<T>`: `serde_json::from_slice`). Nothing may
//! panic. A `SendMessage` that parses goes on as the handler takes it: each
//! image's data from standard base64, then the runtime's validation
//! (`keel_actors::image::prepare` under the upload limits, what
//! `prepare_uploads` runs for each image).
//!
//! Random JSON rarely holds a decodable image, so an input whose first byte
//! is `0xff` skips the JSON: the rest is image bytes, validated under each
//! supported media type.
#![no_main]

use base64::Engine as _;
use keel_api::types::{CreateConversation, ResolveRequest, SendMessage};
use keel_actors::image::{prepare, ImageLimits};
use libfuzzer_sys::fuzz_target;

const MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

fuzz_target!(|input: &[u8]| {
    if let Some((0xff, image)) = input.split_first() {
        for media_type in MEDIA_TYPES {
            let _ = prepare(image.to_vec(), media_type, &ImageLimits::for_upload());
        }
        return;
    }
    let _ = serde_json::from_slice::<CreateConversation>(input);
    let _ = serde_json::from_slice::<ResolveRequest>(input);
    let Ok(message) = serde_json::from_slice::<SendMessage>(input) else {
        return;
    };
    for image in message.images {
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(image.data.trim()) else {
            continue;
        };
        let _ = prepare(bytes, &image.media_type, &ImageLimits::for_upload());
    }
});
