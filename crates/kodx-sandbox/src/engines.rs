//! Which Docker engines sandboxes run on: the server config's `[[engines]]` list (a local
//! socket, or `tcp://HOST:2376` with TLS client certificates), or, when it is empty, the one
//! engine `DOCKER_HOST` or the local socket names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bollard::{BollardRequest, Docker};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

/// One engine of the server's list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Shown in logs, `/healthz`, `/metrics` and comments: letters, digits, `.`, `_`, `-`.
    pub name: String,
    /// `unix:///var/run/docker.sock` or `tcp://HOST:PORT`.
    pub host: String,
    /// A directory with `ca.pem`, `cert.pem` and `key.pem` (Docker's `DOCKER_CERT_PATH`
    /// layout). Required for `tcp://`: the Docker API over plain TCP is root on that host
    /// for anyone who reaches the port.
    #[serde(default)]
    pub tls_cert_path: Option<PathBuf>,
    /// Sandboxes at once on this engine (from this server and every other process sharing
    /// its queue: the engine's own running `kodx.run` containers count).
    #[serde(default = "default_max_runs")]
    pub max_runs: usize,
    /// Warm sandboxes kept on this engine; unset: the server's `warm_sandboxes`.
    #[serde(default)]
    pub warm_sandboxes: Option<usize>,
}

/// Most warm sandboxes one engine may keep.
pub const MAX_WARM: usize = 16;

fn default_max_runs() -> usize {
    2
}

/// The files of a TLS certificate directory.
pub const TLS_FILES: [&str; 3] = ["ca.pem", "cert.pem", "key.pem"];

impl EngineConfig {
    /// What is wrong with this entry, worded for the operator (`None`: nothing).
    pub fn problem(&self) -> Option<String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 40
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !name_ok {
            return Some(format!(
                "engine name {:?} must be 1-40 letters, digits, '.', '_' or '-'",
                self.name
            ));
        }
        if self.max_runs == 0 || self.max_runs > 256 {
            return Some(format!(
                "engine {}: `max_runs` must be between 1 and 256",
                self.name
            ));
        }
        if self.warm_sandboxes.is_some_and(|n| n > MAX_WARM) {
            return Some(format!(
                "engine {}: `warm_sandboxes` must be between 0 and {MAX_WARM}",
                self.name
            ));
        }
        if let Some(path) = self.host.strip_prefix("unix://") {
            if path.is_empty() {
                return Some(format!("engine {}: `host` names no socket", self.name));
            }
            if self.tls_cert_path.is_some() {
                return Some(format!(
                    "engine {}: `tls_cert_path` is for tcp:// engines; a unix socket has no TLS",
                    self.name
                ));
            }
            return None;
        }
        if let Some(addr) = self.host.strip_prefix("tcp://") {
            if addr.is_empty() || !addr.contains(':') {
                return Some(format!(
                    "engine {}: `host` must be tcp://HOST:PORT, got {:?}",
                    self.name, self.host
                ));
            }
            if self.tls_cert_path.is_none() {
                return Some(plain_tcp_refusal(
                    &format!("engine {}", self.name),
                    "`tls_cert_path`",
                ));
            }
            return None;
        }
        Some(format!(
            "engine {}: `host` must start with unix:// or tcp://, got {:?}",
            self.name, self.host
        ))
    }

    /// A client for this engine (no request made yet). Timeouts as bollard's defaults.
    pub fn client(&self) -> Result<Docker, String> {
        match &self.tls_cert_path {
            Some(dir) => tls_client(&self.host, dir),
            None => match self.host.strip_prefix("unix://") {
                Some(path) => {
                    Docker::connect_with_unix(path, TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
                        .map_err(|e| e.to_string())
                }
                None => Err(format!(
                    "engine {}: a tcp:// engine needs tls_cert_path",
                    self.name
                )),
            },
        }
    }
}

/// Why a `tcp://` engine without TLS is refused, one line for `[[engines]]` and
/// `DOCKER_HOST` alike: `subject` names the setting, `fix` what to set.
pub fn plain_tcp_refusal(subject: &str, fix: &str) -> String {
    format!(
        "{subject}: a tcp:// engine needs {fix} (a directory with ca.pem, cert.pem and \
         key.pem): the Docker API over plain TCP gives root on that host to anyone who reaches \
         the port"
    )
}

