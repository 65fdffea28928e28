"""JobSpec: what to run (a recipe, or your own command) and where (backend, resources), and
build_spec, which checks a LaunchOptions (the flags, a job file, or both) and turns it into one.

Imports the settings (config), the providers' registry, launch_options and market; recipes,
datasets, datasources, catalog, preflight and job_env (the environment's values) when it
builds.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from . import config, providers
from .config import INSTANCE_PATTERN, check_known_region, check_region, finite, shown
from .errors import CredentialsError, NoCredentials, UsageError, named_at
from .host.job_records import MAX_RESTARTS
from .job_spec import COMMAND, RECIPE, JobFacts, JobSpec  # noqa: F401  (the lifecycle's)
from .launch_options import LaunchOptions
from .market import Market


MAX_RUNTIME_MINUTES = config.LIMITS["max_runtime_minutes"][1]  # a week
MAX_PROCS = 1024
MAX_NODES = 64  # machines in one job (the published ImageNet runs used up to 16)
# A job name: printable in one table cell (no newline, ANSI escape or bidi override), usable
# as an argument, and never read as a job id prefix (ids are 8 hex digits).
NAME_PATTERN = re.compile(r"[^\W_][\w.-]{0,63}")
ID_LIKE = re.compile(r"[0-9a-fA-F]{1,8}")
AMI_PATTERN = re.compile(r"ami-[0-9a-f]{8}([0-9a-f]{9})?")
# The flag each placement key comes from, for messages.
FLAGS = {"instance_type": "--instance", "region": "--region", "ami": "--ami",
         "disk_gb": "--disk-gb", "max_price": "--max-price", "keep": "--keep",
         "idle_minutes": "--idle-minutes", "on_job": "--on", "gpus": "--gpus",
         "recover": "--recover/--no-recover", "max_restarts": "--max-restarts",
         "fallback": "--fallback", "cpu_only": "--cpu-only", "market": "--spot/--on-demand",
         "nodes": "--nodes"}
FALLBACKS = (Market.ON_DEMAND,)


# -- from what the user typed ----------------------------------------------------------------


def build_spec(o: LaunchOptions, settings: config.Settings) -> JobSpec:
    """Validate what the user asked for (the flags, a job file, or both) and turn it into a
    JobSpec (UsageError otherwise). `data`: `--data NAME=SOURCE` / `--data NAME`
    (datasources.py). `nodes`: `--nodes N`; else a cloud recipe job gets the machines its
    variant was published on (recipe.yaml `resources.nodes_per_variant`), anything else one.
    `regions` (job files) narrows where --gpus looks. `origins`: where the options a job
    file gave came from; a message about one names that, not the flag."""
    from . import datasets, datasources, job_env, recipes
    from .job_env import environment

    if o.regions:
        settings = dataclasses.replace(settings, regions=",".join(o.regions))
    origins = dict(o.origins)
    # A job file that names a cloud's credentials is refused before anything else
    from_shell = job_env.taken(o.envs, o.secrets, origins)
    job_env.refuse_cloud_credentials(from_shell)
    nodes = o.nodes
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int)
                              or not 1 <= nodes <= MAX_NODES):
        raise UsageError(f"{origins.get('nodes', '--nodes')} must be a whole number from 1 to "
                         f"{MAX_NODES}, got {shown(nodes)}")
    flags = datasources.parse_data_flags(o.data, items(origins, "data"))
    spec = dataclasses.replace(_build_spec(o, settings, origins), origins=origins)
    _check_nodes(spec)
    try:
        spec = spec.changed(datasets=datasets.resolve(
            spec, settings, flags, recipes.load(spec.recipe).data if spec.recipe else []))
    except UsageError as exc:  # `--data NAME: ...` about a job file's datasets.NAME
        name = exc.message.split(":", 1)[0].removeprefix("--data ")
        raise named_at(exc, origins.get(f"data.{name}"), f"--data {name}") from None
    if o.budget is not None:
        if spec.backend == "local":
            raise UsageError(f"{origins.get('budget', '--budget')}: the local backend bills "
                             "nothing; a budget holds a cloud job's instances",
                             hint="leave out --budget, or launch on aws (--instance, --gpus)")
        spec = dataclasses.replace(spec, budget_usd=finite(
            o.budget, origins.get("budget", "--budget (USD)"), low=0, low_open=True,
            high=config.BUDGET_MAX_USD))
    if o.deadline is not None:
        spec = dataclasses.replace(spec, deadline_at=check_deadline(spec, o.deadline, origins))
    if o.setup is not None:
        if not o.setup.strip() or "\0" in o.setup:
            raise UsageError(f"{origins.get('setup', '--setup')} needs shell code, e.g. --setup "
                             "'pip install -r requirements.txt'")
        spec = dataclasses.replace(spec, setup=o.setup)
    envs = environment(o.envs, "--env", named=items(origins, "envs"))
    secret_values = environment(o.secrets, "--secret", named=items(origins, "secrets"))
    overlap = set(envs) & set(secret_values)
    if overlap:
        raise UsageError(f"{sorted(overlap)[0]} is given both as an environment variable and "
                         "as a secret: keep it in one")
    named = items(origins, "outputs")
    return dataclasses.replace(
        spec, from_shell=from_shell, envs=envs, secret_values=secret_values,
        secrets=sorted(secret_values),
        outputs=[check_output(p, named.get(p, "--output")) for p in o.outputs])


def items(origins: dict, option: str) -> dict[str, str]:
    """The places of a repeated option's items a job file gave: {NAME: "job.yaml:5:
    envs.NAME"} for `envs`, {path: ...} for `outputs` (launch_options.item names them)."""
    prefix = option + "."
    return {k[len(prefix):]: v for k, v in origins.items() if k.startswith(prefix)}


