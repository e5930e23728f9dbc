//! The GitHub App client (SPEC §2, §4, §5): the App's JWT, installation tokens scoped to
//! one repository and cached per installation and scope, and the few REST calls kodx makes, all against an injectable API base URL
//! (`GITHUB_API_URL`; GitHub Enterprise Server's `https://HOST/api/v3` works the same).
//!
//! - [`GitHubApp`] signs JWTs (RS256) and mints installation tokens, each for one
//!   repository and the permissions a run uses ([`TokenScope`]), keeping one per
//!   (installation, scope) until five minutes before it expires; concurrent callers share
//!   one mint.
//! - [`Installation`] holds a token and one octocrab client built on it; its methods turn
//!   GitHub's JSON into kodx's own small types at once.
//! - Every call, App and installation alike, goes through octocrab ([`transport`]) and runs
//!   under one [`RequestPolicy`]: connect and request timeouts, bounded
//!   retries with backoff for 502/503/504 and unanswered requests, rate limits waited out
//!   when the reset is near, else [`GitHubError::RateLimited`].
//! - Tokens never appear in Debug output, errors or logs: they are `secrecy`'s
//!   [`SecretString`](secrecy::SecretString) (no `Display`, `Debug` prints `[REDACTED]`,
//!   zeroed on drop).

mod actions;
pub mod attachments;
mod check_runs;
mod ci;
mod clock;
mod error;
mod graphql;
mod guard;
mod installation;
mod manifest;
mod policy;
mod transport;
mod types;
mod util;
mod wire;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use octocrab::Octocrab;

pub use check_runs::ANNOTATIONS_PER_REQUEST;
pub use ci::{CiLimits, CiState, FailedCheck};
pub use clock::Clock;
pub use error::GitHubError;
pub use graphql::{ReviewThread, ReviewThreads, ThreadComment};
pub use guard::WriteGuard;
pub use installation::Installation;
pub use manifest::{convert_manifest, ConvertedApp};
pub use policy::RequestPolicy;
pub use types::{
    noreply_email, Access, AppInfo, BotIdentity, CommentInfo, CommentRef, CreatedCheckRun,
    IssueInfo, NewCheckRun, NewPull, Permission, PullBase, PullHead, PullInfo, PullRef, PullRepo,
    PullState, Reaction, ReactionTarget, RepoName, RepoNameError, TokenScope, Tree, TreeEntry,
};

use policy::Raw;
pub use transport::USER_AGENT;
use transport::{Auth, Call, JSON};

/// A cached installation token is replaced once it has less than this left.
pub const TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// Past this many cached tokens, the ones that expired and are not being minted are dropped.
const MAX_CACHED_TOKENS: usize = 256;

/// What the token cache is keyed by: the installation and what the token is for (`None`:
/// every repository and permission of the installation).
type CacheKey = (u64, Option<TokenScope>);
type Slot = Arc<tokio::sync::Mutex<Option<Installation>>>;

/// The GitHub App: its id, its private key and the API base. Cheap to clone; share one.
#[derive(Clone)]
pub struct GitHubApp {
    inner: Arc<AppInner>,
}

struct AppInner {
    /// Without a trailing slash.
    api_url: String,
    app_id: u64,
    /// Signs the App's JWTs ([`GitHubApp::app_jwt`]).
    key: EncodingKey,
    /// Without credentials: App requests carry a JWT signed per attempt.
    octo: Octocrab,
    policy: RequestPolicy,
    /// One slot per installation and scope; its lock is held while a token is minted, so
    /// concurrent callers for the same token wait for that one mint instead of making their
    /// own.
    installations: Mutex<HashMap<CacheKey, Slot>>,
    /// The bot account once looked up; its lock is held during the lookup.
    bot: tokio::sync::Mutex<Option<BotIdentity>>,
    /// What the cached tokens' expiry is read against ([`GitHubApp::clock`]).
    clock: Clock,
}

impl fmt::Debug for GitHubApp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GitHubApp")
            .field("api_url", &self.inner.api_url)
            .field("app_id", &self.inner.app_id)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Serialize)]
struct Claims {
    iat: u64,
    exp: u64,
    iss: String,
}

