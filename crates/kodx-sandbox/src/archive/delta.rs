//! The delta between two tip-only checkouts: what turns a container holding
//! [`pack_tip_to`]'s copy of commit `base` into the one it would make of the clone's `HEAD`
//! now, as a list of paths to remove and a small tar ([`plan_tip_delta`]).
//!
//! The plan is a diff of the two trees that does not enter subtrees with equal ids, and
//! reads no blob but the changed ones' headers (and changed symlinks). The tar holds the
//! changed work-tree entries, the clone's `.git` outside its object store (small: `HEAD`,
//! config, refs, index) with a new `shallow`, and a second pack beside the one the
//! container has: the new commit and the trees and blobs of the new tree that the old tree
//! did not hold where the diff looked. A chain of deltas works the same way: the container
//! holds every object of `base`'s tree, in one pack or several.
//!
//! [`pack_tip_to`]: super::pack_tip_to

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::limits::ArchiveLimits;
use super::manifest::{Manifest, ManifestEntry};
use super::names::{check_rel, is_git};
use super::pack::{Packer, Skipped};
use super::tip::TipPack;
use super::treecheck::{
    missing, read_blob, refused, symlink_size, symlink_target, tree_path, TreeBudget,
};
use crate::error::{Result, SandboxError};

/// What turns a container holding a tip-only checkout of `base` into one of the clone's
/// `HEAD` ([`plan_tip_delta`]).
#[derive(Debug)]
pub struct TipDelta {
    repo_dir: PathBuf,
    limits: ArchiveLimits,
    base: git2::Oid,
    head: git2::Oid,
    have: Manifest,
    removed: Vec<String>,
    /// Work-tree entries to write, parents before children.
    writes: Vec<Written>,
    /// Trees of the new tree the diff entered (their ids changed): into the pack.
    trees: Vec<git2::Oid>,
    /// Objects of the old tree the diff met: the container has them.
    known: HashSet<git2::Oid>,
}

/// One work-tree entry the delta writes.
#[derive(Debug)]
struct Written {
    rel: String,
    id: git2::Oid,
    filemode: i32,
    /// False under a new directory whose tree the container has already (a directory
    /// renamed as it was): its objects stay out of the pack.
    pack: bool,
}

/// Plans the delta from the tip-only checkout of commit `base` (hex id), whose manifest as
/// [`pack_tip_to`] returned it is `have`, to the one [`pack_tip_to`] would make of the
/// repository at `repo_dir` now. Cheap: a tree diff that does not enter subtrees with equal
/// ids, reading the headers of the changed blobs (and changed symlinks' targets) only.
///
/// `Ok(None)` when no delta can be made and the caller copies the whole tip: `base` is not
/// a commit in the clone's objects (never fetched, or gone), or more than `max_changes`
/// work-tree entries differ (removed paths and written entries, each entry under a new
/// directory counted). The new tree is held to what [`pack_tip_to`] holds it to, every
/// limit over the whole resulting tree (`have` plus the changes), so that the plan
/// refuses what [`TipDelta::pack_to`] would refuse. The old tree is held to the same
/// names (what it removes runs as `rm -rf` in the container), and an error also when `have`
/// lacks a path the delta removes: `have` does not describe `base`.
///
/// [`pack_tip_to`]: super::pack_tip_to
pub fn plan_tip_delta(
    repo_dir: &Path,
    base: &str,
    have: &Manifest,
    limits: &ArchiveLimits,
    max_changes: usize,
) -> Result<Option<TipDelta>> {
    let git = |what: &str, e: git2::Error| {
        SandboxError::InvalidInput(format!("{what} in {}: {}", repo_dir.display(), e.message()))
    };
    let base_id = git2::Oid::from_str(base)
        .map_err(|_| SandboxError::InvalidInput(format!("{base:?} is not a commit id")))?;
    let repo = git2::Repository::open(repo_dir).map_err(|e| git("opening the repository", e))?;
    let old = match repo.find_commit(base_id) {
        Ok(commit) => commit,
        Err(e)
            if matches!(
                e.code(),
                git2::ErrorCode::NotFound | git2::ErrorCode::Invalid
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(git("reading the base commit", e)),
    };
    let new = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| git("reading HEAD", e))?;
    let old_tree = old.tree().map_err(|e| git("reading the base's tree", e))?;
    let new_tree = new.tree().map_err(|e| git("reading HEAD's tree", e))?;
    let mut diff = Diff {
        repo: &repo,
        max: max_changes,
        removed: Vec::new(),
        writes: Vec::new(),
        trees: Vec::new(),
        known: HashSet::new(),
    };
    if old_tree.id() != new_tree.id() {
        diff.known.insert(old_tree.id());
        diff.trees.push(new_tree.id());
        if !diff.trees_differ(&old_tree, &new_tree, "")? {
            return Ok(None);
        }
    }
    let odb = repo.odb().map_err(|e| git("opening the objects", e))?;
    diff.removed.extend(stale_git(have, repo.path()));
    diff.removed.sort();
    unpack_known(&mut diff.writes, &diff.known);
    check_budget(&odb, have, &diff.removed, &diff.writes, limits)?;
    Ok(Some(TipDelta {
        repo_dir: repo_dir.to_path_buf(),
        limits: limits.clone(),
        base: old.id(),
        head: new.id(),
        have: have.clone(),
        removed: diff.removed,
        writes: diff.writes,
        trees: diff.trees,
        known: diff.known,
    }))
}

