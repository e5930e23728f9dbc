//! A CI job's log, read for the repair report (SPEC §11): the bytes stream through
//! [`LogReader`] once, whatever their size, and what comes out is a short excerpt around the
//! errors plus the end of the log, and the first error line (what "the same failure again"
//! is judged by).
//!
//! Memory is flat: the reader keeps the line being read (at most [`MAX_LINE_BYTES`] of it),
//! the last [`TAIL_LINES`] lines, and the lines of at most seven windows, each of bounded
//! size ([`MAX_BUFFERED_BYTES`] in all). A 200 MB log costs the same memory as a 2 KB one.
//!
//! Each line is cleaned before anything looks at it:
//! - terminal escape sequences (CSI colours and cursor moves, OSC titles and links, DCS, …)
//!   are removed by a `vte` parser, which is reset at every line end so an unterminated
//!   sequence cannot swallow the lines after it;
//! - `\r` progress rewrites keep their last segment (`10%\r55%\r100%` reads `100%`;
//!   `\r\n` is a plain line end);
//! - the timestamp GitHub Actions puts before every line (`2024-05-01T12:34:56.1234567Z `)
//!   and a byte order mark at a line's start are dropped; other control characters (C0
//!   and C1) are dropped, tabs kept;
//! - bytes that are not UTF-8 read as `�`;
//! - a line longer than [`MAX_LINE_BYTES`] is cut there and ends in `…`.
//!
//! Error lines ([`error_strength`]) are found by markers matched case-sensitively, as the
//! tools print them: `##[error]`, `error[E`, `error:`, `Error:`, `Error ` (make's
//! `Error 2`), `ERROR`, `FAIL` (also `FAILED`, Go's `--- FAIL:`), `FATAL`, `fatal:`,
//! `panicked at`, `Traceback`, `Exception`, `AssertionError`, `npm ERR!`. The lower-case
//! words `error` and `failed` count too, but only as whole words and not after a zero
//! (`0 failed`, which every passing `cargo test` binary prints), and only as a weaker kind:
//! the first error line is the first line with a marker, else the first with such a word.
//!
//! Windows: [`BEFORE`] lines before an error line and [`AFTER`] after it, merged when they
//! overlap or touch; the first [`EDGE_WINDOWS`] and the last [`EDGE_WINDOWS`] windows are
//! kept (the ones between are dropped), each at most [`WINDOW_HEAD`] + [`WINDOW_TAIL`] lines.
//! The excerpt is those windows and the last [`TAIL_LINES`] lines in log order, with
//! `… N lines …` where lines were left out, cut to the caller's size.
//!
//! Also here, for the failure report built from such excerpts: cutting text within a size
//! ([`cut_str`], [`cut_with_mark`], [`cut_middle`]), fencing it ([`fence`]), and an error
//! line without what changes between runs of the same failure ([`normalize_error_line`]).

use std::collections::VecDeque;

use futures_util::{Stream, StreamExt};

/// The most of one line kept (bytes of cleaned text, cut on a character boundary).
pub const MAX_LINE_BYTES: usize = 2048;
/// Lines of context kept before an error line.
pub const BEFORE: u64 = 8;
/// Lines kept after an error line.
pub const AFTER: u64 = 20;
/// The last lines of the log, always in the excerpt.
pub const TAIL_LINES: usize = 30;
/// Windows kept at each end of the log: the first ones and the last ones.
pub const EDGE_WINDOWS: usize = 3;
/// A window longer than `WINDOW_HEAD + WINDOW_TAIL` lines (errors one after the other)
/// keeps its first and last lines.
pub const WINDOW_HEAD: usize = 40;
pub const WINDOW_TAIL: usize = 40;
/// The most of the first error line kept.
pub const MAX_FIRST_ERROR: usize = 500;
/// Room for the line being read: a full line plus its timestamp, which is stripped when
/// the line is complete.
const LINE_ROOM: usize = MAX_LINE_BYTES + 64;
/// Lines held at most: the tail, and the first, last and open windows.
const KEPT_LINES: usize = TAIL_LINES + (2 * EDGE_WINDOWS + 1) * (WINDOW_HEAD + WINDOW_TAIL);
/// The bound of [`LogReader::buffered_bytes`], whatever the log.
pub const MAX_BUFFERED_BYTES: usize = KEPT_LINES * (MAX_LINE_BYTES + '…'.len_utf8()) + LINE_ROOM;
/// Per-line size used when the excerpt does not fit at full line length.
const SHORT_LINE_BYTES: usize = 256;

/// What is shown of one log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogExcerpt {
    /// The windows around the errors and the end of the log, in log order, with
    /// `… N lines …` between parts; at most the `max_excerpt` the reader was given.
    pub text: String,
    /// Lines read.
    pub lines: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Reading stopped before the end of the log (the read limit, or a caller's deadline).
    pub cut_at_read_limit: bool,
}

