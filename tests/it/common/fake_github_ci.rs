//! The fake GitHub's view of a commit's CI, shaped as GitHub's REST description
//! (`@octokit/openapi`: `check-suite`, `check-run`, `check-annotation`,
//! `combined-commit-status`) and its webhooks (`@octokit/webhooks-examples`:
//! `check_suite.completed`, `workflow_run.completed`):
//!
//! - `GET /repos/{o}/{r}/commits/{ref}/check-suites` and `…/check-runs` (`filter=latest`
//!   by default: the newest run per App and name; `all`), `{total_count, check_suites |
//!   check_runs}` pages with `per_page` (default 30, at most 100), `page` and a `Link` header;
//!   `checks: read`.
//! - `GET /repos/{o}/{r}/check-runs/{id}/annotations` (a list, paged the same way;
//!   `checks: read`).
//! - `GET /repos/{o}/{r}/commits/{ref}/status`: the combined status, the latest status per
//!   context, paged; `statuses: read`.
//! - `GET /repos/{o}/{r}/actions/jobs/{id}/logs` (`actions: read`): `302` to a signed URL on
//!   a second loopback listener, the log host, which refuses (403) any request carrying an
//!   `Authorization` header (counted in `blob_requests_with_auth()`), and streams the log,
//!   generated as it is sent for `FakeLog::Generated` (never held whole).
//!
//! Kodx's own Check Runs, created through `POST …/check-runs`, are listed with the others
//! under the App's slug, and make a completed check suite of the App's.
//!
//! Test API on `FakeGitHub`: `add_check_suite(repo, sha, FakeSuite) -> suite id`,
//! `suite_runs(suite id) -> run ids` (a run's id is its job id for GitHub Actions),
//! `complete_check_run(run id, conclusion)` (the suite completes with its last run),
//! `set_suite(suite id, status, conclusion)`, `set_commit_status(repo, sha, context, state,
//! description)`, `log_bytes_served()`, `blob_requests()`, `blob_requests_with_auth()`,
//! and the webhook payloads `check_suite_completed_payload(…)` and
//! `workflow_run_completed_payload(…)`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::{
    accepts_json, auth_installation, gh_error, iso8601, json_response, refuse, repo_json,
    user_json, FakeGitHub, Need, Req, StateInner,
};

const CHECKS_READ: Need = &[("checks", "read")];
const STATUSES_READ: Need = &[("statuses", "read")];
const ACTIONS_READ: Need = &[("actions", "read")];
/// GitHub Actions' App.
pub const ACTIONS_SLUG: &str = "github-actions";
const ACTIONS_APP_ID: u64 = 15368;

/// A job's log as the log host serves it.
#[derive(Clone, Debug)]
pub enum FakeLog {
    Text(String),
    /// `lines` lines of about 125 bytes each, as GitHub Actions writes them (a timestamp on
    /// each, colours on one in ten), generated while they are sent. The lines numbered in
    /// `errors_at` (from 1) read `error[E0599]: no method named `frobnicate` found (log line
    /// N)`.
    Generated {
        lines: u64,
        errors_at: Vec<u64>,
    },
}

impl FakeLog {
    /// The bytes a `Generated` log has (its length, without generating it).
    pub fn len(&self) -> u64 {
        match self {
            FakeLog::Text(t) => t.len() as u64,
            FakeLog::Generated { lines, errors_at } => (1..=*lines)
                .map(|n| generated_line(n, errors_at).len() as u64)
                .sum(),
        }
    }
}

/// One check run as a test describes it. `annotations`: one message each, at
/// `src/lib.rs` line 1, 2, …; a `warning: ` or `notice: ` prefix sets the level, else it is
/// `failure`.
#[derive(Clone, Debug)]
pub struct FakeCheckRunSpec {
    pub name: String,
    /// `queued`, `in_progress` or `completed`.
    pub status: String,
    pub conclusion: Option<String>,
    pub title: Option<String>,
    pub summary: Option<String>,
    pub annotations: Vec<String>,
    pub log: Option<FakeLog>,
}

impl FakeCheckRunSpec {
    pub fn completed(name: &str, conclusion: &str) -> FakeCheckRunSpec {
        FakeCheckRunSpec {
            name: name.into(),
            status: "completed".into(),
            conclusion: Some(conclusion.into()),
            title: None,
            summary: None,
            annotations: Vec::new(),
            log: None,
        }
    }

    pub fn running(name: &str) -> FakeCheckRunSpec {
        FakeCheckRunSpec {
            status: "in_progress".into(),
            conclusion: None,
            ..FakeCheckRunSpec::completed(name, "success")
        }
    }

    pub fn with_output(mut self, title: &str, summary: &str) -> FakeCheckRunSpec {
        self.title = Some(title.into());
        self.summary = Some(summary.into());
        self
    }

    pub fn with_annotations(mut self, messages: &[&str]) -> FakeCheckRunSpec {
        self.annotations = messages.iter().map(|m| m.to_string()).collect();
        self
    }

    pub fn with_log(mut self, log: FakeLog) -> FakeCheckRunSpec {
        self.log = Some(log);
        self
    }
}

/// A check suite of one App on one commit.
#[derive(Clone, Debug)]
pub struct FakeSuite {
    pub app_slug: String,
    /// `queued`, `in_progress` or `completed`.
    pub status: String,
    pub conclusion: Option<String>,
    pub runs: Vec<FakeCheckRunSpec>,
}

