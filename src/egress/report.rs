//! What the egress proxy refused for a run, as people read it: the plain lines `kodx run`
//! prints, and the rows the status comment, the pull request and the run page show (host,
//! port, count, first time, the `network.allow` entry that would allow it).

use super::proxy::Blocked;

/// The most rows a report shows; the rest are counted.
pub const MAX_ROWS: usize = 20;

/// `host` with only the characters a host name or address has (the proxy took it from a
/// request line the sandbox wrote): nothing a Markdown table or a terminal reads as markup.
pub fn clean_host(host: &str) -> String {
    host.chars()
        .filter(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']' | '*')
        })
        .take(253)
        .collect()
}

/// `HH:MM:SS UTC` of Unix milliseconds.
pub fn clock(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "?".to_string())
}

/// The lines `kodx run` prints at its end; empty when nothing was refused.
pub fn plain(blocked: &[Blocked]) -> Vec<String> {
    if blocked.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "kodx: the egress proxy refused {} host(s) (add one to network.allow to allow it):",
        blocked.len()
    )];
    for b in blocked.iter().take(MAX_ROWS) {
        let add = b
            .suggestion
            .as_deref()
            .map(|s| format!("; allow with `{}`", clean_host(s)))
            .unwrap_or_default();
        lines.push(format!(
            "kodx:   {}:{} ×{} from {} ({}{add})",
            clean_host(&b.host),
            b.port,
            b.count,
            clock(b.first_ms),
            b.why
        ));
    }
    if blocked.len() > MAX_ROWS {
        lines.push(format!("kodx:   … and {} more", blocked.len() - MAX_ROWS));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(host: &str, suggestion: Option<&str>) -> Blocked {
        Blocked {
            host: host.into(),
            port: 443,
            count: 3,
            first_ms: 1_796_083_920_000,
            why: "not in network.allow".into(),
            suggestion: suggestion.map(str::to_string),
        }
    }

    #[test]
    fn lines_name_the_host_the_count_and_the_entry_to_add() {
        assert!(plain(&[]).is_empty());
        let lines = plain(&[blocked("evil.example|`x`", Some("evil.example"))]);
        insta::assert_snapshot!(lines.join("\n"), @r"
        kodx: the egress proxy refused 1 host(s) (add one to network.allow to allow it):
        kodx:   evil.examplex:443 ×3 from 00:12:00 UTC (not in network.allow; allow with `evil.example`)
        ");
        let many: Vec<Blocked> = (0..25)
            .map(|i| blocked(&format!("h{i}.test"), None))
            .collect();
        let lines = plain(&many);
        assert_eq!(lines.len(), 1 + MAX_ROWS + 1);
        assert_eq!(lines.last().unwrap(), "kodx:   … and 5 more");
    }
}
