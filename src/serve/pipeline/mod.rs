//! The stages a run goes through, and what they share. Nothing here reaches back into the
//! [worker](crate::serve::worker) or the [commands](crate::serve::commands): the worker
//! builds a run's [`RunCtx`] once and the command's handler walks these stages with it.
//! What a stage does for the services is a free function of its file (`ending::conclude`,
//! `gate::admit`, `status::post_done`…), taking the [`Services`] as its first argument.
//!
//! - [`gate`]: admission — who asked, the repository's config, the monthly budget — and
//!   the typed [`gate::Refusal`];
//! - [`context`]: what GitHub says about the issue, as the model is told it;
//! - [`repo_context`]: what the repository says about itself (instructions, nested
//!   `AGENTS.md`, the pull request template), read from the branch the work targets;
//! - [`plan`]: what the run will do, decided before it does anything (pure);
//! - [`workspace`]: the run's clone on the host;
//! - [`execute`]: the container and the agent working in it;
//! - [`deliver`]: a code run's change committed, pushed and opened as a pull request;
//! - [`checks`]: its checks as a `kodx` Check Run on the pushed commit;
//! - [`work`]: execute and deliver, the stage every code-like command ends in (each
//!   command fills a [`work::Delivery`]);
//! - [`status`]: the run's status comment;
//! - [`ending`]: how the run ended, written down once ([`ending::conclude`]), its row
//!   through [`finish`];
//! - [`engines`], [`lease`], [`resources`]: the Docker engines, the run's hold on its
//!   lease, and the model clients.

pub(in crate::serve) mod checks;
pub(in crate::serve) mod context;
pub(in crate::serve) mod deliver;
mod egress;
pub(in crate::serve) mod ending;
pub(in crate::serve) mod engines;
pub(in crate::serve) mod execute;
pub(in crate::serve) mod finish;
pub(in crate::serve) mod gate;
pub(in crate::serve) mod images;
pub(in crate::serve) mod lease;
pub(in crate::serve) mod mergeable;
pub(in crate::serve) mod plan;
pub(in crate::serve) mod repair;
pub(in crate::serve) mod repo_context;
pub(in crate::serve) mod rerun;
pub(in crate::serve) mod resources;
pub(in crate::serve) mod secrets;
pub(in crate::serve) mod status;
pub(in crate::serve) mod steering;
pub(in crate::serve) mod threads;
pub(in crate::serve) mod warm;
pub(in crate::serve) mod work;
pub(in crate::serve) mod workspace;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cost::Pricing;
use crate::db::{Db, Run};
use crate::github::{GitHubApp, GitHubError, Installation, RepoName, TokenScope};
use crate::job::{RunKind, TriggerKind};
use crate::serve::config::Settings;
use crate::serve::metrics::Metrics;

pub(in crate::serve) use ending::{Ending, RunFailure, RunLog, Timings};
pub use engines::{Engines, Placement, WarmSettings};
pub(in crate::serve) use gate::Admission;
pub(in crate::serve) use lease::Lease;
pub use resources::ProviderFactory;
pub(in crate::serve) use status::StatusComment;

/// What every run of this process uses: the database, GitHub, the engines, the settings,
/// the model clients, and the runs running here. Made once by the worker.
pub struct Services {
    pub db: Db,
    pub app: GitHubApp,
    pub engine: Arc<Engines>,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub providers: Arc<dyn ProviderFactory>,
    pub pricing: Pricing,
    /// Identifies this process's claims.
    pub worker_id: String,
    /// `KODX_PUBLIC_URL` and the run pages' key, when status comments link to run pages.
    pub(in crate::serve) run_links: std::sync::OnceLock<(String, crate::serve::runpage::RunKey)>,
    /// GitHub's web origin (`GITHUB_URL`), when it is not the one beside the API's.
    pub(in crate::serve) github_web: std::sync::OnceLock<String>,
    /// The runs running in this process, by id.
    pub(in crate::serve) running: Mutex<HashMap<String, RunHandle>>,
    /// The acknowledgement of each run being acknowledged, or acknowledged and waiting for
    /// a slot: made once, by whichever task comes first, and taken by the run when it starts
    /// (or dropped when it is cancelled first).
    pub(in crate::serve) acks: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Acked>>>>,
    /// Counts the steers this process heard of (its own `/kodx steer` answers, and
    /// PostgreSQL's `steer` notifications): a run looks for its steers when it moved.
    pub(in crate::serve) steer_wakes: std::sync::atomic::AtomicU64,
    /// kodx's egress proxies, one per engine, started when a run first needs one.
    pub(in crate::serve) egress: crate::egress::Proxies,
}

