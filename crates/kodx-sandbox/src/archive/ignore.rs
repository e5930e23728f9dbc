//! The repository's ignore rules, as libgit2 evaluates them, while a tree streams past.

use std::collections::{HashMap, HashSet};
use std::fs;

use tar::EntryType;

use super::bounded::{read_exact_vec, tar_error, untrusted_archive};
use super::limits::{
    io_at, unsafe_archive, ArchiveLimits, Open, MAX_IGNORE_FILE, MAX_IGNORE_TOTAL,
};
use super::names::ancestors;
use super::pack::sha256_of;
use crate::error::{Result, SandboxError};

/// The ignore rules of a tree being read, as libgit2 evaluates them. The `.gitignore` files
/// met in the stream are copied into a scratch repository (made on first use) and libgit2 is
/// asked about each path there; `.git/info/exclude` and the user's global excludes are those
/// a fresh clone on this machine would have.
///
/// Docker writes a tree depth first in byte order, so a directory's `.gitignore` comes
/// before the names that sort after ".gitignore" but after those sorting before it
/// (".cache", "-x"). A decision taken before every rule file that can apply to the path was
/// read is *provisional* and checked again at the end. The root's `.gitignore` is fetched
/// before the stream, so provisional decisions are rare.
#[derive(Default)]
pub(super) struct Ignores {
    pub(super) scratch: Option<(tempfile::TempDir, git2::Repository)>,
    /// Directories whose `.gitignore` was read (or is known to be absent).
    pub(super) known: HashSet<String>,
    /// Every rule file is known already (a second pass): nothing is provisional.
    pub(super) complete: bool,
    /// Directories found ignored (their contents need no question), and whether that
    /// answer was provisional.
    pub(super) dirs: HashMap<String, bool>,
    /// Bytes of rule files read.
    pub(super) bytes: u64,
    /// The root `.gitignore` fetched before the stream: its SHA-256, `None` when absent.
    pub(super) prefetched: Option<Option<[u8; 32]>>,
    /// The stream's root `.gitignore` differs from the one fetched first.
    pub(super) changed: bool,
}

impl Ignores {
    /// Reads the root's `.gitignore` on its own before the tree streams.
    pub(super) fn prefetch_root(&mut self, open: &mut Open, limits: &ArchiveLimits) -> Result<()> {
        let Some(tar) = open(".gitignore")? else {
            self.known.insert(String::new());
            self.prefetched = Some(None);
            return Ok(());
        };
        let mut archive = untrusted_archive(tar, limits.max_stream_bytes);
        let Some(entry) = archive.entries().map_err(tar_error)?.next() else {
            return Ok(());
        };
        let mut entry = entry.map_err(tar_error)?;
        let size = entry.size();
        let regular = matches!(
            entry.header().entry_type(),
            EntryType::Regular | EntryType::Continuous
        );
        if &*entry.path_bytes() != b".gitignore" || !regular {
            // A symlink or directory: git reads no rules from it, and neither do we.
            self.known.insert(String::new());
            self.prefetched = Some(None);
            return Ok(());
        }
        if size > MAX_IGNORE_FILE.min(limits.max_file_bytes) {
            return Ok(()); // too big to read: the root stays provisional
        }
        let data = read_exact_vec(&mut entry, size)
            .map_err(|e| unsafe_archive(format!("\".gitignore\": {e}")))?;
        self.load("", &data)?;
        self.prefetched = Some(Some(sha256_of(&data)));
        Ok(())
    }

    /// Takes the rules of the `.gitignore` in `dir` ("" for the root).
    pub(super) fn load(&mut self, dir: &str, data: &[u8]) -> Result<()> {
        if self.complete {
            return Ok(());
        }
        if dir.is_empty() {
            if let Some(before) = self.prefetched {
                if before != Some(sha256_of(data)) {
                    self.changed = true;
                } else {
                    return Ok(()); // the same file: nothing to learn
                }
            }
        }
        self.known.insert(dir.to_string());
        self.bytes += data.len() as u64;
        if self.bytes > MAX_IGNORE_TOTAL {
            return Ok(()); // too many rules to read: more is kept, never less
        }
        let (scratch, _) = self.scratch()?;
        let path = scratch.path().join(dir).join(".gitignore");
        let written = fs::create_dir_all(path.parent().expect("has a parent"))
            .and_then(|()| fs::write(&path, data));
        written.map_err(io_at("copying the ignore rules to", &path))
    }

    pub(super) fn scratch(&mut self) -> Result<&(tempfile::TempDir, git2::Repository)> {
        if self.scratch.is_none() {
            let dir = tempfile::Builder::new()
                .prefix("kodx-ignore-")
                .tempdir()
                .map_err(|e| SandboxError::io("creating a scratch directory", e))?;
            let repo = git2::Repository::init(dir.path()).map_err(|e| {
                SandboxError::InvalidInput(format!(
                    "creating a scratch repository for the ignore rules: {}",
                    e.message()
                ))
            })?;
            self.scratch = Some((dir, repo));
        }
        Ok(self.scratch.as_ref().expect("just made"))
    }

