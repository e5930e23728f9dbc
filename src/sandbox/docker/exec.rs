//! A command run to its end as its own process in the container: the repository's checks.
//!
//! Not typed into a shell: a shell's prompt (and the exit status in it) is text the
//! container prints, so anything running there can print a fake one. Here the exit code
//! is the engine's (`inspect_exec`), which nothing inside the container can forge, and the
//! output is only ever output.

use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::StreamExt as _;

use super::sandbox::DockerSandbox;
use crate::sandbox::term;
use crate::sandbox::{Finished, Result, SandboxError};

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
                    env: Some(vec![
                        "TERM=dumb",
                        "PAGER=cat",
                        "GIT_PAGER=cat",
                        "DEBIAN_FRONTEND=noninteractive",
                    ]),
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
                self.kill_group(pid).await;
            }
        }
        let (pending, _) = printed.take();
        let (text, omitted_bytes) =
            term::cap_middle(&pending.text, pending.omitted, pending.cut_at, cap);
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
            omitted_bytes: omitted_bytes as u64,
            exit_code,
            timed_out: !finished,
        })
    }

    /// Kills process group `pid` (a timed-out check and what it started).
    async fn kill_group(&self, pid: u32) {
        // `-KILL -PID` (no `--`): the form dash, bash and busybox all take for a group.
        let kill = format!("kill -KILL -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; true");
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
}
