//! SSE frames rendered to bytes, whole: `event: NAME\n`, `id: SEQ\n` for a
//! canonical event, `data: JSON\n` and the blank line that ends the frame.
//!
//! A frame is rendered straight into the `Bytes` the response body sends,
//! with no intermediate SSE event type, so that an update published to a
//! conversation's subscribers is rendered once and the same bytes go to
//! every stream (`Wave::rendered` keeps them; see `super::Follow`).
//! The format is exactly what axum's `sse::Event` wrote before (the tests
//! below compare the two), so clients see no change.

use std::io::Write as _;

use bytes::Bytes;
use serde::Serialize;

use keel_actors::core::{ConversationId, Seq};
use keel_actors::Update;

use keel_api::types::{ApiEvent, ApiLiveEvent};

/// What an idle stream sends now and then: an SSE comment, which clients
/// ignore and proxies see as traffic.
pub const KEEP_ALIVE: Bytes = Bytes::from_static(b":\n\n");

/// A wave of updates, one frame each (a canonical event with its seq as
/// the `id`, a live one with no `id`), in one buffer: one write to the
/// client for all of them.
pub fn updates(conversation: &ConversationId, updates: &[Update]) -> Bytes {
    // Most frames (deltas, state changes) are well under this; a long
    // message grows the buffer as it goes.
    let mut frames = Vec::with_capacity(256 * updates.len());
    for update in updates {
        match update {
            Update::Event { event } => {
                let api = ApiEvent::new(conversation, event.as_ref().clone());
                render_into(&mut frames, "canonical", Some(event.seq), &api);
            }
            Update::Live { event } => render_into(
                &mut frames,
                "live",
                None,
                &ApiLiveEvent::from(event.clone()),
            ),
        }
    }
    Bytes::from(frames)
}

/// One frame: `event`, `id` when given, then `data` as compact JSON (which
/// never holds a raw line break, so it is one `data:` line).
pub fn render<T: Serialize>(name: &str, id: Option<Seq>, data: &T) -> Bytes {
    let mut frame = Vec::with_capacity(256);
    render_into(&mut frame, name, id, data);
    Bytes::from(frame)
}

