-- kodx schema, version 15: pull requests kept mergeable (SPEC §12, "Mergeable pull
-- requests").
--
-- `merge` runs are agent work like `code`: one at a time per pull request.
DROP INDEX runs_one_running_per_issue;
CREATE UNIQUE INDEX runs_one_running_per_issue ON runs (repo, issue_number)
    WHERE status = 'running'
      AND kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge');

-- The base branch of each pull request kodx opened, so that a `push` to a branch finds the
-- pull requests it may have made conflicted without asking GitHub. `closed_at` is set when
-- kodx finds the pull request closed; it is not looked at again.
CREATE TABLE pull_bases (
    repo        TEXT NOT NULL,
    pull        BIGINT NOT NULL,
    base        TEXT NOT NULL,
    closed_at   BIGINT,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (repo, pull)
);
CREATE INDEX pull_bases_by_base ON pull_bases (repo, base);

-- GitHub's `mergeable_state` of the pull request, as a merge run (or `/kodx update`) read
-- it when it decided: shown on the run page.
ALTER TABLE runs ADD COLUMN mergeable_state TEXT;
