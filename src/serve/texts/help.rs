//! `/kodx help` (and an unknown subcommand): what kodx can do, and who may ask.

use crate::neutral;

/// The answer to `/kodx help` (and to an unknown subcommand).
pub fn help(unknown: &str) -> String {
    let mut out = String::new();
    if !unknown.is_empty() {
        out.push_str(&format!(
            "kodx does not know {}.\n\n",
            neutral::code(&format!("/kodx {unknown}"))
        ));
    }
    out.push_str(
        "**kodx** runs an AI agent in a sandboxed container on a copy of this repository.\n\n\
         | command | what happens | who may |\n\
         | --- | --- | --- |\n\
         | `/kodx ask <question>` | the agent reads the code and answers here | write access (or read, if the repository allows it) |\n\
         | `/kodx code <request>` | the agent makes the change and opens a pull request (`--base <branch>` first: from and into that branch) | write access |\n\
         | `/kodx continue [$N \\| N steps]` | resumes the code run here that a cost, step or time limit stopped, on its branch and pull request, with the repository's limit again (or `$N` / `N steps`) | write access |\n\
         | `/kodx address-reviews [words]` | on a pull request: one run addresses every unresolved review thread, pushes, and replies in each | write access |\n\
         | `/kodx cancel` | stops the runs on this issue or pull request | write access |\n\
         | `/kodx update` | on a pull request kodx opened: merges its base branch into it with a merge commit (no model) | write access |\n\
         | `/kodx go [$N]` | starts the run here that waits for a go-ahead (`confirm_above_usd`), with a cap of at most `$N` if given | write access |\n\
         | `/kodx steer <words>` | gives your words to the run working here, at its next step | write access |\n\
         | `/kodx help` | this message | everyone |\n\n\
         The command must start a line, outside code blocks and quotes; everything after it is the request. \
         Limits and the model are set in `.github/kodx.yml`; kodx follows the repository's `AGENTS.md` \
         and pull request template, read from the branch the work targets. With `ci_repair`, kodx repairs red CI \
         on the pull requests it opened; with `triggers.label`, labelling an issue starts `/kodx code`.",
    );
    out
}