impl GitHubApp {
    /// `private_key_pem` is the PEM text GitHub handed out (PKCS#1 `RSA PRIVATE KEY`, or
    /// PKCS#8 `PRIVATE KEY`); Probot's conventions are accepted too: literal `\n`
    /// sequences, surrounding quotes, or the whole PEM file base64-encoded. Call it inside
    /// a Tokio runtime and use the App there: its octocrab client runs on it.
    pub fn new(api_url: &str, app_id: u64, private_key_pem: &str) -> Result<Self, GitHubError> {
        Self::with_policy(api_url, app_id, private_key_pem, RequestPolicy::default())
    }

    pub fn with_policy(
        api_url: &str,
        app_id: u64,
        private_key_pem: &str,
        policy: RequestPolicy,
    ) -> Result<Self, GitHubError> {
        let api_url = check_api_url(api_url)?;
        if app_id == 0 {
            return Err(GitHubError::Config(
                "APP_ID must be the App's numeric id (Settings → Developer settings → \
                 GitHub Apps → App ID), not 0"
                    .into(),
            ));
        }
        let key = load_key(private_key_pem)?;
        let octo = transport::client(&api_url, &policy, Auth::App)?;
        let app = GitHubApp {
            inner: Arc::new(AppInner {
                api_url,
                app_id,
                key,
                octo,
                policy,
                installations: Mutex::new(HashMap::new()),
                bot: tokio::sync::Mutex::new(None),
                clock: Clock::default(),
            }),
        };
        // A key that decodes but cannot sign fails here, not at the first webhook.
        app.app_jwt()?;
        Ok(app)
    }

    pub fn app_id(&self) -> u64 {
        self.inner.app_id
    }

