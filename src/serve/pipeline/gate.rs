//! Admission: whether a run may start — who asked and their permission, the repository's
//! `.github/kodx.yml`, and the installation's monthly budget — checked once, before kodx
//! posts anything. The outcome is an [`Admission`] that travels into the run's handler, or a
//! typed [`Refusal`]: one short comment and a finished run.

use crate::db::{AdmissionRecord, RunResult};

use crate::db::{Run, RunStatus};
use crate::github::{Installation, Permission, Reaction, RepoName};
use crate::job::{Job, JobKind};
use crate::repo_config::{AskPermission, RepoConfig, RepoConfigError, RunKind, ServerMaxima};
use crate::serve::texts;

use super::{finish, mergeable, repair, status, Services};
use crate::db::EndReason;

/// Runs are capped at what is left of the monthly budget, so spend approaches it without
/// reaching it: with less than this left, the budget counts as spent.
pub(in crate::serve) const MIN_RUN_BUDGET_USD: f64 = 0.01;

/// The installation's monthly budget and what it has spent of it this month.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::serve) struct Budget {
    pub budget: f64,
    pub spent: f64,
}

impl Budget {
    pub fn left(&self) -> f64 {
        self.budget - self.spent
    }

    pub fn is_spent(&self) -> bool {
        self.left() < MIN_RUN_BUDGET_USD
    }
}

/// The branch a run's work targets, whose tip its rules come from (SPEC §11): the
/// repository's config, its instructions and its pull request template. On an issue, the
/// default branch or `--base`; on a pull request, its base branch, never its head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::serve) struct Base {
    pub branch: String,
    /// Its tip when the run was admitted; `None` when GitHub has no such branch (an empty
    /// repository's default branch).
    pub commit: Option<String>,
}

impl Base {
    /// The ref the rules are read at: the commit when known, else the branch.
    pub fn rules_ref(&self) -> &str {
        self.commit.as_deref().unwrap_or(&self.branch)
    }

    /// `main`, at no known commit (for tests).
    #[cfg(test)]
    pub fn main() -> Base {
        Base {
            branch: "main".into(),
            commit: None,
        }
    }
}

/// A run that may start, with what was read to decide it.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::serve) struct Admission {
    /// Where its rules were read.
    pub base: Base,
    pub config: RepoConfig,
    /// Who asked's permission; `None` when an earlier kodx process checked it (a run
    /// acknowledged before a restart).
    pub permission: Option<Permission>,
    /// The monthly budget, when the server has one.
    pub budget: Option<Budget>,
    /// The cap a writer's `/kodx go $N` asked for (USD): the run's cap is at most this.
    pub cap_asked: Option<f64>,
    /// GitHub's `mergeable_state` of the pull request, as a merge run's admission read it.
    pub mergeable_state: Option<String>,
}

impl Admission {
    pub fn new(
        base: Base,
        config: RepoConfig,
        permission: Option<Permission>,
        budget: Option<Budget>,
    ) -> Admission {
        Admission {
            base,
            config,
            permission,
            budget,
            cap_asked: None,
            mergeable_state: None,
        }
    }

    /// The admission with its cap at most `cap` (`/kodx go $N`), when given.
    pub fn capped(self, cap: Option<f64>) -> Admission {
        Admission {
            cap_asked: cap,
            ..self
        }
    }

    /// The cost limit of a run of `kind`: the repository's, under the server's maximum and
    /// never past what is left of the budget.
    pub fn cost_limit(&self, kind: RunKind, maxima: &ServerMaxima) -> f64 {
        let mut limit = self.config.cost_limit_for(kind, maxima);
        if let Some(cap) = self.cap_asked {
            limit = limit.min(cap);
        }
        match self.budget {
            Some(b) => limit.min(b.left()),
            None => limit,
        }
    }

    pub fn max_iterations(&self, maxima: &ServerMaxima) -> u32 {
        self.config.max_iterations(maxima)
    }

