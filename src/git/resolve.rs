//! A merge whose conflicts a run resolves (SPEC §12, "Mergeable pull requests"): the base
//! merged into the pull request's branch in the run's clone, each conflicted file left with
//! git's conflict markers, as a commit the run's workspace starts from; then the run's
//! change committed as the merge commit itself (first parent the branch's head, second the
//! base's tip), refused while a marker is left in a conflicted file.

use std::path::Path;

use git2::{build::CheckoutBuilder, MergeFileOptions, Oid, Repository};

use super::commit::{
    apply_change, changes_to_commit, check_sizes, commit_message, signature_of, stage_work_tree,
    CommitRequest, Committed, Identity,
};
use super::error::GitError;
use super::merge::fetch_tips;
use super::session::other;
use crate::sandbox::ChangeSet;

/// The most conflicted files a merge run takes on; a merge with more is refused (a
/// person's work, not a run's).
pub const MAX_CONFLICTED_FILES: usize = 200;
/// The most of a file the marker check reads.
const MAX_MARKER_SCAN_BYTES: usize = 8 * 1024 * 1024;

/// How a file conflicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictKind {
    /// Both sides changed it: it holds conflict markers.
    Both,
    /// The base deleted it and the branch changed it: the branch's version is kept.
    DeletedInBase,
    /// The branch deleted it and the base changed it: the base's version is kept.
    DeletedInBranch,
    /// Both sides changed a binary file: the branch's version is kept.
    Binary,
}

/// A conflicted file of a prepared merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub path: String,
    pub kind: ConflictKind,
}

/// A merge prepared in a clone: `HEAD`'s branch is at a commit whose parents are `head`
/// and `base` and whose tree is the merge, with markers in the conflicted files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedMerge {
    pub head: String,
    pub base: String,
    /// The conflicted files, sorted by path (empty: the base merged cleanly after all).
    pub conflicts: Vec<Conflict>,
    /// The branch already held the base: nothing was merged.
    pub up_to_date: bool,
}

impl PreparedMerge {
    /// The files given conflict markers (changed on both sides, not binary).
    pub fn marked(&self) -> Vec<String> {
        self.conflicts
            .iter()
            .filter(|c| c.kind == ConflictKind::Both)
            .map(|c| c.path.clone())
            .collect()
    }
}

/// What to merge in a run's clone, and how.
pub struct PrepareMerge<'a> {
    pub url: &'a str,
    pub token: &'a str,
    /// The base branch merged into the checked-out branch.
    pub base: &'a str,
    /// The labels of the two sides in the markers (e.g. the branch's and the base's names).
    pub ours_label: &'a str,
    pub theirs_label: &'a str,
    pub author: Identity,
    pub message: &'a str,
    /// The clone has its files on disk (they are rewritten); else only the index follows.
    pub files: bool,
}

