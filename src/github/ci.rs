//! A commit's CI as a repair run reads it (SPEC §11): whether every check has finished,
//! and, when some failed, what they said: output, annotations and, for GitHub Actions jobs,
//! the job's log cut to the parts around its errors ([`crate::ci_log`]). Every read is
//! bounded (pages, checks detailed, bytes of log read and kept), and every call goes through
//! the installation's octocrab client under its [`RequestPolicy`](super::RequestPolicy).
//!
//! Job logs: `GET /repos/{o}/{r}/actions/jobs/{id}/logs` answers `302` to a short-lived
//! signed URL on another host. Octocrab follows it (its `follow-redirect` feature is
//! tower-http's `FollowRedirect` with the `Standard` policy, whose `FilterCredentials`
//! drops `Authorization`, `Cookie` and `Proxy-Authorization` on a redirect to another
//! origin — scheme, host or port), and octocrab's own auth layer adds the token only to
//! requests for the API's host. So the installation token never reaches the log's host;
//! the integration tests check it against a log host that refuses any `Authorization`.
//! The log's body is streamed through [`LogReader`], never held.

use std::time::{Duration, Instant};

use axum::http; // the `http` crate, which octocrab's raw request API speaks
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use sha2::Digest;

use super::error::GitHubError;
use super::policy::Raw;
use super::transport::JSON;
use super::types::RepoName;
use super::util::encode_segment;
use super::{wire, Installation};
use crate::ci_log::{
    cut_middle, cut_str, cut_with_mark, fence, normalize_error_line, LogExcerpt, LogReader,
};

/// Items per page of the list calls (GitHub's maximum).
const PER_PAGE: u32 = 100;
/// Pages read of a commit's check suites and of its check runs: 1,000 of each.
const MAX_PAGES: u32 = 10;
/// Annotations read of one check run (its first page).
const ANNOTATIONS_PER_PAGE: u32 = 50;
const MAX_ANNOTATION: usize = 500;
const MAX_TITLE: usize = 300;
/// A failed check's output summary and text, together.
const MAX_SUMMARY: usize = 4096;
/// The most of a non-2xx answer read while a log is opened (for GitHub's message).
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Reading one log stops after this long (the excerpt then says the log goes on).
const LOG_DEADLINE: Duration = Duration::from_secs(180);
/// The slug of GitHub Actions' App: its check run ids are job ids.
const ACTIONS: &str = "github-actions";
/// The conclusions that are failures (SPEC §11); every other completed one passed.
pub const FAILING: [&str; 3] = ["failure", "timed_out", "startup_failure"];

/// How much of a commit's failures is read.
#[derive(Debug, Clone, PartialEq)]
pub struct CiLimits {
    /// Failed check runs whose annotations and log are read; the others are named only.
    pub max_detailed: usize,
    /// Bytes of one job log read at most; past them reading stops and the excerpt says so.
    pub max_log_bytes_read: u64,
    /// Bytes of one log's excerpt.
    pub max_log_excerpt: usize,
}

impl Default for CiLimits {
    fn default() -> Self {
        CiLimits {
            max_detailed: 8,
            max_log_bytes_read: 256 << 20,
            max_log_excerpt: 12 * 1024,
        }
    }
}

/// A commit's checks, other than kodx's own.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CiState {
    /// Checks not finished yet, by name (check runs, check suites as `check suite of
    /// <app>`, commit status contexts). When any is pending, `failed` names the failures
    /// known so far without their details.
    pub pending: Vec<String>,
    /// Failed check runs (conclusion in [`FAILING`]) and commit statuses (`failure`,
    /// `error`), in GitHub's order, check runs first.
    pub failed: Vec<FailedCheck>,
    /// Checks that finished without failing (success, neutral, skipped, cancelled, …).
    pub passed: usize,
    /// Checks not read at all: past the page bounds.
    pub left_out: usize,
}

