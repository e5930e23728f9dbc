//! A merge run (SPEC §12, "Mergeable pull requests"): kodx's own run on a pull request it
//! opened whose base moved on and conflicts with it, started by a push to the base (with
//! `pr.keep_mergeable`) or by `/kodx update`. Admission decided it and read GitHub's
//! `mergeable_state` ([`crate::serve::pipeline::mergeable`]); the run is an ordinary code
//! run, with its status comment, budget and cost, whose workspace is the base merged into
//! the branch with the conflicts left in, and whose change is delivered as the merge commit.

use crate::job::Job;
use crate::model::Message;
use crate::serve::pipeline::context::FollowUp;
use crate::serve::pipeline::deliver::Target;
use crate::serve::pipeline::work::{execute_and_deliver, Delivery};
use crate::serve::pipeline::{Ending, RunCtx, RunFailure};
use crate::serve::texts::merge as says;

/// Runs a merge: the base merged in the workspace, one run, the merge commit pushed.
pub(in crate::serve) async fn run(cx: &RunCtx<'_>) -> Result<Ending, RunFailure> {
    let Job::Merge { asked, .. } = &cx.run.request.job else {
        return Err(anyhow::anyhow!("not a merge run").into());
    };
    let follow_up = FollowUp {
        task: says::task(),
        ..FollowUp::default()
    };
    let plan = cx.plan_with(Some(follow_up)).await?;
    let Some(Target::Merge { branch, base }) = plan.target.clone() else {
        return Err(RunFailure::User(
            "kodx does not push to a fork's branch, so it cannot merge the base into this pull \
             request. Nothing was run."
                .to_string(),
        ));
    };
    let messages = vec![Message::user_text(&plan.prompt)];
    let asked_by = asked.then_some(cx.run.request.author.as_str());
    let delivery = Delivery {
        note: Some(says::note(
            &base,
            cx.admission.mergeable_state.as_deref(),
            asked_by,
        )),
        ..Delivery::of(says::request(&base, &branch))
    };
    execute_and_deliver(cx, &plan, messages, delivery).await
}
