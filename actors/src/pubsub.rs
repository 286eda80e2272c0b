//! Live updates for subscribers (the second event plane: canonical events
//! go to the log first, and everything is also broadcast live). Each
//! conversation actor owns one `tokio::sync::broadcast` channel, created on
//! the first subscription and dropped as soon as nobody listens (a
//! [`Subscription`] tells its actor when it is dropped), so a conversation
//! nobody watches holds no buffer.
//!
//! A subscription starts with a [`View`] taken inside the actor, in the same
//! handler that registers the receiver, so the live tail continues exactly
//! after the view's `last_seq`: no gap and no duplicate between them. A slow
//! subscriber never slows the conversation: it lags, loses live-only
//! updates (deltas, tool output) and is told so, and then reads the
//! canonical events it missed from the log, in order, without duplicates.
//! So a subscriber sees every canonical event exactly once, in seq order.
//!
//! The channel carries each update once, as an `Arc<`[`Wave`]`>`:
//! a thousand subscribers share one allocation instead of each cloning the
//! event, and [`Wave::rendered`] lets an embedder derive something from
//! an update once for all of them (the daemon renders its SSE frame there,
//! so the same JSON is not made a thousand times). This crate stays out of
//! what is rendered: the slot is type-erased.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::broadcast;
use tokio::time::Instant;

use keel_core::event::{Event, PendingCall};
use keel_core::ids::{ConversationId, Seq};
use keel_core::message::{Message, Usage};
use keel_core::reducer::WorkingSet;
use keel_core::state::{Phase, StateName};
use keel_core::LiveEvent;
use keel_store::EventLog;

/// How many waves a subscriber may fall behind before it lags. Small:
/// the buffer is allocated whole while anyone watches, and a subscriber
/// that lags loses only live-only updates (it reads canonical ones from
/// the log).
pub(crate) const CHANNEL_CAPACITY: usize = 128;

/// How many canonical events a subscription reads from the log at once
/// when it resumes or catches up: what it holds in memory is bounded by
/// this, however much it missed.
pub(crate) const CATCH_UP_PAGE: usize = 256;

/// How many of the latest messages a view carries; older ones are in the log.
pub const VIEW_MESSAGES: usize = 50;

/// One thing a subscriber hears about.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A canonical event, published right after it became durable.
    Event { event: Arc<Event> },
    /// A live-only event (deltas, tool output, state changes, retries).
    Live { event: LiveEvent },
}

/// What the channel carries: one wave of updates (one or more, in the
/// order they were published), sent once and shared by every subscriber of
/// the conversation through an `Arc`, with a slot that an embedder fills
/// once with what it derives from the wave (see [`Wave::rendered`]).
/// A wave is what one step of the conversation published, with the
/// live-only updates held for it (docs/requirements.md, "Live updates go
/// out in waves"): every subscriber is woken once for it, not once per
/// update.
pub struct Wave {
    updates: Vec<Update>,
    /// What the first caller of [`Wave::rendered`] derived from
    /// `updates`, for every later caller. Type-erased so that this crate
    /// does not learn an embedder's formats (the daemon keeps its SSE
    /// frames here).
    rendered: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl Wave {
    /// One update on its own.
    pub fn new(update: Update) -> Wave {
        Wave::of(vec![update])
    }

    /// Updates that go out together, oldest first.
    pub fn of(updates: Vec<Update>) -> Wave {
        Wave {
            updates,
            rendered: OnceLock::new(),
        }
    }

    /// The updates, in the order they were published.
    pub fn updates(&self) -> &[Update] {
        &self.updates
    }

    /// `render(updates)`, computed once for every holder of this wave:
    /// the first caller renders and keeps the result, later callers (the
    /// other subscribers) get a clone of it. A `T` should be cheap to
    /// clone (`bytes::Bytes`, an `Arc`). Every subscriber gets the first
    /// caller's result, so `render` may depend only on the updates and on
    /// what is the same for every subscriber of the conversation (its id),
    /// never on one subscriber's own state.
    ///
    /// The slot keeps one type. A caller asking for another type than the
    /// one kept (two embedders rendering one conversation differently in
    /// one process) gets `render` run for it, uncached: always right,
    /// cached for the first.
    ///
    /// Two subscribers that ask at the same moment do not both render: the
    /// second waits for the first (microseconds: a serialisation).
    pub fn rendered<T, F>(&self, render: F) -> T
    where
        T: Any + Send + Sync + Clone,
        F: Fn(&[Update]) -> T,
    {
        let kept = self
            .rendered
            .get_or_init(|| Box::new(render(&self.updates)));
        match kept.downcast_ref::<T>() {
            Some(value) => value.clone(),
            None => render(&self.updates),
        }
    }

    /// The updates, moved out when this was their last holder (an event
    /// read from the log for one subscriber), cloned otherwise.
    fn into_updates(published: Arc<Wave>) -> Vec<Update> {
        match Arc::try_unwrap(published) {
            Ok(published) => published.updates,
            Err(shared) => shared.updates.clone(),
        }
    }

    fn canonical(event: Arc<Event>) -> Arc<Wave> {
        Arc::new(Wave::new(Update::Event { event }))
    }

    /// The seq of the last canonical event in the wave; `None` when it
    /// holds only live-only updates.
    fn last_seq(&self) -> Option<Seq> {
        self.updates.iter().rev().find_map(Update::seq)
    }

    /// Whether the wave's canonical events are exactly `next`, `next + 1`,
    /// … (or there are none): a subscriber owed `next` takes it whole.
    fn follows(&self, next: Seq) -> bool {
        let mut expected = next;
        for seq in self.updates.iter().filter_map(Update::seq) {
            if seq != expected {
                return false;
            }
            expected = seq + 1;
        }
        true
    }
}

impl Update {
    /// The canonical event's seq; `None` for a live-only update.
    fn seq(&self) -> Option<Seq> {
        match self {
            Update::Event { event } => Some(event.seq),
            Update::Live { .. } => None,
        }
    }
}

impl std::fmt::Debug for Wave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wave")
            .field("updates", &self.updates)
            .field("rendered", &self.rendered.get().is_some())
            .finish()
    }
}

