//! Pushing: one push ([`push`]), and [`push_rebasing`], which rebases kodx's commits onto
//! a branch that moved meanwhile and tries again, never forcing.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use git2::{ErrorCode, Oid, PushOptions, RebaseOptions, Repository, Signature};

use super::clone::fetch;
use super::error::GitError;
use super::session::{check_branch_name, init, other, Session};

/// Where [`push_rebasing`] left the remote branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushOutcome {
    /// The commit the remote branch points at now.
    pub sha: String,
    /// Whether the local commits were rebased onto commits pushed by someone else.
    pub rebased: bool,
}

/// Asked by a push once it has read the server's refs (the last thing it reads) and before
/// it sends anything: `false` stops it there ([`GitError::Withheld`]).
pub type BeforeSend<'a> = &'a dyn Fn() -> bool;

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
    push_checked(
        repo_dir,
        url,
        token,
        local_ref,
        remote_branch,
        force,
        &|| true,
    )
}

/// [`push`], asking `before_send` once the server's refs are read, right before anything
/// is sent.
pub fn push_checked(
    repo_dir: &Path,
    url: &str,
    token: &str,
    local_ref: &str,
    remote_branch: &str,
    force: bool,
    before_send: BeforeSend<'_>,
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
    push_once(&session, &repo, url, &spec, remote_branch, before_send).map_err(|failure| {
        match failure {
            PushFailure::Moved(reason) => GitError::Rejected { reason },
            PushFailure::Failed(e) => e,
        }
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
    before_send: BeforeSend<'_>,
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
    // Between reading the server's refs and sending the pack: the last moment to stop.
    let withheld = Rc::new(std::cell::Cell::new(false));
    let stopped = withheld.clone();
    callbacks.push_negotiation(move |_updates| {
        if before_send() {
            return Ok(());
        }
        stopped.set(true);
        Err(git2::Error::from_str(
            "the push was withheld before it was sent",
        ))
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
        if withheld.get() {
            return Err(PushFailure::Failed(GitError::Withheld));
        }
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

/// Pushes the current branch's `HEAD` to `refs/heads/<remote_branch>` at `url`, never
/// forcing. When the server refuses because the remote branch moved (non-fast-forward), the
/// branch is fetched (into `refs/remotes/origin/<remote_branch>`), the local commits are
/// rebased onto it (authors kept, committer kept with a new time), the work tree follows
/// (only the index, in a clone without files),
/// and the push is tried again: up to `attempts` rebases, then [`GitError::Moved`].
///
/// A rebase conflict is [`GitError::Conflict`] with nothing pushed and the local branch as
/// it was. Other refusals are [`GitError::Rejected`] with the server's reason, including
/// what a declining pre-receive hook said (see [`explain_rejection`](super::explain_rejection)).
pub fn push_rebasing(
    repo_dir: &Path,
    url: &str,
    token: &str,
    remote_branch: &str,
    attempts: u32,
) -> Result<PushOutcome, GitError> {
    push_rebasing_checked(repo_dir, url, token, remote_branch, attempts, &|| true)
}

/// [`push_rebasing`], asking `before_send` before each push sends anything (once the
/// server's refs are read, after any fetch and rebase).
pub fn push_rebasing_checked(
    repo_dir: &Path,
    url: &str,
    token: &str,
    remote_branch: &str,
    attempts: u32,
    before_send: BeforeSend<'_>,
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
        match push_once(&session, &repo, url, &spec, remote_branch, before_send) {
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
/// [`clone_from_mirror`](super::clone_from_mirror) without files holds nothing else).
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
