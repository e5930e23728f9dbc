//! The one neutralizer (docs/security.md): every string kodx did not write — the model's
//! words and its `kodx-threads` ids and statuses, names and paths from the repository, CI's
//! check names and errors, a user's branch or word, GitHub's and git's errors — goes
//! through it before kodx posts it (a comment, a pull request's body, a commit message, a
//! Check Run, a review reply). Each way in first redacts token shapes ([`crate::redact`])
//! and breaks kodx's metadata opener ([`METADATA_OPEN`]), then makes the text unable to act
//! where it is put:
//!
//! - [`code`]: one line in an inline code span — an id, a status, a name, a path, a
//!   branch. Line breaks are collapsed and the span's fence is longer than any backtick
//!   run inside, so nothing leaves the span, and GitHub links and notifies nothing in code.
//! - [`words`]: one line of plain text inside kodx's own sentence, heading or table cell —
//!   an error. Line breaks are collapsed, every Markdown character that could open a link,
//!   an image, HTML, a code span, emphasis or a cell is escaped, and a zero-width space
//!   breaks mentions, issue references, e-mail addresses and every URL GitHub would link
//!   by itself (`https://`, `www.`).
//! - [`block`]: any text in a fenced code block whose fence no line inside can close — a
//!   failure's output.
//! - [`markdown`]: Markdown someone else wrote, shown as Markdown — an answer, a summary,
//!   a reply, the echoed request. Mentions notify nobody, closing keywords close nothing,
//!   HTML comments are removed, HTML tags and images are shown as text; code and the
//!   author's links stay (the text is shown as the model's, not kodx's).
//! - [`commit`]: the same for a commit message, which GitHub does not render as Markdown.
//!
//! Pure functions, linear in the text.

use crate::redact::redact;

/// The opener of kodx's hidden metadata line (`<!-- kodx:{…} -->`): outside text that holds
/// it is written `<!-- kodx :`, so it never passes for the line of kodx's own comment.
pub const METADATA_OPEN: &str = "<!-- kodx:";

/// What breaks a mention, a reference or a link: rendered as nothing, it keeps GitHub from
/// seeing `@name`, `#12` or `https://` where the text has them.
pub const BREAK: char = '\u{200B}';

/// The most characters of one [`code`] span.
const MAX_CODE_CHARS: usize = 200;
/// The most characters of one [`words`] line.
const MAX_WORDS_CHARS: usize = 1_000;

/// The words after which GitHub closes the issue a pull request or commit names.
const CLOSING_KEYWORDS: [&str; 9] = [
    "close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved",
];

/// Redacted, the metadata opener broken: what every way in starts from.
fn clean(text: &str) -> String {
    redact(text).replace(METADATA_OPEN, "<!-- kodx :")
}

// ---------------------------------------------------------------------------------------
// One line: code spans and words
// ---------------------------------------------------------------------------------------

/// `text` in an inline code span, on one line: `` `feature` ``, ``` ``a`b`` ```.
pub fn code(text: &str) -> String {
    let line = one_line(&clean(text), MAX_CODE_CHARS);
    let fence = "`".repeat(longest_run(&line, '`') + 1);
    // A span whose text starts or ends with a backtick (or is empty) needs room: one space
    // on each side, which GitHub takes off again.
    let pad = if line.is_empty() || line.starts_with('`') || line.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{line}{pad}{fence}")
}

/// `text` as plain words on one line, where nothing renders or links: for kodx's sentences,
/// headings and table cells (a `|` is escaped too).
pub fn words(text: &str) -> String {
    let line = one_line(&clean(text), MAX_WORDS_CHARS);
    let mut out = String::with_capacity(line.len() + line.len() / 8);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '~' | '&' => {
                out.push('\\');
                out.push(c);
            }
            // Mentions and e-mail addresses alike.
            '@' if chars.peek().is_some_and(|n| n.is_ascii_alphanumeric()) => {
                out.push('@');
                out.push(BREAK);
            }
            // `https://…`, `ftp://…`: no scheme is followed by `//` any more.
            '/' if out.ends_with(':') => {
                out.push(BREAK);
                out.push('/');
            }
            '.' if ends_with_ignore_case(&out, "www") => {
                out.push(BREAK);
                out.push('.');
            }
            // `#12`, `owner/repo#12`, `GH-12`.
            d if d.is_ascii_digit()
                && (out.ends_with('#') || ends_with_ignore_case(&out, "gh-")) =>
            {
                out.push(BREAK);
                out.push(d);
            }
            c => out.push(c),
        }
    }
    out
}

