//! The change-set diff: the tree out of the container compared with its [`Manifest`],
//! keeping only what changed.

use std::collections::HashMap;
use std::io::{self, Read};

use tar::EntryType;

use super::bounded::{refusal, untrusted_archive};
use super::contents::{read_contents, Contents};
use super::ignore::Ignores;
use super::limits::{gone, unsafe_archive, ArchiveLimits, Open, MAX_REFETCH};
use super::manifest::{Manifest, ManifestEntry};
use super::names::{check_root, is_git};
use super::untrusted::{memory_opener, Data, Node, Out, Reader};
use crate::error::{Result, SandboxError};

/// The exact difference between a tree taken out of the container and its [`Manifest`],
/// over files and symlinks (directories are implicit, as in git), sorted by path.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChangeSet {
    pub changes: Vec<Change>,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub path: String,
    pub kind: ChangeKind,
}

/// What happened to a path.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeKind {
    /// Not in the baseline (or only as a directory).
    Added(NewEntry),
    /// Contents (file data, symlink target, or the kind of entry) and/or permission bits changed.
    Modified {
        new: NewEntry,
        content_changed: bool,
        mode_changed: bool,
    },
    /// In the baseline as a file or symlink, gone now.
    Deleted,
}

/// The new state of an added or modified path. File modes are permission bits (`& 0o777`).
#[derive(Debug, Clone, PartialEq)]
pub enum NewEntry {
    File { mode: u32, contents: Contents },
    Symlink { target: String },
}

/// [`change_set_from`] for a tar in memory.
pub fn change_set(
    tar: &[u8],
    root: &str,
    baseline: &Manifest,
    limits: &ArchiveLimits,
) -> Result<ChangeSet> {
    change_set_from(&mut memory_opener(tar, root), root, baseline, limits)
}

/// The exact change set of the tree `open("")` gives against `baseline` (same safety rules
/// as [`extract`](super::extract)): files and symlinks only, sorted by path. A top-level ".git" and
/// everything under it is left out on both sides, and so is every path the tree's
/// `.gitignore` files ignore, unless the baseline had it (git keeps tracking it): those
/// are skipped while streaming, never kept and never held to the size limits. Only added
/// and modified contents are kept.
///
/// Files whose contents are needed but were not kept while streaming (a hard link to a
/// skipped file, a large file of unchanged size that changed, a path whose ignore rules
/// came later in the stream) are read again one by one with `open(path)`; when there are
/// many, the whole tree is read a second time with every rule known from the start.
pub fn change_set_from(
    open: &mut Open,
    root: &str,
    baseline: &Manifest,
    limits: &ArchiveLimits,
) -> Result<ChangeSet> {
    check_root(root)?;
    let mut ignores = Ignores::default();
    ignores.prefetch_root(open, limits)?;
    for pass in 1..=2 {
        let tar = open("")?.ok_or_else(|| gone(root))?;
        let mut reader = Reader::new(root, limits, Some(baseline), Out::Changes, Some(ignores));
        reader.read(tar)?;
        match reader.finish_changes(open, pass == 2)? {
            Finished::Done(set) => return Ok(set),
            Finished::Again(mut known) => {
                tracing::info!("reading the workspace again, with every ignore rule known");
                known.complete = true;
                known.dirs.clear();
                ignores = known;
            }
        }
    }
    unreachable!("the second pass never asks for a third")
}

