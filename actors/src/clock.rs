//! The runtime's clock. keel-core never reads a clock; the shell stamps every
//! input with `Clock::now()`. It counts from a wall-clock reading taken once,
//! forward with tokio's monotonic `Instant`, so that timestamps never go
//! backwards when the system clock is adjusted and so that tests running on
//! paused tokio time see time move exactly as the timers do.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_core::time::Timestamp;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Milliseconds since the Unix epoch at `base`.
    wall_base_ms: u64,
    base: Instant,
}

impl Clock {
    /// A clock reading the system time once, now.
    pub fn system() -> Clock {
        let wall_base_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| since.as_millis() as u64)
            .unwrap_or(0);
        Clock {
            wall_base_ms,
            base: Instant::now(),
        }
    }

    pub fn now(&self) -> Timestamp {
        let elapsed = self.base.elapsed().as_millis() as u64;
        Timestamp::from_millis(self.wall_base_ms.saturating_add(elapsed))
    }

    /// How long from now until `at` (zero if it has passed).
    pub fn until(&self, at: Timestamp) -> Duration {
        Duration::from_millis(at.as_millis().saturating_sub(self.now().as_millis()))
    }
}
