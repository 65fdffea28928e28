"""Job files: `cloudtrain launch job.yaml`, a job's spec committed next to its code.

A SkyPilot user reads one at sight (task.yaml's keys where they mean the same):

    name: cifar-sweep-1
    workdir: .                     # this file's directory or below; synced (.gitignore honoured)
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
the line and the key, and suggests the nearest valid key, in one line (exit 2); so does a
check after this one on a value from the file (LaunchOptions.origins).

A job file is code from a repository, perhaps someone else's: its workdir is read
from the file's own directory and must stay inside it, it cannot `include` credential-looking
files, and a secret's value cannot be written in it; a value it takes from this shell
(`KEY: null`) is refused for a cloud's credentials and asked about otherwise (job_env.py). YAML
anchors and aliases are refused before anything expands them.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import re
from pathlib import Path
from typing import Collection

import yaml

from .config import BUDGET_MAX_USD, GP3_MAX_GB, check_region, shown
from .errors import UsageError
from .host.job_records import MAX_RESTARTS
from .job_env import ENV_NAME
from .launch_options import LaunchOptions

SUFFIXES = (".yaml", ".yml")
MAX_BYTES = 1 << 20  # a job file is a page of YAML; a megabyte is something else
MINUTES = {"s": 1 / 60, "m": 1.0, "h": 60.0, "d": 1440.0}


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a job file: where it sits, the launch option it sets, what it holds."""
    path: str  # "name", "resources.spot", ...
    option: str  # the `launch` parameter it sets (the click name)
    kind: str  # str, int, number, bool, script, minutes, usd, time, strings, mapping, choice
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


KEYS: tuple[Key, ...] = (
    Key("name", "name", "str", "a name to refer to the job by (--name)"),
    Key("recipe", "recipe", "str", "a bundled recipe (--recipe); or `run` for your own code"),
    Key("profile", "profile", "str", "the recipe's profile, e.g. smoke (--profile)"),
    Key("args", "sets", "mapping", "recipe arguments, {key: value} (--set key=value)"),
    Key("workdir", "workdir", "str", "directory synced into the job: this file's directory "
                                     "or one below it (--workdir, typed, for another)"),
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
    Key("include", "include", "strings", "refused in a job file: only --include, typed, "
                                         "sends a credential-looking file"),
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
    Key("budget", "budget", "usd", "the most the job may cost, USD, every attempt, volume and "
                                   "staging included: 25 or $25 (--budget)", 0, BUDGET_MAX_USD),
    Key("deadline", "deadline", "time", "when the job must have finished: 2026-12-05 09:00 "
                                       "(local time), with a zone (2026-12-05T09:00Z), or "
                                       "+6h from the launch (--deadline)"),
    Key("resources.max_price", "max_price", "number", "spot: the most to pay per hour, USD "
                                                      "(--max-price)", 0, 1000),
    Key("resources.reservation", "reservation", "str", "a capacity reservation or Capacity "
                                                       "Block you hold, cr-… (--reservation)"),
    Key("resources.block_fee", "block_fee", "usd", "what that Capacity Block cost, USD "
                                                   "(--block-fee)", 0, BUDGET_MAX_USD),
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
                                                         "relaunches (--max-restarts)", 0,
        MAX_RESTARTS),
    Key("resources.fallback", "fallback", "choice", "spot recovery: on-demand when no spot "
                                                    "capacity is left (--fallback)",
        choices=("on-demand",)),
)
BY_PATH = {k.path: k for k in KEYS}
SECTIONS = {"resources"}
# Keys whose values are mappings of names (args: {epochs: 30}): each name has its line.
NAMED = {k.path for k in KEYS if k.kind == "mapping"}


def is_job_file(word: str) -> bool:
    """A word in command position that names a job file (`cloudtrain launch job.yaml`)."""
    return word.lower().endswith(SUFFIXES)


def for_launch(flags: dict, typed: Collection[str], before_dashdash: Collection[str]
               ) -> LaunchOptions:
    """`launch`'s options: its flags (`flags`: {option: value}, `typed`: those given on the
    command line), over a job file's where the command's first word names one and comes
    before any `--` (after it, words are the user's command)."""
    options = LaunchOptions.of(flags)
    command = options.command
    if not (command and is_job_file(command[0]) and command[0] in before_dashdash):
        return options
    given = LaunchOptions.of({k: v for k, v in flags.items() if k in typed and k != "command"})
    given.command = command[1:]
    return given.over(load(command[0], given.given()))


def load(path: str | os.PathLike, typed: Collection[str] = ()) -> LaunchOptions:
    """The launch options a job file sets, in the flags' own form (`sets` as ("k=v", ...),
    `spot` as a bool, `envs` as ("K=V", ...)), so the flags' checks apply to both. `run`
    becomes the command (one string of shell code). `typed`: the options given on the
    command line, which replace the file's (its workdir is then not read)."""
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
    return parse(text, where, p.resolve().parent, typed)


