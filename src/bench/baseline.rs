//! The plain docker CLI baselines the sandbox figures are judged against: `docker run`
//! and `docker exec`.

use std::process::Stdio;
use std::time::Instant;

use anyhow::{ensure, Context};

use super::measure::progress;
use super::stats::ms;

/// Checks that the docker CLI exists and reaches an engine; the error says why not.
pub(super) async fn docker_cli_probe() -> Result<(), String> {
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
pub(super) async fn docker_run_once(image: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    docker(&["run", "--rm", image, "true"]).await?;
    Ok(ms(t.elapsed()))
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
pub(super) async fn docker_exec_baseline(
    image: &str,
    session: &str,
    reps: u32,
) -> anyhow::Result<Vec<f64>> {
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
