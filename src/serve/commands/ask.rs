//! `/kodx ask`: the agent reads the repository in its container and its last message is
//! the answer. Nothing leaves the container.

use crate::db::RunStatus;
use crate::sandbox::Sandbox as _;
use crate::serve::pipeline::execute::execute;
use crate::serve::pipeline::{Ending, RunCtx, RunFailure};
use crate::serve::texts::status::Done;

/// Runs an ask: planned, executed; the status comment shows its answer.
pub(in crate::serve) async fn run(cx: &RunCtx<'_>) -> Result<Ending, RunFailure> {
    let plan = cx.plan().await?;
    let messages = vec![plan.first_message()];
    let (workspace, sandbox, outcome, _) = match execute(cx, &plan, messages).await?.ran() {
        Ok(ran) => ran,
        Err(ending) => return Ok(ending),
    };
    if let Err(e) = sandbox.destroy().await {
        tracing::warn!("removing the container failed: {e}");
    }
    // The clone (and what the agent changed in the container's copy) go.
    drop(workspace);
    let mut done = Done::new(plan.kind, outcome);
    done.text = done.outcome.last_message.clone();
    done.setup = *cx.log.setup.lock();
    let status = if done.succeeded() {
        RunStatus::Succeeded
    } else {
        RunStatus::Failed
    };
    Ok(Ending::Work { status, done })
}