/// One failed check, as the repair run is told it.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedCheck {
    pub name: String,
    pub conclusion: String,
    /// The App's slug (`github-actions`), or `commit status`.
    pub app: String,
    /// The GitHub Actions job it is (its check run id), for a re-run.
    pub job_id: Option<u64>,
    pub details_url: Option<String>,
    pub title: Option<String>,
    /// The output's summary and text (cut), or a status's description.
    pub summary: String,
    /// Failure and warning annotations, one line each (`path:line: level: title: message`).
    pub annotations: Vec<String>,
    /// The job's log (GitHub Actions jobs), or a line saying why it could not be read.
    pub log: Option<LogExcerpt>,
    /// The first error line: of the log, else the first failure annotation, else the title,
    /// else the summary's first line, else the conclusion. Empty when not detailed.
    pub first_error: String,
}

// -------------------------------------------------------------------------------------
// GitHub's answers (`@octokit/openapi`: check-suite, check-run, check-annotation,
// combined-commit-status), the fields read.
// -------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct SuitePage {
    total_count: u64,
    check_suites: Vec<Suite>,
}

#[derive(Deserialize)]
struct Suite {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    app: Option<App>,
    #[serde(default)]
    latest_check_runs_count: u64,
}

/// `nullable-integration`: `slug` is optional there.
#[derive(Deserialize)]
struct App {
    #[serde(default)]
    slug: Option<String>,
}

#[derive(Deserialize)]
struct RunPage {
    total_count: u64,
    check_runs: Vec<Run>,
}

#[derive(Deserialize)]
struct Run {
    id: u64,
    name: String,
    status: String,
    #[serde(default)]
    conclusion: Option<String>,
    #[serde(default)]
    details_url: Option<String>,
    #[serde(default)]
    html_url: Option<String>,
    #[serde(default)]
    output: Option<Output>,
    #[serde(default)]
    app: Option<App>,
}

#[derive(Deserialize)]
struct Output {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    annotations_count: u64,
}

#[derive(Deserialize)]
struct Annotation {
    path: String,
    start_line: u64,
    #[serde(default)]
    annotation_level: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct Combined {
    total_count: u64,
    statuses: Vec<Status>,
}

#[derive(Deserialize)]
struct Status {
    state: String,
    context: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    target_url: Option<String>,
}

/// A failed check run as listed, before its details are read.
struct FailedRun {
    check: FailedCheck,
    id: u64,
    annotations: u64,
}

fn slug_of(app: Option<&App>) -> String {
    app.and_then(|a| a.slug.clone()).unwrap_or_default()
}

impl Installation {
    /// The checks of commit `sha` other than those of kodx's own App (`own_app`, its slug):
    /// its check suites (a suite of another App that is not completed and has check runs is
    /// pending; Apps that never report leave a `queued` suite with no runs, which does not
    /// count), its latest check runs (all pages up to a bound; more are `left_out`) and its
    /// commit statuses. When anything is pending it returns at once; otherwise the first
    /// `limits.max_detailed` failed check runs get their annotations and, for GitHub
    /// Actions jobs, their log's excerpt. A detail that cannot be read says so in its place
    /// rather than failing the call; the list calls' errors are returned.
    pub async fn ci_state(
        &self,
        repo: &RepoName,
        sha: &str,
        own_app: &str,
        limits: &CiLimits,
    ) -> Result<CiState, GitHubError> {
        let mut state = CiState::default();
        self.pending_suites(repo, sha, own_app, &mut state).await?;
        let runs = self.check_runs(repo, sha, own_app, &mut state).await?;
        let statuses = self.commit_statuses(repo, sha, &mut state).await?;
        if !state.pending.is_empty() {
            state.failed = runs.into_iter().map(|r| r.check).collect();
            state.failed.extend(statuses);
            return Ok(state);
        }
        for (i, run) in runs.into_iter().enumerate() {
            let check = if i < limits.max_detailed {
                self.detail(repo, run, limits).await
            } else {
                run.check
            };
            state.failed.push(check);
        }
        state.failed.extend(statuses);
        Ok(state)
    }

