//! The safe and bounded forms of text in a comment: the hidden metadata line that ties a
//! status comment to its run (which text from outside can never forge or break out of),
//! HTML escapes, long text cut in the middle to fit a GitHub comment, and the numbers and
//! durations the texts show.
//!
//! Pure functions only: no I/O, no clock.

use std::time::Duration;

use serde_json::Value;

use crate::neutral::METADATA_OPEN;

/// GitHub rejects comment bodies longer than this many characters.
pub const GITHUB_COMMENT_LIMIT: usize = 65_536;

/// What the rendered body is kept under (in bytes, which are never fewer than characters),
/// leaving room for slack.
pub const BODY_LIMIT: usize = GITHUB_COMMENT_LIMIT - 1_536;

/// The version written into the metadata line.
pub const METADATA_VERSION: u64 = 1;

/// The end of the metadata line.
pub const METADATA_CLOSE: &str = " -->";
/// The longest run id `find_run_id` accepts.
const MAX_RUN_ID_LEN: usize = 128;

/// The hidden first line of every status comment: `<!-- kodx:{"run":"<id>","v":1} -->`.
///
/// `<` and `>` are written as `\u003c` / `\u003e`, which is still valid JSON and means the
/// line can never contain `-->` (or any other end of an HTML comment) before its own end.
pub fn metadata(run_id: &str) -> String {
    let json = serde_json::json!({ "run": run_id, "v": METADATA_VERSION }).to_string();
    let json = json.replace('<', "\\u003c").replace('>', "\\u003e");
    format!("{METADATA_OPEN}{json}{METADATA_CLOSE}")
}

/// The run id from the first well-formed metadata line of `body`.
///
/// A line counts only when it starts at the beginning of a line with `<!-- kodx:`, ends with
/// ` -->`, holds a JSON object with `"v": 1` and a non-empty string `"run"` (at most 128
/// characters, no control characters), and has no `>` inside the JSON text (what
/// `metadata` writes never has one). Anything else is ignored.
pub fn find_run_id(body: &str) -> Option<String> {
    body.lines().find_map(parse_metadata_line)
}

fn parse_metadata_line(line: &str) -> Option<String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let rest = line.strip_prefix(METADATA_OPEN)?;
    let json = rest.strip_suffix(METADATA_CLOSE)?;
    if json.contains('>') || json.contains('<') {
        return None;
    }
    let value: Value = serde_json::from_str(json).ok()?;
    let obj = value.as_object()?;
    if obj.get("v")?.as_u64()? != METADATA_VERSION {
        return None;
    }
    let run = obj.get("run")?.as_str()?;
    if run.is_empty() || run.chars().count() > MAX_RUN_ID_LEN || run.chars().any(char::is_control) {
        return None;
    }
    Some(run.to_string())
}

/// `0.4s`, `6.8s` below ten seconds (one decimal, rounded down), else as
/// [`format_duration`]: `42s`, `1m 12s`.
pub fn format_seconds(d: Duration) -> String {
    if d < Duration::from_secs(10) {
        format!("{}.{}s", d.as_secs(), d.subsec_millis() / 100)
    } else {
        format_duration(d)
    }
}

/// A run's wall time with the agent's share beside it: `6.8s (agent 0.2s)`. The wall time
/// is shown at least as long as the agent's share (two clocks: a stored timestamp and the
/// agent's own).
pub fn format_wall(wall: Duration, agent: Duration) -> String {
    format!(
        "{} (agent {})",
        format_seconds(wall.max(agent)),
        format_seconds(agent)
    )
}

/// `42s`, `1m 12s`, `2h 3m 4s` (whole seconds, rounded down).
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}h {m}m {s}s")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `text` cut to at most `max` characters (plus the note), the middle left out.
pub fn cut_middle(text: &str, max: usize) -> String {
    let chars = text.chars().count();
    if chars <= max {
        return text.to_string();
    }
    let head_end = text.char_indices().nth(max / 2).map_or(text.len(), |p| p.0);
    let tail_start = text
        .char_indices()
        .nth(chars - max / 2)
        .map_or(text.len(), |p| p.0);
    join_cut(text, head_end, tail_start)
}

/// `text` cut to at most `max` bytes including the note, the middle left out (on line
/// boundaries when one is near).
pub fn cut_middle_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    // Room for the note, whose numbers have at most 20 digits.
    let keep = max.saturating_sub(cut_note(usize::MAX).len());
    let mut head_end = keep / 2;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - (keep - keep / 2);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    const NEAR: usize = 2_000;
    if let Some(nl) = text[..head_end].rfind('\n') {
        if head_end - nl <= NEAR {
            head_end = nl + 1;
        }
    }
    if let Some(nl) = text[tail_start..].find('\n') {
        if nl < NEAR && tail_start + nl + 1 < text.len() {
            tail_start += nl + 1;
        }
    }
    join_cut(text, head_end, tail_start)
}

pub fn join_cut(text: &str, head_end: usize, tail_start: usize) -> String {
    let left_out = text[head_end..tail_start].chars().count();
    let head = &text[..head_end];
    let sep = if head.is_empty() || head.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    format!("{head}{sep}{}{}", cut_note(left_out), &text[tail_start..])
}

pub fn cut_note(left_out: usize) -> String {
    format!("\n*[… {left_out} characters cut from the middle to fit a GitHub comment …]*\n\n")
}
