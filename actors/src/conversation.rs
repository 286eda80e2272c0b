//! `ConversationHandle`: what an embedder (and the daemon) holds to talk to
//! one conversation. It names the conversation by id only; every call goes
//! through `ensure_started`, so a handle keeps working across evictions and
//! crash restarts of the actor behind it.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::RpcReplyPort;

use keel_core::event::{Decision, Event, EventKind};
use keel_core::ids::{ConversationId, EventId, Seq, ToolCallId};
use keel_core::message::ImageRef;
use keel_core::reducer::WorkingSet;
use keel_core::state::{Phase, StateName};
use keel_core::ConversationConfig;

use crate::activation::Starter;
use crate::image::{prepare_uploads, ImageUpload};
use crate::mailbox::Mailbox;
pub use crate::message::{ActorStats, Inspection, WorkerInfo};
use crate::message::{ConversationMsg, SendTicket};
use crate::metrics;
use crate::pubsub::{Subscription, View};
use crate::registry;
use crate::Error;

/// How long a call waits for the actor's answer. Actors answer in
/// microseconds unless an append is slow; this only bounds a wedged disk.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One conversation, by id.
#[derive(Clone)]
pub struct ConversationHandle {
    starter: Starter,
    id: ConversationId,
}

impl ConversationHandle {
    pub(crate) fn new(starter: Starter, id: ConversationId) -> ConversationHandle {
        ConversationHandle { starter, id }
    }

    pub fn id(&self) -> &ConversationId {
        &self.id
    }

    /// Send a user message with the images attached to it. Returns its
    /// event id once it is durable; a busy conversation under
    /// `busy_policy = reject` answers `Error::Rejected(Rejection::Busy)`.
    ///
    /// Every image is checked (format, declared type, size), scaled down
    /// to what every provider accepts and stored before the message is
    /// sent, off the async threads. One bad image refuses the whole message
    /// with `Error::InvalidImage`, before anything is stored or logged.
    /// Images stored for a message the conversation then refuses (busy)
    /// stay in the blob store until a sweep of blobs no message names
    /// (`EventLog::sweep_unreferenced_blobs`, after its grace period): they
    /// are addressed by content, so sending the message again in time
    /// reuses them, and later stores them again.
    pub async fn send(
        &self,
        text: impl Into<String>,
        images: Vec<ImageUpload>,
    ) -> Result<EventId, Error> {
        let text = text.into();
        let prepared = prepare_uploads(images).await?;
        let mut images = Vec::with_capacity(prepared.len());
        for image in prepared {
            // Durable before the message that names it: a message in the
            // log never refers to bytes that were not written.
            self.starter.shared.store.put_blob(image.bytes).await?;
            images.push(image.image);
        }
        // A send is recorded (its event id) or refused with nothing
        // recorded, never ambiguous: when the actor stops before it
        // answers (an eviction that got there first, a crash), the ticket
        // says whether it took the message, and the log whether it kept it.
        let ticket = Arc::new(SendTicket::default());
        for _ in 0..3 {
            let actor = self.starter.ensure_started(&self.id).await?;
            let answer = actor
                .call(
                    |reply| ConversationMsg::Send {
                        text: text.clone(),
                        images: images.clone(),
                        ticket: ticket.clone(),
                        reply,
                    },
                    Some(CALL_TIMEOUT),
                )
                .await;
            match answer {
                Ok(CallResult::Success(answer)) => return answer.map_err(Error::Rejected),
                Ok(CallResult::Timeout) => return Err(Error::Timeout),
                Ok(CallResult::SenderError) | Err(_) => match ticket.taken_after() {
                    // The actor stopped with the message still in its
                    // mailbox, or before it arrived: nothing is recorded,
                    // and its next life is asked, once this one is gone.
                    None => {
                        let _ = actor.actor().get_cell().wait(Some(CALL_TIMEOUT)).await;
                    }
                    Some(last_seq) => return self.recorded_after(last_seq, &text, &images).await,
                },
            }
        }
        Err(Error::NotRecorded)
    }

