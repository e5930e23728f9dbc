//! Git over HTTP(S) with git2: clone, fetch and push as `x-access-token:<installation token>`.
//!
//! The token reaches libgit2 only through the credential callback: it is never part of a
//! URL, never written to `.git/config` or any other file, and never part of an error
//! message. The callback answers once per connection; a second request means the server
//! refused the token, and the operation ends with [`GitError::Auth`] instead of libgit2
//! asking again and again.
//!
//! All functions block: callers run them in `spawn_blocking`.

use std::cell::RefCell;
use std::fmt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Once;

use git2::{
    AutotagOption, CredentialType, Direction, ErrorClass, ErrorCode, FetchOptions, PushOptions,
    RemoteCallbacks, Repository, RepositoryInitOptions,
};

/// The user name GitHub expects with an installation token.
const USERNAME: &str = "x-access-token";
/// How long connecting to the git server may take.
const CONNECT_TIMEOUT_MS: i32 = 15_000;
/// How long the git server may stay silent in the middle of an exchange.
const IO_TIMEOUT_MS: i32 = 120_000;

/// An installation token for git. Debug and Display never show it.
#[derive(Clone)]
pub struct GitToken(String);

impl GitToken {
    pub fn new(token: String) -> Self {
        GitToken(token)
    }

    /// The token itself, to hand to [`clone`], [`fetch`] or [`push`].
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for GitToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GitToken([REDACTED])")
    }
}

impl fmt::Display for GitToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// What to check out after cloning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkout {
    /// The branch the server's `HEAD` points at, as a local branch of the same name.
    DefaultBranch,
    /// This branch, as a local branch of the same name.
    Branch(String),
    /// `refs/pull/<N>/head` of the repository, as the local branch `pr-<N>`.
    PullHead(u64),
}

impl Checkout {
    /// The local branch [`clone`] checks out for a pull request.
    pub fn pull_branch(number: u64) -> String {
        format!("pr-{number}")
    }
}

/// The result of [`clone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloned {
    /// The commit checked out.
    pub head_sha: String,
    /// The local branch checked out.
    pub branch: String,
}

/// Why a git operation failed. The message is one actionable line without the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    #[error(
        "the git server refused the installation token: check that the app is installed on \
         the repository and has the contents permission (write, to push)"
    )]
    Auth,
    #[error(
        "the git server has no such repository (HTTP 404): check the clone URL and that the \
         app is installed on the repository"
    )]
    NotFound,
    /// The repository exists but lacks the branch or pull request ref asked for.
    #[error("the repository has no {0}")]
    RefNotFound(String),
    #[error("the git server rejected the push: {reason}")]
    Rejected { reason: String },
    #[error("could not talk to the git server: {0}")]
    Network(String),
    /// The URL was refused before any request was made.
    #[error("refusing the git URL: {0}")]
    InvalidUrl(String),
    #[error("git failed: {0}")]
    Other(String),
}

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