/// A consistent picture of a conversation at one log position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    pub id: ConversationId,
    pub state: StateName,
    /// The log position this view describes; the live tail's first canonical
    /// event is `last_seq + 1`.
    pub last_seq: Seq,
    pub cwd: String,
    pub usage: Usage,
    /// Calls waiting on a human or a client.
    pub pending: Vec<PendingCall>,
    /// Calls the sub-agents of its running `spawn_agents` call wait on;
    /// resolved through this conversation.
    pub child_pending: Vec<keel_core::ChildPendingCall>,
    /// The latest messages (at most [`VIEW_MESSAGES`]).
    pub recent_messages: Vec<Message>,
    /// Messages before `recent_messages` that the view leaves out.
    pub omitted_messages: usize,
}

impl View {
    /// The view of `working` in `state` (the conversation's phase name).
    pub(crate) fn of(working: &WorkingSet, state: StateName) -> View {
        let skip = working.messages.len().saturating_sub(VIEW_MESSAGES);
        View {
            id: working.id.clone(),
            state,
            last_seq: working.last_seq,
            cwd: working.cwd.clone(),
            usage: working.usage,
            pending: working.pending.clone(),
            // Only a live parent follows its children's calls.
            child_pending: Vec::new(),
            recent_messages: working.messages[skip..].to_vec(),
            omitted_messages: skip,
        }
    }

    /// The view of a conversation no actor serves, as it rests in the log.
    pub(crate) fn at_rest(working: &WorkingSet) -> View {
        View::of(working, Phase::from_status(working).name())
    }
}

/// What [`Subscription::next`] yields ([`Subscription::next_wave`]
/// yields the shared `Arc<Wave>` in place of the update).
#[derive(Debug, Clone, PartialEq)]
pub enum Received<U = Update> {
    Update(U),
    /// This subscriber fell `missed` waves (each one or more updates)
    /// behind and they are gone from the channel. The live-only ones among them (deltas, tool output,
    /// state changes) are lost; the canonical events among them come next,
    /// read from the log.
    Lagged {
        missed: u64,
    },
    /// Reading the log to catch up failed; the subscription goes on with
    /// the live tail, and the log still has everything.
    CatchUpFailed {
        error: String,
    },
    /// The conversation actor stopped (evicted, shut down or crashed);
    /// subscribe again to follow it.
    Closed,
}

/// A view, then every canonical event after it exactly once and in order
/// (from the log when the live channel could not keep them), with live
/// updates in between.
pub struct Subscription {
    pub view: View,
    /// `None` only while dropping.
    receiver: Option<broadcast::Receiver<Arc<Wave>>>,
    store: Arc<dyn EventLog>,
    /// The seq of the next canonical event this subscriber is owed.
    next_seq: Seq,
    /// Canonical events to yield before anything else: one page read from
    /// the log (each this subscriber's own), or the channel's event that
    /// came after a gap (shared). At most [`CATCH_UP_PAGE`] events and that
    /// one.
    backlog: VecDeque<Arc<Wave>>,
    /// Canonical events from `next_seq` on still to be read from the log,
    /// a page at a time as the backlog empties, before anything else.
    owed: Option<Owed>,
    /// The channel's update that came after a gap: it goes out once the log
    /// has filled the gap (`owed` is done).
    after_gap: Option<Arc<Wave>>,
    /// The updates of a wave this subscriber could not take whole (some of
    /// its events came from the log already, or a gap comes before them),
    /// one by one, after the backlog.
    split: VecDeque<Arc<Wave>>,
    /// The rest of the wave [`Subscription::next`] is handing out.
    unread: VecDeque<Update>,
    /// Tells the actor this subscription is dropped, so it can free its
    /// channel (the actor gives it; this module knows no actor).
    on_drop: Option<OnDrop>,
}

