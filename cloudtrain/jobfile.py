"""Job files: `cloudtrain launch job.yaml`, a job's spec committed next to its code.

A SkyPilot user reads one at sight (task.yaml's keys where they mean the same):

    name: cifar-sweep-1
    workdir: .                     # relative to where `launch` runs; synced (.gitignore honoured)
    setup: |                       # once per instance, before `run`, in the synced workdir
      pip install -r requirements.txt
    run: |
      python train.py --epochs 30
    envs: {WANDB_PROJECT: cifar}   # the job's environment; null: this shell's value
    secrets: {WANDB_API_KEY: null} # the same, never written to job.json, the store or logs
    outputs: [results]             # brought home besides checkpoints/ and the logs
    resources: {instance: g5.xlarge, spot: true, region: us-east-1, max_runtime: 2h}

or a recipe with `recipe`, `profile` and `args` in place of `run`. The file is read with
`yaml.safe_load` and checked against KEYS, the schema the launch flags share: every key is one
launch option, and a flag given on the command line overrides the file's value (a repeatable
flag, --set, --env, --data, adds to the file's list, later winning). An error names the file,
the line and the key, and suggests the nearest valid key, in one line (exit 2).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import re
import textwrap
from pathlib import Path

import yaml

from .config import GP3_MAX_GB, shown
from .errors import UsageError

SUFFIXES = (".yaml", ".yml")
MAX_BYTES = 1 << 20  # a job file is a page of YAML; a megabyte is something else
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# The job's own variables (jobs.job_environment) are cloudtrain's to set.
RESERVED_ENV_PREFIX = "CLOUDTRAIN_"
MINUTES = {"s": 1 / 60, "m": 1.0, "h": 60.0, "d": 1440.0}


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a job file: where it sits, the launch option it sets, what it holds."""
    path: str  # "name", "resources.spot", ...
    option: str  # the `launch` parameter it sets (the click name)
    kind: str  # str, int, number, bool, script, minutes, strings, mapping, choice
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


KEYS: tuple[Key, ...] = (
    Key("name", "name", "str", "a name to refer to the job by (--name)"),
    Key("recipe", "recipe", "str", "a bundled recipe (--recipe); or `run` for your own code"),
    Key("profile", "profile", "str", "the recipe's profile, e.g. smoke (--profile)"),
    Key("args", "sets", "mapping", "recipe arguments, {key: value} (--set key=value)"),
    Key("workdir", "workdir", "str", "directory synced into the job, relative to where "
                                     "launch runs (--workdir)"),
    Key("setup", "setup", "script", "shell script run once per instance before the job, in "
                                    "the workdir (--setup)"),
    Key("run", "run", "script", "your own code: the shell script the job runs, in the "
                                "workdir (the command after --)"),
    Key("envs", "envs", "mapping", "the job's environment variables; null takes this shell's "
                                   "value (--env KEY=VALUE)"),
    Key("secrets", "secrets", "mapping", "environment variables kept out of every file "
                                         "cloudtrain writes; null takes this shell's value "
                                         "(--secret KEY)"),
    Key("outputs", "outputs", "strings", "paths the job writes (relative to the workdir, or "
                                         "to the job directory for recipes) brought home "
                                         "after it (--output)"),
    Key("include", "include", "strings", "workdir paths synced though they look like "
                                         "credentials (--include)"),
    Key("datasets", "data", "mapping", "datasets staged before the job: {name: source or "
                                       "null for config.yaml's} (--data)"),
    Key("resources.backend", "backend", "str", "where to run: local or aws (--backend)"),
    Key("resources.instance", "instance_type", "str", "EC2 instance type (--instance)"),
    Key("resources.gpus", "gpus", "str", "instead of instance: GPU:N, the cheapest type "
                                         "with N of them (--gpus)"),
    Key("resources.spot", "spot", "bool", "spot (true) or on-demand (false) (--spot)"),
    Key("resources.region", "region", "str", "AWS region (--region)"),
    Key("resources.regions", "regions", "strings", "where `gpus` may look for the cheapest "
                                                   "type (config.yaml's regions)"),
    Key("resources.ami", "ami", "str", "AMI id (--ami)"),
    Key("resources.disk_gb", "disk_gb", "int", "root volume in GB (--disk-gb)", 8, GP3_MAX_GB),
    Key("resources.max_runtime", "max_runtime", "minutes", "stop the job after this long: "
                                                           "minutes, or 90m, 2h, 1d "
                                                           "(--max-runtime)", 0, 7 * 1440),
    Key("resources.max_price", "max_price", "number", "spot: the most to pay per hour, USD "
                                                      "(--max-price)", 0, 1000),
    Key("resources.nodes", "nodes", "int", "machines the job spans (--nodes)", 1, 64),
    Key("resources.procs", "procs", "int", "processes per host for torchrun recipes "
                                           "(--procs)", 1, 1024),
    Key("resources.keep", "keep", "bool", "keep the instance after the job (--keep)"),
    Key("resources.idle_minutes", "idle_minutes", "number", "power the kept instance off "
                                                            "this long after the job "
                                                            "(--idle-minutes)", 0, 7 * 1440),
    Key("resources.cpu_only", "cpu_only", "bool", "allow a type without a GPU (--cpu-only)"),
    Key("resources.recover", "recover", "bool", "spot: continue on a new instance after an "
                                                "interruption (--recover)"),
    Key("resources.max_restarts", "max_restarts", "int", "spot recovery: at most this many "
                                                         "relaunches (--max-restarts)", 0, 100),
    Key("resources.fallback", "fallback", "choice", "spot recovery: on-demand when no spot "
                                                    "capacity is left (--fallback)",
        choices=("on-demand",)),
)
BY_PATH = {k.path: k for k in KEYS}
SECTIONS = {"resources"}
# Launch options that repeat: the file's list first, then the flags'.
REPEATED = ("sets", "envs", "secrets", "outputs", "include", "data")