impl FakeSuite {
    /// A suite whose status and conclusion follow from its runs (no runs: `queued`, as
    /// GitHub leaves the suite of an App that never reports).
    pub fn of(app_slug: &str, runs: Vec<FakeCheckRunSpec>) -> FakeSuite {
        let (status, conclusion) = derived(runs.iter().map(|r| (&r.status, &r.conclusion)));
        FakeSuite {
            app_slug: app_slug.into(),
            status,
            conclusion,
            runs,
        }
    }
}

/// A suite's status and conclusion from its runs'.
fn derived<'a>(
    runs: impl Iterator<Item = (&'a String, &'a Option<String>)>,
) -> (String, Option<String>) {
    let runs: Vec<_> = runs.collect();
    if runs.is_empty() {
        return ("queued".into(), None);
    }
    if runs.iter().any(|(s, _)| s.as_str() != "completed") {
        return ("in_progress".into(), None);
    }
    let failing = ["failure", "timed_out", "startup_failure", "cancelled"];
    let conclusion = runs
        .iter()
        .filter_map(|(_, c)| c.as_deref())
        .find(|c| failing.contains(c))
        .unwrap_or("success");
    ("completed".into(), Some(conclusion.into()))
}

struct SuiteRec {
    id: u64,
    key: String,
    sha: String,
    app_slug: String,
    status: String,
    conclusion: Option<String>,
    runs: Vec<u64>,
    created_at: String,
}

struct RunRec {
    suite: u64,
    spec: FakeCheckRunSpec,
    started_at: String,
    completed_at: Option<String>,
}

struct StatusRec {
    id: u64,
    key: String,
    sha: String,
    context: String,
    state: String,
    description: String,
    at: String,
}

/// The fake's CI state (a field of its state).
#[derive(Default)]
pub(super) struct CiStore {
    suites: Vec<SuiteRec>,
    runs: BTreeMap<u64, RunRec>,
    statuses: Vec<StatusRec>,
    /// Signature → (repository key, job id) of the log URLs handed out.
    signed: HashMap<String, (String, u64)>,
    blob_url: Option<String>,
    served: Arc<AtomicU64>,
    blob_requests: usize,
    blob_with_auth: usize,
    /// Workflow runs re-run through `rerun-failed-jobs`, in order.
    reruns: Vec<u64>,
    /// The second each suite last completed in its payloads.
    completions: HashMap<u64, u64>,
}

fn now() -> String {
    iso8601(SystemTime::now())
}

/// When suite `suite` last completed, as its `check_suite.completed` payload says: now,
/// but never the same second twice for one suite (GitHub's times are in seconds, and a
/// suite whose jobs were re-run completes again, with a later time).
fn completed_at(st: &mut StateInner, suite: u64) -> String {
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let last = st.ci.completions.entry(suite).or_insert(0);
    *last = (*last + 1).max(now);
    iso8601(std::time::UNIX_EPOCH + std::time::Duration::from_secs(*last))
}

impl FakeGitHub {
    /// Adds a check suite (and its runs, with ids assigned) on commit `sha` of `repo`.
    pub fn add_check_suite(&self, repo: &str, sha: &str, suite: FakeSuite) -> u64 {
        let key = repo.to_lowercase();
        let mut st = self.state();
        assert!(st.repos.contains_key(&key), "add_repo({repo}) first");
        let id = st.next_id();
        let mut runs = Vec::new();
        for spec in suite.runs {
            let run = st.next_id();
            let completed = spec.status == "completed";
            st.ci.runs.insert(
                run,
                RunRec {
                    suite: id,
                    spec,
                    started_at: now(),
                    completed_at: completed.then(now),
                },
            );
            runs.push(run);
        }
        st.ci.suites.push(SuiteRec {
            id,
            key,
            sha: sha.into(),
            app_slug: suite.app_slug,
            status: suite.status,
            conclusion: suite.conclusion,
            runs,
            created_at: now(),
        });
        id
    }

    /// The ids of a suite's runs, in the order given.
    pub fn suite_runs(&self, suite: u64) -> Vec<u64> {
        let st = self.state();
        let s = st.ci.suites.iter().find(|s| s.id == suite);
        s.expect("no such suite").runs.clone()
    }

    /// Completes a run; its suite completes (with the first failing conclusion, else
    /// `success`) when it was the last one running.
    pub fn complete_check_run(&self, run: u64, conclusion: &str) {
        let mut st = self.state();
        let ci = &mut st.ci;
        let rec = ci.runs.get_mut(&run).expect("no such check run");
        rec.spec.status = "completed".into();
        rec.spec.conclusion = Some(conclusion.into());
        rec.completed_at = Some(now());
        let suite_id = rec.suite;
        let suite = ci.suites.iter_mut().find(|s| s.id == suite_id).unwrap();
        let runs = &ci.runs;
        let (status, conclusion) = derived(
            suite
                .runs
                .iter()
                .map(|id| (&runs[id].spec.status, &runs[id].spec.conclusion)),
        );
        suite.status = status;
        suite.conclusion = conclusion;
    }

    pub fn set_suite(&self, suite: u64, status: &str, conclusion: Option<&str>) {
        let mut st = self.state();
        let s = st.ci.suites.iter_mut().find(|s| s.id == suite);
        let s = s.expect("no such suite");
        s.status = status.into();
        s.conclusion = conclusion.map(str::to_string);
    }

