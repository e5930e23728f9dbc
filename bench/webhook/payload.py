#!/usr/bin/env python3
"""Writes the two signed `issue_comment.created` payloads the webhook bench sends.

    python3 bench/webhook/payload.py OUT_DIR SECRET

OUT_DIR receives, for each path P in (ignored, queued):
    P.json  the exact body bytes (compact JSON, as GitHub sends it), about 14 KB
    P.sig   "sha256=" + hex(HMAC-SHA256(SECRET, body)), the X-Hub-Signature-256 value

The shape follows GitHub's `issue_comment` webhook: action, issue (with user, labels,
assignees, reactions, a body of a few KB), comment (user, body, author_association,
reactions), repository (all the URL templates, owner, default_branch), sender,
installation. The two payloads differ only in the comment body: the queued one has a
`/kodx ask why is the sky blue?` line, the ignored one has none.
"""

import hashlib
import hmac
import json
import os
import sys

API = "https://api.github.com"
WEB = "https://github.com"
TARGET_SIZE = 14 * 1024


def user(login, uid, kind="User", site_admin=False):
    u = f"{API}/users/{login}"
    return {
        "login": login,
        "id": uid,
        "node_id": f"MDQ6VXNlcj{uid:08d}",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?v=4",
        "gravatar_id": "",
        "url": u,
        "html_url": f"{WEB}/{login}",
        "followers_url": f"{u}/followers",
        "following_url": f"{u}/following{{/other_user}}",
        "gists_url": f"{u}/gists{{/gist_id}}",
        "starred_url": f"{u}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{u}/subscriptions",
        "organizations_url": f"{u}/orgs",
        "repos_url": f"{u}/repos",
        "events_url": f"{u}/events{{/privacy}}",
        "received_events_url": f"{u}/received_events",
        "type": kind,
        "user_view_type": "public",
        "site_admin": site_admin,
    }


def reactions(url, plus=0, heart=0):
    return {
        "url": f"{url}/reactions",
        "total_count": plus + heart,
        "+1": plus,
        "-1": 0,
        "laugh": 0,
        "hooray": 0,
        "confused": 0,
        "heart": heart,
        "rocket": 0,
        "eyes": 0,
    }


