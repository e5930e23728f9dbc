//! The one way kodx talks to GitHub: an octocrab client per identity (the App, or one
//! installation token), and [`send`], which runs one request through it under the
//! [`RequestPolicy`]. App calls (JWT) and installation calls differ only in the client.
//!
//! Octocrab's own retries are off, so the policy is the single retry and rate-limit layer;
//! octocrab provides the connection pool and TLS, the `base_uri` (paths are appended to it,
//! so an Enterprise `…/api/v3` base keeps its prefix), the installation token's
//! `Authorization` header, and `X-GitHub-Api-Version: 2022-11-28` on every request. The
//! App's JWT is kodx's own ([`super::GitHubApp::app_jwt`], `iss` the App id as a string),
//! signed for each attempt and sent by [`send`]: octocrab's App auth writes `iss` as a
//! number, which `jsonwebtoken`-based verifiers (the test fake among them) do not take as
//! the required `iss` claim.

use axum::http; // the `http` crate, which octocrab's raw request API speaks
use octocrab::service::middleware::retry::RetryConfig;
use octocrab::Octocrab;
use secrecy::SecretString;
use serde_json::Value;

use super::error::GitHubError;
use super::guard::{is_write, WriteGuard};
use super::policy::{Raw, RequestPolicy};

/// Sent as `User-Agent` on every request (GitHub requires one).
pub const USER_AGENT: &str = "kodx";

/// The `Accept` of JSON answers.
pub(crate) const JSON: &str = "application/vnd.github+json";

/// The most of an answer's body kodx reads (GitHub's largest answers, a 7 MB tree or a
/// 100-item page, are well under it): past it the body is cut, [`Raw::cut`] says so, and
/// JSON readers refuse it.
pub(crate) const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// Who a client speaks as.
pub(crate) enum Auth {
    /// The App itself: no credentials in the client; [`Call::jwt`] signs one per attempt.
    App,
    /// One installation, with a token minted for it.
    Installation(SecretString),
}

/// An octocrab client on `api_url` with the policy's timeouts and kodx's `User-Agent`.
/// Must be called inside a Tokio runtime (octocrab starts its worker there), and the client
/// used on that runtime.
pub(crate) fn client(
    api_url: &str,
    policy: &RequestPolicy,
    auth: Auth,
) -> Result<Octocrab, GitHubError> {
    let config = |e: octocrab::Error| {
        GitHubError::Config(format!("cannot build the GitHub client for {api_url}: {e}"))
    };
    // Octocrab's rustls has no crypto provider of its own choosing: ring, as everywhere.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = Octocrab::builder().base_uri(api_url).map_err(config)?;
    let builder = match auth {
        Auth::App => builder,
        Auth::Installation(token) => builder.personal_token(token),
    };
    builder
        .add_retry_config(RetryConfig::None)
        .set_connect_timeout(Some(policy.connect_timeout))
        .set_read_timeout(Some(policy.request_timeout))
        .set_write_timeout(Some(policy.request_timeout))
        .add_header(http::header::USER_AGENT, USER_AGENT.to_string())
        .build()
        .map_err(config)
}

/// One request, as kodx sends every GitHub call.
pub(crate) struct Call<'a> {
    /// Names the request in errors and logs (`GET /repos/o/r/issues/1`); never a secret.
    pub what: &'a str,
    pub method: http::Method,
    /// Relative to the API base, starting with `/`.
    pub path: &'a str,
    /// Already encoded.
    pub query: Option<&'a str>,
    pub accept: &'a str,
    pub body: Option<&'a Value>,
    /// For the App's own endpoints: signs the JWT sent as `Authorization: Bearer`, once per
    /// attempt (so a retry late in a long wait does not send an expired one).
    pub jwt: Option<&'a (dyn Fn() -> Result<String, GitHubError> + Sync)>,
    /// The most of the body read ([`MAX_ANSWER_BYTES`] unless a call needs less).
    pub max_body: usize,
    /// Asked before each attempt when the call writes ([`super::guard`]): the installation
    /// client's guard, if it has one.
    pub guard: Option<&'a dyn WriteGuard>,
}

/// Runs `call` through `octo` under `policy`: the first answer not retried, a 2xx as `Ok`.
pub(crate) async fn send(
    octo: &Octocrab,
    policy: &RequestPolicy,
    call: Call<'_>,
) -> Result<Raw, GitHubError> {
    let uri = match call.query {
        Some(q) => format!("{}?{q}", call.path),
        None => call.path.to_string(),
    };
    let (method, accept, body, jwt) = (call.method, call.accept, call.body, call.jwt);
    let max_body = call.max_body;
    let guard = call.guard.filter(|_| is_write(&method));
    policy
        .run_guarded(call.what, guard, || {
            let method = method.clone();
            let uri = uri.clone();
            async move {
                let mut builder = http::Request::builder()
                    .method(method)
                    .uri(uri)
                    .header(http::header::ACCEPT, accept);
                if let Some(jwt) = jwt {
                    let jwt = jwt().map_err(|e| e.to_string())?;
                    let mut value = http::HeaderValue::try_from(format!("Bearer {jwt}"))
                        .map_err(|_| "the App JWT is not a header value".to_string())?;
                    value.set_sensitive(true);
                    builder = builder.header(http::header::AUTHORIZATION, value);
                }
                let request = octo
                    .build_request(builder, body)
                    .map_err(|e| format!("building the request: {e}"))?;
                let response = octo.execute(request).await.map_err(|e| e.to_string())?;
                let status = response.status().as_u16();
                let headers = response.headers().clone();
                let (body, cut) = read_bounded(response.into_body(), max_body)
                    .await
                    .map_err(|e| format!("reading the answer: {e}"))?;
                Ok(Raw {
                    status,
                    headers,
                    body,
                    cut,
                })
            }
        })
        .await
}

/// At most `max` bytes of `body`, and whether there was more (the rest is never read: the
/// connection is dropped).
async fn read_bounded<B>(mut body: B, max: usize) -> Result<(bytes::Bytes, bool), B::Error>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let room = max - out.len();
        if data.len() > room {
            out.extend_from_slice(&data[..room]);
            return Ok((out.freeze(), true));
        }
        out.extend_from_slice(&data);
    }
    Ok((out.freeze(), false))
}
