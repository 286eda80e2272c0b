//! Waiting for many subscribers of one conversation to see its turns end,
//! with one wake per turn rather than one per subscriber (`keel bench`'s
//! and the daemon bench's fan-out).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::anyhow;

/// How many of a conversation's subscribers have seen its turns end: the
/// sender of the next message waits on it with one wake per turn. (A wake
/// per subscriber, a channel message each, would take from the two cores
/// the CPU that the daemon being measured needs.)
#[derive(Debug)]
pub struct TurnTally {
    subscribers: usize,
    /// Turn ends seen, over all subscribers.
    seen: AtomicUsize,
    /// A follower went away before its last turn.
    failed: AtomicBool,
    notify: tokio::sync::Notify,
}

impl TurnTally {
    pub fn new(subscribers: usize) -> Arc<TurnTally> {
        Arc::new(TurnTally {
            subscribers: subscribers.max(1),
            seen: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
        })
    }

    /// One subscriber's side.
    pub fn follower(self: &Arc<TurnTally>) -> TallyFollower {
        TallyFollower {
            tally: self.clone(),
            finished: false,
        }
    }

    /// Wait until every subscriber has seen `turns` turns end; an error
    /// if a follower went away first.
    pub async fn wait_for(&self, turns: usize) -> anyhow::Result<()> {
        let target = turns * self.subscribers;
        while self.seen.load(Ordering::Acquire) < target {
            if self.failed.load(Ordering::Acquire) {
                return Err(anyhow!("a subscriber stopped reading"));
            }
            // A notice given before this wait is kept for it (`Notify`'s
            // permit), so none is missed between the check and the wait.
            self.notify.notified().await;
        }
        Ok(())
    }
}

/// A subscriber's side of a [`TurnTally`]. Dropped before
/// [`TallyFollower::finish`] (its task failed or panicked), it tells the
/// waiter.
#[derive(Debug)]
pub struct TallyFollower {
    tally: Arc<TurnTally>,
    finished: bool,
}

impl TallyFollower {
    pub fn turn_completed(&self) {
        let seen = self.tally.seen.fetch_add(1, Ordering::AcqRel) + 1;
        if seen.is_multiple_of(self.tally.subscribers) {
            self.tally.notify.notify_one();
        }
    }

    /// Every turn was seen.
    pub fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for TallyFollower {
    fn drop(&mut self) {
        if !self.finished {
            self.tally.failed.store(true, Ordering::Release);
            self.tally.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tally_waits_for_every_subscriber_and_hears_of_one_that_went_away() {
        let tally = TurnTally::new(2);
        let first = tally.follower();
        let second = tally.follower();
        first.turn_completed();
        let waiting = tokio::spawn({
            let tally = tally.clone();
            async move { tally.wait_for(1).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one of two has seen the turn end");
        second.turn_completed();
        waiting.await.unwrap().unwrap();

        first.turn_completed();
        first.finish();
        drop(second);
        let error = tally.wait_for(2).await.unwrap_err();
        assert!(error.to_string().contains("stopped reading"), "{error}");
    }
}
