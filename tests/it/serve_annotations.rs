//! Annotations on the `kodx` Check Run end to end (SPEC §12): the real `kodx serve`, real
//! containers running the repository's check commands, and the fake GitHub, which holds the
//! `check-runs` create and update requests and each annotation to GitHub's OpenAPI
//! description.
//!
//! - a red check's problems in the repository become the Check Run's annotations, and those
//!   about paths elsewhere (system headers, dependencies, `<stdin>`, `..`, a file the tree
//!   does not hold) do not; a green check's output gives none;
//! - annotations go 50 to a request: the create carries the first 50 and updates the rest;
//! - a Check Run carries at most 200 (one check's 300, or two checks' 150 each), and its
//!   summary says there were more;
//! - an update GitHub refuses is logged, and the run goes on.

use serde_json::{json, Value};

use crate::common;
use crate::common::serve::{text, tool, usage, Served, REPO};

/// `.github/kodx.yml` (and `files`) on `main`, as the base of the next run, with the
/// source files the checks' output names: only files of the tree the checks ran on are
/// annotated.
fn config(s: &Served, yaml: &str, files: &[(&str, &[u8])]) {
    let mut sources: Vec<String> = (1..=300).map(|i| format!("src/f{i}.c")).collect();
    sources.extend(
        [
            "src/widget.c",
            "src/widget.h",
            "src/lib.rs",
            "one.c",
            "two.c",
        ]
        .map(String::from),
    );
    let mut all: Vec<(&str, &[u8], u32)> = vec![(".github/kodx.yml", yaml.as_bytes(), 0o644)];
    all.extend(files.iter().map(|(p, b)| (*p, *b, 0o644)));
    all.extend(
        sources
            .iter()
            .map(|p| (p.as_str(), b"int x;\n".as_slice(), 0o644)),
    );
    s.git.commit_on_branch(REPO, "main", &all, "checks");
}

/// Files an issue, scripts a model that edits one file and ends, and waits for the run.
async fn run(s: &mut Served, issue: u64) -> String {
    s.github.add_issue(REPO, issue, "Change", "", "carol");
    s.model
        .reply(tool("echo a > a.txt"), "tool_use", usage(1000, 10));
    s.model.reply(text("Done."), "end_turn", usage(1100, 10));
    s.comment(issue, "alice", "/kodx code change it").await;
    s.finished_status(issue).await
}

fn annotation(
    path: &str,
    line: u64,
    column: u64,
    level: &str,
    message: &str,
    title: &str,
) -> Value {
    json!({
        "path": path,
        "start_line": line,
        "end_line": line,
        "start_column": column,
        "end_column": column,
        "annotation_level": level,
        "message": message,
        "title": title,
    })
}

const PROBLEMS: &str = "\
In file included from src/widget.c:1:
/usr/include/stdio.h:27:10: note: a system header
src/widget.c:3:5: error: 'x' undeclared (first use in this function)
/workspace/repo/src/widget.h:7:1: warning: no newline at end of file [-Wnewline-eof]
../outside.c:1:1: error: outside the repository
/root/.cargo/registry/src/index.crates.io-0/serde-1.0.0/src/lib.rs:1:1: error: a dependency
<stdin>:1:1: error: standard input
src/generated.c:2:2: error: a file the tree the checks ran on does not hold
./src/lib.rs:1:20: note: defined here
";