/// Fetches `req.base` into the clone at `repo_dir` and merges it into `HEAD`, leaving the
/// conflicts with markers, as a commit `HEAD`'s branch now points at.
pub fn prepare_conflicted_merge(
    repo_dir: &Path,
    req: &PrepareMerge<'_>,
) -> Result<PreparedMerge, GitError> {
    let repo = Repository::open(repo_dir).map_err(other)?;
    let branch_ref = repo
        .head()
        .map_err(other)?
        .name()
        .map_err(|_| GitError::Other("HEAD has no name".into()))?
        .to_string();
    let tips = fetch_tips(&repo, repo_dir, req.url, req.token, req.base)?;
    let (head, base) = (tips.head, tips.base);
    let (head_sha, base_sha) = (head.id().to_string(), base.id().to_string());
    if tips.up_to_date {
        return Ok(PreparedMerge {
            head: head_sha,
            base: base_sha,
            conflicts: Vec::new(),
            up_to_date: true,
        });
    }
    let mut index = repo.merge_commits(&head, &base, None).map_err(other)?;
    let mut entries = Vec::new();
    for c in index.conflicts().map_err(other)? {
        entries.push(c.map_err(other)?);
        if entries.len() > MAX_CONFLICTED_FILES {
            return Err(GitError::Other(format!(
                "merging `{}` conflicts in more than {MAX_CONFLICTED_FILES} files: that merge \
                 is a person's work",
                req.base
            )));
        }
    }
    let mut conflicts = Vec::new();
    for c in entries {
        let Some(any) = c.our.as_ref().or(c.their.as_ref()).or(c.ancestor.as_ref()) else {
            continue;
        };
        let path = String::from_utf8_lossy(&any.path).into_owned();
        let mut resolved = match (&c.our, &c.their) {
            (Some(ours), Some(theirs))
                if is_binary(&repo, ours.id)? || is_binary(&repo, theirs.id)? =>
            {
                conflicts.push(Conflict {
                    path: path.clone(),
                    kind: ConflictKind::Binary,
                });
                Some((copy_entry(ours), None))
            }
            (Some(ours), Some(theirs)) => {
                let mut opts = MergeFileOptions::new();
                opts.our_label(req.ours_label).their_label(req.theirs_label);
                // Added on both sides: merged against an empty file.
                let ancestor = match &c.ancestor {
                    Some(a) => copy_entry(a),
                    None => {
                        let mut a = copy_entry(ours);
                        a.id = repo.blob(b"").map_err(other)?;
                        a
                    }
                };
                let merged = repo
                    .merge_file_from_index(&ancestor, ours, theirs, Some(&mut opts))
                    .map_err(other)?;
                conflicts.push(Conflict {
                    path: path.clone(),
                    kind: ConflictKind::Both,
                });
                Some((copy_entry(ours), Some(merged.content().to_vec())))
            }
            (Some(ours), None) => {
                conflicts.push(Conflict {
                    path: path.clone(),
                    kind: ConflictKind::DeletedInBase,
                });
                Some((copy_entry(ours), None))
            }
            (None, Some(theirs)) => {
                conflicts.push(Conflict {
                    path: path.clone(),
                    kind: ConflictKind::DeletedInBranch,
                });
                Some((copy_entry(theirs), None))
            }
            (None, None) => None,
        };
        index.conflict_remove(Path::new(&path)).map_err(other)?;
        if let Some((mut entry, content)) = resolved.take() {
            // Stage 0: resolved, as far as the index knows.
            entry.flags &= !0x3000;
            // The merge's index is in memory: the merged text goes in as a blob first.
            if let Some(bytes) = content {
                entry.id = repo.blob(&bytes).map_err(other)?;
                entry.file_size = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            }
            index.add(&entry).map_err(other)?;
        }
    }
    conflicts.sort_by(|a, b| a.path.cmp(&b.path));
    let tree = repo
        .find_tree(index.write_tree_to(&repo).map_err(other)?)
        .map_err(other)?;
    let sig = git2::Signature::now(&req.author.name, &req.author.email).map_err(other)?;
    let merge = repo
        .commit(None, &sig, &sig, req.message, &tree, &[&head, &base])
        .map_err(other)?;
    repo.reference(
        &branch_ref,
        merge,
        true,
        "kodx: the base merged, conflicts left",
    )
    .map_err(other)?;
    if req.files {
        let commit = repo.find_commit(merge).map_err(other)?;
        repo.checkout_tree(commit.as_object(), Some(CheckoutBuilder::new().force()))
            .map_err(other)?;
    }
    let mut on_disk = repo.index().map_err(other)?;
    on_disk.read_tree(&tree).map_err(other)?;
    on_disk.write().map_err(other)?;
    Ok(PreparedMerge {
        head: head_sha,
        base: base_sha,
        conflicts,
        up_to_date: false,
    })
}

