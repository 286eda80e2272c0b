//! A crash-drill worker's book of approvals: which of its conversation's
//! calls wait for one, when it gives each, and which calls waited before a
//! kill with nobody having tried to approve them, so that the drill can
//! check they still wait after it (docs/drills.md, "pending approvals stay
//! pending").
//!
//! The book is kept apart from the worker's I/O so the drill's own
//! bookkeeping can be tested: a drill that calls its own approval a
//! violation is a false alarm, and a false alarm makes every real one
//! doubtful. The case that taught this: a kill landed right after a call
//! was suspended and before the client read the `suspended` event. On
//! reconnecting, the snapshot listed the call as pending, the worker
//! approved it at once, and then the stream replayed the `suspended` event
//! from the log. Read as news, it marked the call "untouched" again; the
//! turn ended before the worker looked at it twice, and every later
//! reconnect reported that the call "waited before the kill and not
//! after". A call the worker has asked about is never untouched again.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

/// One worker's approvals. Calls are tool-call ids of its conversation.
#[derive(Debug, Default)]
pub struct Approvals {
    /// Calls to approve, each with when.
    due: Vec<(String, Instant)>,
    /// Calls the worker has asked the daemon to approve, whether or not
    /// the daemon took it: whatever a stream replays of them later, the
    /// drill has touched them.
    asked: HashSet<String>,
    /// Calls suspended for an approval the worker has not asked for yet.
    untouched: BTreeSet<String>,
}

/// What a reconnect's snapshot said of the calls that waited untouched.
#[derive(Debug, PartialEq, Eq)]
pub struct Reconnected {
    /// Untouched calls the snapshot still lists as pending.
    pub still_pending: usize,
    /// Untouched calls it does not: somebody other than the drill
    /// resolved them, or the daemon lost them.
    pub gone: Vec<String>,
}

impl Approvals {
    /// A `suspended` event names `call`: approve it at `due`, unless the
    /// worker has asked about it already (the event is a replay).
    pub fn suspended(&mut self, call: &str, due: Instant) {
        if self.asked.contains(call) {
            return;
        }
        self.untouched.insert(call.to_owned());
        if !self.is_due(call) {
            self.due.push((call.to_owned(), due));
        }
    }

    /// A snapshot lists `call` as pending: approve it at `due`, unless it
    /// is already on the way.
    pub fn pending(&mut self, call: &str, due: Instant) {
        if self.asked.contains(call) || self.is_due(call) {
            return;
        }
        self.due.push((call.to_owned(), due));
    }

    /// The next call whose approval is due at `now`, taken off the list
    /// and counted as asked about.
    pub fn next_due(&mut self, now: Instant) -> Option<String> {
        let position = self.due.iter().position(|(_, due)| *due <= now)?;
        let (call, _) = self.due.remove(position);
        self.untouched.remove(&call);
        self.asked.insert(call.clone());
        Some(call)
    }

    /// The approval of `call` did not reach the daemon (it is between
    /// lives): ask again at `due`.
    pub fn retry(&mut self, call: &str, due: Instant) {
        if !self.is_due(call) {
            self.due.push((call.to_owned(), due));
        }
    }

    /// The stream reconnected and its snapshot lists `pending`: every call
    /// that waited untouched must still wait.
    pub fn reconnected(&self, pending: &HashSet<&str>) -> Reconnected {
        let mut still_pending = 0;
        let mut gone = Vec::new();
        for call in &self.untouched {
            if pending.contains(call.as_str()) {
                still_pending += 1;
            } else {
                gone.push(call.clone());
            }
        }
        Reconnected {
            still_pending,
            gone,
        }
    }

    fn is_due(&self, call: &str) -> bool {
        self.due.iter().any(|(due, _)| due == call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pending<'a>(calls: &[&'a str]) -> HashSet<&'a str> {
        calls.iter().copied().collect()
    }

    #[test]
    fn a_suspended_event_replayed_after_the_worker_approved_is_no_untouched_call() {
        // The case of `keel drill crash --kills 100 --seed 9`: the kill
        // lands after `suspended` is appended and before the client reads
        // it.
        let now = Instant::now();
        let mut approvals = Approvals::default();
        // The reconnect's snapshot lists the call; nothing waited
        // untouched before the kill.
        let after_first_kill = approvals.reconnected(&pending(&["toolu_mock_90"]));
        assert_eq!(after_first_kill.gone, Vec::<String>::new());
        approvals.pending("toolu_mock_90", now);
        // The worker approves it at once.
        assert_eq!(approvals.next_due(now).as_deref(), Some("toolu_mock_90"));
        // Then the stream replays `suspended` from the log.
        approvals.suspended("toolu_mock_90", now + Duration::from_millis(100));
        assert_eq!(approvals.next_due(now + Duration::from_secs(1)), None);
        // The turn ends; at the next kill the call is no longer pending,
        // and that is no violation: the drill approved it.
        let after_next_kill = approvals.reconnected(&pending(&[]));
        assert_eq!(
            after_next_kill,
            Reconnected {
                still_pending: 0,
                gone: vec![]
            }
        );
    }

    #[test]
    fn a_call_nobody_approved_that_is_gone_after_a_kill_is_reported() {
        let now = Instant::now();
        let mut approvals = Approvals::default();
        approvals.suspended("call_a", now + Duration::from_secs(1));
        approvals.suspended("call_b", now + Duration::from_secs(1));
        let reconnected = approvals.reconnected(&pending(&["call_a"]));
        assert_eq!(reconnected.still_pending, 1);
        assert_eq!(reconnected.gone, vec!["call_b".to_owned()]);
    }

    #[test]
    fn an_approval_that_did_not_reach_the_daemon_is_asked_again_and_never_untouched() {
        let now = Instant::now();
        let mut approvals = Approvals::default();
        approvals.suspended("call_a", now);
        assert_eq!(approvals.next_due(now).as_deref(), Some("call_a"));
        approvals.retry("call_a", now + Duration::from_millis(50));
        assert_eq!(approvals.next_due(now), None);
        // The snapshot after the restart lists it: it is on the way
        // already, not scheduled twice.
        approvals.pending("call_a", now);
        assert_eq!(
            approvals
                .next_due(now + Duration::from_millis(50))
                .as_deref(),
            Some("call_a")
        );
        assert_eq!(approvals.next_due(now + Duration::from_secs(1)), None);
        assert!(approvals.reconnected(&pending(&[])).gone.is_empty());
    }

    #[test]
    fn a_call_is_due_once_however_often_it_is_announced() {
        let now = Instant::now();
        let mut approvals = Approvals::default();
        approvals.pending("call_a", now);
        approvals.suspended("call_a", now);
        approvals.pending("call_a", now);
        assert_eq!(approvals.next_due(now).as_deref(), Some("call_a"));
        assert_eq!(approvals.next_due(now), None);
    }
}
