"""The SQLite store: jobs, instances and events (each job's timeline).

The database is the ledger of what happened; the hosts (and, for clouds, the provider's
tags) are the truth about what runs. One file, `$CLOUDTRAIN_HOME/state.db`, in WAL mode so
that many `cloudtrain` processes can read while one writes; every write is a short
`BEGIN IMMEDIATE` transaction with a generous busy timeout.

This module holds the job states, the records (Job, Instance, Attempt, Event) and
the Store that reads and writes them; which jobs a JobQuery means is in state_query, the
schema's migrations in state_schema, how a column's value is read and written in
state_columns, whether a failing file is unusable in state_check. A job's spec and facts
are parsed where it is loaded (job_spec). It imports only those, config and errors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sqlite3
import stat
import time
from pathlib import Path

from .config import private_file, shown
from .errors import NotFound, UsageError
from .job_spec import FACTS, JobFacts, JobSpec
from .state_check import check_database, database_error  # noqa: F401  (the CLI's too)
from .state_columns import bindable, cached_metrics, json_column, read_row
from .state_query import FINISHED_AT, JobQuery, sql_where
from .state_runs import same_run_of
from .state_schema import MIGRATIONS, SCHEMA_VERSION

# Job states, in lifecycle order. A job is "active" until it reaches a terminal state.
PENDING, PROVISIONING, SYNCING, SETTING_UP, STAGING, RUNNING = (
    "pending", "provisioning", "syncing", "setting-up", "staging", "running")
# A spot job whose instance was interrupted, waiting for the supervisor to relaunch it.
RECOVERING = "recovering"
# A job ready on a kept instance, waiting there for the jobs ahead of it (`launch --on` while
# one runs): the instance's agent starts it (lifecycle/kept.py, host/job_queue.py).
QUEUED = "queued"
SUCCEEDED, FAILED, PREEMPTED, CANCELLED = "succeeded", "failed", "preempted", "cancelled"
# Ended by its own instances at a limit the job set before it could cross it (--budget): its
# last checkpoint kept, nothing started after it. The reason says which.
STOPPED = "stopped"
ACTIVE_STATES = (PENDING, PROVISIONING, SYNCING, SETTING_UP, QUEUED, STAGING, RUNNING,
                 RECOVERING)
TERMINAL_STATES = (SUCCEEDED, FAILED, PREEMPTED, CANCELLED, STOPPED)

BUSY_TIMEOUT_S = 30.0


def on_host(job) -> bool:
    """Whether what runs of `job` is on its host, for a probe to read: the data staged, the
    job file's setup (`setting-up` once the launch is over: no launcher holds its lease; during
    the launch `setting-up` is the launcher's own work), the command."""
    return job.state in (STAGING, RUNNING) or (
        job.state == SETTING_UP and job.lease_until is None and bool(job.jobdir))



@dataclasses.dataclass
class Job:
    id: str
    name: str | None
    kind: str
    recipe: str | None
    command: str
    backend: str
    state: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    reason: str | None
    spec: JobSpec  # what the user asked; a dict given (a row, a test) is parsed
    host: dict | None
    jobdir: str | None
    metrics: dict | None
    cost: float | None
    launcher: str | None = None
    cost_settled: int = 0
    cost_detail: dict | None = None
    lease_until: float | None = None  # launch lease (see _migration_4)
    details: dict | None = None  # the facts as stored (_migration_7)
    # None given: read from details (and from an older spec) in __post_init__, so a Job's
    # facts are always there once it is made.
    facts: JobFacts = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        # A spec as stored: kind and backend are the row's own; older versions kept the
        # per-attempt facts in it, which JobFacts finds there.
        raw = self.spec if isinstance(self.spec, dict) else None
        if raw is not None:
            self.spec = JobSpec.from_dict({"kind": self.kind, "backend": self.backend, **raw})
        if self.facts is None:
            self.facts = JobFacts.load(self.details, raw)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def keeps_instance(self) -> bool:
        """Whether the job's instance stays after it: asked (--keep), or kept for a job
        queued behind it."""
        return bool(self.spec.keep or self.facts.kept_for_queue)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Job":
        values = dict(row)
        for key in ("spec", "host", "metrics", "cost_detail", "details"):
            values[key] = json_column(values.get(key)) or ({} if key == "spec" else None)
        if values["metrics"]:
            values["metrics"] = cached_metrics(values["metrics"])
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclasses.dataclass
class Event:
    job_id: str
    phase: str
    at: float
    detail: str | None


