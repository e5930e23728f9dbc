//! The setup script and the setup cache's part in starting a sandbox: the cache plan for a
//! run (its key, and the cached image when there is one), bringing a cached image's
//! workspace to this run's checkout, running the script with a timeout and keeping the
//! tail of what it printed, and committing a successful setup to the cache.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::DownloadFromContainerOptions;
use bollard::Docker;
use futures_util::StreamExt;

use super::engine::Engine;
use super::sandbox::DockerSandbox;
use super::spec::{SandboxSpec, SetupSecret};
use super::streams::upload;
use crate::archive::{self, Manifest};
use crate::setup_cache::{self, SetupCacheSpec, SetupCacheUse, SetupReport};
use crate::term;
use crate::{Result, SandboxError};

impl Engine {
    /// What the setup cache has for `spec`: `None` when it is off for this run (not asked
    /// for, no setup script, or the key cannot be made: then the run sets up as without it).
    pub(super) async fn setup_cache_plan(&self, spec: &SandboxSpec) -> Option<CachePlan> {
        let (cache, script) = (spec.setup_cache.as_ref()?, spec.setup_script.as_ref()?);
        // A setup with secrets could leave them in the image's files: never cached.
        if !spec.setup_secrets.is_empty() {
            tracing::info!("setup cache off for this run: the setup has secrets");
            return None;
        }
        let base = match self.docker.inspect_image(&spec.image).await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(
                    "setup cache off for this run: inspecting {}: {e}",
                    spec.image
                );
                return None;
            }
        };
        let base_id = base.id?;
        let mut patterns: Vec<String> = setup_cache::DEFAULT_KEY_FILES
            .iter()
            .map(|p| p.to_string())
            .collect();
        patterns.extend(cache.key_files.iter().cloned());
        let files = match spec.repo_dir.clone() {
            Some(dir) => {
                // From where the copy-in takes the files: the disk, or a clone's objects
                // when nothing is checked out.
                let read = move || {
                    if setup_cache::only_git(&dir) {
                        setup_cache::key_files_at_head(&dir, &patterns)
                    } else {
                        setup_cache::key_files(&dir, &patterns)
                    }
                };
                match tokio::task::spawn_blocking(read).await {
                    Ok(Ok(files)) => files,
                    Ok(Err(e)) => {
                        tracing::warn!("setup cache off for this run: {e}");
                        return None;
                    }
                    Err(e) => {
                        tracing::warn!("setup cache off for this run: {e}");
                        return None;
                    }
                }
            }
            None => Vec::new(),
        };
        // One installation's images never serve another's runs on a shared engine.
        let scope = format!(
            "{}\n{}",
            self.instance.as_deref().unwrap_or(""),
            cache.scope
        );
        let key = setup_cache::cache_key(&setup_cache::KeyInputs {
            image_id: &base_id,
            scope: &scope,
            script,
            network: !spec.no_network,
            files: &files,
        });
        let hit = setup_cache::lookup(&self.docker, &key).await;
        if hit.is_some() {
            setup_cache::touch(&self.docker, &key).await;
        }
        tracing::info!(key = %&key[..16], hit = hit.is_some(), files = files.len(), "setup cache");
        Some(CachePlan {
            key,
            base_id,
            base_config: base.config.unwrap_or_default(),
            hit,
            spec: cache.clone(),
        })
    }

    /// Commits the container after its setup as the cached image of `plan`'s key, then
    /// evicts what is over the cache's bounds.
    async fn save_setup(&self, sandbox: &DockerSandbox, plan: &CachePlan) -> Result<()> {
        let script = {
            let baseline = sandbox.baseline.lock();
            setup_cache::clean_script(&sandbox.workdir, &baseline)
        };
        let stored = sandbox.baseline.lock().without_git().to_bytes();
        let files = [
            (&setup_cache::CLEAN_SCRIPT[1..], script.as_bytes(), 0o644),
            (&setup_cache::MANIFEST_FILE[1..], stored.as_slice(), 0o644),
        ];
        upload(&self.docker, &sandbox.id, "/", archive::pack_files(&files)).await?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let config = setup_cache::committed_config(
            &plan.base_config,
            &plan.key,
            &plan.spec.scope,
            &plan.base_id,
            created,
        );
        let image = setup_cache::commit(&self.docker, &sandbox.id, &plan.key, config).await?;
        tracing::info!(image = %image, key = %&plan.key[..16], "setup cached");
        let removed =
            setup_cache::evict(&self.docker, plan.spec.max_images, plan.spec.max_bytes).await?;
        if removed > 0 {
            tracing::info!("evicted {removed} setup cache image(s)");
        }
        Ok(())
    }

    /// Runs the setup script, and offers its result to the cache when the cache is on.
    pub(super) async fn run_setup_script(
        &self,
        sandbox: &DockerSandbox,
        spec: &SandboxSpec,
        cache: Option<&CachePlan>,
        progress: &mut impl FnMut(&str),
    ) -> Result<SetupReport> {
        progress("running the setup script");
        let started = std::time::Instant::now();
        let ran = run_setup(
            &self.docker,
            &sandbox.id,
            &sandbox.workdir,
            spec.setup_timeout,
            &spec.setup_secrets,
        )
        .await;
        if !spec.setup_secrets.is_empty() {
            stop_holders(&self.docker, &sandbox.id, &spec.setup_secrets).await?;
        }
        ran?;
        let took = started.elapsed();
        if let Some(plan) = cache {
            progress("saving the setup to the cache");
            if let Err(e) = self.save_setup(sandbox, plan).await {
                tracing::warn!("the setup was not cached: {e}");
            }
        }
        Ok(SetupReport {
            cache: if cache.is_some() {
                SetupCacheUse::Miss
            } else {
                SetupCacheUse::Off
            },
            took: Some(took),
        })
    }

    /// On a cache hit, before the repository goes in: the checkout the cached image holds,
    /// its `.git` removed (this run's checkout goes in over it, only what differs). An
    /// image without it (made by an older kodx) is cleaned first, and the result is `None`.
    pub(super) async fn clear_cached_workspace(
        &self,
        id: &str,
        workdir: &str,
    ) -> Result<Option<Arc<Manifest>>> {
        let stored = stored_manifest(&self.docker, id).await;
        let command = match stored {
            Some(_) => format!("cd '{workdir}' && rm -rf ./.git"),
            None => format!("sh {}", setup_cache::CLEAN_SCRIPT),
        };
        exec_checked(
            &self.docker,
            id,
            &command,
            "clearing the cached image's workspace",
        )
        .await?;
        Ok(stored.map(Arc::new))
    }

    /// Deletes from the workspace what the cached image's checkout (`stored`) has and this
    /// run's (`new`) does not.
    pub(super) async fn delete_gone(
        &self,
        (id, workdir): (&str, &str),
        stored: &Manifest,
        new: &Manifest,
    ) -> Result<()> {
        let Some(script) = setup_cache::delta_script(workdir, stored, new) else {
            return Ok(());
        };
        self.run_removal(
            id,
            &script,
            "removing what the cached image has and this checkout does not",
        )
        .await
    }

    /// Removes `paths` (relative to `workdir`; a directory with what it holds) from the
    /// workspace: what a preloaded checkout has and a newer tip does not.
    pub(super) async fn remove_paths(
        &self,
        id: &str,
        workdir: &str,
        paths: &[String],
    ) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        let script = setup_cache::removal_of_paths(workdir, paths);
        self.run_removal(
            id,
            &script,
            "removing what the preloaded checkout has and this tip does not",
        )
        .await
    }

    /// Runs the removal `script` in the container.
    async fn run_removal(&self, id: &str, script: &str, what: &str) -> Result<()> {
        let files = [(&DELTA_SCRIPT[1..], script.as_bytes(), 0o644)];
        upload(&self.docker, id, "/", archive::pack_files(&files)).await?;
        exec_checked(
            &self.docker,
            id,
            &format!("sh {DELTA_SCRIPT}; rm -f {DELTA_SCRIPT}"),
            what,
        )
        .await
    }
}

