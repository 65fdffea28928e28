"""Bundled recipes: find `recipes/*/recipe.yaml`, validate them, and turn a recipe plus the
user's `--profile` and `--set key=value` into the exact arguments its script receives.

recipe.yaml:
    name, description, entry (the script, relative to the recipe folder),
    requires (Python modules the job imports), arguments (each: type int|float|bool|str|choice,
    default (null = not passed), help, choices for `choice`), profiles (each: description,
    set: {argument: value}, resources: its own disk_gb and max_runtime_minutes), resources (gpus_per_node, nodes, gpu (the GPU model its published
    results used, for picking a default instance), launcher (python | torchrun: one process
    per GPU on the host), disk_gb, max_runtime_minutes),
    data (name, source, size_mb, reads: the folders each variant reads), target (metric,
    value), published (result, time, hardware, source, and which variant; for estimates:
    gpu, gpus, seconds, accuracy, runs).
An argument named `gpus` is the number of GPUs (processes) the recipe's arguments are set
up for: a job then needs exactly that many on one host. `resources.gpus_per_variant`
({variant: N}) gives the default count per variant (`--procs` overrides it);
`resources.nodes_per_variant` ({variant: N}) the machines a variant was published on.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import gpu_request
from .config import GP3_MAX_GB, finite, shown, suggest, yaml_problem
from .errors import ConfigError, NotFound, UsageError

BUNDLED = Path(__file__).resolve().parent.parent / "recipes"
SHARED_DIR = "common"  # recipes/common: helpers every recipe may import
TYPES = ("int", "float", "bool", "str", "choice")
LAUNCHERS = ("python", "torchrun")
TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")
ARGUMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INT64 = 1 << 63
MAX_GPUS = 64  # on one host (the largest instances have 8; room for what comes)
# Arguments with a meaning cloudtrain knows: (lowest, highest, whether lowest is refused).
ARGUMENT_LIMITS = {"gpus": (1, MAX_GPUS, False), "epochs": (0, 100_000, True),
                   "runs": (1, 100_000, False)}
# resources: numbers and their ranges (whole numbers except max_runtime_minutes).
RESOURCE_LIMITS = {"gpus_per_node": (0, MAX_GPUS), "nodes": (1, 64), "disk_gb": (8, GP3_MAX_GB),
                   "max_runtime_minutes": (0, 7 * 24 * 60),
                   # the default run's minutes on 2 CPU cores, measured (preflight.cpu_warning)
                   "cpu_minutes": (0, 10 ** 7)}


def search_path() -> list[Path]:
    """Where recipes are looked for: `$CLOUDTRAIN_RECIPES` (os.pathsep-separated), then ours."""
    extra = [Path(p) for p in os.environ.get("CLOUDTRAIN_RECIPES", "").split(os.pathsep) if p]
    return extra + [BUNDLED]


@dataclass
class Argument:
    name: str
    type: str
    default: object
    help: str = ""
    choices: list | None = None

    def parse(self, raw: object, source: str) -> object:
        """The typed value of `raw` (a string from --set, or a YAML value), or a UsageError."""
        def bad(expected: str) -> UsageError:
            return UsageError(f"{source}: {self.name} must be {expected}, got {shown(raw)}")

        if raw is None:
            return None
        text = str(raw).strip()
        if self.type == "bool":
            if isinstance(raw, bool):
                return raw
            if text.lower() in TRUE:
                return True
            if text.lower() in FALSE:
                return False
            raise bad("true or false")
        if self.type == "int":
            if isinstance(raw, (bool, float)):
                raise bad("an integer")
            try:
                value = int(text)
            except ValueError:
                raise bad("an integer") from None
            if not -INT64 <= value < INT64:
                raise bad("an integer of at most 19 digits")
            return self._in_range(value, source)
        if self.type == "float":
            if isinstance(raw, bool):
                raise bad("a number")
            try:
                number = float(text)
            except ValueError:
                raise bad("a number") from None
            if not math.isfinite(number):
                raise bad("a finite number")
            return self._in_range(number, source)
        if self.type == "choice":
            if text not in [str(c) for c in self.choices or []]:
                raise bad("one of " + ", ".join(str(c) for c in self.choices or []))
            return text
        return text

    def _in_range(self, value, source: str):
        if self.name in ARGUMENT_LIMITS:
            low, high, low_open = ARGUMENT_LIMITS[self.name]
            finite(value, f"{source}: {self.name}", low=low, high=high, low_open=low_open)
        return value

    def render(self, value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


@dataclass
class Recipe:
    name: str
    path: Path
    description: str
    entry: str
    requires: list[str]
    arguments: dict[str, Argument]
    profiles: dict[str, dict]
    resources: dict
    data: list[dict] = field(default_factory=list)
    target: dict | None = None
    published: list[dict] = field(default_factory=list)
    measured: list[dict] = field(default_factory=list)  # this project's own figures
    # What feeds the GPUs (issue 28): images_per_epoch, per_core {folder: images per
    # CPU-second, decode=cpu}, epochs {variant: {folder: epochs}}; estimate's data bound.
    data_path: dict | None = None
    # Arguments a checkpoint is tied to: `--resume-from` refuses a run that changes one,
    # before launch (the script would refuse only once it runs).
    resume_must_match: list[str] = field(default_factory=list)

    def resources_for(self, profile: str | None) -> dict:
        """The resources a run with `profile` plans with: the recipe's, with what the
        profile sets of its own (a smoke run's disk and max runtime, not the full run's)."""
        own = (self.profiles.get(profile) or {}).get("resources") if profile else None
        return {**self.resources, **(own or {})}

    def target_for(self, values: dict) -> dict:
        """The run's target for these arguments, {metric, value, ...}: the variant's own
        where it has one (imagenet's ffcv-rn50-*: FFCV's top-1), else the recipe's; {}
        without one."""
        target = self.target or {}
        variant = values.get("variant")
        own = (target.get("per_variant") or {}).get(variant) if isinstance(variant, str) \
            else None
        return dict(own or {k: v for k, v in target.items() if k != "per_variant"})

    def compile_costs(self) -> list[dict]:
        """The measured entries that say what compile=true costs before the first step."""
        return [m for m in self.measured if isinstance(m.get("compile_seconds"), (int, float))]

    @property
    def gpus(self) -> int:
        return int(self.resources.get("gpus_per_node", 1)) * int(self.resources.get("nodes", 1))

    @property
    def launcher(self) -> str:
        return self.resources.get("launcher", "python")

    def gpus_needed(self, values: dict) -> int:
        """GPUs (one process each) on one host these arguments are set up for: the `gpus`
        argument's value if the recipe has one and it is set, else `resources.gpus_per_variant`
        for the `variant` argument (0: no requirement)."""
        if "gpus" in self.arguments and values.get("gpus") is not None:
            return int(values["gpus"])
        per_variant = self.resources.get("gpus_per_variant") or {}
        return int(per_variant.get(values.get("variant"), 0))

    def nodes_published(self, values: dict) -> int:
        """Machines the arguments' variant was published on (`resources.nodes_per_variant`,
        else `resources.nodes`). Multi-node launch does not exist yet: a job runs on one
        machine, and the recipe says how its global batch differs."""
        per_variant = self.resources.get("nodes_per_variant") or {}
        return int(per_variant.get(values.get("variant"), self.resources.get("nodes", 1)))

    def gpus_exact(self, values: dict) -> bool:
        """Whether the process count must equal gpus_needed (a `gpus` argument: the recipe
        shards its data that many ways) or is only the default (a variant's, which --procs
        may override: data-parallel recipes run on any count, with another global batch)."""
        return "gpus" in self.arguments and values.get("gpus") is not None

    def gpu_request(self, values: dict) -> str:
        """`V100:8`: what a cloud job of this recipe asks for when no instance is given."""
        return gpu_request(self.resources, self.gpus_needed(values))

    def resolve(self, profile: str | None = None, sets: tuple[str, ...] = (),
                origins: dict | None = None) -> dict:
        """The arguments the script gets: defaults, then the profile, then each --set.
        `origins`: where a job file gave the profile or an argument (jobfile.ORIGINS:
        `profile`, `sets.NAME`), which messages name instead of the flag."""
        origins = origins or {}
        values = {name: arg.default for name, arg in self.arguments.items()}
        if profile is not None:
            if profile not in self.profiles:
                known = ", ".join(sorted(self.profiles)) or "none"
                at = f"{origins['profile']}: " if "profile" in origins else ""
                raise UsageError(f"{at}recipe {self.name} has no profile '{profile}' (profiles: "
                                 f"{known})")
            values.update(self.profiles[profile].get("set") or {})
        for item in sets:
            key, sep, raw = item.partition("=")
            what = origins.get(f"sets.{key}")
            key = key.strip().replace("-", "_")
            what = what or f"--set {key}"
            if not sep or not key:
                raise UsageError(f"--set {shown(item)}: expected key=value")
            if key not in self.arguments:
                close = difflib.get_close_matches(key, self.arguments, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                known = ", ".join(sorted(self.arguments))
                raise UsageError(f"{what}: recipe {self.name} has no argument '{key}'{hint}; "
                                 f"its arguments: {known}")
            values[key] = self.arguments[key].parse(raw, what)
        return {k: v for k, v in values.items() if v is not None}

    def script_args(self, values: dict) -> list[str]:
        """`--name value` for every argument that has a value, in declaration order."""
        out: list[str] = []
        for name, arg in self.arguments.items():
            if name in values:
                out += [f"--{name}", arg.render(values[name])]
        return out

    def entry_path(self) -> str:
        """The script's path relative to a job directory the recipe was synced into."""
        return f"recipes/{self.name}/{self.entry}"


