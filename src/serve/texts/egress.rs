//! What the status comment, the pull request and the run page say about the egress proxy
//! (SPEC §12, "Egress by name"): the requests it refused, with the line to add, and why a
//! repository's `network.allow` was not used.

use crate::egress::report::{clean_host, clock, MAX_ROWS};
use crate::egress::Blocked;
use crate::repo_config::RepoConfig;

/// The refused requests as a Markdown table, each with the `network.allow` entry that
/// would allow it; empty when nothing was refused.
pub fn blocked(blocked: &[Blocked]) -> String {
    if blocked.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "**The egress proxy refused these requests.** To allow a host, add its entry to \
         `network.allow` in `{}`.\n\n| host | port | requests | first | add to `network.allow` |\n|---|---|---|---|---|\n",
        RepoConfig::PATH
    );
    for b in blocked.iter().take(MAX_ROWS) {
        let add = match &b.suggestion {
            Some(s) => format!("`{}`", clean_host(s)),
            None => crate::neutral::words(&b.why),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {add} |\n",
            clean_host(&b.host),
            b.port,
            b.count,
            clock(b.first_ms)
        ));
    }
    if blocked.len() > MAX_ROWS {
        out.push_str(&format!(
            "\n…and {} more (the run page lists them).\n",
            blocked.len() - MAX_ROWS
        ));
    }
    out.push('\n');
    out
}

/// Why the repository's `network.allow` was not used: the sandbox was cut from the network
/// after its setup instead.
pub fn not_used(why: &str) -> String {
    format!(
        "**`network.allow` was not used:** {}. The sandbox had no network after its setup \
         script.\n\n",
        crate::neutral::words(why)
    )
}

/// The run's secrets with `hosts:` could not be injected (its CA could not be made): the
/// sandbox holds no placeholder, and the run goes on.
pub fn not_injected(why: &str) -> String {
    format!(
        "**Secrets with `hosts:` were not injected:** the run's certificate authority could \
         not be made ({}).\n\n",
        crate::neutral::words(why)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_host_and_what_to_add() {
        assert_eq!(blocked(&[]), "");
        let rows = [
            Blocked {
                host: "evil.example".into(),
                port: 443,
                count: 2,
                first_ms: 1_796_083_920_000,
                why: "not in network.allow".into(),
                suggestion: Some("evil.example".into()),
            },
            Blocked {
                host: "inside.test".into(),
                port: 80,
                count: 1,
                first_ms: 1_796_083_921_000,
                why: "resolves only to private, loopback or link-local addresses".into(),
                suggestion: None,
            },
        ];
        insta::assert_snapshot!(blocked(&rows), @r"
        **The egress proxy refused these requests.** To allow a host, add its entry to `network.allow` in `.github/kodx.yml`.

        | host | port | requests | first | add to `network.allow` |
        |---|---|---|---|---|
        | `evil.example` | 443 | 2 | 00:12:00 UTC | `evil.example` |
        | `inside.test` | 80 | 1 | 00:12:01 UTC | resolves only to private, loopback or link-local addresses |
        ");
        insta::assert_snapshot!(not_used("the operator does not allow it"), @"**`network.allow` was not used:** the operator does not allow it. The sandbox had no network after its setup script.");
    }
}
