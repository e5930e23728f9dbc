//! What a PTY prints, turned into text a model can read, and what a model types, turned
//! into bytes a PTY understands.
//!
//! The shells kodx starts print an invisible private OSC sequence as part of their prompt:
//! `ESC ] 7337 ; kodx ; <nonce> ; <status> ; <shell pid> BEL` before `$ ` (PS1) and
//! `ESC ] 7337 ; kodx ; <nonce> ; c BEL` before `> ` (PS2). The decoder strips every escape
//! sequence from the output, applies carriage returns and backspaces the way a terminal
//! would, and records where those prompts were, with the exit status of the last command.
//! The nonce is random per shell, so a file that happens to contain such a sequence does not
//! fool it unless it carries this shell's nonce.
//!
//! Whatever a command prints, memory stays bounded: the line being written is at most
//! [`COLUMNS`] cells (a longer one wraps, as on a terminal), cursor moves stop at the edges,
//! committed text keeps a head and a tail with the middle counted, and the escape parser
//! holds at most a fixed amount of an unfinished sequence.

use std::fmt::Write as _;

/// The OSC number kodx's prompts use (a private number no terminal assigns).
pub const OSC_ID: &str = "7337";

/// Width of the PTY kodx gives its shells, and of the terminal the decoder emulates. Wide,
/// so readline does not scroll long command lines sideways.
pub const COLUMNS: u16 = 1000;

/// The prompt checks look at what follows a prompt only up to this many bytes: a prompt,
/// a line of blanks from a redraw, and some slack. Anything longer is output.
const SHORT: usize = 4 * COLUMNS as usize;

/// What [`clean`] keeps of the head and of the tail of its input.
const CLEAN_KEEP: usize = 32 * 1024;

/// A prompt seen in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptKind {
    /// PS1: the shell is waiting for a new command. `exit` is `$?` when the shell expanded it.
    Command { exit: Option<i32> },
    /// PS2: the shell is waiting for the rest of a command (open quote, heredoc, `\`).
    Continuation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// Byte offset in `Decoder::buf` where the prompt started.
    offset: usize,
    kind: PromptKind,
    /// A prompt already returned by a take: kept so a redraw of it is recognised, but it
    /// does not say the shell finished what was typed after it.
    stale: bool,
}

/// Streaming decoder of one shell's output. Feed it raw bytes as they arrive; read the
/// cleaned text with [`Decoder::take`]. Memory stays bounded: past `4 * keep` bytes the
/// middle of the pending text is dropped and counted, a line wraps at [`COLUMNS`], and the
/// parser (vte without its `std` feature) keeps at most 1 KiB of an unfinished OSC.
pub struct Decoder {
    parser: vte::Parser,
    screen: Screen,
}

struct Screen {
    nonce: String,
    /// Committed text (complete lines, and partial lines cut at a prompt).
    buf: String,
    /// The row being written, as cells (at most `width`), and the cursor column in it: at
    /// most `width`, which means "past the last column", the next character wraps.
    line: Vec<char>,
    col: usize,
    width: usize,
    marks: Vec<Mark>,
    /// Prompts seen since the last take (survives compaction).
    prompts: usize,
    /// Bytes dropped from the middle of `buf` since the last take, and where.
    omitted: usize,
    cut_at: usize,
    keep: usize,
    /// The shell's process id inside the container, from its prompt.
    shell_pid: Option<u32>,
}

/// What the shell printed since the last take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    pub text: String,
    /// Bytes already dropped at `cut_at` to bound memory.
    pub omitted: usize,
    pub cut_at: usize,
}

impl Decoder {
    /// `keep`: how many bytes of head and of tail to keep when output grows past `2 * keep`.
    pub fn new(nonce: &str, keep: usize) -> Self {
        Decoder {
            parser: vte::Parser::new(),
            screen: Screen {
                nonce: nonce.to_string(),
                buf: String::new(),
                line: Vec::new(),
                col: 0,
                width: COLUMNS as usize,
                marks: Vec::new(),
                prompts: 0,
                omitted: 0,
                cut_at: 0,
                keep: keep.max(64),
                shell_pid: None,
            },
        }
    }

