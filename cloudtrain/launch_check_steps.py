"""`cloudtrain check --launch`'s bookkeeping: each step timed, judged and said as it ends
(Step, the Report, `failed`), and the record of what the steps found and made (Check).

Below launch_check and launch_check_teardown, which run the steps; imports only config,
state and errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable

from . import config, state
from .errors import CloudError, CloudtrainError

if TYPE_CHECKING:
    from .providers.aws import AWSProvider


@dataclasses.dataclass
class Step:
    name: str  # "credentials", "RunInstances", "job store round trip", ...
    seconds: float
    ok: bool
    detail: str  # what was found, or why it failed (one line)
    hint: str = ""  # a failure's remedy: the permission, quota or setting, and what to run
    data: dict = dataclasses.field(default_factory=dict)  # the facts, for --json


@dataclasses.dataclass
class Report:
    steps: list[Step] = dataclasses.field(default_factory=list)
    region: str | None = None
    instance_type: str | None = None
    price_per_hour: float | None = None
    job_id: str | None = None
    cost_usd: float | None = None  # what EC2 bills for it, the 60-second minimum included
    interrupted: str | None = None  # the signal's name, when one stopped it

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(s.ok for s in self.steps)


class Stopped(Exception):
    """A step failed (it is recorded): the check goes no further than the teardown."""


class Steps:
    """The steps as they happen: each timed, recorded in the report and said at once."""

    def __init__(self, report: Report, say: Callable[[Step], None] | None):
        self.report, self.say = report, say

    def add(self, step: Step) -> None:
        self.report.steps.append(step)
        if self.say is not None:
            self.say(step)

    @contextlib.contextmanager
    def step(self, name: str):
        """`with steps.step(name) as s:` the body sets s.detail (and s.data); a
        CloudtrainError fails the step (raised on as Stopped), an interruption too (raised
        on as it is)."""
        started = time.monotonic()
        box = SimpleNamespace(name=name, detail="", data={})  # the body may rename the step
        try:
            yield box
        except BaseException as exc:
            self.add(failed(box.name, time.monotonic() - started, exc))
            if isinstance(exc, CloudtrainError):
                raise Stopped() from exc
            raise
        self.add(Step(box.name, time.monotonic() - started, True, box.detail, data=box.data))


def failed(name: str, seconds: float, exc: BaseException) -> Step:
    """A failed step in words: AWS's refusal with its IAM action, an interruption with its
    signal, anything else as it was said."""
    if isinstance(exc, KeyboardInterrupt):
        return Step(name, seconds, False, f"interrupted ({getattr(exc, 'signame', 'SIGINT')}): "
                    "what was started is terminated", data={"interrupted": True})
    if not isinstance(exc, CloudtrainError):
        return Step(name, seconds, False, f"{type(exc).__name__}: {exc}")
    data = {}
    code = getattr(exc, "code", "") or ""
    if code:
        data["code"] = code
    action = re.search(r"not allowed: ([\w-]+:\w+)", exc.message)
    if action:
        data["action"] = action.group(1)
    hint = exc.hint or ""
    if isinstance(exc, CloudError) and exc.quota:
        data["quota"] = True
    return Step(name, seconds, False, " ".join(exc.message.split()), hint, data)


@dataclasses.dataclass(frozen=True)
class Flow:
    """Another check on the same resources and teardown (launch_check_recovery's): what it
    needs of the settings (a read-only step, its detail), the question before launching,
    the job's launch options, and the steps after the launch (returning the job as it
    ended). `spot`: its instance is a spot one; `instance_type`: (type, on-demand USD/h,
    where the price came from) where it needs another type than the plain check's;
    `leftovers`: what else of the job the cleanup must find gone ({kind: [names]}), and
    `left_words` those kinds in the cleanup's line."""
    name: str
    spot: bool
    requires: Callable[["Check"], str]
    question: Callable[["Check", "Report"], str]
    job: Callable[["Check"], dict]
    steps: Callable[["Check", Steps, state.Job], state.Job]
    instance_type: Callable[["Check"], tuple[str, float, str]] | None = None
    leftovers: Callable[["Check", str], dict] | None = None
    left_words: str = ""


@dataclasses.dataclass
class Check:
    """What the steps found and made, for the later steps and the teardown."""
    settings: config.Settings
    provider: AWSProvider
    store: state.Store
    gpu: bool
    nonce: str
    region: str = ""
    owner: str = ""
    key_name: str = ""
    group: str = ""
    disk_gb: int | None = None
    bucket: str | None = None  # None: no job store (job_store: false)
    role_probe: str | None = None  # the job-store "job" whose object the role reads
    role_url: str | None = None  # s3:// of that object
    workdir: Path | None = None
    job_id: str | None = None
    launched: bool = False  # the teardown has something to look at
    flow: Flow | None = None  # another job and steps (--recovery); None: the plain one
    fis: tuple[str, str] | None = None  # (experiment template, experiment) a flow started
    synced: str = "check.txt"  # the one file the job's sync sends

    @property
    def name(self) -> str:
        return f"check-launch-{self.nonce[:8]}"

    @property
    def line(self) -> str:
        """What the synced file holds and the job prints."""
        return f"cloudtrain check --launch {self.nonce}"

    @property
    def role_line(self) -> str:
        return f"read with the instance role {self.nonce}"
