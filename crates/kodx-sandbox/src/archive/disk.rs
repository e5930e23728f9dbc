//! Where a path under a host directory may be written: each parent checked without
//! following a symlink.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::limits::{io_at, unsafe_archive};
use super::names::ancestors;
use crate::error::{Result, SandboxError};

/// How [`checked_path`] treats missing parents, and parents that are not directories.
pub(super) enum Walk<'s> {
    /// Create missing parents.
    Create,
    /// Stop at a missing parent: there is nothing at the path.
    Lookup,
    /// Like `Lookup`, but a parent that `deleted` removes first is no obstacle.
    Precheck { deleted: &'s BTreeSet<&'s str> },
}

/// `dest/rel`, after checking each parent below `dest` with `symlink_metadata` (never
/// following a symlink): a symlink or other non-directory parent is refused. `None` when a
/// parent is missing (or, in a precheck, deleted first), so nothing is at `rel`.
pub(super) fn checked_path(dest: &Path, rel: &str, walk: Walk) -> Result<Option<PathBuf>> {
    for parent in ancestors(rel) {
        let path = dest.join(parent);
        match (fs::symlink_metadata(&path), &walk) {
            (Ok(m), _) if m.is_dir() => {}
            (Ok(_), Walk::Precheck { deleted }) if deleted.contains(parent) => return Ok(None),
            (Ok(m), _) => {
                return Err(unsafe_archive(if m.file_type().is_symlink() {
                    format!("{rel:?}: refusing to write through the symlink {parent:?}")
                } else {
                    format!("{rel:?}: its parent {parent:?} is not a directory")
                }))
            }
            (Err(e), Walk::Create) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&path).map_err(io_at("creating directory", &path))?
            }
            (Err(e), _) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            (Err(e), _) => {
                return Err(SandboxError::io(
                    format!("inspecting {}", path.display()),
                    e,
                ))
            }
        }
    }
    Ok(Some(dest.join(rel)))
}