/// [`change_set_from`], read from a snapshot of the tree that kodx's helper wrote in the
/// container (`kodx-net snapshot`): the files whose inode has not changed since the copy-in
/// come as headers alone ([`AS_COPIED`](super::untrusted::AS_COPIED)), so only what the run touched crosses. Each
/// directory's `.gitignore` comes first in it, so the rules are known before the names they
/// govern. An error (including a tree that would need a second reading) means: read the
/// whole workspace instead. `open` reads single files again (large edited ones).
pub fn change_set_from_snapshot(
    mut tar: impl Read,
    open: &mut Open,
    root: &str,
    baseline: &Manifest,
    limits: &ArchiveLimits,
) -> Result<ChangeSet> {
    check_root(root)?;
    let mut reader = Reader::new(
        root,
        limits,
        Some(baseline),
        Out::Changes,
        Some(Ignores::default()),
    );
    reader.snapshot = true;
    reader.read(&mut tar)?;
    // The rest of the end-of-archive blocks, so the helper's exit can be checked; bounded.
    let rest = io::copy(&mut tar.take(1 << 20), &mut io::sink())
        .map_err(|e| unsafe_archive(format!("reading the end of the snapshot: {e}")))?;
    if rest >= 1 << 20 {
        return Err(unsafe_archive("the snapshot goes on past its end".into()));
    }
    match reader.finish_changes(open, false)? {
        Finished::Done(set) => Ok(set),
        Finished::Again(_) => Err(SandboxError::InvalidInput(
            "the snapshot would have to be read again".into(),
        )),
    }
}

