//! Reading one line: escapes stripped, a place (`path:line[:col]`) found, a level word or
//! a lint code told, a path made relative to the repository, a text bounded.

use super::{Level, MAX_PATH_BYTES};

/// The start of `s`, at most `max` bytes, on a character boundary.
pub(super) use crate::ci_log::cut_str as head;

/// `line` without escape sequences (CSI such as colours, OSC such as hyperlinks and
/// titles, two-character escapes) or control characters but tabs, into `out`. Text after a
/// carriage return replaces what came before it, as on a terminal.
pub(super) fn strip_escapes(line: &str, out: &mut String) {
    out.clear();
    let mut chars = line.chars().peekable();
    let mut returned = false;
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => match chars.next() {
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('\x40'..='\x7e').contains(&c) {
                            break;
                        }
                    }
                }
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    while let Some(c) = chars.next() {
                        if c == '\x07' {
                            break;
                        }
                        if c == '\x1b' {
                            chars.next_if_eq(&'\\');
                            break;
                        }
                    }
                }
                Some('\x20'..='\x2f') => {
                    chars.next();
                }
                _ => {}
            },
            '\r' => returned = true,
            c if c.is_control() && c != '\t' => {}
            c => {
                if returned {
                    out.clear();
                    returned = false;
                }
                out.push(c);
            }
        }
    }
}

/// A place as a tool printed it: `path:line[:col]` and what follows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Place<'a> {
    pub(super) path: &'a str,
    pub(super) line: u32,
    pub(super) column: Option<u32>,
    pub(super) rest: &'a str,
}

/// `path:line[:col][: rest]` at the start of `text` (no whitespace in the path, and not
/// only digits: `12:30:45: …` is a time).
pub(super) fn place(text: &str) -> Option<Place<'_>> {
    let colon = text.find(':')?;
    let path = &text[..colon];
    if path.is_empty()
        || path.contains(char::is_whitespace)
        || path.ends_with('/')
        || path.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let (line, after) = number(&text[colon + 1..])?;
    let (column, after) = match after.strip_prefix(':').map(number) {
        Some(Some((column, after))) => (Some(column), after),
        _ => (None, after),
    };
    let rest = match after.strip_prefix(':') {
        Some(rest) => rest.trim(),
        None if after.is_empty() => "",
        None => return None,
    };
    Some(Place {
        path,
        line,
        column,
        rest,
    })
}

/// A decimal number at the start of `text` (at most 9 digits) and what follows it.
pub(super) fn number(text: &str) -> Option<(u32, &str)> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 9 {
        return None;
    }
    Some((text[..digits].parse().ok()?, &text[digits..]))
}

/// `error`, `warning`, `note` … and the rest after its `:` (and an `[E0308]`-like code,
/// which becomes the title), at the start of `text`.
pub(super) fn level_word(text: &str) -> Option<(Level, Option<&str>, &str)> {
    const WORDS: [(&str, Level); 14] = [
        ("fatal error", Level::Failure),
        ("error", Level::Failure),
        ("fatal", Level::Failure),
        ("critical", Level::Failure),
        ("warning", Level::Warning),
        ("warn", Level::Warning),
        ("note", Level::Notice),
        ("notice", Level::Notice),
        ("info", Level::Notice),
        ("information", Level::Notice),
        ("help", Level::Notice),
        ("hint", Level::Notice),
        ("remark", Level::Notice),
        ("style", Level::Notice),
    ];
    let (word, level) = WORDS.iter().find(|(w, _)| {
        text.get(..w.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(w))
            && matches!(text.as_bytes().get(w.len()), Some(b':' | b'['))
    })?;
    let mut after = &text[word.len()..];
    let mut code = None;
    if let Some(inner) = after.strip_prefix('[') {
        let end = inner.find(']')?;
        code = Some(&inner[..end]).filter(|c| is_code_like(c));
        after = &inner[end + 1..];
    }
    let message = after.strip_prefix(':')?;
    if !(message.is_empty() || message.starts_with(' ')) {
        return None;
    }
    Some((*level, code, message.trim()))
}

/// A lint code as flake8 and ruff print it: 1–6 capital letters, then 1–4 digits (`F401`,
/// `W291`, `PLR0913`).
pub(super) fn lint_code(word: &str) -> bool {
    let letters = word.bytes().take_while(u8::is_ascii_uppercase).count();
    let digits = word.len() - letters;
    (1..=6).contains(&letters)
        && (1..=4).contains(&digits)
        && word[letters..].bytes().all(|b| b.is_ascii_digit())
}

/// Flake8 and ruff: `W…` codes are warnings, the rest failures.
pub(super) fn lint_level(code: &str) -> Level {
    if code.starts_with('W') {
        Level::Warning
    } else {
        Level::Failure
    }
}

/// Something fit to be a title: short, one word.
pub(super) fn is_code_like(text: &str) -> bool {
    !text.is_empty() && text.len() <= 64 && !text.contains(char::is_whitespace)
}

/// A trailing ` [code]` of `message` (`[-Wunused-variable]`, `[SC2086]`, `[return-value]`):
/// the message without it, and the code.
pub(super) fn trailing_code(message: &str) -> (&str, Option<&str>) {
    let Some(inner) = message.strip_suffix(']') else {
        return (message, None);
    };
    match inner.rfind(" [") {
        Some(at) if is_code_like(&inner[at + 2..]) => {
            (inner[..at].trim_end(), Some(&inner[at + 2..]))
        }
        _ => (message, None),
    }
}

/// An exception's name as pytest prints it after `path:line: ` (`AssertionError`,
/// `json.decoder.JSONDecodeError`).
pub(super) fn exception_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 200
        && text.split('.').all(|part| {
            part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `path` relative to the repository in `workdir`, if it is inside it.
pub(super) fn repo_path(path: &str, workdir: &str) -> Option<String> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return None;
    }
    let relative = if path.starts_with('/') {
        path.strip_prefix(workdir)?.strip_prefix('/')?
    } else {
        path
    };
    let mut parts = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p if p.starts_with('<') || p.starts_with('~') || p.contains('\\') => return None,
            p => parts.push(p),
        }
    }
    if parts.is_empty() || parts == ["-"] {
        return None;
    }
    Some(parts.join("/"))
}

/// `text` trimmed and cut to `max` characters (with `…` when cut).
pub(super) fn bounded(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.char_indices().nth(max).is_none() {
        return text.to_string();
    }
    let end = text
        .char_indices()
        .nth(max - 1)
        .map_or(text.len(), |(i, _)| i);
    let mut out = text[..end].trim_end().to_string();
    out.push('…');
    out
}
