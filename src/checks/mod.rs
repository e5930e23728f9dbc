//! The repository's own checks (SPEC §11): commands declared in `.github/kodx.yml`
//! (`checks:`) or given to `kodx run` (`--check name=cmd`), run by kodx itself after the
//! model ends its turn, never by the model's goodwill alone, and never in the agent's own
//! sandbox: in one made for them with exactly the change set ([`verify`], SPEC §12).
//!
//! Each check runs as its own process in the container (`bash -c` in the repository's
//! directory with stdin from `/dev/null`), never typed into a shell: a shell's prompt, and
//! the status in it, is text anything there can print. All the checks of an attempt go to
//! the sandbox at once ([`Sandbox::run_all`]): the Docker sandbox runs them through kodx's
//! own check runner, one engine exec started before anything of the repository ran, whose
//! reports nothing in the sandbox can reach (`crates/kodx-sandbox/src/docker/runner.rs`);
//! without it, each check is an engine exec of its own whose exit code is the engine's. Each runs under
//! its timeout and what is left of the run's wall clock; a check that times out is killed
//! with its process group. Output is read through a bounded decoder (a check printing
//! gigabytes costs its cap, not kodx's memory).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sandbox::{Ran, Sandbox, SandboxError};

pub mod annotate;
pub mod guard;
pub mod verify;

pub use annotate::{Annotation, Level};

/// Checks a repository may declare.
pub const MAX_CHECKS: usize = 20;
/// A check's timeout unless it says otherwise.
pub const DEFAULT_CHECK_TIMEOUT_SECS: u64 = 600;
/// The longest timeout a check may ask for (the run's wall clock bounds it anyway).
pub const MAX_CHECK_TIMEOUT_SECS: u64 = 6 * 3600;
/// Repair passes unless the repository says otherwise.
pub const DEFAULT_CHECK_REPAIR: u32 = 2;
/// The longest check name, in characters.
pub const MAX_CHECK_NAME_CHARS: usize = 64;
/// The longest check command, in bytes.
pub const MAX_CHECK_COMMAND_BYTES: usize = 4096;
/// The end of a check's output kept (for the model, the run page and the Check Run).
pub const TAIL_BYTES: usize = 4000;
/// Error lines from before the tail kept besides it.
const ERROR_LINES_BYTES: usize = 1500;

/// One declared check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckSpec {
    pub name: String,
    /// A shell command, run with `bash -c` in the repository's directory.
    pub run: String,
    pub timeout_secs: u64,
}

impl CheckSpec {
    /// `name=command` (the `--check` flag of `kodx run`).
    pub fn parse_flag(text: &str) -> Result<CheckSpec, String> {
        let Some((name, run)) = text.split_once('=') else {
            return Err(format!(
                "`--check {text}`: expected NAME=COMMAND, e.g. --check \"tests=cargo test\""
            ));
        };
        let spec = CheckSpec {
            name: name.trim().to_string(),
            run: run.trim().to_string(),
            timeout_secs: DEFAULT_CHECK_TIMEOUT_SECS,
        };
        check_name(&spec.name).map_err(|e| format!("`--check {text}`: the name {e}"))?;
        check_command(&spec.run).map_err(|e| format!("`--check {text}`: the command {e}"))?;
        Ok(spec)
    }
}

/// A check's name: 1–64 characters of letters, digits, space, `.`, `_`, `-`, `:` or `/`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if name.chars().count() > MAX_CHECK_NAME_CHARS {
        return Err(format!("must be at most {MAX_CHECK_NAME_CHARS} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_alphanumeric() || " ._-:/".contains(*c)))
    {
        return Err(format!(
            "may hold letters, digits, spaces and . _ - : / only, not {:?}",
            c
        ));
    }
    Ok(())
}

/// A check's command: not empty, at most [`MAX_CHECK_COMMAND_BYTES`], no NUL.
pub fn check_command(run: &str) -> Result<(), String> {
    if run.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if run.len() > MAX_CHECK_COMMAND_BYTES {
        return Err(format!("must be at most {MAX_CHECK_COMMAND_BYTES} bytes"));
    }
    if run.contains('\0') {
        return Err("must not contain a NUL byte".into());
    }
    Ok(())
}

/// What one check did in one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub run: String,
    /// 1 for the checks after the model's first end of turn, 2 after the first repair …
    pub attempt: u32,
    pub passed: bool,
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// The end of its output (and error lines from before it), bounded.
    pub output: String,
    /// Bytes of output not kept.
    #[serde(default)]
    pub omitted_bytes: u64,
    /// Problems read from a red check's output (file, line, level, message), for the
    /// Check Run's annotations ([`annotate`]): repository paths only, bounded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<Annotation>,
    /// Files this check depends on that the change set edits (SPEC §12: `.github/`, the
    /// `checks_guard:` globs, files of the starting commit its command names), sorted: a
    /// pass over them is shown as such, never plainly green.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edited: Vec<String>,
}

