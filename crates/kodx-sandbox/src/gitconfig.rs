//! What of a repository's git configuration goes into the sandbox.
//!
//! A checkout's `.git/config` is where CI keeps its credentials: actions/checkout writes
//! `http.https://github.com/.extraheader = AUTHORIZATION: basic …`, other setups put a token
//! in the remote URL (`https://x-access-token:…@github.com/o/r`), in a `url.*.insteadOf`
//! base, in `credential.*` helpers, or in a file pulled in with `include.path`. Whatever is
//! in the container reaches the model and the transcript, so the file is not copied as it
//! is: it is parsed and written again from an allow-list.
//!
//! Kept: the sections git needs to read the repository and work with its branches (`core`
//! settings that describe the repository, `extensions`, `remote.*`, `branch.*`,
//! `submodule.*`, `url.*`, `user.name`/`user.email`, a few behaviour settings such as
//! `init.defaultBranch` or `pull.rebase`, and git-lfs's own filter commands). URLs lose
//! their user information and query (`https://user:token@host/p?x` → `https://host/p`).
//! Everything else is left out: `http.*`, `credential.*`, `include`/`includeIf`,
//! `core.sshCommand`/`askPass`/`hooksPath`/`worktree`, signing keys, aliases, comments.
//! A value that still looks like a token after that (see [`crate::redact::redact`]) is
//! left out too.
//!
//! The same applies to the other configuration files of a git directory: `config.worktree`,
//! and the `config` of submodules (`.git/modules/…/config`) and worktrees.

use std::borrow::Cow;

/// A config file over this size is not parsed: the sandbox gets a minimal one instead.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// What the sandbox gets when the file cannot be read as a config (too large).
const MINIMAL: &str = "[core]\n\trepositoryformatversion = 0\n";

/// Whether `rel` (a path relative to the repository's top, `/`-separated) is one of the
/// git configuration files that are rewritten: `.git/config`, `.git/config.worktree`,
/// and `config` / `config.worktree` of submodules and worktrees inside `.git`.
pub fn is_config_path(rel: &str) -> bool {
    if rel == ".git/config" || rel == ".git/config.worktree" {
        return true;
    }
    let Some(inner) = rel.strip_prefix(".git/") else {
        return false;
    };
    let in_git_dir_of = |prefix: &str| {
        inner.strip_prefix(prefix).is_some_and(|rest| {
            // Not a ref, a log or an object that happens to be named `config`.
            !rest.split('/').any(|seg| {
                matches!(
                    seg,
                    "refs" | "logs" | "objects" | "hooks" | "info" | "lfs" | "rr-cache"
                )
            })
        })
    };
    (rel.ends_with("/config") || rel.ends_with("/config.worktree"))
        && (in_git_dir_of("modules/") || in_git_dir_of("worktrees/"))
}

/// The configuration `text` rewritten for the sandbox (see the module's documentation).
/// Text that does not start like a git config (a first line that is not a section header,
/// comment or blank) is returned unchanged: it is not a config file.
pub fn sanitize(text: &[u8]) -> Vec<u8> {
    if text.len() > MAX_CONFIG_BYTES {
        tracing::warn!(
            bytes = text.len(),
            "the repository's git config is too large to check; the sandbox gets a minimal one"
        );
        return MINIMAL.as_bytes().to_vec();
    }
    let text = String::from_utf8_lossy(text);
    if !looks_like_config(&text) {
        return text.into_owned().into_bytes();
    }
    let entries = parse(&text);
    let mut out = String::new();
    let mut current: Option<(String, Option<String>)> = None;
    let mut dropped: Vec<String> = Vec::new();
    for e in entries {
        let Some(e) = filter(e, &mut dropped) else {
            continue;
        };
        let header = (e.section.clone(), e.subsection.clone());
        if current.as_ref() != Some(&header) {
            write_header(&mut out, &e.section, e.subsection.as_deref());
            current = Some(header);
        }
        out.push('\t');
        out.push_str(&e.key);
        if let Some(v) = &e.value {
            out.push_str(" = ");
            write_value(&mut out, v);
        }
        out.push('\n');
    }
    if !dropped.is_empty() {
        dropped.sort();
        dropped.dedup();
        tracing::info!(
            left_out = %dropped.join(", "),
            "git config settings left out of the sandbox"
        );
    }
    out.into_bytes()
}

