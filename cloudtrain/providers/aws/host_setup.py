"""The instance as the job sees it: python3 and tmux, GPUs, where the job's directory is,
what the agent does beyond the job (spot notice, power-off timer) and after it."""

from __future__ import annotations

from ... import catalog
from ...errors import MissingDependency
from ...market import Market
from ...ssh_host import SSHHost
from .instances import (
    REARM_PATH, USER_DATA_DONE, USER_DATA_WAIT_S, power_off_minutes, user_data_wait_command)
from .session import AwsSession


def setup(aws: AwsSession, host: SSHHost) -> None:
    """The host has what the agent needs: python3 (3.8+) and tmux. Without tmux, wait
    (bounded) for user-data to finish installing it rather than race its apt-get: SSH
    answers long before cloud-init's final stage has run user-data."""
    probe = ("command -v /opt/pytorch/bin/python || command -v python3; "
             "printf 'tmux:'; command -v tmux")
    found = host.run(probe, check=False).stdout.splitlines()
    finished = True
    if "tmux:" in found:  # `command -v tmux` printed nothing
        finished = host.run(user_data_wait_command(USER_DATA_DONE, USER_DATA_WAIT_S),
                            check=False, timeout=USER_DATA_WAIT_S + 60).ok
        if finished:
            found = host.run(probe, check=False).stdout.splitlines()
    pythons = [line for line in found if not line.startswith("tmux:")]
    if aws.settings.remote_python:
        host.python = aws.settings.remote_python
    elif pythons:
        host.python = pythons[0]
    else:
        raise MissingDependency(f"{host.name} has no python3")
    if "tmux:" in found:
        from ...hosts import TMUX_INSTALL_HINT

        raise MissingDependency(f"tmux is not installed on {host.name}" + (
            "" if finished else f" (user-data had not finished after {USER_DATA_WAIT_S:.0f}"
                                " s)"), hint=TMUX_INSTALL_HINT)


def gpus(spec, host: SSHHost) -> int:
    """The instance type's GPU count (what is paid for), not what the driver shows now:
    a driver still loading must not quietly turn an 8-GPU job into one process. A type
    the catalog does not know (or `--on` a kept instance): ask the host."""
    t = catalog.get(spec.placement.instance_type) if spec.placement.instance_type else None
    return int(t.gpus) if t is not None else host.gpu_count()


def root(aws: AwsSession, host: SSHHost | None) -> str:
    root = aws.settings.remote_root
    if not root.startswith("~"):
        return root
    assert host is not None  # a root below the home directory is asked of a host
    return host.home() + root[1:]


def jobdir(aws: AwsSession, job_id: str, host: SSHHost | None = None) -> str:
    return f"{root(aws, host)}/jobs/{job_id}"


def data_dir(aws: AwsSession, host: SSHHost | None = None) -> str:
    return f"{root(aws, host)}/data"


def agent_settings(aws: AwsSession, spec) -> dict:
    """What the agent on this host does beyond the job: watch the spot interruption
    notice (spot only), and move the instance's power-off timer (user-data armed it for
    the first job only): `argv + [start_minutes]` at job start, and on a kept
    instance `argv + [idle_minutes]` at job end."""
    settings: dict[str, object] = {"rearm": {
        "argv": ["sudo", "-n", REARM_PATH],
        "start_minutes": power_off_minutes(spec.max_runtime_s),
        "idle_minutes": idle_minutes(aws, spec) if spec.keep else None}}
    if spec.placement.market == Market.SPOT:
        settings["imds_url"] = aws.settings.imds_url
        settings["spot_poll_s"] = aws.settings.spot_poll_seconds
    return settings


def idle_minutes(aws: AwsSession, spec) -> int:
    """A kept instance's idle time: whole minutes after its last job before it powers
    itself off (the job's --idle-minutes, else config.yaml's keep_idle_minutes)."""
    return aws.settings.idle_minutes(spec.idle_minutes)


def shutdown(aws: AwsSession, spec) -> tuple[str | None, float]:
    """What the agent runs after the job, and after how long."""
    if spec.keep:
        return None, 0.0
    delay = spec.idle_minutes * 60 if spec.idle_minutes is not None \
        else aws.settings.shutdown_delay_seconds
    return aws.settings.shutdown_command, delay
