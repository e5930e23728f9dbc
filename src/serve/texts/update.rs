//! What kodx answers to `/kodx update` (SPEC §12, "Mergeable pull requests").

use crate::neutral;
use crate::redact::redact;

fn short(sha: &str) -> &str {
    sha.get(..7).unwrap_or(sha)
}

/// The base was merged into the branch.
pub fn merged(base: &str, base_sha: &str, branch: &str, sha: &str) -> String {
    format!(
        "Merged {} ({}) into {} with merge commit {}; no model was called.",
        neutral::code(base),
        short(base_sha),
        neutral::code(branch),
        short(sha)
    )
}

/// The branch already holds the base.
pub fn up_to_date(author: &str, branch: &str, base: &str) -> String {
    format!(
        "@{} {} is up to date with {}: there is nothing to merge.",
        redact(author),
        neutral::code(branch),
        neutral::code(base)
    )
}

/// Why kodx leaves the branch alone.
pub fn refused(author: &str, why: &str) -> String {
    format!(
        "@{} kodx does not update this pull request: {why}.",
        redact(author)
    )
}

/// The same merge is being resolved already (a second `/kodx update` on the same heads).
pub fn merging_already(author: &str, base: &str) -> String {
    format!(
        "@{} a run already resolves the conflicts of merging {} into this pull request at \
         these heads; its status comment says how it goes.",
        redact(author),
        neutral::code(base)
    )
}

/// The merge conflicts and no run could be queued to resolve them: named, nothing pushed.
pub fn conflicts(author: &str, base: &str, paths: &[String]) -> String {
    let shown: Vec<String> = paths.iter().take(20).map(|p| neutral::code(p)).collect();
    let more = match paths.len().saturating_sub(20) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "@{} merging {} into this pull request conflicts in {}{more}; nothing was pushed, \
         and kodx could not start a run to resolve them (see the server log). Run \
         `/kodx update` again, or merge by hand.",
        redact(author),
        neutral::code(base),
        shown.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers() {
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        insta::assert_snapshot!(merged("main", &a, "kodx/issue-7-x", &b), @"Merged `main` (aaaaaaa) into `kodx/issue-7-x` with merge commit bbbbbbb; no model was called.");
        insta::assert_snapshot!(up_to_date("alice", "kodx/issue-7-x", "main"), @"@alice `kodx/issue-7-x` is up to date with `main`: there is nothing to merge.");
        insta::assert_snapshot!(refused("alice", "its branch is in a fork"), @"@alice kodx does not update this pull request: its branch is in a fork.");
        insta::assert_snapshot!(conflicts("alice", "main", &["a.txt".into(), "src/lib.rs".into()]), @"@alice merging `main` into this pull request conflicts in `a.txt`, `src/lib.rs`; nothing was pushed, and kodx could not start a run to resolve them (see the server log). Run `/kodx update` again, or merge by hand.");
    }
}
