//! The network helper: a tiny static program (`native/kodx-net.c`, built by build.rs and
//! embedded here), shipped to the engine in kodx's own image ([`super::image`]). Each
//! sandbox runs it from a read-only volume: it is the sandbox's main process (`hold`), the
//! shells started ahead (`gate`), the check runner (`checks`) and the snapshot. The engine's fencer runs it to plug and
//! fence sandboxes ([`exec_in`]); where there is no fencer, short-lived containers of
//! kodx's image run it, removed on every path.

use std::net::Ipv4Addr;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{AttachContainerOptions, CreateContainerOptions};
use bollard::Docker;
use futures_util::StreamExt;

use super::image::{
    helper_image, no_healthcheck, HELPER, HELPER_LABEL, IMAGE_HELPER_PATH, SANDBOX_HELPER_PATH,
};
use crate::docker::{creation_gate, register_live, remove, remove_blocking};
use crate::owner::run_labels;
use crate::{Result, SandboxError};

/// The longest a helper container may take, from its start to its exit.
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// The most output a helper's answer may have.
const HELPER_OUTPUT_CAP: usize = 256 * 1024;

/// What the helper printed: the addresses of the namespace it ran in.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Addresses {
    pub(super) v4: Vec<Ipv4Addr>,
    pub(super) v6: Vec<std::net::Ipv6Addr>,
}

pub(super) fn parse_addresses(out: &str) -> Result<Addresses> {
    let mut a = Addresses::default();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = || SandboxError::NetworkFence(format!("the network helper printed {line:?}"));
        match line.split_once(' ') {
            Some(("4", hex)) if hex.len() == 8 => {
                let v = u32::from_str_radix(hex, 16).map_err(|_| bad())?;
                a.v4.push(Ipv4Addr::from(v));
            }
            Some(("6", hex)) if hex.len() == 32 => {
                let v = u128::from_str_radix(hex, 16).map_err(|_| bad())?;
                a.v6.push(std::net::Ipv6Addr::from(v));
            }
            _ => return Err(bad()),
        }
    }
    a.v4.sort();
    a.v4.dedup();
    a.v6.sort();
    a.v6.dedup();
    Ok(a)
}

/// The architecture the helper was built for (`uname -m` spelling).
fn helper_arch() -> &'static str {
    std::env::consts::ARCH
}

/// Whether this kodx carries the helper (it is built for x86_64 and aarch64 Linux).
pub fn has_helper() -> bool {
    !HELPER.is_empty()
}

/// The command that keeps a sandbox alive: the helper's `hold`, so that nothing of the
/// image runs in the container until kodx runs it; a shell loop without the helper.
pub fn hold_command() -> Vec<String> {
    if HELPER.is_empty() {
        ["/bin/sh", "-c", "while :; do sleep 86400; done"]
            .map(String::from)
            .to_vec()
    } else {
        vec![SANDBOX_HELPER_PATH.to_string(), "hold".to_string()]
    }
}

/// The command of a shell started ahead of its use: the helper's `gate`, which waits for
/// the line that runs the shell; `None` when this kodx was built without the helper.
pub fn gate_command() -> Option<Vec<String>> {
    (!HELPER.is_empty()).then(|| vec![SANDBOX_HELPER_PATH.to_string(), "gate".to_string()])
}

/// The command of the check runner (the helper's `checks`, see
/// `crate::docker`'s `runner`); `None` without the helper.
pub fn checks_command() -> Option<Vec<String>> {
    (!HELPER.is_empty()).then(|| vec![SANDBOX_HELPER_PATH.to_string(), "checks".to_string()])
}

/// The command that writes `root` as a tar for the change set (the helper's `snapshot`),
/// files unchanged since `marker` as headers alone; `on_line`: once a line comes on its
/// stdin. `None` without the helper.
pub fn snapshot_command(marker: &str, root: &str, on_line: bool) -> Option<Vec<String>> {
    (!HELPER.is_empty()).then(|| {
        vec![
            SANDBOX_HELPER_PATH.to_string(),
            if on_line {
                "snapshot-on-line"
            } else {
                "snapshot"
            }
            .to_string(),
            marker.to_string(),
            root.to_string(),
        ]
    })
}

/// How an exec of the helper in the fencer ended.
#[derive(Debug)]
pub(super) enum FencerExec {
    /// It ran to its end: what it printed, or why it failed.
    Ran(Result<String>),
    /// Its end was never known: the fencer stopped or went away during it (removed, an
    /// engine restart), or the engine never closed its output. What the helper did (all,
    /// part or nothing of it) is unknown; the reason says which.
    Lost(String),
}

