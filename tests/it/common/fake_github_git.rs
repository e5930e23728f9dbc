//! The fake GitHub's view of a repository's commits, read from its bare repository on the
//! git server (`FakeGitHub::set_git_dir`): `GET /repos/{o}/{r}/branches/{branch}`,
//! `/git/trees/{sha}` (`recursive=1`), `/git/blobs/{sha}` (JSON or raw), and `contents`
//! at a `ref` other than the default branch's tip. Shapes as GitHub's REST API answers them.

use std::path::PathBuf;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{
    accepts_json, auth_installation, base64_wrapped, gh_error, json_response, refuse, FakeGitHub,
    Req, CONTENTS_READ,
};

/// The `Accept` that asks for a file's or blob's raw bytes.
const RAW: &str = "application/vnd.github.raw+json";

/// The bare repository of `key` (lower-case `owner/name`) and its full name, if the fake
/// reads commits from one.
fn git_dir(fake: &FakeGitHub, key: &str) -> Option<(PathBuf, String)> {
    let st = fake.state();
    let r = st.repos.get(key)?;
    let f = st.git_dir.clone()?;
    let name = r.full_name.clone();
    drop(st);
    f(&name).map(|d| (d, name))
}

pub(super) fn open_repo(fake: &FakeGitHub, key: &str) -> Option<git2::Repository> {
    let (dir, _) = git_dir(fake, key)?;
    git2::Repository::open_bare(dir).ok()
}

/// The commit `rev` names (a branch, a tag or a commit sha), as GitHub resolves a `ref`.
fn commit_of<'r>(repo: &'r git2::Repository, rev: &str) -> Option<git2::Commit<'r>> {
    if rev.is_empty() || rev.starts_with('-') || rev.contains("..") {
        return None;
    }
    for name in [
        format!("refs/heads/{rev}"),
        format!("refs/tags/{rev}"),
        rev.to_string(),
    ] {
        if let Ok(obj) = repo.revparse_single(&name) {
            if let Ok(c) = obj.peel_to_commit() {
                return Some(c);
            }
        }
    }
    None
}

fn mode_str(mode: i32) -> String {
    format!("{mode:06o}")
}

/// A `contents: read` call answered in JSON: the repository's key, or the refusal.
#[allow(clippy::result_large_err)]
fn readable_json(
    fake: &FakeGitHub,
    req: &Req,
    owner: &str,
    repo: &str,
) -> Result<String, Response> {
    let key = auth_installation(fake, req, owner, repo, CONTENTS_READ)?;
    if !accepts_json(req) {
        return Err(refuse(
            fake,
            req,
            415,
            "Unsupported 'Accept' header",
            "Accept",
        ));
    }
    Ok(key)
}

/// `GET /repos/{owner}/{repo}/branches/{branch}`: the branch's tip, from the branch hooks
/// (`set_branch_sha`) or the git directory; 404 "Branch not found" for anything else (a
/// tag, a commit).
pub(super) async fn get_branch(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, branch)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match readable_json(&fake, &req, &owner, &repo) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let Some(sha) = fake.branch_tip(&key, &branch) else {
        return gh_error(404, "Branch not found");
    };
    let base = format!("{}/repos/{owner}/{repo}", fake.url());
    json_response(
        200,
        json!({
            "name": branch,
            "commit": {
                "sha": sha,
                "node_id": format!("C_{sha}"),
                "url": format!("{base}/commits/{sha}"),
                "commit": {"message": "", "tree": {"sha": sha, "url": format!("{base}/git/trees/{sha}")}},
            },
            "_links": {"self": format!("{base}/branches/{branch}"), "html": format!("{}/{owner}/{repo}/tree/{branch}", fake.root())},
            "protected": false,
            "protection": {"enabled": false, "required_status_checks": {"enforcement_level": "off", "contexts": [], "checks": []}},
            "protection_url": format!("{base}/branches/{branch}/protection"),
        }),
    )
}

/// `GET /repos/{owner}/{repo}/git/trees/{tree_sha}[?recursive=1]`: the tree of a commit,
/// tree or ref, from the git directory.
pub(super) async fn get_tree(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match readable_json(&fake, &req, &owner, &repo) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let recursive = req.query.contains_key("recursive");
    let Some(git) = open_repo(&fake, &key) else {
        return gh_error(404, "Not Found");
    };
    let as_tree = git2::Oid::from_str(&sha)
        .ok()
        .and_then(|oid| git.find_tree(oid).ok());
    let tree = match as_tree.or_else(|| commit_of(&git, &sha).and_then(|c| c.tree().ok())) {
        Some(t) => t,
        None => return gh_error(404, "Not Found"),
    };
    let base = format!("{}/repos/{owner}/{repo}", fake.url());
    // Sizes from the object headers (a blob is not inflated to be measured).
    let odb = git.odb().ok();
    let mut entries = Vec::new();
    let mut push = |path: String, entry: &git2::TreeEntry| {
        let kind = match entry.kind() {
            Some(git2::ObjectType::Tree) => "tree",
            Some(git2::ObjectType::Commit) => "commit",
            _ => "blob",
        };
        let id = entry.id().to_string();
        let mut v = json!({
            "path": path,
            "mode": mode_str(entry.filemode()),
            "type": kind,
            "sha": id,
            "url": format!("{base}/git/{}s/{id}", kind),
        });
        if kind == "blob" {
            if let Some(Ok((size, _))) = odb.as_ref().map(|o| o.read_header(entry.id())) {
                v["size"] = json!(size);
            }
        }
        entries.push(v);
    };
    if recursive {
        let _ = tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            let name = entry.name().unwrap_or("");
            push(format!("{dir}{name}"), entry);
            git2::TreeWalkResult::Ok
        });
    } else {
        for entry in tree.iter() {
            push(entry.name().unwrap_or("").to_string(), &entry);
        }
    }
    json_response(
        200,
        json!({
            "sha": tree.id().to_string(),
            "url": format!("{base}/git/trees/{}", tree.id()),
            "tree": entries,
            "truncated": false,
        }),
    )
}