/// `text` on one line: every run of whitespace (line feeds, carriage returns, tabs,
/// U+2028 and U+2029, NEL …) one space, control and bidi control characters left out, the
/// ends trimmed, and past `max` characters cut with `…`.
fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut count = 0;
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            space = !out.is_empty();
            continue;
        }
        if c.is_control() || is_bidi_control(c) {
            continue;
        }
        let needed = if space { 2 } else { 1 };
        if count + needed > max {
            // Cut: the last character makes room for the mark.
            while count >= max {
                out.pop();
                count -= 1;
            }
            let trimmed = out.trim_end().len();
            out.truncate(trimmed);
            out.push('…');
            return out;
        }
        if space {
            out.push(' ');
            count += 1;
            space = false;
        }
        out.push(c);
        count += 1;
    }
    out
}

/// The characters that reorder the text around them (embeddings, overrides, isolates and
/// marks): kodx's sentence after an outside piece must read as kodx wrote it.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn longest_run(text: &str, ch: char) -> usize {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == ch { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest
}

fn ends_with_ignore_case(text: &str, suffix: &str) -> bool {
    text.len() >= suffix.len()
        && text.is_char_boundary(text.len() - suffix.len())
        && text[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

// ---------------------------------------------------------------------------------------
// Blocks
// ---------------------------------------------------------------------------------------

/// `text` in a fenced code block, its fence longer than any run of backticks inside, so no
/// line of `text` can close it.
pub fn block(text: &str) -> String {
    let text = clean(text);
    let fence = "`".repeat((longest_run(&text, '`') + 1).max(3));
    let nl = if text.ends_with('\n') { "" } else { "\n" };
    format!("{fence}text\n{text}{nl}{fence}\n")
}

// ---------------------------------------------------------------------------------------
// Markdown someone else wrote
// ---------------------------------------------------------------------------------------

/// Makes Markdown the model (or a person) wrote safe to post as kodx, where it reads the
/// same but does nothing:
///
/// - `@name` and `@org/team` outside code become `@\u{200B}name`: shown alike, nobody is
///   notified (an e-mail address `a@b.com` is not a mention and stays; mentions in code
///   are not linked by GitHub and stay too; `&#64;name` is treated as `@name`);
/// - HTML comments outside code are removed, so nothing hidden is posted and no fake
///   `<!-- kodx:` metadata line reaches kodx's own comment lookup (a `<!--` that removal
///   would leave behind is written `&lt;!--`);
/// - HTML tags (and `<https://…>` autolinks) outside code are written `&lt;…`: shown as
///   text, so no `<img>`, `<a>`, `<details>` or `<sub>` of the model's renders in kodx's
///   comment; images (`![…](…)`) are shown as text too;
/// - closing keywords followed by an issue reference (`Closes #1`, `fixes: owner/repo#2`,
///   `Resolved https://…/issues/3`, any case) get a zero-width space after their first
///   letter, everywhere, code included: only kodx's own `Closes #N` closes anything.
pub fn markdown(text: &str) -> String {
    prose(&clean(text), true)
}

/// [`markdown`] for a commit message, which GitHub does not render as Markdown (so HTML
/// and images are left as written): mentions, closing keywords and HTML comments.
pub fn commit(text: &str) -> String {
    prose(&clean(text), false)
}

fn prose(text: &str, rendered: bool) -> String {
    let code = crate::markdown::code(text);
    let mut out = String::with_capacity(text.len() + text.len() / 16);
    let mut at = 0;
    for r in code
        .iter()
        .chain(std::iter::once(&(text.len()..text.len())))
    {
        if r.start > at {
            let part = strip_comments(&text[at..r.start]);
            let part = part
                .replace("&#64;", "@")
                .replace("&#x40;", "@")
                .replace("&commat;", "@");
            defuse_prose(&part, rendered, &mut out);
        }
        out.push_str(&text[r.start..r.end]);
        at = r.end;
    }
    defuse_keywords(&out)
}

/// `text` without HTML comments (an unclosed one runs to the end).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        rest = match rest[start + 4..].find("-->") {
            Some(end) => &rest[start + 4 + end + 3..],
            None => "",
        };
    }
    out.push_str(rest);
    // "<!<!-- x -->--" leaves a new opener behind: show it instead of hiding.
    out.replace("<!--", "&lt;!--")
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Appends `text` (prose, outside code) to `out` with a break after every `@` that starts a
/// mention (after a non-word character or at the start, before an ASCII letter or digit),
/// and, where it is `rendered`, every HTML tag and image shown as text.
fn defuse_prose(text: &str, rendered: bool, out: &mut String) {
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let next = chars.peek().copied();
        match c {
            '@' if !out.chars().next_back().is_some_and(is_word_char)
                && next.is_some_and(|n| n.is_ascii_alphanumeric()) =>
            {
                out.push('@');
                out.push(BREAK);
            }
            '<' if rendered
                && next
                    .is_some_and(|n| n.is_ascii_alphabetic() || matches!(n, '/' | '!' | '?')) =>
            {
                out.push_str("&lt;");
            }
            '[' if rendered && out.ends_with('!') => out.push_str("\\["),
            c => out.push(c),
        }
    }
}

