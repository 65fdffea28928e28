"""Where cloudtrain keeps its state, and the settings in force.

Three layers, later wins: built-in defaults (below), `$CLOUDTRAIN_HOME/config.yaml`, then
environment variables and command-line flags (applied by the caller).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import ipaddress
import math
import os
import re
import stat
from functools import lru_cache
from pathlib import Path

from .errors import ConfigError, UsageError, shown

# What AWS region names look like (us-east-1, us-gov-west-1, ap-southeast-2): checked before
# the name reaches boto3 (which raises InvalidRegionError) or becomes a path (keys/<region>/).
REGION_PATTERN = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d+")
INSTANCE_PATTERN = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")  # g5.xlarge, u-6tb1.metal
# The largest root volume cloudtrain asks for: gp3's 64 TiB (65,536 GiB; AWS raised gp3 from
# 16 TiB to 64 TiB and 80,000 IOPS in 2025, "Optimizing price performance with enhanced
# Amazon EBS gp3 volumes", re:Invent 2025 STG320). A region that still refuses it answers
# RunInstances with InvalidParameterValue, said as the launch's error.
GP3_MAX_GB = 65536
# The largest --budget taken: above it, a typo (a missing point) is likelier than a plan.
BUDGET_MAX_USD = 100_000.0


def home() -> Path:
    """The state directory: `$CLOUDTRAIN_HOME`, default `~/.cloudtrain`; created private (0700)
    when missing. A path that cannot be the state directory is a ConfigError naming it."""
    env = os.environ.get("CLOUDTRAIN_HOME")
    where = f"CLOUDTRAIN_HOME={env}" if env else "the state directory"
    try:
        path = Path(env).expanduser().resolve() if env else Path.home() / ".cloudtrain"
        if not path.is_dir():
            below = next(p for p in (path, *path.parents) if p.exists())
            if not below.is_dir():
                what = "exists" if below == path else f"is below {below}, which exists"
                raise ConfigError(f"{where}: {path} {what} and is not a directory",
                                  hint="point CLOUDTRAIN_HOME at a directory")
            private_dir(path)
    except OSError as exc:  # a parent that is a file, no permission, a path too long, a loop
        raise ConfigError(f"{where}: cannot create {env or '~/.cloudtrain'}: "
                          f"{exc.strerror or exc}",
                          hint="point CLOUDTRAIN_HOME at a directory you can write") from None
    except RuntimeError as exc:  # `~user` of no such user, a symlink loop in resolve()
        raise ConfigError(f"{where}: {exc}",
                          hint="point CLOUDTRAIN_HOME at a directory you can write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: {path} is not writable",
                          hint="point CLOUDTRAIN_HOME at a directory you can write")
    return path


def yaml_problem(exc) -> str:
    """A YAML parse error in one line: where, and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return where + str(getattr(exc, "problem", None) or exc).splitlines()[0]


# -- private files: state, caches and collected logs are the user's alone (whatever the umask)


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) if needed; a directory created here is 0700."""
    path = Path(path)
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass  # another process made it first
        else:
            os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
    return path


def private_file(path: Path) -> Path:
    """Make the file at `path` readable and writable by its owner only (0600), creating it
    empty if it does not exist."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path


