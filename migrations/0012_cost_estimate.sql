-- kodx schema, version 12: the cost estimate shown when a run is acknowledged (SPEC §12,
-- "Quote and confirmation"). It reads the last 20 runs of one repository and kind that ran
-- the agent (succeeded or failed after at least one model call), newest first; this index
-- holds exactly those runs in that order, so the read stays a short index walk however
-- many runs the database keeps.
CREATE INDEX runs_cost_history ON runs (repo, kind, finished_at, seq)
    WHERE status IN ('succeeded', 'failed') AND api_calls > 0;