    /// Sets the status of `context` on `sha` (`error`, `failure`, `pending` or `success`),
    /// replacing its earlier one.
    pub fn set_commit_status(
        &self,
        repo: &str,
        sha: &str,
        context: &str,
        state: &str,
        description: &str,
    ) {
        assert!(["error", "failure", "pending", "success"].contains(&state));
        let key = repo.to_lowercase();
        let mut st = self.state();
        let id = st.next_id();
        let ci = &mut st.ci;
        ci.statuses
            .retain(|s| !(s.key == key && s.sha == sha && s.context == context));
        ci.statuses.push(StatusRec {
            id,
            key,
            sha: sha.into(),
            context: context.into(),
            state: state.into(),
            description: description.into(),
            at: now(),
        });
    }

    /// Bytes of logs the log host has sent (generated logs count as they are sent).
    pub fn log_bytes_served(&self) -> u64 {
        self.state().ci.served.load(Ordering::SeqCst)
    }

    pub fn blob_requests(&self) -> usize {
        self.state().ci.blob_requests
    }

    /// Requests to the log host that carried an `Authorization` header (each refused).
    pub fn blob_requests_with_auth(&self) -> usize {
        self.state().ci.blob_with_auth
    }

    /// A `check_suite` webhook with `action: completed`, as GitHub sends it to an App.
    #[allow(clippy::too_many_arguments)]
    pub fn check_suite_completed_payload(
        &self,
        repo: &str,
        installation_id: u64,
        suite_id: u64,
        app_slug: &str,
        head_sha: &str,
        head_branch: &str,
        conclusion: &str,
        pulls: &[u64],
    ) -> Value {
        let key = repo.to_lowercase();
        let mut st = self.state();
        let repository = repo_json(self, &mut st, &key);
        let pull_requests = pulls_json(self, &st, &key, head_sha, head_branch, pulls);
        let sender = sender_json(&mut st, &key);
        let full_name = &st.repos[&key].full_name;
        let api = format!("{}/repos/{full_name}", self.url());
        json!({
            "action": "completed",
            "check_suite": {
                "id": suite_id,
                "node_id": format!("CS_{suite_id}"),
                "head_branch": head_branch,
                "head_sha": head_sha,
                "status": "completed",
                "conclusion": conclusion,
                "url": format!("{api}/check-suites/{suite_id}"),
                "before": "0000000000000000000000000000000000000000",
                "after": head_sha,
                "pull_requests": pull_requests,
                "app": app_json(self, &st.slug, app_slug),
                "created_at": now(),
                "updated_at": completed_at(&mut st, suite_id),
                "rerequestable": true,
                "runs_rerequestable": true,
                "latest_check_runs_count": 1,
                "check_runs_url": format!("{api}/check-suites/{suite_id}/check-runs"),
                "head_commit": head_commit_json(head_sha),
            },
            "repository": repository,
            "sender": sender,
            "installation": installation_json(installation_id),
        })
    }

    /// A `workflow_run` webhook with `action: completed` (GitHub Actions' run of workflow
    /// `name`, whose check suite is `suite_id`).
    #[allow(clippy::too_many_arguments)]
    pub fn workflow_run_completed_payload(
        &self,
        repo: &str,
        installation_id: u64,
        run_id: u64,
        suite_id: u64,
        name: &str,
        head_sha: &str,
        head_branch: &str,
        conclusion: &str,
        pulls: &[u64],
    ) -> Value {
        let key = repo.to_lowercase();
        let mut st = self.state();
        let repository = repo_json(self, &mut st, &key);
        let pull_requests = pulls_json(self, &st, &key, head_sha, head_branch, pulls);
        let sender = sender_json(&mut st, &key);
        let full_name = st.repos[&key].full_name.clone();
        let api = format!("{}/repos/{full_name}", self.url());
        let html = format!("{}/{full_name}", self.root());
        json!({
            "action": "completed",
            "workflow": {
                "id": 16340987, "node_id": "W_kwDOF6lyTM4A-Vf7", "name": name,
                "path": ".github/workflows/ci.yml", "state": "active",
                "created_at": "2021-12-15T20:11:38.000Z", "updated_at": "2021-12-16T18:40:41.000Z",
                "url": format!("{api}/actions/workflows/16340987"),
                "html_url": format!("{html}/blob/main/.github/workflows/ci.yml"),
            },
            "workflow_run": {
                "id": run_id,
                "name": name,
                "node_id": format!("WFR_{run_id}"),
                "check_suite_id": suite_id,
                "check_suite_node_id": format!("CS_{suite_id}"),
                "check_suite_url": format!("{api}/check-suites/{suite_id}"),
                "head_branch": head_branch,
                "head_sha": head_sha,
                "path": ".github/workflows/ci.yml",
                "display_title": name,
                "run_number": 36,
                "run_attempt": 1 + st.ci.reruns.iter().filter(|r| **r == suite_id).count(),
                "event": "pull_request",
                "status": "completed",
                "conclusion": conclusion,
                "workflow_id": 16340987,
                "url": format!("{api}/actions/runs/{run_id}"),
                "html_url": format!("{html}/actions/runs/{run_id}"),
                "jobs_url": format!("{api}/actions/runs/{run_id}/jobs"),
                "logs_url": format!("{api}/actions/runs/{run_id}/logs"),
                "artifacts_url": format!("{api}/actions/runs/{run_id}/artifacts"),
                "cancel_url": format!("{api}/actions/runs/{run_id}/cancel"),
                "rerun_url": format!("{api}/actions/runs/{run_id}/rerun"),
                "workflow_url": format!("{api}/actions/workflows/16340987"),
                "previous_attempt_url": null,
                "pull_requests": pull_requests,
                "created_at": now(),
                "updated_at": now(),
                "run_started_at": now(),
                "actor": sender.clone(),
                "triggering_actor": sender.clone(),
                "head_commit": head_commit_json(head_sha),
                "repository": repository.clone(),
                "head_repository": repository.clone(),
            },
            "repository": repository,
            "sender": sender,
            "installation": installation_json(installation_id),
        })
    }
}