/// What acknowledging a run came to.
#[derive(Clone)]
pub(in crate::serve) enum Acked {
    /// Admitted; `eyes` and the status comment (with its id, unless creating it failed)
    /// are up.
    Admitted(Box<(Admission, StatusComment)>),
    /// Refused, and finished.
    Refused,
    /// GitHub could not be asked; nothing was posted.
    Unreachable,
    /// Another process acknowledges it (a shared queue).
    Elsewhere,
    /// Another process acknowledged it: its status comment (the admission is read here).
    Posted(u64),
    /// Admitted, but it waits for a writer's `/kodx go` (its status comment says so): back
    /// in the queue, held, until then.
    Held,
}

/// A run running in this process.
pub(in crate::serve) struct RunHandle {
    pub(in crate::serve) cancel: CancellationToken,
    /// Who cancelled it with `/kodx cancel` (none: shutdown).
    pub(in crate::serve) cancelled_by: Arc<Mutex<Option<String>>>,
    /// Its hold on the run's lease (a shared queue).
    pub(in crate::serve) lease: Lease,
}

impl Services {
    /// The run's repository and a token for it ([`Services::installation`]), for the paths
    /// that hold no run context: control jobs, refusals, restarts, the end of a run.
    pub(in crate::serve) async fn github(
        &self,
        run: &Run,
    ) -> anyhow::Result<(Installation, RepoName)> {
        use anyhow::Context as _;
        let repo = repo_of(run)?;
        let gh = self
            .installation(run, &repo)
            .await
            .context("GitHub did not give kodx an installation token")?;
        Ok((gh, repo))
    }

    /// A token for this run's repository only, with the permissions its kind uses: a code
    /// run (and a `/kodx continue`, which goes on with one) may push and open pull
    /// requests; an ask, help or cancel reads and comments.
    pub(in crate::serve) async fn installation(
        &self,
        run: &Run,
        repo: &RepoName,
    ) -> Result<Installation, GitHubError> {
        let scope = if run.kind().run_kind() == Some(RunKind::Code) {
            TokenScope::write(repo)
        } else {
            let review = run.request.trigger.kind() == TriggerKind::ReviewComment;
            TokenScope::read(repo, review)
        };
        self.app
            .installation_for(run.request.installation_id as u64, &scope)
            .await
    }

    /// GitHub's web origin: `GITHUB_URL`, else the one beside the API's.
    pub(in crate::serve) fn github_web(&self) -> String {
        match self.github_web.get() {
            Some(web) => web.clone(),
            None => crate::serve::config::web_url_for(self.app.api_url()),
        }
    }

    /// The address of run `run_id`'s page, when the pages are linked.
    pub(in crate::serve) fn run_link(&self, run_id: &str) -> Option<String> {
        let (public_url, key) = self.run_links.get()?;
        Some(key.link(public_url, run_id))
    }

    /// Drops what acknowledging the run left for it (it started, or it is over).
    pub(in crate::serve) fn forget_ack(&self, run_id: &str) {
        self.acks.lock().remove(run_id);
    }

    /// The prefix of this installation's clone directories (found again by `recover`).
    pub(in crate::serve) fn clone_prefix(&self) -> String {
        format!("kodx-run-{}-", self.engine.instance().unwrap_or("local"))
    }
}

