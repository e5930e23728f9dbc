//! The bare mirror a repository cache keeps: bringing a ref into it ([`fetch_mirror`]) and
//! making a clone from its objects with no network ([`clone_from_mirror`]).

use std::path::Path;
use std::rc::Rc;

use git2::{AutotagOption, Direction, FetchOptions, Oid, Repository, RepositoryInitOptions};

use super::clone::{check_empty_dest, default_branch_of, finish_clone, refs_for, Checkout, Cloned};
use super::error::GitError;
use super::session::{init, other, Origin, Session};

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
/// branch, upstream and `.git/config` as [`clone`](super::clone()) of `checkout` would
/// make — from the objects of the bare repository `mirror`, with no network. The mirror's
/// object files are hard-linked (copied when `dest` is on another filesystem): they are never written
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
