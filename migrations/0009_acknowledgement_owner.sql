-- kodx schema, version 9: who acknowledges a run. On PostgreSQL several `kodx serve`
-- processes see the same queued run; each would react `eyes` and post a status comment
-- for it while it waits. `acked_by` (a process's worker id) is taken atomically by the
-- first process that acknowledges the run, so a command is acknowledged once across
-- processes; the others wait for its status comment.
ALTER TABLE runs ADD COLUMN acked_by TEXT;
