//! Cloning over the network ([`clone`]) and fetching into a repository ([`fetch`]), with
//! the steps a clone from the mirror shares: the refs to make and the end of a clone.

use std::path::Path;

use git2::{Direction, Oid, Repository, RepositoryInitOptions};

use super::error::GitError;
use super::session::{check_branch_name, init, other, Session};

/// What to check out after cloning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkout {
    /// The branch the server's `HEAD` points at, as a local branch of the same name.
    DefaultBranch,
    /// This branch, as a local branch of the same name.
    Branch(String),
    /// `refs/pull/<N>/head` of the repository, as the local branch `pr-<N>`.
    PullHead(u64),
}

impl Checkout {
    /// The local branch [`clone`] checks out for a pull request.
    pub fn pull_branch(number: u64) -> String {
        format!("pr-{number}")
    }
}

/// The result of [`clone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloned {
    /// The commit checked out.
    pub head_sha: String,
    /// The local branch checked out.
    pub branch: String,
}

/// Clones `url` into `dest` (absent or an empty directory) and checks out `checkout`.
///
/// `.git/config` names the remote `origin` with `url` exactly as given. `depth` makes a
/// shallow clone of that many commits. Only the ref checked out is fetched (no tags).
pub fn clone(
    url: &str,
    token: &str,
    dest: &Path,
    checkout: &Checkout,
    depth: Option<u32>,
) -> Result<Cloned, GitError> {
    init();
    let session = Session::new(url, token)?;
    if let Checkout::Branch(name) = checkout {
        check_branch_name(name)?;
    }
    check_empty_dest(dest)?;

    let mut init_opts = RepositoryInitOptions::new();
    // No hooks or other files from the host's template directory.
    init_opts.external_template(false).mkdir(true);
    let repo = Repository::init_opts(dest, &init_opts).map_err(other)?;
    let mut remote = repo.remote("origin", url).map_err(other)?;

    let mut conn = remote
        .connect_auth(Direction::Fetch, Some(session.callbacks()), None)
        .map_err(|e| session.error(e))?;

    // What to fetch, where to keep it, and the local branch to make of it.
    let (source, tracking, branch) = refs_for(checkout, || default_branch_of(&conn))?;
    let advertised = conn
        .list()
        .map_err(|e| session.error(e))?
        .iter()
        .any(|h| h.name() == source);
    if !advertised {
        return Err(GitError::RefNotFound(match checkout {
            Checkout::PullHead(n) => format!("pull request head refs/pull/{n}/head"),
            _ => format!("branch `{branch}`"),
        }));
    }

    let mut fetch_opts = session.fetch_options(depth);
    conn.remote()
        .fetch(
            &[format!("+{source}:{tracking}")],
            Some(&mut fetch_opts),
            Some("clone"),
        )
        .map_err(|e| session.error(e))?;
    drop(conn);
    drop(remote);

    let commit = repo
        .find_reference(&tracking)
        .and_then(|r| r.peel_to_commit())
        .map_err(other)?
        .id();
    finish_clone(&repo, url, checkout, &tracking, branch, commit, true)
}

/// The server's default branch (`refs/heads/...`) as a connection advertises it.
pub(super) fn default_branch_of(
    conn: &git2::RemoteConnection<'_, '_, '_>,
) -> Result<String, GitError> {
    let head = conn
        .default_branch()
        .map_err(|_| GitError::RefNotFound("default branch (is the repository empty?)".into()))?;
    head.as_str()
        .map(str::to_string)
        .map_err(|_| GitError::Other("the default branch is not UTF-8".into()))
}

