//! A command run to its end as its own process in the container: the repository's checks.
//!
//! Not typed into a shell: a shell's prompt (and the exit status in it) is text the
//! container prints, so anything running there can print a fake one. Here the exit code
//! is the engine's (`inspect_exec`), which nothing inside the container can forge, and the
//! output is only ever output.
//!
//! An attempt's checks go to the sandbox's check runner as one batch when it has one
//! ([`super::runner`], whose reports are as unforgeable); else, or once it is lost, each
//! is an engine exec of its own, as here.

use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::StreamExt as _;

use super::runner::{bounded, Outcome, CHECK_ENV};
use super::sandbox::DockerSandbox;
use crate::term;
use crate::{run_one_by_one, Finished, Ran, Reports, Result, SandboxError};

/// The wrapper: its pid on stderr (before anything of the command runs, so the command
/// cannot write there: its stderr is stdout), then the command under bash with no stdin.
/// Each engine exec leads its own session and process group, so the pid is the group the
/// command's processes are in, killed whole on a timeout.
const WRAPPER: &str = "echo \"$$\" >&2; exec bash -c \"$1\" </dev/null 2>&1";

impl DockerSandbox {
    pub(super) async fn exec_to_end(
        &self,
        command: &str,
        timeout: Duration,
        cap: usize,
    ) -> Result<Finished> {
        let what = "running a check";
        let exec = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh", "-c", WRAPPER, "kodx-check", command]),
                    env: Some(CHECK_ENV.to_vec()),
                    working_dir: Some(self.workdir.as_str()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| SandboxError::docker(what, e))?;
        let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| SandboxError::docker(what, e))?
        else {
            return Err(SandboxError::InvalidInput(
                "the check started detached".into(),
            ));
        };
        // Cleaned and bounded as it comes (a check may print without end): a head and a
        // tail of `cap` bytes in all.
        let mut printed = term::Decoder::new("", cap / 2);
        let mut pid = String::new();
        let collect = async {
            while let Some(Ok(item)) = output.next().await {
                match item {
                    bollard::container::LogOutput::StdOut { message } => printed.feed(&message),
                    // Only the wrapper writes here: a pid and a newline.
                    bollard::container::LogOutput::StdErr { message } if pid.len() < 16 => {
                        pid.push_str(&String::from_utf8_lossy(&message));
                    }
                    _ => {}
                }
            }
        };
        let finished = tokio::time::timeout(timeout, collect).await.is_ok();
        if !finished {
            if let Ok(pid) = pid.trim().parse::<u32>() {
                self.kill_groups(&[pid]).await;
            }
        }
        let (text, omitted_bytes) = bounded(printed, cap);
        let exit_code = if finished {
            let inspected = self
                .docker
                .inspect_exec(&exec.id)
                .await
                .map_err(|e| SandboxError::docker("reading a check's exit code", e))?;
            // Ended, by the engine's word; a stream that ended while the process runs
            // (the engine dropped it) has no exit code: not a pass.
            inspected
                .running
                .is_some_and(|r| !r)
                .then_some(inspected.exit_code)
                .flatten()
        } else {
            None
        };
        Ok(Finished {
            output: text,
            omitted_bytes,
            exit_code,
            timed_out: !finished,
        })
    }

    /// Kills each process group in `pids` and its leader (a timed-out check and what it
    /// started, a lost check runner).
    pub(super) async fn kill_groups(&self, pids: &[u32]) {
        // `-KILL -PID` (no `--`): the form dash, bash and busybox all take for a group.
        let kill: String = pids
            .iter()
            .map(|pid| format!("kill -KILL -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; "))
            .chain(["true".to_string()])
            .collect();
        let Ok(exec) = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh", "-c", kill.as_str()]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
        else {
            return;
        };
        if let Ok(StartExecResults::Attached { mut output, .. }) =
            self.docker.start_exec(&exec.id, None).await
        {
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                while let Some(Ok(_)) = output.next().await {}
            })
            .await;
        }
    }

    /// [`Sandbox::run_all`](crate::Sandbox::run_all): through the runner when the
    /// sandbox has one; else (or when it does not take the batch) one engine exec each.
    pub(super) async fn run_batch(
        &self,
        commands: &[(String, Duration)],
        within: Duration,
        cap: usize,
        reports: Reports,
    ) -> Result<()> {
        let started = Instant::now();
        let mut slot = self.runner.lock().await;
        if let Some(runner) = slot.as_mut() {
            let outcome = runner
                .run(&self.workdir, commands, within, cap, &reports)
                .await;
            let pid = runner.pid;
            match outcome {
                Outcome::Done => return Ok(()),
                Outcome::Refused(why) => {
                    tracing::warn!(
                        "the check runner {why}: it is dropped, and each check runs as an \
                         engine exec of its own"
                    );
                    *slot = None;
                    self.kill_groups(&[pid]).await;
                }
                Outcome::Lost {
                    reported,
                    running,
                    why,
                } => {
                    tracing::warn!(
                        "the check runner {why} during the checks: the rest do not pass, and \
                         later checks run as engine execs of their own"
                    );
                    *slot = None;
                    let mut pids = vec![pid];
                    pids.extend(running);
                    self.kill_groups(&pids).await;
                    for _ in reported..commands.len() {
                        let _ = reports.send(Ran::Failed(SandboxError::InvalidInput(format!(
                            "kodx's check runner {why} before this check"
                        ))));
                    }
                    return Ok(());
                }
            }
        }
        let within = within.saturating_sub(started.elapsed());
        run_one_by_one(self, commands, within, cap, &reports).await;
        Ok(())
    }
}
