//! Text kodx did not write, posted by the real `kodx serve` (issue 36, item 5): the model's
//! `kodx-threads` list and CI's check names carry live mentions, links, HTML, code-span
//! breakouts and blank lines; the bodies kodx posts to the fake GitHub are read as GitHub
//! renders Markdown, and nothing in them notifies anyone or links to the evil host.
//!
//! - `/kodx address-reviews` whose list names a hostile thread id and a hostile status:
//!   the status comment's note about the list, and the reply in the real thread;
//! - CI repair that stops on a repeated failure whose check name and first error hold a
//!   blank line, backticks and links: the comment that says repairing stopped.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use serde_json::json;

use crate::common;
use crate::common::fake_github::{FakeCheckRunSpec, FakeSuite};
use crate::common::follow_up::{ci_event, ended, feature_pull, kodx_pull, thread};
use crate::common::serve::{text, tool, usage, Served, INSTALLATION, REPO};

/// The host nothing kodx posts may link to.
const EVIL: &str = "evil.example";

/// Everything hostile at once: a team mention, a Markdown link, an autolink, a bare URL, a
/// `www.` link, an image, HTML, a backtick run that closes any short code span, and a blank
/// line that ends any span and starts a new paragraph.
fn hostile(tag: &str) -> String {
    format!(
        "{tag}` @org/team [{tag}](https://{EVIL}/{tag}) <https://{EVIL}/a> ``\n\n\
         @org/team https://{EVIL}/b www.{EVIL} ![i](https://{EVIL}/i.png) <img src=https://{EVIL}/x> \
         \r\u{2028}@org/team ```"
    )
}

/// Fails when `body`, read as GitHub reads Markdown, holds a live `@org/team` mention, a
/// link, image or HTML aimed at [`EVIL`], or text GitHub would autolink to it — anything
/// outside code spans and code blocks counts.
fn assert_nothing_live(what: &str, body: &str) {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_GFM;
    // The text GitHub would scan for mentions and bare links: outside code, each run of
    // text events joined (a mention split over two events is still one).
    let mut prose = String::new();
    let mut in_block = 0;
    for event in Parser::new_ext(body, options) {
        match event {
            Event::Start(Tag::CodeBlock(_)) => in_block += 1,
            Event::End(TagEnd::CodeBlock) => in_block -= 1,
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                assert!(
                    !dest_url.contains(EVIL),
                    "{what}: a live link to {dest_url}:\n{body}"
                );
            }
            Event::Html(html) | Event::InlineHtml(html) => {
                assert!(
                    !html.contains(EVIL) && !html.to_lowercase().contains("<img"),
                    "{what}: live HTML {html:?}:\n{body}"
                );
            }
            Event::Text(t) if in_block == 0 => prose.push_str(&t),
            _ => prose.push('\n'),
        }
    }
    assert!(
        !prose.contains("@org/team"),
        "{what}: a live mention of @org/team:\n{body}"
    );
    for autolink in [format!("://{EVIL}"), format!("www.{EVIL}")] {
        assert!(
            !prose.to_lowercase().contains(&autolink),
            "{what}: {autolink} would be linked:\n{body}"
        );
    }
}

#[tokio::test]
async fn hostile_thread_ids_and_statuses_post_nothing_live() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    feature_pull(&s, 40);
    let known = s.github.add_review_thread(
        REPO,
        40,
        thread("src/flag.rs", 1, &[("dora", "Is this name right?")], true),
    );
    let list = json!([
        {"thread": known, "status": "question", "reply": "Which @org/team owns the flag?"},
        // An id kodx never gave, and a status no thread can have: both are said back.
        {"thread": hostile("PRRT_id"), "status": "fixed", "reply": "x"},
        {"thread": known, "status": hostile("fixed"), "reply": "y"},
    ]);
    s.model.reply(
        text(&format!(
            "Asked about the name.\n\n```kodx-threads\n{list}\n```"
        )),
        "end_turn",
        usage(1000, 10),
    );
    s.comment(40, "alice", "/kodx address-reviews").await;
    let status = s.finished_status(40).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done — no changes

    > /kodx address-reviews 

    No changes were made to the repository.

    **Review threads:** replied in 1 (0 fixed, 0 declined, 1 question).

    Left out of the run's `kodx-threads` list: entry 2: no thread ``PRRT_id` @org/team [PRRT_id](https://evil.example/PRRT_id) <https://evil.example`` was given; entry 3: unknown variant \`fixed\` @[zwsp]org/team \[fixed\](https:[zwsp]//evil.example/fixed) \<https:[zwsp]//evil.example/a\> \`\` @[zwsp]org/team https:[zwsp]//evil.example/b www[zwsp].evil.example !\[i\](https:[zwsp]//evil.example/i.png) \<img src=https:[zwsp]//evil.example/x\> @[zwsp]org/team \`\`\`\`, expected one of \`fixed\`, \`declined\`, \`question\`.

    Asked about the name.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 1,000 | 10 | 0 | 0 | $0.0032 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    // Both hostile entries were left out and said so, inert.
    assert_nothing_live("the status comment", &status);
    let replies = s.github.thread(&known).replies;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_nothing_live("the reply", &replies[0]);
    s.finish().await;
}

#[tokio::test]
async fn hostile_ci_check_names_post_nothing_live() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 3\nci_rerun: 0\n", "Added a.txt.").await;
    let gh = &s.github;
    // A check whose name and title (its first error: no log, no annotation) are hostile.
    let red = || {
        FakeCheckRunSpec::completed(&hostile("checkname"), "failure")
            .with_output(&hostile("errline"), "it failed")
    };
    let fail = |sha: &str| {
        let suite = gh.add_check_suite(REPO, sha, FakeSuite::of("circleci", vec![red()]));
        gh.check_suite_completed_payload(
            REPO,
            INSTALLATION,
            suite,
            "circleci",
            sha,
            &pr.head,
            "failure",
            &[pr.number],
        )
    };

    // The first failure is repaired; the repaired commit fails the same way.
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    s.model
        .reply(tool("echo two > a.txt"), "tool_use", usage(2000, 10));
    s.model
        .reply(text("Tried two."), "end_turn", usage(2100, 10));
    let repair = ci_event(&s, "check_suite", &fail(&head)).await.unwrap();
    assert_eq!(ended(&s, &repair).await, "end_turn", "{}", s.log());
    let status = s.finished_status(pr.number).await;
    assert_nothing_live("the repair run's status comment", &status);
    let repaired = s.git.branch_sha(REPO, &pr.head).unwrap();
    let again = ci_event(&s, "check_suite", &fail(&repaired)).await.unwrap();
    assert_eq!(ended(&s, &again).await, "dismissed");
    let note = s
        .bot_comment_where(pr.number, "the note that repairing stopped", |c| {
            c.body.contains("kodx stops repairing")
        })
        .await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(note.body, @"
    CI still fails on [hex] (```checkname` @org/team [checkname](https://evil.example/checkname) <https://evil.example/a> `` @org/team https://evil.example/b www.evil.example ![i](https://evil.example/i.png) <img src=https://evil.e…```), and kodx stops repairing: the failure repeats unchanged after its last repair (first error: ```errline` @org/team [errline](https://evil.example/errline) <https://evil.example/a> `` @org/team https://evil.example/b www.evil.example ![i](https://evil.example/i.png) <img src=https://evil.example…```). Fix it by hand, or ask again with `/kodx code <what to do>`, which starts the repair count over.

    <sub>kodx run <code>[run]</code></sub>
    "));
    // The name and the first error are there, shown as text.
    assert_nothing_live("the note that repairing stopped", &note.body);
    s.finish().await;
}