def is_job_file(word: str) -> bool:
    """A word in command position that names a job file (`cloudtrain launch job.yaml`)."""
    return word.lower().endswith(SUFFIXES)


def load(path: str | os.PathLike) -> dict:
    """The launch options a job file sets: {option: value} in the flags' own form (`sets`
    as ("k=v", ...), `spot` as a bool, `envs` as ("K=V", ...)), so the flags' checks apply
    to both. `run` becomes the command (one string of shell code)."""
    p = Path(path)
    where = str(path)
    try:
        if p.is_dir():
            raise UsageError(f"{where}: a directory, not a job file")
        if p.stat().st_size > MAX_BYTES:
            raise UsageError(f"{where}: {p.stat().st_size} bytes is not a job file (at most "
                             f"{MAX_BYTES >> 10} KB)")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{where}: no such job file",
                         hint="cloudtrain init writes one (cloudtrain init --help)") from None
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not a text file (UTF-8)") from None
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror or exc}") from None
    return parse(text, where)


def parse(text: str, where: str = "job.yaml") -> dict:
    """load() for the text of a job file; `where` names it in errors."""
    try:
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{where}{at}: not valid YAML: {problem}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to be a job file") from None
    if data is None:
        raise UsageError(f"{where}: empty job file",
                         hint="cloudtrain init writes a commented example")
    if not isinstance(data, dict) or not isinstance(tree, yaml.MappingNode):
        raise UsageError(f"{where}:1: a job file is a mapping of keys (name:, run:, "
                         f"resources:, ...), not a {type(data).__name__}")
    lines = _lines(tree, where)
    for key in AS_WRITTEN:
        if key in data:
            data[key] = _as_written(tree, key, data[key], where)
    options: dict = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise UsageError(f"{where}: key {shown(key)} is not a name")
        if key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise UsageError(f"{where}:{lines.get(key, 1)}: {key}: expected a mapping "
                                 f"of keys ({', '.join(_section_keys(key))}), got "
                                 f"{_kind_of(value)}")
            for sub, v in value.items():
                _take(options, f"{key}.{sub}", v, lines, where)
        else:
            _take(options, key, value, lines, where)
    if "run" in options:
        if "recipe" in options:
            raise UsageError(f"{where}:{lines.get('run', 1)}: run: a job runs a recipe or "
                             "your own code, not both (leave out recipe or run)")
        options["command"] = (options.pop("run"),)
    return options


# Keys whose values are text the job sees as written: an environment variable's value.
AS_WRITTEN = ("envs", "secrets")