    /// From now on only prompts carrying `nonce` are prompts (a shell moved to a new
    /// marker).
    pub fn set_nonce(&mut self, nonce: &str) {
        self.screen.nonce = nonce.to_string();
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.advance(&mut self.screen, bytes);
    }

    /// The shell's pid inside the container, once a prompt has told it.
    pub fn shell_pid(&self) -> Option<u32> {
        self.screen.shell_pid
    }

    /// Number of prompts (PS1 or PS2) printed since the last take.
    pub fn prompts(&self) -> usize {
        self.screen.prompts
    }

    /// When the output ends at a PS1 prompt (nothing but the prompt's own `$ ` after it),
    /// the status of that prompt.
    pub fn at_prompt(&self) -> Option<PromptKind> {
        let mark = self.screen.marks.last().filter(|m| !m.stale)?;
        if !matches!(mark.kind, PromptKind::Command { .. }) {
            return None;
        }
        let since = self.screen.since(mark)?;
        (since.trim_end() == "$").then_some(mark.kind)
    }

    /// When the shell has sat at the prompt the last take returned, printing nothing
    /// since (a redraw aside), that prompt.
    pub fn idle_at_prompt(&self) -> Option<PromptKind> {
        let mark = self.screen.marks.last().filter(|m| m.stale)?;
        let since = self.screen.since(mark)?;
        matches!(since.trim(), "" | "$").then_some(mark.kind)
    }

    /// The last line of the pending output (no newline after it), cleaned; of a long line,
    /// only about its last [`SHORT`] bytes.
    pub fn last_line(&self) -> String {
        let buf = &self.screen.buf;
        // The row being written, after what `buf` holds of the same line (a prompt or a
        // wrap cut it there).
        let from = floor_char(buf, buf.len().saturating_sub(SHORT));
        let start = buf[from..].rfind('\n').map_or(from, |i| from + i + 1);
        let mut line = buf[start..].to_string();
        line.extend(self.screen.line.iter());
        line
    }

    /// Whether anything was printed since the last take.
    pub fn is_empty(&self) -> bool {
        self.screen.buf.is_empty() && self.screen.line.is_empty() && self.screen.omitted == 0
    }

    /// Takes everything printed since the last take. When the output ends at a PS1
    /// prompt, that prompt is removed from the text and returned.
    pub fn take(&mut self) -> (Pending, Option<PromptKind>) {
        let at_prompt = self.at_prompt();
        let s = &mut self.screen;
        match (at_prompt, s.marks.last()) {
            // Only the prompt follows the mark: drop it (and the row it is on).
            (Some(_), Some(mark)) => {
                s.buf.truncate(mark.offset);
                s.line.clear();
                s.col = 0;
            }
            _ => s.commit_line(false),
        }
        let mut text = std::mem::take(&mut s.buf);
        // The prompt the last take returned, drawn again after it: not new output.
        if s.marks.first().is_some_and(|m| m.stale && m.offset == 0) && text.starts_with("$ ") {
            text.drain(..2);
        }
        s.marks.clear();
        if let Some(kind) = at_prompt {
            s.marks.push(Mark {
                offset: 0,
                kind,
                stale: true,
            });
        }
        s.prompts = 0;
        let pending = Pending {
            text,
            omitted: std::mem::take(&mut s.omitted),
            cut_at: std::mem::take(&mut s.cut_at),
        };
        (pending, at_prompt)
    }

    /// Takes everything printed since the last take as one text of about `cap` bytes at
    /// most, its middle cut with a note (see [`cap_middle`]).
    pub fn take_text(&mut self, cap: usize) -> String {
        let (p, _) = self.take();
        cap_middle(&p.text, p.omitted, p.cut_at, cap).0
    }
}

impl Screen {
    /// Everything printed after `mark`, when it is short enough to be a prompt and blanks
    /// (at most [`SHORT`] bytes committed, plus the row being written); `None` when longer.
    fn since(&self, mark: &Mark) -> Option<String> {
        let committed = self.buf.get(mark.offset..)?;
        if committed.len() > SHORT {
            return None;
        }
        let mut rest = String::with_capacity(committed.len() + self.line.len());
        rest.push_str(committed);
        rest.extend(self.line.iter());
        Some(rest)
    }

