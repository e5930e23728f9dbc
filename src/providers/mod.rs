//! Model providers over HTTP (reqwest): the Anthropic Messages API and OpenAI-compatible
//! Chat Completions. Each client takes its base URL, so tests point it at a fake server and
//! exercise the real code.

pub mod anthropic;
pub mod openai;
pub mod retry;

use std::sync::OnceLock;
use std::time::Duration;

pub use anthropic::AnthropicClient;
pub use openai::OpenAiClient;
pub use retry::RetryPolicy;

/// An API key: never printed, never in a `Debug`.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key replaced, for error messages.
    pub(crate) fn redact(&self, text: &str) -> String {
        if self.0.len() < 8 {
            return text.to_string();
        }
        text.replace(&self.0, "[REDACTED]")
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey([REDACTED])")
    }
}

/// The HTTP client every provider uses: rustls with the ring provider (the one the Docker
/// client already brings), a connect timeout, and a generous request timeout for long
/// generations.
pub(crate) fn http_client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(600))
                .user_agent(concat!("kodx/", env!("CARGO_PKG_VERSION")))
                .build()
                .expect("building the HTTP client")
        })
        .clone()
}

/// Joins a base URL and a path without doubling or losing the slash.
pub(crate) fn join_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_never_shown() {
        let k = ApiKey::new("sk-ant-secret-123456");
        assert_eq!(format!("{k:?}"), "ApiKey([REDACTED])");
        assert_eq!(
            k.redact("bad key sk-ant-secret-123456!"),
            "bad key [REDACTED]!"
        );
    }

    #[test]
    fn urls_join() {
        assert_eq!(join_url("http://h/v1/", "/chat"), "http://h/v1/chat");
        assert_eq!(join_url("http://h", "v1/messages"), "http://h/v1/messages");
    }
}
