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
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Once;

use git2::{
    AutotagOption, CredentialType, Direction, ErrorClass, ErrorCode, FetchOptions, IndexAddOption,
    Oid, PushOptions, RebaseOptions, RemoteCallbacks, Repository, RepositoryInitOptions, Signature,
    Status, StatusOptions,
};

/// The user name GitHub expects with an installation token.
const USERNAME: &str = "x-access-token";
/// How long connecting to the git server may take.
const CONNECT_TIMEOUT_MS: i32 = 15_000;
/// How long the git server may stay silent in the middle of an exchange.
const IO_TIMEOUT_MS: i32 = 120_000;

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
    /// The remote branch moved meanwhile and kodx's commits conflict with the new ones.
    #[error(
        "the branch moved on the server meanwhile and kodx's commits conflict with the new \
         commits in {}; nothing was pushed",
        list_paths(paths)
    )]
    Conflict { paths: Vec<String> },
    /// A changed file is larger than the limit: nothing was committed.
    #[error(
        "the change to `{path}` is {bytes} bytes, over the limit of {limit} bytes for a \
         changed file; nothing was committed"
    )]
    TooLarge {
        path: String,
        bytes: u64,
        limit: u64,
    },
    /// The remote branch was still ahead after rebasing onto it `attempts` times.
    #[error(
        "the branch `{branch}` kept moving on the server: after {attempts} rebase(s) onto \
         it the push was still refused as non-fast-forward; kodx never force-pushes"
    )]
    Moved { branch: String, attempts: u32 },
    #[error("git failed: {0}")]
    Other(String),
}

/// `a`, `b` and 3 more — for an error message.
fn list_paths(paths: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut out = paths
        .iter()
        .take(SHOWN)
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        out.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    if out.is_empty() {
        out.push_str("some files");
    }
    out
}

/// A sentence a maintainer can act on for the reason a git server gave for refusing a push
/// ([`GitError::Rejected`]): GitHub's workflow-permission, protected-branch, ruleset,
/// push-protection and file-size refusals are recognised; anything else is `reason` itself.
pub fn explain_rejection(reason: &str) -> String {
    let lower = reason.to_ascii_lowercase();
    let said = format!(" (GitHub said: {reason})");
    if lower.contains("to create or update workflow")
        || (lower.contains("workflow") && lower.contains("permission"))
    {
        let file = reason
            .split('`')
            .find(|part| part.starts_with(".github/workflows/"))
            .map(|f| format!(", such as `{f}`"))
            .unwrap_or_default();
        return format!(
            "the App is not allowed to change files under .github/workflows/{file} (it lacks \
             the workflows permission); grant the App the workflows permission, or ask for a \
             change that leaves .github/workflows/ alone{said}"
        );
    }
    if lower.contains("gh009")
        || lower.contains("push protection")
        || lower.contains("secrets detected")
        || lower.contains("push cannot contain secrets")
    {
        return format!(
            "GitHub's push protection found what looks like a secret in the changes, so the \
             push was refused; remove the secret from the change and ask again{said}"
        );
    }
    if lower.contains("protected branch") || lower.contains("gh006") {
        return format!(
            "the push was refused because the branch is protected (it may require pull \
             requests, reviews or status checks, or forbid pushes by apps); allow the App to \
             push to it, or ask kodx to work on another branch{said}"
        );
    }
    if lower.contains("gh013") || lower.contains("repository rule violation") {
        return format!(
            "the push was refused by the repository's rules (rulesets) for this branch; \
             allow the App to bypass them, or ask kodx to work on another branch{said}"
        );
    }
    if lower.contains("gh001") || lower.contains("large files detected") {
        return format!(
            "the push was refused because a file exceeds GitHub's file size limit (100 MB)\
             {said}"
        );
    }
    if lower.contains("non-fast-forward") || lower.contains("fetch first") {
        return format!(
            "the branch moved on the server and kodx's commits are not on top of it; kodx \
             never force-pushes{said}"
        );
    }
    reason.to_string()
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
    check_empty_dest(dest)?;

    let mut init_opts = RepositoryInitOptions::new();
    // No hooks or other files from the host's template directory.
    init_opts.external_template(false).mkdir(true);
    let repo = Repository::init_opts(dest, &init_opts).map_err(other)?;
    let mut remote = repo.remote("origin", url).map_err(other)?;

    let mut conn = remote
        .connect_auth(Direction::Fetch, Some(session.callbacks()), None)
        .map_err(|e| session.error(e))?;

    // What to fetch, where to keep it, and the local branch to make of it.
    let (source, tracking, branch) = refs_for(checkout, || default_branch_of(&conn))?;
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
        .map_err(other)?
        .id();
    finish_clone(&repo, url, checkout, &tracking, branch, commit, true)
}

/// The server's default branch (`refs/heads/...`) as a connection advertises it.
fn default_branch_of(conn: &git2::RemoteConnection<'_, '_, '_>) -> Result<String, GitError> {
    let head = conn
        .default_branch()
        .map_err(|_| GitError::RefNotFound("default branch (is the repository empty?)".into()))?;
    head.as_str()
        .map(str::to_string)
        .map_err(|_| GitError::Other("the default branch is not UTF-8".into()))
}

/// For `checkout`: the server's ref to fetch, the ref a clone keeps it under, and the
/// local branch to make of it. `default_branch` names the server's `HEAD` branch
/// (`refs/heads/...`); it is asked only for [`Checkout::DefaultBranch`].
fn refs_for(
    checkout: &Checkout,
    default_branch: impl FnOnce() -> Result<String, GitError>,
) -> Result<(String, String, String), GitError> {
    Ok(match checkout {
        Checkout::DefaultBranch => {
            let head = default_branch()?;
            let name = head
                .strip_prefix("refs/heads/")
                .ok_or_else(|| GitError::Other(format!("unexpected default branch {head}")))?
                .to_string();
            (head.clone(), format!("refs/remotes/origin/{name}"), name)
        }
        Checkout::Branch(name) => {
            check_branch_name(name)?;
            (
                format!("refs/heads/{name}"),
                format!("refs/remotes/origin/{name}"),
                name.clone(),
            )
        }
        Checkout::PullHead(n) => (
            format!("refs/pull/{n}/head"),
            format!("refs/pull/{n}/head"),
            Checkout::pull_branch(*n),
        ),
    })
}

