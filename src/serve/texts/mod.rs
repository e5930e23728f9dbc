//! Every sentence kodx posts on GitHub about a run, as named builders: refusals, the
//! answers of control jobs (the help: [`help`]), the notes of the status comment and the
//! failures it shows, the continue note, and the incomplete-work wording of a delivery.
//! [`status`] lays out the status comment of each phase; [`pull`] writes the commit message,
//! its trailers and the pull request's body. Each is snapshot-tested.
//!
//! Text from outside kodx (errors, names, requests, the model's words) goes through
//! [`crate::neutral`] where it is put in; logins are redacted.

pub mod checks;
pub mod confirm;
pub mod egress;
mod estimate;
mod follow_up;
mod help;
pub mod markup;
pub mod merge;
mod pull;
pub mod rerun;
pub mod status;
pub mod steer;
pub mod update;

pub use estimate::estimate_line;
pub use follow_up::{
    repair_stopped, threads_list_unreadable, threads_unreadable, RepairStop,
    ADDRESS_REVIEWS_ON_ISSUE, NO_THREADS_LISTED, NO_UNRESOLVED_THREADS,
};
pub use help::help;
pub use pull::{commit_body, commit_subject, pull_body, title_from, trailers, Form, Mention};

use crate::cost::format_usd;
use crate::git::GitError;
use crate::github::Permission;
use crate::job::JobKind;
use crate::neutral;
use crate::redact::redact;
use crate::repo_config::{RepoConfig, RunKind};

/// The run id line under a refusal.
pub fn with_run_id(text: &str, run_id: &str) -> String {
    format!(
        "{}\n\n<sub>kodx run <code>{run_id}</code></sub>",
        redact(text)
    )
}

/// The one short comment a person without permission gets.
pub fn not_permitted(author: &str, kind: JobKind, needed: Permission, has: Permission) -> String {
    let who = match needed {
        Permission::Read => "people with read access to this repository",
        _ => "people with write, maintain or admin access to this repository",
    };
    let what = match kind {
        JobKind::Ask
        | JobKind::Code
        | JobKind::Continue
        | JobKind::Cancel
        | JobKind::Go
        | JobKind::Update
        | JobKind::Steer
        | JobKind::AddressReviews => {
            format!("`/kodx {}`", kind.command_word())
        }
        _ => "kodx".to_string(),
    };
    format!(
        "@{} {what} can only be run by {who}; your permission here is `{}`.",
        redact(author),
        has.as_str()
    )
}

pub fn config_unreadable(error: &str) -> String {
    format!(
        "kodx could not read `{}` from the default branch ({}). Run the command again in a moment.",
        RepoConfig::PATH,
        neutral::words(error)
    )
}

pub fn permission_unknown(author: &str, error: &str) -> String {
    format!(
        "kodx could not check @{}'s permission on this repository ({}). Run the command again in a moment.",
        redact(author),
        neutral::words(error)
    )
}

pub fn budget_spent(budget: f64, spent: f64) -> String {
    format!(
        "kodx did not start: this installation's monthly budget of {} is spent ({} used since the 1st, UTC; runs need at least $0.01 of it left). Runs start again next month, or when the server's operator raises `monthly_budget_usd`.",
        format_usd(budget),
        format_usd(spent)
    )
}

pub fn invalid_config(error: &str) -> String {
    format!(
        "kodx cannot run because the repository's configuration is invalid:\n\n{}\nFix `{}` on the default branch and run the command again.",
        neutral::block(error),
        RepoConfig::PATH
    )
}

/// A command that was found but cannot run (`why`: empty, too long; kodx's sentence, its
/// outside parts neutralized where it was made).
pub fn bad_request(author: &str, why: &str) -> String {
    format!("@{} kodx did not start: {}.", redact(author), redact(why))
}

/// Why `--base` is refused on a pull request (the sentence [`bad_request`] gives).
pub const BASE_ON_PULL: &str = "`--base` is for issues; on a pull request kodx works on the \
     pull request's own branch and reads its rules from the pull request's base";

