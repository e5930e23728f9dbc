//! Finding and parsing a `/kodx` command in a comment or issue body (SPEC §4).
//!
//! A command is a line whose first word is exactly `/kodx`, after at most three spaces of
//! indentation, and which lies outside (as `pulldown-cmark` parses GitHub Markdown):
//!
//! - fenced code blocks (```` ``` ```` or `~~~`; an unclosed fence runs to the end),
//! - block quotes, including their lazy continuation lines (`> quoted` then `/kodx code x`
//!   on the next line renders inside the quote), nested quotes and quotes in list items,
//! - indented code (four or more columns; a tab counts to the next multiple of four),
//! - HTML blocks and inline HTML, comments included, so the hidden instructions of issue
//!   templates never start a run,
//! - code spans, also those running over several lines.
//!
//! The first command wins. Its argument is the rest of its line plus every following line,
//! with leading blank lines and trailing whitespace removed and `\r\n` turned into `\n`;
//! everything else (indentation, code fences, quotes) is kept as written.
//!
//! The body is untrusted: the search is linear in its length (one hand scan for candidate
//! lines, one Markdown parse only when there is one), and a request over
//! [`MAX_REQUEST_BYTES`] is measured without being copied.
//!
//! What a command asks for is one type from the comment to the run: [`Job`] (parsed here,
//! stored by the queue, dispatched by the worker), with [`JobKind`] its stored tag and
//! [`RunKind`] the kind of agent work it does (`ask`, or `code` for `code` and `continue`).

use serde::Serialize;
use thiserror::Error;

/// The longest request (bytes of the argument, after trimming) that is accepted.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The longest unknown subcommand kept for the reply, in characters.
const MAX_UNKNOWN_CHARS: usize = 64;

/// The word that starts a command.
const PREFIX: &str = "/kodx";

/// What was asked: what [`parse`] reads from a comment (never [`Job::Refuse`]), what the
/// queue stores and what the worker dispatches on. One type from the comment to the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Job {
    /// `/kodx ask <question>`: read-only agent work.
    Ask { question: String },
    /// `/kodx code [--base <branch>] <request>`: agent work that ends in a pull request
    /// (against `base`, else the default branch).
    Code {
        request: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        base: Option<String>,
    },
    /// `/kodx continue [$N | N steps]`: resume the code run here that a limit stopped, with
    /// `more` budget or steps.
    Continue {
        #[serde(serialize_with = "more_argument")]
        more: More,
    },
    /// `/kodx cancel`: stop the runs on this issue.
    Cancel,
    /// `/kodx go [$N]`: start the run here that waits for confirmation, with a cap of at
    /// most `cap` USD when given.
    Go {
        #[serde(skip_serializing_if = "Option::is_none")]
        cap: Option<Usd>,
    },
    /// `/kodx update`: on a pull request kodx opened, merge its base into its branch.
    Update,
    /// `/kodx help`, or an unknown subcommand (named in the answer).
    Help { unknown: Option<String> },
    /// A command that was found but cannot run (empty or too long); the reason is the
    /// sentence the answer gives.
    Refuse { reason: String },
    /// `/kodx address-reviews [words]`: one code run on a pull request that addresses every
    /// unresolved review thread, then replies in each (SPEC §11); `words` may be empty.
    #[serde(rename = "address-reviews")]
    AddressReviews { words: String },
    /// A repair run kodx starts itself when CI fails on the head `commit` of a pull request
    /// it opened (`ci_repair`, SPEC §11). Never written in a comment.
    Repair { commit: String },
    /// A merge run kodx starts itself on a pull request it opened whose base moved on and
    /// now conflicts with it (SPEC §12, "Mergeable pull requests"): after a push to the
    /// base with `pr.keep_mergeable` (`asked: false`), or when `/kodx update` found
    /// conflicts (`asked: true`). `base` is the base's tip then. Never written in a comment.
    Merge { base: String, asked: bool },
    /// `/kodx steer <words>`: words given to the run running here, at its next step
    /// (SPEC §12, "Steering and pictures").
    Steer { words: String },
}

/// The stored tag of a [`Job`] (the `kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(rename_all = "lowercase", type_name = "text")]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    Ask,
    Code,
    Continue,
    Cancel,
    Go,
    Update,
    Help,
    Refuse,
    #[sqlx(rename = "address_reviews")]
    #[serde(rename = "address_reviews")]
    AddressReviews,
    Repair,
    Merge,
    Steer,
}

impl JobKind {
    /// The word stored, logged and used as the `kind` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Ask => "ask",
            JobKind::Code => "code",
            JobKind::Continue => "continue",
            JobKind::Cancel => "cancel",
            JobKind::Go => "go",
            JobKind::Update => "update",
            JobKind::Help => "help",
            JobKind::Refuse => "refuse",
            JobKind::AddressReviews => "address_reviews",
            JobKind::Repair => "repair",
            JobKind::Merge => "merge",
            JobKind::Steer => "steer",
        }
    }

    /// The subcommand as a maintainer writes it (`address-reviews`); a repair run, which
    /// nobody writes, is named `repair`.
    pub fn command_word(self) -> &'static str {
        match self {
            JobKind::AddressReviews => "address-reviews",
            other => other.as_str(),
        }
    }

    /// `ask`, `code`, `continue`, `address_reviews` and `repair` do agent work (one at a
    /// time per issue, under `max_concurrent_runs`); the others are short control jobs.
    pub fn is_work(self) -> bool {
        self.run_kind().is_some()
    }
}

/// The two kinds of agent work: what limits, programs and the status comment tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunKind {
    /// `/kodx code`: changes, a pull request or a pushed commit.
    Code,
    /// `/kodx ask`: an answer only.
    Ask,
}