/// The end of a clone once `commit` is in `repo` and `tracking` points at it: the local
/// branch (with its upstream unless a pull request head), `origin/HEAD` for the default
/// branch, `HEAD` on the branch, and the work tree (`true`: the files; `false`: only the
/// index, as if the files had been checked out). Checks that the configuration holds
/// `url` exactly.
fn finish_clone(
    repo: &Repository,
    url: &str,
    checkout: &Checkout,
    tracking: &str,
    branch: String,
    commit: Oid,
    files: bool,
) -> Result<Cloned, GitError> {
    let commit = repo.find_commit(commit).map_err(other)?;
    let mut local = repo.branch(&branch, &commit, true).map_err(other)?;
    if !matches!(checkout, Checkout::PullHead(_)) {
        local
            .set_upstream(Some(&format!("origin/{branch}")))
            .map_err(other)?;
    }
    if matches!(checkout, Checkout::DefaultBranch) {
        repo.reference_symbolic(
            "refs/remotes/origin/HEAD",
            tracking,
            true,
            "clone: default branch",
        )
        .map_err(other)?;
    }
    repo.set_head(&format!("refs/heads/{branch}"))
        .map_err(other)?;
    if files {
        repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
            .map_err(other)?;
    } else {
        let mut index = repo.index().map_err(other)?;
        index
            .read_tree(&commit.tree().map_err(other)?)
            .map_err(other)?;
        index.write().map_err(other)?;
    }

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

/// What [`fetch_mirror`] found on the server and left in the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorTip {
    /// The server's ref, kept in the mirror under the same name (`refs/heads/main`,
    /// `refs/pull/7/head`).
    pub source: String,
    /// The local branch a checkout makes of it (`main`, `pr-7`).
    pub branch: String,
    /// The commit the ref points at.
    pub commit: String,
    /// Whether anything was downloaded: `false` when the mirror had the commit already
    /// and only the server's ref list was read.
    pub fetched: bool,
    /// Objects and bytes the fetch received (0 without a download).
    pub received_objects: usize,
    pub received_bytes: usize,
    /// Whether the mirror is shallow now (it holds the tips it was asked for, not all
    /// their history: see [`History::Tip`]).
    pub shallow: bool,
}

/// How much history a mirror must hold for a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum History {
    /// All of it: a shallow mirror is deepened to the whole history (a pull request's
    /// run: its commits, a rebase onto its base).
    #[default]
    Whole,
    /// The commit the ref names, with its tree (issue and `ask` runs). A new mirror is
    /// made shallow (depth 1: one commit's objects instead of the whole history), and a
    /// shallow one stays so (later tips come at depth 1 too, so each commit the mirror
    /// holds is either complete or listed in its `shallow` file); a mirror that has the
    /// whole history keeps it, and fetches incrementally as ever.
    Tip,
}

/// The depth libgit2 takes to deepen a shallow repository to its whole history.
const UNSHALLOW: i32 = i32::MAX;

/// Fetch progress: `(received objects, total objects, received bytes)`. Returning `false`
/// stops the fetch.
pub type FetchProgress<'p> = dyn FnMut(usize, usize, usize) -> bool + 'p;

/// Brings the ref `checkout` names from `url` into the bare repository `mirror`, under the
/// same name, downloading only the objects the mirror lacks (the mirror's refs are what it
/// says it has). When the mirror already holds the commit the server advertises, nothing
/// but the ref list is read. For [`Checkout::DefaultBranch`] the mirror's `HEAD` follows
/// the server's. Nothing is written to the mirror's configuration; no tags are fetched.
pub fn fetch_mirror(
    mirror: &Path,
    url: &str,
    token: &str,
    checkout: &Checkout,
    progress: Option<&mut FetchProgress<'_>>,
) -> Result<MirrorTip, GitError> {
    fetch_mirror_for(mirror, url, token, checkout, History::Whole, progress)
}

/// As [`fetch_mirror`], bringing `history` of it: see [`History`].
pub fn fetch_mirror_for(
    mirror: &Path,
    url: &str,
    token: &str,
    checkout: &Checkout,
    history: History,
    progress: Option<&mut FetchProgress<'_>>,
) -> Result<MirrorTip, GitError> {
    init();
    let session = Session::new(url, token)?;
    let repo = Repository::open_bare(mirror).map_err(other)?;
    let mut remote = repo.remote_anonymous(url).map_err(other)?;
    let mut conn = remote
        .connect_auth(Direction::Fetch, Some(session.callbacks()), None)
        .map_err(|e| session.error(e))?;
    let (source, _, branch) = refs_for(checkout, || default_branch_of(&conn))?;
    let advertised = conn
        .list()
        .map_err(|e| session.error(e))?
        .iter()
        .find(|h| h.name() == source)
        .map(|h| h.oid());
    let Some(advertised) = advertised else {
        return Err(GitError::RefNotFound(match checkout {
            Checkout::PullHead(n) => format!("pull request head refs/pull/{n}/head"),
            _ => format!("branch `{branch}`"),
        }));
    };
    let shallow = repo.is_shallow();
    let empty = repo
        .references()
        .map(|mut refs| refs.next().is_none())
        .map_err(other)?;
    let depth = match history {
        History::Whole if shallow => UNSHALLOW,
        History::Tip if shallow || empty => 1,
        _ => 0,
    };
    let have = repo.refname_to_id(&source).ok();
    let up_to_date =
        have == Some(advertised) && repo.find_commit(advertised).is_ok() && depth != UNSHALLOW;
    let received = Rc::new(std::cell::Cell::new((0usize, 0usize)));
    if !up_to_date {
        let mut callbacks = session.callbacks();
        let seen = received.clone();
        let mut progress = progress;
        callbacks.transfer_progress(move |p| {
            seen.set((p.received_objects(), p.received_bytes()));
            match progress.as_mut() {
                Some(report) => report(p.received_objects(), p.total_objects(), p.received_bytes()),
                None => true,
            }
        });
        let mut opts = FetchOptions::new();
        opts.remote_callbacks(callbacks)
            .download_tags(AutotagOption::None)
            .depth(depth);
        conn.remote()
            .fetch(
                &[format!("+{source}:{source}")],
                Some(&mut opts),
                Some("kodx: refresh the mirror"),
            )
            .map_err(|e| session.error(e))?;
    }
    drop(conn);
    drop(remote);
    if matches!(checkout, Checkout::DefaultBranch) {
        repo.set_head(&source).map_err(other)?;
    }
    let commit = repo
        .find_reference(&source)
        .and_then(|r| r.peel_to_commit())
        .map_err(other)?;
    let (received_objects, received_bytes) = received.get();
    Ok(MirrorTip {
        source,
        branch,
        commit: commit.id().to_string(),
        fetched: !up_to_date,
        received_objects,
        received_bytes,
        shallow: repo.is_shallow(),
    })
}

