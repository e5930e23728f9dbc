//! A sandbox narrowed to kodx's egress proxy after its setup (SPEC §12, "Egress by name"):
//! the network fence keeps the proxy's port on the gateway alone ([`crate::net::narrow`]),
//! and the shells find the proxy, and the run's CA when there is one, in the variables of
//! [`ENV_PATH`], which every shell reads as it starts.

use super::engine::Engine;
use super::sandbox::DockerSandbox;
use super::setup::exec_checked;
use super::spec::EgressSpec;
use super::streams::upload;
use crate::archive;
use crate::net::{self, NETWORK_NAME};
use crate::shell::ENV_PATH;
use crate::Result;

/// Where the run's CA certificate is put.
const CA_PATH: &str = "/tmp/.kodx/egress-ca.pem";
/// The image's trust bundle with the run's CA after it.
const BUNDLE_PATH: &str = "/tmp/.kodx/ca-bundle.pem";
/// Addresses every client reaches directly: the sandbox's own servers.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// Makes the bundle: the image's first system bundle found (Debian, Fedora, Alpine,
/// openSUSE paths) and the CA; the CA is appended to that system bundle too where it is
/// writable, for clients that read it whatever the variables say.
const BUNDLE_SCRIPT: &str = r#"set -e
for b in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem /etc/ssl/ca-bundle.pem; do
  if [ -f "$b" ]; then cat "$b" > /tmp/.kodx/ca-bundle.pem; { cat /tmp/.kodx/egress-ca.pem >> "$b"; } 2>/dev/null || true; break; fi
done
cat /tmp/.kodx/egress-ca.pem >> /tmp/.kodx/ca-bundle.pem
"#;

impl Engine {
    /// Narrows `sandbox`'s network to the egress proxy and writes the shells' variables.
    pub(super) async fn narrow_network(
        &self,
        sandbox: &DockerSandbox,
        egress: &EgressSpec,
    ) -> Result<()> {
        let network = net::ensure_network(&self.docker, NETWORK_NAME).await?;
        let env = env_file(&network.gateway.to_string(), egress);
        let mut files: Vec<(&str, &[u8], u32)> = vec![(&ENV_PATH[1..], env.as_bytes(), 0o644)];
        if let Some(ca) = &egress.ca_pem {
            files.push((&CA_PATH[1..], ca.as_bytes(), 0o644));
        }
        upload(&self.docker, &sandbox.id, "/", archive::pack_files(&files)).await?;
        if egress.ca_pem.is_some() {
            exec_checked(
                &self.docker,
                &sandbox.id,
                BUNDLE_SCRIPT,
                "adding the run's CA to the sandbox's trust",
            )
            .await?;
        }
        let addr = net::narrow(
            &self.docker,
            &self.host,
            &sandbox.id,
            sandbox.run_id(),
            &network,
            egress.port,
        )
        .await?;
        *sandbox.egress_address.lock() = Some(addr);
        Ok(())
    }
}

/// The shells' variables (read with `set -a`): the proxy, and the CA's files when there is
/// a CA.
fn env_file(gateway: &str, egress: &EgressSpec) -> String {
    let proxy = format!("http://{gateway}:{}", egress.port);
    let mut vars = vec![
        ("HTTP_PROXY", proxy.as_str()),
        ("HTTPS_PROXY", proxy.as_str()),
        ("http_proxy", proxy.as_str()),
        ("https_proxy", proxy.as_str()),
        ("NO_PROXY", NO_PROXY),
        ("no_proxy", NO_PROXY),
    ];
    if egress.ca_pem.is_some() {
        vars.extend([
            ("SSL_CERT_FILE", BUNDLE_PATH),
            ("REQUESTS_CA_BUNDLE", BUNDLE_PATH),
            ("PIP_CERT", BUNDLE_PATH),
            ("CARGO_HTTP_CAINFO", BUNDLE_PATH),
            ("GIT_SSL_CAINFO", BUNDLE_PATH),
            ("CURL_CA_BUNDLE", BUNDLE_PATH),
            ("NODE_EXTRA_CA_CERTS", CA_PATH),
        ]);
    }
    let mut out: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    for name in &egress.placeholders {
        // Names are checked where they come from (`[A-Z_][A-Z0-9_]*`); anything else is
        // left out rather than written into a file the shells source.
        if !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            out.push_str(&format!("{name}=kodx-secret:{name}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shells_find_the_proxy_and_the_ca() {
        let plain = EgressSpec {
            port: 41234,
            ca_pem: None,
            placeholders: Vec::new(),
        };
        let env = env_file("172.18.0.1", &plain);
        assert!(
            env.contains("HTTPS_PROXY=http://172.18.0.1:41234\n"),
            "{env}"
        );
        assert!(env.contains("no_proxy=localhost,127.0.0.1,::1\n"), "{env}");
        assert!(!env.contains("SSL_CERT_FILE"), "{env}");
        let with_ca = EgressSpec {
            port: 1,
            ca_pem: Some("-----BEGIN CERTIFICATE-----".into()),
            placeholders: vec!["NPM_TOKEN".into(), "bad name; rm -rf /".into()],
        };
        let env = env_file("10.0.0.1", &with_ca);
        assert!(
            env.contains("SSL_CERT_FILE=/tmp/.kodx/ca-bundle.pem\n"),
            "{env}"
        );
        assert!(
            env.contains("NODE_EXTRA_CA_CERTS=/tmp/.kodx/egress-ca.pem\n"),
            "{env}"
        );
        assert!(env.contains("\nNPM_TOKEN=kodx-secret:NPM_TOKEN\n"), "{env}");
        assert!(!env.contains("rm -rf"), "{env}");
        assert_eq!(
            format!("{with_ca:?}"),
            "EgressSpec { port: 1, ca: true, placeholders: [\"NPM_TOKEN\", \"bad name; rm -rf /\"] }"
        );
    }
}
