//! Starting a conversation: `ensure_started` (the live actor, or one
//! started from the store), `create` (a new conversation, made by its own
//! actor's effect pipeline like any other step) and the out-of-band cancel
//! (a flag and the workers killed ahead of the mailbox). It spawns the
//! conversation actor; what lives below the actor (a parent's sub-agent
//! work) reaches it through `Shared::activation` ([`Activation`]).
//! Finding a live conversation is `registry.rs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ractor::{Actor, ActorCell, SpawnErr};

use keel_core::ids::ConversationId;
use keel_core::{ConversationConfig, NewConversation};

use crate::conversation_actor::{ConversationActor, ConversationArgs, Start};
use crate::mailbox::Mailbox;
use crate::registry::{self, actor_name, control, mailbox};
use crate::shared::{Activate, NewConversationAt, Shared};
use crate::Error;

/// The conversations of one runtime, to start: its shared state and its
/// root supervisor, which every conversation is linked to. What a
/// [`ConversationHandle`](crate::ConversationHandle) holds; cheap to clone.
#[derive(Clone)]
pub(crate) struct Starter {
    pub(crate) shared: Arc<Shared>,
    pub(crate) supervisor: ActorCell,
}

impl Starter {
    /// [`ensure_started`] under this runtime's supervisor.
    pub(crate) async fn ensure_started(&self, id: &ConversationId) -> Result<Mailbox, Error> {
        ensure_started(&self.shared, &self.supervisor, id).await
    }

    /// [`cancel`] under this runtime's supervisor.
    pub(crate) async fn cancel(&self, id: &ConversationId) -> Result<Mailbox, Error> {
        cancel(&self.shared, &self.supervisor, id).await
    }
}

/// This module as [`Activate`], for `Shared::activation`.
pub(crate) struct Activation;

#[async_trait::async_trait]
impl Activate for Activation {
    async fn ensure_started(
        &self,
        shared: &Arc<Shared>,
        supervisor: &ActorCell,
        id: &ConversationId,
    ) -> Result<Mailbox, Error> {
        ensure_started(shared, supervisor, id).await
    }

    async fn create_as(
        &self,
        shared: &Arc<Shared>,
        supervisor: &ActorCell,
        id: ConversationId,
        new: NewConversationAt,
    ) -> Result<(), Error> {
        create_as(
            shared,
            supervisor,
            id,
            &new.cwd,
            new.config,
            new.parent_conversation,
        )
        .await
    }

    async fn cancel(
        &self,
        shared: &Arc<Shared>,
        supervisor: &ActorCell,
        id: &ConversationId,
    ) -> Result<Mailbox, Error> {
        cancel(shared, supervisor, id).await
    }
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
        if registry::being_deleted(shared, id) {
            return Err(Error::NotFound(id.clone()));
        }
        if shared.store.last_seq(id).await? == 0 {
            return Err(Error::NotFound(id.clone()));
        }
        claim(shared, id, id).await?;
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
    claim(shared, &id, parent_conversation.as_ref().unwrap_or(&id)).await?;
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
/// With several processes over one store: make sure this one owns the
/// tree `member` belongs to before `id` starts (`ownership.rs`).
async fn claim(
    shared: &Arc<Shared>,
    id: &ConversationId,
    member: &ConversationId,
) -> Result<(), Error> {
    let Some(ownership) = &shared.ownership else {
        return Ok(());
    };
    let root = crate::ownership::root_of(shared.store.as_ref(), member).await?;
    ownership
        .claim(&root)
        .await
        .map_err(|reason| Error::NotOwner {
            conversation: id.clone(),
            reason,
        })
}

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
pub(crate) fn new_id() -> ConversationId {
    let raw = format!("c-{:016x}", fastrand::u64(..));
    ConversationId::new(raw).unwrap_or_else(|_| unreachable!("invariant: c- and hex is a valid id"))
}