/// Makes `dest` (absent or an empty directory) a clone of `url` at `tip` — the same refs,
/// branch, upstream and `.git/config` as [`clone`] of `checkout` would make — from the
/// objects of the bare repository `mirror`, with no network. The mirror's object files are
/// hard-linked (copied when `dest` is on another filesystem): they are never written
/// again, so the clone shares no mutable state with the mirror or other clones.
///
/// `files`: check the files out; otherwise write only the index, as if they had been (the
/// work tree then goes into the container straight from the objects,
/// [`crate::sandbox::archive::pack_checkout_to`]).
pub fn clone_from_mirror(
    mirror: &Path,
    tip: &MirrorTip,
    url: &str,
    checkout: &Checkout,
    dest: &Path,
    files: bool,
) -> Result<Cloned, GitError> {
    init();
    Origin::parse(url)?;
    check_empty_dest(dest)?;
    let commit = Oid::from_str(&tip.commit).map_err(other)?;
    let mut init_opts = RepositoryInitOptions::new();
    init_opts.external_template(false).mkdir(true);
    let repo = Repository::init_opts(dest, &init_opts).map_err(other)?;
    link_objects(&mirror.join("objects"), &repo.path().join("objects")).map_err(|e| {
        GitError::Other(format!(
            "cannot link the mirror's objects into {}: {e}",
            dest.display()
        ))
    })?;
    // A shallow mirror's list of commits whose parents it lacks: the clone lacks them
    // too (without it, a walk of the history, as a push makes, would fail on them).
    let shallow = mirror.join("shallow");
    match std::fs::copy(&shallow, repo.path().join("shallow")) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(GitError::Other(format!(
                "cannot copy the mirror's shallow list into {}: {e}",
                dest.display()
            )))
        }
    }
    // Opened again: the packs linked in are seen from the start.
    drop(repo);
    let repo = Repository::open(dest).map_err(other)?;
    repo.remote("origin", url).map_err(other)?;
    let (_, tracking, branch) = refs_for(checkout, || Ok(tip.source.clone()))?;
    repo.reference(&tracking, commit, true, "clone: from the mirror")
        .map_err(other)?;
    finish_clone(&repo, url, checkout, &tracking, branch, commit, files)
}

/// Fails unless `dest` is absent or an empty directory.
fn check_empty_dest(dest: &Path) -> Result<(), GitError> {
    if !dest.exists() {
        return Ok(());
    }
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
    Ok(())
}

/// How [`link_objects`] brought the object files over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Linked {
    pub linked: usize,
    pub copied: usize,
}

/// Hard-links (or, across filesystems, copies) the object files of the objects directory
/// `from` into `to`: complete packs (`pack-*.pack` with its `.idx`, the pack first) and
/// loose objects. Temporary files of an unfinished fetch and `info/` are left out.
pub fn link_objects(from: &Path, to: &Path) -> std::io::Result<Linked> {
    let mut done = Linked::default();
    let mut bring = |src: &Path, dst: &Path| -> std::io::Result<()> {
        match std::fs::hard_link(src, dst) {
            Ok(()) => done.linked += 1,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(_) => {
                std::fs::copy(src, dst)?;
                done.copied += 1;
            }
        }
        Ok(())
    };
    let packs = from.join("pack");
    if packs.is_dir() {
        std::fs::create_dir_all(to.join("pack"))?;
        let mut names: Vec<String> = std::fs::read_dir(&packs)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in &names {
            let Some(stem) = name
                .strip_prefix("pack-")
                .and_then(|n| n.strip_suffix(".pack"))
            else {
                continue;
            };
            let idx = format!("pack-{stem}.idx");
            if !is_hex(stem) || !names.contains(&idx) {
                continue;
            }
            bring(&packs.join(name), &to.join("pack").join(name))?;
            bring(&packs.join(&idx), &to.join("pack").join(&idx))?;
        }
    }
    for dir in std::fs::read_dir(from)? {
        let dir = dir?;
        let name = dir.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() != 2 || !is_hex(name) || !dir.file_type()?.is_dir() {
            continue;
        }
        let target = to.join(name);
        for object in std::fs::read_dir(dir.path())? {
            let object = object?;
            let file = object.file_name();
            let Some(file) = file.to_str() else { continue };
            if file.len() == 38 && is_hex(file) {
                std::fs::create_dir_all(&target)?;
                bring(&object.path(), &target.join(file))?;
            }
        }
    }
    Ok(done)
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
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
    let spec = format!(
        "{}{local_ref}:refs/heads/{remote_branch}",
        if force { "+" } else { "" }
    );
    push_once(&session, &repo, url, &spec, remote_branch).map_err(|failure| match failure {
        PushFailure::Moved(reason) => GitError::Rejected { reason },
        PushFailure::Failed(e) => e,
    })
}

