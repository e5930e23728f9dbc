//! Committing what changed: from a work tree on disk ([`commit_all`]) or from a change set
//! the container reported, for a clone without files ([`commit_change_set`]), and the
//! commit message kodx writes.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{ErrorCode, IndexAddOption, Oid, Repository, Signature, Status, StatusOptions};

use crate::sandbox::archive::{Change, ChangeKind, ChangeSet, NewEntry};

use super::error::GitError;
use super::session::other;

/// A git author or committer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub email: String,
}

/// What [`commit_all`] commits, and how.
#[derive(Debug, Clone)]
pub struct CommitRequest<'a> {
    /// Author and committer, e.g. `kodx[bot] <123+kodx[bot]@users.noreply.github.com>`.
    pub author: Identity,
    /// The subject line: made one line without control characters, and cut to
    /// [`MAX_SUBJECT_CHARS`] characters (ending in `…`) when longer.
    pub subject: &'a str,
    /// Free text after the subject; may be empty.
    pub body: &'a str,
    /// `(key, value)` trailers, e.g. `("Co-authored-by", "alice <1005+alice@users.noreply.github.com>")`.
    /// Keys are letters, digits and `-`; values are made one line.
    pub trailers: &'a [(String, String)],
    /// A changed file larger than this refuses the commit.
    pub max_file_bytes: u64,
}

/// The commit [`commit_all`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub sha: String,
    pub files_changed: usize,
    /// The paths added, modified or deleted, sorted.
    pub paths: Vec<String>,
}

/// The longest commit subject [`commit_all`] writes, in characters.
pub const MAX_SUBJECT_CHARS: usize = 72;

/// Stages every change in the work tree of `repo_dir` relative to `HEAD` — additions,
/// modifications (content and executable bit), deletions, symlinks — except paths the
/// repository ignores (`.gitignore`, `.git/info/exclude`; a file already tracked stays
/// tracked even if it matches), and commits it on the current branch with `req.author` as
/// author and committer. `Ok(None)` when there is nothing to commit.
///
/// A changed file over `req.max_file_bytes` is [`GitError::TooLarge`], found before anything
/// is staged. An embedded repository (a directory with its own `.git`, e.g. a dependency
/// the agent cloned) is left out with a warning in the log. Hooks are never run.
pub fn commit_all(repo_dir: &Path, req: &CommitRequest<'_>) -> Result<Option<Committed>, GitError> {
    let repo = Repository::open(repo_dir).map_err(other)?;
    if repo.is_bare() {
        return Err(GitError::Other(format!(
            "{} is a bare repository",
            repo_dir.display()
        )));
    }
    let signature = signature_of(req)?;
    let message = commit_message(req)?;
    let parent = head_parent(&repo)?;

    check_sizes(&repo, req.max_file_bytes)?;

    let tree_id = stage_work_tree(&repo)?;

    let old_tree = parent
        .as_ref()
        .map(|c| c.tree())
        .transpose()
        .map_err(other)?;
    let committed = commit_tree(
        &repo,
        parent.as_ref(),
        old_tree.as_ref(),
        tree_id,
        &signature,
        &message,
    )?;
    Ok(committed.map(|(committed, _)| committed))
}

/// Stages every change of the work tree in the repository's index (an embedded repository
/// left out) and writes the index's tree.
pub(super) fn stage_work_tree(repo: &Repository) -> Result<Oid, GitError> {
    let workdir = repo
        .workdir()
        .ok_or_else(|| GitError::Other("the repository has no work tree".into()))?
        .to_path_buf();
    let mut index = repo.index().map_err(other)?;
    // libgit2 offers a directory only for an embedded repository (a directory with its own
    // `.git`), which it cannot add: it stays out, as an ignored file would.
    let mut skip_embedded = |path: &Path, _spec: &[u8]| -> i32 {
        let is_dir = std::fs::symlink_metadata(workdir.join(path)).is_ok_and(|m| m.is_dir());
        if is_dir {
            tracing::warn!(path = %path.display(), "not committing an embedded git repository");
            1
        } else {
            0
        }
    };
    index
        .add_all(["*"], IndexAddOption::DEFAULT, Some(&mut skip_embedded))
        .map_err(other)?;
    index.update_all(["*"], None).map_err(other)?;
    let tree_id = index.write_tree().map_err(other)?;
    index.write().map_err(other)?;
    Ok(tree_id)
}

