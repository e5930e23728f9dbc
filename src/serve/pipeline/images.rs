//! The images of the issue (or pull request) and of the request, given to the model after
//! the run's first message (SPEC §12, "Steering and pictures"): found in the text as the
//! model is given it (hidden text removed first, so an image in an HTML comment is never
//! fetched), fetched from GitHub's own hosts ([`crate::github::attachments`]), at most
//! [`MAX_IMAGES`]; every image not given is named in the status comment with its reason.

use crate::github::attachments::{self, GitHubHosts, Skipped};
use crate::image::Image;
use crate::markdown::{self, ImageRef};

use super::context::{strip_hidden, RunContext};
use super::RunCtx;

/// The most images given to one run.
pub(in crate::serve) const MAX_IMAGES: usize = 5;
/// The most images looked at (and named) in one run's texts.
const MAX_FOUND: usize = 20;
/// The longest alt text told or shown, in characters.
const MAX_ALT_CHARS: usize = 80;

/// What the run's texts held.
#[derive(Debug, Default)]
pub(in crate::serve) struct Gathered {
    /// Given to the model, in order, with their (cleaned) alt text.
    pub images: Vec<(Image, String)>,
    /// Not given: the image's number in the texts, its alt text, why.
    pub skipped: Vec<(usize, String, Skipped)>,
    /// Images past the first [`MAX_FOUND`], not looked at.
    pub unlooked: usize,
}

impl Gathered {
    /// The images alone.
    pub fn given(&self) -> Vec<Image> {
        self.images.iter().map(|(i, _)| i.clone()).collect()
    }

    /// kodx's words after the prompt, telling the model what follows (`None`: no image).
    pub fn preface(&self) -> Option<String> {
        if self.images.is_empty() {
            return None;
        }
        let mut out = match self.images.len() {
            1 => "[kodx: the image of the description and the request follows:".to_string(),
            n => format!(
                "[kodx: the {n} images of the description and the request follow, in the order they appear:"
            ),
        };
        for (n, (image, alt)) in self.images.iter().enumerate() {
            out.push_str(&format!("\n{}. {}", n + 1, image.describe()));
            if !alt.is_empty() {
                out.push_str(&format!(", alt text: {alt:?}"));
            }
        }
        out.push(']');
        Some(out)
    }
}

/// The image references of `texts` (each cleaned of hidden text first), in order, the same
/// address once; and how many more there were past [`MAX_FOUND`].
pub(in crate::serve) fn find(texts: &[&str]) -> (Vec<ImageRef>, usize) {
    let mut found: Vec<ImageRef> = Vec::new();
    let mut more = 0;
    for text in texts {
        let (refs, over) = markdown::images(&strip_hidden(text), 1000);
        more += over;
        for r in refs {
            if found.iter().any(|f| f.url == r.url) {
                continue;
            }
            if found.len() == MAX_FOUND {
                more += 1;
                continue;
            }
            found.push(ImageRef {
                alt: clean_alt(&r.alt),
                url: r.url,
            });
        }
    }
    (found, more)
}

/// Alt text as it is told and shown: hidden text removed, on one line, cut.
fn clean_alt(alt: &str) -> String {
    let words = strip_hidden(alt);
    let one_line = words.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(MAX_ALT_CHARS) {
        Some((at, _)) => format!("{}…", &one_line[..at]),
        None => one_line,
    }
}

/// Fetches what [`find`] found: those not on GitHub are skipped, the first
/// [`MAX_IMAGES`] on GitHub fetched side by side, the rest skipped.
pub(in crate::serve) async fn gather(
    refs: Vec<ImageRef>,
    unlooked: usize,
    token: &secrecy::SecretString,
    hosts: &GitHubHosts,
) -> Gathered {
    let mut out = Gathered {
        unlooked,
        ..Default::default()
    };
    let mut fetches = Vec::new();
    for (i, r) in refs.into_iter().enumerate() {
        match hosts.allows(&r.url) {
            None => out.skipped.push((i + 1, r.alt, Skipped::NotOnGitHub)),
            Some(_) if fetches.len() == MAX_IMAGES => {
                out.skipped.push((i + 1, r.alt, Skipped::MoreThanFive))
            }
            Some(url) => fetches.push((i + 1, r.alt, url)),
        }
    }
    let fetched = futures_util::future::join_all(
        fetches
            .iter()
            .map(|(_, _, url)| attachments::fetch(url.clone(), token, hosts)),
    )
    .await;
    let mut total = 0;
    for ((n, alt, _), result) in fetches.into_iter().zip(fetched) {
        match result {
            Ok(image) if total + image.size > attachments::MAX_TOTAL_BYTES => {
                out.skipped.push((n, alt, Skipped::TooLargeInAll))
            }
            Ok(image) => {
                total += image.size;
                out.images.push((image, alt))
            }
            Err(why) => out.skipped.push((n, alt, why)),
        }
    }
    out.skipped.sort_by_key(|s| s.0);
    out
}

