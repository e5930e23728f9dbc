//! The fake GitHub's Checks API, validated as GitHub's OpenAPI description
//! (`@octokit/openapi`, `checks/create` and `checks/update`) says:
//!
//! - `POST /repos/{owner}/{repo}/check-runs`: the known keys only, `name` and `head_sha`
//!   required strings, `status` and `conclusion` from their enums, a conclusion required for
//!   a completed run (or one with `completed_at`), timestamps as `YYYY-MM-DDTHH:MM:SSZ`;
//!   the commit must exist in the git directory when there is one.
//! - `PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}`: the same keys but `head_sha`,
//!   none required; an unknown id (or one of another repository) is 404.
//! - Both: `output` with `title` (the description says **Required** for an update too) and
//!   `summary`, each of `summary` and `text` at most 65,535 characters, at most 50
//!   annotations, each an object of exactly the `check-annotation` keys — `path`,
//!   `start_line`, `end_line`, `annotation_level` (notice, warning, failure) and `message`
//!   required; `title` (at most 255 characters), `raw_details`, `start_column`,
//!   `end_column` optional; lines and columns integers from 1, columns only when
//!   `start_line == end_line`; `message` and `raw_details` at most 64 KB.
//!
//! Anything else is refused with 422 (and recorded in `refused()`). The token needs
//! `checks: write`. Created runs and their updates are kept for `check_runs()`; an
//! update's annotations are appended to the run's, as GitHub does.

use axum::extract::{Path, State};
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::{auth_installation, gh_error, json_response, refuse, FakeGitHub, Need, Req};

const CHECKS_WRITE: Need = &[("checks", "write")];

/// A Check Run created through the API, with the updates it got.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeCheckRun {
    pub id: u64,
    pub repo: String,
    /// The `checks/create` request's body.
    pub body: Value,
    /// The bodies of the `checks/update` requests, in order.
    pub updates: Vec<Value>,
}

impl FakeCheckRun {
    /// Every annotation the run holds: the create request's, then each update's.
    pub fn annotations(&self) -> Vec<Value> {
        std::iter::once(&self.body)
            .chain(&self.updates)
            .filter_map(|b| b["output"]["annotations"].as_array())
            .flatten()
            .cloned()
            .collect()
    }

    /// How many annotations each request carried: the create's, then each update's.
    pub fn annotation_batches(&self) -> Vec<usize> {
        std::iter::once(&self.body)
            .chain(&self.updates)
            .map(|b| b["output"]["annotations"].as_array().map_or(0, Vec::len))
            .collect()
    }
}

fn iso8601(v: &Value) -> bool {
    v.as_str().is_some_and(|s| {
        chrono::DateTime::parse_from_rfc3339(s).is_ok() && s.ends_with('Z') && s.len() == 20
    })
}

/// The keys of a `checks/update` body; `checks/create` has `head_sha` besides.
const UPDATE_KEYS: [&str; 9] = [
    "name",
    "details_url",
    "external_id",
    "status",
    "started_at",
    "conclusion",
    "completed_at",
    "output",
    "actions",
];

/// Why `body` is not a valid `checks/create` request, if it is not.
pub fn invalid(body: &Value) -> Option<String> {
    let obj = body.as_object()?;
    let known = |k: &str| k == "head_sha" || k == "check_suite" || UPDATE_KEYS.contains(&k);
    if let Some(k) = obj.keys().find(|k| !known(k)) {
        return Some(format!("unknown key {k}"));
    }
    for k in ["name", "head_sha"] {
        match obj.get(k) {
            Some(Value::String(s)) if !s.is_empty() => {}
            _ => return Some(format!("{k} must be a non-empty string")),
        }
    }
    invalid_fields(obj)
}

/// Why `body` is not a valid `checks/update` request, if it is not.
pub fn invalid_update(body: &Value) -> Option<String> {
    let Some(obj) = body.as_object() else {
        return Some("the body must be an object".into());
    };
    if let Some(k) = obj.keys().find(|k| !UPDATE_KEYS.contains(&k.as_str())) {
        return Some(format!("unknown key {k}"));
    }
    if obj.get("name").is_some_and(|v| !v.is_string()) {
        return Some("name must be a string".into());
    }
    invalid_fields(obj)
}