def parse(text: str, where: str = "job.yaml", base: Path | None = None,
          typed: Collection[str] = ()) -> LaunchOptions:
    """load() for the text of a job file; `where` names it in errors, `base` is its
    directory (default: where's). The options' `origins` say where each value came
    from (`job.yaml:7: resources.disk_gb`; `envs.NAME` for one item of a list option), for
    the checks after this one to name the file, the line and the key."""
    tree, data = _read(text, where)
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
    file = _File(where, Path(where).parent if base is None else base, frozenset(typed), lines)
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
                file.take(f"{key}.{sub}", v)
        else:
            file.take(key, value)
    options, origins = file.options, file.origins
    if "run" in options:
        if "recipe" in options:
            raise UsageError(f"{where}:{lines.get('run', 1)}: run: a job runs a recipe or "
                             "your own code, not both (leave out recipe or run)")
        options["command"] = (options.pop("run"),)
        origins["command"] = origins.pop("run")
    origins[""] = where
    return LaunchOptions.of(options, origins)


# Python refuses to turn a longer integer into text (int_max_str_digits): no setting takes one.
MAX_DIGITS = 4300


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses anchors and aliases where it meets them, before anything
    expands them (a 489-byte file of nested aliases was a 10^9-item value in an
    error message). A job file is a page of keys: nothing in it needs one."""

    where = "job.yaml"

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise UsageError(f"{self.where}:{event.start_mark.line + 1}: YAML anchors and "
                             "aliases (&name, *name) are not supported in a job file; write "
                             "the value out")
        return super().compose_node(parent, index)


def _read(text: str, where: str):
    """The file's node tree and its values, each value checked as it is built: a YAML error,
    a value YAML cannot build (a 13th month) or a number too long to show is one line."""
    loader = None
    try:
        loader = _Loader(text)  # reads the first characters already
        loader.where = where
        tree = loader.get_single_node()
        if tree is None:
            return None, None
        _build_values(loader, tree, where)
        return tree, loader.construct_document(tree)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{where}{at}: not valid YAML: {problem}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to be a job file") from None
    finally:
        if loader is not None:
            loader.dispose()


# The scalars whose building can fail (the others are text, true/false or null).
BUILT = {f"tag:yaml.org,2002:{t}" for t in ("int", "float", "timestamp")}


def _build_values(loader: yaml.SafeLoader, tree: yaml.Node, where: str) -> None:
    """Build every scalar once, in the file's order, naming the key of one that fails:
    YAML reads `2001-13-45` as a date and fails, and an integer past MAX_DIGITS digits
    would fail every message that shows it. A merge key is refused: building
    merges it into its mapping, and envs: and secrets: as written could no longer line up
    with the values."""
    stack: list[tuple[yaml.Node, str]] = [(tree, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for k, v in reversed(node.value):
                if k.tag == "tag:yaml.org,2002:merge":  # building would merge it in place
                    raise UsageError(f"{where}:{k.start_mark.line + 1}: {path or 'job file'}: "
                                     "a merge key (<<) is not supported in a job file; write "
                                     "the keys out")
                name = path
                if isinstance(k, yaml.ScalarNode):
                    name = f"{path}.{k.value}" if path else k.value
                stack += [(v, name), (k, path)]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(v, path) for v in reversed(node.value)]
        elif isinstance(node, yaml.ScalarNode) and node.tag in BUILT:
            at = f"{where}:{node.start_mark.line + 1}: {path or 'key'}"
            if node.tag == "tag:yaml.org,2002:int" and len(node.value) > MAX_DIGITS:
                raise UsageError(f"{at}: a number of {len(node.value)} digits; no setting "
                                 "takes one")
            try:
                value = loader.construct_object(node)
            except (ValueError, OverflowError) as exc:
                raise UsageError(f"{at}: YAML cannot read {shown(node.value)}: "
                                 f"{str(exc).splitlines()[0][:100]}") from None
            if isinstance(value, int) and not isinstance(value, bool) and \
                    abs(value) >= 10 ** MAX_DIGITS:
                raise UsageError(f"{at}: a number of more than {MAX_DIGITS} digits; no "
                                 "setting takes one")


# Keys whose values are text the job sees as written: an environment variable's value.
AS_WRITTEN = ("envs", "secrets")


def _as_written(tree: yaml.MappingNode, key: str, value, where: str):
    """envs: and secrets: names and values as the file writes them, not as YAML 1.1 reads a
    plain scalar: `0755` stays 0755 (not 493), `yes` stays yes (not true), `12:30` stays
    12:30 (not 750), `1.50` stays 1.50, a date stays as typed, a variable named OFF is not
    False. A null stays None (this shell's value); a nested value is left for the checks to
    refuse. A name given twice is refused (and a merge key before this): the file's pairs
    and the loaded mapping would no longer line up."""
    if not isinstance(value, dict):
        return value
    node = next((v for k, v in tree.value
                 if isinstance(k, yaml.ScalarNode) and k.value == key), None)
    if not isinstance(node, yaml.MappingNode):
        return value
    seen: dict[str, int] = {}
    for k, _ in node.value:
        line = k.start_mark.line + 1
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
    """Each key's line (1-based), `section.key` for nested ones and `args.NAME` for the names
    of the mapping keys (NAMED); a key given twice is an error (safe_load would keep the
    last one silently)."""
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
            if not prefix and (k.value in SECTIONS or k.value in NAMED) and \
                    isinstance(v, yaml.MappingNode):
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


@dataclasses.dataclass
class _File:
    """The job file being read: where it is, its keys' lines, and what it sets so far."""
    where: str
    base: Path  # its directory: a workdir is read from here and stays below it
    typed: frozenset  # the options given on the command line (the file's are not read)
    lines: dict
    options: dict = dataclasses.field(default_factory=dict)
    origins: dict = dataclasses.field(default_factory=dict)

    def at(self, path: str) -> str:
        """`job.yaml:7: resources.disk_gb`: how messages name a key."""
        return f"{self.where}:{self.lines.get(path, 1)}: {path}"

    def take(self, path: str, value) -> None:
        """Check one key's value against its Key and store it as its launch option."""
        key = BY_PATH.get(path)
        if key is None:
            raise _unknown(path, self.lines.get(path, 1), self.where)
        if value is None:  # `key:` with nothing: as if not given
            return
        at = self.at(path)
        if path == "include":  # the file may come from someone else's repository
            raise UsageError(f"{at}: a job file cannot send credential-looking files (it may "
                             "come from someone else's repository)",
                             hint="type --include PATTERN on the command line to send one "
                                  "(the launch asks first)")

        def bad(expected: str) -> UsageError:
            return UsageError(f"{at}: expected {expected}, got {_kind_of(value)} "
                              f"{shown(value)}")

        kind = key.kind
        if kind in ("str", "script", "choice"):
            if not isinstance(value, str):
                raise bad("text")
            if kind == "choice" and value not in key.choices:
                raise UsageError(f"{at}: expected one of {', '.join(key.choices)}, got "
                                 f"{shown(value)}")
            if not value.strip():
                raise bad("a value")
            if path == "workdir":
                if "workdir" in self.typed:  # the flag's replaces it: not read at all
                    return
                value = _workdir(value, self.base, at)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise bad("true or false")
        elif kind == "time":  # YAML reads 2026-12-05T09:00:00Z as a datetime itself
            moment = deadline_time(value)
            if moment is None:
                raise bad("a time: 2026-12-05 09:00, 2026-12-05T09:00Z or +6h")
            value = moment
        elif kind in ("int", "number", "minutes", "usd"):
            number = minutes(value) if kind == "minutes" and isinstance(value, str) else \
                dollars(value) if kind == "usd" and isinstance(value, str) else value
            if isinstance(number, bool) or not isinstance(number, (int, float)) or \
                    (kind == "int" and not isinstance(number, int)):
                raise bad("a whole number" if kind == "int" else
                          "minutes, or a duration like 90m or 2h" if kind == "minutes" else
                          "US dollars, e.g. 25 or $25" if kind == "usd" else "a number")
            if kind == "minutes" and number <= 0:  # not "out of range (0 to 10080)"
                raise UsageError(f"{at}: must be more than 0 minutes, got {shown(value)}")
            if kind == "usd" and number <= 0:
                raise UsageError(f"{at}: must be more than $0, got {shown(value)}")
            if number != number or (key.low is not None and number < key.low) or \
                    (key.high is not None and number > key.high):
                raise UsageError(f"{at}: {shown(value)} is out of range ({key.low:g} to "
                                 f"{key.high:g})")
            value = number
        elif kind == "strings":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(i, str) and i.strip()
                                                      for i in items):
                raise bad("a list of text")
            if path == "resources.regions":  # checked as --region is
                for item in items:
                    try:
                        check_region(item)
                    except UsageError as exc:
                        raise UsageError(f"{at}: {exc.message}", hint=exc.hint) from None
            value = tuple(items)
            self.origins.update({f"{key.option}.{i}": at for i in items})
        elif kind == "mapping":
            value = self._mapping(key, value, bad)
        self.options[key.option] = value
        self.origins[key.option] = at

    def _mapping(self, key: Key, value, bad) -> tuple[str, ...]:
        """args / envs / secrets / datasets: {name: scalar} as the flags' `NAME=VALUE` words
        (`NAME` alone for a null: config.yaml's dataset, this shell's variable)."""
        if not isinstance(value, dict):
            raise bad("a mapping {name: value}")
        out = []
        for name, v in value.items():
            if not isinstance(name, str) or not name.strip():
                raise UsageError(f"{self.at(key.path)}: {shown(name)} is not a name")
            at = self.at(f"{key.path}.{name}")
            if key.option in ("envs", "secrets") and not ENV_NAME.fullmatch(name):
                raise UsageError(f"{at}: not an environment variable name (letters, digits "
                                 "and _, not starting with a digit)")
            if isinstance(v, (dict, list)):
                raise UsageError(f"{at}: expected a single value, got {_kind_of(v)}")
            if key.option == "secrets" and v is not None:  # never shown
                raise UsageError(f"{at}: a secret's value does not belong in a job file (the "
                                 "file travels with the workdir)",
                                 hint=f"write `{name}: null` and export {name}, or pass "
                                      f"--secret {name}=VALUE")
            if v is None:
                if key.option == "sets":
                    raise UsageError(f"{at}: no value (leave the key out for the recipe's "
                                     "default)")
                out.append(name)
            elif isinstance(v, bool):
                out.append(f"{name}={'true' if v else 'false'}")
            else:
                out.append(f"{name}={v}")
            self.origins[f"{key.option}.{name}"] = at
        return tuple(out)


