//! An `ask` or `code` run: the repository's config, the program and its limits, the
//! context, the clone, the container, the agent, and for `code` the delivery of the change.

use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use secrecy::ExposeSecret;
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, Progress, Record, StopReason};
use crate::comment::{self, Done, Phase};
use crate::db::{Db, Run, RunStatus};
use crate::github::{GitHubError, Installation, PullInfo, RepoName};
use crate::model::{Provider, ProviderError, Request, Response};
use crate::program::Program;
use crate::repo_cache::{RepoCache, RepoKey};
use crate::repo_config::{OnLimit, RepoConfig};
use crate::sandbox::{RepoSource, Sandbox, SandboxError};
use crate::serve::context::{strip_hidden, ContextComment, RunContext};
use crate::serve::deliver::{self, Target};
use crate::serve::messages;
use crate::serve::metrics::Metrics;

use super::ending::{RunLog, Timings};
use super::gate::Admission;
use super::gate::Refusal;
use super::{run_kind, zero_outcome, Acked, Ending, RunFailure, RunHandle, Workers};
use crate::model::Message;
use crate::serve::handlers::continue_run;
use crate::serve::handlers::plan::{prepare, RunPlan};
use crate::serve::job::Job;
use anyhow::Context as _;

impl Workers {
    pub(super) async fn work(self: &Arc<Self>, run: Run) {
        self.metrics.run_started();
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let cancelled_by = Arc::new(Mutex::new(None));
        self.running.lock().expect("lock").insert(
            run.id.clone(),
            RunHandle {
                cancel: cancel.clone(),
                cancelled_by: cancelled_by.clone(),
            },
        );
        tracing::info!(attempt = run.attempts, "run started");
        let log = RunLog::default();
        // A run claimed before it was acknowledged is acknowledged now (or refused, and
        // then over).
        let (admission, comment_id) = match self.ensure_acknowledged(&run).await {
            Some(Acked::Refused) => (None, None),
            Some(Acked::Admitted(admission, id)) => (Some(Ok(*admission)), id),
            Some(Acked::Unreachable) | None => (Some(Err(())), None),
        };
        self.forget_ack(&run.id);
        let mut run = run;
        run.status_comment_id = run.status_comment_id.or(comment_id.map(|id| id as i64));
        let ended = match admission {
            Some(admission) => Some(self.work_inner(&run, admission.ok(), &cancel, &log).await),
            None => None,
        };
        self.running.lock().expect("lock").remove(&run.id);
        self.metrics.run_ended();
        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let Some(mut ended) = ended else {
            return;
        };
        if let Ok(Ending::Work { status, done }) = &mut ended {
            if done.outcome.stop_reason == StopReason::Cancelled {
                let by = cancelled_by.lock().expect("lock").clone();
                match by {
                    Some(who) => {
                        *status = RunStatus::Cancelled;
                        done.failure = Some(messages::cancelled_by(&who));
                    }
                    None if self.shutdown.is_cancelled() => {
                        // Stopped by a shutdown: left `running`, queued again at the next
                        // start.
                        tracing::warn!(
                            "run stopped by shutdown; it resumes when kodx starts again"
                        );
                        self.edit_status(&run, messages::PAUSED_BY_RESTART).await;
                        return;
                    }
                    None => {}
                }
            }
        }
        self.conclude(&run, ended, &log, started).await;
    }

