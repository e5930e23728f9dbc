//! The one pass over a check's output: each line is read once, with the little state the
//! formats need (a rustc header waiting for its `-->`, a panic or Go message taking the
//! lines below it, the pytest failure being read, the Go tests whose verdict is to come).

use std::collections::{HashMap, HashSet};

use super::lines::{
    bounded, exception_name, head, is_code_like, level_word, lint_code, lint_level, place,
    repo_path, strip_escapes, trailing_code, Place,
};
use super::{
    Annotation, Level, HEADER_REACH, MAX_ANNOTATIONS, MAX_DETAIL_LINES, MAX_GO_PENDING,
    MAX_LINE_BYTES, MAX_MESSAGE_CHARS, MAX_TITLE_CHARS,
};

/// The annotations in `output` (a check's output, whole or bounded), for the repository in
/// `workdir` (its directory where the check ran, e.g. `/workspace/repo`).
pub fn parse(output: &str, workdir: &str) -> Vec<Annotation> {
    let mut parser = Parser::new(workdir);
    let mut line = String::new();
    for raw in output.split('\n') {
        if parser.full() {
            break;
        }
        strip_escapes(head(raw, MAX_LINE_BYTES), &mut line);
        parser.line(line.trim_end());
    }
    parser.finish()
}

/// [`parse`] for the red check `name`: its annotations, titled with its name when the
/// output gave them no title of their own.
pub fn for_check(output: &str, workdir: &str, name: &str) -> Vec<Annotation> {
    let mut annotations = parse(output, workdir);
    for a in &mut annotations {
        a.title
            .get_or_insert_with(|| bounded(name, MAX_TITLE_CHARS));
    }
    // Kept with the check's result (its transcript record): bounded in bytes too.
    let mut bytes = 0;
    let keep = annotations
        .iter()
        .take_while(|a| {
            bytes += a.path.len() + a.message.len() + a.title.as_ref().map_or(0, String::len) + 64;
            bytes <= MAX_CHECK_ANNOTATION_BYTES
        })
        .count();
    annotations.truncate(keep);
    annotations
}

/// The most bytes of annotations one check's result keeps (paths, messages, titles).
pub const MAX_CHECK_ANNOTATION_BYTES: usize = 32 * 1024;

/// What `Parser::line` keeps between lines.
struct Parser {
    workdir: String,
    out: Vec<Annotation>,
    seen: HashSet<(String, u32, Option<u32>, Level, String)>,
    /// A rustc-style header (`error[E0308]: …`, ruff's `F401 …`) waiting for its `-->`.
    header: Option<Header>,
    /// An annotation whose message goes on on the lines below it.
    detail: Option<Detail>,
    pytest: Pytest,
    go: Go,
}

struct Header {
    level: Level,
    code: Option<String>,
    message: String,
    /// Lines read since.
    age: u8,
}

struct Detail {
    annotation: Annotation,
    lines: Vec<String>,
    kind: DetailKind,
}

enum DetailKind {
    /// A Rust panic's message: the lines up to a blank one or a `note:`, less the panic
    /// line's own indent.
    Panic { indent: usize },
    /// A Go test's message: the lines indented deeper than its first; then it goes to the
    /// test's annotations (`None`: out at once, the test failed already).
    Go { indent: usize, test: Option<String> },
}

/// The pytest failure being read (one `____ test_name ____` section).
#[derive(Default)]
struct Pytest {
    test: Option<String>,
    /// The innermost frame inside the repository so far.
    frame: Option<(String, u32)>,
    /// The last block of `E   ` lines, their `E` taken off.
    errors: Vec<String>,
    in_errors: bool,
    /// The exception named by a last line outside the repository.
    exception: Option<String>,
    /// Annotated already.
    done: bool,
}

/// Go tests' state: the test whose lines come now, and the lines of tests (`-v`) whose
/// verdict is still to come.
#[derive(Default)]
struct Go {
    current: Option<String>,
    /// The current test failed already (its lines come after `--- FAIL`).
    failed: bool,
    pending: HashMap<String, Vec<Annotation>>,
    held: usize,
}

impl Parser {
    fn new(workdir: &str) -> Parser {
        Parser {
            workdir: workdir.trim_end_matches('/').to_string(),
            out: Vec::new(),
            seen: HashSet::new(),
            header: None,
            detail: None,
            pytest: Pytest::default(),
            go: Go::default(),
        }
    }

    fn full(&self) -> bool {
        self.out.len() >= MAX_ANNOTATIONS
    }

    fn finish(mut self) -> Vec<Annotation> {
        self.close_detail();
        self.pytest_done();
        self.out.truncate(MAX_ANNOTATIONS);
        self.out
    }

