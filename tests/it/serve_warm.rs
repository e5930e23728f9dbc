//! Warm sandboxes (`warm_sandboxes`) through the real `kodx serve` on the real Docker
//! engine: one is made at start, handed to one run (which finds it fenced and empty),
//! made again after; none reaches a second run; one that waited `warm_idle_secs` is
//! replaced; a killed server's are swept by the next start; shutdown removes them; the
//! pool shows in `/healthz` and `/metrics`.

use std::time::Duration;

use crate::common;
use crate::common::serve::{text, usage, Options, Served, REPO};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(120);

/// `kodx serve` with workers and one warm sandbox, replaced after `idle_secs`.
async fn warm_server(idle_secs: u64) -> Served {
    let settings = format!(
        "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nengine_check_secs = 0.2\n\
         warm_sandboxes = 1\nwarm_idle_secs = {idle_secs}\n"
    );
    Served::start(Options {
        workers: true,
        settings: Some(Box::leak(settings.into_boxed_str())),
        ..Options::default()
    })
    .await
}

/// The warm sandboxes of this server process that no run has claimed (their ids).
async fn unclaimed(s: &Served) -> Vec<String> {
    let pid = s.kodx_pid().to_string();
    let engine = kodx::sandbox::Engine::connect().await.unwrap();
    let list = common::summaries_labelled(&engine, kodx::sandbox::docker::WARM_LABEL).await;
    list.into_iter()
        .filter(|c| {
            let process = c
                .labels
                .as_ref()
                .and_then(|l| l.get(kodx::sandbox::docker::PROCESS_LABEL))
                .map(String::as_str)
                .unwrap_or_default();
            process.split('/').nth(2) == Some(pid.as_str())
        })
        .filter(|c| {
            c.names.iter().flatten().any(|n| {
                n.trim_start_matches('/')
                    .starts_with(kodx::sandbox::docker::WARM_NAME_PREFIX)
            })
        })
        .filter_map(|c| c.id)
        .collect()
}

/// Whether container `id` is still on the engine.
async fn exists(engine: &kodx::sandbox::Engine, id: &str) -> bool {
    engine.docker().inspect_container(id, None).await.is_ok()
}