/// Clones `url` into `dest` (absent or an empty directory) and checks out `checkout`.
///
/// `.git/config` names the remote `origin` with `url` exactly as given. `depth` makes a
/// shallow clone of that many commits. Only the ref checked out is fetched (no tags).
pub fn clone(
    url: &str,
    token: &str,
    dest: &Path,
    checkout: &Checkout,
    depth: Option<u32>,
) -> Result<Cloned, GitError> {
    init();
    let session = Session::new(url, token)?;
    if let Checkout::Branch(name) = checkout {
        check_branch_name(name)?;
    }
    if dest.exists() {
        let mut entries = std::fs::read_dir(dest).map_err(|e| {
            GitError::Other(format!(
                "cannot read clone destination {}: {e}",
                dest.display()
            ))
        })?;
        if entries.next().is_some() {
            return Err(GitError::Other(format!(
                "clone destination {} is not empty",
                dest.display()
            )));
        }
    }

    let mut init_opts = RepositoryInitOptions::new();
    // No hooks or other files from the host's template directory.
    init_opts.external_template(false).mkdir(true);
    let repo = Repository::init_opts(dest, &init_opts).map_err(other)?;
    let mut remote = repo.remote("origin", url).map_err(other)?;

    let mut conn = remote
        .connect_auth(Direction::Fetch, Some(session.callbacks()), None)
        .map_err(|e| session.error(e))?;

    // What to fetch, where to keep it, and the local branch to make of it.
    let (source, tracking, branch) = match checkout {
        Checkout::DefaultBranch => {
            let head = conn.default_branch().map_err(|_| {
                GitError::RefNotFound("default branch (is the repository empty?)".into())
            })?;
            let head = head
                .as_str()
                .map_err(|_| GitError::Other("the default branch is not UTF-8".into()))?;
            let name = head
                .strip_prefix("refs/heads/")
                .ok_or_else(|| GitError::Other(format!("unexpected default branch {head}")))?;
            let name = name.to_string();
            (
                head.to_string(),
                format!("refs/remotes/origin/{name}"),
                name,
            )
        }
        Checkout::Branch(name) => (
            format!("refs/heads/{name}"),
            format!("refs/remotes/origin/{name}"),
            name.clone(),
        ),
        Checkout::PullHead(n) => (
            format!("refs/pull/{n}/head"),
            format!("refs/pull/{n}/head"),
            Checkout::pull_branch(*n),
        ),
    };
    let advertised = conn
        .list()
        .map_err(|e| session.error(e))?
        .iter()
        .any(|h| h.name() == source);
    if !advertised {
        return Err(GitError::RefNotFound(match checkout {
            Checkout::PullHead(n) => format!("pull request head refs/pull/{n}/head"),
            _ => format!("branch `{branch}`"),
        }));
    }

    let mut fetch_opts = session.fetch_options(depth);
    conn.remote()
        .fetch(
            &[format!("+{source}:{tracking}")],
            Some(&mut fetch_opts),
            Some("clone"),
        )
        .map_err(|e| session.error(e))?;
    drop(conn);
    drop(remote);

    let commit = repo
        .find_reference(&tracking)
        .and_then(|r| r.peel_to_commit())
        .map_err(other)?;
    let mut local = repo.branch(&branch, &commit, true).map_err(other)?;
    if !matches!(checkout, Checkout::PullHead(_)) {
        local
            .set_upstream(Some(&format!("origin/{branch}")))
            .map_err(other)?;
    }
    if matches!(checkout, Checkout::DefaultBranch) {
        repo.reference_symbolic(
            "refs/remotes/origin/HEAD",
            &tracking,
            true,
            "clone: default branch",
        )
        .map_err(other)?;
    }
    repo.set_head(&format!("refs/heads/{branch}"))
        .map_err(other)?;
    repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
        .map_err(other)?;

    // The configuration must hold the URL as given: no credentials crept in.
    let stored = repo
        .config()
        .and_then(|c| c.get_string("remote.origin.url"))
        .map_err(other)?;
    if stored != url {
        return Err(GitError::Other(
            "the cloned repository's remote URL differs from the one given".into(),
        ));
    }
    Ok(Cloned {
        head_sha: commit.id().to_string(),
        branch,
    })
}

/// Fetches `refspecs` (e.g. `+refs/pull/7/head:refs/pull/7/head`) from `url` into the
/// repository at `repo_dir`. Nothing is written to its configuration.
pub fn fetch(repo_dir: &Path, url: &str, token: &str, refspecs: &[&str]) -> Result<(), GitError> {
    init();
    let session = Session::new(url, token)?;
    let repo = Repository::open(repo_dir).map_err(other)?;
    let mut remote = repo.remote_anonymous(url).map_err(other)?;
    let mut fetch_opts = session.fetch_options(None);
    remote
        .fetch(refspecs, Some(&mut fetch_opts), Some("fetch"))
        .map_err(|e| session.error(e))
}