    /// The actor took a message when its log ended at `last_seq` and
    /// stopped before answering: its event id if the log kept it, or
    /// `NotRecorded`. The message's step appends its events right after
    /// `last_seq`, before anything of a later life (which begins with
    /// `SessionStarted`), so the message is one of those or nowhere.
    async fn recorded_after(
        &self,
        last_seq: Seq,
        text: &str,
        images: &[ImageRef],
    ) -> Result<EventId, Error> {
        const STEP_EVENTS: usize = 16;
        let events = self
            .starter
            .shared
            .store
            .read(&self.id, last_seq + 1, STEP_EVENTS)
            .await?;
        let recorded = events
            .iter()
            .take_while(|event| !matches!(event.kind, EventKind::SessionStarted))
            .find(|event| {
                matches!(&event.kind, EventKind::UserMessage { text: kept, images: kept_images }
                    if kept == text && kept_images == images)
            });
        match recorded {
            Some(event) => Ok(self.id.event_id(event.seq)),
            None => Err(Error::NotRecorded),
        }
    }

    /// Stop whatever the conversation is doing and bring it to rest. Workers
    /// are killed at once, ahead of anything queued in the actor's mailbox
    /// (the HTTP stream closes, a tool's process group gets SIGKILL); then
    /// the actor records the interruption. Returns the state it ended in.
    ///
    /// A conversation with no actor (evicted) that has nothing to stop (at
    /// rest, nothing pending, no turn owed) answers from the store and is
    /// not woken: a cancel of nothing records nothing.
    pub async fn cancel(&self) -> Result<StateName, Error> {
        let starter = &self.starter;
        if registry::lookup(&starter.shared, &self.id).is_none() {
            let working = keel_store::load(starter.shared.store.as_ref(), &self.id)
                .await?
                .ok_or_else(|| Error::NotFound(self.id.clone()))?;
            if nothing_to_cancel(&working) {
                metrics::cancel();
                return Ok(Phase::from_status(&working).name());
            }
        }
        let actor = starter.cancel(&self.id).await?;
        metrics::cancel();
        self.call_on(actor, |reply| ConversationMsg::Cancel { reply })
            .await
    }

    /// Answer a pending call: approve or deny a tool, answer a question,
    /// return a client-run tool's output. [`resolve_as`](Self::resolve_as)
    /// without saying who decides.
    pub async fn resolve(&self, tool_call_id: ToolCallId, decision: Decision) -> Result<(), Error> {
        self.resolve_as(tool_call_id, decision, None).await
    }

    /// Answer a pending call and record `by`, who decided (free text such
    /// as a user name, at most `MAX_RESOLVED_BY_CHARS` characters), in its
    /// `Resolved` event.
    ///
    /// Exactly once, so it is safe to ask again after a lost answer: the
    /// same decision (answer text included) for a call already resolved
    /// succeeds and changes nothing. Refused with `Error::Rejected`:
    /// another decision for a resolved call (`AlreadyResolved`), a call
    /// that got its result otherwise, say by a cancel or a restart
    /// (`AlreadySettled`), a call this conversation never had
    /// (`UnknownCall`), and a decision that does not fit the call
    /// (`InvalidDecision`).
    pub async fn resolve_as(
        &self,
        tool_call_id: ToolCallId,
        decision: Decision,
        by: Option<String>,
    ) -> Result<(), Error> {
        self.call(|reply| ConversationMsg::Resolve {
            tool_call_id: tool_call_id.clone(),
            decision: decision.clone(),
            by: by.clone(),
            reply,
        })
        .await?
        .map_err(Error::Rejected)
    }

    /// Follow the conversation without waking it: a subscription from seq
    /// `from` (or from now) if an actor serves it, else its view read from
    /// the store. A follower of a conversation at rest waits with
    /// [`woken`](Self::woken) for something else to start it, then follows
    /// again from the seq after the view.
    pub async fn follow(&self, from: Option<Seq>) -> Result<Following, Error> {
        if let Some(subscription) = self.follow_live(from).await? {
            return Ok(Following::Live(subscription));
        }
        let working = keel_store::load(self.starter.shared.store.as_ref(), &self.id)
            .await?
            .ok_or_else(|| Error::NotFound(self.id.clone()))?;
        Ok(Following::AtRest(View::at_rest(&working)))
    }