/// Why one push did not go through.
enum PushFailure {
    /// The remote branch has commits the local one lacks, or moved during the push.
    Moved(String),
    Failed(GitError),
}

/// Most bytes of the server's side-band messages kept for an error.
const MAX_REMOTE_MESSAGES: usize = 16 * 1024;

/// Pushes `spec` (whose destination is `refs/heads/<remote_branch>`) over one connection.
fn push_once(
    session: &Session<'_>,
    repo: &Repository,
    url: &str,
    spec: &str,
    remote_branch: &str,
) -> Result<(), PushFailure> {
    let mut remote = repo
        .remote_anonymous(url)
        .map_err(|e| PushFailure::Failed(other(e)))?;
    let rejections = Rc::new(RefCell::new(Vec::<String>::new()));
    let messages = Rc::new(RefCell::new(Vec::<u8>::new()));
    let mut callbacks = session.callbacks();
    let seen = rejections.clone();
    callbacks.push_update_reference(move |reference, status| {
        if let Some(status) = status {
            seen.borrow_mut().push(format!("{reference}: {status}"));
        }
        Ok(())
    });
    // A pre-receive hook's output (GitHub's reason for declining) comes over side-band 2.
    let heard = messages.clone();
    callbacks.sideband_progress(move |data| {
        let mut heard = heard.borrow_mut();
        let room = MAX_REMOTE_MESSAGES.saturating_sub(heard.len());
        heard.extend_from_slice(&data[..data.len().min(room)]);
        true
    });
    let mut push_opts = PushOptions::new();
    push_opts.remote_callbacks(callbacks);
    let with_messages = |reason: String| {
        let said = remote_messages(&messages.borrow());
        let reason = if said.is_empty() {
            reason
        } else {
            format!("{reason}; the server said: {}", said.join(" "))
        };
        session.scrub(&reason)
    };
    if let Err(e) = remote.push(&[spec], Some(&mut push_opts)) {
        let not_fast_forward = e.code() == ErrorCode::NotFastForward;
        return Err(match session.error(e) {
            // libgit2 refuses a non-fast-forward update itself, before sending anything.
            GitError::Rejected { reason } if not_fast_forward => {
                PushFailure::Moved(format!("refs/heads/{remote_branch}: {reason}"))
            }
            GitError::Rejected { reason } => PushFailure::Failed(GitError::Rejected {
                reason: with_messages(format!("refs/heads/{remote_branch}: {reason}")),
            }),
            e => PushFailure::Failed(e),
        });
    }
    let rejections = rejections.borrow();
    if rejections.is_empty() {
        return Ok(());
    }
    let moved = rejections.iter().all(|r| {
        let r = r.to_ascii_lowercase();
        [
            "non-fast-forward",
            "fetch first",
            "failed to update ref",
            "cannot lock ref",
            "incorrect old value",
            "stale info",
        ]
        .iter()
        .any(|m| r.contains(m))
    });
    let reason = with_messages(rejections.join("; "));
    Err(if moved {
        PushFailure::Moved(reason)
    } else {
        PushFailure::Failed(GitError::Rejected { reason })
    })
}

/// The lines of the server's side-band messages worth repeating: no progress meters.
fn remote_messages(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    text.split(['\n', '\r'])
        .map(|line| {
            let line: String = line
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            line.trim().to_string()
        })
        .filter(|line| !line.is_empty() && !is_progress(line))
        .take(40)
        .map(|line| match line.char_indices().nth(500) {
            Some((cut, _)) => format!("{}…", &line[..cut]),
            None => line,
        })
        .collect()
}

/// `Resolving deltas: 100% (3/3), done.` and the like.
fn is_progress(line: &str) -> bool {
    let Some((label, rest)) = line.split_once(": ") else {
        return false;
    };
    let rest = rest.trim_start();
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    let Some(counts) = rest[digits..].strip_prefix("% (") else {
        return false;
    };
    let Some((done, total)) = counts.split_once(')').and_then(|(c, _)| c.split_once('/')) else {
        return false;
    };
    let number = |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit());
    label.chars().all(|c| c.is_ascii_alphabetic() || c == ' ')
        && (1..=3).contains(&digits)
        && number(done)
        && number(total)
}

/// A git author or committer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub email: String,
}

/// What [`commit_all`] commits, and how.
#[derive(Debug, Clone)]
pub struct CommitRequest<'a> {
    /// Author and committer, e.g. `kodx[bot] <123+kodx[bot]@users.noreply.github.com>`.
    pub author: Identity,
    /// The subject line: made one line without control characters, and cut to
    /// [`MAX_SUBJECT_CHARS`] characters (ending in `…`) when longer.
    pub subject: &'a str,
    /// Free text after the subject; may be empty.
    pub body: &'a str,
    /// `(key, value)` trailers, e.g. `("Co-authored-by", "alice <1005+alice@users.noreply.github.com>")`.
    /// Keys are letters, digits and `-`; values are made one line.
    pub trailers: &'a [(String, String)],
    /// A changed file larger than this refuses the commit.
    pub max_file_bytes: u64,
}

/// The commit [`commit_all`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub sha: String,
    pub files_changed: usize,
    /// The paths added, modified or deleted, sorted.
    pub paths: Vec<String>,
}

/// Where [`push_rebasing`] left the remote branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushOutcome {
    /// The commit the remote branch points at now.
    pub sha: String,
    /// Whether the local commits were rebased onto commits pushed by someone else.
    pub rebased: bool,
}

/// The longest commit subject [`commit_all`] writes, in characters.
pub const MAX_SUBJECT_CHARS: usize = 72;

