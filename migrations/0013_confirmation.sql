-- kodx schema, version 13: runs that wait for a writer's `/kodx go` (SPEC §12, "Quote and
-- confirmation").
--
-- A run whose estimate is above the repository's `confirm_above_usd` stays `queued` with
-- `held_until` set: no worker claims it, and once that time has passed any process ends
-- it. `/kodx go` clears `held_until`, keeps who confirmed it and the lower cap asked for
-- (`/kodx go $N`). `estimate` is the status comment's estimate line as the acknowledgement
-- made it, so every later edit of the comment (by any process) shows it again.
ALTER TABLE runs ADD COLUMN held_until BIGINT;
ALTER TABLE runs ADD COLUMN confirmed_by TEXT;
ALTER TABLE runs ADD COLUMN confirmed_cap_usd DOUBLE PRECISION;
ALTER TABLE runs ADD COLUMN estimate TEXT;
