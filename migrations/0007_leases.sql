-- kodx schema, version 7: leases. A running run belongs to the process that claimed it
-- until `lease_expires_at` (unix milliseconds), which that process renews while it works.
-- On PostgreSQL, where several `kodx serve` processes share the queue, a run whose lease
-- expired (its process died or stalled) is queued again by whichever process notices;
-- "the process that claimed it is gone" can no longer be read from one machine's pids.
--
-- (Numbered 7: 5 and 6 may be taken by other changes.)
ALTER TABLE runs ADD COLUMN lease_expires_at BIGINT;