/// Stages every change in the work tree of `repo_dir` relative to `HEAD` — additions,
/// modifications (content and executable bit), deletions, symlinks — except paths the
/// repository ignores (`.gitignore`, `.git/info/exclude`; a file already tracked stays
/// tracked even if it matches), and commits it on the current branch with `req.author` as
/// author and committer. `Ok(None)` when there is nothing to commit.
///
/// A changed file over `req.max_file_bytes` is [`GitError::TooLarge`], found before anything
/// is staged. An embedded repository (a directory with its own `.git`, e.g. a dependency
/// the agent cloned) is left out with a warning in the log. Hooks are never run.
pub fn commit_all(repo_dir: &Path, req: &CommitRequest<'_>) -> Result<Option<Committed>, GitError> {
    let repo = Repository::open(repo_dir).map_err(other)?;
    if repo.is_bare() {
        return Err(GitError::Other(format!(
            "{} is a bare repository",
            repo_dir.display()
        )));
    }
    let signature = Signature::now(&req.author.name, &req.author.email)
        .map_err(|e| GitError::Other(format!("invalid commit identity: {}", e.message())))?;
    let message = commit_message(req)?;
    let parent = match repo.head() {
        Ok(head) => Some(head.peel_to_commit().map_err(other)?),
        Err(e) if e.code() == ErrorCode::UnbornBranch => None,
        Err(e) => return Err(other(e)),
    };

    check_sizes(&repo, req.max_file_bytes)?;

    let workdir = repo
        .workdir()
        .ok_or_else(|| GitError::Other("the repository has no work tree".into()))?
        .to_path_buf();
    let mut index = repo.index().map_err(other)?;
    // libgit2 offers a directory only for an embedded repository (a directory with its own
    // `.git`), which it cannot add: it stays out, as an ignored file would.
    let mut skip_embedded = |path: &Path, _spec: &[u8]| -> i32 {
        let is_dir = std::fs::symlink_metadata(workdir.join(path)).is_ok_and(|m| m.is_dir());
        if is_dir {
            tracing::warn!(path = %path.display(), "not committing an embedded git repository");
            1
        } else {
            0
        }
    };
    index
        .add_all(["*"], IndexAddOption::DEFAULT, Some(&mut skip_embedded))
        .map_err(other)?;
    index.update_all(["*"], None).map_err(other)?;
    let tree_id = index.write_tree().map_err(other)?;
    index.write().map_err(other)?;

    let old_tree = parent
        .as_ref()
        .map(|c| c.tree())
        .transpose()
        .map_err(other)?;
    let committed = commit_tree(
        &repo,
        parent.as_ref(),
        old_tree.as_ref(),
        tree_id,
        &signature,
        &message,
    )?;
    Ok(committed.map(|(committed, _)| committed))
}

/// As [`commit_all`], for a clone whose files are not on disk ([`clone_from_mirror`]
/// without files): the new tree is `HEAD`'s tree with `changes` applied — what the
/// container changed against the tree it was given, already without the paths its
/// `.gitignore` files ignore — built in memory from the objects, and committed on the
/// current branch. `Ok(None)` when the tree does not change.
///
/// The same tree as applying the change set to a checkout and calling [`commit_all`]
/// (tests/it/repo_cache_commit.rs): a file with any executable bit is `100755`; nothing inside
/// a `.git` at any depth is committed (a change set holds none: its ignore rules leave
/// them out), and should one name `<dir>/.git/...` anyway, all of `<dir>` is left out, as
/// [`commit_all`] leaves out an embedded repository; a file over `req.max_file_bytes` is
/// [`GitError::TooLarge`] before anything is written. Contents are streamed into blobs.
pub fn commit_change_set(
    repo_dir: &Path,
    changes: &crate::sandbox::archive::ChangeSet,
    req: &CommitRequest<'_>,
) -> Result<Option<Committed>, GitError> {
    use crate::sandbox::archive::{ChangeKind, NewEntry};
    let repo = Repository::open(repo_dir).map_err(other)?;
    let signature = Signature::now(&req.author.name, &req.author.email)
        .map_err(|e| GitError::Other(format!("invalid commit identity: {}", e.message())))?;
    let message = commit_message(req)?;
    let parent = match repo.head() {
        Ok(head) => Some(head.peel_to_commit().map_err(other)?),
        Err(e) if e.code() == ErrorCode::UnbornBranch => None,
        Err(e) => return Err(other(e)),
    };
    let old_tree = parent
        .as_ref()
        .map(|c| c.tree())
        .transpose()
        .map_err(other)?;

    // Directories holding their own `.git` (an embedded repository): left out entirely.
    let embedded: Vec<&str> = changes
        .changes
        .iter()
        .filter_map(|c| {
            let at = c.path.find("/.git/").or_else(|| {
                c.path
                    .ends_with("/.git")
                    .then(|| c.path.len() - "/.git".len())
            })?;
            Some(&c.path[..at])
        })
        .collect();
    let mut kept = Vec::new();
    for change in &changes.changes {
        let path = change.path.as_str();
        let segments: Vec<&str> = path.split('/').collect();
        if path.starts_with('/') || segments.iter().any(|seg| matches!(*seg, "" | "." | "..")) {
            return Err(GitError::Other(format!(
                "refusing the change to `{path}`: not a plain relative path"
            )));
        }
        if segments[0].eq_ignore_ascii_case(".git") {
            return Err(GitError::Other(format!(
                "refusing the change to `{path}`: paths inside .git are never committed"
            )));
        }
        if let Some(dir) = embedded.iter().find(|d| path.starts_with(&format!("{d}/"))) {
            if path == format!("{dir}/.git") || path.starts_with(&format!("{dir}/.git/")) {
                tracing::warn!(path = %dir, "not committing an embedded git repository");
            }
            continue;
        }
        if segments.iter().any(|seg| seg.eq_ignore_ascii_case(".git")) {
            continue;
        }
        if let ChangeKind::Added(NewEntry::File { contents, .. })
        | ChangeKind::Modified {
            new: NewEntry::File { contents, .. },
            ..
        } = &change.kind
        {
            if contents.len() > req.max_file_bytes {
                return Err(GitError::TooLarge {
                    path: path.to_string(),
                    bytes: contents.len(),
                    limit: req.max_file_bytes,
                });
            }
        }
        kept.push(change);
    }

    let mut index = git2::Index::new().map_err(other)?;
    if let Some(tree) = &old_tree {
        index.read_tree(tree).map_err(other)?;
    }
    // A path that becomes a file or symlink replaces whatever was at or under it, and
    // any file where one of its parent directories now goes.
    let clear = |index: &mut git2::Index, path: &str| -> Result<(), GitError> {
        index.remove_dir(Path::new(path), 0).map_err(other)?;
        if index.get_path(Path::new(path), 0).is_some() {
            index.remove_path(Path::new(path)).map_err(other)?;
        }
        let mut ancestor = path;
        while let Some((parent, _)) = ancestor.rsplit_once('/') {
            if index.get_path(Path::new(parent), 0).is_some() {
                index.remove_path(Path::new(parent)).map_err(other)?;
            }
            ancestor = parent;
        }
        Ok(())
    };
    for change in &kept {
        let path = change.path.as_str();
        let new = match &change.kind {
            ChangeKind::Deleted => {
                if index.get_path(Path::new(path), 0).is_some() {
                    index.remove_path(Path::new(path)).map_err(other)?;
                }
                continue;
            }
            ChangeKind::Added(new) | ChangeKind::Modified { new, .. } => new,
        };
        let (id, mode) = match new {
            NewEntry::Symlink { target } => {
                (repo.blob(target.as_bytes()).map_err(other)?, 0o120000)
            }
            NewEntry::File { mode, contents } => {
                let mut writer = repo.blob_writer(None).map_err(other)?;
                let mut reader = contents.reader().map_err(|e| {
                    GitError::Other(format!("cannot read the new contents of `{path}`: {e}"))
                })?;
                std::io::copy(&mut reader, &mut writer).map_err(|e| {
                    GitError::Other(format!("cannot store the new contents of `{path}`: {e}"))
                })?;
                let id = writer.commit().map_err(other)?;
                (
                    id,
                    if mode & 0o111 != 0 {
                        0o100755
                    } else {
                        0o100644
                    },
                )
            }
        };
        clear(&mut index, path)?;
        index
            .add(&git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode,
                uid: 0,
                gid: 0,
                file_size: 0,
                id,
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            })
            .map_err(other)?;
    }
    let tree_id = index.write_tree_to(&repo).map_err(other)?;
    let Some((committed, tree)) = commit_tree(
        &repo,
        parent.as_ref(),
        old_tree.as_ref(),
        tree_id,
        &signature,
        &message,
    )?
    else {
        return Ok(None);
    };
    // The index follows, as after commit_all (the files stay where they were: nowhere).
    let mut on_disk = repo.index().map_err(other)?;
    on_disk.read_tree(&tree).map_err(other)?;
    on_disk.write().map_err(other)?;
    Ok(Some(committed))
}