def repository(owner):
    full = f"{owner['login']}/widgets"
    r = f"{API}/repos/{full}"
    return {
        "id": 583742610,
        "node_id": "R_kgDOIsuAkg",
        "name": "widgets",
        "full_name": full,
        "private": False,
        "owner": owner,
        "html_url": f"{WEB}/{full}",
        "description": "Widgets, gadgets and the tooling that builds them",
        "fork": False,
        "url": r,
        "forks_url": f"{r}/forks",
        "keys_url": f"{r}/keys{{/key_id}}",
        "collaborators_url": f"{r}/collaborators{{/collaborator}}",
        "teams_url": f"{r}/teams",
        "hooks_url": f"{r}/hooks",
        "issue_events_url": f"{r}/issues/events{{/number}}",
        "events_url": f"{r}/events",
        "assignees_url": f"{r}/assignees{{/user}}",
        "branches_url": f"{r}/branches{{/branch}}",
        "tags_url": f"{r}/tags",
        "blobs_url": f"{r}/git/blobs{{/sha}}",
        "git_tags_url": f"{r}/git/tags{{/sha}}",
        "git_refs_url": f"{r}/git/refs{{/sha}}",
        "trees_url": f"{r}/git/trees{{/sha}}",
        "statuses_url": f"{r}/statuses/{{sha}}",
        "languages_url": f"{r}/languages",
        "stargazers_url": f"{r}/stargazers",
        "contributors_url": f"{r}/contributors",
        "subscribers_url": f"{r}/subscribers",
        "subscription_url": f"{r}/subscription",
        "commits_url": f"{r}/commits{{/sha}}",
        "git_commits_url": f"{r}/git/commits{{/sha}}",
        "comments_url": f"{r}/comments{{/number}}",
        "issue_comment_url": f"{r}/issues/comments{{/number}}",
        "contents_url": f"{r}/contents/{{+path}}",
        "compare_url": f"{r}/compare/{{base}}...{{head}}",
        "merges_url": f"{r}/merges",
        "archive_url": f"{r}/{{archive_format}}{{/ref}}",
        "downloads_url": f"{r}/downloads",
        "issues_url": f"{r}/issues{{/number}}",
        "pulls_url": f"{r}/pulls{{/number}}",
        "milestones_url": f"{r}/milestones{{/number}}",
        "notifications_url": f"{r}/notifications{{?since,all,participating}}",
        "labels_url": f"{r}/labels{{/name}}",
        "releases_url": f"{r}/releases{{/id}}",
        "deployments_url": f"{r}/deployments",
        "created_at": "2022-12-30T11:04:31Z",
        "updated_at": "2025-05-02T08:12:44Z",
        "pushed_at": "2025-05-02T08:12:40Z",
        "git_url": f"git://github.com/{full}.git",
        "ssh_url": f"git@github.com:{full}.git",
        "clone_url": f"{WEB}/{full}.git",
        "svn_url": f"{WEB}/{full}",
        "homepage": "https://widgets.example.org",
        "size": 18342,
        "stargazers_count": 1274,
        "watchers_count": 1274,
        "language": "Rust",
        "has_issues": True,
        "has_projects": True,
        "has_downloads": True,
        "has_wiki": False,
        "has_pages": False,
        "has_discussions": True,
        "forks_count": 96,
        "mirror_url": None,
        "archived": False,
        "disabled": False,
        "open_issues_count": 41,
        "license": {
            "key": "apache-2.0",
            "name": "Apache License 2.0",
            "spdx_id": "Apache-2.0",
            "url": f"{API}/licenses/apache-2.0",
            "node_id": "MDc6TGljZW5zZTI=",
        },
        "allow_forking": True,
        "is_template": False,
        "web_commit_signoff_required": False,
        "topics": ["cli", "rust", "widgets"],
        "visibility": "public",
        "forks": 96,
        "open_issues": 41,
        "watchers": 1274,
        "default_branch": "main",
        "custom_properties": {},
    }


ISSUE_BODY_PARAGRAPH = (
    "When the cache directory lives on a network file system the build sometimes "
    "reports a miss for a widget that was built a second earlier. The manifest is "
    "written, then renamed into place, and the next lookup reads the old inode. "
    "Steps: mount the cache over NFS, run `widgets build --jobs 8` twice in a row, "
    "and compare the hit counts in `target/widgets/stats.json`.\r\n\r\n"
)

ISSUE_LOG = (
    "```\r\n"
    "[2025-05-02T08:11:02Z INFO  widgets::cache] lookup key=3f1c9a0e hit=false\r\n"
    "[2025-05-02T08:11:02Z DEBUG widgets::cache] manifest mtime=1746173461 size=40312\r\n"
    "[2025-05-02T08:11:03Z WARN  widgets::cache] stale manifest, rebuilding widget #112\r\n"
    "```\r\n\r\n"
)


def issue_body(n_paragraphs):
    parts = ["### What happened\r\n\r\n"]
    for i in range(n_paragraphs):
        parts.append(ISSUE_BODY_PARAGRAPH)
        if i % 3 == 1:
            parts.append(ISSUE_LOG)
    parts.append("### Version\r\n\r\nwidgets 0.19.2 on Linux x86_64, NFSv4.1\r\n")
    return "".join(parts)


