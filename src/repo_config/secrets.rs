//! `secrets:` of `.github/kodx.yml` (SPEC §12, "Egress by name"): which of the secrets kodx
//! keeps for the repository (`kodx secret set`) a run uses, and how. A value is never in
//! the file: only its name.
//!
//! ```yaml
//! secrets:
//!   - { name: NPM_TOKEN, hosts: [npm.pkg.github.com] }   # injected on the wire, never in the sandbox
//!   - { name: TEST_DB_PASSWORD, setup_only: true }       # the setup script's environment only
//! ```
//!
//! A secret with `hosts:` is a placeholder in the sandbox, replaced by kodx's egress proxy
//! in requests to those hosts only: a repository that names one gets the proxy after setup
//! even without `network.allow`, and those hosts are reachable.

use serde::Deserialize;

use super::values::Text;

/// The most secrets a repository's config names.
pub const MAX_SECRETS: usize = 20;

/// One secret a run uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    /// As `kodx secret set` stored it (`NPM_TOKEN`), and the variable's name.
    pub name: String,
    /// In the setup script's environment only.
    pub setup_only: bool,
    /// Injected on the wire by the egress proxy in requests to these hosts (written like
    /// `network.allow` entries); `None` for a `setup_only` secret.
    pub hosts: Option<crate::egress::AllowList>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys name, setup_only, hosts"
)]
struct RawSecret {
    name: Text,
    setup_only: Option<bool>,
    hosts: Option<Vec<Text>>,
}

/// `secrets:`, checked.
pub(super) struct Secrets(pub(super) Vec<SecretSpec>);

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let list: Vec<RawSecret> = Vec::deserialize(deserializer)?;
        if list.len() > MAX_SECRETS {
            return Err(D::Error::custom(format!(
                "must name at most {MAX_SECRETS} secrets, got {}",
                list.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(list.len());
        for s in list {
            let name = s.name.0;
            crate::secrets::check_name(&name).map_err(|e| D::Error::custom(e.to_string()))?;
            if !seen.insert(name.clone()) {
                return Err(D::Error::custom(format!("names {name} twice")));
            }
            let hosts = match s.hosts {
                Some(hosts) if hosts.is_empty() => {
                    return Err(D::Error::custom(format!(
                        "{name}: `hosts:` names no host; list where the secret is sent"
                    )))
                }
                Some(hosts) => Some(
                    crate::egress::AllowList::parse(hosts.iter().map(|h| h.0.as_str()))
                        .map_err(|e| D::Error::custom(format!("{name}: hosts: {e}")))?,
                ),
                None => None,
            };
            match (s.setup_only == Some(true), hosts.is_some()) {
                (true, true) => {
                    return Err(D::Error::custom(format!(
                        "{name}: either `setup_only: true` (the setup script's environment) or \
                         `hosts:` (injected on the wire), not both"
                    )))
                }
                (false, false) => {
                    return Err(D::Error::custom(format!(
                        "{name}: say how the run uses it: `setup_only: true` (the setup \
                         script's environment only) or `hosts: [...]` (injected on the wire \
                         by kodx's egress proxy in requests to those hosts)"
                    )))
                }
                _ => {}
            }
            out.push(SecretSpec {
                name,
                setup_only: hosts.is_none(),
                hosts,
            });
        }
        Ok(Secrets(out))
    }
}

/// `network:` of `.github/kodx.yml` (SPEC §12, "Egress by name"): `allow`, the hosts the
/// sandbox reaches through kodx's egress proxy after its setup script.
pub(super) struct Network {
    pub(super) allow: crate::egress::AllowList,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with the key allow")]
struct RawNetwork {
    allow: Vec<Text>,
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = RawNetwork::deserialize(deserializer)?;
        crate::egress::AllowList::parse(raw.allow.iter().map(|t| t.0.as_str()))
            .map(|allow| Network { allow })
            .map_err(|e| D::Error::custom(format!("network.allow: {e}")))
    }
}