def _as_written(tree: yaml.MappingNode, key: str, value, where: str):
    """envs: and secrets: names and values as the file writes them, not as YAML 1.1 reads a
    plain scalar: `0755` stays 0755 (not 493), `yes` stays yes (not true), `12:30` stays
    12:30 (not 750), `1.50` stays 1.50, a date stays as typed, a variable named OFF is not
    False. A null stays None (this shell's value); a nested value is left for the checks to
    refuse. A merge key (<<) or a name given twice is refused: the file's pairs and the
    loaded mapping would no longer line up."""
    if not isinstance(value, dict):
        return value
    node = next((v for k, v in tree.value
                 if isinstance(k, yaml.ScalarNode) and k.value == key), None)
    if not isinstance(node, yaml.MappingNode):
        return value
    seen: dict[str, int] = {}
    for k, _ in node.value:
        line = k.start_mark.line + 1
        if k.tag == "tag:yaml.org,2002:merge":
            raise UsageError(f"{where}:{line}: {key}: a merge key (<<) is not supported here; "
                             "write the variables out")
        if isinstance(k, yaml.ScalarNode) and k.value in seen:
            raise UsageError(f"{where}:{line}: {key}.{k.value}: given twice (first on line "
                             f"{seen[k.value]})")
        if isinstance(k, yaml.ScalarNode):
            seen[k.value] = line
    if len(node.value) != len(value):
        return value
    typed = (bool, int, float, datetime.date)
    out = {}
    for (k, v), (name, parsed) in zip(node.value, value.items()):
        if isinstance(k, yaml.ScalarNode) and isinstance(name, typed):
            name = k.value
        if isinstance(v, yaml.ScalarNode) and isinstance(parsed, typed):
            parsed = v.value
        out[name] = parsed
    return out


def _lines(tree: yaml.MappingNode, where: str) -> dict[str, int]:
    """Each key's line (1-based), `section.key` for nested ones; a key given twice is an
    error (safe_load would keep the last one silently)."""
    out: dict[str, int] = {}

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for k, v in node.value:
            name = f"{prefix}{k.value}" if isinstance(k, yaml.ScalarNode) else None
            if name is None:
                continue
            if name in out:
                raise UsageError(f"{where}:{k.start_mark.line + 1}: {name}: given twice (first "
                                 f"on line {out[name]})")
            out[name] = k.start_mark.line + 1
            if not prefix and k.value in SECTIONS and isinstance(v, yaml.MappingNode):
                walk(v, f"{k.value}.")

    walk(tree, "")
    return out


def _section_keys(section: str) -> list[str]:
    return [k.path.split(".", 1)[1] for k in KEYS if k.path.startswith(section + ".")]


def _unknown(path: str, line: int, where: str) -> UsageError:
    """An unknown key, with the nearest valid one: in its section, or the same name in
    another place (`spot:` at the top belongs under resources:)."""
    section, _, name = path.rpartition(".")
    elsewhere = [k.path for k in KEYS if k.path.rsplit(".", 1)[-1] == name and k.path != path]
    if elsewhere:
        return UsageError(f"{where}:{line}: {path}: unknown key; {name} belongs at "
                          f"{elsewhere[0]}")
    here = _section_keys(section) if section else \
        [k.path for k in KEYS if "." not in k.path] + sorted(SECTIONS)
    close = difflib.get_close_matches(name, here, n=1, cutoff=0.6) or \
        difflib.get_close_matches(name.lower().replace("-", "_"), here, n=1, cutoff=0.6)
    known = ", ".join(here)
    return UsageError(f"{where}:{line}: {path}: unknown key"
                      + (f"; did you mean {close[0]}?" if close else f" (keys: {known})"))