/// As [`commit_all`], for a clone whose files are not on disk
/// ([`clone_from_mirror`](super::clone_from_mirror) without files): the new tree is
/// `HEAD`'s tree with `changes` applied — what the container changed against the tree it
/// was given, already without the paths its `.gitignore` files ignore — built in memory
/// from the objects, and committed on the current branch. `Ok(None)` when the tree does
/// not change.
///
/// The same tree as applying the change set to a checkout and calling [`commit_all`]
/// (tests/it/repo_cache_commit.rs): a file with any executable bit is `100755`; nothing inside
/// a `.git` at any depth is committed (a change set holds none: its ignore rules leave
/// them out), and should one name `<dir>/.git/...` anyway, all of `<dir>` is left out, as
/// [`commit_all`] leaves out an embedded repository; a file over `req.max_file_bytes` is
/// [`GitError::TooLarge`] before anything is written. Contents are streamed into blobs.
pub fn commit_change_set(
    repo_dir: &Path,
    changes: &ChangeSet,
    req: &CommitRequest<'_>,
) -> Result<Option<Committed>, GitError> {
    let repo = Repository::open(repo_dir).map_err(other)?;
    let signature = signature_of(req)?;
    let message = commit_message(req)?;
    let parent = head_parent(&repo)?;
    let old_tree = parent
        .as_ref()
        .map(|c| c.tree())
        .transpose()
        .map_err(other)?;

    let kept = changes_to_commit(changes, req.max_file_bytes)?;
    let mut index = git2::Index::new().map_err(other)?;
    if let Some(tree) = &old_tree {
        index.read_tree(tree).map_err(other)?;
    }
    for change in &kept {
        apply_change(&repo, &mut index, change)?;
    }
    let tree_id = index.write_tree_to(&repo).map_err(other)?;
    let Some((committed, tree)) = commit_tree(
        &repo,
        parent.as_ref(),
        old_tree.as_ref(),
        tree_id,
        &signature,
        &message,
    )?
    else {
        return Ok(None);
    };
    // The index follows, as after commit_all (the files stay where they were: nowhere).
    let mut on_disk = repo.index().map_err(other)?;
    on_disk.read_tree(&tree).map_err(other)?;
    on_disk.write().map_err(other)?;
    Ok(Some(committed))
}

/// `req.author` as the signature of a commit made now.
pub(super) fn signature_of(req: &CommitRequest<'_>) -> Result<Signature<'static>, GitError> {
    Signature::now(&req.author.name, &req.author.email)
        .map_err(|e| GitError::Other(format!("invalid commit identity: {}", e.message())))
}

/// The commit `HEAD` points at; `None` on an unborn branch.
fn head_parent(repo: &Repository) -> Result<Option<git2::Commit<'_>>, GitError> {
    match repo.head() {
        Ok(head) => Ok(Some(head.peel_to_commit().map_err(other)?)),
        Err(e) if e.code() == ErrorCode::UnbornBranch => Ok(None),
        Err(e) => Err(other(e)),
    }
}

/// The changes of `changes` to commit: a path that is not plain and relative, or inside the
/// top `.git`, refuses the commit, as does a file over `max_file_bytes`; anything inside a
/// `.git` deeper down is left out, and so is all of a directory holding one (an embedded
/// repository, with a warning in the log).
pub(super) fn changes_to_commit(
    changes: &ChangeSet,
    max_file_bytes: u64,
) -> Result<Vec<&Change>, GitError> {
    let embedded = embedded_repositories(changes);
    let mut kept = Vec::new();
    for change in &changes.changes {
        let path = change.path.as_str();
        let segments: Vec<&str> = path.split('/').collect();
        if path.starts_with('/') || segments.iter().any(|seg| matches!(*seg, "" | "." | "..")) {
            return Err(GitError::Other(format!(
                "refusing the change to `{path}`: not a plain relative path"
            )));
        }
        if segments[0].eq_ignore_ascii_case(".git") {
            return Err(GitError::Other(format!(
                "refusing the change to `{path}`: paths inside .git are never committed"
            )));
        }
        if let Some(dir) = embedded.iter().find(|d| path.starts_with(&format!("{d}/"))) {
            if path == format!("{dir}/.git") || path.starts_with(&format!("{dir}/.git/")) {
                tracing::warn!(path = %dir, "not committing an embedded git repository");
            }
            continue;
        }
        if segments.iter().any(|seg| seg.eq_ignore_ascii_case(".git")) {
            continue;
        }
        if let ChangeKind::Added(NewEntry::File { contents, .. })
        | ChangeKind::Modified {
            new: NewEntry::File { contents, .. },
            ..
        } = &change.kind
        {
            if contents.len() > max_file_bytes {
                return Err(GitError::TooLarge {
                    path: path.to_string(),
                    bytes: contents.len(),
                    limit: max_file_bytes,
                });
            }
        }
        kept.push(change);
    }
    Ok(kept)
}

/// The directories of `changes` holding their own `.git` (an embedded repository).
fn embedded_repositories(changes: &ChangeSet) -> Vec<&str> {
    changes
        .changes
        .iter()
        .filter_map(|c| {
            let at = c.path.find("/.git/").or_else(|| {
                c.path
                    .ends_with("/.git")
                    .then(|| c.path.len() - "/.git".len())
            })?;
            Some(&c.path[..at])
        })
        .collect()
}

