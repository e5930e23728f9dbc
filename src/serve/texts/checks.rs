//! The words about a code run's checks (SPEC §11): the table in the status comment and the
//! pull request body, what red checks made of the delivery, and the `kodx` Check Run.

use crate::checks::{latest, CheckResult, Verdict};
use crate::repo_config::OnRed;

use crate::neutral;

use super::markup::format_duration;

/// The name of kodx's Check Run.
pub const CHECK_RUN_NAME: &str = "kodx";

/// The most of one check's output the Check Run's text holds, in characters.
const MAX_TAIL_IN_CHECK_RUN: usize = 12_000;

/// The attempt from which `name` passed in every later attempt (`None`: red in the last).
fn passed_since(results: &[CheckResult], name: &str) -> Option<u32> {
    let mut since = None;
    for r in results.iter().filter(|r| r.name == name) {
        since = match (r.passed, since) {
            (true, None) => Some(r.attempt),
            (true, s) => s,
            (false, _) => None,
        };
    }
    since
}

/// The checks table: each check's last result, its duration, and the attempt it passed in.
pub fn checks_table(results: &[CheckResult]) -> String {
    let last = latest(results);
    let Some(attempts) = last.first().map(|r| r.attempt) else {
        return String::new();
    };
    let mut out = String::from("| check | result | duration | attempt |\n|---|---|--:|---|\n");
    for r in &last {
        let (icon, verdict) = match (r.passed, r.edited.is_empty()) {
            (true, true) => ("✅", r.verdict()),
            // Never plainly green over edited tests.
            (true, false) => (
                "⚠️",
                format!("passed over edited tests: {}", files(&r.edited)),
            ),
            (false, true) => ("❌", r.verdict()),
            (false, false) => ("❌", format!("{}; edits {}", r.verdict(), files(&r.edited))),
        };
        let attempt = match passed_since(results, &r.name) {
            Some(k) => format!("passed in {k} of {attempts}"),
            None => format!("red after {attempts}"),
        };
        out.push_str(&format!(
            "| {} | {icon} {verdict} | {} | {attempt} |\n",
            neutral::words(&r.name),
            short_duration(r),
        ));
    }
    out
}

/// `a`, `b` and 3 more: the first few of `paths`, each as code.
fn files(paths: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut out = paths
        .iter()
        .take(SHOWN)
        .map(|p| neutral::code(p))
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        out.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    out
}

/// The edited files the last attempt's checks depend on, sorted and unique.
fn edited_files(results: &[CheckResult]) -> Vec<String> {
    let mut all: Vec<String> = latest(results)
        .iter()
        .flat_map(|r| r.edited.iter().cloned())
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The note when the change edits files the checks depend on (SPEC §12), for the status
/// comment and the pull request body; `None` when it edits none.
pub fn edited_note(results: &[CheckResult], verdict: Verdict) -> Option<String> {
    let edited = edited_files(results);
    if edited.is_empty() {
        return None;
    }
    let green = verdict.all_passed() == Some(true);
    let lead = if green {
        "⚠️ **The checks passed over edited tests.**"
    } else {
        "⚠️ **The change edits what the checks depend on.**"
    };
    Some(format!(
        "{lead} This change edits {}, which the checks depend on: a pass proves less than \
         usual. Review those edits first.\n\n",
        files(&edited)
    ))
}

/// `0.4s`, `12.0s`, then `1m 12s`.
fn short_duration(r: &CheckResult) -> String {
    let d = r.duration();
    if d.as_secs() < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format_duration(d)
    }
}

/// The checks part of the status comment and the pull request body: a heading and the
/// table (empty when no checks ran).
pub fn section(results: &[CheckResult]) -> String {
    if results.is_empty() {
        return String::new();
    }
    format!(
        "**Checks** (run by kodx in a fresh sandbox holding only the change):\n\n{}\n",
        checks_table(results)
    )
}

/// The names of the checks red in the last attempt.
pub fn failing(results: &[CheckResult]) -> Vec<String> {
    latest(results)
        .into_iter()
        .filter(|r| !r.passed)
        .map(|r| r.name.clone())
        .collect()
}

/// What the red checks made of the delivery, for the status comment and the PR body.
pub fn red_note(results: &[CheckResult], on_red: OnRed, new_pull: bool) -> String {
    let names = failing(results)
        .iter()
        .map(|n| neutral::code(n))
        .collect::<Vec<_>>()
        .join(", ");
    let what = match (on_red, new_pull) {
        (OnRed::Discard, _) => "nothing was pushed (`pr.on_red: discard`)",
        (OnRed::Draft, true) => "the pull request is a draft until they pass (`pr.on_red: draft`)",
        (OnRed::Open, true) => "the pull request was opened anyway (`pr.on_red: open`)",
        (_, false) => "the commit was pushed; the table shows what failed",
    };
    format!("**Checks still failing:** {names}; {what}.\n\n")
}

