//! Images attached to an issue or comment, fetched for the model (SPEC §12, "Steering and
//! pictures").
//!
//! Only an image on GitHub's own hosts is fetched: under the web origin (`GITHUB_URL`,
//! e.g. `https://github.com/user-attachments/assets/…`), the API origin, or on
//! `https://*.githubusercontent.com`. github.com answers an attachment with a redirect to
//! its asset host: redirects are followed by hand, at most [`MAX_REDIRECTS`]. The
//! installation token goes with the first request, and with a redirect only while it stays
//! on the same origin: once a redirect leaves that origin, no later request carries it,
//! wherever it goes. An image is read with a bound ([`MAX_IMAGE_BYTES`]: nothing past it
//! is read), and its kind is found from its bytes. No image's bytes are ever logged.

use std::sync::OnceLock;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};

use crate::image::Image;

/// The most bytes of one image (5 MiB; the model APIs take at most about that).
pub const MAX_IMAGE_BYTES: u64 = 5 << 20;
/// The most bytes of all the images of one run: base64 makes them a third larger, and the
/// Anthropic API takes at most 32 MB in one request, the conversation included.
pub const MAX_TOTAL_BYTES: u64 = 20 << 20;
/// The most pixels on one side (the Anthropic API refuses a larger image).
pub const MAX_IMAGE_SIDE: u32 = 8000;
/// Redirects followed for one image.
pub const MAX_REDIRECTS: usize = 3;
/// How long one image may take, all its requests together.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an image was not given to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// Not under GitHub's web origin nor on `*.githubusercontent.com`: never fetched.
    NotOnGitHub,
    /// Over [`MAX_IMAGE_BYTES`].
    TooLarge,
    /// Over [`MAX_IMAGE_SIDE`] pixels wide or high.
    TooManyPixels,
    /// Its bytes are not a PNG, JPEG, GIF or WebP.
    NotAnImage,
    /// After the first five.
    MoreThanFive,
    /// Over [`MAX_TOTAL_BYTES`] with the images given before it.
    TooLargeInAll,
    /// The fetch failed, with a short reason (never a URL).
    FetchFailed(String),
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skipped::NotOnGitHub => write!(f, "not on GitHub"),
            Skipped::TooLarge => write!(f, "too large (over {} MiB)", MAX_IMAGE_BYTES >> 20),
            Skipped::TooManyPixels => write!(f, "too large (over {MAX_IMAGE_SIDE} pixels a side)"),
            Skipped::NotAnImage => write!(f, "not an image"),
            Skipped::MoreThanFive => write!(f, "more than 5 images"),
            Skipped::TooLargeInAll => write!(
                f,
                "too large with the images before it (over {} MiB in all)",
                MAX_TOTAL_BYTES >> 20
            ),
            Skipped::FetchFailed(why) => write!(f, "fetch failed: {why}"),
        }
    }
}

/// GitHub's own hosts: the web and API origins kodx was given, and
/// `https://*.githubusercontent.com`.
#[derive(Debug, Clone)]
pub struct GitHubHosts {
    web: Option<Url>,
    api: Option<Url>,
}

impl GitHubHosts {
    pub fn new(web_url: &str, api_url: &str) -> GitHubHosts {
        GitHubHosts {
            web: Url::parse(web_url).ok(),
            api: Url::parse(api_url).ok(),
        }
    }

    /// Whether `url` is on one of GitHub's own hosts.
    pub fn holds(&self, url: &Url) -> bool {
        let same = |o: &Option<Url>| o.as_ref().is_some_and(|o| same_origin(o, url));
        if same(&self.web) || same(&self.api) {
            return true;
        }
        url.scheme() == "https"
            && url.port().is_none()
            && url.host_str().is_some_and(|h| {
                let h = h.to_ascii_lowercase();
                h.ends_with(".githubusercontent.com") && !h.contains("..")
            })
    }

    /// Whether `url` (an image's address as written) may be fetched: an http(s) URL on
    /// GitHub's own hosts (the web origin's path, not only its host, is what GitHub Enterprise
    /// serves attachments under).
    pub fn allows(&self, url: &str) -> Option<Url> {
        let url = Url::parse(url).ok()?;
        let fine = matches!(url.scheme(), "https" | "http")
            && url.username().is_empty()
            && url.password().is_none()
            && self.holds(&url);
        fine.then_some(url)
    }
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str().map(str::to_ascii_lowercase) == b.host_str().map(str::to_ascii_lowercase)
        && a.port_or_known_default() == b.port_or_known_default()
}

