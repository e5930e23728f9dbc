//! Where the checks run (SPEC §12): never in the agent's own sandbox, where the agent is
//! root and could shadow `grep`, edit `~/.bashrc`, leave a process behind or plant files
//! the change set does not hold. Each attempt's checks run in a fresh sandbox made as the
//! run's was (same image, setup — the setup cache serves it — limits and network policy),
//! holding the run's starting commit with exactly the change set kodx will commit applied.
//!
//! [`Verifier`] is the seam the agent loop talks to; [`FreshSandboxes`] is the real one:
//! it makes the next checks' sandbox in the background (while the agent works, or while it
//! repairs), so that an attempt waits only for the change set to be written into it.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use async_trait::async_trait;

use super::guard::Guard;
use super::{run_checks, Annotation, CheckResult, CheckSpec};
use crate::sandbox::{ChangeSet, DockerSandbox, Engine, Result, Sandbox, SandboxSpec};

/// A sandbox ready for one attempt's checks, and what the guard and the annotations need
/// to know of the tree in it.
pub struct Checkout {
    pub sandbox: Box<dyn Sandbox>,
    /// Files of the starting commit the change set modifies or deletes, sorted.
    pub edited: Vec<String>,
    /// Every file of the tree the checks see (the starting commit's, less the deleted,
    /// with the added), for annotations; empty when not known.
    pub files: HashSet<String>,
}

/// Where the checks of a run are run.
#[async_trait]
pub trait Verifier: Send + Sync {
    /// A sandbox apart from `work` (the agent's) holding the run's starting commit with
    /// `work`'s change set applied, for one attempt's checks. Destroy it after them.
    async fn checkout(&self, work: &dyn Sandbox) -> Result<Checkout>;

    /// Another attempt will follow (a repair pass): its sandbox can be made meanwhile.
    fn another(&self) {}

    /// The agent changed its workspace after the last checkout (its tools ran again).
    fn work_changed(&self) {}
}

/// The real verifier: a fresh sandbox on the run's engine for each attempt.
pub struct FreshSandboxes {
    engine: Engine,
    /// The run's sandbox spec: image, repository, setup, limits, network.
    spec: SandboxSpec,
    /// The next checks' sandbox, being made.
    next: Mutex<Option<tokio::task::JoinHandle<Result<DockerSandbox>>>>,
    made: AtomicU32,
    /// The change set of the last checkout, while the agent has not acted since: what
    /// the checks judged is what is delivered.
    verified: Mutex<Option<ChangeSet>>,
    /// What each checkout added before the checks could start: the change set read, the
    /// sandbox waited for, the change written into it.
    overheads: Mutex<Vec<std::time::Duration>>,
    /// Told when the checks want their sandbox now: a start waiting to be made goes.
    hurry: std::sync::Arc<tokio::sync::Notify>,
}

/// How long after the run's own sandbox is ready the first checks' sandbox is begun: not
/// while the run's first steps want the engine and the CPUs (as the warm pool's refill).
const FIRST_AFTER: std::time::Duration = std::time::Duration::from_millis(1500);

impl FreshSandboxes {
    /// Verifies on `engine` with sandboxes made as `spec` (the run's, with its repository)
    /// says; starts making the first at once.
    pub fn new(engine: Engine, spec: &SandboxSpec) -> FreshSandboxes {
        let mut spec = spec.clone();
        // Nothing is taken out of a checks' sandbox: no snapshot ahead.
        spec.change_set_ahead = false;
        spec.checks_of = Some(spec.run_id.clone());
        // The check runner, started before anything of the repository runs there.
        spec.checks_ahead = true;
        let verifier = FreshSandboxes {
            engine,
            spec,
            next: Mutex::new(None),
            made: AtomicU32::new(0),
            verified: Mutex::new(None),
            overheads: Mutex::new(Vec::new()),
            hurry: Default::default(),
        };
        verifier.prepare(FIRST_AFTER);
        verifier
    }

    /// The change set the last checks ran on, when the agent did nothing after them:
    /// deliver that one, not one read again (a process the agent left running could have
    /// changed the workspace since).
    pub fn take_verified(&self) -> Option<ChangeSet> {
        self.verified.lock().take()
    }

