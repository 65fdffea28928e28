"""Whether the state database is usable, and what a failing one means to the user.

A database error mid-command is often not the file's fault: two processes recording the same
fact at once, a lock held too long. Only a check of the file itself (SQLite's quick_check, and
the schema against the one the migrations write) may say it is unusable, and only then is
the user told to move it aside, which loses every job's records. Imports state_schema, errors
and the standard library.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .errors import CloudtrainError, UsageError
from .state_schema import schema_problem


def database_error(path: Path, exc: sqlite3.Error) -> CloudtrainError:
    """What a failing state database means to the user, in one line with what to do. The
    advice to move the file aside (which loses every job's records) is given only when a
    check of the file itself (check_database) finds it unusable: a refused write in a
    sound database (two processes recording the same fact at once, a constraint) is said as
    what it is."""
    code = getattr(exc, "sqlite_errorname", "")
    if code in ("SQLITE_BUSY", "SQLITE_LOCKED") or "locked" in str(exc):
        return CloudtrainError(f"{path} is locked by another cloudtrain process ({exc})",
                               hint="try again when it is done")
    if code == "SQLITE_FULL":
        return CloudtrainError(f"cannot write {path}: the disk is full")
    if code in ("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_AUTH") or \
            code.startswith("SQLITE_IOERR"):
        return UsageError(f"cannot use {path}: {exc}",
                          hint="check that the file and its folder are yours and writable")
    problem = check_database(path)
    if problem is None and isinstance(exc, sqlite3.IntegrityError):
        return CloudtrainError(
            f"{path} refused a change ({exc}); the database itself is sound (PRAGMA "
            "quick_check: ok; cloudtrain's schema)",
            hint="another cloudtrain process may have recorded the same thing at that "
                 "moment: run the command again (if it happens again, run it with --debug "
                 "and report the traceback)")
    if problem is None:
        return CloudtrainError(
            f"{path} failed ({exc}), yet the database checks out (PRAGMA quick_check: ok; "
            "cloudtrain's schema)",
            hint="run the command again (if it happens again, run it with --debug and report "
                 "the traceback)")
    if problem.startswith(UNCHECKED):
        return CloudtrainError(f"{path} failed ({exc}), and {problem}",
                               hint="run the command again")
    return UsageError(f"{path} is not a usable cloudtrain database: {exc}",
                      hint=f"move it aside (mv {path} {path}.broken) or restore it from a "
                           "backup; cloudtrain then starts a new, empty one")


UNCHECKED = "it could not be checked"
CHECK_TIMEOUT_S = 5.0


def check_database(path: Path) -> str | None:
    """What makes the file at `path` unusable as cloudtrain's database (SQLite's own check
    fails, or its schema is not the one this version writes), or None where it is sound.
    Read-only, on a connection of its own; a check that cannot run says so, beginning with
    UNCHECKED."""
    if not Path(path).is_file():
        return f"{UNCHECKED}: there is no such file"
    try:
        db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True,
                             timeout=CHECK_TIMEOUT_S)
    except sqlite3.Error as exc:
        return f"{UNCHECKED}: {exc}"
    try:
        rows = [r[0] for r in db.execute("PRAGMA quick_check")]
        if rows != ["ok"]:
            return "PRAGMA quick_check: " + "; ".join(str(r) for r in rows[:3])
        return schema_problem(db)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or getattr(exc, "sqlite_errorname", "") in (
                "SQLITE_BUSY", "SQLITE_LOCKED"):
            return f"{UNCHECKED}: {exc}"
        return str(exc)
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        db.close()