/// Where a run from a cached setup image puts the script that deletes what its checkout
/// no longer has ([`setup_cache::delta_script`]).
const DELTA_SCRIPT: &str = "/tmp/.kodx/delta.sh";

/// The checkout a cached setup image holds ([`setup_cache::MANIFEST_FILE`]), read from the
/// container made from it; `None` when it has none or it cannot be read (the run then
/// cleans the image's checkout and copies its own whole).
async fn stored_manifest(docker: &Docker, id: &str) -> Option<Manifest> {
    let path = setup_cache::MANIFEST_FILE;
    let options = DownloadFromContainerOptions {
        path: path.to_string(),
    };
    let mut stream = docker.download_from_container(id, Some(options));
    // The file and its tar headers.
    let max = setup_cache::MAX_MANIFEST_BYTES + (64 << 10);
    let mut tar = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) if (tar.len() + chunk.len()) as u64 <= max => tar.extend_from_slice(&chunk),
            Ok(_) => {
                tracing::warn!(
                    "the cached image's manifest is over {} bytes; copying the whole checkout",
                    setup_cache::MAX_MANIFEST_BYTES
                );
                return None;
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return None,
            Err(e) => {
                tracing::warn!(
                    "reading the cached image's manifest: {e}; copying the whole checkout"
                );
                return None;
            }
        }
    }
    let read = || -> std::result::Result<Manifest, String> {
        let mut archive = archive::untrusted_archive(tar.as_slice(), max);
        let mut entry = archive
            .entries()
            .and_then(|mut e| e.next().transpose())
            .map_err(|e| e.to_string())?
            .ok_or("an empty archive")?;
        let mut bytes = Vec::new();
        entry
            .by_ref()
            .take(setup_cache::MAX_MANIFEST_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        Manifest::from_bytes(&bytes)
    };
    match read() {
        Ok(manifest) => Some(manifest),
        Err(e) => {
            tracing::warn!(
                "the cached image's manifest cannot be read ({e}); copying the whole checkout"
            );
            None
        }
    }
}