def check_output(path: str, what: str = "--output") -> str:
    """An `--output` path: relative, inside the job's directory (no `..`), one line. `what`
    names it: the flag, or the job file's `file:line: outputs`."""
    text = str(path).strip()
    parts = Path(text).parts
    if not text or any(c in text for c in "\n\r\0\\") or Path(text).is_absolute() or \
            ".." in parts or text.startswith("~") or not parts or parts == (".",):
        raise UsageError(f"{what} {shown(path)}: expected a path relative to the job's "
                         "working directory, e.g. results/ or model.pt")
    return str(Path(*parts))


DEADLINE_MIN_S = 10 * 60  # sooner than this, not even an instance's boot fits
DEADLINE_MAX_S = 30 * 86400


def check_deadline(spec: JobSpec, at: float, origins: dict) -> float:
    """A --deadline the job can have: a cloud job's, at least DEADLINE_MIN_S and at most
    DEADLINE_MAX_S from now (UsageError otherwise)."""
    import time

    what = origins.get("deadline", "--deadline")
    if spec.backend == "local":
        raise UsageError(f"{what}: a deadline moves a cloud job from spot to on-demand; the "
                         "local backend has neither", hint="leave out --deadline")
    ahead = at - time.time()
    if not DEADLINE_MIN_S <= ahead <= DEADLINE_MAX_S:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if math.isfinite(at) \
            and abs(at) < 1e11 else "that time"
        raise UsageError(f"{what}: {when} is " + (
            "past" if ahead < 0 else f"{ahead / 60:.0f} min from now" if ahead < 3600 else
            f"{ahead / 86400:.0f} days from now") + "; a deadline is 10 min to 30 days ahead")
    return at


def _check_nodes(spec: JobSpec) -> None:
    """Refuse a job on several machines that cannot be one."""
    n = spec.nodes
    if n == 1:
        return
    what = spec.origins.get("nodes", f"--nodes {n}")
    if spec.on_job:
        raise UsageError(f"{what}: --on reuses one kept instance; a job on {n} machines "
                         "needs new ones", hint="leave out --on")
    if spec.kind == RECIPE:
        from . import recipes

        assert spec.recipe is not None  # a recipe job names its recipe
        check_recipe_nodes(recipes.load(spec.recipe), spec.args, n, what)


