"""LaunchOptions: what `cloudtrain launch` was asked for, from its flags, a job file, or both.

One typed value travels from the CLI and the job file (jobfile.py fills it) to the job spec
(spec.build_spec checks it and turns it into a JobSpec). Its fields are the launch flags'
names (the click parameter names, which the job file's keys map to: jobfile.KEYS), each in the
flag's own form: `sets` as ("k=v", ...), `spot` as a bool, `max_runtime` in minutes. None (or
an empty tuple for a repeatable flag) is "not given".

Imports the market's type only: it sits below the CLI, the job file and the spec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .market import Market

# The options that place a job on a cloud (JobSpec's fields of the same names); `spot` gives
# the market.
PLACEMENT = ("instance_type", "gpus", "region", "ami", "disk_gb", "max_price", "keep",
             "idle_minutes", "on_job", "recover", "max_restarts", "fallback", "cpu_only",
             "reservation", "block_fee")
OFF_WHEN_FALSE = ("cpu_only",)  # flags that only switch something on (--no-keep says no)
NO_PROFILE = "none"  # `--profile none`: the recipe's full run, whatever a job file says
# Launch options that repeat: a job file's list first, then the flags'.
REPEATED = ("sets", "envs", "secrets", "outputs", "include", "data")


@dataclass
class LaunchOptions:
    recipe: str | None = None
    profile: str | None = None  # NO_PROFILE: none, whatever a job file says
    sets: tuple[str, ...] = ()  # recipe arguments, "key=value"
    name: str | None = None
    backend: str | None = None
    workdir: str | None = None
    max_runtime: float | None = None  # minutes
    budget: float | None = None  # USD, every attempt of the job
    deadline: float | None = None  # seconds since the epoch: when the job must have finished
    instance_type: str | None = None
    gpus: str | None = None  # "GPU:N": the cheapest type with them
    procs: int | None = None
    nodes: int | None = None
    spot: bool | None = None  # None: the configured market
    recover: bool | None = None
    max_restarts: int | None = None
    fallback: str | None = None
    region: str | None = None
    ami: str | None = None
    disk_gb: int | None = None
    max_price: float | None = None
    reservation: str | None = None  # cr-…: capacity the user holds
    block_fee: float | None = None  # USD: what that Capacity Block cost
    keep: bool | None = None
    idle_minutes: float | None = None
    on_job: str | None = None
    include: tuple[str, ...] = ()
    data: tuple[str, ...] = ()  # "NAME=SOURCE" or "NAME"
    cpu_only: bool | None = None
    envs: tuple[str, ...] = ()  # "KEY=VALUE" or "KEY" (this shell's value)
    secrets: tuple[str, ...] = ()
    setup: str | None = None
    outputs: tuple[str, ...] = ()
    resume_from: str | None = None
    command: tuple[str, ...] = ()  # the user's command; a job file's run: is one word of shell
    regions: tuple[str, ...] = ()  # a job file's: where --gpus looks (config.yaml's regions)
    # Where the options a job file gave came from, {option: "job.yaml:7:
    # resources.disk_gb"}, and {"": "job.yaml"} for the file; `envs.NAME` for one item.
    origins: dict = field(default_factory=dict)

    @classmethod
    def of(cls, values: dict, origins: dict | None = None) -> "LaunchOptions":
        """The options among `values` ({option: value}, e.g. click's parameters: the others,
        --dry-run or --yes, are not launch options), a repeatable one as a tuple."""
        names = {f.name for f in dataclasses.fields(cls)} - {"origins"}
        given: dict[str, Any] = {  # each option's value, of its field's type
            k: tuple(v or ()) if k in REPEATED or k in ("command", "regions") else v
            for k, v in values.items() if k in names}
        return cls(**given, origins=dict(origins or {}))

    def given(self) -> dict:
        """{option: value} of what is set (not None, not an empty tuple), origins left out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "origins" and getattr(self, f.name) not in (None, ())}

    def market(self) -> Market | None:
        """--spot / --on-demand, or None when neither was given (the configured market)."""
        return None if self.spot is None else Market.SPOT if self.spot else Market.ON_DEMAND

    def placement(self) -> dict:
        """The cloud placement given, as JobSpec fields: `market` from spot; a flag that only
        switches something on (--cpu-only) counts only when on."""
        out = {k: getattr(self, k) for k in PLACEMENT if getattr(self, k) is not None
               and not (k in OFF_WHEN_FALSE and getattr(self, k) is False)}
        if self.spot is not None:
            out["market"] = self.market()
        return out

    def recipe_profile(self) -> str | None:
        """The profile asked for: None for none at all (NO_PROFILE drops a job file's)."""
        return None if self.profile == NO_PROFILE else self.profile

    def over(self, from_file: "LaunchOptions") -> "LaunchOptions":
        """These options (the flags typed on the command line, only those) over a job file's.
        Repeated options add up, the file's first. The file's origins stay only for what the
        flags left to it."""
        origins = dict(from_file.origins)
        merged: dict[str, Any] = {}  # each option's value, of its field's type
        for option, value in self.given().items():
            if option in REPEATED:
                merged[option] = tuple(getattr(from_file, option)) + tuple(value)
                for word in value:
                    origins.pop(f"{option}.{item(option, word)}", None)
            else:
                merged[option] = value
                origins.pop(option, None)
        return dataclasses.replace(from_file, **merged, origins=origins)


def item(option: str, word: str) -> str:
    """What names one word of a repeated option in the origins: the NAME of `--set
    NAME=VALUE`, `--env`, `--secret` and `--data`; the whole word of `--output` and
    `--include`."""
    return str(word).partition("=")[0] if option in ("sets", "envs", "secrets", "data") \
        else str(word)
