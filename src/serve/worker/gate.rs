//! Admission: whether a run may start — who asked and their permission, the repository's
//! `.github/kodx.yml`, and the installation's monthly budget. A refusal is one short
//! comment and a finished run.

use crate::comment;
use crate::db::{Run, RunStatus};
use crate::github::{Installation, Permission, Reaction, RepoName};
use crate::repo_config::{AskPermission, RepoConfig};
use crate::serve::job::JobKind;

use super::Workers;

/// A short word for the reason a run was refused, stored as its stop reason.
pub(in crate::serve) const NOT_PERMITTED: &str = "not_permitted";

pub(super) const INVALID_CONFIG: &str = "invalid_config";

/// Runs are capped at what is left of the monthly budget, so spend approaches it without
/// reaching it: with less than this left, the budget counts as spent.
pub(super) const MIN_RUN_BUDGET_USD: f64 = 0.01;

impl Workers {
    /// The permission check and `.github/kodx.yml`. On refusal the run is finished and the
    /// person told why; `Err(())` then.
    pub(super) async fn check_permission_and_config(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> Result<RepoConfig, ()> {
        let config_text = gh.file_on_default_branch(repo, RepoConfig::PATH).await;
        let (config, config_error) = match config_text {
            Ok(None) => (RepoConfig::default(), None),
            Ok(Some(text)) => match RepoConfig::parse(&text) {
                Ok(c) => (c, None),
                Err(e) => (RepoConfig::default(), Some(e.to_string())),
            },
            Err(e) => {
                tracing::warn!("reading {} failed: {e}", RepoConfig::PATH);
                self.refuse(gh, repo, run, "internal_error", &format!(
                    "kodx could not read `{}` from the default branch ({e}). Run the command again in a moment.",
                    RepoConfig::PATH
                ))
                .await;
                return Err(());
            }
        };
        let needed = match (run.kind(), config.ask_permission) {
            (JobKind::Ask, AskPermission::Read) => Permission::Read,
            (JobKind::Help, _) => Permission::Read,
            _ => Permission::Write,
        };
        let has = match gh.permission(repo, &run.request.author).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("permission check failed: {e}");
                self.refuse(gh, repo, run, "internal_error", &format!(
                    "kodx could not check @{}'s permission on this repository ({e}). Run the command again in a moment.",
                    run.request.author
                ))
                .await;
                return Err(());
            }
        };
        if has < needed {
            tracing::info!(permission = has.as_str(), "refused: not permitted");
            let body = not_permitted(&run.request.author, run.kind(), needed, has);
            let _ = gh
                .create_comment(repo, run.request.issue_number as u64, &body)
                .await;
            self.finish_quietly(run, RunStatus::Failed, NOT_PERMITTED)
                .await;
            return Err(());
        }
        if let Some(note) = self.budget_spent(run).await {
            tracing::info!("refused: monthly budget spent");
            self.refuse(gh, repo, run, "budget_exceeded", &note).await;
            return Err(());
        }
        if let Some(error) = config_error {
            tracing::info!("refused: invalid repository config");
            self.refuse(gh, repo, run, INVALID_CONFIG, &format!(
                "kodx cannot run because the repository's configuration is invalid:\n\n```\n{error}\n```\n\nFix `{}` on the default branch and run the command again.",
                RepoConfig::PATH
            ))
            .await;
            return Err(());
        }
        Ok(config)
    }

    /// What is left of the installation's monthly budget, if the server has one.
    pub(super) async fn budget_left(&self, run: &Run) -> Option<(f64, f64)> {
        let budget = self.settings.monthly_budget_usd?;
        let since = month_start_ms(crate::db::now_ms());
        let spent = match self
            .db
            .spend_since(run.request.installation_id, since)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("reading the month's spend failed: {e}");
                return Some((budget, 0.0));
            }
        };
        Some((budget, spent))
    }

    /// The refusal text when the installation's monthly budget is spent.
    pub(super) async fn budget_spent(&self, run: &Run) -> Option<String> {
        if !run.is_work() {
            return None;
        }
        let (budget, spent) = self.budget_left(run).await?;
        (budget - spent < MIN_RUN_BUDGET_USD).then(|| {
            format!(
                "kodx did not start: this installation's monthly budget of {} is spent ({} used since the 1st, UTC; runs need at least $0.01 of it left). Runs start again next month, or when the server's operator raises `monthly_budget_usd`.",
                crate::cost::format_usd(budget),
                crate::cost::format_usd(spent)
            )
        })
    }

    /// Answers with one comment, reacts `confused` and finishes the run as failed.
    pub(super) async fn refuse(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
        reason: &str,
        text: &str,
    ) {
        let body = format!(
            "{}\n\n<sub>kodx run <code>{}</code></sub>",
            comment::redact(text),
            run.id
        );
        let body = match run.status_comment_id {
            Some(id) => match gh.update_comment(repo, id as u64, &body).await {
                Ok(()) => None,
                Err(_) => Some(body),
            },
            None => Some(body),
        };
        if let Some(body) = body {
            let _ = gh
                .create_comment(repo, run.request.issue_number as u64, &body)
                .await;
        }
        self.react(gh, repo, run, Reaction::Confused).await;
        self.finish_quietly(run, RunStatus::Failed, reason).await;
    }
}

/// The one short comment a person without permission gets.
pub(in crate::serve) fn not_permitted(
    author: &str,
    kind: JobKind,
    needed: Permission,
    has: Permission,
) -> String {
    let who = match needed {
        Permission::Read => "people with read access to this repository",
        _ => "people with write, maintain or admin access to this repository",
    };
    let what = match kind {
        JobKind::Ask | JobKind::Code | JobKind::Cancel => format!("`/kodx {kind}`"),
        _ => "kodx".to_string(),
    };
    format!(
        "@{} {what} can only be run by {who}; your permission here is `{}`.",
        comment::redact(author),
        has.as_str()
    )
}

/// The first millisecond of the current month (UTC) for `now_ms`.
fn month_start_ms(now_ms: i64) -> i64 {
    use chrono::{DateTime, Datelike, NaiveTime};
    // Out of chrono's range (±262,000 years) only for a clock that is badly wrong.
    let Some(now) = DateTime::from_timestamp_millis(now_ms) else {
        return now_ms;
    };
    let first = now
        .date_naive()
        .with_day(1)
        .expect("every month has a first day");
    first.and_time(NaiveTime::MIN).and_utc().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_start() {
        // 2026-11-22T10:00:00Z → 2026-11-01T00:00:00Z
        assert_eq!(month_start_ms(1_795_341_600_000), 1_793_491_200_000);
        // 2024-03-01T00:00:00Z is its own month start; a leap February before it.
        assert_eq!(month_start_ms(1_709_251_200_000), 1_709_251_200_000);
        assert_eq!(month_start_ms(1_709_251_199_999), 1_706_745_600_000);
        assert_eq!(month_start_ms(0), 0);
    }
}