def write_private(path: Path, data: bytes | str) -> None:
    """Replace the file at `path` with `data`, atomically and readable by its owner only (0600)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise


def check_region(region: str, source: str = "") -> str:
    """`region` if it is shaped like an AWS region name, else a UsageError naming where it
    came from (--region, config.yaml, AWS_REGION, the profile)."""
    if not isinstance(region, str) or not REGION_PATTERN.fullmatch(region):
        raise region_error(region, source)
    return region


# The region every command takes without --region, in this order (AWSProvider.region_and_
# source decides it): said in each --region's help, one way.
REGION_DEFAULT = ("`region:` in config.yaml, then AWS_REGION, AWS_DEFAULT_REGION, the AWS "
                  "profile's, else us-east-1")


def region_error(region, source: str = "") -> UsageError:
    """The one wording, whatever the command, of a region that is not one: shaped
    wrong (check_region) or unknown to EC2 (check_known_region); the nearest
    real one where there is one. The hint names no command: any may have been given it."""
    said = [f"from {source}"] if source else []
    close = closest(region, known_regions()) if isinstance(region, str) else []
    if close:
        said.append(f"did you mean {close[0]}?")
    return UsageError(f"unknown AWS region {shown(region)}"
                      + (f" ({'; '.join(said)})" if said else ""),
                      hint="a region looks like us-east-1 or eu-west-2")


@lru_cache(maxsize=1)
def known_regions() -> frozenset[str]:
    """The regions of every AWS partition (aws, aws-cn, aws-us-gov, ...), from the partition
    data botocore ships (partitions.json, 7 kB): no network call. EC2 is in every region.
    botocore's get_available_regions("ec2") parsed its endpoint data and EC2's whole model
    for the same answer: half a second of CPU in every command that names a region."""
    import botocore.loaders

    data = botocore.loaders.create_loader().load_data("partitions")
    return frozenset(region for partition in data.get("partitions") or []
                     for region in partition.get("regions") or {}
                     if not region.endswith("-global"))  # aws-global: no EC2 there


def check_known_region(region: str, source: str = "--region") -> str:
    """`region` if EC2 has such a region, else a UsageError that says it does not exist."""
    regions = known_regions()
    if regions and region not in regions:
        raise region_error(region, source)
    return region


def closest(word, choices, n: int = 1) -> list[str]:
    """The choices nearest `word`, case-insensitive (an exact match but for case first)."""
    lowered = {str(c).lower(): str(c) for c in choices}
    if str(word).lower() in lowered:
        return [lowered[str(word).lower()]]
    return [lowered[c] for c in difflib.get_close_matches(str(word).lower(), list(lowered),
                                                          n=n, cutoff=0.75)]


def suggest(word, choices, n: int = 1) -> str:
    """` (did you mean X?)` for the closest of `choices` (case-insensitive), else ``."""
    close = closest(word, choices, n)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def finite(value, source: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> float:
    """`value` as a float if it is a finite number in range, else a UsageError naming `source`
    (`low_open`: `low` itself is refused)."""
    number = None
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            pass
    if number is None or not math.isfinite(number):
        raise UsageError(f"{source} must be a finite number, got {shown(value)}")
    if low is not None and (number < low or (low_open and number == low)):
        raise UsageError(f"{source} must be {'more than' if low_open else 'at least'} {low:g}, "
                         f"got {shown(value)}")
    if high is not None and number > high:
        raise UsageError(f"{source} must be at most {high:g}, got {shown(value)}")
    return number


def ssh_cidrs(value: str) -> list[str]:
    """`ssh_cidr:`'s CIDRs, in order, once each (commas or spaces between them)."""
    return list(dict.fromkeys(c for c in value.replace(",", " ").split() if c))


# `instance_profile: per-job`: each job that starts its own instances gets an IAM role and
# instance profile of its own (providers/aws/job_role.py), not a shared one.
PER_JOB_PROFILE = "per-job"


