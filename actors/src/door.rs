//! The one door to a conversation. Everything that finds, starts, creates
//! or reaches a conversation out of band goes through here: its registry
//! name, `lookup` (live only), `ensure_started` (live, or started from the
//! store), `create` (a new conversation, made by its own actor's effect
//! pipeline like any other step), the out-of-band cancel (a flag and the
//! workers killed ahead of the mailbox), and the list of live actors.
//!
//! Callers never hold an actor: handles, the supervisor, boot recovery and
//! a parent spawning sub-agents (`sub_agents.rs`) all address a conversation by id
//! through these functions, so placing conversations on several nodes
//! later changes this module alone (docs/requirements.md, "One door").

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorRef, SpawnErr};

use keel_core::ids::ConversationId;
use keel_core::{ConversationConfig, NewConversation};

use crate::conversation_actor::{
    Control, ConversationActor, ConversationArgs, ConversationMsg, Start,
};
use crate::mailbox::Mailbox;
use crate::runtime::Shared;
use crate::Error;

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
/// door's functions without holding the `Runtime`. `None` once it stopped.
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

/// Return the live actor of `id`, or start it from the store. Two callers
/// racing here get the same actor: the registry admits one name once, and the
/// loser of the spawn race takes the winner's.
pub(crate) async fn ensure_started(
    shared: &Arc<Shared>,
    supervisor: &ActorCell,
    id: &ConversationId,
) -> Result<Mailbox, Error> {
    let name = actor_name(&shared.instance, id);
    for _ in 0..100 {
        if let Some(cell) = ractor::registry::where_is(name.clone()) {
            return Ok(mailbox(shared, id, cell.into()));
        }
        // A runtime that is stopping starts nothing; live conversations
        // still answer until they end their session.
        if shared.closed.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        if shared.store.last_seq(id).await? == 0 {
            return Err(Error::NotFound(id.clone()));
        }
        let args = ConversationArgs {
            id: id.clone(),
            shared: shared.clone(),
            start: Start::Rehydrate,
        };
        match ConversationActor::spawn_linked(
            Some(name.clone()),
            ConversationActor,
            args,
            supervisor.clone(),
        )
        .await
        {
            Ok((actor, _)) => return Ok(mailbox(shared, id, actor)),
            // Someone else started it between our look and our spawn; or
            // an actor that is stopping still holds the name: look again.
            Err(SpawnErr::ActorAlreadyRegistered(_)) => tokio::task::yield_now().await,
            Err(error) => return Err(spawn_error(error)),
        }
    }
    Err(Error::NameTaken(id.clone()))
}

/// Create a conversation working in `cwd` and start its actor. The actor
/// itself records `Created` and `SessionStarted` through its effect
/// pipeline before it takes any message, so creating is a step like every
/// other (durable before anything else happens); a failed append fails the
/// creation and leaves nothing behind.
pub(crate) async fn create(
    shared: &Arc<Shared>,
    supervisor: &ActorCell,
    cwd: &Path,
    config: ConversationConfig,
    parent_conversation: Option<ConversationId>,
) -> Result<ConversationId, Error> {
    let id = new_id();
    create_as(
        shared,
        supervisor,
        id.clone(),
        cwd,
        config,
        parent_conversation,
    )
    .await?;
    Ok(id)
}

/// [`create`] under an id the caller chose: a sub-agent's is derived from
/// its parent's call, so that carrying the call out again finds it. The
/// caller makes sure the id is new in the store; one whose actor is
/// already registered fails with `SpawnErr::ActorAlreadyRegistered`.
pub(crate) async fn create_as(
    shared: &Arc<Shared>,
    supervisor: &ActorCell,
    id: ConversationId,
    cwd: &Path,
    config: ConversationConfig,
    parent_conversation: Option<ConversationId>,
) -> Result<(), Error> {
    if shared.closed.load(Ordering::SeqCst) {
        return Err(Error::ShuttingDown);
    }
    let cwd = working_directory(cwd).await?;
    let args = ConversationArgs {
        id: id.clone(),
        shared: shared.clone(),
        start: Start::Create(Box::new(NewConversation {
            id: id.clone(),
            cwd,
            config,
            parent_conversation,
        })),
    };
    ConversationActor::spawn_linked(
        Some(actor_name(&shared.instance, &id)),
        ConversationActor,
        args,
        supervisor.clone(),
    )
    .await
    .map_err(spawn_error)?;
    tracing::info!(conversation = %id, "created");
    Ok(())
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

/// Cancel ahead of everything queued: mark the cancel in the conversation's
/// control block and kill its workers now (the HTTP stream closes, a tool's
/// process group gets SIGKILL), before the actor even reads its mailbox.
/// Returns the actor, which still has to record the cancel.
pub(crate) async fn cancel(
    shared: &Arc<Shared>,
    supervisor: &ActorCell,
    id: &ConversationId,
) -> Result<Mailbox, Error> {
    // Marked before the actor is started, so that an actor rebuilt for the
    // cancel carries it out before it recovers anything (a turn left in
    // flight is not resumed only to be cancelled).
    let control = control(shared, id);
    control.cancel_requested.store(true, Ordering::SeqCst);
    let actor = match ensure_started(shared, supervisor, id).await {
        Ok(actor) => actor,
        Err(error) => {
            control.cancel_requested.store(false, Ordering::SeqCst);
            return Err(error);
        }
    };
    for worker in actor.actor().get_children() {
        worker.kill();
    }
    Ok(actor)
}

/// The working directory a conversation is created with: made absolute
/// (relative to this process's directory), checked and made canonical
/// (`..` resolved, symbolic links followed), because it is fixed for the
/// conversation's whole life, every tool starts there and the file tools
/// confine paths to it: a link swapped later does not move it.
async fn working_directory(cwd: &Path) -> Result<String, Error> {
    let invalid = |reason: &str| Error::InvalidCwd {
        cwd: cwd.display().to_string(),
        reason: reason.to_owned(),
    };
    let absolute: PathBuf =
        std::path::absolute(cwd).map_err(|error| invalid(&error.to_string()))?;
    match tokio::fs::metadata(&absolute).await {
        Ok(metadata) if metadata.is_dir() => {}
        Ok(_) => return Err(invalid("it is not a directory")),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(invalid("it does not exist"))
        }
        Err(error) => return Err(invalid(&error.to_string())),
    }
    let canonical = tokio::fs::canonicalize(&absolute)
        .await
        .map_err(|error| invalid(&error.to_string()))?;
    // The log stores the directory as text; a path that is not UTF-8 would
    // come back as another path.
    canonical
        .into_os_string()
        .into_string()
        .map_err(|_| invalid("its path is not valid UTF-8"))
}

/// A failed spawn: a store error while the actor rebuilt or recorded the
/// conversation keeps its type, so a caller can tell a disk problem from
/// an actor problem.
fn spawn_error(error: SpawnErr) -> Error {
    match error {
        SpawnErr::StartupFailed(failure) => match failure.downcast::<keel_store::Error>() {
            Ok(store) => Error::Store(*store),
            Err(failure) => Error::Spawn(SpawnErr::StartupFailed(failure)),
        },
        other => Error::Spawn(other),
    }
}

/// A fresh conversation id: `c-` and 16 random hex digits.
fn new_id() -> ConversationId {
    let raw = format!("c-{:016x}", fastrand::u64(..));
    ConversationId::new(raw).unwrap_or_else(|_| unreachable!("invariant: c- and hex is a valid id"))
}
