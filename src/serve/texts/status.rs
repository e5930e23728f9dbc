//! The status comment (SPEC §5, §10): the hidden metadata line that ties a comment to its
//! run ([`super::markup`]), and the Markdown body of each phase of a run (queued, setting up, working, done)
//! with the cost summary. Everything in it that kodx did not write goes through
//! [`crate::neutral`].
//!
//! Pure functions only: no I/O, no clock.

use crate::agent::{Outcome, StopReason};
use crate::checks::Verdict;
use crate::cost::format_usd;
use crate::neutral;
use crate::sandbox::{SetupCacheUse, SetupReport};

use super::markup::{
    cut_middle, cut_middle_bytes, escape_html, format_duration, format_seconds, format_wall,
    metadata, thousands, BODY_LIMIT,
};

/// What a token is replaced with.
pub use crate::redact::{redact, REDACTED};

/// The longest command line shown (characters after redaction).
const MAX_COMMAND_CHARS: usize = 2_000;
/// The longest failure text shown.
const MAX_FAILURE_CHARS: usize = 8_000;

// ---------------------------------------------------------------------------------------
// The status comment
// ---------------------------------------------------------------------------------------

/// Which command a run answers.
pub use crate::job::RunKind;

/// Where a run is, as its status comment shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    Queued,
    SettingUp,
    Working {
        step: u32,
        spent: f64,
        limit: f64,
    },
    /// A run between attempts, e.g. "queued again — kodx restarted" (kodx's own words).
    Note(String),
    /// A run waiting for `/kodx go`: why, and how to go on (kodx's own words,
    /// [`super::confirm::awaiting`]).
    Awaiting(String),
    Done(Box<Done>),
}

/// The end of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    pub kind: RunKind,
    /// What the last attempt's checks came to, worked out once from `outcome.checks`.
    pub verdict: Verdict,
    pub outcome: Outcome,
    /// The answer (ask) or the summary of the change (code). When empty,
    /// `outcome.last_message` is shown.
    pub text: String,
    /// The pull request a code run opened (or updated).
    pub pr_url: Option<String>,
    /// A commit a code run pushed onto an existing pull request's branch: (sha, branch).
    pub pushed: Option<(String, String)>,
    /// The commit a code run pushed, wherever it went (also when opening its pull request
    /// failed after the push).
    pub commit: Option<String>,
    /// What failed after the agent ended (e.g. the push), or overriding `outcome.detail`.
    pub failure: Option<String>,
    /// How the container's setup went, shown when the setup cache was on for the run.
    pub setup: Option<SetupReport>,
    /// Sentences about the delivery shown under the result (red checks, a Check Run that
    /// could not be created), each ending in a blank line.
    pub notes: Vec<String>,
    /// The run's wall time from its acknowledgement to its delivery (set as it is
    /// delivered); the cost summary shows it with the agent's share beside it.
    pub wall: Option<std::time::Duration>,
}

impl Done {
    /// The end of a run that has nothing to show yet but its outcome.
    pub fn new(kind: RunKind, outcome: Outcome) -> Self {
        Done {
            kind,
            verdict: Verdict::of(&outcome.checks),
            outcome,
            text: String::new(),
            pr_url: None,
            pushed: None,
            commit: None,
            failure: None,
            setup: None,
            notes: Vec::new(),
            wall: None,
        }
    }

    /// The run ended its turn and nothing failed after it.
    pub fn succeeded(&self) -> bool {
        self.outcome.stop_reason == StopReason::EndTurn && self.failure.is_none()
    }
}

/// The whole body of the status comment for `phase`: the metadata line, a header, the
/// command, for a finished run its result and the cost summary, and the run id. Everything
/// from the model, the repository or the user is redacted; the body stays under GitHub's
/// comment limit (an over-long answer is cut in the middle, with a note).
pub fn render(run_id: &str, command_line: &str, phase: &Phase) -> String {
    render_linked(run_id, command_line, phase, None, None)
}