    /// The clock its tokens' expiry is read against: a test advances it to bring a cached
    /// token within [`TOKEN_REFRESH_MARGIN`] of its end.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    pub fn api_url(&self) -> &str {
        &self.inner.api_url
    }

    /// A JWT for the App's own endpoints: RS256, `iss` = the App id, issued a minute in the
    /// past (clock skew) and valid nine minutes (GitHub allows at most ten).
    pub fn app_jwt(&self) -> Result<String, GitHubError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = Claims {
            iat: now.saturating_sub(60),
            exp: now + 9 * 60,
            iss: self.inner.app_id.to_string(),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.inner.key).map_err(
            |e| {
                GitHubError::Config(format!(
                    "cannot sign the App JWT with the private key (PRIVATE_KEY / \
                     PRIVATE_KEY_PATH): {e}"
                ))
            },
        )
    }

    /// `GET /app`: the App's id and slug (its bot is `<slug>[bot]`), and what its settings
    /// grant (permissions, webhook events). Checks the key and App id together, so `serve`
    /// and `doctor` call it at start.
    pub async fn app_info(&self) -> Result<AppInfo, GitHubError> {
        let what = "GET /app";
        let raw = self
            .app_request(axum::http::Method::GET, "/app", what, None)
            .await?;
        AppInfo::from_json(&raw.json(what)?, what)
    }

    /// The App's bot account, for commit authorship: `GET /app` (JWT) gives the slug, then
    /// `GET /users/<slug>%5Bbot%5D` its id. GitHub takes JWTs only on the App's own
    /// endpoints, so the user lookup goes through `inst` (any installation's token will
    /// do). Kept after the first success; callers at the same time share one lookup.
    pub async fn bot_identity(&self, inst: &Installation) -> Result<BotIdentity, GitHubError> {
        let mut cached = self.inner.bot.lock().await;
        if let Some(bot) = cached.as_ref() {
            return Ok(bot.clone());
        }
        let login = self.app_info().await?.bot_login();
        let bot = BotIdentity::new(&login, inst.user_id(&login).await?);
        *cached = Some(bot.clone());
        Ok(bot)
    }

    /// The installation with a token good for at least five more minutes, for every
    /// repository and permission the installation has: the cached one, else a newly minted
    /// one (`POST /app/installations/{id}/access_tokens`). Callers for the same installation
    /// at the same time share one mint. Runs use [`installation_for`](Self::installation_for).
    pub async fn installation(&self, installation_id: u64) -> Result<Installation, GitHubError> {
        self.cached((installation_id, None)).await
    }

    /// The installation with a token minted for one repository and the permissions `scope`
    /// names, no more (cached per installation and scope, like
    /// [`installation`](Self::installation)). A token for an `ask` cannot push, and a token
    /// for one repository cannot read another of the same installation.
    pub async fn installation_for(
        &self,
        installation_id: u64,
        scope: &TokenScope,
    ) -> Result<Installation, GitHubError> {
        self.cached((installation_id, Some(scope.clone()))).await
    }

    async fn cached(&self, key: CacheKey) -> Result<Installation, GitHubError> {
        let slot = {
            let mut map = self.inner.installations.lock();
            if map.len() >= MAX_CACHED_TOKENS && !map.contains_key(&key) {
                // Keep slots in use (locked) and tokens still good; drop the rest.
                map.retain(|_, slot| match slot.try_lock() {
                    Ok(cached) => cached
                        .as_ref()
                        .is_some_and(|i| i.valid_for(TOKEN_REFRESH_MARGIN)),
                    Err(_) => true,
                });
            }
            map.entry(key.clone()).or_default().clone()
        };
        let mut cached = slot.lock().await;
        if let Some(inst) = cached.as_ref() {
            if inst.valid_for(TOKEN_REFRESH_MARGIN) {
                return Ok(inst.clone());
            }
        }
        let inst = self.mint(key.0, key.1.as_ref()).await?;
        *cached = Some(inst.clone());
        Ok(inst)
    }

    /// Drops the cached tokens of an installation, whatever their scope (e.g. after GitHub
    /// refused one with 401), so the next call mints new ones.
    pub async fn forget_installation(&self, installation_id: u64) {
        let slots: Vec<Slot> = self
            .inner
            .installations
            .lock()
            .iter()
            .filter(|((id, _), _)| *id == installation_id)
            .map(|(_, slot)| slot.clone())
            .collect();
        for slot in slots {
            *slot.lock().await = None;
        }
    }

    async fn mint(
        &self,
        installation_id: u64,
        scope: Option<&TokenScope>,
    ) -> Result<Installation, GitHubError> {
        let path = format!("/app/installations/{installation_id}/access_tokens");
        let what = match scope {
            None => format!("POST {path}"),
            Some(s) => format!(
                "POST {path} (for {}: contents {}, issues {}, pull requests {})",
                s.repository,
                s.contents.as_str(),
                s.issues.as_str(),
                s.pull_requests.as_str()
            ),
        };
        let body = scope.map_or_else(|| serde_json::json!({}), TokenScope::request_body);
        let raw = self
            .app_request(axum::http::Method::POST, &path, &what, Some(&body))
            .await?;
        // The body holds the token: errors name fields, never quote values.
        let v: serde_json::Value = serde_json::from_slice(&raw.body)
            .map_err(|_| GitHubError::decode(&what, "the token answer is not JSON"))?;
        let token = v
            .get("token")
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| GitHubError::decode(&what, "no usable `token` in the answer"))?;
        let expires_at = v
            .get("expires_at")
            .and_then(|t| t.as_str())
            .and_then(util::parse_rfc3339)
            .ok_or_else(|| GitHubError::decode(&what, "no RFC 3339 `expires_at` in the answer"))?;
        tracing::debug!(
            installation_id,
            scoped = scope.is_some(),
            "minted an installation token"
        );
        Installation::new(
            &self.inner.api_url,
            installation_id,
            token.into(),
            expires_at,
            self.inner.policy.clone(),
            self.inner.clock.clone(),
        )
    }

    /// A call authenticated as the App (a JWT signed for each attempt), under the retry
    /// policy.
    async fn app_request(
        &self,
        method: axum::http::Method,
        path: &str,
        what: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Raw, GitHubError> {
        let call = Call {
            what,
            method,
            path,
            query: None,
            accept: JSON,
            body,
            jwt: Some(&|| self.app_jwt()),
            max_body: transport::MAX_ANSWER_BYTES,
            // The App's own calls are for no one run.
            guard: None,
        };
        transport::send(&self.inner.octo, &self.inner.policy, call).await
    }
}

