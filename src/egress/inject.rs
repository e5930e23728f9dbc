//! Secrets injected on the wire (SPEC §12, "Egress by name"): a secret with `hosts:` is
//! the placeholder `kodx-secret:NAME` inside the sandbox, and kodx's egress proxy puts the
//! real value in its place in the headers of requests to those hosts only.
//!
//! - Naming a host in a secret's `hosts:` allows it: the proxy reaches it although
//!   `network.allow` does not name it (every other check stays: private addresses only in
//!   the operator's ranges).
//! - With an [`Injector`], the proxy terminates the TLS of every `CONNECT` whose client
//!   speaks TLS (a leaf for the `CONNECT` host signed by the run's [`RunCa`]) and checks
//!   the upstream's certificate against [`upstream_roots`] itself; plain HTTP is read as is.
//! - In each request, `kodx-secret:NAME` in a header value is replaced by NAME's value when
//!   NAME's `hosts:` allow the request's host and port (also inside `Authorization: Basic`,
//!   whose base64 is decoded and encoded again). A placeholder left over — another host's
//!   secret, an unknown name, or one in the request target — refuses the whole request
//!   (403, recorded) and nothing is sent upstream.
//! - The value is only ever in the header sent upstream: never in a log line, an error, a
//!   recorded block or the proxy's own answers; an upstream's answer whose headers echo it
//!   has it replaced by the placeholder again (bodies stream through untouched).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use parking_lot::Mutex;

use super::allow::AllowList;
use super::ca::RunCa;

/// What stands for a secret inside the sandbox: `kodx-secret:NAME`.
pub const PLACEHOLDER: &str = "kodx-secret:";
/// The most hosts an injector keeps a leaf certificate for (the oldest is made again when
/// needed).
pub const MAX_LEAVES: usize = 64;

/// One secret injected on the wire.
#[derive(Clone)]
pub struct Injection {
    /// As `kodx secret set` stored it (`NPM_TOKEN`).
    pub name: String,
    /// The real value: never printed (`Debug` shows `[redacted]`).
    pub value: String,
    /// The hosts it is sent to, written like `network.allow` entries.
    pub hosts: AllowList,
}

impl fmt::Debug for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Injection")
            .field("name", &self.name)
            .field("value", &"[redacted]")
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// A request the injector refused: which placeholder, and why (no value in either).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The secret's name as the placeholder wrote it.
    pub name: String,
    /// In a few words, as the run's report records it.
    pub why: String,
}

impl Refused {
    fn misplaced(name: String) -> Refused {
        let why = format!("carried the placeholder of {name} to a host it is not for");
        Refused { name, why }
    }

    /// The proxy's answer to the sandbox.
    pub fn message(&self, host: &str, port: u16) -> String {
        format!(
            "kodx egress proxy: a request to {host}:{port} {}; nothing was sent (a secret's \
             `hosts:` in .github/kodx.yml say where its placeholder is replaced)\n",
            self.why
        )
    }
}

/// The proxy's side of a run's injected secrets: its CA, the secrets, the leaves made so
/// far, and the TLS client that checks upstreams.
pub struct Injector {
    ca: RunCa,
    injections: Vec<Injection>,
    client: Arc<rustls::ClientConfig>,
    leaves: Mutex<Leaves>,
}

