//! The pure parts of the manifest flow: the App manifest kodx asks GitHub for, the form's
//! checks, and the `state` bound to the setup token, good once and for an hour.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::github::AppInfo;

/// What the App must be allowed (SPEC §2): permission, least level.
pub const PERMISSIONS: [(&str, &str); 4] = [
    ("contents", "write"),
    ("issues", "write"),
    ("pull_requests", "write"),
    ("metadata", "read"),
];

/// What the App asks for besides, and works without: `checks: write` puts a `kodx` Check
/// Run on the commits kodx pushes (without it, the status comment says so once); `actions`
/// and `statuses` read let CI repair read why CI failed (SPEC §11), and `actions: write`
/// re-runs failed jobs once before a repair is paid for (SPEC §12).
pub const OPTIONAL_PERMISSIONS: [(&str, &str); 3] = [
    ("checks", "write"),
    ("actions", "write"),
    ("statuses", "read"),
];

/// The webhook events kodx acts on.
pub const EVENTS: [&str; 3] = ["issue_comment", "issues", "pull_request_review_comment"];

/// The events of the pull request's life (SPEC §11, §12): commands in review bodies, CI
/// results for CI repair, and pushes that may leave kodx's pull requests conflicted.
/// Asked for; kodx works without them.
pub const OPTIONAL_EVENTS: [&str; 5] = [
    "pull_request",
    "pull_request_review",
    "check_suite",
    "workflow_run",
    "push",
];

/// GitHub's longest App name.
pub const MAX_NAME_CHARS: usize = 34;

/// Who will own the App.
#[derive(Debug, Clone, PartialEq)]
pub enum Owner {
    /// The account signed in on GitHub.
    Personal,
    Organization(String),
}

/// The App manifest (GitHub's "Registering a GitHub App from a manifest"): no `null`
/// anywhere, since GitHub's validator refuses optional fields set to null.
pub fn manifest(name: &str, public_url: &str, hook_url: &str, redirect_url: &str) -> Value {
    let permissions: serde_json::Map<String, Value> = PERMISSIONS
        .iter()
        .chain(OPTIONAL_PERMISSIONS.iter())
        .map(|(p, level)| (p.to_string(), Value::from(*level)))
        .collect();
    json!({
        "name": name,
        "url": public_url,
        "hook_attributes": { "url": hook_url, "active": true },
        "redirect_url": redirect_url,
        "description": "kodx: an LLM that works in a sandbox on your issues and pull requests (/kodx code, /kodx ask)",
        "public": false,
        "default_permissions": permissions,
        "default_events": EVENTS.iter().chain(OPTIONAL_EVENTS.iter()).collect::<Vec<_>>(),
    })
}

/// Where the browser posts the manifest: `<GITHUB_URL>/settings/apps/new` or
/// `/organizations/ORG/settings/apps/new`, with `state` in the query.
pub fn new_app_url(github_url: &str, owner: &Owner, state: &str) -> String {
    let state = percent_encoding::utf8_percent_encode(state, percent_encoding::NON_ALPHANUMERIC);
    match owner {
        Owner::Personal => format!("{github_url}/settings/apps/new?state={state}"),
        Owner::Organization(org) => {
            format!("{github_url}/organizations/{org}/settings/apps/new?state={state}")
        }
    }
}

/// A fresh default App name: `kodx-` and six random letters and digits.
pub fn default_app_name() -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let tail: String = (0..6)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("kodx-{tail}")
}

/// The App name as GitHub takes it: 1–34 characters, no control characters.
pub fn check_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty() {
        return Err("the App needs a name".into());
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(format!(
            "GitHub takes App names of at most {MAX_NAME_CHARS} characters"
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("the App name has control characters".into());
    }
    Ok(name.to_string())
}

/// A GitHub organization login: letters, digits and single hyphens, at most 39.
pub fn check_org(org: &str) -> Result<String, String> {
    let org = org.trim();
    let ok = !org.is_empty()
        && org.len() <= 39
        && org.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !org.starts_with('-')
        && !org.ends_with('-');
    if ok {
        Ok(org.to_string())
    } else {
        Err(format!(
            "{org:?} is not an organization name (letters, digits and hyphens, as in github.com/ORG)"
        ))
    }
}

/// The public URL GitHub sends webhooks to: http(s), a host, no query or fragment; without
/// a trailing slash.
pub fn check_public_url(url: &str) -> Result<String, String> {
    let url = url.trim().trim_end_matches('/');
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(rest)
            if !rest.is_empty()
                && !rest.starts_with('/')
                && !rest.contains(['?', '#', ' ', '"', '<', '>']) =>
        {
            Ok(url.to_string())
        }
        _ => Err(format!(
            "the public URL must be an http(s) address GitHub can reach, such as https://kodx.example.com, got {url:?}"
        )),
    }
}

