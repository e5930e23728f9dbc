//! What kodx says about a run that waits for `/kodx go` (SPEC §12, "Quote and
//! confirmation"): why it waits and how to go on, who started it, and how it ended when
//! nobody did.
//!
//! Pure functions only: no I/O, no clock (times come in as unix milliseconds).

use std::time::Duration;

use crate::command::Usd;
use crate::cost::format_usd;
use crate::redact::redact;

/// What the run's expected cost was judged by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Judged {
    /// The 90th percentile of the repository's last runs of the kind, in USD.
    Percentile(f64),
    /// With fewer than 3 such runs: the run's cap, in USD.
    Cap(f64),
}

impl Judged {
    pub fn usd(self) -> f64 {
        match self {
            Judged::Percentile(usd) | Judged::Cap(usd) => usd,
        }
    }
}

/// Whether a run waits for confirmation: when the repository sets `confirm_above_usd`
/// and what the run is judged by (the 90th percentile, else the cap) is above it.
pub fn needs_confirmation(threshold: Option<f64>, p90: Option<f64>, cap: f64) -> Option<Judged> {
    let threshold = threshold?;
    let judged = match p90 {
        Some(p90) => Judged::Percentile(p90),
        None => Judged::Cap(cap),
    };
    (judged.usd() > threshold).then_some(judged)
}

/// The paragraph under the estimate line of a waiting run's status comment.
pub fn awaiting(judged: Judged, threshold: f64, until_ms: i64, wait: Duration) -> String {
    let why = match judged {
        Judged::Percentile(usd) => format!(
            "the 90th percentile of its last runs here, {}, is above",
            format_usd(usd)
        ),
        Judged::Cap(usd) => format!(
            "with too few runs here to estimate from, its cap of {} is above",
            format_usd(usd)
        ),
    };
    format!(
        "This run waits for a go-ahead: {why} this repository's `confirm_above_usd` ({}). \
         Nothing has started and nothing is spent.\n\n\
         A writer can start it with `/kodx go`, or with a lower cap with `/kodx go $N`; \
         `/kodx cancel` drops it. If nobody does, it ends by itself at {} ({} after it was asked).",
        format_usd(threshold),
        utc(until_ms),
        wait_words(wait),
    )
}

/// The status comment's header once a writer said `/kodx go`: who, and the cap asked for
/// (the run's cap is the lower of it and what it had).
pub fn started_by(who: &str, asked: Option<Usd>) -> String {
    let who = redact(who);
    match asked {
        Some(n) => {
            format!("⏳ queued — started by @{who} with `/kodx go {n}`: its cap is at most {n}")
        }
        None => format!("⏳ queued — started by @{who} with `/kodx go`"),
    }
}

/// The answer to `/kodx go` where no run waits.
pub fn nothing_to_confirm(author: &str) -> String {
    format!(
        "@{} there is no kodx run waiting for `/kodx go` here.",
        redact(author)
    )
}

/// Why a waiting run ended by itself.
pub fn unconfirmed(wait: Duration) -> String {
    format!(
        "Nobody started it with `/kodx go` within {}, so it ended without starting; nothing \
         was spent. Run the command again to ask anew.",
        wait_words(wait)
    )
}

/// `2026-11-29 23:52 UTC`.
fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| "a time out of range".into())
}

/// `24 hours`, `90 minutes`, `5 seconds`.
fn wait_words(d: Duration) -> String {
    let s = d.as_secs();
    let (n, unit) = match s {
        s if s >= 3600 && s % 3600 == 0 => (s / 3600, "hour"),
        s if s >= 60 && s % 60 == 0 => (s / 60, "minute"),
        s => (s, "second"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_waits() {
        assert_eq!(needs_confirmation(None, Some(9.0), 9.0), None);
        assert_eq!(needs_confirmation(Some(1.0), Some(1.0), 5.0), None);
        assert_eq!(
            needs_confirmation(Some(1.0), Some(1.2), 0.5),
            Some(Judged::Percentile(1.2))
        );
        assert_eq!(
            needs_confirmation(Some(1.0), None, 2.0),
            Some(Judged::Cap(2.0))
        );
        assert_eq!(needs_confirmation(Some(2.0), None, 2.0), None);
        assert_eq!(
            needs_confirmation(Some(0.0), Some(0.01), 2.0),
            Some(Judged::Percentile(0.01))
        );
    }

    #[test]
    fn the_sentences() {
        let day = Duration::from_secs(86_400);
        let until = 1_796_083_920_000; // 2026-12-01 00:12 UTC
        insta::assert_snapshot!(awaiting(Judged::Percentile(1.25), 0.5, until, day), @r"
        This run waits for a go-ahead: the 90th percentile of its last runs here, $1.25, is above this repository's `confirm_above_usd` ($0.5000). Nothing has started and nothing is spent.

        A writer can start it with `/kodx go`, or with a lower cap with `/kodx go $N`; `/kodx cancel` drops it. If nobody does, it ends by itself at 2026-12-01 00:12 UTC (24 hours after it was asked).
        ");
        insta::assert_snapshot!(awaiting(Judged::Cap(2.0), 1.0, until, Duration::from_secs(90)), @r"
        This run waits for a go-ahead: with too few runs here to estimate from, its cap of $2.00 is above this repository's `confirm_above_usd` ($1.00). Nothing has started and nothing is spent.

        A writer can start it with `/kodx go`, or with a lower cap with `/kodx go $N`; `/kodx cancel` drops it. If nobody does, it ends by itself at 2026-12-01 00:12 UTC (90 seconds after it was asked).
        ");
        insta::assert_snapshot!(started_by("bob", None), @"⏳ queued — started by @bob with `/kodx go`");
        insta::assert_snapshot!(started_by("bob", Some(Usd(0.75))), @"⏳ queued — started by @bob with `/kodx go $0.75`: its cap is at most $0.75");
        insta::assert_snapshot!(nothing_to_confirm("carol"), @"@carol there is no kodx run waiting for `/kodx go` here.");
        insta::assert_snapshot!(unconfirmed(Duration::from_secs(3600)), @"Nobody started it with `/kodx go` within 1 hour, so it ended without starting; nothing was spent. Run the command again to ask anew.");
        assert_eq!(wait_words(Duration::from_secs(120)), "2 minutes");
        assert_eq!(wait_words(Duration::from_secs(1)), "1 second");
    }
}
