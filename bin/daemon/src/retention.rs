//! `KEEL_RETENTION_DAYS`: conversations untouched for that long are deleted
//! (with their sub-agents, their logs and the images nothing else shows) by
//! a sweep in the background, a few times per retention period and at least
//! hourly. The sweep is a task of its own: it never holds up a turn, and a
//! conversation busy when it comes is left for the next one
//! (`Runtime::sweep_retention`).

use std::time::Duration;

use keel_actors::Runtime;
use tokio::sync::watch;

/// How often the sweep runs: a quarter of the retention period, between a
/// second and an hour.
fn every(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// Sweep until the daemon stops.
pub(crate) async fn sweep(
    runtime: Runtime,
    retention: Duration,
    mut stopping: watch::Receiver<bool>,
) {
    let every = every(retention);
    loop {
        tokio::select! {
            _ = stopping.wait_for(|stopping| *stopping) => return,
            () = tokio::time::sleep(every) => {}
        }
        match runtime.sweep_retention(retention).await {
            Ok(deleted) if !deleted.is_empty() => tracing::info!(
                deleted = deleted.len(),
                ?retention,
                "retention: deleted conversations untouched for longer than the retention"
            ),
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "retention sweep failed; the next one tries again")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_runs_a_few_times_a_period_at_most_hourly() {
        let day = Duration::from_secs(86_400);
        assert_eq!(every(30 * day), Duration::from_secs(3600));
        assert_eq!(every(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(every(Duration::from_secs(40)), Duration::from_secs(10));
    }
}