def _kind_of(value) -> str:
    return {bool: "true/false", int: "a number", float: "a number", str: "text",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def _take(options: dict, path: str, value, lines: dict, where: str) -> None:
    """Check one key's value against its Key and store it as its launch option."""
    line = lines.get(path, 1)
    key = BY_PATH.get(path)
    if key is None:
        raise _unknown(path, line, where)
    if value is None:  # `key:` with nothing: as if not given
        return

    def bad(expected: str) -> UsageError:
        return UsageError(f"{where}:{line}: {path}: expected {expected}, got "
                          f"{_kind_of(value)} {shown(_short(value))}")

    kind = key.kind
    if kind in ("str", "script", "choice"):
        if not isinstance(value, str):
            raise bad("text")
        if kind == "choice" and value not in key.choices:
            raise UsageError(f"{where}:{line}: {path}: expected one of "
                             f"{', '.join(key.choices)}, got {shown(value)}")
        if not value.strip():
            raise bad("a value")
        options[key.option] = value
    elif kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        options[key.option] = value
    elif kind in ("int", "number", "minutes"):
        number = _minutes(value) if kind == "minutes" and isinstance(value, str) else value
        if isinstance(number, bool) or not isinstance(number, (int, float)) or \
                (kind == "int" and not isinstance(number, int)):
            raise bad("a whole number" if kind == "int" else
                      "minutes, or a duration like 90m or 2h" if kind == "minutes" else
                      "a number")
        if kind == "minutes" and number <= 0:
            raise UsageError(f"{where}:{line}: {path}: must be more than 0 minutes, got "
                             f"{shown(value)}")
        if number != number or (key.low is not None and number < key.low) or \
                (key.high is not None and number > key.high):
            raise UsageError(f"{where}:{line}: {path}: {shown(value)} is out of range "
                             f"({key.low:g} to {key.high:g})")
        options[key.option] = number
    elif kind == "strings":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) and i.strip()
                                                  for i in items):
            raise bad("a list of text")
        options[key.option] = tuple(items)
    elif kind == "mapping":
        options[key.option] = _mapping(key, value, line, where, bad)


def _mapping(key: Key, value, line: int, where: str, bad) -> tuple[str, ...]:
    """args / envs / secrets / datasets: {name: scalar} as the flags' `NAME=VALUE` words
    (`NAME` alone for a null: config.yaml's dataset, this shell's variable)."""
    if not isinstance(value, dict):
        raise bad("a mapping {name: value}")
    out = []
    for name, v in value.items():
        if not isinstance(name, str) or not name.strip():
            raise UsageError(f"{where}:{line}: {key.path}: {shown(name)} is not a name")
        if key.option in ("envs", "secrets") and not ENV_NAME.fullmatch(name):
            raise UsageError(f"{where}:{line}: {key.path}.{name}: not an environment variable "
                             "name (letters, digits and _, not starting with a digit)")
        if isinstance(v, (dict, list)):
            raise UsageError(f"{where}:{line}: {key.path}.{name}: expected a single value, "
                             f"got {_kind_of(v)}")
        if v is None:
            if key.option == "sets":
                raise UsageError(f"{where}:{line}: args.{name}: no value (leave the key out "
                                 "for the recipe's default)")
            out.append(name)
        elif isinstance(v, bool):
            out.append(f"{name}={'true' if v else 'false'}")
        else:
            out.append(f"{name}={v}")
    return tuple(out)