#[tokio::test]
async fn a_red_checks_repository_problems_become_the_check_runs_annotations() {
    let _engine = common::require_engine!();
    let mut s = Served::with_run_pages().await;
    config(
        &s,
        "checks:\n  - { name: build, run: \"cat problems.txt; exit 1\" }\n  - { name: lint, run: \"printf '\\\\033[1msrc/lib.rs:1:1:\\\\033[0m W291 trailing whitespace\\\\n'; exit 1\" }\n  - { name: green, run: \"echo 'src/lib.rs:2:1: error: a green check says so'\" }\ncheck_repair: 0\npr: { on_red: open }\n",
        &[("problems.txt", PROBLEMS.as_bytes())],
    );
    let status = run(&mut s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ⚠️ done — checks failing

    > /kodx code change it

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    **Checks** (run by kodx in a fresh sandbox holding only the change):

    | check | result | duration | attempt |
    |---|---|--:|---|
    | build | ❌ failed (exit 1) | [duration] | red after 1 |
    | lint | ❌ failed (exit 1) | [duration] | red after 1 |
    | green | ✅ passed | [duration] | passed in 1 of 1 |

    **Checks still failing:** `build`, `lint`; the pull request was opened anyway (`pr.on_red: open`).

    Done.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">watch the run</a></sub>
    "#));

    let runs = s.github.check_runs();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let cr = &runs[0];
    assert_eq!(cr.body["conclusion"], "failure");
    assert_eq!(
        cr.annotations(),
        [
            annotation(
                "src/widget.c",
                3,
                5,
                "failure",
                "'x' undeclared (first use in this function)",
                "build"
            ),
            annotation(
                "src/widget.h",
                7,
                1,
                "warning",
                "no newline at end of file",
                "-Wnewline-eof"
            ),
            annotation("src/lib.rs", 1, 1, "warning", "trailing whitespace", "W291"),
            annotation("src/lib.rs", 1, 20, "notice", "defined here", "build"),
        ],
        "{:#}",
        cr.body
    );
    assert_eq!(cr.annotation_batches(), [4], "one request: no update");
    let summary = cr.body["output"]["summary"].as_str().unwrap();
    assert!(!summary.contains("not annotated"), "{summary}");
    assert!(s.github.refused().is_empty(), "{:?}", s.github.refused());
    s.finish().await;
}

#[tokio::test]
async fn annotations_go_fifty_to_a_request_and_two_hundred_to_a_check_run() {
    let _engine = common::require_engine!();
    let mut s = Served::with_run_pages().await;
    let many = |n: u32| {
        format!(
            "checks:\n  - {{ name: many, run: \"for i in $(seq 1 {n}); do echo src/f$i.c:$i:1: error: problem $i; done; exit 1\" }}\ncheck_repair: 0\npr: {{ on_red: open }}\n"
        )
    };

    // 120: the create carries 50, then two updates 50 and 20.
    config(&s, &many(120), &[]);
    let status = run(&mut s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ⚠️ done — checks failing

    > /kodx code change it

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    **Checks** (run by kodx in a fresh sandbox holding only the change):

    | check | result | duration | attempt |
    |---|---|--:|---|
    | many | ❌ failed (exit 1) | [duration] | red after 1 |

    **Checks still failing:** `many`; the pull request was opened anyway (`pr.on_red: open`).

    Done.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">watch the run</a></sub>
    "#));
    let runs = s.github.check_runs();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let cr = &runs[0];
    assert_eq!(cr.annotation_batches(), [50, 50, 20]);
    let all = cr.annotations();
    let expected: Vec<Value> = (1..=120)
        .map(|i| {
            let path = format!("src/f{i}.c");
            annotation(&path, i, 1, "failure", &format!("problem {i}"), "many")
        })
        .collect();
    assert_eq!(all, expected);
    // Each update says the run's output again, as an update's output must.
    for update in &cr.updates {
        assert_eq!(update["output"]["title"], cr.body["output"]["title"]);
        assert_eq!(update["output"]["summary"], cr.body["output"]["summary"]);
        assert_eq!(
            update.as_object().unwrap().len(),
            1,
            "output only: {update}"
        );
    }
    let summary = cr.body["output"]["summary"].as_str().unwrap();
    assert!(!summary.contains("not annotated"), "{summary}");

    // 300: 200 in all, in four requests, and the summary says there were more.
    config(&s, &many(300), &[]);
    run(&mut s, 8).await;
    let runs = s.github.check_runs();
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let cr = &runs[1];
    assert_eq!(cr.annotation_batches(), [50, 50, 50, 50]);
    let all = cr.annotations();
    assert_eq!(all.len(), 200);
    assert_eq!(all[199]["path"], "src/f200.c");
    let summary = cr.body["output"]["summary"].as_str().unwrap();
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(summary, @"
    | check | result | duration | attempt |
    |---|---|--:|---|
    | many | ❌ failed (exit 1) | [duration] | red after 1 |

    The run's steps: https://kodx.example.com/runs/[hex]?token=[hex]

    kodx annotated 200 problems read from the red checks' output, as many as it adds to a Check Run; the output tells of more, not annotated.
    "));

    // Two checks of 150 each: 200 in all, and the summary says how many more.
    config(
        &s,
        "checks:\n  - { name: one, run: \"for i in $(seq 1 150); do echo one.c:$i:1: error: one $i; done; exit 1\" }\n  - { name: two, run: \"for i in $(seq 1 150); do echo two.c:$i:1: error: two $i; done; exit 1\" }\ncheck_repair: 0\npr: { on_red: open }\n",
        &[],
    );
    run(&mut s, 9).await;
    let runs = s.github.check_runs();
    assert_eq!(runs.len(), 3, "{runs:#?}");
    let cr = &runs[2];
    assert_eq!(cr.annotation_batches(), [50, 50, 50, 50]);
    let all = cr.annotations();
    assert_eq!(
        (&all[149]["message"], &all[150]["message"]),
        (&json!("one 150"), &json!("two 1"))
    );
    assert_eq!(all[199]["message"], "two 50");
    let summary = cr.body["output"]["summary"].as_str().unwrap();
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(summary, @"
    | check | result | duration | attempt |
    |---|---|--:|---|
    | one | ❌ failed (exit 1) | [duration] | red after 1 |
    | two | ❌ failed (exit 1) | [duration] | red after 1 |

    The run's steps: https://kodx.example.com/runs/[hex]?token=[hex]

    kodx annotated 200 problems read from the red checks' output, as many as it adds to a Check Run; the output tells of 100 more, not annotated.
    "));
    assert!(s.github.refused().is_empty(), "{:?}", s.github.refused());

    // An update GitHub refuses is logged; the rest are not sent, and the run is not failed.
    config(&s, &many(120), &[]);
    s.github
        .fail_next(&format!("/repos/{REPO}/check-runs/"), 422, 1);
    let status = run(&mut s, 10).await;
    let runs = s.github.check_runs();
    assert_eq!(runs.len(), 4, "{runs:#?}");
    assert_eq!(runs[3].annotation_batches(), [50]);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ⚠️ done — checks failing

    > /kodx code change it

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/11

    **Checks** (run by kodx in a fresh sandbox holding only the change):

    | check | result | duration | attempt |
    |---|---|--:|---|
    | many | ❌ failed (exit 1) | [duration] | red after 1 |

    **Checks still failing:** `many`; the pull request was opened anyway (`pr.on_red: open`).

    Done.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">watch the run</a></sub>
    "#));
    assert!(!status.contains("could not add"), "{status}");
    assert!(
        s.log()
            .contains("adding annotations to the check run failed; the rest are not sent"),
        "{}",
        s.log()
    );
    s.finish().await;
}
