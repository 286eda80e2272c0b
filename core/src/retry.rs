//! Retry policy as data, and the backoff arithmetic. The jitter is an input
//! (the shell draws it), so the same failure always yields the same delay.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetryPolicy {
    /// Retries after the first attempt, per provider; 3 by default
    /// (REQ-BED-006).
    pub max_retries: u32,
    /// Delay before the first retry; doubles with each further retry.
    pub base_delay_ms: u64,
    /// Ceiling of the exponential delay.
    pub max_delay_ms: u64,
    /// Ceiling of a provider's `retry-after`, 60 s by default, so a provider
    /// asking for an hour cannot park a turn that long (docs/requirements.md,
    /// "Retries and fallback").
    pub retry_after_cap_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            base_delay_ms: 1_000,
            max_delay_ms: 30_000,
            retry_after_cap_ms: 60_000,
        }
    }
}

/// A uniformly drawn number in `0..=1000`, supplied by the shell with each failure.
pub type JitterPermille = u16;

impl RetryPolicy {
    /// Delay before retry number `retry` (1-based).
    ///
    /// Exponential with "equal jitter": half the backoff is fixed, the other half
    /// scaled by `jitter`, so retries spread out but never collapse to zero. A
    /// provider's `retry-after` wins when it asks for longer, capped.
    pub fn delay_ms(&self, retry: u32, retry_after_ms: Option<u64>, jitter: JitterPermille) -> u64 {
        let exponent = retry.saturating_sub(1).min(32);
        let backoff = self
            .base_delay_ms
            .saturating_mul(1u64 << exponent)
            .min(self.max_delay_ms);
        let jitter = u64::from(jitter.min(1000));
        let jittered = backoff / 2 + (backoff / 2).saturating_mul(jitter) / 1000;
        match retry_after_ms {
            Some(after) => after.min(self.retry_after_cap_ms).max(jittered),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay_ms(1, None, 1000), 1_000);
        assert_eq!(policy.delay_ms(2, None, 1000), 2_000);
        assert_eq!(policy.delay_ms(3, None, 1000), 4_000);
        assert_eq!(policy.delay_ms(30, None, 1000), 30_000);
    }

    #[test]
    fn jitter_spreads_between_half_and_full_backoff() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay_ms(2, None, 0), 1_000);
        assert_eq!(policy.delay_ms(2, None, 500), 1_500);
        assert_eq!(policy.delay_ms(2, None, u16::MAX), 2_000);
    }

    #[test]
    fn retry_after_is_honoured_and_capped_at_sixty_seconds() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay_ms(1, Some(7_000), 0), 7_000);
        assert_eq!(policy.delay_ms(1, Some(3_600_000), 0), 60_000);
        // A retry-after shorter than our own backoff does not make us hurry.
        assert_eq!(policy.delay_ms(3, Some(10), 1000), 4_000);
    }
}