fn installation_json(id: u64) -> Value {
    json!({"id": id, "node_id": format!("MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9u{id}")})
}

/// The repository's owner, as the one who pushed.
fn sender_json(st: &mut StateInner, key: &str) -> Value {
    let owner = st.repos[key]
        .full_name
        .split('/')
        .next()
        .unwrap()
        .to_string();
    user_json(st, &owner, false)
}

fn head_commit_json(sha: &str) -> Value {
    let who = json!({"name": "Mona Lisa", "email": "mona@example.com"});
    json!({
        "id": sha, "tree_id": "8181cee091cf9627ac07c3cc4b94c015a1d56706",
        "message": "Update", "timestamp": now(), "author": who, "committer": who,
    })
}

/// The `pull_requests` of a check suite or workflow run: each pull's head and base as
/// the fake knows them (`add_pull`), else `head_branch`/`head_sha` into the default branch.
fn pulls_json(
    fake: &FakeGitHub,
    st: &StateInner,
    key: &str,
    head_sha: &str,
    head_branch: &str,
    pulls: &[u64],
) -> Value {
    let r = &st.repos[key];
    let api = format!("{}/repos/{}", fake.url(), r.full_name);
    let mini = json!({"id": r.id, "url": api, "name": r.full_name.split('/').nth(1)});
    let items: Vec<Value> = pulls
        .iter()
        .map(|&number| {
            let pull = r.issues.get(&number).and_then(|i| i.pull.as_ref());
            let (head_ref, head, base_ref, base) = match pull {
                Some(p) => (
                    p.head.ref_name.clone(),
                    p.head.sha.clone(),
                    p.base.ref_name.clone(),
                    p.base.sha.clone(),
                ),
                None => (
                    head_branch.to_string(),
                    head_sha.to_string(),
                    r.default_branch.clone(),
                    "f95f852bd8fca8fcc58a9a2d6c842781e32a215e".to_string(),
                ),
            };
            json!({
                "url": format!("{api}/pulls/{number}"),
                "id": 279_147_000 + number,
                "number": number,
                "head": {"ref": head_ref, "sha": head, "repo": mini},
                "base": {"ref": base_ref, "sha": base, "repo": mini},
            })
        })
        .collect();
    Value::Array(items)
}

/// An App as `nullable-integration` describes it; `own` is the fake App's slug (the
/// caller holds the state's lock).
fn app_json(fake: &FakeGitHub, own: &str, slug: &str) -> Value {
    let id = if slug == ACTIONS_SLUG {
        ACTIONS_APP_ID
    } else if slug == own {
        fake.app_id()
    } else {
        90_000 + slug.bytes().map(u64::from).sum::<u64>()
    };
    json!({
        "id": id,
        "slug": slug,
        "node_id": format!("A_{id}"),
        "client_id": format!("Iv1.{id}"),
        "owner": {"login": "github", "id": 9919, "type": "Organization"},
        "name": slug,
        "description": "",
        "external_url": format!("https://{slug}.example.com"),
        "html_url": format!("{}/apps/{slug}", fake.root()),
        "created_at": "2018-07-30T09:30:17Z",
        "updated_at": "2019-12-10T19:04:12Z",
        "permissions": {"checks": "write", "metadata": "read"},
        "events": [],
    })
}

// -------------------------------------------------------------------------------------
// Listing
// -------------------------------------------------------------------------------------

/// One check run as listed: `(id, suite id, app slug, JSON)`.
type Listed = (u64, u64, String, Value);

/// A list endpoint's checks: the token may read `need` on the repository, and the page
/// asked for is valid. The repository's key and the page.
#[allow(clippy::result_large_err)]
fn listing(
    fake: &FakeGitHub,
    req: &Req,
    owner: &str,
    repo: &str,
    need: Need,
) -> Result<(String, usize, usize), Response> {
    let key = readable(fake, req, owner, repo, need)?;
    let (per_page, page) = paging(fake, req)?;
    Ok((key, per_page, page))
}

/// `per_page` (default 30, at most 100) and `page` (from 1), or the refusal.
#[allow(clippy::result_large_err)]
fn paging(fake: &FakeGitHub, req: &Req) -> Result<(usize, usize), Response> {
    let mut out = [30usize, 1usize];
    for (i, name) in ["per_page", "page"].iter().enumerate() {
        if let Some(text) = req.query.get(*name) {
            match text.parse::<usize>() {
                Ok(v) if v >= 1 => out[i] = v,
                _ => {
                    let reason = format!("{name}={text:?}");
                    return Err(refuse(fake, req, 422, "Invalid request.", &reason));
                }
            }
        }
    }
    Ok((out[0].min(100), out[1]))
}

/// The items of one page and the answer's `Link` header (none on a single page).
fn page_of<T: Clone>(
    fake: &FakeGitHub,
    req: &Req,
    items: &[T],
    per_page: usize,
    page: usize,
) -> (Vec<T>, Option<String>) {
    let last = items.len().div_ceil(per_page).max(1);
    let chosen = items
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .cloned()
        .collect();
    if last == 1 {
        return (chosen, None);
    }
    let mut query: Vec<(String, String)> = req
        .query
        .iter()
        .filter(|(k, _)| k.as_str() != "page" && k.as_str() != "per_page")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    query.sort();
    let base: String = query.iter().map(|(k, v)| format!("{k}={v}&")).collect();
    let link = |p: usize, rel: &str| {
        format!(
            "<{}{}?{base}per_page={per_page}&page={p}>; rel=\"{rel}\"",
            fake.root(),
            req.path
        )
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(link((page - 1).min(last), "prev"));
    }
    if page < last {
        links.push(link(page + 1, "next"));
        links.push(link(last, "last"));
    }
    if page > 1 {
        links.push(link(1, "first"));
    }
    (chosen, Some(links.join(", ")))
}

