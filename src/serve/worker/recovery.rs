//! Starting after another process: runs it left `running` go back to the queue (or fail),
//! its containers and clones go, and old transcripts are pruned.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::agent::StopReason;
use crate::db::{EndReason, RecoveryAction};
use crate::serve::texts;

use super::{run_span, Workers};
use crate::serve::pipeline::{ending, status, workspace};

impl Workers {
    /// Runs left `running` by a dead process go back to the queue (once), and what it left
    /// behind goes: its containers and its clones. Old transcripts are pruned.
    ///
    /// On a queue several processes share (PostgreSQL), the installation's containers and
    /// clones may be another live process's: only containers whose owner process is dead
    /// on this host are removed, and only runs whose lease expired are queued again
    /// ([`crate::db::Db::recover`]; the workers repeat that every third of a lease).
    pub async fn recover(self: &Arc<Self>) {
        let shared = self.svc.db.is_shared();
        let prefix = self.svc.clone_prefix();
        let runs = workspace::repo_cache(&self.svc)
            .map(|c| c.root().join(crate::serve::pipeline::workspace::RUNS_DIR));
        let stale = if shared {
            Ok(0)
        } else {
            tokio::task::spawn_blocking(move || {
                let tmp = std::env::temp_dir();
                remove_stale_clones(&tmp, &prefix)
                    + runs.map_or(0, |dir| remove_stale_clones(&dir, &prefix))
                    + remove_old_scratch(&tmp, SCRATCH_PREFIX, SCRATCH_MAX_AGE)
            })
            .await
        };
        match stale {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "removed {n} clone or scratch director(ies) an earlier kodx process left"
            ),
            Err(e) => tracing::warn!("could not remove old clones: {e}"),
        }
        for (name, engine) in self.svc.engine.answering().await {
            // Every container of this installation is an orphan now: no run has started
            // yet. Its earlier process may have had the same pid (PID 1 in a container).
            // Not on a shared queue: there they may be another process's.
            let orphans = if shared {
                Ok(0)
            } else {
                engine.sweep_instance_orphans().await
            };
            match orphans {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    engine = %name,
                    "removed {n} container(s) an earlier kodx process of this installation left"
                ),
                Err(e) => tracing::warn!(engine = %name, "could not sweep old containers: {e}"),
            }
            match engine.sweep_dead_owners().await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(engine = %name, "removed {n} container(s) left by a dead kodx process")
                }
                Err(e) => tracing::warn!(engine = %name, "could not sweep old containers: {e}"),
            }
            match engine.remove_old_derived().await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(engine = %name, "removed {n} sandbox image(s) of other kodx builds")
                }
                Err(e) => {
                    tracing::warn!(engine = %name, "could not remove old sandbox images: {e}")
                }
            }
        }
        self.prune_transcripts().await;
        self.requeue_orphans().await;
    }

    /// Queues again (or fails, past `max_attempts`) the runs whose process is gone, and
    /// says so in their status comments.
    pub(super) async fn requeue_orphans(self: &Arc<Self>) {
        let recovered = match self
            .svc
            .db
            .recover(
                &self.svc.worker_id,
                i64::from(self.svc.settings.max_attempts),
            )
            .await
        {
            Ok(r) => {
                // What the tests of leases wait on (a pass per third of a lease).
                tracing::debug!(worker = %self.svc.worker_id, taken = r.len(), "looked for runs whose lease ran out");
                r
            }
            Err(e) => {
                tracing::error!("recovering runs failed: {e}");
                return;
            }
        };
        for r in recovered {
            let run = r.run;
            let span = run_span(&run);
            let this = self.clone();
            async move {
                match r.action {
                    RecoveryAction::Requeued => {
                        tracing::warn!("run was interrupted by a restart; queued again");
                        status::edit_status(&this.svc, &run, texts::QUEUED_AGAIN, None).await;
                    }
                    RecoveryAction::Failed => {
                        tracing::error!("run was interrupted by restarts too often; failed");
                        let done = ending::failed_done(
                            &run,
                            StopReason::Error,
                            texts::RESTARTED_TOO_OFTEN.into(),
                        );
                        status::post_done(&this.svc, &run, &done).await;
                        this.svc.metrics.run_finished(
                            run.kind().as_str(),
                            EndReason::InternalError.as_str(),
                            0.0,
                            Duration::ZERO,
                        );
                    }
                }
            }
            .instrument(span)
            .await;
        }
    }

    /// Deletes the transcripts of runs finished more than `transcript_days` ago.
    pub(super) async fn prune_transcripts(&self) {
        let age = i64::from(self.svc.settings.transcript_days) * 86_400_000;
        match self
            .svc
            .db
            .prune_transcripts(crate::db::now_ms() - age)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "deleted {n} transcript record(s) of runs finished over {} days ago",
                self.svc.settings.transcript_days
            ),
            Err(e) => tracing::warn!("pruning old transcripts failed: {e}"),
        }
    }
}

/// Removes the directories in `dir` whose name starts with `prefix` (the clones an earlier
/// process of this installation left there); returns how many. Symbolic links are removed,
/// never followed.
/// The scratch directories the change export makes for `.gitignore` rules
/// (`kodx-ignore-…` in the temporary directory): named, so a crash leaves them behind.
/// (Spooled change files have no name and go with the process.)
const SCRATCH_PREFIX: &str = "kodx-ignore-";

/// Scratch directories older than this are a dead process's: no run, `kodx serve`'s or
/// `kodx run`'s, keeps one that long.
const SCRATCH_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Removes the entries of `dir` named `prefix…` last changed more than `max_age` ago.
fn remove_old_scratch(dir: &std::path::Path, prefix: &str, max_age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let old = |e: &std::fs::DirEntry| {
        e.metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > max_age)
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !name.to_string_lossy().starts_with(prefix) || !old(&entry) {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(
                "could not remove the old scratch directory {}: {e}",
                entry.path().display()
            ),
        }
    }
    removed
}

fn remove_stale_clones(dir: &std::path::Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!("could not remove the old clone {}: {e}", path.display()),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_old_scratch_directories_go() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("kodx-ignore-old");
        let new = dir.path().join("kodx-ignore-new");
        let other = dir.path().join("someone-else");
        for d in [&old, &new, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join(".gitignore"), "x\n").unwrap();
        }
        let two_days_ago = std::time::SystemTime::now() - Duration::from_secs(48 * 3600);
        for d in [&old, &other] {
            std::fs::File::open(d)
                .unwrap()
                .set_modified(two_days_ago)
                .unwrap();
        }
        assert_eq!(
            remove_old_scratch(dir.path(), SCRATCH_PREFIX, SCRATCH_MAX_AGE),
            1
        );
        assert!(!old.exists());
        assert!(new.exists(), "a live run's scratch stays");
        assert!(other.exists(), "only kodx's own");
    }
}