/// Commits the tree `tree_id` on `HEAD` over `parent` (whose tree is `old_tree`), naming
/// the paths that changed; `None` when the tree is the parent's, or empty on an unborn
/// branch. Shared by [`commit_all`] and [`commit_change_set`].
fn commit_tree<'r>(
    repo: &'r Repository,
    parent: Option<&git2::Commit<'r>>,
    old_tree: Option<&git2::Tree<'r>>,
    tree_id: git2::Oid,
    signature: &git2::Signature<'_>,
    message: &str,
) -> Result<Option<(Committed, git2::Tree<'r>)>, GitError> {
    if old_tree.map(|t| t.id()) == Some(tree_id) {
        return Ok(None);
    }
    let tree = repo.find_tree(tree_id).map_err(other)?;
    if old_tree.is_none() && tree.is_empty() {
        return Ok(None);
    }
    let diff = repo
        .diff_tree_to_tree(old_tree, Some(&tree), None)
        .map_err(other)?;
    let mut paths: Vec<String> = diff
        .deltas()
        .filter_map(|d| d.new_file().path().or(d.old_file().path()))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    paths.sort();
    paths.dedup();

    let parents: Vec<&git2::Commit<'_>> = parent.into_iter().collect();
    let sha = repo
        .commit(Some("HEAD"), signature, signature, message, &tree, &parents)
        .map_err(other)?;
    Ok(Some((
        Committed {
            sha: sha.to_string(),
            files_changed: paths.len(),
            paths,
        },
        tree,
    )))
}

/// Fails with [`GitError::TooLarge`] for the first changed, not ignored file over `limit`.
fn check_sizes(repo: &Repository, limit: u64) -> Result<(), GitError> {
    let workdir = repo
        .workdir()
        .ok_or_else(|| GitError::Other("the repository has no work tree".into()))?;
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    let statuses = repo.statuses(Some(&mut opts)).map_err(other)?;
    let mut changed: Vec<Vec<u8>> = statuses
        .iter()
        .filter(|s| !s.status().is_empty() && !s.status().contains(Status::IGNORED))
        .map(|s| s.path_bytes().to_vec())
        .collect();
    changed.sort();
    for path in changed {
        let full = workdir.join(std::ffi::OsStr::from_bytes(&path));
        let Ok(meta) = std::fs::symlink_metadata(full) else {
            continue; // deleted
        };
        // A directory here is an embedded repository, which is not committed.
        if !meta.is_dir() && meta.len() > limit {
            return Err(GitError::TooLarge {
                path: String::from_utf8_lossy(&path).into_owned(),
                bytes: meta.len(),
                limit,
            });
        }
    }
    Ok(())
}

/// `subject`, a blank line, the body (if any), a blank line and the trailers (if any).
fn commit_message(req: &CommitRequest<'_>) -> Result<String, GitError> {
    let mut message = clean_subject(req.subject);
    if message.is_empty() {
        message.push_str("Apply changes");
    }
    message.push('\n');
    let body = clean_body(req.body);
    if !body.is_empty() {
        message.push('\n');
        message.push_str(&body);
        message.push('\n');
    }
    let mut trailers = String::new();
    for (key, value) in req.trailers {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(GitError::Other(format!(
                "invalid commit trailer key `{key}`"
            )));
        }
        let value = one_line(value);
        if !value.is_empty() {
            trailers.push_str(&format!("{key}: {value}\n"));
        }
    }
    if !trailers.is_empty() {
        message.push('\n');
        message.push_str(&trailers);
    }
    Ok(message)
}

