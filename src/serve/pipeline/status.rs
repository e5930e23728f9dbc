//! A run's status comment ([`StatusComment`]): the one comment kodx posts for a run and edits
//! as it moves, with the reactions on the command; and the ways to reach it from a run that
//! holds no token (restarts, shutdown, a cancel from elsewhere).

use crate::agent::Progress;
use crate::db::Run;
use crate::github::{GitHubError, Installation, Reaction, ReactionTarget, RepoName};
use crate::serve::texts::status::{self as comment, Done, Phase};

use super::{Lease, Services};

pub(in crate::serve) async fn find_status_comment(
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
            c.author_is_bot
                && crate::serve::texts::markup::find_run_id(&c.body).as_deref()
                    == Some(run.id.as_str())
        })
        .map(|c| c.id)
}

/// The run's status comment as it stands (its id, if it has one), written with `gh`.
pub(in crate::serve) async fn status_comment(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
) -> StatusComment {
    let id = status_comment_id(svc, run).await;
    // The estimate line the acknowledgement stored (a run read before it was stored is
    // read again).
    let estimate = match (&run.estimate, run.is_work()) {
        (Some(line), _) => Some(line.clone()),
        (None, true) => match svc.db.get_run(&run.id).await {
            Ok(Some(r)) => r.estimate,
            _ => None,
        },
        (None, false) => None,
    };
    // Who steered it (`/kodx steer`), kept in every later edit.
    let steerers = match run.is_work() {
        true => svc.db.steerers(&run.id).await.unwrap_or_default(),
        false => Vec::new(),
    };
    let status = StatusComment::new(gh.clone(), repo.clone(), run, id)
        .linked(svc.run_link(&run.id))
        .estimated(estimate);
    for who in &steerers {
        status.steered_by(who);
    }
    status
}

pub(in crate::serve) async fn react(
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
    reaction: Reaction,
) {
    add_reaction(gh, repo, run.request.trigger.reaction_target(), reaction).await;
}

pub(in crate::serve) async fn status_comment_id(svc: &Services, run: &Run) -> Option<u64> {
    if let Some(id) = run.status_comment_id {
        return Some(id as u64);
    }
    match svc.db.get_run(&run.id).await {
        Ok(Some(r)) => r.status_comment_id.map(|id| id as u64),
        _ => None,
    }
}

/// The run's status comment with a token of its own, for the paths that hold none
/// (restarts, shutdown, the end of a run); `None` when GitHub cannot be asked.
async fn status_comment_alone(svc: &Services, run: &Run) -> Option<StatusComment> {
    match svc.github(run).await {
        Ok((gh, repo)) => Some(status_comment(svc, &gh, &repo, run).await),
        Err(e) => {
            tracing::warn!("GitHub is not reachable to edit the status comment: {e:#}");
            None
        }
    }
}

/// Replaces the status comment's header line with `note` (restarts, shutdown); only
/// while `lease` holds, for a run this process still holds.
pub(in crate::serve) async fn edit_status(
    svc: &Services,
    run: &Run,
    note: &str,
    lease: Option<&Lease>,
) {
    if let Some(mut status) = status_comment_alone(svc, run).await {
        if let Some(lease) = lease {
            status = status.under_lease(lease.clone());
        }
        status.edit(&Phase::Note(note.into())).await;
    }
}

