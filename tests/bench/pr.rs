//! Benchmark (ignored by default; `bash bench/pr-latency.sh` runs it): webhook → pull
//! request opened, with a scripted model that answers at once, on a small repository, a
//! cargo-sized one (3,000 files, 20,000 commits, synthetic) and one of 20,000 files. Each
//! repository starts with a cold repository cache: the first run makes the mirror, later
//! runs fetch. Prints each phase of the first run and the medians of the later ones (from
//! the timings kodx stores with every run), the queue and acknowledgement times, the
//! `/kodx ask` latency from the model's last answer to the posted answer, and each figure
//! against the issue's target.

use crate::common;

mod cargo;
mod preload;

use std::time::{Duration, Instant};

use crate::stats::{env_usize, median};
use common::fake_anthropic::Scripted;
use common::serve::{bot_comments, delivery_id, issue_comment, usage, IssueComment, Served, REPO};
use serde_json::{json, Value};

/// One `/kodx code` run measured from outside and by its own timings.
struct Measured {
    /// Webhook → pull request opened.
    total_ms: f64,
    /// Webhook → first bot comment (the acknowledgement).
    ack_ms: f64,
    /// Queued → claimed by a worker (the run's row).
    queue_ms: f64,
    /// Webhook → the model's first request.
    first_call_ms: Option<f64>,
    /// Its container was a warm sandbox.
    warm: bool,
    /// It held the repository's checkout: how the copy-in used it (`same_tip`,
    /// `difference`, `whole`, `packed_over`).
    preloaded: Option<String>,
    phases: std::collections::BTreeMap<String, f64>,
}

/// The server's database (tried again while the server may still be migrating it).
async fn open_db(s: &Served) -> kodx::db::Db {
    let url = format!("sqlite://{}", s.dir.path().join("kodx.db").display());
    let started = Instant::now();
    loop {
        match kodx::db::Db::open(&url).await {
            Ok(db) => return db,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("opening {url}: {e}"),
        }
    }
}

