//! The sentences of a merge run (SPEC §12, "Mergeable pull requests"): what the model is
//! told, what the status comment and the commit say.

use crate::git::{ConflictKind, PreparedMerge};
use crate::neutral;
use crate::redact::redact;

fn short(sha: &str) -> &str {
    sha.get(..7).unwrap_or(sha)
}

/// What the merge run does, told after the pull request's diff (the files follow once the
/// merge is made: [`conflicts_brief`]).
pub fn task() -> String {
    "The pull request's base branch moved on and now conflicts with this pull request. kodx merged \
         it into the pull request's branch in your workspace: HEAD is that merge (its first \
         parent the branch's head, its second the base's tip), and each conflicted file \
         holds git's conflict markers (`<<<<<<<`, `=======`, `>>>>>>>`). Resolve every \
         conflict so the result keeps what both sides meant: the pull request's change, \
         brought up to date with what the base changed. Remove every marker, make sure the \
         code still builds and its tests pass where you can run them, and change nothing the \
         merge does not need. Do not commit: kodx commits your work as the merge commit, and \
         refuses it while a marker is left in a conflicted file. `git diff HEAD^1` shows \
         what the base brought in; `git log HEAD^2` the base's commits.\n\n"
        .to_string()
}

/// The conflicted files and both sides' commits, added to the run's first message once
/// the merge is made in its workspace.
pub fn conflicts_brief(m: &PreparedMerge, branch: &str, base: &str) -> String {
    let mut out = format!(
        "The merge: {} at {} (this pull request's head) and {} at {} (the base's tip).\n",
        neutral::code(branch),
        short(&m.head),
        neutral::code(base),
        short(&m.base)
    );
    if m.conflicts.is_empty() {
        out.push_str(
            "It has no conflicts after all: check that the merged code builds and its tests \
             pass, and fix only what the merge broke.\n",
        );
        return out;
    }
    out.push_str("The conflicted files:\n");
    for c in &m.conflicts {
        let how = match c.kind {
            ConflictKind::Both => "changed on both sides: markers left in it",
            ConflictKind::DeletedInBase => {
                "deleted by the base, changed by the pull request: the pull request's version \
                 is in the workspace; delete it or keep it"
            }
            ConflictKind::DeletedInBranch => {
                "deleted by the pull request, changed by the base: the base's version is in \
                 the workspace; delete it or keep it"
            }
            ConflictKind::Binary => {
                "a binary file changed on both sides: the pull request's version is in the \
                 workspace"
            }
        };
        out.push_str(&format!("- {} ({how})\n", neutral::code(&c.path)));
    }
    out
}

/// What the commit's subject and the stored result say was asked.
pub fn request(base: &str, branch: &str) -> String {
    format!("Merge branch '{base}' into {branch}, resolving its conflicts")
}

/// How the merge run came to be, under its result in the status comment. `state` is
/// GitHub's `mergeable_state` when kodx read it; `asked_by` who wrote `/kodx update`.
pub fn note(base: &str, state: Option<&str>, asked_by: Option<&str>) -> String {
    let state = state
        .map(|s| format!(" (GitHub's `mergeable_state`: {})", neutral::code(s)))
        .unwrap_or_default();
    match asked_by {
        Some(who) => format!(
            "@{} asked with `/kodx update`, and merging {} into this pull request \
             conflicted{state}: kodx started this run to resolve the conflicts with a merge commit.",
            redact(who),
            neutral::code(base)
        ),
        None => format!(
            "A push to {} left this pull request conflicted{state}, and the repository keeps \
             kodx's pull requests mergeable (`pr.keep_mergeable`): kodx started this run to \
             resolve the conflicts with a merge commit.",
            neutral::code(base)
        ),
    }
}

/// The merge could not be made in the run's clone.
pub fn prepare_failed(error: &str) -> String {
    format!(
        "kodx could not merge the base into this pull request's branch: {}. Nothing was \
         pushed; merge by hand, or run `/kodx update` again.",
        redact(error)
    )
}

/// The branch already held the base when the run merged it.
pub fn nothing_to_merge(base: &str) -> String {
    format!(
        "The branch already holds {}: there was nothing to merge, and no model was called.",
        neutral::code(base)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::Conflict;

    #[test]
    fn the_brief_names_the_files_and_both_commits() {
        let m = PreparedMerge {
            head: "a".repeat(40),
            base: "b".repeat(40),
            conflicts: vec![
                Conflict {
                    path: "a.txt".into(),
                    kind: ConflictKind::Both,
                },
                Conflict {
                    path: "gone.rs".into(),
                    kind: ConflictKind::DeletedInBase,
                },
            ],
            up_to_date: false,
        };
        insta::assert_snapshot!(conflicts_brief(&m, "kodx/issue-7-x", "main"), @"
        The merge: `kodx/issue-7-x` at aaaaaaa (this pull request's head) and `main` at bbbbbbb (the base's tip).
        The conflicted files:
        - `a.txt` (changed on both sides: markers left in it)
        - `gone.rs` (deleted by the base, changed by the pull request: the pull request's version is in the workspace; delete it or keep it)
        ");
        insta::assert_snapshot!(note("main", Some("dirty"), None), @"A push to `main` left this pull request conflicted (GitHub's `mergeable_state`: `dirty`), and the repository keeps kodx's pull requests mergeable (`pr.keep_mergeable`): kodx started this run to resolve the conflicts with a merge commit.");
        insta::assert_snapshot!(note("main", None, Some("alice")), @"@alice asked with `/kodx update`, and merging `main` into this pull request conflicted: kodx started this run to resolve the conflicts with a merge commit.");
    }
}
