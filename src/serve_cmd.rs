//! `kodx serve`: reads the configuration, binds, and runs until SIGTERM / Ctrl-C.

use std::process::ExitCode;

use anyhow::Context;
use kodx::serve::config::{ServeConfig, Startup};
use kodx::serve::{serve_startup, ServeOptions};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// What this process does: `all` (receive webhooks and run the work), `intake` (only
    /// receive and queue webhooks; workers elsewhere run them) or `worker` (only run
    /// queued work; webhooks go to an intake process). Several processes need a shared
    /// PostgreSQL DATABASE_URL.
    #[arg(long, value_enum, default_value_t = Role::All)]
    role: Role,
    /// Same as `--role intake` (only receive and queue webhooks; for measuring the webhook
    /// path, or with workers elsewhere).
    #[arg(long, conflicts_with = "role")]
    no_workers: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    All,
    Intake,
    Worker,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // The handlers are in place before the server binds or answers anything: a SIGTERM that
    // comes right after start (a supervisor, a test) stops it cleanly instead of killing it.
    let shutdown = CancellationToken::new();
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
        )
    };
    let startup = ServeConfig::startup_from_env()?;
    let listen = match &startup {
        Startup::Ready(c) => c.listen,
        Startup::Setup(s) => s.listen,
    };
    let listener = kodx::serve::intake::listen::bind(listen).with_context(|| {
        format!(
            "cannot listen on {} (HOST/PORT): is another server using the port?",
            listen
        )
    })?;
    if let Ok(addr) = listener.local_addr() {
        eprintln!("kodx serve: listening on http://{addr}");
    }
    // The first SIGTERM / Ctrl-C stops accepting webhooks and lets runs finish (within
    // `shutdown_grace_secs`); a second one removes the containers and exits at once.
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            for n in 0.. {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                if n == 0 {
                    eprintln!("kodx: shutting down (again to stop at once)");
                    shutdown.cancel();
                } else {
                    let n = kodx::sandbox::docker::remove_all_live().await;
                    eprintln!("kodx: stopped; removed {n} sandbox container(s)");
                    std::process::exit(130);
                }
            }
        }
    });
    let role = if args.no_workers {
        Role::Intake
    } else {
        args.role
    };
    let options = ServeOptions {
        workers: role != Role::Intake,
        intake: role != Role::Worker,
        ..ServeOptions::default()
    };
    serve_startup(startup, listener, shutdown, options).await?;
    Ok(ExitCode::SUCCESS)
}
