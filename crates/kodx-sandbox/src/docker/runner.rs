//! kodx's check runner in a sandbox: the helper's `checks` mode (`native/kodx-checks.c`),
//! one engine exec started while the sandbox is prepared, that runs every attempt's checks
//! ([`Sandbox::run_all`](crate::Sandbox::run_all)) and reports each one's output
//! and end as frames ([`super::frames`]) on its stdout.
//!
//! Why its word is as good as the engine's: only the runner writes to that stdout. A check
//! is its child with `/dev/null` and a pipe of its own as stdin, stdout and stderr and no
//! other descriptor of the runner; the runner makes itself non-dumpable before anything
//! else, so no process of the sandbox (none has `CAP_SYS_PTRACE`) may open its
//! `/proc/PID/fd/*`, its memory or its environment, nor trace it; and it is started, and
//! says hello, before the setup script or any shell runs ([`Runner::start`] is joined
//! before them), so no process of the repository's was there to open them before. A
//! runner that dies, stops answering or writes anything but well-ordered frames is dropped:
//! the checks it had not reported do not pass, and later attempts run one engine exec per
//! check (whose exit codes are the engine's), never a runner started once the repository's
//! code may be running.

use std::pin::Pin;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures_util::{Stream, StreamExt as _};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};

use super::frames::{self, Ending, Frame, Reader};
use crate::{net, term, Finished, Ran, Reports, Result, SandboxError};

/// How long the runner may take to say hello once its exec started.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the runner may take to begin a check (or pass over it) once it may: at once,
/// unless something stopped it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Past a check's timeout, how long kodx waits for the runner's word on it: the runner
/// kills it at its timeout, then ends what it left (up to 5 s) and reads what is left in
/// its pipe (up to 2 s).
const END_GRACE: Duration = Duration::from_secs(10);

/// The environment a check runs with (besides the container's).
pub(super) const CHECK_ENV: [&str; 4] = [
    "TERM=dumb",
    "PAGER=cat",
    "GIT_PAGER=cat",
    "DEBIAN_FRONTEND=noninteractive",
];

/// What `printed` decoded, its middle cut past `cap` bytes, and the bytes cut.
pub(super) fn bounded(mut printed: term::Decoder, cap: usize) -> (String, u64) {
    let (pending, _) = printed.take();
    let (text, omitted) = term::cap_middle(&pending.text, pending.omitted, pending.cut_at, cap);
    (text, omitted as u64)
}

type Output =
    Pin<Box<dyn Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>>;

/// A started runner, waiting for a batch.
pub(super) struct Runner {
    /// Its pid in the container.
    pub(super) pid: u32,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: Output,
    frames: Reader,
    /// What it wrote on stderr (its last words, when it fails), bounded.
    said: String,
}

/// How a batch went.
pub(super) enum Outcome {
    /// Every command was reported; the runner waits for the next batch.
    Done,
    /// The runner did not take the batch (gone, stopped, past its limits): nothing of it ran.
    Refused(String),
    /// The runner was lost after `reported` reports (the check it was running among them,
    /// whose pid is `running`: it may still run).
    Lost {
        reported: usize,
        running: Option<u32>,
        why: String,
    },
}

/// The check being run: its pid (its process group), its output so far, when the runner
/// must have ended it.
struct Running {
    pid: u32,
    printed: term::Decoder,
    deadline: Instant,
}

impl Running {
    fn done(self, exit_code: Option<i64>, timed_out: bool, cap: usize) -> Ran {
        let (output, omitted_bytes) = bounded(self.printed, cap);
        Ran::Done(Finished {
            output,
            omitted_bytes,
            exit_code,
            timed_out,
        })
    }

    /// The runner was lost while this check ran: no exit code, not a pass.
    fn lost(self, why: &str, cap: usize) -> Ran {
        let (mut output, omitted_bytes) = bounded(self.printed, cap);
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&format!("[kodx lost this check: its runner {why}]"));
        Ran::Done(Finished {
            output,
            omitted_bytes,
            exit_code: None,
            timed_out: false,
        })
    }
}

impl Runner {
    /// Starts the runner in `container` and waits for its hello (it is non-dumpable by
    /// then). `None` when this kodx has no helper. Call it before anything of the
    /// repository runs in the container.
    pub(super) async fn start(docker: &Docker, container: &str) -> Option<Result<Runner>> {
        let command = net::checks_command()?;
        Some(Self::start_with(docker, container, command).await)
    }

