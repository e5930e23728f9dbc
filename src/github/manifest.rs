//! The end of GitHub's App manifest flow: `POST /app-manifests/{code}/conversions` trades
//! the one-time code GitHub handed the browser for the new App's id, key and webhook
//! secret. The call needs no credentials; it goes through the same octocrab transport and
//! [`RequestPolicy`] as every other call.

use secrecy::SecretString;
use serde_json::Value;

use super::error::GitHubError;
use super::policy::RequestPolicy;
use super::transport::{self, Auth, Call, JSON};

/// The App GitHub created from the manifest.
#[derive(Debug, Clone)]
pub struct ConvertedApp {
    pub id: u64,
    pub slug: String,
    /// The App's page (`https://github.com/apps/SLUG`); `/installations/new` installs it.
    pub html_url: String,
    /// PEM text.
    pub pem: SecretString,
    pub webhook_secret: SecretString,
    /// The account that owns the App, when GitHub said.
    pub owner: Option<String>,
}

/// Trades the manifest flow's `code` for the new App (`api_url` as `GITHUB_API_URL`).
pub async fn convert_manifest(api_url: &str, code: &str) -> Result<ConvertedApp, GitHubError> {
    let what = "POST /app-manifests/{code}/conversions";
    // The code is GitHub's; it goes into a path, so only its alphabet is taken.
    if code.is_empty()
        || code.len() > 256
        || !code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(GitHubError::decode(
            what,
            "the code in the redirect is not one GitHub hands out",
        ));
    }
    let api_url = super::check_api_url(api_url)?;
    let policy = RequestPolicy::default();
    let octo = transport::client(&api_url, &policy, Auth::App)?;
    let path = format!("/app-manifests/{code}/conversions");
    let raw = transport::send(
        &octo,
        &policy,
        Call {
            what,
            method: axum::http::Method::POST,
            path: &path,
            query: None,
            accept: JSON,
            body: None,
            jwt: None,
            max_body: transport::MAX_ANSWER_BYTES,
            guard: None,
        },
    )
    .await?;
    // The body holds the key and secrets: errors name fields, never quote values.
    let v: Value = serde_json::from_slice(&raw.body)
        .map_err(|_| GitHubError::decode(what, "the answer is not JSON"))?;
    let string = |key: &str| {
        v.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let missing = |key: &str| GitHubError::decode(what, format!("no `{key}` in the answer"));
    let id = v
        .get("id")
        .and_then(Value::as_u64)
        .filter(|&id| id > 0)
        .ok_or_else(|| missing("id"))?;
    let slug = string("slug").ok_or_else(|| missing("slug"))?;
    let html_url = string("html_url").ok_or_else(|| missing("html_url"))?;
    let pem = string("pem")
        .filter(|p| p.contains("PRIVATE KEY"))
        .ok_or_else(|| missing("pem"))?;
    let webhook_secret = string("webhook_secret").ok_or_else(|| missing("webhook_secret"))?;
    let owner = v
        .pointer("/owner/login")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(ConvertedApp {
        id,
        slug,
        html_url,
        pem: pem.into(),
        webhook_secret: webhook_secret.into(),
        owner,
    })
}