    /// Like [`follow`](Self::follow), but only a live actor's subscription:
    /// `None` (reading nothing from the store) if no actor serves it.
    pub async fn follow_live(&self, from: Option<Seq>) -> Result<Option<Subscription>, Error> {
        let Some(subscription) = self
            .call_live(|reply| ConversationMsg::Subscribe { from, reply })
            .await
        else {
            return Ok(None);
        };
        let subscription = subscription?;
        Ok(Some(match from {
            Some(from) => subscription.starting_at(from).await?,
            None => subscription,
        }))
    }

    /// Wait until an actor serves the conversation (now, or once a message,
    /// a resolution or a restart starts one). Starts nothing.
    pub async fn woken(&self) {
        registry::woken(&self.starter.shared, &self.id).await;
    }

    /// A consistent view of the conversation, then every update after it.
    pub async fn subscribe(&self) -> Result<Subscription, Error> {
        self.call(|reply| ConversationMsg::Subscribe { from: None, reply })
            .await
    }

    /// Like [`subscribe`](Self::subscribe), but the canonical events start
    /// at seq `from` (read from the log up to the view, then live): a
    /// client that saw everything before `from` misses nothing and sees
    /// nothing twice.
    pub async fn subscribe_from(&self, from: Seq) -> Result<Subscription, Error> {
        let subscription = self
            .call(|reply| ConversationMsg::Subscribe {
                from: Some(from),
                reply,
            })
            .await?;
        Ok(subscription.starting_at(from).await?)
    }

    /// What the conversation is and holds. A live conversation answers
    /// itself; one with no actor (evicted, or never woken since a restart)
    /// is read from the store, which starts no actor and writes nothing.
    pub async fn inspect(&self) -> Result<Inspection, Error> {
        // A live actor that stops before answering is read from the store.
        if let Some(inspection) = self
            .call_live(|reply| ConversationMsg::Inspect { reply })
            .await
        {
            return inspection;
        }
        let store = self.starter.shared.store.as_ref();
        let working = keel_store::load(store, &self.id)
            .await?
            .ok_or_else(|| Error::NotFound(self.id.clone()))?;
        let now = self.starter.shared.clock.now();
        Ok(Inspection::at_rest(working, now))
    }

    /// Up to `limit` events of the log from seq `from` on, read from the
    /// store: it starts no actor.
    pub async fn log(&self, from: Seq, limit: usize) -> Result<Vec<Event>, Error> {
        let store = &self.starter.shared.store;
        let events = store.read(&self.id, from.max(1), limit).await?;
        if events.is_empty() && store.last_seq(&self.id).await? == 0 {
            return Err(Error::NotFound(self.id.clone()));
        }
        Ok(events)
    }

    /// Change the configuration; it applies from the next LLM request.
    pub async fn change_config(&self, config: ConversationConfig) -> Result<(), Error> {
        self.call(|reply| ConversationMsg::ChangeConfig {
            config: Box::new(config.clone()),
            reply,
        })
        .await?
        .map_err(Error::Rejected)
    }

    /// Compact now: summarise everything before the latest turn
    /// (docs/compaction.md). Answers once the summary request is under way
    /// (the conversation is `compacting`); the `Compacted` event, or a
    /// `CompactionFailed` live event that leaves the prompt as it was,
    /// follows on the stream. Refused while a turn runs (`Busy`), with no
    /// turn before the latest one (`NothingToCompact`), for a sub-agent.
    pub async fn compact(&self) -> Result<(), Error> {
        self.call(|reply| ConversationMsg::Compact { reply })
            .await?
            .map_err(Error::Rejected)
    }

    /// Rewind to seq `to_seq`, a turn boundary of the log: from now on the
    /// prompt is the one the conversation had there; the log keeps what
    /// came after, for audit (docs/history.md). Refused while a turn runs;
    /// a turn waiting on a human is called off, its calls closed. A seq
    /// that is not a boundary is refused, naming the nearest ones.
    pub async fn rewind(&self, to_seq: Seq) -> Result<(), Error> {
        self.call(|reply| ConversationMsg::Rewind { to_seq, reply })
            .await?
    }