def check_recipe_nodes(rec, args: dict, nodes: int, what: str | None = None) -> None:
    """Refuse a recipe on `nodes` machines that cannot run there (the launch, its dry run and
    `estimate --nodes`): a recipe that is one process, or one whose `gpus` argument (its
    processes in all: WORLD_SIZE must equal it, resnet9 stops at once otherwise) does not
    split evenly over the nodes, each of which starts at least one. `what`: where the node
    count came from (`--nodes N`, or the job file's `file:line: resources.nodes`)."""
    from . import recipes

    if nodes == 1:
        return
    what = what or f"--nodes {nodes}"
    if rec.launcher != "torchrun":
        raise UsageError(f"{what}: recipe {rec.name} runs as one process on one "
                         "machine; it cannot span machines",
                         hint="recipes that can: " + ", ".join(
                             r for r in recipes.names()
                             if recipes.load(r).launcher == "torchrun"))
    gpus = rec.gpus_needed(args)
    if not rec.gpus_exact(args) or gpus % nodes == 0:
        return
    if gpus < nodes:
        raise UsageError(f"recipe {rec.name} with gpus={gpus} runs {gpus} process"
                         f"{'es' if gpus > 1 else ''}: it cannot span {nodes} nodes",
                         hint=f"--set gpus={nodes} (one process on each node), or "
                              + ("leave out --nodes" if gpus == 1 else f"--nodes {gpus}"))
    raise UsageError(f"recipe {rec.name} with gpus={gpus} on {nodes} nodes: its gpus "
                     "(processes in all) must split evenly over the nodes",
                     hint=f"--set gpus={nodes * (gpus // nodes)}, or --nodes a divisor of "
                          f"{gpus}")


def _build_spec(o: LaunchOptions, settings: config.Settings, origins: dict) -> JobSpec:
    """What runs where, checked: the placement first (it says which backend is meant), then
    what runs, a recipe or the user's own command."""
    backend, placement = _placement(o, settings, origins)
    workdir = _check_what_runs(o, origins)
    if o.recipe:
        return _recipe_spec(o, backend, placement, workdir, settings, origins)
    if o.procs is not None:
        raise UsageError(f"{_flag(origins, 'procs')} applies to recipes started under torchrun; "
                         "your own command can read $CLOUDTRAIN_GPUS and start torchrun itself")
    if backend == "aws" and not placement.get("on_job"):
        placement.setdefault("instance_type", settings.instance_type)
    from .jobfile import is_job_file
    from .preflight import own_command

    # Before anything is created
    # a job file's run: reads its scripts from its own directory (workdir: . is that one)
    own_command(list(o.command), workdir, origin=origins.get("command"),
                cwd=str(Path(origins[""]).parent) if "command" in origins else None,
                is_job_file=is_job_file)
    minutes = o.max_runtime or settings.max_runtime_minutes
    return JobSpec.of(kind=COMMAND, backend=backend, name=o.name, command=list(o.command),
                      workdir=workdir, max_runtime_s=float(minutes) * 60,
                      include=list(o.include), nodes=o.nodes or 1, **placement)