/// The client of image fetches: no redirects of its own, no cookies, timeouts.
fn client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(Duration::from_secs(10))
                .timeout(FETCH_TIMEOUT)
                .user_agent(concat!("kodx/", env!("CARGO_PKG_VERSION")))
                .build()
                .expect("building the HTTP client")
        })
        .clone()
}

/// Fetches the image at `url` (already [`GitHubHosts::allows`]ed), with `token` as the
/// rules above say.
pub async fn fetch(url: Url, token: &SecretString, hosts: &GitHubHosts) -> Result<Image, Skipped> {
    match tokio::time::timeout(FETCH_TIMEOUT, fetch_within(url, token, hosts)).await {
        Ok(done) => done,
        Err(_) => Err(Skipped::FetchFailed("timed out".into())),
    }
}

async fn fetch_within(
    mut url: Url,
    token: &SecretString,
    hosts: &GitHubHosts,
) -> Result<Image, Skipped> {
    let failed = |why: &str| Skipped::FetchFailed(why.to_string());
    let mut with_token = hosts.holds(&url);
    let mut hops = 0;
    let response = loop {
        let mut request = client().get(url.clone()).header("accept", "image/*");
        if with_token {
            request = request.bearer_auth(token.expose_secret());
        }
        let response = request.send().await.map_err(|e| failed(short(&e)))?;
        if !response.status().is_redirection() {
            break response;
        }
        if hops == MAX_REDIRECTS {
            return Err(failed("too many redirects"));
        }
        hops += 1;
        let next = response
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .and_then(|l| url.join(l).ok())
            .filter(|u| matches!(u.scheme(), "https" | "http"))
            .ok_or_else(|| failed("a redirect without a usable location"))?;
        // The token follows a redirect only within the origin it was sent to.
        with_token = with_token && same_origin(&url, &next);
        url = next;
    };
    match response.status() {
        StatusCode::OK => {}
        s => return Err(Skipped::FetchFailed(format!("HTTP {}", s.as_u16()))),
    }
    let bytes = read_bounded(response).await?;
    let image = Image::from_bytes(bytes).ok_or(Skipped::NotAnImage)?;
    match image.dimensions {
        Some((w, h)) if w > MAX_IMAGE_SIDE || h > MAX_IMAGE_SIDE => Err(Skipped::TooManyPixels),
        _ => Ok(image),
    }
}

