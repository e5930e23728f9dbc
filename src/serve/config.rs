//! The configuration of `kodx serve` (SPEC §2): Probot's environment names for what a GitHub
//! App needs, and a TOML file (`KODX_CONFIG`, default `config/kodx.toml`) for the server's
//! limits.
//!
//! Secrets are held in `secrecy` types that never print themselves.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use secrecy::SecretString;

use crate::db::DEFAULT_DATABASE_URL;
pub use crate::serve::settings::{ConfigError, Settings, LEASE_SLACK};
pub use crate::serve::setup::store::AppCredentials;
use crate::webhook::WebhookSecrets;

/// Where the server config file is looked for when `KODX_CONFIG` is not set.
pub const DEFAULT_CONFIG_PATH: &str = "config/kodx.toml";
pub const DEFAULT_GITHUB_API_URL: &str = "https://api.github.com";
/// Where `kodx serve` keeps what it saves itself (the App's credentials after setup) when
/// `KODX_DATA_DIR` is not set; the default database lives there too.
pub const DEFAULT_DATA_DIR: &str = "data";

/// Where the App's id, key and webhook secret came from.
#[derive(Debug, Clone, PartialEq)]
pub enum CredentialSource {
    /// `APP_ID`, `PRIVATE_KEY`/`PRIVATE_KEY_PATH`, `WEBHOOK_SECRET` (these win).
    Environment,
    /// Saved by the setup page (or an import) in this file.
    Saved(PathBuf),
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Environment => {
                f.write_str("environment (APP_ID, PRIVATE_KEY/PRIVATE_KEY_PATH, WEBHOOK_SECRET)")
            }
            CredentialSource::Saved(p) => write!(f, "saved by setup in {}", p.display()),
        }
    }
}

/// How `kodx serve` starts: with an App, or in setup mode without one.
#[derive(Debug, Clone)]
pub enum Startup {
    Ready(ServeConfig),
    Setup(SetupConfig),
}

/// Everything but the App's credentials: what setup mode runs with, and what the server
/// runs with once setup has given it an App.
#[derive(Debug, Clone)]
pub struct SetupConfig {
    /// `127.0.0.1:PORT` unless `HOST` was set.
    pub listen: SocketAddr,
    pub github_api_url: String,
    pub github_url: String,
    pub database_url: String,
    pub public_url: Option<String>,
    /// `WEBHOOK_PROXY_URL`: a smee.io-style channel to receive webhooks from.
    pub webhook_proxy_url: Option<String>,
    pub data_dir: PathBuf,
    pub config_file: Option<PathBuf>,
    pub settings: Settings,
}

impl SetupConfig {
    /// The server's configuration once it has an App.
    pub fn with_credentials(self, app: AppCredentials, source: CredentialSource) -> ServeConfig {
        ServeConfig {
            app_id: app.app_id,
            private_key: app.private_key,
            webhook_secrets: app.webhook_secrets,
            credential_source: source,
            github_api_url: self.github_api_url,
            github_url: self.github_url,
            listen: self.listen,
            database_url: self.database_url,
            public_url: self.public_url,
            webhook_proxy_url: self.webhook_proxy_url,
            data_dir: self.data_dir,
            config_file: self.config_file,
            settings: self.settings,
        }
    }
}

/// Everything `kodx serve` runs with.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub app_id: u64,
    /// The App's PEM private key (`expose_secret` reads it).
    pub private_key: SecretString,
    pub webhook_secrets: WebhookSecrets,
    pub credential_source: CredentialSource,
    pub github_api_url: String,
    /// GitHub's web host (`GITHUB_URL`): where Apps are created and installed.
    pub github_url: String,
    pub listen: SocketAddr,
    pub database_url: String,
    pub public_url: Option<String>,
    /// `WEBHOOK_PROXY_URL`: a smee.io-style channel webhooks are also received from
    /// (for a server GitHub cannot reach).
    pub webhook_proxy_url: Option<String>,
    /// `KODX_DATA_DIR`: where setup saves the App's credentials.
    pub data_dir: PathBuf,
    /// Where the settings below came from (`None`: built-in defaults).
    pub config_file: Option<PathBuf>,
    pub settings: Settings,
}

