//! The summary of one measurement's samples: n, median, p95 (nearest rank), min and max.

use std::time::Duration;

use anyhow::Context;

/// Summary of one measurement's samples, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Stats {
    pub(super) n: usize,
    /// The middle sample; with an even count, the mean of the two middle ones
    /// (1..=100 gives 50.5).
    pub(super) median: f64,
    /// Nearest rank: the ⌈0.95·n⌉-th smallest sample (1..=100 gives 95).
    pub(super) p95: f64,
    pub(super) min: f64,
    pub(super) max: f64,
}

impl Stats {
    /// `None` for no samples.
    pub(super) fn of(samples_ms: &[f64]) -> Option<Stats> {
        if samples_ms.is_empty() {
            return None;
        }
        let mut s = samples_ms.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Stats {
            n,
            median,
            p95: s[nearest_rank(n, 95) - 1],
            min: s[0],
            max: s[n - 1],
        })
    }
}

/// The 1-based nearest rank of percentile `pct` among `n` sorted samples: ⌈pct·n/100⌉,
/// at least 1. Integer arithmetic, so 95 % of 100 is exactly rank 95.
fn nearest_rank(n: usize, pct: usize) -> usize {
    (pct * n).div_ceil(100).clamp(1, n.max(1))
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The summary of `samples`; an error when the measurement took none.
pub(super) fn stats_of(samples: &[f64]) -> anyhow::Result<Stats> {
    Stats::of(samples).context("a measurement took no samples")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p95_of_1_to_100() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Stats::of(&samples).unwrap();
        assert_eq!(s.n, 100);
        // Even count: the mean of the 50th and 51st samples.
        assert_eq!(s.median, 50.5);
        // Nearest rank: ⌈0.95 × 100⌉ = 95th sample.
        assert_eq!(s.p95, 95.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 100.0);
    }

    #[test]
    fn odd_counts_and_small_samples() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.p95, s.min, s.max), (2.0, 3.0, 1.0, 3.0));
        let s = Stats::of(&[7.5]).unwrap();
        assert_eq!(
            (s.n, s.median, s.p95, s.min, s.max),
            (1, 7.5, 7.5, 7.5, 7.5)
        );
        // 20 samples: ⌈19.0⌉ = 19th; 21 samples: ⌈19.95⌉ = 20th.
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(Stats::of(&twenty).unwrap().p95, 19.0);
        let twenty_one: Vec<f64> = (1..=21).map(f64::from).collect();
        assert_eq!(Stats::of(&twenty_one).unwrap().p95, 20.0);
        assert_eq!(Stats::of(&twenty_one).unwrap().median, 11.0);
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn nearest_ranks() {
        assert_eq!(nearest_rank(1, 95), 1);
        assert_eq!(nearest_rank(5, 95), 5);
        assert_eq!(nearest_rank(10, 95), 10);
        assert_eq!(nearest_rank(50, 95), 48);
        assert_eq!(nearest_rank(200, 95), 190);
        assert_eq!(nearest_rank(100, 50), 50);
    }
}