/// What the setup cache has for one run ([`Engine::setup_cache_plan`]).
pub(super) struct CachePlan {
    pub(super) key: String,
    base_id: String,
    base_config: bollard::models::ImageConfig,
    /// The cached image's id when there is one.
    pub(super) hit: Option<String>,
    spec: SetupCacheSpec,
}

/// Runs `sh -c command` in the container to its end; fails unless it exits 0.
pub(super) async fn exec_checked(
    docker: &Docker,
    id: &str,
    command: &str,
    what: &str,
) -> Result<()> {
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(vec!["/bin/sh", "-c", command]),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| SandboxError::docker(what, e))?;
    if let StartExecResults::Attached { mut output, .. } =
        docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| SandboxError::docker(what, e))?
    {
        while let Some(Ok(_)) = output.next().await {}
    }
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| SandboxError::docker(what, e))?
        .exit_code
        .unwrap_or(-1);
    if code != 0 {
        return Err(SandboxError::InvalidInput(format!(
            "{what}: exit code {code}"
        )));
    }
    Ok(())
}

/// Runs `/tmp/setup.sh` with bash (sh when the image has no bash) in `workdir`, to the end
/// or its timeout; removes the script afterwards.
async fn run_setup(
    docker: &Docker,
    id: &str,
    workdir: &str,
    timeout: Duration,
    secrets: &[SetupSecret],
) -> Result<()> {
    let mut env = vec!["DEBIAN_FRONTEND=noninteractive".to_string()];
    env.extend(secrets.iter().map(|s| format!("{}={}", s.name, s.value)));
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    // One stream (2>&1): the tail a maintainer reads keeps the order the script wrote it
    // in; two pipes read side by side can put an error line before the output it followed.
    let script = "if command -v bash >/dev/null 2>&1; then bash /tmp/setup.sh 2>&1; \
                  else sh /tmp/setup.sh 2>&1; fi; rc=$?; rm -f /tmp/setup.sh; exit $rc";
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(vec!["/bin/sh", "-c", script]),
                env: Some(env),
                working_dir: Some(workdir),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| SandboxError::docker("creating the setup script's process", e))?;
    let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| SandboxError::docker("starting the setup script", e))?
    else {
        return Err(SandboxError::InvalidInput(
            "setup script started detached".into(),
        ));
    };
    // Cleaned as it comes: a script may print without end, or escapes that would each
    // fill a line. The decoder keeps a head and a tail of the text, the message its tail.
    const KEEP: usize = 32 * 1024;
    let mut printed = term::Decoder::new("", KEEP);
    let collect = async {
        while let Some(Ok(item)) = output.next().await {
            if let LogOutput::StdOut { message } | LogOutput::StdErr { message } = item {
                printed.feed(&message);
            }
        }
    };
    let finished = tokio::time::timeout(timeout, collect).await.is_ok();
    let tail_text = without_secrets(last_lines(&printed.take_text(2 * KEEP), 40), secrets);
    if !finished {
        return Err(SandboxError::SetupTimedOut {
            timeout,
            tail: tail_text,
        });
    }
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| SandboxError::docker("reading the setup script's exit code", e))?
        .exit_code
        .unwrap_or(-1);
    if code != 0 {
        return Err(SandboxError::SetupFailed {
            exit_code: code,
            tail: tail_text,
        });
    }
    Ok(())
}