/// [`render`], with a link to the run's page in the last line when `link` is given, and
/// the cost estimate line (kodx's own words, [`super::estimate_line`]) under the command
/// until the run ends.
pub fn render_linked(
    run_id: &str,
    command_line: &str,
    phase: &Phase,
    link: Option<&str>,
    estimate: Option<&str>,
) -> String {
    let mut head = String::new();
    head.push_str(&metadata(run_id));
    head.push('\n');
    head.push_str("### ");
    head.push_str(&header(phase));
    head.push_str("\n\n");
    // The command is echoed: a mention in it must not notify again from kodx.
    let command = cut_middle(&neutral::markdown(command_line), MAX_COMMAND_CHARS);
    for line in command.lines() {
        head.push_str("> ");
        head.push_str(line);
        head.push('\n');
    }
    head.push('\n');
    if let (Some(line), false) = (estimate, matches!(phase, Phase::Done(_))) {
        head.push_str(line);
        head.push_str("\n\n");
    }
    if let Phase::Awaiting(why) = phase {
        head.push_str(why);
        head.push_str("\n\n");
    }

    let mut tail = String::new();
    let mut answer = String::new();
    if let Phase::Done(done) = phase {
        answer = done_body(done, &mut head, &mut tail);
        tail.push_str(&cost_summary(&done.outcome, done.wall));
        tail.push('\n');
    }
    let setup = match phase {
        Phase::Done(done) => done.setup.as_ref().and_then(setup_note),
        _ => None,
    };
    tail.push_str(&format!(
        "<sub>kodx run <code>{}</code>{}{}</sub>\n",
        escape_html(run_id),
        link.map(|l| format!(" · <a href=\"{}\">watch the run</a>", escape_html(l)))
            .unwrap_or_default(),
        setup.map(|s| format!(" · {s}")).unwrap_or_default()
    ));

    let budget = BODY_LIMIT.saturating_sub(head.len() + tail.len() + 2);
    let answer = cut_middle_bytes(&answer, budget);
    let mut body = head;
    if !answer.is_empty() {
        body.push_str(&answer);
        if !answer.ends_with('\n') {
            body.push('\n');
        }
        body.push('\n');
    }
    body.push_str(&tail);
    if body.len() > BODY_LIMIT {
        // Only reachable with an absurd run id; never post something GitHub refuses.
        let mut end = BODY_LIMIT;
        while !body.is_char_boundary(end) {
            end -= 1;
        }
        body.truncate(end);
    }
    body
}

/// The one-line header of each phase.
fn header(phase: &Phase) -> String {
    match phase {
        Phase::Queued => "⏳ queued".into(),
        Phase::SettingUp => "⚙️ setting up the container".into(),
        Phase::Note(note) => neutral::words(note),
        Phase::Awaiting(_) => "⏸️ awaiting confirmation".into(),
        Phase::Working { step, spent, limit } => format!(
            "🛠️ working — step {step}, {} of {}",
            format_usd(*spent),
            format_usd(*limit)
        ),
        // The agent finished, but the repository's checks stayed red.
        Phase::Done(done) if done.succeeded() && done.verdict.is_red() => {
            if done.pr_url.is_some() || done.pushed.is_some() {
                "⚠️ done — checks failing".into()
            } else {
                "⚠️ checks failing — nothing pushed".into()
            }
        }
        // Green, but over edited tests: never plainly green.
        Phase::Done(done)
            if done.succeeded()
                && (done.pr_url.is_some() || done.pushed.is_some())
                && done.verdict.plainly_green() == Some(false) =>
        {
            "⚠️ done — checks passed over edited tests".into()
        }
        Phase::Done(done) if done.succeeded() => match done.kind {
            RunKind::Ask => "✅ answered".into(),
            RunKind::Code if done.pr_url.is_some() || done.pushed.is_some() => "✅ done".into(),
            RunKind::Code => "✅ done — no changes".into(),
        },
        Phase::Done(done) => format!("❌ {}", failure_title(done)),
    }
}

fn failure_title(done: &Done) -> &'static str {
    match done.outcome.stop_reason {
        StopReason::EndTurn | StopReason::Error => "failed",
        StopReason::CostLimitExceeded => "stopped — cost limit reached",
        StopReason::MaxIterations => "stopped — step limit reached",
        StopReason::Timeout => "stopped — time limit reached",
        StopReason::ToolError => "stopped — repeated tool failures",
        StopReason::SetupFailed => "setup script failed",
        StopReason::Cancelled => "cancelled",
    }
}

