//! Live updates for subscribers (seed 004's second event plane). Each
//! conversation actor owns one `tokio::sync::broadcast` channel, created on
//! the first subscription and dropped when nobody listens: a slow subscriber
//! lags (and is told how far) but never slows the conversation, and a
//! conversation nobody watches holds no buffer.
//!
//! A subscription starts with a [`View`] taken inside the actor, in the same
//! handler that registers the receiver, so the live tail continues exactly
//! after the view's `last_seq`: no gap and no duplicate between them.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::broadcast;

use keel_core::event::{Event, PendingCall};
use keel_core::ids::{ConversationId, Seq};
use keel_core::message::{Message, Usage};
use keel_core::state::StateName;
use keel_core::LiveEvent;

/// How many updates a subscriber may fall behind before it lags.
pub(crate) const CHANNEL_CAPACITY: usize = 1024;

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

/// What [`Subscription::next`] yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    Update(Update),
    /// This subscriber fell `missed` updates behind; they are gone from the
    /// channel. Canonical events among them are in the log: re-read it from
    /// the last seq seen, then carry on.
    Lagged {
        missed: u64,
    },
    /// The conversation actor stopped (evicted, shut down or crashed);
    /// subscribe again to follow it.
    Closed,
}

/// A view, then the live tail.
#[derive(Debug)]
pub struct Subscription {
    pub view: View,
    receiver: broadcast::Receiver<Update>,
}

impl Subscription {
    pub(crate) fn new(view: View, receiver: broadcast::Receiver<Update>) -> Subscription {
        Subscription { view, receiver }
    }

    pub async fn next(&mut self) -> Received {
        match self.receiver.recv().await {
            Ok(update) => Received::Update(update),
            Err(broadcast::error::RecvError::Lagged(missed)) => Received::Lagged { missed },
            Err(broadcast::error::RecvError::Closed) => Received::Closed,
        }
    }
}

/// The actor's side: a sender that exists only while someone listens.
#[derive(Debug, Default)]
pub(crate) struct Publisher {
    sender: Option<broadcast::Sender<Update>>,
}

impl Publisher {
    pub(crate) fn subscribe(&mut self) -> broadcast::Receiver<Update> {
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
        if let Some(sender) = &self.sender {
            if sender.send(update).is_err() {
                // Every receiver is gone: free the buffer.
                self.sender = None;
            }
        }
    }

    /// Drop the channel if nobody listens (idle eviction's first tier).
    pub(crate) fn release_if_unwatched(&mut self) {
        if self
            .sender
            .as_ref()
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            self.sender = None;
        }
    }

    pub(crate) fn subscribers(&self) -> usize {
        self.sender
            .as_ref()
            .map_or(0, |sender| sender.receiver_count())
    }
}
