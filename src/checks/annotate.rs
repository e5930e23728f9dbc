//! Problems read from a red check's output, for the `kodx` Check Run's annotations (SPEC
//! §12): file, line, level and message in the common formats.

use serde::{Deserialize, Serialize};

/// How grave an annotation is, in GitHub's words (`annotation_level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Notice,
    Warning,
    Failure,
}

/// One problem at a place in the repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotation {
    /// A path relative to the repository's root.
    pub path: String,
    pub start_line: u32,
    pub end_line: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_column: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_column: Option<u32>,
    pub level: Level,
    pub message: String,
    /// A short title (e.g. the check's name or the error's code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}