/// `GITHUB_API_URL` must be an absolute http(s) URL without query or fragment.
fn check_api_url(api_url: &str) -> Result<String, GitHubError> {
    let bad = |why: &str| {
        GitHubError::Config(format!(
            "GITHUB_API_URL {api_url:?} {why} (expected e.g. https://api.github.com or \
             https://HOST/api/v3)"
        ))
    };
    let url =
        reqwest::Url::parse(api_url.trim()).map_err(|e| bad(&format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad("is not an http(s) URL"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(bad("must not have a query, fragment or user"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// Reads the App's private key, saying what is wrong with it in words a maintainer can act
/// on. The key itself never appears in the error.
fn load_key(private_key_pem: &str) -> Result<EncodingKey, GitHubError> {
    let bad = |why: String| {
        GitHubError::Config(format!(
            "the App private key (PRIVATE_KEY / PRIVATE_KEY_PATH) is unusable: {why}"
        ))
    };
    let pem = util::normalize_private_key(private_key_pem).map_err(bad)?;
    if let Some(problem) = util::pem_label_problem(&pem) {
        return Err(bad(problem));
    }
    EncodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| {
        bad(format!(
            "it is not a valid RSA private key in PEM ({e}); download a new one from the \
             App's settings page"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = include_str!("../../tests/data/test-app-key.pem");

    // The App's octocrab client starts its worker on the current Tokio runtime.
    #[tokio::test]
    async fn keys_load_as_pem_or_with_literal_newlines() {
        assert!(GitHubApp::new("https://api.github.com", 1, KEY).is_ok());
        let one_line = KEY.trim().replace('\n', "\\n");
        assert!(!one_line.contains('\n'));
        let app = GitHubApp::new("https://api.github.com", 1, &one_line).unwrap();
        assert_eq!(app.app_jwt().unwrap().split('.').count(), 3);
    }

    #[tokio::test]
    async fn bad_keys_say_what_is_wrong() {
        let err = |key: &str| {
            GitHubApp::new("https://api.github.com", 1, key)
                .unwrap_err()
                .to_string()
        };
        let e = err("");
        assert!(e.contains("PRIVATE_KEY") && e.contains("empty"), "{e}");
        let e = err("hunter2");
        assert!(e.contains("not PEM"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = err(include_str!("../../tests/data/test-app-key.pub.pem"));
        assert!(e.contains("public key"), "{e}");
        // Damaged body: the label is right, the DER inside is not.
        let damaged = KEY.replacen("MII", "MIX", 1);
        let e = err(&damaged);
        assert!(e.contains("not a valid RSA private key"), "{e}");
    }

    #[tokio::test]
    async fn config_errors_name_the_variable() {
        let e = GitHubApp::new("api.github.com", 1, KEY).unwrap_err();
        assert!(e.to_string().contains("GITHUB_API_URL"), "{e}");
        let e = GitHubApp::new("ftp://x", 1, KEY).unwrap_err();
        assert!(e.to_string().contains("GITHUB_API_URL"), "{e}");
        let e = GitHubApp::new("https://api.github.com", 0, KEY).unwrap_err();
        assert!(e.to_string().contains("APP_ID"), "{e}");
        let app = GitHubApp::new("https://ghe.example.com/api/v3/", 7, KEY).unwrap();
        assert_eq!(app.api_url(), "https://ghe.example.com/api/v3");
        assert!(!format!("{app:?}").contains("PRIVATE"));
        let key_line = KEY.lines().nth(1).unwrap();
        assert!(!format!("{app:?} {app:#?}").contains(key_line));
    }

    #[tokio::test]
    async fn jwt_claims() {
        let app = GitHubApp::new("https://api.github.com", 4242, KEY).unwrap();
        let jwt = app.app_jwt().unwrap();
        let payload = jwt.split('.').nth(1).unwrap();
        let b64 = payload.replace('-', "+").replace('_', "/");
        let claims: serde_json::Value =
            serde_json::from_slice(&util::base64_decode(&b64).unwrap()).unwrap();
        assert_eq!(claims["iss"], "4242");
        let (iat, exp) = (
            claims["iat"].as_u64().unwrap(),
            claims["exp"].as_u64().unwrap(),
        );
        assert_eq!(exp - iat, 600);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(iat <= now - 59 && iat >= now - 61, "{iat} vs {now}");
        let header = jwt
            .split('.')
            .next()
            .unwrap()
            .replace('-', "+")
            .replace('_', "/");
        let header: serde_json::Value =
            serde_json::from_slice(&util::base64_decode(&header).unwrap()).unwrap();
        assert_eq!(header["alg"], "RS256");
    }
}
