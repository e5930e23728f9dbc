//! Where a code run's change goes ([`Target`]) and the name of its branch (SPEC §5). The
//! commit message and the pull request's body are words kodx posts: [`crate::serve::texts`].

/// Where the change of a code run goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A new branch in the base repository and a new pull request into `base`: for issues
    /// (`closes`), and for pull requests from forks (`original`).
    NewPull {
        branch: String,
        base: String,
        closes: Option<i64>,
        original: Option<i64>,
    },
    /// Commits onto the pull request's own branch (same repository).
    PullBranch { branch: String },
    /// The merge of `base` into the pull request's own branch, its conflicts resolved:
    /// committed as a merge commit and pushed without rebasing (SPEC §12).
    Merge { branch: String, base: String },
}

impl Target {
    /// The branch the change is pushed to.
    pub fn branch(&self) -> &str {
        match self {
            Target::NewPull { branch, .. }
            | Target::PullBranch { branch }
            | Target::Merge { branch, .. } => branch,
        }
    }

    /// What the pull request's body says of where the run was asked.
    pub fn mention(&self) -> crate::serve::texts::Mention {
        use crate::serve::texts::Mention;
        match self {
            Target::NewPull {
                closes: Some(n), ..
            } => Mention::Closes(*n),
            Target::NewPull {
                original: Some(n), ..
            } => Mention::OnTopOf(*n),
            _ => Mention::Nothing,
        }
    }
}

/// The first 8 characters of a run id: enough to tell a repository's runs apart.
pub fn short_id(run_id: &str) -> &str {
    &run_id[..run_id.len().min(8)]
}

/// `<prefix>issue-<N>-<short run id>` for an issue, `<prefix>pr-<N>-<short run id>` for a
/// fork's pull request. The prefix was checked when `.github/kodx.yml` was read.
pub fn branch_name(prefix: &str, is_pull_request: bool, number: i64, run_id: &str) -> String {
    let what = if is_pull_request { "pr" } else { "issue" };
    format!("{prefix}{what}-{number}-{}", short_id(run_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names() {
        assert_eq!(
            branch_name("kodx/", false, 12, "0123456789ab"),
            "kodx/issue-12-01234567"
        );
        assert_eq!(branch_name("bot-", true, 3, "abc"), "bot-pr-3-abc");
    }
}