/// One kept line: its number (from 1) and its cleaned text.
type Kept = (u64, Box<str>);

/// The lines kept around one run of error lines.
#[derive(Default)]
struct Window {
    head: Vec<Kept>,
    tail: VecDeque<Kept>,
    /// The number of the last line taken.
    last: u64,
    /// The last line the window wants: the latest error line's number + [`AFTER`].
    until: u64,
    bytes: usize,
}

impl Window {
    fn push(&mut self, n: u64, text: &str) {
        self.last = n;
        self.bytes += text.len();
        if self.head.len() < WINDOW_HEAD {
            self.head.push((n, text.into()));
            return;
        }
        if self.tail.len() == WINDOW_TAIL {
            if let Some((_, old)) = self.tail.pop_front() {
                self.bytes -= old.len();
            }
        }
        self.tail.push_back((n, text.into()));
    }

    fn lines(&self) -> impl Iterator<Item = &Kept> {
        self.head.iter().chain(self.tail.iter())
    }
}

/// The `vte` performer: builds the current line from what the parser prints, and takes
/// each finished line.
struct Lines {
    line: String,
    /// The current line had more than [`LINE_ROOM`] bytes.
    line_cut: bool,
    /// A `\r` was read: the next printed character starts the line again.
    pending_cr: bool,
    lines: u64,
    recent: VecDeque<Kept>,
    recent_bytes: usize,
    open: Option<Window>,
    first: Vec<Window>,
    last: VecDeque<Window>,
    /// The first error line, and whether it carried a marker (else only a word).
    first_error: Option<(bool, String)>,
    peak: usize,
}

impl vte::Perform for Lines {
    fn print(&mut self, c: char) {
        if self.pending_cr {
            self.pending_cr = false;
            self.line.clear();
            self.line_cut = false;
        }
        if c == '\u{feff}' && self.line.is_empty() {
            return;
        }
        if self.line.len() + c.len_utf8() <= LINE_ROOM {
            self.line.push(c);
        } else {
            self.line_cut = true;
        }
    }

    fn execute(&mut self, byte: u8) {
        match byte {
            b'\n' => {
                self.pending_cr = false;
                self.end_line();
            }
            b'\r' => self.pending_cr = true,
            b'\t' => self.print('\t'),
            _ => {}
        }
    }
}

impl Lines {
    /// Plain text (no control characters) added to the current line.
    fn print_str(&mut self, text: &str) {
        let text = if self.line.is_empty() {
            text.strip_prefix('\u{feff}').unwrap_or(text)
        } else {
            text
        };
        let room = LINE_ROOM - self.line.len();
        let part = cut_str(text, room);
        self.line.push_str(part);
        self.line_cut |= part.len() < text.len();
    }

    fn new() -> Lines {
        Lines {
            line: String::with_capacity(LINE_ROOM),
            line_cut: false,
            pending_cr: false,
            lines: 0,
            recent: VecDeque::with_capacity(TAIL_LINES + 1),
            recent_bytes: 0,
            open: None,
            first: Vec::new(),
            last: VecDeque::new(),
            first_error: None,
            peak: 0,
        }
    }

    fn buffered(&self) -> usize {
        let windows: usize = self
            .first
            .iter()
            .chain(self.last.iter())
            .chain(self.open.iter())
            .map(|w| w.bytes)
            .sum();
        self.line.capacity() + self.recent_bytes + windows
    }

    /// The current line is complete: clean it and take it.
    fn end_line(&mut self) {
        let text = clean_line(&self.line, self.line_cut);
        self.line.clear();
        self.line_cut = false;
        self.lines += 1;
        self.take(self.lines, &text);
    }

    fn take(&mut self, n: u64, text: &str) {
        let strength = error_strength(text);
        if let Some(strong) = strength {
            self.note_error(strong, text);
        }
        if self.open.as_ref().is_some_and(|w| n > w.until + BEFORE + 1) {
            self.close_window();
        }
        let Lines { open, recent, .. } = self;
        match open {
            Some(w) if n <= w.until => {
                w.push(n, text);
                if strength.is_some() {
                    w.until = n + AFTER;
                }
            }
            // Close enough to the open window that the two touch: one window.
            Some(w) if strength.is_some() => {
                let after = w.last;
                for (k, line) in recent.iter().filter(|(k, _)| *k > after) {
                    w.push(*k, line);
                }
                w.push(n, text);
                w.until = n + AFTER;
            }
            None if strength.is_some() => {
                let mut w = Window::default();
                let from = n.saturating_sub(BEFORE);
                for (k, line) in recent.iter().filter(|(k, _)| *k >= from) {
                    w.push(*k, line);
                }
                w.push(n, text);
                w.until = n + AFTER;
                *open = Some(w);
            }
            _ => {}
        }
        if self.recent.len() == TAIL_LINES {
            if let Some((_, old)) = self.recent.pop_front() {
                self.recent_bytes -= old.len();
            }
        }
        self.recent_bytes += text.len();
        self.recent.push_back((n, text.into()));
        self.peak = self.peak.max(self.buffered());
    }

