//! The cost estimate in the status comment (SPEC §12, "Quote and confirmation"): the real
//! `kodx serve`, its database, a fake GitHub, a scripted fake Anthropic and the real Docker
//! engine. Every status comment shows it from its first version: "no history yet" until
//! three runs of the kind have ended in the repository, then their median and 90th
//! percentile beside the cap.

use crate::common;
use crate::common::serve::{usage, Served, REPO};
use serde_json::json;

/// The body of the first version of the bot's comment on `issue` (what creating it posted).
fn first_version(s: &Served, issue: u64) -> String {
    let path = format!("/repos/{REPO}/issues/{issue}/comments");
    let posted = s
        .github
        .requests()
        .into_iter()
        .find(|r| r.method == "POST" && r.path.ends_with(&path))
        .unwrap_or_else(|| panic!("no comment posted on #{issue}"));
    let body: serde_json::Value = serde_json::from_str(&posted.body).unwrap();
    body["body"].as_str().unwrap().to_owned()
}

fn estimate_of(body: &str) -> &str {
    body.lines()
        .find(|l| l.starts_with("estimate: "))
        .unwrap_or_else(|| panic!("no estimate line in {body}"))
}

#[tokio::test]
async fn the_estimate_appears_after_three_finished_runs() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github
        .set_file(REPO, ".github/kodx.yml", "cost_limit: { ask: 0.50 }\n");
    // Three asks that cost more and more, each on its own issue.
    for (i, input) in [(0u64, 10_000u64), (1, 20_000), (2, 40_000)] {
        let issue = 7 + 2 * i;
        s.github.add_issue(REPO, issue, "T", "B", "carol");
        s.model.reply(
            vec![json!({"type": "text", "text": "An answer."})],
            "end_turn",
            usage(input, 50),
        );
        s.comment(issue, "alice", "/kodx ask what is it?").await;
        s.finished_status(issue).await;
        let first = first_version(&s, issue);
        assert_eq!(
            estimate_of(&first),
            "estimate: no history yet · cap $0.5000"
        );
    }
    s.github.add_issue(REPO, 13, "T", "B", "carol");
    s.model.reply(
        vec![json!({"type": "text", "text": "An answer."})],
        "end_turn",
        usage(100, 5),
    );
    s.comment(13, "alice", "/kodx ask and now?").await;
    let done = s.finished_status(13).await;
    let first = first_version(&s, 13);
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(first, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ⏳ queued

    > /kodx ask and now?

    estimate: $0.0608 median, $0.1208 90th percentile of the last 3 `ask` runs here · cap $0.5000

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    // The finished comment shows the real cost, not the estimate.
    assert!(!done.contains("estimate: "), "{done}");
    s.finish().await;
}
