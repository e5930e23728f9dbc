//! `kodx bench`: figures for the engine (written by the benchmark change).
//!
//! `kodx bench sandbox` measures, on one image and in one run: the cold start of a sandbox,
//! the `feed_chars` round trip, a new named shell, the copy-in of a repository and the
//! change-set export, next to two plain docker CLI baselines (`docker run`, `docker exec`).
//! It prints n, median, p95, min and max of each, and whether the targets were met. A missed
//! target is a figure, not a failure: the exit code is non-zero only when something broke.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use kodx::sandbox::{ChangeKind, DockerSandbox, Engine, Sandbox, SandboxSpec, ShellStatus};

/// The image used when neither `--image` nor `KODX_BENCH_IMAGE` names one.
const DEFAULT_IMAGE: &str = "kodx-test:bookworm";
/// How long one `feed_chars` of the benchmark may take before it counts as broken.
const FEED_YIELD: Duration = Duration::from_secs(20);
/// Names `create_new_shell` cycles through (a sandbox keeps at most 16 shells; re-creating
/// a name replaces that shell).
const SHELL_NAMES: usize = 8;
/// Subdirectories the generated repository spreads its files over.
const TREE_DIRS: usize = 100;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// The sandbox engine: cold start, echo round trip, new shell, change-set export.
    Sandbox(SandboxArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct SandboxArgs {
    /// The image every measurement uses.
    #[arg(long, env = "KODX_BENCH_IMAGE", default_value = DEFAULT_IMAGE)]
    image: String,
    /// Samples of the cold start and of the `docker run` baseline.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// Samples of the `feed_chars("echo hi")` round trip (the `docker exec` baseline takes
    /// a quarter of it, at least 20).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    echo_reps: u32,
    /// Samples of `create_new_shell`.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    shell_reps: u32,
    /// Files in the generated repository of the copy-in and change-set measurements.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(3..))]
    files: u32,
    /// Samples of the copy-in and of the change-set export (one fresh sandbox each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    export_reps: u32,
    /// Print the results as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Sandbox(args) => bench_sandbox(args).await,
    }
}

// ---------------------------------------------------------------------------------------
// Statistics

/// Summary of one measurement's samples, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stats {
    n: usize,
    /// The middle sample; with an even count, the mean of the two middle ones
    /// (1..=100 gives 50.5).
    median: f64,
    /// Nearest rank: the ⌈0.95·n⌉-th smallest sample (1..=100 gives 95).
    p95: f64,
    min: f64,
    max: f64,
}

impl Stats {
    /// `None` for no samples.
    fn of(samples_ms: &[f64]) -> Option<Stats> {
        if samples_ms.is_empty() {
            return None;
        }
        let mut s = samples_ms.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Stats {
            n,
            median,
            p95: s[nearest_rank(n, 95) - 1],
            min: s[0],
            max: s[n - 1],
        })
    }
}

