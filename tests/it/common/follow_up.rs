//! What the tests and the benchmark of the pull request's life (SPEC §11) share: a
//! repository config, a same-repository pull request, review threads, a failing Actions
//! job, CI events and waiting for a run's end.

use serde_json::{json, Value};

use super::fake_github::{
    FakeCheckRunSpec, FakeLog, FakePull, FakeSuite, FakeThread, ACTIONS_SLUG,
};
use super::serve::{delivery_id, text, tool, usage, BranchPull, Served, INSTALLATION, REPO};

/// Commits `.github/kodx.yml` with `yaml` on `main`.
pub fn config(s: &Served, yaml: &str) {
    s.git.commit_on_branch(
        REPO,
        "main",
        &[(".github/kodx.yml", yaml.as_bytes(), 0o644)],
        "kodx config",
    );
}

/// A pull request kodx opened: `.github/kodx.yml` set to `yaml`, then `/kodx code add
/// a.txt` on issue #7 (the model writes `a.txt` and says `summary`), to its end.
pub async fn kodx_pull(s: &Served, yaml: &str, summary: &str) -> FakePull {
    config(s, yaml);
    s.github.add_issue(REPO, 7, "Add a.txt", "", "carol");
    s.model
        .reply(tool("echo one > a.txt"), "tool_use", usage(1000, 10));
    s.model.reply(text(summary), "end_turn", usage(1100, 10));
    s.comment(7, "alice", "/kodx code add a.txt").await;
    let done = s.finished_status(7).await;
    assert!(done.contains("✅ done"), "{done}\n{}", s.log());
    s.github.created_pulls(REPO).remove(0)
}

/// The text of the first user message of model request `i`.
pub fn first_user_text(s: &Served, i: usize) -> String {
    let body = &s.model.requests()[i].body;
    let first = &body["messages"][0];
    match first["content"].as_str() {
        Some(t) => t.to_string(),
        None => first["content"].to_string(),
    }
}

/// A same-repository pull request #`number` from a new branch `feature` with one file.
pub fn feature_pull(s: &Served, number: u64) -> String {
    let head = s.git.commit_on_branch(
        REPO,
        "feature",
        &[(
            "src/flag.rs",
            b"pub const FLAG: &str = \"verbose\";\n",
            0o644,
        )],
        "Add a flag",
    );
    let base = s.git.branch_sha(REPO, "main").unwrap();
    s.add_branch_pull(BranchPull {
        number,
        title: "Add a flag",
        body: "Adds the verbose flag.",
        author: "carol",
        branch: "feature",
        head: &head,
        base: &base,
        diff: "diff --git a/src/flag.rs b/src/flag.rs\n+pub const FLAG: &str = \"verbose\";\n",
    });
    head
}

/// An open review thread on `path` at `line` with `comments` (login, body).
pub fn thread(path: &str, line: i64, comments: &[(&str, &str)], can_resolve: bool) -> FakeThread {
    FakeThread {
        path: path.into(),
        line: Some(line),
        original_line: Some(line),
        outdated: false,
        resolved: false,
        can_resolve,
        diff_hunk: "@@ -0,0 +1 @@\n+pub const FLAG: &str = \"verbose\";".into(),
        comments: comments
            .iter()
            .map(|(who, body)| (who.to_string(), who.ends_with("[bot]"), body.to_string()))
            .collect(),
    }
}

/// Waits until run `id` has ended; its stop reason.
pub async fn ended(s: &Served, id: &str) -> String {
    let db = s.db().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        if let Some(r) = db.get_run(id).await.unwrap() {
            if r.status.is_final() {
                db.close().await;
                return r.stop_reason.map(|e| e.to_string()).unwrap_or_default();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "run {id} did not end\n{}",
            s.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Delivers a CI event; the run it queued (or `None` when it was ignored at the door).
pub async fn ci_event(s: &Served, event: &str, payload: &Value) -> Option<String> {
    let (status, answer) = s.deliver(event, &delivery_id(), payload).await;
    match status {
        202 => Some(answer["run_id"].as_str().unwrap().to_string()),
        200 => None,
        other => panic!("{event}: {other} {answer}"),
    }
}

/// A GitHub Actions suite on `commit` whose one job fails ([`failing_tests`]); its id.
pub fn red_actions_suite(s: &Served, commit: &str) -> u64 {
    s.github.add_check_suite(
        REPO,
        commit,
        FakeSuite::of(ACTIONS_SLUG, vec![failing_tests()]),
    )
}

/// A failing GitHub Actions job whose log has its error among timestamps and colours.
pub fn failing_tests() -> FakeCheckRunSpec {
    let log = "2026-11-26T10:00:00.1000000Z ##[group]Run cargo test\n\
               2026-11-26T10:00:01.1000000Z \u{1b}[32m   Compiling\u{1b}[0m widgets v0.1.0\n\
               2026-11-26T10:00:02.1000000Z test tests::counts ... FAILED\n\
               2026-11-26T10:00:02.2000000Z thread 'tests::counts' panicked at src/lib.rs:9:5:\n\
               2026-11-26T10:00:02.3000000Z assertion `left == right` failed: expected 2, got 3\n\
               2026-11-26T10:00:03.1000000Z ##[error]Process completed with exit code 101.\n";
    FakeCheckRunSpec::completed("test", "failure")
        .with_output("Tests failed", "1 test failed")
        .with_annotations(&["Process completed with exit code 101."])
        .with_log(FakeLog::Text(log.into()))
}

/// GitHub's documented `push` payload (`tests/data/webhooks-push.json`, from
/// `@octokit/webhooks-examples`) for a push to `main` from `before` to `after`.
pub fn push_payload(s: &Served, before: &str, after: &str) -> Value {
    let data: Value =
        serde_json::from_str(include_str!("../../data/webhooks-push.json")).expect("push examples");
    let mut p = data["branch"].clone();
    p["ref"] = json!("refs/heads/main");
    p["before"] = json!(before);
    p["after"] = json!(after);
    p["installation"]["id"] = json!(INSTALLATION);
    let r = &mut p["repository"];
    r["full_name"] = json!(REPO);
    r["name"] = json!("widgets");
    r["clone_url"] = json!(s.clone_url);
    r["default_branch"] = json!("main");
    r["master_branch"] = json!("main");
    p
}

/// The fake GitHub's answer to `GET <path>` (under `/repos/{REPO}`), read as kodx reads it
/// with `token`.
pub async fn github_get(s: &Served, token: &str, path: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{}/repos/{REPO}/{path}", s.github.url()))
        .header("authorization", format!("token {token}"))
        .header("accept", "application/vnd.github+json")
        .header("user-agent", "kodx-test")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
