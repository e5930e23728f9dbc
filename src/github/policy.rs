//! The one retry and timeout policy of every GitHub call, App (JWT) and installation alike:
//! a deadline on each attempt, bounded retries with backoff for 502/503/504 and for
//! requests that got no answer, and GitHub's rate-limit signals honoured (wait when the reset
//! is near, else `RateLimited`).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use bytes::Bytes;

use super::error::{one_line, GitHubError};
use super::guard::WriteGuard;

#[derive(Debug, Clone, PartialEq)]
pub struct RequestPolicy {
    /// Time allowed to open a connection.
    pub connect_timeout: Duration,
    /// Time allowed for one attempt, from sending to the last byte of the answer.
    pub request_timeout: Duration,
    /// Attempts in all for 502/503/504 and unanswered requests, the first included.
    pub max_attempts: u32,
    /// Backoff before the second attempt; it doubles each time (with up to 50% jitter), up
    /// to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// A rate limit that resets within this long is waited out (at most twice per call);
    /// a later one is returned as `RateLimited`.
    pub max_rate_limit_wait: Duration,
}

impl Default for RequestPolicy {
    fn default() -> Self {
        RequestPolicy {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_rate_limit_wait: Duration::from_secs(60),
        }
    }
}

/// An answer as it came: status, headers, body (whole unless `cut`).
#[derive(Debug)]
pub(crate) struct Raw {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body was longer than the call reads ([`super::transport::Call::max_body`]).
    pub cut: bool,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A list answer as octocrab's [`Page`](octocrab::Page): its items, and the
    /// `first`/`prev`/`next`/`last` links of its `Link` header. Anything that is not such a
    /// list is a `Decode` error saying `expected` (never quoting the body).
    pub async fn page(
        self,
        what: &str,
        expected: &str,
    ) -> Result<octocrab::Page<serde_json::Value>, GitHubError> {
        use http_body_util::BodyExt;
        use octocrab::FromResponse;
        let body = http_body_util::Full::new(self.body)
            .map_err(|never| -> octocrab::Error { match never {} });
        let mut response = axum::http::Response::new(body);
        *response.headers_mut() = self.headers;
        octocrab::Page::from_response(response)
            .await
            .map_err(|_| GitHubError::decode(what, expected))
    }

    /// The body as JSON, or a `Decode` error that never quotes the body.
    pub fn json(&self, what: &str) -> Result<serde_json::Value, GitHubError> {
        if self.cut {
            return Err(GitHubError::decode(
                what,
                format!("the answer is over {} bytes", self.body.len()),
            ));
        }
        serde_json::from_slice(&self.body).map_err(|e| {
            GitHubError::decode(
                what,
                format!(
                    "the body is not JSON (line {}, column {})",
                    e.line(),
                    e.column()
                ),
            )
        })
    }
}

