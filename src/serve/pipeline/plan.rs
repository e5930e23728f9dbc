//! What an `ask` or `code` run will do, decided before it does anything: a pure function of
//! the request, its admission, what GitHub said about the issue, and the server's settings.
//! [`prepare`] gives the [`RunPlan`]; the worker then clones, starts the container, runs the
//! agent and (for `code`) delivers, as the plan says.

use std::time::Duration;

use super::gate::Admission;
use super::{status, RunCtx, RunFailure};
use crate::cost::Pricing;
use crate::git::Checkout;
use crate::github::PullInfo;
use crate::job::{JobKind, RunRequest};
use crate::program::{self, Overrides, Plan, Program};
use crate::repo_config::{OnLimit, RepoConfig};
use crate::sandbox::SetupCacheSpec;
use crate::serve::config::Settings;
use crate::serve::pipeline::context::RunContext;
use crate::serve::pipeline::deliver::{self, Target};
use crate::serve::texts;
use crate::serve::texts::status::RunKind;
use crate::transcript::context::RepoContext;

/// Everything an `ask` or `code` run needs to start.
#[derive(Debug, Clone)]
pub(in crate::serve) struct RunPlan {
    pub kind: RunKind,
    /// The program with the repository's and the server's settings applied, its sandbox
    /// (without the clone's directory) and its agent settings.
    pub plan: Plan,
    /// The run's first message.
    pub prompt: String,
    /// What is cloned, and how deep (`ask` reads the tip only).
    pub checkout: Checkout,
    pub depth: Option<u32>,
    /// Where a code run's change goes (`None` for `ask`).
    pub target: Option<Target>,
    /// Open the pull request as a draft.
    pub draft: bool,
    /// What a code run stopped by a limit does with its changes.
    pub on_limit: OnLimit,
    /// What the first message carries from the repository (set once read).
    pub repo_context: Option<RepoContext>,
    /// The images of the description and the request given after the prompt, and kodx's
    /// words telling the model about them ([`super::images`]).
    pub images: Vec<crate::model::Image>,
    pub images_preface: Option<String>,
}

impl RunPlan {
    /// The run's first message: the prompt, then its images (when it has any).
    pub fn first_message(&self) -> crate::model::Message {
        let mut message = crate::model::Message::user_text(&self.prompt);
        if let Some(preface) = &self.images_preface {
            message.content.push(crate::model::Block::Text {
                text: preface.clone(),
            });
        }
        message.content.extend(
            self.images
                .iter()
                .map(|i| crate::model::Block::Image { image: i.clone() }),
        );
        message
    }

    /// Whether the run needs only the commit it starts from, not its history: an `ask`
    /// run, and a code run on an issue (on the default branch). A code run on a pull
    /// request gets the history (its commits, a rebase onto its base).
    pub fn tip_only(&self) -> bool {
        self.kind == RunKind::Ask
            || match (&self.checkout, &self.target) {
                (Checkout::DefaultBranch, _) => true,
                // An issue's run cut from `--base`: a new branch from its tip.
                (Checkout::Branch(b), Some(Target::NewPull { base, closes, .. })) => {
                    b == base && closes.is_some()
                }
                _ => false,
            }
    }
}

