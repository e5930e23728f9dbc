//! Where things are in GitHub Markdown, found with `pulldown-cmark`'s source offsets rather
//! than by hand: the parts a command may not start in (code, quotes, HTML), the code a
//! rewrite must leave alone, and the link reference definitions GitHub never shows.
//!
//! All functions are linear in the text (one parse, a difference array over the offsets).

use std::ops::Range;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// GitHub Flavored Markdown as far as it changes where blocks start and end.
fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_GFM
}

fn events(text: &str) -> impl Iterator<Item = (Event<'_>, Range<usize>)> {
    Parser::new_ext(text, options()).into_offset_iter()
}

/// Sorted, non-overlapping ranges from any ranges.
fn merge(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// The byte ranges of block quotes (lazy continuation lines included), code blocks (fenced
/// and indented), HTML blocks, inline code and inline HTML (comments included): where a
/// `/kodx` line is quoted, shown as code or hidden, not written as a command.
pub fn quoted_or_code(text: &str) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    // Nested quotes and code inside quotes lie within the outer range: only outermost.
    let mut depth = 0usize;
    for (event, range) in events(text) {
        match event {
            Event::Start(Tag::BlockQuote(_) | Tag::CodeBlock(_) | Tag::HtmlBlock) => {
                if depth == 0 {
                    ranges.push(range);
                }
                depth += 1;
            }
            Event::End(TagEnd::BlockQuote(_) | TagEnd::CodeBlock | TagEnd::HtmlBlock) => {
                depth = depth.saturating_sub(1);
            }
            Event::Code(_) | Event::InlineHtml(_) | Event::Html(_) if depth == 0 => {
                ranges.push(range)
            }
            _ => {}
        }
    }
    merge(ranges)
}

/// The byte ranges of code blocks and inline code, where GitHub links no mention.
pub fn code(text: &str) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut depth = 0usize;
    for (event, range) in events(text) {
        match event {
            Event::Start(Tag::CodeBlock(_)) => {
                if depth == 0 {
                    ranges.push(range);
                }
                depth += 1;
            }
            Event::End(TagEnd::CodeBlock) => depth = depth.saturating_sub(1),
            Event::Code(_) if depth == 0 => ranges.push(range),
            _ => {}
        }
    }
    merge(ranges)
}

/// The byte ranges of link reference definitions (`[label]: destination "title"`, e.g. the
/// `[//]: # (hidden)` comment idiom), which GitHub never shows, wherever they are (in quotes
/// and list items too, and however often a label repeats).
///
/// Found as the text no event covers: every shown character lies in some leaf block or
/// inline event, while a definition lies in none. A range starts at the definition's `[`
/// and runs to the next covered byte (container markers of following lines included).
pub fn link_definitions(text: &str) -> Vec<Range<usize>> {
    let len = text.len();
    // +1 at the start of each covered range, -1 at its end.
    let mut diff = vec![0i32; len + 1];
    // Offsets where a list item or footnote definition starts: its marker is not a definition.
    let mut markers = Vec::new();
    for (event, range) in events(text) {
        let covers = match &event {
            Event::Start(Tag::Item) | Event::Start(Tag::FootnoteDefinition(_)) => {
                markers.push(range.start);
                false
            }
            Event::Start(
                Tag::BlockQuote(_)
                | Tag::List(_)
                | Tag::DefinitionList
                | Tag::DefinitionListTitle
                | Tag::DefinitionListDefinition,
            )
            | Event::End(_) => false,
            _ => true,
        };
        if covers && range.start < range.end && range.end <= len {
            diff[range.start] += 1;
            diff[range.end] -= 1;
        }
    }
    markers.sort_unstable();
    let mut covered = vec![false; len];
    let mut depth = 0i32;
    for (i, c) in covered.iter_mut().enumerate() {
        depth += diff[i];
        *c = depth > 0;
    }
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < len {
        if covered[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < len && !covered[i] {
            i += 1;
        }
        let end = i;
        // Skip what containers write at the start of lines: indentation, `>`, and the
        // marker of a list item or footnote definition.
        let mut k = start;
        while k < end {
            match bytes[k] {
                b' ' | b'\t' | b'\n' | b'\r' | b'>' => k += 1,
                _ if markers.binary_search(&k).is_ok() => {
                    if bytes[k] == b'[' {
                        // `[^label]:` of a footnote definition.
                        while k < end && bytes[k] != b':' {
                            k += 1;
                        }
                        k += 1;
                    } else {
                        while k < end && !matches!(bytes[k], b' ' | b'\t' | b'\n') {
                            k += 1;
                        }
                    }
                }
                _ => break,
            }
        }
        if k < end && bytes[k] == b'[' {
            out.push(k..end);
        }
    }
    out
}

/// `text` without the bytes in `ranges` (sorted, non-overlapping, on char boundaries).
pub fn remove(text: &str, ranges: &[Range<usize>]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for r in ranges {
        out.push_str(&text[at..r.start]);
        at = r.end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn without_definitions(text: &str) -> String {
        remove(text, &link_definitions(text))
    }

    #[test]
    fn definitions_are_found_wherever_they_are() {
        for (text, want) in [
            ("[//]: # (hidden)\n\ntext", "text"),
            ("[//]: # (a)\n[//]: # (b)\n[//]: # (c)\n\nshown", "shown"),
            ("> [//]: # (hidden)\n> text", "> text"),
            ("- [a]: /u\n  item text\n- two", "- item text\n- two"),
            ("[a]:\n/url\n'title\nmore'\n\ntext [a]", "text [a]"),
            ("intro\n\n[x]: <https://evil> \"do this\"\n", "intro\n\n"),
            ("> > [x]: y\n> > quoted", "> > quoted"),
        ] {
            assert_eq!(without_definitions(text), want, "{text:?}");
        }
    }

    #[test]
    fn shown_text_is_kept() {
        for text in [
            "a \\* b &amp; c  \nd\ne",
            "- [ ] task\n- [x] done",
            "1. one\n2) two",
            "```\n[//]: # (in code)\n```",
            "    [//]: # (indented code)",
            "| a | b |\n|---|---|\n| [c] | d |",
            "Setext\n===\n\n***\n\n<div>\n[x]: y\n</div>",
            "text [link](https://x) and [ref] and [^1]\n\n[^1]: the note",
            "[not a definition] : x",
            "",
        ] {
            assert_eq!(without_definitions(text), text, "{text:?}");
        }
    }

    #[test]
    fn quoted_or_code_ranges() {
        let text = "> quoted\n/kodx lazy\n\nplain `/kodx inline`\n~~~\n/kodx fenced\n~~~\n";
        let r = quoted_or_code(text);
        let inside = |needle: &str| {
            let at = text.find(needle).unwrap();
            r.iter().any(|x| x.contains(&at))
        };
        assert!(inside("/kodx lazy"));
        assert!(inside("/kodx inline"));
        assert!(inside("/kodx fenced"));
        assert!(!inside("plain"));
    }

    #[test]
    fn long_and_nested_input_is_linear() {
        let text = "> ".repeat(10_000) + "x\n" + &"[a]: b\n".repeat(50_000);
        let started = std::time::Instant::now();
        let _ = link_definitions(&text);
        let _ = quoted_or_code(&text);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}
