//! `network.allow` of `.github/kodx.yml` (SPEC §12, "Egress by name"): the names a
//! sandbox's requests may reach through kodx's egress proxy. An entry is a host name
//! (`crates.io`), a suffix (`*.crates.io`: every name under it, not the name itself) or an
//! IP literal (`203.0.113.7`, `[2001:db8::1]`), with an optional `:port`; without one,
//! ports 80 and 443.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The most entries a repository's `network.allow` may have.
pub const MAX_RULES: usize = 200;
/// The longest host name (RFC 1035).
const MAX_NAME: usize = 253;

/// What an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// One name, lower case, without a trailing dot.
    Name(String),
    /// Every name ending in `.suffix` (stored with the leading dot).
    Suffix(String),
    Ip(IpAddr),
}

/// One `network.allow` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    pattern: Pattern,
    port: Option<u16>,
}

/// A host as a request names it, made comparable: lower case, no trailing dot, an IPv6
/// literal without its brackets.
pub fn normalize_host(host: &str) -> String {
    let h = host.trim().trim_end_matches('.').to_ascii_lowercase();
    match h.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) => inner.to_string(),
        None => h,
    }
}

impl AllowRule {
    /// Whether a request to `host` (normalized: [`normalize_host`]) on `port` is allowed.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => port == 80 || port == 443,
        };
        port_ok
            && match &self.pattern {
                Pattern::Name(n) => n == host,
                Pattern::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
                Pattern::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
            }
    }

    /// The entry that allows exactly `host:port`, as a maintainer adds it to
    /// `network.allow` (no port for 80 and 443).
    pub fn suggestion(host: &str, port: u16) -> String {
        let shown = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => host.to_string(),
        };
        match port {
            80 | 443 => shown,
            p => format!("{shown}:{p}"),
        }
    }
}

impl FromStr for AllowRule {
    type Err = String;

    fn from_str(raw: &str) -> Result<AllowRule, String> {
        let s = raw.trim();
        let bad = |why: &str| Err(format!("{s:?} {why}"));
        if s.is_empty() {
            return bad("is empty");
        }
        if s.contains("://") || s.contains('/') {
            return bad("is not a host name (write `crates.io`, not a URL)");
        }
        // `[v6]:port`, `[v6]`, `host:port`, `host`.
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let Some((inner, after)) = rest.split_once(']') else {
                return bad("opens `[` without closing it");
            };
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return bad("has text after `]`"),
            };
            (format!("[{inner}]"), port)
        } else {
            match s.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p)),
                Some(_) => return bad("is an IPv6 address without brackets (write `[::1]:443`)"),
                None => (s.to_string(), None),
            }
        };
        let port = match port {
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => return bad("has a port that is not a number from 1 to 65535"),
            },
            None => None,
        };
        let host = normalize_host(&host);
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(AllowRule {
                pattern: Pattern::Ip(ip),
                port,
            });
        }
        let (suffix, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host.as_str()),
        };
        if name.is_empty() || name.len() > MAX_NAME {
            return bad("is not a host name");
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name.split('.').all(label_ok) {
            return bad("is not a host name (letters, digits, `-` and `.`; `*.` only in front)");
        }
        if suffix && !name.contains('.') {
            return bad("allows a whole top-level domain; name one under it");
        }
        Ok(AllowRule {
            pattern: if suffix {
                Pattern::Suffix(format!(".{name}"))
            } else {
                Pattern::Name(name.to_string())
            },
            port,
        })
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Pattern::Name(n) => f.write_str(n)?,
            Pattern::Suffix(s) => write!(f, "*{s}")?,
            Pattern::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]")?,
            Pattern::Ip(ip) => write!(f, "{ip}")?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// A repository's `network.allow`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<AllowRule>);

impl AllowList {
    /// Reads the entries; the first bad one (or too many) says why.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<AllowList, String> {
        let mut rules = Vec::new();
        for e in entries {
            if rules.len() == MAX_RULES {
                return Err(format!("has more than {MAX_RULES} entries"));
            }
            rules.push(e.parse()?);
        }
        Ok(AllowList(rules))
    }

    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.0.iter().any(|r| r.allows(host, port))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn rules(&self) -> &[AllowRule] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries.iter().copied()).unwrap()
    }

    #[test]
    fn names_suffixes_ips_and_ports() {
        let l = list(&[
            "crates.io",
            "*.crates.io",
            "registry.npmjs.org:443",
            "203.0.113.7:8080",
            "[2001:db8::1]",
            "Files.PythonHosted.org.",
        ]);
        assert!(l.allows("crates.io", 443));
        assert!(l.allows("crates.io", 80));
        assert!(!l.allows("crates.io", 22));
        assert!(l.allows("static.crates.io", 443));
        assert!(!l.allows("evilcrates.io", 443));
        assert!(l.allows("registry.npmjs.org", 443));
        assert!(!l.allows("registry.npmjs.org", 80));
        assert!(l.allows("203.0.113.7", 8080));
        assert!(!l.allows("203.0.113.7", 443));
        assert!(l.allows("2001:db8::1", 443));
        assert!(l.allows(&normalize_host("FILES.pythonhosted.org."), 443));
        assert!(!l.allows("pypi.org", 443));
        assert_eq!(
            l.rules().iter().map(|r| r.to_string()).collect::<Vec<_>>(),
            [
                "crates.io",
                "*.crates.io",
                "registry.npmjs.org:443",
                "203.0.113.7:8080",
                "[2001:db8::1]",
                "files.pythonhosted.org"
            ]
        );
    }

    #[test]
    fn bad_entries_say_why() {
        for (entry, why) in [
            ("", "empty"),
            ("https://crates.io", "URL"),
            ("crates.io:0", "port"),
            ("crates.io:http", "port"),
            ("*.io", "top-level"),
            ("cra tes.io", "host name"),
            ("a.*.io", "host name"),
            ("::1", "brackets"),
            ("[::1", "closing"),
        ] {
            let e = entry.parse::<AllowRule>().unwrap_err();
            assert!(e.contains(why), "{entry}: {e}");
        }
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("h{i}.example")).collect();
        assert!(AllowList::parse(many.iter().map(String::as_str)).is_err());
    }

    #[test]
    fn suggestions() {
        assert_eq!(AllowRule::suggestion("pypi.org", 443), "pypi.org");
        assert_eq!(
            AllowRule::suggestion("example.test", 8443),
            "example.test:8443"
        );
        assert_eq!(AllowRule::suggestion("2001:db8::1", 22), "[2001:db8::1]:22");
    }
}
