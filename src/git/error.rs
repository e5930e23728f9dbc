//! Why a git operation failed ([`GitError`]), and what a maintainer can do about a refused push.

/// Why a git operation failed. The message is one actionable line without the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    #[error(
        "the git server refused the installation token: check that the app is installed on \
         the repository and has the contents permission (write, to push)"
    )]
    Auth,
    #[error(
        "the git server has no such repository (HTTP 404): check the clone URL and that the \
         app is installed on the repository"
    )]
    NotFound,
    /// The repository exists but lacks the branch or pull request ref asked for.
    #[error("the repository has no {0}")]
    RefNotFound(String),
    #[error("the git server rejected the push: {reason}")]
    Rejected { reason: String },
    #[error("could not talk to the git server: {0}")]
    Network(String),
    /// The URL was refused before any request was made.
    #[error("refusing the git URL: {0}")]
    InvalidUrl(String),
    /// The remote branch moved meanwhile and kodx's commits conflict with the new ones.
    #[error(
        "the branch moved on the server meanwhile and kodx's commits conflict with the new \
         commits in {}; nothing was pushed",
        list_paths(paths)
    )]
    Conflict { paths: Vec<String> },
    /// A merge's conflicted files still hold conflict markers: nothing was committed.
    #[error(
        "conflict markers are still in {}; a merge is committed only once every conflict is resolved",
        list_paths(paths)
    )]
    MarkersLeft { paths: Vec<String> },
    /// A changed file is larger than the limit: nothing was committed.
    #[error(
        "the change to `{path}` is {bytes} bytes, over the limit of {limit} bytes for a \
         changed file; nothing was committed"
    )]
    TooLarge {
        path: String,
        bytes: u64,
        limit: u64,
    },
    /// The remote branch was still ahead after rebasing onto it `attempts` times.
    #[error(
        "the branch `{branch}` kept moving on the server: after {attempts} rebase(s) onto \
         it the push was still refused as non-fast-forward; kodx never force-pushes"
    )]
    Moved { branch: String, attempts: u32 },
    /// The push was stopped before it sent anything: its caller's check said no (the run
    /// it was for is no longer this process's).
    #[error("the push was not sent: the run it was for is no longer this process's")]
    Withheld,
    #[error("git failed: {0}")]
    Other(String),
}

/// `a`, `b` and 3 more — for an error message.
fn list_paths(paths: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut out = paths
        .iter()
        .take(SHOWN)
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        out.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    if out.is_empty() {
        out.push_str("some files");
    }
    out
}

/// A sentence a maintainer can act on for the reason a git server gave for refusing a push
/// ([`GitError::Rejected`]): GitHub's workflow-permission, protected-branch, ruleset,
/// push-protection and file-size refusals are recognised; anything else is `reason` itself.
pub fn explain_rejection(reason: &str) -> String {
    let lower = reason.to_ascii_lowercase();
    let said = format!(" (GitHub said: {reason})");
    if lower.contains("to create or update workflow")
        || (lower.contains("workflow") && lower.contains("permission"))
    {
        let file = reason
            .split('`')
            .find(|part| part.starts_with(".github/workflows/"))
            .map(|f| format!(", such as `{f}`"))
            .unwrap_or_default();
        return format!(
            "the App is not allowed to change files under .github/workflows/{file} (it lacks \
             the workflows permission); grant the App the workflows permission, or ask for a \
             change that leaves .github/workflows/ alone{said}"
        );
    }
    if lower.contains("gh009")
        || lower.contains("push protection")
        || lower.contains("secrets detected")
        || lower.contains("push cannot contain secrets")
    {
        return format!(
            "GitHub's push protection found what looks like a secret in the changes, so the \
             push was refused; remove the secret from the change and ask again{said}"
        );
    }
    if lower.contains("protected branch") || lower.contains("gh006") {
        return format!(
            "the push was refused because the branch is protected (it may require pull \
             requests, reviews or status checks, or forbid pushes by apps); allow the App to \
             push to it, or ask kodx to work on another branch{said}"
        );
    }
    if lower.contains("gh013") || lower.contains("repository rule violation") {
        return format!(
            "the push was refused by the repository's rules (rulesets) for this branch; \
             allow the App to bypass them, or ask kodx to work on another branch{said}"
        );
    }
    if lower.contains("gh001") || lower.contains("large files detected") {
        return format!(
            "the push was refused because a file exceeds GitHub's file size limit (100 MB)\
             {said}"
        );
    }
    if lower.contains("non-fast-forward") || lower.contains("fetch first") {
        return format!(
            "the branch moved on the server and kodx's commits are not on top of it; kodx \
             never force-pushes{said}"
        );
    }
    reason.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_are_explained() {
        let workflow = "refs/heads/main: refusing to allow a GitHub App to create or update \
                        workflow `.github/workflows/x.yml` without `workflows` permission";
        let e = explain_rejection(workflow);
        assert!(
            e.starts_with("the App is not allowed to change files under .github/workflows/, such as `.github/workflows/x.yml` (it lacks the workflows permission); "),
            "{e}"
        );
        assert!(e.ends_with(&format!("(GitHub said: {workflow})")), "{e}");

        let protected = "refs/heads/main: protected branch hook declined; the server said: \
                         error: GH006: Protected branch update failed for refs/heads/main.";
        let e = explain_rejection(protected);
        assert!(e.contains("the branch is protected"), "{e}");

        let rules = "refs/heads/main: push declined due to repository rule violations; the \
                     server said: error: GH013: Repository rule violations found for refs/heads/main.";
        assert!(explain_rejection(rules).contains("rulesets"), "{rules}");
        let secrets = "refs/heads/main: push declined due to repository rule violations; the \
                       server said: error: GH013: Repository rule violations found. - GITHUB PUSH PROTECTION";
        assert!(explain_rejection(secrets).contains("secret"));
        assert!(explain_rejection("error: GH001: Large files detected.").contains("100 MB"));
        assert!(explain_rejection("refs/heads/x: non-fast-forward").contains("never force-pushes"));
        assert_eq!(
            explain_rejection("refs/heads/x: funny"),
            "refs/heads/x: funny"
        );
    }

    #[test]
    fn conflict_messages_list_paths() {
        let e = GitError::Conflict {
            paths: (0..12).map(|i| format!("f{i}")).collect(),
        };
        let m = e.to_string();
        assert!(m.contains("`f0`, `f1`"), "{m}");
        assert!(m.contains("and 2 more"), "{m}");
        assert!(!m.contains("`f10`"), "{m}");
    }
}
