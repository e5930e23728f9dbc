//! The status comment of a run: acknowledged (`eyes`, the comment), found again after a
//! restart, edited as the run moves, finished with the outcome and a reaction.

use std::sync::Arc;
use std::time::Instant;

use crate::agent::Progress;
use crate::comment::{self, Done, Phase};
use crate::db::Run;
use crate::github::{GitHubError, Installation, Reaction, ReactionTarget, RepoName};
use crate::serve::job::Job;

use super::ending::RunLog;
use super::gate::{Admission, Refusal};
use super::{RunFailure, Workers};
use crate::serve::handlers::continue_run::CannotContinue;

/// What acknowledging a run came to.
#[derive(Clone)]
pub(in crate::serve) enum Acked {
    /// Admitted; `eyes` and the status comment (its id, unless creating it failed) are up.
    Admitted(Box<Admission>, Option<u64>),
    /// Refused, and finished.
    Refused,
    /// GitHub could not be asked; nothing was posted.
    Unreachable,
    /// Another process acknowledges it (a shared queue).
    Elsewhere,
    /// Another process acknowledged it: its status comment (the admission is read again).
    Posted(u64),
}

/// How long a run claimed here waits for the process acknowledging it to post its status
/// comment before taking that process to be gone.
const ACK_ELSEWHERE_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

impl Workers {
    /// Acknowledges the run once, whoever asks first (the task acknowledging it while it
    /// waits, or the worker that claimed it); the other waits for the same outcome. `None`
    /// for a run an earlier process acknowledged (it has a status comment).
    pub(super) async fn ensure_acknowledged(&self, run: &Run) -> Option<Acked> {
        let cell = {
            let mut acks = self.acks.lock().expect("lock");
            match acks.get(&run.id) {
                Some(cell) => cell.clone(),
                None if run.status_comment_id.is_some() => return None,
                None => acks.entry(run.id.clone()).or_default().clone(),
            }
        };
        let acked = cell.get_or_init(|| self.acknowledge(run)).await.clone();
        // Only an admitted run with its status comment waits here for its slot; the others
        // are over, or are acknowledged again on the next pass.
        if !matches!(acked, Acked::Admitted(_, Some(_))) {
            self.forget_ack(&run.id);
        }
        Some(acked)
    }

    /// Drops what acknowledging the run left for it (it started, or it is over).
    pub(in crate::serve) fn forget_ack(&self, run_id: &str) {
        self.acks.lock().expect("lock").remove(run_id);
    }

    /// Admits the run (who asked, the repository's config, the budget), reacts `eyes` and
    /// creates the status comment; or refuses it (and finishes it).
    pub(in crate::serve) async fn acknowledge(&self, run: &Run) -> Acked {
        // On a shared queue, once: the first process to take it.
        if self.db.is_shared() {
            match self
                .db
                .take_acknowledgement(&run.id, &self.worker_id, false)
                .await
            {
                Ok(true) => {}
                Ok(false) => return Acked::Elsewhere,
                Err(e) => {
                    tracing::warn!("taking the run's acknowledgement failed: {e}");
                    return Acked::Unreachable;
                }
            }
        }
        self.acknowledge_now(run).await
    }

