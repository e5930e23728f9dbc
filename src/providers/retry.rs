//! One retry policy for model APIs: 429, 5xx, 529 and timeouts are retried with exponential
//! backoff and jitter, honouring `retry-after`, bounded in attempts and in total time.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The first backoff; each next one doubles, up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// No retry starts once this much time has passed since the first attempt.
    pub max_total: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 6,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            max_total: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// Whether an HTTP status is worth another attempt.
    pub fn retryable_status(status: u16) -> bool {
        matches!(status, 408 | 409 | 429 | 500..=599)
    }

    /// The wait before attempt `attempt + 1` (attempt counts from 1): `retry-after` when the
    /// server sent one (capped at `max_delay`), else exponential backoff with up to 50%
    /// added jitter.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_delay);
        }
        crate::backoff::delay(self.base_delay, self.max_delay, attempt)
    }
}

/// The largest model API answer kodx reads (a full 64,000-token answer is well under
/// 1 MiB); a larger one is refused rather than buffered.
pub(crate) const MAX_ANSWER_BYTES: usize = 16 << 20;

enum ReadError {
    TooLarge,
    Failed(reqwest::Error),
}

/// Reads a response body, refusing it once it passes `max` bytes (declared or received).
async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<bytes::Bytes, ReadError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(ReadError::Failed)? {
        if body.len() + chunk.len() > max {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Sends a request built by `build` until it succeeds, fails for good, or the policy's
/// budget runs out. Returns the body of the first 2xx answer. `error_message` reads an
/// error body; `redact` removes secrets from every message.
pub(crate) async fn send_with_retry(
    provider: &'static str,
    policy: &RetryPolicy,
    build: impl Fn() -> reqwest::RequestBuilder,
    error_message: impl Fn(&[u8]) -> String,
    redact: impl Fn(&str) -> String,
) -> Result<bytes::Bytes, crate::model::ProviderError> {
    use crate::model::ProviderError;
    let started = std::time::Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (last, retry_after) = match build().send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = parse_retry_after(resp.headers());
                match read_bounded(resp, MAX_ANSWER_BYTES).await {
                    Ok(bytes) if (200..300).contains(&status) => return Ok(bytes),
                    Ok(bytes) => {
                        let message = redact(&error_message(&bytes));
                        if !RetryPolicy::retryable_status(status) {
                            return Err(ProviderError::Api {
                                provider,
                                status,
                                message,
                            });
                        }
                        (format!("HTTP {status}: {message}"), retry_after)
                    }
                    Err(ReadError::TooLarge) => {
                        return Err(ProviderError::Malformed {
                            provider,
                            detail: format!(
                            "the answer (HTTP {status}) is over {} MiB; kodx reads no more of it",
                            MAX_ANSWER_BYTES >> 20
                        ),
                        })
                    }
                    // Cut off mid-body: retried like a failed connection.
                    Err(ReadError::Failed(e)) => (
                        redact(&format!("HTTP {status}, the answer was cut off: {e}")),
                        retry_after,
                    ),
                }
            }
            Err(e) => (redact(&format!("request failed: {e}")), None),
        };
        let delay = policy.delay(attempt, retry_after);
        if attempt >= policy.max_attempts || started.elapsed() + delay > policy.max_total {
            return Err(ProviderError::Exhausted {
                provider,
                attempts: attempt,
                last,
            });
        }
        tracing::warn!(provider, attempt, ?delay, error = %last, "model API call failed; retrying");
        tokio::time::sleep(delay).await;
    }
}

/// Parses a `retry-after` header: seconds (possibly fractional), or `retry-after-ms`.
pub fn parse_retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        return (ms.is_finite() && ms >= 0.0).then(|| Duration::from_secs_f64(ms / 1000.0));
    }
    let secs = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        for s in [408, 409, 429, 500, 502, 503, 529] {
            assert!(RetryPolicy::retryable_status(s), "{s}");
        }
        for s in [400, 401, 403, 404, 413, 422] {
            assert!(!RetryPolicy::retryable_status(s), "{s}");
        }
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let p = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            ..Default::default()
        };
        for attempt in 1..=4 {
            let d = p.delay(attempt, None);
            let base = Duration::from_millis(100 << (attempt - 1));
            assert!(d >= base && d <= base.mul_f64(1.5), "{attempt}: {d:?}");
        }
        assert!(p.delay(20, None) <= Duration::from_secs(2));
    }

    #[test]
    fn retry_after_wins_and_is_capped() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(p.delay(1, Some(Duration::from_secs(3600))), p.max_delay);
    }

    #[test]
    fn retry_after_headers() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(parse_retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(parse_retry_after(&h), Some(Duration::from_millis(250)));
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(parse_retry_after(&h), None);
    }
}