@dataclasses.dataclass
class Settings:
    backend: str = "local"  # where `launch` runs a job when --backend is not given
    max_runtime_minutes: float = 720.0  # for jobs whose recipe does not state one
    stop_grace_seconds: float = 30.0  # SIGTERM, then SIGKILL after this long (`down`)
    heartbeat_seconds: float = 2.0  # how often the agent rewrites status.json
    stale_after_seconds: float = 30.0  # a running job whose heartbeat is older is failed
    python: str = ""  # interpreter that runs jobs on the local backend ("" = this Python)
    # A local job on several machines (--nodes N): node 0 is this machine, nodes 1.. are
    # these hosts over SSH ("[user@]host[:port]", comma-separated), logged in to with
    # local_nodes_key; their host keys are pinned on first contact. node_address: where they
    # reach this machine ("" = the address this machine reaches the first of them from).
    local_nodes: str = ""
    local_nodes_key: str = ""
    node_address: str = ""

    # AWS backend
    region: str = ""  # "" = the AWS chain's (AWS_REGION, ~/.aws/config)
    regions: str = ""  # where --gpus may look, comma-separated ("" = just `region`)
    aws_profile: str = ""  # a profile of ~/.aws/config ("" = AWS_PROFILE or the default)
    instance_type: str = "g5.xlarge"  # when --instance is not given
    market: str = "on-demand"  # or "spot"
    subnet_id: str = ""  # launch only into this subnet ("" = the default VPC, every AZ)
    vpc_id: str = ""  # "" = the subnet's VPC, or the default VPC
    connect: str = "public"  # reach instances at their "public" or "private" IP
    ssh_user: str = ""  # "" = the image's: ubuntu on the DLAMI, by its name for --ami
    ssh_port: int = 22
    # Who may reach port 22: CIDRs, IPv4 or IPv6, comma-separated (a network with several NAT
    # egress addresses, an IPv6 client); "" = this machine's public IPv4 address /32.
    ssh_cidr: str = ""
    # An instance's SSH host key is checked against the fingerprints it prints on its
    # console; without them in time: "tofu" trusts it on first use (said at launch),
    # "strict" refuses the instance.
    host_key_policy: str = "tofu"
    remote_python: str = ""  # "" = /opt/pytorch/bin/python where the AMI has it, else python3
    remote_root: str = "~/.cloudtrain"  # job and data directories on instances
    shutdown_command: str = "sudo shutdown -h now"  # how an instance powers itself off
    shutdown_delay_seconds: float = 60.0  # after the job, before powering off
    # A kept instance (--keep, and --on's by default) powers itself off this long after its
    # last job ended, unless another `launch --on` job came first (--idle-minutes per job).
    keep_idle_minutes: float = 60.0
    imds_url: str = "http://169.254.169.254"  # where spot hosts hear of their interruption
    # IMDSv2's hop limit on instances: 1 lets only processes on the instance itself reach the
    # metadata service and the instance role's credentials; 2 lets a container behind a
    # bridge (Docker's default network) reach them too, for a job that runs one.
    imds_hop_limit: int = 1
    spot_poll_seconds: float = 5.0  # how often a spot host asks it (AWS gives 2 min notice)
    instance_wait_seconds: float = 300.0  # bounded wait for "running"
    ssh_wait_seconds: float = 300.0  # bounded wait for SSH to answer
    poll_seconds: float = 2.0  # how often those waits ask
    disk_gb: int = 0  # root volume (0 = the recipe's disk_gb, else 100)
    collect_checkpoints_mb: float = 2048.0  # bring a cloud job's checkpoints home up to this
    # e.g. cloudtrain-instance (infra/README.md); "" = none; PER_JOB_PROFILE: each job a role
    # of its own (infra/README.md section 2a)
    instance_profile: str = ""
    # The IAM role AWS Fault Injection Service acts with when `check --launch --recovery`
    # interrupts its spot instance (infra/README.md section 2b).
    fis_role: str = "cloudtrain-fis"
    # Where a cloud job's results go before its instance powers off (the S3 job store):
    job_store: bool = True  # false: no bucket; results come home only while the CLI watches
    job_store_bucket: str = ""  # "" = cloudtrain-<account>-<region>, created on first use
    # Without a job store (off, or no S3 permission), how long an instance waits after its
    # job for the CLI to bring the results home before it powers off: billed, and said.
    collect_wait_minutes: float = 10.0
    # Datasets, declared once: {NAME: SOURCE} (s3://bucket/prefix, snap-..., /path on the
    # host, or a mapping with `source:` and options); datasources.py parses them.
    datasets: dict = dataclasses.field(default_factory=dict)
    # The root volume's gp3 throughput (MB/s) for a job that copies data from S3 onto it:
    # 125 comes with the volume; more is billed (catalog.gp3_price) and speeds the copy.
    staging_disk_mbps: int = 1000
    # Spot recovery (recovery.py, supervisor.py): how often the supervisor looks at the
    # recovering jobs, how long a relaunch may wait for capacity somewhere, how often it
    # asks again meanwhile, and how long a checkpoint must stay unchanged before the agent
    # uploads it (a recipe that writes several files finishes first).
    supervisor_poll_seconds: float = 10.0
    recovery_wait_minutes: float = 60.0
    recovery_retry_seconds: float = 60.0
    checkpoint_settle_seconds: float = 2.0
    # A job of an Auto Scaling group on several nodes (host/regroup.py): how often a running
    # node asks the job store for a newer attempt, how often it asks EC2 whether its peers
    # run, how long a failed run looks for a lost peer before the failure is the job's own,
    # and the job's grace when its node stops its part to meet the others.
    regroup_watch_seconds: float = 2.0
    regroup_peers_seconds: float = 10.0
    regroup_lost_wait_seconds: float = 30.0
    regroup_stop_grace_seconds: float = 3.0

    @classmethod
    def load(cls) -> "Settings":
        """The settings in force. A config.yaml mistake is a ConfigError naming its line
        (and the setting meant, for a typo); inside tolerating() it is a warning
        instead, said once, and that setting keeps its built-in default."""
        path = home() / "config.yaml"
        settings = cls()
        try:
            given = _read_config(path)
        except ConfigError as exc:
            if not _tolerant:
                raise
            _warn(f"{exc.message}; using the built-in defaults")
            given = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        lines = _key_lines(path) if given else {}
        for key, value in given.items():
            try:
                if not isinstance(key, str):
                    raise ConfigError(f"{path}: setting names are words, got {shown(key)}")
                key = key.replace("-", "_")
                where = f"{path} line {lines[key]}" if key in lines else str(path)
                if key not in fields:
                    raise ConfigError(
                        f"{where}: unknown setting '{shown(key)[1:-1]}'{suggest(key, fields)}",
                        hint=f"fix or remove {_line_of(where)}config.yaml; every setting, and "
                             "where its value comes from: cloudtrain check")
                if key == "datasets":
                    from .datasources import parse_declarations  # only when there are some

                    try:
                        settings.datasets = parse_declarations(value, where)
                    except UsageError as exc:
                        raise ConfigError(exc.message, hint=exc.hint) from None
                elif value is not None:  # `key:` with no value keeps the built-in default
                    setattr(settings, key, _typed(where, key, value,
                                                  type(getattr(settings, key))))
            except ConfigError as exc:
                if not _tolerant:
                    raise
                _warn(f"{exc.message}; " + ("ignored" if "unknown setting" in exc.message
                                            or "setting names" in exc.message
                                            else "using its default"))
        for keys, problem in settings.problems(str(path), lines):
            if not _tolerant:
                raise problem
            _warn(f"{problem.message}; using the default")
            for key in keys:
                setattr(settings, key, getattr(cls(), key))
        for key, variable in ENVIRONMENT.items():
            if os.environ.get(variable):
                setattr(settings, key, os.environ[variable])
        return settings

    def idle_minutes(self, given: float | None) -> int:
        """A kept instance's idle time, in the whole minutes its power-off timer is armed for
        after its last job: `given` (a job's --idle-minutes), else keep_idle_minutes."""
        minutes = self.keep_idle_minutes if given is None else given
        return max(1, int(math.ceil(minutes)))

    def check(self, source: str) -> None:
        """Refuse values that would misbehave later (a ConfigError naming `source`)."""
        for _, exc in self.problems(source, {}):
            raise exc

    def problems(self, source: str, lines: dict[str, int]) -> list[tuple[tuple[str, ...],
                                                                          ConfigError]]:
        """Values that would misbehave later: (the settings concerned, a ConfigError naming
        `source` and the line of the first of them where `lines` has it)."""
        found = []

        def bad(keys: tuple[str, ...], message: str, hint: str | None = None) -> None:
            where = f"{source} line {lines[keys[0]]}" if keys[0] in lines else source
            found.append((keys, ConfigError(f"{where}: {message}", hint=hint or (
                f"fix or remove {_line_of(where)}config.yaml" if keys[0] in lines else None))))

        for key, (low, high, low_open) in LIMITS.items():
            try:
                finite(getattr(self, key), f"'{key}'", low=low, high=high, low_open=low_open)
            except UsageError as exc:
                bad((key,), exc.message)
        if self.stale_after_seconds <= self.heartbeat_seconds:
            bad(("stale_after_seconds", "heartbeat_seconds"),
                f"'stale_after_seconds' ({self.stale_after_seconds:g}) must be more than "
                f"'heartbeat_seconds' ({self.heartbeat_seconds:g}), or every running job looks "
                "dead")
        if self.disk_gb and self.disk_gb < 8:
            bad(("disk_gb",), "'disk_gb' must be 0 (the recipe's) or at least 8")
        for key, allowed in (("backend", BACKENDS), ("market", MARKETS), ("connect", CONNECTS),
                             ("host_key_policy", HOST_KEY_POLICIES)):
            if getattr(self, key) not in allowed:
                bad((key,), f"'{key}' must be one of {', '.join(allowed)}, got "
                            f"{shown(getattr(self, key))}")
        if not INSTANCE_PATTERN.fullmatch(self.instance_type):
            bad(("instance_type",), "'instance_type' must be an EC2 instance type, e.g. "
                                    f"g5.xlarge, got {shown(self.instance_type)}")
        for cidr in ssh_cidrs(self.ssh_cidr):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                bad(("ssh_cidr",), f"'ssh_cidr' must be CIDRs (e.g. 203.0.113.7/32, "
                                   f"2001:db8::/64), comma-separated; {shown(cidr)} is not one")
        if not self.remote_root.startswith(("/", "~")):
            bad(("remote_root",), "'remote_root' must be an absolute path or start with ~, got "
                                  f"{shown(self.remote_root)}")
        for key in ("region", "regions"):
            for region in [r.strip() for r in getattr(self, key).split(",") if r.strip()]:
                try:
                    check_region(region, f"`{key}:`")
                except UsageError as exc:
                    bad((key,), exc.message, exc.hint)
                    break
        return found


