-- kodx schema, version 10: the Docker engine a running run's sandbox is on. Several
-- `kodx serve` processes may place runs on the same engines; an engine's `max_runs` is
-- checked against the running runs placed there, in the database, so two processes placing
-- at the same moment cannot both take its last slot.
ALTER TABLE runs ADD COLUMN engine TEXT;
CREATE INDEX runs_running_by_engine ON runs (engine) WHERE status = 'running';