    /// What each checkout so far added before its checks could start.
    pub fn overheads(&self) -> Vec<std::time::Duration> {
        self.overheads.lock().clone()
    }

    /// Removes the checks' sandbox made ahead, if any. One still being made is stopped,
    /// and whatever container its start left is removed by its label, now and once more a
    /// moment later (a creation the engine was already doing when it was stopped).
    pub async fn close(self) {
        let Some(task) = self.next.lock().take() else {
            return;
        };
        let finished = task.is_finished();
        task.abort();
        if let Ok(Ok(sandbox)) = task.await {
            let _ = sandbox.destroy().await;
        }
        if finished {
            return;
        }
        let (engine, run) = (self.engine.clone(), self.spec.run_id.clone());
        let sweep = move || {
            let (engine, run) = (engine.clone(), run.clone());
            async move {
                if let Err(e) = engine.remove_checks_of(&run).await {
                    tracing::warn!("removing the checks' sandboxes of {run} failed: {e}");
                }
            }
        };
        sweep().await;
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            sweep().await;
        });
    }

    /// Starts making the next checks' sandbox in the background, unless one is on its way.
    fn prepare(&self, after: std::time::Duration) {
        let mut next = self.next.lock();
        if next.is_some() {
            return;
        }
        let n = self.made.fetch_add(1, Ordering::Relaxed) + 1;
        let mut spec = self.spec.clone();
        spec.run_id = verifier_id(&self.spec.run_id, n);
        let engine = self.engine.clone();
        let hurry = self.hurry.clone();
        *next = Some(tokio::spawn(async move {
            // Not while the run's first steps want the engine and the CPUs, unless the
            // checks want it now.
            tokio::select! {
                () = tokio::time::sleep(after) => {}
                () = hurry.notified() => {}
            }
            let started = Instant::now();
            let made = engine.start(&spec).await;
            tracing::info!(
                took_ms = started.elapsed().as_millis() as u64,
                ok = made.is_ok(),
                "made the checks' sandbox"
            );
            made
        }));
    }

    /// The sandbox made ahead, or a new one now.
    async fn sandbox(&self) -> Result<DockerSandbox> {
        self.prepare(std::time::Duration::ZERO);
        self.hurry.notify_one();
        let task = self.next.lock().take().expect("prepared above");
        task.await.map_err(|e| {
            crate::sandbox::SandboxError::InvalidInput(format!(
                "making the checks' sandbox failed: {e}"
            ))
        })?
    }
}

impl Drop for FreshSandboxes {
    fn drop(&mut self) {
        // A sandbox still being made is stopped; one made is removed with its handle.
        if let Some(task) = self.next.lock().take() {
            task.abort();
        }
    }
}