    /// What is stored with the run's result: the admitted limits.
    pub fn record(&self, kind: RunKind, maxima: &ServerMaxima) -> AdmissionRecord {
        AdmissionRecord {
            permission: self.permission.map(|p| p.as_str().to_string()),
            cost_limit: self.cost_limit(kind, maxima),
            max_iterations: self.max_iterations(maxima),
            budget_left: self.budget.map(|b| b.left()),
        }
    }
}

/// Why `/kodx continue` does not start: the sentence the answer gives.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(in crate::serve) enum CannotContinue {
    #[error("there is no stopped `/kodx code` run here to continue")]
    Nothing,
    #[error(
        "the last code run here (`{id}`) finished its work; there is nothing to continue. \
         Ask for more with `/kodx code`"
    )]
    Finished { id: String },
    #[error(
        "the last code run here (`{id}`) ended with `{reason}`; only a run stopped by its cost, \
         step or time limit can be continued. Run `/kodx code` again"
    )]
    NotStopped { id: String, reason: String },
    #[error(
        "the stopped run `{id}` pushed nothing (its change set was empty, or `pr.on_limit: \
         discard` threw it away), so there is no work to continue from. Run `/kodx code` again"
    )]
    NothingPushed { id: String },
    #[error(
        "the transcript of run `{id}` was deleted for its age, so its conversation cannot be \
         resumed. Run `/kodx code` again"
    )]
    Pruned { id: String },
    #[error("the transcript of run `{id}` cannot be resumed: {}", crate::neutral::words(.problem))]
    Transcript { id: String, problem: String },
    #[error(
        "run `{id}` has not ended yet here; `/kodx continue` once it has stopped (or stop it \
         with `/kodx cancel` first)"
    )]
    StillRunning { id: String },
    #[error("`/kodx continue {asked}` asks for more than this server allows per run ({most})")]
    AboveMaximum { asked: String, most: String },
}

/// Why a run may not start.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::serve) enum Refusal {
    /// GitHub did not give `.github/kodx.yml`.
    ConfigUnreadable(String),
    /// GitHub did not say what permission who asked has.
    PermissionUnknown(String),
    /// Who asked has less than the command needs.
    NotPermitted { needed: Permission, has: Permission },
    /// The installation's monthly budget is spent.
    BudgetSpent(Budget),
    /// `.github/kodx.yml` is invalid.
    InvalidConfig(RepoConfigError),
    /// The command could not be read (empty, too long): the sentence saying why.
    BadRequest(String),
    /// `/kodx continue` has nothing it can go on with, or asks for too much.
    CannotContinue(CannotContinue),
    /// `--base` names no branch of the repository (a tag, a commit, a typo).
    UnknownBase(String),
    /// An event that needs nothing after all (a label that is not the trigger, a CI
    /// failure that is not kodx's to repair): recorded, nothing posted.
    Dismissed(String),
}

impl Refusal {
    /// The stop reason stored and counted.
    pub fn end_reason(&self) -> EndReason {
        match self {
            Refusal::ConfigUnreadable(_) | Refusal::PermissionUnknown(_) => {
                EndReason::InternalError
            }
            Refusal::NotPermitted { .. } => EndReason::NotPermitted,
            Refusal::BudgetSpent(_) => EndReason::BudgetExceeded,
            Refusal::InvalidConfig(_) => EndReason::InvalidConfig,
            Refusal::BadRequest(_) | Refusal::CannotContinue(_) | Refusal::UnknownBase(_) => {
                EndReason::Refused
            }
            Refusal::Dismissed(_) => EndReason::Dismissed,
        }
    }

