//! What kodx says about failed GitHub Actions jobs it re-ran before a CI repair (SPEC §12,
//! "Mergeable pull requests"). A re-run that passes posts nothing.

use crate::neutral;

/// The failed checks' names as a list of code spans (at most ten, then how many more).
fn names(failed: &[String]) -> String {
    let mut shown: Vec<String> = failed.iter().take(10).map(|n| neutral::code(n)).collect();
    if failed.len() > 10 {
        shown.push(format!("{} more", failed.len() - 10));
    }
    shown.join(", ")
}

/// How [`failed_again`] starts.
const FAILED_AGAIN: &str = "Before this repair kodx re-ran the failed GitHub Actions jobs once";

/// The note in a repair run's status comment (and at the top of its failure report) when
/// its failure survived a re-run.
pub fn failed_again(failed: &[String]) -> String {
    format!(
        "{FAILED_AGAIN} ({}); they failed again, so the failure is not a flaky one.",
        names(failed)
    )
}

/// The [`failed_again`] note a failure report starts with, if it does.
pub fn note_of(report: &str) -> Option<&str> {
    report
        .split("\n\n")
        .next()
        .filter(|first| first.starts_with(FAILED_AGAIN))
}

/// The one comment on a pull request whose failed jobs kodx could not re-run.
pub fn cannot_rerun(commit: &str, why: &str) -> String {
    let sha = commit.get(..7).unwrap_or(commit);
    format!(
        "kodx could not re-run the failed GitHub Actions jobs of {sha} before repairing: {}. \
         It repairs without re-running, here and on this pull request's next failures. To \
         give flaky jobs one more try first, grant the App the **Actions: Read and write** \
         permission; `ci_rerun: 0` in `.github/kodx.yml` turns re-running off.",
        neutral::words(why)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentences() {
        insta::assert_snapshot!(failed_again(&["test".into(), "lint (ubuntu)".into()]), @"Before this repair kodx re-ran the failed GitHub Actions jobs once (`test`, `lint (ubuntu)`); they failed again, so the failure is not a flaky one.");
        let note = failed_again(&["test".into()]);
        assert_eq!(
            note_of(&format!("{note}\n\n## CI failures\n\n…")),
            Some(note.as_str())
        );
        assert_eq!(
            note_of("## CI failures\n\nBefore this repair kodx re-ran"),
            None
        );
        let many: Vec<String> = (1..=12).map(|i| format!("job {i}")).collect();
        assert!(failed_again(&many).contains("`job 10`, 2 more)"));
        insta::assert_snapshot!(cannot_rerun(&"a".repeat(40), "the App lacks the Actions write permission"), @"kodx could not re-run the failed GitHub Actions jobs of aaaaaaa before repairing: the App lacks the Actions write permission. It repairs without re-running, here and on this pull request's next failures. To give flaky jobs one more try first, grant the App the **Actions: Read and write** permission; `ci_rerun: 0` in `.github/kodx.yml` turns re-running off.");
    }
}
