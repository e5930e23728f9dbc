//! `/kodx continue` end to end (issue 12): the real `kodx serve`, a fake GitHub, a real git
//! server, a scripted fake Anthropic and the real Docker engine. A code run a limit stopped
//! goes on from its stored conversation and its pushed branch, into the same pull request.

use crate::common;
use crate::common::serve::{text, tool, usage, Options, Served, REPO};
use serde_json::Value;

/// A request's messages without the prompt-cache markers (the provider puts them on the
/// newest blocks, so they move as the conversation grows).
fn messages(body: &Value) -> Vec<Value> {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("cache_control");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut m = body["messages"].clone();
    strip(&mut m);
    m.as_array().unwrap().clone()
}

fn rev_parse(s: &Served, rev: &str) -> String {
    let out = s.git.git(&s.git.bare_path(REPO), &["rev-parse", rev]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

async fn done_where(s: &Served, number: u64, marker: &'static str) -> String {
    s.bot_comment_where(number, marker, |c| {
        c.body.contains(marker) && (c.body.contains("✅") || c.body.contains("❌"))
    })
    .await
    .body
}

/// A run its step limit stops opens a draft pull request; `/kodx continue 5 steps` goes on
/// with the same conversation (told the environment was restarted) on that branch, and
/// finishes it as the same pull request, with both parts' costs in its comment.
#[tokio::test]
async fn continue_finishes_a_stopped_run_as_one_pull_request() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Big", "", "carol");
    s.github
        .set_file(REPO, ".github/kodx.yml", "max_iterations: 2\n");
    s.model
        .reply(tool("echo x > x.txt"), "tool_use", usage(2000, 100));
    s.model.reply(
        text("Wrote x.txt; y.txt is left."),
        "end_turn",
        usage(2100, 20),
    );
    s.comment(7, "alice", "/kodx code do a lot").await;
    let first = done_where(&s, 7, "step limit").await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(first, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ stopped — step limit reached

    > /kodx code do a lot

    ```text
    the run made its 2 model calls (max_iterations); the last one asked for a summary
    ```

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    It holds the work done so far, marked incomplete. To go on from here, comment `/kodx continue` where it was asked (the repository's limits again), `/kodx continue $2` (a cost limit of $2) or `/kodx continue 20 steps` (a step limit of 20); or finish it by hand.

    <details><summary>The agent's last message</summary>

    Wrote x.txt; y.txt is left.

    </details>

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 4,100 | 120 | 0 | 0 | $0.0141 of $2.00 | [duration] (agent [duration]) | `max_iterations` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let (number, branch) = (pulls[0].number, pulls[0].head.clone());
    let head_before = rev_parse(&s, &format!("refs/heads/{branch}"));

    // The second part: the tree has x.txt (from the branch), it adds y.txt and ends.
    s.model.reply(
        tool("test -f x.txt && echo y > y.txt"),
        "tool_use",
        usage(2500, 100),
    );
    s.model.reply(
        text("Wrote y.txt too; all done."),
        "end_turn",
        usage(2600, 20),
    );
    s.comment(7, "alice", "/kodx continue 5 steps").await;
    let second = done_where(&s, 7, "Continued").await;
    // The continuation went on in the stopped run's status comment: one for the whole run.
    let status = common::serve::bot_comments(&s, 7);
    assert_eq!(status.len(), 1, "{status:#?}");
    assert!(
        status[0]
            .edits
            .iter()
            .any(|e| e.contains("marked incomplete")),
        "the same comment showed the first part's end: {:#?}",
        status[0].edits
    );
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(second, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done

    > /kodx continue 5 steps

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    Wrote y.txt too; all done.

    **Continued** from run `[hex]`: earlier parts $0.0141, this part $0.0171, **$0.0312 in total**. Its pull request is now ready for review.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 5,100 | 120 | 0 | 0 | $0.0171 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#));

    // The model's first request of the second part starts with the first part's
    // conversation and tells it the environment was restarted.
    let requests = s.model.requests();
    assert_eq!(requests.len(), 4, "two calls per part");
    let earlier = messages(&requests[1].body);
    let resumed = messages(&requests[2].body);
    assert!(resumed.len() > earlier.len(), "{resumed:?}");
    assert_eq!(&resumed[..earlier.len()], &earlier[..]);
    assert!(
        resumed[..earlier.len()]
            .iter()
            .any(|m| m.to_string().contains("do a lot")),
        "the first prompt is the start: {earlier:?}"
    );
    let last = resumed.last().unwrap().to_string();
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(last, @r#"{"content":[{"text":"[kodx: this run was resumed in a new environment: the files are as the earlier run left them, but its shells, running processes and anything installed outside the repository are gone (the setup script ran again). Continue the task.]","type":"text"}],"role":"user"}"#));

    // One pull request, the same branch, a second commit on top of the first.
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    assert_eq!(pulls[0].number, number);
    assert!(
        !pulls[0].title.starts_with("[incomplete]"),
        "the title says it is done: {:?}",
        pulls[0]
    );
    // The draft the first part opened is ready for review now (GitHub's GraphQL mutation).
    assert!(!pulls[0].draft, "{:?}", pulls[0]);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(second, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done

    > /kodx continue 5 steps

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    Wrote y.txt too; all done.

    **Continued** from run `[hex]`: earlier parts $0.0141, this part $0.0171, **$0.0312 in total**. Its pull request is now ready for review.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 5,100 | 120 | 0 | 0 | $0.0171 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    let head = format!("refs/heads/{branch}");
    assert_eq!(
        s.git.file_at(REPO, &head, "x.txt").as_deref(),
        Some(&b"x\n"[..])
    );
    assert_eq!(
        s.git.file_at(REPO, &head, "y.txt").as_deref(),
        Some(&b"y\n"[..])
    );
    let parent = rev_parse(&s, &format!("{head}~1"));
    assert_eq!(parent, head_before, "the continuation's commit is on top");
    // The comment links the same pull request: its snapshot above shows `/pull/8`.
    assert_eq!(number, 8);
    s.finish().await;
}

/// `/kodx continue` where nothing stopped, by someone without write access, and asking
/// for more than the server allows: each refused with one clear sentence, no model call.
#[tokio::test]
async fn continue_is_refused_when_there_is_nothing_to_continue_or_no_right_to() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 8, "Nothing here", "", "carol");
    s.comment(8, "alice", "/kodx continue").await;
    let body = s
        .bot_comment_where(8, "the refusal", |c| c.body.contains("did not continue"))
        .await
        .body;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @"
    kodx did not continue: there is no stopped `/kodx code` run here to continue.

    <sub>kodx run <code>[run]</code></sub>
    ")
    });

    s.comment(8, "alice", "/kodx continue $50").await;
    let body = s
        .bot_comment_where(8, "the maximum", |c| c.body.contains("allows per run"))
        .await
        .body;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @"
    kodx did not continue: `/kodx continue $50` asks for more than this server allows per run ($10.00).

    <sub>kodx run <code>[run]</code></sub>
    "));

    s.github.set_permission(REPO, "mallory", "read");
    s.comment(8, "mallory", "/kodx continue").await;
    let body = s
        .bot_comment_where(8, "the permission refusal", |c| {
            c.body.contains("can only be run by")
        })
        .await
        .body;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @"@mallory `/kodx continue` can only be run by people with write, maintain or admin access to this repository; your permission here is `read`."));
    s.finish().await;
    assert!(s.model.requests().is_empty(), "no model call");
}

