//! The change set from a snapshot: a marker written by the copy-in itself, right after the
//! checkout, and kodx's helper run in the container at the end to write the workspace as a
//! tar in which every file whose inode has not changed since that marker is a header alone.
//! Only what the run touched crosses the engine, instead of the whole tree read back and
//! hashed. A process in the container cannot set an inode's change time back (that takes
//! setting the clock); what it could do to the marker or the helper only loses its own
//! changes. Any failure reads the whole workspace instead, as before.

use parking_lot::Mutex;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use std::pin::Pin;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};

use super::streams::{Opener, COPIED_MARKER};
use crate::archive::{self, ArchiveLimits, ChangeSet, Manifest};
use crate::error::{Result, SandboxError};
use crate::net;

/// Longest a snapshot may take before the whole workspace is read instead.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

type Chunk = io::Result<Bytes>;

/// The snapshot's stdout, read on a blocking thread.
struct Stdout {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    buf: Bytes,
}

impl Read for Stdout {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.buf.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(chunk) => self.buf = chunk?,
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf.split_to(n));
        Ok(n)
    }
}

/// A sandbox's snapshot: whether one can be taken, and its exec when started ahead.
pub(super) struct Snapshot {
    /// The whole checkout went in with the copy-in's marker after it: the change set can
    /// come from a snapshot.
    ready: AtomicBool,
    /// Start the snapshot's exec ahead ([`super::SandboxSpec::change_set_ahead`]).
    ahead: bool,
    /// The snapshot's exec, started ahead and waiting for its line.
    task: Mutex<Option<tokio::task::JoinHandle<Result<Started>>>>,
}

/// What a snapshot is taken in and read against: the sandbox's container and workspace,
/// and what was copied in.
pub(super) struct Workspace<'w> {
    pub(super) docker: &'w Docker,
    pub(super) id: &'w str,
    pub(super) workdir: &'w str,
    pub(super) opener: Opener,
    /// The workspace directory's own name (the root of its tar).
    pub(super) root: String,
    pub(super) baseline: Manifest,
    pub(super) limits: ArchiveLimits,
}

impl Snapshot {
    /// None taken yet; its exec started ahead when `ahead`.
    pub(super) fn new(ahead: bool) -> Self {
        Snapshot {
            ready: AtomicBool::new(false),
            ahead,
            task: Mutex::new(None),
        }
    }

    /// Whether the change set can come from a snapshot (the copy-in left its marker).
    pub(super) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Records whether the copy-in left its marker after a whole checkout.
    pub(super) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Stops the exec started ahead, if any.
    pub(super) fn abort(&self) {
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }

    /// The change set from the helper's snapshot, when the copy-in left its marker; `None`
    /// when there is none to take or it failed (said in the log): then read the whole
    /// workspace.
    pub(super) async fn change_set(&self, ws: Workspace<'_>) -> Option<ChangeSet> {
        if !self.is_ready() {
            return None;
        }
        let started = std::time::Instant::now();
        match tokio::time::timeout(SNAPSHOT_TIMEOUT, self.read(ws)).await {
            Ok(Ok((set, times))) => {
                tracing::info!(
                    took_ms = started.elapsed().as_millis() as u64,
                    changes = set.changes.len(),
                    started_ahead = times.ahead,
                    exec_ready_ms = times.ready_ms,
                    first_byte_ms = times.first_byte_ms,
                    read_ms = times.read_ms,
                    "read the change set from the workspace's snapshot"
                );
                Some(set)
            }
            Ok(Err(e)) => {
                tracing::warn!("the workspace's snapshot failed, reading all of it: {e}");
                None
            }
            Err(_) => {
                tracing::warn!("the workspace's snapshot took too long, reading all of it");
                None
            }
        }
    }

    /// Starts the snapshot's exec now, waiting for its line, so that the engine's part of
    /// it is done by the time the run ends; only for a run that ends with a change set,
    /// where a snapshot can be taken.
    pub(super) fn start_ahead(&self, docker: &Docker, id: &str, workdir: &str) {
        if !self.ahead || !self.is_ready() {
            return;
        }
        let Some(command) = net::snapshot_command(COPIED_MARKER, workdir, true) else {
            return;
        };
        let (docker, id) = (docker.clone(), id.to_string());
        let task = tokio::spawn(async move { start(&docker, &id, command, true).await });
        if let Some(old) = self.task.lock().replace(task) {
            old.abort();
        }
    }