impl SetupConfig {
    /// What the process environment says apart from the App's credentials (the data
    /// directory, the public URL …), for commands that need no App: `kodx operator-link`.
    pub fn from_env() -> Result<SetupConfig, ConfigError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        base_config(&get).map(|(config, _)| config)
    }
}

impl ServeConfig {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<ServeConfig, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `var` (the environment, or a map in tests); an App
    /// must be configured (in the environment or saved by setup).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<ServeConfig, ConfigError> {
        match Self::startup(var)? {
            Startup::Ready(c) => Ok(c),
            Startup::Setup(_) => Err(ConfigError(format!(
                "kodx serve needs {}",
                MISSING_APP_VARS.join(", and ")
            ))),
        }
    }

    /// Reads how `kodx serve` starts from the process environment.
    pub fn startup_from_env() -> Result<Startup, ConfigError> {
        Self::startup(|name| std::env::var(name).ok())
    }

    /// Reads how `kodx serve` starts: the App's credentials from the environment when any of
    /// its variables is set (they win), else those saved by setup under `KODX_DATA_DIR`,
    /// else setup mode.
    pub fn startup(var: impl Fn(&str) -> Option<String>) -> Result<Startup, ConfigError> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let (base, host_given) = base_config(&get)?;
        let from_env = [
            "APP_ID",
            "PRIVATE_KEY",
            "PRIVATE_KEY_PATH",
            "WEBHOOK_SECRET",
        ]
        .iter()
        .any(|v| get(v).is_some());
        if from_env {
            let app = credentials_from_env(&get)?;
            return Ok(Startup::Ready(
                base.with_credentials(app, CredentialSource::Environment),
            ));
        }
        match crate::serve::setup::store::load(&base.data_dir) {
            Ok(Some(saved)) => {
                let path = crate::serve::setup::store::path(&base.data_dir);
                let app = saved.credentials().map_err(|e| {
                    ConfigError(format!(
                        "{}: {e} (remove the file to run setup again, or set APP_ID, \
                         PRIVATE_KEY_PATH and WEBHOOK_SECRET)",
                        path.display()
                    ))
                })?;
                Ok(Startup::Ready(
                    base.with_credentials(app, CredentialSource::Saved(path)),
                ))
            }
            Ok(None) => {
                let mut setup = base;
                if !host_given {
                    // Setup mode answers this machine only unless told otherwise.
                    setup.listen.set_ip(IpAddr::from([127, 0, 0, 1]));
                }
                Ok(Startup::Setup(setup))
            }
            Err(e) => Err(ConfigError(e.to_string())),
        }
    }
}

/// What `kodx serve` names when the App is only half configured.
const MISSING_APP_VARS: [&str; 3] = [
    "APP_ID (the GitHub App's numeric id)",
    "PRIVATE_KEY or PRIVATE_KEY_PATH (the App's private key, downloaded from its settings)",
    "WEBHOOK_SECRET (the secret set in the App's webhook settings)",
];

