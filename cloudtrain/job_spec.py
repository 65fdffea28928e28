"""The records of a job that every layer reads: JobSpec, what the user asked (what runs, where,
how it recovers), and JobFacts, what the lifecycle and the provider learnt as it ran (its
attempt, where its job store is, the cloud's names for what was made for it).

state.Store parses both where a job is loaded: nothing reads a job's stored spec as a dict.
spec.build_spec makes a JobSpec from what the user typed. Imports only errors and market;
recipes, in display(), to compare the arguments with the profile's.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from . import catalog
from .errors import UsageError
from .market import Market

RECIPE, COMMAND = "recipe", "command"


@dataclass(frozen=True)
class Placement:
    """Where and how the cloud runs the job's instances (ignored by the local backend)."""
    instance_type: str | None = None
    market: Market = Market.ON_DEMAND
    region: str | None = None
    ami: str | None = None  # None: the current AWS Deep Learning PyTorch AMI
    disk_gb: int | None = None
    max_price: float | None = None  # spot only, USD/h
    cpu_only: bool = False  # an instance type without a GPU, on purpose (else refused)
    # Types of the same GPUs the job may also run on, where --gpus chose its type (not
    # --instance): tried after its own type in every AZ, an Auto Scaling group's other
    # overrides; catalog.equivalents.
    alternatives: list[str] = field(default_factory=list)
    # Capacity the user holds (--reservation cr-…): an On-Demand Capacity Reservation or a
    # Capacity Block the job's instances launch into (providers/aws/reservations.py), and
    # what a block cost (--block-fee, USD: EC2 does not show it after the purchase).
    reservation: str | None = None
    block_fee: float | None = None

    def types(self) -> list[str]:
        """The types the job's instances may be: its own, then its alternatives (a launch
        that finds no capacity for one takes the next; a group's overrides)."""
        return [self.instance_type or "", *self.alternatives]


@dataclass(frozen=True)
class Recovery:
    """Spot recovery (lifecycle/recovery.py): on an interruption the job continues on a new
    instance from its last checkpoint, at most max_restarts times; `fallback` "on-demand" lets
    a relaunch that finds no spot capacity anywhere take an on-demand instance."""
    recover: bool = False
    max_restarts: int = 3
    fallback: str | None = None


@dataclass(frozen=True)
class Data:
    """The datasets staged before the job starts (datasets.resolve): [{name, dir, kind,
    location, ...}]; what they hold once read (datasets.preflight) goes in `staging`, with the
    root volume's throughput and the time allowed for the copy that preflight sized for them."""
    datasets: list[dict] = field(default_factory=list)
    staging: dict = field(default_factory=dict)
    disk_mbps: int | None = None  # the root volume's provisioned gp3 MB/s (None: its own 125)
    staging_allowance_s: float = 0.0  # added to max_runtime_s for the data copy (preflight)
    # Where the copies go (preflight): {used: True, path, dir, disks, gb, need_gb}, the
    # instance's local NVMe; {used: False, why}, the root volume; None: nothing said (no copy,
    # or a backend without such disks).
    local_disk: dict | None = None