/// What `checks/create` and `checks/update` check alike.
fn invalid_fields(obj: &Map<String, Value>) -> Option<String> {
    for k in ["details_url", "external_id"] {
        if obj.get(k).is_some_and(|v| !v.is_string()) {
            return Some(format!("{k} must be a string"));
        }
    }
    let status = obj.get("status").map(|v| v.as_str());
    if let Some(s) = status {
        if !matches!(s, Some("queued" | "in_progress" | "completed")) {
            return Some("status must be queued, in_progress or completed".into());
        }
    }
    let conclusion = obj.get("conclusion");
    if let Some(c) = conclusion {
        let ok = matches!(
            c.as_str(),
            Some(
                "action_required"
                    | "cancelled"
                    | "failure"
                    | "neutral"
                    | "success"
                    | "skipped"
                    | "timed_out"
            )
        );
        if !ok {
            return Some(format!("conclusion {c} is not one GitHub accepts"));
        }
    }
    let completed = status == Some(Some("completed")) || obj.contains_key("completed_at");
    if completed && conclusion.is_none() {
        return Some("a completed check run needs a conclusion".into());
    }
    for k in ["started_at", "completed_at"] {
        if obj.get(k).is_some_and(|v| !iso8601(v)) {
            return Some(format!("{k} must be YYYY-MM-DDTHH:MM:SSZ"));
        }
    }
    obj.get("output").and_then(invalid_output)
}

fn invalid_output(output: &Value) -> Option<String> {
    let Some(o) = output.as_object() else {
        return Some("output must be an object".into());
    };
    for k in o.keys() {
        if !["title", "summary", "text", "annotations", "images"].contains(&k.as_str()) {
            return Some(format!("unknown key output.{k}"));
        }
    }
    for k in ["title", "summary"] {
        if !o.get(k).is_some_and(Value::is_string) {
            return Some(format!("output.{k} is required and must be a string"));
        }
    }
    for k in ["summary", "text"] {
        if let Some(v) = o.get(k) {
            let Some(s) = v.as_str() else {
                return Some(format!("output.{k} must be a string"));
            };
            if s.chars().count() > 65_535 {
                return Some(format!("output.{k} is over 65535 characters"));
            }
        }
    }
    match o.get("annotations")?.as_array() {
        Some(a) if a.len() <= 50 => a
            .iter()
            .enumerate()
            .find_map(|(i, a)| invalid_annotation(a).map(|why| format!("annotations[{i}]: {why}"))),
        _ => Some("output.annotations must be an array of at most 50".into()),
    }
}

/// Why `a` is not a `check-annotation` item, if it is not.
pub fn invalid_annotation(a: &Value) -> Option<String> {
    const KEYS: [&str; 9] = [
        "path",
        "start_line",
        "end_line",
        "start_column",
        "end_column",
        "annotation_level",
        "message",
        "title",
        "raw_details",
    ];
    const MAX_BYTES: usize = 64 * 1024;
    let Some(obj) = a.as_object() else {
        return Some("must be an object".into());
    };
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Some(format!("unknown key {k}"));
    }
    for k in ["path", "annotation_level", "message"] {
        if !obj.get(k).is_some_and(Value::is_string) {
            return Some(format!("{k} is required and must be a string"));
        }
    }
    for k in ["title", "raw_details"] {
        if obj.get(k).is_some_and(|v| !v.is_string()) {
            return Some(format!("{k} must be a string"));
        }
    }
    // Integers from 1 ("Line numbers start at 1", "Column numbers start at 1").
    let number = |k: &str| obj.get(k).map(|v| v.as_u64().filter(|n| *n >= 1));
    for k in ["start_line", "end_line"] {
        if number(k).flatten().is_none() {
            return Some(format!("{k} is required and must be an integer from 1"));
        }
    }
    for k in ["start_column", "end_column"] {
        if number(k).is_some_and(|n| n.is_none()) {
            return Some(format!("{k} must be an integer from 1"));
        }
    }
    let has_column = obj.contains_key("start_column") || obj.contains_key("end_column");
    if has_column && obj["start_line"] != obj["end_line"] {
        return Some("columns only when start_line and end_line are the same".into());
    }
    if !matches!(
        obj["annotation_level"].as_str(),
        Some("notice" | "warning" | "failure")
    ) {
        return Some("annotation_level must be notice, warning or failure".into());
    }
    if obj["path"].as_str().is_some_and(str::is_empty) {
        return Some("path must not be empty".into());
    }
    for k in ["message", "raw_details"] {
        if obj
            .get(k)
            .and_then(Value::as_str)
            .is_some_and(|s| s.len() > MAX_BYTES)
        {
            return Some(format!("{k} is over 64 KB"));
        }
    }
    if obj
        .get("title")
        .and_then(Value::as_str)
        .is_some_and(|s| s.chars().count() > 255)
    {
        return Some("title is over 255 characters".into());
    }
    None
}

