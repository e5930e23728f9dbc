-- kodx schema, version 14: failed GitHub Actions jobs re-run once before a CI repair is
-- paid for (SPEC §12, "Mergeable pull requests").
--
-- One row per failing head commit of a pull request kodx opened, taken atomically by the
-- first repair run that finds Actions jobs failed there: `jobs` the ids of the failed jobs
-- it re-ran (comma-separated; a re-run gives each job a new id, so a failure of one of
-- these ids is the old result, not the re-run's), `outcome` `rerun`, `refused` when the
-- App may not re-run jobs (no Actions write permission; kodx repairs as before and says so
-- once per pull request), or `failed` when GitHub did not take the re-run for another
-- reason (kodx repairs as before).
CREATE TABLE ci_reruns (
    repo        TEXT NOT NULL,
    pull        BIGINT NOT NULL,
    commit_sha  TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    jobs        TEXT NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('rerun', 'refused', 'failed')),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (repo, pull, commit_sha)
);