/// The run's plan. Fails (for the maintainer to fix) only when the model has no price.
#[allow(clippy::too_many_arguments)]
pub(in crate::serve) fn prepare(
    run_id: &str,
    kind: RunKind,
    request: &RunRequest,
    admission: &Admission,
    context: &RunContext,
    pull: Option<&PullInfo>,
    settings: &Settings,
    pricing: &Pricing,
) -> Result<RunPlan, RunFailure> {
    let config = &admission.config;
    let mut plan = program_plan(run_id, kind, admission, settings, pricing)
        .map_err(|e| RunFailure::User(texts::model_without_price(&e.to_string())))?;
    // The base's checks judge a code run's work (SPEC §11); an `ask` changes nothing.
    if kind == RunKind::Code {
        plan.agent.checks = config.checks.clone();
        plan.agent.check_repair = config.check_repair(settings.max_check_repair);
        if let Some(globs) = &config.checks_guard {
            // Checked when the file was read; a guard that cannot be built keeps the default.
            plan.agent.checks_guard = crate::checks::guard::Guard::new(globs).unwrap_or_default();
        }
    }
    let default_checkout = if request.is_pull_request {
        // The PR head from the base repository (refs/pull/N/head): a fork is never cloned
        // with the App's token, and works the same as a same-repo branch.
        Checkout::PullHead(request.issue_number as u64)
    } else {
        Checkout::DefaultBranch
    };
    // Where a code run's change goes; for pull requests, the branch to work on.
    let (checkout, target) = match (kind, pull) {
        (RunKind::Ask, _) => (default_checkout, None),
        (RunKind::Code, None) => (
            // `--base`: the work starts from that branch and goes back into it.
            match request.job.base() {
                Some(base) => Checkout::Branch(base.to_string()),
                None => default_checkout,
            },
            Some(Target::NewPull {
                branch: deliver::branch_name(
                    &config.pr.branch_prefix,
                    false,
                    request.issue_number,
                    run_id,
                ),
                base: request
                    .job
                    .base()
                    .unwrap_or(&request.default_branch)
                    .to_string(),
                closes: Some(request.issue_number),
                original: None,
            }),
        ),
        // A merge run: the base merged into the branch, committed as a merge commit.
        (RunKind::Code, Some(pr)) if !pr.is_fork && request.job.kind() == JobKind::Merge => (
            Checkout::Branch(pr.head.ref_name.clone()),
            Some(Target::Merge {
                branch: pr.head.ref_name.clone(),
                base: pr.base.ref_name.clone(),
            }),
        ),
        (RunKind::Code, Some(pr)) if !pr.is_fork => (
            Checkout::Branch(pr.head.ref_name.clone()),
            Some(Target::PullBranch {
                branch: pr.head.ref_name.clone(),
            }),
        ),
        (RunKind::Code, Some(pr)) => (
            default_checkout,
            Some(Target::NewPull {
                branch: deliver::branch_name(
                    &config.pr.branch_prefix,
                    true,
                    request.issue_number,
                    run_id,
                ),
                base: pr.base.ref_name.clone(),
                closes: None,
                original: Some(request.issue_number),
            }),
        ),
    };
    plan.sandbox.setup_cache = setup_cache(&request.repo, &checkout, config, settings);
    Ok(RunPlan {
        kind,
        plan,
        prompt: context.prompt(request.job.kind()),
        checkout,
        depth: (kind == RunKind::Ask).then_some(1),
        target,
        draft: config.pr.draft,
        on_limit: config.pr.on_limit,
        repo_context: None,
        images: Vec::new(),
        images_preface: None,
    })
}

impl RunCtx<'_> {
    /// Shows that the run is setting up, reads the issue from GitHub and plans the run.
    pub(in crate::serve) async fn plan(&self) -> Result<RunPlan, RunFailure> {
        self.plan_with(None).await
    }

    /// [`RunCtx::plan`] for a follow-up run on a pull request: `follow_up` is told after
    /// its diff.
    pub(in crate::serve) async fn plan_with(
        &self,
        follow_up: Option<super::context::FollowUp>,
    ) -> Result<RunPlan, RunFailure> {
        use anyhow::Context as _;
        status::setting_up(self.svc, self.run, self.lease, &self.status).await;
        // The issue and the repository's own context are read side by side.
        let (issue, rules) = tokio::join!(
            self.read_issue(),
            self.read_repo_context(self.kind == RunKind::Code)
        );
        let (mut context, pull) = issue.context("reading the issue from GitHub failed")?;
        context.instructions = rules.instructions_text(context.is_pull_request);
        context.template = rules.template_text();
        if let Some(f) = follow_up {
            // The request of a repair run is its commit, not words anybody wrote.
            if matches!(
                self.run.request.job.kind(),
                crate::job::JobKind::Repair | crate::job::JobKind::Merge
            ) {
                context.request.clear();
            }
            context.follow_up = Some(f);
        }
        let images = self.gather_images(&context).await;
        let mut plan = prepare(
            &self.run.id,
            self.kind,
            &self.run.request,
            &self.admission,
            &context,
            pull.as_ref(),
            &self.svc.settings,
            &self.svc.pricing,
        )?;
        plan.repo_context = Some(rules);
        plan.images = images.given();
        plan.images_preface = images.preface();
        self.log.timings.add("prepare", self.started.elapsed());
        Ok(plan)
    }
}