def payload(comment_body, n_paragraphs):
    owner = user("acme-widgets", 119200311, kind="Organization")
    reporter = user("octo-reporter", 5839201)
    maintainer = user("maintainer-mia", 2210457)
    repo = repository(owner)
    issue_api = f"{repo['url']}/issues/1347"
    comment_id = 2847120935
    comment_api = f"{repo['url']}/issues/comments/{comment_id}"
    labels = [
        {
            "id": 4977390021 + i,
            "node_id": f"LA_kwDOIsuAks8AAAABKKaVx{i}",
            "url": f"{repo['url']}/labels/{name}",
            "name": name,
            "color": color,
            "default": default,
            "description": desc,
        }
        for i, (name, color, default, desc) in enumerate(
            [
                ("bug", "d73a4a", True, "Something isn't working"),
                ("area/cache", "1d76db", False, "The build cache"),
                ("needs-triage", "fbca04", False, "Not looked at yet"),
            ]
        )
    ]
    return {
        "action": "created",
        "issue": {
            "url": issue_api,
            "repository_url": repo["url"],
            "labels_url": f"{issue_api}/labels{{/name}}",
            "comments_url": f"{issue_api}/comments",
            "events_url": f"{issue_api}/events",
            "html_url": f"{repo['html_url']}/issues/1347",
            "id": 3036517840,
            "node_id": "I_kwDOIsuAks61_XzQ",
            "number": 1347,
            "title": "Cache reports a miss right after a build on NFS",
            "user": reporter,
            "labels": labels,
            "state": "open",
            "locked": False,
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "comments": 4,
            "created_at": "2025-05-02T07:58:10Z",
            "updated_at": "2025-05-02T08:12:44Z",
            "closed_at": None,
            "author_association": "NONE",
            "type": None,
            "active_lock_reason": None,
            "sub_issues_summary": {"total": 0, "completed": 0, "percent_completed": 0},
            "body": issue_body(n_paragraphs),
            "reactions": reactions(issue_api, plus=3),
            "timeline_url": f"{issue_api}/timeline",
            "performed_via_github_app": None,
            "state_reason": None,
        },
        "comment": {
            "url": comment_api,
            "html_url": f"{repo['html_url']}/issues/1347#issuecomment-{comment_id}",
            "issue_url": issue_api,
            "id": comment_id,
            "node_id": "IC_kwDOIsuAks6pszkn",
            "user": maintainer,
            "created_at": "2025-05-02T08:12:44Z",
            "updated_at": "2025-05-02T08:12:44Z",
            "author_association": "MEMBER",
            "body": comment_body,
            "reactions": reactions(comment_api),
            "performed_via_github_app": None,
        },
        "repository": repo,
        "organization": {
            "login": owner["login"],
            "id": owner["id"],
            "node_id": owner["node_id"],
            "url": f"{API}/orgs/{owner['login']}",
            "repos_url": f"{API}/orgs/{owner['login']}/repos",
            "events_url": f"{API}/orgs/{owner['login']}/events",
            "hooks_url": f"{API}/orgs/{owner['login']}/hooks",
            "issues_url": f"{API}/orgs/{owner['login']}/issues",
            "members_url": f"{API}/orgs/{owner['login']}/members{{/member}}",
            "public_members_url": f"{API}/orgs/{owner['login']}/public_members{{/member}}",
            "avatar_url": owner["avatar_url"],
            "description": "Widgets and friends",
        },
        "sender": maintainer,
        "installation": {"id": 61234567, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uNjEyMzQ1Njc="},
    }


COMMENT_PLAIN = (
    "Thanks for the report. I can reproduce it on NFSv4.1 with `actimeo=0` unset; "
    "with it set the misses go away, so it looks like attribute caching. "
    "I'll look at fsyncing the directory after the rename.\r\n"
)
COMMENT_COMMAND = COMMENT_PLAIN + "\r\n/kodx ask why is the sky blue?\r\n"


def encode(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def paragraphs():
    """The smallest number of issue-body paragraphs that brings the ignored payload to
    TARGET_SIZE; both payloads use it, so they differ only in the comment."""
    n = 1
    while len(encode(payload(COMMENT_PLAIN, n))) < TARGET_SIZE:
        n += 1
    return n


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, secret = sys.argv[1], sys.argv[2].encode()
    os.makedirs(out, exist_ok=True)
    n = paragraphs()
    for name, comment in (("ignored", COMMENT_PLAIN), ("queued", COMMENT_COMMAND)):
        body = encode(payload(comment, n))
        sig = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        with open(os.path.join(out, f"{name}.json"), "wb") as f:
            f.write(body)
        with open(os.path.join(out, f"{name}.sig"), "w") as f:
            f.write(sig)
        issue_body_len = len(json.loads(body)["issue"]["body"])
        print(f"{name}: {len(body)} bytes (issue body {issue_body_len})", file=sys.stderr)


if __name__ == "__main__":
    main()