    /// What is stored as the run's result.
    pub fn result(&self) -> RunResult {
        let refused = RunResult {
            refused: Some(self.end_reason().as_str().to_string()),
            ..RunResult::default()
        };
        match self {
            Refusal::ConfigUnreadable(e) | Refusal::PermissionUnknown(e) => RunResult {
                error: Some(e.clone()),
                ..refused
            },
            Refusal::NotPermitted { needed, has } => RunResult {
                needed: Some(needed.as_str().to_string()),
                has: Some(has.as_str().to_string()),
                ..refused
            },
            Refusal::BudgetSpent(b) => RunResult {
                budget: Some(b.budget),
                spent: Some(b.spent),
                ..refused
            },
            Refusal::InvalidConfig(e) => RunResult {
                error: Some(e.to_string()),
                ..refused
            },
            Refusal::BadRequest(why) => RunResult {
                error: Some(why.clone()),
                ..refused
            },
            Refusal::CannotContinue(why) => RunResult {
                error: Some(why.to_string()),
                ..refused
            },
            Refusal::UnknownBase(branch) => RunResult {
                base: Some(branch.clone()),
                ..refused
            },
            Refusal::Dismissed(why) => RunResult {
                dismissed: Some(why.clone()),
                ..RunResult::default()
            },
        }
    }

    /// The comment that says so.
    pub fn message(&self, run: &Run) -> String {
        let author = &run.request.author;
        match self {
            Refusal::ConfigUnreadable(e) => texts::config_unreadable(e),
            Refusal::PermissionUnknown(e) => texts::permission_unknown(author, e),
            Refusal::NotPermitted { needed, has } => {
                texts::not_permitted(author, run.kind(), *needed, *has)
            }
            Refusal::BudgetSpent(b) => texts::budget_spent(b.budget, b.spent),
            Refusal::InvalidConfig(e) => texts::invalid_config(&e.to_string()),
            Refusal::CannotContinue(why) => texts::cannot_continue(&why.to_string()),
            Refusal::BadRequest(why) => texts::bad_request(author, why),
            Refusal::UnknownBase(branch) => texts::unknown_base(branch, &run.request.repo),
            Refusal::Dismissed(why) => why.clone(),
        }
    }
}

/// The permission a job needs: read for help, and for ask when the repository allows it;
/// write for everything else.
pub(in crate::serve) fn needed_permission(kind: JobKind, ask: AskPermission) -> Permission {
    match (kind, ask) {
        (JobKind::Ask, AskPermission::Read) | (JobKind::Help, _) => Permission::Read,
        _ => Permission::Write,
    }
}

/// Whether [`Services::check`] asks GitHub for the permission of who asked.
pub(super) enum PermissionCheck {
    Ask,
    /// Checked already (by an earlier process: `None`).
    Known(Option<Permission>),
}

/// The admission of a run about to be acknowledged: its config, who asked's
/// permission and the budget, each read once.
pub(in crate::serve) async fn admit(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
) -> Result<Admission, Refusal> {
    check(svc, gh, repo, run, PermissionCheck::Ask).await
}

/// The admission of a run acknowledged by another process (or before a restart): its
/// config and budget, read here; who asked keeps the permission checked then.
pub(in crate::serve) async fn readmit(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
    permission: Option<Permission>,
) -> Result<Admission, Refusal> {
    check(svc, gh, repo, run, PermissionCheck::Known(permission)).await
}

