-- kodx schema, version 16: the images a run gave the model (SPEC §12, "Steering and
-- pictures"), kept for its run page's thumbnails.
--
-- One row per image, `n` its place in the run's first message (0-based), `kind` what its
-- bytes are (`png`, `jpeg`, `gif`, `webp`), `bytes` the image itself (at most 5 MiB, at
-- most 5 and 20 MiB in all per run), deleted with the run's transcript when transcripts are pruned.
-- `BYTEA` is PostgreSQL's bytes; SQLite stores the same blob under the name.
CREATE TABLE run_images (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    n           BIGINT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('png', 'jpeg', 'gif', 'webp')),
    width       BIGINT,
    height      BIGINT,
    size        BIGINT NOT NULL,
    sha256      TEXT NOT NULL,
    bytes       BYTEA NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (run_id, n)
);
