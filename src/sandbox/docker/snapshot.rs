//! The change set from a snapshot: a marker written by the copy-in itself, right after the
//! checkout, and kodx's helper run in the container at the end to write the workspace as a
//! tar in which every file whose inode has not changed since that marker is a header alone.
//! Only what the run touched crosses the engine, instead of the whole tree read back and
//! hashed. A process in the container cannot set an inode's change time back (that takes
//! setting the clock); what it could do to the marker or the helper only loses its own
//! changes. Any failure reads the whole workspace instead, as before.

use parking_lot::Mutex;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use bytes::Bytes;
use futures_util::StreamExt as _;

use super::sandbox::DockerSandbox;
use super::streams::COPIED_MARKER;
use crate::sandbox::archive::{self, ChangeSet};
use crate::sandbox::net;
use crate::sandbox::{Result, SandboxError};

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

impl DockerSandbox {
    /// The change set from the helper's snapshot, when the copy-in left its marker; `None`
    /// when there is none to take or it failed (said in the log): then read the whole
    /// workspace.
    pub async fn snapshot_change_set(&self) -> Option<ChangeSet> {
        if !self.snapshot_ready() {
            return None;
        }
        let command = net::snapshot_command(COPIED_MARKER, &self.workdir)?;
        let started = std::time::Instant::now();
        match tokio::time::timeout(SNAPSHOT_TIMEOUT, self.read_snapshot(command)).await {
            Ok(Ok(set)) => {
                tracing::info!(
                    took_ms = started.elapsed().as_millis() as u64,
                    changes = set.changes.len(),
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

    async fn read_snapshot(&self, command: Vec<String>) -> Result<ChangeSet> {
        let what = "taking the workspace's snapshot";
        let exec = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(command),
                    user: Some("0".to_string()),
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
                "the snapshot started detached".into(),
            ));
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(8);
        let stderr = Arc::new(Mutex::new(String::new()));
        let said = stderr.clone();
        let forward = tokio::spawn(async move {
            while let Some(item) = output.next().await {
                match item {
                    Ok(bollard::container::LogOutput::StdOut { message }) => {
                        if tx.send(Ok(message)).await.is_err() {
                            break; // the reader stopped: dropping the stream ends the exec
                        }
                    }
                    Ok(bollard::container::LogOutput::StdErr { message }) => {
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
        let opener = self.opener();
        let root = self.root_name().to_string();
        let baseline = self.baseline.lock().clone();
        let limits = self.archive_limits.clone();
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
        let _ = forward.await;
        let set = read?;
        // Whole only if the helper says so, by the engine's word.
        match exit_code(&self.docker, &exec.id).await {
            Some(0) => Ok(set),
            code => Err(SandboxError::InvalidInput(format!(
                "the helper ended with {code:?}: {}",
                stderr.lock().trim()
            ))),
        }
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
