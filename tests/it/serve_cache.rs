//! The repository cache in `kodx serve` (issue 11), end to end: the real `kodx serve`, a
//! fake GitHub, a real git server (`git http-backend`), a scripted model and the real
//! Docker engine. A run's clone comes from one bare mirror per repository, refreshed by
//! incremental fetches; the tree goes into the container from git objects, and the change is
//! committed onto the checked-out commit without a host work tree.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;
use crate::common::fake_anthropic::Scripted;
use crate::common::serve::{text, tool, usage, BranchPull, Options, Served, REPO};
use serde_json::{json, Value};

fn mirror(s: &Served) -> PathBuf {
    s.dir.path().join("mirrors/acme/widgets.git")
}

/// The runs' clones left in the server's temporary directory or beside the mirrors.
fn clones_left(s: &Served) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for dir in [s.dir.path().join("tmp"), s.dir.path().join("mirrors/.runs")] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            left.extend(entries.flatten().map(|e| e.path()).filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("kodx-run-")
            }));
        }
    }
    left
}

/// The pack files of a bare repository, and the objects each holds.
fn packs(bare: &Path) -> Vec<(String, usize)> {
    let dir = bare.join("objects/pack");
    let mut out: Vec<(String, usize)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    let stem = name.strip_suffix(".idx")?.to_string();
                    let listed = std::process::Command::new("git")
                        .args(["show-index"])
                        .stdin(std::fs::File::open(e.path()).unwrap())
                        .output()
                        .unwrap();
                    assert!(listed.status.success());
                    Some((
                        stem,
                        listed
                            .stdout
                            .split(|b| *b == b'\n')
                            .filter(|l| !l.is_empty())
                            .count(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `git-upload-pack` POSTs (a download of objects) the git server has seen.
fn downloads(s: &Served) -> usize {
    s.git
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path_and_query.contains("git-upload-pack"))
        .count()
}

async fn result_of(s: &Served, run_id: &str) -> Value {
    let db = kodx::db::Db::open(&format!(
        "sqlite://{}",
        s.dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let result = loop {
        let run = db.get_run(run_id).await.unwrap().unwrap();
        if run.status.is_final() {
            break run.result.unwrap_or_default();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the run never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    db.close().await;
    serde_json::from_str(&result).unwrap()
}

/// `/kodx code <request>` on issue `number`, which writes `file` with `contents`; waits
/// for the run's end and returns its id and its stored result.
async fn code_run(s: &Served, number: u64, file: &str, contents: &str) -> (String, Value) {
    s.model.reply(
        tool(&format!(
            "cat README.md > seen-{file}; echo {contents} > {file}"
        )),
        "tool_use",
        usage(1000, 10),
    );
    s.model
        .reply(text(&format!("Wrote {file}.")), "end_turn", usage(1100, 10));
    let run = s
        .comment(number, "alice", &format!("/kodx code write {file}"))
        .await;
    let result = result_of(s, &run.0).await;
    (run.0, result)
}

fn phases(result: &Value) -> Vec<String> {
    result["timings_ms"]
        .as_object()
        .unwrap_or_else(|| panic!("no timings: {result}"))
        .keys()
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_second_run_fetches_only_what_the_mirror_lacks() {
    let _engine = common::require_engine!();
    let s = Served::with_workers().await;
    for n in [7, 8, 9] {
        s.github.add_issue(REPO, n, "Write", "", "carol");
    }

    // First run: the mirror is made (an issue's run needs only the tip: a shallow
    // clone of it, one commit deep).
    let (first, result) = code_run(&s, 7, "one.txt", "one").await;
    assert_eq!(
        s.github.created_pulls(REPO).len(),
        1,
        "{result}\n{}",
        s.log()
    );
    let p = phases(&result);
    insta::assert_snapshot!(p.join(" "), @"agent checkout clone commit container export prepare pull_request push");
    assert!(!p.contains(&"fetch".into()), "{p:?}");
    let after_first = packs(&mirror(&s));
    assert!(!after_first.is_empty(), "the mirror holds the tip");
    assert_eq!(
        std::fs::read_to_string(mirror(&s).join("shallow")).unwrap(),
        format!("{}\n", s.git.branch_sha(REPO, "main").unwrap()),
        "the mirror is shallow"
    );
    let branch = format!("kodx/issue-7-{}", &first[..8]);
    assert_eq!(s.git.file_at(REPO, &branch, "one.txt").unwrap(), b"one\n");

    // Someone pushes to main; the second run fetches that and nothing else.
    s.git.commit_on_branch(
        REPO,
        "main",
        &[("README.md", b"# widgets, second edition\n", 0o644)],
        "second edition",
    );
    let main = s.git.branch_sha(REPO, "main").unwrap();
    let before = downloads(&s);
    let (second, result) = code_run(&s, 8, "two.txt", "two").await;
    assert_eq!(
        s.github.created_pulls(REPO).len(),
        2,
        "{result}\n{}",
        s.log()
    );
    let p = phases(&result);
    assert!(
        p.contains(&"fetch".into()) && !p.contains(&"clone".into()),
        "{p:?}"
    );
    // A depth-1 fetch over stateless HTTP is two requests: the shallow list, then the
    // pack.
    assert_eq!(downloads(&s) - before, 2, "one fetch of the new objects");
    let after_second = packs(&mirror(&s));
    let new: Vec<_> = after_second
        .iter()
        .filter(|p| !after_first.contains(p))
        .collect();
    assert_eq!(
        new.len(),
        1,
        "one new pack: {after_first:?} → {after_second:?}"
    );
    // The new commit, its tree and the changed README: nothing the mirror had.
    assert!(
        new[0].1 <= 3,
        "the fetch brought only the new objects: {new:?}"
    );
    // The run worked on the new main, and its branch sits on it.
    let branch = format!("kodx/issue-8-{}", &second[..8]);
    assert_eq!(s.git.ref_sha(REPO, &format!("{branch}~1")).unwrap(), main);
    assert_eq!(
        s.git.file_at(REPO, &branch, "seen-two.txt").unwrap(),
        b"# widgets, second edition\n",
        "the container had the new README"
    );
    assert_eq!(s.git.file_at(REPO, &branch, "two.txt").unwrap(), b"two\n");
    let tree: Vec<String> = s
        .git
        .ls_tree(REPO, &format!("refs/heads/{branch}"))
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert!(!tree.contains(&"one.txt".to_string()), "{tree:?}");
    let streamed = |s: &Served| {
        s.log()
            .matches("streamed the repository's ready checkout")
            .count()
    };
    assert_eq!(streamed(&s), 0, "a new tip is packed: {}", s.log());

    // Nothing new on the server: the third run downloads nothing at all.
    let before = downloads(&s);
    let (third, result) = code_run(&s, 9, "three.txt", "three").await;
    assert_eq!(
        s.github.created_pulls(REPO).len(),
        3,
        "{result}\n{}",
        s.log()
    );
    assert_eq!(downloads(&s), before, "the mirror was up to date");
    assert_eq!(packs(&mirror(&s)), after_second);
    // The same tip as the second run: its packed tar is streamed, and the run saw main.
    assert_eq!(streamed(&s), 1, "{}", s.log());
    let third = format!("kodx/issue-9-{}", &third[..8]);
    assert_eq!(
        s.git.file_at(REPO, &third, "seen-three.txt").unwrap(),
        b"# widgets, second edition\n"
    );
    let ready = s.dir.path().join("mirrors/.ready/acme/widgets");
    let kept = std::fs::read_dir(&ready).unwrap().flatten().count();
    assert_eq!(kept, 2, "the two tips' ready checkouts");
    assert!(clones_left(&s).is_empty(), "{:?}", clones_left(&s));
}

#[tokio::test]
async fn a_pull_request_run_whose_head_moved_works_on_the_new_head() {
    let _engine = common::require_engine!();
    let s = Served::with_workers().await;
    let head = s.git.commit_on_branch(
        REPO,
        "feature",
        &[("feature.txt", b"v1\n", 0o644)],
        "feature",
    );
    let base = s.git.branch_sha(REPO, "main").unwrap();
    s.git
        .commit(REPO, "refs/pull/8/head", Some(&head), &[], "same");
    s.add_branch_pull(BranchPull {
        number: 8,
        title: "Feature",
        body: "Adds feature.txt",
        author: "alice",
        branch: "feature",
        head: &head,
        base: &base,
        diff: "+v1\n",
    });
    let one = |file: &str| {
        s.model.reply(
            tool(&format!("cat feature.txt > seen-{file}; echo x > {file}")),
            "tool_use",
            usage(1000, 10),
        );
        s.model
            .reply(text(&format!("Wrote {file}.")), "end_turn", usage(1100, 10));
    };
    one("a.txt");
    let run = s.comment(8, "alice", "/kodx code write a.txt").await;
    let result = result_of(&s, &run.0).await;
    let pushed = s.git.branch_sha(REPO, "feature").unwrap();
    assert_eq!(
        s.git.ref_sha(REPO, "feature~1").unwrap(),
        head,
        "{result}\n{}",
        s.log()
    );

    // The author pushes on top of kodx's commit; the next run starts from that head.
    let moved = s.git.commit(
        REPO,
        "refs/heads/feature",
        Some(&pushed),
        &[("feature.txt", b"v3\n", 0o644)],
        "v3",
    );
    let before = downloads(&s);
    one("b.txt");
    let run = s.comment(8, "alice", "/kodx code write b.txt").await;
    let result = result_of(&s, &run.0).await;
    assert_eq!(downloads(&s) - before, 1, "{result}");
    insta::assert_snapshot!(phases(&result).join(" "), @"agent checkout commit container export fetch prepare push");
    assert_eq!(
        s.git.ref_sha(REPO, "feature~1").unwrap(),
        moved,
        "{result}\n{}",
        s.log()
    );
    assert_eq!(
        s.git.file_at(REPO, "feature", "seen-b.txt").unwrap(),
        b"v3\n",
        "the container had the moved head"
    );
    assert_eq!(s.git.file_at(REPO, "feature", "a.txt").unwrap(), b"x\n");
    assert_eq!(s.git.file_at(REPO, "feature", "b.txt").unwrap(), b"x\n");
}

/// An issue's run gets a `.git` of the tip alone in its container (a shallow repository:
/// no history to copy in), in which git works as in any clone: `git status` is clean,
/// `git diff` sees the agent's change, `git log -1` names the tip, `git fsck` passes. The
/// pull request's commit sits on the tip. A later run on a pull request of the same
/// repository gets the whole history (the mirror is deepened for it).
#[tokio::test]
async fn an_issue_run_gets_the_tip_alone_and_git_works_in_it() {
    let _engine = common::require_engine!();
    let s = Served::with_workers().await;
    for i in 2..=4 {
        let text = format!("# widgets {i}\n");
        s.git.commit_on_branch(
            REPO,
            "main",
            &[("README.md", text.as_bytes(), 0o644)],
            &format!("edition {i}"),
        );
    }
    let main = s.git.branch_sha(REPO, "main").unwrap();
    let commits = s.git.commit_count(REPO, "main");
    assert!(commits >= 4);
    s.github.add_issue(REPO, 7, "Look", "", "carol");
    let script = "git log --format=%H > /tmp/log; git status --porcelain > /tmp/status; \
         echo more >> README.md; git diff --stat > /tmp/diff; \
         git log -1 --format=%H > /tmp/one; cat .git/shallow > /tmp/shallow; \
         (git fsck --no-dangling; echo exit=$?) > /tmp/fsck 2>&1; \
         cp /tmp/log log.txt; cp /tmp/status status.txt; cp /tmp/diff diff.txt; \
         cp /tmp/one one.txt; cp /tmp/shallow shallow.txt; cp /tmp/fsck fsck.txt";
    s.model.reply(tool(script), "tool_use", usage(1000, 10));
    s.model.reply(text("Looked."), "end_turn", usage(1100, 10));
    let run = s.comment(7, "alice", "/kodx code look at git").await;
    let result = result_of(&s, &run.0).await;
    let branch = format!("kodx/issue-7-{}", &run.0[..8]);
    let file = |name: &str| {
        String::from_utf8(
            s.git
                .file_at(REPO, &branch, name)
                .unwrap_or_else(|| panic!("no {name}: {result}\n{}", s.log())),
        )
        .unwrap()
    };
    assert_eq!(
        file("log.txt"),
        format!("{main}\n"),
        "the history is the tip"
    );
    assert_eq!(file("one.txt"), format!("{main}\n"));
    assert_eq!(file("shallow.txt"), format!("{main}\n"));
    assert_eq!(file("status.txt"), "", "a clean work tree");
    insta::assert_snapshot!(file("diff.txt"), @"
    README.md | 1 +
    1 file changed, 1 insertion(+)
    ");
    assert!(
        file("fsck.txt").ends_with("exit=0\n"),
        "{}",
        file("fsck.txt")
    );
    assert_eq!(s.git.ref_sha(REPO, &format!("{branch}~1")).unwrap(), main);
    assert_eq!(s.git.commit_count(REPO, &branch), commits + 1);
    assert!(mirror(&s).join("shallow").exists());

    // A pull request's run needs the history: the mirror is deepened, and its container
    // has all of it.
    let run = s.code_run_counting_a_pulls_commits(8, &main).await;
    let result = result_of(&s, &run.0).await;
    let count = s
        .git
        .file_at(REPO, "feature", "count.txt")
        .unwrap_or_else(|| panic!("no count.txt: {result}\n{}", s.log()));
    assert_eq!(
        String::from_utf8(count).unwrap().trim(),
        (commits + 1).to_string()
    );
    assert!(
        !mirror(&s).join("shallow").exists(),
        "the mirror was deepened"
    );
}

/// Both runs of a repository at once: each reads its request from the model's prompt and
/// writes its own file; each pull request holds exactly its own file.
#[tokio::test]
async fn two_concurrent_runs_on_one_repository_each_open_their_own_pull_request() {
    let _engine = common::require_engine!();
    let s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\nmax_concurrent_runs = 2\n"),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Alpha", "", "carol");
    s.github.add_issue(REPO, 8, "Beta", "", "carol");
    for _ in 0..4 {
        s.model.push(Scripted::Dynamic(Box::new(|req: &Value| {
            let all = req.to_string();
            let which = if all.contains("write-alpha") {
                "alpha"
            } else {
                "beta"
            };
            let answered = req["messages"]
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m["content"].as_array())
                .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"));
            let (content, stop) = if answered {
                (text(&format!("Wrote {which}.txt.")), "end_turn")
            } else {
                (
                    // Slow enough that both containers are up at once.
                    tool(&format!("sleep 1; echo {which} > {which}.txt")),
                    "tool_use",
                )
            };
            json!({
                "id": format!("msg_{}", rand::random::<u32>()),
                "type": "message", "role": "assistant",
                "model": "claude-sonnet-4-5-20250929",
                "content": content, "stop_reason": stop, "stop_sequence": null,
                "usage": usage(1000, 10),
            })
        })));
    }
    let (a, b) = tokio::join!(
        s.comment(7, "alice", "/kodx code write-alpha"),
        s.comment(8, "alice", "/kodx code write-beta")
    );
    let (ra, rb) = tokio::join!(result_of(&s, &a.0), result_of(&s, &b.0));
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 2, "{ra}\n{rb}\n{}", s.log());
    for (run, issue, mine, theirs) in [(&a, 7, "alpha", "beta"), (&b, 8, "beta", "alpha")] {
        let branch = format!("kodx/issue-{issue}-{}", &run.0[..8]);
        assert!(pulls.iter().any(|p| p.head == branch), "{pulls:#?}");
        let tree: Vec<String> = s
            .git
            .ls_tree(REPO, &format!("refs/heads/{branch}"))
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        assert!(tree.contains(&format!("{mine}.txt")), "{tree:?}");
        assert!(!tree.contains(&format!("{theirs}.txt")), "{tree:?}");
        assert_eq!(
            s.git
                .file_at(REPO, &branch, &format!("{mine}.txt"))
                .unwrap(),
            format!("{mine}\n").into_bytes()
        );
    }
    assert!(mirror(&s).is_dir());
    assert!(clones_left(&s).is_empty(), "{:?}", clones_left(&s));
}

#[tokio::test]
async fn with_the_cache_off_a_run_clones_as_before() {
    let _engine = common::require_engine!();
    let s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\nrepo_cache_max_bytes = 0\n"),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Write", "", "carol");
    let (run, result) = code_run(&s, 7, "one.txt", "one").await;
    assert_eq!(
        s.github.created_pulls(REPO).len(),
        1,
        "{result}\n{}",
        s.log()
    );
    let p = phases(&result);
    insta::assert_snapshot!(p.join(" "), @"agent clone commit container export prepare pull_request push");
    assert!(
        !p.contains(&"checkout".into()) && !p.contains(&"fetch".into()),
        "{p:?}"
    );
    assert!(!s.dir.path().join("mirrors").exists(), "no mirror was made");
    let branch = format!("kodx/issue-7-{}", &run[..8]);
    assert_eq!(s.git.file_at(REPO, &branch, "one.txt").unwrap(), b"one\n");
    assert_eq!(
        s.git.file_at(REPO, &branch, "seen-one.txt").unwrap(),
        b"# widgets\n"
    );
    assert!(clones_left(&s).is_empty(), "{:?}", clones_left(&s));
}