/// `POST /repos/{owner}/{repo}/check-runs`.
pub(super) async fn create_check_run(
    State(fake): State<FakeGitHub>,
    Path((owner, repo)): Path<(String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, CHECKS_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
        return refuse(
            &fake,
            &req,
            400,
            "Problems parsing JSON",
            "body is not JSON",
        );
    };
    if let Some(why) = invalid(&body) {
        return refuse(&fake, &req, 422, "Invalid request.", &why);
    }
    if let Some(git) = super::git_view::open_repo(&fake, &key) {
        let sha = body["head_sha"].as_str().unwrap_or_default();
        let exists = git2::Oid::from_str(sha)
            .ok()
            .and_then(|oid| git.find_commit(oid).ok())
            .is_some();
        if !exists {
            return gh_error(422, "No commit found for SHA: ".to_string().as_str());
        }
    }
    let run = {
        let mut st = fake.state();
        st.next_id += 1;
        let run = FakeCheckRun {
            id: st.next_id,
            repo: key.clone(),
            body,
            updates: Vec::new(),
        };
        st.check_runs.push(run.clone());
        run
    };
    fake.notify();
    json_response(201, answer(&fake, &owner, &repo, &run))
}

/// `PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}`: what the update says replaces
/// what the run said; its annotations are added to the run's.
pub(super) async fn update_check_run(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, CHECKS_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
        return refuse(
            &fake,
            &req,
            400,
            "Problems parsing JSON",
            "body is not JSON",
        );
    };
    if let Some(why) = invalid_update(&body) {
        return refuse(&fake, &req, 422, "Invalid request.", &why);
    }
    let run = {
        let mut st = fake.state();
        let found = id.parse::<u64>().ok().and_then(|id| {
            st.check_runs
                .iter_mut()
                .find(|r| r.id == id && r.repo == key)
        });
        let Some(run) = found else {
            return gh_error(404, "Not Found");
        };
        run.updates.push(body);
        run.clone()
    };
    fake.notify();
    json_response(200, answer(&fake, &owner, &repo, &run))
}