    async fn start_with(docker: &Docker, container: &str, command: Vec<String>) -> Result<Runner> {
        let what = "starting the check runner";
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(command),
                    env: Some(CHECK_ENV.iter().map(|v| v.to_string()).collect()),
                    // The checks' directory comes with each batch: it may not be there yet.
                    working_dir: Some("/".to_string()),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| SandboxError::docker(what, e))?;
        let StartExecResults::Attached { output, input } = docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| SandboxError::docker(what, e))?
        else {
            return Err(SandboxError::InvalidInput(
                "the check runner started detached".into(),
            ));
        };
        let mut runner = Runner {
            pid: 0,
            input,
            output,
            frames: Reader::default(),
            said: String::new(),
        };
        let hello = tokio::time::timeout(HELLO_TIMEOUT, runner.next_frame()).await;
        match hello {
            Ok(Ok(Frame::Hello { pid, version })) if version == frames::VERSION => {
                runner.pid = pid;
                Ok(runner)
            }
            Ok(Ok(frame)) => Err(SandboxError::InvalidInput(format!(
                "the check runner said {frame:?} first"
            ))),
            Ok(Err(why)) => Err(SandboxError::InvalidInput(format!(
                "the check runner {why}"
            ))),
            Err(_) => Err(SandboxError::InvalidInput(
                "the check runner did not answer".into(),
            )),
        }
    }

    /// The next frame; `Err` (why, as words after "the runner") when the stream ended,
    /// failed or held no frame.
    async fn next_frame(&mut self) -> std::result::Result<Frame, String> {
        loop {
            if let Some(frame) = self.frames.next().map_err(|e| format!("wrote {e}"))? {
                return Ok(frame);
            }
            match self.output.next().await {
                Some(Ok(LogOutput::StdOut { message })) => self.frames.push(&message),
                Some(Ok(LogOutput::StdErr { message })) if self.said.len() < 1024 => {
                    self.said.push_str(&String::from_utf8_lossy(&message));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("could not be read ({e})")),
                None => {
                    return Err(match self.said.trim() {
                        "" => "ended".to_string(),
                        said => format!("ended ({said})"),
                    })
                }
            }
        }
    }

    /// Runs `commands` in `dir` as one batch, reporting each as it ends.
    pub(super) async fn run(
        &mut self,
        dir: &str,
        commands: &[(String, Duration)],
        within: Duration,
        cap: usize,
        reports: &Reports,
    ) -> Outcome {
        let Some(batch) = frames::batch(dir, commands, within) else {
            return Outcome::Refused("the checks are past the runner's limits".into());
        };
        let end = Instant::now() + within;
        let written = async {
            self.input.write_all(&batch).await?;
            self.input.flush().await
        };
        if let Err(e) = written.await {
            return Outcome::Refused(format!("could not be written to ({e})"));
        }
        let mut reported = 0;
        let mut running: Option<Running> = None;
        loop {
            let wait = match &running {
                Some(r) => r.deadline.saturating_duration_since(Instant::now()) + END_GRACE,
                None => ANSWER_TIMEOUT,
            };
            let frame = match tokio::time::timeout(wait, self.next_frame()).await {
                Ok(Ok(frame)) => frame,
                Ok(Err(why)) => return lose(reports, reported, running, why, cap),
                Err(_) => return lose(reports, reported, running, "stopped answering".into(), cap),
            };
            let current = reported < commands.len() && frame.index() == Some(reported);
            match (frame, running.as_mut()) {
                (Frame::Began { pid, .. }, None) if current => {
                    let left = end.saturating_duration_since(Instant::now());
                    running = Some(Running {
                        pid,
                        printed: term::Decoder::new("", cap / 2),
                        deadline: Instant::now() + commands[reported].1.min(left),
                    });
                }
                (Frame::Output { bytes, .. }, Some(r)) if current => r.printed.feed(&bytes),
                (Frame::Ended { how, .. }, _) if current => {
                    let ran = match (how, running.take()) {
                        (Ending::NotStarted, None) => Ran::NotStarted,
                        (Ending::CouldNotStart(errno), None) => {
                            Ran::Failed(SandboxError::InvalidInput(format!(
                                "kodx's check runner could not start it (errno {errno})"
                            )))
                        }
                        (Ending::Exited(code), Some(r)) => r.done(Some(code.into()), false, cap),
                        // As the engine reports a process a signal killed.
                        (Ending::Signaled(sig), Some(r)) => {
                            r.done(Some(128 + i64::from(sig)), false, cap)
                        }
                        (Ending::TimedOut, Some(r)) => r.done(None, true, cap),
                        (how, r) => {
                            let why = format!("reported {how:?} out of turn");
                            return lose(reports, reported, r, why, cap);
                        }
                    };
                    let _ = reports.send(ran);
                    reported += 1;
                }
                (Frame::Over { count }, None)
                    if usize::from(count) == commands.len() && reported == commands.len() =>
                {
                    return Outcome::Done
                }
                (frame, _) => {
                    let why = format!("sent {frame:?} out of turn");
                    return lose(reports, reported, running, why, cap);
                }
            }
        }
    }
}

impl Frame {
    /// The check a frame is about.
    fn index(&self) -> Option<usize> {
        match self {
            Frame::Began { index, .. }
            | Frame::Output { index, .. }
            | Frame::Ended { index, .. } => Some(usize::from(*index)),
            Frame::Hello { .. } | Frame::Over { .. } => None,
        }
    }
}

/// The runner was lost (`why`) after `reported` reports, while `running` ran: that one is
/// reported without an exit code. Nothing begun or reported yet: the batch was refused.
fn lose(
    reports: &Reports,
    mut reported: usize,
    running: Option<Running>,
    why: String,
    cap: usize,
) -> Outcome {
    if reported == 0 && running.is_none() {
        return Outcome::Refused(why);
    }
    let pid = running.as_ref().map(|r| r.pid);
    if let Some(r) = running {
        let _ = reports.send(r.lost(&why, cap));
        reported += 1;
    }
    Outcome::Lost {
        reported,
        running: pid,
        why,
    }
}
