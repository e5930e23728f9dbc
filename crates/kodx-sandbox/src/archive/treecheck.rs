//! The rules a git tree from an untrusted repository keeps to go into the sandbox as a work
//! tree ([`pack_checkout_to`], [`pack_tip_to`], [`plan_tip_delta`]): names git would check
//! out, symlink targets that are text, and the [`ArchiveLimits`] over the whole tree,
//! counted before a blob is read.
//!
//! [`pack_checkout_to`]: super::pack_checkout_to
//! [`pack_tip_to`]: super::pack_tip_to
//! [`plan_tip_delta`]: super::plan_tip_delta

use super::limits::{human, ArchiveLimits, MAX_NAME_BYTES};
use super::tip::TipPack;
use crate::error::{Result, SandboxError};

/// What a work tree made from git objects has used of the limits so far.
pub(super) struct TreeBudget<'l> {
    pub(super) limits: &'l ArchiveLimits,
    pub(super) entries: usize,
    pub(super) bytes: u64,
    pub(super) names: u64,
    /// The pack of a tip-only `.git`, taking every tree and blob met.
    pub(super) tip: Option<TipPack>,
}

impl TreeBudget<'_> {
    /// Counts one more entry at `rel`, and its name.
    pub(super) fn count(&mut self, rel: &str) -> Result<()> {
        self.entries += 1;
        self.names += rel.len() as u64;
        if self.entries > self.limits.max_entries {
            return Err(refused(
                rel,
                format!("more than {} entries", self.limits.max_entries),
            ));
        }
        if self.names > self.limits.max_name_bytes {
            return Err(refused(
                rel,
                format!("more than {} of names", human(self.limits.max_name_bytes)),
            ));
        }
        Ok(())
    }

    /// Counts the file at `rel` of `size` bytes.
    pub(super) fn file(&mut self, rel: &str, size: u64) -> Result<()> {
        if size > self.limits.max_file_bytes {
            return Err(refused(
                rel,
                format!(
                    "a file of {}, over the limit of {}",
                    human(size),
                    human(self.limits.max_file_bytes)
                ),
            ));
        }
        self.bytes += size;
        if self.bytes > self.limits.max_total_bytes {
            return Err(refused(
                rel,
                format!(
                    "files adding up to more than {}",
                    human(self.limits.max_total_bytes)
                ),
            ));
        }
        Ok(())
    }
}

/// The path in the work tree of the entry named `raw` in the tree at `parent` ("" at the
/// top), if git would check it out: UTF-8, a single component, not `.git` in any spelling.
pub(super) fn tree_path(parent: &str, raw: &[u8]) -> Result<String> {
    let shown = String::from_utf8_lossy(raw);
    let rel = if parent.is_empty() {
        shown.into_owned()
    } else {
        format!("{parent}/{shown}")
    };
    let name =
        std::str::from_utf8(raw).map_err(|_| refused(&rel, "a name that is not UTF-8".into()))?;
    if let Some(why) = bad_tree_name(name) {
        return Err(refused(&rel, why.into()));
    }
    Ok(rel)
}

/// Why a name in a git tree cannot be checked out, if it cannot: not a single component,
/// or `.git` in any spelling git refuses (case, trailing dots and spaces, `git~1`).
fn bad_tree_name(name: &str) -> Option<&'static str> {
    if name.is_empty() || name == "." || name == ".." {
        return Some("an empty, `.` or `..` name");
    }
    if name.contains('/') || name.contains('\0') {
        return Some("a name with `/` or a NUL byte");
    }
    let folded = name.trim_end_matches([' ', '.']).to_ascii_lowercase();
    if folded == ".git" || folded == "git~1" {
        return Some("a `.git` entry, which git refuses to check out");
    }
    None
}

/// Refuses a symlink at `rel` whose blob is `size` bytes: longer than a path can be.
pub(super) fn symlink_size(rel: &str, size: usize) -> Result<()> {
    if size > MAX_NAME_BYTES {
        return Err(refused(
            rel,
            format!("a symlink target longer than {MAX_NAME_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// The target of the symlink at `rel` whose blob holds `data`: UTF-8, not empty, no NUL.
pub(super) fn symlink_target(rel: &str, data: &[u8]) -> Result<String> {
    let target = std::str::from_utf8(data)
        .map_err(|_| refused(rel, "a symlink target that is not UTF-8".into()))?;
    if target.is_empty() || target.contains('\0') {
        return Err(refused(
            rel,
            "an empty symlink target or one with NUL".into(),
        ));
    }
    Ok(target.to_string())
}

/// The tree holds `what` at `rel`.
pub(super) fn refused(rel: &str, what: String) -> SandboxError {
    SandboxError::InvalidInput(format!(
        "the repository's tree holds {what} at `{}`; it cannot go into the sandbox",
        rel.chars().take(300).collect::<String>()
    ))
}

/// The object of `rel` is not in the repository (or not what its tree says it is).
pub(super) fn missing(rel: &str, e: git2::Error) -> SandboxError {
    SandboxError::InvalidInput(format!(
        "the object of `{rel}` cannot be read from the repository: {}",
        e.message()
    ))
}

/// The blob `id` at `rel`, refused when the object is something else.
pub(super) fn read_blob<'o>(
    odb: &'o git2::Odb<'_>,
    rel: &str,
    id: git2::Oid,
) -> Result<git2::OdbObject<'o>> {
    let object = odb.read(id).map_err(|e| missing(rel, e))?;
    if object.kind() != git2::ObjectType::Blob {
        return Err(missing(
            rel,
            git2::Error::from_str(&format!("{id} is a {}, not a blob", object.kind())),
        ));
    }
    Ok(object)
}
