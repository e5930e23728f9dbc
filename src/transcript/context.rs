//! The transcript's `context` record: what the run's first message carried from the
//! repository (its instructions, nested `AGENTS.md` paths, pull request template, and what
//! was left out), as the run page reads it back. Read from the repository by
//! `serve::pipeline::repo_context`; every field has a default, so a record an earlier
//! version wrote stays readable.

use serde::{Deserialize, Serialize};

/// What the model was given about the repository, kept with the run (transcript, run page).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RepoContext {
    /// The branch it was read from, and its commit.
    pub branch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<Instructions>,
    /// Nested `AGENTS.md` files, by path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nested: Vec<String>,
    /// How many more there are than listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nested_more: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
    /// What was found but not given, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The repository's instructions as given to the model.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Instructions {
    /// The file read (a link's target when the instruction file is a link).
    pub path: String,
    /// The instruction file's name when it is a link to `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Cleaned of hidden text, at most `MAX_INSTRUCTIONS_BYTES` read.
    pub text: String,
    /// The file's size in bytes.
    pub bytes: u64,
    /// Only its first `MAX_INSTRUCTIONS_BYTES` were read.
    pub cut: bool,
}

/// The pull request template the body follows.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Template {
    pub path: String,
    /// Cleaned of hidden text (a template's HTML comments are guidance for people).
    pub text: String,
    pub cut: bool,
}
