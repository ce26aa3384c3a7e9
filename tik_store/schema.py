"""The IR's tables. One SQLite file (`tik.db`, WAL); git holds the sources, the rows hold everything else.

Nothing is ever deleted: statuses change (and each change is an event), decisions, checks and
measurements accumulate. Integer ids everywhere; times are ISO-8601 UTC strings.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

#: an implementation's life: candidate -> failed | verified -> eligible -> promoted | rejected
STATUSES = ("candidate", "failed", "verified", "eligible", "promoted", "rejected")

ACTIONS = ("promote", "reject", "archive")

WORKER_STATES = ("idle", "running", "paused", "stopped", "finished", "crashed")

_STATUS_CHECK = "status IN ({})".format(", ".join(f"'{s}'" for s in STATUSES))

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS operators (
    op TEXT PRIMARY KEY,
    summary TEXT NOT NULL DEFAULT '',
    contract TEXT NOT NULL DEFAULT '{{}}',
    fingerprint TEXT,
    created TEXT NOT NULL,
    updated TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS implementations (
    id INTEGER PRIMARY KEY,
    op TEXT NOT NULL REFERENCES operators(op),
    commit_sha TEXT NOT NULL UNIQUE,
    blob_sha TEXT NOT NULL,
    filename TEXT NOT NULL,
    parent_id INTEGER REFERENCES implementations(id),
    status TEXT NOT NULL CHECK ({_STATUS_CHECK}),
    status_detail TEXT,
    proposer TEXT NOT NULL,
    rationale TEXT NOT NULL DEFAULT '',
    source_sha256 TEXT NOT NULL,
    nonce TEXT NOT NULL UNIQUE,
    objective REAL,
    incumbent_objective REAL,
    admissible INTEGER,
    failure TEXT,
    created TEXT NOT NULL,
    updated TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS impl_op_status ON implementations(op, status);
CREATE INDEX IF NOT EXISTS impl_parent ON implementations(parent_id);
CREATE TABLE IF NOT EXISTS impl_parents (
    impl_id INTEGER NOT NULL REFERENCES implementations(id),
    parent_id INTEGER NOT NULL REFERENCES implementations(id),
    pos INTEGER NOT NULL,
    PRIMARY KEY (impl_id, pos)
);
CREATE INDEX IF NOT EXISTS impl_parents_parent ON impl_parents(parent_id);
CREATE TABLE IF NOT EXISTS modifications (
    impl_id INTEGER PRIMARY KEY REFERENCES implementations(id),
    lines_added INTEGER NOT NULL,
    lines_removed INTEGER NOT NULL,
    functions_changed TEXT NOT NULL DEFAULT '[]',
    expected_effect TEXT NOT NULL DEFAULT '""',
    numerical_risks TEXT NOT NULL DEFAULT '""',
    extra TEXT NOT NULL DEFAULT '{{}}'
);
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY,
    impl_id INTEGER NOT NULL REFERENCES implementations(id),
    verified INTEGER NOT NULL,
    failure TEXT,
    admissible INTEGER,
    eligible INTEGER,
    objective REAL,
    incumbent_objective REAL,
    device TEXT,
    env TEXT NOT NULL DEFAULT '{{}}',
    contract_fingerprint TEXT,
    source_sha256 TEXT,
    elapsed_s REAL,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS evaluations_impl ON evaluations(impl_id);
CREATE TABLE IF NOT EXISTS checks (
    id INTEGER PRIMARY KEY,
    impl_id INTEGER NOT NULL REFERENCES implementations(id),
    evaluation_id INTEGER REFERENCES evaluations(id),
    batch INTEGER NOT NULL,
    name TEXT NOT NULL,
    requirement TEXT,
    passed INTEGER NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    max_diff REAL,
    device TEXT,
    contract_fingerprint TEXT,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS checks_impl ON checks(impl_id, batch);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    impl_id INTEGER NOT NULL REFERENCES implementations(id),
    evaluation_id INTEGER REFERENCES evaluations(id),
    batch INTEGER NOT NULL,
    cell TEXT NOT NULL,
    device TEXT,
    coeff REAL,
    "limit" REAL,
    median_us REAL,
    spread_us REAL,
    samples INTEGER,
    root_median_us REAL,
    incumbent_median_us REAL,
    baseline_median_us REAL,
    ratio_vs_root REAL,
    ratio_vs_baseline REAL,
    gpu TEXT,
    driver TEXT,
    torch TEXT,
    triton TEXT,
    env TEXT NOT NULL DEFAULT '{{}}',
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_impl ON measurements(impl_id, batch);
CREATE TABLE IF NOT EXISTS opportunities (
    id INTEGER PRIMARY KEY,
    op TEXT NOT NULL REFERENCES operators(op),
    mechanism TEXT NOT NULL,
    workloads TEXT NOT NULL DEFAULT '[]',
    evidence TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'open',
    impl_id INTEGER REFERENCES implementations(id),
    created TEXT NOT NULL,
    updated TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY,
    impl_id INTEGER NOT NULL REFERENCES implementations(id),
    action TEXT NOT NULL CHECK (action IN ('promote', 'reject', 'archive')),
    by TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_impl ON decisions(impl_id);
CREATE TABLE IF NOT EXISTS llm_usage (
    id INTEGER PRIMARY KEY,
    impl_id INTEGER REFERENCES implementations(id),
    model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS llm_usage_impl ON llm_usage(impl_id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    ts TEXT NOT NULL,
    kind TEXT NOT NULL,
    op TEXT,
    impl_id INTEGER REFERENCES implementations(id),
    payload TEXT NOT NULL DEFAULT '{{}}'
);
CREATE INDEX IF NOT EXISTS events_impl_kind ON events(impl_id, kind);
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL DEFAULT '{{}}',
    created TEXT NOT NULL,
    done TEXT
);
CREATE TABLE IF NOT EXISTS worker_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    pid INTEGER,
    host TEXT,
    state TEXT NOT NULL DEFAULT 'idle',
    op TEXT,
    proposer TEXT,
    budget REAL,
    spent REAL,
    heartbeat REAL,
    message TEXT,
    extra TEXT NOT NULL DEFAULT '{{}}',
    updated TEXT NOT NULL
);
"""
