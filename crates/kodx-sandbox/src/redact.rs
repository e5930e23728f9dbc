//! Redaction of token shapes (SPEC §10) in everything kodx posts, logs or keeps: GitHub
//! tokens, model API keys and credentials in URLs. Below every module that shows text.

/// What a redacted secret becomes.
pub const REDACTED: &str = "[REDACTED]";

/// Replaces token shapes with `[REDACTED]` (SPEC §10):
///
/// - `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_` followed by 36 or more `[A-Za-z0-9]`;
/// - `github_pat_` followed by 22 or more `[A-Za-z0-9_]`;
/// - `sk-` followed by 20 or more `[A-Za-z0-9_-]` (OpenAI and Anthropic keys: `sk-proj-…`,
///   `sk-ant-…`);
/// - `x-access-token:<anything up to @ or whitespace>` → `x-access-token:[REDACTED]`
///   (the prefix matched without regard to case).
///
/// The first three only count at the start of a word (not right after `[A-Za-z0-9_]`), so
/// `task-…` is not taken for a key. Shorter look-alikes stay as they are. One pass, linear in
/// the length of `text`.
pub fn redact(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    // Start of the not yet copied part of `text`.
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let at_word_start = i == 0 || !is_word_byte(bytes[i - 1]);
        if let Some(end) = at_word_start.then(|| token_end(bytes, i)).flatten() {
            out.push_str(&text[copied..i]);
            out.push_str(REDACTED);
            i = end;
            copied = end;
            continue;
        }
        if let Some((secret_start, end)) = access_token_secret(text, i) {
            out.push_str(&text[copied..secret_start]);
            out.push_str(REDACTED);
            i = end;
            copied = end;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The end of the token starting at `i`, when one of the prefixed shapes starts there.
///
/// The run scanned after a prefix either reaches the minimum length (and is then skipped as a
/// whole by the caller) or is shorter than that minimum, so the work per position is bounded
/// and the whole scan stays linear.
fn token_end(bytes: &[u8], i: usize) -> Option<usize> {
    let rest = &bytes[i..];
    let (prefix_len, min, class): (usize, usize, fn(u8) -> bool) =
        if rest.starts_with(b"github_pat_") {
            (11, 22, is_word_byte)
        } else if rest.len() >= 4
            && rest.starts_with(b"gh")
            && matches!(rest[2], b'p' | b'o' | b'u' | b's' | b'r')
            && rest[3] == b'_'
        {
            (4, 36, |b: u8| b.is_ascii_alphanumeric())
        } else if rest.starts_with(b"sk-") {
            (3, 20, |b: u8| is_word_byte(b) || b == b'-')
        } else {
            return None;
        };
    let run = rest[prefix_len..].iter().take_while(|&&b| class(b)).count();
    (run >= min).then_some(i + prefix_len + run)
}

/// When `x-access-token:` starts at byte `i` of `text`: the start and end of what follows it
/// up to `@` or whitespace (the secret), when that is not empty.
fn access_token_secret(text: &str, i: usize) -> Option<(usize, usize)> {
    const PREFIX: &str = "x-access-token:";
    let head = text.as_bytes().get(i..i + PREFIX.len())?;
    if !head.eq_ignore_ascii_case(PREFIX.as_bytes()) {
        return None;
    }
    let start = i + PREFIX.len();
    let tail = &text[start..];
    let len = tail
        .find(|c: char| c == '@' || c.is_whitespace())
        .unwrap_or(tail.len());
    (len > 0).then_some((start, start + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GHS: &str = "ghs_abcdefghijklmnopqrstuvwxyz0123456789";

    #[test]
    fn each_token_shape_is_redacted() {
        let a36 = "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8";
        assert_eq!(a36.len(), 36);
        for prefix in ["ghp_", "gho_", "ghu_", "ghs_", "ghr_"] {
            let text = format!("token {prefix}{a36} end");
            assert_eq!(redact(&text), "token [REDACTED] end", "{prefix}");
            let longer = format!("({prefix}{a36}XYZ)");
            assert_eq!(redact(&longer), "([REDACTED])");
        }
        let pat = format!("github_pat_{}", "11ABCDEFG_0123456789abcdefghijkl");
        assert_eq!(redact(&format!("key={pat}\n")), "key=[REDACTED]\n");
        for key in [
            "sk-abcdefghijklmnopqrst",
            "sk-proj-Ab_cd-EF0123456789xyzXYZ",
            "sk-ant-api03-AbCdEf_GhIjKl-MnOpQrStUvWx",
        ] {
            assert_eq!(redact(&format!("\"{key}\"")), "\"[REDACTED]\"", "{key}");
        }
        assert_eq!(
            redact("https://x-access-token:ghs_short@github.com/o/r.git"),
            "https://x-access-token:[REDACTED]@github.com/o/r.git"
        );
        assert_eq!(
            redact("X-Access-Token:abc def"),
            "X-Access-Token:[REDACTED] def"
        );
        assert_eq!(
            redact(&format!("{GHS} and {GHS}")),
            "[REDACTED] and [REDACTED]"
        );
        assert_eq!(redact("ü ghs_ü sk-é"), "ü ghs_ü sk-é");
    }

    #[test]
    fn near_misses_are_kept() {
        let a35 = "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r";
        for text in [
            format!("ghp_{a35}"),
            format!("ghx_{a35}XX"),
            format!("xghp_{a35}XX"),
            "github_pat_short".into(),
            format!("github_pat-{}", "a".repeat(30)),
            "sk-abcdefghijklmnopqrs".into(),
            "task-manager-for-everything-here".into(),
            "disk-usage-report-for-everything".into(),
            "sk- abcdefghijklmnopqrstuvwxyz".into(),
            "x-access-token:".into(),
            "x-access-token: secret".into(),
            "the ghs_ prefix and sk-ant keys".into(),
            String::new(),
        ] {
            assert_eq!(redact(&text), text, "{text}");
        }
    }

    #[test]
    fn redaction_is_linear_on_adversarial_input() {
        let text = "sk-".repeat(200_000) + &"ghp_".repeat(100_000);
        let out = redact(&text);
        assert_eq!(out, "[REDACTED]");
        let short = "sk-a ".repeat(100_000);
        assert_eq!(redact(&short), short);
    }
}