/// `/kodx code --base <branch>` naming no branch of `repo`.
pub fn unknown_base(branch: &str, repo: &str) -> String {
    format!(
        "kodx did not start: {} has no branch {}. `--base` takes the name of a \
         branch (not a tag or a commit) to start the work from and open the pull request \
         against; check the name and ask again.",
        neutral::code(repo),
        neutral::code(branch)
    )
}

/// `/kodx continue` that cannot go on (`why`: nothing stopped here, no right, over the
/// maximum …).
pub fn cannot_continue(why: &str) -> String {
    format!("kodx did not continue: {why}.")
}

/// The answer to `/kodx cancel` where nothing runs.
pub fn nothing_to_cancel(author: &str) -> String {
    format!("@{} there is no kodx run to cancel here.", redact(author))
}

pub fn cancelled_by(who: &str) -> String {
    format!("Cancelled by @{who}.")
}

pub fn cancelled_before_it_started(who: &str) -> String {
    format!("Cancelled by @{who} before it started.")
}

/// The status comment's header while kodx restarts under a running run.
pub const PAUSED_BY_RESTART: &str =
    "⏳ paused — kodx is restarting; this run starts again when it is back";

/// The status comment's header of a run queued again after a restart.
pub const QUEUED_AGAIN: &str = "⏳ queued again — kodx restarted while this run was working";

pub const RESTARTED_TOO_OFTEN: &str = "kodx restarted while this run was working, more than once; it was not started again. Run the command again to retry.";

/// kodx's own failure: what failed, and the run id to find its logs by.
pub fn internal_error(what: &str, run_id: &str) -> String {
    format!("kodx hit an internal error ({what}). Run id `{run_id}`.")
}

pub fn config_became_invalid(error: &str) -> String {
    format!(
        "The repository's configuration became invalid: {error}. Fix it on the default branch and run the command again."
    )
}

pub const BUDGET_SPENT_WHILE_WAITING: &str =
    "This installation's monthly budget was spent while the run waited; nothing was started.";

/// The repository's model has no price, so its cost cap could not be kept.
/// The setup secrets `.github/kodx.yml` names that the run did not get, with why and the
/// command that sets one; the run went on without them.
pub fn secrets_left_out(repo: &str, missing: &[(String, String)]) -> String {
    let mut out = String::from("**Secrets the run did not get:**\n");
    for (name, why) in missing {
        out.push_str(&format!("- `{name}`: {}\n", crate::neutral::words(why)));
    }
    out.push_str(&format!(
        "\nAn operator sets one with `kodx secret set {} NAME` (the value on standard \
         input); the run went on without them.\n\n",
        crate::redact::redact(repo)
    ));
    out
}

pub fn model_without_price(error: &str) -> String {
    format!(
        "{error}. Choose a model kodx knows in `{}` (`model:`), or ask the server's operator to add its price.",
        RepoConfig::PATH
    )
}

pub fn clone_failed(error: &str) -> String {
    format!("Cloning the repository failed: {error}")
}

pub fn container_failed(error: &str) -> String {
    format!("The container could not be started: {error}")
}

/// No Docker engine of the server answers: the run was not started.
pub fn no_engine(error: &str) -> String {
    format!(
        "No Docker engine of this kodx server answers, so the run was not started ({error}). \
         Run the command again once the server's operator has an engine back."
    )
}

/// The engine running the run stopped answering while it worked.
pub fn engine_lost(engine: &str) -> String {
    format!(
        "The Docker engine `{engine}` stopped answering while this run worked, so the run was \
         stopped there. New runs go to the engines that answer: run the command again to \
         retry."
    )
}

/// The request line of work a limit cut short (commit subject, pull request title).
pub fn incomplete_request(request: &str) -> String {
    format!("[incomplete] {request}")
}

/// The summary of work a limit cut short (commit body, pull request body).
pub fn incomplete_summary(why: &str, last_message: &str) -> String {
    format!(
        "**Incomplete:** the run stopped before it finished ({why}). This is what it did so far. \
         {CONTINUE_HOW}\n\n{last_message}"
    )
}

