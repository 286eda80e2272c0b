//! Following one conversation for a client, whatever the protocol: the
//! items every event stream of the daemon is made of, in order, with
//! nothing missed or doubled. keel's own stream (`events.rs`) renders
//! them as its SSE frames; the LangGraph and AG-UI projections render the
//! same items as theirs. One source, several projections.
//!
//! Resuming is the runtime's business: following from seq N
//! (`ConversationHandle::follow`) reads what the client missed from the
//! log and then follows live. A client that falls behind is caught up from
//! the log by the subscription too. If the conversation's actor stops
//! (evicted, crashed and restarted), the follower subscribes again from
//! the next seq it owes, with a fresh snapshot.
//!
//! A follower never wakes a conversation (docs/daemon.md, "Streams of a
//! conversation at rest"). Following one that no actor serves (evicted,
//! or not started since the daemon did) gives its snapshot read from the
//! store and the canonical events owed from the log, then waits until
//! something else starts the conversation (a message, a resolution, the
//! supervisor's restart); then it follows that life from the next seq
//! owed.

mod stop;

use std::future::Future as _;
use std::sync::Arc;
use std::task::Poll;

use keel_actors::core::{ConversationId, Seq};
use keel_actors::{ConversationHandle, Following, Received, Subscription, Update, View, Wave};
use keel_api::ErrorCode;

use super::error::ApiError;
use super::measure::OpenStream;
use super::AppState;
use stop::Stop;

/// Canonical events read from the log per item while a follower of a
/// conversation at rest catches up.
const LOG_PAGE: usize = 256;

/// What a follower hands its stream, in order.
pub enum Item {
    /// Where the conversation stands: first, and again whenever a new life
    /// of its actor is followed.
    Snapshot(View),
    /// Canonical events owed to the client, read from the log.
    Logged(Vec<Update>),
    /// What one step of the conversation published, as its subscribers
    /// share it (`Wave::rendered` keeps one rendering for all).
    Wave(Arc<Wave>),
    /// The client fell so far behind that `missed` live-only updates were
    /// dropped (canonical events are never dropped: they are caught up).
    Lagged { missed: u64 },
    /// The follower cannot go on; nothing comes after this. The client
    /// reconnects from the last seq it saw.
    Failed { code: ErrorCode, message: String },
}

/// One client's follow of one conversation.
pub struct Follower {
    handle: ConversationHandle,
    id: ConversationId,
    subscription: Option<Subscription>,
    /// The conversation rested with no actor when the follow began: its
    /// view, handed out as the snapshot before anything else.
    at_rest: Option<View>,
    snapshot_sent: bool,
    /// The seq to subscribe from again once the actor's next life answers.
    resume_from: Option<Seq>,
    stop: Stop,
    done: bool,
    /// Counts this stream in `keel_event_streams_open` while it lives.
    _open: OpenStream,
}

impl Follower {
    /// Follow conversation `id` from canonical seq `from` (from its next
    /// event when `None`). An unknown conversation is an error now, before
    /// any item.
    pub async fn open(
        state: &AppState,
        id: ConversationId,
        from: Option<Seq>,
    ) -> Result<Follower, ApiError> {
        let handle = state.runtime.handle(id.clone());
        let following = handle
            .follow(from)
            .await
            .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
        let (subscription, at_rest, resume_from) = match following {
            Following::Live(subscription) => (Some(subscription), None, None),
            Following::AtRest(view) => {
                let next = from.unwrap_or(view.last_seq + 1).max(1);
                (None, Some(view), Some(next))
            }
        };
        Ok(Follower {
            handle,
            id,
            subscription,
            at_rest,
            snapshot_sent: false,
            resume_from,
            stop: Stop::new(state.stopping.clone()),
            done: false,
            _open: OpenStream::open(),
        })
    }

    pub fn id(&self) -> &ConversationId {
        &self.id
    }