def _workdir(value: str, base: Path, at: str) -> str:
    """A job file's workdir as an absolute path: read from the file's directory `base`, and
    inside it once links are resolved (`workdir: ../..` or a link out of the
    repository sent the home directory it was cloned into, keys and tokens with it). `at`:
    the key's place, `job.yaml:2: workdir`."""
    try:
        base = base.resolve()
        path = (base / Path(value).expanduser()).resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links, a name too long
        raise UsageError(f"{at}: {shown(value)}: {getattr(exc, 'strerror', None) or exc}"
                         ) from None
    if not path.is_relative_to(base):
        raise UsageError(f"{at}: {shown(value)} is outside {base}, the job file's directory: "
                         "a job file syncs only its own directory or one below it",
                         hint="to sync another directory, type it: --workdir DIR")
    if not path.is_dir():
        raise UsageError(f"{at}: {shown(value)} is not a directory")
    return str(path)


def minutes(text: str):
    """'90m', '2h', '1.5d', '45s', '30' (minutes) -> minutes; anything else is returned
    unchanged. The job file's max_runtime and the --max-runtime flag read the same."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text)
    if not m:
        return text
    return float(m.group(1)) * MINUTES[m.group(2) or "m"]


def deadline_time(value, now: float | None = None) -> float | None:
    """A deadline as seconds since the epoch, or None where `value` is not one: a datetime
    (YAML's own), ISO 8601 text (2026-12-05 09:00 in this machine's local time where it
    names no zone, 2026-12-05T09:00Z, 2026-12-05T09:00+01:00), or +6h / +90m / +1.5d from
    `now`. The spec checks it is in the future."""
    import time as time_

    now = time_.time() if now is None else now
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        value = datetime.datetime.combine(value, datetime.time())
    if isinstance(value, datetime.datetime):
        return value.timestamp()  # a naive one is local time, as the text form
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.startswith("+"):
        ahead = minutes(text[1:])
        return None if isinstance(ahead, str) else now + ahead * 60
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp()


def flag_deadline(text: str, flag: str) -> float:
    """--deadline's time (deadline_time), or a UsageError naming it."""
    at = deadline_time(text)
    if at is None:
        raise UsageError(f"{flag} {shown(text)}: expected a time, e.g. '2026-12-05 09:00' "
                         "(local), 2026-12-05T09:00Z, or +6h from now")
    return at


def dollars(text: str):
    """'25', '$25', '12.50', '$0.75 ' -> dollars; anything else is returned unchanged. The
    job file's budget and the --budget flag read the same."""
    m = re.fullmatch(r"\s*\$?\s*([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*", text)
    return float(m.group(1)) if m else text


def flag_dollars(text: str, flag: str) -> float:
    """A money flag's dollars (dollars(): `--budget $25`), or a UsageError naming it; the
    range is the spec's to check."""
    value = dollars(text)
    if isinstance(value, str):
        raise UsageError(f"{flag} {shown(text)}: expected US dollars, e.g. 25 or $25")
    return value


def flag_minutes(text: str, flag: str) -> float:
    """A duration flag's minutes (minutes(): `--max-runtime 2h`), or a UsageError naming it;
    the range is the spec's to check."""
    value = minutes(text)
    if isinstance(value, str):
        raise UsageError(f"{flag} {shown(text)}: expected minutes, or a duration like 90m, 2h, "
                         "1d")
    return value
