//! Where a live conversation is found: its actor's registry name,
//! `lookup` (live only, starting nothing), the list of live actors, each
//! one's out-of-band control block, and the wake-up of followers waiting
//! for a conversation at rest to be started by something else. Starting a
//! conversation is `activation.rs`, which spawns actors; this module sits
//! below the actor, which registers itself here.
//!
//! Callers never hold an actor: handles, the supervisor, boot recovery and
//! a parent spawning sub-agents (`sub_agents.rs`) all address a conversation by id
//! through these functions and `activation.rs`, so placing conversations
//! on several nodes later changes these two modules alone
//! (docs/requirements.md, "One door").

use std::sync::Arc;

use ractor::{ActorCell, ActorRef};

use keel_core::ids::ConversationId;

use crate::mailbox::Mailbox;
use crate::message::{Control, ConversationMsg};
use crate::shared::Shared;

/// The registry name of a conversation's actor. The registry is
/// process-global: the runtime's instance prefix keeps two runtimes in one
/// process apart.
pub(crate) fn actor_name(instance: &str, id: &ConversationId) -> String {
    format!("{instance}/conversation/{id}")
}

/// The registry name of a runtime's root supervisor.
pub(crate) fn supervisor_name(instance: &str) -> String {
    format!("{instance}/supervisor")
}

/// The runtime's root supervisor, which every conversation is linked to:
/// how an actor of the runtime (a parent spawning sub-agents) reaches the
/// activation functions without holding the `Runtime`. `None` once it stopped.
pub(crate) fn supervisor(shared: &Shared) -> Option<ActorCell> {
    ractor::registry::where_is(supervisor_name(&shared.instance))
}

/// The conversation a registry name belongs to, if it is one of `instance`'s.
pub(crate) fn conversation_of(instance: &str, name: &str) -> Option<ConversationId> {
    let id = name
        .strip_prefix(instance)?
        .strip_prefix("/conversation/")?;
    ConversationId::new(id).ok()
}

/// The live actor of `id`, without starting one.
pub(crate) fn lookup(shared: &Shared, id: &ConversationId) -> Option<Mailbox> {
    let cell = ractor::registry::where_is(actor_name(&shared.instance, id))?;
    Some(mailbox(shared, id, cell.into()))
}

/// The way to `actor`'s mailbox that counts what waits in it. It takes the
/// control block only if the actor made one (it does as it starts), so a
/// send to an id that is not live leaves nothing behind in `controls`.
pub(crate) fn mailbox(
    shared: &Shared,
    id: &ConversationId,
    actor: ActorRef<ConversationMsg>,
) -> Mailbox {
    let control = shared
        .controls
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(id)
        .cloned();
    Mailbox::new(actor, control)
}

/// Every live conversation of this runtime and its actor.
pub(crate) fn live(shared: &Shared) -> Vec<(ConversationId, Mailbox)> {
    let mut live: Vec<(ConversationId, Mailbox)> = ractor::registry::registered()
        .into_iter()
        .filter_map(|name| {
            let id = conversation_of(&shared.instance, &name)?;
            let cell = ractor::registry::where_is(name)?;
            let mailbox = mailbox(shared, &id, cell.into());
            Some((id, mailbox))
        })
        .collect();
    live.sort_by(|left, right| left.0.cmp(&right.0));
    live
}

/// The out-of-band control block of a conversation, shared by its actor
/// (whichever life of it) and every handle.
pub(crate) fn control(shared: &Shared, id: &ConversationId) -> Arc<Control> {
    let mut controls = shared
        .controls
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    controls.entry(id.clone()).or_default().clone()
}

/// A conversation's actor stopped cleanly (eviction): drop its control
/// block, so the map holds only conversations that are live, unless a
/// newer actor of the same conversation already took a new one.
pub(crate) fn forget_control(shared: &Shared, id: &ConversationId, control: &Arc<Control>) {
    let mut controls = shared
        .controls
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if controls
        .get(id)
        .is_some_and(|current| Arc::ptr_eq(current, control))
    {
        controls.remove(id);
    }
}

/// Wait until an actor serves `id` (now, or once something else starts
/// one: a message, a resolution, the supervisor's restart). Starts nothing:
/// a follower of a conversation at rest must not wake it.
pub(crate) async fn woken(shared: &Shared, id: &ConversationId) {
    loop {
        let wake = shared
            .wakes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(id.clone())
            .or_default()
            .clone();
        let notified = wake.notified();
        tokio::pin!(notified);
        // Registered before the look, so a start between the look and the
        // wait still wakes this.
        notified.as_mut().enable();
        // An actor that is stopping is no life to follow: its successor,
        // if any, wakes this when it starts.
        if lookup(shared, id)
            .is_some_and(|actor| ractor::ACTIVE_STATES.contains(&actor.actor().get_status()))
        {
            return;
        }
        notified.await;
    }
}

/// An actor of `id` has started and takes requests: wake its followers
/// ([`woken`]).
pub(crate) fn started(shared: &Shared, id: &ConversationId) {
    let wake = shared
        .wakes
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(id);
    if let Some(wake) = wake {
        wake.notify_waiters();
    }
}

/// Whether conversation `id` is being deleted: it may not start again.
pub(crate) fn being_deleted(shared: &Shared, id: &ConversationId) -> bool {
    shared
        .deleting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .contains(id)
}

/// Mark `id` as being deleted (`true`), or no longer (`false`). Whether
/// the mark changed: a second delete of one conversation at once is told
/// apart.
pub(crate) fn mark_deleting(shared: &Shared, id: &ConversationId, deleting: bool) -> bool {
    let mut marks = shared
        .deleting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if deleting {
        marks.insert(id.clone())
    } else {
        marks.remove(id)
    }
}