    async fn pending_suites(
        &self,
        repo: &RepoName,
        sha: &str,
        own_app: &str,
        state: &mut CiState,
    ) -> Result<(), GitHubError> {
        let path = format!(
            "{}/commits/{}/check-suites",
            repo_path(repo),
            encode_segment(sha)
        );
        let mut seen = 0;
        for page in 1..=MAX_PAGES {
            let (answer, next): (SuitePage, bool) = self.list_page(&path, "", page).await?;
            seen += answer.check_suites.len() as u64;
            for suite in answer.check_suites {
                let app = slug_of(suite.app.as_ref());
                let finished = suite.status.as_deref().is_none_or(|s| s == "completed");
                if app.eq_ignore_ascii_case(own_app) || finished {
                    continue;
                }
                if suite.latest_check_runs_count > 0 {
                    state.pending.push(format!("check suite of {app}"));
                }
            }
            if !next {
                return Ok(());
            }
            if page == MAX_PAGES {
                state.left_out += answer.total_count.saturating_sub(seen) as usize;
            }
        }
        Ok(())
    }

    /// The commit's latest check runs, other Apps' only: pending ones and passes are counted
    /// into `state`, failures returned in order.
    async fn check_runs(
        &self,
        repo: &RepoName,
        sha: &str,
        own_app: &str,
        state: &mut CiState,
    ) -> Result<Vec<FailedRun>, GitHubError> {
        let path = format!(
            "{}/commits/{}/check-runs",
            repo_path(repo),
            encode_segment(sha)
        );
        let mut failed = Vec::new();
        let mut seen = 0;
        for page in 1..=MAX_PAGES {
            let (answer, next): (RunPage, bool) =
                self.list_page(&path, "filter=latest&", page).await?;
            seen += answer.check_runs.len() as u64;
            for run in answer.check_runs {
                let app = slug_of(run.app.as_ref());
                if app.eq_ignore_ascii_case(own_app) {
                    continue;
                }
                let conclusion = run.conclusion.clone().unwrap_or_default();
                if run.status != "completed" {
                    state.pending.push(run.name);
                } else if FAILING.contains(&conclusion.as_str()) {
                    failed.push(failed_run(run, app, conclusion));
                } else {
                    state.passed += 1;
                }
            }
            if !next {
                break;
            }
            if page == MAX_PAGES {
                state.left_out += answer.total_count.saturating_sub(seen) as usize;
            }
        }
        Ok(failed)
    }

    /// The commit's combined status: pending contexts go to `state`, failed ones are
    /// returned (the first 100 contexts; more are left out).
    async fn commit_statuses(
        &self,
        repo: &RepoName,
        sha: &str,
        state: &mut CiState,
    ) -> Result<Vec<FailedCheck>, GitHubError> {
        let path = format!("{}/commits/{}/status", repo_path(repo), encode_segment(sha));
        let query = format!("per_page={PER_PAGE}");
        let what = format!("GET {path}");
        let raw = self.get_raw(&path, Some(&query), &what).await?;
        let combined: Combined = wire::decode(&raw.json(&what)?, &what)?;
        state.left_out += combined
            .total_count
            .saturating_sub(combined.statuses.len() as u64) as usize;
        let mut failed = Vec::new();
        for status in combined.statuses {
            match status.state.as_str() {
                "pending" => state.pending.push(status.context),
                "failure" | "error" => failed.push(failed_status(status)),
                _ => state.passed += 1,
            }
        }
        Ok(failed)
    }

    /// A failed check run with its annotations and (Actions jobs) log.
    async fn detail(&self, repo: &RepoName, run: FailedRun, limits: &CiLimits) -> FailedCheck {
        let mut check = run.check;
        if run.annotations > 0 {
            check.annotations = match self.annotations(repo, run.id).await {
                Ok(list) => list,
                Err(e) => vec![format!("[annotations could not be read: {e}]")],
            };
        }
        let mut log_error = None;
        if check.app == ACTIONS {
            check.log = Some(match self.job_log(repo, run.id, limits).await {
                Ok((excerpt, first)) => {
                    log_error = first;
                    excerpt
                }
                Err(e) => LogExcerpt {
                    text: format!("[the job's log could not be read: {e}]"),
                    lines: 0,
                    bytes: 0,
                    cut_at_read_limit: false,
                },
            });
        }
        check.first_error = log_error.unwrap_or_else(|| fallback_first_error(&check));
        check
    }