def _placement(o: LaunchOptions, settings: config.Settings, origins: dict
               ) -> tuple[str, dict]:
    """The backend and the cloud placement (JobSpec's fields): --gpus resolved to a type,
    the market and its recovery; a cloud option for another backend refused."""
    placement = o.placement()
    _check_inputs(dict(recipe=o.recipe, profile=o.recipe_profile(), workdir=o.workdir,
                       name=o.name, backend=o.backend, resume_from=o.resume_from),
                  placement, o.include, origins)
    recovery = {k: placement.pop(k) for k in ("recover", "max_restarts", "fallback")
                if k in placement}
    if "reservation" in placement or "block_fee" in placement:
        if o.backend not in (None, "aws"):
            raise UsageError(f"{_flag(origins, 'reservation')} applies to aws, not {o.backend}")
        _reserved(placement, origins, deadline=o.deadline is not None)
    gpus = placement.pop("gpus", None)
    if gpus:
        if placement.get("instance_type"):
            raise UsageError(f"{_flag(origins, 'instance_type')} and {_flag(origins, 'gpus')}: "
                             "give one, not both")
        placement.update(_resolve_gpus(gpus, placement, settings, origins))
    on_job = placement.pop("on_job", None)
    if on_job and set(placement) - {"keep", "idle_minutes"}:
        raise UsageError("--on JOB reuses that job's instance: leave out --instance, --spot, "
                         "--region, --ami, --disk-gb and --max-price")
    # Any cloud placement option (--instance, --gpus, --spot, --region, --ami, ...) says which
    # backend is meant, as --instance always did.
    cloud = on_job or set(placement) - {"keep"}
    backend = o.backend or ("aws" if cloud else settings.backend)
    if backend == "aws":
        placement.setdefault("market", Market(settings.market))
        if on_job:
            placement["on_job"] = on_job
            # A job on a kept instance keeps it (--no-keep: powered off after it); its
            # idle time is the instance's unless given (lifecycle.sources.kept_source).
            placement.setdefault("keep", True)
        elif placement.get("keep") and placement.get("idle_minutes") is None:
            placement["idle_minutes"] = settings.keep_idle_minutes  # a real idle stop
        placement.update(_recovery(recovery, placement["market"], on_job, origins))
    elif recovery:
        raise UsageError(f"{_flag(origins, sorted(recovery)[0])} applies to cloud backends "
                         f"(spot instances), not {backend}")
    elif on_job or set(placement) - {"keep"} or placement.get("keep"):
        key = "on_job" if on_job else sorted(placement)[0]
        flag = _flag(origins, key) if key != "market" else \
            origins.get("spot", f"--{placement[key]}")
        raise UsageError(f"{flag} applies to cloud backends, not {backend}")
    providers.get(backend)  # unknown backend: error now, before anything else
    return backend, placement


def _check_what_runs(o: LaunchOptions, origins: dict) -> str | None:
    """Refuse what cannot run (a recipe and a command, neither, a recipe's options for a
    command, ...); the workdir as an absolute path."""
    recipe, command = o.recipe, o.command
    if recipe and command:
        raise UsageError(f"{origins.get('recipe', '--recipe')} and "
                         f"{origins.get('command', 'a command after --')}: a job runs a recipe "
                         "or your own command, not both")
    if not recipe and not command:
        if "" in origins:  # a job file that sets neither
            raise UsageError(f"{origins['']}: nothing to run: give it run: (your own code) or "
                             "recipe: (a bundled recipe)", hint="cloudtrain init writes an "
                                                               "example of each")
        raise UsageError("nothing to run: give --recipe NAME or a command after --",
                         hint="cloudtrain launch --recipe resnet9 --profile smoke --follow")
    if command and not command[0].strip():
        raise UsageError(f"the command after -- starts with an empty word, {shown(command[0])}")
    if (o.recipe_profile() or o.sets) and not recipe:
        first = o.sets[0].partition("=")[0] if o.sets else ""
        what = origins.get("profile", "--profile") if o.recipe_profile() else \
            origins.get(f"sets.{first}", "--set")
        raise UsageError(f"{what} applies to recipes; your own command takes its arguments "
                         "itself (after --, or in run:)")
    workdir = None
    if o.workdir is not None:
        what = origins.get("workdir", f"--workdir {shown(o.workdir)[1:-1]}")
        try:
            path = Path(o.workdir).expanduser()
            if not path.is_dir():
                raise UsageError(f"{what}: not a directory")
            workdir = str(path.resolve())
        except OSError as exc:  # a name too long, a loop of links, ...
            raise UsageError(f"{what}: {exc.strerror or exc}") from None
    if o.include and o.workdir is None:
        raise UsageError("--include applies to the files --workdir syncs; give --workdir too")
    if o.procs is not None and not 1 <= o.procs <= MAX_PROCS:
        raise UsageError(f"{_flag(origins, 'procs')} must be between 1 and {MAX_PROCS}, got "
                         f"{o.procs}")
    if o.max_runtime is not None:
        finite(o.max_runtime, origins.get("max_runtime", "--max-runtime (minutes)"),
               low=0, low_open=True, high=MAX_RUNTIME_MINUTES)
    if o.resume_from and not recipe:
        raise UsageError("--resume-from continues a recipe's training; give --recipe too")
    return workdir