/// `text` on one line: every run of whitespace or control characters becomes one space.
fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// One line of at most [`MAX_SUBJECT_CHARS`] characters, ending in `…` when cut.
fn clean_subject(subject: &str) -> String {
    let line = one_line(subject);
    if line.chars().count() <= MAX_SUBJECT_CHARS {
        return line;
    }
    let cut: String = line.chars().take(MAX_SUBJECT_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// The body with `\n` line ends, no other control characters but tabs, no trailing spaces.
fn clean_body(body: &str) -> String {
    body.replace("\r\n", "\n")
        .split(['\n', '\r'])
        .map(|line| {
            line.chars()
                .filter(|c| *c == '\t' || !c.is_control())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
        .trim_matches('\n')
        .to_string()
}

/// Pushes the current branch's `HEAD` to `refs/heads/<remote_branch>` at `url`, never
/// forcing. When the server refuses because the remote branch moved (non-fast-forward), the
/// branch is fetched (into `refs/remotes/origin/<remote_branch>`), the local commits are
/// rebased onto it (authors kept, committer kept with a new time), the work tree follows
/// (only the index, in a clone without files),
/// and the push is tried again: up to `attempts` rebases, then [`GitError::Moved`].
///
/// A rebase conflict is [`GitError::Conflict`] with nothing pushed and the local branch as
/// it was. Other refusals are [`GitError::Rejected`] with the server's reason, including
/// what a declining pre-receive hook said (see [`explain_rejection`]).
pub fn push_rebasing(
    repo_dir: &Path,
    url: &str,
    token: &str,
    remote_branch: &str,
    attempts: u32,
) -> Result<PushOutcome, GitError> {
    init();
    let session = Session::new(url, token)?;
    check_branch_name(remote_branch)?;
    let repo = Repository::open(repo_dir).map_err(other)?;
    let spec = format!("HEAD:refs/heads/{remote_branch}");
    let tracking = format!("refs/remotes/origin/{remote_branch}");
    let fetch_spec = format!("+refs/heads/{remote_branch}:{tracking}");
    let mut rebased = 0;
    loop {
        let head = head_commit(&repo)?;
        match push_once(&session, &repo, url, &spec, remote_branch) {
            Ok(()) => {
                return Ok(PushOutcome {
                    sha: head.to_string(),
                    rebased: rebased > 0,
                })
            }
            Err(PushFailure::Failed(e)) => return Err(e),
            Err(PushFailure::Moved(reason)) => {
                if rebased >= attempts {
                    tracing::info!(branch = remote_branch, reason, "push refused: branch moved");
                    return Err(GitError::Moved {
                        branch: remote_branch.to_string(),
                        attempts,
                    });
                }
                rebased += 1;
                fetch(repo_dir, url, token, &[&fetch_spec])?;
                let upstream = repo
                    .find_reference(&tracking)
                    .and_then(|r| r.peel_to_commit())
                    .map_err(other)?
                    .id();
                rebase_head_onto(&repo, upstream)?;
            }
        }
    }
}

/// The commit `HEAD` points at.
fn head_commit(repo: &Repository) -> Result<Oid, GitError> {
    repo.head()
        .and_then(|h| h.peel_to_commit())
        .map(|c| c.id())
        .map_err(|e| GitError::Other(format!("no commit to push: {}", e.message())))
}

/// Rebases the commits of `HEAD` that `upstream` lacks onto `upstream`, in memory, then
/// moves `HEAD` (its branch) there and checks it out. On a conflict nothing changes.
fn rebase_head_onto(repo: &Repository, upstream: Oid) -> Result<(), GitError> {
    let onto = repo.find_annotated_commit(upstream).map_err(other)?;
    let mut opts = RebaseOptions::new();
    opts.inmemory(true);
    let mut rebase = repo
        .rebase(None, Some(&onto), None, Some(&mut opts))
        .map_err(other)?;
    let mut last = upstream;
    let result = (|| {
        while let Some(op) = rebase.next() {
            let original = repo.find_commit(op.map_err(other)?.id()).map_err(other)?;
            let index = rebase.inmemory_index().map_err(other)?;
            if index.has_conflicts() {
                let mut paths = Vec::new();
                for conflict in index.conflicts().map_err(other)? {
                    let conflict = conflict.map_err(other)?;
                    if let Some(entry) = conflict.our.or(conflict.their).or(conflict.ancestor) {
                        paths.push(String::from_utf8_lossy(&entry.path).into_owned());
                    }
                }
                paths.sort();
                paths.dedup();
                return Err(GitError::Conflict { paths });
            }
            let who = original.committer();
            let committer = Signature::now(
                &String::from_utf8_lossy(who.name_bytes()),
                &String::from_utf8_lossy(who.email_bytes()),
            )
            .map_err(other)?;
            match rebase.commit(None, &committer, None) {
                Ok(id) => last = id,
                // Already upstream: the commit drops out.
                Err(e) if e.code() == ErrorCode::Applied => {}
                Err(e) => return Err(other(e)),
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = rebase.abort();
        return Err(e);
    }
    rebase.finish(None).map_err(other)?;
    drop(rebase);

    let commit = repo.find_commit(last).map_err(other)?;
    if has_files(repo) {
        repo.checkout_tree(
            commit.as_object(),
            Some(git2::build::CheckoutBuilder::new().force()),
        )
        .map_err(other)?;
    } else {
        // A clone whose files were never written ([`clone_from_mirror`] without files):
        // only the index follows; the files stay where they were, nowhere.
        let mut index = repo.index().map_err(other)?;
        index
            .read_tree(&commit.tree().map_err(other)?)
            .map_err(other)?;
        index.write().map_err(other)?;
    }
    let head = repo.head().map_err(other)?;
    if head.is_branch() {
        let name = head
            .name()
            .map_err(|_| GitError::Other("the branch name is not UTF-8".into()))?
            .to_string();
        repo.reference(&name, last, true, "kodx: rebase onto the remote branch")
            .map_err(other)?;
    } else {
        repo.set_head_detached(last).map_err(other)?;
    }
    Ok(())
}

/// Whether the work tree of `repo` holds anything besides `.git` (a clone made by
/// [`clone_from_mirror`] without files holds nothing else).
fn has_files(repo: &Repository) -> bool {
    let Some(workdir) = repo.workdir() else {
        return false;
    };
    std::fs::read_dir(workdir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name() != std::ffi::OsStr::new(".git"))
    })
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
    fn subjects_are_one_line_and_cut_at_72_chars() {
        assert_eq!(
            clean_subject("  Fix\tthe\n\nparser\u{7} "),
            "Fix the parser"
        );
        let long = "é".repeat(100);
        let cut = clean_subject(&long);
        assert_eq!(cut.chars().count(), MAX_SUBJECT_CHARS);
        assert_eq!(cut, format!("{}…", "é".repeat(71)));
        let exact = "a".repeat(72);
        assert_eq!(clean_subject(&exact), exact);
        // No space before the ellipsis.
        let spaced = format!("{} tail", "a".repeat(70));
        assert_eq!(clean_subject(&spaced), format!("{}…", "a".repeat(70)));
    }

    fn req<'a>(
        subject: &'a str,
        body: &'a str,
        trailers: &'a [(String, String)],
    ) -> CommitRequest<'a> {
        CommitRequest {
            author: Identity {
                name: "kodx[bot]".into(),
                email: "1+kodx[bot]@users.noreply.github.com".into(),
            },
            subject,
            body,
            trailers,
            max_file_bytes: 1,
        }
    }

    #[test]
    fn commit_messages() {
        let trailers = vec![
            (
                "Co-authored-by".to_string(),
                "alice\n <1+alice@users.noreply.github.com>\r".to_string(),
            ),
            ("Kodx-Run".to_string(), "r-1".to_string()),
            ("Empty".to_string(), " \n".to_string()),
        ];
        assert_eq!(
            commit_message(&req("Subject", "\r\nline one  \r\n\u{1b}[31mline two\n\n", &trailers)).unwrap(),
            "Subject\n\nline one\n[31mline two\n\nCo-authored-by: alice <1+alice@users.noreply.github.com>\nKodx-Run: r-1\n"
        );
        assert_eq!(
            commit_message(&req("Subject", " \n", &trailers[1..2])).unwrap(),
            "Subject\n\nKodx-Run: r-1\n"
        );
        assert_eq!(
            commit_message(&req("S", "Body", &[])).unwrap(),
            "S\n\nBody\n"
        );
        assert_eq!(
            commit_message(&req("\n", "", &[])).unwrap(),
            "Apply changes\n"
        );
        let bad = vec![("Bad: key".to_string(), "v".to_string())];
        assert!(commit_message(&req("S", "", &bad)).is_err());
        let bad = vec![("Bad\nKey".to_string(), "v".to_string())];
        assert!(commit_message(&req("S", "", &bad)).is_err());
    }

    #[test]
    fn rejections_are_explained() {
        let workflow = "refs/heads/main: refusing to allow a GitHub App to create or update \
                        workflow `.github/workflows/x.yml` without `workflows` permission";
        let e = explain_rejection(workflow);
        assert!(
            e.starts_with("the App is not allowed to change files under .github/workflows/, such as `.github/workflows/x.yml` (it lacks the workflows permission); "),
            "{e}"
        );
        assert!(e.ends_with(&format!("(GitHub said: {workflow})")), "{e}");

        let protected = "refs/heads/main: protected branch hook declined; the server said: \
                         error: GH006: Protected branch update failed for refs/heads/main.";
        let e = explain_rejection(protected);
        assert!(e.contains("the branch is protected"), "{e}");

        let rules = "refs/heads/main: push declined due to repository rule violations; the \
                     server said: error: GH013: Repository rule violations found for refs/heads/main.";
        assert!(explain_rejection(rules).contains("rulesets"), "{rules}");
        let secrets = "refs/heads/main: push declined due to repository rule violations; the \
                       server said: error: GH013: Repository rule violations found. - GITHUB PUSH PROTECTION";
        assert!(explain_rejection(secrets).contains("secret"));
        assert!(explain_rejection("error: GH001: Large files detected.").contains("100 MB"));
        assert!(explain_rejection("refs/heads/x: non-fast-forward").contains("never force-pushes"));
        assert_eq!(
            explain_rejection("refs/heads/x: funny"),
            "refs/heads/x: funny"
        );
    }

    #[test]
    fn remote_messages_drop_progress() {
        let raw = b"Resolving deltas:  50% (1/2)\rResolving deltas: 100% (2/2), done.\n\
                    error: GH006: Protected branch update failed.\n\x1b[31merror\x1b[0m: x\n\n";
        assert_eq!(
            remote_messages(raw),
            [
                "error: GH006: Protected branch update failed.",
                "[31merror [0m: x"
            ]
        );
        assert!(remote_messages(b"").is_empty());
        assert!(!is_progress("error: 100% sure"));
        assert!(!is_progress("error: 100% (of the time)"));
        assert!(is_progress(
            "Writing objects: 100% (3/3), 250 bytes | 250.00 KiB/s, done."
        ));
        assert!(is_progress("Counting objects: 100% (3/3), done."));
    }

    #[test]
    fn conflict_messages_list_paths() {
        let e = GitError::Conflict {
            paths: (0..12).map(|i| format!("f{i}")).collect(),
        };
        let m = e.to_string();
        assert!(m.contains("`f0`, `f1`"), "{m}");
        assert!(m.contains("and 2 more"), "{m}");
        assert!(!m.contains("`f10`"), "{m}");
    }

    #[test]
    fn branch_names() {
        assert!(check_branch_name("kodx/issue-7-ab12").is_ok());
        for bad in ["", "a..b", "-x", "a b", "x:y", "refs/heads/"] {
            assert!(check_branch_name(bad).is_err(), "{bad} accepted");
        }
    }
}
