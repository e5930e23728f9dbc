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

/// An image written in Markdown (`![alt](url)`) or HTML (`<img src=… alt=…>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    pub url: String,
    pub alt: String,
}

/// The images of `text` in order, outside code (as GitHub shows them; a reference
/// `![alt][ref]` whose definition was removed is not one), at most `max` of them; the
/// second value is how many more there are. Alt text is kept as written: the caller
/// cleans it.
pub fn images(text: &str, max: usize) -> (Vec<ImageRef>, usize) {
    let mut found = Vec::new();
    let mut more = 0;
    let mut push = |r: ImageRef| {
        if found.len() < max {
            found.push(r);
        } else {
            more += 1;
        }
    };
    // Inside an image: its URL and the alt text so far (nested images add to it).
    let mut open: Option<(String, String)> = None;
    let mut depth = 0usize;
    let mut html = String::new();
    for (event, _) in events(text) {
        match event {
            Event::Start(Tag::Image { dest_url, .. }) => {
                if depth == 0 {
                    open = Some((dest_url.to_string(), String::new()));
                }
                depth += 1;
            }
            Event::End(TagEnd::Image) => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    if let Some((url, alt)) = open.take() {
                        push(ImageRef { url, alt });
                    }
                }
            }
            Event::Text(t) | Event::Code(t) if depth > 0 => {
                if let Some((_, alt)) = open.as_mut() {
                    if alt.len() < MAX_ALT_BYTES {
                        alt.push_str(&t);
                    }
                }
            }
            Event::Start(Tag::HtmlBlock) => html.clear(),
            // An HTML block comes a line at a time: its tags are read once it ends.
            Event::Html(t) if html.len() < MAX_HTML_BYTES => html.push_str(&t),
            Event::End(TagEnd::HtmlBlock) => {
                html_images(&html).into_iter().for_each(&mut push);
                html.clear();
            }
            Event::InlineHtml(t) => html_images(&t).into_iter().for_each(&mut push),
            _ => {}
        }
    }
    (found, more)
}

/// The longest alt text kept, in bytes.
const MAX_ALT_BYTES: usize = 1000;
/// The most of one HTML block read for images.
const MAX_HTML_BYTES: usize = 256 << 10;

/// The `<img>` tags of a piece of HTML with a `src`: one pass, each tag's attributes read
/// by a small scanner (names, `=`, quoted or bare values).
fn html_images(html: &str) -> Vec<ImageRef> {
    let lower = html.to_ascii_lowercase();
    let bytes = html.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = lower[at..].find("<img") {
        let mut i = at + found + 4;
        at = i;
        if !bytes
            .get(i)
            .is_some_and(|b| b.is_ascii_whitespace() || *b == b'/' || *b == b'>')
        {
            continue;
        }
        let (mut src, mut alt) = (None, String::new());
        loop {
            while bytes
                .get(i)
                .is_some_and(|b| b.is_ascii_whitespace() || *b == b'/')
            {
                i += 1;
            }
            match bytes.get(i) {
                None | Some(b'>') => break,
                _ => {}
            }
            let name_start = i;
            while bytes
                .get(i)
                .is_some_and(|b| !b.is_ascii_whitespace() && !matches!(b, b'=' | b'>' | b'/'))
            {
                i += 1;
            }
            let name = &lower[name_start..i];
            while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
                i += 1;
            }
            let mut value = "";
            if bytes.get(i) == Some(&b'=') {
                i += 1;
                while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
                    i += 1;
                }
                let (start, end, next) = match bytes.get(i) {
                    Some(q @ (b'"' | b'\'')) => {
                        let close = html[i + 1..]
                            .find(*q as char)
                            .map_or(html.len(), |e| i + 1 + e);
                        (i + 1, close, (close + 1).min(html.len()))
                    }
                    _ => {
                        let mut e = i;
                        while bytes
                            .get(e)
                            .is_some_and(|b| !b.is_ascii_whitespace() && *b != b'>')
                        {
                            e += 1;
                        }
                        (i, e, e)
                    }
                };
                value = &html[start..end];
                i = next;
            }
            match name {
                "src" if src.is_none() => src = Some(entities(value.trim())),
                "alt" => alt = entities(value),
                _ => {}
            }
            if name_start == i {
                i += 1;
            }
        }
        at = at.max(i);
        if let Some(url) = src.filter(|u| !u.is_empty()) {
            out.push(ImageRef { url, alt });
        }
    }
    out
}

/// The few character references an attribute of an issue's HTML holds.
fn entities(value: &str) -> String {
    value
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_found_in_markdown_and_html_outside_code() {
        let text = "Broken:\n\n![the *error* dialog](https://github.com/user-attachments/assets/a1)\n\n\
            <img width=\"300\" alt='second &amp; last' src=\"https://x.githubusercontent.com/b.png?a=1&amp;b=2\">\n\n\
            inline <IMG SRC=https://example.com/c.gif> here\n\n\
            ```\n![in code](https://github.com/user-attachments/assets/no)\n```\n\n\
            `<img src=\"https://github.com/no.png\">`\n\n\
            <div>\n<img\n  src=\"https://github.com/user-attachments/assets/d4\"\n  alt=\"multi\nline\"\n/>\n</div>\n\n\
            <imgx src=\"https://github.com/not-a-tag.png\"> <img alt=\"no src\">";
        let (found, more) = images(text, 10);
        let shown: Vec<String> = found
            .iter()
            .map(|r| format!("{} | {}", r.url, r.alt))
            .collect();
        insta::assert_snapshot!(shown.join("\n"), @"
        https://github.com/user-attachments/assets/a1 | the error dialog
        https://x.githubusercontent.com/b.png?a=1&b=2 | second & last
        https://example.com/c.gif | 
        https://github.com/user-attachments/assets/d4 | multi
        line
        ");
        assert_eq!(more, 0);
        let (first, more) = images(text, 2);
        assert_eq!((first.len(), more), (2, 2));
    }

    #[test]
    fn unclosed_tags_stay_in_bounds() {
        for text in [
            "<img src=\"https://github.com/a",
            "<img src=",
            "<img",
            "<img alt='x' src",
            "x <img/src=a>",
        ] {
            let _ = images(text, 5);
            let _ = html_images(text);
        }
        assert_eq!(html_images("x <img/src=a>")[0].url, "a");
    }

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
