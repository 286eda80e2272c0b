//! An SSE body's keep-alive: a comment ([`super::frame::KEEP_ALIVE`]) once
//! a stream has sent nothing for an interval, so that proxies and clients
//! with idle timeouts keep the connection open.
//!
//! axum's `Sse` has one, but it only takes axum's `sse::Event`s, which the
//! daemon no longer builds (it sends frames rendered once per conversation,
//! as `Bytes`). This one also does less per frame: axum moves its timer in
//! the timer wheel on every event; here a frame only notes the time, and
//! the timer, when it fires, is moved to a full interval after the last
//! frame if one came meanwhile. An idle stream costs one wake-up per
//! interval, a busy one none.

use std::convert::Infallible;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::{Instant, Sleep};

use super::frame;

/// `frames`, with a keep-alive comment after every `interval` without one.
/// Ends when `frames` ends.
pub struct KeepAlive<S> {
    frames: Pin<Box<S>>,
    timer: Pin<Box<Sleep>>,
    interval: Duration,
    /// When the stream last sent something (a frame or a comment): the
    /// next comment is due an interval after it.
    last_sent: Instant,
    /// Frames went out since `last_sent` was last set.
    sent_unnoted: bool,
    /// The task the timer last registered, while it is still set: a
    /// wake-up for a frame need not poll the timer again (a call into
    /// tokio's timer per frame per stream) unless it has fired.
    registered: Option<Waker>,
}

impl<S: Stream<Item = Bytes>> KeepAlive<S> {
    pub fn new(frames: S, interval: Duration) -> KeepAlive<S> {
        let now = Instant::now();
        KeepAlive {
            frames: Box::pin(frames),
            timer: Box::pin(tokio::time::sleep_until(now + interval)),
            interval,
            last_sent: now,
            sent_unnoted: false,
            registered: None,
        }
    }
}

impl<S: Stream<Item = Bytes>> Stream for KeepAlive<S> {
    /// Never an error: the body's error type, for `Body::from_stream`.
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Every field is `Unpin` (the stream and the timer are boxed).
        let this = &mut *self;
        // Frames first: the timer is only looked at while none is ready,
        // and a pending frame is never dropped for a comment.
        match this.frames.as_mut().poll_next(cx) {
            Poll::Ready(Some(bytes)) => {
                // The time is read once the burst is out (below), not per
                // frame: a wave of several frames costs one clock read.
                this.sent_unnoted = true;
                return Poll::Ready(Some(Ok(bytes)));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        if std::mem::take(&mut this.sent_unnoted) {
            this.last_sent = Instant::now();
        }
        if !this.timer.is_elapsed()
            && this
                .registered
                .as_ref()
                .is_some_and(|registered| registered.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                this.registered = Some(cx.waker().clone());
                return Poll::Pending;
            }
            this.registered = None;
            let due = this.last_sent + this.interval;
            let now = Instant::now();
            if due > now {
                // Frames went out since the timer was set: wait a full
                // interval from the last one (polled again to register).
                this.timer.as_mut().reset(due);
                continue;
            }
            this.last_sent = now;
            this.timer.as_mut().reset(now + this.interval);
            return Poll::Ready(Some(Ok(frame::KEEP_ALIVE)));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use futures_util::StreamExt as _;
    use tokio::sync::mpsc;

    use super::*;

    const INTERVAL: Duration = Duration::from_secs(15);

    fn frames(receiver: mpsc::UnboundedReceiver<Bytes>) -> impl Stream<Item = Bytes> {
        futures_util::stream::unfold(receiver, |mut receiver| async move {
            let frame = receiver.recv().await?;
            Some((frame, receiver))
        })
    }

    /// The next item and how long after `since` it came (paused time).
    async fn next_after<S: Stream<Item = Bytes>>(
        stream: &mut KeepAlive<S>,
        since: Instant,
    ) -> (Bytes, Duration) {
        let item = stream.next().await.expect("an item").expect("no error");
        (item, since.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_gets_a_comment_every_interval() {
        let (_sender, receiver) = mpsc::unbounded_channel();
        let start = Instant::now();
        let mut stream = KeepAlive::new(frames(receiver), INTERVAL);
        assert_eq!(
            next_after(&mut stream, start).await,
            (frame::KEEP_ALIVE, INTERVAL)
        );
        assert_eq!(
            next_after(&mut stream, start).await,
            (frame::KEEP_ALIVE, INTERVAL * 2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_puts_the_next_comment_a_full_interval_after_it() {
        let (sender, receiver) = mpsc::unbounded_channel();
        let start = Instant::now();
        let mut stream = KeepAlive::new(frames(receiver), INTERVAL);
        let frame = Bytes::from_static(b"event: live\ndata: {}\n\n");
        let later = frame.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            sender.send(later).unwrap();
            // Held open, so the stream does not end.
            std::future::pending::<()>().await;
        });
        assert_eq!(
            next_after(&mut stream, start).await,
            (frame, Duration::from_secs(10))
        );
        assert_eq!(
            next_after(&mut stream, start).await,
            (frame::KEEP_ALIVE, Duration::from_secs(25)),
            "not at 15 s: a frame went out at 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ready_frames_go_first_and_the_stream_ends_with_its_frames() {
        let (sender, receiver) = mpsc::unbounded_channel();
        for text in ["a", "b"] {
            sender.send(Bytes::from(text)).unwrap();
        }
        drop(sender);
        let mut stream = KeepAlive::new(frames(receiver), INTERVAL);
        tokio::time::advance(INTERVAL * 3).await;
        let items: Vec<Bytes> = stream.by_ref().map(Result::unwrap).collect().await;
        assert_eq!(items, [Bytes::from("a"), Bytes::from("b")]);
    }
}