def _recipe_spec(o: LaunchOptions, backend: str, placement: dict, workdir: str | None,
                 settings: config.Settings, origins: dict) -> JobSpec:
    """A recipe's job: its arguments resolved (profile, --set, resume), its machines and, on
    a cloud, its instance type."""
    from . import recipes

    assert o.recipe is not None  # asked for a recipe job (--recipe)
    try:
        rec = recipes.load(o.recipe)
    except UsageError as exc:
        raise named_at(exc, origins.get("recipe"), "--recipe") from None
    sets, profile, procs = o.sets, o.recipe_profile(), o.procs
    if o.resume_from:
        if "resume" not in rec.arguments:
            raise UsageError(f"recipe {rec.name} cannot resume (it has no resume argument)")
        sets = (*sets, "resume=true")
    args = rec.resolve(profile, sets, origins)
    needed = rec.gpus_needed(args)
    if procs is not None and procs > 1 and rec.launcher != "torchrun":
        raise UsageError(f"{_flag(origins, 'procs')}: recipe {rec.name} runs as one "
                         "process")
    # The machines: --nodes, else on a cloud those the variant was published on.
    new_hosts = backend == "aws" and not placement.get("on_job")
    nodes = o.nodes or (rec.nodes_published(args) if new_hosts else 1)
    if new_hosts:
        _place_recipe(rec, args, placement, settings, nodes)
    resources = rec.resources_for(profile)  # a smoke run plans with its own disk and time
    minutes = o.max_runtime or resources.get("max_runtime_minutes") \
        or settings.max_runtime_minutes
    return JobSpec.of(kind=RECIPE, backend=backend, name=o.name, recipe=rec.name, profile=profile,
                      args=args, workdir=workdir, max_runtime_s=float(minutes) * 60,
                      resources=resources, requires=list(rec.requires),
                      target=rec.target_for(args) or None,
                      resume_from=o.resume_from, procs=procs, gpus_needed=needed,
                      gpus_exact=rec.gpus_exact(args), include=list(o.include), nodes=nodes,
                      **placement)


def _recovery(given: dict, market: Market, on_job: str | None, origins: dict) -> dict:
    """Spot jobs recover by default; on-demand ones are not interrupted, so asking them to
    recover, or setting how, is refused rather than ignored."""
    recover = given.get("recover")
    if on_job and given:
        raise UsageError(f"{_flag(origins, sorted(given)[0])}: --on runs on a kept instance, "
                         "which is not relaunched elsewhere")
    if recover and market != Market.SPOT:
        raise UsageError(f"{origins.get('recover', '--recover')} applies to --spot jobs: an "
                         "on-demand instance is not interrupted", hint="add --spot")
    enabled = market == Market.SPOT and not on_job if recover is None else bool(recover)
    if not enabled and ("max_restarts" in given or "fallback" in given):
        what = _flag(origins, "max_restarts" if "max_restarts" in given else "fallback")
        raise UsageError(f"{what} applies to a recovering --spot job" +
                         (", not with --no-recover" if recover is False else ""),
                         hint=None if market == Market.SPOT else "add --spot")
    restarts = given.get("max_restarts", 3)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or \
            not 0 <= restarts <= MAX_RESTARTS:
        raise UsageError(f"{_flag(origins, 'max_restarts')} must be a whole number from 0 to "
                         f"{MAX_RESTARTS}, got {shown(restarts)}")
    fallback = given.get("fallback")
    if fallback is not None and fallback not in FALLBACKS:
        raise UsageError(f"{_flag(origins, 'fallback')} must be one of {', '.join(FALLBACKS)}, "
                         f"got {shown(fallback)}")
    # No restart is no recovery: nothing relaunches, so no supervisor and no stream.
    return {"recover": enabled and restarts > 0, "max_restarts": restarts, "fallback": fallback}


