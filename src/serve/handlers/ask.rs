//! `/kodx ask`: the agent reads the repository in its container and its last message is
//! the answer. Nothing leaves the container.

use std::sync::Arc;

use crate::comment::Done;
use crate::db::RunStatus;
use crate::sandbox::Sandbox as _;
use crate::serve::handlers::execute::Execution;
use crate::serve::worker::{Ending, RunFailure, Workers};

impl Workers {
    /// Executes an ask run; the status comment shows its answer.
    pub(in crate::serve) async fn ask(
        self: &Arc<Self>,
        exec: Execution<'_>,
    ) -> Result<Ending, RunFailure> {
        let (kind, log) = (exec.plan.kind, exec.log);
        let (workspace, sandbox, outcome) = match self.execute(exec).await?.ran() {
            Ok(ran) => ran,
            Err(ending) => return Ok(ending),
        };
        if let Err(e) = sandbox.destroy().await {
            tracing::warn!("removing the container failed: {e}");
        }
        // The clone (and what the agent changed in the container's copy) go.
        drop(workspace);
        let mut done = Done::new(kind, outcome);
        done.text = done.outcome.last_message.clone();
        done.setup = *log.setup.lock().expect("lock");
        let status = if done.succeeded() {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        };
        Ok(Ending::Work { status, done })
    }
}
