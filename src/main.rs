//! The `kodx` binary.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Parser, Subcommand};

mod bench;
mod doctor;
mod operator_link;
mod run;
mod run_egress;
mod run_steer;
mod secret_cmd;
mod serve_cmd;
mod usage_cmd;

#[derive(Parser)]
#[command(
    name = "kodx",
    version,
    about = "An LLM agent in real shells inside a hardened Docker container"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The GitHub App: webhook receiver, run queue, workers, /healthz and /metrics.
    Serve(serve_cmd::ServeArgs),
    /// One agent run on a local directory (options of the Python kodx).
    Run(Box<run::RunArgs>),
    /// Check Docker and the configuration; say what is wrong and how to fix it.
    Doctor(doctor::DoctorArgs),
    /// Measure the engine and print figures (median and p95).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Print links to the operator's list of runs, /healthz's details and /usage
    /// (they expire; --rotate ends every earlier one).
    OperatorLink(operator_link::OperatorLinkArgs),
    /// What finished runs cost: spend, runs, success rate and median per repository,
    /// person or command, and the monthly budget left (also at /usage).
    Usage(usage_cmd::UsageArgs),
    /// Secrets kodx keeps for a repository's runs: stored encrypted, values never printed.
    #[command(subcommand)]
    Secret(secret_cmd::SecretCommand),
}

fn init_tracing(default: &str) {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter = EnvFilter::try_from_env("KODX_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if std::env::var("KODX_LOG_FORMAT").is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // A server logs what it does; the CLI only what went wrong.
    init_tracing(if matches!(cli.command, Command::Serve(_)) {
        "info"
    } else {
        "warn"
    });
    if let Command::Serve(args) = cli.command {
        // serve handles its own signals: a shutdown lets runs finish.
        return match serve_cmd::run(args).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("kodx serve: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Ctrl-C (or SIGTERM) removes every container this process made, then exits 130.
    let interrupted = Arc::new(AtomicBool::new(false));
    let on_signal = tokio::spawn({
        let interrupted = interrupted.clone();
        async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            interrupted.store(true, Ordering::SeqCst);
            let n = kodx::sandbox::docker::remove_all_live().await;
            eprintln!("kodx: interrupted; removed {n} sandbox container(s)");
            std::process::exit(130);
        }
    });
    let result = match cli.command {
        Command::Run(args) => run::run(*args).await,
        Command::Doctor(args) => doctor::run(args).await,
        Command::Bench(cmd) => bench::run(cmd).await,
        Command::OperatorLink(args) => operator_link::run(args),
        Command::Usage(args) => usage_cmd::run(args).await,
        Command::Secret(cmd) => secret_cmd::run(cmd).await,
        Command::Serve(_) => unreachable!("handled above"),
    };
    if interrupted.load(Ordering::SeqCst) {
        // The work failed because its containers are being removed: let the handler
        // finish that and exit 130.
        let _ = on_signal.await;
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kodx: {e:#}");
            ExitCode::FAILURE
        }
    }
}
