"""The instance as the job sees it: python3 and tmux, GPUs, where the job's directory is,
what the agent does beyond the job (spot notice, power-off timer) and after it."""

from __future__ import annotations

import json
import re
import shlex

from ... import catalog
from ...errors import MissingDependency
from ...market import Market
from ...ssh_host import SSHHost
from .images import (
    SOFTWARE_FAILED, USER_DATA_LOG, VOLTA_VENV, local_torch, software_failure)
from .instances import (
    REARM_PATH, USER_DATA_DONE, USER_DATA_WAIT_S, power_off_minutes, user_data_wait_command)
from .session import AwsSession


# What the instance's Python carries, read without importing torch (an import reads the
# CUDA libraries from a root volume AWS restores lazily from its snapshot: seconds, which the
# job's own import pays): torch's version from its package metadata, the CUDA it was built
# for from torch/version.py, the NVIDIA driver the kernel loaded from /proc. Standard library
# only; one JSON line, read back as untrusted.
SOFTWARE_PROBE = r"""
import json, os, re
out = {}
try:
    import importlib.metadata as metadata
    out["torch"] = metadata.version("torch")
except Exception:
    pass
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
        found = re.search(r"^cuda(?:: [^=]+)? = ['\"]([^'\"]+)['\"]", f.read(), re.M)
    out["cuda"] = found.group(1) if found else None
except Exception:
    pass
try:
    with open("/proc/driver/nvidia/version") as f:
        found = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]*)", f.read())
    out["driver"] = found.group(1) if found else None
except Exception:
    pass
print(json.dumps(out))
"""
SOFTWARE_FIELD = re.compile(r"[0-9A-Za-z.+_-]{1,40}")
WARM_READ = "/var/lib/cloudtrain/warm-read"  # user-data's first read of the image's libraries
SOFTWARE_MAX_BYTES = 1024


def setup(aws: AwsSession, host: SSHHost) -> str:
    """The host has what the agent needs: python3 (3.8+) and tmux. Without tmux, wait
    (bounded) for user-data to finish installing it rather than race its apt-get: SSH
    answers long before cloud-init's final stage has run user-data. Returns what the job's
    Python carries (software_line), for the job's timeline."""
    if host.ready_file:  # its image installs the job's software at boot (a Volta type's)
        ready = host.run(user_data_wait_command(host.ready_file, USER_DATA_WAIT_S),
                         check=False, timeout=USER_DATA_WAIT_S + 60).ok
        if not ready:
            raise MissingDependency(f"{host.name}: the GPU software its image lacks had not "
                                    f"installed after {USER_DATA_WAIT_S:.0f} s",
                                    hint=f"its log: {USER_DATA_LOG} there")
        told = host.run(f"cat {shlex.quote(SOFTWARE_FAILED)} 2>/dev/null && grep -v "
                        f"' cloudtrain-user-data: ' {shlex.quote(USER_DATA_LOG)} | tail -n 5",
                        check=False)
        failure = software_failure(host.name, told.stdout if told.ok else "")
        if failure:
            raise MissingDependency(failure, hint="launch again (a package mirror or "
                                    "PyTorch's index may have failed), or pass --ami with "
                                    "an image that has the driver and torch")
    probe = (f"command -v {VOLTA_VENV}/bin/python || command -v /opt/pytorch/bin/python || "
             "command -v python3; printf 'tmux:'; command -v tmux")
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
    got = host.run(f"{shlex.quote(host.python)} -c {shlex.quote(SOFTWARE_PROBE)}",
                   check=False, timeout=60)
    warm = host.run(f"cat {shlex.quote(WARM_READ)} 2>/dev/null || true", check=False)
    return software_line(host.python, got.stdout if got.ok else "") + warm_said(
        warm.stdout if warm.ok else "")


def warm_said(answer: str) -> str:
    """What the timeline says of the image's shared libraries, read once at boot by
    user-data (a root volume restored from a snapshot fetches each block from S3 the first
    time): how many GB in how many seconds; "" where there is no such record (an image
    without /opt/pytorch, or a read not ended by setup). `answer`: warm-read's lines, from
    the instance: untrusted, only whole numbers taken."""
    found = dict(re.findall(r"^(seconds|bytes)=(\d{1,15})$", answer[:200], re.M))
    if not found:
        return ""
    return (f"; its root volume's first reads (the image's shared libraries, "
            f"{int(found.get('bytes', 0)) / 1e9:.1f} GB, fetched from the snapshot) took "
            f"{int(found['seconds'])} s at boot, before the job's import")


def software_line(python: str, answer: str) -> str:
    """The timeline's line for the job's software: torch, the CUDA it was built for, the
    NVIDIA driver loaded, and this machine's torch where it differs (the recipes are tested
    here). `answer` is the probe's output: untrusted, each field checked."""
    try:
        doc = json.loads(answer[:SOFTWARE_MAX_BYTES]) if answer else {}
    except ValueError:
        doc = {}
    facts = {k: v for k, v in (doc.items() if isinstance(doc, dict) else ())
             if k in ("torch", "cuda", "driver") and isinstance(v, str)
             and SOFTWARE_FIELD.fullmatch(v)}
    torch = facts.get("torch")
    line = (f"{python}: torch {torch}" if torch else f"{python}: no torch")
    line += f" built for CUDA {facts['cuda']}" if facts.get("cuda") else (
        ", a CPU build" if torch else "")
    line += (f"; NVIDIA driver {facts['driver']}" if facts.get("driver")
             else "; no NVIDIA driver loaded")
    here = local_torch()
    if torch and here and torch.split("+")[0].split(".")[:2] != here.split("+")[0].split(".")[:2]:
        line += f" (this machine has torch {here}: the recipes are tested here on it)"
    return line


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