/// `text` with a break after the first letter of each closing keyword that GitHub would
/// act on: a whole word from [`CLOSING_KEYWORDS`], an optional `:`, whitespace, then `#N`,
/// `GH-N`, `owner/repo#N` or an `http(s)://` link.
fn defuse_keywords(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let word_start = bytes[i].is_ascii_alphabetic()
            && (i == 0 || !text[..i].chars().next_back().is_some_and(is_word_char));
        if !word_start {
            i += 1;
            continue;
        }
        let end = i + bytes[i..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count();
        let word = &text[i..end];
        if CLOSING_KEYWORDS
            .iter()
            .any(|k| word.eq_ignore_ascii_case(k))
            && references_an_issue(&text[end..])
        {
            out.push_str(&text[copied..i + 1]);
            out.push(BREAK);
            copied = i + 1;
        }
        i = end;
    }
    out.push_str(&text[copied..]);
    out
}

/// Whether `rest` (what follows a closing keyword) is `:`? whitespace and an issue reference.
fn references_an_issue(rest: &str) -> bool {
    let rest = rest.strip_prefix(':').unwrap_or(rest);
    let trimmed = rest.trim_start_matches([' ', '\t', '\n', '\r']);
    if trimmed.len() == rest.len() {
        return false;
    }
    let digit_after = |s: &str| s.chars().next().is_some_and(|c| c.is_ascii_digit());
    if let Some(n) = trimmed.strip_prefix('#') {
        return digit_after(n);
    }
    if trimmed.len() >= 3 && trimmed.is_char_boundary(3) && trimmed[..3].eq_ignore_ascii_case("gh-")
    {
        return digit_after(&trimmed[3..]);
    }
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        return true;
    }
    // owner/repo#N
    let word: &str = trimmed
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | '#')))
        .next()
        .unwrap_or("");
    match word.split_once('#') {
        Some((repo, n)) => repo.contains('/') && digit_after(n),
        None => false,
    }
}

/// What the tests of every posting site share: the hostile text, and the check that a
/// body holds nothing live.
#[cfg(test)]
pub(crate) mod testing {
    /// Every hostile thing at once, as the model or CI could send it: a team mention, a
    /// Markdown link, an autolink, bare URLs, an image, HTML, an entity, an e-mail address,
    /// closing keywords and references, a backtick run that closes any short code span,
    /// a blank line, other line breaks, emphasis, a cell's `|`, a bidi override.
    pub const HOSTILE: &str = "x` @org/team [a](https://evil.example/a) <https://evil.example/b> \
        https://evil.example/c www.evil.example ![i](https://evil.example/i.png) \
        <img src=x onerror=alert(1)> &#64;carol a@evil.example Closes #1 GH-2 o/r#3 ``\n\n\
        @org/team\r\u{2028}\u{2029}\u{85}*b* _c_ | d \\ ~~e~~ \u{202E}fed ```";

    /// The text outside code spans and code blocks as `pulldown-cmark` reads `md`, and
    /// every link, image and HTML it finds (what GitHub would make live).
    pub fn live(md: &str) -> (String, Vec<String>) {
        use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
        let mut prose = String::new();
        let mut found = Vec::new();
        let mut in_block = 0;
        for event in Parser::new_ext(md, Options::all()) {
            match event {
                Event::Start(Tag::CodeBlock(_)) => in_block += 1,
                Event::End(TagEnd::CodeBlock) => in_block -= 1,
                Event::Start(Tag::Link { dest_url, .. })
                | Event::Start(Tag::Image { dest_url, .. }) => found.push(dest_url.to_string()),
                Event::Html(h) | Event::InlineHtml(h) => found.push(h.to_string()),
                Event::Text(t) if in_block == 0 => prose.push_str(&t),
                _ => prose.push('\n'),
            }
        }
        (prose, found)
    }

