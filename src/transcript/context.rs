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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::Record;

    /// A `context` record as kodx wrote it when the record held untyped JSON (the context's
    /// keys sorted), and one with only its branch, read back as before; written again, it
    /// says the same.
    #[test]
    fn earlier_context_records_read_the_same() {
        let line = r#"{"type":"context","context":{"branch":"main","commit":"0123456789abcdef0123","instructions":{"bytes":14,"cut":false,"path":"docs/AGENTS.md","text":"Run make test.","via":"AGENTS.md"},"nested":["web/AGENTS.md"],"nested_more":2,"notes":["CLAUDE.md was not read: AGENTS.md is used"],"template":{"cut":false,"path":".github/pull_request_template.md","text":"Why this change:"}}}"#;
        let Record::Context { context } = serde_json::from_str(line).unwrap() else {
            panic!("not a context record")
        };
        assert_eq!(context.branch, "main");
        assert_eq!(context.commit.as_deref(), Some("0123456789abcdef0123"));
        let i = context.instructions.as_ref().unwrap();
        assert_eq!(
            (i.path.as_str(), i.via.as_deref(), i.bytes, i.cut),
            ("docs/AGENTS.md", Some("AGENTS.md"), 14, false)
        );
        assert_eq!(context.nested, ["web/AGENTS.md"]);
        assert_eq!(context.nested_more, 2);
        assert_eq!(context.template.as_ref().unwrap().text, "Why this change:");
        assert_eq!(context.notes.len(), 1);
        // Keys in the struct's order now, not sorted as the untyped value had them.
        let again = serde_json::to_string(&Record::Context { context }).unwrap();
        let value = |l: &str| serde_json::from_str::<serde_json::Value>(l).unwrap();
        assert_eq!(value(&again), value(line));

        let bare = r#"{"type":"context","context":{"branch":"dev"}}"#;
        let Record::Context { context } = serde_json::from_str(bare).unwrap() else {
            panic!("not a context record")
        };
        assert_eq!(
            context,
            RepoContext {
                branch: "dev".into(),
                ..RepoContext::default()
            }
        );
    }
}