@dataclass(frozen=True)
class JobSpec:
    """What the user asked: what runs, where (`placement`), how it recovers (`recovery`) and
    with which data (`data`). Stored flat (to_dict, from_dict: each part's fields under their
    own names, as every version wrote them), so older jobs load and `status --json` keeps its
    keys; made from flat names with JobSpec.of() and changed with changed(), which put each
    name in its part."""
    kind: str  # RECIPE or COMMAND
    backend: str  # a provider name: "local", ...
    name: str | None = None
    recipe: str | None = None
    profile: str | None = None
    args: dict = field(default_factory=dict)  # recipe arguments after profile and --set
    command: list[str] = field(default_factory=list)  # the user's command (kind COMMAND)
    workdir: str | None = None  # absolute path on this machine, synced into the job
    max_runtime_s: float = 12 * 3600.0  # the agent stops the job after this long
    # The most the job may cost, USD, every attempt, volume and staging included (--budget):
    # its instances stop it before they cross it (host/budget.py). None: no budget.
    budget_usd: float | None = None
    # When the job must have finished (seconds since the epoch; --deadline): spot while the
    # work left fits before it, on-demand once the slack runs out. None: no deadline.
    deadline_at: float | None = None
    resources: dict = field(default_factory=dict)  # gpus_per_node, nodes, disk_gb
    requires: list[str] = field(default_factory=list)  # Python modules the job imports
    resume_from: str | None = None  # a job id whose checkpoints this job starts from
    procs: int | None = None  # processes per host (torchrun recipes); None: the host's GPUs
    gpus_needed: int = 0  # GPUs on one host the recipe's arguments require (0: no requirement)
    gpus_exact: bool = True  # False: gpus_needed is a default that --procs may override
    # Machines the job spans (nodes.py): one torchrun job over all of them, node 0 the
    # rendezvous; every node gets the same files, setup and command.
    nodes: int = 1
    placement: Placement = field(default_factory=Placement)
    recovery: Recovery = field(default_factory=Recovery)
    data: Data = field(default_factory=Data)
    keep: bool = False  # leave the instance running after the job
    idle_minutes: float | None = None  # power off this long after the job ends
    on_job: str | None = None  # run on that (kept) job's instance instead of a new one
    # `--on`: the kept instance as lifecycle.sources.kept_source found it: {instance, type,
    # region, holder (the job on it now), ahead (the jobs this one waits behind, in order),
    # wait_s (the most they may still run)}.
    kept: dict | None = None
    expected: dict | None = None  # the estimate shown before launch: train_s, total_s, usd
    # A recipe's target for these arguments ({metric, value}: imagenet's top5 0.93), kept with
    # the job so that `status` shows that metric without reading the recipe again.
    target: dict | None = None
    # Workdir paths (gitignore-style patterns) synced although they look like credentials
    # (.aws/, .ssh/, .env, *.pem, $CLOUDTRAIN_HOME), which the sync otherwise always leaves out.
    include: list[str] = field(default_factory=list)
    # Job files (jobfile.py) and their flags: `setup` (shell, once per instance before the
    # job), the job's environment `envs`, the names of its `secrets` (their values never go
    # in the spec: lifecycle/secrets.py), and `outputs` brought home after the job (paths relative
    # to the workdir for own code, to the job directory for recipes).
    setup: str | None = None
    envs: dict = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # The secrets' values, in memory only: to_dict() leaves them out, lifecycle.launch hands
    # them to lifecycle.secrets (a private file for relaunches) and to the host (read, then
    # deleted).
    secret_values: dict = field(default_factory=dict, repr=False, compare=False)
    # Where the options given in a job file came from, {option: "job.yaml:7:
    # resources.disk_gb"} (LaunchOptions.origins): checks name that instead of the flag, which
    # nobody typed. In memory only, for the checks of this launch.
    origins: dict = field(default_factory=dict, repr=False, compare=False)
    # The values taken from this shell's environment (job_env.Taken: names and where a job
    # file named them, never a value), for the launch's question and the dry run. In memory.
    from_shell: list = field(default_factory=list, repr=False, compare=False)

    def display(self) -> str:
        """One line saying what runs: the recipe, its profile and the arguments that differ
        from what the profile (or the recipe) sets, `resnet9 (smoke) variant=dawn epochs=4`;
        or the command (shell code's lines joined by `; `, without the newline a job
        file's `run: |` ends with)."""
        if self.kind == RECIPE:
            from . import recipes

            what = [f"{self.recipe} ({self.profile})" if self.profile else str(self.recipe)]
            assert self.recipe is not None  # a recipe job names its recipe
            try:
                rec = recipes.load(self.recipe)
                base = rec.resolve(self.profile if self.profile in rec.profiles else None)
            except UsageError:  # the recipe is gone or changed: nothing to compare with
                rec, base = None, {}
            for k, v in self.args.items():
                if base.get(k) != v:
                    text = rec.arguments[k].render(v) if rec and k in rec.arguments else str(v)
                    what.append(f"{k}={shlex.quote(text)}")
            return " ".join(what) + self._on_nodes()
        if len(self.command) == 1:  # shell code (a job file's run: |): one line
            lines = [line.strip() for line in self.command[0].splitlines() if line.strip()]
            return "; ".join(lines) + self._on_nodes()
        return shlex.join(self.command) + self._on_nodes()

    def _on_nodes(self) -> str:
        return f" [{self.nodes} nodes]" if self.nodes > 1 else ""

    def output_paths(self) -> list[str]:
        """The job's named outputs relative to its directory on the host: own code's below its
        working directory (work/), a recipe's below the job directory."""
        base = "work/" if self.kind != RECIPE or self.workdir else ""
        return [base + p for p in self.outputs]

    def processes(self, gpus: int) -> int:
        """How many processes the job starts on a host with `gpus` GPUs: --procs if given;
        else, for a recipe whose arguments are set up for N GPUs, N (refused on a host with
        fewer); else one per GPU for torchrun recipes (one on a host without GPUs); else one.
        On several nodes a recipe's `gpus` argument counts the processes of all of them:
        each node starts its share."""
        n = self.gpus_needed
        if self.nodes > 1 and self.gpus_exact and n > 1 and n % self.nodes == 0:
            n //= self.nodes
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
                                      f"{catalog.gpu_request(self.resources, n)}), or {other}")
        else:
            torchrun = self.kind == RECIPE and self.resources.get("launcher") == "torchrun"
            procs = max(gpus, 1) if torchrun else 1
        if n > 1 and procs != n and self.gpus_exact:
            raise UsageError(f"recipe {self.recipe} with gpus={n} needs {n} processes, not "
                             f"--procs {procs}", hint=f"pass --procs {n}, or --set gpus={procs}")
        return procs

    def relaunch_places(self, settings, home: str | None) -> list[tuple[str, str]]:
        """(region, market) in the order a relaunch tries them (lifecycle/recovery.py): the
        home region, then `regions:` from config.yaml (not for data on an EBS snapshot, which
        lives in one region; an S3 source is reachable from any), spot first, then on-demand
        with --fallback on-demand."""
        regions = [home] if home else []
        if not any(d.get("kind") == "snapshot" for d in self.data.datasets or []):
            regions += [r.strip() for r in settings.regions.split(",")
                        if r.strip() and r.strip() not in regions]
        markets = [Market.SPOT] + ([Market.ON_DEMAND] if self.recovery.fallback == Market.ON_DEMAND
                                   else [])
        return [(region, market) for market in markets for region in regions]

    def root_gb(self, settings) -> int:
        """The root volume's size: --disk-gb (or what preflight sized for the datasets),
        else config.yaml's disk_gb, else the recipe's, else 100 GB."""
        return int(self.placement.disk_gb or settings.disk_gb or self.resources.get("disk_gb")
                   or 100)

    @classmethod
    def of(cls, **fields) -> "JobSpec":
        """A spec from flat names (`instance_type=`, `max_restarts=`, `datasets=`, ...): each
        part's fields go into that part."""
        return cls(**_grouped(fields, None))

    def changed(self, **changes) -> "JobSpec":
        """This spec with `changes` (flat names, as of() takes them) made."""
        return dataclasses.replace(self, **_grouped(changes, self))

    def to_dict(self) -> dict:
        """The stored form: flat, each part's fields under their own names."""
        data = dataclasses.asdict(self)
        for part in PARTS:
            data.update(data.pop(part))
        data.pop("secret_values")  # never stored: job.json, state.db and logs get names only
        data.pop("origins")
        data.pop("from_shell")
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        """A spec as stored (state.db's jobs.spec), of this version or an older one: keys it
        no longer has (the per-attempt facts older versions wrote in, now JobFacts) are
        left out; a market no version wrote reads as on-demand."""
        values = {k: v for k, v in data.items() if type(v) in STORED.get(k, ())}
        market = values.get("market")
        values["market"] = Market(market) if market in MARKETS else Market.ON_DEMAND
        if "kind" not in values or "backend" not in values:
            return cls.of(**values)  # the error a spec without them gets
        # `status` loads every job it lists: filled in directly, as __init__ would (a frozen
        # dataclass's __init__ sets each of its fields through object.__setattr__, 3x slower)
        parts = {}
        for part, part_cls in PARTS.items():
            obj: object = object.__new__(part_cls)
            obj.__dict__.update(_DEFAULTS[part_cls])
            obj.__dict__.update({k: f() for k, f in _FACTORIES[part_cls].items()
                                 if k not in values})
            obj.__dict__.update({k: values.pop(k) for k in _FIELDS[part_cls] if k in values})
            parts[part] = obj
        spec = object.__new__(cls)
        spec.__dict__.update(_DEFAULTS[cls])
        spec.__dict__.update({k: f() for k, f in _FACTORIES[cls].items() if k not in values})
        spec.__dict__.update(values)
        spec.__dict__.update(parts)
        return spec