    fn note_error(&mut self, strong: bool, text: &str) {
        let better = match &self.first_error {
            None => true,
            Some((had_strong, _)) => strong && !had_strong,
        };
        if better {
            let line = text.trim();
            let line = line.strip_prefix("##[error]").unwrap_or(line).trim();
            self.first_error = Some((strong, cut_str(line, MAX_FIRST_ERROR).to_string()));
        }
    }

    /// Keeps the open window among the first or the last ones.
    fn close_window(&mut self) {
        let Some(w) = self.open.take() else {
            return;
        };
        if self.first.len() < EDGE_WINDOWS {
            self.first.push(w);
            return;
        }
        self.last.push_back(w);
        if self.last.len() > EDGE_WINDOWS {
            self.last.pop_front();
        }
    }
}

/// Streams a log through once and keeps its excerpt (see the module's documentation).
pub struct LogReader {
    parser: vte::Parser,
    lines: Lines,
    max_read: u64,
    max_excerpt: usize,
    read: u64,
    cut: bool,
    /// Part of the current line went through the parser.
    mid_line: bool,
    /// The current line has an escape character.
    escaped: bool,
}

impl LogReader {
    /// Reads at most `max_read` bytes of a log; the excerpt is at most `max_excerpt` bytes.
    pub fn new(max_read: u64, max_excerpt: usize) -> LogReader {
        LogReader {
            parser: vte::Parser::new(),
            lines: Lines::new(),
            max_read,
            max_excerpt,
            read: 0,
            cut: false,
            mid_line: false,
            escaped: false,
        }
    }

    /// Takes the next bytes of the log. `false` once the read limit is reached: the rest
    /// of `chunk`, and anything after it, is not read (the excerpt says so).
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.cut {
            return false;
        }
        let room = self.max_read - self.read;
        let take = usize::try_from(room).map_or(chunk.len(), |r| r.min(chunk.len()));
        let mut rest = &chunk[..take];
        self.read += take as u64;
        while !rest.is_empty() {
            let (len, newline, plain) = scan_line(rest);
            self.take_bytes(&rest[..len], newline, plain);
            rest = &rest[len + usize::from(newline)..];
        }
        if take < chunk.len() {
            self.cut = true;
            return false;
        }
        true
    }

    /// A piece of a line, without its `\n`; `newline` when the line ends after it, `plain`
    /// when it has no control character but tabs.
    fn take_bytes(&mut self, bytes: &[u8], newline: bool, plain: bool) {
        // A whole line of plain text (the most of any log) skips the parser.
        if newline && !self.mid_line && plain {
            if let Ok(text) = std::str::from_utf8(bytes) {
                self.lines.print_str(text);
                self.lines.end_line();
                return;
            }
        }
        self.mid_line = !newline;
        self.escaped |= bytes.contains(&0x1b);
        self.parser.advance(&mut self.lines, bytes);
        if !newline {
            return;
        }
        let before = self.lines.lines;
        // Through the parser, so a character cut short reads as `�`.
        self.parser.advance(&mut self.lines, b"\n");
        if self.lines.lines == before {
            // The parser was inside a sequence (an OSC does not end at a newline).
            self.lines.end_line();
        }
        if std::mem::take(&mut self.escaped) {
            // A sequence left open at the line's end ends with it.
            self.parser = vte::Parser::new();
        }
    }

    /// Feeds every chunk of `stream` until it ends or the read limit is reached (the
    /// stream is then dropped unread). A stream error ends reading with that error.
    pub async fn feed_stream<S, B, E>(&mut self, stream: S) -> Result<(), E>
    where
        S: Stream<Item = Result<B, E>>,
        B: AsRef<[u8]>,
    {
        let mut stream = std::pin::pin!(stream);
        while let Some(chunk) = stream.next().await {
            if !self.feed(chunk?.as_ref()) {
                break;
            }
        }
        Ok(())
    }

    /// Says that reading stopped before the end of the log for a reason of the caller's
    /// (a deadline): the excerpt says the log goes on.
    pub fn stop_early(&mut self) {
        self.cut = true;
    }

    /// Bytes of log text the reader holds now (the line being read included).
    pub fn buffered_bytes(&self) -> usize {
        self.lines.buffered()
    }

    /// The most [`buffered_bytes`](Self::buffered_bytes) has been; never over
    /// [`MAX_BUFFERED_BYTES`].
    pub fn peak_buffered_bytes(&self) -> usize {
        self.lines.peak.max(self.lines.buffered())
    }

    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// The first error line so far (cleaned, without a `##[error]` prefix).
    pub fn first_error(&self) -> Option<&str> {
        self.lines.first_error.as_ref().map(|(_, l)| l.as_str())
    }

    /// The excerpt, and the first error line. A last line without a newline counts.
    pub fn finish(mut self) -> (LogExcerpt, Option<String>) {
        // A character cut short by the end of the log reads as `�`.
        self.parser.advance(&mut self.lines, &[0]);
        let lines = &mut self.lines;
        if !lines.line.is_empty() || lines.line_cut {
            lines.end_line();
        }
        lines.close_window();
        let mut parts = kept_lines(lines);
        if self.cut {
            parts.push(format!(
                "[… the log goes on: reading stopped after {} bytes]",
                self.read
            ));
        }
        let text = fit(&parts, self.max_excerpt);
        let excerpt = LogExcerpt {
            text,
            lines: lines.lines,
            bytes: self.read,
            cut_at_read_limit: self.cut,
        };
        let first_error = lines.first_error.take().map(|(_, l)| l);
        (excerpt, first_error)
    }
}

