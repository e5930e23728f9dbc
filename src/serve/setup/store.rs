//! The App's credentials as setup saves them: one JSON file, `github-app.json`, under the
//! data directory, mode 0600 in a directory kodx creates with mode 0700, written to a
//! temporary file and renamed into place (a crash leaves the old file or the new one).
//! Its values are never logged; in memory they are `secrecy` types.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret, SecretString};
use serde_json::{json, Value};

use crate::webhook::WebhookSecrets;

/// What a GitHub App needs to act.
#[derive(Debug, Clone)]
pub struct AppCredentials {
    pub app_id: u64,
    /// PEM text.
    pub private_key: SecretString,
    pub webhook_secrets: WebhookSecrets,
}

/// The file's name under the data directory.
pub const FILE_NAME: &str = "github-app.json";

/// Larger files are refused (a key is ~1.7 KB).
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// What setup saves.
#[derive(Debug, Clone)]
pub struct SavedApp {
    pub app_id: u64,
    /// PEM text.
    pub private_key: SecretString,
    pub webhook_secret: SecretString,
    /// The App's slug and settings page, when GitHub said (the manifest flow does).
    pub slug: Option<String>,
    pub html_url: Option<String>,
}

/// Why the saved credentials cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: cannot {doing}: {source}")]
    Io {
        path: String,
        doing: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: {problem} (remove the file to run setup again)")]
    Invalid { path: String, problem: String },
}

impl SavedApp {
    /// The credentials the server runs with. The saved secret is ONE secret, commas and
    /// all: it is what GitHub signs with, and read as a list (`WEBHOOK_SECRET`'s rotation
    /// syntax) a part of it (`x` of `long,x`) would be a valid key.
    pub fn credentials(&self) -> Result<AppCredentials, String> {
        let webhook_secrets = WebhookSecrets::one(self.webhook_secret.expose_secret())
            .map_err(|e| format!("webhook_secret: {e}"))?;
        Ok(AppCredentials {
            app_id: self.app_id,
            private_key: self.private_key.clone(),
            webhook_secrets,
        })
    }
}

/// Where the credentials are saved under `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// The saved credentials, `None` when nothing was saved.
pub fn load(data_dir: &Path) -> Result<Option<SavedApp>, StoreError> {
    let path = path(data_dir);
    let shown = path.display().to_string();
    let io = |doing, source| StoreError::Io {
        path: shown.clone(),
        doing,
        source,
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read the saved GitHub App credentials", e)),
    };
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| io("read the saved GitHub App credentials", e))?;
    let invalid = |problem: &str| StoreError::Invalid {
        path: shown.clone(),
        problem: problem.to_string(),
    };
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(invalid("larger than 64 KiB: not a file kodx wrote"));
    }
    // Errors name fields, never quote values.
    let v: Value = serde_json::from_str(&text).map_err(|_| invalid("not JSON"))?;
    let string = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    let app_id = v
        .get("app_id")
        .and_then(Value::as_u64)
        .filter(|&id| id > 0)
        .ok_or_else(|| invalid("no numeric `app_id`"))?;
    let private_key = string("private_key")
        .filter(|k| k.contains("PRIVATE KEY"))
        .ok_or_else(|| invalid("no PEM `private_key`"))?;
    let webhook_secret = string("webhook_secret")
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| invalid("no `webhook_secret`"))?;
    Ok(Some(SavedApp {
        app_id,
        private_key: private_key.into(),
        webhook_secret: webhook_secret.into(),
        slug: string("slug"),
        html_url: string("html_url"),
    }))
}

/// Saves `app` under `data_dir` (created with mode 0700 if missing), mode 0600, replacing
/// what was there; returns the file's path.
pub fn save(data_dir: &Path, app: &SavedApp) -> Result<PathBuf, StoreError> {
    let target = path(data_dir);
    let io = |doing, source| StoreError::Io {
        path: target.display().to_string(),
        doing,
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(|e| io("create the data directory (KODX_DATA_DIR)", e))?;
    let text = json!({
        "app_id": app.app_id,
        "slug": app.slug,
        "html_url": app.html_url,
        "private_key": app.private_key.expose_secret(),
        "webhook_secret": app.webhook_secret.expose_secret(),
    })
    .to_string();
    let tmp = data_dir.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = create_new(&tmp)?;
        // The umask may have taken bits away: exactly 0600.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("save the GitHub App credentials", e)
    })?;
    Ok(target)
}

/// A new file at `path`, mode 0600, made by this call: never one that was there, and never
/// through a symlink (`O_CREAT|O_EXCL|O_NOFOLLOW`), so a link planted at the temporary
/// name cannot make kodx write its secrets elsewhere. What is at the name (a leftover of
/// a crash, or a planted link) is removed first: `remove_file` removes a link itself.
fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> SavedApp {
        SavedApp {
            app_id: 42,
            private_key: "-----BEGIN RSA PRIVATE KEY-----\nk\n-----END RSA PRIVATE KEY-----\n"
                .to_string()
                .into(),
            webhook_secret: "hook-secret-value".to_string().into(),
            slug: Some("kodx-abc".into()),
            html_url: Some("https://github.com/apps/kodx-abc".into()),
        }
    }

    #[test]
    fn saved_credentials_round_trip_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert!(load(&data).unwrap().is_none(), "nothing saved yet");
        let path = save(&data, &app()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        let back = load(&data).unwrap().unwrap();
        assert_eq!(back.app_id, 42);
        assert_eq!(
            back.private_key.expose_secret(),
            app().private_key.expose_secret()
        );
        assert_eq!(back.slug.as_deref(), Some("kodx-abc"));
        assert!(back.credentials().is_ok());
        assert!(
            !format!("{back:?}").contains("hook-secret-value"),
            "the secret never prints"
        );
        // Saving again replaces, and a looser existing mode is tightened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut other = app();
        other.app_id = 43;
        save(&data, &other).unwrap();
        assert_eq!(load(&data).unwrap().unwrap().app_id, 43);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let leftovers: Vec<_> = std::fs::read_dir(&data).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left");
    }

    #[test]
    fn a_symlink_at_the_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let tmp = data.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let path = save(&data, &app()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert_eq!(load(&data).unwrap().unwrap().app_id, 42);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn an_imported_secret_with_a_comma_is_one_secret() {
        let mut a = app();
        a.webhook_secret = "long-secret,x".to_string().into();
        let secrets = a.credentials().unwrap().webhook_secrets;
        let body = b"{}";
        let signed = |secret: &str| {
            crate::webhook::WebhookSecrets::one(secret)
                .unwrap()
                .sign(body)
        };
        assert!(secrets.verify(Some(&signed("long-secret,x")), body).is_ok());
        assert!(secrets.verify(Some(&signed("x")), body).is_err());
        assert!(secrets.verify(Some(&signed("long-secret")), body).is_err());
    }

    #[test]
    fn a_damaged_file_is_named_without_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            path(dir.path()),
            "{\"app_id\": 7, \"webhook_secret\": \"zzz-secret\"}",
        )
        .unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("private_key") && e.contains(FILE_NAME), "{e}");
        assert!(!e.contains("zzz-secret"), "{e}");
        std::fs::write(path(dir.path()), "not json zzz-secret").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not JSON") && !e.contains("zzz-secret"), "{e}");
    }
}