def _require(doc: dict, key: str, kind: type, path: Path):
    if key not in doc:
        raise ConfigError(f"{path}: missing '{key}'")
    if not isinstance(doc[key], kind):
        raise ConfigError(f"{path}: '{key}' must be a {kind.__name__}")
    return doc[key]


def _optional(doc: dict, key: str, kind: type, path: Path, what: str, empty):
    """doc[key] if it is a `kind` (`empty` when absent or null), else a ConfigError."""
    value = doc.get(key)
    if value is None:
        return empty
    if not isinstance(value, kind):
        raise ConfigError(f"{path}: '{key}' must be {what}, got {shown(value)}")
    return value


def _mappings(items: list, path: Path, key: str) -> list[dict]:
    for item in items:
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: each entry of '{key}' must be a mapping, got {shown(item)}")
    return items


def _numbers(values: dict, keys, path: Path, where: str, limits: dict | None = None) -> None:
    """The numeric fields of a mapping are finite numbers (in range, where limits say)."""
    for key in keys:
        if values.get(key) is None:
            continue
        low, high = (limits or {}).get(key, (0, None))
        try:
            number = finite(values[key], f"{where}.{key}", low=low, high=high)
        except UsageError as exc:
            raise ConfigError(f"{path}: {exc.message}") from None
        if limits and key not in ("max_runtime_minutes", "cpu_minutes") and number != int(number):
            raise ConfigError(f"{path}: {where}.{key} must be a whole number, got "
                              f"{shown(values[key])}")