    /// One line, without escapes or its end's white space.
    fn line(&mut self, line: &str) {
        if let Some(detail) = &mut self.detail {
            if detail.takes(line) {
                return;
            }
            self.close_detail();
        }
        if let Some(header) = &mut self.header {
            header.age += 1;
            if header.age > HEADER_REACH {
                self.header = None;
            }
        }
        if line == "E" || line.starts_with("E ") {
            self.pytest.error(line);
            return;
        }
        self.pytest.in_errors = false;
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if self.go_marker(trimmed, indent) || self.pytest_banner(line) {
            return;
        }
        if let Some(at) = trimmed.strip_prefix("--> ") {
            if let (Some(header), Some(place)) = (self.header.take(), place(at.trim())) {
                self.push(
                    &place,
                    header.level,
                    &header.message,
                    header.code.as_deref(),
                );
            }
            return;
        }
        if indent > 0 && self.go_line(trimmed, indent) {
            return;
        }
        if indent == 0 {
            if let Some(header) = header(line) {
                self.header = Some(header);
                return;
            }
        }
        // Indented too: a test runner may indent what the tests print (cargo nextest).
        if trimmed.starts_with("thread '") {
            self.panic(trimmed, indent);
        } else if let Some(place) = place(trimmed) {
            self.place(&place, indent == 0);
        }
    }

    /// A line that starts with a place: gcc-style, flake8/ruff, eslint, go vet, and pytest
    /// (only at the start of a line: `top`).
    fn place(&mut self, p: &Place<'_>, top: bool) {
        if top && p.path.ends_with(".py") && p.column.is_none() {
            if p.rest.is_empty() || p.rest.starts_with("in ") {
                if let Some(path) = self.repo(p.path) {
                    self.pytest.frame = Some((path, p.line));
                }
                return;
            }
            if exception_name(p.rest) {
                self.pytest_last(p);
                return;
            }
        }
        if let Some((level, code, message)) = level_word(p.rest) {
            let (message, trailing) = trailing_code(message);
            self.push(p, level, message, code.or(trailing));
            return;
        }
        // Without a level word, only with a column: `path:line: text` is too common.
        if p.column.is_none() || p.rest.is_empty() {
            return;
        }
        if let Some((message, level, rule)) = eslint(p.rest) {
            self.push(p, level, message, rule);
            return;
        }
        let (word, message) = p.rest.split_once(' ').unwrap_or((p.rest, ""));
        if lint_code(word) {
            let message = message.strip_prefix("[*] ").unwrap_or(message);
            self.push(p, lint_level(word), message, Some(word));
        } else {
            self.push(p, Level::Failure, p.rest, None);
        }
    }

    /// `thread 'name' panicked at path:line:col:` (the message below) or, before Rust
    /// 1.73, `thread 'name' panicked at 'message', path:line:col`.
    fn panic(&mut self, line: &str, indent: usize) {
        let Some((name, rest)) = line["thread '".len()..].split_once('\'') else {
            return;
        };
        let mut rest = rest.trim_start();
        if rest.starts_with('(') {
            rest = rest.split_once(')').map_or("", |(_, r)| r.trim_start());
        }
        let Some(rest) = rest.strip_prefix("panicked at ") else {
            return;
        };
        if let Some(old) = rest.strip_prefix('\'') {
            if let Some(p) = old
                .rsplit_once("', ")
                .and_then(|(m, at)| place(at).map(|p| Place { rest: m, ..p }))
            {
                self.push(&p, Level::Failure, p.rest, Some(name));
            }
            return;
        }
        let Some(p) = place(rest) else { return };
        self.detail = Some(Detail {
            annotation: annotation(&p, Level::Failure, "", Some(name)),
            lines: Vec::new(),
            kind: DetailKind::Panic { indent },
        });
    }

    /// An indented `file.go:line: message`: a Go test's (read as such only after a Go test
    /// marker). Whether the line was one.
    fn go_line(&mut self, trimmed: &str, indent: usize) -> bool {
        let Some(p) = place(trimmed).filter(|p| go_place(p)) else {
            return false;
        };
        let Some(test) = self.go.current.clone() else {
            return true;
        };
        let failed = self.go.failed;
        self.detail = Some(Detail {
            annotation: annotation(&p, Level::Failure, p.rest, Some(&test)),
            lines: Vec::new(),
            kind: DetailKind::Go {
                indent,
                test: (!failed).then_some(test),
            },
        });
        true
    }

