//! The fake GitHub's Checks API: `POST /repos/{owner}/{repo}/check-runs`, validated as
//! GitHub's OpenAPI description (`@octokit/openapi`, `checks/create`) says: the known keys
//! only, `name` and `head_sha` required strings, `status` and `conclusion` from their enums,
//! a conclusion required for a completed run (or one with `completed_at`), timestamps as
//! `YYYY-MM-DDTHH:MM:SSZ`, `output` with `title` and `summary` (each of `summary` and `text`
//! at most 65,535 characters), at most 50 annotations. The token needs `checks: write`; the
//! commit must exist in the git directory when there is one. Created runs are kept for
//! `check_runs()`.

use axum::extract::{Path, State};
use axum::response::Response;
use serde_json::{json, Value};

use super::{auth_installation, gh_error, json_response, refuse, FakeGitHub, Need, Req};

const CHECKS_WRITE: Need = &[("checks", "write")];

/// A Check Run created through the API.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeCheckRun {
    pub id: u64,
    pub repo: String,
    pub body: Value,
}

fn iso8601(v: &Value) -> bool {
    v.as_str().is_some_and(|s| {
        chrono::DateTime::parse_from_rfc3339(s).is_ok() && s.ends_with('Z') && s.len() == 20
    })
}

/// Why `body` is not a valid `checks/create` request, if it is not.
pub fn invalid(body: &Value) -> Option<String> {
    let obj = body.as_object()?;
    const KEYS: [&str; 11] = [
        "name",
        "head_sha",
        "details_url",
        "external_id",
        "status",
        "started_at",
        "conclusion",
        "completed_at",
        "output",
        "actions",
        "check_suite",
    ];
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Some(format!("unknown key {k}"));
    }
    for k in ["name", "head_sha"] {
        match obj.get(k) {
            Some(Value::String(s)) if !s.is_empty() => {}
            _ => return Some(format!("{k} must be a non-empty string")),
        }
    }
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
    if let Some(output) = obj.get("output") {
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
        if o.get("annotations")
            .is_some_and(|a| a.as_array().is_none_or(|a| a.len() > 50))
        {
            return Some("output.annotations must be an array of at most 50".into());
        }
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
    let sha = body["head_sha"].as_str().unwrap_or_default().to_string();
    if let Some(git) = super::git_view::open_repo(&fake, &key) {
        let exists = git2::Oid::from_str(&sha)
            .ok()
            .and_then(|oid| git.find_commit(oid).ok())
            .is_some();
        if !exists {
            return gh_error(422, "No commit found for SHA: ".to_string().as_str());
        }
    }
    let id = {
        let mut st = fake.state();
        st.next_id += 1;
        let id = st.next_id;
        st.check_runs.push(FakeCheckRun {
            id,
            repo: key.clone(),
            body: body.clone(),
        });
        id
    };
    fake.notify();
    let base = format!("{}/repos/{owner}/{repo}", fake.url());
    let html = format!("{}/{owner}/{repo}/runs/{id}", fake.root());
    let mut answer = json!({
        "id": id,
        "head_sha": sha,
        "node_id": format!("CR_{id}"),
        "external_id": body.get("external_id").cloned().unwrap_or(json!("")),
        "url": format!("{base}/check-runs/{id}"),
        "html_url": html,
        "details_url": body.get("details_url").cloned().unwrap_or(Value::Null),
        "status": body.get("status").cloned().unwrap_or(json!("queued")),
        "conclusion": body.get("conclusion").cloned().unwrap_or(Value::Null),
        "started_at": body.get("started_at").cloned().unwrap_or(Value::Null),
        "completed_at": body.get("completed_at").cloned().unwrap_or(Value::Null),
        "output": {
            "title": body["output"]["title"].clone(),
            "summary": body["output"]["summary"].clone(),
            "text": body["output"]["text"].clone(),
            "annotations_count": 0,
            "annotations_url": format!("{base}/check-runs/{id}/annotations"),
        },
        "name": body["name"].clone(),
        "check_suite": {"id": id + 1},
        "app": {"id": fake.app_id(), "slug": fake.slug()},
        "pull_requests": [],
    });
    if answer["conclusion"].is_string() {
        answer["status"] = json!("completed");
    }
    json_response(201, answer)
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
}
