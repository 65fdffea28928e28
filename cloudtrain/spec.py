"""JobSpec: what to run (a recipe, or your own command) and where (backend, resources)."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from .errors import UsageError

RECIPE, COMMAND = "recipe", "command"


@dataclass
class JobSpec:
    kind: str  # RECIPE or COMMAND
    backend: str  # a provider name: "local", ...
    name: str | None = None
    recipe: str | None = None
    profile: str | None = None
    args: dict = field(default_factory=dict)  # recipe arguments after profile and --set
    command: list[str] = field(default_factory=list)  # the user's command (kind COMMAND)
    workdir: str | None = None  # absolute path on this machine, synced into the job
    max_runtime_s: float = 12 * 3600.0  # the agent stops the job after this long
    resources: dict = field(default_factory=dict)  # gpus_per_node, nodes, disk_gb
    requires: list[str] = field(default_factory=list)  # Python modules the job imports
    resume_from: str | None = None  # a job id whose checkpoints this job starts from
    procs: int | None = None  # processes per host (torchrun recipes); None: the host's GPUs
    gpus_needed: int = 0  # GPUs on one host the recipe's arguments require (0: no requirement)
    gpus_exact: bool = True  # False: gpus_needed is a default that --procs may override
    # Cloud placement (ignored by the local backend)
    instance_type: str | None = None
    market: str = "on-demand"  # "on-demand" or "spot" (one-time request, terminate on interruption)
    region: str | None = None
    ami: str | None = None  # None: the current AWS Deep Learning PyTorch AMI
    disk_gb: int | None = None
    max_price: float | None = None  # spot only, USD/h
    keep: bool = False  # leave the instance running after the job
    idle_minutes: float | None = None  # power off this long after the job ends
    on_job: str | None = None  # run on that (kept) job's instance instead of a new one
    expected: dict | None = None  # the estimate shown before launch: train_s, total_s, usd

    def display(self) -> str:
        """One line saying what runs: `resnet9 (smoke)` or the command."""
        if self.kind == RECIPE:
            return f"{self.recipe} ({self.profile})" if self.profile else str(self.recipe)
        if len(self.command) == 1:
            return self.command[0]
        return shlex.join(self.command)

    def processes(self, gpus: int) -> int:
        """How many processes the job starts on a host with `gpus` GPUs: --procs if given;
        else, for a recipe whose arguments are set up for N GPUs, N (refused on a host with
        fewer); else one per GPU for torchrun recipes (one on a host without GPUs); else one."""
        n = self.gpus_needed
        if self.procs:
            procs = self.procs
        elif n:
            procs = n
            if n > max(gpus, 1):
                what = f"with gpus={n}" if self.gpus_exact else \
                    f"variant {self.args.get('variant')}"
                other = f"pass --procs {n} to run {n} processes anyway (gloo on CPU)" \
                    if self.gpus_exact else "pass --procs N to run it on N processes (a " \
                                            "different global batch from the published run)"
                raise UsageError(f"recipe {self.recipe} {what} runs one process per GPU on {n} "
                                 f"GPUs, but this host has {gpus} GPU(s)",
                                 hint=f"launch on an instance with {n} GPUs (--gpus "
                                      f"{self.resources.get('gpu', 'V100')}:{n}), or {other}")
        else:
            torchrun = self.kind == RECIPE and self.resources.get("launcher") == "torchrun"
            procs = max(gpus, 1) if torchrun else 1
        if n > 1 and procs != n and self.gpus_exact:
            raise UsageError(f"recipe {self.recipe} with gpus={n} needs {n} processes, not "
                             f"--procs {procs}", hint=f"pass --procs {n}, or --set gpus={procs}")
        return procs

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
