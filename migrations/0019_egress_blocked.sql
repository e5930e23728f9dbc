-- kodx schema, version 19: what kodx's egress proxy refused for a run (SPEC §12, "Egress
-- by name"): a JSON list of {host, port, count, first_ms, why, suggestion}, at most 100
-- entries, shown on the run page. NULL: the run did not go through the proxy.
ALTER TABLE runs ADD COLUMN egress_blocked TEXT;
