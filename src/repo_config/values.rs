//! The values of `.github/kodx.yml` that are checked while they are read, so that
//! serde_norway reports the line and key path of an offending value: strings written as
//! strings, amounts, counts, file patterns, branch prefixes and template names, and the
//! visitors they are read with.

use serde::Deserialize;

/// Longest accepted `pr.branch_prefix`.
pub const MAX_BRANCH_PREFIX_LEN: usize = 64;

pub(super) struct Text(pub(super) String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("a string", |s| Ok(Text(s.to_string()))))
    }
}

/// `setup_cache_key_files`: at most [`MAX_KEY_PATTERNS`] relative paths or patterns.
///
/// [`MAX_KEY_PATTERNS`]: crate::sandbox::setup_cache::MAX_KEY_PATTERNS
pub(super) struct KeyFiles(pub(super) Vec<String>);

/// One `setup_cache_key_files` entry.
pub(super) struct KeyFile(pub(super) String);

impl<'de> Deserialize<'de> for KeyFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("a path relative to the repository root", |s| {
            crate::sandbox::setup_cache::check_pattern(s).map(|()| KeyFile(s.to_string()))
        }))
    }
}

impl<'de> Deserialize<'de> for KeyFiles {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use crate::sandbox::setup_cache::MAX_KEY_PATTERNS;
        let list: Vec<KeyFile> = Vec::deserialize(deserializer)?;
        if list.len() > MAX_KEY_PATTERNS {
            return Err(serde::de::Error::custom(format!(
                "must list at most {MAX_KEY_PATTERNS} paths, got {}",
                list.len()
            )));
        }
        Ok(KeyFiles(list.into_iter().map(|k| k.0).collect()))
    }
}

/// A positive, finite amount of USD.
pub(super) struct Usd(pub(super) f64);

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NumberVisitor("a positive amount of USD", |v| {
            if v.is_finite() && v > 0.0 {
                Ok(Usd(v))
            } else {
                Err(format!("must be a positive amount of USD, got {v}"))
            }
        }))
    }
}

/// A finite amount of USD, zero or more (`confirm_above_usd: 0` asks for every run).
pub(super) struct UsdOrZero(pub(super) f64);

impl<'de> Deserialize<'de> for UsdOrZero {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NumberVisitor("an amount of USD", |v| {
            if v.is_finite() && v >= 0.0 {
                Ok(UsdOrZero(v))
            } else {
                Err(format!("must be an amount of USD, zero or more, got {v}"))
            }
        }))
    }
}

/// An iteration count of at least 1.
pub(super) struct Iterations(pub(super) u32);

impl<'de> Deserialize<'de> for Iterations {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IntegerVisitor("a whole number of at least 1", |v| {
            match u32::try_from(v) {
                Ok(n) if n >= 1 => Ok(Iterations(n)),
                _ if v < 1 => Err(format!("must be at least 1, got {v}")),
                _ => Err(format!("must be at most {}, got {v}", u32::MAX)),
            }
        }))
    }
}

/// The name of a pull request template: a file name in `PULL_REQUEST_TEMPLATE/`, with or
/// without its extension.
pub(super) struct TemplateName(pub(super) String);

impl<'de> Deserialize<'de> for TemplateName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor(
            "the name of a file in PULL_REQUEST_TEMPLATE/, such as bugfix",
            |s| {
                let bad = |why: &str| Err(format!("{why}, got \"{}\"", s.escape_default()));
                if s.trim().is_empty() {
                    bad("must not be empty")
                } else if s.chars().count() > 100 {
                    bad("must be at most 100 characters")
                } else if s.contains(['/', '\\']) || s.chars().any(char::is_control) {
                    bad("must be a file name, without a directory")
                } else {
                    Ok(TemplateName(s.trim().to_string()))
                }
            },
        ))
    }
}

/// A prefix of a git branch name.
pub(super) struct BranchPrefix(pub(super) String);

impl<'de> Deserialize<'de> for BranchPrefix {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("a branch name prefix such as kodx/", |s| {
            check_branch_prefix(s).map(|()| BranchPrefix(s.to_string()))
        }))
    }
}

/// Accepts any number, checked by the function.
pub(super) struct NumberVisitor<T>(
    pub(super) &'static str,
    pub(super) fn(f64) -> Result<T, String>,
);

impl<T> serde::de::Visitor<'_> for NumberVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<T, E> {
        self.visit_f64(v as f64)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<T, E> {
        self.visit_f64(v as f64)
    }
}

/// Accepts any integer, checked by the function.
pub(super) struct IntegerVisitor<T>(
    pub(super) &'static str,
    pub(super) fn(i128) -> Result<T, String>,
);

impl<T> serde::de::Visitor<'_> for IntegerVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<T, E> {
        (self.1)(v.into()).map_err(E::custom)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<T, E> {
        (self.1)(v.into()).map_err(E::custom)
    }
}

/// Accepts a string, checked by the function.
pub(super) struct StrVisitor<T>(
    pub(super) &'static str,
    pub(super) fn(&str) -> Result<T, String>,
);

impl<T> serde::de::Visitor<'_> for StrVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
}

/// A prefix that stays a valid git ref component start: non-empty, at most 64 characters,
/// no whitespace or control characters, no `..`, no leading `/` or `-`, none of `~^:?*[\`.
pub(super) fn check_branch_prefix(s: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{why}, got \"{}\"", s.escape_default()));
    if s.is_empty() {
        return Err("must not be empty".to_string());
    }
    if s.chars().count() > MAX_BRANCH_PREFIX_LEN {
        return bad(&format!(
            "must be at most {MAX_BRANCH_PREFIX_LEN} characters"
        ));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("must not contain spaces or control characters");
    }
    if s.contains("..") {
        return bad("must not contain \"..\"");
    }
    if s.starts_with('/') || s.starts_with('-') {
        return bad("must not start with \"/\" or \"-\"");
    }
    if let Some(c) = s.chars().find(|c| "~^:?*[\\".contains(*c)) {
        return bad(&format!("must not contain '{c}'"));
    }
    Ok(())
}
