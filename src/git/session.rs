//! One network operation's URL and token: the credential callback that offers the token
//! once and only to the URL's origin, libgit2's timeouts, and turning libgit2 errors into
//! [`GitError`]s without the token.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Once;

use git2::{AutotagOption, CredentialType, ErrorClass, ErrorCode, FetchOptions, RemoteCallbacks};

use super::error::GitError;

/// The user name GitHub expects with an installation token.
pub(super) const USERNAME: &str = "x-access-token";
/// How long connecting to the git server may take.
const CONNECT_TIMEOUT_MS: i32 = 15_000;
/// How long the git server may stay silent in the middle of an exchange.
const IO_TIMEOUT_MS: i32 = 120_000;

/// Sets libgit2's network timeouts. Every function here calls it first; the service may
/// call it at start-up too.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: these write plain ints in libgit2's global options, read when a
        // connection opens. kodx uses libgit2 only through this module, whose functions
        // all pass through this `Once` first, so the writes happen before (and are
        // visible to) every read, and only one thread ever writes.
        unsafe {
            let _ = git2::opts::set_server_connect_timeout_in_milliseconds(CONNECT_TIMEOUT_MS);
            let _ = git2::opts::set_server_timeout_in_milliseconds(IO_TIMEOUT_MS);
        }
    });
}

/// The URL and token of one operation, and what its callbacks learnt.
pub(super) struct Session<'t> {
    token: &'t str,
    origin: Origin,
    /// Set by a callback that refused to go on; it explains the failure better than the
    /// error libgit2 returns.
    failure: Rc<RefCell<Option<GitError>>>,
}

impl<'t> Session<'t> {
    pub(super) fn new(url: &str, token: &'t str) -> Result<Self, GitError> {
        Ok(Session {
            token,
            origin: Origin::parse(url)?,
            failure: Rc::default(),
        })
    }

    /// Callbacks for one connection: the token is offered once, to the URL's origin only.
    pub(super) fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut callbacks = RemoteCallbacks::new();
        let mut offered = false;
        callbacks.credentials(move |url, _username, allowed| {
            let refuse = |failure: GitError| {
                *self.failure.borrow_mut() = Some(failure);
                Err(git2::Error::new(
                    ErrorCode::Auth,
                    ErrorClass::Http,
                    "credentials not offered",
                ))
            };
            if offered {
                // libgit2 asks again after a 401: the token was refused.
                return refuse(GitError::Auth);
            }
            if !allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
                return refuse(GitError::Other(
                    "the git server wants a kind of authentication other than a user name \
                     and password"
                        .into(),
                ));
            }
            if Origin::parse(url).ok().as_ref() != Some(&self.origin) {
                return refuse(GitError::Other(
                    "the git server redirected to another host; the token is not sent there".into(),
                ));
            }
            offered = true;
            git2::Cred::userpass_plaintext(USERNAME, self.token)
        });
        callbacks
    }

    pub(super) fn fetch_options(&self, depth: Option<u32>) -> FetchOptions<'_> {
        let mut opts = FetchOptions::new();
        opts.remote_callbacks(self.callbacks())
            .download_tags(AutotagOption::None);
        if let Some(depth) = depth {
            opts.depth(i32::try_from(depth).unwrap_or(i32::MAX));
        }
        opts
    }

    /// A libgit2 error as a [`GitError`].
    pub(super) fn error(&self, e: git2::Error) -> GitError {
        if let Some(failure) = self.failure.borrow_mut().take() {
            return failure;
        }
        let message = self.scrub(e.message());
        match (e.code(), e.class()) {
            (ErrorCode::Auth, _) => GitError::Auth,
            (ErrorCode::NotFastForward, _) => GitError::Rejected { reason: message },
            _ if message.contains("status code: 404") => GitError::NotFound,
            _ if message.contains("status code: 403") => GitError::Auth,
            (ErrorCode::Certificate | ErrorCode::Timeout | ErrorCode::Eof, _)
            | (_, ErrorClass::Net | ErrorClass::Http | ErrorClass::Ssl | ErrorClass::Os) => {
                GitError::Network(message)
            }
            _ => GitError::Other(message),
        }
    }

    /// `text` without the token, should anything ever echo it.
    pub(super) fn scrub(&self, text: &str) -> String {
        if self.token.is_empty() {
            text.to_string()
        } else {
            text.replace(self.token, "[REDACTED]")
        }
    }
}

