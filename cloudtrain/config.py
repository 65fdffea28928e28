"""Where cloudtrain keeps its state, and the settings in force.

Three layers, later wins: built-in defaults (below), `$CLOUDTRAIN_HOME/config.yaml`, then
environment variables and command-line flags (applied by the caller).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .errors import ConfigError


def home() -> Path:
    """The state directory: `$CLOUDTRAIN_HOME`, default `~/.cloudtrain`."""
    env = os.environ.get("CLOUDTRAIN_HOME")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cloudtrain"


def yaml_problem(exc) -> str:
    """A YAML parse error in one line: where, and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return where + str(getattr(exc, "problem", None) or exc).splitlines()[0]


@dataclasses.dataclass
class Settings:
    backend: str = "local"  # where `launch` runs a job when --backend is not given
    max_runtime_minutes: float = 720.0  # for jobs whose recipe does not state one
    stop_grace_seconds: float = 30.0  # SIGTERM, then SIGKILL after this long (`down`)
    heartbeat_seconds: float = 2.0  # how often the agent rewrites status.json
    stale_after_seconds: float = 30.0  # a running job whose heartbeat is older is failed
    python: str = ""  # interpreter that runs jobs on the local backend ("" = this Python)

    # AWS backend
    region: str = ""  # "" = the AWS chain's (AWS_REGION, ~/.aws/config)
    regions: str = ""  # where --gpus may look, comma-separated ("" = just `region`)
    aws_profile: str = ""  # a profile of ~/.aws/config ("" = AWS_PROFILE or the default)
    instance_type: str = "g5.xlarge"  # when --instance is not given
    market: str = "on-demand"  # or "spot"
    subnet_id: str = ""  # launch only into this subnet ("" = the default VPC, every AZ)
    vpc_id: str = ""  # "" = the subnet's VPC, or the default VPC
    connect: str = "public"  # reach instances at their "public" or "private" IP
    ssh_user: str = "ubuntu"
    ssh_port: int = 22
    ssh_cidr: str = ""  # who may reach port 22 ("" = this machine's public address /32)
    remote_python: str = ""  # "" = /opt/pytorch/bin/python where the AMI has it, else python3
    remote_root: str = "~/.cloudtrain"  # job and data directories on instances
    shutdown_command: str = "sudo shutdown -h now"  # how an instance powers itself off
    shutdown_delay_seconds: float = 60.0  # after the job, before powering off
    imds_url: str = "http://169.254.169.254"  # where spot hosts hear of their interruption
    instance_wait_seconds: float = 300.0  # bounded wait for "running"
    ssh_wait_seconds: float = 300.0  # bounded wait for SSH to answer
    poll_seconds: float = 2.0  # how often those waits ask
    disk_gb: int = 0  # root volume (0 = the recipe's disk_gb, else 100)
    collect_checkpoints_mb: float = 2048.0  # bring a cloud job's checkpoints home up to this
    instance_profile: str = ""  # e.g. cloudtrain-instance (infra/README.md); "" = none

    @classmethod
    def load(cls) -> "Settings":
        path = home() / "config.yaml"
        values: dict = {}
        if path.exists():
            import yaml  # only when there is a file to read: keeps `status` fast

            try:
                values = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as exc:
                raise ConfigError(f"{path} is not valid YAML: {yaml_problem(exc)}") from exc
            if not isinstance(values, dict):
                raise ConfigError(f"{path} must be a mapping of setting: value")
        settings = cls()
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in values.items():
            key = key.replace("-", "_")
            if key not in fields:
                known = ", ".join(sorted(fields))
                raise ConfigError(f"{path}: unknown setting '{key}' (known: {known})")
            default = getattr(settings, key)
            try:
                value = type(default)(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{path}: '{key}' must be a {type(default).__name__}, got {value!r}") from exc
            setattr(settings, key, value)
        if os.environ.get("CLOUDTRAIN_BACKEND"):
            settings.backend = os.environ["CLOUDTRAIN_BACKEND"]
        return settings