/// `GET /repos/{owner}/{repo}/git/blobs/{file_sha}`: base64 JSON, or the raw bytes with
/// `Accept: application/vnd.github.raw+json`.
pub(super) async fn get_blob(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, CONTENTS_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let raw = req.header("accept").is_some_and(|a| a.contains(RAW));
    if !raw && !accepts_json(&req) {
        return refuse(&fake, &req, 415, "Unsupported 'Accept' header", "Accept");
    }
    let Some(git) = open_repo(&fake, &key) else {
        return gh_error(404, "Not Found");
    };
    let Ok(oid) = git2::Oid::from_str(&sha) else {
        return gh_error(
            422,
            "The sha parameter must be exactly 40 characters and contain only [0-9a-f].",
        );
    };
    let Ok(blob) = git.find_blob(oid) else {
        return gh_error(404, "Not Found");
    };
    if raw {
        return (
            axum::http::StatusCode::OK,
            [("content-type", "application/vnd.github.raw")],
            blob.content().to_vec(),
        )
            .into_response();
    }
    let base = format!("{}/repos/{owner}/{repo}", fake.url());
    json_response(
        200,
        json!({
            "sha": sha,
            "node_id": format!("B_{sha}"),
            "size": blob.size(),
            "url": format!("{base}/git/blobs/{sha}"),
            "content": base64_wrapped(blob.content()),
            "encoding": "base64",
        }),
    )
}

/// The contents answer for `path` at `rev` from the git directory: a file, a directory's
/// listing, a symlink or a submodule, as GitHub describes each; `None`: not there.
pub(super) fn contents_at(fake: &FakeGitHub, key: &str, rev: &str, path: &str) -> Option<Response> {
    let git = open_repo(fake, key)?;
    let commit = commit_of(&git, rev)?;
    let tree = commit.tree().ok()?;
    let (_, full_name) = git_dir(fake, key)?;
    let base = format!("{}/repos/{full_name}", fake.url());
    let describe = |p: &str, kind: &str, id: String, size: usize| -> Value {
        json!({
            "type": kind,
            "size": size,
            "name": p.rsplit('/').next().unwrap_or(p),
            "path": p,
            "sha": id,
            "url": format!("{base}/contents/{p}?ref={rev}"),
            "html_url": format!("{}/{full_name}/blob/{rev}/{p}", fake.root()),
            "git_url": format!("{base}/git/blobs/{id}"),
            "download_url": null,
            "_links": {"self": format!("{base}/contents/{p}?ref={rev}"), "git": format!("{base}/git/blobs/{id}"), "html": null},
        })
    };
    let dir_listing = |t: &git2::Tree, prefix: &str| -> Response {
        let items: Vec<Value> = t
            .iter()
            .map(|e| {
                let name = e.name().unwrap_or("");
                let p = if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}/{name}")
                };
                let kind = match (e.kind(), e.filemode()) {
                    (Some(git2::ObjectType::Tree), _) => "dir",
                    (Some(git2::ObjectType::Commit), _) => "submodule",
                    (_, 0o120000) => "symlink",
                    _ => "file",
                };
                let size = git.find_blob(e.id()).map(|b| b.size()).unwrap_or(0);
                describe(&p, kind, e.id().to_string(), size)
            })
            .collect();
        json_response(200, Value::Array(items))
    };
    if path.is_empty() {
        return Some(dir_listing(&tree, ""));
    }
    let entry = tree.get_path(std::path::Path::new(path)).ok()?;
    let id = entry.id().to_string();
    Some(match (entry.kind(), entry.filemode()) {
        (Some(git2::ObjectType::Tree), _) => dir_listing(&git.find_tree(entry.id()).ok()?, path),
        (Some(git2::ObjectType::Commit), _) => {
            let mut v = describe(path, "submodule", id, 0);
            v["submodule_git_url"] = json!("");
            json_response(200, v)
        }
        (_, 0o120000) => {
            let blob = git.find_blob(entry.id()).ok()?;
            let mut v = describe(path, "symlink", id, blob.size());
            v["target"] = json!(String::from_utf8_lossy(blob.content()));
            json_response(200, v)
        }
        _ => {
            let blob = git.find_blob(entry.id()).ok()?;
            let mut v = describe(path, "file", id, blob.size());
            if blob.size() > 1024 * 1024 {
                // GitHub's contents API sends files over 1 MB without their content.
                v["encoding"] = json!("none");
                v["content"] = json!("");
            } else {
                v["encoding"] = json!("base64");
                v["content"] = json!(base64_wrapped(blob.content()));
            }
            json_response(200, v)
        }
    })
}

/// The tip of `branch` of `key`: the branch hooks first, else the git directory.
pub(super) fn branch_tip_from_git(fake: &FakeGitHub, key: &str, branch: &str) -> Option<String> {
    let git = open_repo(fake, key)?;
    let r = git.find_reference(&format!("refs/heads/{branch}")).ok()?;
    let id = r.peel_to_commit().ok()?.id().to_string();
    Some(id)
}
