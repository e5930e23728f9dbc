//! Finding and parsing a `/kodx` command in a comment or issue body (SPEC §4).
//!
//! A command is a line whose first word is exactly `/kodx`, after at most three spaces of
//! indentation, and which lies outside:
//!
//! - fenced code blocks (```` ``` ```` or `~~~`, any info string; a fence closes only with a
//!   fence of the same character and at least the same length; an unclosed fence runs to
//!   the end of the body),
//! - block quotes (lines starting with `>` after at most three spaces),
//! - indented code (lines indented by four or more columns; a tab counts to the next
//!   multiple of four),
//! - HTML comment blocks (a line starting with `<!--` up to the line holding `-->`), so the
//!   hidden instructions of issue templates never start a run.
//!
//! The first command wins. Its argument is the rest of its line plus every following line,
//! with leading blank lines and trailing whitespace removed and `\r\n` turned into `\n`;
//! everything else (indentation, code fences, quotes) is kept as written.
//!
//! The body is untrusted: everything here is a single pass, linear in its length, and a
//! request over [`MAX_REQUEST_BYTES`] is measured without being copied.

use thiserror::Error;

/// The longest request (bytes of the argument, after trimming) that is accepted.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The longest unknown subcommand kept for the reply, in characters.
const MAX_UNKNOWN_CHARS: usize = 64;

/// The word that starts a command.
const PREFIX: &str = "/kodx";

/// A parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/kodx code <request>`: an agent with write intent.
    Code { request: String },
    /// `/kodx ask <question>`: a read-only agent that answers.
    Ask { question: String },
    /// `/kodx cancel`: cancel queued and running runs here. Further words are ignored.
    Cancel,
    /// `/kodx help`, `/kodx` alone, or an unknown subcommand (kept, cut to 64 characters,
    /// so the reply can name it).
    Help { unknown: Option<String> },
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
}

/// Finds the first command in `body` and parses it. `None` when the body holds no command.
pub fn parse(body: &str) -> Option<Result<Command, ParseError>> {
    let body = body.strip_prefix('\u{feff}').unwrap_or(body);
    let after = find_command(body)?;
    Some(parse_after_prefix(&body[after..]))
}

/// Block context carried from one line to the next.
enum State {
    Normal,
    /// Inside a fenced code block opened by `len` copies of `ch`.
    Fence {
        ch: char,
        len: usize,
    },
    /// Inside an HTML comment block, waiting for `-->`.
    Comment,
}

/// The byte offset just past the `/kodx` of the first command line, if any.
fn find_command(body: &str) -> Option<usize> {
    let mut state = State::Normal;
    let mut offset = 0;
    for raw in body.split_inclusive('\n') {
        let start = offset;
        offset += raw.len();
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let (indent, rest) = split_indent(line);
        match state {
            State::Fence { ch, len } => {
                if indent < 4 && is_closing_fence(rest, ch, len) {
                    state = State::Normal;
                }
            }
            State::Comment => {
                if line.contains("-->") {
                    state = State::Normal;
                }
            }
            State::Normal => {
                if indent >= 4 || rest.starts_with('>') {
                    continue;
                }
                if let Some((ch, len)) = opening_fence(rest) {
                    state = State::Fence { ch, len };
                } else if let Some(comment) = rest.strip_prefix("<!--") {
                    if !comment.contains("-->") {
                        state = State::Comment;
                    }
                } else if let Some(tail) = rest.strip_prefix(PREFIX) {
                    if tail.is_empty() || tail.starts_with([' ', '\t']) {
                        return Some(start + (line.len() - tail.len()));
                    }
                }
            }
        }
    }
    None
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

/// The length of the run of `ch` that starts `s`.
fn run_len(s: &str, ch: char) -> usize {
    s.len() - s.trim_start_matches(ch).len()
}

/// `Some((char, length))` when `rest` (indentation removed) opens a fenced code block.
fn opening_fence(rest: &str) -> Option<(char, usize)> {
    let ch = rest.chars().next().filter(|c| matches!(c, '`' | '~'))?;
    let len = run_len(rest, ch);
    if len < 3 {
        return None;
    }
    // A backtick fence's info string may not hold backticks: "``` x ```" is inline code.
    if ch == '`' && rest[len..].contains('`') {
        return None;
    }
    Some((ch, len))
}

/// Whether `rest` (indentation removed) closes a fence opened by `len` copies of `ch`.
fn is_closing_fence(rest: &str, ch: char, len: usize) -> bool {
    let run = run_len(rest, ch);
    run >= len && rest[run..].trim_matches([' ', '\t']).is_empty()
}

/// Parses what follows `/kodx` (the rest of its line and every following line).
fn parse_after_prefix(text: &str) -> Result<Command, ParseError> {
    let text = text.trim_start_matches([' ', '\t']);
    let line_end = text.find(['\r', '\n']).unwrap_or(text.len());
    let word_end = text[..line_end].find([' ', '\t']).unwrap_or(line_end);
    let word = &text[..word_end];
    let argument = &text[word_end..];
    if word.is_empty() || word.eq_ignore_ascii_case("help") {
        Ok(Command::Help { unknown: None })
    } else if word.eq_ignore_ascii_case("cancel") {
        Ok(Command::Cancel)
    } else if word.eq_ignore_ascii_case("code") {
        let request = request("code", argument)?;
        Ok(Command::Code { request })
    } else if word.eq_ignore_ascii_case("ask") {
        let question = request("ask", argument)?;
        Ok(Command::Ask { question })
    } else {
        let unknown = word.chars().take(MAX_UNKNOWN_CHARS).collect();
        Ok(Command::Help {
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

    fn code(request: &str) -> Option<Result<Command, ParseError>> {
        Some(Ok(Command::Code {
            request: request.to_owned(),
        }))
    }

    fn ask(question: &str) -> Option<Result<Command, ParseError>> {
        Some(Ok(Command::Ask {
            question: question.to_owned(),
        }))
    }

    fn help(unknown: Option<&str>) -> Option<Result<Command, ParseError>> {
        Some(Ok(Command::Help {
            unknown: unknown.map(str::to_owned),
        }))
    }

    fn empty(command: &'static str) -> Option<Result<Command, ParseError>> {
        Some(Err(ParseError::EmptyRequest { command }))
    }

    fn check(cases: &[(&str, Option<Result<Command, ParseError>>)]) {
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
            ("/kodx cancel", Some(Ok(Command::Cancel))),
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
    fn subcommand_is_case_insensitive() {
        check(&[
            ("/kodx ASK why", ask("why")),
            ("/kodx Code it", code("it")),
            ("/kodx CANCEL", Some(Ok(Command::Cancel))),
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
            ("/kodx cancel extra words", Some(Ok(Command::Cancel))),
            ("/kodx cancel\nmore lines", Some(Ok(Command::Cancel))),
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
            ("/kodx\tcancel", Some(Ok(Command::Cancel))),
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
            (
                "intro\n/kodx cancel\n/kodx code x",
                Some(Ok(Command::Cancel)),
            ),
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
            ("/kodx cancel\r\n", Some(Ok(Command::Cancel))),
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
}
