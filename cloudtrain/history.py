"""Job history (issue 16): which jobs `status` shows, and removing finished jobs.

`status` shows every job that has not finished and the recent finished ones (DEFAULT_VIEW);
filters (state, recipe, name, since) narrow what is looked at, `-a` lifts the default view.
Everything is chosen in SQL: with 10,000 jobs stored, only the rows shown are read.

`rm` and `prune` remove finished jobs: their rows in every table and their directory
$CLOUDTRAIN_HOME/jobs/<id>/. A removal is planned first (plan_removal: which jobs, how many
bytes of files, and which jobs are kept and why), shown, and only then done (remove), which
checks each job again as it removes it. A job is kept while it has not finished, while an
instance of it may still bill, and while an active job is to resume from its checkpoints.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import re
import stat
import time
from pathlib import Path

from . import state
from .config import shown, suggest
from .errors import NotFound, UsageError
from .state import Job, Store
from .state_query import JobQuery

STATES = state.ACTIVE_STATES + state.TERMINAL_STATES


@dataclasses.dataclass(frozen=True)
class View:
    finished_within_s: float  # a finished job is shown if it ended this recently...
    finished_at_most: int     # ...and is one of this many that ended most recently


# What `status` shows without -a: every job not finished (however old), and the finished jobs
# that ended in the last 7 days, the 20 most recent of them at most. Filters narrow the jobs
# this rule looks at; -a shows every job the filters match.
DEFAULT_VIEW = View(finished_within_s=7 * 86400, finished_at_most=20)

DURATION_UNITS = "min, h, d, w or mo"  # ledger.DURATION_UNITS (m: minutes too)
GLOB_CHARS = re.compile(r"[*?\[]")  # a --name with one of these is a pattern too


# -- filters -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Filters:
    """The jobs `status` looks at: every filter given must match (None, empty: any)."""
    states: tuple[str, ...] = ()
    recipes: tuple[str, ...] = ()
    name: str | None = None         # the name exactly, or a shell glob (*, ?, [...], [!...])
    since: float | None = None      # created at or after this time (epoch seconds)
    since_text: str | None = None   # --since as given (the footer repeats it)

    def any(self) -> bool:
        """Whether any filter was given."""
        return bool(self.states or self.recipes or self.name or self.since is not None)

    def query(self) -> JobQuery:
        glob = self.name if self.name and GLOB_CHARS.search(self.name) else None
        return JobQuery(states=self.states, recipes=self.recipes, name=self.name,
                        name_glob=glob, created_since=self.since)

    def options(self) -> list[str]:
        """The command-line options that give these filters (for a hint to copy)."""
        import shlex

        out = [f"--state {s}" for s in self.states]
        out += [f"--recipe {shlex.quote(r)}" for r in self.recipes]
        for flag, value in (("--name", self.name),
                            ("--since", self.since_text)):
            if value is not None:
                out.append(f"{flag} {shlex.quote(value)}")
        return out


def parse_filters(states: tuple[str, ...] | list[str] = (),
                  recipe: str | tuple[str, ...] | list[str] | None = None,
                  name: str | None = None, since: str | None = None, *,
                  now: float | None = None) -> Filters:
    """Filters from `status` options as typed: --state and --recipe (each repeatable, or
    comma-separated: any of them), --name (exact or shell glob), --since (a duration ago
    or a date). Anything that cannot be meant is a UsageError of one line."""
    wanted: list[str] = []
    for given in states:
        for s in str(given).split(","):
            s = s.strip().lower()
            if s not in STATES:
                raise UsageError(f"--state {shown(given)}: not a job state{suggest(s, STATES)}; "
                                 "the states are " + ", ".join(STATES))
            if s not in wanted:
                wanted.append(s)
    given_recipes = (recipe,) if isinstance(recipe, str) else tuple(recipe or ())
    recipes: list[str] = []
    for value in given_recipes:
        if not value.strip():
            raise UsageError(f"--recipe needs a value, got {value!r}")
        recipes += [r.strip() for r in value.split(",") if r.strip() and r.strip() not in recipes]
    for flag, text in [*(("--recipe", r) for r in given_recipes), ("--name", name)]:
        if text is None:
            continue
        if not text.strip():
            raise UsageError(f"{flag} needs a value, got {text!r}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 on the command line
            raise UsageError(f"{flag} {shown(text)} is not UTF-8 text") from None
    start = None
    if since is not None:
        start = parse_time(since, "--since", time.time() if now is None else now)
    return Filters(states=tuple(wanted), recipes=tuple(recipes), name=name, since=start,
                   since_text=since)


def parse_time(text: str, flag: str, now: float, *, destructive: bool = False) -> float:
    """A point in the past as epoch seconds: a duration ago (30min, 2h, 3d, 2w, 6mo: ledger's
    units) or a date (2026-11-01, 2026-11-01T14:30; local time unless it says). With
    `destructive` (prune), `6m` is refused: it reads as minutes, and a cron line meant six
    months would remove everything older than six minutes."""
    from .ledger import duration_seconds, parse_since

    text = (text or "").strip()
    expected = (f"a duration ({DURATION_UNITS} after a number: 2h, 3d, 2w) or a date "
                "(2026-11-01)")
    if not text:
        raise UsageError(f"{flag} needs a value: {expected}")
    got = duration_seconds(text)
    if destructive and got is not None and got[1] == "m":
        number = text[:-1].strip()
        raise UsageError(f"{flag} {shown(text)}: m could mean minutes or months",
                         hint=f"write {number}min or {number}mo")
    try:
        at = parse_since(text, now)
    except UsageError:
        try:
            at = datetime.datetime.fromisoformat(text).timestamp()
        except (ValueError, OverflowError, OSError):
            raise UsageError(f"{flag} {shown(text)}: expected {expected}") from None
    if at is None or not math.isfinite(at):
        raise UsageError(f"{flag} {shown(text)}: expected {expected}")
    if at > now:
        raise UsageError(f"{flag} {shown(text)} is in the future")
    return at


# -- status: what to show ------------------------------------------------------------------


def select(store: Store, filters: Filters | None = None, *, all_: bool = False,
           limit: int | None = None, now: float | None = None) -> tuple[list[Job], int]:
    """The jobs `status` shows, newest first, and how many jobs the filters match that are
    not shown (DEFAULT_VIEW without `all_`; `limit`: --limit)."""
    filters = filters or Filters()
    now = time.time() if now is None else now
    query = filters.query()
    if all_:
        jobs = store.find_jobs(query, limit=limit)
    else:
        active = store.find_jobs(dataclasses.replace(query, finished=False))
        recent = store.find_jobs(
            dataclasses.replace(query, finished=True,
                                ended_since=now - DEFAULT_VIEW.finished_within_s),
            by_end=True, limit=DEFAULT_VIEW.finished_at_most)
        jobs = sorted(active + recent, key=lambda j: (-(j.created_at or 0.0), j.id))
        jobs = jobs[:limit] if limit else jobs
    matched = store.count_jobs(query)
    return jobs, max(0, matched - len(jobs))


def footer(hidden: int, filters: Filters | None = None, *, all_: bool = False) -> str | None:
    """The line under the table when jobs are not shown, with the command that shows them."""
    if hidden <= 0:
        return None
    jobs = "job" if hidden == 1 else "jobs"
    if all_:  # only --limit cut the list
        return f"({hidden} more {jobs} not shown: raise --limit)"
    command = " ".join(["cloudtrain status -a", *(filters or Filters()).options()])
    return f"({hidden} older {jobs} not shown: {command})"


def empty_view(store: Store, filters: Filters | None = None) -> str:
    """What `status` says when it shows no job: "no jobs yet" only when there is none;
    else what matched nothing, out of how many, and the command that lists them all (an
    unknown recipe name said as such)."""
    filters = filters or Filters()
    total = store.count_jobs(JobQuery())
    if total == 0:
        return "no jobs yet: cloudtrain launch --recipe resnet9 --profile smoke --follow"
    in_all = f"({total} {'job' if total == 1 else 'jobs'} in all: cloudtrain status -a)"
    if not filters.any():
        return f"no active or recent jobs {in_all}"
    line = f"no jobs match {' '.join(filters.options())} {in_all}"
    from . import recipes

    unknown = [r for r in filters.recipes if r not in recipes.names()]
    if unknown:
        line += f"; no recipe is named {', '.join(unknown)} (cloudtrain recipes lists them)"
    return line


# -- rm and prune --------------------------------------------------------------------------

JOB_ID = re.compile(r"[0-9a-f]{8}\Z")  # Store.create_job's ids: secrets.token_hex(4)


@dataclasses.dataclass
class Removal:
    job: Job
    path: Path | None   # $CLOUDTRAIN_HOME/jobs/<id> where something is there, else None
    bytes: int          # the size of the files below it (a symlink: 0, only the link goes)
    files: int
    link_to: str | None = None  # the path is a symlink to this, which is left alone


@dataclasses.dataclass
class Refusal:
    ref: str            # the job's id, or the reference as given when it names no job
    reason: str         # one line: why it is kept
    hint: str | None = None  # the command that would let it go


@dataclasses.dataclass
class Plan:
    removals: list[Removal]
    refused: list[Refusal]
    cutoff: float | None = None  # prune: jobs that finished before this time

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removals)

    @property
    def files(self) -> int:
        return sum(r.files for r in self.removals)


@dataclasses.dataclass
class Summary:
    removed: list[str]       # ids of the jobs whose rows and directory are gone
    bytes: int               # the bytes of files removed (as planned)
    rows: int                # rows deleted, all tables together
    refused: list[Refusal]   # kept after all: changed since the plan, or files that would
                             # not go (those refused when planning are in Plan.refused)


def plan_removal(store: Store, refs: tuple[str, ...] | list[str] = (), *,
                 older_than: str | None = None, now: float | None = None,
                 home: Path | None = None) -> Plan:
    """What `rm REFS` (ids, id prefixes, names: Store.find_job) or `prune --older-than AGE`
    (jobs that finished before then) would remove; reads only. Jobs that must stay are in
    `refused` with the reason: not finished, an instance that may still bill, an active job
    resuming from its checkpoints; with `rm`, also a reference that names no job."""
    if bool(refs) == (older_than is not None):
        raise UsageError("give job ids or names (rm), or --older-than (prune)"
                         if not refs else "give job ids or --older-than, not both")
    now = time.time() if now is None else now
    home = _home(home)
    refused: list[Refusal] = []
    if refs:
        jobs: list[Job] = []
        for ref in refs:
            # A reference that names no job (or an ambiguous prefix) is a usage error,
            # raised before anything is removed, as every other command refuses it
            job = store.find_job(ref)
            if all(j.id != job.id for j in jobs):
                jobs.append(job)
    else:
        assert older_than is not None  # refs or older_than, checked above
        cutoff = parse_time(older_than, "--older-than", now, destructive=True)
        jobs = store.find_jobs(JobQuery(finished=True, ended_before=cutoff))
    removals = []
    active = store.find_jobs(JobQuery(finished=False))
    for job in jobs:
        kept = why_kept(store, job, active)
        if kept is not None:
            refused.append(kept)
        else:
            removals.append(_measure(job, home))
    return Plan(removals, refused, cutoff=None if refs else cutoff)


def why_kept(store: Store, job: Job, active: list[Job] | None = None) -> Refusal | None:
    """Why `job` must not be removed now, or None (`active`: the jobs not finished, when the
    caller has them at hand)."""
    if job.state not in state.TERMINAL_STATES:
        return Refusal(job.id, f"job {job.id} is {job.state}: only finished jobs are removed",
                       f"stop it first: cloudtrain down {job.id}")
    # The rule `down` uses (lifecycle.stop.holds_instance): an instance on a cloud that is
    # not known to be terminated may still bill (a --keep job's kept instance, a launch cut
    # short); a local one costs nothing.
    live = [i for i in store.instances(job.id) if i.state != "terminated"
            and i.provider != "local"]
    if live:
        return Refusal(job.id, f"job {job.id} is {job.state} but its instance {live[0].id} is "
                       f"{live[0].state} and may still bill",
                       f"terminate it first: cloudtrain down {job.id}")
    for other in store.find_jobs(JobQuery(finished=False)) if active is None else active:
        ref = other.spec.resume_from
        if isinstance(ref, str) and ref and (
                job.id.startswith(ref) or ref == job.name):
            return Refusal(job.id, f"job {job.id}: job {other.id} ({other.state}) resumes from "
                           "its checkpoints", f"wait for job {other.id} to end, or stop it: "
                           f"cloudtrain down {other.id}")
    return None


def _home(home: Path | None) -> Path:
    if home is None:
        from . import config

        home = config.home()
    return Path(home)


def _job_path(home: Path, job_id: str) -> Path | None:
    """$CLOUDTRAIN_HOME/jobs/<id> for a job id as cloudtrain makes them; None for any other
    id (a row edited by hand: `../..` must never become a path to remove)."""
    return home / "jobs" / job_id if JOB_ID.match(job_id) else None


def _measure(job: Job, home: Path) -> Removal:
    path = _job_path(home, job.id)
    try:
        info = os.lstat(path) if path is not None else None
    except FileNotFoundError:
        info = None
    except OSError:  # there, but not ours to read: remove() tries, and says what failed
        return Removal(job, path, 0, 0)
    if info is None or path is None:  # no path: no info
        return Removal(job, None, 0, 0)
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return Removal(job, path, 0, 0, link_to=target)
    if not stat.S_ISDIR(info.st_mode):
        return Removal(job, path, info.st_size, 1)
    size = files = 0
    for top, dirs, names in os.walk(path):  # os.walk never follows symlinks by default
        for name in names + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            try:
                size += os.lstat(os.path.join(top, name)).st_size
                files += 1
            except OSError:
                pass
    return Removal(job, path, size, files)


# A removal commits at least this often: other processes wait for the write lock meanwhile.
BATCH_JOBS, BATCH_S = 200, 0.5


def remove(store: Store, plan: Plan, *, home: Path | None = None) -> Summary:
    """Remove what `plan` names, each job checked again first (it may have changed since the
    plan was shown: a --keep job reused with `launch --on`, a new job resuming from it).

    Order, per job: the check, its files, then its rows, all in one write transaction, and
    the deletion of the rows committed only after the files are gone. The other order can
    strand data: rows committed away, then the process killed (or a file refusing to go),
    leaves a directory that no record names and that no command will ever find or clean.
    This way a job whose files fail to go keeps its rows (rolled back to its savepoint) and
    is reported kept, and a process killed mid-way leaves records (of a few jobs whose files
    are partly or all gone: jobs the user asked to remove) that the same command removes.

    The write lock is held from the check to the commit, so nothing can make a job live
    again in between. Jobs are committed in batches (BATCH_JOBS, BATCH_S: each commit syncs
    the disk, a few ms, and thousands of jobs are pruned at once), each job in a savepoint."""
    home = _home(home)
    removed: list[str] = []
    refused: list[Refusal] = []
    size = rows = 0
    todo = list(plan.removals)
    while todo:
        started, batch_rows = time.monotonic(), 0
        batch: list[Removal] = []
        with store.transaction() as db:
            # Nothing can change while this transaction holds the write lock: the active jobs
            # read here stay the active jobs until its commit.
            active = store.find_jobs(JobQuery(finished=False))
            while todo and len(batch) < BATCH_JOBS and time.monotonic() - started < BATCH_S:
                planned = todo.pop(0)
                job_id = planned.job.id
                try:
                    job = store.job(job_id)
                except NotFound:
                    refused.append(Refusal(job_id, f"job {job_id} was removed meanwhile"))
                    continue
                kept = why_kept(store, job, active)
                if kept is not None:
                    refused.append(kept)
                    continue
                db.execute("SAVEPOINT remove_job")
                try:
                    _remove_path(_job_path(home, job_id))
                    _remove_path(home / "secrets" / f"{job_id}.json" if _job_path(
                        home, job_id) is not None else None)  # lifecycle.secrets' copy, if any
                    batch_rows += store.delete_job(job_id)
                except OSError as exc:
                    db.execute("ROLLBACK TO remove_job")
                    refused.append(Refusal(job_id, f"job {job_id}: could not remove "
                                           f"{exc.filename or planned.path}: "
                                           f"{exc.strerror or exc}; its records are kept",
                                           "fix the permissions, then run the command again"))
                    continue
                finally:
                    db.execute("RELEASE remove_job")
                batch.append(planned)
        removed += [r.job.id for r in batch]  # committed
        size += sum(r.bytes for r in batch)
        rows += batch_rows
    return Summary(removed, size, rows, refused)


def _remove_path(path: Path | None) -> None:
    """Remove the job's directory; a symlink there is unlinked, never followed (what it
    points to is not ours), and so is a file; what is not there is already gone."""
    if path is None:
        return
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        import shutil  # here: `status` imports this module, and shutil costs it 4 ms

        # rmtree does not follow symlinks below it, and on Linux removes through directory
        # descriptors (rmtree.avoids_symlink_attacks): a directory swapped for a link while it
        # works is not followed either.
        shutil.rmtree(path)
    else:
        os.unlink(path)