/// One variable of a config file.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// Lower case.
    section: String,
    /// Case kept (`[remote "Origin"]`); lower case in the old `[section.sub]` form.
    subsection: Option<String>,
    /// Lower case.
    key: String,
    /// `None` for a bare `key` (boolean true).
    value: Option<String>,
}

fn looks_like_config(text: &str) -> bool {
    for line in text.lines() {
        let t = line.trim_start_matches([' ', '\t', '\u{feff}']);
        if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        return t.starts_with('[');
    }
    true
}

/// Parses git's config syntax: `[section]`, `[section "sub"]`, `[section.sub]`, variables
/// with or without a value, quoting, the escapes `\\ \" \n \t \b`, continuation lines,
/// and `#`/`;` comments. Lines git would reject are skipped.
fn parse(text: &str) -> Vec<Entry> {
    let chars: Vec<char> = text.chars().collect();
    let mut entries = Vec::new();
    let mut section: Option<(String, Option<String>)> = None;
    let mut i = 0;
    let n = chars.len();
    let skip_line = |i: &mut usize| {
        while *i < n && chars[*i] != '\n' {
            *i += 1;
        }
    };
    while i < n {
        let c = chars[i];
        if c == '\n' || c == ' ' || c == '\t' || c == '\r' || c == '\u{feff}' {
            i += 1;
            continue;
        }
        if c == '#' || c == ';' {
            skip_line(&mut i);
            continue;
        }
        if c == '[' {
            match parse_header(&chars, i + 1) {
                Some((s, next)) => {
                    section = Some(s);
                    i = next;
                }
                None => {
                    section = None;
                    skip_line(&mut i);
                }
            }
            continue;
        }
        if !c.is_ascii_alphabetic() {
            skip_line(&mut i);
            continue;
        }
        let start = i;
        while i < n && (chars[i].is_ascii_alphanumeric() || chars[i] == '-') {
            i += 1;
        }
        let key: String = chars[start..i].iter().collect::<String>().to_lowercase();
        while i < n && (chars[i] == ' ' || chars[i] == '\t') {
            i += 1;
        }
        let value = if i >= n || chars[i] == '\n' || chars[i] == '\r' {
            None
        } else if chars[i] == '#' || chars[i] == ';' {
            skip_line(&mut i);
            None
        } else if chars[i] == '=' {
            match parse_value(&chars, i + 1) {
                Some((v, next)) => {
                    i = next;
                    Some(v)
                }
                None => {
                    skip_line(&mut i);
                    continue;
                }
            }
        } else {
            skip_line(&mut i);
            continue;
        };
        if let Some((s, sub)) = &section {
            entries.push(Entry {
                section: s.clone(),
                subsection: sub.clone(),
                key,
                value,
            });
        }
    }
    entries
}

