//! A run's clone on the host, in a private temporary directory removed with it: from the
//! repository cache (a clone sharing the mirror's objects; the files go into the container
//! straight from git) or, with the cache off, a plain clone whose files are copied in.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{RunFailure, Services, Timings};
use crate::db::Run;
use crate::git::{Checkout, History};
use crate::repo_cache::{RepoCache, RepoKey};
use crate::sandbox::ready::{self, ReadyCache, ReadyRepo};
use crate::sandbox::RepoSource;
use crate::serve::texts;

/// Where the runs' clones go under the repository cache's directory when the temporary
/// directory is on another filesystem (a name its mirrors never take: they are
/// `<owner>/<name>.git`, and an owner never starts with a dot).
pub(in crate::serve) const RUNS_DIR: &str = ".runs";
/// Where the ready checkouts (the packed tips of issue and `ask` runs) go under the
/// repository cache's directory, beside the mirrors ([`crate::sandbox::ready`]).
const READY_DIR: &str = ".ready";

/// A run's clone. Dropping it removes the clone.
pub(in crate::serve) struct Workspace {
    _dir: tempfile::TempDir,
    /// The clone's work tree (for a clone from the cache, a repository with no files).
    pub dest: PathBuf,
    /// How the tree goes into the container, and how its change is committed.
    pub source: RepoSource,
    /// Where a tip-only clone's packed tar is kept for the next run on the same tip.
    pub ready: Option<ReadyRepo>,
    /// A merge run's merge, prepared in the clone ([`Workspace::prepare_merge`]).
    pub merge: Option<crate::git::PreparedMerge>,
}

impl Workspace {
    /// Merges `base` into the clone's branch (`branch`, checked out), each conflicted file
    /// left with conflict markers, as the commit the container is given (a merge run, SPEC
    /// §12): what the run resolves, and what its delivery commits as the merge.
    pub(in crate::serve) async fn prepare_merge(
        &mut self,
        url: &str,
        token: String,
        branch: &str,
        base: &str,
        author: crate::git::Identity,
        timings: &Timings,
    ) -> Result<&crate::git::PreparedMerge, RunFailure> {
        let started = Instant::now();
        let (dest, url, branch, base) = (
            self.dest.clone(),
            url.to_string(),
            branch.to_string(),
            base.to_string(),
        );
        let files = self.source == RepoSource::Files;
        let prepared = tokio::task::spawn_blocking(move || {
            let message = format!(
                "Merge branch '{base}' into {branch}\n\nkodx merged it with the conflicts left in \
                 the files; the run resolves them, and this commit is replaced by the resolved \
                 merge before anything is pushed."
            );
            crate::git::prepare_conflicted_merge(
                &dest,
                &crate::git::PrepareMerge {
                    url: &url,
                    token: &token,
                    base: &base,
                    ours_label: &branch,
                    theirs_label: &base,
                    author,
                    message: &message,
                    files,
                },
            )
        })
        .await
        .map_err(clone_task_failed)?
        .map_err(|e| RunFailure::User(texts::merge::prepare_failed(&e.to_string())))?;
        timings.add("merge", started.elapsed());
        tracing::info!(head = %prepared.head, base = %prepared.base,
            conflicts = prepared.conflicts.len(), "merged the base into the branch");
        Ok(self.merge.insert(prepared))
    }
}

/// What to clone, with what.
pub(in crate::serve) struct CloneOf<'a> {
    pub url: &'a str,
    /// The installation token (never stored in the clone's config).
    pub token: String,
    pub checkout: &'a Checkout,
    /// A shallow clone's depth (plain clones only).
    pub depth: Option<u32>,
    /// The run needs only the tip (an issue's or an `ask` run): from the repository cache,
    /// the container's `.git` holds that commit alone ([`RepoSource::GitTip`]), and a new
    /// mirror is made shallow. A run on a pull request gets the history.
    pub tip_only: bool,
}