fn with_link(mut resp: Response, link: Option<String>) -> Response {
    if let Some(link) = link {
        resp.headers_mut().insert("link", link.parse().unwrap());
    }
    resp
}

/// Every check run on `sha` of `key`: the tests' and kodx's own, by id.
fn runs_on(fake: &FakeGitHub, st: &mut StateInner, key: &str, sha: &str) -> Vec<Listed> {
    let full_name = st.repos[key].full_name.clone();
    let mut out = Vec::new();
    for suite in st.ci.suites.iter().filter(|s| s.key == key && s.sha == sha) {
        for id in &suite.runs {
            let run = &st.ci.runs[id];
            let v = run_json(fake, &st.slug, &full_name, *id, sha, suite, run);
            out.push((*id, suite.id, suite.app_slug.clone(), v));
        }
    }
    let own_suite = own_suite_id(st, key, sha);
    let slug = st.slug.clone();
    for created in st
        .check_runs
        .iter()
        .filter(|c| c.repo == key && c.body["head_sha"] == sha)
    {
        let v = own_run_json(
            fake,
            &slug,
            &full_name,
            created.id,
            own_suite,
            &created.body,
        );
        out.push((created.id, own_suite, slug.clone(), v));
    }
    out.sort_by_key(|(id, ..)| *id);
    out
}

/// The suite kodx's own runs on a commit are listed in (a number of its own).
fn own_suite_id(st: &StateInner, key: &str, sha: &str) -> u64 {
    let first = st
        .check_runs
        .iter()
        .find(|c| c.repo == key && c.body["head_sha"] == sha)
        .map_or(0, |c| c.id);
    8_000_000_000 + first
}

fn run_json(
    fake: &FakeGitHub,
    own: &str,
    full_name: &str,
    id: u64,
    sha: &str,
    suite: &SuiteRec,
    run: &RunRec,
) -> Value {
    let api = format!("{}/repos/{full_name}", fake.url());
    let html = format!("{}/{full_name}", fake.root());
    let s = &run.spec;
    let details = if suite.app_slug == ACTIONS_SLUG {
        format!("{html}/actions/runs/{}/job/{id}", suite.id)
    } else {
        format!("https://{}.example.com/builds/{id}", suite.app_slug)
    };
    json!({
        "id": id,
        "head_sha": sha,
        "node_id": format!("CR_{id}"),
        "external_id": id.to_string(),
        "url": format!("{api}/check-runs/{id}"),
        "html_url": format!("{html}/runs/{id}"),
        "details_url": details,
        "status": s.status,
        "conclusion": s.conclusion,
        "started_at": run.started_at,
        "completed_at": run.completed_at,
        "output": {
            "title": s.title,
            "summary": s.summary,
            "text": null,
            "annotations_count": s.annotations.len(),
            "annotations_url": format!("{api}/check-runs/{id}/annotations"),
        },
        "name": s.name,
        "check_suite": {"id": suite.id},
        "app": app_json(fake, own, &suite.app_slug),
        "pull_requests": [],
    })
}

/// A Check Run kodx created, as the list endpoints show it.
fn own_run_json(
    fake: &FakeGitHub,
    own: &str,
    full_name: &str,
    id: u64,
    suite: u64,
    body: &Value,
) -> Value {
    let api = format!("{}/repos/{full_name}", fake.url());
    let conclusion = body.get("conclusion").cloned().unwrap_or(Value::Null);
    let status = if conclusion.is_string() {
        json!("completed")
    } else {
        body.get("status").cloned().unwrap_or(json!("queued"))
    };
    let output = &body["output"];
    json!({
        "id": id,
        "head_sha": body["head_sha"],
        "node_id": format!("CR_{id}"),
        "external_id": body.get("external_id").cloned().unwrap_or(json!("")),
        "url": format!("{api}/check-runs/{id}"),
        "html_url": format!("{}/{full_name}/runs/{id}", fake.root()),
        "details_url": body.get("details_url").cloned().unwrap_or(Value::Null),
        "status": status,
        "conclusion": conclusion,
        "started_at": body.get("started_at").cloned().unwrap_or(Value::Null),
        "completed_at": body.get("completed_at").cloned().unwrap_or(Value::Null),
        "output": {
            "title": output.get("title").cloned().unwrap_or(Value::Null),
            "summary": output.get("summary").cloned().unwrap_or(Value::Null),
            "text": output.get("text").cloned().unwrap_or(Value::Null),
            "annotations_count": 0,
            "annotations_url": format!("{api}/check-runs/{id}/annotations"),
        },
        "name": body["name"],
        "check_suite": {"id": suite},
        "app": app_json(fake, own, own),
        "pull_requests": [],
    })
}

/// A `checks: read` JSON call: the repository's key, or the refusal.
#[allow(clippy::result_large_err)]
fn readable(
    fake: &FakeGitHub,
    req: &Req,
    owner: &str,
    repo: &str,
    need: Need,
) -> Result<String, Response> {
    let key = auth_installation(fake, req, owner, repo, need)?;
    if !accepts_json(req) {
        let r = refuse(fake, req, 415, "Unsupported 'Accept' header", "Accept");
        return Err(r);
    }
    Ok(key)
}