/// The opt-in for a plain TCP engine on a loopback address (a test engine on this machine):
/// nobody else reaches that port, so there is nothing to encrypt against.
pub const PLAIN_LOOPBACK_ENV: &str = "KODX_ALLOW_PLAIN_LOOPBACK_ENGINE";

/// The engine the environment names, as Docker's own client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvEngine {
    /// `unix://PATH` (the local socket when `DOCKER_HOST` is unset).
    Unix(String),
    /// `tcp://HOST:PORT` with `DOCKER_TLS_VERIFY`: TLS with the certificates in this
    /// directory (`DOCKER_CERT_PATH`, else `~/.docker`).
    Tls { host: String, certs: PathBuf },
    /// `tcp://` on a loopback address without TLS, allowed by [`PLAIN_LOOPBACK_ENV`].
    PlainLoopback(String),
}

impl EnvEngine {
    /// Reads `DOCKER_HOST`, `DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH` and
    /// [`PLAIN_LOOPBACK_ENV`] through `var` (the process's environment, or a test's). A
    /// `tcp://` engine without TLS is refused with [`plain_tcp_refusal`]'s sentence, as a
    /// `[[engines]]` entry is, unless it is on loopback and opted in.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<EnvEngine, String> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        let host = set("DOCKER_HOST").unwrap_or_else(|| "unix:///var/run/docker.sock".into());
        if let Some(path) = host.strip_prefix("unix://") {
            return Ok(EnvEngine::Unix(path.to_string()));
        }
        let Some(addr) = host
            .strip_prefix("tcp://")
            .or_else(|| host.strip_prefix("https://"))
        else {
            return Err(format!(
                "DOCKER_HOST must start with unix:// or tcp://, got {host:?}"
            ));
        };
        let tls =
            host.starts_with("https://") || set("DOCKER_TLS_VERIFY").is_some_and(|v| v != "0");
        if tls {
            let certs = match set("DOCKER_CERT_PATH") {
                Some(dir) => PathBuf::from(dir),
                None => match set("HOME") {
                    Some(home) => PathBuf::from(home).join(".docker"),
                    None => {
                        return Err("DOCKER_TLS_VERIFY is set but neither DOCKER_CERT_PATH \
                                        nor HOME names the certificates' directory"
                            .into())
                    }
                },
            };
            return Ok(EnvEngine::Tls { host, certs });
        }
        if set(PLAIN_LOOPBACK_ENV).is_some_and(|v| v == "1") && is_loopback(addr) {
            return Ok(EnvEngine::PlainLoopback(host));
        }
        Err(format!(
            "{} (or {PLAIN_LOOPBACK_ENV}=1 for a test engine on a loopback address)",
            plain_tcp_refusal(
                &format!("DOCKER_HOST={host}"),
                "DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH"
            )
        ))
    }

    /// The address kodx shows for this engine.
    pub fn host(&self) -> String {
        match self {
            EnvEngine::Unix(path) => format!("unix://{path}"),
            EnvEngine::Tls { host, .. } | EnvEngine::PlainLoopback(host) => host.clone(),
        }
    }

    /// A client for this engine (no request made yet).
    pub fn client(&self) -> Result<Docker, String> {
        match self {
            EnvEngine::Unix(path) => {
                Docker::connect_with_unix(path, TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
                    .map_err(|e| e.to_string())
            }
            EnvEngine::Tls { host, certs } => tls_client(host, certs),
            EnvEngine::PlainLoopback(host) => {
                Docker::connect_with_http(host, TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// Whether `addr` (`HOST:PORT`, a path may follow) is a loopback address: `127.0.0.0/8`,
/// `[::1]` or `localhost`.
fn is_loopback(addr: &str) -> bool {
    let hostport = addr.split('/').next().unwrap_or("");
    let host = match hostport.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => hostport.rsplit_once(':').map_or(hostport, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Request timeout of the engine clients, as bollard's default.
const TIMEOUT_SECS: u64 = 120;

/// A TLS client for `host` (`tcp://HOST:PORT`) with the client certificate of `dir` that
/// trusts only `dir/ca.pem`, as Docker's own client does. (bollard's `connect_with_ssl`
/// adds the system's roots, so any public CA could vouch for the engine.)
fn tls_client(host: &str, dir: &Path) -> Result<Docker, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let file = |name: &str| -> Result<PathBuf, String> {
        let p = dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "the TLS file {} is missing (the certificates' directory needs {})",
                p.display(),
                TLS_FILES.join(", ")
            ))
        }
    };
    let (ca, cert, key) = (file("ca.pem")?, file("cert.pem")?, file("key.pem")?);
    let unreadable = |p: &Path| format!("the TLS file {} is not readable PEM", p.display());
    let roots = trusted_roots(&ca)?;
    let chain = CertificateDer::pem_file_iter(&cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|_| unreadable(&cert))?;
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|_| unreadable(&key))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .map_err(|e| format!("the client certificate in {}: {e}", dir.display()))?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnector::from((http, config));
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(https);
    let addr = host
        .strip_prefix("tcp://")
        .or_else(|| host.strip_prefix("https://"))
        .unwrap_or(host);
    Docker::connect_with_custom_transport(
        move |req: BollardRequest| {
            let client = client.clone();
            async move {
                client
                    .request(req)
                    .await
                    .map_err(bollard::errors::Error::from)
            }
        },
        Some(format!("https://{addr}")),
        TIMEOUT_SECS,
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|e| e.to_string())
}

/// The roots a TLS engine is checked against: the certificates of `ca` and nothing else.
pub fn trusted_roots(ca: &Path) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|_| format!("the TLS file {} is not readable PEM", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "the TLS file {} holds no CA certificate",
            ca.display()
        ));
    }
    Ok(roots)
}

