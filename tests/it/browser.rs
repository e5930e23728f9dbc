//! kodx's pages in a real browser: Debian's `chromium`, driven over WebDriver
//! (`chromedriver`, via fantoccini), headless. 1: the setup page, from the form to the
//! created App (the fake GitHub's web side of the manifest flow), then a webhook signed
//! with the new secret is taken without a restart. 2: a live run page gets a new step
//! without a reload; a wrong token shows nothing. 3: `/usage` draws a bar per day with
//! spend and totals as `kodx usage` does. 4: the run page's thumbnail of an image the
//! model was given loads under the page's CSP. Screenshots of the pages at phone and desktop
//! widths go to `docs/screenshots/`.
//!
//! Without chromium these tests fail, saying what to install, unless
//! `KODX_SKIP_BROWSER=1` (never under `CI=true`).

use std::process::Stdio;
use std::time::Duration;

use crate::common;
use crate::common::serve::{usage, Options, Served, REPO};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

const PUBLIC: &str = "https://kodx.example.com";

/// A chromedriver on a free loopback port and a headless Chromium session through it;
/// `None` when the browser is missing and `KODX_SKIP_BROWSER=1` says to skip.
async fn browser(test: &str) -> Option<(Client, tokio::process::Child)> {
    let installed = std::path::Path::new("/usr/bin/chromedriver").exists()
        && std::path::Path::new("/usr/bin/chromium").exists();
    if !installed {
        if std::env::var("KODX_SKIP_BROWSER").is_ok_and(|v| v == "1")
            && std::env::var("CI").map_or(true, |v| v != "true")
        {
            eprintln!("SKIPPED {test}: KODX_SKIP_BROWSER=1");
            return None;
        }
        panic!("{test} needs Chromium: apt-get install chromium chromium-driver (or KODX_SKIP_BROWSER=1 outside CI)");
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let driver = tokio::process::Command::new("/usr/bin/chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromedriver starts");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,900"],
        }),
    );
    let url = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(c) => return Some((c, driver)),
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no WebDriver session from chromedriver: {e}"),
        }
    }
}