impl fmt::Debug for Injector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Injector")
            .field("ca", &self.ca)
            .field("injections", &self.injections)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Leaves {
    order: VecDeque<String>,
    configs: HashMap<String, Arc<rustls::ServerConfig>>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Injector {
    /// `upstream_roots`: what an upstream's certificate is checked against (normally
    /// [`upstream_roots`]).
    pub fn new(
        ca: RunCa,
        injections: Vec<Injection>,
        upstream_roots: rustls::RootCertStore,
    ) -> Injector {
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports rustls's default protocol versions")
            .with_root_certificates(upstream_roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Injector {
            ca,
            injections,
            client: Arc::new(client),
            leaves: Mutex::default(),
        }
    }

    /// The run's CA.
    pub fn ca(&self) -> &RunCa {
        &self.ca
    }

    /// Whether a secret's `hosts:` name `host:port` (which makes it reachable).
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.injections.iter().any(|i| i.hosts.allows(host, port))
    }

    /// Puts the values of the secrets meant for `host:port` in place of their
    /// placeholders in `headers`; refuses the request if a placeholder is left in a header
    /// or in `target` (its path and query).
    pub fn apply(
        &self,
        host: &str,
        port: u16,
        target: &str,
        headers: &mut HeaderMap,
    ) -> Result<(), Refused> {
        let decoded = percent_encoding::percent_decode_str(target).decode_utf8_lossy();
        for t in [target, decoded.as_ref()] {
            if let Some(name) = first_placeholder(t.as_bytes()) {
                return Err(Refused::misplaced(name));
            }
        }
        let value_of = |name: &str| {
            self.injections
                .iter()
                .find(|i| i.name == name && i.hosts.allows(host, port))
                .map(|i| i.value.as_str())
        };
        for (header, value) in headers.iter_mut() {
            let mut bytes = Cow::Borrowed(value.as_bytes());
            if header == AUTHORIZATION {
                if let Some(b) = in_basic(&bytes, &value_of)? {
                    bytes = Cow::Owned(b);
                }
            }
            if let Some(b) = substitute(&bytes, &value_of).map_err(Refused::misplaced)? {
                bytes = Cow::Owned(b);
            }
            if let Cow::Owned(b) = bytes {
                let mut new = HeaderValue::from_bytes(&b).map_err(|_| {
                    let name = first_placeholder(value.as_bytes()).unwrap_or_default();
                    Refused {
                        why: format!(
                            "needed the value of {name} in a header, which it cannot be in \
                             (a line break or another control character)"
                        ),
                        name,
                    }
                })?;
                new.set_sensitive(true);
                *value = new;
            }
        }
        Ok(())
    }

    /// An upstream's answer headers with every secret's value put back as its placeholder.
    pub fn scrub(&self, headers: &mut HeaderMap) {
        for value in headers.values_mut() {
            let mut bytes = Cow::Borrowed(value.as_bytes());
            for i in self.injections.iter().filter(|i| !i.value.is_empty()) {
                if find(&bytes, i.value.as_bytes()).is_some() {
                    bytes = Cow::Owned(replace_all(&bytes, i.value.as_bytes(), &i.name));
                }
            }
            if let Cow::Owned(b) = bytes {
                *value = HeaderValue::from_bytes(&b)
                    .unwrap_or_else(|_| HeaderValue::from_static("[kodx: removed]"));
            }
        }
    }

    /// The TLS server side for `host`: a leaf signed by the run's CA, `http/1.1` only.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        if let Some(c) = self.leaves.lock().configs.get(host) {
            return Ok(c.clone());
        }
        let leaf = self.ca.leaf(host)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(leaf.chain, leaf.key)
            .map_err(|e| format!("the leaf for {host}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock();
        if !leaves.configs.contains_key(host) {
            while leaves.order.len() >= MAX_LEAVES {
                if let Some(old) = leaves.order.pop_front() {
                    leaves.configs.remove(&old);
                }
            }
            leaves.order.push_back(host.to_string());
            leaves.configs.insert(host.to_string(), config.clone());
        }
        Ok(config)
    }

    /// The TLS client towards upstreams.
    pub(crate) fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.client.clone()
    }

    #[cfg(test)]
    fn leaves_kept(&self) -> usize {
        self.leaves.lock().configs.len()
    }
}

