//! `kodx secret set|list|rm`: the secrets kodx keeps for a repository's runs (SPEC §12), in
//! the database `kodx serve` uses (`DATABASE_URL`, the same environment and
//! `KODX_CONFIG`), sealed under the deployment's key ([`kodx::secrets`]). A value is read
//! from standard input and never printed.

use std::io::Read as _;
use std::process::ExitCode;

use anyhow::Context;
use kodx::db::Db;
use kodx::secrets::{check_name, value_from_input, SecretsKey, MAX_PER_REPO, MAX_VALUE_BYTES};
use kodx::serve::config::SetupConfig;

#[derive(clap::Subcommand)]
pub enum SecretCommand {
    /// Store (or replace) a secret; its value is read from standard input (one trailing
    /// newline dropped), e.g. `printf %s "$TOKEN" | kodx secret set acme/widgets NPM_TOKEN`.
    Set {
        /// The repository, `OWNER/REPO`.
        repo: String,
        /// The secret's name, as the repository's `.github/kodx.yml` names it (`NPM_TOKEN`).
        name: String,
    },
    /// The names of a repository's secrets, never their values.
    List {
        /// The repository, `OWNER/REPO`.
        repo: String,
    },
    /// Remove a repository's secret.
    Rm {
        /// The repository, `OWNER/REPO`.
        repo: String,
        name: String,
    },
}

pub async fn run(cmd: SecretCommand) -> anyhow::Result<ExitCode> {
    let config = SetupConfig::from_env()?;
    let repo = match &cmd {
        SecretCommand::Set { repo, .. }
        | SecretCommand::List { repo }
        | SecretCommand::Rm { repo, .. } => repo.clone(),
    };
    kodx::repo_cache::RepoKey::parse(&repo)
        .map_err(|e| anyhow::anyhow!("{e}: write the repository as OWNER/REPO"))?;
    let url = &config.database_url;
    let db = Db::open(url)
        .await
        .with_context(|| format!("opening {}", kodx::db::shown_url(url)))?;
    match cmd {
        SecretCommand::Set { name, .. } => {
            check_name(&name)?;
            let key = SecretsKey::load(&config.data_dir, true)?
                .expect("a key is made when there is none");
            // One deployment, one key: a database holding secrets under another key is
            // not given a second one.
            if let Some(other) = db
                .secret_key_ids()
                .await?
                .into_iter()
                .find(|id| id != key.id())
            {
                anyhow::bail!(
                    "this database's secrets are under key {other}, and this process has key {}: \
                     give it the deployment's key (`KODX_SECRETS_KEY`, or the same `secrets.key` \
                     in `KODX_DATA_DIR`); nothing was stored",
                    key.id()
                );
            }
            let names = db.secret_names(&repo).await?;
            if names.len() >= MAX_PER_REPO && !names.iter().any(|e| e.name == name) {
                anyhow::bail!("{repo} has {MAX_PER_REPO} secrets already; remove one first");
            }
            let mut input = Vec::new();
            std::io::stdin()
                .take(MAX_VALUE_BYTES as u64 + 3)
                .read_to_end(&mut input)
                .context("reading the value from standard input")?;
            let value = value_from_input(input)?;
            let sealed = key.seal(&repo, &name, &value)?;
            db.put_secret(&repo, &name, &sealed).await?;
            println!(
                "stored {name} for {} ({} bytes, sealed under key {})",
                repo.to_ascii_lowercase(),
                value.len(),
                key.id()
            );
        }
        SecretCommand::List { .. } => {
            let key = SecretsKey::load(&config.data_dir, false)?;
            let names = db.secret_names(&repo).await?;
            if names.is_empty() {
                println!("{} has no secrets", repo.to_ascii_lowercase());
            }
            for e in names {
                let when = chrono::DateTime::from_timestamp_millis(e.updated_at)
                    .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                    .unwrap_or_default();
                let readable = match &key {
                    Some(k) if k.id() == e.key_id => String::new(),
                    _ => format!(
                        "  (sealed under key {}, which this process does not have)",
                        e.key_id
                    ),
                };
                println!("{}  set {when}{readable}", e.name);
            }
        }
        SecretCommand::Rm { name, .. } => {
            if !db.remove_secret(&repo, &name).await? {
                eprintln!(
                    "kodx: {} has no secret {name}; `kodx secret list {repo}` shows its secrets",
                    repo.to_ascii_lowercase()
                );
                db.close().await;
                return Ok(ExitCode::from(1));
            }
            println!("removed {name} from {}", repo.to_ascii_lowercase());
        }
    }
    db.close().await;
    Ok(ExitCode::SUCCESS)
}