#[async_trait]
impl Verifier for FreshSandboxes {
    async fn checkout(&self, work: &dyn Sandbox) -> Result<Checkout> {
        *self.verified.lock() = None;
        let begun = Instant::now();
        let (changes, sandbox) = tokio::join!(work.change_set(), self.sandbox());
        let (changes, sandbox) = (changes?, sandbox?);
        let started = Instant::now();
        let waited = started - begun;
        if let Err(e) = sandbox.apply_changes(&changes).await {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        tracing::info!(
            change_set_and_sandbox_ms = waited.as_millis() as u64,
            write_ms = started.elapsed().as_millis() as u64,
            changes = %changes.summary(),
            "wrote the change set into the checks' sandbox"
        );
        self.overheads.lock().push(begun.elapsed());
        let files = sandbox.files_with(&changes);
        let edited = super::guard::edited_paths(&changes);
        *self.verified.lock() = Some(changes);
        Ok(Checkout {
            sandbox: Box::new(sandbox),
            edited,
            files,
        })
    }

    fn another(&self) {
        self.prepare(std::time::Duration::ZERO);
    }

    fn work_changed(&self) {
        *self.verified.lock() = None;
    }
}

/// Runs `checks` as attempt `attempt` on the change set of `work` (the agent's sandbox) in
/// a sandbox of `verifier`'s, never in `work` itself; each result goes to `each` as it
/// comes. The results name the edited files each check depends on (`guard`) and carry
/// only annotations on files of the tree the checks saw. Without a verifier, or when its
/// sandbox cannot be made in time, every check is reported not run: red.
pub async fn run_apart(
    verifier: Option<&dyn Verifier>,
    work: &dyn Sandbox,
    checks: &[CheckSpec],
    guard: &Guard,
    attempt: u32,
    deadline: Instant,
    mut each: impl FnMut(&CheckResult),
) -> Vec<CheckResult> {
    let Some(verifier) = verifier else {
        let why = "[not run: kodx has no sandbox apart from the agent's to run the checks in]";
        return not_run(checks, attempt, why, &mut each);
    };
    let checkout = match tokio::time::timeout_at(deadline.into(), verifier.checkout(work)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::warn!("the checks' sandbox could not be made: {e}");
            let why = format!("[not run: kodx could not make the sandbox the checks run in: {e}]");
            return not_run(checks, attempt, &why, &mut each);
        }
        Err(_) => {
            let why = "[not run: the run's time limit was reached]";
            return not_run(checks, attempt, why, &mut each);
        }
    };
    let mut results = run_checks(&*checkout.sandbox, checks, attempt, deadline, each).await;
    if let Err(e) = checkout.sandbox.destroy().await {
        tracing::warn!("removing the checks' sandbox failed: {e}");
    }
    for (r, spec) in results.iter_mut().zip(checks) {
        r.edited = guard.edited_for(spec, &checkout.edited);
        in_tree(&mut r.annotations, &checkout.files);
    }
    results
}

/// Every check of `checks`, not run for `why`.
fn not_run(
    checks: &[CheckSpec],
    attempt: u32,
    why: &str,
    each: &mut impl FnMut(&CheckResult),
) -> Vec<CheckResult> {
    checks
        .iter()
        .map(|spec| {
            let r = CheckResult::red(spec, attempt, why.to_string());
            each(&r);
            r
        })
        .collect()
}

/// Keeps the annotations on files of `files` (when it is known): a path printed relative
/// to a subdirectory (Go's `foo_test.go:12`) becomes the one file of the tree it ends.
fn in_tree(annotations: &mut Vec<Annotation>, files: &HashSet<String>) {
    if files.is_empty() {
        return;
    }
    annotations.retain_mut(|a| {
        if files.contains(&a.path) {
            return true;
        }
        let tail = format!("/{}", a.path);
        let mut found = files.iter().filter(|f| f.ends_with(&tail));
        match (found.next(), found.next()) {
            (Some(only), None) => {
                a.path = only.clone();
                true
            }
            _ => false,
        }
    });
}

/// The run id of a run's `n`th checks' sandbox (its container's name and label).
fn verifier_id(run_id: &str, n: u32) -> String {
    let suffix = format!("-checks{n}");
    let keep = 64usize.saturating_sub(suffix.len()).min(run_id.len());
    format!("{}{suffix}", &run_id[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_stay_on_files_of_the_tree() {
        let files: HashSet<String> = ["src/main.rs", "pkg/a/foo_test.go", "x/util.go", "y/util.go"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let a = |path: &str| Annotation {
            path: path.into(),
            start_line: 1,
            end_line: 1,
            start_column: None,
            end_column: None,
            level: super::super::Level::Failure,
            message: "m".into(),
            title: None,
        };
        let mut list = vec![
            a("src/main.rs"),
            a("foo_test.go"),
            a("util.go"),
            a("gone.rs"),
        ];
        in_tree(&mut list, &files);
        let paths: Vec<&str> = list.iter().map(|a| a.path.as_str()).collect();
        assert_eq!(paths, ["src/main.rs", "pkg/a/foo_test.go"]);
        let mut kept = vec![a("anything.rs")];
        in_tree(&mut kept, &HashSet::new());
        assert_eq!(kept.len(), 1);
    }

    #[test]
    fn checks_sandboxes_are_named_after_their_run_within_the_limit() {
        assert_eq!(verifier_id("kodx-0123", 2), "kodx-0123-checks2");
        let long = "r".repeat(64);
        let id = verifier_id(&long, 11);
        assert_eq!(id.len(), 64);
        assert!(id.ends_with("-checks11"));
    }
}
