-- kodx schema, version 17: `/kodx steer` (SPEC §12, "Steering and pictures"): words a
-- writer gave a running run, waiting for the process that runs it.
--
-- One row per steer comment: `body` its words, cleaned of hidden text and bounded,
-- `comment_id` the comment (one row per comment, so a redelivered webhook adds nothing).
-- The running process takes a run's untaken rows at its next step with one
-- `UPDATE … SET taken_at … RETURNING` (so two processes never both take one); a row still
-- untaken when its run ends is answered on the issue as too late.
CREATE TABLE steers (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    author      TEXT NOT NULL,
    body        TEXT NOT NULL,
    comment_id  BIGINT PRIMARY KEY,
    created_at  BIGINT NOT NULL,
    taken_at    BIGINT
);

CREATE INDEX steers_untaken ON steers (run_id) WHERE taken_at IS NULL;
