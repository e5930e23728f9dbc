//! The words of a code run's delivery (SPEC §5): its commit message, its trailers and the
//! body of its pull request.

use crate::neutral;

/// What a pull request's body says of the issue or pull request it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mention {
    /// `Closes #N`: the pull request answers issue N.
    Closes(i64),
    /// Changes on top of pull request N, whose branch is in a fork kodx cannot push to.
    OnTopOf(i64),
    Nothing,
}

/// One line of the request, for a commit subject or a PR title: the first non-empty line,
/// whitespace collapsed, cut to `max` characters with `…`.
pub fn title_from(request: &str, max: usize) -> String {
    let line = request
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("Changes requested with /kodx code");
    let line: String = line
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let mut chars = line.chars();
    let head: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        let mut cut: String = head.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    } else {
        head
    }
}

/// The commit subject: the request's first line (see [`title_from`]), unable to close an
/// issue when the commit lands (only the pull request's own `Closes #N` does).
pub fn commit_subject(request: &str) -> String {
    neutral::commit(&title_from(request, 72))
}

/// The commit message body (the subject comes from the request): the agent's summary,
/// where it was asked, and the run id.
pub fn commit_body(summary: &str, repo_issue: i64, is_pull_request: bool, run_id: &str) -> String {
    let what = if is_pull_request {
        "pull request"
    } else {
        "issue"
    };
    let summary = neutral::commit(summary.trim());
    let summary = cut_chars(&summary, 4_000);
    let mut body = String::new();
    if !summary.is_empty() {
        body.push_str(&summary);
        body.push_str("\n\n");
    }
    body.push_str(&format!(
        "Made by kodx (run {run_id}) for {what} #{repo_issue}."
    ));
    body
}

/// The trailers: the person who asked as co-author, and the run.
pub fn trailers(author: &str, author_id: i64, run_id: &str) -> Vec<(String, String)> {
    vec![
        (
            "Co-authored-by".into(),
            format!(
                "{author} <{}>",
                crate::github::noreply_email(author, author_id.max(0) as u64)
            ),
        ),
        ("Kodx-Run".into(), run_id.to_string()),
    ]
}

/// How the pull request body is shaped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Form {
    /// The summary fills the repository's pull request template: kodx's own part follows
    /// in a delimited section.
    pub templated: bool,
    /// kodx's checks ran and passed: a box claiming tests or checks pass may stay ticked.
    pub checks_passed: bool,
    /// kodx's own Markdown for its part, first (the checks table and notes).
    pub extra: String,
}

/// The body of the pull request kodx opens.
pub fn pull_body(
    summary: &str,
    mention: Mention,
    author: &str,
    cost_summary: &str,
    run_id: &str,
    link: Option<&str>,
    form: Form,
) -> String {
    let mut body = String::new();
    body.push_str(super::markup::metadata(run_id).as_str());
    body.push('\n');
    // The model's words can mention, hide or close nothing; kodx's own `Closes #N` follows.
    let summary = cut_chars(&neutral::markdown(summary.trim()), 30_000);
    let summary = untick_unverified(&summary, form.checks_passed);
    if summary.is_empty() {
        body.push_str("kodx made the change requested below.\n\n");
    } else {
        body.push_str(&summary);
        body.push_str("\n\n");
    }
    if form.templated {
        body.push_str("---\n\n#### kodx\n\n");
    }
    body.push_str(&form.extra);
    match mention {
        Mention::Closes(n) => body.push_str(&format!("Closes #{n}\n\n")),
        Mention::OnTopOf(n) => body.push_str(&format!(
            "Changes on top of #{n}, whose branch lives in a fork kodx cannot push to.\n\n"
        )),
        Mention::Nothing => {}
    }
    body.push_str(&format!(
        "Requested by @{} with `/kodx code`.\n\n",
        crate::redact::redact(author)
    ));
    body.push_str(cost_summary);
    let watch = link
        .map(|l| format!(" · <a href=\"{l}\">the run's steps</a>"))
        .unwrap_or_default();
    body.push_str(&format!(
        "\n\n<sub>kodx run <code>{run_id}</code>{watch}</sub>\n"
    ));
    body
}