/// A note when the change edits the files that define checks or CI: the checks that ran
/// came from the base, whatever the change says.
pub fn rules_edited_note(paths: &[&str]) -> Option<String> {
    let edited: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| *p == ".github/kodx.yml" || p.starts_with(".github/workflows/"))
        .collect();
    if edited.is_empty() {
        return None;
    }
    let list = edited
        .iter()
        .take(10)
        .map(|p| neutral::code(p))
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "⚠️ This change edits the check or CI configuration ({list}). kodx ran the checks of \
         the base branch, not the edited ones; review these files with care.\n\n"
    ))
}

/// The Check Run's conclusion, title, summary and text.
pub fn check_run(
    results: &[CheckResult],
    verdict: Verdict,
    run_link: Option<&str>,
) -> (String, String, String, String) {
    let last = latest(results);
    let Verdict {
        red, over_edited, ..
    } = verdict;
    // Green over edited tests is neutral: not a failure, never plainly green.
    let conclusion = match (red, over_edited) {
        (0, 0) => "success",
        (0, _) => "neutral",
        _ => "failure",
    };
    let title = match (red, over_edited) {
        (0, 0) => format!("{} of {} checks passed", last.len(), last.len()),
        (0, n) => format!(
            "{} of {} checks passed, {n} over edited tests",
            last.len(),
            last.len()
        ),
        _ => format!("{red} of {} checks failed", last.len()),
    };
    let mut summary = checks_table(results);
    if let Some(note) = edited_note(results, verdict) {
        summary.push('\n');
        summary.push_str(&note);
    }
    if let Some(link) = run_link {
        summary.push_str(&format!("\nThe run's steps: {link}\n"));
    }
    let mut text = String::new();
    for r in &last {
        let output: String = {
            // Redacted before it is cut, so no token is cut out of its shape.
            let o = crate::redact::redact(&r.output);
            let n = o.chars().count();
            if n > MAX_TAIL_IN_CHECK_RUN {
                o.chars().skip(n - MAX_TAIL_IN_CHECK_RUN).collect()
            } else {
                o
            }
        };
        text.push_str(&format!(
            "### {} — {}\n\n{}\n\n",
            neutral::words(&r.name),
            r.verdict(),
            neutral::code(&r.run),
        ));
        if !r.edited.is_empty() {
            text.push_str(&format!(
                "Edited files this check depends on: {}\n\n",
                files(&r.edited)
            ));
        }
        text.push_str(&format!("{}\n", neutral::block(&output)));
    }
    (conclusion.into(), title, summary, text)
}

/// The one line said when the Check Run could not be created.
pub fn check_run_failed(error: &str, permission: bool) -> String {
    if permission {
        "kodx could not add its `kodx` check to the commit: the App has no Checks permission \
         on this repository. Grant **Checks: Read and write** in the App's settings to see the \
         checks on the commit."
            .into()
    } else {
        format!(
            "kodx could not add its `kodx` check to the commit: {}",
            neutral::words(error)
        )
    }
}