impl RunKind {
    /// The name of the built-in program that does it.
    pub fn program(self) -> &'static str {
        match self {
            RunKind::Code => "code",
            RunKind::Ask => "ask",
        }
    }
}

impl JobKind {
    /// The agent work this job does, if it does any.
    pub fn run_kind(self) -> Option<RunKind> {
        match self {
            JobKind::Ask => Some(RunKind::Ask),
            // Only code runs are continued (an answer is asked for again).
            JobKind::Code
            | JobKind::Continue
            | JobKind::AddressReviews
            | JobKind::Repair
            | JobKind::Merge => Some(RunKind::Code),
            JobKind::Cancel
            | JobKind::Go
            | JobKind::Update
            | JobKind::Help
            | JobKind::Refuse
            | JobKind::Steer => None,
        }
    }
}

impl std::fmt::Display for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Job {
    /// The job a command asks for: what [`parse`] read, or a refusal saying why it could
    /// not be read.
    pub fn from_parsed(parsed: Result<Job, ParseError>) -> Job {
        parsed.unwrap_or_else(|e| Job::Refuse {
            reason: e.to_string(),
        })
    }

    /// The job stored as `kind` and `argument`.
    pub fn from_stored(kind: JobKind, argument: String) -> Job {
        match kind {
            JobKind::Ask => Job::Ask { question: argument },
            // Stored as written: `--base <branch> <request>` or the request alone.
            JobKind::Code => match split_base(&argument) {
                Ok((Some(base), request)) if !request.trim().is_empty() => Job::Code {
                    request: request.trim_start().to_string(),
                    base: Some(base.to_string()),
                },
                _ => Job::Code {
                    request: argument,
                    base: None,
                },
            },
            // Stored as the command wrote it; a row no version could write reads as the
            // default rather than failing the whole row.
            JobKind::Continue => Job::Continue {
                more: More::parse(&argument).unwrap_or(More::Default),
            },
            JobKind::Cancel => Job::Cancel,
            // Stored as the command wrote it (``, `$2`); a row no version could write reads
            // as no cap.
            JobKind::Update => Job::Update,
            JobKind::Go => Job::Go {
                cap: Usd::parse(&argument),
            },
            JobKind::Help => Job::Help {
                unknown: (!argument.is_empty()).then_some(argument),
            },
            JobKind::Refuse => Job::Refuse { reason: argument },
            JobKind::AddressReviews => Job::AddressReviews { words: argument },
            JobKind::Repair => Job::Repair { commit: argument },
            // `update <sha>` or `push <sha>`.
            JobKind::Merge => match argument.split_once(' ') {
                Some((how, base)) => Job::Merge {
                    base: base.to_string(),
                    asked: how == "update",
                },
                None => Job::Merge {
                    base: argument,
                    asked: false,
                },
            },
            JobKind::Steer => Job::Steer { words: argument },
        }
    }

    pub fn kind(&self) -> JobKind {
        match self {
            Job::Ask { .. } => JobKind::Ask,
            Job::Code { .. } => JobKind::Code,
            Job::Continue { .. } => JobKind::Continue,
            Job::Cancel => JobKind::Cancel,
            Job::Go { .. } => JobKind::Go,
            Job::Update => JobKind::Update,
            Job::Help { .. } => JobKind::Help,
            Job::Refuse { .. } => JobKind::Refuse,
            Job::AddressReviews { .. } => JobKind::AddressReviews,
            Job::Repair { .. } => JobKind::Repair,
            Job::Merge { .. } => JobKind::Merge,
            Job::Steer { .. } => JobKind::Steer,
        }
    }

    /// What was asked, as the prompt, commits and pull request say it: the question, the
    /// request (without `--base`), what `continue` adds (`$2`, `20 steps`), the unknown
    /// subcommand or the refusal's reason (empty for `cancel`).
    pub fn argument(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Job::Ask { question } => question.into(),
            Job::Code { request, .. } => request.into(),
            Job::Continue { more } => more.as_argument().into(),
            Job::Cancel => "".into(),
            Job::Go { cap } => cap.map(|c| c.to_string()).unwrap_or_default().into(),
            Job::Update => "".into(),
            Job::Help { unknown } => unknown.as_deref().unwrap_or("").into(),
            Job::Refuse { reason } => reason.into(),
            Job::AddressReviews { words } => words.into(),
            Job::Repair { commit } => commit.into(),
            Job::Merge { base, asked } => {
                format!("{} {base}", if *asked { "update" } else { "push" }).into()
            }
            Job::Steer { words } => words.into(),
        }
    }

    /// The text stored in the `argument` column: [`Job::argument`], with a code run's
    /// `--base <branch>` before its request.
    pub fn stored_argument(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Job::Code {
                request,
                base: Some(base),
            } => format!("--base {base} {request}").into(),
            _ => self.argument(),
        }
    }

    /// The branch a code run works from and opens its pull request against, when the
    /// command named one (`--base`).
    pub fn base(&self) -> Option<&str> {
        match self {
            Job::Code { base, .. } => base.as_deref(),
            _ => None,
        }
    }

    pub fn is_work(&self) -> bool {
        self.kind().is_work()
    }

    /// The command as the status comment quotes it.
    pub fn command_line(&self) -> String {
        match self {
            Job::Repair { commit } => {
                format!("CI repair of {}", commit.get(..7).unwrap_or(commit))
            }
            Job::Merge { base, asked } => format!(
                "merge of the base ({}){}",
                base.get(..7).unwrap_or(base),
                if *asked {
                    ", asked with /kodx update"
                } else {
                    " after a push to it"
                }
            ),
            _ => format!(
                "/kodx {} {}",
                self.kind().command_word(),
                self.stored_argument()
            ),
        }
    }
}