    /// Moves the current line into `buf` (with a newline when `newline`), then bounds
    /// `buf`.
    fn commit_line(&mut self, newline: bool) {
        self.buf.extend(self.line.drain(..));
        if newline {
            self.buf.push('\n');
        }
        self.col = 0;
        self.compact();
    }

    fn put(&mut self, c: char) {
        if self.col >= self.width {
            // Past the last column: the row is full and wraps, as on a terminal. It goes to
            // `buf` as it is, without a newline, so a line without end is cut in the middle
            // and counted like many short lines.
            self.commit_line(false);
        }
        if self.col < self.line.len() {
            self.line[self.col] = c;
        } else {
            self.line.push(c);
        }
        self.col += 1;
    }

    /// Bounds memory: past `4 * keep` bytes, keeps the first and the last `keep` bytes and
    /// counts the rest.
    fn compact(&mut self) {
        let keep = self.keep;
        if self.buf.len() <= 4 * keep {
            return;
        }
        let head_end = if self.omitted > 0 {
            self.cut_at
        } else {
            floor_char(&self.buf, keep)
        };
        let tail_start = floor_char(&self.buf, self.buf.len() - keep).max(head_end);
        let dropped = tail_start - head_end;
        self.buf.replace_range(head_end..tail_start, "");
        self.omitted += dropped;
        self.cut_at = head_end;
        self.marks.retain_mut(|m| {
            if m.offset >= tail_start {
                m.offset -= dropped;
                true
            } else {
                m.offset < head_end
            }
        });
    }

    fn prompt(&mut self, kind: PromptKind) {
        // Readline on a dumb terminal redraws its prompt (`$ `, blanks, `\r`, prompt
        // again). Nothing but that prompt and blanks since the last one, on the same
        // line, is a redraw: it replaces the last prompt and does not count again.
        if let Some(since) = self.marks.last().and_then(|last| self.since(last)) {
            if !since.contains('\n') && matches!(since.trim(), "" | "$" | ">") {
                if let Some(last) = self.marks.last_mut() {
                    last.kind = kind;
                    self.buf.truncate(last.offset);
                }
                self.line.clear();
                self.col = 0;
                return;
            }
        }
        // A prompt starts a new segment: what was on the line before stays as it is.
        self.commit_line(false);
        self.marks.push(Mark {
            offset: self.buf.len(),
            kind,
            stale: false,
        });
        self.prompts += 1;
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl vte::Perform for Screen {
    fn print(&mut self, c: char) {
        self.put(c);
    }

    fn execute(&mut self, byte: u8) {
        match byte {
            b'\n' => self.commit_line(true),
            b'\r' => self.col = 0,
            // From past the last column, the cursor is on the last column.
            b'\x08' => self.col = self.col.min(self.width - 1).saturating_sub(1),
            b'\t' => self.put('\t'),
            _ => {} // BEL and other C0 controls print nothing.
        }
    }

    fn csi_dispatch(
        &mut self,
        params: &vte::Params,
        _intermediates: &[u8],
        _ignore: bool,
        action: char,
    ) {
        let first = params
            .iter()
            .next()
            .and_then(|p| p.first().copied())
            .unwrap_or(0);
        // Cursor moves stop at the edges of the terminal, as on a real one; from past the
        // last column (a wrap pending), the cursor is on the last column.
        let last_col = self.width - 1;
        let n = usize::from(first.max(1));
        match action {
            // Erase in line: 0 = to the right of the cursor, 2 = whole line.
            'K' if first == 0 => self.line.truncate(self.col),
            'K' if first == 2 => self.line.clear(),
            // Cursor back / forward, as readline uses when redrawing. Moving forward past
            // the end of the line shows blanks there.
            'D' => self.col = self.col.min(last_col).saturating_sub(n),
            'C' => {
                self.col = self.col.min(last_col).saturating_add(n).min(last_col);
                if self.line.len() < self.col {
                    self.line.resize(self.col, ' ');
                }
            }
            'G' => self.col = (n - 1).min(last_col),
            _ => {}
        }
    }

    fn osc_dispatch(&mut self, params: &[&[u8]], _bell_terminated: bool) {
        if !(4..=5).contains(&params.len())
            || params[0] != OSC_ID.as_bytes()
            || params[1] != b"kodx"
        {
            return;
        }
        if let Some(pid) = params.get(4).and_then(|p| std::str::from_utf8(p).ok()) {
            if let Ok(pid) = pid.trim().parse() {
                self.shell_pid = Some(pid);
            }
        }
        // No nonce (`clean`) matches no prompt.
        if self.nonce.is_empty() || params[2] != self.nonce.as_bytes() {
            return;
        }
        let status = String::from_utf8_lossy(params[3]);
        let kind = if status == "c" {
            PromptKind::Continuation
        } else {
            PromptKind::Command {
                exit: status.trim().parse().ok(),
            }
        };
        self.prompt(kind);
    }
}

/// Cuts `text` to at most about `cap` bytes by removing its middle, saying how much was
/// left out; returns the text and the number of bytes left out. `pre_omitted` bytes were
/// already dropped by the decoder at `pre_cut_at`.
pub fn cap_middle(
    text: &str,
    pre_omitted: usize,
    pre_cut_at: usize,
    cap: usize,
) -> (String, usize) {
    let total = text.len() + pre_omitted;
    if total <= cap {
        return (text.to_string(), 0);
    }
    let half = cap / 2;
    // Prefer cutting at line boundaries, but never keep more than `half` on either side.
    let mut head_end = floor_char(
        text,
        half.min(if pre_omitted > 0 { pre_cut_at } else { half }),
    );
    if let Some(nl) = text[..head_end].rfind('\n') {
        if nl + 1 >= head_end / 2 {
            head_end = nl + 1;
        }
    }
    let mut tail_start = floor_char(text, text.len().saturating_sub(half)).max(head_end);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    if let Some(nl) = text[tail_start..].find('\n') {
        let candidate = tail_start + nl + 1;
        if candidate < text.len() && text.len() - candidate >= (text.len() - tail_start) / 2 {
            tail_start = candidate;
        }
    }
    let omitted = total - head_end - (text.len() - tail_start);
    let mut out = String::with_capacity(cap + 64);
    out.push_str(&text[..head_end]);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "[... {} bytes of output omitted ...]",
        group_thousands(omitted)
    );
    out.push_str(&text[tail_start..]);
    (out, omitted)
}

pub fn group_thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Keystrokes for a model's `chars`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keystrokes {
    pub bytes: Vec<u8>,
    /// Newlines in `bytes`: how many lines the shell will read.
    pub lines: usize,
    /// True when the input is only control characters (e.g. Ctrl-C): no newline is added.
    pub control_only: bool,
}