PARTS = {"placement": Placement, "recovery": Recovery, "data": Data}
# Each flat name of a part's field, and the part it belongs to.
PART_OF = {f.name: part for part, part_cls in PARTS.items() for f in dataclasses.fields(part_cls)}


def _grouped(fields: dict, base: JobSpec | None) -> dict:
    """JobSpec's own fields from flat names: a part's fields go into that part (made anew, or
    changed from base's)."""
    out: dict = {}
    changes: dict[str, dict] = {}
    for name, value in fields.items():
        part = PART_OF.get(name)
        if part is None:
            out[name] = value
        else:
            changes.setdefault(part, {})[name] = value
    for part, values in changes.items():
        if part in out:
            raise TypeError(f"{part} given both whole and by its fields {sorted(values)}")
        out[part] = dataclasses.replace(getattr(base, part), **values) if base is not None \
            else PARTS[part](**values)
    return out


MARKETS = frozenset(m.value for m in Market)
_ALL = (JobSpec, *PARTS.values())
_FIELDS = {c: frozenset(f.name for f in dataclasses.fields(c)) for c in _ALL}
_DEFAULTS = {c: {f.name: f.default for f in dataclasses.fields(c)
                 if f.default is not dataclasses.MISSING} for c in _ALL}
_FACTORIES = {c: {f.name: f.default_factory for f in dataclasses.fields(c)
                  if f.default_factory is not dataclasses.MISSING and f.name not in PARTS}
              for c in _ALL}