def parse_recipe(path: Path) -> Recipe:
    """Read and validate one recipe.yaml (ConfigError naming the file on any problem)."""
    doc = _document(path)
    name = _require(doc, "name", str, path)
    if name != path.parent.name:
        raise ConfigError(f"{path}: name '{name}' differs from its folder '{path.parent.name}'")
    entry = _entry(doc, path)
    requires = _optional(doc, "requires", list, path, "a list of module names", [])
    for module in requires:
        if not isinstance(module, str) or not module.strip():
            raise ConfigError(f"{path}: 'requires' lists module names, got {shown(module)}")
    arguments = _arguments(doc, path)
    profiles = _profiles(doc, arguments, path)
    resources = _resources(doc, path)
    target = _optional(doc, "target", dict, path, "a mapping (metric, value)", None)
    if target is not None:
        _numbers(target, ("value",), path, "target")
        per_variant = target.get("per_variant") or {}
        if not isinstance(per_variant, dict) or not all(
                isinstance(t, dict) and isinstance(t.get("metric"), str) and "value" in t
                for t in per_variant.values()):
            raise ConfigError(f"{path}: target.per_variant maps a variant to its own target "
                              "{metric, value, ...}")
        for variant, own in per_variant.items():
            _numbers(own, [k for k in own if k != "metric"], path,
                     f"target.per_variant.{variant}")
    published = _mappings(_optional(doc, "published", list, path, "a list of results", []),
                          path, "published")
    for i, entry_ in enumerate(published):
        _numbers(entry_, ("gpus", "seconds", "accuracy", "runs", "price_per_hour", "cost_usd"),
                 path, f"published[{i}]")
    measured = _measured(doc, arguments, path)
    data = _mappings(_optional(doc, "data", list, path, "a list of datasets", []), path, "data")
    _check_data(data, arguments, path)
    must_match = _optional(doc, "resume_must_match", list, path, "a list of argument names", [])
    for key in must_match:
        if key not in arguments:
            raise ConfigError(f"{path}: resume_must_match names unknown argument {shown(key)}")
    return Recipe(
        name=name, path=path.parent, description=_require(doc, "description", str, path),
        entry=entry, requires=list(requires), arguments=arguments,
        profiles=profiles, resources=resources, data=list(data),
        target=target, published=list(published), resume_must_match=list(must_match),
        measured=list(measured), data_path=_data_path(doc, path))


