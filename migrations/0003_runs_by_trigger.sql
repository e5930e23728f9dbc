-- One run per trigger: a signed body replayed under a new X-GitHub-Delivery id must not
-- start a second run. The trigger is the comment (`issue_comment`, `review_comment`: the
-- comment's id) or the opened issue (`issue`: its number), in its repository; one comment
-- or issue body holds one command, so the command needs no column of its own here.
--
-- A database written before this migration may already hold replays. They keep their
-- rows: `trigger_copy` is 0 for the first run of a trigger and that run's own `seq` for any
-- later one, so the unique index can be built over the history. Every new run has 0, so a
-- replay conflicts with the first run of its trigger.
ALTER TABLE runs ADD COLUMN trigger_copy BIGINT NOT NULL DEFAULT 0;

UPDATE runs SET trigger_copy = seq
 WHERE seq NOT IN (SELECT MIN(seq) FROM runs GROUP BY repo, trigger_kind, trigger_id);

CREATE UNIQUE INDEX runs_by_trigger ON runs (repo, trigger_kind, trigger_id, trigger_copy);