/// The final status comment and the `rocket` / `confused` reaction.
pub(in crate::serve) async fn post_done(svc: &Services, run: &Run, done: &Done) {
    let mut done = done.clone();
    done.wall
        .get_or_insert_with(|| run.since_acknowledged(crate::db::now_ms()));
    match status_comment_alone(svc, run).await {
        Some(status) => status.finish(&done).await,
        None => tracing::error!("GitHub unreachable; the outcome of the run was not posted"),
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
    trigger: Option<ReactionTarget>,
    /// `None` until it is posted (creating it may have failed).
    id: Option<u64>,
    /// The run's hold on its lease, which `gh` asks before each write: no edit once another
    /// process took the run.
    lease: Option<Lease>,
    /// The run page's address, shown in the comment.
    link: Option<String>,
    /// The cost estimate line, shown until the run ends (set when it is acknowledged).
    estimate: Option<String>,
    /// Who steered the run (`/kodx steer`), shared by every clone: the steering adds to
    /// it as the run takes each steer, and every later edit shows it.
    steered: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
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
            lease: None,
            link: None,
            estimate: None,
            steered: Default::default(),
        }
    }

    /// Names `who` among those who steered the run (once), from the next edit on.
    pub fn steered_by(&self, who: &str) {
        let mut steered = self.steered.lock();
        if !steered.iter().any(|s| s == who) {
            steered.push(who.to_string());
        }
    }

    /// Its id, once posted.
    pub fn id(&self) -> Option<u64> {
        self.id
    }

    /// The comment found already posted (a restart, a continued run's).
    pub fn set_id(&mut self, id: u64) {
        self.id = Some(id);
    }

    pub fn gh(&self) -> &Installation {
        &self.gh
    }

    pub fn repo(&self) -> &RepoName {
        &self.repo
    }

    /// The same comment, written with a newer token (fenced as this one is).
    pub fn with_token(mut self, gh: Installation) -> StatusComment {
        self.gh = match &self.lease {
            Some(lease) => lease.guard(&gh),
            None => gh,
        };
        self
    }

    /// Links the run's page.
    pub fn linked(mut self, link: Option<String>) -> StatusComment {
        self.link = link;
        self
    }

    /// Shows the cost estimate line ([`crate::serve::texts::estimate_line`]) until the run
    /// ends.
    pub fn estimated(mut self, line: Option<String>) -> StatusComment {
        self.estimate = line;
        self
    }

    /// Written only while `lease` holds: its client asks the lease right before each edit,
    /// post and reaction.
    pub fn under_lease(mut self, lease: Lease) -> StatusComment {
        self.gh = lease.guard(&self.gh);
        self.lease = Some(lease);
        self
    }

    fn body(&self, phase: &Phase) -> String {
        let body = comment::render_linked(
            &self.run_id,
            &self.command,
            phase,
            self.link.as_deref(),
            self.estimate.as_deref(),
        );
        match crate::serve::texts::steer::steered_line(&self.steered.lock()) {
            Some(line) => crate::serve::texts::steer::with_line_above_footer(body, &line),
            None => body,
        }
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
        let body = self.body(&Phase::Done(Box::new(done.clone())));
        let posted = match self.id {
            Some(id) => self.gh.update_comment(&self.repo, id, &body).await,
            None => self
                .gh
                .create_comment(&self.repo, self.issue, &body)
                .await
                .map(|_| ()),
        };
        match posted {
            Ok(()) => {}
            // Another process holds the run now: its outcome is that process's to post.
            Err(GitHubError::Withheld { .. }) => return,
            Err(e) => tracing::error!("posting the outcome failed: {e}"),
        }
        let reaction = if done.succeeded() {
            Reaction::Rocket
        } else {
            Reaction::Confused
        };
        add_reaction(&self.gh, &self.repo, self.trigger, reaction).await;
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
async fn add_reaction(
    gh: &Installation,
    repo: &RepoName,
    target: Option<ReactionTarget>,
    reaction: Reaction,
) {
    // A review's body and a CI event have nothing to react on.
    let Some(target) = target else { return };
    if let Err(e) = gh.react(repo, target, reaction).await {
        tracing::warn!("reacting {} failed: {e}", reaction.as_str());
    }
}

/// The command as the status comment quotes it.
pub(in crate::serve) fn command_line(run: &Run) -> String {
    run.request.job.command_line()
}

/// Notes the run's phase (for `/runs` and recovery) while its lease holds it (else
/// the run is lost here); a failure is only logged.
pub(in crate::serve) async fn set_phase(svc: &Services, run: &Run, lease: &Lease, phase: &str) {
    match svc.db.set_phase(&run.id, lease.lease(), phase).await {
        Ok(true) => {}
        Ok(false) => lease.lose(),
        Err(e) => tracing::warn!("recording the run's phase {phase:?} failed: {e}"),
    }
}

/// Shows that the run is setting up, before its clone.
pub(in crate::serve) async fn setting_up(
    svc: &Services,
    run: &Run,
    lease: &Lease,
    status: &StatusComment,
) {
    status.edit(&Phase::SettingUp).await;
    set_phase(svc, run, lease, "setting_up").await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use parking_lot::Mutex;
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
                    shown.lock().push((p.step, start.elapsed().as_secs()));
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
        assert_eq!(*shown.lock(), vec![(1, 0)]);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(*shown.lock(), vec![(1, 0), (4, 10)]);
        // The same step again is not shown twice.
        tx.send(step(4)).unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(shown.lock().len(), 2);
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
        assert_eq!(*shown.lock(), vec![(1, 0)]);
    }
}