    /// The run itself, admitted by `admission` when it was acknowledged (`None`: it was
    /// not, here).
    async fn work_inner(
        self: &Arc<Self>,
        run: &Run,
        admission: Option<Admission>,
        cancel: &CancellationToken,
        log: &RunLog,
    ) -> Result<Ending, RunFailure> {
        let timings = &log.timings;
        let prepare_started = Instant::now();
        let kind = run_kind(run);
        let gh = self
            .installation(run)
            .await
            .context("GitHub did not give kodx an installation token")?;
        let repo = RepoName::parse(&run.request.repo)
            .with_context(|| format!("the repository name {:?} is not valid", run.request.repo))?;
        // The admission made when the run was acknowledged, unless the run waited since (or
        // an earlier process acknowledged it): then its config and budget are read again.
        let mut admission = match admission {
            Some(a) if a.is_fresh(self.ended()) => a,
            earlier => {
                let permission = earlier.and_then(|a| a.permission);
                match self.readmit(&gh, &repo, run, permission).await {
                    Ok(a) => a,
                    Err(refusal) => return self.refused_after_wait(run, refusal),
                }
            }
        };
        // Its cost cap is reserved against the monthly budget now, so runs starting
        // together (here or in other processes) cannot spend the same dollars twice.
        if let Some(refusal) = self.reserve(run, &mut admission, kind).await? {
            return self.refused_after_wait(run, refusal);
        }
        let maxima = self.settings.maxima();
        *log.admission.lock().expect("lock") = Some(admission.to_json(kind, &maxima));
        // `/kodx continue`: the stopped run it goes on with, checked before anything shows.
        let resumption = match &run.request.job {
            Job::Continue { more } => {
                let limits = continue_run::limits(*more, &admission, &maxima)
                    .map_err(Refusal::CannotContinue)?;
                let resumption = self
                    .resumption(run)
                    .await
                    .context("reading the stopped run from the database failed")?
                    .map_err(Refusal::CannotContinue)?;
                let earlier = &resumption.earlier;
                *log.branch.lock().expect("lock") = Some(earlier.branch.clone());
                *log.continues.lock().expect("lock") = Some(serde_json::json!({
                    "run": earlier.id,
                    "request": earlier.request,
                    "cost_usd": earlier.cost,
                }));
                Some((resumption, limits))
            }
            _ => None,
        };
        let status = self.status_comment(&gh, &repo, run).await;
        status.edit(&Phase::SettingUp).await;
        let _ = self.db.set_phase(&run.id, "setting_up").await;

        // What GitHub says about the issue, then what the run will do.
        let (context, pull) = self
            .context(&gh, &repo, run)
            .await
            .context("reading the issue from GitHub failed")?;
        let mut run_plan = prepare(
            &run.id,
            &run.request,
            &admission,
            &context,
            pull.as_ref(),
            &self.settings,
            &self.pricing,
        )?;
        if let Some((resumption, (cost, steps))) = &resumption {
            continue_run::resume_plan(&mut run_plan, &resumption.earlier, *cost, *steps);
        }
        let RunPlan {
            kind,
            plan,
            prompt,
            checkout,
            depth,
            target,
            draft,
            on_limit,
            ..
        } = run_plan;
        let cost_limit = plan.agent.cost_limit;
        let clone_url = run.request.clone_url.clone();
        let program = &plan.program;
        let provider = self
            .providers
            .make(program.model.provider)
            .map_err(anyhow::Error::msg)
            .context("the model API is not configured on this server")?;
        let provider = Timed {
            inner: provider,
            metrics: self.metrics.clone(),
        };
        // Readable by this user alone: it holds a private repository. A clone from the
        // repository cache must be on the mirrors' filesystem to hard-link their packs
        // instead of copying them: in the temporary directory when it is there, else beside
        // the mirrors.
        let runs_dir = match self.repo_cache() {
            Some(cache) => Some(clones_dir(cache.root()).map_err(|e| {
                RunFailure::User(format!(
                    "The repository cache has no room for this run's clone: cannot create {}: {e}; check that the data volume is writable",
                    cache.root().display()
                ))
            })?),
            None => None,
        };
        let prefix = format!("{}{}-", self.clone_prefix(), run.id);
        let mut builder = tempfile::Builder::new();
        builder
            .prefix(&prefix)
            .permissions(std::fs::Permissions::from_mode(0o700));
        let made = match &runs_dir {
            Some(dir) => builder.tempdir_in(dir),
            None => builder.tempdir(),
        };
        let workdir = match made {
            Ok(d) => d,
            Err(e) => {
                return Err(RunFailure::Internal(anyhow::anyhow!(
                    "no temporary directory for the clone: {e}"
                )))
            }
        };
        let dest = workdir.path().join("repo");
        let token = gh.token().expose_secret().to_string();
        timings.add("prepare", prepare_started.elapsed());
        let source = match self.repo_cache() {
            Some(cache) => {
                let key = RepoKey::parse(&run.request.repo).map_err(|e| {
                    RunFailure::User(format!("The repository cache refused this run: {e}"))
                })?;
                let checked = {
                    let dest = dest.clone();
                    let url = clone_url.clone();
                    tokio::task::spawn_blocking(move || {
                        let first = !cache.mirror_path(&key).exists();
                        cache
                            .checkout(&key, &url, &token, &checkout, &dest, false)
                            .map(|c| (c, first))
                    })
                    .await
                };
                match checked {
                    Ok(Ok((c, first))) => {
                        // A first download of the whole history is a clone; later ones
                        // fetch what the mirror lacks.
                        timings.add(if first { "clone" } else { "fetch" }, c.fetch_took);
                        timings.add("checkout", c.clone_took);
                        tracing::info!(
                            head = %c.commit,
                            fetched = c.fetched,
                            objects = c.received_objects,
                            bytes = c.received_bytes,
                            recovery = ?c.recovery,
                            "checked out from the repository cache"
                        );
                        RepoSource::GitHead
                    }
                    Ok(Err(e)) => {
                        return Err(RunFailure::User(messages::clone_failed(&e.to_string())))
                    }
                    Err(e) => {
                        return Err(RunFailure::Internal(anyhow::anyhow!(
                            "the clone task failed: {e}"
                        )))
                    }
                }
            }
            None => {
                let clone_started = Instant::now();
                let cloned = {
                    let dest = dest.clone();
                    let url = clone_url.clone();
                    tokio::task::spawn_blocking(move || {
                        crate::git::clone(&url, &token, &dest, &checkout, depth)
                    })
                    .await
                };
                match cloned {
                    Ok(Ok(c)) => {
                        timings.add("clone", clone_started.elapsed());
                        tracing::info!(head = %c.head_sha, "cloned")
                    }
                    Ok(Err(e)) => {
                        return Err(RunFailure::User(messages::clone_failed(&e.to_string())))
                    }
                    Err(e) => {
                        return Err(RunFailure::Internal(anyhow::anyhow!(
                            "the clone task failed: {e}"
                        )))
                    }
                }
                RepoSource::Files
            }
        };
        if cancel.is_cancelled() {
            return Ok(self.cancelled_early(run, cost_limit, program));
        }

        // The container.
        let engine = match self.engine.get().await {
            Ok(e) => e,
            Err(e) => {
                return Err(RunFailure::Internal(anyhow::anyhow!(
                    "no Docker engine: {e}"
                )))
            }
        };
        let mut spec = plan.sandbox.clone();
        spec.repo_dir = Some(dest.clone());
        spec.repo_source = source;
        if run.attempts > 1 {
            // An earlier attempt's container (whoever made it) would hold the name.
            match engine.remove_run_containers(&spec.run_id).await {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} container(s) of an earlier attempt"),
                Err(e) => tracing::warn!("could not remove an earlier attempt's container: {e}"),
            }
        }
        let setup_started = Instant::now();
        let sandbox = tokio::select! {
            s = engine.start_with_progress(&spec, |line| tracing::info!("{line}")) => s,
            _ = cancel.cancelled() => return Ok(self.cancelled_early(run, cost_limit, program)),
        };
        let sandbox = match sandbox {
            Ok(s) => {
                let setup = s.setup_report();
                // The container phase is the whole start; the setup is its part.
                timings.add("container", setup_started.elapsed());
                if let Some(took) = setup.took {
                    timings.add(setup.phase(), took);
                }
                *log.setup_cache.lock().expect("lock") = Some(setup.cache.as_str());
                s
            }
            Err(e @ (SandboxError::SetupFailed { .. } | SandboxError::SetupTimedOut { .. })) => {
                let mut outcome = zero_outcome(
                    StopReason::SetupFailed,
                    cost_limit,
                    program.model.name.clone(),
                );
                outcome.duration = setup_started.elapsed();
                outcome.detail = Some(e.to_string());
                return Ok(Ending::Work {
                    status: RunStatus::Failed,
                    done: Done {
                        kind,
                        outcome,
                        text: String::new(),
                        pr_url: None,
                        pushed: None,
                        failure: None,
                    },
                });
            }
            Err(e) => return Err(RunFailure::User(messages::container_failed(&e.to_string()))),
        };