/// After `[`: the section and subsection, and the index just past `]`.
fn parse_header(chars: &[char], mut i: usize) -> Option<((String, Option<String>), usize)> {
    let n = chars.len();
    let start = i;
    while i < n && (chars[i].is_ascii_alphanumeric() || chars[i] == '-' || chars[i] == '.') {
        i += 1;
    }
    let name: String = chars[start..i].iter().collect::<String>().to_lowercase();
    if name.is_empty() {
        return None;
    }
    if i < n && chars[i] == ']' {
        // `[section]` or the old `[section.sub]` (sub folded to lower case).
        return Some(match name.split_once('.') {
            Some((s, sub)) if !s.is_empty() => ((s.to_string(), Some(sub.to_string())), i + 1),
            Some(_) => return None,
            None => ((name, None), i + 1),
        });
    }
    if name.contains('.') {
        return None;
    }
    while i < n && (chars[i] == ' ' || chars[i] == '\t') {
        i += 1;
    }
    if i >= n || chars[i] != '"' {
        return None;
    }
    i += 1;
    let mut sub = String::new();
    loop {
        match chars.get(i)? {
            '\n' | '\0' => return None,
            '"' => {
                i += 1;
                break;
            }
            '\\' => {
                let next = *chars.get(i + 1)?;
                if next == '\n' {
                    return None;
                }
                sub.push(next);
                i += 2;
            }
            &c => {
                sub.push(c);
                i += 1;
            }
        }
    }
    if chars.get(i) != Some(&']') {
        return None;
    }
    Some(((name, Some(sub)), i + 1))
}

/// After `=`: the value and the index of the end of its (last) line.
fn parse_value(chars: &[char], mut i: usize) -> Option<(String, usize)> {
    let n = chars.len();
    let mut value = String::new();
    let mut quoted = false;
    // Whitespace seen outside quotes, kept only if more value follows.
    let mut pending = String::new();
    let mut started = false;
    while i < n {
        let c = chars[i];
        match c {
            '\n' => {
                if quoted {
                    return None;
                }
                break;
            }
            '\r' if chars.get(i + 1) == Some(&'\n') && !quoted => {
                i += 1;
                continue;
            }
            ' ' | '\t' if !quoted => {
                if started {
                    pending.push(c);
                }
                i += 1;
                continue;
            }
            '#' | ';' if !quoted => {
                while i < n && chars[i] != '\n' {
                    i += 1;
                }
                break;
            }
            _ => {}
        }
        value.push_str(&pending);
        pending.clear();
        match c {
            '"' => {
                quoted = !quoted;
                started = true;
                i += 1;
            }
            '\\' => {
                let next = *chars.get(i + 1)?;
                match next {
                    '\n' => {}
                    '\r' if chars.get(i + 2) == Some(&'\n') => i += 1,
                    'n' => value.push('\n'),
                    't' => value.push('\t'),
                    'b' => value.push('\u{8}'),
                    '\\' | '"' => value.push(next),
                    _ => return None,
                }
                started = true;
                i += 2;
            }
            _ => {
                value.push(c);
                started = true;
                i += 1;
            }
        }
    }
    if quoted {
        return None;
    }
    Some((value, i))
}

/// How a kept variable's value is treated.
enum Keep {
    Yes,
    /// A URL: user information and query removed.
    Url,
    No,
}

/// `core` settings that describe the repository or tune git; none names a program, a
/// credential or a host path.
const CORE_KEYS: &[&str] = &[
    "repositoryformatversion",
    "filemode",
    "bare",
    "logallrefupdates",
    "ignorecase",
    "precomposeunicode",
    "symlinks",
    "autocrlf",
    "eol",
    "safecrlf",
    "checkroundtripencoding",
    "quotepath",
    "whitespace",
    "abbrev",
    "compression",
    "loosecompression",
    "bigfilethreshold",
    "sparsecheckout",
    "sparsecheckoutcone",
    "splitindex",
    "untrackedcache",
    "commitgraph",
    "multipackindex",
    "protecthfs",
    "protectntfs",
    "longpaths",
    "trustctime",
    "checkstat",
    "preloadindex",
    "sharedrepository",
    "warnambiguousrefs",
    "commentchar",
    "commentstring",
    "deltabasecachelimit",
    "packedgitlimit",
    "packedgitwindowsize",
    "filesreflocktimeout",
    "packedrefstimeout",
];