/// Applies one change to `index`: a deletion removes the path; a new or modified entry is
/// stored as a blob of `repo` and replaces whatever was at, under or above it.
pub(super) fn apply_change(
    repo: &Repository,
    index: &mut git2::Index,
    change: &Change,
) -> Result<(), GitError> {
    let path = change.path.as_str();
    let new = match &change.kind {
        ChangeKind::Deleted => {
            if index.get_path(Path::new(path), 0).is_some() {
                index.remove_path(Path::new(path)).map_err(other)?;
            }
            return Ok(());
        }
        ChangeKind::Added(new) | ChangeKind::Modified { new, .. } => new,
    };
    let (id, mode) = store_blob(repo, path, new)?;
    clear_for(index, path)?;
    index
        .add(&git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode,
            uid: 0,
            gid: 0,
            file_size: 0,
            id,
            flags: 0,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        })
        .map_err(other)
}

/// Stores the new entry at `path` as a blob (a file's contents streamed in) and names its
/// mode: `120000` for a symlink, `100755` for a file with any executable bit, else `100644`.
fn store_blob(repo: &Repository, path: &str, new: &NewEntry) -> Result<(Oid, u32), GitError> {
    Ok(match new {
        NewEntry::Symlink { target } => (repo.blob(target.as_bytes()).map_err(other)?, 0o120000),
        NewEntry::File { mode, contents } => {
            let mut writer = repo.blob_writer(None).map_err(other)?;
            let mut reader = contents.reader().map_err(|e| {
                GitError::Other(format!("cannot read the new contents of `{path}`: {e}"))
            })?;
            std::io::copy(&mut reader, &mut writer).map_err(|e| {
                GitError::Other(format!("cannot store the new contents of `{path}`: {e}"))
            })?;
            let id = writer.commit().map_err(other)?;
            (
                id,
                if mode & 0o111 != 0 {
                    0o100755
                } else {
                    0o100644
                },
            )
        }
    })
}

/// Makes room in `index` for a file or symlink at `path`: it replaces whatever was at or
/// under it, and any file where one of its parent directories now goes.
fn clear_for(index: &mut git2::Index, path: &str) -> Result<(), GitError> {
    index.remove_dir(Path::new(path), 0).map_err(other)?;
    if index.get_path(Path::new(path), 0).is_some() {
        index.remove_path(Path::new(path)).map_err(other)?;
    }
    let mut ancestor = path;
    while let Some((parent, _)) = ancestor.rsplit_once('/') {
        if index.get_path(Path::new(parent), 0).is_some() {
            index.remove_path(Path::new(parent)).map_err(other)?;
        }
        ancestor = parent;
    }
    Ok(())
}

/// Commits the tree `tree_id` on `HEAD` over `parent` (whose tree is `old_tree`), naming
/// the paths that changed; `None` when the tree is the parent's, or empty on an unborn
/// branch. Shared by [`commit_all`] and [`commit_change_set`].
fn commit_tree<'r>(
    repo: &'r Repository,
    parent: Option<&git2::Commit<'r>>,
    old_tree: Option<&git2::Tree<'r>>,
    tree_id: git2::Oid,
    signature: &git2::Signature<'_>,
    message: &str,
) -> Result<Option<(Committed, git2::Tree<'r>)>, GitError> {
    if old_tree.map(|t| t.id()) == Some(tree_id) {
        return Ok(None);
    }
    let tree = repo.find_tree(tree_id).map_err(other)?;
    if old_tree.is_none() && tree.is_empty() {
        return Ok(None);
    }
    let diff = repo
        .diff_tree_to_tree(old_tree, Some(&tree), None)
        .map_err(other)?;
    let mut paths: Vec<String> = diff
        .deltas()
        .filter_map(|d| d.new_file().path().or(d.old_file().path()))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    paths.sort();
    paths.dedup();

    let parents: Vec<&git2::Commit<'_>> = parent.into_iter().collect();
    let sha = repo
        .commit(Some("HEAD"), signature, signature, message, &tree, &parents)
        .map_err(other)?;
    Ok(Some((
        Committed {
            sha: sha.to_string(),
            files_changed: paths.len(),
            paths,
        },
        tree,
    )))
}