/// The system's roots (rustls-native-certs: the platform's store, or `SSL_CERT_FILE` /
/// `SSL_CERT_DIR` when set), which upstreams' certificates are checked against. What
/// cannot be read is logged; with none at all every upstream TLS connection fails.
pub fn upstream_roots() -> rustls::RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!("egress proxy: a system root certificate could not be read: {e}");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (_, ignored) = roots.add_parsable_certificates(found.certs);
    if ignored > 0 {
        tracing::warn!("egress proxy: {ignored} system root certificates were not usable");
    }
    if roots.is_empty() {
        tracing::warn!(
            "egress proxy: no system root certificates; no upstream's TLS will be trusted"
        );
    }
    roots
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn replace_all(bytes: &[u8], value: &[u8], name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(at) = find(rest, value) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(format!("{PLACEHOLDER}{name}").as_bytes());
        rest = &rest[at + value.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The name after a placeholder starting at `at` and where it ends.
fn name_at(bytes: &[u8], at: usize) -> (String, usize) {
    let start = at + PLACEHOLDER.len();
    let len = bytes[start..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    let name = String::from_utf8_lossy(&bytes[start..start + len.min(64)]).to_string();
    (name, start + len)
}

fn first_placeholder(bytes: &[u8]) -> Option<String> {
    find(bytes, PLACEHOLDER.as_bytes()).map(|at| name_at(bytes, at).0)
}

/// `bytes` with each placeholder replaced by its value: `Ok(None)` when there is none,
/// `Err(name)` for the first one `value_of` has no value for.
fn substitute<'v>(
    bytes: &[u8],
    value_of: &impl Fn(&str) -> Option<&'v str>,
) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut done = 0;
    while let Some(at) = find(&bytes[done..], PLACEHOLDER.as_bytes()) {
        let at = done + at;
        let (name, end) = name_at(bytes, at);
        let value = value_of(&name).ok_or(name)?;
        out.extend_from_slice(&bytes[done..at]);
        out.extend_from_slice(value.as_bytes());
        done = end;
    }
    if done == 0 {
        return Ok(None);
    }
    out.extend_from_slice(&bytes[done..]);
    Ok(Some(out))
}

/// `Authorization: Basic …` whose decoded credentials hold a placeholder: the same with the
/// value in place, encoded again (`Ok(None)`: not Basic, or no placeholder inside).
fn in_basic<'v>(
    header: &[u8],
    value_of: &impl Fn(&str) -> Option<&'v str>,
) -> Result<Option<Vec<u8>>, Refused> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let Some(scheme) = header.get(..6) else {
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return Ok(None);
    }
    let Ok(decoded) = b64.decode(header[6..].trim_ascii()) else {
        return Ok(None);
    };
    match substitute(&decoded, value_of).map_err(Refused::misplaced)? {
        Some(creds) => Ok(Some(format!("Basic {}", b64.encode(creds)).into_bytes())),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injector() -> Injector {
        let npm = Injection {
            name: "NPM_TOKEN".into(),
            value: "npm_s3cr3t".into(),
            hosts: AllowList::parse(["secret.test", "*.npm.test:8443"]).unwrap(),
        };
        let gh = Injection {
            name: "GH".into(),
            value: "ghp_v4lue".into(),
            hosts: AllowList::parse(["git.test"]).unwrap(),
        };
        Injector::new(
            RunCa::new("t").unwrap(),
            vec![npm, gh],
            rustls::RootCertStore::empty(),
        )
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn placeholders_are_replaced_for_their_hosts_only() {
        let inj = injector();
        let mut h = headers(&[
            ("authorization", "Bearer kodx-secret:NPM_TOKEN"),
            ("x-both", "a=kodx-secret:NPM_TOKEN;b=kodx-secret:NPM_TOKEN."),
            ("accept", "*/*"),
        ]);
        inj.apply("secret.test", 443, "/pkg", &mut h).unwrap();
        assert_eq!(h["authorization"], "Bearer npm_s3cr3t");
        assert!(h["authorization"].is_sensitive());
        assert_eq!(h["x-both"], "a=npm_s3cr3t;b=npm_s3cr3t.");
        assert_eq!(h["accept"], "*/*");
        let mut h = headers(&[("authorization", "Bearer kodx-secret:NPM_TOKEN")]);
        inj.apply("a.npm.test", 8443, "/", &mut h).unwrap();
        assert_eq!(h["authorization"], "Bearer npm_s3cr3t");

        // Another host, another port, another secret's host, an unknown name, a longer name.
        for (host, port, value, name) in [
            (
                "other.test",
                443,
                "Bearer kodx-secret:NPM_TOKEN",
                "NPM_TOKEN",
            ),
            (
                "secret.test",
                8080,
                "Bearer kodx-secret:NPM_TOKEN",
                "NPM_TOKEN",
            ),
            (
                "git.test",
                443,
                "kodx-secret:GH kodx-secret:NPM_TOKEN",
                "NPM_TOKEN",
            ),
            ("secret.test", 443, "kodx-secret:NOPE", "NOPE"),
            ("secret.test", 443, "kodx-secret:NPM_TOKEN_2", "NPM_TOKEN_2"),
        ] {
            let mut h = headers(&[("x-token", value)]);
            let refused = inj.apply(host, port, "/", &mut h).unwrap_err();
            assert_eq!(refused.name, name, "{host}:{port} {value}");
            assert_eq!(
                refused.why,
                format!("carried the placeholder of {name} to a host it is not for")
            );
            assert_eq!(h["x-token"], value, "left as it was");
        }
    }

    #[test]
    fn the_target_never_carries_a_placeholder_and_basic_auth_is_read() {
        let inj = injector();
        for target in ["/?t=kodx-secret:NPM_TOKEN", "/kodx-secret%3ANPM_TOKEN"] {
            let e = inj
                .apply("secret.test", 443, target, &mut HeaderMap::new())
                .unwrap_err();
            assert_eq!(e.name, "NPM_TOKEN", "{target}");
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let basic = format!("Basic {}", b64.encode("x-access-token:kodx-secret:GH"));
        let mut h = headers(&[("authorization", &basic)]);
        inj.apply("git.test", 443, "/o/r.git/info/refs", &mut h)
            .unwrap();
        assert_eq!(
            h["authorization"],
            format!("Basic {}", b64.encode("x-access-token:ghp_v4lue")).as_str()
        );
        let mut h = headers(&[("authorization", &basic)]);
        let e = inj.apply("other.test", 443, "/", &mut h).unwrap_err();
        assert_eq!(e.name, "GH");
    }

    #[test]
    fn a_value_that_cannot_be_a_header_refuses_without_showing_it() {
        let bad = Injection {
            name: "ML".into(),
            value: "line1\nline2".into(),
            hosts: AllowList::parse(["secret.test"]).unwrap(),
        };
        let inj = Injector::new(
            RunCa::new("t").unwrap(),
            vec![bad],
            rustls::RootCertStore::empty(),
        );
        let mut h = headers(&[("x-token", "kodx-secret:ML")]);
        let e = inj.apply("secret.test", 443, "/", &mut h).unwrap_err();
        assert_eq!(e.name, "ML");
        assert!(!e.why.contains("line1") && !e.message("secret.test", 443).contains("line1"));
    }

    #[test]
    fn answers_echoing_a_value_get_the_placeholder_back() {
        let inj = injector();
        let mut h = headers(&[("x-echo", "npm_s3cr3t and npm_s3cr3t"), ("x-other", "ok")]);
        inj.scrub(&mut h);
        assert_eq!(
            h["x-echo"],
            "kodx-secret:NPM_TOKEN and kodx-secret:NPM_TOKEN"
        );
        assert_eq!(h["x-other"], "ok");
    }

    #[test]
    fn leaves_are_kept_per_host_and_bounded() {
        let inj = injector();
        let a = inj.server_config("secret.test").unwrap();
        assert!(Arc::ptr_eq(&a, &inj.server_config("secret.test").unwrap()));
        for i in 0..MAX_LEAVES + 5 {
            inj.server_config(&format!("h{i}.test")).unwrap();
        }
        assert_eq!(inj.leaves_kept(), MAX_LEAVES);
        assert!(!Arc::ptr_eq(&a, &inj.server_config("secret.test").unwrap()));
    }

    #[test]
    fn debug_shows_no_secret() {
        let inj = injector();
        let shown = format!("{inj:?} {:?}", inj.injections[0]);
        assert!(
            shown.contains("NPM_TOKEN") && shown.contains("[redacted]"),
            "{shown}"
        );
        assert!(
            !shown.contains("npm_s3cr3t") && !shown.contains("ghp_v4lue"),
            "{shown}"
        );
    }
}