/// The setup token (random, shown once on the terminal) and the `state` bound to it: a
/// nonce and the HMAC of the nonce under the token. Only the holder of the token can make
/// a `state` the callback takes.
pub fn make_state(token: &[u8]) -> String {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    format!(
        "{nonce}.{}",
        hex::encode(state_mac(token, &nonce).finalize().into_bytes())
    )
}

/// Whether `state` was made by [`make_state`] under `token` (compared in constant time).
pub fn check_state(token: &[u8], state: &str) -> bool {
    let Some((nonce, mac)) = state.split_once('.') else {
        return false;
    };
    let Ok(mac) = hex::decode(mac) else {
        return false;
    };
    nonce.len() == 32 && state_mac(token, nonce).verify_slice(&mac).is_ok()
}

fn state_mac(token: &[u8], nonce: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes any key");
    mac.update(b"kodx-setup-state:");
    mac.update(nonce.as_bytes());
    mac
}

/// How long a `state` handed to GitHub stays good: the operator creates the App on
/// GitHub in between, and GitHub's code itself is good for an hour.
pub const STATE_TTL: Duration = Duration::from_secs(3600);

/// The most `state`s kept at once; handing out one more forgets the oldest. Only the
/// holder of the setup token can make them, so this only bounds a careless one.
pub const MAX_STATES: usize = 16;

/// The `state`s handed out and not yet used, in memory: each is taken back once, within
/// [`STATE_TTL`], so a callback URL seen in a browser's history or a proxy's log cannot be
/// replayed. A restart forgets them (the operator starts again from the page).
#[derive(Default)]
pub struct States {
    issued: VecDeque<(String, Instant)>,
}

/// Why a callback's `state` is refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum StateError {
    #[error("the state GitHub sent back was not made by this server's setup page")]
    Forged,
    #[error("the state GitHub sent back was used already, is older than an hour, or kodx restarted since it was made")]
    Spent,
}

impl States {
    /// A fresh `state` bound to `token`, good once until `now` + [`STATE_TTL`].
    pub fn issue(&mut self, token: &[u8], now: Instant) -> String {
        self.forget_expired(now);
        while self.issued.len() >= MAX_STATES {
            self.issued.pop_front();
        }
        let state = make_state(token);
        self.issued.push_back((state.clone(), now));
        state
    }

    /// Takes `state` back: `Ok` once for a live one this made under `token`.
    pub fn redeem(&mut self, token: &[u8], state: &str, now: Instant) -> Result<(), StateError> {
        if !check_state(token, state) {
            return Err(StateError::Forged);
        }
        self.forget_expired(now);
        // Compared in the clear: it is authentic already, and only its owner holds it.
        let at = self
            .issued
            .iter()
            .position(|(s, _)| s == state)
            .ok_or(StateError::Spent)?;
        self.issued.remove(at);
        Ok(())
    }

    fn forget_expired(&mut self, now: Instant) {
        self.issued
            .retain(|(_, made)| now.saturating_duration_since(*made) < STATE_TTL);
    }
}

