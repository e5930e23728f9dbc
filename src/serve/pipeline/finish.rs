//! A run's row written at its end: the one write every ending goes through, under the
//! claim this process holds the run by (a run another process holds now is not written
//! here), and the run's metrics.

use std::time::Duration;

use crate::db::{EndReason, Finish, Holder, Run, RunResult, RunStatus};

use super::Services;

/// Records a run that ended without a model call: its row and its metrics. Whether
/// the end is this process's to say (`false`: the run had ended, or another process
/// holds it now; nothing was written and nothing should be posted).
pub(in crate::serve) async fn finish_quietly(
    svc: &Services,
    run: &Run,
    status: RunStatus,
    reason: EndReason,
    result: &RunResult,
) -> bool {
    let fin = Finish::without_calls(status, reason.clone(), result);
    match svc.db.finish(&run.id, &holder(svc, run), &fin).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!("the run's end was not recorded here: it ended already, or another process holds it now");
            return false;
        }
        Err(e) => tracing::error!("recording the end of the run failed: {e}"),
    }
    svc.metrics
        .run_finished(run.kind().as_str(), reason.as_str(), 0.0, Duration::ZERO);
    true
}

/// Who ends `run` here: the claim that `run` (as this process read it) shows this
/// process running it under, else this process as a run waits.
pub(super) fn holder(svc: &Services, run: &Run) -> Holder {
    Holder::of(run, &svc.worker_id)
}
