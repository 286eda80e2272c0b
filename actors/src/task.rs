//! Small helpers for the tasks the actors start.

/// Aborts its task when dropped, so that timers and tickers die with the actor
/// however it ends (`post_stop` is skipped when an actor is killed).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