/// A local failure (no network involved): no token can be in it.
pub(super) fn other(e: git2::Error) -> GitError {
    GitError::Other(e.message().to_string())
}

pub(super) fn check_branch_name(name: &str) -> Result<(), GitError> {
    if git2::Branch::name_is_valid(name).unwrap_or(false) && !name.starts_with('-') {
        Ok(())
    } else {
        Err(GitError::Other(format!("invalid branch name `{name}`")))
    }
}

/// Scheme and host (with a non-default port) of an http(s) URL without user info.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Origin {
    scheme: String,
    host: String,
}

impl Origin {
    pub(super) fn parse(url: &str) -> Result<Self, GitError> {
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(GitError::InvalidUrl(
                "it contains whitespace or control characters".into(),
            ));
        }
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| GitError::InvalidUrl("it is not an http(s) URL".into()))?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "https" => ":443",
            "http" => ":80",
            _ => {
                return Err(GitError::InvalidUrl(
                    "only http and https URLs are allowed".into(),
                ))
            }
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(GitError::InvalidUrl(
                "it carries user credentials (user@host); kodx authenticates by itself".into(),
            ));
        }
        let host = authority.to_ascii_lowercase();
        let host = host.strip_suffix(default_port).unwrap_or(&host).to_string();
        if host.is_empty() || host.starts_with(':') {
            return Err(GitError::InvalidUrl("it has no host".into()));
        }
        Ok(Origin { scheme, host })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let o = Origin::parse("https://GitHub.com/o/r.git").unwrap();
        assert_eq!(o, Origin::parse("https://github.com:443/other").unwrap());
        assert_ne!(o, Origin::parse("http://github.com/o/r.git").unwrap());
        assert_ne!(o, Origin::parse("https://github.com:8443/o/r.git").unwrap());
        assert_eq!(
            Origin::parse("http://127.0.0.1:8080/o/r.git").unwrap().host,
            "127.0.0.1:8080"
        );
    }

    #[test]
    fn refused_urls() {
        for url in [
            "https://user:pw@github.com/o/r.git",
            "https://x-access-token@github.com/o/r.git",
            "ssh://git@github.com/o/r.git",
            "git@github.com:o/r.git",
            "file:///etc",
            "https:///o/r.git",
            "https://github.com/o/r.git\n",
            "https://:443/o",
        ] {
            assert!(
                matches!(Origin::parse(url), Err(GitError::InvalidUrl(_))),
                "{url} accepted"
            );
        }
        // An `@` after the host is part of the path, not user info.
        assert!(Origin::parse("https://github.com/o/r@x.git").is_ok());
    }

    #[test]
    fn errors_never_carry_the_token() {
        let s = Session::new("https://github.com/o/r.git", "ghs_tok").unwrap();
        let e = s.error(git2::Error::new(
            ErrorCode::GenericError,
            ErrorClass::Net,
            "failed with ghs_tok inside",
        ));
        assert_eq!(e, GitError::Network("failed with [REDACTED] inside".into()));
        let e = s.error(git2::Error::new(
            ErrorCode::GenericError,
            ErrorClass::Http,
            "unexpected http status code: 404",
        ));
        assert_eq!(e, GitError::NotFound);
    }

    #[test]
    fn branch_names() {
        assert!(check_branch_name("kodx/issue-7-ab12").is_ok());
        for bad in ["", "a..b", "-x", "a b", "x:y", "refs/heads/"] {
            assert!(check_branch_name(bad).is_err(), "{bad} accepted");
        }
    }
}
