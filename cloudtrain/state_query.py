"""Which jobs a query means: JobQuery, and the SQL that finds them in the store (state.py)."""

from __future__ import annotations

import dataclasses
import sqlite3

# When a job finished: its end, else (a row without one) its creation (index jobs_finished_at).
FINISHED_AT = "coalesce(ended_at, created_at)"


def _fnmatchcase(name, pattern) -> int:
    import fnmatch

    return isinstance(name, str) and isinstance(pattern, str) and \
        fnmatch.fnmatchcase(name, pattern)


@dataclasses.dataclass(frozen=True)
class JobQuery:
    """Which jobs Store.find_jobs and count_jobs mean: every condition given holds."""
    states: tuple[str, ...] = ()        # the job is in one of these states (empty: any)
    recipes: tuple[str, ...] = ()       # the job ran one of these recipes (empty: any)
    name: str | None = None             # the job has this name (with name_glob:
    name_glob: str | None = None        # or one this shell glob, fnmatch, matches)
    created_since: float | None = None  # created at or after this time (epoch seconds)
    finished: bool | None = None        # True: in a terminal state; False: any other state
    ended_since: float | None = None    # finished (FINISHED_AT) at or after this time
    ended_before: float | None = None   # finished before this time


def sql_where(db: sqlite3.Connection, query: JobQuery, finished_states: tuple[str, ...]
              ) -> tuple[str, list]:
    """The WHERE clause (with its parameters) of the jobs `query` means; `finished_states`:
    the terminal states, written out in the SQL."""
    terms: list[str] = []
    params: list[object] = []
    if query.states:
        terms.append("state IN (%s)" % ",".join("?" * len(query.states)))
        params += query.states
    if query.finished is not None:  # a state no version wrote counts as not finished
        # Constants written out, not bound: SQLite matches a partial index's condition
        # (jobs_unfinished) only against the same literal terms. `+state` keeps the state
        # index out of the finished query: by when they finished (jobs_finished_at) a
        # few rows are read, by state nearly all of them.
        terms.append(("+state IN %s" if query.finished else "state NOT IN %s")
                     % ("(%s)" % ", ".join(f"'{s}'" for s in finished_states)))
    if query.recipes:
        terms.append("recipe IN (%s)" % ",".join("?" * len(query.recipes)))
        params += query.recipes
    if query.name is not None or query.name_glob is not None:
        glob = "name GLOB ?"
        if query.name_glob is not None and "[" in query.name_glob:
            # Sets differ: the shell's [!a] is SQLite's [^a], whose ^ is the shell's
            # literal. Python's fnmatch decides those (a function call per row).
            db.create_function("fnmatchcase", 2, _fnmatchcase, deterministic=True)
            glob = "fnmatchcase(name, ?)"
        names = [("name = ?", query.name), (glob, query.name_glob)]
        terms.append("(%s)" % " OR ".join(t for t, v in names if v is not None))
        params += [v for _, v in names if v is not None]
    for column, op, value in (("created_at", ">=", query.created_since),
                              (FINISHED_AT, ">=", query.ended_since),
                              (FINISHED_AT, "<", query.ended_before)):
        if value is not None:
            terms.append(f"{column} {op} ?")
            params.append(float(value))
    return (" WHERE " + " AND ".join(terms)) if terms else "", params
