//! Which Docker engines sandboxes run on: the server config's `[[engines]]` list (a local
//! socket, or `tcp://HOST:2376` with TLS client certificates), or, when it is empty, the one
//! engine `DOCKER_HOST` or the local socket names.

use std::path::PathBuf;

use bollard::Docker;
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
}

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
                return Some(format!(
                    "engine {}: a tcp:// engine needs `tls_cert_path` (a directory with ca.pem, \
                     cert.pem and key.pem): the Docker API over plain TCP gives root on that \
                     host to anyone who reaches the port",
                    self.name
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
        const TIMEOUT_SECS: u64 = 120;
        match &self.tls_cert_path {
            Some(dir) => {
                let file = |name: &str| -> Result<PathBuf, String> {
                    let p = dir.join(name);
                    if p.is_file() {
                        Ok(p)
                    } else {
                        Err(format!(
                            "the TLS file {} is missing (tls_cert_path needs {})",
                            p.display(),
                            TLS_FILES.join(", ")
                        ))
                    }
                };
                let (ca, cert, key) = (file("ca.pem")?, file("cert.pem")?, file("key.pem")?);
                Docker::connect_with_ssl(
                    &self.host,
                    &key,
                    &cert,
                    &ca,
                    TIMEOUT_SECS,
                    bollard::API_DEFAULT_VERSION,
                )
                .map_err(|e| e.to_string())
            }
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
}
