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
//! The channel carries each update once, as an `Arc<`[`Published`]`>`:
//! a thousand subscribers share one allocation instead of each cloning the
//! event, and [`Published::rendered`] lets an embedder derive something from
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
use keel_core::state::StateName;
use keel_core::LiveEvent;
use keel_store::EventLog;

use crate::conversation_actor::ConversationMsg;
use crate::mailbox::Mailbox;

/// How many updates a subscriber may fall behind before it lags. Small:
/// the buffer is allocated whole while anyone watches, and a subscriber
/// that lags loses only live-only updates (it reads canonical ones from
/// the log).
pub(crate) const CHANNEL_CAPACITY: usize = 128;

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

/// One update as the channel carries it: published once, shared by every
/// subscriber of the conversation through an `Arc`, with a slot that an
/// embedder fills once with what it derives from the update (see
/// [`Published::rendered`]).
pub struct Published {
    update: Update,
    /// What the first caller of [`Published::rendered`] derived from
    /// `update`, for every later caller. Type-erased so that this crate does
    /// not learn an embedder's formats (the daemon keeps its SSE frame here).
    rendered: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl Published {
    pub fn new(update: Update) -> Published {
        Published {
            update,
            rendered: OnceLock::new(),
        }
    }

    pub fn update(&self) -> &Update {
        &self.update
    }

    /// `render(update)`, computed once for every holder of this update:
    /// the first caller renders and keeps the result, later callers (the
    /// other subscribers) get a clone of it. A `T` should be cheap to
    /// clone (`bytes::Bytes`, an `Arc`). Every subscriber gets the first
    /// caller's result, so `render` may depend only on the update and on
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
        F: Fn(&Update) -> T,
    {
        let kept = self.rendered.get_or_init(|| Box::new(render(&self.update)));
        match kept.downcast_ref::<T>() {
            Some(value) => value.clone(),
            None => render(&self.update),
        }
    }

    /// The update, moved out when this was its last holder (an event read
    /// from the log for one subscriber), cloned otherwise.
    fn into_update(published: Arc<Published>) -> Update {
        match Arc::try_unwrap(published) {
            Ok(published) => published.update,
            Err(shared) => shared.update.clone(),
        }
    }

    fn canonical(event: Arc<Event>) -> Arc<Published> {
        Arc::new(Published::new(Update::Event { event }))
    }

    /// The canonical event's seq; `None` for a live-only update.
    fn seq(&self) -> Option<Seq> {
        match &self.update {
            Update::Event { event } => Some(event.seq),
            Update::Live { .. } => None,
        }
    }
}

impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Published")
            .field("update", &self.update)
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
    /// The latest messages (at most [`VIEW_MESSAGES`]).
    pub recent_messages: Vec<Message>,
    /// Messages before `recent_messages` that the view leaves out.
    pub omitted_messages: usize,
}

