-- kodx schema, version 4: the installation's own id, and pruning transcripts by age.
--
-- (Numbered 4, not 3, so it cannot collide with another change's migration 3 on merge;
-- sqlx applies versions in order and allows gaps.)

-- Settings kodx keeps about itself. `instance`: a random id drawn when the database is
-- created, labelling this installation's sandbox containers, so that two installations (or
-- test runs) sharing one Docker engine never remove each other's containers.
CREATE TABLE kodx_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- When the transcript of a finished run was deleted for its age (`transcript_days`); the
-- run's row (status, cost, tokens, result) stays.
ALTER TABLE runs ADD COLUMN transcript_pruned_at BIGINT;

-- Finished runs by age, for pruning.
CREATE INDEX runs_by_finished_at ON runs (finished_at);
