//! A CI repair run (SPEC §11): kodx's own follow-up when CI fails on a pull request it
//! opened. Admission decided it and stored the failure report
//! ([`crate::serve::pipeline::repair`]); the run is an ordinary code run on the pull
//! request's branch, with its status comment, budget and cost.

use crate::job::Job;
use crate::serve::pipeline::repair::follow_up;
use crate::serve::pipeline::work::{execute_and_deliver, Delivery};
use crate::serve::pipeline::{Ending, RunCtx, RunFailure};
use crate::serve::texts;

/// Runs a repair: the stored failure report, one run, its commit on the pull request.
pub(in crate::serve) async fn run(cx: &RunCtx<'_>) -> Result<Ending, RunFailure> {
    let report = cx
        .svc
        .db
        .repair_report(&cx.run.id)
        .await
        .map_err(|e| anyhow::anyhow!("reading the failure report failed: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("the repair run has no failure report"))?;
    let plan = cx.plan_with(Some(follow_up(&report))).await?;
    let messages = vec![plan.first_message()];
    let delivery = Delivery {
        // A failure that survived a re-run of the failed jobs: the report starts with it.
        note: texts::rerun::note_of(&report).map(str::to_string),
        ..Delivery::of(request(&cx.run.request.job))
    };
    execute_and_deliver(cx, &plan, messages, delivery).await
}

/// What the commit and the pull request say was asked: what a repair does.
fn request(job: &Job) -> String {
    match job {
        Job::Repair { commit } => format!(
            "Repair the failing CI of {}",
            commit.get(..7).unwrap_or(commit)
        ),
        other => other.argument().into_owned(),
    }
}