/// What [`Subscription::next`] yields ([`Subscription::next_published`]
/// yields the shared `Arc<Published>` in place of the update).
#[derive(Debug, Clone, PartialEq)]
pub enum Received<U = Update> {
    Update(U),
    /// This subscriber fell `missed` updates behind and they are gone from
    /// the channel. The live-only ones among them (deltas, tool output,
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
    receiver: Option<broadcast::Receiver<Arc<Published>>>,
    store: Arc<dyn EventLog>,
    /// The seq of the next canonical event this subscriber is owed.
    next_seq: Seq,
    /// Canonical events to yield before anything else: read from the log
    /// (each this subscriber's own), or the channel's event that came after
    /// a gap (shared).
    backlog: VecDeque<Arc<Published>>,
    /// Told when this subscription is dropped, so it can free its channel.
    actor: Mailbox,
}

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
        receiver: broadcast::Receiver<Arc<Published>>,
        store: Arc<dyn EventLog>,
        actor: Mailbox,
    ) -> Subscription {
        Subscription {
            next_seq: view.last_seq + 1,
            view,
            receiver: Some(receiver),
            store,
            backlog: VecDeque::new(),
            actor,
        }
    }

    /// Start the canonical events at `from` instead of after the view: the
    /// events from `from` through the view's `last_seq` are read from the
    /// log and come first (a client resuming from the last seq it saw).
    pub(crate) async fn starting_at(
        mut self,
        from: Seq,
    ) -> Result<Subscription, keel_store::Error> {
        let from = from.max(1);
        if from <= self.view.last_seq {
            let count = (self.view.last_seq - from + 1) as usize;
            let events = self.store.read(&self.view.id, from, count).await?;
            self.backlog.extend(
                events
                    .into_iter()
                    .map(|event| Published::canonical(Arc::new(event))),
            );
            self.next_seq = from;
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
        match self.next_published().await {
            Received::Update(published) => Received::Update(Published::into_update(published)),
            Received::Lagged { missed } => Received::Lagged { missed },
            Received::CatchUpFailed { error } => Received::CatchUpFailed { error },
            Received::Closed => Received::Closed,
        }
    }

    /// The same as [`Subscription::next`], the update as the channel
    /// shares it among the conversation's subscribers, so that what is
    /// derived from it through [`Published::rendered`] is derived once.
    /// (Events read from the log for this subscriber are its own.)
    pub async fn next_published(&mut self) -> Received<Arc<Published>> {
        loop {
            if let Some(published) = self.backlog.pop_front() {
                if let Some(seq) = published.seq() {
                    self.next_seq = seq + 1;
                }
                return Received::Update(published);
            }
            let Some(receiver) = self.receiver.as_mut() else {
                return Received::Closed;
            };
            match receiver.recv().await {
                Ok(published) => match published.seq() {
                    // Live-only.
                    None => return Received::Update(published),
                    // Already delivered from the log.
                    Some(seq) if seq < self.next_seq => {}
                    Some(seq) if seq > self.next_seq => {
                        // A gap the channel never reported: fill it from the log.
                        if let Err(error) = self.catch_up(Some(seq)).await {
                            return Received::CatchUpFailed {
                                error: error.to_string(),
                            };
                        }
                        self.backlog.push_back(published);
                    }
                    Some(seq) => {
                        self.next_seq = seq + 1;
                        return Received::Update(published);
                    }
                },
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    if let Err(error) = self.catch_up(None).await {
                        return Received::CatchUpFailed {
                            error: error.to_string(),
                        };
                    }
                    return Received::Lagged { missed };
                }
                Err(broadcast::error::RecvError::Closed) => return Received::Closed,
            }
        }
    }

    /// Read the canonical events this subscriber is owed from the log, up
    /// to (not including) `before`, or to the end of the log.
    async fn catch_up(&mut self, before: Option<Seq>) -> Result<(), keel_store::Error> {
        let limit = match before {
            Some(before) => before.saturating_sub(self.next_seq) as usize,
            None => usize::MAX,
        };
        let events = self.store.read(&self.view.id, self.next_seq, limit).await?;
        self.backlog.extend(
            events
                .into_iter()
                .map(|event| Published::canonical(Arc::new(event))),
        );
        Ok(())
    }
}

impl Drop for Subscription {
    /// Let go of the channel first, then tell the actor: if this was the
    /// last subscriber, the actor frees the channel's buffer now rather than
    /// at its next idle check.
    fn drop(&mut self) {
        drop(self.receiver.take());
        let _ = self.actor.cast(ConversationMsg::Unsubscribed);
    }
}

/// The actor's side: a sender that exists only while someone listens,
/// and the live-only updates it holds back to send with the next wave.
///
/// Every send wakes every subscriber, and each woken stream is a write to
/// its client, so the publisher sends in waves
/// (docs/requirements.md, "Live updates go out in waves"): a canonical
/// event is never held, and takes the held live updates along, in order,
/// ahead of it; a live-only update goes out at once when nothing was sent
/// for `interval` (a first token after a quiet wait is not delayed), and
/// otherwise is held until the actor's current message is done if that
/// message sent something, or until `interval` after the last send. The
/// actor calls [`Publisher::finish_message`] after each message and arms a
/// flush at the deadline it returns. A zero interval sends everything at
/// once.
#[derive(Debug)]
pub(crate) struct Publisher {
    sender: Option<broadcast::Sender<Arc<Published>>>,
    interval: Duration,
    /// Live-only updates waiting for the next wave, oldest first.
    held: Vec<Update>,
    /// When the channel last sent.
    last_sent: Option<Instant>,
    /// Something was sent while handling the actor's current message:
    /// more updates of the same message join that wave.
    sent_in_message: bool,
}

impl Publisher {
    pub(crate) fn new(interval: Duration) -> Publisher {
        Publisher {
            sender: None,
            interval,
            held: Vec::new(),
            last_sent: None,
            sent_in_message: false,
        }
    }