async fn check(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
    permission: PermissionCheck,
) -> Result<Admission, Refusal> {
    let (base, unknown_base) = base(gh, repo, run).await?;
    let config = match gh
        .file_at(repo, RepoConfig::PATH, Some(base.rules_ref()))
        .await
    {
        Ok(None) => Ok(RepoConfig::default()),
        Ok(Some(text)) => RepoConfig::parse(&text),
        Err(e) => {
            tracing::warn!("reading {} failed: {e}", RepoConfig::PATH);
            return Err(Refusal::ConfigUnreadable(e.to_string()));
        }
    };
    // A label that is not the repository's trigger is nobody's command.
    if let Some(label) = run.request.trigger.label() {
        if !config.as_ref().is_ok_and(|c| c.is_trigger_label(label)) {
            return Err(Refusal::Dismissed(format!(
                "the label {label:?} is not this repository's `triggers.label`"
            )));
        }
    }
    // kodx's own runs: dismissed quietly rather than refused with a comment.
    let is_repair = matches!(run.request.job, Job::Repair { .. } | Job::Merge { .. });
    let own = if matches!(run.request.job, Job::Merge { .. }) {
        "merge run"
    } else {
        "CI repair"
    };
    if is_repair && config.is_err() {
        return Err(Refusal::Dismissed(format!(
            "{own}: `{}` is invalid",
            RepoConfig::PATH
        )));
    }
    let permission = match permission {
        PermissionCheck::Known(p) => p,
        PermissionCheck::Ask => {
            // An invalid config refuses; until then, its default decides who may ask.
            let ask = config
                .as_ref()
                .map(|c| c.ask_permission)
                .unwrap_or_default();
            let needed = needed_permission(run.kind(), ask);
            let has = match gh.permission(repo, &run.request.author).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("permission check failed: {e}");
                    return Err(Refusal::PermissionUnknown(e.to_string()));
                }
            };
            if has < needed && is_repair {
                return Err(Refusal::Dismissed(format!(
                    "{own}: @{} no longer has write permission",
                    run.request.author
                )));
            }
            if has < needed {
                tracing::info!(permission = has.as_str(), "refused: not permitted");
                return Err(Refusal::NotPermitted { needed, has });
            }
            Some(has)
        }
    };
    if let Some(branch) = unknown_base {
        tracing::info!("refused: no base branch {branch:?}");
        return Err(Refusal::UnknownBase(branch));
    }
    if let (Job::Repair { commit }, Ok(c)) = (&run.request.job, &config) {
        repair::admit_repair(svc, gh, repo, run, c, commit)
            .await
            .map_err(Refusal::Dismissed)?;
    }
    let mut mergeable_state = None;
    if let (Job::Merge { asked, .. }, Ok(c)) = (&run.request.job, &config) {
        mergeable_state = mergeable::admit_merge(svc, gh, repo, run, c, *asked)
            .await
            .map_err(Refusal::Dismissed)?;
    }
    let budget = budget(svc, run).await;
    if let Some(b) = budget.filter(|b| run.is_work() && b.is_spent()) {
        tracing::info!("refused: monthly budget spent");
        return Err(Refusal::BudgetSpent(b));
    }
    let config = config.map_err(|e| {
        tracing::info!("refused: invalid repository config");
        Refusal::InvalidConfig(e)
    })?;
    Ok(Admission {
        mergeable_state,
        ..Admission::new(base, config, permission, budget)
    })
}

/// The branch the run's work targets and its tip (SPEC §11), and the `--base` branch
/// that does not exist, if that is what was asked (the default branch's rules then
/// decide who may ask, and the run is refused after that check).
async fn base(
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
) -> Result<(Base, Option<String>), Refusal> {
    let request = &run.request;
    let unreadable = |e: crate::github::GitHubError| {
        tracing::warn!("reading the base branch failed: {e}");
        Refusal::ConfigUnreadable(e.to_string())
    };
    if matches!(request.job, Job::AddressReviews { .. }) && !request.is_pull_request {
        return Err(Refusal::BadRequest(
            texts::ADDRESS_REVIEWS_ON_ISSUE.to_string(),
        ));
    }
    let (branch, asked) = match request.job.base() {
        Some(_) if request.is_pull_request => {
            return Err(Refusal::BadRequest(texts::BASE_ON_PULL.to_string()))
        }
        Some(b) => (b.to_string(), true),
        None if request.is_pull_request => {
            // The base's rules judge a pull request; its head cannot change them.
            let pr = gh
                .pull_request(repo, request.issue_number as u64)
                .await
                .map_err(unreadable)?;
            (pr.base.ref_name, false)
        }
        None => (request.default_branch.clone(), false),
    };
    let commit = gh.branch_sha(repo, &branch).await.map_err(unreadable)?;
    if asked && commit.is_none() {
        let default = Base {
            branch: request.default_branch.clone(),
            commit: None,
        };
        return Ok((default, Some(branch)));
    }
    Ok((Base { branch, commit }, None))
}

