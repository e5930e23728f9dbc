//! The one error type of the GitHub client. Callers branch on the variant (a missing file or
//! a non-collaborator is `NotFound`, a rate limit says when to come back); every message is
//! one line and never holds a token.

use std::time::Duration;

/// What went wrong talking to GitHub. `what` names the request (`GET /repos/o/r/issues/1`).
#[derive(Debug, thiserror::Error)]
pub enum GitHubError {
    /// The App's own settings are unusable (key, app id, API URL).
    #[error("GitHub App configuration: {0}")]
    Config(String),
    /// 404 (or 410): the thing does not exist, or the installation cannot see it.
    #[error("{what}: not found on GitHub")]
    NotFound { what: String },
    /// 401: the JWT or the installation token was refused.
    #[error("{what}: GitHub refused the credentials (401): {message}")]
    Unauthorized { what: String, message: String },
    /// 403 that is not a rate limit: the App lacks a permission.
    #[error("{what}: forbidden by GitHub (403): {message}")]
    Forbidden { what: String, message: String },
    /// 403/429 with a rate-limit signal whose reset is too far away to wait for.
    #[error("{what}: GitHub rate limit reached; it resets in {}s", reset_in.as_secs())]
    RateLimited { what: String, reset_in: Duration },
    /// 422 on opening a pull request: one from this head (`owner:branch`) into this base is
    /// already open; [`Installation::find_open_pull`](super::Installation::find_open_pull)
    /// finds it.
    #[error("{what}: a pull request from {head} is already open")]
    PullExists { what: String, head: String },
    /// 422 on opening a pull request: the head has no commits the base lacks (GitHub's
    /// "No commits between BASE and HEAD" in `message`).
    #[error("{what}: GitHub answered 422: {message}")]
    NoCommits { what: String, message: String },
    /// Any other non-success status; `message` is GitHub's `message` field.
    #[error("{what}: GitHub answered {status}: {message}")]
    Http {
        what: String,
        status: u16,
        message: String,
    },
    /// No answer: connection refused, timeout, broken response (after the retries).
    #[error("{what}: cannot reach GitHub: {message}")]
    Network { what: String, message: String },
    /// A write not sent: its [`WriteGuard`](super::WriteGuard) said no (the run it was
    /// for is no longer this process's).
    #[error("{what}: not sent: the work it was for is no longer this process's")]
    Withheld { what: String },
    /// An answer that is not what the API documents (bad JSON, missing field, a directory
    /// where a file was expected, text that is not UTF-8).
    #[error("{what}: unexpected answer from GitHub: {message}")]
    Decode { what: String, message: String },
}

impl GitHubError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, GitHubError::NotFound { .. })
    }

    /// The HTTP status GitHub answered, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            GitHubError::NotFound { .. } => Some(404),
            GitHubError::Unauthorized { .. } => Some(401),
            GitHubError::Forbidden { .. } => Some(403),
            GitHubError::PullExists { .. } | GitHubError::NoCommits { .. } => Some(422),
            GitHubError::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub(crate) fn decode(what: &str, message: impl Into<String>) -> GitHubError {
        GitHubError::Decode {
            what: what.to_string(),
            message: one_line(&message.into()),
        }
    }
}

/// Makes a message safe to show: one line, at most 300 characters, token shapes redacted.
pub(crate) fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut: String = joined.chars().take(300).collect();
    let cut = if cut.len() < joined.len() {
        cut + "…"
    } else {
        cut
    };
    crate::redact::redact(&cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_redacted_line() {
        let m = one_line("Bad\ncredentials for ghs_abcdefghijklmnopqrstuvwxyz0123456789");
        assert!(!m.contains('\n'));
        assert!(
            !m.contains("ghs_abcdefghijklmnopqrstuvwxyz0123456789"),
            "{m}"
        );
        assert!(m.starts_with("Bad credentials"));
        assert_eq!(one_line(&"x".repeat(1000)).chars().count(), 301);
    }
}