/// Writes the fixed parts of a finished run into `head`/`tail` and returns the (cleaned)
/// free text that goes between them: the one part that may be cut to fit.
fn done_body(done: &Done, head: &mut String, tail: &mut String) -> String {
    let text = if done.text.trim().is_empty() {
        &done.outcome.last_message
    } else {
        &done.text
    };
    // The model's words: redacted, and unable to mention, hide or close anything.
    let text = neutral::markdown(text);
    let checks = checks_part(done);
    if done.succeeded() {
        match (done.kind, &done.pr_url, &done.pushed) {
            (RunKind::Ask, _, _) => {}
            (RunKind::Code, Some(url), _) => {
                head.push_str(&format!("**Pull request:** {}\n\n", redact(url)));
            }
            (RunKind::Code, None, Some((sha, branch))) => {
                head.push_str(&format!(
                    "**Pushed:** commit {} to {}.\n\n",
                    neutral::code(&sha.chars().take(12).collect::<String>()),
                    neutral::code(branch)
                ));
            }
            (RunKind::Code, None, None) => {
                head.push_str("No changes were made to the repository.\n\n");
            }
        }
        head.push_str(&checks);
        return text;
    }
    let failure = done
        .failure
        .as_deref()
        .or(done.outcome.detail.as_deref())
        .map(redact)
        .unwrap_or_else(|| default_failure(done.outcome.stop_reason));
    head.push_str(&neutral::block(&cut_middle(&failure, MAX_FAILURE_CHARS)));
    head.push('\n');
    let limit = matches!(
        done.outcome.stop_reason,
        StopReason::CostLimitExceeded | StopReason::MaxIterations | StopReason::Timeout
    );
    if let Some(url) = &done.pr_url {
        head.push_str(&format!("**Pull request:** {}\n\n", redact(url)));
        if limit {
            head.push_str("It holds the work done so far, marked incomplete. ");
        }
    } else if let Some((sha, branch)) = &done.pushed {
        head.push_str(&format!(
            "**Pushed:** commit {} to {}, with the work done so far, marked incomplete.\n\n",
            neutral::code(&sha.chars().take(12).collect::<String>()),
            neutral::code(branch)
        ));
    }
    if limit {
        let pushed = done.pr_url.is_some() || done.pushed.is_some();
        head.push_str(super::after_limit(done.kind, pushed));
        head.push_str("\n\n");
    }
    head.push_str(&checks);
    if text.trim().is_empty() {
        return String::new();
    }
    head.push_str("<details><summary>The agent's last message</summary>\n\n");
    tail.insert_str(0, "</details>\n\n");
    text
}

/// The checks table and the delivery's notes, when there are any.
fn checks_part(done: &Done) -> String {
    let mut out = super::checks::section(&done.outcome.checks);
    for note in &done.notes {
        out.push_str(note);
    }
    out
}

fn default_failure(reason: StopReason) -> String {
    match reason {
        StopReason::Cancelled => "The run was cancelled.".into(),
        StopReason::EndTurn => "The run failed after the agent finished.".into(),
        _ => "Internal error: see the logs of this run id.".into(),
    }
}

/// The cost summary, always shown for a finished run.
/// Whether the setup cache served the run's setup (`None` when it was off for the run).
fn setup_note(setup: &SetupReport) -> Option<String> {
    let took = setup
        .took
        .map(|d| match d.as_secs() {
            0..=59 => format!(" in {:.1}s", d.as_secs_f64()),
            _ => format!(" in {}", format_duration(d)),
        })
        .unwrap_or_default();
    match setup.cache {
        SetupCacheUse::Off => None,
        SetupCacheUse::Hit => Some(format!("setup from the cache{took}")),
        SetupCacheUse::Miss => Some(format!("setup ran{took} (not cached yet)")),
    }
}