impl RequestPolicy {
    /// The wait before attempt `attempt + 1` ([`crate::backoff::delay`]).
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        crate::backoff::delay(self.base_delay, self.max_delay, attempt)
    }

    /// Runs `attempt` (one HTTP exchange; `Err` is a transport failure, already free of
    /// secrets) under this policy and returns the first answer that is not retried.
    /// A 2xx answer is `Ok`; any other final answer is mapped by [`status_error`].
    pub(crate) async fn run<F, Fut>(&self, what: &str, attempt: F) -> Result<Raw, GitHubError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Raw, String>>,
    {
        self.run_guarded(what, None, attempt).await
    }

    /// [`run`](Self::run), asking `guard` right before each attempt (the first, and every
    /// one after a backoff or a rate-limit wait): when it says no, nothing more is sent and
    /// the call is [`GitHubError::Withheld`]. Each attempt is bounded by `request_timeout`.
    pub(crate) async fn run_guarded<F, Fut>(
        &self,
        what: &str,
        guard: Option<&dyn WriteGuard>,
        mut attempt: F,
    ) -> Result<Raw, GitHubError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Raw, String>>,
    {
        let mut attempts = 0;
        let mut rate_limit_waits = 0;
        loop {
            attempts += 1;
            if let Some(guard) = guard {
                if !guard.allows().await {
                    tracing::warn!(
                        what,
                        "GitHub write withheld: the run is no longer this process's"
                    );
                    return Err(GitHubError::Withheld {
                        what: what.to_string(),
                    });
                }
            }
            let outcome = match tokio::time::timeout(self.request_timeout, attempt()).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!(
                    "no complete answer within {}s",
                    self.request_timeout.as_secs()
                )),
            };
            let failure = match outcome {
                Ok(raw) if (200..300).contains(&raw.status) => return Ok(raw),
                Ok(raw) if matches!(raw.status, 403 | 429) => match rate_limit_wait(&raw) {
                    Some(wait) if wait <= self.max_rate_limit_wait && rate_limit_waits < 2 => {
                        rate_limit_waits += 1;
                        attempts -= 1;
                        tracing::warn!(what, wait_s = wait.as_secs(), "GitHub rate limit; waiting");
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    Some(reset_in) => {
                        return Err(GitHubError::RateLimited {
                            what: what.to_string(),
                            reset_in,
                        })
                    }
                    None => return Err(status_error(what, &raw)),
                },
                Ok(raw) if matches!(raw.status, 502..=504) => Failure::Status(raw),
                Ok(raw) => return Err(status_error(what, &raw)),
                Err(message) => Failure::Network(message),
            };
            if attempts >= self.max_attempts {
                return Err(match failure {
                    Failure::Status(raw) => status_error(what, &raw),
                    Failure::Network(message) => GitHubError::Network {
                        what: what.to_string(),
                        message: one_line(&message),
                    },
                });
            }
            let delay = self.backoff(attempts);
            let error = match &failure {
                Failure::Status(raw) => format!("HTTP {}", raw.status),
                Failure::Network(message) => one_line(message),
            };
            tracing::warn!(what, attempt = attempts, ?delay, %error, "GitHub call failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }
}

enum Failure {
    Status(Raw),
    Network(String),
}

/// How long GitHub asks us to wait, when a 403/429 is a rate limit: `retry-after`, else
/// `x-ratelimit-remaining: 0` with `x-ratelimit-reset`, else a minute for a bare 429
/// (GitHub's advice for secondary limits). A bare 403 is a real refusal: `None`.
fn rate_limit_wait(raw: &Raw) -> Option<Duration> {
    if let Some(secs) = raw
        .header("retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        return Some(Duration::from_secs(secs));
    }
    if raw.header("x-ratelimit-remaining").map(str::trim) == Some("0") {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let reset = raw
            .header("x-ratelimit-reset")
            .and_then(|v| v.trim().parse::<u64>().ok());
        return Some(match reset {
            // One more second: the reset is a whole second and clocks differ a little.
            Some(reset) => Duration::from_secs(reset.saturating_sub(now).max(1) + 1),
            None => Duration::from_secs(60),
        });
    }
    (raw.status == 429).then(|| Duration::from_secs(60))
}

/// The error for a final non-2xx answer, with GitHub's `message` (one line).
pub(crate) fn status_error(what: &str, raw: &Raw) -> GitHubError {
    let what = what.to_string();
    let message = github_message(raw);
    match raw.status {
        401 => GitHubError::Unauthorized { what, message },
        403 => GitHubError::Forbidden { what, message },
        404 | 410 => GitHubError::NotFound { what },
        status => GitHubError::Http {
            what,
            status,
            message,
        },
    }
}

/// GitHub's `message` field (plus the first `errors[].message` of a 422), else the start of
/// the body, else the status.
fn github_message(raw: &Raw) -> String {
    let from_json = serde_json::from_slice::<serde_json::Value>(&raw.body)
        .ok()
        .and_then(|v| {
            let message = v.get("message")?.as_str()?.to_string();
            let detail = v
                .get("errors")
                .and_then(|e| e.as_array())
                .and_then(|e| e.first())
                .and_then(|e| e.get("message").or_else(|| e.get("code")))
                .and_then(|m| m.as_str());
            Some(match detail {
                Some(d) => format!("{message} ({d})"),
                None => message,
            })
        });
    let text = from_json.unwrap_or_else(|| {
        let body = String::from_utf8_lossy(&raw.body);
        let line = body.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        if line.is_empty() {
            format!("HTTP {}", raw.status)
        } else {
            line.to_string()
        }
    });
    one_line(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn raw(status: u16, headers: &[(&'static str, String)], body: &str) -> Raw {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, v.parse().unwrap());
        }
        Raw {
            status,
            headers: h,
            body: Bytes::from(body.to_string()),
            cut: false,
        }
    }

    fn fast() -> RequestPolicy {
        RequestPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            request_timeout: Duration::from_millis(200),
            ..Default::default()
        }
    }

    #[test]
    fn rate_limit_signals() {
        assert_eq!(
            rate_limit_wait(&raw(403, &[("retry-after", "7".into())], "")),
            Some(Duration::from_secs(7))
        );
        let reset = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 30;
        let w = rate_limit_wait(&raw(
            403,
            &[
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", reset.to_string()),
            ],
            "",
        ))
        .unwrap();
        assert!(
            w >= Duration::from_secs(29) && w <= Duration::from_secs(32),
            "{w:?}"
        );
        assert_eq!(
            rate_limit_wait(&raw(429, &[], "")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            rate_limit_wait(&raw(403, &[("x-ratelimit-remaining", "12".into())], "")),
            None
        );
    }

    #[test]
    fn errors_carry_githubs_message() {
        let e = status_error(
            "POST /x",
            &raw(
                422,
                &[],
                r#"{"message":"Validation Failed","errors":[{"resource":"Issue","code":"custom","message":"body is too long"}],"documentation_url":"https://docs.github.com"}"#,
            ),
        );
        assert_eq!(
            e.to_string(),
            "POST /x: GitHub answered 422: Validation Failed (body is too long)"
        );
        let e = status_error("GET /y", &raw(401, &[], r#"{"message":"Bad credentials"}"#));
        assert!(
            matches!(e, GitHubError::Unauthorized { ref message, .. } if message == "Bad credentials")
        );
        let e = status_error("GET /y", &raw(502, &[], "<html>\n<h1>Bad gateway</h1>"));
        assert_eq!(e.to_string(), "GET /y: GitHub answered 502: <html>");
        assert!(status_error("GET /z", &raw(404, &[], "")).is_not_found());
    }

    #[tokio::test]
    async fn list_answers_become_octocrab_pages() {
        let link = "<https://api.github.com/repositories/1/issues/2/comments?per_page=100&page=2>; \
                    rel=\"next\", <https://api.github.com/repositories/1/issues/2/comments?per_page=100&page=3>; rel=\"last\"";
        let page = raw(200, &[("link", link.into())], r#"[{"id":1},{"id":2}]"#)
            .page("GET /c", "expected a list of comments")
            .await
            .unwrap();
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.number_of_pages(), Some(3));
        assert!(page.next.is_some());
        // The last page has no `last` link.
        let page = raw(200, &[], "[]").page("GET /c", "x").await.unwrap();
        assert_eq!((page.items.len(), page.number_of_pages()), (0, None));
        for body in ["{\"message\":\"ghs_secretsecretsecret\"}", "not json"] {
            let e = raw(200, &[], body)
                .page("GET /c", "expected a list of comments")
                .await
                .unwrap_err();
            assert_eq!(
                e.to_string(),
                "GET /c: unexpected answer from GitHub: expected a list of comments"
            );
        }
    }

    #[tokio::test]
    async fn retries_gateway_errors_then_succeeds() {
        let calls = AtomicU32::new(0);
        let out = fast()
            .run("GET /a", || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Ok(raw(502, &[], "")),
                    1 => Err("connection reset".to_string()),
                    _ => Ok(raw(200, &[], "{}")),
                }
            })
            .await
            .unwrap();
        assert_eq!(out.status, 200);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    /// Allows the first `allowed` writes it is asked about, then no more.
    struct Allows {
        allowed: u32,
        asked: AtomicU32,
    }

    #[async_trait::async_trait]
    impl WriteGuard for Allows {
        async fn allows(&self) -> bool {
            self.asked.fetch_add(1, Ordering::SeqCst) < self.allowed
        }
    }

    #[tokio::test]
    async fn a_guard_is_asked_before_every_attempt_and_a_no_sends_nothing() {
        // Allowed once: the first attempt goes out (502), the retry is withheld unsent.
        let guard = Allows {
            allowed: 1,
            asked: AtomicU32::new(0),
        };
        let calls = AtomicU32::new(0);
        let err = fast()
            .run_guarded("PATCH /a", Some(&guard), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(raw(502, &[], ""))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, GitHubError::Withheld { ref what } if what == "PATCH /a"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "PATCH /a: not sent: the work it was for is no longer this process's"
        );
        assert_eq!(err.status(), None);
        assert_eq!(
            (
                calls.load(Ordering::SeqCst),
                guard.asked.load(Ordering::SeqCst)
            ),
            (1, 2)
        );
        // Allowed throughout: asked once per attempt.
        let guard = Allows {
            allowed: u32::MAX,
            asked: AtomicU32::new(0),
        };
        let calls = AtomicU32::new(0);
        let out = fast()
            .run_guarded("POST /b", Some(&guard), || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Err("connection reset".to_string()),
                    _ => Ok(raw(201, &[], "{}")),
                }
            })
            .await
            .unwrap();
        assert_eq!(out.status, 201);
        assert_eq!(guard.asked.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn only_reads_go_out_without_asking() {
        use crate::github::guard::is_write;
        use axum::http::Method;
        for m in [Method::GET, Method::HEAD] {
            assert!(!is_write(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::PUT, Method::DELETE] {
            assert!(is_write(&m), "{m}");
        }
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts_and_never_retries_client_errors() {
        let calls = AtomicU32::new(0);
        let err = fast()
            .run("GET /a", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(raw(503, &[], r#"{"message":"Service Unavailable"}"#))
            })
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(
            matches!(err, GitHubError::Http { status: 503, .. }),
            "{err}"
        );

        let calls = AtomicU32::new(0);
        let err = fast()
            .run("GET /a", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(raw(500, &[], r#"{"message":"boom"}"#))
            })
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(matches!(err, GitHubError::Http { status: 500, .. }));
    }

    #[tokio::test]
    async fn a_hanging_attempt_times_out_and_counts_as_network() {
        let calls = AtomicU32::new(0);
        let err = fast()
            .run("GET /slow", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(raw(200, &[], ""))
            })
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(matches!(err, GitHubError::Network { .. }), "{err}");
    }

    #[tokio::test]
    async fn far_rate_limit_is_returned_near_one_is_waited() {
        let err = fast()
            .run("GET /r", || async {
                Ok(raw(429, &[("retry-after", "3600".into())], ""))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, GitHubError::RateLimited { reset_in, .. } if reset_in == Duration::from_secs(3600))
        );
        let calls = AtomicU32::new(0);
        let out = fast()
            .run("GET /r", || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Ok(raw(403, &[("retry-after", "0".into())], "")),
                    _ => Ok(raw(200, &[], "")),
                }
            })
            .await
            .unwrap();
        assert_eq!(out.status, 200);
    }
}