    /// A receiver of everything published from now on. Updates held
    /// before go out first, to the subscribers they were published to.
    pub(crate) fn subscribe(&mut self) -> broadcast::Receiver<Arc<Published>> {
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
        let now = Instant::now();
        let holds = matches!(update, Update::Live { .. })
            && !self.sent_in_message
            && self
                .last_sent
                .is_some_and(|last| now < last + self.interval);
        if holds {
            self.held.push(update);
            return;
        }
        self.flush();
        self.send(update, now);
    }

    /// Send every held update now.
    pub(crate) fn flush(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let now = Instant::now();
        for update in std::mem::take(&mut self.held) {
            self.send(update, now);
        }
    }

    /// The actor is done with a message. Updates held while it sent
    /// something go out now, with that wave; otherwise the held ones are
    /// owed a flush at the returned deadline (`None`: nothing is held).
    pub(crate) fn finish_message(&mut self) -> Option<Instant> {
        if std::mem::take(&mut self.sent_in_message) {
            self.flush();
            self.sent_in_message = false;
            return None;
        }
        if self.held.is_empty() {
            return None;
        }
        Some(
            self.last_sent
                .map_or_else(Instant::now, |last| last + self.interval),
        )
    }

    fn send(&mut self, update: Update, now: Instant) {
        let Some(sender) = &self.sender else {
            self.held.clear();
            return;
        };
        if sender.send(Arc::new(Published::new(update))).is_err() {
            // Every receiver is gone: free the buffer.
            self.sender = None;
            self.held.clear();
            return;
        }
        self.last_sent = Some(now);
        self.sent_in_message = true;
    }

    /// Drop the channel if nobody listens (idle eviction's first tier).
    pub(crate) fn release_if_unwatched(&mut self) {
        if self
            .sender
            .as_ref()
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            self.sender = None;
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

    fn live() -> Published {
        Published::new(Update::Live {
            event: LiveEvent::StateChanged {
                state: StateName::Idle,
            },
        })
    }

    #[test]
    fn an_update_is_rendered_once_for_every_caller() {
        let published = live();
        let renders = AtomicUsize::new(0);
        let render = |_: &Update| Arc::new(renders.fetch_add(1, Ordering::Relaxed));
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

    fn canonical(seq: Seq) -> Update {
        Update::Event {
            event: Arc::new(Event {
                seq,
                at: keel_core::time::Timestamp::from_millis(0),
                parent: None,
                triggers_turn: false,
                kind: keel_core::event::EventKind::TurnStarted { turn: 1 },
            }),
        }
    }

    /// Everything the receiver has been sent so far.
    fn drain(receiver: &mut broadcast::Receiver<Arc<Published>>) -> Vec<Update> {
        let mut got = Vec::new();
        while let Ok(published) = receiver.try_recv() {
            got.push(published.update().clone());
        }
        got
    }

    const INTERVAL: Duration = Duration::from_millis(16);

    #[tokio::test(start_paused = true)]
    async fn a_live_update_after_a_quiet_interval_goes_out_at_once() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut receiver = publisher.subscribe();
        publisher.publish(state(StateName::Streaming));
        assert_eq!(drain(&mut receiver), vec![state(StateName::Streaming)]);
        assert_eq!(publisher.finish_message(), None);
        tokio::time::advance(INTERVAL).await;
        publisher.publish(state(StateName::Idle));
        assert_eq!(drain(&mut receiver), vec![state(StateName::Idle)]);
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
            vec![
                state(StateName::Streaming),
                state(StateName::ExecutingTools)
            ]
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
        assert_eq!(
            drain(&mut receiver),
            vec![state(StateName::Streaming), canonical(4)]
        );
        // Later updates of the same message join its wave.
        publisher.publish(state(StateName::Idle));
        assert_eq!(drain(&mut receiver), vec![state(StateName::Idle)]);
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
        assert_eq!(
            drain(&mut receiver),
            vec![state(StateName::Streaming), state(StateName::Idle)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_subscriber_gets_nothing_held_from_before_it() {
        let mut publisher = Publisher::new(INTERVAL);
        let mut first = publisher.subscribe();
        publisher.publish(canonical(3));
        publisher.finish_message();
        publisher.publish(state(StateName::Streaming));
        publisher.finish_message();
        let mut second = publisher.subscribe();
        assert_eq!(
            drain(&mut first),
            vec![canonical(3), state(StateName::Streaming)]
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
        assert_eq!(
            drain(&mut receiver),
            vec![canonical(3), state(StateName::Streaming)]
        );
        assert_eq!(publisher.finish_message(), None);
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
}