/// The cost table. Its duration is the run's `wall` time from acknowledgement to delivery
/// with the agent's share (`outcome.duration`) beside it, or the agent's alone when the
/// wall time is not known.
pub fn cost_summary(outcome: &Outcome, wall: Option<std::time::Duration>) -> String {
    // A run that ended before any model was chosen or called (refused after it waited,
    // cancelled or expired before it started): no table of zeros.
    if outcome.api_calls == 0 && outcome.model.is_empty() && outcome.usd_cost == 0.0 {
        return "Nothing was spent: no model was called.\n".into();
    }
    let u = &outcome.usage;
    format!(
        "| model | API calls | input | output | cache write | cache read | cost | duration | stop |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|---|\n\
         | {} | {} | {} | {} | {} | {} | {} of {} | {} | `{}` |\n",
        neutral::words(&outcome.model),
        outcome.api_calls,
        thousands(u.input_tokens),
        thousands(u.output_tokens),
        thousands(u.cache_write_tokens),
        thousands(u.cache_read_tokens),
        format_usd(outcome.usd_cost),
        format_usd(outcome.cost_limit),
        match wall {
            Some(wall) => format_wall(wall, outcome.duration),
            None => format!("agent {}", format_seconds(outcome.duration)),
        },
        outcome.stop_reason.as_str(),
    )
}