impl RunCtx<'_> {
    /// The images of the run's description and request, fetched, stored for the run page
    /// and noted for the status comment. A `/kodx continue` gathers none: it goes on with
    /// the stopped run's conversation (whose transcript keeps no image bytes); nor does a
    /// server with `images = false`.
    pub(in crate::serve) async fn gather_images(&self, context: &RunContext) -> Gathered {
        let continues = self.run.request.job.kind() == crate::job::JobKind::Continue;
        if continues || !self.svc.settings.images {
            return Gathered::default();
        }
        let (refs, unlooked) = find(&[&context.body, &context.request]);
        if refs.is_empty() {
            return Gathered::default();
        }
        let hosts = GitHubHosts::new(&self.svc.github_web(), self.svc.app.api_url());
        let gathered = gather(refs, unlooked, self.gh.token(), &hosts).await;
        tracing::info!(
            given = gathered.images.len(),
            skipped = gathered.skipped.len(),
            "images of the issue"
        );
        for (n, (image, _)) in gathered.images.iter().enumerate() {
            let Some(bytes) = &image.bytes else { continue };
            let stored = self
                .svc
                .db
                .store_run_image(
                    &self.run.id,
                    self.lease.lease(),
                    n as i64,
                    image.kind.as_str(),
                    image.dimensions,
                    &image.sha256,
                    bytes,
                )
                .await;
            if let Err(e) = stored {
                tracing::warn!("storing image {n} for the run page failed: {e}");
            }
        }
        let skipped: Vec<(usize, String, String)> = gathered
            .skipped
            .iter()
            .map(|(n, alt, why)| (*n, alt.clone(), why.to_string()))
            .collect();
        if let Some(note) = crate::serve::texts::status::images_skipped(&skipped, gathered.unlooked)
        {
            *self.log.images_note.lock() = Some(note);
        }
        gathered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five images of 4.5 MiB each on a loopback "GitHub": the first four are given (18
    /// MiB), the fifth would pass 20 MiB in all and is named instead; one elsewhere is
    /// never fetched.
    #[tokio::test]
    async fn images_stop_at_the_total_a_request_can_carry() {
        use axum::routing::get;
        let mut big = crate::image::samples::png(100, 100);
        big.resize((9 << 20) / 2, 0);
        let app = axum::Router::new().route(
            "/a/{n}",
            get(move || {
                let big = big.clone();
                async move { big }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut refs: Vec<ImageRef> = (1..=5)
            .map(|n| ImageRef {
                url: format!("{url}/a/{n}"),
                alt: format!("shot {n}"),
            })
            .collect();
        refs.insert(
            2,
            ImageRef {
                url: "https://example.com/x.png".into(),
                alt: String::new(),
            },
        );
        let hosts = GitHubHosts::new(&url, &url);
        let token = secrecy::SecretString::from("ghs_test_token_0123456789");
        let got = gather(refs, 0, &token, &hosts).await;
        assert_eq!(got.images.len(), 4);
        let skipped: Vec<String> = got
            .skipped
            .iter()
            .map(|(n, alt, why)| format!("{n} {alt:?}: {why}"))
            .collect();
        insta::assert_snapshot!(skipped.join("\n"), @r#"
        3 "": not on GitHub
        6 "shot 5": too large with the images before it (over 20 MiB in all)
        "#);
    }

    #[test]
    fn images_are_found_once_in_order_with_hidden_text_gone() {
        let body = "![first\u{200B} shot](https://github.com/user-attachments/assets/1)\n\
                    <!-- ![hidden](https://github.com/user-attachments/assets/h) -->\n\
                    <img src=\"https://example.com/x.png\" alt=\"  off\n  site \">";
        let request = "fix it, see ![again](https://github.com/user-attachments/assets/1) and \
                       ![](https://github.com/user-attachments/assets/2)";
        let (found, more) = find(&[body, request]);
        let shown: Vec<String> = found
            .iter()
            .map(|r| format!("{} | {}", r.url, r.alt))
            .collect();
        insta::assert_snapshot!(shown.join("\n"), @"
        https://github.com/user-attachments/assets/1 | first shot
        https://example.com/x.png | off site
        https://github.com/user-attachments/assets/2 |
        ");
        assert_eq!(more, 0);
        let many = "![a](https://github.com/x/1) ".to_string()
            + &(0..30)
                .map(|i| format!("![i{i}](https://github.com/x/{i}) "))
                .collect::<String>();
        let (found, more) = find(&[&many]);
        assert_eq!((found.len(), more), (MAX_FOUND, 10));
    }
}