/// The setup cache of a run on `repo` (`None`: off, by the server or the repository). A
/// pull request's head is its own scope: what the setup made from a fork's (or any PR's)
/// code never serves a run on the repository's own branches, nor another PR.
pub(in crate::serve) fn setup_cache(
    repo: &str,
    checkout: &Checkout,
    config: &RepoConfig,
    settings: &Settings,
) -> Option<SetupCacheSpec> {
    if !settings.setup_cache_on() || config.setup_cache == Some(false) {
        return None;
    }
    let scope = match checkout {
        Checkout::PullHead(n) => format!("{repo}#pull/{n}"),
        _ => repo.to_string(),
    };
    Some(SetupCacheSpec {
        scope,
        key_files: config.setup_cache_key_files.clone(),
        max_images: settings.setup_cache_max_images,
        max_bytes: settings.setup_cache_max_bytes,
    })
}

/// The program of a `kind` run under the repository's config (as admitted: within the
/// server's maxima and the budget) over the server's settings: [`Plan::new`], the one
/// conversion `kodx run` uses too.
pub(in crate::serve) fn program_plan(
    run_id: &str,
    kind: RunKind,
    admission: &Admission,
    settings: &Settings,
    pricing: &Pricing,
) -> Result<Plan, crate::cost::CostError> {
    let config = &admission.config;
    let maxima = settings.maxima();
    let cost_limit = admission.cost_limit(kind, &maxima);
    let max_iterations = admission.max_iterations(&maxima);
    let program = Program::builtin(kind.program()).expect("built-in ask and code programs");
    let overrides = Overrides {
        model: config.model.clone().or_else(|| settings.model.clone()),
        image: config.image.clone(),
        setup_script: config.setup_script.clone(),
        disable_network_after_setup: config.disable_network_after_setup,
        cost_limit: Some(cost_limit),
        max_iterations: Some(max_iterations),
        // The repository has no say in it; the server's setting is the default below.
        command_timeout: None,
    };
    let defaults = program::Defaults {
        image: settings.image.clone(),
        cost_limit,
        max_iterations,
        command_timeout: Duration::from_secs(settings.command_timeout_secs),
        run_timeout: Duration::from_secs(settings.run_timeout_secs),
        network: settings.network,
        network_allow: settings.network_allow.clone(),
        max_disk_bytes: settings.max_disk_bytes,
    };
    Plan::new(
        format!("kodx-{run_id}"),
        program,
        &overrides,
        &defaults,
        pricing,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::{Permission, PullBase, PullHead, PullRepo, RepoName};
    use crate::job::{Job, Trigger};
    use crate::repo_config::RepoConfig;

    fn request(job: Job, is_pull_request: bool) -> RunRequest {
        RunRequest {
            installation_id: 1,
            repo: "acme/widgets".into(),
            issue_number: 7,
            is_pull_request,
            author: "alice".into(),
            author_id: 1005,
            clone_url: "https://github.com/acme/widgets.git".into(),
            default_branch: "trunk".into(),
            job,
            trigger: Trigger::IssueComment(11),
        }
    }

    fn code() -> Job {
        Job::Code {
            request: "add a flag".into(),
            base: None,
        }
    }

    fn admitted(config: RepoConfig) -> Admission {
        Admission::new(
            super::super::gate::Base::main(),
            config,
            Some(Permission::Write),
            None,
        )
    }

    fn pull(is_fork: bool) -> PullInfo {
        let repo = PullRepo {
            name: RepoName::parse("acme/widgets").unwrap(),
            clone_url: "https://github.com/acme/widgets.git".into(),
        };
        PullInfo {
            number: 7,
            title: "t".into(),
            body: String::new(),
            author: "bob".into(),
            state: "open".into(),
            head: PullHead {
                ref_name: "feature".into(),
                sha: "a".repeat(40),
                repo: Some(repo.clone()),
            },
            base: PullBase {
                ref_name: "release".into(),
                sha: "b".repeat(40),
                repo,
            },
            is_fork,
            maintainer_can_modify: false,
            mergeable: None,
            mergeable_state: None,
        }
    }

    fn plan_of(job: Job, pr: Option<&PullInfo>, config: RepoConfig) -> RunPlan {
        let request = request(job, pr.is_some());
        let context = RunContext {
            request: request.job.argument().to_string(),
            is_pull_request: pr.is_some(),
            ..Default::default()
        };
        prepare(
            "0123456789ab",
            request.job.kind().run_kind().expect("an agent run"),
            &request,
            &admitted(config),
            &context,
            pr,
            &Settings::default(),
            &Pricing::builtin(),
        )
        .expect("planned")
    }

    #[test]
    fn an_ask_reads_the_tip_and_delivers_nothing() {
        let p = plan_of(
            Job::Ask {
                question: "why does it fail?".into(),
            },
            None,
            RepoConfig::default(),
        );
        assert_eq!(p.kind, RunKind::Ask);
        assert_eq!(p.checkout, Checkout::DefaultBranch);
        assert_eq!(p.depth, Some(1));
        assert_eq!(p.target, None);
        assert!(p.prompt.contains("why does it fail?"), "{}", p.prompt);
        assert_eq!(p.plan.program.name, "ask");
        assert_eq!(p.plan.agent.cost_limit, 1.0);
        assert_eq!(p.plan.sandbox.run_id, "kodx-0123456789ab");
    }

    #[test]
    fn code_on_an_issue_opens_a_pull_request_that_closes_it() {
        let mut config = RepoConfig::default();
        config.pr.branch_prefix = "bot/".into();
        config.pr.draft = true;
        let p = plan_of(code(), None, config);
        assert_eq!(p.checkout, Checkout::DefaultBranch);
        assert_eq!(p.depth, None);
        assert_eq!(
            p.target,
            Some(Target::NewPull {
                branch: "bot/issue-7-01234567".into(),
                base: "trunk".into(),
                closes: Some(7),
                original: None,
            })
        );
        assert!(p.draft);
        assert_eq!(p.plan.agent.cost_limit, 2.0);
    }

    #[test]
    fn code_on_a_pull_request_pushes_to_its_branch_unless_it_is_a_fork() {
        let same = plan_of(code(), Some(&pull(false)), RepoConfig::default());
        assert_eq!(same.checkout, Checkout::Branch("feature".into()));
        assert_eq!(
            same.target,
            Some(Target::PullBranch {
                branch: "feature".into()
            })
        );
        let fork = plan_of(code(), Some(&pull(true)), RepoConfig::default());
        assert_eq!(fork.checkout, Checkout::PullHead(7));
        assert_eq!(
            fork.target,
            Some(Target::NewPull {
                branch: "kodx/pr-7-01234567".into(),
                base: "release".into(),
                closes: None,
                original: Some(7),
            })
        );
    }

    #[test]
    fn a_model_without_a_price_is_the_maintainers_to_fix() {
        let config = RepoConfig {
            model: Some("claude-unknown-9".into()),
            ..Default::default()
        };
        let request = request(code(), false);
        let failure = prepare(
            "r1",
            RunKind::Code,
            &request,
            &admitted(config),
            &RunContext::default(),
            None,
            &Settings::default(),
            &Pricing::builtin(),
        )
        .expect_err("no price");
        match failure {
            RunFailure::User(text) => {
                assert!(text.contains("Choose a model kodx knows"), "{text}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn setup_cache_follows_server_and_repository_and_scopes_pull_heads() {
        let settings = Settings::default();
        let config = RepoConfig {
            setup_cache_key_files: vec!["tools/*.txt".into()],
            ..Default::default()
        };
        let on = setup_cache("acme/widgets", &Checkout::DefaultBranch, &config, &settings)
            .expect("on by default");
        assert_eq!(on.scope, "acme/widgets");
        assert_eq!(on.key_files, ["tools/*.txt"]);
        assert_eq!((on.max_images, on.max_bytes), (20, 20 << 30));
        let branch = setup_cache(
            "acme/widgets",
            &Checkout::Branch("b".into()),
            &config,
            &settings,
        );
        assert_eq!(branch.unwrap().scope, "acme/widgets");
        let pr = setup_cache("acme/widgets", &Checkout::PullHead(7), &config, &settings);
        assert_eq!(pr.unwrap().scope, "acme/widgets#pull/7");
        let repo_off = RepoConfig {
            setup_cache: Some(false),
            ..Default::default()
        };
        assert_eq!(
            setup_cache(
                "acme/widgets",
                &Checkout::DefaultBranch,
                &repo_off,
                &settings
            ),
            None
        );
        let server_off = Settings {
            setup_cache_max_images: 0,
            ..Settings::default()
        };
        assert_eq!(
            setup_cache(
                "acme/widgets",
                &Checkout::DefaultBranch,
                &config,
                &server_off
            ),
            None
        );
        // Through the whole plan: an issue run's sandbox has it.
        let plan = plan_of(code(), None, config);
        assert_eq!(
            plan.plan.sandbox.setup_cache.map(|c| c.scope).as_deref(),
            Some("acme/widgets")
        );
    }

    /// `kodx serve` and `kodx run` make a run's sandbox and agent settings with the same
    /// conversion: the same program, limits and server settings give the same plan. (Serve
    /// once dropped the command timeout.)
    #[test]
    fn serve_plans_as_kodx_run_does() {
        let settings = Settings {
            image: "kodx-test:bookworm".into(),
            command_timeout_secs: 7,
            run_timeout_secs: 99,
            max_disk_bytes: 123 << 20,
            network: crate::sandbox::NetworkMode::SetupOnly,
            ..Settings::default()
        };
        let config = RepoConfig {
            setup_script: Some("make deps".into()),
            max_iterations: Some(12),
            ..Default::default()
        };
        let admission = admitted(config.clone());
        let serve = program_plan(
            "r1",
            RunKind::Code,
            &admission,
            &settings,
            &Pricing::builtin(),
        )
        .expect("serve plan");
        // What `kodx run code --setup-script … --cost-limit 2 --max-iterations 12` with
        // the server's settings as its environment builds.
        let run = Plan::new(
            "kodx-r1",
            Program::builtin("code").unwrap(),
            &Overrides {
                setup_script: config.setup_script.clone(),
                cost_limit: Some(2.0),
                max_iterations: Some(12),
                ..Default::default()
            },
            &program::Defaults {
                image: settings.image.clone(),
                command_timeout: Duration::from_secs(7),
                run_timeout: Duration::from_secs(99),
                network: settings.network,
                max_disk_bytes: settings.max_disk_bytes,
                ..Default::default()
            },
            &Pricing::builtin(),
        )
        .expect("run plan");
        assert_eq!(serve.agent.command_timeout, Duration::from_secs(7));
        assert_eq!(serve.agent.timeout, Duration::from_secs(99));
        assert_eq!(format!("{:?}", serve.agent), format!("{:?}", run.agent));
        assert_eq!(format!("{:?}", serve.sandbox), format!("{:?}", run.sandbox));
        assert_eq!(serve.program, run.program);
    }
}