fn rule(section: &str, sub: Option<&str>, key: &str) -> Keep {
    let yes = |ok: bool| if ok { Keep::Yes } else { Keep::No };
    match (section, sub) {
        ("core", None) => yes(CORE_KEYS.contains(&key)),
        ("extensions", None) => Keep::Yes,
        ("remote", Some(_)) => match key {
            "url" | "pushurl" => Keep::Url,
            _ => yes(matches!(
                key,
                "fetch"
                    | "push"
                    | "mirror"
                    | "tagopt"
                    | "prune"
                    | "prunetags"
                    | "promisor"
                    | "partialclonefilter"
                    | "skipdefaultupdate"
                    | "skipfetchall"
                    | "followremotehead"
            )),
        },
        ("branch", Some(_)) => yes(matches!(
            key,
            "remote" | "pushremote" | "merge" | "rebase" | "description"
        )),
        ("submodule", Some(_)) => match key {
            "url" => Keep::Url,
            _ => yes(matches!(
                key,
                "path" | "branch" | "active" | "ignore" | "shallow" | "fetchrecursesubmodules"
            )),
        },
        ("url", Some(_)) => match key {
            "insteadof" | "pushinsteadof" => Keep::Url,
            _ => Keep::No,
        },
        ("filter", Some("lfs")) => yes(matches!(key, "clean" | "smudge" | "process" | "required")),
        (_, Some(_)) => Keep::No,
        ("user", None) => yes(matches!(key, "name" | "email")),
        ("init", None) => yes(key == "defaultbranch"),
        ("pull", None) => yes(matches!(key, "rebase" | "ff")),
        ("push", None) => yes(matches!(key, "default" | "autosetupremote" | "followtags")),
        ("fetch", None) => yes(matches!(
            key,
            "prune" | "prunetags" | "recursesubmodules" | "writecommitgraph"
        )),
        ("merge", None) => yes(matches!(key, "ff" | "conflictstyle")),
        ("rebase", None) => yes(matches!(key, "autosquash" | "autostash" | "updaterefs")),
        ("diff", None) => yes(matches!(
            key,
            "renames" | "algorithm" | "mnemonicprefix" | "noprefix" | "colormoved"
        )),
        ("status", None) => yes(matches!(key, "showuntrackedfiles" | "submodulesummary")),
        ("index", None) => yes(matches!(key, "version" | "skiphash")),
        ("feature", None) => yes(matches!(key, "manyfiles" | "experimental")),
        ("lfs", None) => yes(key == "repositoryformatversion"),
        _ => Keep::No,
    }
}

/// The entry as it goes into the sandbox, or `None` (its `section.key` noted in `dropped`).
fn filter(mut e: Entry, dropped: &mut Vec<String>) -> Option<Entry> {
    let name = format!("{}.{}", e.section, e.key);
    let drop = |dropped: &mut Vec<String>| {
        dropped.push(name.clone());
        None
    };
    let keep = rule(&e.section, e.subsection.as_deref(), &e.key);
    match keep {
        Keep::No => return drop(dropped),
        Keep::Yes => {}
        Keep::Url => {
            if let Some(v) = &e.value {
                e.value = Some(strip_url(v).into_owned());
            }
        }
    }
    if e.section == "url" {
        e.subsection = e.subsection.as_deref().map(|s| strip_url(s).into_owned());
    }
    if e.section == "filter"
        && e.key != "required"
        && !e.value.as_deref().unwrap_or("").starts_with("git-lfs ")
    {
        return drop(dropped);
    }
    let texts = [e.subsection.as_deref(), e.value.as_deref()];
    for t in texts.into_iter().flatten() {
        if crate::redact::redact(t) != t || t.contains(['\0', '\r']) {
            return drop(dropped);
        }
    }
    if e.subsection.as_deref().is_some_and(|s| s.contains('\n')) {
        return drop(dropped);
    }
    Some(e)
}