/// `GET /repos/{owner}/{repo}/commits/{ref}/check-runs`.
pub(super) async fn list_check_runs(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let (key, per_page, page) = match listing(&fake, &req, &owner, &repo, CHECKS_READ) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let filter = req.query.get("filter").map_or("latest", String::as_str);
    if !matches!(filter, "latest" | "all") {
        return refuse(&fake, &req, 422, "Invalid request.", "filter");
    }
    let mut runs = runs_on(&fake, &mut fake.state(), &key, &sha);
    if filter == "latest" {
        // The newest run of each App and name.
        let mut newest: HashMap<(String, String), u64> = HashMap::new();
        for (id, _, app, v) in &runs {
            let name = v["name"].as_str().unwrap_or_default().to_string();
            let e = newest.entry((app.clone(), name)).or_insert(*id);
            *e = (*e).max(*id);
        }
        runs.retain(|(id, _, app, v)| {
            let name = v["name"].as_str().unwrap_or_default().to_string();
            newest[&(app.clone(), name)] == *id
        });
    }
    let values: Vec<Value> = runs.into_iter().map(|(.., v)| v).collect();
    let (items, link) = page_of(&fake, &req, &values, per_page, page);
    let body = json!({"total_count": values.len(), "check_runs": items});
    with_link(json_response(200, body), link)
}

/// `GET /repos/{owner}/{repo}/commits/{ref}/check-suites`.
pub(super) async fn list_check_suites(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let (key, per_page, page) = match listing(&fake, &req, &owner, &repo, CHECKS_READ) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let mut st = fake.state();
    let repository = repo_json(&fake, &mut st, &key);
    let api = format!("{}/repos/{}", fake.url(), st.repos[&key].full_name);
    let own = st.slug.clone();
    let suite = |id: u64, slug: &str, status: &str, conclusion: Option<&str>, count: usize| {
        json!({
            "id": id, "node_id": format!("CS_{id}"), "head_branch": null, "head_sha": sha,
            "status": status, "conclusion": conclusion,
            "url": format!("{api}/check-suites/{id}"),
            "before": null, "after": sha, "pull_requests": [],
            "app": app_json(&fake, &own, slug), "repository": repository,
            "created_at": now(), "updated_at": now(),
            "head_commit": head_commit_json(&sha),
            "latest_check_runs_count": count,
            "check_runs_url": format!("{api}/check-suites/{id}/check-runs"),
            "rerequestable": true, "runs_rerequestable": true,
        })
    };
    let mut suites: Vec<Value> = st
        .ci
        .suites
        .iter()
        .filter(|s| s.key == key && s.sha == sha)
        .map(|s| {
            let conclusion = s.conclusion.as_deref();
            suite(s.id, &s.app_slug, &s.status, conclusion, s.runs.len())
        })
        .collect();
    let own: Vec<&Value> = st
        .check_runs
        .iter()
        .filter(|c| c.repo == key && c.body["head_sha"] == sha)
        .map(|c| &c.body)
        .collect();
    if !own.is_empty() {
        let (slug, id) = (st.slug.clone(), own_suite_id(&st, &key, &sha));
        let failed = own.iter().any(|b| b["conclusion"] == "failure");
        let conclusion = Some(if failed { "failure" } else { "success" });
        suites.push(suite(id, &slug, "completed", conclusion, own.len()));
    }
    drop(st);
    let (items, link) = page_of(&fake, &req, &suites, per_page, page);
    let body = json!({"total_count": suites.len(), "check_suites": items});
    with_link(json_response(200, body), link)
}

/// `GET /repos/{owner}/{repo}/check-runs/{id}/annotations`.
pub(super) async fn list_annotations(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let (key, per_page, page) = match listing(&fake, &req, &owner, &repo, CHECKS_READ) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let Ok(id) = id.parse::<u64>() else {
        return refuse(&fake, &req, 404, "Not Found", "check run id");
    };
    let st = fake.state();
    let messages = match st.ci.runs.get(&id) {
        Some(run)
            if st
                .ci
                .suites
                .iter()
                .any(|s| s.id == run.suite && s.key == key) =>
        {
            run.spec.annotations.clone()
        }
        _ if st.check_runs.iter().any(|c| c.id == id && c.repo == key) => Vec::new(),
        _ => return gh_error(404, "Not Found"),
    };
    let blob = format!(
        "{}/repos/{}/git/blobs/3a8c6bd3f08b1f6e4a9a1b3c2d4e5f6a7b8c9d0e",
        fake.url(),
        st.repos[&key].full_name
    );
    drop(st);
    let all: Vec<Value> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (level, message) = match m.split_once(": ") {
                Some((l @ ("warning" | "notice"), rest)) => (l, rest),
                _ => ("failure", m.as_str()),
            };
            json!({
                "path": "src/lib.rs", "blob_href": blob,
                "start_line": i + 1, "end_line": i + 1,
                "start_column": null, "end_column": null,
                "annotation_level": level, "title": format!("check {}", i + 1),
                "message": message, "raw_details": null,
            })
        })
        .collect();
    let (items, link) = page_of(&fake, &req, &all, per_page, page);
    with_link(json_response(200, Value::Array(items)), link)
}

