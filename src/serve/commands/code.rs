//! `/kodx code`: the agent changes the repository in its container; the exact change set
//! comes out and is delivered as a pull request (or a commit on the pull request's branch),
//! through the pipeline's execute-and-deliver stage ([`crate::serve::pipeline::work`]).

use crate::serve::pipeline::work::{execute_and_deliver, Delivery};
use crate::serve::pipeline::{Ending, RunCtx, RunFailure};

/// Runs `/kodx code`: planned, executed, delivered with the request as asked.
pub(in crate::serve) async fn run(cx: &RunCtx<'_>) -> Result<Ending, RunFailure> {
    let plan = cx.plan().await?;
    let messages = vec![plan.first_message()];
    let request = cx.run.request.job.argument().into_owned();
    execute_and_deliver(cx, &plan, messages, Delivery::of(request)).await
}
