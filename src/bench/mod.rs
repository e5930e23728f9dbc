//! `kodx bench`: figures for the engine (written by the benchmark change).
//!
//! `kodx bench sandbox` measures, on one image and in one run: the cold start of a sandbox,
//! the `feed_chars` round trip, a new named shell, the copy-in of a repository and the
//! change-set export, next to two plain docker CLI baselines (`docker run`, `docker exec`).
//! It prints n, median, p95, min and max of each, and whether the targets were met. A missed
//! target is a figure, not a failure: the exit code is non-zero only when something broke.

use std::process::ExitCode;

use anyhow::Context;
use kodx::sandbox::Engine;

mod baseline;
mod measure;
mod report;
mod stats;

use baseline::{docker_cli_probe, docker_exec_baseline, docker_run_once};
pub use measure::SandboxArgs;
use measure::{cold_start_once, export_measurements, progress, shell_measurements};
use report::{render_json, render_table, rows_of, Figures, Report};

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// The sandbox engine: cold start, echo round trip, new shell, change-set export.
    Sandbox(SandboxArgs),
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Sandbox(args) => bench_sandbox(args).await,
    }
}

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
    let figures = measure_all(&engine, &args, &session, cli.is_none()).await?;
    let report = Report {
        image: args.image.clone(),
        api_version: engine.api_version().to_string(),
        host: engine.host().to_string(),
        cpus: info.ncpu,
        server_version: info.server_version,
        rows: rows_of(&figures, args.files)?,
        baselines_skipped: cli,
    };
    if args.json {
        println!("{}", render_json(&report));
    } else {
        print!("{}", render_table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// `reps` cold starts, one untimed warm-up first; with `docker_run`, each followed by a
/// `docker run --rm IMAGE true` (the baseline), so that both see the engine in the same
/// state.
async fn cold_starts(
    engine: &Engine,
    image: &str,
    session: &str,
    reps: u32,
    docker_run: bool,
) -> anyhow::Result<(Vec<f64>, Option<Vec<f64>>)> {
    let mut samples = Vec::with_capacity(reps as usize);
    let mut baseline = Vec::with_capacity(reps as usize);
    for i in 0..=reps {
        if i == 0 {
            progress(&format!(
                "cold start{}: warm-up",
                if docker_run {
                    ", a docker run --rm IMAGE true after each"
                } else {
                    ""
                }
            ));
        } else if i == 1 || i % 5 == 0 || i == reps {
            progress(&format!("cold start: {i}/{reps}"));
        }
        let took = cold_start_once(engine, image, session, i).await?;
        let bare = match docker_run {
            true => Some(
                docker_run_once(image)
                    .await
                    .context("the `docker run` baseline")?,
            ),
            false => None,
        };
        if i > 0 {
            samples.push(took);
            baseline.extend(bare);
        }
    }
    Ok((samples, docker_run.then_some(baseline)))
}

/// Takes every measurement, in order; the docker CLI baselines only when `baselines`.
async fn measure_all(
    engine: &Engine,
    args: &SandboxArgs,
    session: &str,
    baselines: bool,
) -> anyhow::Result<Figures> {
    // 1. Cold start, interleaved with its `docker run` baseline.
    let (cold, docker_run) = cold_starts(engine, &args.image, session, args.reps, baselines)
        .await
        .context("the cold start measurement")?;

    // 2. and 3. One sandbox for the echo round trip and the new shells.
    let (echo, shells) = shell_measurements(engine, args, session)
        .await
        .context("the shell measurements")?;

    // 4. Copy-in and change-set export of a generated repository.
    let export = export_measurements(engine, args, session)
        .await
        .context("the change-set measurements")?;

    // 5. The `docker exec` baseline.
    let exec_reps = (args.echo_reps / 4).max(20);
    let docker_exec = match baselines {
        true => Some(
            docker_exec_baseline(&args.image, session, exec_reps)
                .await
                .context("the `docker exec` baseline")?,
        ),
        false => None,
    };
    Ok(Figures {
        docker_run,
        cold,
        echo,
        shells,
        export,
        docker_exec,
    })
}
