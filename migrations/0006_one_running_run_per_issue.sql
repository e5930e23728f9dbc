-- kodx schema, version 6: at most one agent run (`ask`, `code`, `continue`) running per issue, enforced
-- by the database itself, so it holds for every `kodx serve` process sharing the queue
-- (PostgreSQL), not only inside one process. The claim already picks only the oldest
-- queued run of an issue with none running; this index makes a second one impossible.
--
-- (Numbered 6, not 5, so it cannot collide with another change's migration 5 on merge.)
CREATE UNIQUE INDEX runs_one_running_per_issue ON runs (repo, issue_number)
    WHERE status = 'running' AND kind IN ('ask', 'code', 'continue');