/// A stopped run cannot be continued once the monthly budget is spent.
#[tokio::test]
async fn continue_is_refused_when_the_monthly_budget_is_spent() {
    let _engine = common::require_engine!();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\nmonthly_budget_usd = 0.10\n"),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Budget", "", "carol");
    // The run may spend at most the $0.10 left: one call bills $0.0915, then it stops.
    s.model
        .reply(tool("echo x > x.txt"), "tool_use", usage(30_000, 100));
    s.model
        .reply(text("never reached"), "end_turn", usage(10, 1));
    s.comment(7, "alice", "/kodx code first").await;
    let body = done_where(&s, 7, "cost limit").await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ stopped — cost limit reached

    > /kodx code first

    ```text
    cost limit reached: $0.0915 spent of the $0.1000 limit, and the next model call could cost up to $0.1026
    ```

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    It holds the work done so far, marked incomplete. To go on from here, comment `/kodx continue` where it was asked (the repository's limits again), `/kodx continue $2` (a cost limit of $2) or `/kodx continue 20 steps` (a step limit of 20); or finish it by hand.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 30,000 | 100 | 0 | 0 | $0.0915 of $0.1000 | [duration] (agent [duration]) | `cost_limit_exceeded` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    let calls = s.model.requests().len();
    s.comment(7, "alice", "/kodx continue").await;
    s.bot_comment_where(7, "the refusal", |c| c.body.contains("monthly budget"))
        .await;
    s.finish().await;
    assert_eq!(s.model.requests().len(), calls, "no model call");
}

/// `/kodx continue` while the code run it would continue is still running: refused at once
/// with a sentence saying to wait for it (or cancel it), not queued silently.
#[tokio::test]
async fn continue_while_the_run_is_still_running_says_so() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Slow", "", "carol");
    s.model
        .reply(tool("sleep 300"), "tool_use", usage(1000, 10));
    let running = s.comment(7, "alice", "/kodx code wait a while").await;
    s.wait_for(
        "the first model call",
        std::time::Duration::from_secs(60),
        || !s.model.requests().is_empty(),
    )
    .await;
    let cont = s.comment(7, "alice", "/kodx continue").await;
    let refusal = s
        .bot_comment_where(7, "the refusal", |c| c.body.contains("has not ended yet"))
        .await
        .body;
    // The running run is named (the refused one signs the comment).
    common::serve::redactions(&[&running.0], &[]).bind(|| insta::assert_snapshot!(refusal, @"
    kodx did not continue: run `[run]` has not ended yet here; `/kodx continue` once it has stopped (or stop it with `/kodx cancel` first).

    <sub>kodx run <code>[run]</code></sub>
    "));
    // The refused continue is over (its row is written just after its comment).
    let db = s.db().await;
    let asked = std::time::Instant::now();
    while !db
        .get_run(&cont.0)
        .await
        .unwrap()
        .unwrap()
        .status
        .is_final()
    {
        assert!(
            asked.elapsed().as_secs() < 30,
            "the refused run never ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    db.close().await;
    s.comment(7, "alice", "/kodx cancel").await;
    s.bot_comment_where(7, "the cancelled run", |c| {
        c.body.contains("Cancelled by @alice") && c.body.contains("wait a while")
    })
    .await;
    s.finish().await;
    assert_eq!(
        s.model.requests().len(),
        1,
        "the refused continue made no call"
    );
}
