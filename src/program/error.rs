//! Why a program file or `.kodx/config.toml` could not be used: [`ProgramError`].

use std::io;
use std::path::PathBuf;

use super::spec::Format;

/// Why a program file or `.kodx/config.toml` could not be used. Every variant names the
/// file; the messages are meant to be shown to the user as they are.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{}: cannot read: {source}", .path.display())]
    Read { path: PathBuf, source: io::Error },

    #[error("{file}: invalid {format}{}: {message}", at_line(*.line))]
    Syntax {
        file: String,
        format: Format,
        line: Option<usize>,
        message: String,
    },

    #[error("{file}: unknown key \"{key}\"{} (expected one of: {})", at_line(*.line), .expected.join(", "))]
    UnknownKey {
        file: String,
        /// Dotted path, e.g. `model.nmae`.
        key: String,
        line: Option<usize>,
        expected: Vec<String>,
    },

    #[error("{file}: missing required key \"{key}\" ({hint})")]
    MissingKey {
        file: String,
        key: String,
        hint: &'static str,
    },

    #[error("{file}: invalid value for \"{key}\"{}: {message}", at_line(*.line))]
    InvalidValue {
        file: String,
        key: String,
        line: Option<usize>,
        message: String,
    },

    /// A problem not tied to one key (e.g. the file is a list, not a mapping).
    #[error("{file}{}: {message}", at_line(*.line))]
    Invalid {
        file: String,
        line: Option<usize>,
        message: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}
