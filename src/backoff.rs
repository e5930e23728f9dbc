//! One backoff formula for every retried call (model APIs, GitHub): exponential, with
//! jitter, capped.

use std::time::Duration;

/// The wait before attempt `attempt + 1` (attempts count from 1): `base`, doubled for each
/// attempt after the first (at most 2^16 times), plus up to 50% random jitter, never more
/// than `max`.
pub fn delay(base: Duration, max: Duration, attempt: u32) -> Duration {
    with_jitter(base, max, attempt, rand::random::<f64>())
}

/// [`delay`] with the random draw given: `unit` in `[0, 1)` adds `unit * 50%`.
fn with_jitter(base: Duration, max: Duration, attempt: u32, unit: f64) -> Duration {
    let exp = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(max);
    (exp + exp.mul_f64(unit * 0.5)).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    #[test]
    fn doubles_from_the_base_without_jitter() {
        let waits: Vec<u64> = (1..=7)
            .map(|a| with_jitter(S, MAX, a, 0.0).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60]);
        assert_eq!(
            with_jitter(S, MAX, 0, 0.0),
            S,
            "attempt 0 reads as the first"
        );
    }

    #[test]
    fn jitter_adds_up_to_half_and_the_cap_holds() {
        assert_eq!(with_jitter(S * 4, MAX, 1, 0.5), S * 5);
        assert_eq!(
            with_jitter(S * 4, MAX, 1, 0.999),
            S * 4 + (S * 2).mul_f64(0.999)
        );
        assert_eq!(with_jitter(S * 40, MAX, 1, 0.9), S * 58);
        assert_eq!(with_jitter(S * 50, MAX, 1, 0.9), MAX);
        assert_eq!(with_jitter(S, MAX, u32::MAX, 0.9), MAX, "no overflow");
        for attempt in 1..40 {
            let d = delay(S, MAX, attempt);
            let exp = with_jitter(S, MAX, attempt, 0.0);
            assert!(
                d >= exp && d <= exp.mul_f64(1.5).min(MAX),
                "{attempt}: {d:?}"
            );
        }
    }
}
