"""What a launch checks before anything is created or billed. The dry run makes the same
checks (a provider's plan() calls its preflight()), so a plan it shows is one the launch
can carry out.

    unknown_instance_type(name, why)  the one error for a type that is not one, any command
    instance_type(name, region, ..) the type exists, is offered in the region, runs the AMI's
                                    architecture, and has a GPU (or cpu_ok says it need not)
    own_command(command, workdir, is_job_file=)  a file name given as the command, a file
                                    here that is no command, a script not in the workdir
    cpu_warning(spec)               a GPU recipe run on a machine without one: how long it takes

Nothing here calls AWS itself: what only EC2 can answer (a type the bundled catalog does not
hold, a region it does not cover) comes in as a `describe` callable from the AWS provider,
None without credentials.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import catalog
from .catalog import DEFAULT_ARCH
from .config import INSTANCE_PATTERN, shown, suggest
from .errors import UsageError

# What a job-spec file looks like (SkyPilot's task.yaml, dstack's .dstack.yml): given as the
# command it would be run as a program on an instance that was booted and billed for it.
SPEC_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".ipynb")


def unknown_instance_type(name, why: str = "", origin: str | None = None) -> UsageError:
    """The one wording, whatever the command, of an instance type that is not one:
    the nearest name in the catalog whatever the case, and why it is not one; `origin`: the
    job file's `file:line: resources.instance` it came from."""
    return UsageError(f"{origin + ': ' if origin else ''}unknown instance type "
                      f"{shown(name)}{suggest(name, catalog.load())}"
                      + (f": {why}" if why else ""),
                      hint="cloudtrain catalog lists the GPU types")


def instance_type_error(name, origin: str | None = None) -> UsageError:
    """A --instance that is not shaped like an EC2 type name (g5.xlarge, u-6tb1.metal)."""
    lower = isinstance(name, str) and INSTANCE_PATTERN.fullmatch(name.lower())
    return unknown_instance_type(name, "EC2 type names are lower case" if lower else
                                 "expected an EC2 instance type, e.g. g5.xlarge", origin)


# What a Volta type's job gets instead of the Deep Learning AMI (providers/aws/images.py).
VOLTA_NOTE = ("{name}'s {gpu} (Volta) runs on no current Deep Learning AMI; the job gets "
              "Ubuntu 24.04 and installs NVIDIA's proprietary driver and a torch built for "
              "CUDA 12.6 at boot (a few minutes more, billed); current types such as "
              "g6.xlarge (L4) start sooner")
# What to take instead of a type with a GPU no default image runs, by its GPU count.
_NEWER = {1: "g5.xlarge (A10G) or g6.xlarge (L4)", 4: "g5.12xlarge (4 A10G)",
          8: "p4d.24xlarge (8 A100) or g6e.48xlarge (8 L40S)"}


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
                  offered: Callable[[str], bool | None] | None = None,
                  dlami: bool = True) -> TypeFacts:
    """Check `name` for a job in `region`. From the bundled catalog where it knows the type
    (and the region), else from EC2 (`describe(name)` -> {gpus, gpu, arch} or None when EC2
    has no such type; `offered(name)` -> whether it is offered in the region, None if unknown).
    `ami_arch`: the AMI's architecture (None: not known without credentials); `dlami`:
    whether the job runs the Deep Learning AMI (no --ami). UsageError for a type that does
    not exist, is not offered there, cannot run the AMI (its architecture, or a GPU the DLAMI
    does not support), or has no GPU when `cpu_ok` is not set."""
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
            raise unknown_instance_type(name, "EC2 type names are lower case")
        found = describe(name) if describe is not None else None
        if found is None and describe is not None:
            raise unknown_instance_type(name, "EC2 has no such type")
        if found is None:  # no credentials: the catalog is all there is to go by
            if suggest(name, types):
                raise unknown_instance_type(name)
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
    if dlami and facts.gpus and not catalog.default_image_runs(name):
        instead = f"pick a GPU type it runs, e.g. {_NEWER.get(int(facts.gpus), _NEWER[1])}"
        raise UsageError(catalog.no_dlami_note(name, facts.gpu),
                         hint=f"{instead}; or pass --ami with an image that supports {name}")
    if dlami and facts.gpus and catalog.volta(name):
        note = "; ".join(filter(None, [note, VOLTA_NOTE.format(name=name, gpu=facts.gpu)]))
    facts.note = note
    return facts