/// The run as GitHub shows it: its create request with each update's fields over it.
fn answer(fake: &FakeGitHub, owner: &str, repo: &str, run: &FakeCheckRun) -> Value {
    let id = run.id;
    let mut now = run.body.clone();
    for update in &run.updates {
        for (k, v) in update.as_object().into_iter().flatten() {
            now[k] = v.clone();
        }
    }
    let base = format!("{}/repos/{owner}/{repo}", fake.url());
    let html = format!("{}/{owner}/{repo}/runs/{id}", fake.root());
    let mut answer = json!({
        "id": id,
        "head_sha": now["head_sha"].clone(),
        "node_id": format!("CR_{id}"),
        "external_id": now.get("external_id").cloned().unwrap_or(json!("")),
        "url": format!("{base}/check-runs/{id}"),
        "html_url": html,
        "details_url": now.get("details_url").cloned().unwrap_or(Value::Null),
        "status": now.get("status").cloned().unwrap_or(json!("queued")),
        "conclusion": now.get("conclusion").cloned().unwrap_or(Value::Null),
        "started_at": now.get("started_at").cloned().unwrap_or(Value::Null),
        "completed_at": now.get("completed_at").cloned().unwrap_or(Value::Null),
        "output": {
            "title": now["output"]["title"].clone(),
            "summary": now["output"]["summary"].clone(),
            "text": now["output"]["text"].clone(),
            "annotations_count": run.annotations().len(),
            "annotations_url": format!("{base}/check-runs/{id}/annotations"),
        },
        "name": now["name"].clone(),
        "check_suite": {"id": id + 1},
        "app": {"id": fake.app_id(), "slug": fake.slug()},
        "pull_requests": [],
    });
    if answer["conclusion"].is_string() {
        answer["status"] = json!("completed");
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_held() {
        let ok = json!({"name": "kodx", "head_sha": "abc", "status": "completed",
            "conclusion": "success", "completed_at": "2026-11-26T10:00:00Z",
            "output": {"title": "t", "summary": "s", "text": "x"}});
        assert_eq!(invalid(&ok), None);
        for (k, v) in [
            ("name", Value::Null),
            ("status", json!("done")),
            ("conclusion", json!("stale")),
            ("completed_at", json!("2026-11-26 10:00")),
            ("output", json!({"title": "t"})),
            ("extra", json!(1)),
        ] {
            let mut bad = ok.clone();
            bad[k] = v;
            assert!(invalid(&bad).is_some(), "{k}");
        }
        let mut no_conclusion = ok.clone();
        no_conclusion.as_object_mut().unwrap().remove("conclusion");
        assert!(invalid(&no_conclusion).is_some());
    }

    #[test]
    fn updates_and_annotations_hold_the_schema() {
        let ok = json!({"output": {"title": "t", "summary": "s", "annotations": [
            {"path": "src/a.c", "start_line": 3, "end_line": 3, "start_column": 5,
             "end_column": 5, "annotation_level": "failure", "message": "m", "title": "t"},
            {"path": "src/b.c", "start_line": 3, "end_line": 4,
             "annotation_level": "notice", "message": "m", "raw_details": "r"},
        ]}});
        assert_eq!(invalid_update(&ok), None);
        assert_eq!(invalid_update(&json!({"conclusion": "failure"})), None);
        // A create carries the same annotations.
        let mut create = json!({"name": "kodx", "head_sha": "abc"});
        create["output"] = ok["output"].clone();
        assert_eq!(invalid(&create), None);
        for bad in [
            json!({"head_sha": "abc"}),
            json!({"output": {"summary": "s"}}),
            json!({"output": {"title": "t", "summary": "s", "annotations": {}}}),
            json!({"output": {"title": "t", "summary": "s",
                "annotations": vec![ok["output"]["annotations"][1].clone(); 51]}}),
        ] {
            assert!(invalid_update(&bad).is_some(), "{bad}");
        }
        let base = ok["output"]["annotations"][0].clone();
        let with = |k: &str, v: Value| {
            let mut a = base.clone();
            a[k] = v;
            a
        };
        let without = |k: &str| {
            let mut a = base.clone();
            a.as_object_mut().unwrap().remove(k);
            a
        };
        let mut bad = vec![
            with("annotation_level", json!("error")),
            with("start_line", json!(0)),
            with("start_line", json!("3")),
            with("end_line", json!(1.5)),
            with("end_line", json!(4)),
            with("start_column", json!(0)),
            with("level", json!("failure")),
            with("title", json!("t".repeat(256))),
            with("message", json!("m".repeat(64 * 1024 + 1))),
            with("path", json!("")),
            json!("src/a.c:3"),
        ];
        bad.extend(
            [
                "path",
                "start_line",
                "end_line",
                "annotation_level",
                "message",
            ]
            .map(without),
        );
        for a in bad {
            assert!(invalid_annotation(&a).is_some(), "{a}");
            let body = json!({"output": {"title": "t", "summary": "s", "annotations": [a]}});
            assert!(invalid_update(&body).is_some());
        }
        assert_eq!(invalid_annotation(&without("start_column")), None);
    }
}