    /// Save the snapshot and stop the actor now (only in a clean state: a
    /// busy conversation answers `Rejected(Busy)`). The next call starts it
    /// again from the store. Evicting a conversation that is not running
    /// does nothing.
    pub async fn evict(&self) -> Result<(), Error> {
        let Some(actor) = registry::lookup(&self.starter.shared, &self.id) else {
            return Ok(());
        };
        let answer = match actor
            .call(
                |reply| ConversationMsg::Evict { reply: Some(reply) },
                Some(CALL_TIMEOUT),
            )
            .await
        {
            Ok(CallResult::Success(answer)) => answer,
            // It stopped on its own meanwhile: evicted either way.
            Ok(CallResult::SenderError) | Err(_) => return Ok(()),
            Ok(CallResult::Timeout) => return Err(Error::Timeout),
        };
        answer.map_err(Error::Rejected)?;
        // The actor stops itself after this answer; wait until it has, so
        // that the next call starts it afresh.
        let _ = actor.actor().wait(Some(CALL_TIMEOUT)).await;
        Ok(())
    }

    /// Crash the actor on purpose (drills): its supervisor restarts it from
    /// the log under its recovery policy.
    pub async fn crash(&self) -> Result<(), Error> {
        let actor = self.starter.ensure_started(&self.id).await?;
        actor
            .cast(ConversationMsg::Crash)
            .map_err(|_| Error::Stopped)
    }

    /// Send a request built by `message`, starting the actor if needed; if
    /// the actor stops between the lookup and the answer (eviction), look it
    /// up again and ask again.
    async fn call<T, F>(&self, message: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(RpcReplyPort<T>) -> ConversationMsg,
    {
        self.call_with(Retry::Always, message).await
    }

    async fn call_with<T, F>(&self, retry: Retry, message: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(RpcReplyPort<T>) -> ConversationMsg,
    {
        for _ in 0..3 {
            let actor = self.starter.ensure_started(&self.id).await?;
            match actor.call(&message, Some(CALL_TIMEOUT)).await {
                Ok(CallResult::Success(answer)) => return Ok(answer),
                Ok(CallResult::Timeout) => return Err(Error::Timeout),
                Ok(CallResult::SenderError) if retry == Retry::OnlyUndelivered => {
                    return Err(Error::Stopped)
                }
                // The actor stopped (a crash its supervisor is restarting, an
                // eviction): wait until it is gone, so the next look finds
                // its successor, or starts one, rather than the same dying
                // actor again.
                Ok(CallResult::SenderError) | Err(_) => {
                    let _ = actor.actor().get_cell().wait(Some(CALL_TIMEOUT)).await;
                }
            }
        }
        Err(Error::Stopped)
    }

    /// Ask the live actor only, without starting one: `None` if it stopped
    /// before answering.
    async fn call_live<T, F>(&self, message: F) -> Option<Result<T, Error>>
    where
        T: Send + 'static,
        F: Fn(RpcReplyPort<T>) -> ConversationMsg,
    {
        let actor = registry::lookup(&self.starter.shared, &self.id)?;
        match actor.call(&message, Some(CALL_TIMEOUT)).await {
            Ok(CallResult::Success(answer)) => Some(Ok(answer)),
            Ok(CallResult::Timeout) => Some(Err(Error::Timeout)),
            Ok(CallResult::SenderError) | Err(_) => None,
        }
    }

    async fn call_on<T, F>(&self, actor: Mailbox, message: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(RpcReplyPort<T>) -> ConversationMsg,
    {
        match actor.call(&message, Some(CALL_TIMEOUT)).await {
            Ok(CallResult::Success(answer)) => Ok(answer),
            Ok(CallResult::Timeout) => Err(Error::Timeout),
            Ok(CallResult::SenderError) | Err(_) => self.call(message).await,
        }
    }
}

/// What [`ConversationHandle::follow`] found.
pub enum Following {
    /// An actor serves the conversation: its subscription.
    Live(Subscription),
    /// No actor serves it: where it rests, read from the store.
    AtRest(View),
}

/// Whether a conversation at rest with no actor has nothing a cancel could
/// stop: no turn in flight or owed, no call waiting, no message queued.
fn nothing_to_cancel(working: &WorkingSet) -> bool {
    let phase = Phase::from_status(working);
    matches!(
        phase.name(),
        StateName::Idle | StateName::Error | StateName::Completed | StateName::Failed
    ) && working.pending.is_empty()
        && working.queued.is_empty()
        && working.untriggered.is_empty()
}

/// Whether a request may be asked again when its answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Asking twice does no harm (a view, a cancel, a resolution: the same
    /// one again succeeds and changes nothing).
    Always,
    /// Only if it never reached the actor.
    OnlyUndelivered,
}