/// Reserves the run's cost cap against the installation's monthly budget as it starts
/// (atomically, across processes: [`crate::db::Db::reserve_budget`]) and caps the run
/// at what it got. `Some(refusal)` when less than a cent is left.
pub(in crate::serve) async fn reserve(
    svc: &Services,
    run: &Run,
    lease: &crate::db::Lease,
    admission: &mut Admission,
    kind: RunKind,
) -> anyhow::Result<Option<Refusal>> {
    let Some(budget) = svc.settings.monthly_budget_usd else {
        return Ok(None);
    };
    let want = admission
        .config
        .cost_limit_for(kind, &svc.settings.maxima());
    let granted = svc
        .db
        .reserve_budget(
            &run.id,
            lease,
            run.request.installation_id,
            crate::db::month_start_ms(crate::db::now_ms()),
            crate::db::to_micros(want),
            crate::db::to_micros(budget),
        )
        .await
        .map_err(|e| anyhow::anyhow!("reserving the run's budget failed: {e}"))?;
    let left = granted as f64 / 1_000_000.0;
    let b = Budget {
        budget,
        spent: budget - left,
    };
    if b.is_spent() {
        tracing::info!("refused at start: monthly budget spent");
        return Ok(Some(Refusal::BudgetSpent(b)));
    }
    admission.budget = Some(b);
    Ok(None)
}

/// The installation's monthly budget and its spend this month, if the server has one.
async fn budget(svc: &Services, run: &Run) -> Option<Budget> {
    let budget = svc.settings.monthly_budget_usd?;
    let since = crate::db::month_start_ms(crate::db::now_ms());
    let spent = match svc.db.spend_since(run.request.installation_id, since).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("reading the month's spend failed: {e}");
            0.0
        }
    };
    Some(Budget { budget, spent })
}

/// Says why the run was refused and finishes it as failed: a person not permitted gets
/// one short comment; a request that cannot be read, one short comment and `confused`;
/// the others, the status comment (or a new one) and `confused`.
pub(in crate::serve) async fn refuse(svc: &Services, run: &Run, refusal: &Refusal) {
    // Recorded before it is posted: whoever reads the refusal and sends the next
    // command (a `/kodx continue` right after) finds this run ended.
    let status = match refusal {
        Refusal::Dismissed(_) => RunStatus::Succeeded,
        _ => RunStatus::Failed,
    };
    if !finish::finish_quietly(svc, run, status, refusal.end_reason(), &refusal.result()).await {
        return;
    }
    if let Refusal::Dismissed(why) = refusal {
        tracing::info!("dismissed: {why}");
        return;
    }
    match svc.github(run).await {
        Ok((gh, repo)) => post_refusal(svc, &gh, &repo, run, refusal).await,
        Err(e) => tracing::error!("the refusal was not posted: {e:#}"),
    }
}

