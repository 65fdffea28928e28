"""Stage: plan, before anything is created or billed: what `launch --dry-run` shows, what
a launch says and asks first (the question, the estimate), and the checks of the name, the
workdir and the sources a launch makes before it records anything. It may call sources
(and through them watch).

    plan(spec, store, settings)       the dry run's rows
    question(spec, warn)              the price to confirm, or why a run would not finish
    expected(spec, store)             the estimate of a cloud recipe job, kept with its spec
    check_name(store, spec)           the finished job whose name this launch takes, if any
    name_note(spec, taken, launched)  what is said of that
    read_datasets(spec, settings)     what the job's datasets hold (a missing one stops here)
    workdir_warning / credentials_sent / warn_about_workdir  what a workdir would send
    taken_from_shell(spec)            what a job file takes from this shell, asked first
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

from .. import config, datasets, progress, providers
from ..errors import CloudtrainError, UsageError
from ..gitignore import survey
from ..hosts import measure
from ..job_env import consent
from ..market import Market
from ..providers.base import Account, Question
from ..spec import JobSpec
from ..state import Job, Store
from .sources import kept_source, resume_source


def plan(spec: JobSpec, store: Store | None = None, settings: config.Settings | None = None
         ) -> list[tuple[str, str]]:
    """What `launch` would do for this spec (`--dry-run`): nothing is created or billed. The
    datasets are read (with the user's credentials) for their sizes; one that cannot be read
    is said, as the launch would stop on it."""
    data_rows = []
    if spec.data.datasets:
        try:
            settings = settings or config.Settings.load()
            spec, found = read_datasets(spec, settings)
            data_rows = [("data", datasets.staging_line(spec))] + [
                ("note", note) for note in datasets.notes(spec, settings, found)]
        except datasets.MissingFolders:
            raise  # the data is there, but not what the job reads: refused, as the launch is
        except CloudtrainError as exc:
            data_rows = [("data", f"cannot be read, the launch would stop: {exc.message}")]
    renamed = None
    if store is not None:  # the checks the launch makes on the name, --on, --resume-from
        renamed = check_name(store, spec)
        spec, _ = kept_source(store, spec)
        resume_source(store, settings or config.Settings.load(), spec)
    spec, row = expected(spec, store)  # a deadline may move the market before anything
    rows = [("job", spec.display()), *_given_rows(spec),
            *providers.get(spec.backend).plan(spec), *data_rows]
    if renamed is not None:  # the name row says whose name it takes
        rows = [("name", name_note(spec, renamed, launched=False)) if key == "name" else
                (key, value) for key, value in rows]
    if row is not None:
        from ..catalog_views import estimate_line

        rows.append(("estimate", estimate_line(row, spec.placement.market)[len("estimate: "):]))
    return rows + deadline_rows(spec)


def _given_rows(spec: JobSpec) -> list[tuple[str, str]]:
    """What the job takes besides its command, as the plan's rows: its name, the
    workdir's files (and those held back), setup's first line, the names of its envs and
    secrets (never a secret's value), its outputs; warnings on what the workdir sends."""
    rows = [("name", spec.name)] if spec.name else []
    if spec.workdir:
        found = survey(Path(spec.workdir), tuple(spec.include))
        count, size = measure(Path(spec.workdir), files=found.files)
        rows.append(("workdir", f"{spec.workdir}: {count} file{'' if count == 1 else 's'}, "
                                f"{progress.megabytes(size)} to sync"
                     + (f"; {_held_back(found.held_back)}" if found.held_back else "")))
        for line in (workdir_warning(Path(spec.workdir), tuple(spec.include)),
                     credentials_sent(spec)):
            if line:
                rows.append(("WARNING", line.removeprefix("WARNING: ")))
    if spec.setup:
        lines = [line.strip() for line in spec.setup.splitlines() if line.strip()]
        more = len(lines) - 1
        rows.append(("setup", lines[0] + (f" (and {more} more line{'' if more == 1 else 's'})"
                                           if more else "")))
    shell = {t.name: t for t in spec.from_shell}
    for key, names in (("env", sorted(spec.envs)), ("secrets", spec.secrets)):
        if names:
            rows.append((key, ", ".join(n + _from_shell(shell.get(n)) for n in names)))
    if spec.outputs:
        rows.append(("outputs", ", ".join(spec.outputs)))
    return rows


def _from_shell(taken) -> str:
    """What the dry run says of a value that comes from your environment (its name
    only): and whether the launch asks first (a job file's, not one you typed)."""
    if taken is None:
        return ""
    return " (from your environment: the launch asks first)" if taken.at else \
        " (from your environment)"


def taken_from_shell(spec: JobSpec):
    """The values a job file takes from this shell, as the question the launch asks in a
    terminal whatever -y says, and the error without one (job_env.Consent); None when the
    job file takes none (a typed --secret NAME is the user's own)."""
    return consent(spec.from_shell, spec.origins.get(""))


def question(spec: JobSpec, warn: Callable[[str], None] | None = None
             ) -> Question | None:
    """What `launch` says and asks before it goes on: the price of the paid resources it
    creates, or why a run here would not finish (a GPU recipe on a machine without a GPU).
    `warn`: the plan's warnings are said through it at once (and left out of the question),
    before the check that there are credentials to launch with (before anything is asked
    or recorded; a warning is neither)."""
    provider = providers.get(spec.backend)
    provider.preflight(spec)  # what cannot work is refused before anything is asked
    asked = provider.question(spec)
    if asked is not None and warn is not None:
        for line in asked.warnings:
            warn(line)
        asked.warnings = []
    if isinstance(provider, Account):  # nor is a launch asked about that cannot start
        provider.ready(spec)  # (no credentials)
    return asked


def expected(spec: JobSpec, store: Store | None = None) -> tuple[JobSpec, object]:
    """The estimate (time and cost) of a cloud recipe job on its instance type, from the
    recipe's published result (estimate.py), or None where there is no basis for one; and
    the spec that keeps it (`expected`), so that `status JOB` can set it against the bill."""
    if spec.backend != "aws" or spec.on_job:
        return spec, None
    from .. import estimate

    try:
        region = providers.get(spec.backend).account.region(spec)
    except CloudtrainError:
        return spec, None
    row = estimate.for_spec(spec, region, store)
    decided = deadline_decision(spec, row)
    if decided is not None and spec.placement.market == Market.SPOT and \
            decided.market == Market.ON_DEMAND:  # the slack is out before the first attempt
        spec = spec.changed(market=Market.ON_DEMAND, max_price=None, recover=False,
                            fallback=None)
    if row is not None:
        spec = dataclasses.replace(spec, expected={
            "train_s": row.train_s, "total_s": row.total_s, "market": spec.placement.market,
            "usd": row.spot if spec.placement.market == Market.SPOT else row.on_demand,
            "basis": row.scaling})
    if decided is not None:
        kept = {"why": decided.why, "switch_at": decided.switch_at,
                "market": str(decided.market)}
        if spec.budget_usd is not None and row is not None and row.spot and \
                row.on_demand and row.total_s:
            from .. import deadline

            hours = max(float(row.total_s), 1.0) / 3600.0  # the estimate's run, per hour
            kept["binds"] = deadline.weigh(decided, spec.budget_usd, row.spot / hours,
                                           row.on_demand / hours).line
        spec = dataclasses.replace(spec, expected={**(spec.expected or {}), "deadline": kept})
    return spec, row


# Before a first launch nothing is measured: an own command's work is bounded by its max
# runtime, its start by a typical boot and setup, its checkpoint interval by ten minutes.
LAUNCH_S, CHECKPOINT_S = 300.0, 600.0


def deadline_decision(spec: JobSpec, row=None, now: float | None = None,
                      work_s: float | None = None, interruptions: int = 0,
                      spot_hours: float = 0.0):
    """deadline.decide for the job's next attempt, or None without a deadline: the work
    left (`work_s`, else the estimate's training time, else the max runtime), the launch
    (the estimate's boot and setup), the checkpoint interval (a recipe's epoch), the
    interruptions seen so far."""
    if spec.deadline_at is None:
        return None
    from .. import deadline

    train = float(row.train_s) if row is not None and row.train_s else spec.max_runtime_s
    launch = float(row.total_s - row.train_s) if row is not None and row.total_s and \
        row.train_s else LAUNCH_S
    epochs = spec.args.get("epochs")
    checkpoint = train / epochs if isinstance(epochs, int) and not isinstance(epochs, bool) \
        and epochs > 0 else min(train, CHECKPOINT_S)
    return deadline.decide(deadline.Situation(
        work_s=max(0.0, train if work_s is None else work_s),
        now=time.time() if now is None else now, deadline=spec.deadline_at,
        launch_s=max(0.0, launch), checkpoint_s=checkpoint, interruptions=interruptions,
        spot_hours=spot_hours))


def deadline_rows(spec: JobSpec) -> list[tuple[str, str]]:
    """The plan's line on the deadline: the market it decided and why, and with a budget
    which of the two binds (as `expected` kept them)."""
    kept = (spec.expected or {}).get("deadline")
    if spec.deadline_at is None or not isinstance(kept, dict):
        return []
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(spec.deadline_at))
    rows = [("deadline", f"{when}: {kept['why']}")]
    if kept.get("binds"):
        rows.append(("binds", kept["binds"]))
    return rows


def check_name(store: Store, spec: JobSpec) -> Job | None:
    """A name refers to one job, the newest of that name: a name held by a job
    that has not finished is refused (`down NAME` would not know which); one held by a
    finished job moves to the new launch, so a job file with `name:` runs again and again.
    Returns the finished job that gives up the name, if any."""
    if not spec.name:
        return None
    taken = store.job_named(spec.name)
    if taken is None:
        return None
    if taken.active:
        raise UsageError(f"--name {spec.name}: job {taken.id} ({taken.state}) has that name "
                         f"and has not finished",
                         hint=f"stop it first (cloudtrain down {spec.name}), or give another "
                              f"name, e.g. --name {spec.name}-2")
    return taken


def name_note(spec: JobSpec, taken: Job | None, launched: bool) -> str | None:
    """What a launch says of a name it takes over from a finished job."""
    if taken is None:
        return None
    if launched:
        return (f"the name {spec.name} moves from job {taken.id} ({taken.state}) to this one; "
                f"that job keeps its id")
    return f"{spec.name} now names job {taken.id} ({taken.state}); this job takes the name"


def read_datasets(spec: JobSpec, settings: config.Settings) -> tuple[JobSpec, list]:
    """Read what the job's datasets hold (datasets.preflight), before anything is created:
    the spec with their sizes (and the disk and time they need), and what was read."""
    return datasets.preflight(spec, settings, providers.DatasetReader(settings))


def warn_about_workdir(workdir: Path, include: tuple[str, ...],
                       say: Callable[[str], None] | None) -> None:
    """A workdir that is the home directory, holds it, or holds cloudtrain's own is
    synced without the credential-looking files (gitignore.CREDENTIAL_PATTERNS) but is almost
    surely a mistake: said with what is actually sent, what was held back, and what an
    --include sent anyway. Of any other workdir, the credential-looking files held back."""
    if say is None:
        return
    line = workdir_warning(workdir, include)
    if line is None:  # any other workdir: what the sync leaves out, said
        held = survey(workdir, include).held_back
        line = f"{_held_back(held)} from the workdir (--include PATTERN sends one)" \
            if held else None
    if line:
        say(line)


def workdir_warning(workdir: Path, include: tuple[str, ...] = ()) -> str | None:
    """The WARNING line for a workdir that is, or holds, the home directory or
    $CLOUDTRAIN_HOME (None for any other)."""
    where, home, state = Path(workdir).resolve(), Path.home().resolve(), config.home()
    if where == home:
        what = "is your home directory"
    elif home.is_relative_to(where):
        what = f"holds your home directory {home}"
    elif state.is_relative_to(where):
        what = f"holds cloudtrain's state {state}"
    else:
        return None
    found = survey(where, include)
    count, size = measure(where, files=found.files)
    line = (f"WARNING: the workdir {where} {what}: {count} file{'' if count == 1 else 's'} "
            f"({progress.megabytes(size)}) are sent to the host; "
            f"{_held_back(found.held_back)}")
    if found.included:
        line += f"; sent anyway by --include: {', '.join(found.included)}"
    return line


def _held_back(files: list[str], shown: int = 5) -> str:
    """`N credential-looking files held back (a, b, ... and M more)`."""
    n = len(files)
    if not n:
        return "no credential-looking file found"
    names = ", ".join(files[:shown]) + (f" and {n - shown} more" if n > shown else "")
    return f"{n} credential-looking file{'' if n == 1 else 's'} held back ({names})"


def credentials_sent(spec: JobSpec) -> str | None:
    """What `--include` sends that the sync would otherwise hold back, as the line the
    launch asks (in a terminal, whatever -y says) or warns with: each file named."""
    if not spec.workdir or not spec.include:
        return None
    sent = survey(Path(spec.workdir), tuple(spec.include)).included
    if not sent:
        return None
    return (f"--include sends {len(sent)} credential-looking file{'' if len(sent) == 1 else 's'}"
            f" to the host: {', '.join(sent)}")