/// How often a running exec (and its fencer) is looked at, after the first look.
const EXEC_WATCH_EVERY: Duration = Duration::from_millis(500);
/// How long the output of an exec the engine says has exited may take to end.
const EXEC_OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// Runs the helper with `args` in the running container `id` (the fencer) as an engine
/// exec. The exec is watched while it runs: a fencer removed or stopped meanwhile ends the
/// wait at once ([`FencerExec::Lost`]) instead of leaving it to the engine, which may keep
/// the output of such an exec open until [`HELPER_TIMEOUT`].
pub(super) async fn exec_in(docker: &Docker, id: &str, args: &[String]) -> FencerExec {
    let mut cmd = vec![IMAGE_HELPER_PATH.to_string()];
    cmd.extend(args.iter().cloned());
    let run = async {
        let exec = match docker
            .create_exec(
                id,
                CreateExecOptions {
                    cmd: Some(cmd),
                    user: Some("0:0".to_string()),
                    working_dir: Some("/".to_string()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
        {
            Ok(exec) => exec,
            Err(e) => {
                return FencerExec::Ran(Err(SandboxError::docker("running the network helper", e)))
            }
        };
        let mut output = match docker.start_exec(&exec.id, None).await {
            Ok(StartExecResults::Attached { output, .. }) => output,
            Ok(StartExecResults::Detached) => {
                return FencerExec::Ran(Err(SandboxError::NetworkFence(
                    "the network helper started detached".into(),
                )))
            }
            Err(e) => {
                return lost_or(
                    docker,
                    id,
                    Err(SandboxError::docker("running the network helper", e)),
                )
                .await
            }
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let ended = {
            let collected = collect_into(&mut output, &mut stdout, &mut stderr);
            tokio::pin!(collected);
            tokio::select! {
                () = &mut collected => None,
                seen = watch_exec(docker, id, &exec.id) => match seen {
                    Watched::FencerGone(why) => Some(why),
                    Watched::Exited => tokio::time::timeout(EXEC_OUTPUT_GRACE, &mut collected)
                        .await
                        .err()
                        .map(|_| {
                            format!(
                                "the engine said the helper exited but kept its output open \
                                 for {}s more",
                                EXEC_OUTPUT_GRACE.as_secs()
                            )
                        }),
                },
            }
        };
        if let Some(why) = ended {
            return FencerExec::Lost(why);
        }
        let code = match docker.inspect_exec(&exec.id).await {
            Ok(inspected) => match (inspected.running, inspected.exit_code) {
                (Some(false), Some(code)) => code,
                _ => -1,
            },
            Err(e) => {
                return lost_or(
                    docker,
                    id,
                    Err(SandboxError::docker(
                        "reading the network helper's exit code",
                        e,
                    )),
                )
                .await
            }
        };
        // The helper never exits 126 or 127 itself: the engine could not run it (in a
        // fencer stopping: "cannot exec in a stopped state"), and said nothing on stderr.
        if matches!(code, 126 | 127) && stderr.is_empty() {
            return FencerExec::Lost(format!(
                "the engine could not run the helper in the fencer (exit code {code})"
            ));
        }
        lost_or(docker, id, verdict(code, &stdout, &stderr)).await
    };
    match tokio::time::timeout(HELPER_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => FencerExec::Ran(Err(SandboxError::NetworkFence(format!(
            "the network helper did not finish within {}s",
            HELPER_TIMEOUT.as_secs()
        )))),
    }
}

/// `result`, unless it is a failure and the fencer `id` no longer runs: then the exec was
/// lost with it.
async fn lost_or(docker: &Docker, id: &str, result: Result<String>) -> FencerExec {
    if result.is_err() {
        if let Some(why) = fencer_gone(docker, id).await {
            return FencerExec::Lost(why);
        }
    }
    FencerExec::Ran(result)
}

/// Why the fencer `id` no longer runs; `None` while it runs (or cannot be looked at).
async fn fencer_gone(docker: &Docker, id: &str) -> Option<String> {
    match docker.inspect_container(id, None).await {
        Ok(c) if c.state.as_ref().and_then(|s| s.running) == Some(true) => None,
        Ok(_) => Some("the fencer stopped during the exec".to_string()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Some("the fencer was removed during the exec".to_string()),
        Err(_) => None,
    }
}

/// What watching an exec found.
enum Watched {
    /// The engine says it exited.
    Exited,
    /// Its fencer no longer runs: why.
    FencerGone(String),
}

/// Looks at the exec `exec_id` and its fencer `id` every [`EXEC_WATCH_EVERY`] (most execs
/// end before the first look) until one of them says the exec is over.
async fn watch_exec(docker: &Docker, id: &str, exec_id: &str) -> Watched {
    loop {
        tokio::time::sleep(EXEC_WATCH_EVERY).await;
        if let Some(why) = fencer_gone(docker, id).await {
            return Watched::FencerGone(why);
        }
        match docker.inspect_exec(exec_id).await {
            Ok(e) if e.running == Some(false) && e.exit_code.is_some() => return Watched::Exited,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Watched::FencerGone("the engine forgot the exec".to_string()),
            _ => {}
        }
    }
}

/// Stdout and stderr of a helper, each bounded.
async fn collect(
    output: &mut (impl futures_util::Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>>
              + Unpin),
) -> (Vec<u8>, Vec<u8>) {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    collect_into(output, &mut stdout, &mut stderr).await;
    (stdout, stderr)
}

/// Reads a helper's output to its end into `stdout` and `stderr`, each bounded.
async fn collect_into(
    output: &mut (impl futures_util::Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>>
              + Unpin),
    stdout: &mut Vec<u8>,
    stderr: &mut Vec<u8>,
) {
    while let Some(item) = output.next().await {
        match item {
            Ok(LogOutput::StdOut { message }) if stdout.len() < HELPER_OUTPUT_CAP => {
                stdout.extend_from_slice(&message)
            }
            Ok(LogOutput::StdErr { message }) if stderr.len() < HELPER_OUTPUT_CAP => {
                stderr.extend_from_slice(&message)
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
}

/// What a helper that exited with `code` says: its output, or why it failed.
fn verdict(code: i64, stdout: &[u8], stderr: &[u8]) -> Result<String> {
    if code != 0 {
        let said = String::from_utf8_lossy(stderr);
        let said = said.trim();
        return Err(SandboxError::NetworkFence(format!(
            "the network helper failed (exit code {code}){}",
            if said.is_empty() {
                String::new()
            } else {
                format!(": {}", said.chars().take(500).collect::<String>())
            }
        )));
    }
    Ok(String::from_utf8_lossy(stdout).into_owned())
}

/// Checks that the embedded helper can run on an engine reporting `engine_arch`.
pub fn check_arch(engine_arch: &str) -> Result<()> {
    let normal = match engine_arch {
        "amd64" | "x86_64" => "x86_64",
        "arm64" | "aarch64" => "aarch64",
        other => other,
    };
    if HELPER.is_empty() {
        return Err(SandboxError::NetworkFence(format!(
            "this kodx was built for {} without the sandbox network helper, so it cannot fence \
             a sandbox's network; use network = \"off\" (kodx run: --network off), or a kodx \
             built for x86_64 or aarch64 Linux",
            helper_arch()
        )));
    }
    if normal != helper_arch() {
        return Err(SandboxError::NetworkFence(format!(
            "the Docker engine runs on {engine_arch}, but this kodx carries its sandbox network \
             helper for {}; run a kodx built for {normal}, or use network = \"off\" \
             (kodx run: --network off)",
            helper_arch()
        )));
    }
    Ok(())
}

/// Runs the helper with `args` in a container of kodx's image, on `network_mode`, with only
/// the capabilities `caps`; returns what it printed. The container is removed on every
/// path.
pub(super) async fn run_helper(
    docker: &Docker,
    run_id: &str,
    network_mode: &str,
    caps: &[&str],
    args: &[String],
) -> Result<String> {
    Helper::create(docker, run_id, network_mode, caps, args)
        .await?
        .run()
        .await
}

/// A helper container of kodx's image, not started yet. Removed when run, or when dropped.
pub(super) struct Helper {
    guard: HelperGuard,
}

impl Helper {
    pub(super) async fn create(
        docker: &Docker,
        run_id: &str,
        network_mode: &str,
        caps: &[&str],
        args: &[String],
    ) -> Result<Helper> {
        let image = helper_image(docker).await?;
        let mut labels = run_labels(run_id, None);
        labels.insert(HELPER_LABEL.to_string(), "net".to_string());
        let body = ContainerCreateBody {
            image: Some(image),
            entrypoint: Some(vec![IMAGE_HELPER_PATH.to_string()]),
            cmd: Some(args.to_vec()),
            user: Some("0:0".to_string()),
            working_dir: Some("/".to_string()),
            labels: Some(labels),
            tty: Some(false),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            network_disabled: Some(false),
            healthcheck: Some(no_healthcheck()),
            host_config: Some(HostConfig {
                network_mode: Some(network_mode.to_string()),
                // An engine remapping user namespaces allows the host's network only with
                // the host's user namespace.
                userns_mode: (network_mode == "host").then(|| "host".to_string()),
                privileged: Some(false),
                cap_drop: Some(vec!["ALL".to_string()]),
                cap_add: Some(caps.iter().map(|c| c.to_string()).collect()),
                security_opt: Some(vec!["no-new-privileges:true".to_string()]),
                memory: Some(64 << 20),
                pids_limit: Some(16),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Held until registered, as for sandboxes: an interrupt's cleanup cannot miss it.
        let creating = creation_gate().read().await;
        let created = docker
            .create_container(None::<CreateContainerOptions>, body)
            .await
            .map_err(|e| SandboxError::docker("creating the network helper container", e))?;
        register_live(docker, &created.id);
        drop(creating);
        Ok(Helper {
            guard: HelperGuard::new(docker, created.id),
        })
    }

    pub(super) async fn run(self) -> Result<String> {
        let Helper { guard } = self;
        let docker = &guard.docker;
        let run = async {
            let mut attached = docker
                .attach_container(
                    &guard.id,
                    Some(AttachContainerOptions {
                        stdout: true,
                        stderr: true,
                        stream: true,
                        ..Default::default()
                    }),
                )
                .await
                .map_err(|e| SandboxError::docker("attaching to the network helper", e))?;
            docker
                .start_container(&guard.id, None)
                .await
                .map_err(|e| SandboxError::docker("starting the network helper", e))?;
            let (stdout, stderr) = collect(&mut attached.output).await;
            let code = match docker.wait_container(&guard.id, None).next().await {
                Some(Ok(r)) => r.status_code,
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
                Some(Err(e)) => {
                    return Err(SandboxError::docker("waiting for the network helper", e))
                }
                None => -1,
            };
            verdict(code, &stdout, &stderr)
        };
        let result = match tokio::time::timeout(HELPER_TIMEOUT, run).await {
            Ok(r) => r,
            Err(_) => Err(SandboxError::NetworkFence(format!(
                "the network helper did not finish within {}s",
                HELPER_TIMEOUT.as_secs()
            ))),
        };
        guard.remove().await;
        result
    }
}

/// Removes a helper container when dropped (a cancelled run), or at once with `remove`.
pub(super) struct HelperGuard {
    docker: Docker,
    id: String,
    done: bool,
}

impl HelperGuard {
    pub(super) fn new(docker: &Docker, id: String) -> HelperGuard {
        HelperGuard {
            docker: docker.clone(),
            id,
            done: false,
        }
    }

    pub(super) async fn remove(mut self) {
        self.done = true;
        let _ = remove(&self.docker, &self.id).await;
    }
}

impl Drop for HelperGuard {
    fn drop(&mut self) {
        if !self.done {
            remove_blocking(&self.docker, &self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_output_parses() {
        let a = parse_addresses(
            "4 7f000001\n4 c0000202\n4 c0000202\n6 00000000000000000000000000000001\n6 fe80000000000000000000fffe000001\n",
        )
        .unwrap();
        assert_eq!(
            a.v4,
            vec![
                "127.0.0.1".parse::<Ipv4Addr>().unwrap(),
                "192.0.2.2".parse().unwrap()
            ]
        );
        assert_eq!(a.v6.len(), 2);
        assert!(parse_addresses("4 zz\n").is_err());
        assert!(parse_addresses("hello\n").is_err());
    }

    #[test]
    fn the_helper_is_embedded_for_this_architecture() {
        assert!(HELPER.starts_with(b"\x7fELF"), "build.rs built the helper");
        assert!(check_arch(std::env::consts::ARCH).is_ok());
        let other = if std::env::consts::ARCH == "x86_64" {
            "aarch64"
        } else {
            "x86_64"
        };
        let e = check_arch(other).unwrap_err().to_string();
        assert!(e.contains(other) && e.contains("network = \"off\""), "{e}");
    }
}