    /// The first page of a check run's annotations, failures and warnings, one line each.
    async fn annotations(&self, repo: &RepoName, id: u64) -> Result<Vec<String>, GitHubError> {
        let path = format!("{}/check-runs/{id}/annotations", repo_path(repo));
        let what = format!("GET {path}");
        let query = format!("per_page={ANNOTATIONS_PER_PAGE}");
        let raw = self.get_raw(&path, Some(&query), &what).await?;
        let list: Vec<Annotation> = wire::decode(&raw.json(&what)?, &what)?;
        Ok(list
            .into_iter()
            .filter(|a| matches!(a.annotation_level.as_deref(), Some("failure" | "warning")))
            .map(|a| annotation_line(&a))
            .collect())
    }

    /// A GitHub Actions job's log (the check run id is the job id), streamed through a
    /// [`LogReader`] within the limits and [`LOG_DEADLINE`].
    async fn job_log(
        &self,
        repo: &RepoName,
        job_id: u64,
        limits: &CiLimits,
    ) -> Result<(LogExcerpt, Option<String>), GitHubError> {
        let path = format!("{}/actions/jobs/{job_id}/logs", repo_path(repo));
        let what = format!("GET {path}");
        let mut body = self.open_stream(&path, &what).await?;
        let (_, policy, _) = self.graphql_channel();
        let mut reader = LogReader::new(limits.max_log_bytes_read, limits.max_log_excerpt);
        let deadline = Instant::now() + LOG_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left.min(policy.request_timeout);
            let frame = match tokio::time::timeout(wait, body.frame()).await {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => break,
                Ok(Some(Err(e))) if reader.bytes_read() == 0 => {
                    return Err(GitHubError::Network {
                        what,
                        message: super::error::one_line(&e.to_string()),
                    })
                }
                Ok(Some(Err(e))) => {
                    tracing::warn!(%what, error = %e, "the job log broke off; keeping what was read");
                    reader.stop_early();
                    break;
                }
                Err(_) => {
                    tracing::warn!(%what, read = reader.bytes_read(), "the job log is too slow; keeping what was read");
                    reader.stop_early();
                    break;
                }
            };
            if let Ok(data) = frame.into_data() {
                if !reader.feed(&data) {
                    break;
                }
            }
        }
        Ok(reader.finish())
    }

    /// A GET whose 2xx body is returned unread (after any redirect), under the policy: the
    /// policy sees the status and headers, and reads at most [`MAX_ERROR_BODY`] of an
    /// error's body for GitHub's message.
    async fn open_stream(
        &self,
        path: &str,
        what: &str,
    ) -> Result<http_body_util::combinators::BoxBody<Bytes, octocrab::Error>, GitHubError> {
        let (octo, policy, _) = self.graphql_channel();
        let slot = parking_lot::Mutex::new(None);
        policy
            .run(what, || async {
                let builder = http::Request::builder()
                    .method(http::Method::GET)
                    .uri(path)
                    .header(http::header::ACCEPT, JSON);
                let request = octo
                    .build_request(builder, None::<&Value>)
                    .map_err(|e| format!("building the request: {e}"))?;
                let response = octo.execute(request).await.map_err(|e| e.to_string())?;
                let status = response.status().as_u16();
                let headers = response.headers().clone();
                let mut body = response.into_body();
                if (200..300).contains(&status) {
                    *slot.lock() = Some(body);
                    return Ok(Raw {
                        status,
                        headers,
                        body: Bytes::new(),
                        cut: false,
                    });
                }
                let mut head = Vec::new();
                while let Some(Ok(frame)) = body.frame().await {
                    if let Ok(data) = frame.into_data() {
                        head.extend_from_slice(&data);
                    }
                    if head.len() >= MAX_ERROR_BODY {
                        break;
                    }
                }
                head.truncate(MAX_ERROR_BODY);
                Ok(Raw {
                    status,
                    headers,
                    body: head.into(),
                    cut: false,
                })
            })
            .await?;
        let body = slot.lock().take();
        body.ok_or_else(|| GitHubError::decode(what, "no body"))
    }