async fn finished(db: &kodx::db::Db, run_id: &str) -> (kodx::db::Run, Value) {
    loop {
        let run = db.get_run(run_id).await.unwrap().unwrap();
        if run.status.is_final() {
            let result = serde_json::from_str(run.result.as_deref().unwrap_or("{}")).unwrap();
            return (run, result);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn code_once(s: &Served, db: &kodx::db::Db, number: u64) -> Measured {
    s.github.add_issue(REPO, number, "Bench", "", "carol");
    s.model.reply(
        vec![
            json!({"type": "tool_use", "id": format!("t{number}"), "name": "feed_chars",
                    "input": {"chars": format!("echo {number} > bench-{number}.txt")}}),
        ],
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(
        vec![json!({"type": "text", "text": "Wrote the file."})],
        "end_turn",
        usage(1000, 10),
    );
    let before = s.github.created_pulls(REPO).len();
    let calls_before = s.model.requests().len();
    let (gh_before, git_before) = (s.github.requests().len(), s.git.requests().len());
    let body = format!("/kodx code write bench-{number}.txt");
    let id = s.github.add_comment(REPO, number, "alice", &body, false);
    let payload = issue_comment(&IssueComment {
        clone_url: &s.clone_url,
        number,
        comment_id: id,
        body: &body,
        ..IssueComment::default()
    });
    let started = Instant::now();
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &payload).await;
    assert_eq!(status, 202, "{answer}");
    let run_id = answer["run_id"].as_str().unwrap().to_string();
    let mut ack_ms = None;
    while s.github.created_pulls(REPO).len() == before {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no PR:\n{}",
            s.log()
        );
        if ack_ms.is_none() && !bot_comments(s, number).is_empty() {
            ack_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let total_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (run, result) = finished(db, &run_id).await;
    if std::env::var("KODX_BENCH_TIMELINE").is_ok() {
        print_timeline(s, started, gh_before, git_before);
    }
    let phases = result["timings_ms"]
        .as_object()
        .unwrap_or_else(|| panic!("no timings: {result}\n{}", s.log()))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .collect();
    let first_call_ms = s
        .model
        .requests()
        .get(calls_before)
        .map(|r| r.at.duration_since(started).as_secs_f64() * 1000.0);
    Measured {
        total_ms,
        first_call_ms,
        warm: result["warm_start"] == true,
        preloaded: result["preloaded"].as_str().map(str::to_string),
        ack_ms: ack_ms.unwrap_or(total_ms),
        queue_ms: run.started_at.unwrap_or(run.created_at) as f64 - run.created_at as f64,
        phases,
    }
}

/// With KODX_BENCH_TIMELINE: each request the fake GitHub and the git server answered
/// during the run, in ms since the webhook, and what it took there.
fn print_timeline(s: &Served, webhook: Instant, gh_before: usize, git_before: usize) {
    let ms = |at: Instant| at.saturating_duration_since(webhook).as_secs_f64() * 1000.0;
    let mut lines: Vec<(f64, String)> = s.github.requests()[gh_before..]
        .iter()
        .map(|r| {
            let took = r.took.map_or(f64::NAN, |t| t.as_secs_f64() * 1000.0);
            let query = r
                .query
                .as_deref()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            (
                ms(r.at),
                format!("github {} {}{query} ({took:.1} ms)", r.method, r.path),
            )
        })
        .collect();
    lines.extend(s.git.requests()[git_before..].iter().map(|r| {
        (
            ms(r.at),
            format!(
                "git {} {} -> {} ({:.1} ms, {} bytes sent)",
                r.method,
                r.path_and_query,
                r.status,
                r.took.as_secs_f64() * 1000.0,
                r.body_bytes
            ),
        )
    }));
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, line) in lines {
        println!("    {at:>8.1} ms  {line}");
    }
}

const PHASES: [&str; 13] = [
    "prepare",
    "clone",
    "fetch",
    "checkout",
    "container",
    "setup",
    "setup (cached)",
    "agent",
    "verifier",
    "export",
    "commit",
    "push",
    "pull_request",
];

/// Prints the first run and the medians of the later ones, phase by phase; returns the
/// first run's total and the later runs' median total.
fn report(label: &str, runs: &[Measured]) -> (f64, Option<f64>) {
    let later = &runs[1..];
    println!(
        "\n{label}: first run, and median of {} later run(s)",
        later.len()
    );
    let med = |f: &dyn Fn(&Measured) -> Option<f64>| {
        let v: Vec<f64> = later.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} ms"));
    println!("  {:<28} {:>12} {:>12}", "phase", "first", "later");
    for phase in PHASES {
        let first = runs[0].phases.get(phase).copied();
        let later = med(&|m| m.phases.get(phase).copied());
        if first.is_some() || later.is_some() {
            println!("  {phase:<28} {:>12} {:>12}", show(first), show(later));
        }
    }
    for (name, f) in [
        (
            "queue",
            &(|m: &Measured| Some(m.queue_ms)) as &dyn Fn(&Measured) -> Option<f64>,
        ),
        ("acknowledgement", &|m: &Measured| Some(m.ack_ms)),
        ("webhook → first model call", &|m: &Measured| {
            m.first_call_ms
        }),
        ("webhook → PR opened (total)", &|m: &Measured| {
            Some(m.total_ms)
        }),
    ] {
        println!(
            "  {name:<28} {:>12} {:>12}",
            show(f(&runs[0])),
            show(med(f))
        );
    }
    let preloaded: Vec<&str> = runs
        .iter()
        .map(|m| m.preloaded.as_deref().unwrap_or("-"))
        .collect();
    println!(
        "  warm starts: {} of {} run(s); preloaded checkout used: {}",
        runs.iter().filter(|m| m.warm).count(),
        runs.len(),
        preloaded.join(", ")
    );
    (runs[0].total_ms, med(&|m| Some(m.total_ms)))
}

/// Waits (up to 10 s) until the server's warm pool has a sandbox waiting, as it has when a
/// maintainer's next command comes a moment after the last one: the refill starts with
/// the run that took the last one.
async fn until_warm(s: &Served) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let (_, metrics) = s.get("/metrics").await;
        let waiting = metrics
            .lines()
            .find(|l| l.starts_with("kodx_engine_warm_sandboxes{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The resident memory of the idle server, in MB (after 2 s without work; both servers
/// are measured so, before their first run).
async fn idle_rss_mb(s: &Served) -> f64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.kodx_pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// `kodx serve` with workers and one warm sandbox per engine (the default setting), or
/// none.
async fn server(warm: bool) -> Served {
    Served::start(common::serve::Options {
        workers: true,
        settings: Some(if warm {
            "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nwarm_sandboxes = 1\nwarm_repositories = 2\n"
        } else {
            "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nwarm_sandboxes = 0\nwarm_repositories = 0\n"
        }),
        ..Default::default()
    })
    .await
}

async fn measure(label: &str, s: &Served, runs: usize, first_issue: u64) -> (f64, Option<f64>) {
    measure_with(label, s, runs, first_issue, |_| {}).await
}

/// As [`measure`], also returning each run's figures.
async fn measure_runs(
    label: &str,
    s: &Served,
    runs: usize,
    first_issue: u64,
) -> (Vec<Measured>, (f64, Option<f64>)) {
    let db = open_db(s).await;
    let mut all = Vec::new();
    for i in 0..runs.max(2) {
        until_warm(s).await;
        all.push(code_once(s, &db, first_issue + i as u64).await);
    }
    db.close().await;
    let figures = report(label, &all);
    (all, figures)
}

/// `runs` pairs of code runs: the first once the pool has a warm sandbox and its two
/// preloaded ones (issue 43, as after a moment without commands; a note when they do not
/// come), the second `gap` after the first one's pull
/// request opened (without waiting for the pool); prints the second runs' figures (the
/// first line of the report is the first pair's second run, "later" the median of the
/// others') and how many of them found a warm sandbox; returns the second runs.
async fn second_commands(
    s: &Served,
    runs: usize,
    first_issue: u64,
    gap: Duration,
    label: &str,
) -> Vec<Measured> {
    let db = open_db(s).await;
    let mut seconds = Vec::new();
    for i in 0..runs.max(2) as u64 {
        until_warm(s).await;
        preload::until_preloaded(s, 2).await;
        code_once(s, &db, first_issue + 2 * i).await;
        tokio::time::sleep(gap).await;
        seconds.push(code_once(s, &db, first_issue + 2 * i + 1).await);
    }
    db.close().await;
    report(label, &seconds);
    seconds
}

/// As [`measure`], calling `between(i)` before each run after the first.
async fn measure_with(
    label: &str,
    s: &Served,
    runs: usize,
    first_issue: u64,
    between: impl Fn(usize),
) -> (f64, Option<f64>) {
    let db = open_db(s).await;
    let mut all = Vec::new();
    // KODX_BENCH_PAUSE_MS: a pause between runs, so a run does not start while the
    // engine's filesystem is still busy with the previous run's container (as a
    // maintainer's next command usually does not).
    let pause = Duration::from_millis(env_usize("KODX_BENCH_PAUSE_MS", 0) as u64);
    for i in 0..runs.max(2) {
        if i > 0 {
            between(i);
            tokio::time::sleep(pause).await;
        }
        until_warm(s).await;
        all.push(code_once(s, &db, first_issue + i as u64).await);
    }
    db.close().await;
    report(label, &all)
}

/// Code runs with one check (`true`) declared: the median of the `verifier` phase, what
/// running the checks apart from the agent added (issue 37).
async fn with_a_check(label: &str, s: &Served, runs: usize, first_issue: u64) -> f64 {
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        "checks:\n  - { name: ok, run: \"true\" }\n",
    );
    let (all, _) = measure_runs(label, s, runs, first_issue).await;
    s.github.set_file(REPO, ".github/kodx.yml", "{}\n");
    median(
        all.iter()
            .skip(1)
            .map(|m| m.phases.get("verifier").copied().expect("a verifier phase"))
            .collect(),
    )
}

/// `/kodx ask` runs: the time from the model's last answer arriving at kodx to the answer
/// posted on the issue, for each run; each once a warm sandbox waits, and a preloaded one
/// when `preloaded` (issue 43).
async fn ask_latency(
    s: &Served,
    runs: usize,
    first_issue: u64,
    preloaded: bool,
) -> (Vec<f64>, Vec<f64>, Vec<AskRun>) {
    let db = open_db(s).await;
    let mut out = Vec::new();
    let mut first_calls = Vec::new();
    let mut whole = Vec::new();
    for i in 0..runs {
        until_warm(s).await;
        if preloaded {
            preload::until_preloaded(s, 1).await;
        }
        let calls_before = s.model.requests().len();
        let number = first_issue + i as u64;
        s.github.add_issue(REPO, number, "Question", "", "carol");
        s.model.reply(
            vec![
                json!({"type": "tool_use", "id": format!("a{number}"), "name": "feed_chars",
                        "input": {"chars": "ls | head -3"}}),
            ],
            "tool_use",
            usage(1000, 10),
        );
        let answered = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
        let mark = answered.clone();
        let words = format!("The answer to question {number}.");
        let text = words.clone();
        s.model
            .push(Scripted::Dynamic(Box::new(move |_req: &Value| {
                *mark.lock().unwrap() = Some(Instant::now());
                json!({
                    "id": format!("msg_{}", rand::random::<u32>()),
                    "type": "message", "role": "assistant",
                    "model": "claude-sonnet-4-5-20250929",
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn", "stop_sequence": null, "usage": usage(1000, 10),
                })
            })));
        let sent = Instant::now();
        let run = s
            .comment(number, "alice", "/kodx ask what is in this repository?")
            .await;
        let started = Instant::now();
        loop {
            if bot_comments(s, number)
                .iter()
                .any(|c| c.body.contains(&words))
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "no answer:\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let posted = Instant::now();
        let at = answered.lock().unwrap().expect("the model answered");
        out.push(posted.duration_since(at).as_secs_f64() * 1000.0);
        if let Some(r) = s.model.requests().get(calls_before) {
            first_calls.push(r.at.duration_since(sent).as_secs_f64() * 1000.0);
        }
        let (_, result) = finished(&db, &run.0).await;
        whole.push(AskRun {
            total_ms: posted.duration_since(sent).as_secs_f64() * 1000.0,
            phases: serde_json::from_value(result["timings_ms"].clone()).unwrap_or_default(),
        });
    }
    db.close().await;
    (out, first_calls, whole)
}

/// One `/kodx ask` from the webhook to its answer posted, and the phases the run stored.
struct AskRun {
    total_ms: f64,
    phases: std::collections::BTreeMap<String, u64>,
}

/// Where an ask's time went (issue 43, item 4): the median of webhook → answer posted,
/// each stored phase's median, and the rest (acknowledgement, status comment, the issue's
/// and the repository's context reads, the answer's post).
fn print_ask_breakdown(what: &str, asks: &[AskRun]) {
    let total = median(asks.iter().map(|a| a.total_ms).collect());
    let mut names: Vec<&String> = asks.iter().flat_map(|a| a.phases.keys()).collect();
    names.sort();
    names.dedup();
    let mut parts = Vec::new();
    let mut sum = 0.0;
    for name in names {
        let m = median(
            asks.iter()
                .map(|a| a.phases.get(name).copied().unwrap_or(0) as f64)
                .collect(),
        );
        sum += m;
        parts.push(format!("{name} {m:.0}"));
    }
    println!(
        "{what}: webhook → answer posted median {total:.0} ms (target <= 1500: {}); phases (median ms): {}; the rest {:.0}",
        if total <= 1500.0 { "ok" } else { "MISSED" },
        parts.join(", "),
        (total - sum).max(0.0)
    );
}

/// With KODX_BENCH_LOG: where each run's copy-in went (kodx reading, or the engine
/// writing), how much of the tree was already in the container, and the ready checkouts
/// streamed and kept, and how each change set was read (the snapshot, or why not).
fn print_copy_ins(s: &Served) {
    if std::env::var("KODX_BENCH_LOG").is_ok() {
        for line in s.log().lines().filter(|l| {
            l.contains("packed the repository")
                || l.contains("ready checkout")
                || l.contains("snapshot")
        }) {
            println!("  {line}");
        }
    }
}

/// The setup cache's images the benchmark made (its repository's scope).
async fn remove_setup_images() {
    use bollard::query_parameters::{ListImagesOptions, RemoveImageOptions};
    use kodx::sandbox::setup_cache::SCOPE_LABEL;
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec![format!("{SCOPE_LABEL}={REPO}")],
    )]);
    let images = docker
        .list_images(Some(ListImagesOptions {
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    for image in images {
        let options = RemoveImageOptions {
            force: true,
            ..Default::default()
        };
        let _ = docker.remove_image(&image.id, Some(options), None).await;
    }
}

fn figure(results: &mut Vec<bool>, name: &str, ms: f64, target_ms: f64) {
    let ok = ms <= target_ms;
    results.push(ok);
    println!(
        "  {name:<56} {ms:>9.0} ms  target <= {target_ms:.0} ms: {}",
        if ok { "ok" } else { "MISSED" }
    );
}

#[tokio::test]
#[ignore = "benchmark: bash bench/pr-latency.sh"]
async fn webhook_to_pull_request() {
    let Some(_engine) = common::engine().await else {
        panic!("the benchmark needs the Docker engine and the test images");
    };
    let runs = env_usize("KODX_BENCH_RUNS", 5);
    let files = env_usize("KODX_BENCH_FILES", 3_000);
    let commits = env_usize("KODX_BENCH_COMMITS", 20_000);

    let journaled = std::env::var("KODX_BENCH_ENGINE").is_ok_and(|e| e == "journaled");
    if std::env::var("KODX_BENCH_ONLY").is_ok_and(|v| v == "cargo") {
        // The cargo-sized code runs alone, and issue 43's scenarios on them.
        cargo::only(runs, files, commits, journaled).await;
        return;
    }
    let s = server(false).await;
    let rss_cold = idle_rss_mb(&s).await;
    let (_, cold_small) = measure(
        "small repository (3 files), no warm sandboxes",
        &s,
        runs,
        100,
    )
    .await;
    drop(s);

    let s = server(true).await;
    until_warm(&s).await;
    let rss_warm = idle_rss_mb(&s).await;
    let (small, _) = measure_runs("small repository (3 files)", &s, runs, 100).await;
    let small_first_call = median(
        small
            .iter()
            .skip(1)
            .filter_map(|m| m.first_call_ms)
            .collect(),
    );
    let (_, small_ask_first_call, _) = ask_latency(&s, runs, 500, false).await;
    let small = small[0].total_ms;
    let small_verifier = with_a_check("small repository (3 files), one check", &s, runs, 700).await;
    drop(s);

    let s = server(true).await;
    let made = Instant::now();
    common::synthetic::fill_bare(&s.git.bare_path(REPO), files, commits);
    println!(
        "\n(made the cargo-sized repository, {files} files and {commits} commits, in {:.1} s)",
        made.elapsed().as_secs_f64()
    );
    let cargo = measure(
        &format!("cargo-sized repository ({files} files, {commits} commits)"),
        &s,
        runs,
        100,
    )
    .await;
    print_copy_ins(&s);
    // The mirror is warm now: every ask run is a second run.
    let (asks, _, ask_runs) = ask_latency(&s, runs, 500, false).await;
    print_ask_breakdown("ask, cargo-sized, second run", &ask_runs);
    let cargo_verifier = with_a_check(
        &format!("cargo-sized repository ({files} files), one check"),
        &s,
        runs,
        700,
    )
    .await;
    drop(s);

    let s = server(true).await;
    let contents: Vec<(String, Vec<u8>)> = (0..20_000)
        .map(|i| {
            (
                format!("src/d{}/f{i}.txt", i % 200),
                format!("file {i}\n").into_bytes(),
            )
        })
        .collect();
    let tree: Vec<(&str, &[u8], u32)> = contents
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_slice(), 0o644))
        .collect();
    s.git.commit_on_branch(REPO, "main", &tree, "20,000 files");
    let large = measure("20,000-file repository", &s, runs, 100).await;
    print_copy_ins(&s);
    drop(s);

    // The same files with a setup script: later runs start from the setup cache's image,
    // and main moves by one edited file before each.
    let s = server(true).await;
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        "setup_script: |\n  mkdir -p node_modules && echo x > node_modules/x.js\n",
    );
    let mut with_setup = tree.clone();
    with_setup.push(("package-lock.json", b"{}\n".as_slice(), 0o644));
    s.git
        .commit_on_branch(REPO, "main", &with_setup, "20,000 files and a setup script");
    let cached = measure_with(
        "20,000 files, setup script; main moves one commit between runs",
        &s,
        runs,
        100,
        |i| {
            let edit = format!("edit {i}\n");
            s.git.commit_on_branch(
                REPO,
                "main",
                &[("src/d0/f0.txt", edit.as_bytes(), 0o644)],
                "One edit",
            );
        },
    )
    .await;
    print_copy_ins(&s);
    remove_setup_images().await;
    drop(s);

    println!(
        "\ntargets (release build, webhook → PR opened; later runs: median; sandboxes on {})",
        if journaled {
            "the journaled-ext4 engine"
        } else {
            "this machine's engine"
        }
    );
    let mut results = Vec::new();
    figure(
        &mut results,
        "warm code, small: webhook → first model call",
        small_first_call,
        300.0,
    );
    figure(
        &mut results,
        "warm ask, small: webhook → first model call",
        median(small_ask_first_call),
        300.0,
    );
    figure(
        &mut results,
        "warm code, cargo-sized: webhook → PR",
        cargo.1.unwrap(),
        if journaled { 1000.0 } else { 2000.0 },
    );
    println!(
        "  (small repository without warm sandboxes, later runs: {:.0} ms to the PR)",
        cold_small.unwrap_or(f64::NAN)
    );
    let more = rss_warm - rss_cold;
    results.push(more <= 10.0);
    println!(
        "  {:<56} {more:>9.1} MB  target <= 10 MB: {}   ({rss_cold:.1} MB without, {rss_warm:.1} MB with)",
        "idle kodx serve: memory with a warm sandbox",
        if more <= 10.0 { "ok" } else { "MISSED" }
    );
    figure(&mut results, "small repository, first run", small, 3000.0);
    figure(
        &mut results,
        "cargo-sized repository, first run",
        cargo.0,
        5000.0,
    );
    figure(
        &mut results,
        "cargo-sized repository, second run",
        cargo.1.unwrap(),
        2000.0,
    );
    figure(
        &mut results,
        "20,000-file repository, first run",
        large.0,
        12000.0,
    );
    figure(
        &mut results,
        "20,000-file repository, second run",
        large.1.unwrap(),
        4000.0,
    );
    figure(
        &mut results,
        "20,000 files with setup (cache hit), later run",
        cached.1.unwrap(),
        4000.0,
    );
    figure(
        &mut results,
        "ask, cargo-sized, second run: model's answer → posted",
        median(asks),
        1500.0,
    );
    // The scripted model ends its turn at once: the checks' sandbox is made on demand
    // (a real model's turn is longer than making it: bench/checks.sh measures that case).
    for (name, ms) in [
        (
            "checks' sandbox per pass, small (made on demand)",
            small_verifier,
        ),
        (
            "checks' sandbox per pass, cargo-sized (made on demand)",
            cargo_verifier,
        ),
    ] {
        figure(&mut results, name, ms, 1000.0);
    }
    println!(
        "{} of {} targets met",
        results.iter().filter(|r| **r).count(),
        results.len()
    );
}