/// Clones `of` for `run` into a new private directory; the phases go into `timings`.
pub(in crate::serve) async fn workspace(
    svc: &Services,
    run: &Run,
    of: CloneOf<'_>,
    timings: &Timings,
) -> Result<Workspace, RunFailure> {
    let cache = repo_cache(svc);
    // Readable by this user alone: it holds a private repository. A clone from the
    // repository cache must be on the mirrors' filesystem to hard-link their packs
    // instead of copying them: in the temporary directory when it is there, else beside
    // the mirrors.
    let runs_dir = match &cache {
        Some(cache) => Some(clones_dir(cache.root()).map_err(|e| {
            RunFailure::User(format!(
                "The repository cache has no room for this run's clone: cannot create {}: {e}; check that the data volume is writable",
                cache.root().display()
            ))
        })?),
        None => None,
    };
    let prefix = format!("{}{}-", svc.clone_prefix(), run.id);
    let mut builder = tempfile::Builder::new();
    builder
        .prefix(&prefix)
        .permissions(std::fs::Permissions::from_mode(0o700));
    let made = match &runs_dir {
        Some(dir) => builder.tempdir_in(dir),
        None => builder.tempdir(),
    };
    let dir = made.map_err(|e| {
        RunFailure::Internal(anyhow::anyhow!("no temporary directory for the clone: {e}"))
    })?;
    let dest = dir.path().join("repo");
    let mut ready = None;
    let source = match cache {
        Some(cache) => {
            let key = RepoKey::parse(&run.request.repo).map_err(|e| {
                RunFailure::User(format!("The repository cache refused this run: {e}"))
            })?;
            if of.tip_only {
                ready = ready_checkouts(&cache, &key);
            }
            let checked = {
                let dest = dest.clone();
                let url = of.url.to_string();
                let checkout = of.checkout.clone();
                let token = of.token;
                let history = if of.tip_only {
                    History::Tip
                } else {
                    History::Whole
                };
                tokio::task::spawn_blocking(move || {
                    let first = !cache.mirror_path(&key).exists();
                    cache
                        .checkout_for(&key, &url, &token, &checkout, history, &dest, false)
                        .map(|c| (c, first))
                })
                .await
            };
            let (c, first) = match checked {
                Ok(Ok(checked)) => checked,
                Ok(Err(e)) => return Err(RunFailure::User(texts::clone_failed(&e.to_string()))),
                Err(e) => return Err(clone_task_failed(e)),
            };
            // A first download of the whole history is a clone; later ones fetch what
            // the mirror lacks.
            timings.add(if first { "clone" } else { "fetch" }, c.fetch_took);
            timings.add("checkout", c.clone_took);
            tracing::info!(
                head = %c.commit,
                fetched = c.fetched,
                objects = c.received_objects,
                bytes = c.received_bytes,
                shallow = c.shallow,
                recovery = ?c.recovery,
                "checked out from the repository cache"
            );
            if of.tip_only {
                RepoSource::GitTip
            } else {
                RepoSource::GitHead
            }
        }
        None => {
            let started = Instant::now();
            let cloned = {
                let dest = dest.clone();
                let url = of.url.to_string();
                let checkout = of.checkout.clone();
                let (token, depth) = (of.token, of.depth);
                tokio::task::spawn_blocking(move || {
                    crate::git::clone(&url, &token, &dest, &checkout, depth)
                })
                .await
            };
            match cloned {
                Ok(Ok(c)) => {
                    timings.add("clone", started.elapsed());
                    tracing::info!(head = %c.head_sha, "cloned")
                }
                Ok(Err(e)) => return Err(RunFailure::User(texts::clone_failed(&e.to_string()))),
                Err(e) => return Err(clone_task_failed(e)),
            }
            RepoSource::Files
        }
    };
    Ok(Workspace {
        _dir: dir,
        dest,
        source,
        ready,
        merge: None,
    })
}

/// The repository cache, unless `repo_cache_max_bytes = 0` turned it off.
pub(in crate::serve) fn repo_cache(svc: &Services) -> Option<RepoCache> {
    let dir = svc.settings.repo_cache_dir.as_ref()?;
    (svc.settings.repo_cache_max_bytes > 0)
        .then(|| RepoCache::new(dir, svc.settings.repo_cache_max_bytes))
}

/// The repository's ready checkouts under the repository cache's directory.
fn ready_checkouts(cache: &RepoCache, key: &RepoKey) -> Option<ReadyRepo> {
    let root = cache.root().join(READY_DIR);
    ReadyCache::new(root, ready::DEFAULT_MAX_BYTES)
        .repository(key.owner(), key.name())
        .map_err(|e| tracing::warn!("{e}"))
        .ok()
}

fn clone_task_failed(e: tokio::task::JoinError) -> RunFailure {
    RunFailure::Internal(anyhow::anyhow!("the clone task failed: {e}"))
}

/// Where a run's clone from the mirrors under `cache_root` goes: the temporary directory if
/// it is on their filesystem (a hard link costs nothing there), else `<cache_root>/.runs`
/// (created). `Err`: the cache's directory cannot be created.
fn clones_dir(cache_root: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(cache_root)?;
    let tmp = std::env::temp_dir();
    let device = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if device(&tmp).is_some() && device(&tmp) == device(cache_root) {
        return Ok(tmp);
    }
    let runs = cache_root.join(RUNS_DIR);
    std::fs::create_dir_all(&runs)?;
    Ok(runs)
}