/// Turns the model's `chars` into the bytes to type (SPEC §6).
///
/// Control characters may be given as themselves or, at the start of `chars`, as the
/// escapes `\x03` (Ctrl-C), `\x04` (Ctrl-D), `\x1b` (Esc), or any `\xNN` for a C0 control
/// byte or DEL. Escapes later in the text are typed literally, so that
/// `printf '\x1b[1m'` reaches the shell as written. A newline is added unless `chars` is
/// empty, already ends with one, or is only control characters.
pub fn keystrokes(chars: &str) -> Keystrokes {
    let mut bytes = Vec::with_capacity(chars.len() + 1);
    let mut rest = chars;
    while let Some(b) = leading_control_escape(rest) {
        bytes.push(b);
        rest = &rest[4..];
    }
    bytes.extend_from_slice(rest.as_bytes());
    let control_only = !bytes.is_empty()
        && bytes
            .iter()
            .all(|&b| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f);
    if !bytes.is_empty() && !control_only && bytes.last() != Some(&b'\n') {
        bytes.push(b'\n');
    }
    let lines = bytes.iter().filter(|&&b| b == b'\n').count();
    Keystrokes {
        bytes,
        lines,
        control_only,
    }
}

fn leading_control_escape(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("\\x")?.get(..2)?;
    let b = u8::from_str_radix(hex, 16).ok()?;
    (b < 0x20 || b == 0x7f).then_some(b)
}