RESERVATION_ID = re.compile(r"cr-[0-9a-f]{8,17}")
BLOCK_FEE_MAX_USD = 10_000_000.0  # 64 p5 instances for 182 days cost about that


def _reserved(placement: dict, origins: dict, deadline: bool) -> None:
    """--reservation cr-… (and --block-fee): capacity the user holds, bought on-demand or as
    a Capacity Block, so not spot; with --spot and a --deadline, where the job goes once spot
    cannot make the deadline. Its instance type is the reservation's, read from EC2 where no
    --instance was given."""
    flag = _flag(origins, "reservation")
    rid = placement.get("reservation")
    if rid is None:
        raise UsageError(f"{_flag(origins, 'block_fee')} is what a Capacity Block cost: give "
                         "--reservation with it")
    if not isinstance(rid, str) or not RESERVATION_ID.fullmatch(rid.strip()):
        raise UsageError(f"{flag} {shown(rid)}: expected a capacity reservation id, cr- and 17 "
                         "hex digits (cr-0123456789abcdef0)")
    rid = placement["reservation"] = rid.strip()
    if placement.get("market") == Market.SPOT and not deadline:
        raise UsageError(f"{flag}: an instance in capacity you hold is not spot",
                         hint="leave out --spot, or give a --deadline: spot until its slack "
                              "is out, then the reservation")
    for key in ("gpus", "on_job"):
        if placement.get(key):
            raise UsageError(f"{_flag(origins, key)} and {flag}: the reservation says the "
                             "instance type and the price; give one, not both")
    if placement.get("block_fee") is not None:
        placement["block_fee"] = finite(placement["block_fee"], _flag(origins, "block_fee"),
                                        low=0, low_open=True, high=BLOCK_FEE_MAX_USD)
    placement.setdefault("market", Market.ON_DEMAND)
    if not placement.get("instance_type"):  # the reservation's own
        account = providers.get("aws").account
        region = account.region_and_source(placement.get("region"))[0]
        try:
            placement["instance_type"] = account.reserved_type(region, rid)
        except (CredentialsError, NoCredentials) as exc:  # its type is read from EC2
            exc.hint = (f"{exc.hint}; or give --instance too (the type {rid} holds) for a "
                        "dry run without them")
            raise


def _flag(origins: dict, key: str) -> str:
    """How a message names a launch option: the job file's `file:line: key` where the value
    came from one, else the flag (FLAGS, or the option's own name as a flag)."""
    return origins.get(key) or FLAGS.get(key) or "--" + key.replace("_", "-")