/// The Check Run's note when the red checks' output told of more problems than the `kept`
/// annotations it carries: `left_out` more were read, and with `more` a check's output went
/// on past what was read of it.
pub fn annotations_left_out(kept: usize, left_out: usize, more: bool) -> String {
    let rest = match (left_out, more) {
        (0, _) => "more".to_string(),
        (n, false) => format!("{n} more"),
        (n, true) => format!("at least {n} more"),
    };
    format!(
        "\nkodx annotated {kept} problems read from the red checks' output, as many as it adds \
         to a Check Run; the output tells of {rest}, not annotated.\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, attempt: u32, passed: bool) -> CheckResult {
        CheckResult {
            name: name.into(),
            run: format!("make {name}"),
            attempt,
            passed,
            exit_code: Some(if passed { 0 } else { 2 }),
            timed_out: false,
            duration_ms: 1500,
            output: if passed {
                "ok".into()
            } else {
                "error: boom".into()
            },
            omitted_bytes: 0,
            annotations: Vec::new(),
            edited: Vec::new(),
        }
    }

    #[test]
    fn a_pass_over_edited_tests_is_never_plainly_green() {
        let mut tests = r("tests", 1, true);
        tests.edited = vec!["tests/run.sh".into(), "tests/x_test.py".into()];
        let mut lint = r("lint", 1, false);
        lint.edited = vec![".github/workflows/ci.yml".into()];
        let results = [tests.clone(), r("build", 1, true)];
        let table = checks_table(&results);
        assert!(
            table.contains(
                "| tests | ⚠️ passed over edited tests: `tests/run.sh`, `tests/x_test.py` |"
            ),
            "{table}"
        );
        assert!(table.contains("| build | ✅ passed |"), "{table}");
        assert_eq!(Verdict::of(&results).plainly_green(), Some(false));
        assert_eq!(
            Verdict::of(&[r("build", 1, true)]).plainly_green(),
            Some(true)
        );
        let (conclusion, title, summary, text) = check_run(&results, Verdict::of(&results), None);
        assert_eq!(conclusion, "neutral");
        assert_eq!(title, "2 of 2 checks passed, 1 over edited tests");
        assert!(
            summary.contains("The checks passed over edited tests"),
            "{summary}"
        );
        assert!(
            text.contains("Edited files this check depends on: `tests/run.sh`"),
            "{text}"
        );
        let note = edited_note(&results, Verdict::of(&results)).unwrap();
        assert!(note.contains("`tests/run.sh`, `tests/x_test.py`"), "{note}");
        // Red stays red, and says what it edits.
        let red = [tests, lint];
        assert_eq!(check_run(&red, Verdict::of(&red), None).0, "failure");
        assert!(checks_table(&red)
            .contains("| lint | ❌ failed (exit 2); edits `.github/workflows/ci.yml` |"));
        assert!(edited_note(&red, Verdict::of(&red))
            .unwrap()
            .contains("edits what the checks depend on"));
        assert_eq!(
            edited_note(&[r("build", 1, true)], Verdict::default()),
            None
        );
        let many: Vec<String> = (0..8).map(|i| format!("tests/t{i}.py")).collect();
        assert!(
            files(&many).ends_with("`tests/t4.py` and 3 more"),
            "{}",
            files(&many)
        );
    }

    #[test]
    fn the_table_says_when_each_check_passed() {
        let results = [
            r("tests", 1, false),
            r("lint", 1, true),
            r("tests", 2, true),
            r("lint", 2, true),
        ];
        insta::assert_snapshot!("checks_table", checks_table(&results));
        let red = [r("tests", 1, false), r("lint", 1, true)];
        let table = checks_table(&red);
        assert!(
            table.contains("| tests | ❌ failed (exit 2) | 1.5s | red after 1 |"),
            "{table}"
        );
        assert!(red_note(&red, OnRed::Draft, true).contains("`tests`; the pull request is a draft"));
        let (conclusion, title, summary, text) =
            check_run(&red, Verdict::of(&red), Some("https://k/runs/1"));
        assert_eq!(
            (conclusion.as_str(), title.as_str()),
            ("failure", "1 of 2 checks failed")
        );
        assert!(summary.contains("| lint | ✅ passed") && summary.contains("https://k/runs/1"));
        assert!(text.contains("### tests — failed (exit 2)") && text.contains("error: boom"));
        insta::assert_snapshot!(annotations_left_out(200, 51, false), @r"
        kodx annotated 200 problems read from the red checks' output, as many as it adds to a Check Run; the output tells of 51 more, not annotated.
        ");
        assert!(annotations_left_out(200, 0, true).contains("tells of more, not"));
        assert!(annotations_left_out(200, 3, true).contains("tells of at least 3 more"));
    }

    #[test]
    fn outside_names_commands_and_output_post_nothing_live() {
        use crate::neutral::testing::{assert_nothing_live, HOSTILE};
        let mut bad = r(HOSTILE, 1, false);
        bad.run = format!("make\n\n{HOSTILE}");
        bad.output = HOSTILE.into();
        let results = [bad, r("lint", 1, true)];
        let (_, _, summary, text) = check_run(&results, Verdict::of(&results), None);
        let workflow = format!(".github/workflows/{HOSTILE}");
        for body in [
            checks_table(&results),
            red_note(&results, OnRed::Draft, true),
            rules_edited_note(&[workflow.as_str()]).unwrap(),
            summary,
            text.clone(),
            check_run_failed(HOSTILE, false),
        ] {
            assert_nothing_live(&body);
        }
        // The table keeps its shape: the name's `|` and line breaks stay in its cell.
        let table = checks_table(&results);
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(text.contains("### x\\` @\u{200B}org/team"), "{text}");
    }

    #[test]
    fn edits_to_the_check_configuration_are_named() {
        assert_eq!(rules_edited_note(&["src/lib.rs"]), None);
        let note =
            rules_edited_note(&["src/lib.rs", ".github/kodx.yml", ".github/workflows/ci.yml"])
                .unwrap();
        assert!(
            note.contains("`.github/kodx.yml`, `.github/workflows/ci.yml`"),
            "{note}"
        );
    }
}
