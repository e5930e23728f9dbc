//! The measurements of the sandbox engine: cold start, the `feed_chars` round trip, new
//! shells, and the copy-in and change-set export of a generated repository.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use kodx::sandbox::{ChangeKind, DockerSandbox, Engine, Sandbox, SandboxSpec, ShellStatus};

use super::stats::ms;

/// The image used when neither `--image` nor `KODX_BENCH_IMAGE` names one.
const DEFAULT_IMAGE: &str = "kodx-test:bookworm";
/// How long one `feed_chars` of the benchmark may take before it counts as broken.
const FEED_YIELD: Duration = Duration::from_secs(20);
/// Names `create_new_shell` cycles through (a sandbox keeps at most 16 shells; re-creating
/// a name replaces that shell).
pub(super) const SHELL_NAMES: usize = 8;
/// The pause before each `create_new_shell` measured at a model's pace: shorter than any
/// model's answer between two tool calls, and long enough for the sandbox's spare shell
/// (started ahead after each use) to be ready.
pub(super) const SHELL_GAP: Duration = Duration::from_millis(600);
/// Subdirectories the generated repository spreads its files over.
const TREE_DIRS: usize = 100;

#[derive(clap::Args, Debug, Clone)]
pub struct SandboxArgs {
    /// The image every measurement uses.
    #[arg(long, env = "KODX_BENCH_IMAGE", default_value = DEFAULT_IMAGE)]
    pub(super) image: String,
    /// Samples of the cold start and of the `docker run` baseline.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) reps: u32,
    /// Samples of the `feed_chars("echo hi")` round trip (the `docker exec` baseline takes
    /// a quarter of it, at least 20).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) echo_reps: u32,
    /// Samples of `create_new_shell` at a model's pace (calls [`SHELL_GAP`] apart), and as
    /// many back to back.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) shell_reps: u32,
    /// Files in the generated repository of the copy-in and change-set measurements.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(3..))]
    pub(super) files: u32,
    /// Samples of the copy-in and of the change-set export (one fresh sandbox each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) export_reps: u32,
    /// Print the results as one JSON object instead of the table.
    #[arg(long)]
    pub(super) json: bool,
}

pub(super) fn progress(line: &str) {
    eprintln!("bench: {line}");
}

/// Destroys `sandbox` whatever `result` is; the measurement's error comes first, then the
/// removal's.
pub(super) async fn finish<T>(
    sandbox: DockerSandbox,
    result: anyhow::Result<T>,
) -> anyhow::Result<T> {
    let id = sandbox.container_id().to_string();
    let removed = sandbox.destroy().await;
    let value = result?;
    removed.with_context(|| format!("removing the sandbox container {id}"))?;
    Ok(value)
}

/// One cold start (a sandbox without a repository, destroyed after), timed up to the
/// start.
pub(super) async fn cold_start_once(
    engine: &Engine,
    image: &str,
    session: &str,
    i: u32,
) -> anyhow::Result<f64> {
    let spec = SandboxSpec::new(format!("bench-{session}-cold-{i}"), image);
    let t = Instant::now();
    let sandbox = engine
        .start(&spec)
        .await
        .with_context(|| format!("starting sandbox {}", spec.run_id))?;
    let took = ms(t.elapsed());
    finish(sandbox, Ok(())).await?;
    Ok(took)
}

/// The echo round trip and the new-shell figures, from one sandbox.
pub(super) async fn shell_measurements(
    engine: &Engine,
    args: &SandboxArgs,
    session: &str,
) -> anyhow::Result<(Vec<f64>, NewShells)> {
    let spec = SandboxSpec::new(format!("bench-{session}-shell"), &args.image);
    let sandbox = engine
        .start(&spec)
        .await
        .with_context(|| format!("starting sandbox {}", spec.run_id))?;
    let result: anyhow::Result<(Vec<f64>, NewShells)> = async {
        let echo = echo_round_trips(&sandbox, args.echo_reps).await?;
        let paced = new_shells(&sandbox, args.shell_reps, SHELL_GAP, true).await?;
        let back_to_back = new_shells(&sandbox, args.shell_reps, Duration::ZERO, false).await?;
        Ok((
            echo,
            NewShells {
                paced,
                back_to_back,
            },
        ))
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

/// `create_new_shell` samples: at a model's pace, and back to back (the spare shell started
/// after a call is still on its way at the next).
pub(super) struct NewShells {
    pub(super) paced: Vec<f64>,
    pub(super) back_to_back: Vec<f64>,
}

/// `fresh`: the names are not in use yet (the first pass).
async fn new_shells(
    sandbox: &DockerSandbox,
    reps: u32,
    gap: Duration,
    fresh: bool,
) -> anyhow::Result<Vec<f64>> {
    progress(&format!(
        "create_new_shell: {reps} shells over the names b0..b{}, {} ms apart",
        SHELL_NAMES - 1,
        gap.as_millis()
    ));
    let mut samples = Vec::with_capacity(reps as usize);
    let mut last = String::new();
    for i in 0..reps as usize {
        let name = format!("b{}", i % SHELL_NAMES);
        tokio::time::sleep(gap).await;
        let t = Instant::now();
        let said = sandbox
            .create_new_shell(&name)
            .await
            .with_context(|| format!("create_new_shell({name:?}) #{}", i + 1))?;
        samples.push(ms(t.elapsed()));
        // The first SHELL_NAMES calls start shells, the later ones replace them.
        let want = if fresh && i < SHELL_NAMES {
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
pub(super) struct ExportFigures {
    /// The whole `engine.start` with the repository.
    pub(super) copy_in: Vec<f64>,
    /// Its phase from packing-and-uploading the tar to the shell start.
    pub(super) upload: Vec<f64>,
    /// `change_set()`.
    pub(super) export: Vec<f64>,
}

/// `export_reps` × (start with the generated repository — the copy-in sample —, change 3
/// files in the shell, `change_set()` — the export sample —, destroy).
pub(super) async fn export_measurements(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