/// How a code run a limit stopped goes on, with the amount syntax of `/kodx continue`
/// (`command::More`), so nobody has to find it in the help.
const CONTINUE_HOW: &str = "To go on from here, comment `/kodx continue` where it was asked \
     (the repository's limits again), `/kodx continue $2` (a cost limit of $2) or \
     `/kodx continue 20 steps` (a step limit of 20); or finish it by hand.";

/// What to do after a cost, step or time limit stopped a run: a code run that pushed its
/// work is continued (`/kodx continue`, which needs that pushed branch); anything else
/// starts again with a higher limit, since an ask keeps no work to go on from.
pub fn after_limit(kind: RunKind, pushed: bool) -> &'static str {
    match (kind, pushed) {
        (RunKind::Code, true) => CONTINUE_HOW,
        (RunKind::Code, false) => {
            "Nothing was pushed, so there is nothing to continue: raise the limit in \
             `.github/kodx.yml` and run `/kodx code` again."
        }
        (RunKind::Ask, _) => {
            "An answer cannot be continued: raise the limit in `.github/kodx.yml` and ask \
             again."
        }
    }
}

/// A push the server refused, in words a maintainer can act on.
pub fn push_failure(e: &GitError, branch: &str) -> String {
    match e {
        GitError::Rejected { reason } => format!(
            "GitHub refused the push to `{branch}`: {}",
            crate::git::explain_rejection(reason)
        ),
        GitError::Conflict { paths } => format!(
            "The branch `{branch}` moved while kodx worked, and kodx's change conflicts with it in {}. Nothing was pushed; run the command again on the new head.",
            paths.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        ),
        other => format!("Pushing to `{branch}` failed: {other}"),
    }
}

/// What became of the draft pull request of a continuation that finished.
#[derive(Debug, Clone, PartialEq)]
pub enum Readiness {
    /// The continuation did not finish (or delivered no pull request): nothing to say.
    Unchanged,
    /// Marked ready for review (or it was not a draft).
    Ready,
    /// Still a draft: the repository asks for drafts (`pr.draft`), or GitHub did not mark
    /// it ready (why).
    StillDraft(Option<String>),
}

