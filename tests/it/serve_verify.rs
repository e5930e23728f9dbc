//! Verification apart from the agent (SPEC §12), end to end on the real engine: the checks
//! run in a fresh sandbox holding the starting commit and exactly the change set kodx
//! commits, never in the agent's container.
//!
//! - an agent that shadows `grep`, edits its shell's startup files, leaves a process
//!   running or plants files outside the change set (ignored files, `/tmp`) cannot turn a
//!   red check green;
//! - what the change set holds (edits, deletions, a new executable, a symlink) is exactly
//!   what the checks see, and what is delivered;
//! - a change that edits the tests a check depends on passes, but never plainly: the
//!   table, the pull request, the status comment and a `neutral` Check Run say so.

use crate::common;
use crate::common::serve::{text, tool, usage, Served, REPO};

fn repository(s: &Served, yaml: &str) {
    s.git.commit_on_branch(
        REPO,
        "main",
        &[
            (".github/kodx.yml", yaml.as_bytes(), 0o644),
            (".gitignore", b"build/\n", 0o644),
            ("src/main.py", b"print('broken')\n", 0o644),
            ("old.txt", b"old\n", 0o644),
            ("tests/run.sh", b"grep -q fixed src/main.py\n", 0o755),
            (
                "tests/all.sh",
                b"grep -q fixed src/main.py && test ! -e old.txt && ./run.sh && test \"$(readlink link)\" = src/main.py && test ! -e build/x\n",
                0o755,
            ),
        ],
        "repository",
    );
}

#[tokio::test]
async fn an_agent_that_tampers_with_its_own_container_cannot_turn_a_red_check_green() {
    let _engine = common::require_engine!();
    let mut s = Served::with_run_pages().await;
    repository(
        &s,
        concat!(
            "checks:\n",
            "  - { name: grep, run: grep -q fixed src/main.py }\n",
            "  - { name: login, run: \"bash -lc 'grep -q fixed src/main.py'\" }\n",
            "  - { name: daemon, run: \"for p in /proc/[0-9]*/cmdline; do tr '\\\\0' ' ' < $p; echo; done | grep -q '^kodx-daemon'\" }\n",
            "  - { name: ignored, run: test -f build/ok }\n",
            "  - { name: tmp, run: test -f /tmp/ok }\n",
            "check_repair: 0\n",
            "pr: { on_red: draft }\n",
        ),
    );
    s.github.add_issue(REPO, 7, "Fix main", "", "carol");
    // Each tamper, and a real (if useless) change so there is something to deliver.
    let tampers = [
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/grep && chmod +x /usr/local/bin/grep && hash -r",
        "printf 'exit 0\\n' > ~/.bash_profile && printf 'exit 0\\n' >> ~/.bashrc && printf 'exit 0\\n' >> /etc/profile",
        "(exec -a kodx-daemon sleep 1000 &) ; sleep 0.2",
        "mkdir -p build && touch build/ok /tmp/ok",
        "echo '# touched' >> src/main.py",
    ];
    for (i, t) in tampers.iter().enumerate() {
        s.model
            .reply(tool(t), "tool_use", usage(1000 + i as u64, 10));
    }
    s.model
        .reply(text("All checks pass here."), "end_turn", usage(2000, 10));
    s.comment(7, "alice", "/kodx code fix main").await;
    let status = s.finished_status(7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ⚠️ done — checks failing

    > /kodx code fix main

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    **Checks** (run by kodx in a fresh sandbox holding only the change):

    | check | result | duration | attempt |
    |---|---|--:|---|
    | grep | ❌ failed (exit 1); edits `src/main.py` | [duration] | red after 1 |
    | login | ❌ failed (exit 1); edits `src/main.py` | [duration] | red after 1 |
    | daemon | ❌ failed (exit 1) | [duration] | red after 1 |
    | ignored | ❌ failed (exit 1) | [duration] | red after 1 |
    | tmp | ❌ failed (exit 1) | [duration] | red after 1 |

    **Checks still failing:** `grep`, `login`, `daemon`, `ignored`, `tmp`; the pull request is a draft until they pass (`pr.on_red: draft`).

    ⚠️ **The change edits what the checks depend on.** This change edits `src/main.py`, which the checks depend on: a pass proves less than usual. Review those edits first.

    All checks pass here.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 6 | 7,010 | 60 | 0 | 0 | $0.0219 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">watch the run</a></sub>
    "#));
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert!(pulls[0].draft, "red checks make a draft");
    let runs = s.github.check_runs();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].body["conclusion"], "failure");
    assert_eq!(runs[0].body["output"]["title"], "5 of 5 checks failed");
    // The tampering stayed in the agent's container: the commit holds only the change.
    let files = s.git.changed_files(REPO, &pulls[0].head);
    assert_eq!(files, ["src/main.py"], "{files:?}");
    s.finish().await;
}

