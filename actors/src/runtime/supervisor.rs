//! The root supervisor. Every ConversationActor is linked to it. When one
//! fails (a panic, a failed append), the supervisor brings it back through
//! `ensure_started`, which rebuilds it from the log and lets its recovery
//! policy decide what happens to the turn it was in. A conversation that
//! keeps failing is left stopped after `max_restarts` in `restart_window`
//! (Erlang's restart intensity), so a poisoned log cannot spin a core; the
//! next message or resolution tries again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;

use keel_core::ids::ConversationId;

use super::Shared;
use crate::door::{conversation_of, ensure_started};

pub(crate) struct SupervisorActor;

pub(crate) enum SupervisorMsg {
    /// How many restarts the supervisor has made, for tests and the admin view.
    Restarts { reply: ractor::RpcReplyPort<u64> },
}

pub(crate) struct SupervisorState {
    shared: Arc<Shared>,
    /// Recent restart times per conversation.
    restarts: HashMap<ConversationId, VecDeque<Instant>>,
    total_restarts: u64,
}

impl Actor for SupervisorActor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        shared: Arc<Shared>,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        Ok(SupervisorState {
            shared,
            restarts: HashMap::new(),
            total_restarts: 0,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Restarts { reply } => {
                let _ = reply.send(state.total_restarts);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let SupervisionEvent::ActorFailed(cell, error) = event else {
            // Started, or stopped on purpose (eviction, shutdown): nothing to do.
            return Ok(());
        };
        let Some(id) = cell
            .get_name()
            .and_then(|name| conversation_of(&state.shared.instance, &name))
        else {
            tracing::error!(%error, "an unnamed child of the supervisor failed");
            return Ok(());
        };
        let settings = state.shared.settings;
        let now = Instant::now();
        let recent = state.restarts.entry(id.clone()).or_default();
        while recent
            .front()
            .is_some_and(|at| now.duration_since(*at) > settings.restart_window)
        {
            recent.pop_front();
        }
        if recent.len() >= settings.max_restarts {
            tracing::error!(
                conversation = %id, %error,
                "conversation failed {} times within {:?}; leaving it stopped until it is next addressed",
                recent.len() + 1, settings.restart_window
            );
            return Ok(());
        }
        recent.push_back(now);
        state.total_restarts += 1;
        tracing::warn!(conversation = %id, %error, "conversation actor failed; restarting it from the log");
        // Restart off the supervisor's own mailbox: rebuilding reads the log.
        let shared = state.shared.clone();
        let supervisor = myself.get_cell();
        tokio::spawn(async move {
            if let Err(error) = ensure_started(&shared, &supervisor, &id).await {
                tracing::error!(conversation = %id, %error, "restart failed");
            }
        });
        Ok(())
    }
}