    /// `=== RUN   TestX`, `--- FAIL: TestX (0.00s)`, `--- PASS: …`, `FAIL`, `ok  pkg`.
    fn go_marker(&mut self, trimmed: &str, indent: usize) -> bool {
        let go = &mut self.go;
        if let Some(rest) = trimmed.strip_prefix("=== ") {
            let Some((verb, name)) = rest.split_once(' ') else {
                return false;
            };
            if !matches!(verb, "RUN" | "CONT" | "PAUSE" | "NAME") {
                return false;
            }
            go.current = Some(name.trim().to_string());
            go.failed = false;
            return true;
        }
        if let Some(rest) = trimmed.strip_prefix("--- ") {
            let Some((verdict, name)) = rest.split_once(": ") else {
                return false;
            };
            let name = name.rsplit_once(" (").map_or(name, |(n, _)| n).to_string();
            match verdict {
                "FAIL" => {
                    let pending = go.pending.remove(&name).unwrap_or_default();
                    go.held -= pending.len();
                    go.current = Some(name);
                    go.failed = true;
                    for a in pending {
                        self.push_annotation(a);
                    }
                }
                "PASS" | "SKIP" => {
                    let dropped = go.pending.remove(&name).map_or(0, |p| p.len());
                    go.held -= dropped;
                    go.current = None;
                }
                _ => return false,
            }
            return true;
        }
        if indent == 0 && (trimmed == "FAIL" || trimmed == "PASS" || trimmed.starts_with("ok  ")) {
            go.current = None;
            go.failed = false;
        }
        false
    }

    /// pytest's `____ test_name ____` (a failure's section) and `==== … ====` banners.
    fn pytest_banner(&mut self, line: &str) -> bool {
        if line.len() > 6 && line.starts_with("___") && line.ends_with("___") {
            let name = line.trim_matches('_').trim();
            if name.is_empty() || name.starts_with("_ ") {
                return false;
            }
            self.pytest_done();
            self.pytest.test = Some(name.to_string());
            return true;
        }
        if line.starts_with("===") && line.ends_with("===") {
            self.pytest_done();
            return true;
        }
        false
    }

    /// `path:line: ExceptionType`, the last line of a long traceback.
    fn pytest_last(&mut self, p: &Place<'_>) {
        if self.repo(p.path).is_none() {
            self.pytest.exception = Some(p.rest.to_string());
            return;
        }
        let message = self.pytest.message(Some(p.rest));
        let test = self.pytest.test.clone();
        self.push(p, Level::Failure, &message, test.as_deref());
        self.pytest.done = true;
        self.pytest.errors.clear();
    }

    /// The failure read ends: annotated at its innermost frame inside the repository unless
    /// it was already.
    fn pytest_done(&mut self) {
        let py = std::mem::take(&mut self.pytest);
        let told = !py.errors.is_empty() || py.exception.is_some();
        if let (false, true, Some((path, line))) = (py.done, told, &py.frame) {
            let message = py.message(py.exception.as_deref());
            let p = Place {
                path,
                line: *line,
                column: None,
                rest: "",
            };
            self.push(&p, Level::Failure, &message, py.test.as_deref());
        }
    }

    fn close_detail(&mut self) {
        let Some(Detail {
            mut annotation,
            lines,
            kind,
        }) = self.detail.take()
        else {
            return;
        };
        for line in &lines {
            if !annotation.message.is_empty() {
                annotation.message.push('\n');
            }
            annotation.message.push_str(line);
            if annotation.message.len() > 4 * MAX_MESSAGE_CHARS {
                break;
            }
        }
        match kind {
            DetailKind::Panic { .. } if annotation.message.is_empty() => {
                annotation.message = "panicked".into();
                self.push_annotation(annotation);
            }
            DetailKind::Go {
                test: Some(test), ..
            } => {
                if self.go.held < MAX_GO_PENDING {
                    self.go.held += 1;
                    self.go.pending.entry(test).or_default().push(annotation);
                }
            }
            _ => self.push_annotation(annotation),
        }
    }

    /// `path` relative to the repository, if it is in it.
    fn repo(&self, path: &str) -> Option<String> {
        repo_path(path, &self.workdir)
    }

    fn push(&mut self, p: &Place<'_>, level: Level, message: &str, title: Option<&str>) {
        self.push_annotation(annotation(p, level, message, title));
    }

    /// Keeps `a` if its path is in the repository, its line is one and it is new.
    fn push_annotation(&mut self, mut a: Annotation) {
        if self.full() || a.start_line == 0 {
            return;
        }
        let Some(path) = self.repo(&a.path) else {
            return;
        };
        a.path = path;
        a.message = bounded(&a.message, MAX_MESSAGE_CHARS);
        a.title = a
            .title
            .map(|t| bounded(&t, MAX_TITLE_CHARS))
            .filter(|t| !t.is_empty());
        if a.message.is_empty() {
            return;
        }
        let key = (
            a.path.clone(),
            a.start_line,
            a.start_column,
            a.level,
            a.message.clone(),
        );
        if self.seen.insert(key) {
            self.out.push(a);
        }
    }
}

