//! A code run's checks where GitHub shows them (SPEC §11, §12): a completed Check Run named
//! `kodx` on the commit kodx pushed, with the checks table as its summary, each check's
//! output tail as its text, the run page as its details, and the annotations read from the
//! red checks' output. The token asks for `checks: write` alone, so an installation without
//! that permission loses the Check Run (said once in the status comment), never the run.
//!
//! Annotations: GitHub takes at most [`ANNOTATIONS_PER_REQUEST`] in one request, so the
//! create request carries the first ones and updates (`PATCH`) append the rest, at most
//! [`MAX_ANNOTATIONS`] in all; the summary says how many more there were. An update that
//! fails is logged and the rest are not sent: the run and its Check Run stand.

use std::collections::HashSet;

use crate::checks::{annotate, latest, Annotation, CheckResult, Verdict};
use crate::github::{GitHubError, NewCheckRun, TokenScope, ANNOTATIONS_PER_REQUEST};
use crate::serve::texts::checks::{
    annotations_left_out, check_run, check_run_failed, CHECK_RUN_NAME,
};

use super::RunCtx;

/// Annotations on one Check Run at most (SPEC §12).
pub(in crate::serve) const MAX_ANNOTATIONS: usize = 200;

/// Creates the `kodx` Check Run on `sha`. `Err`: the sentence the status comment shows.
pub(in crate::serve) async fn report_checks(
    cx: &RunCtx<'_>,
    sha: &str,
    results: &[CheckResult],
    verdict: Verdict,
) -> Result<(), String> {
    let link = cx.svc.run_link(&cx.run.id);
    let (conclusion, title, mut summary, text) = check_run(results, verdict, link.as_deref());
    let (mut annotations, left_out, more) = annotations(results);
    if left_out > 0 || more {
        summary.push_str(&annotations_left_out(annotations.len(), left_out, more));
    }
    let gh = cx
        .installation_for(&TokenScope::checks(&cx.repo))
        .await
        .map_err(|e| {
            tracing::warn!("no token for the Check Run: {e}");
            check_run_failed(&e.to_string(), not_permitted(&e))
        })?;
    let rest = annotations.split_off(annotations.len().min(ANNOTATIONS_PER_REQUEST));
    let run = NewCheckRun {
        name: CHECK_RUN_NAME.into(),
        head_sha: sha.into(),
        conclusion,
        title,
        summary,
        text,
        details_url: link,
        external_id: Some(cx.run.id.clone()),
        annotations,
    };
    // Only while this process holds the run (the client asks the lease; else it ends
    // here, silently).
    let created = match gh.create_check_run(&cx.repo, &run).await {
        Ok(created) => created,
        Err(GitHubError::Withheld { .. }) => return Ok(()),
        Err(e) => {
            tracing::warn!("creating the check run failed: {e}");
            return Err(check_run_failed(&e.to_string(), not_permitted(&e)));
        }
    };
    tracing::info!(url = %created.html_url, annotations = run.annotations.len(), "check run created");
    for batch in rest.chunks(ANNOTATIONS_PER_REQUEST) {
        match gh
            .add_check_run_annotations(&cx.repo, created.id, &run, batch)
            .await
        {
            Ok(()) => {}
            Err(GitHubError::Withheld { .. }) => break,
            Err(e) => {
                tracing::warn!(
                    check_run = created.id,
                    "adding annotations to the check run failed; the rest are not sent: {e}"
                );
                break;
            }
        }
    }
    Ok(())
}

/// The annotations of the last attempt's red checks, secrets redacted, duplicates (the
/// same problem told by two checks) dropped, failures before warnings before notices (each
/// in the order the checks told them), at most [`MAX_ANNOTATIONS`]; how many more there
/// were, and whether a check's output went on past the annotations read from it (the
/// parser's own bound, [`annotate::MAX_ANNOTATIONS`]).
fn annotations(results: &[CheckResult]) -> (Vec<Annotation>, usize, bool) {
    let red: Vec<&CheckResult> = latest(results).into_iter().filter(|r| !r.passed).collect();
    let more = red
        .iter()
        .any(|r| r.annotations.len() >= annotate::MAX_ANNOTATIONS);
    let mut seen = HashSet::new();
    let mut all: Vec<Annotation> = red
        .iter()
        .flat_map(|r| r.annotations.iter())
        .filter(|a| seen.insert((&a.path, a.start_line, a.start_column, a.level, &a.message)))
        .map(|a| Annotation {
            message: crate::redact::redact(&a.message),
            title: a.title.as_deref().map(crate::redact::redact),
            ..a.clone()
        })
        .collect();
    all.sort_by_key(|a| std::cmp::Reverse(a.level));
    let left_out = all.len().saturating_sub(MAX_ANNOTATIONS);
    all.truncate(MAX_ANNOTATIONS);
    (all, left_out, more)
}

/// GitHub's answers for an installation without the Checks permission: 422 when a token
/// asks for it, 403 "Resource not accessible by integration" when a call needs it.
fn not_permitted(e: &GitHubError) -> bool {
    let text = e.to_string();
    text.contains("not granted to this installation")
        || text.contains("Resource not accessible by integration")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::Level;

    fn red(name: &str, attempt: u32, lines: std::ops::Range<u32>, level: Level) -> CheckResult {
        CheckResult {
            name: name.into(),
            run: "make".into(),
            attempt,
            passed: false,
            exit_code: Some(1),
            timed_out: false,
            duration_ms: 1,
            output: String::new(),
            omitted_bytes: 0,
            annotations: lines
                .map(|l| Annotation {
                    path: "src/a.c".into(),
                    start_line: l,
                    end_line: l,
                    start_column: None,
                    end_column: None,
                    level,
                    message: format!("problem {l} ghp_{}", "a".repeat(36)),
                    title: Some(name.into()),
                })
                .collect(),
            edited: Vec::new(),
        }
    }

    #[test]
    fn the_last_attempts_red_checks_give_at_most_200_failures_first() {
        let mut passed = red("green", 2, 1..5, Level::Failure);
        passed.passed = true;
        let results = [
            red("earlier", 1, 1..400, Level::Failure),
            red("lint", 2, 1..151, Level::Warning),
            red("tests", 2, 100..201, Level::Failure),
            // The same problems told again by another check.
            red("again", 2, 1..11, Level::Warning),
            passed,
        ];
        let (kept, left_out, more) = annotations(&results);
        assert_eq!((kept.len(), left_out, more), (200, 51, false));
        assert!(kept[..101].iter().all(|a| a.level == Level::Failure));
        assert_eq!(kept[0].start_line, 100);
        assert_eq!(kept[101].title.as_deref(), Some("lint"));
        assert!(kept.iter().all(|a| !a.message.contains("ghp_")), "redacted");
        let none = annotations(&[red("green", 1, 1..1, Level::Notice)]);
        assert_eq!(none, (Vec::new(), 0, false));
        // A check whose output had more than the parser reads of it.
        let (kept, left_out, more) = annotations(&[red("big", 1, 1..201, Level::Failure)]);
        assert_eq!((kept.len(), left_out, more), (200, 0, true));
    }
}
