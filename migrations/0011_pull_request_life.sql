-- kodx schema, version 11: the pull request's life after it opens (SPEC §11).
--
-- `address_reviews` and `repair` runs are agent work like `code`: one at a time per issue
-- or pull request.
DROP INDEX runs_one_running_per_issue;
CREATE UNIQUE INDEX runs_one_running_per_issue ON runs (repo, issue_number)
    WHERE status = 'running' AND kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair');

-- Every commit kodx made the head of a pull request: when it opened the pull request
-- (`opened` = 1) or pushed to its branch. CI repair acts only on pull requests kodx opened,
-- and only while their head is one of these commits (a push by anyone else ends it).
CREATE TABLE pull_commits (
    repo        TEXT NOT NULL,
    pull        BIGINT NOT NULL,
    commit_sha  TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    opened      BIGINT NOT NULL CHECK (opened IN (0, 1)),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (repo, pull, commit_sha)
);

-- One repair per failing head commit, taken atomically by the run that repairs it (a
-- `check_suite` and a `workflow_run` event about the same commit are one trigger), with
-- the failure's signature (a failure that repeats unchanged stops repairing) and the
-- failure report the repair run is given. A commit kodx decided not to repair (its limit
-- reached, the failure repeated) is recorded too, with `repaired` = 0, so that decision is
-- said once.
CREATE TABLE repairs (
    repo        TEXT NOT NULL,
    pull        BIGINT NOT NULL,
    commit_sha  TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    signature   TEXT NOT NULL,
    repaired    BIGINT NOT NULL CHECK (repaired IN (0, 1)),
    report      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (repo, pull, commit_sha)
);
