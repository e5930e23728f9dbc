//! Problems read from a red check's output, for the `kodx` Check Run's annotations (SPEC
//! §12): file, line, level and message in the common formats.
//!
//! - `path:line[:col]: error|warning|note: message` — gcc, clang, go vet, mypy,
//!   shellcheck `-f gcc` (a trailing `[code]` — `[-Wunused-variable]`, `[SC2086]`,
//!   `[return-value]` — becomes the title); without a level word, `path:line:col: CODE
//!   message` (flake8, ruff's concise format: the code is the title, `W…` codes are
//!   warnings), `path:line:col: message [Error/rule]` (eslint's unix format) and
//!   `path:line:col: message` (go vet, go build);
//! - rustc and cargo (and ruff's full format): `error[E0308]: message`, `warning: message`
//!   (or `F401 message`) followed within a few lines by `--> path:line:col`; a panic,
//!   `thread 'name' panicked at path:line:col:` with the message on the lines below
//!   (indented too, as cargo nextest shows a test's output);
//! - pytest: `path:line: ExceptionType` (the long traceback's last line) with the `E   `
//!   lines above it; when that place is outside the repository, or with `--tb=short`
//!   (frames `path:line: in name`), the innermost frame inside it;
//! - Go test: `    file_test.go:line: message` (indented; the path as printed, relative to
//!   the package) of the tests reported `--- FAIL`, continuation lines included.
//!
//! Escape sequences (colour, hyperlinks) are stripped first. Only paths inside the
//! repository are kept: relative ones without `..`, and absolute ones under the repository's
//! directory, made relative; `./` is dropped. Messages and titles are bounded, duplicates
//! dropped, and at most [`MAX_ANNOTATIONS`] come out of one output, read in one pass.

use serde::{Deserialize, Serialize};

/// How grave an annotation is, in GitHub's words (`annotation_level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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

/// Annotations read from one output at most.
pub const MAX_ANNOTATIONS: usize = 200;
/// The longest message kept, in characters (GitHub takes 64 KB).
pub const MAX_MESSAGE_CHARS: usize = 1000;
/// The longest title kept, in characters (GitHub takes 255).
pub const MAX_TITLE_CHARS: usize = 120;
/// Of a longer line only its start is read.
const MAX_LINE_BYTES: usize = 16 * 1024;
/// The longest path kept, in bytes.
const MAX_PATH_BYTES: usize = 1024;
/// Lines below a problem's first line added to its message at most.
const MAX_DETAIL_LINES: usize = 20;
/// Lines after a rustc-style header within which its `-->` line must come.
const HEADER_REACH: u8 = 4;
/// Go test lines held for tests whose verdict has not come yet, at most.
const MAX_GO_PENDING: usize = 1000;

mod lines;
mod parser;
pub use parser::{for_check, parse};

#[cfg(test)]
mod tests;