/// Saves a screenshot of the current page at `width` × `height`: to docs/screenshots/ (the
/// docs' pages) with `KODX_UPDATE_SCREENSHOTS=1`, else to target/screenshots/.
async fn screenshot(c: &Client, name: &str, width: u32, height: u32) {
    c.set_window_size(width, height).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let under = if std::env::var("KODX_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        "docs/screenshots"
    } else {
        "target/screenshots"
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(under);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// The page's text. Right after a click the browser may still be between two pages (no
/// body yet, or the old one going stale): asked again until the new page answers.
async fn page_text(c: &Client) -> String {
    let mut last = None;
    for _ in 0..100 {
        match c.find(Locator::Css("body")).await {
            Ok(body) => match body.text().await {
                Ok(text) => return text,
                Err(e) => last = Some(e),
            },
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the page has no body after 10 s: {last:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_in_the_browser_creates_the_app_and_serves_it() {
    let Some((c, _driver)) = browser("setup_in_the_browser_creates_the_app_and_serves_it").await
    else {
        return;
    };
    let data = tempfile::tempdir().unwrap().keep();
    let s = Served::start(Options {
        workers: true,
        setup_mode: true,
        extra_env: vec![(
            "KODX_DATA_DIR".into(),
            data.join("data").display().to_string(),
        )],
        ..Options::default()
    })
    .await;
    let old_app = s.github.app_id();
    let url = s
        .log()
        .lines()
        .find(|l| l.trim_start().starts_with("http") && l.contains("/?token="))
        .map(|l| l.trim().to_string());
    let url = match url {
        Some(u) => u,
        None => {
            s.wait_for("the setup URL", Duration::from_secs(10), || {
                s.log().contains("/?token=")
            })
            .await;
            s.log()
                .lines()
                .find(|l| l.trim_start().starts_with("http") && l.contains("/?token="))
                .unwrap()
                .trim()
                .to_string()
        }
    };
    c.goto(&url).await.unwrap();
    screenshot(&c, "setup-desktop", 1280, 900).await;
    screenshot(&c, "setup-phone", 390, 844).await;
    c.set_window_size(1280, 900).await.unwrap();
    let public = c.find(Locator::Id("public_url")).await.unwrap();
    public.clear().await.unwrap();
    public.send_keys("https://kodx.example.com").await.unwrap();
    c.find(Locator::Id("create-app"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // kodx posts the manifest to the fake GitHub, which sends the browser back with a code.
    let started = std::time::Instant::now();
    let text = loop {
        let text = page_text(&c).await;
        if text.contains("Install") || started.elapsed() > Duration::from_secs(30) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(text.contains("Install"), "the install link: {text}");
    let new_app = s.github.app_id();
    assert_ne!(new_app, old_app, "the fake GitHub created a new App");
    // Without a restart, a webhook signed with the NEW secret is taken (the old one is
    // refused), and the server acts as the NEW App (the fake checks every App JWT).
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("data/github-app.json")).unwrap())
            .unwrap();
    let new_secret = saved["webhook_secret"].as_str().unwrap().to_string();
    common::serve::new_app_takes_webhooks(&s, &new_secret).await;
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_run_page_shows_a_new_step_without_a_reload() {
    let _engine = common::require_engine!();
    let Some((c, _driver)) = browser("a_live_run_page_shows_a_new_step_without_a_reload").await
    else {
        return;
    };
    let mut s = Served::start(Options {
        workers: true,
        extra_env: vec![("KODX_PUBLIC_URL".into(), PUBLIC.into())],
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Slow", "", "carol");
    let tool = |id: &str, chars: &str| {
        vec![json!({"type": "tool_use", "id": id, "name": "feed_chars", "input": {"chars": chars}})]
    };
    s.model.reply(
        tool("t1", "sleep 2; echo first-step"),
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(
        tool("t2", "echo second-step; sleep 5"),
        "tool_use",
        usage(1100, 10),
    );
    s.model.reply(
        vec![json!({"type": "text", "text": "Done."})],
        "end_turn",
        usage(1200, 10),
    );
    let run = s.comment(7, "alice", "/kodx ask take your time").await;
    let status = s
        .bot_comment_where(7, "the link", |c| c.body.contains("watch the run"))
        .await;
    let start = status.body.find(&format!("{PUBLIC}/runs/")).unwrap() + PUBLIC.len();
    let rest = &status.body[start..];
    let page = rest[..rest.find('"').unwrap()].to_string();
    c.goto(&format!("{}{page}", s.url)).await.unwrap();
    // A marker a reload would wipe.
    c.execute("window.kodxMarker = 42; return null;", vec![])
        .await
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let text = page_text(&c).await;
        if text.contains("echo second-step") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the second step never appeared: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let marker = c
        .execute("return window.kodxMarker || null;", vec![])
        .await
        .unwrap();
    assert_eq!(marker, json!(42), "the step appeared without a reload");
    let text = page_text(&c).await;
    assert!(
        text.contains("Spent so far: $0."),
        "the cost is shown: {text}"
    );
    screenshot(&c, "run-page-desktop", 1280, 900).await;
    screenshot(&c, "run-page-phone", 390, 844).await;
    // A wrong token shows nothing of the run.
    let (path, _) = page.split_once('?').unwrap();
    c.goto(&format!("{}{path}?token=wrong", s.url))
        .await
        .unwrap();
    let text = page_text(&c).await;
    assert!(
        !text.contains("first-step") && !text.contains("take your time"),
        "{text}"
    );
    c.close().await.unwrap();
    s.bot_comment_where(7, "the answer", |c| c.body.contains("answered"))
        .await;
    let _ = run;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_page_draws_spend_per_day_and_totals_as_the_cli_does() {
    let Some((c, _driver)) =
        browser("the_usage_page_draws_spend_per_day_and_totals_as_the_cli_does").await
    else {
        return;
    };
    let mut s = crate::serve_usage::served().await;
    let made = crate::serve_usage::spend(&s).await;
    let link = crate::serve_usage::usage_link(&s).await;
    c.goto(&format!("{}{link}", s.url)).await.unwrap();
    let text = page_text(&c).await;
    assert!(text.contains("Spend per day (UTC)"), "{text}");
    // One bar per UTC day on which something was spent, each drawn with a height.
    let days: std::collections::BTreeSet<i64> = made
        .iter()
        .filter(|(cost, _)| *cost > 0.0)
        .map(|(_, at)| at.div_euclid(kodx::db::DAY_MS))
        .collect();
    let bars = c
        .execute(
            "return Array.from(document.querySelectorAll('svg.chart rect'))\
               .map(r => r.getBoundingClientRect().height);",
            vec![],
        )
        .await
        .unwrap();
    let heights: Vec<f64> = serde_json::from_value(bars).unwrap();
    assert_eq!(
        heights.len(),
        days.len(),
        "bars {heights:?} for days {days:?}"
    );
    assert!(heights.iter().all(|h| *h > 0.0), "{heights:?}");
    // The page's own style applied under its CSP, and it runs no script.
    let styled = c
        .execute(
            "return [getComputedStyle(document.querySelector('table.usage')).borderCollapse, \
               document.scripts.length];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(styled, json!(["collapse", 0]));
    // The table's total is the CLI's.
    let total = c
        .find(Locator::Css("#total td:nth-child(4)"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (out, err, code) = s.kodx_cli(&["usage"]).await;
    assert_eq!(code, Some(0), "{err}");
    let cli_total = out
        .lines()
        .find(|l| l.starts_with("total "))
        .and_then(|l| l.split_whitespace().nth(3))
        .expect("a total line");
    assert_eq!((total.as_str(), cli_total), ("$4.92", "$4.92"), "{out}");
    screenshot(&c, "usage-desktop", 1280, 900).await;
    screenshot(&c, "usage-phone", 390, 844).await;
    c.close().await.unwrap();
    s.finish().await;
}

/// The run page shows the image the model was given as a thumbnail that really loads in
/// the browser under the page's CSP (`img-src 'self'`): its natural size is the image's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_page_shows_the_images_the_model_was_given() {
    let _engine = common::require_engine!();
    let Some((c, _driver)) = browser("a_run_page_shows_the_images_the_model_was_given").await
    else {
        return;
    };
    let mut s = Served::start(Options {
        workers: true,
        extra_env: vec![("KODX_PUBLIC_URL".into(), PUBLIC.into())],
        ..Options::default()
    })
    .await;
    let url = s
        .github
        .put_asset("shot", "image/png", common::images::png(64, 48, 0));
    s.github
        .add_issue(REPO, 7, "Broken", &format!("![the dialog]({url})"), "carol");
    s.model.reply(
        vec![json!({"type": "text", "text": "A red dialog."})],
        "end_turn",
        usage(1200, 10),
    );
    s.comment(7, "alice", "/kodx ask what is shown?").await;
    let status = s.finished_status(7).await;
    let start = status.find(&format!("{PUBLIC}/runs/")).unwrap() + PUBLIC.len();
    let rest = &status[start..];
    let page = rest[..rest.find('"').unwrap()].to_string();
    c.goto(&format!("{}{page}", s.url)).await.unwrap();
    let started = std::time::Instant::now();
    let size = loop {
        let size = c
            .execute(
                "const i = document.querySelector('#images img'); \
                 return i && i.complete ? [i.naturalWidth, i.naturalHeight] : null;",
                vec![],
            )
            .await
            .unwrap();
        if !size.is_null() || started.elapsed() > Duration::from_secs(20) {
            break size;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(size, json!([64, 48]), "the thumbnail loaded");
    let text = page_text(&c).await;
    assert!(text.contains("Images given to the model"), "{text}");
    assert!(text.contains("PNG, 64×48"), "{text}");
    screenshot(&c, "run-page-images", 1280, 900).await;
    c.close().await.unwrap();
    s.finish().await;
}