def _document(path: Path) -> dict:
    """recipe.yaml's mapping, read as YAML."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML at {yaml_problem(exc)}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: must be a mapping")
    return doc


def _entry(doc: dict, path: Path) -> str:
    """The entry point: a file inside the recipe's folder."""
    entry = _require(doc, "entry", str, path)
    folder = path.parent.resolve()
    script = (folder / entry).resolve()
    if not script.is_relative_to(folder):
        raise ConfigError(f"{path}: entry {shown(entry)} is outside the recipe folder")
    if not script.is_file():
        raise ConfigError(f"{path}: entry {shown(entry)} does not exist")
    return entry


def _arguments(doc: dict, path: Path) -> dict[str, Argument]:
    """`arguments:`, each a word with a type (its choices, its default parsed as that type)."""
    arguments = {}
    for arg_name, spec in (_require(doc, "arguments", dict, path)).items():
        if not isinstance(arg_name, str) or not ARGUMENT_NAME.fullmatch(arg_name):
            raise ConfigError(f"{path}: argument name {shown(arg_name)} must be a word "
                              "(letters, digits, _)")
        if not isinstance(spec, dict) or spec.get("type") not in TYPES:
            raise ConfigError(f"{path}: argument '{arg_name}' needs a type, one of {', '.join(TYPES)}")
        choices = spec.get("choices")
        if spec["type"] == "choice" and not choices:
            raise ConfigError(f"{path}: argument '{arg_name}' is a choice without choices")
        if choices is not None and (not isinstance(choices, list) or not all(
                isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices)):
            raise ConfigError(f"{path}: argument '{arg_name}': choices must be a list of "
                              f"words or numbers, got {shown(choices)}")
        arg = Argument(arg_name, spec["type"], None, str(spec.get("help", "")), choices)
        try:
            arg.default = arg.parse(spec.get("default"), f"{path}: default of")
        except UsageError as exc:
            raise ConfigError(exc.message) from None
        arguments[arg_name] = arg
    return arguments


PROFILE_RESOURCES = ("disk_gb", "max_runtime_minutes")  # what a profile may plan with itself


def _profiles(doc: dict, arguments: dict[str, Argument], path: Path) -> dict:
    """`profiles:`, each setting known arguments (their values parsed as those arguments),
    and perhaps `resources:` of its own (PROFILE_RESOURCES: a smoke run is planned with its
    own disk and max runtime)."""
    profiles = _optional(doc, "profiles", dict, path, "a mapping of profile: settings", {})
    for prof_name, prof in profiles.items():
        if not isinstance(prof_name, str):
            raise ConfigError(f"{path}: profile names are words, got {shown(prof_name)}")
        prof = profiles[prof_name] = prof or {}
        if not isinstance(prof, dict):
            raise ConfigError(f"{path}: profile '{prof_name}' must be a mapping (description, "
                              f"set), got {shown(prof)}")
        sets = _optional(prof, "set", dict, path, f"a mapping of argument: value (profile "
                                                   f"'{prof_name}')", {})
        for key, value in sets.items():
            if key not in arguments:
                raise ConfigError(f"{path}: profile '{prof_name}' sets unknown argument "
                                  f"{shown(key)}")
            try:
                sets[key] = arguments[key].parse(value, f"{path}: profile {prof_name}:")
            except UsageError as exc:
                raise ConfigError(exc.message) from None
        own = _optional(prof, "resources", dict, path, f"a mapping (profile '{prof_name}')", {})
        if set(own) - set(PROFILE_RESOURCES):
            raise ConfigError(f"{path}: profile '{prof_name}': resources may set "
                              f"{' and '.join(PROFILE_RESOURCES)}, not "
                              f"{', '.join(sorted(set(own) - set(PROFILE_RESOURCES)))}")
        _numbers(own, PROFILE_RESOURCES, path, f"profiles.{prof_name}.resources",
                 RESOURCE_LIMITS)
    return profiles