/// The status comment's text of a continuation: its own summary, then what both parts
/// cost, and what became of the pull request's draft state when it finished.
pub fn continued(
    text: &str,
    earlier_id: &str,
    earlier_cost: f64,
    this_part: f64,
    readiness: &Readiness,
) -> String {
    let usd = crate::cost::format_usd;
    let mut out = format!(
        "{}\n\n**Continued** from run `{}`: earlier parts {}, this part {}, **{} in total**.",
        text.trim_end(),
        earlier_id,
        usd(earlier_cost),
        usd(this_part),
        usd(earlier_cost + this_part),
    );
    match readiness {
        Readiness::Unchanged => {}
        Readiness::Ready => out.push_str(" Its pull request is now ready for review."),
        Readiness::StillDraft(None) => out.push_str(
            " Its pull request stays a draft, as this repository asks (`pr.draft`); mark it ready for review on GitHub when it looks right.",
        ),
        Readiness::StillDraft(Some(why)) => out.push_str(&format!(
            " Its pull request is still a draft: GitHub did not mark it ready for review ({}); mark it ready on GitHub when it looks right.",
            neutral::words(why)
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals() {
        insta::assert_snapshot!(
            "not_permitted_ask",
            not_permitted("mallory", JobKind::Ask, Permission::Write, Permission::Read)
        );
        insta::assert_snapshot!(
            "not_permitted_help",
            not_permitted("eve", JobKind::Help, Permission::Read, Permission::None)
        );
        insta::assert_snapshot!("config_unreadable", config_unreadable("502 Bad Gateway"));
        insta::assert_snapshot!(
            "permission_unknown",
            permission_unknown("alice", "timed out")
        );
        insta::assert_snapshot!("budget_spent", budget_spent(10.0, 9.995));
        insta::assert_snapshot!(
            "invalid_config",
            with_run_id(
                &invalid_config(".github/kodx.yml: line 2: unknown key \"modle\""),
                "0123456789ab"
            )
        );
        insta::assert_snapshot!(
            "bad_request",
            bad_request("alice", "`/kodx ask` needs a request")
        );
    }

    #[test]
    fn control_answers_and_notes() {
        insta::assert_snapshot!("nothing_to_cancel", nothing_to_cancel("alice"));
        insta::assert_snapshot!(
            "cancel_notes",
            [
                cancelled_by("bob"),
                cancelled_before_it_started("bob"),
                PAUSED_BY_RESTART.into(),
                QUEUED_AGAIN.into(),
                RESTARTED_TOO_OFTEN.into(),
            ]
            .join("\n")
        );
    }

    #[test]
    fn failures() {
        insta::assert_snapshot!(
            "failures",
            [
                internal_error("no Docker engine: connection refused", "0123456789ab"),
                config_became_invalid(".github/kodx.yml: line 1: invalid YAML"),
                BUDGET_SPENT_WHILE_WAITING.into(),
                model_without_price("no price for model \"x\""),
                clone_failed("authentication failed"),
                container_failed("no such image"),
                no_engine("local: connection refused"),
                engine_lost("builder-2"),
            ]
            .join("\n")
        );
    }

    #[test]
    fn incomplete_work() {
        insta::assert_snapshot!(
            "incomplete",
            format!(
                "{}\n---\n{}",
                incomplete_request("add a flag"),
                incomplete_summary("the step limit of 3 is reached", "Added half of it.")
            )
        );
    }

    #[test]
    fn what_comes_from_outside_is_redacted() {
        let token = "ghs_0123456789abcdefghijklmnopqrstuvwxyzAB";
        for text in [
            bad_request("alice", &format!("leaked {token}")),
            with_run_id(&format!("error {token}"), "r1"),
        ] {
            assert!(!text.contains(token), "{text}");
            assert!(text.contains("[REDACTED]"), "{text}");
        }
    }

    #[test]
    fn outside_words_in_refusals_post_nothing_live() {
        use crate::neutral::testing::{assert_nothing_live, HOSTILE};
        let bad_base = crate::command::ParseError::BadBase {
            found: HOSTILE.into(),
        };
        for text in [
            config_unreadable(HOSTILE),
            permission_unknown("alice", HOSTILE),
            invalid_config(HOSTILE),
            unknown_base(HOSTILE, "acme/widgets"),
            bad_request("alice", &bad_base.to_string()),
            help(HOSTILE),
            continued(
                "Done.",
                "r0",
                0.25,
                0.5,
                &Readiness::StillDraft(Some(HOSTILE.into())),
            ),
        ] {
            assert_nothing_live(&with_run_id(&text, "r1"));
        }
    }

    #[test]
    fn help_and_continue_notes() {
        insta::assert_snapshot!("help", help(""));
        insta::assert_snapshot!("help_unknown", help("frobnicate"));
        insta::assert_snapshot!(
            "continued_ready",
            continued("Done.", "0123456789ab", 0.25, 0.5, &Readiness::Ready)
        );
    }

    #[test]
    fn the_text_shows_both_parts_and_the_total() {
        let both_parts =
            |text: &str, this_part: f64, r: &Readiness| continued(text, "s", 0.25, this_part, r);
        let t = both_parts("Done.\n", 0.5, &Readiness::Ready);
        assert!(t.starts_with("Done.\n\n**Continued** from run `s`"), "{t}");
        assert!(
            t.contains("earlier parts $0.2500, this part $0.5000, **$0.7500 in total**"),
            "{t}"
        );
        assert!(t.contains("now ready for review"), "{t}");
        assert!(!both_parts("x", 0.5, &Readiness::Unchanged).contains("ready for review"));
        let draft = both_parts("x", 0.5, &Readiness::StillDraft(Some("HTTP 403".into())));
        assert!(
            draft.contains("still a draft") && draft.contains("HTTP 403"),
            "{draft}"
        );
        assert!(both_parts("x", 0.5, &Readiness::StillDraft(None)).contains("`pr.draft`"));
    }
}
