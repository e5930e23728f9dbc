//! kodx's Check Run (SPEC §11, §12): created completed on a commit, with its first
//! annotations; more annotations go in updates (`PATCH …/check-runs/{id}`), which GitHub
//! appends to the run's. Both are writes, so a guarded client asks its guard before each
//! attempt ([`super::guard`]) like every other write.

use axum::http; // the `http` crate, which octocrab's raw request API speaks
use serde_json::{json, Value};

use super::error::GitHubError;
use super::installation::repo_path;
use super::transport::JSON;
use super::types::{CreatedCheckRun, NewCheckRun, RepoName};
use super::{wire, Installation};
use crate::checks::{Annotation, Level};

/// Annotations GitHub takes in one request (`checks/create`, `checks/update`).
pub const ANNOTATIONS_PER_REQUEST: usize = 50;
/// GitHub's limit on a Check Run's `summary` and `text`, in characters.
const MAX_OUTPUT_CHARS: usize = 65_535;
/// GitHub's limit on an annotation's `title`, in characters.
const MAX_TITLE_CHARS: usize = 255;
/// GitHub's limit on an annotation's `message` is 64 KB; kodx's messages are far shorter
/// ([`crate::checks::annotate`]), this only keeps a request valid whatever it is given.
const MAX_MESSAGE_BYTES: usize = 60 * 1024;

impl Installation {
    /// Creates a completed Check Run on a commit (SPEC §11) with `run.annotations` (the
    /// first [`ANNOTATIONS_PER_REQUEST`] of them); returns its id and page. Over-long
    /// `summary` and `text` are cut to GitHub's 65,535 characters.
    pub async fn create_check_run(
        &self,
        repo: &RepoName,
        run: &NewCheckRun,
    ) -> Result<CreatedCheckRun, GitHubError> {
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
        let mut body = json!({
            "name": run.name,
            "head_sha": run.head_sha,
            "status": "completed",
            "conclusion": run.conclusion,
            "completed_at": now,
            "output": output(run, &run.annotations),
        });
        if let Some(url) = &run.details_url {
            body["details_url"] = url.as_str().into();
        }
        if let Some(id) = &run.external_id {
            body["external_id"] = id.as_str().into();
        }
        let path = format!("{}/check-runs", repo_path(repo));
        let what = format!("POST {path}");
        let raw = self
            .request(http::Method::POST, &path, None, JSON, Some(&body))
            .await?;
        let v = raw.json(&what)?;
        Ok(wire::decode::<wire::CheckRunCreated>(&v, &what)?.into())
    }

    /// Adds `annotations` (the first [`ANNOTATIONS_PER_REQUEST`]) to Check Run `id`: an
    /// update whose `output` carries `run`'s title, summary and text again (an update's
    /// output needs its title and summary) with the annotations, which GitHub appends to
    /// those the run has.
    pub async fn add_check_run_annotations(
        &self,
        repo: &RepoName,
        id: u64,
        run: &NewCheckRun,
        annotations: &[Annotation],
    ) -> Result<(), GitHubError> {
        let body = json!({ "output": output(run, annotations) });
        let path = format!("{}/check-runs/{id}", repo_path(repo));
        let what = format!("PATCH {path}");
        self.request(http::Method::PATCH, &path, None, JSON, Some(&body))
            .await?
            .json(&what)?;
        Ok(())
    }
}

/// A Check Run's `output`: title, summary and text cut to GitHub's limits, and at most
/// [`ANNOTATIONS_PER_REQUEST`] annotations (none: no `annotations` key).
fn output(run: &NewCheckRun, annotations: &[Annotation]) -> Value {
    let mut out = json!({
        "title": run.title,
        "summary": cut(&run.summary),
        "text": cut(&run.text),
    });
    let annotations: Vec<Value> = annotations
        .iter()
        .take(ANNOTATIONS_PER_REQUEST)
        .map(annotation)
        .collect();
    if !annotations.is_empty() {
        out["annotations"] = annotations.into();
    }
    out
}

fn cut(t: &str) -> String {
    if t.chars().count() <= MAX_OUTPUT_CHARS {
        return t.to_string();
    }
    let mut out: String = t.chars().take(MAX_OUTPUT_CHARS - 20).collect();
    out.push_str("\n[… cut by kodx]");
    out
}

/// One annotation as GitHub's `check-annotation` spells it: `annotation_level`, columns
/// only on a one-line annotation, the title within 255 characters.
fn annotation(a: &Annotation) -> Value {
    let level = match a.level {
        Level::Notice => "notice",
        Level::Warning => "warning",
        Level::Failure => "failure",
    };
    let start = a.start_line.max(1);
    let end = a.end_line.max(start);
    let mut message = a.message.clone();
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    let mut v = json!({
        "path": a.path,
        "start_line": start,
        "end_line": end,
        "annotation_level": level,
        "message": message,
    });
    if start == end {
        let columns = a.start_column.filter(|c| *c >= 1).map(|start_col| {
            let end_col = a
                .end_column
                .filter(|c| *c >= start_col)
                .unwrap_or(start_col);
            (start_col, end_col)
        });
        if let Some((s, e)) = columns {
            v["start_column"] = s.into();
            v["end_column"] = e.into();
        }
    }
    if let Some(title) = a.title.as_deref().filter(|t| !t.is_empty()) {
        v["title"] = title
            .chars()
            .take(MAX_TITLE_CHARS)
            .collect::<String>()
            .into();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(line: u32, column: Option<u32>) -> Annotation {
        Annotation {
            path: "src/main.c".into(),
            start_line: line,
            end_line: line,
            start_column: column,
            end_column: None,
            level: Level::Warning,
            message: "unused variable".into(),
            title: Some("t".repeat(300)),
        }
    }

    #[test]
    fn annotations_are_spelled_as_github_wants_them() {
        let v = annotation(&a(3, Some(7)));
        assert_eq!(v["annotation_level"], "warning");
        assert_eq!(
            (v["start_line"].as_u64(), v["end_line"].as_u64()),
            (Some(3), Some(3))
        );
        assert_eq!(
            (v["start_column"].as_u64(), v["end_column"].as_u64()),
            (Some(7), Some(7))
        );
        assert_eq!(v["title"].as_str().unwrap().chars().count(), 255);
        let mut two_lines = a(3, Some(7));
        two_lines.end_line = 5;
        let v = annotation(&two_lines);
        assert!(
            v.get("start_column").is_none() && v.get("end_column").is_none(),
            "{v}"
        );
        assert!(annotation(&a(3, None)).get("start_column").is_none());
        let run = NewCheckRun {
            name: "kodx".into(),
            head_sha: "abc".into(),
            conclusion: "failure".into(),
            title: "t".into(),
            summary: "s".into(),
            text: String::new(),
            details_url: None,
            external_id: None,
            annotations: Vec::new(),
        };
        assert!(output(&run, &[]).get("annotations").is_none());
        let many: Vec<Annotation> = (1..=60).map(|l| a(l, None)).collect();
        assert_eq!(
            output(&run, &many)["annotations"].as_array().unwrap().len(),
            50
        );
    }
}