/// `text` with every ticked task-list box (`- [x] …`) whose words claim tests or checks
/// pass unticked, unless `checks_passed`: kodx vouches for nothing it did not verify.
pub fn untick_unverified(text: &str, checks_passed: bool) -> String {
    if checks_passed {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        let rest = &line[indent..];
        let boxed = ["- [x]", "- [X]", "* [x]", "* [X]", "+ [x]", "+ [X]"]
            .iter()
            .find(|b| rest.starts_with(*b));
        match boxed {
            Some(b) if claims_checks_pass(&rest[b.len()..]) => {
                out.push_str(&line[..indent]);
                out.push_str(&b[..1]);
                out.push_str(" [ ]");
                let words = rest[b.len()..].trim_end_matches(['\r', '\n']);
                out.push_str(words);
                out.push_str(" _(unticked by kodx: no checks of kodx's verified this)_");
                out.push_str(&rest[rest.trim_end_matches(['\r', '\n']).len()..]);
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// Whether a task's words say tests, checks, lints or builds pass ("All tests pass", "CI
/// is green", "Lint and unit tests pass locally").
fn claims_checks_pass(words: &str) -> bool {
    let words: Vec<String> = words
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let subject = words.iter().any(|w| {
        [
            "test",
            "check",
            "lint",
            "build",
            "clippy",
            "typecheck",
            "compil",
        ]
        .iter()
        .any(|s| w.starts_with(s))
            || w == "ci"
    });
    let claim = words.iter().any(|w| {
        ["pass", "green", "succe"].iter().any(|s| w.starts_with(s)) || w == "ok" || w == "ran"
    });
    subject && claim
}

fn cut_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max).collect();
    out.push_str("\n\n[…]");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pull request bodies kodx writes: for an issue, and for a fork's pull request.
    #[test]
    fn pull_request_body_renders() {
        let issue = Mention::Closes(7);
        let fork = Mention::OnTopOf(9);
        for (name, target) in [("issue", issue), ("fork", fork)] {
            let body = pull_body(
                "Added `--json` to `list`, with a test.\n\nCloses #99 is not for the model to say.",
                target,
                "alice",
                "$0.0234 · 7 model calls",
                "0123456789ab",
                Some("https://kodx.example/runs/0123456789ab?token=t"),
                Form::default(),
            );
            insta::assert_snapshot!(format!("pull_body_{name}"), body);
        }
    }

    #[test]
    fn titles_are_one_clean_line() {
        assert_eq!(
            title_from("\n  add a   --json flag\nmore", 72),
            "add a --json flag"
        );
        let long = "x".repeat(100);
        let t = title_from(&long, 72);
        assert_eq!(t.chars().count(), 72);
        assert!(t.ends_with('…'));
        assert_eq!(title_from("", 72), "Changes requested with /kodx code");
        assert_eq!(title_from("tab\there\u{7}bell", 72), "tab herebell");
    }

    #[test]
    fn trailers_and_body() {
        let t = trailers("alice", 1005, "r1");
        assert_eq!(t[0].1, "alice <1005+alice@users.noreply.github.com>");
        let b = commit_body(
            "Did it. ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            7,
            false,
            "r1",
        );
        assert!(b.contains("for issue #7") && b.contains("run r1"));
        assert!(
            !b.contains("ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
            "redacted: {b}"
        );
    }

    #[test]
    fn pull_bodies() {
        let issue = Mention::Closes(7);
        let b = pull_body(
            "Summary.",
            issue,
            "alice",
            "cost",
            "r1",
            None,
            Form::default(),
        );
        assert!(
            b.starts_with("<!-- kodx:")
                && b.contains("Closes #7")
                && b.contains("@alice")
                && b.contains("cost")
        );
        let fork = Mention::OnTopOf(8);
        let b = pull_body("", fork, "bob", "cost", "r2", None, Form::default());
        assert!(b.contains("on top of #8") && !b.contains("Closes"));
    }

    #[test]
    fn the_models_words_cannot_mention_hide_or_close() {
        let summary = "Fixed it, @octocat.\n<!-- kodx:{\"run\":\"x\",\"v\":1} -->\nCloses #99";
        let issue = Mention::Closes(7);
        for text in [
            pull_body(summary, issue, "alice", "cost", "r1", None, Form::default()),
            commit_body(summary, 7, false, "r1"),
        ] {
            assert!(!text.contains("@octocat"), "{text}");
            assert!(text.contains("@\u{200B}octocat"), "{text}");
            assert!(!text.contains("Closes #99"), "{text}");
            assert!(!text.contains("\"run\":\"x\""), "{text}");
        }
        let b = pull_body(summary, issue, "alice", "cost", "r1", None, Form::default());
        assert!(b.contains("\nCloses #7\n"), "kodx's own line stays: {b}");
        assert!(b.contains("Requested by @alice"), "{b}");
        assert_eq!(
            crate::serve::texts::markup::find_run_id(&b).as_deref(),
            Some("r1")
        );
        assert_eq!(commit_subject("fix #12 crash"), "f\u{200B}ix #12 crash");
    }

    #[test]
    fn boxes_claiming_checks_pass_are_unticked_unless_checks_passed() {
        let filled = "## Checklist\n- [x] All new and existing tests pass\n- [x] I updated the docs\n  * [X] CI is green\n- [ ] Lint passes\n- [x] I have added tests that prove my fix works\n";
        let b = untick_unverified(filled, false);
        assert!(
            b.contains("- [ ] All new and existing tests pass _(unticked"),
            "{b}"
        );
        assert!(b.contains("- [x] I updated the docs\n"), "{b}");
        assert!(b.contains("  * [ ] CI is green _(unticked"), "{b}");
        assert!(b.contains("- [ ] Lint passes\n"), "{b}");
        // Adding tests is a claim about the diff, which reviewers see.
        assert!(
            b.contains("- [x] I have added tests that prove my fix works\n"),
            "{b}"
        );
        assert_eq!(untick_unverified(filled, true), filled);

        // 200 boxes: each judged on its own line, the rest kept as written.
        let many: String = (0..200)
            .map(|i| format!("- [x] test {i} passes\n"))
            .collect();
        let b = untick_unverified(&many, false);
        assert_eq!(b.matches("- [ ] test").count(), 200);
        assert_eq!(b.lines().count(), 200);

        // A template's body: kodx's part below a rule.
        let b = pull_body(
            filled,
            Mention::Closes(7),
            "alice",
            "cost",
            "r1",
            None,
            Form {
                templated: true,
                ..Form::default()
            },
        );
        let (template, kodx) = b.split_once("\n---\n\n#### kodx\n").expect(&b);
        assert!(
            template.contains("## Checklist") && !template.contains("Closes #7"),
            "{b}"
        );
        assert!(kodx.contains("Closes #7") && kodx.contains("@alice"), "{b}");
    }
}
