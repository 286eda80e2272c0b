//! The way into a conversation actor's mailbox that counts what waits in
//! it. ractor does not expose a mailbox's length, and `/admin/actors` (and
//! `keel ps`) show it: a conversation whose mailbox grows is one that
//! cannot keep up. So every sender (handles, the runtime, the actor's own
//! workers and timers, subscriptions) casts and calls through a [`Mailbox`],
//! which counts the message in the conversation's [`Control`] block, and
//! the actor counts each one out as it takes it (`Control::taken`).
//!
//! The count is an estimate, never negative: a message sent while the
//! actor is being started may miss the count, and a new life of the actor
//! (a supervisor restart) starts again from zero, as its mailbox does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, MessagingErr, RpcReplyPort};

use crate::message::{Control, ConversationMsg, Seen};

/// A conversation actor and its control block.
#[derive(Clone)]
pub(crate) struct Mailbox {
    actor: ActorRef<ConversationMsg>,
    /// `None` when the actor has no control block (yet): sends still go,
    /// uncounted.
    control: Option<Arc<Control>>,
}

impl Mailbox {
    pub(crate) fn new(actor: ActorRef<ConversationMsg>, control: Option<Arc<Control>>) -> Mailbox {
        Mailbox { actor, control }
    }

    pub(crate) fn actor(&self) -> &ActorRef<ConversationMsg> {
        &self.actor
    }

    /// Messages waiting in the mailbox, as counted.
    pub(crate) fn len(&self) -> usize {
        self.control
            .as_ref()
            .map_or(0, |control| control.mailbox_len())
    }

    /// What the actor was last seen doing (nothing known without a
    /// control block).
    pub(crate) fn seen(&self) -> Seen {
        self.control
            .as_ref()
            .map_or_else(Seen::default, |control| control.seen())
    }

    /// Send without waiting for an answer.
    pub(crate) fn cast(
        &self,
        message: ConversationMsg,
    ) -> Result<(), MessagingErr<ConversationMsg>> {
        self.count_in();
        let sent = self.actor.cast(message);
        if sent.is_err() {
            self.count_out();
        }
        sent
    }

    /// Send a request and wait (at most `timeout`) for its answer.
    pub(crate) async fn call<T, F>(
        &self,
        message: F,
        timeout: Option<Duration>,
    ) -> Result<CallResult<T>, MessagingErr<ConversationMsg>>
    where
        T: Send + 'static,
        F: FnOnce(RpcReplyPort<T>) -> ConversationMsg,
    {
        self.count_in();
        let answer = self.actor.call(message, timeout).await;
        // Never delivered: nothing will take it out. (A timed-out request
        // was delivered and is counted out when the actor gets to it.)
        if matches!(answer, Err(_) | Ok(CallResult::SenderError)) {
            self.count_out();
        }
        answer
    }

    fn count_in(&self) {
        if let Some(control) = &self.control {
            control.queued.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn count_out(&self) {
        if let Some(control) = &self.control {
            control.taken();
        }
    }
}

impl Control {
    /// The actor took one message from its mailbox.
    pub(crate) fn taken(&self) {
        let _ = self
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |queued| {
                queued.checked_sub(1)
            });
    }

    /// Messages sent to the actor and not yet taken, as far as counted.
    pub(crate) fn mailbox_len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}
