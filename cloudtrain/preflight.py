"""What a launch checks before anything is created or billed. The dry run makes the same
checks (a provider's plan() calls its preflight()), so a plan it shows is one the launch
can carry out.

    suggest(word, choices)          "did you mean ...?" for a mistyped name
    known_regions()                 every EC2 region botocore knows, in every partition (offline)
    check_known_region(region, by)  a region that does not exist is an error naming it
    instance_type(name, region, ..) the type exists, is offered in the region, runs the AMI's
                                    architecture, and has a GPU (or cpu_ok says it need not)
    own_command(command, workdir)   a file name given as the command, a script not in the workdir

Nothing here calls AWS itself: what only EC2 can answer (a type the bundled catalog does not
hold, a region it does not cover) comes in as a `describe` callable from the AWS provider,
None without credentials.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from .config import suggest  # noqa: F401  ("did you mean", used here and by callers)
from .errors import UsageError

DEFAULT_ARCH = "x86_64"  # the Deep Learning AMI cloudtrain uses (images.DLAMI_PARAMETER)
# What a job-spec file looks like (SkyPilot's task.yaml, dstack's .dstack.yml): given as the
# command it would be run as a program on an instance that was booted and billed for it.
SPEC_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".ipynb")



@lru_cache(maxsize=1)
def known_regions() -> frozenset[str]:
    """EC2's regions in every partition (aws, aws-cn, aws-us-gov, ...), from the endpoint data
    botocore ships: no network call."""
    import botocore.session

    session = botocore.session.get_session()
    found: set[str] = set()
    for partition in session.get_available_partitions():
        found |= set(session.get_available_regions("ec2", partition_name=partition))
    return frozenset(found)


def check_known_region(region: str, source: str = "--region") -> str:
    """`region` if EC2 has such a region, else a UsageError that says it does not exist."""
    regions = known_regions()
    if regions and region not in regions:
        raise UsageError(f"{source} {region}: there is no AWS region {region}"
                         f"{suggest(region, regions)}",
                         hint="cloudtrain catalog --region us-east-1 lists what a region offers")
    return region


@dataclass
class TypeFacts:
    """What the checks found out about an instance type."""

    name: str
    gpus: float  # 0: no GPU
    gpu: str | None
    arch: str
    source: str  # "catalog" or "EC2"
    note: str | None = None  # a check that could not be made, said in the plan


def instance_type(name: str, region: str, *, cpu_ok: bool = False,
                  ami_arch: str | None = DEFAULT_ARCH,
                  describe: Callable[[str], dict | None] | None = None,
                  offered: Callable[[str], bool | None] | None = None) -> TypeFacts:
    """Check `name` for a job in `region`. From the bundled catalog where it knows the type
    (and the region), else from EC2 (`describe(name)` -> {gpus, gpu, arch} or None when EC2
    has no such type; `offered(name)` -> whether it is offered in the region, None if unknown).
    `ami_arch`: the AMI's architecture (None: not known without credentials). UsageError for
    a type that does not exist, is not offered there, cannot run the AMI, or has no GPU when
    `cpu_ok` is not set."""
    from . import catalog

    types = catalog.load()
    t = types.get(name)
    note = None
    if t is not None:
        facts = TypeFacts(t.name, t.gpus, t.gpu, t.arch, "catalog")
        covered = catalog.regions()
        if region in covered:
            if region not in t.on_demand and region not in t.spot_snapshot:
                where = sorted(set(t.on_demand) | set(t.spot_snapshot))
                raise UsageError(f"{name} is not offered in {region}"
                                 + (f" (the catalog has it in: {', '.join(where)})" if where
                                    else ""),
                                 hint=f"cloudtrain catalog --region {region} lists the GPU types "
                                      "there")
        else:
            answer = offered(name) if offered is not None else None
            if answer is False:
                raise UsageError(f"{name} is not offered in {region} (EC2 "
                                 "DescribeInstanceTypeOfferings)",
                                 hint=f"cloudtrain catalog --gpu {t.gpu} lists where the catalog "
                                      "has it")
            if answer is None:
                note = (f"the bundled catalog has no prices for {region}; EC2 checks at launch "
                        f"that {name} is offered there")
    else:
        if name.lower() in {k.lower() for k in types}:
            raise UsageError(f"unknown instance type {name!r}{suggest(name, types)}: EC2 type "
                             "names are lower case")
        found = describe(name) if describe is not None else None
        if found is None and describe is not None:
            raise UsageError(f"unknown instance type {name!r}{suggest(name, types)}: EC2 has "
                             "no such type", hint="cloudtrain catalog lists the GPU types")
        if found is None:  # no credentials: the catalog is all there is to go by
            hint = suggest(name, types)
            if hint:
                raise UsageError(f"unknown instance type {name!r}{hint}",
                                 hint="cloudtrain catalog lists the GPU types")
            if not cpu_ok:
                raise UsageError(f"{name} is not a GPU instance type in the bundled catalog",
                                 hint="cloudtrain catalog lists the GPU types; to run on a type "
                                      "without a GPU on purpose, add --cpu-only")
            return TypeFacts(name, 0, None, DEFAULT_ARCH, "unchecked",
                             note="not in the GPU catalog and not checked with EC2 (no "
                                  "credentials): price unknown")
        facts = TypeFacts(name, found.get("gpus") or 0, found.get("gpu"),
                          found.get("arch") or DEFAULT_ARCH, "EC2")
    if not facts.gpus and not cpu_ok:
        raise UsageError(f"{name} has no GPU", hint="pick a GPU type (cloudtrain catalog), or "
                                                    "add --cpu-only to run on it on purpose")
    if ami_arch and facts.arch != ami_arch:
        what = "the Deep Learning AMI" if ami_arch == DEFAULT_ARCH else "the AMI"
        raise UsageError(f"{name} is {facts.arch} but {what} is {ami_arch}: RunInstances would "
                         "refuse it",
                         hint=("choose an x86_64 type (cloudtrain catalog), or pass --ami with "
                               f"an {facts.arch} image") if ami_arch == DEFAULT_ARCH else
                         f"pass an --ami built for {facts.arch}")
    facts.note = note
    return facts


def own_command(command: list[str], workdir: str | None, cwd: str | None = None) -> None:
    """Refuse, before anything is created, an own command that cannot run: a job-spec file
    given as the command (`cloudtrain launch task.yaml`), and a script path relative to the
    job's directory that is not in the synced workdir (with none given, the job runs in an
    empty directory)."""
    if not command:
        return
    cwd = cwd or os.getcwd()
    words = list(command)
    if len(words) == 1 and any(c.isspace() for c in words[0]):
        try:  # one string of shell code: its words, as far as they can be told
            words = shlex.split(words[0])
        except ValueError:
            return
    if not words:
        return
    first = words[0]
    if first.lower().endswith(SPEC_SUFFIXES) and len(words) == 1:
        from .jobfile import is_job_file

        if is_job_file(first):
            raise UsageError(f"{first} is a job file, not a command: give it before any --",
                             hint=f"cloudtrain launch {shlex.quote(first)}")
        raise UsageError(f"{first} is a file, not a command; cloudtrain's job files are YAML "
                         "(job.yaml)", hint="cloudtrain init writes one; or run your own "
                                            "command: cloudtrain launch --workdir . -- python "
                                            "train.py")
    base = Path(workdir) if workdir else None
    for word in words:
        if word.startswith(("-", "/", "~", "$")) or "=" in word or \
                any(c.isspace() for c in word):  # an option, a variable, shell code (-c '...')
            continue
        script = word.lower().endswith(SCRIPT_SUFFIXES) or word.startswith("./")
        if not script:
            continue
        if base is not None:
            if not (base / word).exists():
                here = Path(cwd, word).exists() and Path(cwd).resolve() != base
                raise UsageError(f"{word} is not in --workdir {base}: the job runs there",
                                 hint="add --workdir . (the current directory has it)" if here
                                 else "check the path, relative to --workdir")
        elif Path(cwd, word).exists():
            raise UsageError(f"{word} is here, but without --workdir the job runs in an empty "
                             "directory", hint="add --workdir . to sync this directory "
                                               "(.gitignore honoured)")
        else:
            raise UsageError(f"{word}: no such file, and without --workdir the job runs in an "
                             "empty directory",
                             hint="add --workdir DIR with your code in it")


def cpu_warning(spec) -> str | None:
    """For a recipe that trains on a GPU, run on a machine without one: how long its CPU figure
    (`resources.cpu_minutes`: the default run on 2 CPU cores, measured) says it would take,
    against its max runtime, and the ways out."""
    from . import recipes

    rec = recipes.load(spec.recipe)
    if int(rec.resources.get("gpus_per_node", 0)) < 1:
        return None
    limit = spec.max_runtime_s / 60
    minutes = rec.resources.get("cpu_minutes")
    if not minutes or minutes <= 10:  # no figure to go by, or not worth a question
        return None
    took = f"about {minutes / 60:.1f} h" if minutes >= 90 else f"about {minutes:g} min"
    said = f"no GPU here: {rec.name} would take {took} on this CPU (its figure for 2 cores)"
    if minutes > limit:
        said += f", past its max runtime of {limit:g} min, which stops it as failed"
    return (said + f". For a quick check: --profile smoke; for the real run: --instance TYPE or "
                   f"--gpus {rec.gpu_request(spec.args)}")