async fn post_refusal(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
    refusal: &Refusal,
) {
    let text = refusal.message(run);
    match refusal {
        // Nothing anybody asked for: nothing is said.
        Refusal::Dismissed(_) => return,
        // Help is for everyone who can read; nobody else is answered at all.
        Refusal::NotPermitted { .. } if run.kind() == JobKind::Help => return,
        // One short answer to the person, who may not see more.
        Refusal::NotPermitted { .. } | Refusal::BadRequest(_) => {
            if let Err(e) = gh
                .create_comment(repo, run.request.issue_number as u64, &text)
                .await
            {
                tracing::warn!("posting the refusal failed: {e}");
            }
        }
        _ => {
            let body = texts::with_run_id(&text, &run.id);
            let body = match run.status_comment_id {
                Some(id) => match gh.update_comment(repo, id as u64, &body).await {
                    Ok(()) => None,
                    Err(_) => Some(body),
                },
                None => Some(body),
            };
            if let Some(body) = body {
                if let Err(e) = gh
                    .create_comment(repo, run.request.issue_number as u64, &body)
                    .await
                {
                    tracing::warn!("posting the refusal failed: {e}");
                }
            }
        }
    }
    if !matches!(refusal, Refusal::NotPermitted { .. }) {
        status::react(gh, repo, run, Reaction::Confused).await;
    }
    finish::finish_quietly(
        svc,
        run,
        RunStatus::Failed,
        refusal.end_reason(),
        &refusal.result(),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn admission(config: RepoConfig, budget: Option<Budget>) -> Admission {
        Admission::new(Base::main(), config, Some(Permission::Write), budget)
    }

    #[test]
    fn admitted_limits_stay_under_the_maxima_and_the_budget() {
        let maxima = ServerMaxima {
            cost_limit: 5.0,
            max_iterations: 40,
        };
        let mut config = RepoConfig::default();
        config.cost_limit.code = Some(8.0);
        config.max_iterations = Some(100);
        let a = admission(config.clone(), None);
        assert_eq!(a.cost_limit(RunKind::Code, &maxima), 5.0);
        assert_eq!(a.cost_limit(RunKind::Ask, &maxima), 1.0);
        assert_eq!(a.max_iterations(&maxima), 40);
        // `/kodx go $N` lowers the cap, never raises it.
        let go = a.clone().capped(Some(1.5));
        assert_eq!(go.cost_limit(RunKind::Code, &maxima), 1.5);
        assert_eq!(go.cost_limit(RunKind::Ask, &maxima), 1.0);
        assert_eq!(
            a.clone()
                .capped(Some(50.0))
                .cost_limit(RunKind::Code, &maxima),
            5.0
        );
        let b = admission(
            config,
            Some(Budget {
                budget: 10.0,
                spent: 9.25,
            }),
        );
        assert_eq!(b.cost_limit(RunKind::Code, &maxima), 0.75);
        assert_eq!(
            serde_json::to_value(b.record(RunKind::Code, &maxima)).unwrap(),
            json!({"permission": "write", "cost_limit": 0.75, "max_iterations": 40, "budget_left": 0.75})
        );
    }

    #[test]
    fn a_budget_is_spent_below_a_cent() {
        let b = |spent| Budget { budget: 1.0, spent };
        assert!(!b(0.98).is_spent());
        assert!(b(0.995).is_spent());
        assert!(b(1.5).is_spent());
    }

    #[test]
    fn who_may_ask() {
        use AskPermission as A;
        assert_eq!(needed_permission(JobKind::Ask, A::Write), Permission::Write);
        assert_eq!(needed_permission(JobKind::Ask, A::Read), Permission::Read);
        assert_eq!(needed_permission(JobKind::Code, A::Read), Permission::Write);
        assert_eq!(
            needed_permission(JobKind::Cancel, A::Read),
            Permission::Write
        );
        assert_eq!(needed_permission(JobKind::Help, A::Write), Permission::Read);
    }

    #[test]
    fn refusals_are_stored_with_their_reason() {
        let r = Refusal::NotPermitted {
            needed: Permission::Write,
            has: Permission::Read,
        };
        assert_eq!(r.end_reason().as_str(), "not_permitted");
        assert_eq!(
            serde_json::to_value(r.result()).unwrap(),
            json!({"refused": "not_permitted", "needed": "write", "has": "read"})
        );
        let r = Refusal::BudgetSpent(Budget {
            budget: 1.0,
            spent: 1.0,
        });
        assert_eq!(r.end_reason().as_str(), "budget_exceeded");
        assert_eq!(
            Refusal::ConfigUnreadable("502".into())
                .end_reason()
                .as_str(),
            "internal_error"
        );
        assert_eq!(
            Refusal::BadRequest("too long".into()).end_reason().as_str(),
            "refused"
        );
    }
}
