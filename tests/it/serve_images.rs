//! Images of the issue given to the model (SPEC §12, "Steering and pictures"), end to end
//! through the real `kodx serve`: found in the issue's body, fetched from the fake GitHub's
//! web side (its attachments need the installation token), through redirects within it and
//! to another host (which must never see the token), bounded, sniffed, sent to the fake
//! Anthropic as image blocks it validates, named in the status comment when skipped, kept
//! out of the transcript, and shown on the run page under the run's own token.

use base64::Engine as _;

use crate::common;
use crate::common::images::{png, OtherHost};
use crate::common::serve::{text, usage, Served, REPO};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn issue_images_reach_the_model_and_the_run_page_and_skipped_ones_are_named() {
    let _engine = common::require_engine!();
    let mut s = Served::with_run_pages().await;
    let other = OtherHost::start().await;
    let gh = &s.github;
    let direct = png(40, 30, 0);
    let away = png(20, 10, 0);
    let within = png(12, 12, 0);
    let big = png(8, 8, 6 << 20);
    let url_direct = gh.put_asset("shot", "image/png", direct.clone());
    // github.com sends an attachment on to its asset host: here, a host that is not GitHub.
    other.put("away.png", "image/png", away.clone());
    let url_away = gh.redirect_asset("away", &format!("{}/away.png", other.url));
    // A redirect that stays on GitHub's origin keeps the token.
    gh.put_asset("within-target", "image/png", within.clone());
    let url_within = gh.redirect_asset("within", &gh.asset_url("within-target"));
    let url_big = gh.put_asset("big", "image/png", big);
    let url_page = gh.put_asset("page", "text/html", b"<!doctype html><p>hi".to_vec());
    other.put("elsewhere.png", "image/png", png(5, 5, 0));
    let url_sixth = gh.put_asset("sixth", "image/png", png(6, 6, 0));
    let url_hidden = gh.put_asset("hidden", "image/png", png(7, 7, 0));
    let body = format!(
        "The dialog breaks:\n\n![the error\u{200B} dialog]({url_direct})\n\n\
         <img src=\"{url_away}\" alt=\"after a redirect\">\n\n![within]({url_within})\n\n\
         ![big]({url_big}) ![page]({url_page}) ![elsewhere]({}/elsewhere.png)\n\n\
         ![sixth]({url_sixth})\n<!-- ![hidden]({url_hidden}) -->\n",
        other.url
    );
    s.github.add_issue(REPO, 7, "Dialog", &body, "carol");
    s.model.reply(
        text("It shows an error dialog."),
        "end_turn",
        usage(2000, 10),
    );

    let run = s
        .comment(7, "alice", "/kodx ask what do the pictures show?")
        .await;
    let status = s.finished_status(7).await;
    common::serve::redactions(&[&run], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[run]","v":1} -->
    ### ✅ answered

    > /kodx ask what do the pictures show?

    **Images not given to the model:**
    - image 4 `big`: too large (over 5 MiB)
    - image 5 `page`: not an image
    - image 6 `elsewhere`: not on GitHub
    - image 7 `sixth`: more than 5 images

    It shows an error dialog.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 2,000 | 10 | 0 | 0 | $0.0062 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[run]?token=[hex]">watch the run</a></sub>
    "#));

    // The model got the three images after the prompt, as blocks the fake checked.
    assert!(s.model.rejected().is_empty(), "{:?}", s.model.rejected());
    let requests = s.model.requests();
    let content = requests[0].body["messages"][0]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 5, "prompt, preface, three images");
    insta::assert_snapshot!(content[1]["text"].as_str().unwrap(), @r#"
    [kodx: the 3 images of the description and the request follow, in the order they appear:
    1. PNG, 40×30, 1 KB, alt text: "the error dialog"
    2. PNG, 20×10, 1 KB, alt text: "after a redirect"
    3. PNG, 12×12, 1 KB, alt text: "within"]
    "#);
    for (block, bytes) in content[2..].iter().zip([&direct, &away, &within]) {
        assert_eq!(block["type"], "image");
        assert_eq!(block["source"]["media_type"], "image/png");
        assert_eq!(block["source"]["data"], b64(bytes));
    }

    // The token went to GitHub's origin only: with each attachment request there, never to
    // the other host, which got the redirected request bare; what is not on GitHub, and
    // what hid in an HTML comment, was never asked for.
    let asked: Vec<(String, bool)> = s
        .github
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/user-attachments/"))
        .map(|r| {
            (
                r.path,
                r.authorization
                    .is_some_and(|a| a.starts_with("Bearer ghs_")),
            )
        })
        .collect();
    let mut names: Vec<String> = asked
        .iter()
        .map(|(p, t)| format!("{p} token={t}"))
        .collect();
    names.sort();
    insta::assert_snapshot!(names.join("\n"), @"
    /user-attachments/assets/away token=true
    /user-attachments/assets/big token=true
    /user-attachments/assets/page token=true
    /user-attachments/assets/shot token=true
    /user-attachments/assets/within token=true
    /user-attachments/assets/within-target token=true
    ");
    let seen = other.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, "/away.png");
    assert!(seen[0].1.get("authorization").is_none(), "{:?}", seen[0].1);

    // The transcript keeps each image's kind, size and hash, not its bytes.
    let first = &s.records(&run.0, "request").await[0];
    let stored = &first["new_messages"][0]["content"][2];
    assert_eq!(stored["type"], "image");
    assert_eq!(stored["image"]["kind"], "png");
    assert_eq!(stored["image"]["size"], direct.len());
    assert!(!first.to_string().contains(&b64(&direct)));

    // The run page shows them as thumbnails served by kodx under the run's token.
    let page = s.linked_run_page(&status).await;
    let token = status
        .split("?token=")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap()
        .to_string();
    let src = format!("/runs/{}/images/0?token={token}", run.0);
    assert!(page.contains(&format!("src=\"{src}\"")), "{page}");
    assert!(
        !page.contains(&s.github.root()),
        "no GitHub address embedded"
    );
    let got = reqwest::get(format!("{}{src}", s.url)).await.unwrap();
    assert_eq!(got.status(), 200);
    let h = got.headers().clone();
    assert_eq!(h["content-type"], "image/png");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert!(h["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("img-src 'self'"));
    assert_eq!(got.bytes().await.unwrap().as_ref(), direct.as_slice());
    let third = format!("/runs/{}/images/2?token={token}", run.0);
    let got = reqwest::get(format!("{}{third}", s.url)).await.unwrap();
    assert_eq!(got.bytes().await.unwrap().as_ref(), within.as_slice());
    for refused in [
        format!("/runs/{}/images/0", run.0),
        format!("/runs/{}/images/0?token=0000", run.0),
        format!("/runs/{}/images/3?token={token}", run.0),
    ] {
        let (code, body) = s.get(&refused).await;
        assert_eq!((code, body.as_str()), (404, "not found\n"), "{refused}");
    }
    s.finish().await;
}

/// A server whose model reads no images (`images = false`) fetches none and names none.
#[tokio::test]
async fn a_server_with_images_off_fetches_none() {
    let _engine = common::require_engine!();
    let mut s = Served::start(common::serve::Options {
        workers: true,
        settings: Some("images = false\n"),
        ..Default::default()
    })
    .await;
    let url = s.github.put_asset("shot", "image/png", png(4, 4, 0));
    s.github
        .add_issue(REPO, 7, "Dialog", &format!("![shot]({url})"), "carol");
    s.model
        .reply(text("No picture."), "end_turn", usage(2000, 10));
    s.comment(7, "alice", "/kodx ask what is shown?").await;
    let status = s.finished_status(7).await;
    assert!(!status.contains("Images not given"), "{status}");
    let content = &s.model.requests()[0].body["messages"][0]["content"];
    assert_eq!(content.as_array().unwrap().len(), 1, "{content}");
    assert!(!s
        .github
        .requests()
        .iter()
        .any(|r| r.path.starts_with("/user-attachments/")));
    s.finish().await;
}