        // The agent, with the status comment following its progress.
        let _ = self.db.set_phase(&run.id, "working").await;
        let agent_config = plan.agent.clone();
        let (progress_tx, progress_rx) = tokio::sync::watch::channel(None::<Progress>);
        let updater = tokio::spawn(self.clone().follow_progress(status.clone(), progress_rx));
        let (records_tx, records_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(write_transcript(
            self.db.clone(),
            run.id.clone(),
            records_rx,
        ));
        let agent = Agent {
            provider: &provider,
            sandbox: &sandbox,
            config: agent_config,
            cancel: cancel.clone(),
        };
        let agent_started = Instant::now();
        let (messages, earlier) = match resumption {
            Some((r, _)) => (r.messages, Some(r.earlier)),
            None => (vec![Message::user_text(&prompt)], None),
        };
        let outcome = agent
            .resume(
                messages,
                |p| {
                    let _ = progress_tx.send(Some(p.clone()));
                },
                |r: &Record| {
                    if let Ok(line) = serde_json::to_string(r) {
                        let _ = records_tx.send(line);
                    }
                },
            )
            .await;
        timings.add("agent", agent_started.elapsed());
        drop(progress_tx);
        drop(records_tx);
        let _ = updater.await;
        let _ = writer.await;
        // A code run that ended its turn: its exact change set leaves the container. So
        // does one a limit stopped, unless the repository asks to discard its work
        // (`pr.on_limit`): it is delivered marked incomplete.
        let partial = matches!(
            outcome.stop_reason,
            StopReason::CostLimitExceeded | StopReason::MaxIterations | StopReason::Timeout
        )
        .then_some(on_limit)
        .filter(|o| *o != OnLimit::Discard);
        let deliverable = outcome.stop_reason == StopReason::EndTurn || partial.is_some();
        let changes = match &target {
            Some(_) if deliverable => {
                let started = Instant::now();
                let changes = sandbox.change_set().await;
                timings.add("export", started.elapsed());
                Some(changes)
            }
            _ => None,
        };
        // The container goes while the change is delivered (it is not needed any more).
        drop(agent);
        let teardown = tokio::spawn(async move { sandbox.destroy().await });
        let mut done = Done {
            kind,
            text: outcome.last_message.clone(),
            outcome,
            pr_url: None,
            pushed: None,
            failure: None,
        };
        if let (Some(target), Some(changes)) = (target, changes) {
            // A continuation's commit and pull request say the request it continues.
            let as_code;
            let asked = match &earlier {
                Some(earlier) => {
                    let mut r = run.clone();
                    r.request.job = Job::Code {
                        request: earlier.request.clone(),
                    };
                    as_code = r;
                    &as_code
                }
                None => run,
            };
            let delivered = match changes {
                Ok(changes) => {
                    self.deliver(
                        asked, &repo, &dest, source, &clone_url, &target, changes, &done, draft,
                        partial, timings,
                    )
                    .await
                }
                Err(e) => Err(format!(
                    "The changes could not be taken out of the container: {e}"
                )),
            };
            if matches!(delivered, Ok(Delivered::Pull(_) | Delivered::Pushed { .. })) {
                let (Target::NewPull { branch, .. } | Target::PullBranch { branch }) = &target;
                *log.branch.lock().expect("lock") = Some(branch.clone());
            }
            match delivered {
                Ok(Delivered::Pull(url)) => done.pr_url = Some(url),
                Ok(Delivered::Pushed { sha, branch }) => done.pushed = Some((sha, branch)),
                Ok(Delivered::Nothing) => {}
                Err(failure) => done.failure = Some(failure),
            }
        }
        match teardown.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("removing the container failed: {e}"),
            Err(e) => tracing::warn!("removing the container failed: {e}"),
        }
        // The clone (and for ask runs, the container's changes) go with `workdir`.
        drop(workdir);
        if let Some(earlier) = &earlier {
            let finished = done.succeeded() && done.pr_url.is_some();
            done.text =
                continue_run::both_parts(&done.text, earlier, done.outcome.usd_cost, finished);
        }
        let status = if done.succeeded() {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        };
        Ok(Ending::Work { status, done })
    }

    /// Commits a code run's change set in the run's clone (applied to its files, or for a
    /// clone from the repository cache onto its commit from the objects), pushes it and
    /// opens (or finds) the pull request. `Err` is the sentence the status comment shows.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn deliver(
        &self,
        run: &Run,
        repo: &RepoName,
        dest: &std::path::Path,
        source: RepoSource,
        clone_url: &str,
        target: &Target,
        changes: crate::sandbox::archive::ChangeSet,
        done: &Done,
        draft: bool,
        partial: Option<OnLimit>,
        timings: &Timings,
    ) -> Result<Delivered, String> {
        if changes.is_empty() {
            return Ok(Delivered::Nothing);
        }
        tracing::info!(changes = %changes.summary(), "delivering");
        // A fresh token: the run may have outlived the one it cloned with.
        let gh = self
            .installation(run)
            .await
            .map_err(|e| format!("GitHub did not give kodx a token to push with: {e}"))?;
        let bot = self
            .app
            .bot_identity(&gh)
            .await
            .map_err(|e| format!("kodx could not read its own GitHub identity: {e}"))?;
        // Work a limit cut short says so in its subject, commit and pull request.
        let request_text = match partial {
            Some(_) => messages::incomplete_request(&run.request.job.argument()),
            None => run.request.job.argument().to_string(),
        };
        let summary = match partial {
            Some(_) => messages::incomplete_summary(
                done.outcome
                    .detail
                    .as_deref()
                    .unwrap_or(done.outcome.stop_reason.as_str()),
                &done.outcome.last_message,
            ),
            None => done.outcome.last_message.clone(),
        };
        let subject = deliver::commit_subject(&request_text);
        let body = deliver::commit_body(
            &summary,
            run.request.issue_number,
            run.request.is_pull_request,
            &run.id,
        );
        let trailers = deliver::trailers(&run.request.author, run.request.author_id, &run.id);
        let max_file_bytes = self.settings.max_commit_file_bytes;
        let token = gh.token().expose_secret().to_string();
        let committed = {
            let dest = dest.to_path_buf();
            let url = clone_url.to_string();
            let target = target.clone();
            let token = token.clone();
            let identity_name = bot.login.clone();
            let identity_email = bot.noreply_email.clone();
            type Pushed = Option<(String, String, Duration, Duration)>;
            tokio::task::spawn_blocking(move || -> Result<Pushed, String> {
                let started = Instant::now();
                if source == RepoSource::Files {
                    changes.apply(&dest).map_err(|e| {
                        format!("The changes could not be applied to the clone: {e}")
                    })?;
                }
                let request = crate::git::CommitRequest {
                    author: crate::git::Identity {
                        name: identity_name,
                        email: identity_email,
                    },
                    subject: &subject,
                    body: &body,
                    trailers: &trailers,
                    max_file_bytes,
                };
                let committed = match source {
                    RepoSource::Files => crate::git::commit_all(&dest, &request),
                    // The clone has no files: the change set goes onto the commit the
                    // container was given, from the objects.
                    RepoSource::GitHead => crate::git::commit_change_set(&dest, &changes, &request),
                };
                let Some(commit) =
                    committed.map_err(|e| format!("The change could not be committed: {e}"))?
                else {
                    return Ok(None);
                };
                tracing::info!(sha = %commit.sha, files = commit.files_changed, "committed");
                let committed = started.elapsed();
                let started = Instant::now();
                match &target {
                    Target::NewPull { branch, .. } => {
                        // The run's own branch: a re-run after a restart replaces what an
                        // earlier attempt pushed there.
                        crate::git::push(&dest, &url, &token, "HEAD", branch, true)
                            .map_err(|e| push_failure(&e, branch))?;
                        Ok(Some((
                            commit.sha,
                            branch.clone(),
                            committed,
                            started.elapsed(),
                        )))
                    }
                    Target::PullBranch { branch } => {
                        let pushed = crate::git::push_rebasing(&dest, &url, &token, branch, 3)
                            .map_err(|e| push_failure(&e, branch))?;
                        Ok(Some((
                            pushed.sha,
                            branch.clone(),
                            committed,
                            started.elapsed(),
                        )))
                    }
                }
            })
            .await
            .map_err(|e| format!("kodx hit an internal error while committing: {e}"))??
        };
        let Some((sha, branch, commit_took, push_took)) = committed else {
            return Ok(Delivered::Nothing);
        };
        timings.add("commit", commit_took);
        timings.add("push", push_took);
        let pr_started = Instant::now();
        let Target::NewPull { base, .. } = target else {
            return Ok(Delivered::Pushed { sha, branch });
        };
        if partial == Some(OnLimit::Branch) {
            return Ok(Delivered::Pushed { sha, branch });
        }
        let cost = comment::cost_summary(&done.outcome);
        let pull_body = deliver::pull_body(&summary, target, &run.request.author, &cost, &run.id);
        let existing = gh.find_open_pull(repo, &branch).await.map_err(|e| {
            format!("Pushed `{branch}`, but GitHub could not be asked for its pull request: {e}")
        })?;
        if let Some(pr) = existing {
            // A continuation that finished: the title no longer says incomplete.
            let title = partial
                .is_none()
                .then(|| deliver::title_from(&request_text, 100));
            let _ = gh
                .update_pull(repo, pr.number, title.as_deref(), &pull_body)
                .await;
            timings.add("pull_request", pr_started.elapsed());
            return Ok(Delivered::Pull(pr.html_url));
        }
        let new = crate::github::NewPull {
            title: deliver::title_from(&request_text, 100),
            head: branch.clone(),
            base: base.clone(),
            body: pull_body,
            draft: draft || partial.is_some(),
        };
        let created = gh.create_pull(repo, &new).await;
        timings.add("pull_request", pr_started.elapsed());
        match created {
            Ok(pr) => Ok(Delivered::Pull(pr.html_url)),
            Err(GitHubError::PullExists { .. }) => match gh.find_open_pull(repo, &branch).await {
                Ok(Some(pr)) => Ok(Delivered::Pull(pr.html_url)),
                _ => Err(format!(
                    "Pushed `{branch}`, but its pull request could not be found."
                )),
            },
            Err(e) => Err(format!(
                "Pushed the change to branch `{branch}`, but opening the pull request failed: {e}"
            )),
        }
    }

    /// The repository cache, unless `repo_cache_max_bytes = 0` turned it off.
    pub(super) fn repo_cache(&self) -> Option<RepoCache> {
        let dir = self.settings.repo_cache_dir.as_ref()?;
        (self.settings.repo_cache_max_bytes > 0)
            .then(|| RepoCache::new(dir, self.settings.repo_cache_max_bytes))
    }

    /// A run whose config or budget changed while it waited: it ends as it did before
    /// the admission was one check (a failed run, not a refusal).
    fn refused_after_wait(&self, run: &Run, refusal: Refusal) -> Result<Ending, RunFailure> {
        match refusal {
            Refusal::InvalidConfig(e) => Err(RunFailure::User(messages::config_became_invalid(
                &e.to_string(),
            ))),
            Refusal::BudgetSpent(_) => Ok(Ending::Work {
                status: RunStatus::Failed,
                done: self.failed_done(
                    run,
                    StopReason::CostLimitExceeded,
                    messages::BUDGET_SPENT_WHILE_WAITING.into(),
                ),
            }),
            Refusal::ConfigUnreadable(e) => Err(RunFailure::Internal(anyhow::anyhow!(
                "reading {} failed: {e}",
                RepoConfig::PATH
            ))),
            other => Err(RunFailure::Internal(anyhow::anyhow!(
                "the run was refused after it waited: {other:?}"
            ))),
        }
    }

    pub(super) fn cancelled_early(&self, run: &Run, cost_limit: f64, program: &Program) -> Ending {
        Ending::Work {
            status: RunStatus::Cancelled,
            done: Done {
                kind: run_kind(run),
                outcome: zero_outcome(
                    StopReason::Cancelled,
                    cost_limit,
                    program.model.name.clone(),
                ),
                text: String::new(),
                pr_url: None,
                pushed: None,
                failure: None,
            },
        }
    }

    /// What the model is told, and for a pull request, the pull request.
    pub(super) async fn context(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> Result<(RunContext, Option<PullInfo>), GitHubError> {
        let number = run.request.issue_number as u64;
        let mut ctx = RunContext {
            repo: run.request.repo.clone(),
            number: run.request.issue_number,
            is_pull_request: run.request.is_pull_request,
            author: run.request.author.clone(),
            request: run.request.job.argument().to_string(),
            ..Default::default()
        };
        ctx.review = run.request.trigger.review().cloned();
        if run.request.is_pull_request {
            let pr = gh.pull_request(repo, number).await?;
            ctx.title = pr.title.clone();
            ctx.body = pr.body.clone();
            ctx.branches = Some((pr.head.ref_name.clone(), pr.base.ref_name.clone()));
            ctx.diff = Some(
                gh.pull_request_diff(repo, number, self.settings.max_diff_bytes)
                    .await?,
            );
            ctx.comments = self.comments(gh, repo, number).await?;
            Ok((ctx, Some(pr)))
        } else {
            let issue = gh.issue(repo, number).await?;
            ctx.title = issue.title;
            ctx.body = issue.body;
            ctx.comments = self.comments(gh, repo, number).await?;
            Ok((ctx, None))
        }
    }

    pub(super) async fn comments(
        &self,
        gh: &Installation,
        repo: &RepoName,
        number: u64,
    ) -> Result<Vec<ContextComment>, GitHubError> {
        if self.settings.context_comments == 0 {
            return Ok(Vec::new());
        }
        let comments = gh
            .issue_comments(repo, number, self.settings.context_comments)
            .await?;
        Ok(comments
            .into_iter()
            .filter(|c| !c.author_is_bot)
            .map(|c| ContextComment {
                author: c.author,
                body: strip_hidden(&c.body),
            })
            .collect())
    }
}

