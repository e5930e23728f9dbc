//! Reading a commit's files from a local repository (the repository cache's mirror), with
//! no network: the listing of its tree and the start of a blob, as GitHub's recursive tree
//! and raw blob calls give them. A commit's tree is the same wherever it is read.

use std::path::Path;

use git2::{ObjectType, Oid, Repository, TreeWalkMode, TreeWalkResult};

use super::error::GitError;
use super::session::other;

/// One entry of a commit's tree: its path from the root, git's mode, its object id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalEntry {
    pub path: String,
    pub mode: i32,
    pub sha: String,
}

/// Every entry of `commit`'s tree in the repository at `repo_dir`, depth first (the order
/// of GitHub's recursive listing); `None` when the repository does not hold the commit or
/// any of its trees (a shallow mirror fetched at another tip). Names that are not UTF-8
/// are left out, as GitHub's JSON cannot carry them either.
pub fn commit_tree(repo_dir: &Path, commit: &str) -> Result<Option<Vec<LocalEntry>>, GitError> {
    let Ok(id) = Oid::from_str(commit) else {
        return Ok(None);
    };
    let repo = Repository::open(repo_dir).map_err(other)?;
    let Ok(commit) = repo.find_commit(id) else {
        return Ok(None);
    };
    let Ok(tree) = commit.tree() else {
        return Ok(None);
    };
    let mut entries = Vec::new();
    let walked = tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        let Ok(name) = entry.name() else {
            return TreeWalkResult::Skip;
        };
        entries.push(LocalEntry {
            path: format!("{dir}{name}"),
            mode: entry.filemode(),
            sha: entry.id().to_string(),
        });
        TreeWalkResult::Ok
    });
    // A tree the repository lacks (it never fetched this commit whole) stops the walk.
    Ok(walked.is_ok().then_some(entries))
}

/// The first `max` bytes of blob `sha` in the repository at `repo_dir`, whether it has
/// more, and its whole size; `None` when the repository does not hold it.
pub fn blob_head(
    repo_dir: &Path,
    sha: &str,
    max: usize,
) -> Result<Option<(Vec<u8>, bool, u64)>, GitError> {
    let Ok(id) = Oid::from_str(sha) else {
        return Ok(None);
    };
    let repo = Repository::open(repo_dir).map_err(other)?;
    let odb = repo.odb().map_err(other)?;
    let Ok(object) = odb.read(id) else {
        return Ok(None);
    };
    if object.kind() != ObjectType::Blob {
        return Ok(None);
    }
    let data = object.data();
    let head = data[..data.len().min(max)].to_vec();
    Ok(Some((head, data.len() > max, data.len() as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository with `a`, `d/b` (executable) and a link `l -> a`, committed.
    fn repo() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let blob = |data: &[u8]| repo.blob(data).unwrap();
        let mut sub = repo.treebuilder(None).unwrap();
        sub.insert("b", blob(b"bee\n"), 0o100755).unwrap();
        let sub = sub.write().unwrap();
        let mut root = repo.treebuilder(None).unwrap();
        root.insert("a", blob(b"0123456789"), 0o100644).unwrap();
        root.insert("d", sub, 0o040000).unwrap();
        root.insert("l", blob(b"a"), 0o120000).unwrap();
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        let who = git2::Signature::now("t", "t@example.com").unwrap();
        let commit = repo.commit(None, &who, &who, "c", &tree, &[]).unwrap();
        (dir, commit.to_string())
    }

    #[test]
    fn lists_a_commit_and_reads_its_blobs() {
        let (dir, commit) = repo();
        let entries = commit_tree(dir.path(), &commit).unwrap().unwrap();
        let listed: Vec<(&str, i32)> = entries.iter().map(|e| (e.path.as_str(), e.mode)).collect();
        assert_eq!(
            listed,
            [
                ("a", 0o100644),
                ("d", 0o040000),
                ("d/b", 0o100755),
                ("l", 0o120000)
            ]
        );
        let a = &entries[0].sha;
        assert_eq!(
            blob_head(dir.path(), a, 4).unwrap().unwrap(),
            (b"0123".to_vec(), true, 10)
        );
        assert_eq!(
            blob_head(dir.path(), a, 10).unwrap().unwrap(),
            (b"0123456789".to_vec(), false, 10)
        );
        // A tree is not a blob; an unknown commit or blob is not there.
        assert_eq!(blob_head(dir.path(), &entries[1].sha, 4).unwrap(), None);
        let unknown = "0123456789012345678901234567890123456789";
        assert_eq!(blob_head(dir.path(), unknown, 4).unwrap(), None);
        assert_eq!(commit_tree(dir.path(), unknown).unwrap(), None);
        assert_eq!(commit_tree(dir.path(), "main").unwrap(), None);
    }
}