/// `GET /repos/{owner}/{repo}/commits/{ref}/status`.
pub(super) async fn combined_status(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let (key, per_page, page) = match listing(&fake, &req, &owner, &repo, STATUSES_READ) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let mut st = fake.state();
    let repository = repo_json(&fake, &mut st, &key);
    let api = format!("{}/repos/{}", fake.url(), st.repos[&key].full_name);
    let statuses: Vec<Value> = st
        .ci
        .statuses
        .iter()
        .filter(|s| s.key == key && s.sha == sha)
        .map(|s| {
            json!({
                "url": format!("{api}/statuses/{sha}"),
                "avatar_url": "https://avatars.githubusercontent.com/u/9919?v=4",
                "id": s.id, "node_id": format!("SC_{}", s.id),
                "state": s.state, "description": s.description,
                "target_url": format!("https://ci.example.com/{}", s.id),
                "context": s.context, "created_at": s.at, "updated_at": s.at,
            })
        })
        .collect();
    drop(st);
    let states: Vec<&str> = statuses
        .iter()
        .filter_map(|s| s["state"].as_str())
        .collect();
    let state = if states.iter().any(|s| matches!(*s, "failure" | "error")) {
        "failure"
    } else if states.is_empty() || states.contains(&"pending") {
        "pending"
    } else {
        "success"
    };
    let (items, link) = page_of(&fake, &req, &statuses, per_page, page);
    let body = json!({
        "state": state, "statuses": items, "sha": sha, "total_count": statuses.len(),
        "repository": repository,
        "commit_url": format!("{api}/commits/{sha}"), "url": format!("{api}/commits/{sha}/status"),
    });
    with_link(json_response(200, body), link)
}

// -------------------------------------------------------------------------------------
// Job logs and the log host
// -------------------------------------------------------------------------------------

/// `GET /repos/{owner}/{repo}/actions/jobs/{job_id}/logs`: `302` to a signed URL on the
/// log host, as GitHub answers.
pub(super) async fn job_logs(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ACTIONS_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let Ok(id) = id.parse::<u64>() else {
        return refuse(&fake, &req, 404, "Not Found", "job id");
    };
    let base = blob_url(&fake);
    let mut st = fake.state();
    let has_log = st.ci.runs.get(&id).is_some_and(|run| {
        run.spec.log.is_some()
            && st
                .ci
                .suites
                .iter()
                .any(|s| s.id == run.suite && s.key == key && s.app_slug == ACTIONS_SLUG)
    });
    if !has_log {
        return gh_error(404, "Not Found");
    }
    let signature: String = {
        use rand::Rng;
        rand::rng()
            .sample_iter(&rand::distr::Alphanumeric)
            .take(32)
            .map(char::from)
            .collect()
    };
    st.ci.signed.insert(signature.clone(), (key, id));
    let location = format!(
        "{base}/_apis/pipelines/1/jobs/{id}/signedlogcontent?urlExpires=2099-01-01T00%3A00%3A00Z\
         &urlSigningMethod=HMACV1&urlSignature={signature}"
    );
    (
        axum::http::StatusCode::FOUND,
        [("location", location)],
        Body::empty(),
    )
        .into_response()
}

