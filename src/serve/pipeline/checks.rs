//! A code run's checks where GitHub shows them (SPEC §11): a completed Check Run named
//! `kodx` on the commit kodx pushed, with the checks table as its summary, each check's
//! output tail as its text and the run page as its details. The token asks for `checks:
//! write` alone, so an installation without that permission loses the Check Run (said once
//! in the status comment), never the run.

use crate::checks::CheckResult;
use crate::github::{GitHubError, NewCheckRun, TokenScope};
use crate::serve::texts::checks::{check_run, check_run_failed, CHECK_RUN_NAME};

use super::RunCtx;

/// Creates the `kodx` Check Run on `sha`. `Err`: the sentence the status comment shows.
pub(in crate::serve) async fn report_checks(
    cx: &RunCtx<'_>,
    sha: &str,
    results: &[CheckResult],
) -> Result<(), String> {
    let link = cx.svc.run_link(&cx.run.id);
    let (conclusion, title, summary, text) = check_run(results, link.as_deref());
    let gh = cx
        .installation_for(&TokenScope::checks(&cx.repo))
        .await
        .map_err(|e| {
            tracing::warn!("no token for the Check Run: {e}");
            check_run_failed(&e.to_string(), not_permitted(&e))
        })?;
    let run = NewCheckRun {
        name: CHECK_RUN_NAME.into(),
        head_sha: sha.into(),
        conclusion,
        title,
        summary,
        text,
        details_url: link,
        external_id: Some(cx.run.id.clone()),
    };
    // Only while this process holds the run (the client asks the fence; else it ends
    // here, silently).
    match gh.create_check_run(&cx.repo, &run).await {
        Ok(url) => {
            tracing::info!(%url, "check run created");
            Ok(())
        }
        Err(GitHubError::Withheld { .. }) => Ok(()),
        Err(e) => {
            tracing::warn!("creating the check run failed: {e}");
            Err(check_run_failed(&e.to_string(), not_permitted(&e)))
        }
    }
}

/// GitHub's answers for an installation without the Checks permission: 422 when a token
/// asks for it, 403 "Resource not accessible by integration" when a call needs it.
fn not_permitted(e: &GitHubError) -> bool {
    let text = e.to_string();
    text.contains("not granted to this installation")
        || text.contains("Resource not accessible by integration")
}
