//! `kodx serve`'s sandboxes against the real binary, the fakes and the real Docker engine:
//! a run cannot reach kodx's own endpoints on the host; the server's `network`,
//! `network_allow` and `max_disk_bytes` settings apply whatever the repository asks.

use std::time::Duration;

use crate::common;
use crate::common::fake_anthropic::feed_chars as tool;
use crate::common::serve::{usage, Options, Served, REPO};

/// kodx serve listening on every address of the host, as in production.
async fn served(settings: String) -> Served {
    Served::start(Options {
        workers: true,
        settings: Some(Box::leak(settings.into_boxed_str())),
        extra_env: vec![("HOST".into(), "0.0.0.0".into())],
        ..Options::default()
    })
    .await
}

fn port_of(s: &Served) -> u16 {
    s.url.rsplit(':').next().unwrap().parse().unwrap()
}

/// A shell command printing the HTTP status of `url`, or the error.
fn fetch(url: &str) -> String {
    format!(
        "python3 -c \"import urllib.request as u; print('status', u.urlopen('{url}', timeout=3).status)\" 2>&1 | tail -1"
    )
}

async fn ask(s: &Served, question: &str) -> String {
    s.github.add_issue(REPO, 7, "Network", "Check it.", "carol");
    s.comment(7, "alice", question).await;
    s.bot_comment_where(7, "the run's end", |c| {
        !c.body.contains("queued") && !c.body.contains("setting up") && !c.body.contains("working")
    })
    .await
    .body
}

#[tokio::test]
async fn a_run_cannot_reach_kodx_serve_on_its_host() {
    let engine = common::require_engine!();
    let gateway = common::net::sandbox_gateway(&engine).await;
    let mut s = served("status_interval_secs = 0.2\n".into()).await;
    let port = port_of(&s);
    // The server answers on the gateway address: only the fence keeps the run out.
    let (code, _) = {
        let r = reqwest::get(format!("http://{gateway}:{port}/healthz")).await;
        (r.map(|r| r.status().as_u16()).unwrap_or(0), ())
    };
    assert!(
        code == 200 || code == 503,
        "kodx serve answers on {gateway}"
    );
    let probe = [
        fetch(&format!("http://{gateway}:{port}/healthz")),
        fetch(&format!("http://{gateway}:{port}/metrics")),
        fetch("http://169.254.169.254/latest/meta-data/"),
    ]
    .join("; ");
    s.model
        .reply(vec![tool("t1", &probe)], "tool_use", usage(1000, 20));
    s.model
        .answer_from_last_tool_result(|out| format!("PROBE(({out}))"));
    let body = ask(&s, "/kodx ask can you reach the host?").await;
    let probe_out = body
        .split("PROBE((")
        .nth(1)
        .and_then(|r| r.split("))").next())
        .unwrap_or_else(|| panic!("the answer: {body}"));
    assert!(
        !probe_out.lines().any(|l| l.starts_with("status ")),
        "an answer came back: {probe_out}"
    );
    assert_eq!(
        probe_out.matches("No route to host").count(),
        3,
        "{probe_out}"
    );
    s.finish().await;
}

#[tokio::test]
async fn the_server_settings_win_over_the_repository() {
    let engine = common::require_engine!();
    let gateway = common::net::sandbox_gateway(&engine).await;
    // The operator allows the host's gateway address (say, a mirror there) and cuts the
    // network after setup; the repository asks to keep it.
    let mut s = served(format!(
        "status_interval_secs = 0.2\nnetwork = \"setup-only\"\nnetwork_allow = [\"{gateway}/32\"]\n"
    ))
    .await;
    let port = port_of(&s);
    let setup = fetch(&format!("http://{gateway}:{port}/healthz"));
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        &format!(
            "disable_network_after_setup: false\nsetup_script: |\n  {setup} > /tmp/setup.txt\n"
        ),
    );
    s.model.reply(
        vec![tool(
            "t1",
            "cat /tmp/setup.txt; echo interfaces: $(ls /sys/class/net)",
        )],
        "tool_use",
        usage(1000, 20),
    );
    s.model
        .answer_from_last_tool_result(|out| format!("PROBE(({out}))"));
    let body = ask(&s, "/kodx ask what network did setup have?").await;
    // During setup the allowed address answered; afterwards only loopback is left.
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ answered

    > /kodx ask what network did setup have?

    PROBE((status 200
    interfaces: lo
    [exit status: 0]))

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,200 | 60 | 0 | 0 | $0.0075 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · setup ran in [duration] (not cached yet)</sub>
    "#)
    });
    s.finish().await;
}

#[tokio::test]
async fn a_run_writing_past_the_servers_max_disk_bytes_fails_with_the_reason() {
    let _engine = common::require_engine!();
    let mut s = served("status_interval_secs = 0.2\nmax_disk_bytes = 16777216\n".into()).await;
    s.model.reply(
        vec![tool(
            "t1",
            "dd if=/dev/zero of=/tmp/fill bs=1M count=200; sleep 100",
        )],
        "tool_use",
        usage(1000, 20),
    );
    s.model
        .answer_from_last_tool_result(|out| format!("never: {out}"));
    let started = std::time::Instant::now();
    let body = ask(&s, "/kodx ask fill the disk").await;
    // How much it wrote before the watchdog looked depends on the machine's pace.
    let mut settings = common::serve::redactions(&[], &[]);
    settings.add_filter(r"wrote \d+\.\d MiB", "wrote [n] MiB");
    settings.bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ failed

    > /kodx ask fill the disk

    ```text
    the sandbox wrote [n] MiB to its disk, over its limit of 16.0 MiB (max_disk_bytes), and was stopped
    ```

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 1,000 | 20 | 0 | 0 | $0.0033 of $1.00 | [duration] (agent [duration]) | `error` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    assert!(!body.contains("never:"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "stopped by the watchdog, not by the command: {:?}",
        started.elapsed()
    );
    s.finish().await;
}
