//! Bringing a pull request's branch up to date with its base on the host (SPEC §12,
//! "Mergeable pull requests"): the base merged into the branch as a merge commit (first
//! parent the branch's head, second the base's tip), made with git2 in a clone; or the
//! files that conflict, when the merge needs a person or a model.

use std::path::Path;

use git2::{Repository, Signature};

use super::clone::{clone, fetch, Checkout};
use super::commit::Identity;
use super::error::GitError;
use super::session::other;

/// The most conflicted paths named.
const MAX_CONFLICTS: usize = 50;

/// What merging the base into the branch came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// The branch already holds the base's tip: nothing to do.
    UpToDate { base: String },
    /// A merge commit `sha` (parents: the branch's head, then `base`), not pushed yet.
    Committed { sha: String, base: String },
    /// The merge conflicts in these files (sorted, at most 50); nothing was committed.
    Conflicts { paths: Vec<String>, base: String },
}

/// What to merge, and how to sign it.
pub struct MergeRequest<'a> {
    pub url: &'a str,
    /// The installation token (never stored in the clone's config).
    pub token: &'a str,
    /// The pull request's branch, and the commit it must be at (else the branch moved
    /// and nothing is merged: [`GitError::Rejected`]).
    pub branch: &'a str,
    pub head: &'a str,
    /// The base branch merged into it.
    pub base: &'a str,
    pub author: Identity,
    pub message: &'a str,
}

/// Clones `req.branch` into `dest` (absent or empty), fetches `req.base`, and merges the
/// base into the branch with a merge commit on the local branch.
pub fn merge_base_into(dest: &Path, req: &MergeRequest<'_>) -> Result<Merged, GitError> {
    let cloned = clone(
        req.url,
        req.token,
        dest,
        &Checkout::Branch(req.branch.to_string()),
        None,
    )?;
    if cloned.head_sha != req.head {
        return Err(GitError::Rejected {
            reason: format!(
                "the branch `{}` moved to {} meanwhile (expected {})",
                req.branch,
                short(&cloned.head_sha),
                short(req.head)
            ),
        });
    }
    let repo = Repository::open(dest).map_err(other)?;
    let tips = fetch_tips(&repo, dest, req.url, req.token, req.base)?;
    let (head, base) = (tips.head, tips.base);
    let base_sha = base.id().to_string();
    if tips.up_to_date {
        return Ok(Merged::UpToDate { base: base_sha });
    }
    let mut index = repo.merge_commits(&head, &base, None).map_err(other)?;
    if index.has_conflicts() {
        let mut paths: Vec<String> = index
            .conflicts()
            .map_err(other)?
            .filter_map(|c| c.ok())
            .filter_map(|c| c.our.or(c.their).or(c.ancestor))
            .map(|e| String::from_utf8_lossy(&e.path).into_owned())
            .collect();
        paths.sort();
        paths.dedup();
        paths.truncate(MAX_CONFLICTS);
        return Ok(Merged::Conflicts {
            paths,
            base: base_sha,
        });
    }
    let tree = repo
        .find_tree(index.write_tree_to(&repo).map_err(other)?)
        .map_err(other)?;
    let sig = Signature::now(&req.author.name, &req.author.email).map_err(other)?;
    let sha = repo
        .commit(
            Some("HEAD"),
            &sig,
            &sig,
            req.message,
            &tree,
            &[&head, &base],
        )
        .map_err(other)?;
    Ok(Merged::Committed {
        sha: sha.to_string(),
        base: base_sha,
    })
}

/// The two tips of a merge of a base into the checked-out branch.
pub(super) struct Tips<'r> {
    pub head: git2::Commit<'r>,
    pub base: git2::Commit<'r>,
    /// The branch already holds the base.
    pub up_to_date: bool,
}

/// Fetches branch `base` into `refs/remotes/origin/<base>` of the clone at `dir` (opened as
/// `repo`) and reads its tip and `HEAD`'s.
pub(super) fn fetch_tips<'r>(
    repo: &'r Repository,
    dir: &Path,
    url: &str,
    token: &str,
    base: &str,
) -> Result<Tips<'r>, GitError> {
    let tracking = format!("refs/remotes/origin/{base}");
    fetch(
        dir,
        url,
        token,
        &[&format!("+refs/heads/{base}:{tracking}")],
    )?;
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(other)?;
    let base = repo
        .find_reference(&tracking)
        .and_then(|r| r.peel_to_commit())
        .map_err(|_| GitError::RefNotFound(format!("branch {base}")))?;
    let up_to_date = head.id() == base.id()
        || repo
            .graph_descendant_of(head.id(), base.id())
            .map_err(other)?;
    Ok(Tips {
        head,
        base,
        up_to_date,
    })
}

fn short(sha: &str) -> &str {
    sha.get(..7).unwrap_or(sha)
}