/// Fails with [`GitError::TooLarge`] for the first changed, not ignored file over `limit`.
pub(super) fn check_sizes(repo: &Repository, limit: u64) -> Result<(), GitError> {
    let workdir = repo
        .workdir()
        .ok_or_else(|| GitError::Other("the repository has no work tree".into()))?;
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    let statuses = repo.statuses(Some(&mut opts)).map_err(other)?;
    let mut changed: Vec<Vec<u8>> = statuses
        .iter()
        .filter(|s| !s.status().is_empty() && !s.status().contains(Status::IGNORED))
        .map(|s| s.path_bytes().to_vec())
        .collect();
    changed.sort();
    for path in changed {
        let full = workdir.join(std::ffi::OsStr::from_bytes(&path));
        let Ok(meta) = std::fs::symlink_metadata(full) else {
            continue; // deleted
        };
        // A directory here is an embedded repository, which is not committed.
        if !meta.is_dir() && meta.len() > limit {
            return Err(GitError::TooLarge {
                path: String::from_utf8_lossy(&path).into_owned(),
                bytes: meta.len(),
                limit,
            });
        }
    }
    Ok(())
}

/// `subject`, a blank line, the body (if any), a blank line and the trailers (if any).
pub(super) fn commit_message(req: &CommitRequest<'_>) -> Result<String, GitError> {
    let mut message = clean_subject(req.subject);
    if message.is_empty() {
        message.push_str("Apply changes");
    }
    message.push('\n');
    let body = clean_body(req.body);
    if !body.is_empty() {
        message.push('\n');
        message.push_str(&body);
        message.push('\n');
    }
    let mut trailers = String::new();
    for (key, value) in req.trailers {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(GitError::Other(format!(
                "invalid commit trailer key `{key}`"
            )));
        }
        let value = one_line(value);
        if !value.is_empty() {
            trailers.push_str(&format!("{key}: {value}\n"));
        }
    }
    if !trailers.is_empty() {
        message.push('\n');
        message.push_str(&trailers);
    }
    Ok(message)
}

/// `text` on one line: every run of whitespace or control characters becomes one space.
fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// One line of at most [`MAX_SUBJECT_CHARS`] characters, ending in `…` when cut.
fn clean_subject(subject: &str) -> String {
    let line = one_line(subject);
    if line.chars().count() <= MAX_SUBJECT_CHARS {
        return line;
    }
    let cut: String = line.chars().take(MAX_SUBJECT_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// The body with `\n` line ends, no other control characters but tabs, no trailing spaces.
fn clean_body(body: &str) -> String {
    body.replace("\r\n", "\n")
        .split(['\n', '\r'])
        .map(|line| {
            line.chars()
                .filter(|c| *c == '\t' || !c.is_control())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
        .trim_matches('\n')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_one_line_and_cut_at_72_chars() {
        assert_eq!(
            clean_subject("  Fix\tthe\n\nparser\u{7} "),
            "Fix the parser"
        );
        let long = "é".repeat(100);
        let cut = clean_subject(&long);
        assert_eq!(cut.chars().count(), MAX_SUBJECT_CHARS);
        assert_eq!(cut, format!("{}…", "é".repeat(71)));
        let exact = "a".repeat(72);
        assert_eq!(clean_subject(&exact), exact);
        // No space before the ellipsis.
        let spaced = format!("{} tail", "a".repeat(70));
        assert_eq!(clean_subject(&spaced), format!("{}…", "a".repeat(70)));
    }

    fn req<'a>(
        subject: &'a str,
        body: &'a str,
        trailers: &'a [(String, String)],
    ) -> CommitRequest<'a> {
        CommitRequest {
            author: Identity {
                name: "kodx[bot]".into(),
                email: "1+kodx[bot]@users.noreply.github.com".into(),
            },
            subject,
            body,
            trailers,
            max_file_bytes: 1,
        }
    }

    #[test]
    fn commit_messages() {
        let trailers = vec![
            (
                "Co-authored-by".to_string(),
                "alice\n <1+alice@users.noreply.github.com>\r".to_string(),
            ),
            ("Kodx-Run".to_string(), "r-1".to_string()),
            ("Empty".to_string(), " \n".to_string()),
        ];
        assert_eq!(
            commit_message(&req("Subject", "\r\nline one  \r\n\u{1b}[31mline two\n\n", &trailers)).unwrap(),
            "Subject\n\nline one\n[31mline two\n\nCo-authored-by: alice <1+alice@users.noreply.github.com>\nKodx-Run: r-1\n"
        );
        assert_eq!(
            commit_message(&req("Subject", " \n", &trailers[1..2])).unwrap(),
            "Subject\n\nKodx-Run: r-1\n"
        );
        assert_eq!(
            commit_message(&req("S", "Body", &[])).unwrap(),
            "S\n\nBody\n"
        );
        assert_eq!(
            commit_message(&req("\n", "", &[])).unwrap(),
            "Apply changes\n"
        );
        let bad = vec![("Bad: key".to_string(), "v".to_string())];
        assert!(commit_message(&req("S", "", &bad)).is_err());
        let bad = vec![("Bad\nKey".to_string(), "v".to_string())];
        assert!(commit_message(&req("S", "", &bad)).is_err());
    }
}