/// The kept lines in log order, each once, with `… N lines …` for each gap (lines are
/// numbered from 1).
fn kept_lines(lines: &Lines) -> Vec<String> {
    let mut kept: Vec<&Kept> = lines
        .first
        .iter()
        .chain(lines.last.iter())
        .flat_map(Window::lines)
        .chain(lines.recent.iter())
        .collect();
    kept.sort_by_key(|(n, _)| *n);
    kept.dedup_by_key(|(n, _)| *n);
    let mut out = Vec::with_capacity(kept.len() + 8);
    let mut prev = 0;
    for (n, text) in kept {
        if *n > prev + 1 {
            out.push(gap(*n - prev - 1));
        }
        out.push(text.to_string());
        prev = *n;
    }
    out
}

fn gap(lines: u64) -> String {
    if lines == 1 {
        "… 1 line …".to_string()
    } else {
        format!("… {lines} lines …")
    }
}

/// `parts` joined by newlines within `max` bytes: as they are; else each line cut to
/// [`SHORT_LINE_BYTES`]; else the first and last lines that fit in half the room each,
/// with a marker between.
fn fit(parts: &[String], max: usize) -> String {
    let joined = parts.join("\n");
    if joined.len() <= max {
        return joined;
    }
    let short: Vec<&str> = parts.iter().map(|p| cut_str(p, SHORT_LINE_BYTES)).collect();
    let joined = short.join("\n");
    if joined.len() <= max {
        return joined;
    }
    let marker_room = 48;
    let half = max.saturating_sub(marker_room) / 2;
    let (mut head, mut head_len) = (0, 0);
    while head < short.len() && head_len + short[head].len() < half {
        head_len += short[head].len() + 1;
        head += 1;
    }
    let (mut tail, mut tail_len) = (short.len(), 0);
    while tail > head && tail_len + short[tail - 1].len() < half {
        tail_len += short[tail - 1].len() + 1;
        tail -= 1;
    }
    let mut out = String::with_capacity(max);
    for line in &short[..head] {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!("[… {} lines cut to fit …]", tail - head));
    for line in &short[tail..] {
        out.push('\n');
        out.push_str(line);
    }
    cut_str(&out, max).to_string()
}

/// The longest start of `s` of at most `max` bytes that ends on a character boundary.
pub fn cut_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `text` within `max` bytes, ending in `…` when cut.
pub fn cut_with_mark(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut out = cut_str(text, max.saturating_sub('…'.len_utf8())).to_string();
    out.push('…');
    out
}

/// `text` within `max` bytes: its start and end, with a marker between, cut on line
/// boundaries where it can be.
pub fn cut_middle(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let marker = "\n[… cut to fit the report …]\n";
    let half = max.saturating_sub(marker.len()) / 2;
    let head = cut_str(text, half);
    let head = head.rfind('\n').map_or(head, |i| &head[..i]);
    let mut start = text.len() - half.min(text.len());
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let tail = &text[start..];
    let tail = tail.find('\n').map_or(tail, |i| &tail[i + 1..]);
    let out = format!("{head}{marker}{tail}");
    cut_str(&out, max).to_string()
}

/// A fence longer than any run of backticks in `text`.
pub fn fence(text: &str, info: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let ticks = "`".repeat((longest + 1).max(3));
    format!("{ticks}{info}\n{text}\n{ticks}\n")
}