impl TipDelta {
    /// The commit the delta brings the checkout to (the clone's `HEAD`), in hex.
    pub fn commit(&self) -> String {
        self.head.to_string()
    }

    /// Paths (relative to the checkout's root, as the manifest's) to remove, with what is
    /// under them, before the tar goes in: entries of `have` the new tree lacks, and entries
    /// whose kind changes (file, symlink, directory, submodule); under `.git`, outside its
    /// objects, what the clone's `.git` no longer has or has as another kind (a ref
    /// deleted, a file become a directory). Sorted; none lies under another, and each is a
    /// path of `have`.
    pub fn removed(&self) -> &[String] {
        &self.removed
    }

    /// Work-tree entries the tar writes (added or changed), for logs.
    pub fn changed(&self) -> usize {
        self.writes.len()
    }

    /// Writes the tar to `out`: its entries under `prefix/` (a directory entry for `prefix`
    /// first), headers as [`pack_tip_to`] writes them (uid/gid 0, the mode, the commit's
    /// time, symlinks verbatim), ending with the two zero blocks. Returns the manifest of
    /// what the container holds once [`TipDelta::removed`] is gone and the tar is in:
    /// `have` without the removed paths, with the written entries; its work-tree part
    /// equals what [`pack_tip_to`] would return now.
    ///
    /// [`pack_tip_to`]: super::pack_tip_to
    pub fn pack_to<W: Write>(self, prefix: &str, out: W) -> Result<Manifest> {
        if !prefix.is_empty() {
            check_rel(prefix).map_err(|why| {
                SandboxError::InvalidInput(format!("bad archive prefix {prefix:?}: {why}"))
            })?;
        }
        let git = |what: &str, e: git2::Error| {
            SandboxError::InvalidInput(format!(
                "{what} in {}: {}",
                self.repo_dir.display(),
                e.message()
            ))
        };
        let repo =
            git2::Repository::open(&self.repo_dir).map_err(|e| git("opening the repository", e))?;
        let odb = repo.odb().map_err(|e| git("opening the objects", e))?;
        let commit = repo
            .find_commit(self.head)
            .map_err(|e| git("reading the new tip", e))?;
        let mtime = u64::try_from(commit.time().seconds()).unwrap_or(0);
        let mut manifest = self.have;
        for rel in &self.removed {
            let gone: Vec<String> = under(&manifest, rel).map(|(p, _)| p.clone()).collect();
            for path in gone {
                manifest.entries.remove(&path);
            }
        }
        let mut packer = Packer {
            builder: tar::Builder::new(out),
            manifest,
            prefix,
            have: None,
            skipped: Skipped::default(),
        };
        packer.prefix_dir(mtime, &self.repo_dir)?;
        packer.dot_git(repo.path(), Some((self.head, mtime)))?;
        let packing = |e: io::Error| SandboxError::io("making the delta's pack", e);
        let mut pack = TipPack::without(self.known).map_err(packing)?;
        let news = (self.head != self.base).then_some(self.head);
        for id in news.into_iter().chain(self.trees.iter().copied()) {
            let o = odb.read(id).map_err(|e| git("reading the new tip", e))?;
            pack.add(id, o.kind(), o.data()).map_err(packing)?;
        }
        let written: HashSet<&str> = self.writes.iter().map(|w| w.rel.as_str()).collect();
        let mut budget = start_budget(&packer.manifest, |p| written.contains(p), &self.limits);
        budget.tip = Some(pack);
        for w in &self.writes {
            budget.count(&w.rel)?;
            let held = if w.pack { None } else { budget.tip.take() };
            let entry = packer.tree_entry(&odb, &w.rel, w.id, w.filemode, mtime, &mut budget);
            if held.is_some() {
                budget.tip = held;
            }
            packer.manifest.entries.insert(w.rel.clone(), entry?);
        }
        if let Some(pack) = budget.tip.take().filter(|p| !p.is_empty()) {
            packer.append_pack(pack, mtime)?;
        }
        packer
            .builder
            .into_inner()
            .and_then(|mut out| out.flush())
            .map_err(|e| SandboxError::io("finishing the tar", e))?;
        Ok(packer.manifest)
    }
}

/// The `.git` paths of `have`, outside the object store and `shallow` (what
/// [`Packer::dot_git`] writes anew), that the clone's `.git` at `dot_git` no longer has,
/// or has as another kind; none under another.
fn stale_git(have: &Manifest, dot_git: &Path) -> Vec<String> {
    let mut stale: Vec<String> = Vec::new();
    for (path, entry) in have.entries() {
        let Some(rest) = path.strip_prefix(".git/") else {
            continue;
        };
        let top = rest.split('/').next().unwrap_or(rest);
        if top == "objects" || top == "shallow" {
            continue;
        }
        let below_stale = stale.iter().any(|s| {
            path.strip_prefix(s.as_str())
                .is_some_and(|r| r.starts_with('/'))
        });
        if below_stale {
            continue;
        }
        let same_kind = fs::symlink_metadata(dot_git.join(rest)).is_ok_and(|m| match entry {
            ManifestEntry::Dir { .. } => m.is_dir(),
            ManifestEntry::File { .. } => m.is_file(),
            ManifestEntry::Symlink { .. } => m.file_type().is_symlink(),
        });
        if !same_kind {
            stale.push(path.to_string());
        }
    }
    stale
}