/// `url` without user information, query or fragment: `https://u:p@host/x?t=1` →
/// `https://host/x`; scp-like `user:secret@host:path` → `host:path` (a plain `git@host:path`
/// is kept). Anything else is returned as it is.
fn strip_url(url: &str) -> Cow<'_, str> {
    if let Some(scheme_end) = url.find("://") {
        let scheme = &url[..scheme_end];
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            return Cow::Borrowed(url);
        }
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        let host = match authority.rfind('@') {
            Some(at) => &authority[at + 1..],
            None => authority,
        };
        let mut path = &rest[authority_end..];
        if let Some(q) = path.find(['?', '#']) {
            path = &path[..q];
        }
        let out = format!("{scheme}://{host}{path}");
        return if out == url {
            Cow::Borrowed(url)
        } else {
            Cow::Owned(out)
        };
    }
    // scp-like: [user@]host:path, where a ':' before the '@' would be a password.
    if let Some(at) = url.find('@') {
        let user = &url[..at];
        if user.contains(':') && !user.contains('/') {
            return Cow::Owned(url[at + 1..].to_string());
        }
    }
    Cow::Borrowed(url)
}

fn write_header(out: &mut String, section: &str, sub: Option<&str>) {
    out.push('[');
    out.push_str(section);
    if let Some(sub) = sub {
        out.push_str(" \"");
        for c in sub.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out.push_str("]\n");
}

fn write_value(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(text: &str) -> String {
        String::from_utf8(sanitize(text.as_bytes())).unwrap()
    }

    const TOKEN: &str = "ghs_0123456789abcdefghijklmnopqrstuvwxyzAB";

    #[test]
    fn credentials_are_left_out_and_the_rest_kept() {
        let config = format!(
            r#"# written by actions/checkout {TOKEN}
[core]
	repositoryformatversion = 0
	filemode = true
	bare = false
	logallrefupdates = true
	sshCommand = ssh -i /home/runner/.ssh/key
	hooksPath = /opt/hooks
[remote "origin"]
	url = https://x-access-token:{TOKEN}@github.com/o/r.git
	pushurl = https://bot:hunter2@github.com/o/r.git?private_token=abc#frag
	fetch = +refs/heads/*:refs/remotes/origin/*
	proxy = http://user:pw@proxy:3128
[http "https://github.com/"]
	extraheader = AUTHORIZATION: basic eC1hY2Nlc3MtdG9rZW46Z2hzXzAxMjM0NTY3ODk=
[http]
	extraHeader = Authorization: Bearer abc
[credential]
	helper = store --file /tmp/creds
[credential "https://github.com"]
	username = x-access-token
[url "https://oauth2:secret@gitlab.com/"]
	insteadOf = https://gitlab.com/
[include]
	path = /home/runner/.gitconfig-secrets
[includeIf "gitdir:/work/"]
	path = ../../secrets.inc
[branch "main"]
	remote = origin
	merge = refs/heads/main
[user]
	name = CI Bot
	email = ci@example.com
	signingkey = ABCDEF
[alias]
	deploy = !git push https://{TOKEN}@github.com/o/r
[extensions]
	objectFormat = sha1
"#
        );
        let out = clean(&config);
        for secret in [
            TOKEN,
            "hunter2",
            "private_token",
            "eC1hY2Nlc3M",
            "Bearer",
            "helper",
            "credential",
            "secret",
            "include",
            "sshcommand",
            "hookspath",
            "proxy",
            "x-access-token",
            "signingkey",
            "alias",
            "extraheader",
        ] {
            assert!(
                !out.to_lowercase().contains(&secret.to_lowercase()),
                "{secret} in\n{out}"
            );
        }
        assert_eq!(
            out,
            "[core]\n\trepositoryformatversion = \"0\"\n\tfilemode = \"true\"\n\tbare = \"false\"\n\
             \tlogallrefupdates = \"true\"\n\
             [remote \"origin\"]\n\turl = \"https://github.com/o/r.git\"\n\
             \tpushurl = \"https://github.com/o/r.git\"\n\
             \tfetch = \"+refs/heads/*:refs/remotes/origin/*\"\n\
             [url \"https://gitlab.com/\"]\n\tinsteadof = \"https://gitlab.com/\"\n\
             [branch \"main\"]\n\tremote = \"origin\"\n\tmerge = \"refs/heads/main\"\n\
             [user]\n\tname = \"CI Bot\"\n\temail = \"ci@example.com\"\n\
             [extensions]\n\tobjectformat = \"sha1\"\n"
        );
    }

    #[test]
    fn syntax_quotes_escapes_continuations_comments() {
        let config = "[core] bare = false ; trailing comment\n\
                      [Remote \"Up \\\"x\\\"\"]\n\
                      \tURL = \"https://host/a b\" # c\n\
                      \tfetch = +refs/heads/*:\\\n\
                      refs/remotes/up/*\n\
                      [branch.Feature]\n\tmerge = refs/heads/feature\n\
                      \trebase\n\
                      [branch \"x\"]\n\tdescription = line1\\nline2\\t\\\\ \"quoted\" ok\n\
                      not a variable line\n\
                      [bad\n\
                      \tremote = ignored\n\
                      [branch \"y\"]\n\tremote=origin\n";
        let out = clean(config);
        assert_eq!(
            out,
            "[core]\n\tbare = \"false\"\n\
             [remote \"Up \\\"x\\\"\"]\n\turl = \"https://host/a b\"\n\
             \tfetch = \"+refs/heads/*:refs/remotes/up/*\"\n\
             [branch \"feature\"]\n\tmerge = \"refs/heads/feature\"\n\trebase\n\
             [branch \"x\"]\n\tdescription = \"line1\\nline2\\t\\\\ quoted ok\"\n\
             [branch \"y\"]\n\tremote = \"origin\"\n"
        );
        // What was written reads back the same.
        let again = clean(&out);
        assert_eq!(again, out);
    }

    #[test]
    fn urls_lose_user_information_and_queries() {
        for (url, want) in [
            ("https://u:p@h/x.git", "https://h/x.git"),
            ("https://tok@h:8443/x", "https://h:8443/x"),
            ("http://h/x?token=1", "http://h/x"),
            ("ssh://git@h/x", "ssh://h/x"),
            ("git@github.com:o/r.git", "git@github.com:o/r.git"),
            ("user:pw@host:o/r.git", "host:o/r.git"),
            ("/srv/git/r.git", "/srv/git/r.git"),
            ("../sibling", "../sibling"),
            ("https://h/a@b", "https://h/a@b"),
        ] {
            assert_eq!(strip_url(url), want, "{url}");
        }
    }

    #[test]
    fn token_shapes_left_anywhere_drop_the_entry() {
        let out = clean(&format!(
            "[branch \"main\"]\n\tdescription = use {TOKEN} to deploy\n\tremote = origin\n"
        ));
        assert_eq!(out, "[branch \"main\"]\n\tremote = \"origin\"\n");
    }

    #[test]
    fn config_paths() {
        for p in [
            ".git/config",
            ".git/config.worktree",
            ".git/modules/lib/config",
            ".git/modules/a/b/config",
            ".git/worktrees/wt/config.worktree",
        ] {
            assert!(is_config_path(p), "{p}");
        }
        for p in [
            "config",
            "src/.git/config",
            ".git/refs/heads/config",
            ".git/modules/lib/refs/heads/config",
            ".git/logs/refs/heads/config",
            ".git/configs",
            ".gitconfig",
        ] {
            assert!(!is_config_path(p), "{p}");
        }
    }

    #[test]
    fn other_files_and_huge_files() {
        let sha = "0123456789abcdef0123456789abcdef01234567\n";
        assert_eq!(sanitize(sha.as_bytes()), sha.as_bytes());
        assert_eq!(clean(""), "");
        let huge = format!("[core]\n\tbare = false\n{}", "#".repeat(MAX_CONFIG_BYTES));
        assert_eq!(clean(&huge), MINIMAL);
    }
}