fn more_argument<S: serde::Serializer>(more: &More, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&more.as_argument())
}

/// An amount in US dollars as a command writes it: `$` and a positive number of at most
/// [`More::MAX_USD`] (`$2`, `$0.50`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Usd(pub f64);

impl Eq for Usd {}

impl Usd {
    /// Reads `$N`; `None` for anything else (the caller words the error).
    pub fn parse(word: &str) -> Option<Usd> {
        let digits = word.trim().strip_prefix('$')?;
        let ok = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && digits.matches('.').count() <= 1;
        if !ok {
            return None;
        }
        match digits.parse::<f64>() {
            Ok(usd) if usd > 0.0 && usd <= More::MAX_USD => Some(Usd(usd)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Usd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${}", self.0)
    }
}

/// What `/kodx continue` adds to the stopped run's limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum More {
    /// Nothing named: the repository's limit for the kind, within the server's maxima.
    Default,
    /// `$N`: this much more budget, in USD.
    Usd(f64),
    /// `N steps`: this many more model calls.
    Steps(u32),
}

impl Eq for More {}

impl More {
    /// The most `/kodx continue $N` accepts; the server's maxima usually bound it further.
    pub const MAX_USD: f64 = 10_000.0;
    /// The most `/kodx continue N steps` accepts.
    pub const MAX_STEPS: u32 = 10_000;

    /// As the command writes it: ``, `$2`, `20 steps`.
    pub fn as_argument(&self) -> String {
        match self {
            More::Default => String::new(),
            More::Usd(usd) => format!("${usd}"),
            More::Steps(1) => "1 step".to_string(),
            More::Steps(n) => format!("{n} steps"),
        }
    }

