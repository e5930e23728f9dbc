//! Model providers over HTTP (reqwest): the Anthropic Messages API and OpenAI-compatible
//! Chat Completions. Each client takes its base URL, so tests point it at a fake server and
//! exercise the real code.

pub mod anthropic;
pub mod openai;
pub mod retry;

use std::sync::OnceLock;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

pub use anthropic::AnthropicClient;
pub use openai::OpenAiClient;
pub use retry::RetryPolicy;

/// `text` with every occurrence of the API key `key` replaced, for error messages. (The key
/// itself is a [`SecretString`]: no `Debug` or `Display` shows it, and it is zeroed on
/// drop.)
pub(crate) fn redact_key(key: &SecretString, text: &str) -> String {
    let key = key.expose_secret();
    if key.len() < 8 {
        return text.to_string();
    }
    text.replace(key, "[REDACTED]")
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

/// Builds the HTTP client now (loading the system's root certificates takes tens of
/// milliseconds), on the calling thread: `kodx run` does it on a blocking thread while
/// its sandbox starts, so the first model call does not wait for it.
pub fn prepare_http_client() {
    let _ = http_client();
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

    const KEY: &str = "sk-ant-secret-123456";

    #[test]
    fn keys_are_never_shown() {
        let k = SecretString::from(KEY);
        assert!(!format!("{k:?}").contains(KEY));
        assert_eq!(
            redact_key(&k, "bad key sk-ant-secret-123456!"),
            "bad key [REDACTED]!"
        );
        assert_eq!(
            redact_key(&SecretString::from("short"), "a short b"),
            "a short b"
        );
        let anthropic = AnthropicClient::new("http://h", KEY);
        assert!(!format!("{anthropic:?}").contains(KEY), "{anthropic:?}");
        let openai = OpenAiClient::new("http://h", Some(KEY.into()));
        assert!(!format!("{openai:?}").contains(KEY), "{openai:?}");
    }

    #[test]
    fn urls_join() {
        assert_eq!(join_url("http://h/v1/", "/chat"), "http://h/v1/chat");
        assert_eq!(join_url("http://h", "v1/messages"), "http://h/v1/messages");
    }
}
