//! The secrets a run's setup script gets (SPEC §12, "Egress by name"): the `setup_only`
//! ones `.github/kodx.yml` names, read from the database and opened with this process's
//! key ([`crate::secrets`]). One that is not set, or that this process cannot open, is
//! left out and named in the status comment with what to do; the run goes on.

use secrecy::ExposeSecret as _;

use super::ending::RunLog;
use super::Services;
use crate::db::Run;
use crate::repo_config::RepoConfig;
use crate::sandbox::SetupSecret;
use crate::secrets::SecretsKey;
use crate::serve::texts;

/// The run's setup secrets; what was left out goes to `log` for the status comment.
pub(super) async fn setup_secrets(
    svc: &Services,
    run: &Run,
    config: &RepoConfig,
    log: &RunLog,
) -> Vec<SetupSecret> {
    let wanted: Vec<&str> = config
        .secrets
        .iter()
        .filter(|s| s.setup_only)
        .map(|s| s.name.as_str())
        .collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let repo = &run.request.repo;
    let dir = svc.settings.secrets_dir.clone().unwrap_or_default();
    let key = SecretsKey::load(&dir, false);
    let mut got = Vec::new();
    let mut missing = Vec::new();
    for name in wanted {
        let why = match (&key, svc.db.sealed_secret(repo, name).await) {
            (_, Ok(None)) => "not set".to_string(),
            (_, Err(e)) => format!("it could not be read: {e}"),
            (Ok(None), Ok(Some(_))) => "this server has no key for its secrets".to_string(),
            (Err(e), Ok(Some(_))) => e.to_string(),
            (Ok(Some(key)), Ok(Some(sealed))) => match key.open(repo, name, &sealed) {
                Ok(value) => {
                    got.push(SetupSecret {
                        name: name.to_string(),
                        value: value.expose_secret().to_string(),
                    });
                    continue;
                }
                Err(e) => e.to_string(),
            },
        };
        tracing::warn!(secret = name, "a setup secret was left out: {why}");
        missing.push((name.to_string(), why));
    }
    if !missing.is_empty() {
        *log.secrets_note.lock() = Some(texts::secrets_left_out(repo, &missing));
    }
    got
}