/// What a subscription does as it is dropped.
pub(crate) type OnDrop = Box<dyn FnOnce() + Send + Sync>;

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("view", &self.view)
            .field("next_seq", &self.next_seq)
            .field("backlog", &self.backlog.len())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) fn new(
        view: View,
        receiver: broadcast::Receiver<Arc<Wave>>,
        store: Arc<dyn EventLog>,
        on_drop: OnDrop,
    ) -> Subscription {
        Subscription {
            next_seq: view.last_seq + 1,
            view,
            receiver: Some(receiver),
            store,
            backlog: VecDeque::new(),
            owed: None,
            after_gap: None,
            split: VecDeque::new(),
            unread: VecDeque::new(),
            on_drop: Some(on_drop),
        }
    }

    /// Start the canonical events at `from` with `recent`, the latest
    /// events the actor appended (oldest first, the last one the view's
    /// `last_seq`), when they hold every event from `from` on: a follower
    /// that joins a turn it just started (from its message's seq) is
    /// served from memory, not from the log. `false`, changing nothing,
    /// when they do not; [`Subscription::starting_at`] then reads the log.
    pub(crate) fn starting_in_memory(&mut self, from: Seq, recent: &VecDeque<Arc<Event>>) -> bool {
        let from = from.max(1);
        let (Some(first), Some(last)) = (recent.front(), recent.back()) else {
            return false;
        };
        if from > self.view.last_seq || last.seq != self.view.last_seq || first.seq > from {
            return false;
        }
        let skip = (from - first.seq) as usize;
        let updates: Vec<Update> = recent
            .iter()
            .skip(skip)
            .map(|event| Update::Event {
                event: event.clone(),
            })
            .collect();
        let published = Arc::new(Wave::of(updates));
        if !published.follows(from) {
            return false;
        }
        self.next_seq = from;
        self.backlog.push_back(published);
        true
    }

    /// Start the canonical events at `from` instead of after the view: the
    /// events from `from` through the view's `last_seq` are read from the
    /// log and come first (a client resuming from the last seq it saw), a
    /// page of [`CATCH_UP_PAGE`] at a time. The first page is read here, so
    /// a log that cannot be read fails the call. Nothing is read when the
    /// events start there already ([`Subscription::starting_in_memory`]).
    pub(crate) async fn starting_at(
        mut self,
        from: Seq,
    ) -> Result<Subscription, keel_store::Error> {
        let from = from.max(1);
        if from < self.next_seq {
            self.next_seq = from;
            self.owed = Some(Owed {
                until: Some(self.view.last_seq + 1),
            });
            self.read_page().await?;
        }
        Ok(self)
    }

    /// The seq of the next canonical event this subscriber is owed: where
    /// a new subscription picks up if this one closes.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// The next thing this subscriber hears about, the update its own.
    pub async fn next(&mut self) -> Received {
        loop {
            if let Some(update) = self.unread.pop_front() {
                return Received::Update(update);
            }
            match self.next_wave().await {
                Received::Update(published) => {
                    self.unread.extend(Wave::into_updates(published));
                }
                Received::Lagged { missed } => return Received::Lagged { missed },
                Received::CatchUpFailed { error } => return Received::CatchUpFailed { error },
                Received::Closed => return Received::Closed,
            }
        }
    }

    /// The same as [`Subscription::next`], a wave at a time, as the
    /// channel shares it among the conversation's subscribers, so that
    /// what is derived from it through [`Wave::rendered`] is derived
    /// once. (Events read from the log for this subscriber, and the parts
    /// of a wave it could not take whole, are its own.)
    pub async fn next_wave(&mut self) -> Received<Arc<Wave>> {
        loop {
            if let Some(published) = self.backlog.pop_front() {
                if let Some(seq) = published.last_seq() {
                    self.next_seq = seq + 1;
                }
                return Received::Update(published);
            }
            if self.owed.is_some() {
                if let Err(error) = self.read_page().await {
                    // The subscription goes on with what comes next.
                    self.owed = None;
                    return Received::CatchUpFailed {
                        error: error.to_string(),
                    };
                }
                continue;
            }
            if let Some(published) = self.after_gap.take() {
                self.backlog.push_back(published);
                continue;
            }
            let published = match self.split.pop_front() {
                Some(published) => published,
                None => {
                    let Some(receiver) = self.receiver.as_mut() else {
                        return Received::Closed;
                    };
                    match receiver.recv().await {
                        Ok(published) => {
                            if published.follows(self.next_seq) {
                                if let Some(seq) = published.last_seq() {
                                    self.next_seq = seq + 1;
                                }
                                return Received::Update(published);
                            }
                            // Taken one update at a time, below.
                            self.split.extend(
                                published
                                    .updates()
                                    .iter()
                                    .map(|update| Arc::new(Wave::new(update.clone()))),
                            );
                            continue;
                        }
                        Err(broadcast::error::RecvError::Lagged(missed)) => {
                            // What it missed comes from the log next, to
                            // the log's end, a page at a time.
                            self.owed = Some(Owed { until: None });
                            return Received::Lagged { missed };
                        }
                        Err(broadcast::error::RecvError::Closed) => return Received::Closed,
                    }
                }
            };
            // One update of a split wave.
            match published.last_seq() {
                // Live-only.
                None => return Received::Update(published),
                // Already delivered from the log.
                Some(seq) if seq < self.next_seq => {}
                Some(seq) if seq > self.next_seq => {
                    // A gap the channel never reported: fill it from the
                    // log, then this update.
                    self.owed = Some(Owed { until: Some(seq) });
                    self.after_gap = Some(published);
                }
                Some(seq) => {
                    self.next_seq = seq + 1;
                    return Received::Update(published);
                }
            }
        }
    }

    /// Read the next page of what `owed` says from the log into the
    /// (empty) backlog: at most [`CATCH_UP_PAGE`] events from `next_seq`.
    /// A short page, or one that reaches `until`, settles the debt.
    async fn read_page(&mut self) -> Result<(), keel_store::Error> {
        let Some(owed) = self.owed else {
            return Ok(());
        };
        let limit = match owed.until {
            Some(until) => until
                .saturating_sub(self.next_seq)
                .min(CATCH_UP_PAGE as u64) as usize,
            None => CATCH_UP_PAGE,
        };
        let events = if limit == 0 {
            Vec::new()
        } else {
            self.store.read(&self.view.id, self.next_seq, limit).await?
        };
        let reached = events.last().map_or(self.next_seq, |event| event.seq + 1);
        let done = events.len() < limit || owed.until.is_some_and(|until| reached >= until);
        if done {
            self.owed = None;
        }
        self.backlog.extend(
            events
                .into_iter()
                .map(|event| Wave::canonical(Arc::new(event))),
        );
        Ok(())
    }
}

