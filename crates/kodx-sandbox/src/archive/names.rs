//! Names in an archive: an entry's name turned into a path under the tree's root, the
//! checks every relative path and symlink target passes, and whether a symlink, followed
//! through the others in the tree, stays inside it.

use super::limits::{MAX_NAME_BYTES, MAX_SYMLINK_HOPS};
use crate::error::{Result, SandboxError};

/// Turns an archive name into a path relative to `root`: refuses non-UTF-8, empty, overlong,
/// NUL-containing and absolute names, `..` components, and names outside `root`;
/// drops empty and `.` components.
pub(super) fn strip_root(raw: &[u8], root: &str) -> Result<String, String> {
    let name = std::str::from_utf8(raw).map_err(|_| "name is not UTF-8".to_string())?;
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("name longer than {MAX_NAME_BYTES} bytes"));
    }
    if name.contains('\0') {
        return Err("NUL byte in name".into());
    }
    if name.starts_with('/') {
        return Err("absolute path".into());
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err("path with a `..` component".into()),
            part => parts.push(part),
        }
    }
    if !root.is_empty() {
        if parts.first() != Some(&root) {
            return Err(format!("entry is not under {root:?}"));
        }
        parts.remove(0);
    }
    Ok(parts.join("/"))
}

/// A canonical relative path: non-empty, no NUL, not absolute, no empty/`.`/`..` component.
pub(super) fn check_rel(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.contains('\0') {
        return Err("NUL byte in path".into());
    }
    if path.starts_with('/') {
        return Err("absolute path".into());
    }
    if path.split('/').any(|p| matches!(p, "" | "." | "..")) {
        return Err("path with an empty, `.` or `..` component".into());
    }
    Ok(())
}

/// Syntax only (empty, overlong, NUL); whether the target stays inside the tree is
/// [`check_link`]'s job.
pub(super) fn check_target_syntax(target: &str) -> Result<(), String> {
    if target.is_empty() {
        return Err("empty target".into());
    }
    if target.len() > MAX_NAME_BYTES {
        return Err(format!("target longer than {MAX_NAME_BYTES} bytes"));
    }
    if target.contains('\0') {
        return Err("NUL byte in target".into());
    }
    Ok(())
}

/// Checks that the symlink at `link` with `target` stays inside the tree when resolved from
/// the link's own directory. `lookup` gives the target of another symlink in the tree, which
/// is followed (so a chain of individually harmless links cannot climb out); with a lookup
/// that knows no links the check is purely lexical.
pub(super) fn check_link<'t>(
    link: &'t str,
    target: &'t str,
    lookup: &dyn Fn(&str) -> Option<&'t str>,
) -> Result<(), String> {
    let mut dir: Vec<&str> = link.split('/').collect();
    dir.pop();
    resolve(&mut dir, target, lookup, &mut 0)
}

pub(super) fn resolve<'t>(
    at: &mut Vec<&'t str>,
    target: &'t str,
    lookup: &dyn Fn(&str) -> Option<&'t str>,
    hops: &mut usize,
) -> Result<(), String> {
    check_target_syntax(target)?;
    if target.starts_with('/') {
        return Err("absolute target".into());
    }
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if at.pop().is_none() {
                    return Err("points outside the tree".into());
                }
            }
            part => {
                at.push(part);
                if let Some(next) = lookup(&at.join("/")) {
                    *hops += 1;
                    if *hops > MAX_SYMLINK_HOPS {
                        return Err("too many levels of symlinks".into());
                    }
                    at.pop();
                    resolve(at, next, lookup, hops)?;
                }
            }
        }
    }
    Ok(())
}

/// The proper ancestors of a relative path, shallowest first: "a/b/c" → "a", "a/b".
pub(super) fn ancestors(rel: &str) -> impl Iterator<Item = &str> {
    rel.match_indices('/').map(move |(i, _)| &rel[..i])
}

pub(super) fn is_git(path: &str) -> bool {
    path == ".git" || path.starts_with(".git/")
}

/// Checks the root a tar stream is read under: the tree's (`""`) or a single file name.
pub(super) fn check_root(root: &str) -> Result<()> {
    if !root.is_empty() && (root.contains('/') || check_rel(root).is_err()) {
        return Err(SandboxError::InvalidInput(format!(
            "bad archive root {root:?}: it must be a single file name"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_relative_to_the_root() {
        assert_eq!(strip_root(b"repo/a/./b", "repo").as_deref(), Ok("a/b"));
        assert_eq!(strip_root(b"repo", "repo").as_deref(), Ok(""));
        assert_eq!(strip_root(b"a//b", "").as_deref(), Ok("a/b"));
        assert!(strip_root(b"other/a", "repo").is_err());
        assert!(strip_root(b"repo/../x", "repo").is_err());
        assert!(strip_root(b"/repo/a", "repo").is_err());
        assert!(strip_root(&[b'r', 0xff], "").is_err());
    }

    #[test]
    fn symlinks_are_followed_through_the_tree() {
        let none = |_: &str| -> Option<&'static str> { None };
        assert!(check_link("a/l", "../b", &none).is_ok());
        assert!(check_link("a/l", "../../b", &none).is_err());
        assert!(check_link("l", "/etc", &none).is_err());
        // Harmless on its own, out of the tree through the link `up -> ..`.
        let links = |p: &str| -> Option<&'static str> { (p == "up").then_some("..") };
        assert!(check_link("a/l", "../up/x", &links).is_err());
        assert!(check_link("a/l", "../x", &links).is_ok());
        // A loop of links ends in an error, not a hang.
        let looping = |p: &str| -> Option<&'static str> { (p == "loop").then_some("loop") };
        assert!(check_link("l", "loop", &looping).is_err());
    }
}