def _check_inputs(given: dict, placement: dict, include: tuple[str, ...],
                  origins: dict) -> None:
    """Refuse what the user typed that would misbehave later: empty values (`--workdir ''`
    would sync the current directory, `--on ''` would launch a new instance), a region boto
    rejects, a name that breaks the status table or reads as a job id, numbers that are not."""
    for key, value in {**given, **placement}.items():
        if isinstance(value, str) and not value.strip():
            raise UsageError(f"{_flag(origins, key)} needs a value, got {shown(value)}")
    name = given.get("name")
    if name is not None:
        what = origins.get("name", f"--name {shown(name)}")
        if not NAME_PATTERN.fullmatch(name):
            raise UsageError(f"{what}: use 1 to 64 letters, digits, '.', '_' or '-', starting "
                             "with a letter or digit")
        if ID_LIKE.fullmatch(name):
            raise UsageError(f"{origins.get('name', f'--name {name}')}: a name of hex digits "
                             "reads as a job id prefix",
                             hint=f"add a letter past f, e.g. --name run-{name}")
    if placement.get("region"):
        source = _flag(origins, "region")
        check_known_region(check_region(placement["region"], source), source)
    if placement.get("ami") and not AMI_PATTERN.fullmatch(placement["ami"]):
        raise UsageError(f"{origins.get('ami', '--ami')} {shown(placement['ami'])}: expected "
                         "an AMI id, e.g. ami-0123456789abcdef0")
    if placement.get("instance_type") and not INSTANCE_PATTERN.fullmatch(placement["instance_type"]):
        from .preflight import instance_type_error

        raise instance_type_error(placement["instance_type"], origins.get("instance_type"))
    if "max_price" in placement:
        finite(placement["max_price"], origins.get("max_price", "--max-price (USD per hour)"),
               low=0, low_open=True, high=1000)
    if "idle_minutes" in placement:
        finite(placement["idle_minutes"], _flag(origins, "idle_minutes"), low=0,
               high=MAX_RUNTIME_MINUTES)
    for pattern in include:
        if not pattern.strip() or any(c in pattern for c in "\n\r\0"):
            raise UsageError(f"--include {shown(pattern)}: expected a path pattern, e.g. .env")


def _place_recipe(rec, args: dict, placement: dict, settings: config.Settings,
                  nodes: int = 1) -> None:
    """A cloud recipe job's instance: the one asked for, which must have the GPUs the recipe's
    arguments need (per node); else, for a multi-GPU recipe, the cheapest type with them;
    else the configured default type."""
    from . import catalog

    needed = rec.gpus_needed(args)
    if nodes > 1 and rec.gpus_exact(args) and needed % nodes == 0:  # `gpus`: in all
        needed //= nodes
    if placement.get("instance_type"):
        t = catalog.get(placement["instance_type"])
        if t is not None and needed > t.gpus:
            raise UsageError(f"recipe {rec.name} with gpus={needed} needs {needed} GPUs on one "
                             f"host; {t.name} has {t.gpus:g}",
                             hint=f"use --gpus {rec.gpu_request(args)}" + (
                                 f", or --set gpus={t.gpus:g}" if t.gpus >= 1 else ""))
        return
    request = rec.gpu_request(args)
    if needed != rec.gpus_needed(args):  # split over the nodes
        request = f"{catalog.parse_gpus(request)[0]}:{needed}"
    if catalog.parse_gpus(request)[1] > 1:
        placement.update(_resolve_gpus(request, placement, settings))
    else:
        placement["instance_type"] = settings.instance_type


def _resolve_gpus(request: str, placement: dict, settings: config.Settings,
                  origins: dict | None = None) -> dict:
    """`--gpus V100:1`: the cheapest matching type (and region) among the allowed regions:
    --region, else `regions:` from config.yaml, else the configured region; and the types of
    the same GPUs it may also run on (catalog.equivalents)."""
    from . import catalog

    origin = (origins or {}).get("gpus")
    try:
        gpu, count = catalog.parse_gpus(request)
        finite(count, f"{origin or '--gpus'} {request}: the count", low=0, low_open=True,
               high=64)
        # The region chain every command uses (AWS_REGION, the profile, ...), as
        # --instance
        regions = [placement["region"]] if placement.get("region") else \
            [r.strip() for r in settings.regions.split(",") if r.strip()] or \
            [providers.get("aws").account.region()]
        market = placement.get("market") or Market(settings.market)
        chosen, region, _ = catalog.cheapest(gpu, count, regions, market)
    except UsageError as exc:  # a job file's `gpus:` is named where it is
        if origin and exc.message.startswith(origin):
            raise
        raise named_at(exc, origin, "--gpus") from None
    return {"instance_type": chosen.name, "region": region,
            "alternatives": [o.name for o in catalog.equivalents(chosen, region)]}
