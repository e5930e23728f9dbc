-- kodx schema, version 8: monthly budgets held across processes. A run reserves its cost
-- cap against its installation's budget when it starts (`reserved_micros`) and settles to
-- what it spent when it ends (`cost_micros`); both in integer micro-dollars. The month's
-- spend counts a queued or running run's reservation and a finished run's cost, so two
-- runs starting together cannot both spend the same last dollars.
ALTER TABLE runs ADD COLUMN reserved_micros BIGINT;
ALTER TABLE runs ADD COLUMN cost_micros BIGINT;