# Set inside tolerating(): how to warn, and what was said already (each mistake once).
_tolerant: dict = {}


@contextlib.contextmanager
def tolerating(warn):
    """Inside this block a config.yaml mistake is said once through `warn` (as a
    `WARNING: ...` line) and that setting keeps its built-in default, rather than refusing
    the command: for what must work whatever config.yaml says (down, status, logs, the
    recovery supervisor). `check` and `launch` still refuse."""
    before = dict(_tolerant)
    _tolerant.update(warn=warn, said=set())
    try:
        yield
    finally:
        _tolerant.clear()
        _tolerant.update(before)


def _warn(message: str) -> None:
    if message not in _tolerant["said"]:
        _tolerant["said"].add(message)
        _tolerant["warn"](f"WARNING: {message}")


def _line_of(where: str) -> str:
    """"line N of " for a `<path> line N` location, else ""."""
    return f"line {where.rsplit(' line ', 1)[1]} of " if " line " in where else ""


# Settings an environment variable sets, over config.yaml (flags, applied by the caller, win
# over both): setting -> variable.
ENVIRONMENT = {"backend": "CLOUDTRAIN_BACKEND"}


def origins() -> dict[str, str]:
    """Where each setting's value comes from, read the way Settings.load() reads it: the
    environment variable's name, `config.yaml line N` (`config.yaml` where the line cannot be
    told), or `default` (also for `key:` left empty, which keeps the default). Meant after
    Settings.load() succeeded: a config.yaml it refuses is the same ConfigError here."""
    path = home() / "config.yaml"
    given = {}
    for key, value in _read_config(path).items():
        if isinstance(key, str):
            given[key.replace("-", "_")] = value
    lines = _key_lines(path) if given else {}
    found = {}
    for field in dataclasses.fields(Settings):
        name, variable = field.name, ENVIRONMENT.get(field.name)
        if variable and os.environ.get(variable):
            found[name] = variable
        elif name in given and (given[name] is not None or name == "datasets"):
            found[name] = f"config.yaml line {lines[name]}" if name in lines else "config.yaml"
        else:
            found[name] = "default"
    return found