    /// One page of a list answered as an object (`{total_count, check_runs: […]}`), and
    /// whether the answer's `Link` names a next page. `query` ends in `&` when not empty.
    async fn list_page<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &str,
        page: u32,
    ) -> Result<(T, bool), GitHubError> {
        let what = format!("GET {path}");
        let query = format!("{query}per_page={PER_PAGE}&page={page}");
        let raw = self.get_raw(path, Some(&query), &what).await?;
        let next = raw.header("link").is_some_and(has_next);
        Ok((wire::decode(&raw.json(&what)?, &what)?, next))
    }

    async fn get_raw(
        &self,
        path: &str,
        query: Option<&str>,
        what: &str,
    ) -> Result<Raw, GitHubError> {
        let (octo, policy, _) = self.graphql_channel();
        let call = super::transport::Call {
            what,
            method: http::Method::GET,
            path,
            query,
            accept: JSON,
            body: None,
            jwt: None,
            max_body: super::transport::MAX_ANSWER_BYTES,
            guard: self.write_guard(),
        };
        super::transport::send(octo, policy, call).await
    }
}

fn repo_path(repo: &RepoName) -> String {
    // RepoName only holds URL-safe characters.
    format!("/repos/{}/{}", repo.owner, repo.name)
}

/// Whether a `Link` header has a `rel="next"` link.
fn has_next(link: &str) -> bool {
    link.split(',')
        .any(|part| part.split(';').skip(1).any(|p| p.trim() == "rel=\"next\""))
}

fn failed_run(run: Run, app: String, conclusion: String) -> FailedRun {
    let output = run.output.unwrap_or(Output {
        title: None,
        summary: None,
        text: None,
        annotations_count: 0,
    });
    let mut summary = output.summary.unwrap_or_default();
    if let Some(text) = output.text.filter(|t| !t.trim().is_empty()) {
        if !summary.is_empty() {
            summary.push_str("\n\n");
        }
        summary.push_str(cut_str(&text, MAX_SUMMARY));
    }
    FailedRun {
        id: run.id,
        annotations: output.annotations_count,
        check: FailedCheck {
            job_id: (app == ACTIONS).then_some(run.id),
            name: run.name,
            conclusion,
            app,
            details_url: run.details_url.or(run.html_url),
            title: output
                .title
                .filter(|t| !t.trim().is_empty())
                .map(|t| cut_str(&t, MAX_TITLE).to_string()),
            summary: cut_with_mark(summary.trim(), MAX_SUMMARY),
            annotations: Vec::new(),
            log: None,
            first_error: String::new(),
        },
    }
}

fn failed_status(status: Status) -> FailedCheck {
    let summary = cut_str(status.description.as_deref().unwrap_or(""), MAX_TITLE).to_string();
    FailedCheck {
        name: status.context,
        first_error: summary.clone(),
        conclusion: status.state,
        app: "commit status".into(),
        job_id: None,
        details_url: status.target_url,
        title: None,
        summary,
        annotations: Vec::new(),
        log: None,
    }
}

fn annotation_line(a: &Annotation) -> String {
    let mut line = format!(
        "{}:{}: {}",
        a.path,
        a.start_line,
        a.annotation_level.as_deref().unwrap_or("failure")
    );
    for part in [&a.title, &a.message].into_iter().flatten() {
        let part = part.split_whitespace().collect::<Vec<_>>().join(" ");
        if !part.is_empty() {
            line.push_str(": ");
            line.push_str(&part);
        }
    }
    cut_with_mark(&line, MAX_ANNOTATION)
}

/// When the log gave no error line: the first failure annotation's message, the title,
/// the summary's first line, the conclusion.
fn fallback_first_error(check: &FailedCheck) -> String {
    let annotation = check
        .annotations
        .iter()
        .find(|a| a.contains(": failure"))
        .map(|a| a.split_once(": failure").map_or(a.as_str(), |(_, m)| m))
        .map(|m| m.trim_start_matches(':').trim());
    let summary_line = check.summary.lines().map(str::trim).find(|l| !l.is_empty());
    let line = annotation
        .or(check.title.as_deref())
        .or(summary_line)
        .unwrap_or(&check.conclusion);
    cut_str(line, crate::ci_log::MAX_FIRST_ERROR).to_string()
}