/// The images of the issue not given to the model, each named with why (`skipped`: its
/// number in the texts, its alt text, the reason in kodx's words), and how many were not
/// looked at: a note under the result (`None` when every image was given).
pub fn images_skipped(skipped: &[(usize, String, String)], unlooked: usize) -> Option<String> {
    if skipped.is_empty() && unlooked == 0 {
        return None;
    }
    let mut out = String::from("**Images not given to the model:**\n");
    for (n, alt, why) in skipped {
        let alt = match alt.is_empty() {
            true => String::new(),
            false => format!(" {}", neutral::code(alt)),
        };
        out.push_str(&format!("- image {n}{alt}: {}\n", neutral::words(why)));
    }
    if unlooked > 0 {
        out.push_str(&format!(
            "- {unlooked} more {} not looked at (more than 5 images)\n",
            if unlooked == 1 { "image" } else { "images" }
        ));
    }
    out.push('\n');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Usage;
    use crate::neutral::METADATA_OPEN;
    use crate::serve::texts::markup::{find_run_id, GITHUB_COMMENT_LIMIT, METADATA_CLOSE};
    use std::time::Duration;

    fn outcome(reason: StopReason, last: &str) -> Outcome {
        Outcome {
            stop_reason: reason,
            last_message: last.into(),
            api_calls: 7,
            usage: Usage {
                input_tokens: 12_345,
                output_tokens: 678,
                cache_write_tokens: 1_000,
                cache_read_tokens: 2_000_000,
            },
            usd_cost: 0.0234,
            cost_limit: 2.0,
            duration: Duration::from_secs(72),
            model: "claude-sonnet-4-5".into(),
            detail: None,
            checks: Vec::new(),
        }
    }

    fn done(kind: RunKind, reason: StopReason, text: &str) -> Done {
        Done {
            kind,
            verdict: Verdict::default(),
            outcome: outcome(reason, text),
            text: text.into(),
            pr_url: None,
            pushed: None,
            commit: None,
            failure: None,
            setup: None,
            notes: Vec::new(),
            wall: Some(Duration::from_secs(80)),
        }
    }

    /// Every phase of a status comment as GitHub shows it: queued, working, an answer, a
    /// pull request, a pushed commit, a limit and a failure.
    #[test]
    fn status_comment_renders() {
        let mut with_pr = done(RunKind::Code, StopReason::EndTurn, "Added the flag.");
        with_pr.pr_url = Some("https://github.com/acme/widgets/pull/8".into());
        let mut pushed = done(RunKind::Code, StopReason::EndTurn, "Fixed the test.");
        pushed.pushed = Some(("0123456789abcdef".into(), "feature".into()));
        let limit = done(RunKind::Code, StopReason::CostLimitExceeded, "Half done.");
        // A limit with the work pushed says how to continue; an ask, how to ask again.
        let mut limit_pr = done(RunKind::Code, StopReason::MaxIterations, "Half done.");
        limit_pr.pr_url = Some("https://github.com/acme/widgets/pull/9".into());
        let mut limit_pushed = done(RunKind::Code, StopReason::Timeout, "Half done.");
        limit_pushed.pushed = Some(("0123456789abcdef".into(), "feature".into()));
        let ask_limit = done(
            RunKind::Ask,
            StopReason::CostLimitExceeded,
            "Partly answered.",
        );
        let mut failed = done(RunKind::Code, StopReason::Error, "");
        failed.failure = Some("The branch `main` moved while kodx worked.".into());
        let phases = [
            ("queued", Phase::Queued),
            ("setting_up", Phase::SettingUp),
            (
                "working",
                Phase::Working {
                    step: 3,
                    spent: 0.0123,
                    limit: 2.0,
                },
            ),
            (
                "answered",
                Phase::Done(Box::new(done(
                    RunKind::Ask,
                    StopReason::EndTurn,
                    "It is cached in `src/cache.rs`.",
                ))),
            ),
            ("pull_request", Phase::Done(Box::new(with_pr))),
            ("pushed", Phase::Done(Box::new(pushed))),
            ("cost_limit", Phase::Done(Box::new(limit))),
            ("step_limit_pull_request", Phase::Done(Box::new(limit_pr))),
            ("time_limit_pushed", Phase::Done(Box::new(limit_pushed))),
            ("ask_cost_limit", Phase::Done(Box::new(ask_limit))),
            ("failed", Phase::Done(Box::new(failed))),
        ];
        for (name, phase) in phases {
            let body = render_linked(
                "0123456789ab",
                "/kodx code add a --json flag",
                &phase,
                Some("https://kodx.example/runs/0123456789ab?token=t"),
                None,
            );
            insta::assert_snapshot!(format!("status_{name}"), body);
        }
    }

    #[test]
    fn the_footer_says_whether_the_setup_cache_served_the_run() {
        let mut d = done(RunKind::Code, StopReason::EndTurn, "Done.");
        let footer = |d: &Done| {
            let body = render(
                "0123abcd",
                "/kodx code x",
                &Phase::Done(Box::new(d.clone())),
            );
            body.lines().last().unwrap().to_string()
        };
        assert_eq!(footer(&d), "<sub>kodx run <code>0123abcd</code></sub>");
        d.setup = Some(SetupReport {
            cache: SetupCacheUse::Off,
            took: Some(Duration::from_secs(3)),
        });
        assert_eq!(footer(&d), "<sub>kodx run <code>0123abcd</code></sub>");
        d.setup = Some(SetupReport {
            cache: SetupCacheUse::Hit,
            took: Some(Duration::from_millis(400)),
        });
        assert_eq!(
            footer(&d),
            "<sub>kodx run <code>0123abcd</code> · setup from the cache in 0.4s</sub>"
        );
        d.setup = Some(SetupReport {
            cache: SetupCacheUse::Miss,
            took: Some(Duration::from_secs(21)),
        });
        assert_eq!(
            footer(&d),
            "<sub>kodx run <code>0123abcd</code> · setup ran in 21.0s (not cached yet)</sub>"
        );
    }

    const GHS: &str = "ghs_abcdefghijklmnopqrstuvwxyz0123456789";

    // --- metadata ---

    #[test]
    fn metadata_round_trip() {
        let line = metadata("r-01HX");
        assert_eq!(line, r#"<!-- kodx:{"run":"r-01HX","v":1} -->"#);
        assert_eq!(find_run_id(&line), Some("r-01HX".into()));
        let body = render("r-01HX", "/kodx ask why", &Phase::Queued);
        assert!(body.starts_with("<!-- kodx:"));
        assert_eq!(find_run_id(&body), Some("r-01HX".into()));
        assert_eq!(
            find_run_id(&format!("{line}\r\nrest")),
            Some("r-01HX".into())
        );
    }

    #[test]
    fn run_id_cannot_break_out_of_the_comment() {
        for id in [
            "a-->b",
            "--><script>",
            "x --> <!-- kodx:{\"run\":\"y\",\"v\":1} -->",
        ] {
            let line = metadata(id);
            let inner = line
                .strip_prefix(METADATA_OPEN)
                .unwrap()
                .strip_suffix(METADATA_CLOSE)
                .unwrap();
            assert!(!inner.contains('>'), "{line}");
            assert!(!inner.contains("-->"), "{line}");
            assert_eq!(line.matches("-->").count(), 1);
            assert!(line.contains("\\u003e"));
            assert_eq!(find_run_id(&line).as_deref(), Some(id));
        }
    }

    #[test]
    fn malformed_or_forged_metadata_is_ignored() {
        let ok = metadata("r1");
        for bad in [
            format!("text {ok}"),
            format!(" {ok}"),
            format!("> {ok}"),
            "<!-- kodx:{\"run\":\"r1\",\"v\":1 -->".into(),
            "<!-- kodx:not json -->".into(),
            "<!-- kodx:{\"run\":\"r1\",\"v\":2} -->".into(),
            "<!-- kodx:{\"run\":\"\",\"v\":1} -->".into(),
            "<!-- kodx:{\"run\":7,\"v\":1} -->".into(),
            "<!-- kodx:{\"v\":1} -->".into(),
            "<!-- kodx:[\"r1\"] -->".into(),
            "<!-- kodx:{\"run\":\"a>b\",\"v\":1} -->".into(),
            "<!-- kodx:{\"run\":\"r1\",\"v\":1} --> trailing".into(),
            "<!-- kodx:{\"run\":\"r1\",\"v\":1}-->".into(),
            format!("<!-- kodx:{{\"run\":\"{}\",\"v\":1}} -->", "x".repeat(200)),
            String::new(),
        ] {
            assert_eq!(find_run_id(&bad), None, "{bad}");
        }
        // The first valid line wins; a forged one later does not replace it.
        let body = format!("{ok}\n{}", metadata("forged"));
        assert_eq!(find_run_id(&body), Some("r1".into()));
        // A metadata line in the model's answer is defused in the rendered body.
        let mut d = done(RunKind::Ask, StopReason::EndTurn, "");
        d.text = format!("{}\nhi", metadata("forged"));
        let body = render("real", "/kodx ask", &Phase::Done(Box::new(d)));
        let body_without_first = body.split_once('\n').unwrap().1;
        assert_eq!(find_run_id(body_without_first), None);
        assert_eq!(find_run_id(&body), Some("real".into()));
    }

    // --- what the model wrote (crate::neutral) ---

    const ZW: &str = "\u{200B}";

    #[test]
    fn outside_names_in_the_status_comment_post_nothing_live() {
        use crate::neutral::testing::{assert_nothing_live, HOSTILE};
        let mut d = done(RunKind::Code, StopReason::EndTurn, "Done.");
        d.pushed = Some(("0123456789abcdef".into(), HOSTILE.into()));
        d.outcome.model = HOSTILE.into();
        let mut failed = done(RunKind::Code, StopReason::Timeout, "Half.");
        failed.pushed = Some(("0123456789abcdef".into(), HOSTILE.into()));
        failed.failure = Some(HOSTILE.into());
        for d in [d, failed] {
            let body = render("r1", "/kodx code x", &Phase::Done(Box::new(d)));
            assert_nothing_live(&body);
            assert_eq!(find_run_id(&body).as_deref(), Some("r1"));
        }
    }

    #[test]
    fn a_forged_metadata_line_in_an_answer_is_removed() {
        let mut d = done(RunKind::Ask, StopReason::EndTurn, "");
        d.text = format!("{}\nhi", metadata("forged"));
        let body = render("real", "/kodx ask", &Phase::Done(Box::new(d)));
        assert!(!body.contains("forged"), "{body}");
        assert_eq!(body.matches("<!--").count(), 1, "{body}");
    }

    #[test]
    fn the_done_comment_carries_the_defused_text() {
        let answer = "Done, @octocat.\n<!-- kodx:{\"run\":\"x\"} -->\nCloses #99";
        let body = render(
            "r1",
            "/kodx ask ping @org/team",
            &Phase::Done(Box::new(done(RunKind::Ask, StopReason::EndTurn, answer))),
        );
        assert!(body.contains(&format!("Done, @{ZW}octocat.")), "{body}");
        assert!(body.contains(&format!("C{ZW}loses #99")), "{body}");
        assert!(!body.contains("\"run\":\"x\""), "{body}");
        assert!(
            body.contains(&format!("> /kodx ask ping @{ZW}org/team")),
            "{body}"
        );
    }

    // --- render ---

    #[test]
    fn render_queued_setting_up_working() {
        let q = render("r1", "/kodx code fix it", &Phase::Queued);
        assert!(q.contains("⏳ queued"));
        assert!(q.contains("> /kodx code fix it"));
        assert!(q.contains("<code>r1</code>"));
        let n = render(
            "r1",
            "/kodx code fix it",
            &Phase::Note("⏳ queued again".into()),
        );
        assert!(
            n.contains("### ⏳ queued again\n") && n.contains("> /kodx code fix it"),
            "{n}"
        );
        assert_eq!(find_run_id(&n).as_deref(), Some("r1"));
        let s = render("r1", "/kodx code fix it", &Phase::SettingUp);
        assert!(s.contains("⚙️ setting up the container"));
        let w = render(
            "r1",
            "/kodx code fix it",
            &Phase::Working {
                step: 3,
                spent: 0.0123,
                limit: 2.0,
            },
        );
        assert!(w.contains("🛠️ working — step 3, $0.0123 of $2.00"), "{w}");
        for body in [q, s, w] {
            assert!(!body.contains("| model |"));
        }
    }

    #[test]
    fn command_line_is_redacted() {
        let body = render("r1", &format!("/kodx ask is {GHS} valid?"), &Phase::Queued);
        assert!(!body.contains(GHS));
        assert!(body.contains("is [REDACTED] valid?"));
    }

    fn assert_cost_summary(body: &str, reason: &str) {
        for piece in [
            "| model | API calls | input | output | cache write | cache read | cost | duration | stop |",
            "| claude-sonnet-4-5 | 7 | 12,345 | 678 | 1,000 | 2,000,000 | $0.0234 of $2.00 | 1m 20s (agent 1m 12s) |",
            &format!("`{reason}`"),
        ] {
            assert!(body.contains(piece), "missing {piece:?} in\n{body}");
        }
    }

    #[test]
    fn render_done_ask() {
        let answer = format!("The answer is 42. Your key {GHS} leaked.");
        let body = render(
            "r1",
            "/kodx ask what?",
            &Phase::Done(Box::new(done(RunKind::Ask, StopReason::EndTurn, &answer))),
        );
        assert!(body.contains("✅ answered"));
        assert!(body.contains("The answer is 42. Your key [REDACTED] leaked."));
        assert!(!body.contains(GHS));
        assert_cost_summary(&body, "end_turn");
    }

    #[test]
    fn render_done_code_with_pr() {
        let mut d = done(RunKind::Code, StopReason::EndTurn, "Fixed the parser.");
        d.pr_url = Some("https://github.com/o/r/pull/5".into());
        let mut pushed = d.clone();
        pushed.pr_url = None;
        pushed.pushed = Some(("0123456789abcdef".into(), "feature".into()));
        let p = render("r1", "/kodx code fix", &Phase::Done(Box::new(pushed)));
        assert!(
            p.contains("✅ done") && p.contains("**Pushed:** commit `0123456789ab` to `feature`."),
            "{p}"
        );
        let body = render("r1", "/kodx code fix", &Phase::Done(Box::new(d)));
        assert!(body.contains("✅ done"));
        assert!(body.contains("**Pull request:** https://github.com/o/r/pull/5"));
        assert!(body.contains("Fixed the parser."));
        assert_cost_summary(&body, "end_turn");
    }

    #[test]
    fn render_done_code_without_changes() {
        let mut d = done(RunKind::Code, StopReason::EndTurn, "");
        d.outcome.last_message = "Nothing to change: already fixed.".into();
        let body = render("r1", "/kodx code fix", &Phase::Done(Box::new(d)));
        assert!(body.contains("✅ done — no changes"));
        assert!(body.contains("No changes were made"));
        assert!(body.contains("Nothing to change: already fixed."));
        assert_cost_summary(&body, "end_turn");
    }

    #[test]
    fn render_done_failures() {
        let mut d = done(RunKind::Code, StopReason::SetupFailed, "");
        d.outcome.detail = Some(format!(
            "setup script exited with 1:\n```\nnpm ERR! token {GHS}"
        ));
        let body = render("r1", "/kodx code fix", &Phase::Done(Box::new(d)));
        assert!(body.contains("❌ setup script failed"));
        assert!(body.contains("setup script exited with 1:"));
        assert!(body.contains("````text\n"));
        assert!(!body.contains(GHS));
        assert_cost_summary(&body, "setup_failed");

        let mut d = done(RunKind::Code, StopReason::CostLimitExceeded, "half done");
        d.outcome.detail = Some("the cost limit of $2.00 is reached".into());
        let body = render("r1", "/kodx code fix", &Phase::Done(Box::new(d)));
        assert!(body.contains("❌ stopped — cost limit reached"));
        assert!(body.contains("<details><summary>The agent's last message</summary>"));
        assert!(body.contains("half done\n"));
        assert!(body.contains("</details>"));
        assert_cost_summary(&body, "cost_limit_exceeded");

        // A failure after the agent ended (e.g. the push) wins over success.
        let mut d = done(RunKind::Code, StopReason::EndTurn, "Done.");
        d.failure = Some("pushing the branch failed: x-access-token:abc@host".into());
        let body = render("r1", "/kodx code fix", &Phase::Done(Box::new(d)));
        assert!(body.contains("❌ failed"));
        assert!(body.contains("x-access-token:[REDACTED]@host"));
        assert_cost_summary(&body, "end_turn");

        let d = done(RunKind::Ask, StopReason::Error, "");
        let body = render("r-err", "/kodx ask", &Phase::Done(Box::new(d)));
        assert!(body.contains("Internal error"));
        assert!(body.contains("<code>r-err</code>"));
        assert_cost_summary(&body, "error");
    }

    #[test]
    fn huge_answer_is_cut_in_the_middle() {
        let mut answer = String::from("START\n");
        while answer.len() < 200_000 {
            answer.push_str("line of the answer with ünïcödé and a token ghp_\n");
        }
        answer.push_str("END\n");
        let body = render(
            "r1",
            &"/kodx ask ".repeat(1_000),
            &Phase::Done(Box::new(done(RunKind::Ask, StopReason::EndTurn, &answer))),
        );
        assert!(body.len() <= BODY_LIMIT, "{}", body.len());
        assert!(body.chars().count() < GITHUB_COMMENT_LIMIT);
        assert!(
            body.len() > BODY_LIMIT - 4_000,
            "uses the room: {}",
            body.len()
        );
        assert!(body.contains("START\n"));
        assert!(body.contains("END\n"));
        assert!(body.contains("characters cut from the middle"));
        assert_cost_summary(&body, "end_turn");
        assert_eq!(find_run_id(&body), Some("r1".into()));

        let small = cut_middle_bytes("short", 100);
        assert_eq!(small, "short");
    }

    #[test]
    fn durations_and_numbers() {
        assert_eq!(format_duration(Duration::from_millis(400)), "0s");
        // A run's wall time and the agent's share: one decimal below ten seconds.
        assert_eq!(
            format_wall(Duration::from_millis(6_850), Duration::from_millis(240)),
            "6.8s (agent 0.2s)"
        );
        assert_eq!(
            format_wall(Duration::from_secs(75), Duration::from_millis(9_990)),
            "1m 15s (agent 9.9s)"
        );
        // Clocks that disagree never show the whole shorter than its part.
        assert_eq!(
            format_wall(Duration::from_millis(100), Duration::from_millis(300)),
            "0.3s (agent 0.3s)"
        );
        assert_eq!(format_seconds(Duration::from_secs(10)), "10s");
        assert_eq!(format_duration(Duration::from_secs(42)), "42s");
        assert_eq!(format_duration(Duration::from_secs(72)), "1m 12s");
        assert_eq!(format_duration(Duration::from_secs(7384)), "2h 3m 4s");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn skipped_images_are_named_with_their_reason() {
        assert_eq!(images_skipped(&[], 0), None);
        let note = images_skipped(
            &[
                (
                    1,
                    "the `error` @dialog".into(),
                    "too large (over 5 MiB)".into(),
                ),
                (2, String::new(), "not on GitHub".into()),
                (7, "x".into(), "fetch failed: HTTP 404".into()),
            ],
            3,
        )
        .unwrap();
        insta::assert_snapshot!(note, @"
        **Images not given to the model:**
        - image 1 ``the `error` @dialog``: too large (over 5 MiB)
        - image 2: not on GitHub
        - image 7 `x`: fetch failed: HTTP 404
        - 3 more images not looked at (more than 5 images)
        ");
    }
}