impl CheckResult {
    /// Check `spec` in attempt `attempt`, not passed, with `output` (filled in by whoever
    /// ran it, or saying why it did not run).
    pub fn red(spec: &CheckSpec, attempt: u32, output: String) -> CheckResult {
        CheckResult {
            name: spec.name.clone(),
            run: spec.run.clone(),
            attempt,
            passed: false,
            exit_code: None,
            timed_out: false,
            duration_ms: 0,
            output,
            omitted_bytes: 0,
            annotations: Vec::new(),
            edited: Vec::new(),
        }
    }

    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.duration_ms)
    }

    /// `exit 1`, `timed out after 10s`, `passed`.
    pub fn verdict(&self) -> String {
        if self.passed {
            "passed".into()
        } else if self.timed_out {
            format!("timed out after {:.0}s", self.duration().as_secs_f64())
        } else {
            match self.exit_code {
                Some(code) => format!("failed (exit {code})"),
                None => "failed".into(),
            }
        }
    }
}

/// The results of the last attempt of each check (what was delivered), in order.
pub fn latest(results: &[CheckResult]) -> Vec<&CheckResult> {
    let Some(last) = results.iter().map(|r| r.attempt).max() else {
        return Vec::new();
    };
    results.iter().filter(|r| r.attempt == last).collect()
}

/// What the last attempt's checks came to: worked out once when a run's checks are over,
/// and handed to everything that says it (the status comment, the pull request body, the
/// `kodx` Check Run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verdict {
    /// How many checks the last attempt ran (none: no checks ran).
    pub ran: usize,
    /// How many of them failed.
    pub red: usize,
    /// How many passed over files the change edited that they depend on.
    pub over_edited: usize,
}

impl Verdict {
    pub fn of(results: &[CheckResult]) -> Verdict {
        let last = latest(results);
        Verdict {
            ran: last.len(),
            red: last.iter().filter(|r| !r.passed).count(),
            over_edited: last
                .iter()
                .filter(|r| r.passed && !r.edited.is_empty())
                .count(),
        }
    }

    /// Whether every check passed (`None`: no checks ran).
    pub fn all_passed(&self) -> Option<bool> {
        (self.ran > 0).then_some(self.red == 0)
    }

    /// Some check failed.
    pub fn is_red(&self) -> bool {
        self.all_passed() == Some(false)
    }

    /// Whether every check passed with none over edited files: what kodx vouches for
    /// (`None`: no checks ran). A pass over edited tests is never plainly green.
    pub fn plainly_green(&self) -> Option<bool> {
        (self.ran > 0).then_some(self.red == 0 && self.over_edited == 0)
    }
}

/// Whether every check of the last attempt passed (`None`: no checks ran).
pub fn all_passed(results: &[CheckResult]) -> Option<bool> {
    let latest = latest(results);
    (!latest.is_empty()).then(|| latest.iter().all(|r| r.passed))
}

/// The checks told to the model in its first message.
pub fn told(checks: &[CheckSpec]) -> String {
    let mut out = String::from(
        "This repository declares checks. When you end your turn, kodx runs each of them in \
         a fresh sandbox made like yours, holding the repository with exactly your changes \
         to its files (what git would commit; ignored files are not carried over) — not in \
         your container: what you install, start or change outside the repository there \
         does not reach them. If one fails you get its output and another turn to fix it. \
         Run them yourself while you work:\n\n",
    );
    for c in checks {
        out.push_str(&format!(
            "- {}: `{}` (timeout {}s)\n",
            c.name,
            c.run.replace('`', "'"),
            c.timeout_secs
        ));
    }
    out
}