    /// The next item, or `None` once the follow is over (the daemon is
    /// stopping, or after [`Item::Failed`]).
    pub async fn next(&mut self) -> Option<Item> {
        loop {
            if self.done || self.stop.is_stopping() {
                return None;
            }
            if self.subscription.is_none() {
                if let Some(view) = self.at_rest.take() {
                    self.snapshot_sent = true;
                    return Some(Item::Snapshot(view));
                }
                match self.owed_from_log().await {
                    Ok(Some(updates)) => return Some(Item::Logged(updates)),
                    Ok(None) => {}
                    Err(failed) => {
                        self.done = true;
                        return failed;
                    }
                }
                if let Err(failed) = self.resubscribe().await {
                    self.done = true;
                    return failed;
                }
            }
            let Some(subscription) = self.subscription.as_mut() else {
                continue;
            };
            if !self.snapshot_sent {
                self.snapshot_sent = true;
                return Some(Item::Snapshot(subscription.view.clone()));
            }
            // The next update, or the daemon's stop. The subscription is
            // polled first; the stop (checked above for every item) only
            // while no update is ready, and cheaply (`stop`).
            let received = {
                let stop = &mut self.stop;
                let mut next = std::pin::pin!(subscription.next_wave());
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(received) = next.as_mut().poll(cx) {
                        return Poll::Ready(Some(received));
                    }
                    stop.poll_stopped(cx).map(|()| None)
                })
                .await
            };
            // `None`: the daemon is stopping.
            match received? {
                Received::Update(published) => return Some(Item::Wave(published)),
                Received::Lagged { missed } => return Some(Item::Lagged { missed }),
                Received::CatchUpFailed { error } => {
                    self.done = true;
                    return Some(Item::Failed {
                        code: ErrorCode::CatchUpFailed,
                        message: format!(
                            "could not read missed events from the log ({error}); reconnect with Last-Event-ID"
                        ),
                    });
                }
                Received::Closed => {
                    // The actor stopped; follow its next life from the
                    // next seq this client is owed.
                    let next = subscription.next_seq();
                    self.subscription = None;
                    self.resume_from = Some(next);
                }
            }
        }
    }

    /// The canonical events the client is owed that the log already holds,
    /// while no actor serves the conversation: the next page of them, or
    /// `None` once there are none. `Err` ends the follow, with the item to
    /// hand out last.
    async fn owed_from_log(&mut self) -> Result<Option<Vec<Update>>, Option<Item>> {
        let Some(from) = self.resume_from else {
            return Ok(None);
        };
        let events = match self.handle.log(from, LOG_PAGE).await {
            Ok(events) => events,
            Err(keel_actors::Error::NotFound(_)) => return Ok(None),
            Err(error) => return Err(Some(unavailable(&error))),
        };
        let Some(last) = events.last() else {
            return Ok(None);
        };
        self.resume_from = Some(last.seq + 1);
        Ok(Some(
            events
                .into_iter()
                .map(|event| Update::Event {
                    event: Arc::new(event),
                })
                .collect(),
        ))
    }

    /// Follow the conversation again once an actor serves it: started by
    /// something else (a message, a resolution, its supervisor), never by
    /// this follower. `Err` ends the follow, with the item to hand out
    /// last, if any.
    async fn resubscribe(&mut self) -> Result<(), Option<Item>> {
        loop {
            let woken = {
                let stop = &mut self.stop;
                let mut woken = std::pin::pin!(self.handle.woken());
                std::future::poll_fn(|cx| {
                    if woken.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(true);
                    }
                    stop.poll_stopped(cx).map(|()| false)
                })
                .await
            };
            if !woken {
                return Err(None);
            }
            match self.handle.follow_live(self.resume_from).await {
                Ok(Some(subscription)) => {
                    self.subscription = Some(subscription);
                    self.snapshot_sent = false;
                    return Ok(());
                }
                // It stopped again before it could be followed: wait for
                // its next life.
                Ok(None) => tokio::task::yield_now().await,
                Err(keel_actors::Error::ShuttingDown) => return Err(None),
                Err(error) => return Err(Some(unavailable(&error))),
            }
        }
    }
}

/// The last item of a follow that cannot follow its conversation.
fn unavailable(error: &keel_actors::Error) -> Item {
    Item::Failed {
        code: ErrorCode::ConversationUnavailable,
        message: format!(
            "the conversation could not be followed ({error}); reconnect with Last-Event-ID"
        ),
    }
}