/// Checks a whole list: each entry, and names and hosts used once.
pub fn check_list(engines: &[EngineConfig]) -> Result<(), String> {
    for (i, e) in engines.iter().enumerate() {
        if let Some(p) = e.problem() {
            return Err(p);
        }
        if engines[..i].iter().any(|o| o.name == e.name) {
            return Err(format!("engine name {:?} is used twice", e.name));
        }
        if engines[..i].iter().any(|o| o.host == e.host) {
            return Err(format!("engine host {:?} is listed twice", e.host));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(name: &str, host: &str, tls: Option<&str>) -> EngineConfig {
        EngineConfig {
            name: name.into(),
            host: host.into(),
            tls_cert_path: tls.map(PathBuf::from),
            max_runs: 2,
            warm_sandboxes: None,
        }
    }

    #[test]
    fn entries_are_checked() {
        assert_eq!(
            engine("local", "unix:///var/run/docker.sock", None).problem(),
            None
        );
        assert_eq!(
            engine("b2", "tcp://10.0.0.5:2376", Some("/etc/kodx/b2")).problem(),
            None
        );
        let plain = engine("b2", "tcp://10.0.0.5:2375", None).problem().unwrap();
        assert!(plain.contains("needs `tls_cert_path`"), "{plain}");
        let scheme = engine("b2", "http://x:1", None).problem().unwrap();
        assert!(scheme.contains("unix:// or tcp://"), "{scheme}");
        assert!(engine("no port", "tcp://x", Some("/t")).problem().is_some());
        assert!(engine("a b", "unix:///s", None).problem().is_some());
        let mut zero = engine("z", "unix:///s", None);
        zero.max_runs = 0;
        assert!(zero.problem().unwrap().contains("max_runs"));
        assert!(engine("u", "unix:///s", Some("/t"))
            .problem()
            .unwrap()
            .contains("unix socket has no TLS"));
    }

    #[test]
    fn lists_name_each_engine_once() {
        let a = engine("a", "unix:///a", None);
        let b = engine("b", "unix:///b", None);
        assert_eq!(check_list(&[a.clone(), b.clone()]), Ok(()));
        let mut dup = b.clone();
        dup.name = "a".into();
        assert!(check_list(&[a.clone(), dup])
            .unwrap_err()
            .contains("used twice"));
        let mut same_host = b;
        same_host.host = a.host.clone();
        assert!(check_list(&[a, same_host])
            .unwrap_err()
            .contains("listed twice"));
    }

    #[test]
    fn missing_tls_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(
            "b2",
            "tcp://127.0.0.1:1",
            Some(dir.path().to_str().unwrap()),
        );
        let err = e.client().err().unwrap();
        assert!(err.contains("ca.pem") && err.contains("missing"), "{err}");
    }

    fn env(vars: &[(&str, &str)]) -> Result<EnvEngine, String> {
        EnvEngine::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn docker_host_over_plain_tcp_is_refused_as_in_engines() {
        let err = env(&[("DOCKER_HOST", "tcp://10.0.0.5:2375")]).unwrap_err();
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(
            err.starts_with("DOCKER_HOST=tcp://10.0.0.5:2375: a tcp:// engine needs DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH"),
            "{err}"
        );
        // The same rule and reason as an `[[engines]]` entry.
        let listed = engine("b2", "tcp://10.0.0.5:2375", None).problem().unwrap();
        let reason = "the Docker API over plain TCP gives root on that host";
        assert!(
            err.contains(reason) && listed.contains(reason),
            "{err}\n{listed}"
        );
        // DOCKER_TLS_VERIFY=0 is no TLS; the opt-in does not cover another host.
        assert!(env(&[
            ("DOCKER_HOST", "tcp://10.0.0.5:2375"),
            ("DOCKER_TLS_VERIFY", "0")
        ])
        .is_err());
        assert!(env(&[
            ("DOCKER_HOST", "tcp://10.0.0.5:2375"),
            (PLAIN_LOOPBACK_ENV, "1")
        ])
        .is_err());
        assert!(env(&[("DOCKER_HOST", "tcp://127.0.0.1:2375")]).is_err());
        for host in [
            "tcp://127.0.0.1:2375",
            "tcp://localhost:2375",
            "tcp://[::1]:2375",
        ] {
            assert_eq!(
                env(&[("DOCKER_HOST", host), (PLAIN_LOOPBACK_ENV, "1")]),
                Ok(EnvEngine::PlainLoopback(host.into())),
                "{host}"
            );
        }
        assert!(env(&[("DOCKER_HOST", "ssh://me@host")])
            .unwrap_err()
            .contains("unix:// or tcp://"));
    }

    #[test]
    fn docker_host_with_tls_or_a_socket_is_taken() {
        assert_eq!(env(&[]), Ok(EnvEngine::Unix("/var/run/docker.sock".into())));
        assert_eq!(
            env(&[
                ("DOCKER_HOST", "unix:///run/d.sock"),
                (PLAIN_LOOPBACK_ENV, "1")
            ]),
            Ok(EnvEngine::Unix("/run/d.sock".into()))
        );
        assert_eq!(
            env(&[
                ("DOCKER_HOST", "tcp://h:2376"),
                ("DOCKER_TLS_VERIFY", "1"),
                ("DOCKER_CERT_PATH", "/c")
            ]),
            Ok(EnvEngine::Tls {
                host: "tcp://h:2376".into(),
                certs: "/c".into()
            })
        );
        assert_eq!(
            env(&[
                ("DOCKER_HOST", "tcp://h:2376"),
                ("DOCKER_TLS_VERIFY", "1"),
                ("HOME", "/home/k")
            ]),
            Ok(EnvEngine::Tls {
                host: "tcp://h:2376".into(),
                certs: "/home/k/.docker".into()
            })
        );
    }

    #[test]
    fn a_tls_engine_trusts_its_ca_pem_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        // A self-signed CA (the shape `tests/engines/engine.sh` makes).
        let made = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=kodx-test-ca",
            ])
            .arg("-keyout")
            .arg(dir.path().join("ca-key.pem"))
            .arg("-out")
            .arg(&ca)
            .output()
            .expect("openssl runs");
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let roots = trusted_roots(&ca).unwrap();
        assert_eq!(roots.len(), 1, "only ca.pem, no system roots");
        std::fs::write(&ca, "not a certificate").unwrap();
        assert!(trusted_roots(&ca)
            .unwrap_err()
            .contains("no CA certificate"));
    }
}
