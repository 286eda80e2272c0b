//! The runtime's settings: timing of idle tiers, live-update waves and the
//! graceful stop.

use std::time::Duration;

/// Timings of the runtime; the defaults suit a daemon, tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Idle this long in a clean state (waiting on a user or a human), an
    /// actor releases its working set, which the next message rebuilds from
    /// the checkpoint and the log's tail. Zero releases it as soon as the
    /// conversation comes to rest: a live idle conversation then holds no
    /// history, and every message pays a rebuild.
    pub short_idle: Duration,
    /// Idle this long in a clean state, an actor saves its snapshot and stops.
    pub long_idle: Duration,
    /// How often an actor looks at its idle time.
    pub idle_check: Duration,
    /// Events a hibernating conversation may be ahead of its stored
    /// checkpoint before hibernating writes a new one (so that waking
    /// replays at most about this many). Eviction always writes one.
    pub checkpoint_lag: u64,
    /// A conversation failing more often than this within `restart_window`
    /// is left stopped until it is next addressed.
    pub max_restarts: usize,
    pub restart_window: Duration,
    /// How long a graceful [`Runtime::shutdown`](crate::Runtime::shutdown) lets turns in flight run
    /// to their end before it interrupts them.
    pub shutdown_grace: Duration,
    /// Live-only updates (deltas, tool output, state changes) go out to
    /// subscribers in waves at most this often; what one step publishes
    /// goes out together, a canonical event is never held past its step
    /// and takes the held ones along (docs/requirements.md, "Live updates
    /// go out in waves"). Zero holds nothing beyond the step.
    pub live_interval: Duration,
}

/// The default of [`Settings::live_interval`]: one frame of a 60 Hz
/// display, shorter than a person notices and long enough that a fast
/// model's tokens, and the message that ends them, share a wave.
pub const DEFAULT_LIVE_INTERVAL: Duration = Duration::from_millis(16);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            short_idle: Duration::from_secs(60),
            long_idle: Duration::from_secs(30 * 60),
            idle_check: Duration::from_secs(30),
            checkpoint_lag: 64,
            max_restarts: 3,
            restart_window: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            live_interval: DEFAULT_LIVE_INTERVAL,
        }
    }
}