impl CiState {
    /// What makes two failures "the same" (SPEC §11: the same checks fail with the same
    /// first error line): the SHA-256, in hex, of the sorted, distinct pairs of a failed
    /// check's name and its first error line as [`normalize_error_line`] makes it.
    pub fn signature(&self) -> String {
        let mut pairs: Vec<(&str, String)> = self
            .failed
            .iter()
            .map(|f| (f.name.as_str(), normalize_error_line(&f.first_error)))
            .collect();
        pairs.sort();
        pairs.dedup();
        let mut hash = sha2::Sha256::new();
        for (name, line) in pairs {
            hash.update(name.as_bytes());
            hash.update(b"\t");
            hash.update(line.as_bytes());
            hash.update(b"\n");
        }
        hex::encode(hash.finalize())
    }

    /// The failure report the repair run's model is given, in Markdown, at most `max_bytes`
    /// (cut on character boundaries): the counts, then each detailed failed check (name,
    /// conclusion, App, link, title, summary, annotations, the log excerpt in a fence),
    /// sharing the room equally, then the failures named only.
    pub fn report(&self, max_bytes: usize) -> String {
        let detailed: Vec<&FailedCheck> = self
            .failed
            .iter()
            .filter(|f| !f.first_error.is_empty() || f.log.is_some())
            .collect();
        let named: Vec<&str> = self
            .failed
            .iter()
            .filter(|f| f.first_error.is_empty() && f.log.is_none())
            .map(|f| f.name.as_str())
            .collect();
        let mut out = self.report_head();
        let mut tail = String::new();
        if !named.is_empty() {
            tail.push_str("\nAlso failed (not detailed): ");
            let list = named
                .iter()
                .map(|n| format!("`{}`", n.replace('`', "'")))
                .collect::<Vec<_>>()
                .join(", ");
            tail.push_str(&cut_with_mark(&list, max_bytes / 8));
            tail.push('\n');
        }
        let room = max_bytes.saturating_sub(out.len() + tail.len());
        let share = room / detailed.len().max(1);
        for check in detailed {
            out.push_str(&section(check, share));
        }
        out.push_str(&tail);
        cut_str(&out, max_bytes).to_string()
    }

    fn report_head(&self) -> String {
        let mut out = format!(
            "## CI failures\n\n{} failed, {} passed",
            self.failed.len(),
            self.passed
        );
        if !self.pending.is_empty() {
            let names: Vec<&str> = self.pending.iter().take(20).map(String::as_str).collect();
            out.push_str(&format!(
                ", {} still running ({})",
                self.pending.len(),
                cut_with_mark(&names.join(", "), 1024)
            ));
        }
        if self.left_out > 0 {
            out.push_str(&format!(
                ", {} more not read (over kodx's limits)",
                self.left_out
            ));
        }
        out.push_str(".\n");
        out
    }
}

