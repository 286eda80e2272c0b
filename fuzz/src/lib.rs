//! What the fuzz targets share: turning one fuzz input into the SSE events a
//! stream decoder is fed, the way keel-actors' `provider::read` does, and
//! driving a decoder through them while checking its contract.
//!
//! An input is read in one of two modes, chosen by its first byte:
//!
//! - bit 7 clear: the rest is a response body. It is cut into chunks of
//!   `2^(first & 0x0f)` bytes (1 B to 32 KiB, so events and UTF-8
//!   sequences straddle chunk edges) and framed by `sseer`, the parser
//!   keel-actors uses; `message` is renamed to the empty name, as there.
//! - bit 7 set: the rest is a list of `(event name, data)` pairs separated
//!   by NUL bytes, decoded as lossy UTF-8: events no SSE parser would
//!   produce (data with bare `\r`, names with spaces), to check that the
//!   decoders hold up without the framing's help.
//!
//! The seed corpus (see docs/fuzzing.md) is real streams with a `0x0e`
//! byte (16 KiB chunks) in front.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use keel_core::wire::{SseEvent, StreamDecoder};
use sseer::EventStream;

/// The events of `input`, as owned `(name, data)` pairs.
pub fn events(input: &[u8]) -> Vec<(String, String)> {
    let Some((&first, rest)) = input.split_first() else {
        return Vec::new();
    };
    if first & 0x80 == 0 {
        framed(rest, 1 << (first & 0x0f))
    } else {
        let mut fields = rest
            .split(|&byte| byte == 0)
            .map(|field| String::from_utf8_lossy(field).into_owned());
        let mut events = Vec::new();
        while let Some(name) = fields.next() {
            let data = fields.next().unwrap_or_default();
            events.push((name, data));
        }
        events
    }
}

/// `body` framed by sseer in `chunk`-byte pieces. A body that is not UTF-8
/// ends the events where sseer reports it, as the reader turns that into a
/// failure before the decoder sees more.
fn framed(body: &[u8], chunk: usize) -> Vec<(String, String)> {
    let body = Bytes::copy_from_slice(body);
    let chunks = (0..body.len())
        .step_by(chunk)
        .map(|start| Ok::<_, Infallible>(body.slice(start..body.len().min(start + chunk))));
    let mut stream = EventStream::new(futures_util::stream::iter(chunks));
    let mut events = Vec::new();
    while let Some(Ok(event)) = next_ready(&mut stream) {
        let name = match &*event.event {
            "message" => "",
            name => name,
        };
        events.push((name.to_owned(), event.data.to_string()));
    }
    events
}

/// The next item of a stream over memory, polled without an executor.
fn next_ready<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(stream).poll_next_unpin(&mut cx) {
        Poll::Ready(item) => item,
        // An in-memory stream is never pending; treat it as the end.
        Poll::Pending => None,
    }
}

/// Feeds every event to `decoder`, past `is_complete` too (the reader stops
/// there, but a decoder must not care), then finishes it. Panics (which
/// libFuzzer reports) when the decoder breaks its contract: a failure
/// reported by `feed` must be reported by every later `feed` and by
/// `finish`.
pub fn drive(mut decoder: Box<dyn StreamDecoder>, events: &[(String, String)]) {
    let mut failed = None;
    for (name, data) in events {
        let fed = decoder.feed(SseEvent { event: name, data });
        match (&failed, fed) {
            (None, Ok(_)) => {}
            (None, Err(failure)) => failed = Some(failure),
            (Some(first), Err(again)) => assert_eq!(*first, again, "a failure must stick"),
            (Some(_), Ok(_)) => panic!("feed succeeded after a failure"),
        }
    }
    let finished = decoder.finish();
    if let Some(first) = failed {
        assert_eq!(finished, Err(first), "finish must report feed's failure");
    }
}