/// For `checkout`: the server's ref to fetch, the ref a clone keeps it under, and the
/// local branch to make of it. `default_branch` names the server's `HEAD` branch
/// (`refs/heads/...`); it is asked only for [`Checkout::DefaultBranch`].
pub(super) fn refs_for(
    checkout: &Checkout,
    default_branch: impl FnOnce() -> Result<String, GitError>,
) -> Result<(String, String, String), GitError> {
    Ok(match checkout {
        Checkout::DefaultBranch => {
            let head = default_branch()?;
            let name = head
                .strip_prefix("refs/heads/")
                .ok_or_else(|| GitError::Other(format!("unexpected default branch {head}")))?
                .to_string();
            (head.clone(), format!("refs/remotes/origin/{name}"), name)
        }
        Checkout::Branch(name) => {
            check_branch_name(name)?;
            (
                format!("refs/heads/{name}"),
                format!("refs/remotes/origin/{name}"),
                name.clone(),
            )
        }
        Checkout::PullHead(n) => (
            format!("refs/pull/{n}/head"),
            format!("refs/pull/{n}/head"),
            Checkout::pull_branch(*n),
        ),
    })
}

/// The end of a clone once `commit` is in `repo` and `tracking` points at it: the local
/// branch (with its upstream unless a pull request head), `origin/HEAD` for the default
/// branch, `HEAD` on the branch, and the work tree (`true`: the files; `false`: only the
/// index, as if the files had been checked out). Checks that the configuration holds
/// `url` exactly.
pub(super) fn finish_clone(
    repo: &Repository,
    url: &str,
    checkout: &Checkout,
    tracking: &str,
    branch: String,
    commit: Oid,
    files: bool,
) -> Result<Cloned, GitError> {
    let commit = repo.find_commit(commit).map_err(other)?;
    let mut local = repo.branch(&branch, &commit, true).map_err(other)?;
    if !matches!(checkout, Checkout::PullHead(_)) {
        local
            .set_upstream(Some(&format!("origin/{branch}")))
            .map_err(other)?;
    }
    if matches!(checkout, Checkout::DefaultBranch) {
        repo.reference_symbolic(
            "refs/remotes/origin/HEAD",
            tracking,
            true,
            "clone: default branch",
        )
        .map_err(other)?;
    }
    repo.set_head(&format!("refs/heads/{branch}"))
        .map_err(other)?;
    if files {
        repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
            .map_err(other)?;
    } else {
        let mut index = repo.index().map_err(other)?;
        index
            .read_tree(&commit.tree().map_err(other)?)
            .map_err(other)?;
        index.write().map_err(other)?;
    }

    // The configuration must hold the URL as given: no credentials crept in.
    let stored = repo
        .config()
        .and_then(|c| c.get_string("remote.origin.url"))
        .map_err(other)?;
    if stored != url {
        return Err(GitError::Other(
            "the cloned repository's remote URL differs from the one given".into(),
        ));
    }
    Ok(Cloned {
        head_sha: commit.id().to_string(),
        branch,
    })
}

/// Fails unless `dest` is absent or an empty directory.
pub(super) fn check_empty_dest(dest: &Path) -> Result<(), GitError> {
    if !dest.exists() {
        return Ok(());
    }
    let mut entries = std::fs::read_dir(dest).map_err(|e| {
        GitError::Other(format!(
            "cannot read clone destination {}: {e}",
            dest.display()
        ))
    })?;
    if entries.next().is_some() {
        return Err(GitError::Other(format!(
            "clone destination {} is not empty",
            dest.display()
        )));
    }
    Ok(())
}

/// Fetches `refspecs` (e.g. `+refs/pull/7/head:refs/pull/7/head`) from `url` into the
/// repository at `repo_dir`. Nothing is written to its configuration.
pub fn fetch(repo_dir: &Path, url: &str, token: &str, refspecs: &[&str]) -> Result<(), GitError> {
    init();
    let session = Session::new(url, token)?;
    let repo = Repository::open(repo_dir).map_err(other)?;
    let mut remote = repo.remote_anonymous(url).map_err(other)?;
    let mut fetch_opts = session.fetch_options(None);
    remote
        .fetch(refspecs, Some(&mut fetch_opts), Some("fetch"))
        .map_err(|e| session.error(e))
}