/// `text` with every secret's value cut out.
fn without_secrets(mut text: String, secrets: &[SetupSecret]) -> String {
    for s in secrets.iter().filter(|s| !s.value.is_empty()) {
        text = text.replace(&s.value, &format!("[{} REDACTED]", s.name));
    }
    text
}

/// Stops every process whose environment holds one of the setup's secrets (what the setup
/// script started and left running: a database, a daemon), so no shell of the run can read
/// them from `/proc/*/environ`.
async fn stop_holders(docker: &Docker, id: &str, secrets: &[SetupSecret]) -> Result<()> {
    // Names are `[A-Za-z_][A-Za-z0-9_]*` (checked when the config was read): safe in a
    // pattern. A process is stopped when a line of its environment starts with `NAME=`.
    let names: Vec<String> = secrets
        .iter()
        .filter(|s| {
            s.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
        .map(|s| format!("^{}=", s.name))
        .collect();
    let patterns = names
        .iter()
        .map(|n| format!("-e '{n}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        r#"command -v grep >/dev/null && command -v tr >/dev/null || {{ echo "the image has no grep or tr to find them" >&2; exit 1; }}
for p in /proc/[0-9]*; do
  n="${{p##*/}}"; [ "$n" = 1 ] && continue; [ "$n" = "$$" ] && continue
  if tr '\000' '\n' < "$p/environ" 2>/dev/null | grep -q {patterns}; then kill -9 "$n" 2>/dev/null; fi
done
exit 0"#
    );
    exec_checked(
        docker,
        id,
        &script,
        "stopping what the setup left running with its secrets",
    )
    .await
}

/// The last `n` lines of `text` (at most 8,000 bytes), without trailing blanks (cursor
/// moves print them).
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().map(str::trim_end).collect();
    let start = lines.len().saturating_sub(n);
    let mut out = lines[start..]
        .join("\n")
        .trim_start_matches('\n')
        .to_string();
    if out.len() > 8000 {
        let cut = out.len() - 8000;
        let cut = (cut..out.len())
            .find(|&i| out.is_char_boundary(i))
            .unwrap_or(0);
        out = out[cut..].to_string();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_tail_keeps_last_lines() {
        let text: String = (0..100).map(|i| format!("l{i}\n")).collect();
        let t = last_lines(&text, 3);
        assert_eq!(t, "l97\nl98\nl99");
        assert_eq!(last_lines("a   \n   \nb \n", 40), "a\n\nb");
        assert_eq!(last_lines("   \nb \n", 40), "b");
    }
}