/// The message that gives the model the failing checks of an attempt.
pub fn failure_report(results: &[CheckResult], passes_left: u32) -> String {
    let mut out = String::from(
        "kodx ran the repository's checks on your work, and some failed. Fix the cause (not \
         the checks), then end your turn again; kodx runs all the checks again after that.",
    );
    out.push_str(&format!(
        " Repair passes left after this one: {passes_left}.\n\n"
    ));
    for r in results.iter().filter(|r| !r.passed) {
        out.push_str(&format!(
            "### {} — {}\n`{}`\n\n```\n{}\n```\n\n",
            r.name,
            r.verdict(),
            r.run.replace('`', "'"),
            r.output.trim_end().replace("```", "`\u{200B}``")
        ));
    }
    out
}

/// Output of one check kept while it runs (head and tail; the middle is cut past it).
const CHECK_OUTPUT_CAP: usize = 256 * 1024;

/// Runs `checks` in `sandbox` as attempt `attempt`, each bounded by its timeout and by
/// `deadline`; `each` hears every result as it comes.
pub async fn run_checks(
    sandbox: &dyn Sandbox,
    checks: &[CheckSpec],
    attempt: u32,
    deadline: Instant,
    mut each: impl FnMut(&CheckResult),
) -> Vec<CheckResult> {
    let commands: Vec<(String, Duration)> = checks
        .iter()
        .map(|c| (c.run.clone(), Duration::from_secs(c.timeout_secs)))
        .collect();
    let within = deadline.saturating_duration_since(Instant::now());
    let (reports, mut ran) = tokio::sync::mpsc::unbounded_channel();
    let mut results = Vec::with_capacity(checks.len());
    let mut since = Instant::now();
    // Each check's result as it ends, while the sandbox runs the others.
    let hear = async {
        while let Some(ran) = ran.recv().await {
            let Some(spec) = checks.get(results.len()) else {
                break;
            };
            let result = check_result(spec, attempt, ran, since.elapsed(), sandbox.workdir());
            since = Instant::now();
            each(&result);
            results.push(result);
        }
    };
    let all = sandbox.run_all(&commands, within, CHECK_OUTPUT_CAP, reports);
    let (outcome, ()) = tokio::join!(all, hear);
    // A check the sandbox did not report did not pass.
    let why = match outcome {
        Err(e) => e.to_string(),
        Ok(()) => "the sandbox did not report it".to_string(),
    };
    for spec in &checks[results.len()..] {
        let lost = Ran::Failed(SandboxError::InvalidInput(why.clone()));
        let result = check_result(spec, attempt, lost, Duration::ZERO, sandbox.workdir());
        each(&result);
        results.push(result);
    }
    results
}

/// What check `spec` did in attempt `attempt`, as the sandbox reported it (`ran`), `took`
/// after the previous one.
fn check_result(
    spec: &CheckSpec,
    attempt: u32,
    ran: Ran,
    took: Duration,
    workdir: &str,
) -> CheckResult {
    let mut result = CheckResult::red(spec, attempt, String::new());
    match ran {
        Ran::NotStarted => {
            result.timed_out = true;
            result.output = "[not run: the run's time limit was reached]".into();
        }
        Ran::Done(done) => {
            result.omitted_bytes = done.omitted_bytes;
            result.output = tail(&done.output);
            result.exit_code = done.exit_code;
            result.timed_out = done.timed_out;
            result.passed = done.exit_code == Some(0);
            if !result.passed {
                result.annotations = annotate::for_check(&done.output, workdir, &spec.name);
            }
        }
        Ran::Failed(e) => result.output = format!("[kodx could not run the check: {e}]"),
    }
    result.duration_ms = took.as_millis() as u64;
    result
}

