//! The run page over HTTP, against the real `kodx serve`, the fakes and the real engine:
//! the status comment links it (with `KODX_PUBLIC_URL`), it shows the steps — what was
//! typed, what it printed (redacted), tokens and cost — and live while the run works
//! (server-sent events); a wrong token, another run's token and `run_pages = false` are
//! `404` with nothing of the run; the operator's list (`kodx operator-link`) shows recent runs.

use std::time::Duration;

use crate::common;
use crate::common::serve::{text, tool, usage, Options, Served, REPO};
use futures_util::StreamExt as _;

const PUBLIC: &str = "https://kodx.example.com";
const SECRET_LOOKALIKE: &str = "ghs_abcdefghijklmnopqrstuvwxyz0123456789";

async fn served(settings: Option<&'static str>) -> Served {
    Served::start(Options {
        workers: true,
        settings,
        extra_env: vec![("KODX_PUBLIC_URL".into(), PUBLIC.into())],
        ..Options::default()
    })
    .await
}

/// The path and query of the run page linked in `body` (under [`PUBLIC`]).
fn linked_page(body: &str) -> String {
    let start = body
        .find(&format!("{PUBLIC}/runs/"))
        .unwrap_or_else(|| panic!("no run page link in {body}"));
    let rest = &body[start + PUBLIC.len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

async fn get(s: &Served, path_and_query: &str) -> (u16, String) {
    let r = reqwest::get(format!("{}{path_and_query}", s.url))
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn a_finished_runs_page_shows_its_steps_and_only_to_its_token() {
    let _engine = common::require_engine!();
    let mut s = served(None).await;
    s.github.add_issue(REPO, 7, "Notes", "", "carol");
    s.model.reply(
        tool(&format!("echo notes-ok; echo {SECRET_LOOKALIKE}")),
        "tool_use",
        usage(2000, 20),
    );
    s.model
        .reply(text("The notes are fine."), "end_turn", usage(2100, 10));
    let run = s.comment(7, "alice", "/kodx ask are the notes ok?").await;
    let status = s
        .bot_comment_where(7, "the answer", |c| {
            c.body.lines().any(|l| l == "### ✅ answered")
        })
        .await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status.body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ answered

    > /kodx ask are the notes ok?

    The notes are fine.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 4,100 | 30 | 0 | 0 | $0.0128 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">watch the run</a></sub>
    "#));
    let page_path = linked_page(&status.body);
    assert!(
        page_path.starts_with(&format!("/runs/{}?token=", run.0)),
        "{page_path}"
    );

    let (code, page) = get(&s, &page_path).await;
    assert_eq!(code, 200, "{page}");
    // Who asked what, what was typed and printed, the model's words, the tokens and cost
    // of each step; the page's body, a line per block element.
    let shown = &page[page.find("<h1>").expect("a heading")..page.find("</body>").unwrap()];
    let mut settings = common::serve::redactions(&[&run.0], &[]);
    settings.add_filter(r"(<(?:div|p|pre|h1|h2|details)\b)", "\n$1");
    settings.bind(|| insta::assert_snapshot!(shown, @r#"

    <h1>kodx run <code>[run]</code></h1>
    <div class="card">
    <p><strong>alice</strong> asked: <code>/kodx ask are the notes ok?</code></p>
    <p>acme/widgets #7</p>
    <p>Status: <span class="ok">succeeded</span> · stop: <code>end_turn</code> · [duration] (agent [duration])</p>
    <p>Cost: <strong class="cost">$0.0128</strong> · 2 API calls</p></div>
    <div class="card" id="context">
    <h2>Repository context</h2>
    <p>Read from branch <code>main</code> at <code>[run]</code>.</p>
    <p class="hint">No instructions given (no AGENTS.md, CLAUDE.md or .github/copilot-instructions.md to use).</p></div>
    <div id="steps" data-events="/runs/[run]/events?token=[hex]&amp;from=6">
    <div class="card step" data-seq="2">
    <h2>Step 1</h2>
    <pre class="typed">default$ echo notes-ok; echo [REDACTED]</pre>
    <pre class="out">notes-ok
    [REDACTED]
    [exit status: 0]</pre>
    <p class="hint">tokens: 2000 in, 20 out, 0 cache write, 0 cache read · $0.0063</p></div>
    <div class="card step" data-seq="6">
    <h2>Step 2</h2>
    <pre class="text">The notes are fine.</pre>
    <p class="hint">tokens: 2100 in, 10 out, 0 cache write, 0 cache read · $0.0065</p></div></div></main>
    "#));
    assert!(
        !page.contains(SECRET_LOOKALIKE),
        "redacted as comments are: {page}"
    );
    assert!(
        !page.contains("<script"),
        "a finished run's page is not live"
    );

    // Without the right token: 404 and nothing of the run.
    for wrong in [
        format!("/runs/{}", run.0),
        format!("/runs/{}?token=00", run.0),
        format!("/runs/{}?token={}", run.0, "0".repeat(32)),
        format!("/runs/nosuchrun?{}", page_path.split('?').nth(1).unwrap()),
    ] {
        let (code, body) = get(&s, &wrong).await;
        assert_eq!(code, 404, "{wrong}");
        assert!(!body.contains("notes"), "{body}");
    }

    // The operator's list, at the address `kodx operator-link` prints; never in the log.
    assert!(!s.log().contains("runs?token="), "{}", s.log());
    let (printed, err, ok) = s.operator_link_cli(&[]).await;
    assert!(ok, "{err}");
    let list_path = printed
        .lines()
        .next()
        .unwrap()
        .trim()
        .strip_prefix(PUBLIC)
        .unwrap()
        .to_string();
    let (code, list) = get(&s, &list_path).await;
    assert_eq!(code, 200);
    assert!(list.contains(&run.0), "{list}");
    let (code, _) = get(&s, "/runs?token=0").await;
    assert_eq!(code, 404);
    // A run's token does not open the list.
    let (code, _) = get(
        &s,
        &format!("/runs?{}", page_path.split('?').nth(1).unwrap()),
    )
    .await;
    assert_eq!(code, 404);
    s.finish().await;
}

#[tokio::test]
async fn a_live_page_gets_new_steps_and_then_the_end() {
    let _engine = common::require_engine!();
    let mut s = served(None).await;
    s.github.add_issue(REPO, 7, "Slow", "", "carol");
    s.model
        .reply(tool("echo first-step"), "tool_use", usage(1000, 10));
    s.model.reply(
        tool("sleep 2; echo second-step"),
        "tool_use",
        usage(1100, 10),
    );
    s.model.reply(text("Done."), "end_turn", usage(1200, 10));
    let run = s.comment(7, "alice", "/kodx ask take your time").await;
    let status = s
        .bot_comment_where(7, "the link", |c| c.body.contains("watch the run"))
        .await;
    let page_path = linked_page(&status.body);
    let (path, query) = page_path.split_once('?').unwrap();
    let events = reqwest::get(format!("{}{path}/events?{query}", s.url))
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let mut stream = events.bytes_stream();
    let mut seen = String::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(chunk) = stream.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("event: end") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the stream never ended: {seen}");
    assert!(seen.contains("event: steps"), "{seen}");
    assert!(
        seen.contains("second-step"),
        "a step that came while watching: {seen}"
    );
    s.bot_comment_where(7, "the answer", |c| {
        c.body.lines().any(|l| l == "### ✅ answered")
    })
    .await;
    let _ = run;
    s.finish().await;
}

#[tokio::test]
async fn pages_off_means_no_page_and_no_link() {
    let _engine = common::require_engine!();
    let mut s = served(Some("run_pages = false\n")).await;
    s.github.add_issue(REPO, 7, "Q", "", "carol");
    s.model.reply(text("Yes."), "end_turn", usage(1000, 10));
    let run = s.comment(7, "alice", "/kodx ask yes?").await;
    let status = s
        .bot_comment_where(7, "the answer", |c| {
            c.body.lines().any(|l| l == "### ✅ answered")
        })
        .await;
    assert!(!status.body.contains("/runs/"), "{}", status.body);
    let (code, _) = get(&s, &format!("/runs/{}?token=x", run.0)).await;
    assert_eq!(code, 404);
    s.finish().await;
}
