//! The daemon's stop signal as one event stream waits on it, registered
//! with the signal's channel once per stream rather than once per frame.
//!
//! A stream waits for its next update or for the daemon to stop, whichever
//! comes first. Waiting with `select!` on `watch::Receiver::changed()` made
//! a new waiter, put it on the channel's list under its lock and took it
//! off again every time a stream woke for a frame: with a thousand streams
//! of one conversation that was a lock taken twice per frame per stream,
//! the largest user-space cost of the fan-out after the frames themselves
//! (measured with `perf`). Here the waiter is made once and stays on the
//! list; a wake-up for a frame only checks the channel's version (one
//! atomic load) and that the stream's task is the one registered.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::sync::watch;

pub struct Stop {
    /// `true` once the daemon starts to stop. Only ever changes to `true`,
    /// so any change means stop.
    stopping: watch::Receiver<bool>,
    /// Waits on a clone of `stopping`; made once, polled only to register
    /// a task that is not already registered.
    waiting: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    /// The task `waiting` last registered: the channel wakes it on a stop.
    registered: Option<Waker>,
    stopped: bool,
}

impl Stop {
    pub fn new(stopping: watch::Receiver<bool>) -> Stop {
        let mut waiting_on = stopping.clone();
        // A stop sent before this receiver was cloned is no change to it.
        let stopped = *stopping.borrow();
        Stop {
            stopping,
            waiting: Box::pin(async move {
                // A dropped sender counts as a stop, as with `changed()`.
                let _ = waiting_on.wait_for(|stopping| *stopping).await;
            }),
            registered: None,
            stopped,
        }
    }

    /// Whether the daemon has started to stop (cheap: no lock).
    pub fn is_stopping(&self) -> bool {
        self.stopped || self.stopping.has_changed().unwrap_or(true)
    }

    /// Ready once the daemon starts to stop; until then registers the
    /// calling task to be woken then.
    pub fn poll_stopped(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_stopping() {
            self.stopped = true;
            return Poll::Ready(());
        }
        if self
            .registered
            .as_ref()
            .is_some_and(|registered| registered.will_wake(cx.waker()))
        {
            // Registered already: a stop wakes this task, and the check
            // above then sees it.
            return Poll::Pending;
        }
        match self.waiting.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.stopped = true;
                Poll::Ready(())
            }
            Poll::Pending => {
                self.registered = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::future::poll_fn;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_waiting_stream_is_woken_by_the_stop() {
        let (sender, receiver) = watch::channel(false);
        let (registered, is_registered) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(async move {
            let mut stop = Stop::new(receiver);
            // Polled several times before the stop, as a stream is for
            // its frames: registered once, and woken all the same.
            for _ in 0..3 {
                let once = poll_fn(|cx| Poll::Ready(stop.poll_stopped(cx))).await;
                assert!(once.is_pending(), "no stop yet");
            }
            registered.send(()).unwrap();
            poll_fn(|cx| stop.poll_stopped(cx)).await;
            assert!(stop.is_stopping());
        });
        is_registered.await.unwrap();
        sender.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the stop")
            .unwrap();
    }

    #[tokio::test]
    async fn a_stream_opened_after_the_stop_sees_it() {
        let (sender, receiver) = watch::channel(false);
        sender.send(true).unwrap();
        let mut stop = Stop::new(receiver);
        assert!(stop.is_stopping());
        poll_fn(|cx| stop.poll_stopped(cx)).await;
    }
}
