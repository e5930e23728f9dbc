//! The sentences of the pull request's life (SPEC §11): `/kodx address-reviews` and CI
//! repair.

use crate::neutral;
use crate::redact::redact;

/// `/kodx address-reviews` on an issue.
pub const ADDRESS_REVIEWS_ON_ISSUE: &str = "`/kodx address-reviews` answers the review \
     threads of a pull request; write it on the pull request (or in a review)";

/// `/kodx address-reviews` on a pull request without unresolved threads.
pub const NO_UNRESOLVED_THREADS: &str = "This pull request has no unresolved review threads, \
     so there is nothing for `/kodx address-reviews` to address. Nothing was run or charged.";

/// The run ended without listing any thread.
pub const NO_THREADS_LISTED: &str = "The run listed no review thread in its `kodx-threads` \
     list, so kodx replied in none.\n\n";

/// GitHub did not give the review threads.
pub fn threads_unreadable(error: &str) -> String {
    format!(
        "kodx could not read this pull request's review threads from GitHub ({}). Run \
         `/kodx address-reviews` again in a moment.",
        redact(error)
    )
}

/// The model's list could not be read: no replies were posted. `why` is kodx's sentence
/// (its outside parts already neutralized where it was made).
pub fn threads_list_unreadable(why: &str) -> String {
    format!(
        "kodx posted no replies in the review threads: {}. The change above was delivered \
         as usual; reply in the threads by hand, or run `/kodx address-reviews` again.\n\n",
        redact(why)
    )
}

/// Why CI repair stopped on a pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairStop {
    /// `ci_repair` repair runs were made since a maintainer's last run.
    Limit(u32),
    /// The same checks failed with the same first error as on the last repaired commit.
    Repeated { first_error: String },
}

/// The one comment kodx posts when CI still fails on its pull request and it stops
/// repairing.
pub fn repair_stopped(commit: &str, failed: &[String], stop: &RepairStop) -> String {
    let sha = commit.get(..7).unwrap_or(commit);
    let names = failed
        .iter()
        .take(10)
        .map(|n| neutral::code(n))
        .collect::<Vec<_>>()
        .join(", ");
    let why = match stop {
        RepairStop::Limit(1) => {
            "it already made its one repair run here (`ci_repair: 1`)".to_string()
        }
        RepairStop::Limit(n) => format!("it already made {n} repair runs here (`ci_repair: {n}`)"),
        RepairStop::Repeated { first_error } => format!(
            "the failure repeats unchanged after its last repair (first error: {})",
            neutral::code(first_error)
        ),
    };
    format!(
        "CI still fails on {sha} ({names}), and kodx stops repairing: {why}. Fix it by hand, \
         or ask again with `/kodx code <what to do>`, which starts the repair count over."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_repair_says_why_and_what_next() {
        let t = repair_stopped(
            "0123456789abcdef",
            &["tests".into(), "lint".into()],
            &RepairStop::Limit(1),
        );
        assert!(t.contains("0123456"), "{t}");
        assert!(t.contains("`tests`, `lint`"), "{t}");
        assert!(t.contains("`ci_repair: 1`"), "{t}");
        assert!(t.contains("/kodx code"), "{t}");
        let t = repair_stopped(
            "abc",
            &["tests".into()],
            &RepairStop::Repeated {
                first_error: "error[E0308]: `mismatched` types".into(),
            },
        );
        assert!(t.contains("repeats unchanged"), "{t}");
        assert!(t.contains("``error[E0308]: `mismatched` types``"), "{t}");
    }

    #[test]
    fn hostile_check_names_and_errors_stay_inert() {
        use crate::neutral::testing::{assert_nothing_live, HOSTILE};
        for stop in [
            RepairStop::Limit(2),
            RepairStop::Repeated {
                first_error: HOSTILE.into(),
            },
        ] {
            let t = repair_stopped("abc", &[HOSTILE.into(), "lint\n\n@org/team".into()], &stop);
            assert_nothing_live(&t);
            assert!(t.contains("kodx stops repairing"), "{t}");
        }
    }
}
