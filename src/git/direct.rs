//! A one-request push of a new branch ([`push_new_branch`]): the commit `HEAD` points at,
//! with only the objects its parents lack, sent to `refs/heads/<branch>` as a creation
//! (old value zero) in a single `POST …/git-receive-pack`.
//!
//! libgit2's push first reads the server's refs (an anonymous request answered 401, then
//! the ref advertisement: `git receive-pack --advertise-refs` on the server) and marks the
//! whole tree of every advertised commit it holds as already there before it packs. A run's
//! branch is new and its one commit sits on a tip the server gave kodx, so none of that is
//! needed: the server checks the creation itself (a branch that already exists is refused,
//! nothing is forced), and any refusal, failure or surprise hands the push to libgit2's
//! path ([`Direct::Declined`]), which behaves as before.
//!
//! The token goes in a basic `Authorization` header to the URL's origin only: no
//! redirects are followed, no proxy is used, and nothing with the token is kept or logged.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use git2::{ObjectType, Oid, Repository, Tree};

use super::error::GitError;
use super::push::BeforeSend;
use super::session::{check_branch_name, init, other, Session};

/// How a direct push went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direct {
    /// The server created the branch at the commit.
    Pushed { sha: String, objects: usize },
    /// Not pushed this way, for the reason given: push as before.
    Declined(String),
}

/// How long connecting may take, and the whole request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Most bytes of the server's answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Creates `refs/heads/<remote_branch>` at `url` on the commit `HEAD` of the repository at
/// `repo_dir` points at, in one request (see the module). `before_send` is asked right
/// before the request: `false` is [`GitError::Withheld`]. `runtime` runs the request
/// (this function blocks, as the others here do).
pub fn push_new_branch(
    repo_dir: &Path,
    url: &str,
    token: &str,
    remote_branch: &str,
    runtime: &tokio::runtime::Handle,
    before_send: BeforeSend<'_>,
) -> Result<Direct, GitError> {
    init();
    let session = Session::new(url, token)?;
    check_branch_name(remote_branch)?;
    let (new, pack, objects) = {
        let repo = Repository::open(repo_dir).map_err(other)?;
        let head = repo
            .head()
            .and_then(|h| h.peel_to_commit())
            .map_err(|e| GitError::Other(format!("no commit to push: {}", e.message())))?;
        if head.parent_count() == 0 {
            return Ok(Direct::Declined("the commit has no parent".into()));
        }
        let ids = new_objects(&repo, &head)?;
        let mut builder = repo.packbuilder().map_err(other)?;
        for id in &ids {
            builder.insert_object(*id, None).map_err(other)?;
        }
        let mut pack = git2::Buf::new();
        builder.write_buf(&mut pack).map_err(other)?;
        (head.id(), pack.to_vec(), ids.len())
    };
    let refname = format!("refs/heads/{remote_branch}");
    let mut body = pkt_line(&format!(
        "{} {new} {refname}\0report-status side-band-64k agent=kodx\n",
        Oid::ZERO_SHA1
    ));
    body.extend_from_slice(b"0000");
    body.extend_from_slice(&pack);
    if !before_send() {
        return Err(GitError::Withheld);
    }
    let endpoint = format!("{}/git-receive-pack", url.trim_end_matches('/'));
    let answer = runtime.block_on(send(&endpoint, token, body));
    let answer = match answer {
        Ok(answer) => answer,
        Err(why) => return Ok(Direct::Declined(session.scrub(&why))),
    };
    Ok(match report(&answer, &refname) {
        Ok(()) => Direct::Pushed {
            sha: new.to_string(),
            objects,
        },
        Err(why) => Direct::Declined(session.scrub(&why)),
    })
}

/// The commit and the trees and blobs of its tree that none of its parents' trees holds at
/// the same place: what the server lacks, the parents being the server's.
fn new_objects(repo: &Repository, commit: &git2::Commit<'_>) -> Result<Vec<Oid>, GitError> {
    let tree = commit.tree().map_err(other)?;
    let parents: Vec<Tree<'_>> = commit
        .parents()
        .map(|p| p.tree())
        .collect::<Result<_, _>>()
        .map_err(other)?;
    let mut out = vec![commit.id()];
    let mut seen = HashSet::new();
    if parents.iter().all(|p| p.id() != tree.id()) {
        out.push(tree.id());
        seen.insert(tree.id());
        tree_difference(repo, &tree, &parents, &mut seen, &mut out)?;
    }
    Ok(out)
}

