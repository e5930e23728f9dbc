//! The secrets a run uses (SPEC §12, "Egress by name"): the ones `.github/kodx.yml` names,
//! read from the database and opened with this process's key ([`crate::secrets`]) — the
//! `setup_only` ones for the setup script's environment, the ones with `hosts:` for the
//! egress proxy to inject on the wire. One that is not set, or that this process cannot
//! open, is left out and named in the status comment with what to do; the run goes on.

use secrecy::ExposeSecret as _;

use super::ending::RunLog;
use super::Services;
use crate::db::Run;
use crate::egress::Injection;
use crate::repo_config::RepoConfig;
use crate::sandbox::SetupSecret;
use crate::secrets::SecretsKey;
use crate::serve::texts;

/// The secrets a run got, by how it uses them.
#[derive(Default)]
pub(super) struct RunSecrets {
    /// For the setup script's environment alone.
    pub setup: Vec<SetupSecret>,
    /// For the egress proxy to put on the wire, to their hosts only.
    pub injected: Vec<Injection>,
}

/// The run's secrets; what was left out goes to `log` for the status comment.
pub(super) async fn run_secrets(
    svc: &Services,
    run: &Run,
    config: &RepoConfig,
    log: &RunLog,
) -> RunSecrets {
    let mut out = RunSecrets::default();
    if config.secrets.is_empty() {
        return out;
    }
    let repo = &run.request.repo;
    let dir = svc.settings.secrets_dir.clone().unwrap_or_default();
    let key = SecretsKey::load(&dir, false);
    let mut missing = Vec::new();
    for spec in &config.secrets {
        let name = spec.name.as_str();
        let why = match (&key, svc.db.sealed_secret(repo, name).await) {
            (_, Ok(None)) => "not set".to_string(),
            (_, Err(e)) => format!("it could not be read: {e}"),
            (Ok(None), Ok(Some(_))) => "this server has no key for its secrets".to_string(),
            (Err(e), Ok(Some(_))) => e.to_string(),
            (Ok(Some(key)), Ok(Some(sealed))) => match key.open(repo, name, &sealed) {
                Ok(value) => {
                    let value = value.expose_secret().to_string();
                    match &spec.hosts {
                        Some(hosts) => out.injected.push(Injection {
                            name: name.to_string(),
                            value,
                            hosts: hosts.clone(),
                        }),
                        None => out.setup.push(SetupSecret {
                            name: name.to_string(),
                            value,
                        }),
                    }
                    continue;
                }
                Err(e) => e.to_string(),
            },
        };
        tracing::warn!(secret = name, "a secret was left out: {why}");
        missing.push((name.to_string(), why));
    }
    if !missing.is_empty() {
        *log.secrets_note.lock() = Some(texts::secrets_left_out(repo, &missing));
    }
    out
}