    /// Nothing in `prose` that GitHub would turn into a mention, a reference or a link.
    pub fn assert_inert_prose(prose: &str, md: &str) {
        for live in ["@org", "@carol", "@evil", "://", "www.", "#1", "GH-2", "#3"] {
            assert!(!prose.contains(live), "{live:?} is live in {md:?}");
        }
    }

    /// `md`, read as GitHub reads it, holds no link, image or HTML aimed at the evil host,
    /// and nothing outside code that would mention, reference or link.
    pub fn assert_nothing_live(md: &str) {
        let (prose, found) = live(md);
        assert!(
            found
                .iter()
                .all(|f| !f.contains("evil") && !f.contains("<img")),
            "live: {found:?} in\n{md}"
        );
        assert_inert_prose(&prose, md);
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    const ZW: &str = "\u{200B}";

    #[test]
    fn a_code_span_holds_anything_on_one_line() {
        for text in [
            HOSTILE,
            "`",
            "``",
            "a`",
            "`a",
            "a ``` b",
            "\n\n",
            "",
            "\r\n@org/team\r\n",
            "a\u{2028}\u{2028}@org/team",
        ] {
            let span = code(text);
            assert!(
                !span.contains(['\n', '\r', '\u{2028}', '\u{2029}', '\u{85}']),
                "{span:?}"
            );
            let (prose, found) = live(&format!("before {span} after"));
            assert!(found.is_empty(), "{text:?} → {span:?}: {found:?}");
            // All of it stayed in the span: only kodx's own words are outside.
            assert_eq!(prose.trim(), "before \n after", "{text:?} → {span:?}");
        }
        assert_eq!(code("feature"), "`feature`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`a"), "`` `a ``");
        assert_eq!(code("a\n\nb\r\nc\u{2028}d"), "`a b c d`");
        assert_eq!(code("\u{202E}evil\u{1b}[31m"), "`evil[31m`");
    }

    #[test]
    fn words_render_as_themselves_and_link_nothing() {
        let w = words(HOSTILE);
        assert!(
            !w.contains(['\n', '\r', '\u{2028}', '\u{2029}', '\u{85}', '\u{202E}']),
            "{w:?}"
        );
        let (prose, found) = live(&format!("kodx says: {w}, and more."));
        assert!(found.is_empty(), "{w:?}: {found:?}");
        assert_inert_prose(&prose, &w);
        // Shown as written (the breaks render as nothing).
        let shown = prose.replace(ZW, "");
        for piece in [
            "x` @org/team [a](https://evil.example/a) <https://evil.example/b>",
            "<img src=x onerror=alert(1)> &#64;carol a@evil.example Closes #1 GH-2 o/r#3 ``",
            "*b* _c_ | d \\ ~~e~~ fed ```",
        ] {
            assert!(shown.contains(piece), "{piece:?} not shown in {shown:?}");
        }
        // In a table cell too.
        let table = format!("| a | b |\n|---|---|\n| {w} | end |\n");
        let (_, found) = live(&table);
        assert!(found.is_empty(), "{found:?}");
        assert!(table.lines().nth(2).unwrap().ends_with("| end |"));
        assert_eq!(words("tests failed"), "tests failed");
    }

    #[test]
    fn a_block_holds_anything() {
        for text in [
            HOSTILE,
            "```\n@org/team\n```",
            "````",
            "~~~\n[a](https://evil.example)",
        ] {
            let b = block(text);
            let (prose, found) = live(&format!("{b}\nafter"));
            assert!(found.is_empty(), "{b:?}: {found:?}");
            assert_eq!(prose.trim(), "after", "{b:?}");
        }
    }