/// Pushes `local_ref` (`HEAD`, a branch, a full ref) of the repository at `repo_dir` to
/// `refs/heads/<remote_branch>` at `url`; `force` allows a non-fast-forward update. A ref
/// the server refuses is [`GitError::Rejected`] with the server's reason.
pub fn push(
    repo_dir: &Path,
    url: &str,
    token: &str,
    local_ref: &str,
    remote_branch: &str,
    force: bool,
) -> Result<(), GitError> {
    init();
    let session = Session::new(url, token)?;
    check_branch_name(remote_branch)?;
    if local_ref.is_empty() || local_ref.starts_with('+') || local_ref.contains(':') {
        return Err(GitError::Other(format!(
            "invalid local ref to push: `{local_ref}`"
        )));
    }
    let repo = Repository::open(repo_dir).map_err(other)?;
    let mut remote = repo.remote_anonymous(url).map_err(other)?;
    let spec = format!(
        "{}{local_ref}:refs/heads/{remote_branch}",
        if force { "+" } else { "" }
    );

    let rejections = Rc::new(RefCell::new(Vec::<String>::new()));
    let mut callbacks = session.callbacks();
    let seen = rejections.clone();
    callbacks.push_update_reference(move |reference, status| {
        if let Some(status) = status {
            seen.borrow_mut().push(format!("{reference}: {status}"));
        }
        Ok(())
    });
    let mut push_opts = PushOptions::new();
    push_opts.remote_callbacks(callbacks);
    remote
        .push(&[spec.as_str()], Some(&mut push_opts))
        .map_err(|e| match session.error(e) {
            // libgit2 refuses a non-fast-forward update itself, before sending anything.
            GitError::Rejected { reason } => GitError::Rejected {
                reason: format!("refs/heads/{remote_branch}: {reason}"),
            },
            e => e,
        })?;
    let rejections = rejections.borrow();
    if rejections.is_empty() {
        Ok(())
    } else {
        Err(GitError::Rejected {
            reason: session.scrub(&rejections.join("; ")),
        })
    }
}

/// The URL and token of one operation, and what its callbacks learnt.
struct Session<'t> {
    token: &'t str,
    origin: Origin,
    /// Set by a callback that refused to go on; it explains the failure better than the
    /// error libgit2 returns.
    failure: Rc<RefCell<Option<GitError>>>,
}

impl<'t> Session<'t> {
    fn new(url: &str, token: &'t str) -> Result<Self, GitError> {
        Ok(Session {
            token,
            origin: Origin::parse(url)?,
            failure: Rc::default(),
        })
    }

    /// Callbacks for one connection: the token is offered once, to the URL's origin only.
    fn callbacks(&self) -> RemoteCallbacks<'_> {
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

    fn fetch_options(&self, depth: Option<u32>) -> FetchOptions<'_> {
        let mut opts = FetchOptions::new();
        opts.remote_callbacks(self.callbacks())
            .download_tags(AutotagOption::None);
        if let Some(depth) = depth {
            opts.depth(i32::try_from(depth).unwrap_or(i32::MAX));
        }
        opts
    }

    /// A libgit2 error as a [`GitError`].
    fn error(&self, e: git2::Error) -> GitError {
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
    fn scrub(&self, text: &str) -> String {
        if self.token.is_empty() {
            text.to_string()
        } else {
            text.replace(self.token, "[REDACTED]")
        }
    }
}

/// A local failure (no network involved): no token can be in it.
fn other(e: git2::Error) -> GitError {
    GitError::Other(e.message().to_string())
}

fn check_branch_name(name: &str) -> Result<(), GitError> {
    if git2::Branch::name_is_valid(name).unwrap_or(false) && !name.starts_with('-') {
        Ok(())
    } else {
        Err(GitError::Other(format!("invalid branch name `{name}`")))
    }
}

/// Scheme and host (with a non-default port) of an http(s) URL without user info.
#[derive(Debug, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
}

impl Origin {
    fn parse(url: &str) -> Result<Self, GitError> {
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
    fn token_is_redacted() {
        let t = GitToken::new("ghs_secret123".into());
        assert_eq!(format!("{t:?}"), "GitToken([REDACTED])");
        assert_eq!(format!("{t}"), "[REDACTED]");
        assert_eq!(t.expose(), "ghs_secret123");
    }

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