/// What the App lacks of [`PERMISSIONS`] (as `name: level`) and [`EVENTS`].
pub fn missing_grants(info: &AppInfo) -> (Vec<String>, Vec<&'static str>) {
    let level = |p: &str| match info.permissions.get(p).map(String::as_str) {
        Some("admin") => 3,
        Some("write") => 2,
        Some("read") => 1,
        _ => 0,
    };
    let permissions = PERMISSIONS
        .iter()
        .filter(|(p, need)| level(p) < if *need == "write" { 2 } else { 1 })
        .map(|(p, need)| format!("{p}: {need}"))
        .collect();
    let events = EVENTS
        .iter()
        .copied()
        .filter(|e| !info.events.iter().any(|have| have == e))
        .collect();
    (permissions, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_nulls(v: &Value) -> bool {
        match v {
            Value::Null => false,
            Value::Array(a) => a.iter().all(no_nulls),
            Value::Object(o) => o.values().all(no_nulls),
            _ => true,
        }
    }

    #[test]
    fn the_manifest_is_what_github_validates() {
        let m = manifest(
            "kodx-abc123",
            "https://kodx.example.com",
            "https://kodx.example.com/webhook",
            "http://127.0.0.1:3000/setup/callback",
        );
        assert!(no_nulls(&m), "{m}");
        assert_eq!(
            m["hook_attributes"]["url"],
            "https://kodx.example.com/webhook"
        );
        assert_eq!(m["redirect_url"], "http://127.0.0.1:3000/setup/callback");
        assert_eq!(m["url"], "https://kodx.example.com");
        assert_eq!(m["public"], false);
        assert_eq!(
            m["default_permissions"],
            json!({"contents": "write", "issues": "write", "pull_requests": "write", "metadata": "read", "checks": "write", "actions": "write", "statuses": "read"})
        );
        assert_eq!(
            m["default_events"],
            json!([
                "issue_comment",
                "issues",
                "pull_request_review_comment",
                "pull_request",
                "pull_request_review",
                "check_suite",
                "workflow_run",
                "push"
            ])
        );
    }

    #[test]
    fn the_form_goes_to_the_account_or_the_organization() {
        assert_eq!(
            new_app_url("https://github.com", &Owner::Personal, "a.b"),
            "https://github.com/settings/apps/new?state=a%2Eb"
        );
        assert_eq!(
            new_app_url(
                "https://ghe.example.com",
                &Owner::Organization("acme".into()),
                "s"
            ),
            "https://ghe.example.com/organizations/acme/settings/apps/new?state=s"
        );
    }

    #[test]
    fn state_is_bound_to_the_token() {
        let token = b"the-token";
        let s = make_state(token);
        assert!(check_state(token, &s));
        assert_ne!(make_state(token), s, "a fresh nonce each time");
        assert!(!check_state(b"another-token", &s));
        let (nonce, mac) = s.split_once('.').unwrap();
        // The nonce with its last digit changed (to one it is not: a fixed digit would be
        // the same one time in sixteen).
        let last = if nonce.ends_with('0') { '1' } else { '0' };
        let other_nonce = format!("{}{last}", &nonce[..31]);
        assert!(!check_state(token, &format!("{other_nonce}.{mac}")));
        for bad in ["", ".", "abc", "x.y", &format!("{nonce}.")] {
            assert!(!check_state(token, bad), "{bad:?}");
        }
    }

    #[test]
    fn a_state_is_good_once_and_for_an_hour() {
        let token = b"the-token";
        let t0 = Instant::now();
        let mut states = States::default();
        let a = states.issue(token, t0);
        let b = states.issue(token, t0);
        assert_eq!(states.redeem(token, &a, t0), Ok(()));
        assert_eq!(
            states.redeem(token, &a, t0),
            Err(StateError::Spent),
            "used once"
        );
        // Made under this token but never handed out (or before a restart).
        let other = make_state(token);
        assert_eq!(states.redeem(token, &other, t0), Err(StateError::Spent));
        assert_eq!(states.redeem(b"x", &b, t0), Err(StateError::Forged));
        assert_eq!(
            states.redeem(token, &b, t0 + STATE_TTL),
            Err(StateError::Spent),
            "expired"
        );
        let c = states.issue(token, t0);
        assert_eq!(
            states.redeem(token, &c, t0 + STATE_TTL - Duration::from_secs(1)),
            Ok(())
        );
        // Bounded: the oldest is forgotten first.
        let first = states.issue(token, t0);
        for _ in 0..MAX_STATES {
            states.issue(token, t0);
        }
        assert_eq!(states.issued.len(), MAX_STATES);
        assert_eq!(states.redeem(token, &first, t0), Err(StateError::Spent));
    }

    #[test]
    fn form_values_are_checked() {
        let name = default_app_name();
        assert!(name.starts_with("kodx-") && name.len() == 11, "{name}");
        assert_eq!(check_name("  my app ").unwrap(), "my app");
        assert!(check_name("").is_err());
        assert!(check_name(&"x".repeat(35)).is_err());
        assert!(check_org("acme-corp").is_ok());
        assert!(check_org("acme/evil").is_err());
        assert!(check_org("-acme").is_err());
        assert_eq!(
            check_public_url("https://kodx.example.com/").unwrap(),
            "https://kodx.example.com"
        );
        assert!(check_public_url("kodx.example.com").is_err());
        assert!(check_public_url("https://x/?a=1").is_err());
        assert!(check_public_url("https://").is_err());
    }

    #[test]
    fn missing_grants_are_named() {
        let mut info = AppInfo {
            id: 1,
            slug: "k".into(),
            permissions: [
                ("contents", "write"),
                ("issues", "read"),
                ("metadata", "read"),
            ]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
            events: vec!["issues".into()],
        };
        let (p, e) = missing_grants(&info);
        assert_eq!(p, ["issues: write", "pull_requests: write"]);
        assert_eq!(e, ["issue_comment", "pull_request_review_comment"]);
        info.permissions.insert("issues".into(), "admin".into());
        info.permissions
            .insert("pull_requests".into(), "write".into());
        info.events = EVENTS.iter().map(|e| e.to_string()).collect();
        assert_eq!(missing_grants(&info), (vec![], vec![]));
    }
}