/// Commits the run's change as the merge commit: the tree of `HEAD` (the prepared merge)
/// with `changes` applied (`None`: the work tree's files, for a clone with files), the
/// parents of `HEAD`, on `HEAD`'s branch. [`GitError::MarkersLeft`] while one of `marked`
/// (the files that were given markers) still holds a conflict marker.
pub fn commit_merge(
    repo_dir: &Path,
    changes: Option<&ChangeSet>,
    req: &CommitRequest<'_>,
    marked: &[String],
) -> Result<Committed, GitError> {
    let repo = Repository::open(repo_dir).map_err(other)?;
    let signature = signature_of(req)?;
    let message = commit_message(req)?;
    let head_ref = repo.head().map_err(other)?;
    let branch_ref = head_ref
        .name()
        .map_err(|_| GitError::Other("HEAD has no name".into()))?
        .to_string();
    let prepared = head_ref.peel_to_commit().map_err(other)?;
    let parents: Vec<git2::Commit<'_>> = prepared.parents().collect();
    if parents.len() != 2 {
        return Err(GitError::Other(
            "the workspace's HEAD is not the prepared merge".into(),
        ));
    }
    let tree_id = match changes {
        Some(changes) => {
            let kept = changes_to_commit(changes, req.max_file_bytes)?;
            let mut index = git2::Index::new().map_err(other)?;
            index
                .read_tree(&prepared.tree().map_err(other)?)
                .map_err(other)?;
            for change in &kept {
                apply_change(&repo, &mut index, change)?;
            }
            index.write_tree_to(&repo).map_err(other)?
        }
        None => {
            check_sizes(&repo, req.max_file_bytes)?;
            stage_work_tree(&repo)?
        }
    };
    let tree = repo.find_tree(tree_id).map_err(other)?;
    let left = markers_left(&repo, &tree, marked)?;
    if !left.is_empty() {
        return Err(GitError::MarkersLeft { paths: left });
    }
    let sha = repo
        .commit(
            None,
            &signature,
            &signature,
            &message,
            &tree,
            &[&parents[0], &parents[1]],
        )
        .map_err(other)?;
    repo.reference(&branch_ref, sha, true, "kodx: merge commit")
        .map_err(other)?;
    let old = parents[0].tree().map_err(other)?;
    let diff = repo
        .diff_tree_to_tree(Some(&old), Some(&tree), None)
        .map_err(other)?;
    let mut paths: Vec<String> = diff
        .deltas()
        .filter_map(|d| d.new_file().path().or(d.old_file().path()))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    paths.sort();
    paths.dedup();
    Ok(Committed {
        sha: sha.to_string(),
        files_changed: paths.len(),
        paths,
    })
}

/// The files of `marked` whose blob in `tree` still holds a conflict marker line
/// (`<<<<<<< `, `>>>>>>> ` or `||||||| ` at the start of a line).
fn markers_left(
    repo: &Repository,
    tree: &git2::Tree<'_>,
    marked: &[String],
) -> Result<Vec<String>, GitError> {
    let mut left = Vec::new();
    for path in marked {
        let Ok(entry) = tree.get_path(Path::new(path)) else {
            continue;
        };
        let Ok(blob) = repo.find_blob(entry.id()) else {
            continue;
        };
        let content = blob.content();
        if has_marker(&content[..content.len().min(MAX_MARKER_SCAN_BYTES)]) {
            left.push(path.clone());
        }
    }
    Ok(left)
}

/// Whether `text` has a line starting with a conflict marker.
pub fn has_marker(text: &[u8]) -> bool {
    text.split(|b| *b == b'\n').any(|line| {
        [&b"<<<<<<< "[..], b">>>>>>> ", b"||||||| "]
            .iter()
            .any(|m| line.starts_with(m))
            || line == b"<<<<<<<"
            || line == b">>>>>>>"
    })
}

/// `git2::IndexEntry` is not `Clone`.
fn copy_entry(e: &git2::IndexEntry) -> git2::IndexEntry {
    git2::IndexEntry {
        ctime: e.ctime,
        mtime: e.mtime,
        dev: e.dev,
        ino: e.ino,
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        file_size: e.file_size,
        id: e.id,
        flags: e.flags,
        flags_extended: e.flags_extended,
        path: e.path.clone(),
    }
}

fn is_binary(repo: &Repository, id: Oid) -> Result<bool, GitError> {
    Ok(repo.find_blob(id).map_err(other)?.is_binary())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_found_at_the_start_of_a_line_only() {
        assert!(has_marker(
            b"a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\n"
        ));
        assert!(has_marker(b">>>>>>> main"));
        assert!(!has_marker(b"a\n=======\nheading\n"));
        assert!(!has_marker(b"x <<<<<<< y\n"));
        assert!(!has_marker(b""));
    }
}