    /// Parses the argument of `/kodx continue` (its first line).
    pub fn parse(argument: &str) -> Result<More, ParseError> {
        let words: Vec<&str> = argument.split_whitespace().collect();
        let bad = || ParseError::BadContinue {
            found: argument.trim().chars().take(MAX_UNKNOWN_CHARS).collect(),
        };
        match words.as_slice() {
            [] => Ok(More::Default),
            [money] if money.starts_with('$') => {
                Usd::parse(money).map(|u| More::Usd(u.0)).ok_or_else(bad)
            }
            [n, unit]
                if unit.eq_ignore_ascii_case("steps") || unit.eq_ignore_ascii_case("step") =>
            {
                if !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                match n.parse::<u32>() {
                    Ok(n) if (1..=More::MAX_STEPS).contains(&n) => Ok(More::Steps(n)),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }
}

/// A command that was found but cannot run.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// `/kodx code` or `/kodx ask` without any text.
    #[error("`/kodx {command}` needs a request")]
    EmptyRequest { command: &'static str },
    /// The request is longer than `limit` bytes.
    #[error("the request is {bytes} bytes long; the limit is {limit} bytes")]
    TooLong { bytes: usize, limit: usize },
    /// `/kodx continue` with an argument that is neither `$N` nor `N steps`.
    #[error("`/kodx continue` takes nothing, `$N` (more budget, e.g. `$2`) or `N steps` (e.g. `20 steps`), not {}", crate::neutral::code(.found))]
    BadContinue { found: String },
    /// `/kodx go` with an argument that is not `$N`.
    #[error("`/kodx go` takes nothing or a lower cap as `$N` (e.g. `$1.50`), not {}", crate::neutral::code(.found))]
    BadGo { found: String },
    /// `--base` without a branch after it.
    #[error(
        "`--base` needs the name of a branch, as in `/kodx code --base release-1 fix the crash`"
    )]
    BaseWithoutBranch,
    /// `--base` names something no branch can be called.
    #[error("{} cannot be the name of a branch, so `--base` cannot take it", crate::neutral::code(.found))]
    BadBase { found: String },
}

/// The longest branch name `--base` takes, in bytes (git allows more; GitHub's web pages
/// and most tools break long before).
const MAX_BRANCH_BYTES: usize = 255;

/// Splits `--base <branch>` (or `--base=<branch>`) off the front of a code run's argument:
/// `(branch, the rest)`, or `(None, argument)` when it does not start with `--base`.
fn split_base(argument: &str) -> Result<(Option<&str>, &str), ParseError> {
    let text = argument.trim_start_matches([' ', '\t']);
    let Some(after) = text.strip_prefix("--base") else {
        return Ok((None, argument));
    };
    let after = match after.strip_prefix('=') {
        Some(rest) => rest,
        None if after.is_empty() || after.starts_with([' ', '\t', '\r', '\n']) => {
            after.trim_start_matches([' ', '\t'])
        }
        // `--baseline …` is a request, not the option.
        None => return Ok((None, argument)),
    };
    let end = after.find([' ', '\t', '\r', '\n']).unwrap_or(after.len());
    let name = &after[..end];
    if name.is_empty() {
        return Err(ParseError::BaseWithoutBranch);
    }
    let shown = || name.chars().take(MAX_UNKNOWN_CHARS).collect::<String>();
    let valid = name.len() <= MAX_BRANCH_BYTES
        && !name.chars().any(char::is_control)
        && git2::Reference::is_valid_name(&format!("refs/heads/{name}"))
        && !name.starts_with('-');
    if !valid {
        return Err(ParseError::BadBase { found: shown() });
    }
    Ok((Some(name), &after[end..]))
}

/// Finds the first command in `body` and parses it. `None` when the body holds no command.
pub fn parse(body: &str) -> Option<Result<Job, ParseError>> {
    let body = body.strip_prefix('\u{feff}').unwrap_or(body);
    let after = find_command(body)?;
    Some(parse_after_prefix(&body[after..]))
}

/// The byte offset just past the `/kodx` of the first command line, if any.
///
/// Candidate lines are found by hand (cheap, and most bodies have none); the Markdown is
/// parsed only when there is one, and a candidate counts when its `/kodx` lies outside
/// every quote, code block, HTML block, code span and inline HTML that `pulldown-cmark`
/// finds, exactly as GitHub renders the body.
fn find_command(body: &str) -> Option<usize> {
    let mut candidates = candidates(body).peekable();
    candidates.peek()?;
    let hidden = crate::markdown::quoted_or_code(body);
    let mut h = 0;
    for (at, after) in candidates {
        while h < hidden.len() && hidden[h].end <= at {
            h += 1;
        }
        if hidden.get(h).is_some_and(|r| r.contains(&at)) {
            continue;
        }
        return Some(after);
    }
    None
}

/// `(offset of "/kodx", offset just past it)` of every line that starts with `/kodx` as a
/// word after at most three columns of indentation (four or more is code, whatever
/// contains it).
fn candidates(body: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut offset = 0;
    body.split_inclusive('\n').filter_map(move |raw| {
        let start = offset;
        offset += raw.len();
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let (indent, rest) = split_indent(line);
        if indent >= 4 {
            return None;
        }
        let tail = rest.strip_prefix(PREFIX)?;
        if !(tail.is_empty() || tail.starts_with([' ', '\t'])) {
            return None;
        }
        let after = start + (line.len() - tail.len());
        Some((after - PREFIX.len(), after))
    })
}

/// The indentation of `line` in columns (tabs stop every four columns) and the rest.
fn split_indent(line: &str) -> (usize, &str) {
    let mut columns = 0;
    for (i, b) in line.bytes().enumerate() {
        match b {
            b' ' => columns += 1,
            b'\t' => columns += 4 - columns % 4,
            _ => return (columns, &line[i..]),
        }
    }
    (columns, "")
}

/// Parses what follows `/kodx` (the rest of its line and every following line).
fn parse_after_prefix(text: &str) -> Result<Job, ParseError> {
    let text = text.trim_start_matches([' ', '\t']);
    let line_end = text.find(['\r', '\n']).unwrap_or(text.len());
    let word_end = text[..line_end].find([' ', '\t']).unwrap_or(line_end);
    let word = &text[..word_end];
    let argument = &text[word_end..];
    if word.is_empty() || word.eq_ignore_ascii_case("help") {
        Ok(Job::Help { unknown: None })
    } else if word.eq_ignore_ascii_case("cancel") {
        Ok(Job::Cancel)
    } else if word.eq_ignore_ascii_case("update") {
        Ok(Job::Update)
    } else if word.eq_ignore_ascii_case("go") {
        let line = argument.find(['\r', '\n']).unwrap_or(argument.len());
        let words = argument[..line].trim();
        let cap = match words {
            "" => None,
            money => Some(Usd::parse(money).ok_or_else(|| ParseError::BadGo {
                found: money.chars().take(MAX_UNKNOWN_CHARS).collect(),
            })?),
        };
        Ok(Job::Go { cap })
    } else if word.eq_ignore_ascii_case("continue") {
        let line = argument.find(['\r', '\n']).unwrap_or(argument.len());
        let more = More::parse(&argument[..line])?;
        Ok(Job::Continue { more })
    } else if word.eq_ignore_ascii_case("code") {
        let (base, argument) = split_base(argument)?;
        let request = request("code", argument)?;
        Ok(Job::Code {
            request,
            base: base.map(str::to_string),
        })
    } else if word.eq_ignore_ascii_case("ask") {
        let question = request("ask", argument)?;
        Ok(Job::Ask { question })
    } else if word.eq_ignore_ascii_case("steer") {
        let words = request("steer", argument)?;
        Ok(Job::Steer { words })
    } else if word.eq_ignore_ascii_case("address-reviews") {
        // The words are optional: the unresolved threads are the request.
        let words = match request("address-reviews", argument) {
            Err(ParseError::EmptyRequest { .. }) => String::new(),
            other => other?,
        };
        Ok(Job::AddressReviews { words })
    } else {
        let unknown = word.chars().take(MAX_UNKNOWN_CHARS).collect();
        Ok(Job::Help {
            unknown: Some(unknown),
        })
    }
}

/// Trims the argument of `code` or `ask` and checks it is neither empty nor too long.
fn request(command: &'static str, argument: &str) -> Result<String, ParseError> {
    let argument = argument.trim_start_matches([' ', '\t']);
    let argument = skip_blank_lines(argument).trim_end();
    if argument.is_empty() {
        return Err(ParseError::EmptyRequest { command });
    }
    let bytes = argument.len() - argument.matches("\r\n").count();
    if bytes > MAX_REQUEST_BYTES {
        return Err(ParseError::TooLong {
            bytes,
            limit: MAX_REQUEST_BYTES,
        });
    }
    Ok(argument.replace("\r\n", "\n"))
}

/// `text` without its leading lines that hold only whitespace.
fn skip_blank_lines(mut text: &str) -> &str {
    while let Some(newline) = text.find('\n') {
        if !text[..newline].trim().is_empty() {
            break;
        }
        text = &text[newline + 1..];
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn code(request: &str) -> Option<Result<Job, ParseError>> {
        Some(Ok(Job::Code {
            request: request.to_owned(),
            base: None,
        }))
    }

    fn ask(question: &str) -> Option<Result<Job, ParseError>> {
        Some(Ok(Job::Ask {
            question: question.to_owned(),
        }))
    }

    fn help(unknown: Option<&str>) -> Option<Result<Job, ParseError>> {
        Some(Ok(Job::Help {
            unknown: unknown.map(str::to_owned),
        }))
    }

    fn empty(command: &'static str) -> Option<Result<Job, ParseError>> {
        Some(Err(ParseError::EmptyRequest { command }))
    }

    fn check(cases: &[(&str, Option<Result<Job, ParseError>>)]) {
        for (body, expected) in cases {
            assert_eq!(&parse(body), expected, "body: {body:?}");
        }
    }

    /// Checks that none of `bodies` holds a command.
    fn none(bodies: &[&str]) {
        for body in bodies {
            assert_eq!(parse(body), None, "body: {body:?}");
        }
    }

    #[test]
    fn subcommands() {
        check(&[
            ("/kodx code fix the bug", code("fix the bug")),
            ("/kodx ask why is it slow?", ask("why is it slow?")),
            ("/kodx cancel", Some(Ok(Job::Cancel))),
            ("/kodx help", help(None)),
            ("/kodx", help(None)),
            ("/kodx   ", help(None)),
            ("/kodx frobnicate", help(Some("frobnicate"))),
            ("/kodx frobnicate the widget", help(Some("frobnicate"))),
            ("/kodx codefoo x", help(Some("codefoo"))),
            ("/kodx code: x", help(Some("code:"))),
        ]);
    }

    #[test]
    fn go_takes_nothing_or_a_lower_cap() {
        let go = |cap: Option<f64>| Some(Ok(Job::Go { cap: cap.map(Usd) }));
        let bad = |found: &str| {
            Some(Err(ParseError::BadGo {
                found: found.to_owned(),
            }))
        };
        check(&[
            ("/kodx go", go(None)),
            ("/kodx GO  ", go(None)),
            ("/kodx go\nthe estimate looks fine", go(None)),
            ("/kodx go $1.50", go(Some(1.5))),
            ("/kodx go  $3\r\nthanks", go(Some(3.0))),
            ("/kodx go now", bad("now")),
            ("/kodx go 2", bad("2")),
            ("/kodx go $0", bad("$0")),
            ("/kodx go $-1", bad("$-1")),
            ("/kodx go $2 please", bad("$2 please")),
            ("/kodx gogo", help(Some("gogo"))),
            ("/kodx update", Some(Ok(Job::Update))),
            ("/kodx UPDATE please", Some(Ok(Job::Update))),
        ]);
        // Stored and read back as written.
        for job in [
            Job::Go { cap: None },
            Job::Go {
                cap: Some(Usd(0.75)),
            },
        ] {
            let again = Job::from_stored(job.kind(), job.stored_argument().into_owned());
            assert_eq!(again, job);
        }
        assert_eq!(
            Job::Go {
                cap: Some(Usd(0.75))
            }
            .command_line(),
            "/kodx go $0.75"
        );
    }

    #[test]
    fn steer_takes_words() {
        let steer = |w: &str| {
            Some(Ok(Job::Steer {
                words: w.to_owned(),
            }))
        };
        check(&[
            ("/kodx steer use the v2 API", steer("use the v2 API")),
            (
                "/kodx STEER  stop\r\nand test first\n",
                steer("stop\nand test first"),
            ),
            (
                "/kodx steer\n\nleave the docs alone",
                steer("leave the docs alone"),
            ),
            ("/kodx steer", empty("steer")),
            ("/kodx steer   \n  ", empty("steer")),
            ("/kodx steering x", help(Some("steering"))),
        ]);
        assert_eq!(
            ParseError::EmptyRequest { command: "steer" }.to_string(),
            "`/kodx steer` needs a request"
        );
        let job = Job::Steer {
            words: "keep the old name".into(),
        };
        assert_eq!(job.kind(), JobKind::Steer);
        assert!(!job.is_work());
        assert_eq!(
            Job::from_stored(job.kind(), job.stored_argument().into_owned()),
            job
        );
        assert_eq!(job.command_line(), "/kodx steer keep the old name");
    }

    #[test]
    fn continue_takes_nothing_money_or_steps() {
        let more = |m: More| Some(Ok(Job::Continue { more: m }));
        let bad = |found: &str| {
            Some(Err(ParseError::BadContinue {
                found: found.to_owned(),
            }))
        };
        check(&[
            ("/kodx continue", more(More::Default)),
            ("/kodx Continue  ", more(More::Default)),
            (
                "/kodx continue\nplease finish the tests",
                more(More::Default),
            ),
            ("/kodx continue $2", more(More::Usd(2.0))),
            ("/kodx continue $0.50\r\nthanks", more(More::Usd(0.5))),
            ("/kodx continue 20 steps", more(More::Steps(20))),
            ("/kodx continue 1 step", more(More::Steps(1))),
            ("/kodx continue 5 STEPS", more(More::Steps(5))),
            ("/kodx continue lots", bad("lots")),
            ("/kodx continue $", bad("$")),
            ("/kodx continue $-1", bad("$-1")),
            ("/kodx continue $0", bad("$0")),
            ("/kodx continue $1e9", bad("$1e9")),
            ("/kodx continue $1.2.3", bad("$1.2.3")),
            ("/kodx continue $20000", bad("$20000")),
            ("/kodx continue 0 steps", bad("0 steps")),
            ("/kodx continue -3 steps", bad("-3 steps")),
            ("/kodx continue 99999999999 steps", bad("99999999999 steps")),
            ("/kodx continue $2 and 20 steps", bad("$2 and 20 steps")),
            ("/kodx continue 20", bad("20")),
        ]);
        assert_eq!(More::Usd(2.0).as_argument(), "$2");
        assert_eq!(More::Usd(0.5).as_argument(), "$0.5");
        assert_eq!(More::Steps(1).as_argument(), "1 step");
        assert_eq!(More::Steps(20).as_argument(), "20 steps");
        assert_eq!(More::Default.as_argument(), "");
        let long = format!("/kodx continue {}", "x".repeat(500));
        let Some(Err(ParseError::BadContinue { found })) = parse(&long) else {
            panic!()
        };
        assert_eq!(found.chars().count(), 64);
    }

    #[test]
    fn subcommand_is_case_insensitive() {
        check(&[
            ("/kodx ASK why", ask("why")),
            ("/kodx Code it", code("it")),
            ("/kodx CANCEL", Some(Ok(Job::Cancel))),
            ("/kodx HeLp", help(None)),
        ]);
    }

    #[test]
    fn prefix_is_case_sensitive() {
        none(&["/KODX code x", "/Kodx ask y"]);
    }

    #[test]
    fn cancel_and_help_ignore_extra_words() {
        check(&[
            ("/kodx cancel extra words", Some(Ok(Job::Cancel))),
            ("/kodx cancel\nmore lines", Some(Ok(Job::Cancel))),
            ("/kodx help me please", help(None)),
        ]);
    }

    #[test]
    fn empty_requests() {
        check(&[
            ("/kodx code", empty("code")),
            ("/kodx ask   ", empty("ask")),
            ("/kodx ask\t", empty("ask")),
            ("/kodx code\n\n   \n", empty("code")),
            ("/kodx code \r\n\r\n", empty("code")),
        ]);
    }

    #[test]
    fn bare_kodx_then_text_on_next_line_is_help() {
        check(&[("/kodx\ncode fix it", help(None))]);
    }

    #[test]
    fn prose_around_the_command() {
        check(&[
            ("Thanks!\n\n/kodx code add tests", code("add tests")),
            ("hello\r\n/kodx ask what?\r\n", ask("what?")),
        ]);
    }

    #[test]
    fn first_word_must_be_exactly_kodx() {
        none(&[
            "/kodxcode x",
            "/kodx-code x",
            "/kodx\u{200b} code x",
            "/kodx\u{200d} code x",
            "\u{200b}/kodx code x",
            "/kodx\u{a0}code x",
            "kodx code x",
            "//kodx code x",
            "\\/kodx code x",
        ]);
    }

    #[test]
    fn kodx_later_on_a_line_is_not_a_command() {
        none(&[
            "please /kodx ask why",
            "- /kodx code x",
            "1. /kodx code x",
            "**/kodx** code x",
        ]);
    }

    #[test]
    fn inline_code_is_not_a_command() {
        none(&[
            "run `/kodx code x`",
            "`/kodx code x`",
            "``/kodx code x``",
            "```/kodx code x```",
        ]);
    }

    #[test]
    fn up_to_three_spaces_of_indentation() {
        check(&[
            (" /kodx code a", code("a")),
            ("  /kodx code a", code("a")),
            ("   /kodx code a", code("a")),
        ]);
    }

    #[test]
    fn indented_code_is_not_a_command() {
        none(&[
            "    /kodx code a",
            "        /kodx code a",
            "\t/kodx code a",
            "  \t/kodx code a",
            "text\n\n    /kodx code a\n",
        ]);
    }

    #[test]
    fn tabs_separate_words() {
        check(&[
            ("/kodx\tcode\tfix\tit", code("fix\tit")),
            ("/kodx \t ask \t why", ask("why")),
            ("/kodx\tcancel", Some(Ok(Job::Cancel))),
        ]);
    }

    #[test]
    fn block_quotes_are_not_commands() {
        none(&[
            "> /kodx code x",
            ">/kodx code x",
            ">> /kodx code x",
            "> > /kodx code x",
            "   > /kodx code x",
            "> quoted\n> /kodx code x\n> more",
        ]);
        // Four spaces before `>` is indented code, also not a command.
        none(&["    > /kodx code x"]);
    }

    #[test]
    fn lazy_continuation_of_a_quote_is_not_a_command() {
        // GitHub renders the second line inside the quote.
        none(&[
            "> quoted\n/kodx code x",
            "> quoted\r\n/kodx code x\r\n",
            "> quoted\n  /kodx code x",
            "> a\n> b\n/kodx ask why\nmore",
            "Someone wrote:\n\n> please run\n/kodx code rm -rf the tests",
        ]);
        // A blank line (or a blank quote line) ends the paragraph, and so the quote.
        check(&[
            ("> quoted\n\n/kodx code x", code("x")),
            ("> quoted\n>\n/kodx code x", code("x")),
        ]);
    }

    #[test]
    fn nested_quotes_are_not_commands() {
        none(&[
            "> > inner\n/kodx code x",
            "> outer\n> > inner\n/kodx code x",
            ">>> deep\n/kodx code x",
            "> > > deep\n> /kodx code x",
        ]);
        check(&[("> > inner\n\n/kodx ask y", ask("y"))]);
    }

    #[test]
    fn quotes_inside_lists_are_not_commands() {
        none(&[
            "- item\n  > quoted\n  /kodx code x",
            "1. item\n\n   > quoted\n   /kodx code x",
            "- > quoted\n  /kodx code x",
        ]);
        // A list item's own continuation line is shown as text: it is a command.
        check(&[("- item\n  /kodx code x", code("x"))]);
    }

    #[test]
    fn tilde_fences_and_indented_code_are_not_commands() {
        none(&[
            "~~~\n/kodx code x\n~~~",
            "~~~~ text\n~~~\n/kodx code x\n~~~~",
            "text\n\n    /kodx code x\n",
            "text\n\n\t/kodx code x",
            "- item\n\n      ```\n      x\n      ```\n  ~~~\n  /kodx code x\n  ~~~",
        ]);
    }

    #[test]
    fn html_comments_and_blocks_are_not_commands() {
        none(&[
            "<!-- /kodx code x -->",
            "<!--\n/kodx code x -->",
            "text <!--\n/kodx code x\n-->",
            "<details>\n/kodx code x\n</details>",
            "`a\n/kodx code x`",
        ]);
        // An inline comment that never closes is text GitHub shows.
        check(&[("text <!--\n/kodx code x", code("x"))]);
    }

    #[test]
    fn command_after_a_quote() {
        check(&[("> /kodx code old\n\n/kodx code new", code("new"))]);
    }

    #[test]
    fn fenced_code_is_not_a_command() {
        none(&[
            "```\n/kodx code x\n```",
            "```sh\n/kodx code x\n```",
            "``` shell title=\"x\"\n/kodx code x\n```",
            "~~~\n/kodx code x\n~~~",
            "~~~ `weird` info\n/kodx code x\n~~~",
            "   ```\n/kodx code x\n   ```",
            "```\n/kodx code x",
            "~~~~\n/kodx code x",
        ]);
    }

    #[test]
    fn command_after_a_closed_fence() {
        check(&[
            ("```\n/kodx code no\n```\n/kodx code yes", code("yes")),
            ("~~~\n/kodx code no\n~~~\n/kodx ask yes", ask("yes")),
            ("```\nx\n```  \n/kodx code yes", code("yes")),
            ("```\nx\n   ````\n/kodx code yes", code("yes")),
        ]);
    }

    #[test]
    fn fence_closes_only_with_same_char_and_length() {
        none(&[
            // A longer fence holds shorter ones.
            "````\n```\n/kodx code x\n```\n````",
            "````md\n```\n/kodx code x\n```\n````",
            // A shorter fence does not close a longer one.
            "````\n```\n/kodx code x",
            // The other character does not close it.
            "```\n~~~\n/kodx code x\n~~~",
            "~~~\n```\n/kodx code x\n```",
            // A closing fence takes no info string.
            "```\n``` sh\n/kodx code x\n```",
            // A closing fence indented 4+ is content.
            "```\n    ```\n/kodx code x",
        ]);
        check(&[(
            "````\n```\n/kodx code no\n```\n````\n/kodx code yes",
            code("yes"),
        )]);
    }

    #[test]
    fn two_backticks_or_inline_code_lines_do_not_open_a_fence() {
        check(&[
            ("``\n/kodx code x", code("x")),
            ("``` a ```\n/kodx code x", code("x")),
        ]);
    }

    #[test]
    fn indented_fence_is_not_a_fence() {
        // A fence indented 4+ is indented code; it opens nothing.
        check(&[("    ```\n/kodx code x", code("x"))]);
    }

    #[test]
    fn html_comments_are_not_commands() {
        none(&[
            "<!-- /kodx code x -->",
            "<!--\n/kodx code x\n-->",
            "<!-- Template:\n\n/kodx code describe here\n\n-->",
        ]);
        check(&[
            ("<!-- hidden -->\n/kodx code x", code("x")),
            ("<!--\nhidden\n-->\n/kodx ask y", ask("y")),
        ]);
    }

    #[test]
    fn first_command_wins() {
        check(&[
            (
                "/kodx ask first\n/kodx code second",
                ask("first\n/kodx code second"),
            ),
            ("intro\n/kodx cancel\n/kodx code x", Some(Ok(Job::Cancel))),
            ("/kodx frob\n/kodx code x", help(Some("frob"))),
            ("/kodx code\n/kodx ask x", code("/kodx ask x")),
        ]);
    }

    #[test]
    fn multi_line_request_keeps_formatting() {
        let body = "Some context.\n\n/kodx code fix the parser\n\nIt fails on:\n\n```rust\nfn main() {\n    /kodx code inner\n}\n```\n\n> a quote\n- a list\n\n";
        check(&[(
            body,
            code("fix the parser\n\nIt fails on:\n\n```rust\nfn main() {\n    /kodx code inner\n}\n```\n\n> a quote\n- a list"),
        )]);
    }

    #[test]
    fn request_starting_on_the_next_line() {
        check(&[
            ("/kodx code\nfix it\nplease", code("fix it\nplease")),
            (
                "/kodx code   \n\n  \n    indented\nmore  \n\n",
                code("    indented\nmore"),
            ),
            ("/kodx ask\n```\nwhy?\n```", ask("```\nwhy?\n```")),
        ]);
    }

    #[test]
    fn crlf_line_endings() {
        check(&[
            ("/kodx code a\r\nb\r\n", code("a\nb")),
            ("/kodx ask\r\nwhy\r\n\r\n", ask("why")),
            ("/kodx cancel\r\n", Some(Ok(Job::Cancel))),
            ("/kodx\r\n", help(None)),
            ("/kodx frob\r\nx", help(Some("frob"))),
            (
                "```\r\n/kodx code no\r\n```\r\n/kodx code yes\r\n",
                code("yes"),
            ),
            ("```\r\n/kodx code no\r\n", None),
            ("> /kodx code no\r\n", None),
        ]);
    }

    #[test]
    fn bom_is_ignored_at_the_start_only() {
        check(&[
            ("\u{feff}/kodx code x", code("x")),
            ("\u{feff}hello\n/kodx ask y", ask("y")),
        ]);
        none(&["hello\n\u{feff}/kodx code x"]);
    }

    #[test]
    fn unicode_is_kept() {
        check(&[
            ("/kodx code 修复 bug 🐛", code("修复 bug 🐛")),
            ("/kodx ask ¿qué?\u{200b}", ask("¿qué?\u{200b}")),
            ("/kodx ünknown", help(Some("ünknown"))),
        ]);
    }

    #[test]
    fn unknown_word_is_cut() {
        let word = "é".repeat(1000);
        let expected = "é".repeat(MAX_UNKNOWN_CHARS);
        check(&[(&format!("/kodx {word}"), help(Some(&expected)))]);
    }

    #[test]
    fn no_command() {
        none(&[
            "",
            "\n\n",
            "hello",
            "\u{feff}",
            "kodx",
            "/kod",
            "/ kodx code x",
        ]);
    }

    #[test]
    fn request_at_the_limit() {
        let text = "a".repeat(MAX_REQUEST_BYTES);
        let body = format!("/kodx code {text}\n\n");
        assert_eq!(parse(&body), code(&text));

        let text = "a".repeat(MAX_REQUEST_BYTES + 1);
        let body = format!("/kodx code {text}");
        assert_eq!(
            parse(&body),
            Some(Err(ParseError::TooLong {
                bytes: MAX_REQUEST_BYTES + 1,
                limit: MAX_REQUEST_BYTES,
            }))
        );
    }

    #[test]
    fn limit_counts_crlf_as_one_byte() {
        // 32 768 lines of "a\r\n", trimmed of the last line ending: 65 535 bytes as "\n".
        let text = "a\r\n".repeat(MAX_REQUEST_BYTES / 2);
        let body = format!("/kodx ask {text}");
        let expected = "a\n".repeat(MAX_REQUEST_BYTES / 2);
        assert_eq!(parse(&body), ask(expected.trim_end()));
    }

    #[test]
    fn huge_body_without_command_is_fast() {
        let started = Instant::now();
        let mut body = String::with_capacity(10 * 1024 * 1024 + 64);
        while body.len() < 10 * 1024 * 1024 {
            body.push_str("text /kodx code x ``` ~~~ > `/kodx`\n```\n/kodx code x\n```\n");
        }
        assert_eq!(parse(&body), None);
        // One huge line, and one huge unclosed fence.
        assert_eq!(parse(&"x".repeat(10 * 1024 * 1024)), None);
        assert_eq!(
            parse(&format!("```\n{}", "/kodx code x\n".repeat(800_000))),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn huge_body_with_command_at_the_end() {
        let started = Instant::now();
        let mut body = "lorem ipsum dolor\n".repeat(600_000);
        body.push_str("/kodx code at the end\r\n");
        assert_eq!(parse(&body), code("at the end"));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn huge_request_is_too_long() {
        let body = format!("/kodx code x\n{}", "y".repeat(10 * 1024 * 1024));
        assert_eq!(
            parse(&body),
            Some(Err(ParseError::TooLong {
                bytes: 10 * 1024 * 1024 + 2,
                limit: MAX_REQUEST_BYTES,
            }))
        );
    }

    #[test]
    fn errors_display() {
        assert_eq!(
            ParseError::EmptyRequest { command: "code" }.to_string(),
            "`/kodx code` needs a request"
        );
        assert_eq!(
            ParseError::TooLong {
                bytes: 70000,
                limit: MAX_REQUEST_BYTES
            }
            .to_string(),
            "the request is 70000 bytes long; the limit is 65536 bytes"
        );
    }

    #[test]
    fn base_names_the_branch_the_work_targets() {
        let code = |request: &str, base: Option<&str>| {
            Some(Ok(Job::Code {
                request: request.into(),
                base: base.map(Into::into),
            }))
        };
        assert_eq!(
            parse("/kodx code --base release-1 fix the crash"),
            code("fix the crash", Some("release-1"))
        );
        assert_eq!(
            parse("/kodx code --base=release/2.x  fix it\nmore"),
            code("fix it\nmore", Some("release/2.x"))
        );
        assert_eq!(
            parse("/kodx code --base release-1\n\nfix it"),
            code("fix it", Some("release-1"))
        );
        // Not the option: a request that starts with another word.
        assert_eq!(
            parse("/kodx code --baseline is wrong"),
            code("--baseline is wrong", None)
        );
        let err = |body: &str| parse(body).unwrap().unwrap_err().to_string();
        assert_eq!(
            err("/kodx code --base"),
            "`--base` needs the name of a branch, as in `/kodx code --base release-1 fix the crash`"
        );
        assert_eq!(err("/kodx code --base="), err("/kodx code --base"));
        assert_eq!(
            err("/kodx code --base release-1"),
            "`/kodx code` needs a request"
        );
        for bad in [
            "a..b",
            "x:y",
            "a~1",
            "-x",
            "refs/heads/",
            "a\u{7}b",
            "v1.lock",
        ] {
            let e = err(&format!("/kodx code --base {bad} fix"));
            assert!(e.contains("cannot be the name of a branch"), "{bad}: {e}");
        }
        let long = "b".repeat(300);
        assert!(err(&format!("/kodx code --base {long} fix")).contains("cannot be the name"));
        // Stored as written, read back the same.
        let job = Job::Code {
            request: "fix it\nplease".into(),
            base: Some("release-1".into()),
        };
        assert_eq!(job.stored_argument(), "--base release-1 fix it\nplease");
        assert_eq!(job.argument(), "fix it\nplease");
        assert_eq!(
            job.command_line(),
            "/kodx code --base release-1 fix it\nplease"
        );
        assert_eq!(
            Job::from_stored(JobKind::Code, job.stored_argument().into()),
            job
        );
    }
}