    async fn read(&self, ws: Workspace<'_>) -> Result<(ChangeSet, Times)> {
        let t0 = std::time::Instant::now();
        let ahead = self.task.lock().take();
        let was_ahead = ahead.is_some();
        let started = match ahead {
            Some(task) => match task.await {
                Ok(Ok(mut waiting)) => {
                    let input = waiting.input.as_mut().expect("started with stdin");
                    input
                        .write_all(b"go\n")
                        .await
                        .and(input.flush().await)
                        .map_err(|e| SandboxError::io("starting the workspace's snapshot", e))?;
                    Ok(waiting)
                }
                Ok(Err(e)) => Err(e),
                Err(e) => Err(SandboxError::InvalidInput(format!(
                    "the snapshot's start failed: {e}"
                ))),
            },
            None => Err(SandboxError::InvalidInput("not started ahead".into())),
        };
        let mut ahead_used = false;
        let Started {
            exec,
            mut output,
            input: _input,
        } = match started {
            Ok(started) => {
                ahead_used = true;
                started
            }
            Err(e) => {
                tracing::debug!("the snapshot started ahead is not there ({e}); starting it now");
                let command = net::snapshot_command(COPIED_MARKER, ws.workdir, false)
                    .ok_or_else(|| SandboxError::InvalidInput("no helper".into()))?;
                start(ws.docker, ws.id, command, false).await?
            }
        };
        let ready_ms = t0.elapsed().as_millis() as u64;
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(8);
        let stderr = Arc::new(Mutex::new(String::new()));
        let said = stderr.clone();
        let first = Arc::new(AtomicU64::new(0));
        let first_at = first.clone();
        let forward = tokio::spawn(async move {
            while let Some(item) = output.next().await {
                match item {
                    Ok(LogOutput::StdOut { message }) => {
                        if first_at.load(Ordering::Relaxed) == 0 {
                            first_at.store(t0.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                        }
                        if tx.send(Ok(message)).await.is_err() {
                            break; // the reader stopped: dropping the stream ends the exec
                        }
                    }
                    Ok(LogOutput::StdErr { message }) => {
                        let mut said = said.lock();
                        if said.len() < 1024 {
                            said.push_str(&String::from_utf8_lossy(&message));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                        break;
                    }
                }
            }
        });
        let Workspace {
            docker,
            opener,
            root,
            baseline,
            limits,
            ..
        } = ws;
        let read = tokio::task::spawn_blocking(move || {
            let mut open = |path: &str| opener.open(path);
            let tar = Stdout {
                rx,
                buf: Bytes::new(),
            };
            archive::change_set_from_snapshot(tar, &mut open, &root, &baseline, &limits)
        })
        .await
        .map_err(|e| SandboxError::InvalidInput(format!("snapshot task failed: {e}")))?;
        let read_ms = t0.elapsed().as_millis() as u64;
        let _ = forward.await;
        let set = read?;
        let times = Times {
            ahead: was_ahead && ahead_used,
            ready_ms,
            first_byte_ms: first.load(Ordering::Relaxed).saturating_sub(1),
            read_ms,
        };
        // Whole only if the helper says so, by the engine's word.
        match exit_code(docker, &exec).await {
            Some(0) => Ok((set, times)),
            code => Err(SandboxError::InvalidInput(format!(
                "the helper ended with {code:?}: {}",
                stderr.lock().trim()
            ))),
        }
    }
}

/// Where a snapshot's time went, from the moment it was asked for: its exec ready (started
/// ahead, or now), the first byte of the tar, the tar read.
struct Times {
    ahead: bool,
    ready_ms: u64,
    first_byte_ms: u64,
    read_ms: u64,
}

/// The snapshot's exec, started (with its stdin when it waits for a line).
pub(super) struct Started {
    exec: String,
    output:
        Pin<Box<dyn Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>>,
    input: Option<Pin<Box<dyn AsyncWrite + Send>>>,
}

async fn start(docker: &Docker, id: &str, command: Vec<String>, stdin: bool) -> Result<Started> {
    let what = "taking the workspace's snapshot";
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(command),
                user: Some("0".to_string()),
                attach_stdin: Some(stdin),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| SandboxError::docker(what, e))?;
    match docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| SandboxError::docker(what, e))?
    {
        StartExecResults::Attached { output, input } => Ok(Started {
            exec: exec.id,
            output,
            input: stdin.then_some(input),
        }),
        StartExecResults::Detached => Err(SandboxError::InvalidInput(
            "the snapshot started detached".into(),
        )),
    }
}

/// The exit code of a finished exec; `None` while it still runs (after a short wait).
async fn exit_code(docker: &Docker, exec: &str) -> Option<i64> {
    for _ in 0..20 {
        let inspected = docker.inspect_exec(exec).await.ok()?;
        if inspected.running == Some(false) {
            return inspected.exit_code;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