/// Where the runs' clones go under the repository cache's directory when the temporary
/// directory is on another filesystem (a name its mirrors never take: they are
/// `<owner>/<name>.git`, and an owner never starts with a dot).
pub(super) const RUNS_DIR: &str = ".runs";

/// Where a run's clone from the mirrors under `cache_root` goes: the temporary directory if
/// it is on their filesystem (a hard link costs nothing there), else `<cache_root>/.runs`
/// (created). `Err`: the cache's directory cannot be created.
fn clones_dir(cache_root: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(cache_root)?;
    let tmp = std::env::temp_dir();
    let device = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if device(&tmp).is_some() && device(&tmp) == device(cache_root) {
        return Ok(tmp);
    }
    let runs = cache_root.join(RUNS_DIR);
    std::fs::create_dir_all(&runs)?;
    Ok(runs)
}

/// Where a code run's change went.
pub(super) enum Delivered {
    Pull(String),
    Pushed { sha: String, branch: String },
    Nothing,
}

/// A push the server refused, in words a maintainer can act on.
fn push_failure(e: &crate::git::GitError, branch: &str) -> String {
    match e {
        crate::git::GitError::Rejected { reason } => format!(
            "GitHub refused the push to `{branch}`: {}",
            crate::git::explain_rejection(reason)
        ),
        crate::git::GitError::Conflict { paths } => format!(
            "The branch `{branch}` moved while kodx worked, and kodx's change conflicts with it in {}. Nothing was pushed; run the command again on the new head.",
            paths.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        ),
        other => format!("Pushing to `{branch}` failed: {other}"),
    }
}

/// Keeps the transcript in the database as records arrive.
async fn write_transcript(
    db: Db,
    run_id: String,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let mut seq = db.next_transcript_seq(&run_id).await.unwrap_or(0);
    while let Some(line) = rx.recv().await {
        if let Err(e) = db.append_transcript(&run_id, seq, &line).await {
            tracing::warn!("writing the transcript failed: {e}");
        }
        seq += 1;
    }
}

/// Times model calls for `/metrics`.
struct Timed {
    inner: Box<dyn Provider>,
    metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl Provider for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn complete(&self, request: &Request) -> Result<Response, ProviderError> {
        let started = Instant::now();
        let r = self.inner.complete(request).await;
        self.metrics.model_call(&request.model, started.elapsed());
        r
    }

    async fn count_tokens(&self, request: &Request) -> Option<u64> {
        self.inner.count_tokens(request).await
    }
}