def _resources(doc: dict, path: Path) -> dict:
    """`resources:`: the launcher, GPUs and machines (per variant too) within their limits."""
    resources = _optional(doc, "resources", dict, path, "a mapping", {})
    if resources.get("launcher", "python") not in LAUNCHERS:
        raise ConfigError(f"{path}: resources.launcher must be one of {', '.join(LAUNCHERS)}")
    _numbers(resources, RESOURCE_LIMITS, path, "resources", RESOURCE_LIMITS)
    per_variant = _optional(resources, "gpus_per_variant", dict, path,
                            "a mapping of variant: GPUs (resources.gpus_per_variant)", {})
    _numbers(per_variant, list(per_variant), path, "resources.gpus_per_variant",
             {v: (1, MAX_GPUS) for v in per_variant})
    nodes_per_variant = _optional(resources, "nodes_per_variant", dict, path,
                                  "a mapping of variant: machines (resources.nodes_per_variant)",
                                  {})
    _numbers(nodes_per_variant, list(nodes_per_variant), path, "resources.nodes_per_variant",
             {v: RESOURCE_LIMITS["nodes"] for v in nodes_per_variant})
    if not isinstance(resources.get("gpu", ""), str):
        raise ConfigError(f"{path}: resources.gpu must be a GPU name, e.g. V100")
    return resources


def _data_path(doc: dict, path: Path) -> dict | None:
    """`data_path:` (issue 28): images_per_epoch, per_core {folder: images per CPU-second}
    and epochs {variant: {folder: epochs}}, every folder of `epochs` one of per_core's."""
    data_path = _optional(doc, "data_path", dict, path, "a mapping", None)
    if data_path is None:
        return None
    _numbers(data_path, ("images_per_epoch",), path, "data_path")
    rates = data_path.get("per_core")
    epochs = data_path.get("epochs")
    if not data_path.get("images_per_epoch") or not isinstance(rates, dict) or not rates \
            or not isinstance(epochs, dict):
        raise ConfigError(f"{path}: data_path needs images_per_epoch, per_core and epochs")
    _numbers(rates, list(rates), path, "data_path.per_core")
    for variant, folders in epochs.items():
        if not isinstance(folders, dict) or any(f not in rates for f in folders):
            raise ConfigError(f"{path}: data_path.epochs.{variant} must map folders of "
                              "per_core to epochs")
        _numbers(folders, list(folders), path, f"data_path.epochs.{variant}")
    return data_path


def _measured(doc: dict, arguments: dict[str, Argument], path: Path) -> list[dict]:
    """`measured:`: figures measured with this project's own code (benchmarks/gpu.py), kept
    apart from the published ones: gpu, gpus, seconds (the recipe's own timer), `when` (the
    arguments they hold for), torch, date, data, source. estimate prefers them on the same
    GPU. An entry without gpu and seconds only describes a measurement (what, command,
    hardware). compile_seconds / compile_cached_seconds: what compile=true cost before the
    first step, with a cold and with a warm inductor cache (issue 17; `recipes NAME` shows
    them)."""
    measured = _mappings(_optional(doc, "measured", list, path, "a list of measurements", []),
                         path, "measured")
    for i, entry_ in enumerate(measured):
        _numbers(entry_, ("gpus", "seconds", "accuracy", "runs", "compile_seconds",
                          "compile_cached_seconds"), path, f"measured[{i}]")
        when = entry_.get("when") or {}
        if not isinstance(when, dict) or any(k not in arguments for k in when):
            raise ConfigError(f"{path}: measured[{i}].when must map argument names to values")
        if ("gpu" in entry_) != ("seconds" in entry_) or \
                ("gpu" in entry_ and not isinstance(entry_["gpu"], str)):
            raise ConfigError(f"{path}: measured[{i}]: gpu (a GPU model) and seconds go "
                              "together (without them an entry only describes a measurement)")
    return measured