    /// A run claimed here that another process is acknowledging: its status comment, once
    /// that process posted it; `None` when that process refused the run (it is over). A
    /// process that does not finish within a while is taken to be gone, and the run is
    /// acknowledged here.
    pub(in crate::serve) async fn acknowledged_elsewhere(&self, run: &Run) -> Acked {
        let deadline = Instant::now() + ACK_ELSEWHERE_WAIT;
        while Instant::now() < deadline {
            match self.db.get_run(&run.id).await {
                Ok(Some(r)) if r.status.is_final() => return Acked::Refused,
                Ok(Some(r)) => {
                    if let Some(id) = r.status_comment_id {
                        return Acked::Posted(id as u64);
                    }
                }
                Ok(None) => return Acked::Refused,
                Err(e) => tracing::warn!("reading the run failed: {e}"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        tracing::warn!("the process acknowledging this run did not finish; acknowledging it here");
        if let Err(e) = self
            .db
            .take_acknowledgement(&run.id, &self.worker_id, true)
            .await
        {
            tracing::warn!("taking the run's acknowledgement failed: {e}");
        }
        self.acknowledge_now(run).await
    }

    async fn acknowledge_now(&self, run: &Run) -> Acked {
        let gh = match self.installation(run).await {
            Ok(gh) => gh,
            Err(e) => {
                tracing::warn!("GitHub is not reachable to acknowledge the run: {e}");
                return Acked::Unreachable;
            }
        };
        let Ok(repo) = RepoName::parse(&run.request.repo) else {
            let e = anyhow::anyhow!("the repository name {:?} is not valid", run.request.repo);
            self.conclude(
                run,
                Err(RunFailure::Internal(e)),
                &RunLog::default(),
                Instant::now(),
            )
            .await;
            return Acked::Refused;
        };
        // Who may: checked before anything is posted, so a refusal is one short comment.
        let admission = match self.admit(&gh, &repo, run).await {
            Ok(a) => a,
            Err(refusal) => {
                self.conclude(run, Err(refusal.into()), &RunLog::default(), Instant::now())
                    .await;
                return Acked::Refused;
            }
        };
        // `/kodx continue` while the run it would continue has not ended: refused at once
        // (what to continue is known only when that run stops).
        if matches!(run.request.job, Job::Continue { .. }) {
            match self.db.unfinished_code_run_before(&run.id).await {
                Ok(Some(id)) => {
                    let refusal = Refusal::CannotContinue(CannotContinue::StillRunning { id });
                    self.conclude(run, Err(refusal.into()), &RunLog::default(), Instant::now())
                        .await;
                    return Acked::Refused;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("looking for an unfinished run on the issue failed: {e}"),
            }
        }
        self.react(&gh, &repo, run, Reaction::Eyes).await;
        // `/kodx continue` goes on in the status comment of the run it continues.
        if matches!(run.request.job, Job::Continue { .. }) {
            if let Some(id) = self.continued_status_comment(run).await {
                StatusComment::new(gh, repo, run, Some(id))
                    .linked(self.run_link(&run.id))
                    .edit(&Phase::Queued)
                    .await;
                if let Err(e) = self.db.set_status_comment(&run.id, id as i64).await {
                    tracing::error!("storing the status comment id failed: {e}");
                }
                return Acked::Admitted(Box::new(admission), Some(id));
            }
        }
        // A comment this run posted before a crash is found by its hidden metadata.
        if let Some(existing) = self.find_status_comment(&gh, &repo, run).await {
            if let Err(e) = self.db.set_status_comment(&run.id, existing as i64).await {
                tracing::error!("storing the status comment id failed: {e}");
            }
            return Acked::Admitted(Box::new(admission), Some(existing));
        }
        let mut status = StatusComment::new(gh, repo, run, None).linked(self.run_link(&run.id));
        match status.create(&Phase::Queued).await {
            Ok(id) => {
                if let Err(e) = self.db.set_status_comment(&run.id, id as i64).await {
                    tracing::error!("storing the status comment id failed: {e}");
                }
                Acked::Admitted(Box::new(admission), Some(id))
            }
            Err(e) => {
                tracing::warn!("creating the status comment failed: {e}");
                Acked::Admitted(Box::new(admission), None)
            }
        }
    }

    pub(in crate::serve) async fn find_status_comment(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> Option<u64> {
        // Only worth a listing when this run may have posted before (a restart, or a
        // webhook handled a while ago).
        let age = crate::db::now_ms() - run.created_at;
        if !(run.recovered || run.attempts > 0 || age > 30_000) {
            return None;
        }
        let comments = gh
            .issue_comments(repo, run.request.issue_number as u64, 100)
            .await
            .ok()?;
        comments
            .iter()
            .rev()
            .find(|c| {
                c.author_is_bot && comment::find_run_id(&c.body).as_deref() == Some(run.id.as_str())
            })
            .map(|c| c.id)
    }

    /// The run's status comment as it stands (its id, if it has one), written with `gh`.
    pub(in crate::serve) async fn status_comment(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> StatusComment {
        let id = self.status_comment_id(run).await;
        StatusComment::new(gh.clone(), repo.clone(), run, id).linked(self.run_link(&run.id))
    }

    pub(in crate::serve) async fn react(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
        reaction: Reaction,
    ) {
        react(gh, repo, run.request.trigger.reaction_target(), reaction).await;
    }

    /// Edits the status comment as the run moves, at most once per `status_interval`. Ends
    /// as soon as the agent does (its sender is dropped), also while waiting out the
    /// interval: a finished run never waits for the next edit.
    pub(in crate::serve) async fn follow_progress(
        self: Arc<Self>,
        status: StatusComment,
        rx: tokio::sync::watch::Receiver<Option<Progress>>,
    ) {
        status.follow(self.settings.status_interval(), rx).await;
    }

    pub(in crate::serve) async fn status_comment_id(&self, run: &Run) -> Option<u64> {
        if let Some(id) = run.status_comment_id {
            return Some(id as u64);
        }
        match self.db.get_run(&run.id).await {
            Ok(Some(r)) => r.status_comment_id.map(|id| id as u64),
            _ => None,
        }
    }

    /// The run's status comment with a token of its own, for the paths that hold none
    /// (restarts, shutdown, the end of a run); `None` when GitHub cannot be asked.
    async fn status_comment_alone(&self, run: &Run) -> Option<StatusComment> {
        let gh = match self.installation(run).await {
            Ok(gh) => gh,
            Err(e) => {
                tracing::warn!("GitHub is not reachable to edit the status comment: {e}");
                return None;
            }
        };
        let repo = RepoName::parse(&run.request.repo).ok()?;
        Some(self.status_comment(&gh, &repo, run).await)
    }

    /// Replaces the status comment's header line with `note` (restarts, shutdown).
    pub(in crate::serve) async fn edit_status(&self, run: &Run, note: &str) {
        if let Some(status) = self.status_comment_alone(run).await {
            status.edit(&Phase::Note(note.into())).await;
        }
    }

    /// The final status comment and the `rocket` / `confused` reaction.
    pub(in crate::serve) async fn post_done(&self, run: &Run, done: &Done) {
        match self.status_comment_alone(run).await {
            Some(status) => status.finish(done).await,
            None => tracing::error!("GitHub unreachable; the outcome of the run was not posted"),
        }
    }
}

/// A run's status comment: the one comment kodx posts for a run and edits as it moves —
/// its phase while it works, a note when kodx restarts under it, the outcome at the end —
/// with the reactions on the command that started it.
#[derive(Clone)]
pub(in crate::serve) struct StatusComment {
    gh: Installation,
    repo: RepoName,
    run_id: String,
    issue: u64,
    command: String,
    trigger: ReactionTarget,
    /// `None` until it is posted (creating it may have failed).
    id: Option<u64>,
    /// The run's hold on its lease: no edit once another process took the run.
    fence: Option<super::Fence>,
    /// The run page's address, shown in the comment.
    link: Option<String>,
}

impl StatusComment {
    pub fn new(gh: Installation, repo: RepoName, run: &Run, id: Option<u64>) -> StatusComment {
        StatusComment {
            gh,
            repo,
            run_id: run.id.clone(),
            issue: run.request.issue_number as u64,
            command: command_line(run),
            trigger: run.request.trigger.reaction_target(),
            id,
            fence: None,
            link: None,
        }
    }

    /// Links the run's page.
    pub fn linked(mut self, link: Option<String>) -> StatusComment {
        self.link = link;
        self
    }

    /// Edited only while `fence` holds.
    pub fn fenced(mut self, fence: super::Fence) -> StatusComment {
        self.fence = Some(fence);
        self
    }

    /// Whether this process may still act for the run.
    async fn may_act(&self) -> bool {
        match &self.fence {
            Some(fence) => fence.holds().await,
            None => true,
        }
    }

    fn body(&self, phase: &Phase) -> String {
        comment::render_linked(&self.run_id, &self.command, phase, self.link.as_deref())
    }

    /// Posts it, showing `phase`; returns its id.
    pub async fn create(&mut self, phase: &Phase) -> Result<u64, GitHubError> {
        let c = self
            .gh
            .create_comment(&self.repo, self.issue, &self.body(phase))
            .await?;
        self.id = Some(c.id);
        Ok(c.id)
    }

    /// Shows `phase`; nothing when it was never posted. A failed edit is logged: the run
    /// goes on.
    pub async fn edit(&self, phase: &Phase) {
        let Some(id) = self.id else { return };
        if !self.may_act().await {
            return;
        }
        if let Err(e) = self
            .gh
            .update_comment(&self.repo, id, &self.body(phase))
            .await
        {
            tracing::warn!("editing the status comment failed: {e}");
        }
    }

    /// Shows the outcome (posting the comment if it never was) and reacts `rocket` or
    /// `confused` on the command.
    pub async fn finish(&self, done: &Done) {
        if !self.may_act().await {
            return;
        }
        let body = self.body(&Phase::Done(Box::new(done.clone())));
        let posted = match self.id {
            Some(id) => self.gh.update_comment(&self.repo, id, &body).await,
            None => self
                .gh
                .create_comment(&self.repo, self.issue, &body)
                .await
                .map(|_| ()),
        };
        if let Err(e) = posted {
            tracing::error!("posting the outcome failed: {e}");
        }
        let reaction = if done.succeeded() {
            Reaction::Rocket
        } else {
            Reaction::Confused
        };
        react(&self.gh, &self.repo, self.trigger, reaction).await;
    }

    /// Shows the agent's progress at most once per `interval`, until the agent ends.
    pub async fn follow(
        &self,
        interval: std::time::Duration,
        rx: tokio::sync::watch::Receiver<Option<Progress>>,
    ) {
        throttled(interval, rx, |p| async move {
            self.edit(&Phase::Working {
                step: p.step,
                spent: p.spent,
                limit: p.limit,
            })
            .await
        })
        .await
    }
}

/// Calls `show` with the newest progress of a step not shown yet, at most once per
/// `interval`, until the agent ends (its sender is dropped) — also while waiting out the
/// interval: a finished run never waits for the next edit.
async fn throttled<F, Fut>(
    interval: std::time::Duration,
    mut rx: tokio::sync::watch::Receiver<Option<Progress>>,
    mut show: F,
) where
    F: FnMut(Progress) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut last_shown: Option<tokio::time::Instant> = None;
    let mut shown_step = 0;
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        if let Some(at) = last_shown {
            // Newer progress only replaces what the edit will show; the end of the agent
            // ends the wait.
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(at + interval) => break,
                    changed = rx.changed() => if changed.is_err() { return },
                }
            }
        }
        let p = rx.borrow_and_update().clone();
        let Some(p) = p else { continue };
        if p.step == shown_step {
            continue;
        }
        shown_step = p.step;
        show(p).await;
        last_shown = Some(tokio::time::Instant::now());
    }
}

/// Reacts on the command that started a run; a failure is logged.
async fn react(gh: &Installation, repo: &RepoName, target: ReactionTarget, reaction: Reaction) {
    if let Err(e) = gh.react(repo, target, reaction).await {
        tracing::warn!("reacting {} failed: {e}", reaction.as_str());
    }
}

/// The command as the status comment quotes it.
pub(super) fn command_line(run: &Run) -> String {
    run.request.job.command_line()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    fn step(step: u32) -> Option<Progress> {
        Some(Progress {
            step,
            action: "thinking".into(),
            spent: 0.01 * step as f64,
            limit: 1.0,
            elapsed: Duration::ZERO,
        })
    }

    /// The steps shown, each with the seconds since the start.
    type Shown = Arc<Mutex<Vec<(u32, u64)>>>;

    /// Runs `throttled` with a 10 s interval; returns what it shows and the task's handle.
    fn follow_for_test(
        rx: tokio::sync::watch::Receiver<Option<Progress>>,
    ) -> (Shown, tokio::task::JoinHandle<()>) {
        let shown = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let task = {
            let shown = shown.clone();
            tokio::spawn(throttled(Duration::from_secs(10), rx, move |p| {
                let shown = shown.clone();
                async move {
                    shown
                        .lock()
                        .unwrap()
                        .push((p.step, start.elapsed().as_secs()));
                }
            }))
        };
        (shown, task)
    }

    #[tokio::test(start_paused = true)]
    async fn progress_is_shown_at_most_once_per_interval_and_newest_wins() {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let (shown, task) = follow_for_test(rx);
        tx.send(step(1)).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Steps 2 to 4 arrive within the interval: only the newest is shown, when it ends.
        for s in 2..=4 {
            tx.send(step(s)).unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        assert_eq!(*shown.lock().unwrap(), vec![(1, 0)]);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(*shown.lock().unwrap(), vec![(1, 0), (4, 10)]);
        // The same step again is not shown twice.
        tx.send(step(4)).unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(shown.lock().unwrap().len(), 2);
        drop(tx);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_agent_ends_the_wait_at_once() {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let (shown, task) = follow_for_test(rx);
        tx.send(step(1)).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        tx.send(step(2)).unwrap();
        tokio::task::yield_now().await;
        let before = Instant::now();
        drop(tx);
        task.await.unwrap();
        // Waiting out the interval would have taken 9 more (paused) seconds.
        assert_eq!(before.elapsed(), Duration::ZERO);
        assert_eq!(*shown.lock().unwrap(), vec![(1, 0)]);
    }
}
