//! The cost estimate line of the status comment (SPEC §12, "Quote and confirmation"): what
//! the repository's last runs of the same kind cost, beside the run's cap. Shown from the
//! acknowledgement until the run ends; the finished comment shows the real cost instead.
//!
//! Pure functions only: no I/O, no clock.

use crate::cost::format_usd;
use crate::db::Estimate;
use crate::job::JobKind;

/// One line: the median and the 90th percentile of the last runs of `kind` (or "no history
/// yet" with fewer than 3), and the run's cap.
pub fn estimate_line(estimate: Option<&Estimate>, kind: JobKind, cap: f64) -> String {
    let cap = format_usd(cap);
    match estimate {
        Some(e) => format!(
            "estimate: {} median, {} 90th percentile of the last {} `{}` runs here · cap {cap}",
            format_usd(e.median_usd()),
            format_usd(e.p90_usd()),
            e.runs,
            kind.command_word(),
        ),
        None => format!("estimate: no history yet · cap {cap}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_line() {
        let e = Estimate {
            runs: 12,
            median_micros: 412_000,
            p90_micros: 1_250_000,
        };
        insta::assert_snapshot!(estimate_line(Some(&e), JobKind::Code, 2.0), @"estimate: $0.4120 median, $1.25 90th percentile of the last 12 `code` runs here · cap $2.00");
        insta::assert_snapshot!(estimate_line(Some(&e), JobKind::AddressReviews, 0.5), @"estimate: $0.4120 median, $1.25 90th percentile of the last 12 `address-reviews` runs here · cap $0.5000");
        insta::assert_snapshot!(estimate_line(None, JobKind::Ask, 1.0), @"estimate: no history yet · cap $1.00");
    }

    #[test]
    fn the_status_comment_shows_it_until_the_run_ends() {
        use crate::agent::{Outcome, StopReason};
        use crate::serve::texts::status::{render_linked, Done, Phase, RunKind};
        let line = estimate_line(None, JobKind::Code, 2.0);
        let queued = render_linked("r1", "/kodx code fix it", &Phase::Queued, None, Some(&line));
        insta::assert_snapshot!(queued, @r#"
        <!-- kodx:{"run":"r1","v":1} -->
        ### ⏳ queued

        > /kodx code fix it

        estimate: no history yet · cap $2.00

        <sub>kodx run <code>r1</code></sub>
        "#);
        let outcome = Outcome {
            stop_reason: StopReason::EndTurn,
            last_message: "done".into(),
            api_calls: 1,
            usage: Default::default(),
            usd_cost: 0.01,
            cost_limit: 2.0,
            duration: std::time::Duration::from_secs(1),
            model: "m".into(),
            detail: None,
            checks: Vec::new(),
        };
        let done = Phase::Done(Box::new(Done::new(RunKind::Code, outcome)));
        let done = render_linked("r1", "/kodx code fix it", &done, None, Some(&line));
        assert!(!done.contains("estimate:"), "{done}");
    }
}