/// The log host's URL, its listener started at the first call.
fn blob_url(fake: &FakeGitHub) -> String {
    let mut st = fake.state();
    if let Some(url) = &st.ci.blob_url {
        return url.clone();
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let app = Router::new()
        .route(
            "/_apis/pipelines/1/jobs/{id}/signedlogcontent",
            get(serve_log),
        )
        .with_state(fake.clone());
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    st.ci.blob_url = Some(url.clone());
    url
}

/// The log host: a request with the signature handed out for that job and no
/// `Authorization` gets the log.
async fn serve_log(State(fake): State<FakeGitHub>, Path(id): Path<u64>, req: Request) -> Response {
    let query = super::parse_query(req.uri().query().unwrap_or(""));
    let mut st = fake.state();
    st.ci.blob_requests += 1;
    if req.headers().contains_key("authorization") {
        st.ci.blob_with_auth += 1;
        return (
            axum::http::StatusCode::FORBIDDEN,
            "AuthenticationFailed: a signed URL takes no Authorization header",
        )
            .into_response();
    }
    let signed = query
        .get("urlSignature")
        .and_then(|s| st.ci.signed.get(s))
        .filter(|(_, job)| *job == id);
    let Some((_, job)) = signed else {
        return (axum::http::StatusCode::FORBIDDEN, "AuthenticationFailed").into_response();
    };
    let log = st.ci.runs[job].spec.log.clone().unwrap();
    let served = st.ci.served.clone();
    drop(st);
    let body = match log {
        FakeLog::Text(text) => {
            served.fetch_add(text.len() as u64, Ordering::SeqCst);
            Body::from(text)
        }
        FakeLog::Generated { lines, errors_at } => generated_body(lines, errors_at, served),
    };
    ([("content-type", "text/plain; charset=utf-8")], body).into_response()
}

fn generated_line(n: u64, errors_at: &[u64]) -> String {
    if errors_at.contains(&n) {
        return format!(
            "2024-05-01T12:34:56.1234567Z ##[error]error[E0599]: no method named `frobnicate` \
             found (log line {n})\n"
        );
    }
    let (on, off) = if n % 10 == 0 {
        ("\x1b[32m", "\x1b[0m")
    } else {
        ("", "")
    };
    format!(
        "2024-05-01T12:34:56.1234567Z {on}[{n:>9}]{off} Compiling crate-{n:09} v0.1.0 \
         (/home/runner/work/widgets/widgets/crates/crate-{n:09})\n"
    )
}

/// A generated log as a stream of 64 KiB chunks, counted as they are sent.
fn generated_body(lines: u64, errors_at: Vec<u64>, served: Arc<AtomicU64>) -> Body {
    let stream = futures_util::stream::unfold(
        (1u64, errors_at, served),
        move |(mut n, errors_at, served)| async move {
            if n > lines {
                return None;
            }
            let mut chunk = Vec::with_capacity(66 * 1024);
            while n <= lines && chunk.len() < 64 * 1024 {
                chunk.extend_from_slice(generated_line(n, &errors_at).as_bytes());
                n += 1;
            }
            served.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            Some((
                Ok::<_, std::io::Error>(Bytes::from(chunk)),
                (n, errors_at, served),
            ))
        },
    );
    Body::from_stream(stream)
}

// -------------------------------------------------------------------------------------
// GitHub Actions jobs and re-runs (`@octokit/openapi`: `job`, `actions/re-run-workflow-
// failed-jobs`). A GitHub Actions suite is its workflow run: its id is the run's id, each
// of its check runs a job of it (the ids are the same).
// -------------------------------------------------------------------------------------

const ACTIONS_WRITE: Need = &[("actions", "write")];

impl FakeGitHub {
    /// The workflow runs whose failed jobs `rerun-failed-jobs` started again, in order.
    pub fn reruns(&self) -> Vec<u64> {
        self.state().ci.reruns.clone()
    }
}

/// `GET /repos/{owner}/{repo}/actions/jobs/{job_id}`: one job (`actions: read`).
pub(super) async fn get_job(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match readable(&fake, &req, &owner, &repo, ACTIONS_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let Ok(id) = id.parse::<u64>() else {
        return refuse(&fake, &req, 404, "Not Found", "job id");
    };
    let st = fake.state();
    let Some(run) = st.ci.runs.get(&id) else {
        return gh_error(404, "Not Found");
    };
    let Some(suite) = st
        .ci
        .suites
        .iter()
        .find(|s| s.id == run.suite && s.key == key && s.app_slug == ACTIONS_SLUG)
    else {
        return gh_error(404, "Not Found");
    };
    let full_name = st.repos[&key].full_name.clone();
    let api = format!("{}/repos/{full_name}", fake.url());
    let html = format!("{}/{full_name}", fake.root());
    let s = &run.spec;
    json_response(
        200,
        json!({
            "id": id,
            "run_id": suite.id,
            "run_url": format!("{api}/actions/runs/{}", suite.id),
            "run_attempt": 1 + st.ci.reruns.iter().filter(|r| **r == suite.id).count(),
            "node_id": format!("CR_{id}"),
            "head_sha": suite.sha,
            "url": format!("{api}/actions/jobs/{id}"),
            "html_url": format!("{html}/actions/runs/{}/job/{id}", suite.id),
            "status": s.status,
            "conclusion": s.conclusion,
            "created_at": run.started_at,
            "started_at": run.started_at,
            "completed_at": run.completed_at,
            "name": s.name,
            "steps": [],
            "check_run_url": format!("{api}/check-runs/{id}"),
            "labels": ["ubuntu-latest"],
            "runner_id": 1,
            "runner_name": "GitHub Actions 1",
            "runner_group_id": 2,
            "runner_group_name": "GitHub Actions",
            "workflow_name": "CI",
            "head_branch": "main",
        }),
    )
}

/// `POST /repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs` (`actions:
/// write`): `201 {}`. Each failed job of the run is replaced in its suite by a new job (a
/// new id, `queued`), so the suite is `in_progress` again; a test completes the new jobs
/// with `complete_check_run`. A run with no failed job is refused as GitHub does (403).
pub(super) async fn rerun_failed_jobs(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ACTIONS_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    if !req.body.is_empty() {
        let body: Result<Value, _> = serde_json::from_slice(&req.body);
        let ok = match &body {
            Ok(Value::Null) => true,
            Ok(Value::Object(o)) => o
                .iter()
                .all(|(k, v)| k == "enable_debug_logging" && v.is_boolean()),
            _ => false,
        };
        if !ok {
            return refuse(&fake, &req, 422, "Invalid request.", "body");
        }
    }
    let Ok(id) = id.parse::<u64>() else {
        return refuse(&fake, &req, 404, "Not Found", "run id");
    };
    let mut st = fake.state();
    let Some(index) = st
        .ci
        .suites
        .iter()
        .position(|s| s.id == id && s.key == key && s.app_slug == ACTIONS_SLUG)
    else {
        return gh_error(404, "Not Found");
    };
    let failing = ["failure", "timed_out", "startup_failure", "cancelled"];
    let old = st.ci.suites[index].runs.clone();
    let mut runs = Vec::new();
    let mut rerun = 0;
    for job in old {
        let spec = st.ci.runs[&job].spec.clone();
        if spec.status != "completed"
            || !spec
                .conclusion
                .as_deref()
                .is_some_and(|c| failing.contains(&c))
        {
            runs.push(job);
            continue;
        }
        let new = st.next_id();
        st.ci.runs.insert(
            new,
            RunRec {
                suite: id,
                spec: FakeCheckRunSpec {
                    status: "queued".into(),
                    conclusion: None,
                    ..spec
                },
                started_at: now(),
                completed_at: None,
            },
        );
        runs.push(new);
        rerun += 1;
    }
    if rerun == 0 {
        return gh_error(403, "This workflow run cannot be retried");
    }
    let suite = &mut st.ci.suites[index];
    suite.runs = runs;
    suite.status = "queued".into();
    suite.conclusion = None;
    st.ci.reruns.push(id);
    json_response(201, json!({}))
}