/// Canonical events a subscription still reads from the log: from its
/// `next_seq` up to (not including) `until`, or to the log's end.
#[derive(Debug, Clone, Copy)]
struct Owed {
    until: Option<Seq>,
}

impl Drop for Subscription {
    /// Let go of the channel first, then tell the actor: if this was the
    /// last subscriber, the actor frees the channel's buffer now rather than
    /// at its next idle check.
    fn drop(&mut self) {
        drop(self.receiver.take());
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
    }
}

/// The actor's side: a sender that exists only while someone listens,
/// the wave it is gathering, and the live-only updates it holds back for a
/// later wave.
///
/// Every send wakes every subscriber, and each woken stream is a write to
/// its client, so the publisher sends in waves
/// (docs/requirements.md, "Live updates go out in waves"). What one step
/// of the conversation publishes (the events it appended, the live updates
/// it sent) is gathered and goes out as one [`Wave`] when the step is
/// done or before the actor waits on anything ([`Publisher::send_wave`]),
/// so a canonical event is never held past its own step. A canonical event
/// takes the held live updates along, ahead of it. A live-only update
/// joins the wave when the actor's current message has sent or gathers
/// something, or when nothing was sent for `interval` (a first token after
/// a quiet wait is not delayed); otherwise it is held until `interval`
/// after the last send. The actor calls [`Publisher::finish_message`]
/// after each message and arms a flush at the deadline it returns. A zero
/// interval holds nothing.
#[derive(Debug)]
pub(crate) struct Publisher {
    sender: Option<broadcast::Sender<Arc<Wave>>>,
    interval: Duration,
    /// The wave being gathered, oldest first.
    wave: Vec<Update>,
    /// Live-only updates held for a later wave, oldest first. Only ever
    /// non-empty while `wave` is empty (whatever joins a wave takes them
    /// along first).
    held: Vec<Update>,
    /// When the channel last sent.
    last_sent: Option<Instant>,
    /// Something was sent while handling the actor's current message:
    /// more updates of the same message join a wave.
    sent_in_message: bool,
}

impl Publisher {
    pub(crate) fn new(interval: Duration) -> Publisher {
        Publisher {
            sender: None,
            interval,
            wave: Vec::new(),
            held: Vec::new(),
            last_sent: None,
            sent_in_message: false,
        }
    }