def _check_data(data: list[dict], arguments: dict, path: Path) -> None:
    """Each `data:` entry: a dataset name, `when:` (the arguments under which the recipe
    reads it), `download:` (whether the recipe fetches it itself when no source is declared),
    `dir:` (the folder below $CLOUDTRAIN_DATA_DIR it is read from), `dir_arg:` (the argument
    that points the recipe at a copy elsewhere instead: set, nothing is staged), `size_mb:`."""
    from . import datasources

    for i, entry in enumerate(data):
        where = f"{path}: data[{i}]"
        try:
            datasources.check_name(entry.get("name"), where)
        except UsageError as exc:
            raise ConfigError(exc.message) from None
        when = entry.get("when") or {}
        if not isinstance(when, dict) or any(k not in arguments for k in when):
            raise ConfigError(f"{where}: when must map argument names of this recipe to values")
        if not isinstance(entry.get("download", False), bool):
            raise ConfigError(f"{where}: download must be true or false")
        if entry.get("dir_arg") is not None and entry["dir_arg"] not in arguments:
            raise ConfigError(f"{where}: dir_arg must name an argument of this recipe")
        folder = entry.get("dir", entry["name"])
        if not isinstance(folder, str) or not datasources.NAME.fullmatch(folder.lower()):
            raise ConfigError(f"{where}: dir must be one folder name below the data dir")
        _numbers(entry, ("size_mb",), path, f"data[{i}]")
        if entry.get("reads") is not None:
            _check_reads(entry["reads"], arguments, f"{where}: reads")


def _check_reads(reads, arguments: dict, where: str) -> None:
    """A `data:` entry's `reads:`, the folders of the dataset the job reads, checked before
    a launch: `by` (the argument that picks them, e.g. variant), `folders` ({value: [folder,
    ...]}, "" the dataset's top), `within` (sub-folders each of them must have, e.g. [train,
    val]), `prepare` (the command that makes missing ones: SRC and DEST as given, each
    `{name}` the numbers of the missing `name/N` folders, e.g. `--sizes {sz}`)."""
    def paths(value) -> bool:
        return isinstance(value, list) and all(
            isinstance(f, str) and (f == "" or (f.strip("/") == f and ".." not in f.split("/")))
            for f in value)

    if not isinstance(reads, dict) or set(reads) - {"by", "folders", "within", "prepare"}:
        raise ConfigError(f"{where} must be a mapping of by, folders, within and prepare")
    if reads.get("by") not in arguments:
        raise ConfigError(f"{where}.by must name an argument of this recipe")
    folders = reads.get("folders")
    if not isinstance(folders, dict) or not all(paths(v) for v in folders.values()):
        raise ConfigError(f"{where}.folders must map each value of {reads['by']} to a list of "
                          "relative folders (\"\" the dataset's top)")
    if not paths(reads.get("within", [""])):
        raise ConfigError(f"{where}.within must be a list of relative folders")
    if not isinstance(reads.get("prepare", ""), str):
        raise ConfigError(f"{where}.prepare must be a command line")


def _candidates() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in search_path():
        if not root.is_dir():
            continue
        for yml in sorted(root.glob("*/recipe.yaml")):
            found.setdefault(yml.parent.name, yml)  # earlier search-path entries win
    return found


def names() -> list[str]:
    return sorted(_candidates())


def load(name: str) -> Recipe:
    found = _candidates()
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise NotFound(f"unknown recipe '{name}'{suggest(name, found)}; known recipes: {known}",
                       hint="cloudtrain recipes lists them with what they reproduce")
    return parse_recipe(found[name])


def load_all() -> list[Recipe]:
    return [parse_recipe(path) for _, path in sorted(_candidates().items())]


def survey() -> tuple[list[Recipe], list[ConfigError]]:
    """Every recipe that loads, and the problem of each one that does not: one broken recipe
    (a user's, on CLOUDTRAIN_RECIPES) must not hide the others."""
    found, broken = [], []
    for _, path in sorted(_candidates().items()):
        try:
            found.append(parse_recipe(path))
        except ConfigError as exc:
            broken.append(exc)
    return found, broken