/// The body, or [`Skipped::TooLarge`] as soon as it is over [`MAX_IMAGE_BYTES`] (what it
/// says it holds, or what has arrived).
async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, Skipped> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_IMAGE_BYTES)
    {
        return Err(Skipped::TooLarge);
    }
    let mut out = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Skipped::FetchFailed(short(&e).to_string()))?
    {
        if out.len() as u64 + chunk.len() as u64 > MAX_IMAGE_BYTES {
            return Err(Skipped::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A reqwest error in a few words, without its URL (a signed asset URL holds a secret).
fn short(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the answer broke off"
    } else {
        "the request failed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;

    #[test]
    fn only_githubs_own_hosts_are_fetched() {
        let hosts = GitHubHosts::new("https://github.com", "https://api.github.com");
        let ok = |u: &str| hosts.allows(u).is_some();
        assert!(ok("https://github.com/user-attachments/assets/0f1e2d3c"));
        assert!(ok("https://GitHub.com:443/owner/repo/assets/1/2"));
        assert!(ok(
            "https://private-user-images.githubusercontent.com/1/2.png?jwt=x"
        ));
        assert!(ok("https://user-images.githubusercontent.com/1/2.png"));
        assert!(ok("https://api.github.com/repos/o/r/contents/a.png"));
        assert!(!ok("http://github.com/user-attachments/assets/1"));
        assert!(!ok("https://github.com.evil.example/a.png"));
        assert!(!ok("https://evilgithubusercontent.com/a.png"));
        assert!(!ok("http://user-images.githubusercontent.com/1/2.png"));
        assert!(!ok(
            "https://user-images.githubusercontent.com:8443/1/2.png"
        ));
        assert!(!ok("https://user:pw@github.com/a.png"));
        assert!(!ok("https://example.com/a.png"));
        assert!(!ok("data:image/png;base64,AAAA"));
        assert!(!ok("/relative.png"));
        // GitHub Enterprise Server: its own host.
        let ghes = GitHubHosts::new("https://ghe.example", "https://ghe.example/api/v3");
        assert!(ghes
            .allows("https://ghe.example/user-attachments/assets/1")
            .is_some());
        assert!(ghes
            .allows("https://github.com/user-attachments/assets/1")
            .is_none());
    }

    /// A server on loopback taken as GitHub's web origin: `/big` streams 6 MiB with no
    /// length, `/loop` redirects to itself, `/gone` is 404, `/ftp` redirects to ftp, `/gif`
    /// is a GIF whose `Content-Type` says text.
    async fn github_on_loopback() -> (String, GitHubHosts) {
        use axum::body::Body;
        use axum::response::IntoResponse;
        use axum::routing::get;
        let app = axum::Router::new()
            .route(
                "/big",
                get(|| async {
                    let chunk = bytes::Bytes::from(vec![0u8; 64 << 10]);
                    let stream = futures_util::stream::iter(
                        (0..96).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                    );
                    Body::from_stream(stream)
                }),
            )
            .route(
                "/loop",
                get(|| async { (StatusCode::FOUND, [("location", "/loop")]).into_response() }),
            )
            .route("/gone", get(|| async { StatusCode::NOT_FOUND }))
            .route(
                "/ftp",
                get(|| async { (StatusCode::FOUND, [("location", "ftp://x/y")]).into_response() }),
            )
            .route(
                "/wide",
                get(|| async {
                    let mut b = b"GIF89a".to_vec();
                    b.extend([0x41, 0x1F, 0x01, 0x00]);
                    b
                }),
            )
            .route(
                "/gif",
                get(|| async {
                    (
                        [("content-type", "text/plain")],
                        b"GIF89a\x02\0\x03\0".to_vec(),
                    )
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let hosts = GitHubHosts::new(&url, &url);
        (url, hosts)
    }

    #[tokio::test]
    async fn a_fetch_is_bounded_and_says_why_it_failed() {
        let (url, hosts) = github_on_loopback().await;
        let token = SecretString::from("ghs_test_token_0123456789");
        let fetch_ = |path: &str| {
            let u = hosts.allows(&format!("{url}{path}")).unwrap();
            let (token, hosts) = (token.clone(), hosts.clone());
            async move { fetch(u, &token, &hosts).await }
        };
        assert_eq!(fetch_("/big").await.unwrap_err(), Skipped::TooLarge);
        assert_eq!(fetch_("/wide").await.unwrap_err(), Skipped::TooManyPixels);
        let words: Vec<String> = ["/loop", "/gone", "/ftp"]
            .iter()
            .map(|p| async move { fetch_(p).await.unwrap_err().to_string() })
            .collect::<futures_util::stream::FuturesOrdered<_>>()
            .collect()
            .await;
        insta::assert_snapshot!(words.join("\n"), @"
        fetch failed: too many redirects
        fetch failed: HTTP 404
        fetch failed: a redirect without a usable location
        ");
        let gif = fetch_("/gif").await.unwrap();
        assert_eq!(
            (gif.kind, gif.dimensions),
            (crate::image::ImageKind::Gif, Some((2, 3)))
        );
    }

    #[test]
    fn reasons_read_as_the_status_comment_names_them() {
        let all = [
            Skipped::NotOnGitHub,
            Skipped::TooLarge,
            Skipped::TooManyPixels,
            Skipped::NotAnImage,
            Skipped::MoreThanFive,
            Skipped::TooLargeInAll,
            Skipped::FetchFailed("HTTP 404".into()),
        ];
        let words: Vec<String> = all.iter().map(ToString::to_string).collect();
        insta::assert_snapshot!(words.join("\n"), @r"
        not on GitHub
        too large (over 5 MiB)
        too large (over 8000 pixels a side)
        not an image
        more than 5 images
        too large with the images before it (over 20 MiB in all)
        fetch failed: HTTP 404
        ");
    }
}