#[tokio::test]
async fn the_checks_see_exactly_the_change_set_that_is_delivered() {
    let _engine = common::require_engine!();
    let mut s = Served::with_run_pages().await;
    repository(
        &s,
        concat!(
            "checks:\n",
            "  - { name: change, run: sh tests/all.sh }\n",
            "check_repair: 0\n",
        ),
    );
    s.github.add_issue(REPO, 7, "Fix main", "", "carol");
    s.model.reply(
        tool("echo \"print('fixed')\" > src/main.py && rm old.txt && printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod +x run.sh && ln -s src/main.py link && mkdir -p build && touch build/x"),
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(text("Fixed."), "end_turn", usage(1100, 10));
    s.comment(7, "alice", "/kodx code fix main").await;
    let status = s.finished_status(7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done

    > /kodx code fix main

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    **Checks** (run by kodx in a fresh sandbox holding only the change):

    | check | result | duration | attempt |
    |---|---|--:|---|
    | change | ✅ passed | [duration] | passed in 1 of 1 |

    Fixed.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">watch the run</a></sub>
    "#));
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1);
    assert!(!pulls[0].draft);
    let files = s.git.changed_files(REPO, &pulls[0].head);
    assert_eq!(
        files,
        ["link", "old.txt", "run.sh", "src/main.py"],
        "{files:?}"
    );
    assert_eq!(s.github.check_runs()[0].body["conclusion"], "success");
    s.finish().await;
}

#[tokio::test]
async fn a_pass_over_edited_tests_is_called_out_everywhere() {
    let _engine = common::require_engine!();
    let mut s = Served::with_run_pages().await;
    repository(
        &s,
        "checks:\n  - { name: tests, run: sh tests/run.sh }\n  - { name: main, run: python3 -c 1 || true }\ncheck_repair: 0\n",
    );
    s.github.add_issue(REPO, 7, "Fix main", "", "carol");
    // The quiet way to green: the test itself made to pass.
    s.model.reply(
        tool("echo 'exit 0' > tests/run.sh && echo '# note' >> src/main.py"),
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(text("Fixed."), "end_turn", usage(1100, 10));
    s.comment(7, "alice", "/kodx code fix main").await;
    let status = s.finished_status(7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(status, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ⚠️ done — checks passed over edited tests

    > /kodx code fix main

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    **Checks** (run by kodx in a fresh sandbox holding only the change):

    | check | result | duration | attempt |
    |---|---|--:|---|
    | tests | ⚠️ passed over edited tests: `tests/run.sh` | [duration] | passed in 1 of 1 |
    | main | ⚠️ passed over edited tests: `tests/run.sh` | [duration] | passed in 1 of 1 |

    ⚠️ **The checks passed over edited tests.** This change edits `tests/run.sh`, which the checks depend on: a pass proves less than usual. Review those edits first.

    Fixed.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">watch the run</a></sub>
    "#));
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1);
    // The globs guard every check; the files a command names guard that check.
    let body = &pulls[0].body;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    Fixed.

    **Checks** (run by kodx in a fresh sandbox holding only the change):

    | check | result | duration | attempt |
    |---|---|--:|---|
    | tests | ⚠️ passed over edited tests: `tests/run.sh` | [duration] | passed in 1 of 1 |
    | main | ⚠️ passed over edited tests: `tests/run.sh` | [duration] | passed in 1 of 1 |

    ⚠️ **The checks passed over edited tests.** This change edits `tests/run.sh`, which the checks depend on: a pass proves less than usual. Review those edits first.

    Closes #7

    Requested by @alice with `/kodx code`.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |


    <sub>kodx run <code>[run]</code> · <a href="https://kodx.example.com/runs/[hex]?token=[hex]">the run's steps</a></sub>
    "#));
    let runs = s.github.check_runs();
    assert_eq!(runs.len(), 1);
    let cr = &runs[0].body;
    assert_eq!(cr["conclusion"], "neutral");
    assert_eq!(
        cr["output"]["title"],
        "2 of 2 checks passed, 2 over edited tests"
    );
    let text = cr["output"]["text"].as_str().unwrap();
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(text, @"
    ### tests — passed

    `sh tests/run.sh`

    Edited files this check depends on: `tests/run.sh`

    ```text

    ```

    ### main — passed

    `python3 -c 1 || true`

    Edited files this check depends on: `tests/run.sh`

    ```text

    ```
    ")
    });
    assert!(s.github.refused().is_empty(), "{:?}", s.github.refused());
    s.finish().await;
}
