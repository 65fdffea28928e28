"""The host package as a host has it (hosts.write_host_files: cloudtrain_host/ and the
commands' launchers), written once per test process: tests run agent.py, job_queue.py, ... from
there, as an instance does, never from cloudtrain/host/ (whose modules import relatively)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from cloudtrain.hosts import write_host_files


@functools.lru_cache(maxsize=None)
def shipped_host() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="ct-host-"))
    atexit.register(shutil.rmtree, folder, True)
    write_host_files(folder)
    return folder


def command(name: str) -> str:
    """The path of a host command (agent, job_queue, checkpoint_stream, stager, ...)."""
    return str(shipped_host() / f"{name}.py")