/// The 1-based nearest rank of percentile `pct` among `n` sorted samples: ⌈pct·n/100⌉,
/// at least 1. Integer arithmetic, so 95 % of 100 is exactly rank 95.
fn nearest_rank(n: usize, pct: usize) -> usize {
    (pct * n).div_ceil(100).clamp(1, n.max(1))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------------------------------
// Results

#[derive(Debug, Clone)]
struct Goal {
    /// E.g. "≤ 15 ms".
    text: String,
    limit_ms: f64,
    ok: bool,
}

impl Goal {
    fn median_at_most(stats: &Stats, limit_ms: f64, text: String) -> Goal {
        Goal {
            text,
            limit_ms,
            ok: stats.median <= limit_ms,
        }
    }
}

#[derive(Debug, Clone)]
struct Row {
    /// Stable key for the JSON output.
    key: &'static str,
    name: String,
    stats: Stats,
    target: Option<Goal>,
    /// Extra words for the target column when there is no target (or it cannot be judged).
    note: Option<String>,
}

struct Report {
    image: String,
    api_version: String,
    host: String,
    cpus: Option<i64>,
    server_version: Option<String>,
    rows: Vec<Row>,
    baselines_skipped: Option<String>,
}

// ---------------------------------------------------------------------------------------
// The run

async fn bench_sandbox(args: SandboxArgs) -> anyhow::Result<ExitCode> {
    let engine = Engine::connect()
        .await
        .context("connecting to the Docker engine")?;
    let info = engine
        .docker()
        .info()
        .await
        .context("asking the Docker engine for its description")?;
    progress(&format!(
        "engine at {} (API {}), image {}",
        engine.host(),
        engine.api_version(),
        args.image
    ));
    engine
        .ensure_image(&args.image, progress)
        .await
        .with_context(|| format!("making sure the image {} is present", args.image))?;

    // Distinct run ids for this process, so two benchmarks at once do not collide.
    let session = format!("{:08x}", rand::random::<u32>());

    let cli = match docker_cli_probe().await {
        Ok(()) => None,
        Err(why) => {
            progress(&format!("the docker CLI baselines are skipped: {why}"));
            Some(why)
        }
    };

    // 1. Cold start, next to its `docker run` baseline.
    let docker_run = match &cli {
        None => Some(
            docker_run_baseline(&args.image, args.reps)
                .await
                .context("the `docker run` baseline")?,
        ),
        Some(_) => None,
    };
    let cold = cold_start(&engine, &args.image, &session, args.reps)
        .await
        .context("the cold start measurement")?;

    // 2. and 3. One sandbox for the echo round trip and the new shells.
    let (echo, shells) = shell_measurements(&engine, &args, &session)
        .await
        .context("the shell measurements")?;

    // 4. Copy-in and change-set export of a generated repository.
    let ExportFigures {
        copy_in,
        upload,
        export,
    } = export_measurements(&engine, &args, &session)
        .await
        .context("the change-set measurements")?;

    // 5. The `docker exec` baseline.
    let exec_reps = (args.echo_reps / 4).max(20);
    let docker_exec = match &cli {
        None => Some(
            docker_exec_baseline(&args.image, &session, exec_reps)
                .await
                .context("the `docker exec` baseline")?,
        ),
        Some(_) => None,
    };

    let mut rows = Vec::new();
    let docker_run_stats = docker_run.as_deref().and_then(Stats::of);
    let cold_stats = stats_of(&cold)?;
    let (target, note) = match &docker_run_stats {
        Some(base) => (
            Some(Goal::median_at_most(
                &cold_stats,
                1.2 * base.median,
                format!("≤ 1.2 × docker run ({})", fmt_ms(base.median)),
            )),
            None,
        ),
        None => (
            None,
            Some("≤ 1.2 × docker run: not judged (no baseline)".to_string()),
        ),
    };
    rows.push(Row {
        key: "cold_start",
        name: "cold start (create → first shell prompt)".to_string(),
        stats: cold_stats,
        target,
        note,
    });
    let echo_stats = stats_of(&echo)?;
    rows.push(Row {
        key: "echo_round_trip",
        name: "feed_chars(\"echo hi\") round trip".to_string(),
        target: Some(Goal::median_at_most(&echo_stats, 15.0, "≤ 15 ms".into())),
        stats: echo_stats,
        note: None,
    });
    let shell_stats = stats_of(&shells)?;
    rows.push(Row {
        key: "new_shell",
        name: "create_new_shell (new named shell)".to_string(),
        target: Some(Goal::median_at_most(&shell_stats, 50.0, "≤ 50 ms".into())),
        stats: shell_stats,
        note: None,
    });
    // The same samples split: a name's first use starts one exec; replacing a name also
    // hangs up the old shell (one more, detached, exec).
    if shells.len() > SHELL_NAMES {
        let (first, again) = shells.split_at(SHELL_NAMES);
        for (key, name, part) in [
            (
                "new_shell_first_use",
                "  of which: first use of a name",
                first,
            ),
            ("new_shell_replace", "  of which: replacing a name", again),
        ] {
            rows.push(Row {
                key,
                name: name.to_string(),
                stats: stats_of(part)?,
                target: None,
                note: None,
            });
        }
    }
    let copy_stats = stats_of(&copy_in)?;
    rows.push(Row {
        key: "copy_in",
        name: format!("copy-in of {} files (start with repo)", args.files),
        note: Some(format!(
            "(+{} over cold start)",
            fmt_ms(copy_stats.median - cold_stats.median)
        )),
        stats: copy_stats,
        target: None,
    });
    if let Some(stats) = Stats::of(&upload) {
        rows.push(Row {
            key: "copy_in_upload",
            name: "  of which: packing + upload of the tar".to_string(),
            stats,
            target: None,
            note: None,
        });
    }
    let export_stats = stats_of(&export)?;
    rows.push(Row {
        key: "change_set_export",
        name: format!("change-set export, {} files, 3 changed", args.files),
        target: Some(Goal::median_at_most(
            &export_stats,
            1000.0,
            "≤ 1000 ms".into(),
        )),
        stats: export_stats,
        note: None,
    });
    if let Some(stats) = docker_run_stats {
        rows.push(Row {
            key: "docker_run_baseline",
            name: "docker run --rm IMAGE true (baseline)".to_string(),
            stats,
            target: None,
            note: None,
        });
    }
    if let Some(stats) = docker_exec.as_deref().and_then(Stats::of) {
        rows.push(Row {
            key: "docker_exec_baseline",
            name: "docker exec CID true (baseline)".to_string(),
            stats,
            target: None,
            note: None,
        });
    }

    let report = Report {
        image: args.image.clone(),
        api_version: engine.api_version().to_string(),
        host: engine.host().to_string(),
        cpus: info.ncpu,
        server_version: info.server_version,
        rows,
        baselines_skipped: cli,
    };
    if args.json {
        println!("{}", render_json(&report));
    } else {
        print!("{}", render_table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn stats_of(samples: &[f64]) -> anyhow::Result<Stats> {
    Stats::of(samples).context("a measurement took no samples")
}

fn progress(line: &str) {
    eprintln!("bench: {line}");
}

/// Destroys `sandbox` whatever `result` is; the measurement's error comes first, then the
/// removal's.
async fn finish<T>(sandbox: DockerSandbox, result: anyhow::Result<T>) -> anyhow::Result<T> {
    let id = sandbox.container_id().to_string();
    let removed = sandbox.destroy().await;
    let value = result?;
    removed.with_context(|| format!("removing the sandbox container {id}"))?;
    Ok(value)
}

/// `reps` × (start without a repository, destroy), timing only the start; one untimed
/// warm-up first.
async fn cold_start(
    engine: &Engine,
    image: &str,
    session: &str,
    reps: u32,
) -> anyhow::Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(reps as usize);
    for i in 0..=reps {
        if i == 0 {
            progress("cold start: warm-up");
        } else if i == 1 || i % 5 == 0 || i == reps {
            progress(&format!("cold start: {i}/{reps}"));
        }
        let spec = SandboxSpec::new(format!("bench-{session}-cold-{i}"), image);
        let t = Instant::now();
        let sandbox = engine
            .start(&spec)
            .await
            .with_context(|| format!("starting sandbox {}", spec.run_id))?;
        let took = ms(t.elapsed());
        finish(sandbox, Ok(())).await?;
        if i > 0 {
            samples.push(took);
        }
    }
    Ok(samples)
}

/// The echo round trip and the new-shell figures, from one sandbox.
async fn shell_measurements(
    engine: &Engine,
    args: &SandboxArgs,
    session: &str,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let spec = SandboxSpec::new(format!("bench-{session}-shell"), &args.image);
    let sandbox = engine
        .start(&spec)
        .await
        .with_context(|| format!("starting sandbox {}", spec.run_id))?;
    let result: anyhow::Result<(Vec<f64>, Vec<f64>)> = async {
        let echo = echo_round_trips(&sandbox, args.echo_reps).await?;
        let shells = new_shells(&sandbox, args.shell_reps).await?;
        Ok((echo, shells))
    }
    .await;
    finish(sandbox, result).await
}

/// Types `chars` into the default shell and requires exit status 0.
async fn run_ok(sandbox: &DockerSandbox, shell: &str, chars: &str) -> anyhow::Result<String> {
    let out = sandbox
        .feed_chars(shell, chars, FEED_YIELD)
        .await
        .with_context(|| format!("typing {chars:?} into shell {shell:?}"))?;
    ensure!(
        out.status == (ShellStatus::Ready { exit_code: Some(0) }),
        "{chars:?} in shell {shell:?} did not end with exit status 0: {:?}, output {:?}",
        out.status,
        out.output
    );
    Ok(out.output)
}

async fn echo_round_trips(sandbox: &DockerSandbox, reps: u32) -> anyhow::Result<Vec<f64>> {
    progress(&format!("feed_chars(\"echo hi\"): {reps} round trips"));
    // Untimed warm-up: the first command of a fresh shell.
    run_ok(sandbox, "default", "true").await?;
    let mut samples = Vec::with_capacity(reps as usize);
    for i in 0..reps {
        let t = Instant::now();
        let out = sandbox
            .feed_chars("default", "echo hi", FEED_YIELD)
            .await
            .context("feed_chars(\"echo hi\")")?;
        let took = ms(t.elapsed());
        if out.output != "hi\n" || out.status != (ShellStatus::Ready { exit_code: Some(0) }) {
            bail!(
                "feed_chars(\"echo hi\") #{} returned output {:?} with status {:?}; expected \"hi\\n\" at the prompt with exit status 0",
                i + 1,
                out.output,
                out.status
            );
        }
        samples.push(took);
    }
    Ok(samples)
}

async fn new_shells(sandbox: &DockerSandbox, reps: u32) -> anyhow::Result<Vec<f64>> {
    progress(&format!(
        "create_new_shell: {reps} shells over the names b0..b{}",
        SHELL_NAMES - 1
    ));
    let mut samples = Vec::with_capacity(reps as usize);
    let mut last = String::new();
    for i in 0..reps as usize {
        let name = format!("b{}", i % SHELL_NAMES);
        let t = Instant::now();
        let said = sandbox
            .create_new_shell(&name)
            .await
            .with_context(|| format!("create_new_shell({name:?}) #{}", i + 1))?;
        samples.push(ms(t.elapsed()));
        // The first SHELL_NAMES calls start shells, the later ones replace them.
        let want = if i < SHELL_NAMES {
            "Started"
        } else {
            "Replaced"
        };
        ensure!(
            said.starts_with(want),
            "create_new_shell({name:?}) #{} answered {said:?}; expected it to start with {want:?}",
            i + 1
        );
        last = name;
    }
    // Untimed check that what was made is a working shell: a command there ends at the
    // prompt with exit status 0. (Its output is not compared: the echo round trip does
    // that, and the first output of a fresh shell is what this check would judge.)
    run_ok(sandbox, &last, "true").await?;
    Ok(samples)
}

/// The generated repository's file number `i`, relative to its root.
fn tree_file(i: usize) -> String {
    format!("d{:02}/f{i:05}.txt", i % TREE_DIRS)
}

/// Deterministic contents of file `i`: 100 to 200 bytes.
fn tree_contents(i: usize) -> Vec<u8> {
    let len = 100 + (i * 37) % 101;
    let line = format!("kodx benchmark file {i}: the quick brown fox jumps over the lazy dog.\n");
    line.bytes().cycle().take(len).collect()
}

/// Writes `files` small files over [`TREE_DIRS`] subdirectories of `root`.
fn write_tree(root: &Path, files: usize) -> anyhow::Result<u64> {
    let mut bytes = 0;
    for d in 0..TREE_DIRS.min(files) {
        let dir = root.join(format!("d{d:02}"));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for i in 0..files {
        let path = root.join(tree_file(i));
        let contents = tree_contents(i);
        bytes += contents.len() as u64;
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(bytes)
}

/// Samples of [`export_measurements`], in milliseconds.
struct ExportFigures {
    /// The whole `engine.start` with the repository.
    copy_in: Vec<f64>,
    /// Its phase from packing-and-uploading the tar to the shell start.
    upload: Vec<f64>,
    /// `change_set()`.
    export: Vec<f64>,
}

/// `export_reps` × (start with the generated repository — the copy-in sample —, change 3
/// files in the shell, `change_set()` — the export sample —, destroy).
async fn export_measurements(
    engine: &Engine,
    args: &SandboxArgs,
    session: &str,
) -> anyhow::Result<ExportFigures> {
    let files = args.files as usize;
    progress(&format!("writing a repository of {files} files"));
    let dir = tempfile::Builder::new()
        .prefix("kodx-bench-")
        .tempdir()
        .context("making a temporary directory for the benchmark repository")?;
    let root: PathBuf = dir.path().to_path_buf();
    let bytes = tokio::task::spawn_blocking(move || write_tree(&root, files))
        .await
        .context("the task writing the benchmark repository")??;
    progress(&format!(
        "repository: {files} files, {bytes} bytes over {} directories",
        TREE_DIRS.min(files)
    ));

    let (a, b, c) = (tree_file(0), tree_file(1), tree_file(2));
    let change = format!("echo appended >> {a} && echo appended >> {b} && rm {c}");
    let mut copy_in = Vec::new();
    let mut upload = Vec::new();
    let mut export = Vec::new();
    for i in 1..=args.export_reps {
        progress(&format!(
            "copy-in and change-set export: {i}/{}",
            args.export_reps
        ));
        let mut spec = SandboxSpec::new(format!("bench-{session}-export-{i}"), &args.image);
        spec.repo_dir = Some(dir.path().to_path_buf());
        // The same as `engine.start`, with the phases timed: the copy runs from "copying
        // the repository" (the host-side packing is awaited there) to "starting the shell".
        let mut copying = None;
        let mut shell_at = None;
        let t = Instant::now();
        let sandbox = engine
            .start_with_progress(&spec, |phase| {
                if phase.starts_with("copying") {
                    copying = Some(Instant::now());
                } else if phase.starts_with("starting the shell") {
                    shell_at = Some(Instant::now());
                }
            })
            .await
            .with_context(|| format!("starting sandbox {} with the repository", spec.run_id))?;
        copy_in.push(ms(t.elapsed()));
        if let (Some(a), Some(b)) = (copying, shell_at) {
            upload.push(ms(b.duration_since(a)));
        }
        let result: anyhow::Result<f64> = async {
            run_ok(&sandbox, "default", &change).await?;
            let t = Instant::now();
            let set = sandbox.change_set().await.context("change_set()")?;
            let took = ms(t.elapsed());
            let got: Vec<String> = set
                .changes
                .iter()
                .map(|ch| {
                    let kind = match ch.kind {
                        ChangeKind::Added(_) => "added",
                        ChangeKind::Modified { .. } => "modified",
                        ChangeKind::Deleted => "deleted",
                    };
                    format!("{kind} {}", ch.path)
                })
                .collect();
            let want = vec![
                format!("modified {a}"),
                format!("modified {b}"),
                format!("deleted {c}"),
            ];
            ensure!(
                got == want,
                "change_set() after changing 3 files has {} changes ({}): {got:?}; expected {want:?}",
                set.changes.len(),
                set.summary()
            );
            Ok(took)
        }
        .await;
        export.push(finish(sandbox, result).await?);
    }
    dir.close()
        .context("removing the benchmark repository's temporary directory")?;
    Ok(ExportFigures {
        copy_in,
        upload,
        export,
    })
}

// ---------------------------------------------------------------------------------------
// docker CLI baselines

/// Checks that the docker CLI exists and reaches an engine; the error says why not.
async fn docker_cli_probe() -> Result<(), String> {
    let out = tokio::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.APIVersion}}"])
        .stdin(Stdio::null())
        .output()
        .await;
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("the `docker` CLI is not on PATH".to_string())
        }
        Err(e) => Err(format!("running the `docker` CLI failed: {e}")),
        Ok(out) if !out.status.success() => Err(format!(
            "`docker version` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

/// Runs `docker ARGS` and requires success; returns its stdout.
async fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running `docker {}`", args.join(" ")))?;
    ensure!(
        out.status.success(),
        "`docker {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `reps` × `docker run --rm IMAGE true`, after one untimed warm-up.
async fn docker_run_baseline(image: &str, reps: u32) -> anyhow::Result<Vec<f64>> {
    progress(&format!("docker run --rm {image} true: {reps} runs"));
    docker(&["run", "--rm", image, "true"]).await?;
    let mut samples = Vec::with_capacity(reps as usize);
    for _ in 0..reps {
        let t = Instant::now();
        docker(&["run", "--rm", image, "true"]).await?;
        samples.push(ms(t.elapsed()));
    }
    Ok(samples)
}

/// A plain container started by the docker CLI; removed with `docker rm -f` by
/// [`CliContainer::remove`], or on drop when that was never reached. It carries kodx's
/// labels, so `kodx doctor` sweeps it up if this process is killed, and its `sleep 600`
/// ends it in any case.
struct CliContainer {
    id: String,
    removed: bool,
}

impl CliContainer {
    async fn start(image: &str, session: &str) -> anyhow::Result<CliContainer> {
        use kodx::sandbox::docker::{
            owner_id, process_identity, OWNER_LABEL, PROCESS_LABEL, RUN_LABEL,
        };
        let mut args = vec![
            "run".to_string(),
            "-d".into(),
            "--rm".into(),
            "--label".into(),
            format!("{RUN_LABEL}=bench-{session}-exec"),
            "--label".into(),
            format!("{OWNER_LABEL}={}", owner_id()),
        ];
        if let Some(me) = process_identity() {
            args.extend(["--label".into(), format!("{PROCESS_LABEL}={me}")]);
        }
        args.extend([image.to_string(), "sleep".into(), "600".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = docker(&args).await?;
        let id = out.trim().to_string();
        ensure!(!id.is_empty(), "`docker run -d` printed no container id");
        Ok(CliContainer { id, removed: false })
    }

    async fn remove(mut self) -> anyhow::Result<()> {
        self.removed = true;
        docker(&["rm", "-f", &self.id]).await.map(|_| ())
    }
}

impl Drop for CliContainer {
    fn drop(&mut self) {
        if !self.removed {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", &self.id])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `reps` × `docker exec CID true` into a plain `sleep 600` container, after one untimed
/// warm-up; the container is removed on every path.
async fn docker_exec_baseline(image: &str, session: &str, reps: u32) -> anyhow::Result<Vec<f64>> {
    progress(&format!("docker exec CID true: {reps} execs"));
    let container = CliContainer::start(image, session).await?;
    let result: anyhow::Result<Vec<f64>> = async {
        docker(&["exec", &container.id, "true"]).await?;
        let mut samples = Vec::with_capacity(reps as usize);
        for _ in 0..reps {
            let t = Instant::now();
            docker(&["exec", &container.id, "true"]).await?;
            samples.push(ms(t.elapsed()));
        }
        Ok(samples)
    }
    .await;
    let id = container.id.clone();
    let removed = container.remove().await;
    let samples = result?;
    removed.with_context(|| format!("removing the baseline container {id}"))?;
    Ok(samples)
}

// ---------------------------------------------------------------------------------------
// Output

/// Milliseconds with two decimals below 10 ms, one above.
fn fmt_ms(v: f64) -> String {
    if v.abs() < 10.0 {
        format!("{v:.2}ms")
    } else {
        format!("{v:.1}ms")
    }
}

fn target_text(row: &Row) -> String {
    match (&row.target, &row.note) {
        (Some(t), _) => format!("{}: {}", t.text, if t.ok { "ok" } else { "MISSED" }),
        (None, Some(note)) => note.clone(),
        (None, None) => String::new(),
    }
}

fn render_table(r: &Report) -> String {
    let mut out = format!(
        "kodx bench sandbox — image {}, Docker API {}, {}\n",
        r.image,
        r.api_version,
        match r.cpus {
            Some(1) => "1 CPU".to_string(),
            Some(n) => format!("{n} CPUs"),
            None => "? CPUs".to_string(),
        }
    );
    let width = r
        .rows
        .iter()
        .map(|row| row.name.chars().count())
        .max()
        .unwrap_or(0)
        .max("measurement".len());
    out.push_str(&format!(
        "{:<width$}  {:>5}  {:>9}  {:>9}  {:>9}  {:>9}  target\n",
        "measurement", "n", "median", "p95", "min", "max"
    ));
    for row in &r.rows {
        let s = &row.stats;
        let line = format!(
            "{:<width$}  {:>5}  {:>9}  {:>9}  {:>9}  {:>9}  {}",
            row.name,
            s.n,
            fmt_ms(s.median),
            fmt_ms(s.p95),
            fmt_ms(s.min),
            fmt_ms(s.max),
            target_text(row)
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if let Some(why) = &r.baselines_skipped {
        out.push_str(&format!("docker CLI baselines skipped: {why}\n"));
    }
    out
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A finite number with three decimals (JSON has no NaN or infinity).
fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "null".to_string()
    }
}

fn json_opt_str(s: Option<&str>) -> String {
    s.map_or_else(|| "null".to_string(), json_str)
}

fn render_json(r: &Report) -> String {
    let rows: Vec<String> = r
        .rows
        .iter()
        .map(|row| {
            let s = &row.stats;
            let target = match &row.target {
                Some(t) => format!(
                    "{{\"description\":{},\"median_limit_ms\":{},\"ok\":{}}}",
                    json_str(&t.text),
                    json_num(t.limit_ms),
                    t.ok
                ),
                None => "null".to_string(),
            };
            format!(
                "{{\"id\":{},\"name\":{},\"n\":{},\"median_ms\":{},\"p95_ms\":{},\"min_ms\":{},\"max_ms\":{},\"target\":{},\"note\":{}}}",
                json_str(row.key),
                json_str(&row.name),
                s.n,
                json_num(s.median),
                json_num(s.p95),
                json_num(s.min),
                json_num(s.max),
                target,
                json_opt_str(row.note.as_deref())
            )
        })
        .collect();
    format!(
        "{{\"image\":{},\"docker_host\":{},\"docker_api_version\":{},\"docker_server_version\":{},\"cpus\":{},\"baselines_skipped\":{},\"measurements\":[{}]}}",
        json_str(&r.image),
        json_str(&r.host),
        json_str(&r.api_version),
        json_opt_str(r.server_version.as_deref()),
        r.cpus.map_or_else(|| "null".to_string(), |n| n.to_string()),
        json_opt_str(r.baselines_skipped.as_deref()),
        rows.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p95_of_1_to_100() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Stats::of(&samples).unwrap();
        assert_eq!(s.n, 100);
        // Even count: the mean of the 50th and 51st samples.
        assert_eq!(s.median, 50.5);
        // Nearest rank: ⌈0.95 × 100⌉ = 95th sample.
        assert_eq!(s.p95, 95.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 100.0);
    }

    #[test]
    fn odd_counts_and_small_samples() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.p95, s.min, s.max), (2.0, 3.0, 1.0, 3.0));
        let s = Stats::of(&[7.5]).unwrap();
        assert_eq!(
            (s.n, s.median, s.p95, s.min, s.max),
            (1, 7.5, 7.5, 7.5, 7.5)
        );
        // 20 samples: ⌈19.0⌉ = 19th; 21 samples: ⌈19.95⌉ = 20th.
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(Stats::of(&twenty).unwrap().p95, 19.0);
        let twenty_one: Vec<f64> = (1..=21).map(f64::from).collect();
        assert_eq!(Stats::of(&twenty_one).unwrap().p95, 20.0);
        assert_eq!(Stats::of(&twenty_one).unwrap().median, 11.0);
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn nearest_ranks() {
        assert_eq!(nearest_rank(1, 95), 1);
        assert_eq!(nearest_rank(5, 95), 5);
        assert_eq!(nearest_rank(10, 95), 10);
        assert_eq!(nearest_rank(50, 95), 48);
        assert_eq!(nearest_rank(200, 95), 190);
        assert_eq!(nearest_rank(100, 50), 50);
    }

    #[test]
    fn tree_is_deterministic_and_sized() {
        assert_eq!(tree_file(0), "d00/f00000.txt");
        assert_eq!(tree_file(19_999), "d99/f19999.txt");
        for i in 0..500 {
            let c = tree_contents(i);
            assert!((100..=200).contains(&c.len()), "{i}: {}", c.len());
            assert_eq!(c, tree_contents(i));
        }
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\nd→"), "\"a\\\"b\\\\c\\nd→\"");
        assert_eq!(json_str("\u{1}"), "\"\\u0001\"");
        assert_eq!(json_num(f64::NAN), "null");
        assert_eq!(json_num(1.5), "1.500");
    }

    #[test]
    fn table_marks_targets() {
        let stats = Stats::of(&[1.0, 2.0, 3.0]).unwrap();
        let row = |limit: f64| Row {
            key: "echo_round_trip",
            name: "x".into(),
            stats,
            target: Some(Goal::median_at_most(&stats, limit, "≤ t".into())),
            note: None,
        };
        let report = Report {
            image: "img".into(),
            api_version: "1.41".into(),
            host: "unix:///var/run/docker.sock".into(),
            cpus: Some(2),
            server_version: None,
            rows: vec![row(2.0), row(1.5)],
            baselines_skipped: None,
        };
        let table = render_table(&report);
        assert!(table.starts_with("kodx bench sandbox — image img, Docker API 1.41, 2 CPUs\n"));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[2].ends_with("≤ t: ok"), "{table}");
        assert!(lines[3].ends_with("≤ t: MISSED"), "{table}");
        assert!(render_json(&report).contains("\"ok\":false"));
    }
}