def _short(value) -> object:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _minutes(text: str):
    """'90m', '2h', '1.5d', '45s', '30' -> minutes; anything else is returned unchanged."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text)
    if not m:
        return text
    return float(m.group(1)) * MINUTES[m.group(2) or "m"]


def merge(from_file: dict, given: dict) -> dict:
    """The launch options: the flags typed on the command line (`given`: {option: value},
    only those the user typed) over the file's. Repeated options add up, the file's first."""
    merged = dict(from_file)
    for option, value in given.items():
        if option in REPEATED:
            merged[option] = tuple(from_file.get(option, ())) + tuple(value)
        else:
            merged[option] = value
    return merged


def environment(words, what: str, environ=None) -> dict[str, str]:
    """`--env KEY=VALUE` / `--env KEY` (this shell's value) words as {KEY: VALUE}; the last
    word for a key wins. `what` is the flag, for messages."""
    environ = os.environ if environ is None else environ
    given: dict[str, str | None] = {}  # the last word for a name wins, a value or not
    for word in words or ():
        name, eq, value = str(word).partition("=")
        if not ENV_NAME.fullmatch(name):  # the value may be a secret: never shown
            raise UsageError(f"{what} {shown(name)}{'=...' if eq else ''}: expected KEY=VALUE "
                             "with KEY an environment variable name (letters, digits and _)")
        if name.upper().startswith(RESERVED_ENV_PREFIX):
            raise UsageError(f"{what} {name}: CLOUDTRAIN_* variables are set by cloudtrain for "
                             "the job", hint="pick another name")
        given[name] = value if eq else None
    out: dict[str, str] = {}
    for name, value in given.items():
        if value is None:
            if name not in environ:
                raise UsageError(f"{what} {name}: no value given and {name} is not set here",
                                 hint=f"{what} {name}=VALUE, or export {name} first")
            value = environ[name]
        if "\0" in value:
            raise UsageError(f"{what} {name}: a value cannot hold a NUL character")
        out[name] = value
    return out


# -- `cloudtrain init` ---------------------------------------------------------------------------


def example(recipe=None, filename: str = "cloudtrain.yaml") -> str:
    """A commented job file: for `recipe` (a recipes.Recipe) its profiles and arguments; else
    for your own code. Every key it shows is in KEYS (a test loads what it writes)."""
    if recipe is not None:
        profiles = ", ".join(sorted(recipe.profiles)) or "none"
        profile = "smoke" if "smoke" in recipe.profiles else None
        args = []
        for name, arg in recipe.arguments.items():
            default = arg.render(arg.default) if arg.default is not None else None
            help_text = textwrap.shorten(str(arg.help or ""), 60, placeholder="...")
            args.append(f"  # {name}: {default if default not in (None, '') else '...'}"
                        + (f"    # {help_text}" if help_text else ""))
        head = (f"# cloudtrain job file: the {recipe.name} recipe. Run it with\n"
                f"#   cloudtrain launch {{file}}            (flags override it: --set, --spot, ...)\n"
                f"#   cloudtrain launch {{file}} --dry-run  (the plan and its price)\n"
                f"name: {recipe.name}-run\n"
                f"recipe: {recipe.name}\n"
                f"# profiles: {profiles}\n"
                + (f"profile: {profile}\n" if profile else "")
                + "# args: the recipe's arguments (cloudtrain recipes "
                  f"{recipe.name}); uncomment to set\n"
                + "args:\n" + "\n".join(args) + "\n")
    else:
        head = ("# cloudtrain job file: your own code. Run it with\n"
                "#   cloudtrain launch {file}            (flags override it: --spot, --env, ...)\n"
                "#   cloudtrain launch {file} --dry-run  (the plan and its price)\n"
                "name: my-training-run\n"
                "workdir: .               # synced into the job (.gitignore honoured)\n"
                "setup: |                 # once per instance, before run, in the workdir\n"
                "  python -m pip install -q -r requirements.txt || true\n"
                "run: |                   # the job: $CLOUDTRAIN_JOB_DIR/metrics.jsonl rows "
                "show in status and plot\n"
                "  python train.py\n"
                "envs:                    # the job's environment (null: this shell's value)\n"
                "  PYTHONHASHSEED: 0\n"
                "# secrets:               # like envs, but never written to any file cloudtrain "
                "keeps\n"
                "#   WANDB_API_KEY: null\n"
                "# outputs: [results]     # files your code writes, brought home after the job\n")
    resources = ("resources:               # where it runs (default: this machine)\n"
                 "  # backend: aws         # implied by instance, gpus, spot or region\n"
                 "  # instance: g5.xlarge\n"
                 "  # gpus: A10G:1         # instead of instance: the cheapest type with these\n"
                 "  # spot: true\n"
                 "  # region: us-east-1\n"
                 "  # disk_gb: 100\n"
                 "  # nodes: 1\n"
                 + ("  # max_runtime: 2h      # default: the recipe's\n" if recipe is not None
                    else "  max_runtime: 2h\n"))
    return (head + resources).replace("{file}", filename)


def write_example(path: str, recipe_name: str | None = None, force: bool = False) -> str:
    """`cloudtrain init`: the example for a recipe (by name) or for your own code, written to
    `path` (never over an existing file without `force`); "-" returns the text instead."""
    recipe = None
    if recipe_name is not None:
        from . import recipes

        recipe = recipes.load(recipe_name)
    name = "cloudtrain.yaml" if path == "-" else Path(path).name
    text = example(recipe, name)
    if path == "-":
        return text
    if not is_job_file(path):
        raise UsageError(f"{path}: a job file's name ends in .yaml or .yml")
    target = Path(path)
    if target.exists() and not force:
        raise UsageError(f"{path} exists: not overwritten", hint="--force to replace it, or "
                                                                 "-o another.yaml")
    try:
        target.write_text(text)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    return ""