fn credentials_from_env(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<AppCredentials, ConfigError> {
    let mut missing = Vec::new();
    let app_id = match get("APP_ID") {
        Some(v) => Some(v.trim().parse::<u64>().ok().filter(|&id| id > 0).ok_or_else(|| {
            ConfigError(format!(
                "APP_ID must be the GitHub App's numeric id (App settings → About → App ID), got {v:?}"
            ))
        })?),
        None => {
            missing.push(MISSING_APP_VARS[0]);
            None
        }
    };
    let private_key = match (get("PRIVATE_KEY"), get("PRIVATE_KEY_PATH")) {
        (Some(pem), _) => Some(SecretString::from(pem.replace("\\n", "\n"))),
        (None, Some(path)) => Some(SecretString::from(std::fs::read_to_string(&path).map_err(
            |e| ConfigError(format!("PRIVATE_KEY_PATH={path}: cannot read the key: {e}")),
        )?)),
        (None, None) => {
            missing.push(MISSING_APP_VARS[1]);
            None
        }
    };
    let webhook_secrets = match get("WEBHOOK_SECRET") {
        Some(v) => Some(
            WebhookSecrets::parse(&v).map_err(|e| ConfigError(format!("WEBHOOK_SECRET: {e}")))?,
        ),
        None => {
            missing.push(MISSING_APP_VARS[2]);
            None
        }
    };
    match (app_id, private_key, webhook_secrets) {
        (Some(app_id), Some(private_key), Some(webhook_secrets)) => Ok(AppCredentials {
            app_id,
            private_key,
            webhook_secrets,
        }),
        _ => Err(ConfigError(format!(
            "kodx serve needs {} (or none of the App's variables, to set the App up in the browser)",
            missing.join(", and ")
        ))),
    }
}

/// The web host beside an API URL: `https://api.github.com` → `https://github.com`,
/// `https://HOST/api/v3` → `https://HOST`, `https://api.HOST` → `https://HOST`; anything
/// else is taken as it is (a test server serving both).
pub fn web_url_for(api_url: &str) -> String {
    if api_url == DEFAULT_GITHUB_API_URL {
        return "https://github.com".into();
    }
    if let Some(base) = api_url.strip_suffix("/api/v3") {
        return base.to_string();
    }
    for scheme in ["https://", "http://"] {
        if let Some(host) = api_url
            .strip_prefix(scheme)
            .and_then(|r| r.strip_prefix("api."))
        {
            return format!("{scheme}{host}");
        }
    }
    api_url.to_string()
}

/// Everything but the App's credentials; `true` when `HOST` was given.
fn base_config(get: &dyn Fn(&str) -> Option<String>) -> Result<(SetupConfig, bool), ConfigError> {
    let github_api_url = get("GITHUB_API_URL")
        .unwrap_or_else(|| DEFAULT_GITHUB_API_URL.into())
        .trim_end_matches('/')
        .to_string();
    if !(github_api_url.starts_with("https://") || github_api_url.starts_with("http://")) {
        return Err(ConfigError(format!(
            "GITHUB_API_URL must be an http(s) URL such as https://api.github.com or https://HOST/api/v3, got {github_api_url:?}"
        )));
    }
    let github_url = match get("GITHUB_URL") {
        Some(u) => {
            let u = u.trim().trim_end_matches('/').to_string();
            if !(u.starts_with("https://") || u.starts_with("http://")) {
                return Err(ConfigError(format!(
                    "GITHUB_URL must be GitHub's web address such as https://github.com or https://HOST, got {u:?}"
                )));
            }
            u
        }
        None => web_url_for(&github_api_url),
    };
    let port = match get("PORT") {
        Some(p) => p
            .trim()
            .parse::<u16>()
            .map_err(|_| ConfigError(format!("PORT must be a port number (0–65535), got {p:?}")))?,
        None => 3000,
    };
    let host_given = get("HOST").is_some();
    let host = get("HOST").unwrap_or_else(|| "0.0.0.0".into());
    let ip: IpAddr = host.trim().parse().map_err(|_| {
        ConfigError(format!(
            "HOST must be an IP address to listen on (0.0.0.0, 127.0.0.1, ::), got {host:?}"
        ))
    })?;
    let database_url = get("DATABASE_URL").unwrap_or_else(|| DEFAULT_DATABASE_URL.into());
    let public_url = get("KODX_PUBLIC_URL").map(|u| u.trim_end_matches('/').to_string());
    let webhook_proxy_url = match get("WEBHOOK_PROXY_URL").map(|u| u.trim().to_string()) {
        Some(u) if u.is_empty() => None,
        Some(u) if reqwest::Url::parse(&u)
            .is_ok_and(|p| matches!(p.scheme(), "http" | "https") && p.host().is_some()) =>
        {
            Some(u)
        }
        Some(u) => {
            return Err(ConfigError(format!(
                "WEBHOOK_PROXY_URL must be an http(s) URL of a webhook channel, e.g. https://smee.io/AbCdEf, got {u:?}"
            )))
        }
        None => None,
    };
    let data_dir = PathBuf::from(get("KODX_DATA_DIR").unwrap_or_else(|| DEFAULT_DATA_DIR.into()));

    let (config_file, mut settings) = match get("KODX_CONFIG") {
        Some(path) => {
            let path = PathBuf::from(path);
            let s = load_settings(&path)?;
            (Some(path), s)
        }
        None if Path::new(DEFAULT_CONFIG_PATH).is_file() => {
            let path = PathBuf::from(DEFAULT_CONFIG_PATH);
            let s = load_settings(&path)?;
            (Some(path), s)
        }
        None => (None, Settings::default()),
    };
    if let Some(image) = get("KODX_IMAGE") {
        settings.image = image;
    }
    if let Some(dir) = get("KODX_REPO_CACHE_DIR") {
        settings.repo_cache_dir = Some(PathBuf::from(dir));
    }
    if let Some(bytes) = get("KODX_REPO_CACHE_MAX_BYTES") {
        settings.repo_cache_max_bytes = bytes.trim().parse().map_err(|_| {
            ConfigError(format!(
                "KODX_REPO_CACHE_MAX_BYTES must be a number of bytes (0 turns the repository cache off), got {bytes:?}"
            ))
        })?;
    }
    let warm = |name: &str, n: String| -> Result<usize, ConfigError> {
        n.trim()
            .parse()
            .ok()
            .filter(|n| *n <= crate::sandbox::engines::MAX_WARM)
            .ok_or_else(|| {
                ConfigError(format!(
                    "{name} must be a number from 0 (none) to {}, got {n:?}",
                    crate::sandbox::engines::MAX_WARM
                ))
            })
    };
    if let Some(n) = get("KODX_WARM_SANDBOXES") {
        settings.warm_sandboxes = warm("KODX_WARM_SANDBOXES", n)?;
    }
    if let Some(n) = get("KODX_WARM_REPOSITORIES") {
        settings.warm_repositories = warm("KODX_WARM_REPOSITORIES", n)?;
    }
    let seconds = |name: &str, v: String| -> Result<u64, ConfigError> {
        v.trim().parse().map_err(|_| {
            ConfigError(format!(
                "{name} must be a whole number of seconds, got {v:?}"
            ))
        })
    };
    if let Some(v) = get("KODX_LEASE_SECS") {
        settings.lease_secs = seconds("KODX_LEASE_SECS", v)?;
    }
    if let Some(v) = get("KODX_GITHUB_TIMEOUT_SECS") {
        settings.github_timeout_secs = seconds("KODX_GITHUB_TIMEOUT_SECS", v)?;
    }
    if let Some(v) = get("KODX_TEST_LEASE_MS") {
        let ms = v
            .trim()
            .parse()
            .ok()
            .filter(|ms| (500..=60_000).contains(ms));
        settings.test_lease_ms = Some(ms.ok_or_else(|| {
            ConfigError(format!(
                "KODX_TEST_LEASE_MS must be 500 to 60000, got {v:?}"
            ))
        })?);
    }
    settings.check_lease(
        "KODX_LEASE_SECS and KODX_GITHUB_TIMEOUT_SECS (or their keys in KODX_CONFIG)",
    )?;
    if settings.repo_cache_dir.is_none() {
        settings.repo_cache_dir = Some(self::data_dir(&database_url).join("mirrors"));
    }
    settings.secrets_dir = Some(data_dir.clone());
    Ok((
        SetupConfig {
            listen: SocketAddr::new(ip, port),
            github_api_url,
            github_url,
            database_url,
            public_url,
            webhook_proxy_url,
            data_dir,
            config_file,
            settings,
        },
        host_given,
    ))
}

/// The directory the SQLite database of `database_url` is in (`data` when it has none,
/// e.g. in memory): where the server keeps what it keeps on disk.
pub fn data_dir(database_url: &str) -> PathBuf {
    let url = database_url.trim();
    let lower = url.to_ascii_lowercase();
    let rest = if lower.starts_with("sqlite://") {
        &url["sqlite://".len()..]
    } else if lower.starts_with("sqlite:") {
        &url["sqlite:".len()..]
    } else {
        ""
    };
    let path = rest.split('?').next().unwrap_or("");
    match Path::new(path).parent() {
        Some(dir) if path != ":memory:" && !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ if path != ":memory:" && !path.is_empty() => PathBuf::from("."),
        _ => PathBuf::from("data"),
    }
}

/// Reads and checks a server config file.
pub fn load_settings(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("KODX_CONFIG: cannot read {}: {e}", path.display())))?;
    parse_settings(&text, &path.display().to_string())
}