def own_command(command: list[str], workdir: str | None, cwd: str | None = None,
                origin: str | None = None, *, is_job_file: Callable[[str], bool]) -> None:
    """Refuse, before anything is created, an own command that cannot run: a job-spec file
    given as the command (`cloudtrain launch task.yaml`), a file here given as the command
    (`launch notjob.txt`: the shell looks commands up on PATH, not here), and a script path
    relative to the job's directory that is not in the synced workdir (with none given, the
    job runs in an empty directory). `origin`: the job file's `file:line: run` it came from,
    which the message names; `is_job_file`: whether a word names one of ours
    (jobfile.is_job_file)."""
    if not command:
        return
    at = f"{origin}: " if origin else ""
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
        if is_job_file(first):
            raise UsageError(f"{at}{first} is a job file, not a command: give it before any --",
                             hint=f"cloudtrain launch {shlex.quote(first)}")
        raise UsageError(f"{at}{first} is a file, not a command; cloudtrain's job files are "
                         "YAML (job.yaml)", hint="cloudtrain init writes one; or run your own "
                                                 "command: cloudtrain launch --workdir . -- "
                                                 "python train.py")
    _not_a_command(first, [Path(cwd)] + ([Path(workdir)] if workdir else []), at)
    base = Path(workdir) if workdir else None
    # A job file's user is told the key to write, a typed command's the flag
    flag, file = ("workdir:", origin.split(":", 1)[0]) if origin else ("--workdir", None)
    for word in words:
        if not _script_path(word):
            continue
        if base is not None:
            if not (base / word).exists():
                here = Path(cwd, word).exists() and Path(cwd).resolve() != base
                shown_base = (_below(base, cwd) or base) if file else base
                hint = f"check the path, relative to {flag}"
                if here:
                    hint = f"write `workdir: .` ({file}'s directory has it)" if file else \
                        "add --workdir . (the current directory has it)"
                raise UsageError(f"{at}{word} is not in {flag} {shown_base}: the job runs there",
                                 hint=hint)
        elif Path(cwd, word).exists():
            raise UsageError(f"{at}{word} is here, but without {flag} the job runs in an empty "
                             "directory",
                             hint=f"add `workdir: .` to {file} to sync its directory (.gitignore "
                                  "honoured)" if file else "add --workdir . to sync this "
                                                           "directory (.gitignore honoured)")
        else:
            raise UsageError(f"{at}{word}: no such file, and without {flag} the job runs in an "
                             "empty directory",
                             hint=f"add workdir: DIR ({file}'s directory or one below it) with "
                                  "your code in it" if file else
                                  "add --workdir DIR with your code in it")


def _below(path: Path, base: str) -> str | None:
    """`path` relative to `base` where it lies below it (a job file's workdir, as written)."""
    try:
        return str(Path(path).resolve().relative_to(Path(base).resolve()))
    except ValueError:
        return None


def _script_path(word: str) -> bool:
    """Whether a word of a command names a script relative to where the job runs (not an
    option, a variable, an absolute path or shell code such as -c '...')."""
    if word.startswith(("-", "/", "~", "$")) or "=" in word or any(c.isspace() for c in word):
        return False
    return word.lower().endswith(SCRIPT_SUFFIXES) or word.startswith("./")


def script_here(command: list[str], cwd: str | None = None) -> str | None:
    """The first script a command names that is in `cwd` (default: here): the job needs
    --workdir . to have it (own_command refuses it without)."""
    cwd = cwd or os.getcwd()
    return next((w for w in command if _script_path(w) and Path(cwd, w).exists()), None)


def _not_a_command(word: str, places: list[Path], at: str) -> None:
    """A file name here in command position (`notjob.txt`, `train.py`, `run.sh`) that
    is no command on PATH: the shell would answer `command not found` (exit 127), on a cloud
    only once the instance is up. Only names with a suffix are looked at: shell builtins
    (`cd`, `test`) have none."""
    import shutil

    if "/" in word or "." not in word.lstrip(".") or shutil.which(word):
        return
    found = next((p / word for p in places if (p / word).is_file()), None)
    if found is None:
        return
    quoted = shlex.quote(word)
    if os.access(found, os.X_OK):
        run = f"./{quoted}"
    else:
        run = f"{'python' if word.endswith('.py') else 'bash'} {quoted}"
    raise UsageError(f"{at}{word} is a file here, not a command: the shell looks commands up "
                     "on PATH and would answer 'command not found'",
                     hint=f"cloudtrain launch -- {run}; or, if it is a job file, rename it to "
                          f"{Path(word).stem}.yaml")


def cpu_warning(spec) -> tuple[str, bool] | None:
    """For a recipe that trains on a GPU, run on a machine without one: how long its CPU figure
    (`resources.cpu_minutes`: the default run on 2 CPU cores, measured) says it would take,
    against its max runtime, and the ways out; and whether that is past the max runtime (the
    run is predicted to fail). The recipe's resources are the spec's (spec.build_spec copies
    them)."""
    resources = spec.resources
    if int(resources.get("gpus_per_node", 0)) < 1:
        return None
    limit = spec.max_runtime_s / 60
    minutes = resources.get("cpu_minutes")
    if not minutes or minutes <= 10:  # no figure to go by, or not worth a question
        return None
    took = f"about {minutes / 60:.1f} h" if minutes >= 90 else f"about {minutes:g} min"
    said = f"no GPU here: {spec.recipe} would take {took} on this CPU (its figure for 2 cores)"
    if minutes > limit:
        said += f", past its max runtime of {limit:g} min, which stops it as failed"
    return (said + f". For a quick check: --profile smoke; for the real run: --instance TYPE or "
                   f"--gpus {catalog.gpu_request(resources, spec.gpus_needed)}"), minutes > limit