/// [`render`] at the end of `frame`.
fn render_into<T: Serialize>(frame: &mut Vec<u8>, name: &str, id: Option<Seq>, data: &T) {
    frame.extend_from_slice(b"event: ");
    frame.extend_from_slice(name.as_bytes());
    frame.push(b'\n');
    if let Some(seq) = id {
        // Writing into a Vec cannot fail.
        let _ = writeln!(frame, "id: {seq}");
    }
    let fields = frame.len();
    frame.extend_from_slice(b"data: ");
    match serde_json::to_writer(&mut *frame, data) {
        Ok(()) => frame.extend_from_slice(b"\n\n"),
        Err(error) => {
            // Not expected (the API types serialise); the client still
            // gets the frame's name and id, with a comment saying why its
            // data is missing, as before.
            frame.truncate(fields);
            let why = error.to_string().replace(['\r', '\n'], " ");
            let _ = write!(frame, ": unserialisable frame: {why}\n\n");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use axum::response::sse::{Event as SseEvent, Sse};
    use axum::response::IntoResponse;
    use futures_util::stream;
    use keel_actors::core::event::{Event, EventKind};
    use keel_actors::core::{Generation, LiveEvent, StreamDelta, Timestamp};
    use keel_actors::Wave;
    use serde_json::json;

    use super::*;

    /// What axum's `Sse` wrote for `event`, the way the daemon built its
    /// events before it rendered frames itself.
    async fn axum_bytes(event: SseEvent) -> Bytes {
        let response =
            Sse::new(stream::iter([Ok::<_, std::convert::Infallible>(event)])).into_response();
        axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap()
    }

    fn axum_event<T: Serialize>(name: &'static str, id: Option<Seq>, data: &T) -> SseEvent {
        let event = SseEvent::default().event(name);
        let event = match id {
            Some(seq) => event.id(seq.to_string()),
            None => event,
        };
        event.data(serde_json::to_string(data).unwrap())
    }

    fn update(conversation: &ConversationId, update: &Update) -> Bytes {
        updates(conversation, std::slice::from_ref(update))
    }

    #[test]
    fn a_wave_is_its_frames_one_after_the_other() {
        let canonical = Update::Event {
            event: Arc::new(user_message(3)),
        };
        let live = Update::Live {
            event: LiveEvent::StateChanged {
                state: keel_actors::core::state::StateName::Streaming,
            },
        };
        let wave = updates(&conversation(), &[canonical.clone(), live.clone()]);
        let mut apart = update(&conversation(), &canonical).to_vec();
        apart.extend_from_slice(&update(&conversation(), &live));
        assert_eq!(wave.as_ref(), apart.as_slice());
        assert!(updates(&conversation(), &[]).is_empty());
    }

    fn conversation() -> ConversationId {
        ConversationId::new("c-frames".to_owned()).unwrap()
    }

    fn user_message(seq: Seq) -> Event {
        Event {
            seq,
            at: Timestamp::from_millis(1_700_000_000_000),
            parent: Some(1),
            triggers_turn: true,
            kind: EventKind::UserMessage {
                text: "line one\nline two \"quoted\"".to_owned(),
                images: Vec::new(),
            },
        }
    }

    #[tokio::test]
    async fn a_canonical_frame_is_byte_for_byte_what_axum_wrote() {
        let event = user_message(7);
        let api = ApiEvent::new(&conversation(), event.clone());
        let ours = update(
            &conversation(),
            &Update::Event {
                event: Arc::new(event),
            },
        );
        assert_eq!(
            ours,
            axum_bytes(axum_event("canonical", Some(7), &api)).await
        );
        let text = std::str::from_utf8(&ours).unwrap();
        assert!(
            text.starts_with("event: canonical\nid: 7\ndata: {"),
            "{text}"
        );
        assert!(text.ends_with("}\n\n"), "{text}");
        assert_eq!(text.matches('\n').count(), 4, "one line per field: {text}");
    }

    #[tokio::test]
    async fn a_live_frame_has_no_id_and_is_what_axum_wrote() {
        let live = LiveEvent::Delta {
            generation: Generation {
                turn: 2,
                attempt: 1,
            },
            delta: StreamDelta::Text {
                text: "par\ntial".to_owned(),
            },
        };
        let api = ApiLiveEvent::from(live.clone());
        let ours = update(&conversation(), &Update::Live { event: live });
        assert_eq!(ours, axum_bytes(axum_event("live", None, &api)).await);
        assert!(ours.starts_with(b"event: live\ndata: {"));
    }

    #[tokio::test]
    async fn snapshot_and_error_frames_are_what_axum_wrote() {
        let data = json!({"code": "catch_up_failed", "message": "a\nb"});
        assert_eq!(
            render("error", None, &data),
            axum_bytes(axum_event("error", None, &data)).await
        );
        assert_eq!(KEEP_ALIVE, axum_bytes(SseEvent::DEFAULT_KEEP_ALIVE).await);
    }

    /// The point of rendering into `Wave`: every subscriber gets the
    /// same bytes, rendered once.
    #[test]
    fn a_published_update_is_rendered_once_for_every_subscriber() {
        let published = Wave::new(Update::Event {
            event: Arc::new(user_message(3)),
        });
        let renders = std::sync::atomic::AtomicUsize::new(0);
        let render = |updates: &[Update]| {
            renders.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            super::updates(&conversation(), updates)
        };
        let first = published.rendered(render);
        let second = published.rendered(render);
        assert_eq!(renders.into_inner(), 1);
        assert_eq!(first, second);
        assert_eq!(first.as_ptr(), second.as_ptr(), "the same bytes, shared");
    }
}
