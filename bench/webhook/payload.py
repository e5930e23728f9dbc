#!/usr/bin/env python3
"""Writes the two signed `issue_comment.created` payloads the webhook bench sends.

    python3 bench/webhook/payload.py OUT_DIR SECRET

OUT_DIR receives, for each path P in (ignored, queued):
    P.json  the exact body bytes (compact JSON, as GitHub sends it), about 14 KB
    P.sig   "sha256=" + hex(HMAC-SHA256(SECRET, body)), the X-Hub-Signature-256 value
and for the queued path a template, so every queued request can carry its own comment:
    queued.tpl  the body up to its comment id, then the SHA-256 states webhook.lua needs
                to sign any comment id in a few microseconds (see `template`)

kodx starts one run per comment (a replayed body under a new delivery id queues
nothing), so a bench of the queued path must send a new comment id with every request,
and each such body needs its own signature. The comment id is the last value of the body
(`"comment"` is the payload's last key and `"id"` the comment's last key; JSON key order
means nothing to a reader), and the body before it is padded to whole SHA-256 blocks, so
the HMAC's inner and outer hash states after the fixed part can be computed once here;
per request only the last inner block and the outer block remain.

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
import struct
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


COMMENT_ID = 2847120935


def payload(comment_body, n_paragraphs, comment_id=COMMENT_ID):
    owner = user("acme-widgets", 119200311, kind="Organization")
    reporter = user("octo-reporter", 5839201)
    maintainer = user("maintainer-mia", 2210457)
    repo = repository(owner)
    issue_api = f"{repo['url']}/issues/1347"
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
        # Last, so a bench can vary its id cheaply (see the module docstring).
        "comment": {
            "url": comment_api,
            "html_url": f"{repo['html_url']}/issues/1347#issuecomment-{comment_id}",
            "issue_url": issue_api,
            "node_id": "IC_kwDOIsuAks6pszkn",
            "user": maintainer,
            "created_at": "2025-05-02T08:12:44Z",
            "updated_at": "2025-05-02T08:12:44Z",
            "author_association": "MEMBER",
            "body": comment_body,
            "reactions": reactions(comment_api),
            "performed_via_github_app": None,
            # Last, so a bench can vary it cheaply (see the module docstring).
            "id": comment_id,
        },
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


# --- SHA-256 with its state exposed (hashlib keeps it hidden) --------------------------

K = [
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
]
H0 = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]


def _rotr(x, n):
    return ((x >> n) | (x << (32 - n))) & 0xFFFFFFFF


def compress(state, block):
    """One SHA-256 compression of a 64-byte block into the 8-word state."""
    w = list(struct.unpack(">16I", block))
    for i in range(16, 64):
        s0 = _rotr(w[i - 15], 7) ^ _rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
        s1 = _rotr(w[i - 2], 17) ^ _rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
        w.append((w[i - 16] + s0 + w[i - 7] + s1) & 0xFFFFFFFF)
    a, b, c, d, e, f, g, h = state
    for i in range(64):
        t1 = (h + (_rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i]) & 0xFFFFFFFF
        t2 = ((_rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) & 0xFFFFFFFF
        a, b, c, d, e, f, g, h = (t1 + t2) & 0xFFFFFFFF, a, b, c, (d + t1) & 0xFFFFFFFF, e, f, g
    return [(x + y) & 0xFFFFFFFF for x, y in zip(state, [a, b, c, d, e, f, g, h])]


def absorb(state, data):
    assert len(data) % 64 == 0
    for i in range(0, len(data), 64):
        state = compress(state, data[i : i + 64])
    return state


# The comment ids webhook.lua sends: 19 digits, "<run 8><thread 2><counter 9>", the run
# part in [10000000, 90000000) so the id has no leading zero and fits a signed 64-bit int.
ID_DIGITS = 19


def template(body_with_id, secret):
    """The queued body split for per-request signing: (prefix, states, sample).

    prefix: the body up to the comment id's digits, padded with JSON whitespace to whole
    64-byte blocks; the body of a request is prefix + <19 digits> + "}}".
    states: the HMAC inner hash state after (key ^ ipad) + prefix, and the outer hash
    state after (key ^ opad), as 8 hex words each.
    """
    marker = f'"id":{COMMENT_ID}}}}}'.encode()
    assert body_with_id.endswith(marker), "the comment id must be the body's last value"
    head = body_with_id[: -len(marker)]
    # Whitespace between tokens is insignificant: pad after the last comma.
    assert head.endswith(b",")
    pad = (-(len(head) + len(b'"id":'))) % 64
    prefix = head + b" " * pad + b'"id":'
    assert len(prefix) % 64 == 0
    key = secret if len(secret) <= 64 else hashlib.sha256(secret).digest()
    key = key.ljust(64, b"\0")
    inner = absorb(H0, bytes(k ^ 0x36 for k in key) + prefix)
    outer = absorb(H0, bytes(k ^ 0x5C for k in key))
    return prefix, inner, outer


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
        if name == "queued":
            prefix, inner, outer = template(body, secret)
            # A sample id and its signature, so webhook.lua can check its own arithmetic.
            sample_id = "1234567890123456789"
            sample = prefix + sample_id.encode() + b"}}"
            json.loads(sample)  # still JSON
            sample_sig = "sha256=" + hmac.new(secret, sample, hashlib.sha256).hexdigest()
            with open(os.path.join(out, "queued.tpl"), "wb") as f:
                f.write(b" ".join(f"{w:08x}".encode() for w in inner) + b"\n")
                f.write(b" ".join(f"{w:08x}".encode() for w in outer) + b"\n")
                f.write(f"{sample_id} {sample_sig}\n".encode())
                f.write(prefix)


if __name__ == "__main__":
    main()