/// Waits until exactly one warm sandbox waits, other than those in `not`; its id.
async fn one_warm(s: &Served, not: &[&str]) -> String {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let ids = unclaimed(s).await;
        if ids.len() == 1 && !not.contains(&ids[0].as_str()) {
            return ids[0].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no new warm sandbox (have {ids:?})\n--- kodx serve log ---\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `/healthz` shows one warm sandbox waiting (made and fenced) and none in use.
async fn until_ready(s: &Served) {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let health = engine_health(s).await;
        if (health["warm"].as_u64(), health["warm_in_use"].as_u64()) == (Some(1), Some(0)) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{health}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `/healthz` details of the one engine.
async fn engine_health(s: &Served) -> Value {
    let path = s.operator_health_path().await;
    let (code, body) = s.get(&path).await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["engines"][0].clone()
}

/// What the run's one command printed (its tool result in the model's last request).
pub(crate) fn last_tool_output(s: &Served) -> String {
    let requests = s.model.requests();
    let last = requests.last().expect("a model request");
    last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["content"].to_string())
        .next_back()
        .unwrap_or_default()
}

/// An `/kodx ask` on `issue` whose one command is `command`; what it printed, and the
/// run's stored result.
async fn ask_running(s: &Served, issue: u64, command: &str) -> (String, Value) {
    s.github.add_issue(REPO, issue, "Q", "A question.", "carol");
    s.model.reply(
        vec![json!({"type": "tool_use", "id": "t1", "name": "feed_chars",
                    "input": {"chars": command}})],
        "tool_use",
        usage(100, 10),
    );
    s.model.reply(text("Answered."), "end_turn", usage(100, 10));
    let run = s.comment(issue, "alice", "/kodx ask what is here?").await;
    s.finished_status(issue).await;
    let printed = last_tool_output(s);
    let db = s.db().await;
    let result = db.get_run(&run.0).await.unwrap().unwrap().result.unwrap();
    (printed, serde_json::from_str(&result).unwrap())
}

#[tokio::test]
async fn a_warm_sandbox_goes_to_one_run_fenced_and_empty_and_is_made_again() {
    let engine = common::require_engine!();
    let mut s = warm_server(600).await;
    let first = one_warm(&s, &[]).await;
    // Shown once it is fenced and waits (per engine: warm, and runs in one that was).
    until_ready(&s).await;

    // Long enough that a shell started for the run would start seconds after the
    // container's main process; the warm sandbox's own first shell started with it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The run gets it: its container (hostname = the short id) is the warm one, and its
    // fence was up before the run began (the unreachable routes, flag 0x0201).
    let (printed, result) = ask_running(
        &s,
        7,
        "hostname; echo fenced=$(awk '$4 == \"0201\"' /proc/net/route | wc -l); touch /tmp/run-one-was-here; ls /workspace/repo; \
         echo shell-after-main=$(( $(cut -d' ' -f22 /proc/$$/stat) - $(cut -d' ' -f22 /proc/1/stat) ))",
    )
    .await;
    // The shell is the one started with the warm sandbox (in clock ticks, 100 a second).
    let after = printed
        .split("shell-after-main=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u32>().ok());
    assert!(after.is_some_and(|t| t < 150), "{printed}");
    assert!(printed.contains(&first[..12]), "{printed}");
    assert!(
        printed.contains("README.md"),
        "the repository went in: {printed}"
    );
    let fenced = printed
        .split("fenced=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u32>().ok());
    assert!(fenced.is_some_and(|n| n > 0), "{printed}");
    assert_eq!(result["warm_start"], true, "{result}");

    // Made again after the hand-out; the first is gone with its run.
    let second = one_warm(&s, &[&first]).await;
    assert_ne!(second, first);
    until_ready(&s).await;
    assert!(
        !exists(&engine, &first).await,
        "the first run's container was removed with the run"
    );

    // The next run gets the new one, which no run touched: nothing of the first is there.
    let (printed, result) =
        ask_running(&s, 8, "hostname; ls /tmp/run-one-was-here 2>&1 | head -1").await;
    assert!(!printed.contains(&first[..12]), "{printed}");
    // Its hostname is the new one's short id; the first run's file is not there.
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(&second[..12], "[second]");
    settings.bind(|| insta::assert_snapshot!(printed, @r#""[second]\nls: cannot access '/tmp/run-one-was-here': No such file or directory\n[exit status: 0]""#));
    assert_eq!(result["warm_start"], true, "{result}");

    // The answer is posted before the run's container goes: the gauge falls right after.
    let deadline = std::time::Instant::now() + LONG;
    let metrics = loop {
        let (_, metrics) = s.get("/metrics").await;
        let idle = metrics
            .lines()
            .any(|l| l == "kodx_engine_warm_sandboxes_in_use{engine=\"local\"} 0");
        if idle || std::time::Instant::now() > deadline {
            assert!(idle, "{metrics}");
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        metrics.contains("kodx_engine_warm_sandboxes{engine=\"local\"}"),
        "{metrics}"
    );
    // Two runs, both took a warm sandbox; each run's first model call was timed from its
    // webhook.
    for line in [
        "kodx_warm_starts_total{engine=\"local\",result=\"hit\"} 2",
        "kodx_warm_hit_ratio{engine=\"local\"} 1.0",
        "kodx_first_model_call_seconds_count 2",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
    assert!(
        metrics.contains("kodx_first_model_call_recent_seconds{quantile=\"0.95\"}"),
        "{metrics}"
    );
    one_warm(&s, &[&first, &second]).await;
    // Shutdown removes it: `finish` finds no container of this installation left.
    s.finish().await;
}

#[tokio::test]
async fn a_warm_sandbox_that_waited_too_long_is_replaced() {
    let _engine = common::require_engine!();
    let mut s = warm_server(10).await;
    let first = one_warm(&s, &[]).await;
    let second = one_warm(&s, &[&first]).await;
    assert_ne!(first, second);
    assert!(!unclaimed(&s).await.contains(&first));
    s.finish().await;
}

#[tokio::test]
async fn a_killed_servers_warm_sandbox_is_swept_by_the_next_start() {
    let engine = common::require_engine!();
    let mut s = warm_server(600).await;
    let first = one_warm(&s, &[]).await;
    s.kill().await;
    // A kill -9 leaves it. Any kodx process on this engine may sweep a dead owner's
    // containers, so another test's start may remove it before this one's: what is checked
    // is that it does not outlive the next start.
    if !exists(&engine, &first).await {
        eprintln!("another kodx process on this engine swept {first} before the restart");
    }
    s.restart().await;
    let second = one_warm(&s, &[&first]).await;
    assert_ne!(second, first);
    // The start's sweeps run beside the pool's first making: the new warm sandbox may be
    // there first.
    let deadline = std::time::Instant::now() + LONG;
    while exists(&engine, &first).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the next start did not remove the killed server's warm sandbox\n--- kodx serve log ---\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.finish().await;
}