/// The last [`TAIL_BYTES`] of `output`, after up to [`ERROR_LINES_BYTES`] of the lines
/// before them that look like errors (the first failure is often far above the end).
pub fn tail(output: &str) -> String {
    if output.len() <= TAIL_BYTES {
        return output.to_string();
    }
    let mut start = output.len() - TAIL_BYTES;
    while !output.is_char_boundary(start) {
        start += 1;
    }
    let (before, end) = output.split_at(start);
    let mut errors = String::new();
    for line in before.lines() {
        let lower = line.to_ascii_lowercase();
        if ["error", "failed", "failure", "panicked", "fatal", "assert"]
            .iter()
            .any(|w| lower.contains(w))
        {
            let line: String = line.chars().take(300).collect();
            if errors.len() + line.len() + 1 > ERROR_LINES_BYTES {
                break;
            }
            errors.push_str(&line);
            errors.push('\n');
        }
    }
    let mut out = String::new();
    if !errors.is_empty() {
        out.push_str("[error lines from earlier in the output]\n");
        out.push_str(&errors);
        out.push_str("[…]\n");
    } else {
        out.push_str("[…]\n");
    }
    out.push_str(end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_names_and_commands_are_checked() {
        let c = CheckSpec::parse_flag("tests=cargo test --quiet").unwrap();
        assert_eq!(
            (c.name.as_str(), c.run.as_str()),
            ("tests", "cargo test --quiet")
        );
        assert_eq!(c.timeout_secs, DEFAULT_CHECK_TIMEOUT_SECS);
        // `=` in the command stays in the command.
        assert_eq!(
            CheckSpec::parse_flag("env=A=1 make").unwrap().run,
            "A=1 make"
        );
        assert!(CheckSpec::parse_flag("no equals")
            .unwrap_err()
            .contains("NAME=COMMAND"));
        assert!(CheckSpec::parse_flag("=make")
            .unwrap_err()
            .contains("must not be empty"));
        assert!(CheckSpec::parse_flag("a`b=make")
            .unwrap_err()
            .contains("not '`'"));
        assert!(check_name(&"n".repeat(65)).is_err());
        assert!(check_command("a\0b").is_err());
        assert!(check_command(&"x".repeat(5000)).is_err());
    }

    #[test]
    fn the_tail_keeps_the_end_and_earlier_errors() {
        let mut out = String::from("error[E0308]: mismatched types\n");
        out.push_str(&"ok line\n".repeat(2000));
        out.push_str("test result: FAILED. 1 failed\n");
        let t = tail(&out);
        assert!(
            t.len() <= TAIL_BYTES + ERROR_LINES_BYTES + 100,
            "{}",
            t.len()
        );
        assert!(t.starts_with("[error lines from earlier in the output]\nerror[E0308]"));
        assert!(t.ends_with("test result: FAILED. 1 failed\n"));
        assert_eq!(tail("short"), "short");
    }

    #[test]
    fn the_latest_attempt_decides() {
        let r = |attempt, passed| CheckResult {
            name: "t".into(),
            run: "x".into(),
            attempt,
            passed,
            exit_code: Some(if passed { 0 } else { 1 }),
            timed_out: false,
            duration_ms: 5,
            output: String::new(),
            omitted_bytes: 0,
            annotations: Vec::new(),
            edited: Vec::new(),
        };
        assert_eq!(all_passed(&[]), None);
        assert_eq!(all_passed(&[r(1, false), r(2, true)]), Some(true));
        assert_eq!(all_passed(&[r(1, true), r(2, false)]), Some(false));
        assert_eq!(r(1, false).verdict(), "failed (exit 1)");
        // The verdict says the same of the last attempt, once.
        assert_eq!(Verdict::of(&[]).all_passed(), None);
        assert_eq!(Verdict::of(&[]).plainly_green(), None);
        let red = Verdict::of(&[r(1, true), r(2, false), r(2, true)]);
        assert_eq!((red.ran, red.red, red.is_red()), (2, 1, true));
        let mut edited = r(2, true);
        edited.edited = vec!["tests/a.rs".into()];
        let over = Verdict::of(&[r(1, false), edited, r(2, true)]);
        assert_eq!(over.all_passed(), Some(true));
        assert_eq!(over.plainly_green(), Some(false));
        assert_eq!(Verdict::of(&[r(1, true)]).plainly_green(), Some(true));
    }
}