_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,),
          "list": (list,), "None": (type(None),), "Market": (str,)}
# The JSON types each stored (flat) field may hold, from its annotation (`str | None`: a
# string or null); a stored value of another type (a hand-edited or damaged row) reads as the
# default.
STORED = {f.name: frozenset(t for part in str(f.type).split("|")
                            for t in _TYPES[part.strip().split("[")[0]])
          for c in _ALL for f in dataclasses.fields(c) if f.init and f.name not in PARTS}


@dataclass(frozen=True)
class JobFacts:
    """What was learnt about a job as it ran, not asked by the user: kept with the job
    (jobs.details) by the lifecycle and the provider, never written into its spec."""
    # The attempt now launched (1, then 2 after a relaunch) and the zones it tries last (the
    # one that was just interrupted, in the same region).
    attempt: int = 1
    avoid_zones: tuple[str, ...] = ()
    store_region: str | None = None  # the job store's region: the first attempt's
    # The job store's owner key (jobs/<store_owner>/<id>/), kept at the first upload grant;
    # None for a job stored before owner prefixes (jobs/<id>/).
    store_owner: str | None = None
    # The job's Auto Scaling group (issue 27), kept once it is made: the cloud relaunches the
    # job, not the supervisor (lifecycle/autoscaled.py reads its attempts).
    auto_scaling_group: str | None = None
    # The queued job this one keeps its instance for (lifecycle/kept.py), though not kept.
    kept_for_queue: str | None = None
    # The job's own IAM role and instance profile (issue 36: `instance_profile: per-job`),
    # kept before they are made, so that whatever ends the job deletes them.
    job_role: str | None = None

    @classmethod
    def load(cls, details: dict | None, legacy: dict | None = None) -> "JobFacts":
        """The facts as stored in `details`; those a job launched by an older version kept in
        its spec (`legacy`, its stored JSON) are found there, unless `details` has them."""
        if not details and not (legacy and FACTS & legacy.keys()):
            return _NO_FACTS
        values = {}
        for name in FACTS:
            for source in (details or {}, legacy or {}):
                if name in source:
                    values[name] = source[name]
                    break
        try:
            values["attempt"] = max(1, int(values.get("attempt") or 1))
        except (TypeError, ValueError):
            values["attempt"] = 1
        zones = values.get("avoid_zones")
        values["avoid_zones"] = tuple(z for z in zones if isinstance(z, str)) \
            if isinstance(zones, (list, tuple)) else ()
        for name in FACTS - {"attempt", "avoid_zones"}:
            if not isinstance(values.get(name), (str, type(None))):
                values[name] = None
        return cls(**values)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}


FACTS = frozenset(f.name for f in dataclasses.fields(JobFacts))
_NO_FACTS = JobFacts()