impl Detail {
    /// Whether `line` goes on this annotation's message (and takes it).
    fn takes(&mut self, line: &str) -> bool {
        if self.lines.len() >= MAX_DETAIL_LINES {
            return false;
        }
        let trimmed = line.trim_start();
        let taken = match &self.kind {
            DetailKind::Panic { .. } => {
                !trimmed.is_empty()
                    && !["note: ", "stack backtrace:", "thread '", "---- "]
                        .iter()
                        .any(|p| trimmed.starts_with(p))
            }
            DetailKind::Go { indent, .. } => {
                line.len() - trimmed.len() > *indent
                    && !trimmed.starts_with("--- ")
                    && !trimmed.starts_with("=== ")
                    && place(trimmed).is_none_or(|p| !go_place(&p))
            }
        };
        if taken {
            let kept = match self.kind {
                DetailKind::Panic { indent } => {
                    let own = (line.len() - trimmed.len()).min(indent);
                    &line[own..]
                }
                DetailKind::Go { .. } => trimmed,
            };
            self.lines
                .push(head(kept, 4 * MAX_MESSAGE_CHARS).to_string());
        }
        taken
    }
}

impl Pytest {
    /// An `E   …` line: a new block when the line before was not one.
    fn error(&mut self, line: &str) {
        if !self.in_errors {
            self.errors.clear();
            self.in_errors = true;
        }
        if self.errors.len() < MAX_DETAIL_LINES {
            self.errors
                .push(head(&line[1..], 4 * MAX_MESSAGE_CHARS).to_string());
        }
    }

    /// The `E` lines, their common indent taken off, after the exception's name unless they
    /// name it already.
    fn message(&self, exception: Option<&str>) -> String {
        let indent = self
            .errors
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        let lines: Vec<&str> = self
            .errors
            .iter()
            .map(|l| l.get(indent..).unwrap_or("").trim_end())
            .collect();
        let text = lines.join("\n");
        match exception {
            None if text.is_empty() => "failed".into(),
            None => text,
            Some(e) if text.is_empty() => e.to_string(),
            Some(e) => {
                let short = e.rsplit('.').next().unwrap_or(e);
                let first = lines.first().copied().unwrap_or("");
                if first.contains(&format!("{short}:")) || first == short {
                    text
                } else {
                    format!("{e}: {text}")
                }
            }
        }
    }
}

/// A rustc-style header at the start of a line: `error[E0308]: message`, `warning:
/// message`, or ruff's `F401 [*] message`.
fn header(line: &str) -> Option<Header> {
    let (level, code, message) = match level_word(line) {
        Some((level, code, message)) => (level, code, message),
        None => {
            let (word, message) = line.split_once(' ')?;
            if !lint_code(word) {
                return None;
            }
            let message = message.strip_prefix("[*] ").unwrap_or(message).trim();
            (lint_level(word), Some(word), message)
        }
    };
    (!message.is_empty()).then(|| Header {
        level,
        code: code.map(str::to_string),
        message: message.to_string(),
        age: 0,
    })
}

/// eslint's unix format: `message [Error/rule]`, `message [Warning/rule]`, `message [Error]`.
fn eslint(rest: &str) -> Option<(&str, Level, Option<&str>)> {
    let inner = rest.strip_suffix(']')?;
    let at = inner.rfind(" [")?;
    let tag = &inner[at + 2..];
    let (severity, rule) = match tag.split_once('/') {
        Some((s, r)) => (s, Some(r).filter(|r| is_code_like(r))),
        None => (tag, None),
    };
    let level = match severity {
        "Error" => Level::Failure,
        "Warning" => Level::Warning,
        _ => return None,
    };
    Some((inner[..at].trim_end(), level, rule))
}

/// A Go test's place: `file.go:line: message`, no column.
fn go_place(p: &Place<'_>) -> bool {
    p.path.ends_with(".go") && p.column.is_none() && !p.rest.is_empty()
}

fn annotation(p: &Place<'_>, level: Level, message: &str, title: Option<&str>) -> Annotation {
    Annotation {
        path: p.path.to_string(),
        start_line: p.line,
        end_line: p.line,
        start_column: p.column.filter(|c| *c >= 1),
        end_column: None,
        level,
        message: message.to_string(),
        title: title.map(str::to_string),
    }
}