    /// A receiver of everything published from now on. Updates gathered or
    /// held before go out first, to the subscribers they were published to.
    pub(crate) fn subscribe(&mut self) -> broadcast::Receiver<Arc<Wave>> {
        self.flush();
        match &self.sender {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = broadcast::channel(CHANNEL_CAPACITY);
                self.sender = Some(sender);
                receiver
            }
        }
    }

    pub(crate) fn publish(&mut self, update: Update) {
        if self.sender.is_none() {
            return;
        }
        let joins = match update {
            Update::Event { .. } => true,
            Update::Live { .. } => {
                !self.wave.is_empty()
                    || self.sent_in_message
                    || self
                        .last_sent
                        .is_none_or(|last| Instant::now() >= last + self.interval)
            }
        };
        if joins {
            self.wave.append(&mut self.held);
            self.wave.push(update);
        } else {
            self.held.push(update);
        }
    }

    /// Send the wave gathered so far (nothing if there is none).
    pub(crate) fn send_wave(&mut self) {
        if self.wave.is_empty() {
            return;
        }
        let wave = std::mem::take(&mut self.wave);
        let Some(sender) = &self.sender else {
            self.held.clear();
            return;
        };
        if sender.send(Arc::new(Wave::of(wave))).is_err() {
            // Every receiver is gone: free the buffer.
            self.sender = None;
            self.held.clear();
            return;
        }
        self.last_sent = Some(Instant::now());
        self.sent_in_message = true;
    }

    /// Send everything gathered or held now.
    pub(crate) fn flush(&mut self) {
        if !self.held.is_empty() {
            let mut held = std::mem::take(&mut self.held);
            held.append(&mut self.wave);
            self.wave = held;
        }
        self.send_wave();
    }

    /// The actor is done with a message: the wave it gathered goes out,
    /// and the held updates are owed a flush at the returned deadline
    /// (`None`: nothing is held).
    pub(crate) fn finish_message(&mut self) -> Option<Instant> {
        self.send_wave();
        self.sent_in_message = false;
        if self.held.is_empty() {
            return None;
        }
        Some(
            self.last_sent
                .map_or_else(Instant::now, |last| last + self.interval),
        )
    }

    /// Drop the channel if nobody listens (idle eviction's first tier).
    pub(crate) fn release_if_unwatched(&mut self) {
        if self
            .sender
            .as_ref()
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            self.sender = None;
            self.wave = Vec::new();
            self.held = Vec::new();
        }
    }

    pub(crate) fn subscribers(&self) -> usize {
        self.sender
            .as_ref()
            .map_or(0, |sender| sender.receiver_count())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use keel_core::state::StateName;

    use super::*;

    fn live() -> Wave {
        Wave::new(Update::Live {
            event: LiveEvent::StateChanged {
                state: StateName::Idle,
            },
        })
    }

    #[test]
    fn a_wave_is_rendered_once_for_every_caller() {
        let published = Wave::of(vec![canonical(3), state(StateName::Idle)]);
        let renders = AtomicUsize::new(0);
        let render = |updates: &[Update]| {
            assert_eq!(updates.len(), 2);
            Arc::new(renders.fetch_add(1, Ordering::Relaxed))
        };
        let first = published.rendered(render);
        let second = published.rendered(render);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(renders.load(Ordering::Relaxed), 1);
    }

    fn state(state: StateName) -> Update {
        Update::Live {
            event: LiveEvent::StateChanged { state },
        }
    }

    fn event(seq: Seq) -> Event {
        Event {
            seq,
            at: keel_core::time::Timestamp::from_millis(0),
            parent: None,
            triggers_turn: false,
            kind: keel_core::event::EventKind::TurnStarted { turn: 1 },
        }
    }

    fn canonical(seq: Seq) -> Update {
        Update::Event {
            event: Arc::new(event(seq)),
        }
    }

    /// Every wave the receiver has been sent so far.
    fn drain(receiver: &mut broadcast::Receiver<Arc<Wave>>) -> Vec<Vec<Update>> {
        let mut got = Vec::new();
        while let Ok(published) = receiver.try_recv() {
            got.push(published.updates().to_vec());
        }
        got
    }

    const INTERVAL: Duration = Duration::from_millis(16);

    #[test]
    fn a_wave_follows_a_seq_when_its_events_start_there_without_a_gap() {
        let wave = Wave::of(vec![
            state(StateName::Streaming),
            canonical(4),
            canonical(5),
        ]);
        assert!(wave.follows(4));
        assert!(!wave.follows(3), "a gap before 4");
        assert!(!wave.follows(5), "4 was had already");
        assert_eq!(wave.last_seq(), Some(5));
        assert!(!Wave::of(vec![canonical(4), canonical(6)]).follows(4));
        let live_only = Wave::of(vec![state(StateName::Idle)]);
        assert!(live_only.follows(9));
        assert_eq!(live_only.last_seq(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn what_one_step_publishes_goes_out_as_one_wave() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut receiver = publisher.subscribe();
        publisher.publish(canonical(3));
        publisher.publish(canonical(4));
        publisher.publish(state(StateName::Streaming));
        assert!(
            drain(&mut receiver).is_empty(),
            "gathered until the step ends"
        );
        publisher.send_wave();
        assert_eq!(
            drain(&mut receiver),
            vec![vec![
                canonical(3),
                canonical(4),
                state(StateName::Streaming)
            ]]
        );
        // Later updates of the same message make a wave of their own.
        publisher.publish(state(StateName::Idle));
        assert_eq!(publisher.finish_message(), None);
        assert_eq!(drain(&mut receiver), vec![vec![state(StateName::Idle)]]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_update_after_a_quiet_interval_goes_out_with_its_message() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut receiver = publisher.subscribe();
        publisher.publish(state(StateName::Streaming));
        assert_eq!(publisher.finish_message(), None);
        assert_eq!(
            drain(&mut receiver),
            vec![vec![state(StateName::Streaming)]]
        );
        tokio::time::advance(INTERVAL).await;
        publisher.publish(state(StateName::Idle));
        assert_eq!(publisher.finish_message(), None);
        assert_eq!(drain(&mut receiver), vec![vec![state(StateName::Idle)]]);
    }

    #[tokio::test(start_paused = true)]
    async fn live_updates_soon_after_a_wave_wait_for_the_deadline() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut receiver = publisher.subscribe();
        publisher.publish(canonical(3));
        assert_eq!(publisher.finish_message(), None);
        let sent_at = Instant::now();
        drain(&mut receiver);

        tokio::time::advance(Duration::from_millis(2)).await;
        publisher.publish(state(StateName::Streaming));
        assert_eq!(publisher.finish_message(), Some(sent_at + INTERVAL));
        tokio::time::advance(Duration::from_millis(2)).await;
        publisher.publish(state(StateName::ExecutingTools));
        assert_eq!(
            publisher.finish_message(),
            Some(sent_at + INTERVAL),
            "the deadline is the wave's, not the newest update's"
        );
        assert!(drain(&mut receiver).is_empty(), "held");

        publisher.flush();
        assert_eq!(
            drain(&mut receiver),
            vec![vec![
                state(StateName::Streaming),
                state(StateName::ExecutingTools)
            ]]
        );
        assert_eq!(publisher.finish_message(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_canonical_event_is_never_held_and_takes_the_held_along_in_order() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut receiver = publisher.subscribe();
        publisher.publish(canonical(3));
        publisher.finish_message();
        drain(&mut receiver);
        tokio::time::advance(Duration::from_millis(1)).await;
        publisher.publish(state(StateName::Streaming));
        publisher.finish_message();
        tokio::time::advance(Duration::from_millis(1)).await;
        publisher.publish(canonical(4));
        publisher.publish(state(StateName::Idle));
        publisher.send_wave();
        assert_eq!(
            drain(&mut receiver),
            vec![vec![
                state(StateName::Streaming),
                canonical(4),
                state(StateName::Idle)
            ]]
        );
        assert_eq!(publisher.finish_message(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_update_sends_the_held_ones_first() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut receiver = publisher.subscribe();
        publisher.publish(canonical(3));
        publisher.finish_message();
        drain(&mut receiver);
        publisher.publish(state(StateName::Streaming));
        publisher.finish_message();
        // The flush was owed and has not come yet (a busy actor).
        tokio::time::advance(INTERVAL * 2).await;
        publisher.publish(state(StateName::Idle));
        publisher.finish_message();
        assert_eq!(
            drain(&mut receiver),
            vec![vec![state(StateName::Streaming), state(StateName::Idle)]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_subscriber_gets_nothing_gathered_or_held_from_before_it() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut first = publisher.subscribe();
        publisher.publish(canonical(3));
        publisher.finish_message();
        publisher.publish(state(StateName::Streaming));
        publisher.finish_message();
        publisher.publish(canonical(4));
        let mut second = publisher.subscribe();
        assert_eq!(
            drain(&mut first),
            vec![
                vec![canonical(3)],
                vec![state(StateName::Streaming), canonical(4)]
            ]
        );
        assert!(drain(&mut second).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_holds_nothing() {
        let mut publisher = Publisher::new(Duration::ZERO);
        let mut receiver = publisher.subscribe();
        publisher.publish(canonical(3));
        publisher.finish_message();
        publisher.publish(state(StateName::Streaming));
        assert_eq!(publisher.finish_message(), None);
        assert_eq!(
            drain(&mut receiver),
            vec![vec![canonical(3)], vec![state(StateName::Streaming)]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_held_for_nobody() {
        let mut publisher = Publisher::new(INTERVAL);
        publisher.publish(canonical(3));
        publisher.publish(state(StateName::Streaming));
        assert_eq!(publisher.finish_message(), None);
        let receiver = publisher.subscribe();
        drop(receiver);
        publisher.publish(canonical(4));
        publisher.publish(state(StateName::Idle));
        assert_eq!(publisher.finish_message(), None, "the last receiver left");
        assert_eq!(publisher.subscribers(), 0);
    }

    #[test]
    fn another_type_is_rendered_uncached_and_the_first_stays() {
        let published = live();
        assert_eq!(published.rendered(|_| 7_u32), 7);
        assert_eq!(published.rendered(|_| "other".to_owned()), "other");
        assert_eq!(published.rendered(|_| 8_u32), 7, "the first is kept");
    }

    fn view(id: &ConversationId, last_seq: Seq) -> View {
        View {
            id: id.clone(),
            state: StateName::Idle,
            last_seq,
            cwd: String::new(),
            usage: Usage::default(),
            pending: Vec::new(),
            child_pending: Vec::new(),
            recent_messages: Vec::new(),
            omitted_messages: 0,
        }
    }

    /// The canonical seqs and live updates of what a subscription yields.
    fn seqs(published: &Arc<Wave>) -> Vec<Option<Seq>> {
        published.updates().iter().map(Update::seq).collect()
    }

    async fn next(subscription: &mut Subscription) -> Arc<Wave> {
        match subscription.next_wave().await {
            Received::Update(published) => published,
            other => panic!("expected an update, got {other:?}"),
        }
    }

    /// A follower that joins a turn from its message on gets the turn's
    /// events from the actor's memory: the store here holds nothing, so
    /// anything read from it would be missing. Memory that does not reach
    /// back to `from`, or that does not end at the view, is not used.
    #[tokio::test]
    async fn a_follower_of_the_turn_in_progress_is_served_from_memory() {
        let store: Arc<dyn EventLog> = Arc::new(keel_store::open_memory().unwrap());
        let id = ConversationId::new("c-memory".to_owned()).unwrap();
        let recent: VecDeque<Arc<Event>> = (3..=5).map(|seq| Arc::new(event(seq))).collect();
        let subscription = |last_seq: Seq| {
            let (_, receiver) = broadcast::channel(CHANNEL_CAPACITY);
            Subscription::new(
                view(&id, last_seq),
                receiver,
                store.clone(),
                Box::new(|| {}),
            )
        };

        // Older than memory reaches, past the view, or memory behind it.
        assert!(!subscription(5).starting_in_memory(2, &recent));
        assert!(!subscription(5).starting_in_memory(6, &recent));
        assert!(!subscription(6).starting_in_memory(4, &recent));
        assert!(!subscription(5).starting_in_memory(4, &VecDeque::new()));

        let (sender, receiver) = broadcast::channel(CHANNEL_CAPACITY);
        let mut following = Subscription::new(view(&id, 5), receiver, store, Box::new(|| {}));
        assert!(following.starting_in_memory(4, &recent));
        let mut following = following.starting_at(4).await.unwrap();
        let first = next(&mut following).await;
        assert_eq!(
            seqs(&first),
            vec![Some(4), Some(5)],
            "one wave, from memory"
        );
        assert_eq!(following.next_seq(), 6);
        // Then the live tail, without a gap.
        sender.send(Arc::new(Wave::of(vec![canonical(6)]))).unwrap();
        assert_eq!(seqs(&next(&mut following).await), vec![Some(6)]);
    }

    #[tokio::test]
    async fn a_wave_is_shared_whole_when_it_follows_and_split_when_it_overlaps_or_skips() {
        let store: Arc<dyn EventLog> = Arc::new(keel_store::open_memory().unwrap());
        let id = ConversationId::new("c-waves".to_owned()).unwrap();
        let created = Event {
            kind: keel_core::event::EventKind::Created {
                conversation: id.clone(),
                cwd: "/".to_owned(),
                config: keel_core::ConversationConfig::default(),
                parent_conversation: None,
                user_initiated: true,
                forked_from: None,
            },
            ..event(1)
        };
        let mut log = vec![created];
        log.extend((2..=8).map(event));
        store.append(&id, log).await.unwrap();
        let (sender, receiver) = broadcast::channel(CHANNEL_CAPACITY);
        let dropped = Arc::new(AtomicUsize::new(0));
        let told = dropped.clone();
        let mut subscription = Subscription::new(
            view(&id, 2),
            receiver,
            store,
            Box::new(move || {
                told.fetch_add(1, Ordering::SeqCst);
            }),
        );

        // Owed 3: a wave of 3 and 4 is taken whole, the same allocation.
        let wave = Arc::new(Wave::of(vec![
            canonical(3),
            state(StateName::Streaming),
            canonical(4),
        ]));
        sender.send(wave.clone()).unwrap();
        assert!(Arc::ptr_eq(&next(&mut subscription).await, &wave));
        assert_eq!(subscription.next_seq(), 5);

        // A wave that repeats 4: 4 is left out, the rest comes one by one.
        sender
            .send(Arc::new(Wave::of(vec![
                canonical(4),
                canonical(5),
                state(StateName::Idle),
            ])))
            .unwrap();
        assert_eq!(seqs(&next(&mut subscription).await), vec![Some(5)]);
        assert_eq!(seqs(&next(&mut subscription).await), vec![None]);
        assert_eq!(subscription.next_seq(), 6);

        // A wave after a gap (6 never came): 6 is read from the log first.
        sender
            .send(Arc::new(Wave::of(vec![
                state(StateName::Streaming),
                canonical(7),
                canonical(8),
            ])))
            .unwrap();
        assert_eq!(seqs(&next(&mut subscription).await), vec![None]);
        assert_eq!(seqs(&next(&mut subscription).await), vec![Some(6)]);
        assert_eq!(seqs(&next(&mut subscription).await), vec![Some(7)]);
        assert_eq!(seqs(&next(&mut subscription).await), vec![Some(8)]);
        assert_eq!(subscription.next_seq(), 9);

        // `next` hands a wave out one update at a time.
        sender
            .send(Arc::new(Wave::of(vec![
                canonical(9),
                state(StateName::Idle),
            ])))
            .unwrap();
        assert_eq!(subscription.next().await, Received::Update(canonical(9)));
        assert_eq!(
            subscription.next().await,
            Received::Update(state(StateName::Idle))
        );
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        drop(subscription);
        // The actor is told once, so it can free the channel.
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }

    /// A resume over more than a page, and a lag over more than a page,
    /// deliver every canonical event once and in order, and the
    /// subscription never holds more than a page of them.
    #[tokio::test]
    async fn resuming_and_catching_up_read_the_log_a_page_at_a_time() {
        let store: Arc<dyn EventLog> = Arc::new(keel_store::open_memory().unwrap());
        let id = ConversationId::new("c-pages".to_owned()).unwrap();
        let created = Event {
            kind: keel_core::event::EventKind::Created {
                conversation: id.clone(),
                cwd: "/".to_owned(),
                config: keel_core::ConversationConfig::default(),
                parent_conversation: None,
                user_initiated: true,
                forked_from: None,
            },
            ..event(1)
        };
        let missed = 2 * CATCH_UP_PAGE as Seq + 10;
        let mut log = vec![created];
        log.extend((2..=missed).map(event));
        store.append(&id, log).await.unwrap();
        let (sender, receiver) = broadcast::channel(CHANNEL_CAPACITY);
        let subscription =
            Subscription::new(view(&id, missed), receiver, store.clone(), Box::new(|| {}));
        let mut subscription = subscription.starting_at(1).await.unwrap();

        let mut heard = Vec::new();
        let mut most_held = subscription.backlog.len();
        while subscription.next_seq() <= missed {
            heard.extend(seqs(&next(&mut subscription).await));
            most_held = most_held.max(subscription.backlog.len());
        }
        let expected: Vec<Option<Seq>> = (1..=missed).map(Some).collect();
        assert_eq!(
            heard, expected,
            "the resume gave every event once, in order"
        );
        assert_eq!(most_held, CATCH_UP_PAGE, "a page at a time");

        // More than a channel's worth and more than a page go by unheard:
        // the subscriber lags and reads them from the log, paged too.
        let last = missed + 2 * CATCH_UP_PAGE as Seq + 10;
        store
            .append(&id, ((missed + 1)..=last).map(event).collect())
            .await
            .unwrap();
        for seq in (missed + 1)..=last {
            let _ = sender.send(Arc::new(Wave::new(canonical(seq))));
        }
        assert!(matches!(
            subscription.next_wave().await,
            Received::Lagged { .. }
        ));
        let mut heard = Vec::new();
        let mut most_held = 0;
        while subscription.next_seq() <= last {
            heard.extend(seqs(&next(&mut subscription).await));
            most_held = most_held.max(subscription.backlog.len());
        }
        let expected: Vec<Option<Seq>> = ((missed + 1)..=last).map(Some).collect();
        assert_eq!(
            heard, expected,
            "the catch-up gave every event once, in order"
        );
        assert!(most_held <= CATCH_UP_PAGE, "{most_held} held at once");

        drop(subscription);
    }
}