    /// libgit2's answer for `rel` (a directory when `is_dir`).
    pub(super) fn query(&mut self, rel: &str, is_dir: bool) -> Result<bool> {
        let (_, repo) = self.scratch()?;
        let path = if is_dir {
            format!("{rel}/")
        } else {
            rel.to_string()
        };
        repo.is_path_ignored(&path).map_err(|e| {
            SandboxError::InvalidInput(format!(
                "checking the ignore rules for {rel:?}: {}",
                e.message()
            ))
        })
    }

    /// Whether `rel` is ignored, and whether that answer is provisional. The contents of an
    /// ignored directory are ignored without a question (git never looks inside).
    pub(super) fn decide(&mut self, rel: &str, is_dir: bool) -> Result<(bool, bool)> {
        for dir in ancestors(rel) {
            if let Some(&provisional) = self.dirs.get(dir) {
                return Ok((true, provisional));
            }
        }
        let provisional = !self.complete && !self.settled(rel);
        let ignored = self.query(rel, is_dir)?;
        if ignored && is_dir {
            self.dirs.insert(rel.to_string(), provisional);
        }
        Ok((ignored, provisional))
    }

    /// True when no `.gitignore` that applies to `rel` can come later in the stream: at
    /// each level, the directory's rule file was read or sorts before the next component.
    pub(super) fn settled(&self, rel: &str) -> bool {
        let mut dir = "";
        let mut start = 0;
        for part in rel.split('/') {
            if part < ".gitignore" && !self.known.contains(dir) {
                return false;
            }
            dir = &rel[..start + part.len()];
            start += part.len() + 1;
        }
        true
    }

    /// The final answer, every rule file being known: an ignored ancestor directory
    /// ignores everything under it. `cache` holds the directories asked about.
    pub(super) fn finally(
        &mut self,
        rel: &str,
        is_dir: bool,
        cache: &mut HashMap<String, bool>,
    ) -> Result<bool> {
        for dir in ancestors(rel) {
            let ignored = match cache.get(dir) {
                Some(&v) => v,
                None => {
                    let v = self.query(dir, true)?;
                    cache.insert(dir.to_string(), v);
                    v
                }
            };
            if ignored {
                return Ok(true);
            }
        }
        self.query(rel, is_dir)
    }
}

#[cfg(test)]
mod tests {
    use crate::archive::testutil::*;
    use crate::archive::{
        change_set, change_set_from, memory_opener, pack_dir, ChangeKind, Manifest, NewEntry,
    };
    use tempfile::TempDir;

    #[test]
    fn rules_that_come_later_in_the_stream_still_apply() {
        // Docker writes "-x" and ".cache" before ".gitignore": decisions about them are
        // provisional and taken again once the directory's rules are known.
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, "sub/keep.txt", "k", 0o644);
        let (_, baseline) = pack_dir(&orig, "repo").unwrap();
        let new = tmp.path().join("new");
        put(&new, "sub/keep.txt", "k", 0o644);
        put(&new, "sub/.gitignore", "*.tmp\n/.cache/\n", 0o644);
        sized(&new, "sub/-early.tmp", 5000);
        sized(&new, "sub/.cache/blob", 5000);
        put(&new, "sub/-early.txt", "wanted", 0o640);
        put(&new, "sub/late.tmp", "ignored", 0o644);
        put(&new, ".aaa/.gitignore", "!x\n", 0o644); // root has no rules at all
        put(&new, ".aaa/x", "x", 0o644);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let order: Vec<String> = tar::Archive::new(tar.as_slice())
            .entries()
            .unwrap()
            .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
            .collect();
        let pos = |p: &str| order.iter().position(|n| n == p).unwrap();
        assert!(pos("repo/sub/-early.tmp") < pos("repo/sub/.gitignore"));
        assert!(pos("repo/sub/.cache/blob") < pos("repo/sub/.gitignore"));

        let set = change_set(&tar, "repo", &baseline, &small_limits()).unwrap();
        assert_eq!(
            paths(&set),
            [
                "added .aaa/.gitignore",
                "added .aaa/x",
                "added sub/-early.txt",
                "added sub/.gitignore",
            ]
        );
        let early = set
            .changes
            .iter()
            .find(|c| c.path == "sub/-early.txt")
            .unwrap();
        let ChangeKind::Added(NewEntry::File { mode, contents }) = &early.kind else {
            panic!("{early:?}")
        };
        assert_eq!(
            (*mode, contents.to_vec().unwrap()),
            (0o640, b"wanted".to_vec())
        );
    }

    #[test]
    fn a_root_gitignore_that_comes_late_is_fetched_first() {
        // The root's rules are read before the stream, so "-big" (before ".gitignore")
        // is decided at once and never read.
        let tmp = TempDir::new().unwrap();
        let new = tmp.path().join("new");
        put(&new, ".gitignore", "-big\n.build/\n", 0o644);
        sized(&new, "-big", 5000);
        sized(&new, ".build/debug/app", 5000);
        put(&new, "a.txt", "a", 0o644);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let mut asked = Vec::new();
        let mut inner = memory_opener(&tar, "repo");
        let mut open = |p: &str| {
            asked.push(p.to_string());
            inner(p)
        };
        let set =
            change_set_from(&mut open, "repo", &Manifest::default(), &small_limits()).unwrap();
        assert_eq!(paths(&set), ["added .gitignore", "added a.txt"]);
        assert_eq!(
            asked,
            [".gitignore", ""],
            "no second reading, nothing fetched again"
        );
    }
}