/// Adds to `out` the entries of `tree` (recursively) that no tree of `old` (the trees at
/// the same place in the parents) has with the same id.
fn tree_difference(
    repo: &Repository,
    tree: &Tree<'_>,
    old: &[Tree<'_>],
    seen: &mut HashSet<Oid>,
    out: &mut Vec<Oid>,
) -> Result<(), GitError> {
    for entry in tree.iter() {
        let id = entry.id();
        let name = entry.name_bytes();
        let before: Vec<git2::TreeEntry<'_>> =
            old.iter().filter_map(|t| t.get_name_bytes(name)).collect();
        if before.iter().any(|e| e.id() == id) || !seen.insert(id) {
            continue;
        }
        match entry.kind() {
            Some(ObjectType::Blob) => out.push(id),
            Some(ObjectType::Tree) => {
                out.push(id);
                let sub = repo.find_tree(id).map_err(other)?;
                let old_subs: Vec<Tree<'_>> = before
                    .iter()
                    .filter(|e| e.kind() == Some(ObjectType::Tree))
                    .filter_map(|e| repo.find_tree(e.id()).ok())
                    .collect();
                tree_difference(repo, &sub, &old_subs, seen, out)?;
            }
            // A submodule's commit is not in this repository.
            _ => {}
        }
    }
    Ok(())
}

/// One pkt-line: four hex digits of length, then `data`.
fn pkt_line(data: &str) -> Vec<u8> {
    let mut out = format!("{:04x}", data.len() + 4).into_bytes();
    out.extend_from_slice(data.as_bytes());
    out
}

/// POSTs `body` to `endpoint`; the server's answer, or why there is none to read.
async fn send(endpoint: &str, token: &str, body: Vec<u8>) -> Result<Vec<u8>, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .user_agent("git/2.0 (kodx)")
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))?;
    let credentials = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{token}", super::session::USERNAME));
    let response = client
        .post(endpoint)
        .header("Authorization", format!("Basic {credentials}"))
        .header("Content-Type", "application/x-git-receive-pack-request")
        .header("Accept", "application/x-git-receive-pack-result")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("the request failed: {}", e.without_url()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("the server answered {status}"));
    }
    let bytes = response
        .bytes()
        .await
        .map_err(|e| format!("reading the answer failed: {}", e.without_url()))?;
    if bytes.len() > MAX_ANSWER_BYTES {
        return Err("the answer is too long".into());
    }
    Ok(bytes.to_vec())
}

/// Reads receive-pack's answer (side-band 64k around its report-status): `Ok` when it
/// unpacked the objects and updated `refname`, else what it said.
fn report(answer: &[u8], refname: &str) -> Result<(), String> {
    let mut status = Vec::new();
    let mut said = Vec::new();
    for packet in packets(answer)? {
        match packet.split_first() {
            Some((1, data)) => status.extend_from_slice(data),
            Some((2, data)) => said.extend_from_slice(data),
            Some((3, data)) => {
                return Err(format!(
                    "the server failed: {}",
                    String::from_utf8_lossy(data).trim()
                ))
            }
            _ => return Err("the server's answer is not side-band data".into()),
        }
    }
    let lines: Vec<String> = packets(&status)?
        .iter()
        .map(|l| String::from_utf8_lossy(l).trim_end().to_string())
        .collect();
    let unpacked = lines.iter().any(|l| l == "unpack ok");
    let updated = lines.iter().any(|l| *l == format!("ok {refname}"));
    if unpacked && updated {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&said);
    Err(format!(
        "the server said: {}{}",
        lines.join("; "),
        if said.trim().is_empty() {
            String::new()
        } else {
            format!(" ({})", said.trim())
        }
    ))
}

/// The pkt-lines of `data` up to its first flush (or its end), without their lengths.
fn packets(mut data: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = std::str::from_utf8(&data[..4])
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or("a malformed pkt-line")?;
        if len == 0 {
            break;
        }
        if len < 4 || len > data.len() {
            return Err("a malformed pkt-line".into());
        }
        out.push(&data[4..len]);
        data = &data[len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkt_lines_and_reports() {
        assert_eq!(pkt_line("a\n"), b"0006a\n");
        let band = |n: u8, s: &str| {
            let mut v = vec![n];
            v.extend_from_slice(s.as_bytes());
            let mut out = format!("{:04x}", v.len() + 4).into_bytes();
            out.extend(v);
            out
        };
        let inner = [pkt_line("unpack ok\n"), pkt_line("ok refs/heads/b\n")].concat();
        let ok = [
            band(1, &String::from_utf8(inner).unwrap()),
            b"0000".to_vec(),
        ]
        .concat();
        assert_eq!(report(&ok, "refs/heads/b"), Ok(()));
        assert!(report(&ok, "refs/heads/other").is_err());
        let inner = [
            pkt_line("unpack ok\n"),
            pkt_line("ng refs/heads/b failed to update ref\n"),
        ]
        .concat();
        let ng = [
            band(2, "error: cannot lock ref\n"),
            band(1, &String::from_utf8(inner).unwrap()),
            b"0000".to_vec(),
        ]
        .concat();
        let why = report(&ng, "refs/heads/b").unwrap_err();
        assert!(
            why.contains("ng refs/heads/b failed to update ref"),
            "{why}"
        );
        assert!(why.contains("cannot lock ref"), "{why}");
        assert!(report(&band(3, "boom"), "refs/heads/b")
            .unwrap_err()
            .contains("boom"));
        assert!(report(b"00", "refs/heads/b").is_err());
        assert!(report(b"zzzz", "refs/heads/b").is_err());
        assert!(report(b"0003", "refs/heads/b").is_err());
    }
}