/// An error line without what changes from run to run of the same failure: each ASCII
/// word of hex digits with a digit in it that is at least 7 long or `0x`-prefixed (commit
/// and object ids, addresses) becomes `#`, every other run of digits (durations, counts,
/// line numbers, ports) becomes `#`, and blanks become one space. So `FAILED (0.53s) at
/// 0x7ffd5e8c` and `FAILED (1.20s) at 0x7ffd0010` are the same line, while `E0308` and
/// `E0425` both read `E#` and differ only by the words after them.
pub fn normalize_error_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if !word.is_empty() {
            out.push_str(&normalize_word(word));
            word.clear();
        }
    };
    for c in line.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
            continue;
        }
        flush(&mut word, &mut out);
        if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out.trim().to_string()
}

fn normalize_word(word: &str) -> String {
    let bare = word
        .strip_prefix("0x")
        .or_else(|| word.strip_prefix("0X"))
        .unwrap_or(word);
    let hex = !bare.is_empty()
        && bare.chars().all(|c| c.is_ascii_hexdigit())
        && bare.chars().any(|c| c.is_ascii_digit());
    if hex && (bare.len() >= 7 || bare.len() < word.len()) {
        return "#".into();
    }
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A finished line as kept: without its Actions timestamp and trailing blanks, at most
/// [`MAX_LINE_BYTES`] (then ending in `…`).
fn clean_line(raw: &str, was_cut: bool) -> String {
    let text = strip_timestamp(raw).trim_end();
    if text.len() <= MAX_LINE_BYTES && !was_cut {
        return text.to_string();
    }
    let mut out = cut_str(text, MAX_LINE_BYTES).to_string();
    out.push('…');
    out
}

/// `line` without a leading `YYYY-MM-DDTHH:MM:SS[.fraction]Z ` (GitHub Actions puts one
/// before every line of a job's log).
pub fn strip_timestamp(line: &str) -> &str {
    let b = line.as_bytes();
    let digits = |from: usize, to: usize| {
        b.get(from..to)
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let shaped = digits(0, 4)
        && at(4, b'-')
        && digits(5, 7)
        && at(7, b'-')
        && digits(8, 10)
        && at(10, b'T')
        && digits(11, 13)
        && at(13, b':')
        && digits(14, 16)
        && at(16, b':')
        && digits(17, 19);
    if !shaped {
        return line;
    }
    let mut i = 19;
    if at(i, b'.') {
        i += 1;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
    }
    if !at(i, b'Z') {
        return line;
    }
    i += 1;
    if at(i, b' ') {
        i += 1;
    }
    &line[i..]
}

/// The length of the line at the start of `bytes` (without its `\n`), whether a `\n` ends
/// it, and whether it is plain: no control character but tabs (so no escape and no `\r`).
fn scan_line(bytes: &[u8]) -> (usize, bool, bool) {
    let mut plain = true;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\n' {
            return (i, true, plain);
        }
        // 0xC2 leads U+0080..U+00BF, the C1 controls among them: the parser sorts them out.
        if (b < 0x20 && b != b'\t') || b == 0x7f || b == 0xc2 {
            plain = false;
        }
        i += 1;
    }
    (i, false, plain)
}

/// Bytes a marker or word can start with ([`error_strength`] looks closer only there).
const STARTS: [bool; 256] = {
    let mut t = [false; 256];
    let starts = b"#eEFfpTAn";
    let mut i = 0;
    while i < starts.len() {
        t[starts[i] as usize] = true;
        i += 1;
    }
    t
};

/// Whether `line` is an error line: `Some(true)` for a marker, `Some(false)` for the
/// lower-case word `error` or `failed` alone (not after a zero), `None` otherwise (see
/// the module's documentation). One pass over the bytes: logs are long, and this runs on
/// every line.
pub fn error_strength(line: &str) -> Option<bool> {
    let b = line.as_bytes();
    let mut weak = false;
    let mut i = 0;
    while i < b.len() {
        if STARTS[b[i] as usize] {
            match marker_at(&b[i..]) {
                Some(true) => return Some(true),
                Some(false) => weak |= alone(line, i, b[i]),
                None => {}
            }
        }
        i += 1;
    }
    weak.then_some(false)
}

/// A marker (`Some(true)`) or one of the words `error`, `failed` (`Some(false)`) at the
/// start of `rest`.
fn marker_at(rest: &[u8]) -> Option<bool> {
    let has = |m: &[u8]| rest.starts_with(m);
    match rest[0] {
        b'#' => has(b"##[error]").then_some(true),
        b'e' if has(b"error") => Some(has(b"error[E") || has(b"error:")),
        b'f' if has(b"fatal:") => Some(true),
        b'f' => has(b"failed").then_some(false),
        b'E' => {
            (has(b"Error:") || has(b"Error ") || has(b"ERROR") || has(b"Exception")).then_some(true)
        }
        b'F' => (has(b"FAIL") || has(b"FATAL")).then_some(true),
        b'p' => has(b"panicked at").then_some(true),
        b'T' => has(b"Traceback").then_some(true),
        b'A' => has(b"AssertionError").then_some(true),
        b'n' => has(b"npm ERR!").then_some(true),
        _ => None,
    }
}

