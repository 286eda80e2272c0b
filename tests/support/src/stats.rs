//! Percentiles of measured durations, the two ways keel's figures take
//! them: the benches' nearest rank, and `keel bench`'s rounded index
//! (the figures published with each were taken that way, so each keeps
//! its own).

use std::time::Duration;

/// The nearest-rank percentile `p` (0 to 1) of `values`, in any order:
/// the smallest value with at least `p` of them at or below it. Zero for
/// no values.
pub fn nearest_rank(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The value at index `(n - 1) * quantile`, rounded, of `sorted` (sorted
/// ascending); `None` for no values.
pub fn rounded_rank(sorted: &[Duration], quantile: f64) -> Option<Duration> {
    let last = sorted.len().checked_sub(1)?;
    let index = (last as f64 * quantile).round() as usize;
    Some(sorted[index.min(last)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ways_pick_a_sample() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(nearest_rank(&samples, 0.5), Duration::from_millis(50));
        assert_eq!(nearest_rank(&samples, 0.99), Duration::from_millis(99));
        assert_eq!(nearest_rank(&samples, 1.0), Duration::from_millis(100));
        assert_eq!(nearest_rank(&[], 0.5), Duration::ZERO);
        assert_eq!(rounded_rank(&samples, 0.5), Some(Duration::from_millis(51)));
        assert_eq!(
            rounded_rank(&samples, 0.99),
            Some(Duration::from_millis(99))
        );
        assert_eq!(rounded_rank(&[], 0.5), None);
    }
}