/// One failed check's part of the report, within `room` bytes: the log gets what the
/// other parts leave, and each of those gets at most a quarter.
fn section(check: &FailedCheck, room: usize) -> String {
    let quarter = room / 4;
    let mut out = format!(
        "\n### `{}` — {} ({})\n",
        cut_str(&check.name.replace('`', "'"), 200),
        check.conclusion,
        if check.app.is_empty() {
            "unknown app"
        } else {
            &check.app
        }
    );
    if let Some(url) = &check.details_url {
        out.push_str(&format!("Details: {}\n", cut_str(url, 500)));
    }
    if let Some(title) = &check.title {
        let title = cut_with_mark(title, MAX_TITLE).replace('\n', " ");
        out.push_str(&format!("Title: {title}\n"));
    }
    if !check.first_error.is_empty() {
        let line = cut_with_mark(&check.first_error, crate::ci_log::MAX_FIRST_ERROR);
        out.push_str(&format!("First error: {}\n", line.replace('\n', " ")));
    }
    if !check.summary.is_empty() {
        out.push_str("\nSummary:\n");
        out.push_str(&fence(&cut_middle(&check.summary, quarter), "text"));
    }
    if !check.annotations.is_empty() {
        out.push_str("\nAnnotations:\n");
        let list: String = check
            .annotations
            .iter()
            .map(|a| format!("- {a}\n"))
            .collect();
        out.push_str(&fence(&cut_middle(&list, quarter), "text"));
    }
    if let Some(log) = &check.log {
        let about = if log.lines == 0 && log.bytes == 0 {
            String::new()
        } else {
            format!(
                " ({} lines, {} bytes{})",
                log.lines,
                log.bytes,
                if log.cut_at_read_limit {
                    ", read in part"
                } else {
                    ""
                }
            )
        };
        out.push_str(&format!("\nLog excerpt{about}:\n"));
        let left = room.saturating_sub(out.len() + 16);
        out.push_str(&fence(&cut_middle(&log.text, left), "text"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(name: &str, first_error: &str) -> FailedCheck {
        FailedCheck {
            name: name.into(),
            conclusion: "failure".into(),
            app: ACTIONS.into(),
            job_id: Some(2),
            details_url: Some("https://github.com/o/r/actions/runs/1/job/2".into()),
            title: Some("tests".into()),
            summary: "2 tests failed".into(),
            annotations: vec!["src/lib.rs:3: failure: boom".into()],
            log: Some(LogExcerpt {
                text: format!("… 10 lines …\n{first_error}\nmore"),
                lines: 12,
                bytes: 300,
                cut_at_read_limit: false,
            }),
            first_error: first_error.into(),
        }
    }

    #[test]
    fn the_signature_is_the_set_of_checks_and_first_errors() {
        let a = |e1: &str, e2: &str| CiState {
            failed: vec![failed("test", e1), failed("lint", e2)],
            ..CiState::default()
        };
        let base = a("FAILED (0.5s)", "error: x").signature();
        assert_eq!(base.len(), 64);
        assert_eq!(a("FAILED (1.7s)", "error: x").signature(), base);
        let mut swapped = a("FAILED (0.5s)", "error: x");
        swapped.failed.reverse();
        swapped.passed = 9;
        assert_eq!(swapped.signature(), base);
        assert_ne!(a("FAILED (0.5s)", "error: y").signature(), base);
        let mut renamed = a("FAILED (0.5s)", "error: x");
        renamed.failed[0].name = "test (macos)".into();
        assert_ne!(renamed.signature(), base);
    }

    #[test]
    fn the_report_names_every_part_and_fits_its_size() {
        let mut st = CiState {
            failed: vec![failed("test", "error[E0308]: mismatched types")],
            passed: 4,
            left_out: 2,
            ..CiState::default()
        };
        st.failed.push(FailedCheck {
            log: None,
            first_error: String::new(),
            ..failed("named only", "")
        });
        let report = st.report(48 * 1024);
        for part in [
            "## CI failures\n\n2 failed, 4 passed, 2 more not read (over kodx's limits).",
            "### `test` — failure (github-actions)",
            "Details: https://github.com/o/r/actions/runs/1/job/2",
            "Title: tests",
            "First error: error[E0308]: mismatched types",
            "```text\n2 tests failed\n```",
            "- src/lib.rs:3: failure: boom",
            "Log excerpt (12 lines, 300 bytes):\n```text\n… 10 lines …\nerror[E0308]",
            "Also failed (not detailed): `named only`",
        ] {
            assert!(report.contains(part), "{part}\n---\n{report}");
        }
        // Many long failures, multi-byte text: within the size, on char boundaries.
        let long = "é".repeat(20_000);
        let big = CiState {
            failed: (0..12)
                .map(|i| failed(&format!("job {i}"), &long))
                .collect(),
            ..CiState::default()
        };
        for max in [0, 10, 1000, 48 * 1024] {
            let r = big.report(max);
            assert!(r.len() <= max, "{max}: {}", r.len());
        }
        assert!(big.report(48 * 1024).contains("### `job 11`"));
    }

    #[test]
    fn next_links_are_found() {
        let link = "<https://api.github.com/x?page=2>; rel=\"next\", \
                    <https://api.github.com/x?page=5>; rel=\"last\"";
        assert!(has_next(link));
        assert!(!has_next("<https://api.github.com/x?page=1>; rel=\"prev\""));
    }
}