@dataclasses.dataclass
class Attempt:
    job_id: str
    n: int
    started_at: float | None
    instance_id: str | None = None
    region: str | None = None
    zone: str | None = None
    market: str | None = None
    instance_type: str | None = None
    running_at: float | None = None
    ended_at: float | None = None
    outcome: str | None = None
    end_reason: str | None = None
    resumed_step: int | None = None
    resumed_seq: int | None = None
    last_step: int | None = None
    checkpoint: dict | None = None


@dataclasses.dataclass
class Instance:
    id: str
    job_id: str
    provider: str
    region: str | None
    zone: str | None
    instance_type: str | None
    market: str | None
    state: str
    launched_at: float | None
    terminated_at: float | None
    price_per_hour: float | None
    details: dict | None


class Store:
    """One connection to the state database. Cheap to open; open one per command."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_dir():
            raise UsageError(f"{self.path} is a directory, not cloudtrain's database",
                             hint=f"move it aside: mv {self.path} {self.path}.broken")
        try:
            # The database holds commands (tokens in arguments) and hosts: the user's alone.
            # SQLite gives the -wal and -shm files the database file's mode.
            # Never open and close these files here once they exist: closing any descriptor
            # of a file drops every POSIX lock this process holds on it, so a second Store in
            # the same process (the launch lease's thread) would strip the first one's locks,
            # and another process would then reset the -shm under its mapping (SIGBUS).
            for name in (self.path, *(self.path.with_name(self.path.name + s)
                                      for s in ("-wal", "-shm"))):
                if name.exists():
                    if stat.S_IMODE(name.stat().st_mode) != 0o600:
                        os.chmod(name, 0o600)
                elif name == self.path:
                    private_file(name)
        except OSError as exc:
            raise UsageError(f"cannot use {self.path}: {exc.strerror or exc}",
                             hint="check that the file and its folder are yours and writable") \
                from None
        self.db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self.db.row_factory = read_row
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            if self.db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                self._migrate()
            self.db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise database_error(self.path, exc) from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _migrate(self) -> None:
        # WAL is a property of the file; setting it needs no transaction and is idempotent.
        self.db.execute("PRAGMA journal_mode = WAL")
        with self.transaction():
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UsageError(
                    f"{self.path} has schema version {version}, newer than this cloudtrain "
                    f"understands ({SCHEMA_VERSION})",
                    hint="upgrade cloudtrain: pip install -U cloudtrain")
            for migration in MIGRATIONS[version:]:
                migration(self.db)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- transactions -------------------------------------------------------------------

    class _Transaction:
        def __init__(self, db: sqlite3.Connection):
            self.db = db

        def __enter__(self):
            if self.db.in_transaction:  # one a signal cut short: it must not block this one
                self.db.execute("ROLLBACK")
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, exc, tb):
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")

    def rollback(self) -> None:
        """End a write transaction left open (a signal between BEGIN and COMMIT)."""
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def transaction(self) -> "Store._Transaction":
        """A write transaction that takes the write lock up front (no upgrade deadlocks)."""
        return Store._Transaction(self.db)

    # -- jobs ---------------------------------------------------------------------------

    def create_job(self, *, name: str | None, kind: str, recipe: str | None, command: str,
                   backend: str, spec: dict | JobSpec, at: float | None = None,
                   launcher: str | None = None) -> Job:
        at = time.time() if at is None else at
        for _ in range(10):
            job_id = secrets.token_hex(4)
            try:
                with self.transaction() as db:
                    db.execute(
                        "INSERT INTO jobs (id, name, kind, recipe, command, backend, state,"
                        " created_at, spec, launcher) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (job_id, name, kind, recipe, command, backend, PENDING, at,
                         json.dumps(spec.to_dict() if isinstance(spec, JobSpec) else spec),
                         launcher))
                    db.execute("INSERT INTO events (job_id, phase, at) VALUES (?, ?, ?)",
                               (job_id, PENDING, at))
                return self.job(job_id)
            except sqlite3.IntegrityError:
                continue  # an id collision: draw again
        raise RuntimeError("could not allocate a unique job id")

    def job(self, job_id: str) -> Job:
        row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job '{job_id}'", hint="cloudtrain status lists the jobs")
        return Job.from_row(row)

    def find_job(self, ref: str) -> Job:
        """A job by id, name (the newest job of that name), or unique id prefix. An exact
        name comes before an id prefix: `logs 19a3` means the job named 19a3, if one
        is, not job 19a3f0fe."""
        if not ref:
            raise UsageError("give a job id, id prefix or name",
                             hint="cloudtrain status lists the jobs")
        try:
            ref.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 on the command line: no job's
            raise NotFound(f"no job {ref.encode('utf-8', 'replace').decode()!r}",
                           hint="cloudtrain status lists the jobs") from None
        row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (ref,)).fetchone()
        if row is not None:
            return Job.from_row(row)
        named = self.job_named(ref)
        if named is not None:
            return named
        # A prefix compared as text, not LIKE: no wildcards to escape, and no "LIKE or GLOB
        # pattern too complex" for a reference of 100,000 characters.
        rows = self.db.execute(
            "SELECT * FROM jobs WHERE substr(id, 1, ?) = ? ORDER BY created_at DESC",
            (len(ref), ref)).fetchall()
        if len(rows) > 1:
            ids = ", ".join(r["id"] for r in rows[:5])
            raise UsageError(f"job id prefix '{ref}' is ambiguous: {ids}")
        if not rows:
            raise NotFound(f"no job {shown(ref)}", hint="cloudtrain status lists the jobs")
        return Job.from_row(rows[0])

    def job_named(self, name: str) -> Job | None:
        """The newest job of this name, or None."""
        row = self.db.execute("SELECT * FROM jobs WHERE name = ? ORDER BY created_at DESC "
                              "LIMIT 1", (name,)).fetchone()
        return None if row is None else Job.from_row(row)

    def jobs(self, *, active_only: bool = False, limit: int | None = None) -> list[Job]:
        sql = "SELECT * FROM jobs"
        if active_only:
            sql += " WHERE state IN (%s)" % ",".join("?" * len(ACTIVE_STATES))
        sql += " ORDER BY created_at DESC, id"
        if limit:
            sql += f" LIMIT {int(limit)}"
        rows = self.db.execute(sql, ACTIVE_STATES if active_only else ()).fetchall()
        return [Job.from_row(r) for r in rows]

    # -- history (issue 16): jobs by filter, and forgetting a job ----------------------

    def find_jobs(self, query: JobQuery, *, by_end: bool = False,
                  limit: int | None = None, offset: int = 0) -> list[Job]:
        """The jobs `query` matches, newest first: by creation, or with `by_end` by when they
        finished (for finished jobs); `offset` of them skipped (a page of them)."""
        where, params = sql_where(self.db, query, TERMINAL_STATES)
        order = f"{FINISHED_AT} DESC, id" if by_end else "created_at DESC, id"
        sql = f"SELECT * FROM jobs{where} ORDER BY {order}"
        if limit is not None or offset:
            sql += f" LIMIT {int(limit) if limit is not None else -1} OFFSET {max(0, int(offset))}"
        return [Job.from_row(r) for r in self.db.execute(sql, params).fetchall()]

    def count_jobs(self, query: JobQuery) -> int:
        where, params = sql_where(self.db, query, TERMINAL_STATES)
        return self.db.execute(f"SELECT count(*) FROM jobs{where}", params).fetchone()[0]

    def job_tables(self) -> list[str]:
        """Every table with a job_id column (a job's rows besides its `jobs` row), read from
        the schema so that a table a later migration adds is never left holding rows of a
        job that is gone."""
        tables = [r["name"] for r in self.db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND name != 'jobs' ORDER BY name")]
        return [t for t in tables
                if any(c["name"] == "job_id" for c in self.db.execute(
                    "SELECT name FROM pragma_table_info(?)", (t,)))]

    def delete_job(self, job_id: str) -> int:
        """Delete every row of the job, in every table (its own row last: the others refer
        to it); how many rows went. Inside a transaction the caller holds (history.remove
        holds one while it removes the job's files), else in one of its own."""
        if not self.db.in_transaction:
            with self.transaction():
                return self.delete_job(job_id)
        rows = 0
        for table in self.job_tables():
            quoted = '"%s"' % table.replace('"', '""')
            rows += self.db.execute(f"DELETE FROM {quoted} WHERE job_id = ?",
                                    (job_id,)).rowcount
        return rows + self.db.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount

    def update_job(self, job_id: str, *, same_run: Job | None = None, **fields) -> bool:
        """Set columns of a job (dicts are stored as JSON). With `same_run` (a snapshot of
        the job), only if it is still in the snapshot's state on the snapshot's run (see
        set_state): what a snapshot's process learnt never lands on the run after it.
        Returns whether the job changed."""
        if not fields:
            return False
        with self.transaction() as db:
            if same_run is not None:
                row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None:
                    raise NotFound(f"no job '{job_id}'")
                now = Job.from_row(row)
                if now.state != same_run.state or not same_run_of(now, same_run):
                    return False
            self._update(db, job_id, fields)
        return True

    def set_state(self, job_id: str, state: str, *, at: float | None = None,
                  detail: str | None = None, only_if_active: bool = True,
                  expect: str | None = None, same_run: Job | None = None,
                  **fields) -> bool:
        """Move a job to `state` and record the event, atomically.

        With `only_if_active`, a job that has already ended is left as it is (two processes
        may notice the same end; the first one wins). With `expect`, the change is made only
        if the job is still in that state (compare-and-set: a decision taken on a snapshot
        never overrides what happened since). With `same_run` (a snapshot of the job), only
        if it still runs where the snapshot saw it: the same host record and attempt (a
        relaunch may land at the same address, in the same state, under another instance).
        Returns whether the job changed.
        """
        at = time.time() if at is None else at
        with self.transaction() as db:
            row = db.execute("SELECT %s FROM jobs WHERE id = ?" % ("*" if same_run else "state"),
                             (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"no job '{job_id}'")
            if only_if_active and row["state"] in TERMINAL_STATES:
                return False
            if expect is not None and row["state"] != expect:
                return False
            if same_run is not None and not same_run_of(Job.from_row(row), same_run):
                return False
            if row["state"] == state:
                if fields:
                    self._update(db, job_id, fields)
                return False
            fields["state"] = state
            if state in TERMINAL_STATES and "ended_at" not in fields:
                fields["ended_at"] = at
            self._update(db, job_id, fields)
            db.execute("INSERT INTO events (job_id, phase, at, detail) VALUES (?, ?, ?, ?)",
                       (job_id, state, at, detail))
        return True

    def record_facts(self, job_id: str, **facts) -> None:
        """Keep what was learnt about a job (JobFacts' fields) with it, beside those it has."""
        unknown = set(facts) - FACTS
        if unknown:
            raise ValueError(f"not job facts: {sorted(unknown)}")
        with self.transaction() as db:
            row = db.execute("SELECT details FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"no job '{job_id}'")
            details = {**(json_column(row["details"]) or {}), **facts}
            self._update(db, job_id, {"details": details})

    @staticmethod
    def _update(db: sqlite3.Connection, job_id: str, fields: dict) -> None:
        columns = ", ".join(f"{key} = ?" for key in fields)
        values = [bindable(v) for v in fields.values()]
        db.execute(f"UPDATE jobs SET {columns} WHERE id = ?", (*values, job_id))

    # -- events -------------------------------------------------------------------------

    def add_event(self, job_id: str, phase: str, *, at: float | None = None,
                  detail: str | None = None, once: bool = False) -> bool:
        """Record an event; with `once`, only if the job has no event of this phase and
        detail yet (a fact that several processes may notice at the same time is said once).
        Returns whether it was recorded."""
        with self.transaction() as db:
            return self._add_event(db, job_id, phase, time.time() if at is None else at,
                                   detail, once)

    @staticmethod
    def _add_event(db: sqlite3.Connection, job_id: str, phase: str, at: float,
                   detail: str | None, once: bool) -> bool:
        if once:
            cur = db.execute(
                "INSERT INTO events (job_id, phase, at, detail) SELECT ?, ?, ?, ? WHERE NOT "
                "EXISTS (SELECT 1 FROM events WHERE job_id = ? AND phase = ? AND detail IS ?)",
                (job_id, phase, at, detail, job_id, phase, detail))
        else:
            cur = db.execute("INSERT INTO events (job_id, phase, at, detail) VALUES "
                             "(?, ?, ?, ?)", (job_id, phase, at, detail))
        return cur.rowcount == 1

    def events(self, job_id: str) -> list[Event]:
        rows = self.db.execute(
            "SELECT job_id, phase, at, detail FROM events WHERE job_id = ? ORDER BY id",
            (job_id,)).fetchall()
        return [Event(**dict(r)) for r in rows]

    # -- instances ----------------------------------------------------------------------

    def add_instance(self, instance: Instance, event: tuple[str, str] | None = None) -> bool:
        """Record an instance, and with it `event` (phase, detail); nothing where the store
        knows that instance already (another process recorded it first: the store's
        attempts are learnt by `status` and the supervisor at once). Returns whether it was
        recorded."""
        values = dataclasses.asdict(instance)
        values["details"] = values["details"] or None
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO instances (%s) VALUES (%s) ON CONFLICT (id) DO NOTHING"
                % (", ".join(values), ", ".join("?" * len(values))),
                tuple(bindable(v) for v in values.values()))
            added = cur.rowcount == 1
            if added and event is not None:
                self._add_event(db, instance.job_id, event[0], time.time(), event[1], False)
        return added

    def update_instance(self, instance_id: str, **fields) -> None:
        columns = ", ".join(f"{key} = ?" for key in fields)
        with self.transaction() as db:
            db.execute(f"UPDATE instances SET {columns} WHERE id = ?",
                       (*(bindable(v) for v in fields.values()), instance_id))

    def hand_over(self, instance: Instance, to_job: str) -> None:
        """A kept instance's record moves to the job that runs on it now (`launch --on`, a
        queued job starting), its billing with it, and each job's timeline says so. Its
        details keep `tagged_job`: the job whose cloudtrain:job tag it wears (EC2 tags are
        written at launch only), which is what `release` checks EC2's answer against."""
        details = {**(instance.details or {}),
                   "tagged_job": (instance.details or {}).get("tagged_job", instance.job_id)}
        with self.transaction() as db:
            db.execute("UPDATE instances SET job_id = ?, details = ? WHERE id = ?",
                       (to_job, json.dumps(details), instance.id))
        self.add_event(to_job, "instance", detail=f"{instance.id} taken over from job "
                                                  f"{instance.job_id}")
        self.add_event(instance.job_id, "handover", detail=f"{instance.id} to job {to_job}")

    def instances(self, job_id: str) -> list[Instance]:
        rows = self.db.execute(
            "SELECT * FROM instances WHERE job_id = ? ORDER BY launched_at", (job_id,)).fetchall()
        out = []
        for r in rows:
            values = dict(r)
            values["details"] = json_column(values["details"])
            out.append(Instance(**values))
        return out


    # -- attempts -----------------------------------------------------------------------

    ATTEMPT_FIELDS = frozenset(f.name for f in dataclasses.fields(Attempt)) - {"job_id", "n"}

    @classmethod
    def _attempt_fields(cls, fields: dict) -> None:
        unknown = set(fields) - cls.ATTEMPT_FIELDS
        if unknown:
            raise ValueError(f"not attempt fields: {sorted(unknown)}")

    def add_attempt(self, job_id: str, n: int, started_at: float | None = None,
                    **fields) -> bool:
        """Record attempt `n` of the job; False (and nothing changed) if it exists already:
        a supervisor restarted mid-recovery finds the attempt it had begun."""
        self._attempt_fields(fields)
        values = {"job_id": job_id, "n": int(n),
                  "started_at": time.time() if started_at is None else started_at, **fields}
        with self.transaction() as db:
            cur = db.execute("INSERT INTO attempts (%s) VALUES (%s) "
                             "ON CONFLICT (job_id, n) DO NOTHING" % (
                ", ".join(values), ", ".join("?" * len(values))),
                tuple(bindable(v) for v in values.values()))
        return cur.rowcount == 1

    def update_attempt(self, job_id: str, n: int, *, only_if_open: bool = False,
                       **fields) -> bool:
        """Set fields of attempt `n`; with only_if_open, only while it has not ended (the
        first to see the end records it). Returns whether a row changed."""
        self._attempt_fields(fields)
        if not fields:
            return False
        columns = ", ".join(f"{key} = ?" for key in fields)
        sql = f"UPDATE attempts SET {columns} WHERE job_id = ? AND n = ?"
        if only_if_open:
            sql += " AND ended_at IS NULL"
        with self.transaction() as db:
            cur = db.execute(sql, (*(bindable(v) for v in fields.values()), job_id, int(n)))
        return cur.rowcount == 1

    def attempts(self, job_id: str) -> list[Attempt]:
        rows = self.db.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY n",
                               (job_id,)).fetchall()
        out = []
        for r in rows:
            values = dict(r)
            values["checkpoint"] = json_column(values["checkpoint"])
            if values["n"] is None:
                continue
            out.append(Attempt(**values))
        return out

    def attempt(self, job_id: str, n: int | None = None) -> Attempt | None:
        """Attempt `n` of the job, or its latest (None: it has none)."""
        found = self.attempts(job_id)
        if n is None:
            return found[-1] if found else None
        return next((a for a in found if a.n == n), None)


def open_store(home: Path) -> Store:
    return Store(Path(home) / "state.db")

