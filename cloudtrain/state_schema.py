"""The state database's schema: numbered migrations, applied in order by state.Store.

Each migration is a small function that brings the file from version n-1 to n (the version is
PRAGMA user_version); a migration, once released, never changes: a new column or index is a
new one. Imports only the standard library.
"""

from __future__ import annotations

import sqlite3


def _execute_script(db: sqlite3.Connection, script: str) -> None:
    """Run statements one by one: executescript() would COMMIT the migration's transaction."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _migration_1(db: sqlite3.Connection) -> None:
    _execute_script(db,
        """
        CREATE TABLE jobs (
            id          TEXT PRIMARY KEY,
            name        TEXT,
            kind        TEXT NOT NULL,      -- 'recipe' or 'command'
            recipe      TEXT,
            command     TEXT NOT NULL,      -- what runs, for display
            backend     TEXT NOT NULL,
            state       TEXT NOT NULL,
            created_at  REAL NOT NULL,
            started_at  REAL,               -- the job's command started (agent clock)
            ended_at    REAL,
            exit_code   INTEGER,
            reason      TEXT,
            spec        TEXT NOT NULL,      -- JobSpec as JSON
            host        TEXT,               -- how to reach the host again, JSON
            jobdir      TEXT,               -- the job directory on that host
            metrics     TEXT,               -- the latest metrics row, JSON (a cache)
            cost        REAL                -- dollars, NULL until known
        );
        CREATE INDEX jobs_created_at ON jobs(created_at);
        CREATE INDEX jobs_state ON jobs(state);
        CREATE TABLE instances (
            id              TEXT PRIMARY KEY,
            job_id          TEXT NOT NULL REFERENCES jobs(id),
            provider        TEXT NOT NULL,
            region          TEXT,
            zone            TEXT,
            instance_type   TEXT,
            market          TEXT,           -- 'on-demand', 'spot' or 'local'
            state           TEXT NOT NULL,  -- requested | running | terminated
            launched_at     REAL,
            terminated_at   REAL,
            price_per_hour  REAL,
            details         TEXT            -- provider-specific JSON
        );
        CREATE INDEX instances_job ON instances(job_id);
        CREATE TABLE events (
            id      INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id  TEXT NOT NULL REFERENCES jobs(id),
            phase   TEXT NOT NULL,
            at      REAL NOT NULL,
            detail  TEXT
        );
        CREATE INDEX events_job ON events(job_id, id);
        """
    )


def _migration_2(db: sqlite3.Connection) -> None:
    # Which process is launching the job ("hostname:pid"): a launch whose process died
    # half-way is then shown as failed instead of "syncing" for ever.
    db.execute("ALTER TABLE jobs ADD COLUMN launcher TEXT")


def _migration_3(db: sqlite3.Connection) -> None:
    # Whether `cost` is final (every instance terminated, its prices known) and how it
    # breaks down (per phase, to the target, notes), so reports work offline.
    db.execute("ALTER TABLE jobs ADD COLUMN cost_settled INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE jobs ADD COLUMN cost_detail TEXT")


def _migration_4(db: sqlite3.Connection) -> None:
    # The launch lease: the launching process renews it while it works; a job still being
    # launched whose lease ran out was abandoned (its launcher was killed), whichever machine
    # or container notices. Replaces the hostname + pid check, which only the launching
    # machine could make.
    db.execute("ALTER TABLE jobs ADD COLUMN lease_until REAL")


def _migration_5(db: sqlite3.Connection) -> None:
    # Spot recovery: one job, several attempts. Each attempt is one instance's try at the
    # job (a launch, or a relaunch after an interruption): where it ran, from which
    # checkpoint it resumed, how and why it ended, and the last step it is known to have run
    # (the steps between that and the checkpoint the next attempt resumes from are redone).
    _execute_script(db,
        """
        CREATE TABLE attempts (
            job_id        TEXT NOT NULL REFERENCES jobs(id),
            n             INTEGER NOT NULL,   -- 1 for the launch, then 2, 3, ...
            instance_id   TEXT,
            region        TEXT,
            zone          TEXT,
            market        TEXT,
            instance_type TEXT,
            started_at    REAL NOT NULL,      -- the (re)launch began
            running_at    REAL,               -- the job's command started on the host
            ended_at      REAL,
            outcome       TEXT,               -- interrupted | succeeded | failed | cancelled
            end_reason    TEXT,
            resumed_step  INTEGER,            -- the checkpoint's step it resumed from
            resumed_seq   INTEGER,            -- the job store's checkpoint sequence number
            last_step     INTEGER,            -- the last step it is known to have run
            checkpoint    TEXT,               -- JSON: its last checkpoint upload (final one)
            PRIMARY KEY (job_id, n)
        )
        """)


def _migration_6(db: sqlite3.Connection) -> None:
    # Job history (issue 16): `status` reads the jobs not finished (a partial index: a few
    # rows among thousands) and the most recently finished ones, not every row; a name is
    # looked up (find_job, --name) without reading them all. The partial index's condition is
    # the one Store.find_jobs writes for "not finished", term for term: SQLite uses it only then.
    _execute_script(db,
        """
        CREATE INDEX jobs_unfinished ON jobs(created_at)
            WHERE state NOT IN ('succeeded', 'failed', 'preempted', 'cancelled');
        CREATE INDEX jobs_finished_at ON jobs(coalesce(ended_at, created_at));
        CREATE INDEX jobs_name ON jobs(name, created_at)
        """)


def _migration_7(db: sqlite3.Connection) -> None:
    # What was learnt about a job as it ran (job_spec.JobFacts: its attempt, its job store's
    # owner, the cloud's group made for it), JSON, apart from its spec (what the user asked).
    # Jobs of older versions keep theirs in the spec, where JobFacts.load finds them.
    db.execute("ALTER TABLE jobs ADD COLUMN details TEXT")


# Schema migrations, applied in order; the schema version is PRAGMA user_version.
def _migration_8(db: sqlite3.Connection) -> None:
    # A job stopped by its own instances at its budget (issue 38) is finished: the partial
    # index of the unfinished jobs says so, term for term as Store.find_jobs writes it.
    _execute_script(db,
        """
        DROP INDEX IF EXISTS jobs_unfinished;
        CREATE INDEX jobs_unfinished ON jobs(created_at)
            WHERE state NOT IN ('succeeded', 'failed', 'preempted', 'cancelled', 'stopped')
        """)


MIGRATIONS = [_migration_1, _migration_2, _migration_3, _migration_4, _migration_5,
              _migration_6, _migration_7, _migration_8]
SCHEMA_VERSION = len(MIGRATIONS)


def schema_problem(db: sqlite3.Connection) -> str | None:
    """How the database's schema differs from the one the migrations write (its version, a
    table or a column missing), or None where it is that schema (extra tables or columns
    are allowed: a newer cloudtrain may add them)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version < SCHEMA_VERSION:
        return f"schema version {version}, not {SCHEMA_VERSION}"
    want = sqlite3.connect(":memory:")
    try:
        for migration in MIGRATIONS:
            migration(want)
        for (table,) in want.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                     "AND name NOT LIKE 'sqlite_%' ORDER BY name"):
            have = {r[0] for r in db.execute("SELECT name FROM pragma_table_info(?)", (table,))}
            if not have:
                return f"no table {table}"
            missing = sorted({r[0] for r in want.execute(
                "SELECT name FROM pragma_table_info(?)", (table,))} - have)
            if missing:
                return f"table {table} has no column {', '.join(missing)}"
    finally:
        want.close()
    return None