/// Parses the text of a server config file; `source` names it in errors.
pub fn parse_settings(text: &str, source: &str) -> Result<Settings, ConfigError> {
    let settings: Settings = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let message = e.message().trim().to_string();
        match line {
            Some(l) => ConfigError(format!("{source}: line {l}: {message}")),
            None => ConfigError(format!("{source}: {message}")),
        }
    })?;
    settings.check(source)?;
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::NetworkMode;
    use secrecy::ExposeSecret;
    use std::collections::HashMap;
    use std::time::Duration;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const BASE: &[(&str, &str)] = &[
        ("APP_ID", "123"),
        (
            "PRIVATE_KEY",
            "-----BEGIN RSA PRIVATE KEY-----\\nabc\\n-----END RSA PRIVATE KEY-----",
        ),
        ("WEBHOOK_SECRET", "s3cret"),
        ("KODX_CONFIG", "/nonexistent/kodx-test-config.toml"),
    ];

    fn without_config(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = BASE
            .iter()
            .copied()
            .filter(|(k, _)| *k != "KODX_CONFIG")
            .collect();
        v.extend_from_slice(extra);
        v
    }

    #[test]
    fn probot_names_and_defaults() {
        let c = ServeConfig::from_lookup(lookup(&without_config(&[]))).unwrap();
        assert_eq!(c.app_id, 123);
        assert!(
            c.private_key.expose_secret().contains("\nabc\n"),
            "literal \\n turned into newlines"
        );
        assert_eq!(c.github_api_url, DEFAULT_GITHUB_API_URL);
        assert_eq!(c.listen, "0.0.0.0:3000".parse().unwrap());
        assert_eq!(c.database_url, DEFAULT_DATABASE_URL);
        assert!(!format!("{c:?}").contains("abc"), "the key never prints");
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the secret never prints"
        );
    }

    #[test]
    fn all_missing_names_every_variable() {
        let e = ServeConfig::from_lookup(lookup(&[])).unwrap_err().0;
        for name in [
            "APP_ID",
            "PRIVATE_KEY",
            "PRIVATE_KEY_PATH",
            "WEBHOOK_SECRET",
        ] {
            assert!(e.contains(name), "{e}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        let e = ServeConfig::from_lookup(lookup(&without_config(&[("PORT", "http")]))).unwrap_err();
        assert!(e.0.contains("PORT"), "{e}");
        let mut v = without_config(&[]);
        v.retain(|(k, _)| *k != "APP_ID");
        v.push(("APP_ID", "my-app"));
        let e = ServeConfig::from_lookup(lookup(&v)).unwrap_err();
        assert!(e.0.contains("APP_ID") && e.0.contains("my-app"), "{e}");
        let e = ServeConfig::from_lookup(lookup(&without_config(&[("HOST", "localhost:80")])))
            .unwrap_err();
        assert!(e.0.contains("HOST"), "{e}");
        let e = ServeConfig::from_lookup(lookup(&without_config(&[(
            "GITHUB_API_URL",
            "api.github.com",
        )])))
        .unwrap_err();
        assert!(e.0.contains("GITHUB_API_URL"), "{e}");
    }

    #[test]
    fn explicit_config_file_must_exist() {
        let e = ServeConfig::from_lookup(lookup(BASE)).unwrap_err();
        assert!(
            e.0.contains("KODX_CONFIG") && e.0.contains("kodx-test-config"),
            "{e}"
        );
    }

    #[test]
    fn key_from_path_and_enterprise_url() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, "PEM").unwrap();
        let key_s = key.to_str().unwrap().to_string();
        let mut v: Vec<(String, String)> = without_config(&[])
            .into_iter()
            .filter(|(k, _)| *k != "PRIVATE_KEY")
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        v.push(("PRIVATE_KEY_PATH".into(), key_s));
        v.push((
            "GITHUB_API_URL".into(),
            "https://ghe.example.com/api/v3/".into(),
        ));
        let map: HashMap<_, _> = v.into_iter().collect();
        let c = ServeConfig::from_lookup(|k| map.get(k).cloned()).unwrap();
        assert_eq!(c.private_key.expose_secret(), "PEM");
        assert_eq!(c.github_api_url, "https://ghe.example.com/api/v3");
    }

    #[test]
    fn settings_file_is_strict() {
        let s = parse_settings(
            "max_concurrent_runs = 4\nmax_cost_limit = 3.5\n",
            "kodx.toml",
        )
        .unwrap();
        assert_eq!(s.max_concurrent_runs, 4);
        assert_eq!(s.max_cost_limit, 3.5);
        assert_eq!(s.max_iterations, Settings::default().max_iterations);
        let e = parse_settings("max_concurrent = 4\n", "kodx.toml").unwrap_err();
        assert!(
            e.0.starts_with("kodx.toml: line 1:") && e.0.contains("max_concurrent"),
            "{e}"
        );
        let e = parse_settings("\nmax_concurrent_runs = \"two\"\n", "kodx.toml").unwrap_err();
        assert!(e.0.contains("line 2"), "{e}");
        let e = parse_settings("max_concurrent_runs = 0\n", "kodx.toml").unwrap_err();
        assert!(e.0.contains("max_concurrent_runs"), "{e}");
    }

    #[test]
    fn sandbox_network_and_disk_settings() {
        let s = parse_settings(
            "network = \"setup-only\"\nnetwork_allow = [\"10.1.0.0/16\", \"192.168.5.7\"]\nmax_disk_bytes = 2147483648\n",
            "kodx.toml",
        )
        .unwrap();
        assert_eq!(s.network, NetworkMode::SetupOnly);
        assert_eq!(
            s.network_allow
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>(),
            ["10.1.0.0/16", "192.168.5.7/32"]
        );
        assert_eq!(s.max_disk_bytes, 2 << 30);
        assert_eq!(Settings::default().network, NetworkMode::On);
        let e = parse_settings("network = \"sometimes\"\n", "kodx.toml").unwrap_err();
        assert!(e.0.contains("line 1") && e.0.contains("setup-only"), "{e}");
        let e = parse_settings("network_allow = [\"10.1.2.3/8\"]\n", "kodx.toml").unwrap_err();
        assert!(e.0.contains("did you mean 10.0.0.0/8"), "{e}");
        let e = parse_settings("max_disk_bytes = 10\n", "kodx.toml").unwrap_err();
        assert!(e.0.contains("max_disk_bytes"), "{e}");
    }

    #[test]
    fn the_server_network_setting_wins_over_what_a_repository_asks() {
        use crate::sandbox::SandboxSpec;
        let mut spec = SandboxSpec::new("r", "img");
        for (mode, repo_cut, cut, none) in [
            (NetworkMode::On, false, false, false),
            (NetworkMode::On, true, true, false),
            (NetworkMode::SetupOnly, false, true, false),
            (NetworkMode::SetupOnly, true, true, false),
            (NetworkMode::Off, false, false, true),
            (NetworkMode::Off, true, true, true),
        ] {
            mode.apply(&mut spec, repo_cut);
            assert_eq!(
                (spec.disable_network_after_setup, spec.no_network),
                (cut, none),
                "{mode:?}, repository asks for the cut: {repo_cut}"
            );
        }
    }

    #[test]
    fn repo_cache_keys_default_beside_the_database() {
        let c = ServeConfig::from_lookup(lookup(&without_config(&[]))).unwrap();
        assert_eq!(
            c.settings.repo_cache_dir,
            Some(PathBuf::from("data/mirrors"))
        );
        assert_eq!(c.settings.repo_cache_max_bytes, 10 << 30);
        let c = ServeConfig::from_lookup(lookup(&without_config(&[(
            "DATABASE_URL",
            "sqlite:///var/lib/kodx/kodx.db?mode=rwc",
        )])))
        .unwrap();
        assert_eq!(
            c.settings.repo_cache_dir,
            Some(PathBuf::from("/var/lib/kodx/mirrors"))
        );
        let c = ServeConfig::from_lookup(lookup(&without_config(&[
            ("KODX_REPO_CACHE_DIR", "/srv/mirrors"),
            ("KODX_REPO_CACHE_MAX_BYTES", "0"),
        ])))
        .unwrap();
        assert_eq!(
            c.settings.repo_cache_dir,
            Some(PathBuf::from("/srv/mirrors"))
        );
        assert_eq!(c.settings.repo_cache_max_bytes, 0);
        let e = ServeConfig::from_lookup(lookup(&without_config(&[(
            "KODX_REPO_CACHE_MAX_BYTES",
            "10G",
        )])))
        .unwrap_err();
        assert!(
            e.0.contains("KODX_REPO_CACHE_MAX_BYTES") && e.0.contains("10G"),
            "{e}"
        );
        let s = parse_settings(
            "repo_cache_dir = \"/tmp/m\"\nrepo_cache_max_bytes = 1048576\n",
            "kodx.toml",
        )
        .unwrap();
        assert_eq!(s.repo_cache_dir, Some(PathBuf::from("/tmp/m")));
        assert_eq!(s.repo_cache_max_bytes, 1 << 20);
        assert_eq!(data_dir("sqlite::memory:"), PathBuf::from("data"));
        assert_eq!(data_dir("sqlite://kodx.db"), PathBuf::from("."));
    }

    #[test]
    fn setup_cache_settings() {
        let d = Settings::default();
        assert!(d.setup_cache_on());
        assert_eq!(
            (d.setup_cache_max_images, d.setup_cache_max_bytes),
            (20, 20 << 30)
        );
        let s = parse_settings(
            "setup_cache_max_images = 3\nsetup_cache_max_bytes = 1000000\n",
            "kodx.toml",
        )
        .unwrap();
        assert_eq!(
            (s.setup_cache_max_images, s.setup_cache_max_bytes),
            (3, 1_000_000)
        );
        assert!(s.setup_cache_on());
        let off = parse_settings("setup_cache_max_images = 0\n", "kodx.toml").unwrap();
        assert!(!off.setup_cache_on());
        let off = parse_settings("setup_cache_max_bytes = 0\n", "kodx.toml").unwrap();
        assert!(!off.setup_cache_on());
        let e = parse_settings("setup_cache_max_images = -1\n", "kodx.toml").unwrap_err();
        assert!(e.0.contains("line 1"), "{e}");
    }

    #[test]
    fn engine_lists() {
        let s = parse_settings(
            "engine_check_secs = 0.5\n[[engines]]\nname = \"local\"\nhost = \"unix:///var/run/docker.sock\"\nmax_runs = 3\n\n[[engines]]\nname = \"b2\"\nhost = \"tcp://10.0.0.12:2376\"\ntls_cert_path = \"/etc/kodx/b2\"\n",
            "kodx.toml",
        )
        .unwrap();
        assert_eq!(s.engines.len(), 2);
        assert_eq!((s.engines[0].max_runs, s.engines[1].max_runs), (3, 2));
        assert_eq!(s.engine_check_interval(), Duration::from_millis(500));
        let e = parse_settings(
            "[[engines]]\nname = \"b2\"\nhost = \"tcp://10.0.0.12:2375\"\n",
            "kodx.toml",
        )
        .unwrap_err();
        assert!(
            e.0.contains("[[engines]]") && e.0.contains("tls_cert_path"),
            "{e}"
        );
        let e = parse_settings(
            "[[engines]]\nname = \"x\"\nhost = \"unix:///s\"\nport = 1\n",
            "kodx.toml",
        )
        .unwrap_err();
        assert!(e.0.contains("port"), "{e}");
    }

    #[test]
    fn the_lease_outlasts_a_github_request_and_the_margin() {
        let s = Settings::default();
        assert_eq!((s.lease_secs, s.github_timeout_secs), (60, 30));
        assert_eq!(s.lease_margin(), Duration::from_secs(32));
        assert_eq!(s.github_policy().request_timeout, Duration::from_secs(30));
        let s = parse_settings("lease_secs = 10\ngithub_timeout_secs = 3\n", "kodx.toml").unwrap();
        assert_eq!(s.lease(), Duration::from_secs(10));
        assert_eq!(s.lease_margin(), Duration::from_secs(5));
        let policy = s.github_policy();
        assert_eq!(
            (policy.request_timeout, policy.connect_timeout),
            (Duration::from_secs(3), Duration::from_secs(3))
        );
        // A lease the margin would eat.
        let e = parse_settings("lease_secs = 34\n", "kodx.toml").unwrap_err();
        assert!(
            e.0.contains("`lease_secs` must be between 35") && e.0.contains("got 34"),
            "{e}"
        );
        let e = parse_settings("github_timeout_secs = 0\n", "kodx.toml").unwrap_err();
        assert!(e.0.contains("github_timeout_secs"), "{e}");
        // The environment sets both, and they are checked together.
        let c = ServeConfig::from_lookup(lookup(&without_config(&[
            ("KODX_LEASE_SECS", "10"),
            ("KODX_GITHUB_TIMEOUT_SECS", "3"),
        ])))
        .unwrap();
        assert_eq!(
            (c.settings.lease_secs, c.settings.github_timeout_secs),
            (10, 3)
        );
        let e = ServeConfig::from_lookup(lookup(&without_config(&[("KODX_LEASE_SECS", "10")])))
            .unwrap_err();
        assert!(
            e.0.contains("KODX_LEASE_SECS") && e.0.contains("between 35"),
            "{e}"
        );
        let e = ServeConfig::from_lookup(lookup(&without_config(&[("KODX_LEASE_SECS", "1m")])))
            .unwrap_err();
        assert!(
            e.0.contains("KODX_LEASE_SECS must be a whole number"),
            "{e}"
        );
    }

    #[test]
    fn a_test_lease_in_milliseconds_scales_the_github_bound_and_the_margin_with_it() {
        let c =
            ServeConfig::from_lookup(lookup(&without_config(&[("KODX_TEST_LEASE_MS", "2000")])))
                .unwrap();
        let s = &c.settings;
        assert_eq!(s.lease(), Duration::from_millis(2000));
        assert_eq!(s.github_timeout(), Duration::from_millis(600));
        assert_eq!(
            s.github_policy().request_timeout,
            Duration::from_millis(600)
        );
        assert_eq!(s.lease_margin(), Duration::from_millis(1000));
        let e = ServeConfig::from_lookup(lookup(&without_config(&[("KODX_TEST_LEASE_MS", "10")])))
            .unwrap_err();
        assert!(
            e.0.contains("KODX_TEST_LEASE_MS must be 500 to 60000"),
            "{e}"
        );
    }

    #[test]
    fn shipped_config_file_parses_to_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_CONFIG_PATH);
        assert_eq!(load_settings(&path).unwrap(), Settings::default());
    }
}