/// One run, as its handler sees it: built once by the worker when the run starts and
/// passed by reference to the command's handler and every stage after it.
pub(in crate::serve) struct RunCtx<'a> {
    pub svc: &'a Services,
    pub run: &'a Run,
    /// The repository, parsed once.
    pub repo: RepoName,
    /// What the run does (`continue` goes on with a code run).
    pub kind: RunKind,
    /// A token for the work, whose writes ask `lease` first (a fresh one is taken before a
    /// push: [`RunCtx::installation`]).
    pub gh: Installation,
    pub admission: Admission,
    pub status: StatusComment,
    pub cancel: &'a CancellationToken,
    /// The run's hold on its lease, checked before each model call, command, push and
    /// GitHub write (by the run's GitHub clients themselves: [`Lease::guard`]).
    pub lease: &'a Lease,
    pub log: &'a RunLog,
    /// When the run's preparation began (the `prepare` phase of its timings).
    pub started: std::time::Instant,
}

impl RunCtx<'_> {
    /// A fresh token for the run's repository ([`Services::installation`]), whose writes
    /// ask the run's lease first. A stage that needs a token takes it here, never from the
    /// App or the services directly, so no write of the run skips its lease.
    pub async fn installation(&self) -> Result<Installation, GitHubError> {
        let gh = self.svc.installation(self.run, &self.repo).await?;
        Ok(self.lease.guard(&gh))
    }

    /// A token of the run's installation for `scope`, whose writes ask the run's lease
    /// first ([`RunCtx::installation`]).
    pub async fn installation_for(&self, scope: &TokenScope) -> Result<Installation, GitHubError> {
        let id = self.run.request.installation_id as u64;
        let gh = self.svc.app.installation_for(id, scope).await?;
        Ok(self.lease.guard(&gh))
    }
}

/// The run's repository, typed.
pub(in crate::serve) fn repo_of(run: &Run) -> anyhow::Result<RepoName> {
    use anyhow::Context as _;
    RepoName::parse(&run.request.repo)
        .with_context(|| format!("the repository name {:?} is not valid", run.request.repo))
}

/// The kind of work a run does; a control job's status comment reads as an `ask`'s.
pub(in crate::serve) fn run_kind(run: &Run) -> RunKind {
    run.kind().run_kind().unwrap_or(RunKind::Ask)
}

#[cfg(test)]
mod tests {
    /// The stages of a run take their GitHub clients from the run's context (`cx.gh`,
    /// [`super::RunCtx::installation`]), whose writes ask the run's lease first; none takes
    /// a token from the services or the App directly, which would write unfenced. (The
    /// paths outside a run's lease — control jobs, refusals, a run's end once written —
    /// live in `commands/mod.rs`, `commands/cancel.rs`, `commands/update.rs` (a control
    /// job), `gate.rs`, `repair.rs` (with
    /// `rerun.rs`, part of a repair's admission) and `status.rs`, and are not scanned.)
    #[test]
    fn run_stages_take_github_clients_only_through_their_fence() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/serve");
        let outside = [
            "commands/mod.rs",
            "commands/cancel.rs",
            "commands/update.rs",
            "pipeline/mod.rs",
            "pipeline/gate.rs",
            "pipeline/repair.rs",
            "pipeline/rerun.rs",
            "pipeline/status.rs",
        ];
        let unfenced = [
            "svc.installation(",
            "svc.github(",
            "svc.app.installation_for(",
            "svc.app.installation(",
        ];
        let mut dirs = vec![root.join("commands"), root.join("pipeline")];
        let mut scanned = 0;
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                if !name.ends_with(".rs") || outside.contains(&name.as_str()) {
                    continue;
                }
                scanned += 1;
                let text = std::fs::read_to_string(&path).unwrap();
                let code: String = text.split_whitespace().collect();
                for call in unfenced {
                    assert!(
                        !code.contains(call),
                        "src/serve/{name} calls `{call}`: take the token with `cx.installation()`, whose writes ask the run's lease"
                    );
                }
            }
        }
        assert!(scanned > 10, "{scanned}");
    }
}
