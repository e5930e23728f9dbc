-- kodx schema, version 1 (SPEC §3, §9).
--
-- Written for SQLite now and PostgreSQL later: only TEXT, BIGINT and DOUBLE PRECISION
-- (SQLite reads them as TEXT, INTEGER and REAL affinity), booleans as 0/1, times as unix
-- milliseconds, no AUTOINCREMENT, no rowid, no date functions.

-- Every webhook delivery kodx has accepted, keyed by GitHub's X-GitHub-Delivery id, so a
-- redelivery is recognised and does nothing.
CREATE TABLE deliveries (
    id              TEXT PRIMARY KEY,
    event           TEXT NOT NULL,
    action          TEXT,
    installation_id BIGINT,
    repo            TEXT,
    received_at     BIGINT NOT NULL
);

-- The App's installations, as the installation* events left them.
CREATE TABLE installations (
    id          BIGINT PRIMARY KEY,
    account     TEXT NOT NULL,
    last_action TEXT NOT NULL,
    suspended   BIGINT NOT NULL DEFAULT 0 CHECK (suspended IN (0, 1)),
    deleted     BIGINT NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1)),
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

-- The run queue and every run's outcome. A delivery causes at most one run.
CREATE TABLE runs (
    id                 TEXT PRIMARY KEY,
    -- Queue order: one more than the largest so far, assigned inside the writing
    -- transaction. Ties (impossible in SQLite) would only affect order, not correctness.
    seq                BIGINT NOT NULL,
    delivery_id        TEXT NOT NULL UNIQUE REFERENCES deliveries (id),
    kind               TEXT NOT NULL,
    installation_id    BIGINT NOT NULL,
    repo               TEXT NOT NULL,
    issue_number       BIGINT NOT NULL,
    is_pull_request    BIGINT NOT NULL CHECK (is_pull_request IN (0, 1)),
    argument           TEXT NOT NULL,
    author             TEXT NOT NULL,
    author_id          BIGINT NOT NULL,
    trigger_kind       TEXT NOT NULL,
    trigger_id         BIGINT NOT NULL,
    clone_url          TEXT NOT NULL,
    default_branch     TEXT NOT NULL,
    context            TEXT NOT NULL,
    status             TEXT NOT NULL
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    phase              TEXT,
    attempts           BIGINT NOT NULL DEFAULT 0,
    worker             TEXT,
    recovered          BIGINT NOT NULL DEFAULT 0 CHECK (recovered IN (0, 1)),
    status_comment_id  BIGINT,
    stop_reason        TEXT,
    cost_usd           DOUBLE PRECISION,
    input_tokens       BIGINT NOT NULL DEFAULT 0,
    output_tokens      BIGINT NOT NULL DEFAULT 0,
    cache_read_tokens  BIGINT NOT NULL DEFAULT 0,
    cache_write_tokens BIGINT NOT NULL DEFAULT 0,
    api_calls          BIGINT NOT NULL DEFAULT 0,
    result             TEXT,
    pr_url             TEXT,
    cancelled_by       TEXT,
    created_at         BIGINT NOT NULL,
    started_at         BIGINT,
    finished_at        BIGINT
);

CREATE INDEX runs_by_status ON runs (status, seq);
CREATE INDEX runs_by_issue ON runs (repo, issue_number, status);
CREATE INDEX runs_by_installation ON runs (installation_id, created_at);

-- Every model request and response and every tool call and result of a run, in order.
CREATE TABLE transcripts (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    seq        BIGINT NOT NULL,
    record     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
