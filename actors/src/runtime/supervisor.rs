//! The root supervisor. Every ConversationActor is linked to it. When one
//! fails (a panic, a failed append), the supervisor brings it back through
//! `ensure_started`, which rebuilds it from the log and lets its recovery
//! policy decide what happens to the turn it was in. A conversation that
//! keeps failing is left stopped after `max_restarts` in `restart_window`
//! (Erlang's restart intensity), so a poisoned log cannot spin a core; the
//! next message or resolution tries again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;

use keel_core::ids::ConversationId;

use crate::activation::ensure_started;
use crate::registry::conversation_of;
use crate::shared::Shared;

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
        let recent = state.restarts.entry(id.clone()).or_default();
        if !may_restart(
            recent,
            Instant::now(),
            settings.max_restarts,
            settings.restart_window,
        ) {
            tracing::error!(
                conversation = %id, %error,
                "conversation failed {} times within {:?}; leaving it stopped until it is next addressed",
                recent.len() + 1, settings.restart_window
            );
            return Ok(());
        }
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

/// Restart intensity: whether a conversation that failed at `now` is
/// restarted, given when it was restarted before (`recent`, oldest first).
/// Restarts older than `window` are forgotten; with `max_restarts` left in
/// the window it is not restarted. A restart is recorded in `recent`.
fn may_restart(
    recent: &mut VecDeque<Instant>,
    now: Instant,
    max_restarts: usize,
    window: Duration,
) -> bool {
    while recent
        .front()
        .is_some_and(|at| now.duration_since(*at) > window)
    {
        recent.pop_front();
    }
    if recent.len() >= max_restarts {
        return false;
    }
    recent.push_back(now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Settings;

    /// The defaults: a conversation that fails a fourth time within 60 s of
    /// its first restart is left stopped; once the oldest restart is more
    /// than 60 s old it is restarted again.
    #[test]
    fn a_fourth_failure_within_the_window_is_not_restarted() {
        let settings = Settings::default();
        assert_eq!(settings.max_restarts, 3);
        assert_eq!(settings.restart_window, Duration::from_secs(60));
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut recent = VecDeque::new();
        let mut restarted = |now: Instant| {
            may_restart(
                &mut recent,
                now,
                settings.max_restarts,
                settings.restart_window,
            )
        };
        assert!(restarted(at(0)));
        assert!(restarted(at(10)));
        assert!(restarted(at(20)));
        assert!(!restarted(at(30)), "a fourth failure within 60 s");
        assert!(!restarted(at(60)), "the first restart is exactly 60 s old");
        assert!(restarted(at(61)), "the first restart is past the window");
        assert!(!restarted(at(62)), "three within the window again");
        assert!(restarted(at(71)), "the restart at 10 s is past it too");
    }
}