/// Whether the word starting with `first` at byte `at` of `line` (`error` or `failed`)
/// stands alone: no ASCII letter, digit, `-` or `_` (nor any non-ASCII byte) on either
/// side, and not after a zero count (`0 failed`).
fn alone(line: &str, at: usize, first: u8) -> bool {
    let len = if first == b'e' { 5 } else { 6 };
    let b = line.as_bytes();
    let part = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c >= 0x80;
    let before_ok = at == 0 || !part(b[at - 1]);
    let after_ok = at + len >= b.len() || !part(b[at + len]);
    before_ok && after_ok && !after_zero(&b[..at])
}

/// Whether `before` ends in a zero count: `0 ` with no digit before the zero.
fn after_zero(before: &[u8]) -> bool {
    before
        .strip_suffix(b"0 ")
        .is_some_and(|rest| !rest.last().is_some_and(u8::is_ascii_digit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn error_lines_lose_what_changes_between_runs() {
        assert_eq!(
            normalize_error_line("test it ... FAILED  (0.53s) at 0x7ffd5e8c, commit 1a2b3c4d5e"),
            "test it ... FAILED (#.#s) at #, commit #"
        );
        assert_eq!(
            normalize_error_line("error[E0308]: src/lib.rs:12:5 deadbeef"),
            "error[E#]: src/lib.rs:#:# deadbeef"
        );
        assert_eq!(normalize_error_line("  "), "");
    }

    #[test]
    fn fences_outgrow_the_backticks_inside() {
        assert_eq!(fence("a", "text"), "```text\na\n```\n");
        assert_eq!(fence("x ```` y", ""), "`````\nx ```` y\n`````\n");
    }

    #[test]
    fn cuts_keep_both_ends() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let cut = cut_middle(&text, 200);
        assert!(cut.len() <= 200);
        assert!(cut.starts_with("line 0\n") && cut.trim_end().ends_with("line 99"));
        assert!(cut.contains("[… cut to fit the report …]"));
        assert_eq!(cut_with_mark("abcdef", 4), "a…");
    }

    fn read(log: &[u8], max_excerpt: usize) -> (LogExcerpt, Option<String>) {
        let mut r = LogReader::new(u64::MAX, max_excerpt);
        // Odd chunk sizes: sequences and characters split across chunks.
        for chunk in log.chunks(7) {
            assert!(r.feed(chunk));
        }
        r.finish()
    }

    #[test]
    fn escapes_timestamps_boms_and_progress_are_cleaned() {
        let log = "\u{feff}2024-05-01T12:34:56.1234567Z Run cargo test\n\
                   2024-05-01T12:34:57.0000000Z \x1b[1m\x1b[31merror[E0308]\x1b[0m: mismatched types\n\
                   2024-05-01T12:34:58Z \x1b]8;;https://x.test/a\x07a link\x1b]8;;\x07 and \x1b]0;title\x1b\\text\n\
                   downloading 10%\r downloading 55%\r\x1b[Kdownloading 100%\r\n\
                   tab\there\x07bell\u{85} and c1 \u{a9}\n";
        let (ex, first) = read(log.as_bytes(), 12 * 1024);
        assert_eq!(first.as_deref(), Some("error[E0308]: mismatched types"));
        assert_eq!(
            ex.text,
            "Run cargo test\nerror[E0308]: mismatched types\na link and text\n\
             downloading 100%\ntab\therebell and c1 \u{a9}"
        );
        assert_eq!((ex.lines, ex.bytes), (5, log.len() as u64));
        assert!(!ex.cut_at_read_limit);
    }

    #[test]
    fn an_unterminated_sequence_ends_with_its_line() {
        let log = b"before \x1b]0;never terminated\nerror: after it\n";
        let (ex, first) = read(log, 4096);
        assert_eq!(ex.text, "before\nerror: after it");
        assert_eq!(first.as_deref(), Some("error: after it"));
    }

    #[test]
    fn error_lines_and_their_kinds() {
        for strong in [
            "##[error]Process completed with exit code 1.",
            "error[E0425]: cannot find value `x`",
            "thread 'main' panicked at src/main.rs:2:5:",
            "Traceback (most recent call last):",
            "npm ERR! code ELIFECYCLE",
            "fatal: not a git repository",
            "FAILED tests/test_x.py::test_y - assert 1 == 2",
            "--- FAIL: TestX (0.00s)",
            "make: *** [Makefile:3: all] Error 2",
            "java.lang.IllegalStateException: boom",
        ] {
            assert_eq!(error_strength(strong), Some(true), "{strong}");
        }
        for weak in ["the build failed", "an error occurred", "error"] {
            assert_eq!(error_strength(weak), Some(false), "{weak}");
        }
        for none in [
            "test result: ok. 12 passed; 0 failed; 0 ignored",
            "Compiling error-chain v0.12.4",
            "no errors found",
            "warning: unused variable",
        ] {
            assert_eq!(error_strength(none), None, "{none}");
        }
        assert_eq!(error_strength("10 failed"), Some(false));
    }

    #[test]
    fn the_first_marked_error_wins_over_an_earlier_word() {
        let log = "step\nthe download failed, retrying\nok\n##[error]  error: linker failed\n";
        let (_, first) = read(log.as_bytes(), 4096);
        assert_eq!(first.as_deref(), Some("error: linker failed"));
        let (_, first) = read(b"all good\n", 4096);
        assert_eq!(first, None);
    }

    fn numbered(lines: u64, errors: &[u64]) -> String {
        (1..=lines)
            .map(|n| {
                if errors.contains(&n) {
                    format!("error: number {n}\n")
                } else {
                    format!("line {n}\n")
                }
            })
            .collect()
    }

    #[test]
    fn windows_merge_and_gaps_are_counted() {
        // Errors at 100 and 125 touch (125 - 8 <= 100 + 20 + 1): one window 92..=145.
        let (ex, _) = read(numbered(1000, &[100, 125]).as_bytes(), 64 * 1024);
        let lines: Vec<&str> = ex.text.lines().collect();
        assert_eq!(lines[0], "… 91 lines …");
        assert_eq!(lines[1], "line 92");
        assert!(lines.contains(&"error: number 125"));
        let end = lines.iter().position(|l| *l == "line 145").unwrap();
        assert_eq!(lines[end + 1], "… 825 lines …");
        assert_eq!(lines[end + 2], "line 971");
        assert_eq!(*lines.last().unwrap(), "line 1000");
        // Far apart: two windows.
        let (ex, _) = read(numbered(1000, &[100, 300]).as_bytes(), 64 * 1024);
        assert!(
            ex.text.contains("line 120\n… 171 lines …\nline 292\n"),
            "{}",
            ex.text
        );
    }

    #[test]
    fn only_the_first_and_last_windows_are_kept() {
        let errors: Vec<u64> = (1..=20).map(|i| i * 1000).collect();
        let (ex, first) = read(numbered(25_000, &errors).as_bytes(), 64 * 1024);
        assert_eq!(first.as_deref(), Some("error: number 1000"));
        for kept in [1000, 2000, 3000, 18000, 19000, 20000] {
            assert!(
                ex.text.contains(&format!("error: number {kept}\n")),
                "{kept}"
            );
        }
        for dropped in [4000, 10000, 17000] {
            assert!(!ex.text.contains(&format!("error: number {dropped}\n")));
        }
        assert!(ex.text.ends_with("line 25000"));
    }

    #[test]
    fn a_log_without_a_trailing_newline_keeps_its_last_line() {
        let (ex, first) = read(b"one\ntwo\nerror: three", 4096);
        assert_eq!(ex.text, "one\ntwo\nerror: three");
        assert_eq!(ex.lines, 3);
        assert_eq!(first.as_deref(), Some("error: three"));
        let (ex, first) = read(b"", 4096);
        assert_eq!((ex.text.as_str(), ex.lines, first), ("", 0, None));
    }

    #[test]
    fn a_ten_megabyte_line_is_cut_and_memory_stays_flat() {
        let mut r = LogReader::new(u64::MAX, 12 * 1024);
        assert!(r.feed(b"error: a long line follows\n"));
        let block = vec![b'x'; 64 * 1024];
        for _ in 0..160 {
            assert!(r.feed(&block));
            assert!(r.buffered_bytes() <= MAX_BUFFERED_BYTES);
        }
        assert!(r.feed(b"\nend\n"));
        assert!(
            r.peak_buffered_bytes() < 64 * 1024,
            "{}",
            r.peak_buffered_bytes()
        );
        let (ex, _) = r.finish();
        assert_eq!(ex.lines, 3);
        let long = ex.text.lines().nth(1).unwrap();
        assert_eq!(long.len(), MAX_LINE_BYTES + '…'.len_utf8());
        assert!(long.ends_with('…'));
        assert!(ex.text.ends_with("\nend"));
    }

    #[test]
    fn bytes_that_are_not_utf8_read_as_replacement_characters() {
        let (ex, first) = read(b"ok \xff\xfe bytes\nerror: \xc3\x28 bad\n\xe2\x82", 4096);
        assert!(
            ex.text.starts_with("ok \u{fffd}\u{fffd} bytes\n"),
            "{}",
            ex.text
        );
        assert!(first.unwrap().starts_with("error: \u{fffd}"));
        assert_eq!(ex.lines, 3);
        assert!(ex.text.ends_with("\n\u{fffd}"), "{}", ex.text);
    }

    #[test]
    fn the_read_limit_stops_reading_and_says_so() {
        let log = numbered(10_000, &[5]);
        let mut r = LogReader::new(1000, 4096);
        assert!(!r.feed(log.as_bytes()));
        assert!(!r.feed(b"more"));
        assert_eq!(r.bytes_read(), 1000);
        let (ex, first) = r.finish();
        assert!(ex.cut_at_read_limit);
        assert_eq!(ex.bytes, 1000);
        assert_eq!(first.as_deref(), Some("error: number 5"));
        assert!(ex
            .text
            .ends_with("[… the log goes on: reading stopped after 1000 bytes]"));
    }

    #[test]
    fn the_excerpt_fits_its_size_on_char_boundaries() {
        let line = "é".repeat(1500);
        let log: String = (0..200).map(|i| format!("error: {i} {line}\n")).collect();
        for max in [0, 1, 100, 1001, 12 * 1024] {
            let (ex, _) = read(log.as_bytes(), max);
            assert!(ex.text.len() <= max, "{max}: {}", ex.text.len());
        }
        let (ex, _) = read(log.as_bytes(), 12 * 1024);
        assert!(ex.text.starts_with("error: 0 "), "{}", &ex.text[..40]);
        assert!(ex.text.contains("lines cut to fit"));
        assert!(ex.text.contains("error: 199 "));
    }

    /// A generated log of about `total` bytes, as a stream of 64 KiB chunks: Actions
    /// timestamps and colours on every line, an error near the start and one at the end.
    fn generated(total: u64) -> impl Stream<Item = Result<Vec<u8>, std::io::Error>> {
        // Colours on one line in ten, as a build's output has them.
        let line = |n: u64| {
            let (on, off) = if n % 10 == 0 {
                ("\x1b[32m", "\x1b[0m")
            } else {
                ("", "")
            };
            format!(
                "2024-05-01T12:34:56.1234567Z {on}[{n:>9}]{off} compiling crate-{n:09} \
                 with the usual flags and some padding to make the line longer\n"
            )
        };
        // Nine lines in ten of `line(1)`'s length, one 9 bytes longer.
        let lines = total * 10 / (10 * line(1).len() as u64 + 9);
        let text = move |n: u64| match n {
            100 => {
                "2024-05-01T12:34:56.1234567Z error[E0308]: mismatched types (early)\n".to_string()
            }
            n if n == lines - 5 => {
                "2024-05-01T12:34:56.1234567Z ##[error]error: could not compile (late)\n"
                    .to_string()
            }
            n => line(n),
        };
        futures_util::stream::unfold(1u64, move |mut n| async move {
            if n > lines {
                return None;
            }
            let mut chunk = Vec::with_capacity(65 * 1024);
            while n <= lines && chunk.len() < 64 * 1024 {
                chunk.extend_from_slice(text(n).as_bytes());
                n += 1;
            }
            Some((Ok(chunk), n))
        })
    }

    #[tokio::test]
    async fn a_200_mb_log_streams_through_in_flat_memory() {
        let total = 200_000_000;
        let mut r = LogReader::new(256 << 20, 12 * 1024);
        let started = Instant::now();
        r.feed_stream(generated(total)).await.unwrap();
        let took = started.elapsed();
        let peak = r.peak_buffered_bytes();
        let (ex, first) = r.finish();
        eprintln!(
            "200 MB log: {} bytes, {} lines in {took:?} ({:.0} MB/s); peak buffer {peak} bytes; \
             excerpt {} bytes",
            ex.bytes,
            ex.lines,
            ex.bytes as f64 / 1e6 / took.as_secs_f64(),
            ex.text.len()
        );
        assert!(ex.bytes > total - 1000 && ex.bytes <= total, "{}", ex.bytes);
        assert!(!ex.cut_at_read_limit);
        assert!(peak <= MAX_BUFFERED_BYTES);
        assert!(peak < 64 * 1024, "{peak}");
        assert!(ex.text.len() <= 12 * 1024);
        assert!(
            ex.text.contains("error[E0308]: mismatched types (early)"),
            "{}",
            ex.text
        );
        assert!(ex.text.contains("##[error]error: could not compile (late)"));
        assert!(!ex.text.contains("\x1b") && !ex.text.contains("2024-05-01T"));
        assert_eq!(
            first.as_deref(),
            Some("error[E0308]: mismatched types (early)")
        );
    }
}