    #[test]
    fn long_pieces_are_cut() {
        let long = "é@".repeat(10_000);
        let span = code(&long);
        assert!(span.chars().count() <= MAX_CODE_CHARS + 2, "{}", span.len());
        assert!(span.ends_with("…`"), "{span}");
        let w = words(&long);
        assert!(w.ends_with('…'));
        assert!(w.replace(ZW, "").chars().count() <= MAX_WORDS_CHARS);
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(one_line("ab  cd", 4), "ab…");
        assert_eq!(one_line("abcd", 4), "abcd");
        assert_eq!(one_line("abcd  \n", 4), "abcd");
        // Linear: a megabyte goes through at once.
        let huge = "`@[<\n".repeat(200_000);
        let started = std::time::Instant::now();
        let _ = (code(&huge), words(&huge), block(&huge), markdown(&huge));
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn tokens_and_metadata_never_pass() {
        let token = "ghs_0123456789abcdefghijklmnopqrstuvwxyzAB";
        let forged = "<!-- kodx:{\"run\":\"x\",\"v\":1} -->";
        for out in [
            code(token),
            words(token),
            block(token),
            markdown(token),
            commit(token),
        ] {
            assert!(!out.contains(token) && out.contains("REDACTED"), "{out}");
        }
        for out in [block(forged), markdown(&format!("```\n{forged}\n```"))] {
            assert!(!out.contains(METADATA_OPEN), "{out}");
        }
    }

    // --- Markdown someone else wrote ---

    #[test]
    fn mentions_are_defused_outside_code() {
        assert_eq!(
            markdown("Thanks @octocat and @github/security-team!"),
            format!("Thanks @{ZW}octocat and @{ZW}github/security-team!")
        );
        assert_eq!(markdown("@alice: done"), format!("@{ZW}alice: done"));
        assert_eq!(markdown("(@bob)"), format!("(@{ZW}bob)"));
        assert_eq!(markdown("cc &#64;carol"), format!("cc @{ZW}carol"));
        // Not mentions: e-mail addresses, a bare @, code.
        for kept in [
            "mail a@b.com or first.last@example.org",
            "x_@y",
            "an @ sign, @-dash",
            "use `@property` here",
            "```python\n@dataclass\nclass A: ...\n```",
            "    @indented_code",
        ] {
            assert_eq!(markdown(kept), kept);
        }
    }

    #[test]
    fn html_comments_are_removed_outside_code() {
        assert_eq!(markdown("a<!-- hidden -->b"), "ab");
        assert_eq!(
            markdown("answer\n<!-- kodx:{\"run\":\"x\",\"v\":1} -->\nmore"),
            "answer\n\nmore"
        );
        assert_eq!(markdown("visible <!-- never closed"), "visible ");
        assert_eq!(markdown("<!<!-- x -->-- y -->"), "&lt;!-- y -->");
        assert_eq!(markdown("@<!-- -->octocat"), format!("@{ZW}octocat"));
        let code = "```html\n<!-- shown in code -->\n```";
        assert_eq!(markdown(code), code);
    }

    #[test]
    fn html_and_images_are_shown_as_text() {
        for (text, want) in [
            ("<img src=x>", "&lt;img src=x>"),
            ("a</details>b", "a&lt;/details>b"),
            ("<sub>kodx run</sub>", "&lt;sub>kodx run&lt;/sub>"),
            ("<https://evil.example>", "&lt;https://evil.example>"),
            (
                "![pixel](https://evil.example/p.png)",
                "!\\[pixel](https://evil.example/p.png)",
            ),
            ("Vec<String> and a < b", "Vec&lt;String> and a < b"),
            (
                "`<img>` and ![x](y) in code: `![x](y)`",
                "`<img>` and !\\[x](y) in code: `![x](y)`",
            ),
        ] {
            assert_eq!(markdown(text), want, "{text}");
            let (_, found) = live(&markdown(text));
            assert!(
                found
                    .iter()
                    .all(|f| !f.contains("evil") && !f.contains('<')),
                "{text}: {found:?}"
            );
        }
        // The author's own links stay: the text is shown as theirs.
        assert_eq!(
            markdown("[docs](https://docs.rs)"),
            "[docs](https://docs.rs)"
        );
        // A commit message is not rendered: nothing to escape there.
        assert_eq!(
            commit("Vec<String> @alice"),
            format!("Vec<String> @{ZW}alice")
        );
    }

    #[test]
    fn closing_keywords_are_defused() {
        for (text, want) in [
            ("Closes #1", format!("C{ZW}loses #1")),
            ("fixes owner/repo#2", format!("f{ZW}ixes owner/repo#2")),
            ("FIXED: #3", format!("F{ZW}IXED: #3")),
            ("resolve\n#4", format!("r{ZW}esolve\n#4")),
            (
                "Resolves https://github.com/o/r/issues/5",
                format!("R{ZW}esolves https://github.com/o/r/issues/5"),
            ),
            ("close GH-6", format!("c{ZW}lose GH-6")),
            ("(closed #7)", format!("(c{ZW}losed #7)")),
            ("`fix #8`", format!("`f{ZW}ix #8`")),
        ] {
            assert_eq!(markdown(text), want, "{text}");
            assert_eq!(commit(text), want, "{text}");
        }
        for kept in [
            "I fixed the bug",
            "closes the file",
            "prefix #1",
            "fixes- #1",
            "fixes#1",
            "unfixed #2",
            "fixes #x",
            "closed owner/repo",
            // Not a reference, and no byte of it is cut in the middle of a character.
            "fixes éé",
            "fixes 日本",
        ] {
            assert_eq!(markdown(kept), kept);
        }
    }
}