impl ChangeSet {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The added paths.
    pub fn added(&self) -> impl Iterator<Item = &Change> + '_ {
        self.changes
            .iter()
            .filter(|c| matches!(c.kind, ChangeKind::Added(_)))
    }

    /// The modified paths.
    pub fn modified(&self) -> impl Iterator<Item = &Change> + '_ {
        self.changes
            .iter()
            .filter(|c| matches!(c.kind, ChangeKind::Modified { .. }))
    }

    /// The deleted paths.
    pub fn deleted(&self) -> impl Iterator<Item = &Change> + '_ {
        self.changes
            .iter()
            .filter(|c| matches!(c.kind, ChangeKind::Deleted))
    }

    /// E.g. "2 added, 1 modified, 1 deleted"; zero counts are left out, and an empty set
    /// reads "no changes".
    pub fn summary(&self) -> String {
        if self.is_empty() {
            return "no changes".to_string();
        }
        [
            (self.added().count(), "added"),
            (self.modified().count(), "modified"),
            (self.deleted().count(), "deleted"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// The result of the first reading of a change set.
pub(super) enum Finished {
    Done(ChangeSet),
    /// Read everything again with these rules (all of them are known now).
    Again(Ignores),
}

impl Reader<'_> {
    /// Snapshot: a baseline file the helper found unchanged since the copy-in. Anything
    /// else claimed so is an error (the caller then reads the whole workspace instead).
    pub(super) fn as_copied(&mut self, rel: &str) -> Result<()> {
        if is_git(rel) {
            return Ok(());
        }
        let Some((mode, size, _)) = self.baseline.and_then(|b| b.file(rel)) else {
            return Err(self.at(
                rel,
                "marked as copied in, but the checkout has no such file",
            ));
        };
        self.count(rel, rel.len())?;
        self.insert(
            rel,
            Node::File {
                mode,
                size,
                data: Data::Unchanged,
            },
        )
    }

    /// Change set: checks provisional answers again with every rule known, reads pending
    /// files again, and builds the change set — or asks for a second reading.
    pub(super) fn finish_changes(mut self, open: &mut Open, last: bool) -> Result<Finished> {
        let mut ignores = self
            .ignores
            .take()
            .expect("a change set reads the ignore rules");
        let mut again = ignores.changed;
        {
            let mut cache = HashMap::new();
            for p in std::mem::take(&mut self.provisional) {
                let ignored = ignores.finally(&p.path, p.is_dir, &mut cache)?;
                if p.ignored && !ignored {
                    again = true; // skipped, but wanted after all
                } else if !p.ignored && ignored && !p.is_dir {
                    self.tree.nodes.remove(&p.path);
                }
            }
        }
        if again && !last {
            return Ok(Finished::Again(ignores));
        }
        self.check_symlinks()?;
        let pending: Vec<(String, Option<u64>)> = self
            .tree
            .nodes
            .iter()
            .filter_map(|(path, node)| match node {
                Node::File {
                    data: Data::Pending(size),
                    ..
                } => Some((path.clone(), *size)),
                _ => None,
            })
            .collect();
        for (path, size) in &pending {
            if let Some(size) = size {
                self.check_file(path, *size)?;
            }
        }
        if pending.len() > MAX_REFETCH {
            if !last {
                return Ok(Finished::Again(ignores));
            }
            return Err(unsafe_archive(format!(
                "{} files would have to be read from the container one by one (limit {MAX_REFETCH})",
                pending.len()
            )));
        }
        for (path, _) in pending {
            let data = self.refetch(open, &path)?;
            self.set_data(&path, data);
        }
        Ok(Finished::Done(self.change_list()))
    }

    /// Reads one file of the tree on its own.
    pub(super) fn refetch(&mut self, open: &mut Open, rel: &str) -> Result<Data> {
        let shown = self.shown(rel);
        let vanished = || {
            unsafe_archive(format!(
                "{shown:?} changed while kodx was taking the changes out of the container; try again"
            ))
        };
        let tar = open(rel)?.ok_or_else(vanished)?;
        let malformed = |e: io::Error| match refusal(&e) {
            Some(why) => unsafe_archive(format!("{shown:?}: {why}")),
            None => unsafe_archive(format!("{shown:?}: malformed tar: {e}")),
        };
        let mut archive = untrusted_archive(tar, self.limits.max_stream_bytes);
        let mut entry = archive
            .entries()
            .map_err(malformed)?
            .next()
            .ok_or_else(vanished)?
            .map_err(malformed)?;
        let base = rel.rsplit('/').next().unwrap_or(rel);
        let regular = matches!(
            entry.header().entry_type(),
            EntryType::Regular | EntryType::Continuous
        );
        if &*entry.path_bytes() != base.as_bytes() || !regular {
            return Err(vanished());
        }
        let mode = entry.header().mode().map_err(malformed)? & 0o7777;
        let size = entry.size();
        if let Some(Node::File {
            mode: m, size: s, ..
        }) = self.tree.nodes.get_mut(rel)
        {
            *m = mode;
            *s = size;
        }
        self.check_file(rel, size)?;
        let contents = read_contents(&mut entry, size, &mut self.memory)
            .map_err(|e| unsafe_archive(format!("{shown:?}: {e}")))?;
        if let Some((old_mode, _, old_sha)) = self.baseline.and_then(|b| b.file(rel)) {
            if old_sha == contents.sha256() && (old_mode ^ mode) & 0o777 == 0 {
                return Ok(Data::Unchanged);
            }
        }
        self.add_total(rel, size)?;
        Ok(Data::Kept(contents))
    }

    /// The change list from the tree and the baseline.
    pub(super) fn change_list(&self) -> ChangeSet {
        let baseline = self.baseline.expect("a change set has a baseline");
        let mut changes = Vec::new();
        for (path, node) in &self.tree.nodes {
            let (new, diff) = match node {
                Node::Dir { .. } => continue,
                Node::File { mode, data, .. } => {
                    let contents = match data {
                        Data::Kept(c) => c.clone(),
                        _ => continue, // unchanged
                    };
                    let diff = match baseline.get(path) {
                        None | Some(ManifestEntry::Dir { .. }) => None,
                        Some(ManifestEntry::File {
                            mode: old, sha256, ..
                        }) => Some((contents.sha256() != *sha256, (mode ^ old) & 0o777 != 0)),
                        Some(ManifestEntry::Symlink { .. }) => Some((true, false)),
                    };
                    let new = NewEntry::File {
                        mode: mode & 0o777,
                        contents,
                    };
                    (new, diff)
                }
                Node::Symlink { target } => {
                    let diff = match baseline.get(path) {
                        None | Some(ManifestEntry::Dir { .. }) => None,
                        Some(ManifestEntry::Symlink { target: old }) => {
                            Some((target != old, false))
                        }
                        Some(ManifestEntry::File { .. }) => Some((true, false)),
                    };
                    let new = NewEntry::Symlink {
                        target: target.clone(),
                    };
                    (new, diff)
                }
            };
            let kind = match diff {
                Some((false, false)) => continue,
                None => ChangeKind::Added(new),
                Some((content_changed, mode_changed)) => ChangeKind::Modified {
                    new,
                    content_changed,
                    mode_changed,
                },
            };
            changes.push(Change {
                path: path.clone(),
                kind,
            });
        }
        for (path, entry) in &baseline.entries {
            let gone = !matches!(
                self.tree.nodes.get(path),
                Some(Node::File { .. } | Node::Symlink { .. })
            );
            if gone && !is_git(path) && !matches!(entry, ManifestEntry::Dir { .. }) {
                changes.push(Change {
                    path: path.clone(),
                    kind: ChangeKind::Deleted,
                });
            }
        }
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        ChangeSet { changes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::contents::Stored;
    use crate::archive::limits::INLINE_MAX;
    use crate::archive::testutil::*;
    use crate::archive::{extract, pack_dir};
    use std::fs::{self, Permissions};
    use std::os::unix::fs::PermissionsExt;
    use tempfile::TempDir;

    #[test]
    fn change_set_and_apply() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, "a.txt", "alpha", 0o644);
        put(&orig, "same.txt", "same", 0o644);
        put(&orig, "mode.sh", "x", 0o644);
        put(&orig, "gone.txt", "bye", 0o644);
        put(&orig, "f2l.txt", "was a file", 0o644);
        put(&orig, "dir/keep.txt", "keep", 0o644);
        put(&orig, "dir/gone2.txt", "bye", 0o644);
        put(&orig, "only/lonely.txt", "bye", 0o644);
        put(&orig, ".git/HEAD", "ref: refs/heads/main", 0o644);
        link(&orig, "link", "a.txt");
        let (tar0, baseline) = pack_dir(&orig, "repo").unwrap();
        let unchanged = change_set(&tar0, "repo", &baseline, &ArchiveLimits::default()).unwrap();
        assert!(unchanged.is_empty());
        assert_eq!(unchanged.summary(), "no changes");

        let new = tmp.path().join("new");
        extract(&tar0, "repo", &new, &ArchiveLimits::default()).unwrap();
        put(&new, "a.txt", "alpha changed", 0o644);
        fs::set_permissions(new.join("mode.sh"), Permissions::from_mode(0o755)).unwrap();
        fs::remove_file(new.join("gone.txt")).unwrap();
        fs::remove_file(new.join("dir/gone2.txt")).unwrap();
        fs::remove_dir_all(new.join("only")).unwrap();
        fs::remove_file(new.join("f2l.txt")).unwrap();
        link(&new, "f2l.txt", "a.txt");
        fs::remove_file(new.join("link")).unwrap();
        link(&new, "link", "same.txt");
        put(&new, "new.txt", "brand new", 0o600);
        put(&new, "sub/new/deep.txt", "deep", 0o644);
        put(&new, ".git/HEAD", "ref: refs/heads/other", 0o644);
        put(&new, ".git/objects/ab", "object", 0o444);
        let (tar1, _) = pack_dir(&new, "repo").unwrap();

        let set = change_set(&tar1, "repo", &baseline, &ArchiveLimits::default()).unwrap();
        let file = |mode, contents: &str| NewEntry::File {
            mode,
            contents: contents.as_bytes().into(),
        };
        let sym = |target: &str| NewEntry::Symlink {
            target: target.into(),
        };
        let modified = |new, content_changed, mode_changed| ChangeKind::Modified {
            new,
            content_changed,
            mode_changed,
        };
        let expected = [
            ("a.txt", modified(file(0o644, "alpha changed"), true, false)),
            ("dir/gone2.txt", ChangeKind::Deleted),
            ("f2l.txt", modified(sym("a.txt"), true, false)),
            ("gone.txt", ChangeKind::Deleted),
            ("link", modified(sym("same.txt"), true, false)),
            ("mode.sh", modified(file(0o755, "x"), false, true)),
            ("new.txt", ChangeKind::Added(file(0o600, "brand new"))),
            ("only/lonely.txt", ChangeKind::Deleted),
            ("sub/new/deep.txt", ChangeKind::Added(file(0o644, "deep"))),
        ];
        let expected: Vec<Change> = expected
            .into_iter()
            .map(|(path, kind)| Change {
                path: path.into(),
                kind,
            })
            .collect();
        assert_eq!(set.changes, expected);
        assert_eq!(set.summary(), "2 added, 4 modified, 3 deleted");
        assert_eq!(set.added().count(), 2);
        assert_eq!(set.deleted().count(), 3);

        let host = tmp.path().join("host");
        extract(&tar0, "repo", &host, &ArchiveLimits::default()).unwrap();
        set.apply(&host).unwrap();
        assert_eq!(without_git(snapshot(&host)), without_git(snapshot(&new)));
        assert_eq!(
            fs::read_to_string(host.join(".git/HEAD")).unwrap(),
            "ref: refs/heads/main"
        );
    }

    #[test]
    fn ignored_paths_are_skipped_before_the_limits_apply() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, ".gitignore", "target/\n*.log\n", 0o644);
        put(&orig, "src/a.rs", "fn a() {}\n", 0o644);
        put(
            &orig,
            "target/tracked.txt",
            "tracked in an ignored dir\n",
            0o644,
        );
        put(&orig, "gone.log", "tracked, matches *.log\n", 0o644);
        let (_, baseline) = pack_dir(&orig, "repo").unwrap();

        let new = tmp.path().join("new");
        put(
            &new,
            ".gitignore",
            "target/\n*.log\ndist/\n!keep.log\n",
            0o644,
        );
        put(&new, "src/a.rs", "fn a() { changed }\n", 0o644);
        put(
            &new,
            "target/tracked.txt",
            "changed, still tracked\n",
            0o644,
        );
        sized(&new, "target/app.bin", 120_000); // over the 1000-byte limit, ignored
        sized(&new, "target/deep/x.o", 5000);
        sized(&new, "debug.log", 5000); // ignored by pattern
        put(&new, "keep.log", "re-included\n", 0o644);
        sized(&new, "dist/bundle.js", 5000); // ignored by the model's own new rule
        put(&new, ".git/objects/pack/p.pack", &"x".repeat(5000), 0o444);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let set = change_set(&tar, "repo", &baseline, &small_limits()).unwrap();
        assert_eq!(
            paths(&set),
            [
                "modified .gitignore",
                "deleted gone.log",
                "added keep.log",
                "modified src/a.rs",
                "modified target/tracked.txt",
            ]
        );

        // A real oversize change is still refused, naming the file.
        sized(&new, "data.bin", 5000);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let err = change_set(&tar, "repo", &baseline, &small_limits()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("repo/data.bin") && msg.contains("max_file_bytes = 1000"),
            "{msg}"
        );
        fs::remove_file(new.join("data.bin")).unwrap();

        // Once the model un-ignores target/, its build output is a change like any other.
        put(&new, ".gitignore", "*.log\ndist/\n", 0o644);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let err = change_set(&tar, "repo", &baseline, &small_limits()).unwrap_err();
        assert!(err.to_string().contains("repo/target/app.bin"), "{err}");
    }

    /// A spooled change file has no name (`O_TMPFILE`, or unlinked at once where the
    /// filesystem has no such flag): the kernel frees it when kodx dies, so a crash leaves
    /// nothing to sweep.
    #[test]
    fn a_spooled_change_leaves_no_file_behind() {
        let open = || -> std::collections::HashMap<String, std::path::PathBuf> {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| {
                    let e = e.ok()?;
                    let target = std::fs::read_link(e.path()).ok()?;
                    Some((e.file_name().to_string_lossy().into_owned(), target))
                })
                .collect()
        };
        let before = open();
        let size = INLINE_MAX + 10;
        let mut memory = 0;
        let contents =
            read_contents(&mut std::io::repeat(b'x').take(size), size, &mut memory).unwrap();
        assert!(contents.is_spooled());
        let new: Vec<_> = open()
            .into_iter()
            .filter(|(fd, target)| before.get(fd) != Some(target))
            .map(|(_, target)| target)
            .filter(|t| t.starts_with(std::env::temp_dir()))
            .collect();
        assert!(!new.is_empty(), "the spool is open");
        for t in &new {
            assert!(
                t.to_string_lossy().ends_with("(deleted)") || !t.exists(),
                "a spool file with a name: {}",
                t.display()
            );
        }
        drop(contents);
    }

    #[test]
    fn large_changes_are_spooled_and_same_size_edits_read_again() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        let big = "b".repeat(300 << 10); // over INLINE_MAX
        put(&orig, "same-size.dat", &big, 0o644);
        put(&orig, "untouched.dat", &big, 0o644);
        let (_, baseline) = pack_dir(&orig, "repo").unwrap();
        let new = tmp.path().join("new");
        put(&new, "untouched.dat", &big, 0o644);
        let edited = format!("X{}", &big[1..]);
        put(&new, "same-size.dat", &edited, 0o644);
        let added = "n".repeat(2 << 20);
        put(&new, "new.dat", &added, 0o600);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let set = change_set(&tar, "repo", &baseline, &ArchiveLimits::default()).unwrap();
        assert_eq!(paths(&set), ["added new.dat", "modified same-size.dat"]);
        for (change, want) in set.changes.iter().zip([&added, &edited]) {
            let (ChangeKind::Added(NewEntry::File { contents, .. })
            | ChangeKind::Modified {
                new: NewEntry::File { contents, .. },
                ..
            }) = &change.kind
            else {
                panic!("{change:?}")
            };
            assert!(contents.is_spooled(), "{change:?}");
            // Spooled to a file with no name: nothing is left behind if kodx dies.
            if let Stored::Spooled(file) = &contents.stored {
                use std::os::unix::fs::MetadataExt;
                assert_eq!(file.metadata().unwrap().nlink(), 0);
            }
            assert_eq!(contents.to_vec().unwrap(), want.as_bytes());
        }
        let host = tmp.path().join("host");
        extract(
            &pack_dir(&orig, "repo").unwrap().0,
            "repo",
            &host,
            &ArchiveLimits::default(),
        )
        .unwrap();
        set.apply(&host).unwrap();
        assert_eq!(snapshot(&host), snapshot(&new));
    }

    #[test]
    fn hard_links_to_skipped_files_are_read_again() {
        let tar = raw_tar(&[
            RawEntry::dir("repo/"),
            RawEntry::file("repo/.gitignore", "target/\n"),
            RawEntry::dir("repo/target/"),
            RawEntry::file("repo/target/app", "binary"),
            RawEntry::hard("repo/zz-app", "repo/target/app"),
        ]);
        let set = change_set(
            &tar,
            "repo",
            &Manifest::default(),
            &ArchiveLimits::default(),
        )
        .unwrap();
        assert_eq!(paths(&set), ["added .gitignore", "added zz-app"]);
        let ChangeKind::Added(NewEntry::File { contents, .. }) = &set.changes[1].kind else {
            panic!("{set:?}")
        };
        assert_eq!(contents.to_vec().unwrap(), b"binary");
    }
}