/// Strips escape sequences and applies `\r`/`\b` to a complete piece of output. Of a long
/// one, keeps the first and the last 32 KiB with a note of how much was left out between.
pub fn clean(bytes: &[u8]) -> String {
    let mut d = Decoder::new("", CLEAN_KEEP);
    d.feed(bytes);
    d.take_text(2 * CLEAN_KEEP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(nonce: &str, status: &str) -> String {
        format!("\x1b]7337;kodx;{nonce};{status};42\x07$ ")
    }

    #[test]
    fn strips_colors_cursor_moves_and_titles() {
        let raw = b"\x1b[1;31mred\x1b[0m plain \x1b]0;title\x07end\x1b[?2004h\r\n";
        assert_eq!(clean(raw), "red plain end\n");
    }

    #[test]
    fn carriage_return_overwrites_like_a_terminal() {
        assert_eq!(clean(b" 10%\r 20%\r100%\n"), "100%\n");
        assert_eq!(clean(b"line\r\nnext\r\n"), "line\nnext\n");
        assert_eq!(clean(b"abc\x08\x08X\n"), "aXc\n");
        assert_eq!(clean(b"abcdef\r\x1b[Kxy\n"), "xy\n");
    }

    #[test]
    fn invalid_utf8_does_not_break_decoding() {
        assert_eq!(clean(b"a\xffb\n"), "a\u{fffd}b\n");
    }

    #[test]
    fn sentinel_split_across_chunks_is_found() {
        let mut d = Decoder::new("n1", 1024);
        let all = format!("hello\r\n{}", prompt("n1", "3"));
        let bytes = all.as_bytes();
        for chunk in bytes.chunks(3) {
            d.feed(chunk);
        }
        assert_eq!(d.prompts(), 1);
        assert_eq!(d.at_prompt(), Some(PromptKind::Command { exit: Some(3) }));
        assert_eq!(d.shell_pid(), Some(42));
        let (p, k) = d.take();
        assert_eq!(p.text, "hello\n");
        assert_eq!(k, Some(PromptKind::Command { exit: Some(3) }));
        assert!(d.is_empty());
        assert_eq!(d.prompts(), 0);
    }

    #[test]
    fn readline_prompt_redraw_counts_once() {
        let mut d = Decoder::new("n", 1024);
        let p = prompt("n", "0");
        d.feed(format!("echo hi\r\nhi\r\n{p}{}\r{p}", " ".repeat(300)).as_bytes());
        assert_eq!(d.prompts(), 1);
        assert_eq!(d.at_prompt(), Some(PromptKind::Command { exit: Some(0) }));
        assert_eq!(d.take().0.text, "echo hi\nhi\n");
        // A redraw after the take is the same prompt: not new, not "done".
        d.feed(format!("{}\r{p}", " ".repeat(300)).as_bytes());
        assert_eq!(d.prompts(), 0);
        assert_eq!(d.at_prompt(), None);
        assert_eq!(
            d.idle_at_prompt(),
            Some(PromptKind::Command { exit: Some(0) })
        );
        d.feed(b"ls\r\n");
        assert_eq!(d.idle_at_prompt(), None);
        assert_eq!(d.take().0.text, "ls\n");
        // An empty command line is a new prompt, not a redraw.
        d.feed(format!("{p}\r\n{p}").as_bytes());
        assert_eq!(d.prompts(), 2);
    }

    #[test]
    fn redraw_split_across_reads_leaves_no_stray_prompt() {
        // As traced in a benchmark: the redraw's blanks, `\r` and prompt arrive after
        // the take that returned the command's output.
        let mut d = Decoder::new("n", 4096);
        let p = prompt("n", "0");
        d.feed(format!("echo hi\r\nhi\r\n{p}{}", " ".repeat(990)).as_bytes());
        assert_eq!(d.at_prompt(), Some(PromptKind::Command { exit: Some(0) }));
        assert_eq!(d.take().0.text, "echo hi\nhi\n");
        d.feed(format!("{}\r", " ".repeat(8)).as_bytes());
        d.feed(p.as_bytes());
        d.feed(format!("echo x\r\nx\r\n{p}").as_bytes());
        let (pending, kind) = d.take();
        assert_eq!(pending.text, "echo x\nx\n");
        assert_eq!(kind, Some(PromptKind::Command { exit: Some(0) }));
    }

    #[test]
    fn other_nonce_or_plain_text_is_not_a_prompt() {
        let mut d = Decoder::new("mine", 1024);
        d.feed(prompt("theirs", "0").as_bytes());
        d.feed(b"]7337;kodx;mine;0 $ ");
        assert_eq!(d.prompts(), 0);
        assert_eq!(d.at_prompt(), None);
    }

    #[test]
    fn output_after_the_prompt_means_not_at_prompt() {
        let mut d = Decoder::new("n", 1024);
        d.feed(prompt("n", "0").as_bytes());
        d.feed(b"sleep 5\r\n");
        assert_eq!(d.at_prompt(), None);
        assert_eq!(d.prompts(), 1);
    }

    #[test]
    fn continuation_prompts_count_but_are_not_the_end() {
        let mut d = Decoder::new("n", 1024);
        d.feed(b"cat <<EOF\r\n\x1b]7337;kodx;n;c\x07> ");
        assert_eq!(d.prompts(), 1);
        assert_eq!(d.at_prompt(), None);
        assert_eq!(d.last_line(), "> ");
    }

    #[test]
    fn unexpanded_status_is_unknown() {
        let mut d = Decoder::new("n", 1024);
        d.feed(prompt("n", "$?").as_bytes());
        assert_eq!(d.at_prompt(), Some(PromptKind::Command { exit: None }));
    }

    #[test]
    fn partial_line_without_newline_is_kept() {
        let mut d = Decoder::new("n", 1024);
        d.feed(b"Python 3.11\r\n>>> ");
        assert_eq!(d.last_line(), ">>> ");
        let (p, k) = d.take();
        assert_eq!(p.text, "Python 3.11\n>>> ");
        assert_eq!(k, None);
    }

    #[test]
    fn memory_is_bounded_and_the_cut_is_counted() {
        let mut d = Decoder::new("n", 100);
        for i in 0..10_000 {
            d.feed(format!("line {i}\n").as_bytes());
        }
        d.feed(prompt("n", "0").as_bytes());
        assert!(d.screen.buf.len() <= 4 * 100 + 64, "{}", d.screen.buf.len());
        assert_eq!(d.at_prompt(), Some(PromptKind::Command { exit: Some(0) }));
        let (p, _) = d.take();
        assert!(p.text.starts_with("line 0\n"));
        assert!(p.text.ends_with("line 9999\n"));
        let total: usize = (0..10_000).map(|i| format!("line {i}\n").len()).sum();
        assert_eq!(p.text.len() + p.omitted, total);
        let (shown, n) = cap_middle(&p.text, p.omitted, p.cut_at, 200);
        assert_eq!(
            n + shown.len() - shown.lines().find(|l| l.starts_with("[...")).unwrap().len() - 1,
            total
        );
        assert!(shown.contains("bytes of output omitted"), "{shown}");
        assert!(shown.starts_with("line 0\n"));
        assert!(shown.ends_with("line 9999\n"));
    }

    #[test]
    fn middle_cut_reports_exact_count() {
        let text: String = (0..1000).map(|i| format!("{i:04}\n")).collect();
        let (out, omitted) = cap_middle(&text, 0, 0, 100);
        let kept: usize = out
            .lines()
            .filter(|l| !l.starts_with("[..."))
            .map(|l| l.len() + 1)
            .sum();
        let note = out.lines().find(|l| l.starts_with("[...")).unwrap();
        let n: usize = note
            .trim_start_matches("[... ")
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap();
        assert_eq!(kept + n, text.len());
        assert_eq!(n, omitted);
        assert!(out.len() < 200, "{}", out.len());
        assert_eq!(cap_middle("short", 0, 0, 100), ("short".to_string(), 0));
    }

    #[test]
    fn middle_cut_respects_char_boundaries() {
        let text = "é".repeat(1000);
        let (out, _) = cap_middle(&text, 0, 0, 101);
        assert!(out.contains("omitted"));
    }

    #[test]
    fn thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(1234567), "1,234,567");
    }

    #[test]
    fn keystrokes_add_newline_and_count_lines() {
        let k = keystrokes("echo hi");
        assert_eq!(k.bytes, b"echo hi\n");
        assert_eq!(k.lines, 1);
        assert!(!k.control_only);
        assert_eq!(keystrokes("a\nb\n").lines, 2);
        assert_eq!(keystrokes("").bytes, b"");
        assert_eq!(keystrokes("").lines, 0);
    }

    #[test]
    fn keystrokes_decode_leading_control_escapes_only() {
        let k = keystrokes("\\x03");
        assert_eq!(k.bytes, vec![3]);
        assert!(k.control_only);
        assert_eq!(k.lines, 0);
        assert_eq!(keystrokes("\u{3}").bytes, vec![3]);
        assert_eq!(keystrokes("\\x04").bytes, vec![4]);
        assert_eq!(keystrokes("\\x1b:wq").bytes, b"\x1b:wq\n");
        assert_eq!(keystrokes("\\x03\\x03").bytes, vec![3, 3]);
        // Printable \x41 is not a control escape; later escapes are typed as written.
        assert_eq!(keystrokes("\\x41").bytes, b"\\x41\n");
        assert_eq!(
            keystrokes("printf '\\x1b[1m'").bytes,
            b"printf '\\x1b[1m'\n"
        );
        assert_eq!(keystrokes("\\x7f").bytes, vec![0x7f]);
        // Incomplete escape stays literal.
        assert_eq!(keystrokes("\\x0").bytes, b"\\x0\n");
    }

    /// Bytes the decoder's own buffers hold (capacity, not length).
    fn footprint(d: &Decoder) -> usize {
        d.screen.buf.capacity()
            + d.screen.line.capacity() * std::mem::size_of::<char>()
            + d.screen.marks.capacity() * std::mem::size_of::<Mark>()
    }

    /// The `N` of the `[... N bytes of output omitted ...]` note in `text`.
    fn noted(text: &str) -> usize {
        let note = text
            .lines()
            .find(|l| l.starts_with("[... "))
            .expect("a note");
        note.trim_start_matches("[... ")
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap()
    }

    #[test]
    fn huge_cursor_moves_stay_within_the_terminal_width() {
        let mut d = Decoder::new("n", 1024);
        for _ in 0..200 {
            d.feed(b"\x1b[2000000000C");
            assert!(d.screen.line.len() <= 1000, "{}", d.screen.line.len());
            assert!(d.screen.col <= 1000, "{}", d.screen.col);
        }
        assert!(footprint(&d) <= 16 * 1024, "{}", footprint(&d));
        // As a 1000-column terminal shows it: the cursor stops at the last column.
        assert_eq!(
            clean(b"\x1b[99999999Cx\n"),
            format!("{}x\n", " ".repeat(999))
        );
        assert_eq!(clean(b"ab\x1b[3Cc\n"), "ab   c\n");
        assert_eq!(clean(b"abcdef\x1b[99999Dx\n"), "xbcdef\n");
        // Past the end of the line, an absolute move does not pad (as before).
        assert_eq!(clean(b"abcdef\x1b[3Gx\x1b[65535G\x1b[Ky\n"), "abxdefy\n");
        // A flood of them, as `cat` of such a file prints it.
        let flood = "\x1b[99999999C".repeat(3000) + "end\n";
        let out = clean(flood.as_bytes());
        assert!(out.len() <= 1100, "{}", out.len());
        assert!(out.ends_with("end\n"), "{out:?}");
    }

    #[test]
    fn a_long_line_wraps_at_the_width_like_a_terminal() {
        let x = "x".repeat(1500);
        // Unchanged text; a carriage return goes back to the start of the last row only.
        assert_eq!(clean(format!("{x}\n").as_bytes()), format!("{x}\n"));
        assert_eq!(
            clean(format!("{x}\rY\n").as_bytes()),
            format!("{}Y{}\n", &x[..1000], &x[..499])
        );
        // A full row wraps only when the next character comes.
        let row = "x".repeat(1000);
        assert_eq!(
            clean(format!("{row}\rY\n").as_bytes()),
            format!("Y{}\n", &row[1..])
        );
        assert_eq!(
            clean(format!("{row}\x08Y\n").as_bytes()),
            format!("{}Yx\n", &row[2..])
        );
        // The prompt after a long line is found, and the line is output.
        let mut d = Decoder::new("n", 1 << 20);
        d.feed(format!("{x}{}", prompt("n", "0")).as_bytes());
        assert_eq!(d.at_prompt(), Some(PromptKind::Command { exit: Some(0) }));
        assert_eq!(d.take().0.text, x);
    }

    #[test]
    fn a_line_without_newline_is_cut_like_many_lines() {
        let keep = 4096;
        let mut d = Decoder::new("n", keep);
        let chunk = [b'a'; 64 * 1024];
        let mut total = 0;
        d.feed(b"start:");
        total += 6;
        for _ in 0..800 {
            d.feed(&chunk);
            total += chunk.len();
            assert!(footprint(&d) <= 16 * keep, "{}", footprint(&d));
        }
        d.feed(b":end");
        total += 4;
        d.feed(prompt("n", "0").as_bytes());
        assert_eq!(d.at_prompt(), Some(PromptKind::Command { exit: Some(0) }));
        assert!(d.last_line().len() <= 5000, "{}", d.last_line().len());
        let (p, k) = d.take();
        assert_eq!(k, Some(PromptKind::Command { exit: Some(0) }));
        assert!(p.text.starts_with("start:aaa"), "{}", &p.text[..20]);
        assert!(
            p.text.ends_with("aaa:end"),
            "{}",
            &p.text[p.text.len() - 20..]
        );
        assert_eq!(p.text.len() + p.omitted, total);
        // The model's cut: head, note, tail; the note's count is exact.
        let (shown, n) = cap_middle(&p.text, p.omitted, p.cut_at, 2000);
        assert_eq!(noted(&shown), n);
        let (head, rest) = shown.split_once("\n[... ").unwrap();
        let tail = rest.split_once(" omitted ...]\n").unwrap().1;
        assert!(head.starts_with("start:") && tail.ends_with(":end"));
        assert_eq!(head.len() + n + tail.len(), total);
        assert!(shown.len() <= 2100, "{}", shown.len());
    }

    #[test]
    fn clean_is_bounded_whatever_it_is_given() {
        let mut big = b"start ".to_vec();
        big.resize(20 << 20, b'x');
        big.extend_from_slice(b" end\n");
        let out = clean(&big);
        assert!(out.len() <= 100_000, "{}", out.len());
        assert!(out.starts_with("start xxx") && out.ends_with("xxx end\n"));
        let (head, rest) = out.split_once("\n[... ").unwrap();
        let tail = rest.split_once(" omitted ...]\n").unwrap().1;
        assert_eq!(head.len() + noted(&out) + tail.len(), big.len());
        // Many lines too.
        let lines: String = (0..200_000).map(|i| format!("line {i}\n")).collect();
        let out = clean(lines.as_bytes());
        assert!(out.len() <= 100_000, "{}", out.len());
        assert!(out.starts_with("line 0\n") && out.ends_with("line 199999\n"));
        // An empty nonce matches no prompt: the text is kept as printed.
        assert_eq!(clean(b"out\n\x1b]7337;kodx;;0;1\x07$ "), "out\n$ ");
    }

    #[test]
    fn an_escape_sequence_without_end_is_held_in_a_fixed_buffer() {
        // An OSC (window title) that never ends: the parser keeps at most a fixed amount.
        struct Longest(usize);
        impl vte::Perform for Longest {
            fn osc_dispatch(&mut self, params: &[&[u8]], _: bool) {
                self.0 = self.0.max(params.iter().map(|p| p.len()).sum());
            }
        }
        let mut parser = vte::Parser::new();
        let mut longest = Longest(0);
        parser.advance(&mut longest, b"\x1b]0;");
        for _ in 0..100 {
            parser.advance(&mut longest, &[b't'; 10_000]);
        }
        parser.advance(&mut longest, b"\x07");
        assert!(longest.0 > 0 && longest.0 <= 4096, "{}", longest.0);
        // And the decoder goes on after it.
        let mut d = Decoder::new("n", 1024);
        d.feed(b"\x1b]0;");
        d.feed(&[b't'; 100_000]);
        d.feed(b"\x07after\n");
        assert_eq!(d.take().0.text, "after\n");
    }
}
