//! A change set written into a sandbox that holds the tree it was taken against: the
//! checks' own sandbox (SPEC §12) gets the run's starting commit copied in as any sandbox
//! does, then exactly the change set kodx will commit, and nothing else of the agent's.

use std::collections::HashSet;
use std::io;

use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::StreamExt as _;

use super::sandbox::DockerSandbox;
use super::streams::{piped, upload_stream};
use crate::archive::{ChangeKind, ChangeSet, ManifestEntry};
use crate::{Result, SandboxError};

/// Removes each path given after `--` (relative to the working directory), then the
/// directories that leaves empty, as git does. Nothing else: a path that is a directory
/// now is left (a written file replaces it through the upload).
const REMOVE: &str = r#"for p in "$@"; do
  rm -f -- "$p" || exit 1
  d=$p
  while [ "${d%/*}" != "$d" ]; do d=${d%/*}; rmdir -- "$d" 2>/dev/null || break; done
done"#;

/// Most bytes of paths one removal's command line carries (Linux takes 128 KiB per
/// argument and 2 MiB in all).
const REMOVE_BATCH_BYTES: usize = 64 << 10;

impl DockerSandbox {
    /// Writes `changes` into the workspace: the deleted paths removed, then the added and
    /// modified files and symlinks uploaded as one tar, streamed from the change set.
    pub async fn apply_changes(&self, changes: &ChangeSet) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        // Validated (the same rules as applying it on the host) before anything is done.
        let (deleted, apart) = changes.checked_deletions()?;
        let remove = async {
            for batch in batches(&deleted) {
                self.remove_paths(batch).await?;
            }
            Ok(())
        };
        // Removed first when a written path depends on it (a directory become a file);
        // else both at once.
        if apart {
            let (removed, written) = tokio::join!(remove, self.write_changes(changes));
            removed.and(written)
        } else {
            remove.await?;
            self.write_changes(changes).await
        }
    }

    /// Uploads the added and modified files and symlinks of `changes` as one tar.
    async fn write_changes(&self, changes: &ChangeSet) -> Result<()> {
        if changes.added().chain(changes.modified()).next().is_none() {
            return Ok(());
        }
        let owned = changes.clone();
        let (task, body) = piped(move |out| owned.pack_written_to(out).map(|_| ()));
        let uploaded = upload_stream(&self.docker, &self.id, &self.workdir, body).await;
        let packed = task.await.map_err(|e| {
            SandboxError::InvalidInput(format!("packing the change set failed: {e}"))
        })?;
        match (packed, uploaded) {
            (Ok(()), Ok(())) => Ok(()),
            // The upload stopped first: the engine's error says why.
            (Err(SandboxError::Io { source, .. }), Err(e))
                if source.kind() == io::ErrorKind::BrokenPipe =>
            {
                Err(e)
            }
            (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        }
    }

    /// The files and symlinks of the workspace once `changes` is applied to what was
    /// copied in (`.git` left out).
    pub fn files_with(&self, changes: &ChangeSet) -> HashSet<String> {
        let mut files: HashSet<String> = self
            .baseline
            .lock()
            .entries()
            .filter(|(path, entry)| {
                !matches!(entry, ManifestEntry::Dir { .. })
                    && *path != ".git"
                    && !path.starts_with(".git/")
            })
            .map(|(path, _)| path.to_string())
            .collect();
        for change in &changes.changes {
            match change.kind {
                ChangeKind::Deleted => files.remove(&change.path),
                _ => files.insert(change.path.clone()),
            };
        }
        files
    }

    /// Removes `paths` in the workspace with one exec; its exit code is the engine's.
    async fn remove_paths(&self, paths: &[String]) -> Result<()> {
        let what = "removing the deleted files";
        let mut cmd = vec!["/bin/sh", "-c", REMOVE, "kodx-remove"];
        cmd.extend(paths.iter().map(String::as_str));
        let exec = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(cmd),
                    working_dir: Some(self.workdir.as_str()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| SandboxError::docker(what, e))?;
        let mut said = String::new();
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| SandboxError::docker(what, e))?
        {
            while let Some(Ok(item)) = output.next().await {
                if said.len() < 2000 {
                    said.push_str(&String::from_utf8_lossy(&item.into_bytes()));
                }
            }
        }
        let code = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| SandboxError::docker(what, e))?
            .exit_code;
        match code {
            Some(0) => Ok(()),
            code => Err(SandboxError::InvalidInput(format!(
                "{what}: exit {code:?}: {}",
                said.trim()
            ))),
        }
    }
}

/// `paths` cut into runs of at most [`REMOVE_BATCH_BYTES`].
fn batches(paths: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, p) in paths.iter().enumerate() {
        if bytes + p.len() + 1 > REMOVE_BATCH_BYTES && i > start {
            out.push(&paths[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += p.len() + 1;
    }
    if start < paths.len() {
        out.push(&paths[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_are_cut_into_command_lines_the_kernel_takes() {
        let paths: Vec<String> = (0..5000).map(|i| format!("dir/file-{i:06}.txt")).collect();
        let cut = batches(&paths);
        assert!(cut.len() > 1, "{}", cut.len());
        assert_eq!(cut.iter().map(|b| b.len()).sum::<usize>(), paths.len());
        for b in &cut {
            assert!(b.iter().map(|p| p.len() + 1).sum::<usize>() <= REMOVE_BATCH_BYTES);
        }
        assert!(batches(&[]).is_empty());
    }
}