/// The entry at `rel` of `manifest` and those under it.
fn under<'m>(
    manifest: &'m Manifest,
    rel: &str,
) -> impl Iterator<Item = (&'m String, &'m ManifestEntry)> + 'm {
    let at = manifest.entries.get_key_value(rel);
    // '0' follows '/': the range holds exactly the paths starting with "rel/".
    let below = manifest.entries.range(format!("{rel}/")..format!("{rel}0"));
    at.into_iter().chain(below)
}

/// The budget of a tree that holds the entries of `manifest` but those `skip` names, as
/// [`Packer::walk_tree`] counts it: every entry, and the work tree's names and bytes.
fn start_budget<'l>(
    manifest: &Manifest,
    skip: impl Fn(&str) -> bool,
    limits: &'l ArchiveLimits,
) -> TreeBudget<'l> {
    let mut budget = TreeBudget {
        limits,
        entries: 0,
        bytes: 0,
        names: 0,
        tip: None,
    };
    for (path, entry) in manifest.entries().filter(|(p, _)| !skip(p)) {
        budget.entries += 1;
        if is_git(path) {
            continue;
        }
        budget.names += path.len() as u64;
        if let ManifestEntry::File { size, .. } = entry {
            budget.bytes += size;
        }
    }
    budget
}

/// Holds the tree that `have` less `removed` plus `writes` makes to the limits, and the
/// written symlinks' targets to the rules, reading blob headers only (and symlinks).
fn check_budget(
    odb: &git2::Odb<'_>,
    have: &Manifest,
    removed: &[String],
    writes: &[Written],
    limits: &ArchiveLimits,
) -> Result<()> {
    let mut gone = HashSet::new();
    for rel in removed {
        if have.get(rel).is_none() {
            return Err(not_described(rel));
        }
        gone.extend(under(have, rel).map(|(p, _)| p.as_str()));
    }
    let written: HashSet<&str> = writes.iter().map(|w| w.rel.as_str()).collect();
    let mut budget = start_budget(have, |p| gone.contains(p) || written.contains(p), limits);
    for w in writes {
        budget.count(&w.rel)?;
        match kind(w.filemode) {
            Kind::Symlink => {
                let (size, _) = odb.read_header(w.id).map_err(|e| missing(&w.rel, e))?;
                symlink_size(&w.rel, size)?;
                symlink_target(&w.rel, read_blob(odb, &w.rel, w.id)?.data())?;
            }
            Kind::File(_) => {
                let (size, _) = odb.read_header(w.id).map_err(|e| missing(&w.rel, e))?;
                budget.file(&w.rel, size as u64)?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn not_described(rel: &str) -> SandboxError {
    SandboxError::InvalidInput(format!(
        "the base's manifest lacks `{rel}`, which the base's tree has: \
         it does not describe that commit"
    ))
}

/// Leaves out of the pack what is under a new directory whose tree the container has
/// already (a directory moved as it was): the writes come parents first.
fn unpack_known(writes: &mut [Written], known: &HashSet<git2::Oid>) {
    let mut i = 0;
    while i < writes.len() {
        let (dir, id) = (&writes[i].rel, writes[i].id);
        i += 1;
        if writes[i - 1].filemode != 0o040000 || !known.contains(&id) {
            continue;
        }
        let prefix = format!("{dir}/");
        while i < writes.len() && writes[i].rel.starts_with(&prefix) {
            writes[i].pack = false;
            i += 1;
        }
    }
}

/// A work-tree entry's kind by its git mode: what can change in place and what cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File(u32),
    Symlink,
    Dir,
    Submodule,
    Other(i32),
}

fn kind(filemode: i32) -> Kind {
    match filemode {
        0o100755 => Kind::File(0o755),
        0o100644 | 0o100664 => Kind::File(0o644),
        0o120000 => Kind::Symlink,
        0o040000 => Kind::Dir,
        0o160000 => Kind::Submodule,
        other => Kind::Other(other),
    }
}

/// The diff of two trees under way.
struct Diff<'r> {
    repo: &'r git2::Repository,
    max: usize,
    removed: Vec<String>,
    writes: Vec<Written>,
    trees: Vec<git2::Oid>,
    known: HashSet<git2::Oid>,
}

impl Diff<'_> {
    fn over(&self) -> bool {
        self.removed.len() + self.writes.len() > self.max
    }

    /// Compares the old tree and the new one at `rel`; false once past the most changes.
    fn trees_differ(
        &mut self,
        old: &git2::Tree<'_>,
        new: &git2::Tree<'_>,
        rel: &str,
    ) -> Result<bool> {
        type Side = Option<(git2::Oid, i32)>;
        let mut names: BTreeMap<Vec<u8>, (Side, Side)> = BTreeMap::new();
        for e in old.iter() {
            names.entry(e.name_bytes().to_vec()).or_default().0 = Some((e.id(), e.filemode()));
        }
        for e in new.iter() {
            names.entry(e.name_bytes().to_vec()).or_default().1 = Some((e.id(), e.filemode()));
        }
        names.retain(|_, (o, n)| o != n);
        // The old side first: what the container holds already need not go in again.
        self.known
            .extend(names.values().filter_map(|(o, _)| o.map(|(id, _)| id)));
        for (name, sides) in names {
            let path = tree_path(rel, &name)?;
            match sides {
                (Some((old_id, old_mode)), Some((new_id, new_mode))) => {
                    match (kind(old_mode), kind(new_mode)) {
                        (Kind::Dir, Kind::Dir) => {
                            let o = self.repo.find_tree(old_id).map_err(|e| missing(&path, e))?;
                            let n = self.repo.find_tree(new_id).map_err(|e| missing(&path, e))?;
                            self.trees.push(new_id);
                            if !self.trees_differ(&o, &n, &path)? {
                                return Ok(false);
                            }
                        }
                        // Either way an empty directory in the work tree.
                        (Kind::Submodule, Kind::Submodule) => {}
                        (a, b) if a == b && old_id == new_id => {} // 100644 and 100664
                        (Kind::File(_), Kind::File(_)) | (Kind::Symlink, Kind::Symlink) => {
                            self.write(path, new_id, new_mode)?;
                        }
                        _ => {
                            self.removed.push(path.clone());
                            self.write(path, new_id, new_mode)?;
                        }
                    }
                }
                (Some(_), None) => self.removed.push(path),
                (None, Some((new_id, new_mode))) => self.write(path, new_id, new_mode)?,
                (None, None) => unreachable!("a name comes from one side or the other"),
            }
            if self.over() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records the new entry at `rel`, and all under it for a directory.
    fn write(&mut self, rel: String, id: git2::Oid, filemode: i32) -> Result<()> {
        if let Kind::Other(mode) = kind(filemode) {
            return Err(refused(&rel, format!("an entry of unknown mode {mode:o}")));
        }
        self.writes.push(Written {
            rel: rel.clone(),
            id,
            filemode,
            pack: true,
        });
        if filemode != 0o040000 || self.over() {
            return Ok(());
        }
        let tree = self.repo.find_tree(id).map_err(|e| missing(&rel, e))?;
        for e in tree.iter() {
            let path = tree_path(&rel, e.name_bytes())?;
            self.write(path, e.id(), e.filemode())?;
            if self.over() {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::pack_tip_to;
    use crate::archive::testutil::{put, snapshot, without_git, Snap};
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;
    use std::time::Instant;
    use tempfile::TempDir;

    /// Runs git in `dir` (fixed identity and dates), its output; panics on failure.
    fn git(dir: &Path, args: &[&str]) -> String {
        git_in(dir, args, "")
    }

    fn git_in(dir: &Path, args: &[&str], stdin: &str) -> String {
        use std::io::Write as _;
        let mut child = Command::new("git")
            .args(["-c", "user.name=T", "-c", "user.email=t@example.com"])
            .args(["-c", "init.defaultBranch=main", "-c", "core.autocrlf=false"])
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_DATE", "1700000000 +0000")
            .env("GIT_COMMITTER_DATE", "1700000000 +0000")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn commit(dir: &Path, message: &str) -> String {
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-q", "--allow-empty", "-m", message]);
        git(dir, &["rev-parse", "HEAD"]).trim().to_string()
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn tip(repo: &Path) -> (Vec<u8>, Manifest) {
        let mut tar = Vec::new();
        let manifest = pack_tip_to(repo, "repo", &ArchiveLimits::default(), &mut tar).unwrap();
        (tar, manifest)
    }

    fn delta(repo: &Path, base: &str, have: &Manifest) -> TipDelta {
        plan_tip_delta(repo, base, have, &ArchiveLimits::default(), 10_000)
            .unwrap()
            .expect("a delta")
    }

    /// Unpacks `tar` (entries under `repo/`) over `parent`, as Docker's upload does.
    fn unpack(tar: &[u8], parent: &Path) {
        let mut archive = tar::Archive::new(tar);
        archive.set_preserve_permissions(true);
        archive.unpack(parent).unwrap();
    }

    /// Removes what the delta says, as `rm -rf` would.
    fn remove(root: &Path, removed: &[String]) {
        for rel in removed {
            let path = root.join(rel);
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                fs::remove_dir_all(&path).unwrap();
            } else {
                fs::remove_file(&path).unwrap();
            }
        }
    }

    /// The entries of a tar outside `repo/.git`, but for `repo/` itself.
    fn work_entries(tar: &[u8]) -> Vec<String> {
        tar::Archive::new(tar)
            .entries()
            .unwrap()
            .map(|e| String::from_utf8(e.unwrap().path_bytes().to_vec()).unwrap())
            .filter(|p| p != "repo/" && !p.starts_with("repo/.git/"))
            .collect()
    }

    /// The ids in a pack index (version 2).
    fn idx_ids(idx: &[u8]) -> HashSet<String> {
        let count = u32::from_be_bytes(idx[8 + 255 * 4..8 + 256 * 4].try_into().unwrap());
        (0..count as usize)
            .map(|i| hex::encode(&idx[1032 + 20 * i..1032 + 20 * (i + 1)]))
            .collect()
    }

    /// Every object of `commit`: itself, its trees and blobs.
    fn objects(repo: &Path, commit: &str) -> HashSet<String> {
        let mut ids: HashSet<String> = git(repo, &["ls-tree", "-r", "-t", commit])
            .lines()
            .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
            .collect();
        ids.insert(
            git(repo, &["rev-parse", &format!("{commit}^{{tree}}")])
                .trim()
                .into(),
        );
        ids.insert(commit.to_string());
        ids
    }

    /// The manifest entry a snapshot entry would have.
    fn as_entry(snap: &Snap) -> ManifestEntry {
        match snap {
            Snap::File(mode, data) => ManifestEntry::File {
                mode: *mode,
                size: data.len() as u64,
                sha256: crate::archive::pack::sha256_of(data),
            },
            Snap::Dir(mode) => ManifestEntry::Dir { mode: *mode },
            Snap::Link(target) => ManifestEntry::Symlink {
                target: target.clone(),
            },
        }
    }

    /// T0 → twenty commits → T1, with every kind of change; the container's copy of T0
    /// brought to T1 by the delta is the copy of T1, its git included.
    #[test]
    fn delta_turns_the_old_tip_into_the_new_one() {
        let tmp = TempDir::new().unwrap();
        let clone = new_clone(&tmp);
        put(&clone, "keep/unchanged.txt", "same\n", 0o644);
        put(&clone, "mod.txt", "v1\n", 0o644);
        put(&clone, "del.txt", "bye\n", 0o644);
        put(&clone, "deldir/a.txt", "a\n", 0o644);
        put(&clone, "deldir/sub/b.txt", "b\n", 0o644);
        put(&clone, "exec.sh", "#!/bin/sh\n", 0o644);
        std::os::unix::fs::symlink("mod.txt", clone.join("link")).unwrap();
        put(&clone, "f2d", "a file first\n", 0o644);
        put(&clone, "d2f/x.txt", "x\n", 0o644);
        put(&clone, "old-name.txt", "renamed\n", 0o644);
        put(&clone, "moved/one.txt", "one\n", 0o644);
        put(&clone, "moved/deep/two.txt", "two\n", 0o644);
        commit(&clone, "history");
        let t0 = commit(&clone, "T0");
        let (t0_tar, t0_manifest) = tip(&clone);

        type Step = Box<dyn Fn(&Path)>;
        let steps: Vec<Step> = vec![
            Box::new(|c| put(c, "added.txt", "new\n", 0o644)),
            Box::new(|c| put(c, "mod.txt", "v2, longer\n", 0o644)),
            Box::new(|c| fs::remove_file(c.join("del.txt")).unwrap()),
            Box::new(|c| put(c, "new/deep/er/file.txt", "nested\n", 0o644)),
            Box::new(|c| fs::remove_dir_all(c.join("deldir")).unwrap()),
            Box::new(|c| chmod(&c.join("exec.sh"), 0o755)),
            Box::new(|c| {
                fs::remove_file(c.join("link")).unwrap();
                std::os::unix::fs::symlink("keep/unchanged.txt", c.join("link")).unwrap();
            }),
            Box::new(|c| {
                fs::remove_file(c.join("f2d")).unwrap();
                put(c, "f2d/inner.txt", "a dir now\n", 0o644);
            }),
            Box::new(|c| {
                fs::remove_dir_all(c.join("d2f")).unwrap();
                put(c, "d2f", "a file now\n", 0o644);
            }),
            Box::new(|c| fs::rename(c.join("old-name.txt"), c.join("new-name.txt")).unwrap()),
            // Moved as it was: its objects are in the old pack already.
            Box::new(|c| fs::rename(c.join("moved"), c.join("a-moved")).unwrap()),
            Box::new(|c| put(c, "transient.txt", "here a while\n", 0o644)),
        ];
        for (i, step) in steps.iter().enumerate() {
            step(&clone);
            commit(&clone, &format!("step {i}"));
        }
        for i in steps.len()..19 {
            put(&clone, "churn.txt", &format!("churn {i}\n"), 0o644);
            commit(&clone, &format!("churn {i}"));
        }
        fs::remove_file(clone.join("transient.txt")).unwrap();
        let t1 = commit(&clone, "T1");
        assert_eq!(
            git(&clone, &["rev-list", "--count", &format!("{t0}..{t1}")]).trim(),
            "20"
        );

        let plan = delta(&clone, &t0, &t0_manifest);
        assert_eq!(plan.commit(), t1);
        assert_eq!(
            plan.removed(),
            ["d2f", "del.txt", "deldir", "f2d", "moved", "old-name.txt"]
        );
        let mut tar = Vec::new();
        let changed = plan.changed();
        let manifest = plan.pack_to("repo", &mut tar).unwrap();
        assert!(tar.ends_with(&[0; 1024]));
        let mut written = work_entries(&tar);
        written.sort();
        assert_eq!(
            written,
            [
                "repo/a-moved/",
                "repo/a-moved/deep/",
                "repo/a-moved/deep/two.txt",
                "repo/a-moved/one.txt",
                "repo/added.txt",
                "repo/churn.txt",
                "repo/d2f",
                "repo/exec.sh",
                "repo/f2d/",
                "repo/f2d/inner.txt",
                "repo/link",
                "repo/mod.txt",
                "repo/new-name.txt",
                "repo/new/",
                "repo/new/deep/",
                "repo/new/deep/er/",
                "repo/new/deep/er/file.txt",
            ]
        );
        assert_eq!(changed, written.len());

        // The container: T0's copy, the removals, the delta over it.
        let a = tmp.path().join("a");
        unpack(&t0_tar, &a);
        let a_repo = a.join("repo");
        remove(&a_repo, &removed_of(&clone, &t0, &t0_manifest));
        unpack(&tar, &a);
        // A fresh copy of T1.
        let (t1_tar, t1_manifest) = tip(&clone);
        let b = tmp.path().join("b");
        unpack(&t1_tar, &b);
        let b_repo = b.join("repo");

        assert_eq!(
            without_git(snapshot(&a_repo)),
            without_git(snapshot(&b_repo))
        );
        assert_eq!(manifest.without_git(), t1_manifest.without_git());
        // The manifest is what the container holds, `.git` included.
        let on_disk = snapshot(&a_repo);
        let listed: Vec<&str> = manifest.entries().map(|(p, _)| p).collect();
        assert_eq!(
            listed,
            on_disk.keys().map(String::as_str).collect::<Vec<_>>()
        );
        for (path, snap) in &on_disk {
            assert_eq!(manifest.get(path), Some(&as_entry(snap)), "{path}");
        }
        // T0's .git entries are all still listed, and the new pack beside the old one.
        for (path, _) in t0_manifest.entries().filter(|(p, _)| is_git(p)) {
            assert!(manifest.get(path).is_some(), "{path}");
        }
        let packs = |m: &Manifest| -> Vec<String> {
            m.entries()
                .map(|(p, _)| p.to_string())
                .filter(|p| p.ends_with(".idx"))
                .collect()
        };
        assert_eq!(packs(&manifest).len(), 2);

        // The new pack holds what T0's lacks, and only that.
        let new_idx = packs(&manifest)
            .into_iter()
            .find(|p| t0_manifest.get(p).is_none())
            .unwrap();
        let in_delta = idx_ids(&fs::read(a_repo.join(&new_idx)).unwrap());
        let old = objects(&clone, &t0);
        let new = objects(&clone, &t1);
        let lacking: HashSet<String> = new.difference(&old).cloned().collect();
        assert_eq!(in_delta, lacking);

        // git in the container: the new tip, clean, every object there, and it works on.
        assert_eq!(git(&a_repo, &["log", "-1", "--format=%H"]).trim(), t1);
        assert_eq!(
            git(&a_repo, &["status", "--porcelain"]),
            git(&b_repo, &["status", "--porcelain"])
        );
        assert_eq!(git(&a_repo, &["status", "--porcelain"]), "");
        let all: Vec<String> = new.iter().cloned().collect();
        let checked = git_in(
            &a_repo,
            &["cat-file", "--batch-check"],
            &(all.join("\n") + "\n"),
        );
        assert!(!checked.contains("missing"), "{checked}");
        assert_eq!(checked.lines().count(), new.len());
        for id in all.iter().take(5) {
            git(&a_repo, &["cat-file", "-e", id]);
        }
        fs::write(a_repo.join("mod.txt"), "edited in the sandbox\n").unwrap();
        assert!(git(&a_repo, &["diff"]).contains("+edited in the sandbox"));
        git(&a_repo, &["commit", "-q", "-am", "in the sandbox"]);
        assert_eq!(git(&a_repo, &["log", "-1", "--format=%P"]).trim(), t1);
        assert_eq!(git(&a_repo, &["status", "--porcelain"]), "");
    }

    /// What the clone's `.git` no longer has (a branch deleted), or has as another kind (a
    /// ref file become a directory), goes from the container's copy too: its `.git` is then
    /// a fresh copy's but for the object store, and the manifest says so.
    #[test]
    fn delta_removes_what_the_clones_git_no_longer_has() {
        let tmp = TempDir::new().unwrap();
        let clone = new_clone(&tmp);
        put(&clone, "a.txt", "a\n", 0o644);
        let t0 = commit(&clone, "T0");
        git(&clone, &["branch", "gone"]);
        git(&clone, &["branch", "topic"]);
        let (t0_tar, t0_manifest) = tip(&clone);
        assert!(t0_manifest.get(".git/refs/heads/gone").is_some());
        put(&clone, "a.txt", "a, later\n", 0o644);
        commit(&clone, "T1");
        git(&clone, &["branch", "-D", "gone", "topic"]);
        git(&clone, &["branch", "topic/inner"]);

        let plan = delta(&clone, &t0, &t0_manifest);
        assert_eq!(
            plan.removed(),
            [
                ".git/logs/refs/heads/gone",
                ".git/logs/refs/heads/topic",
                ".git/refs/heads/gone",
                ".git/refs/heads/topic"
            ]
        );
        let mut tar = Vec::new();
        let manifest = plan.pack_to("repo", &mut tar).unwrap();
        let a = tmp.path().join("a");
        unpack(&t0_tar, &a);
        let a_repo = a.join("repo");
        remove(&a_repo, &removed_of(&clone, &t0, &t0_manifest));
        unpack(&tar, &a);
        let b = tmp.path().join("b");
        unpack(&tip(&clone).0, &b);
        let outside_objects = |root: &Path| {
            let mut snap = snapshot(root);
            snap.retain(|p, _| !p.starts_with(".git/objects"));
            snap
        };
        let on_disk = outside_objects(&a_repo);
        assert_eq!(on_disk, outside_objects(&b.join("repo")));
        assert!(on_disk.contains_key(".git/refs/heads/topic/inner"));
        assert!(manifest.get(".git/refs/heads/gone").is_none());
        assert!(matches!(
            manifest.get(".git/refs/heads/topic"),
            Some(ManifestEntry::Dir { .. })
        ));
        let listed: Vec<&str> = manifest.entries().map(|(p, _)| p).collect();
        assert_eq!(
            listed,
            snapshot(&a_repo)
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
        );
    }

    /// An empty repository at `clone` in `tmp`.
    fn new_clone(tmp: &TempDir) -> PathBuf {
        let clone = tmp.path().join("clone");
        fs::create_dir(&clone).unwrap();
        git(&clone, &["init", "-q"]);
        clone
    }

    fn removed_of(clone: &Path, base: &str, have: &Manifest) -> Vec<String> {
        delta(clone, base, have).removed().to_vec()
    }

    #[test]
    fn no_delta_without_the_base_or_past_the_most_changes() {
        let tmp = TempDir::new().unwrap();
        let clone = tmp.path();
        git(clone, &["init", "-q"]);
        put(clone, "a.txt", "a\n", 0o644);
        put(clone, "b.txt", "b\n", 0o644);
        let t0 = commit(clone, "T0");
        let (_, have) = tip(clone);
        put(clone, "a.txt", "changed\n", 0o644);
        fs::remove_file(clone.join("b.txt")).unwrap();
        put(clone, "c/d.txt", "new\n", 0o644);
        commit(clone, "T1");
        let limits = ArchiveLimits::default();

        let unknown = "ab".repeat(20);
        assert!(plan_tip_delta(clone, &unknown, &have, &limits, 100)
            .unwrap()
            .is_none());
        let blob = git(clone, &["rev-parse", "HEAD:a.txt"]);
        assert!(plan_tip_delta(clone, blob.trim(), &have, &limits, 100)
            .unwrap()
            .is_none());
        assert!(plan_tip_delta(clone, "not hex", &have, &limits, 100).is_err());

        // b.txt removed; a.txt, c/ and c/d.txt written: four.
        let plan = plan_tip_delta(clone, &t0, &have, &limits, 4)
            .unwrap()
            .unwrap();
        assert_eq!((plan.removed().len(), plan.changed()), (1, 3));
        assert!(plan_tip_delta(clone, &t0, &have, &limits, 3)
            .unwrap()
            .is_none());

        // A manifest that is not the base's is refused.
        let mut other = have.clone();
        other.entries.remove("b.txt");
        let msg = plan_tip_delta(clone, &t0, &other, &limits, 100)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`b.txt`"), "{msg}");
    }

    #[test]
    fn delta_to_the_same_tip_is_empty() {
        let tmp = TempDir::new().unwrap();
        let clone = tmp.path();
        git(clone, &["init", "-q"]);
        put(clone, "a.txt", "a\n", 0o644);
        put(clone, "dir/b.txt", "b\n", 0o755);
        let t0 = commit(clone, "T0");
        let (_, have) = tip(clone);
        let plan = delta(clone, &t0, &have);
        assert_eq!(plan.commit(), t0);
        assert!(plan.removed().is_empty());
        assert_eq!(plan.changed(), 0);
        let mut tar = Vec::new();
        let manifest = plan.pack_to("repo", &mut tar).unwrap();
        assert!(work_entries(&tar).is_empty());
        // No pack either: the container has every object.
        let names = tar::Archive::new(tar.as_slice())
            .entries()
            .unwrap()
            .map(|e| String::from_utf8(e.unwrap().path_bytes().to_vec()).unwrap())
            .collect::<Vec<_>>();
        assert!(!names.iter().any(|n| n.contains("objects")), "{names:?}");
        assert_eq!(manifest, have);
    }

    /// The new tree is held to pack_tip_to's rules, the limits over the whole result.
    #[test]
    fn delta_refuses_what_pack_tip_refuses() {
        let tmp = TempDir::new().unwrap();
        let clone = tmp.path();
        git(clone, &["init", "-q"]);
        put(clone, "big.txt", &"x".repeat(600), 0o644);
        let t0 = commit(clone, "T0");
        let (_, have) = tip(clone);
        put(clone, "more.txt", &"y".repeat(500), 0o644);
        commit(clone, "T1");
        let small = ArchiveLimits {
            max_total_bytes: 1000,
            ..ArchiveLimits::default()
        };
        let msg = plan_tip_delta(clone, &t0, &have, &small, 100)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("adding up to"), "{msg}");
        let few = ArchiveLimits {
            max_entries: have.len(),
            ..ArchiveLimits::default()
        };
        let msg = plan_tip_delta(clone, &t0, &have, &few, 100)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("entries"), "{msg}");
        let enough = ArchiveLimits {
            max_entries: have.len() + 1,
            ..ArchiveLimits::default()
        };
        assert!(plan_tip_delta(clone, &t0, &have, &enough, 100).is_ok());

        // A `.git` directory in the new tree, written by hand (git would not commit it).
        let repo = git2::Repository::open(clone).unwrap();
        let blob = repo.blob(b"[core]\n").unwrap();
        let mut raw = b"100644 config\0".to_vec();
        raw.extend_from_slice(blob.as_bytes());
        let bad = repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Tree, &raw)
            .unwrap();
        let head = repo.head().unwrap().peel_to_tree().unwrap();
        // In an old tree too: removing it would remove the container's `.git`.
        let mut raw = Vec::new();
        let big = head.get_name("big.txt").unwrap().id();
        for (mode, name, id) in [("40000", ".git", bad), ("100644", "big.txt", big)] {
            raw.extend_from_slice(format!("{mode} {name}\0").as_bytes());
            raw.extend_from_slice(id.as_bytes());
        }
        let old_tree = repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Tree, &raw)
            .unwrap();
        let sig = git2::Signature::now("T", "t@example.com").unwrap();
        let bad_base = repo
            .commit(
                None,
                &sig,
                &sig,
                "bad",
                &repo.find_tree(old_tree).unwrap(),
                &[],
            )
            .unwrap();
        assert!(have.get(".git").is_some());
        let msg = plan_tip_delta(clone, &bad_base.to_string(), &have, &enough, 100)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`.git` entry"), "{msg}");

        let mut top = repo.treebuilder(Some(&head)).unwrap();
        top.insert("sub", head.id(), 0o040000).unwrap();
        let sub_id = top.write().unwrap();
        let mut raw = Vec::new();
        for (mode, name, id) in [("40000", ".GIT", bad), ("40000", "sub", sub_id)] {
            raw.extend_from_slice(format!("{mode} {name}\0").as_bytes());
            raw.extend_from_slice(id.as_bytes());
        }
        let tree = repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Tree, &raw)
            .unwrap();
        let sig = git2::Signature::now("T", "t@example.com").unwrap();
        let parent = repo.head().unwrap().peel_to_commit().unwrap();
        repo.commit(
            Some("HEAD"),
            &sig,
            &sig,
            "bad",
            &repo.find_tree(tree).unwrap(),
            &[&parent],
        )
        .unwrap();
        let msg = plan_tip_delta(clone, &t0, &have, &ArchiveLimits::default(), 100)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`.git` entry"), "{msg}");
    }

    /// A repository of `files` files in `dirs` directories, at T0; then 20 commits that
    /// change two files each.
    fn big_history(clone: &Path, files: usize, dirs: usize) -> (String, Vec<u8>, Manifest) {
        git(clone, &["init", "-q"]);
        for i in 0..files {
            let text = format!("file {i}\n{}\n", "some line of text ".repeat(i % 40));
            put(
                clone,
                &format!("d{:02}/f{i:04}.txt", i % dirs),
                &text,
                0o644,
            );
        }
        let t0 = commit(clone, "T0");
        let (tar, manifest) = tip(clone);
        for c in 0..20 {
            for j in 0..2 {
                let i = (c * 2 + j) * 71 % files;
                put(
                    clone,
                    &format!("d{:02}/f{i:04}.txt", i % dirs),
                    &format!("changed {c}\n"),
                    0o644,
                );
            }
            commit(clone, &format!("change {c}"));
        }
        (t0, tar, manifest)
    }

    #[test]
    fn delta_of_a_big_tree_holds_only_the_changes() {
        let tmp = TempDir::new().unwrap();
        let clone = tmp.path();
        let (t0, _, have) = big_history(clone, 3000, 30);
        let plan = delta(clone, &t0, &have);
        assert!(plan.removed().is_empty());
        assert_eq!(plan.changed(), 40);
        let mut tar = Vec::new();
        let manifest = plan.pack_to("repo", &mut tar).unwrap();
        assert_eq!(work_entries(&tar).len(), 40);
        assert_eq!(manifest.without_git(), tip(clone).1.without_git());
    }

    /// Not a test: a figure. `cargo test -p kodx-sandbox --release --lib
    /// archive::delta::tests::delta_time -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn delta_time() {
        let tmp = TempDir::new().unwrap();
        let clone = tmp.path();
        let (t0, _, have) = big_history(clone, 3000, 30);
        let runs = 10;
        let started = Instant::now();
        let mut delta_bytes = 0;
        for _ in 0..runs {
            let mut tar = Vec::new();
            delta(clone, &t0, &have).pack_to("repo", &mut tar).unwrap();
            delta_bytes = tar.len();
        }
        let delta_time = started.elapsed() / runs;
        let started = Instant::now();
        let mut tip_bytes = 0;
        for _ in 0..runs {
            tip_bytes = tip(clone).0.len();
        }
        let tip_time = started.elapsed() / runs;
        println!(
            "3000 files, 20 commits changing 40: delta (plan + pack_to) {delta_time:?}, \
             {delta_bytes} bytes; pack_tip_to {tip_time:?}, {tip_bytes} bytes (mean of {runs})"
        );
    }
}