def _key_lines(path: Path) -> dict[str, int]:
    """The line (from 1) of each top-level key of a YAML mapping file, a later duplicate
    winning as in yaml.safe_load; {} for anything that is not one."""
    import yaml

    try:
        node = yaml.compose(path.read_bytes().decode("utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(key.value).replace("-", "_"): key.start_mark.line + 1
            for key, _ in node.value if isinstance(key, yaml.ScalarNode)}


BACKENDS = ("local", "aws")  # where a job can run: providers.get(name)
MARKETS = ("on-demand", "spot")
CONNECTS = ("public", "private")
HOST_KEY_POLICIES = ("tofu", "strict")
WEEK_S = 7 * 86400.0
# Numeric settings: (lowest, highest, whether the lowest itself is refused). NaN and inf are
# always refused: `t - started > nan` is never true, so a NaN limit is no limit.
LIMITS = {
    "max_runtime_minutes": (0, WEEK_S / 60, True),
    "stop_grace_seconds": (0, 3600, False),
    "heartbeat_seconds": (0, 3600, True),
    "stale_after_seconds": (0, WEEK_S, True),
    "ssh_port": (1, 65535, False),
    "imds_hop_limit": (1, 64, False),  # EC2's HttpPutResponseHopLimit: 1 to 64
    "shutdown_delay_seconds": (0, WEEK_S, False),
    "keep_idle_minutes": (0, WEEK_S / 60, False),
    "instance_wait_seconds": (0, WEEK_S, True),
    "ssh_wait_seconds": (0, WEEK_S, True),
    "poll_seconds": (0, 3600, True),
    "disk_gb": (0, GP3_MAX_GB, False),
    "collect_checkpoints_mb": (0, 1 << 30, False),
    "collect_wait_minutes": (0, WEEK_S / 60, False),
    "staging_disk_mbps": (125, 1000, False),
    "supervisor_poll_seconds": (0, 3600, True),
    "spot_poll_seconds": (0, 60, True),
    "recovery_wait_minutes": (0, WEEK_S / 60, False),
    "recovery_retry_seconds": (0, 86400, False),
    "checkpoint_settle_seconds": (0, 3600, False),
    "regroup_watch_seconds": (0, 3600, True),
    "regroup_peers_seconds": (0, 3600, True),
    "regroup_lost_wait_seconds": (0, 86400, True),
    "regroup_stop_grace_seconds": (0, 3600, False),
}


def _read_config(path: Path) -> dict:
    """config.yaml as a mapping ({} when there is none); a ConfigError naming it otherwise."""
    if not path.exists() and not path.is_symlink():
        return {}
    import yaml  # only when there is a file to read: keeps `status` fast

    try:
        text = path.read_bytes().decode("utf-8")
        values = yaml.safe_load(text) or {}
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a settings file",
                          hint=f"move it aside: mv {path} {path}.bak") from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {yaml_problem(exc)}") from exc
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be settings") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must be a mapping of setting: value")
    return values


def _typed(path: Path | str, key: str, value, kind: type):
    """A config.yaml value as the setting's type: YAML true/false for flags, numbers for
    numbers (a quoted number too), text for text; a ConfigError otherwise. `path`: where
    the value is (the file, or `<file> line N`)."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"{path}: '{key}' must be {what}, got {shown(value)}",
                           hint=f"fix or remove {_line_of(str(path))}config.yaml")

    if kind is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise bad("a number")
        try:
            number = float(value)
        except (ValueError, OverflowError):
            raise bad("a number") from None
        if kind is int:
            if not math.isfinite(number) or number != int(number):
                raise bad("a whole number")
            return int(number)
        return number
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise bad("text")
    return str(value)
