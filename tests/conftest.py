"""Shared fixtures: every test gets its own CLOUDTRAIN_HOME; all tests share one private
tmux server (killed at the end), so a developer's own jobs are never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TMUX_SOCKET = f"cloudtrain-test-{os.getpid()}"

# Short timings so that lifecycle tests run in seconds; the mechanisms are the real ones.
TEST_CONFIG = {
    "stop_grace_seconds": 2.0,
    "heartbeat_seconds": 0.5,
    "stale_after_seconds": 5.0,
}


@pytest.fixture(scope="session", autouse=True)
def _tmux_server():
    os.environ["CLOUDTRAIN_TMUX_SOCKET"] = TMUX_SOCKET
    yield
    subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)


@pytest.fixture(autouse=True)
def ct_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "ct-home"
    home.mkdir()
    (home / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in TEST_CONFIG.items()))
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    monkeypatch.delenv("CLOUDTRAIN_BACKEND", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_RECIPES", raising=False)
    return home


class CLI:
    """The real `cloudtrain` command, run as a separate process."""

    def __init__(self, home: Path):
        self.home = home

    def __call__(self, *args: str, env: dict | None = None, timeout: float = 120,
                 input: str | None = None) -> subprocess.CompletedProcess:
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "cloudtrain", *args], capture_output=True,
                              text=True, env=full_env, timeout=timeout, input=input, cwd=REPO)
        # Whatever happened, the user never sees a traceback.
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def ok(self, *args: str, **kw) -> subprocess.CompletedProcess:
        proc = self(*args, **kw)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def launch(self, *args: str, **kw) -> str:
        """Launch and return the job id."""
        return self.ok("launch", "--quiet", *args, **kw).stdout.strip().splitlines()[-1]

    def job(self, job_id: str) -> dict:
        return json.loads(self.ok("status", job_id, "--json").stdout)

    def wait(self, job_id: str, states=("succeeded", "failed", "cancelled"), timeout=60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {job['state']} after {timeout}s")
            time.sleep(0.2)


@pytest.fixture
def cli(ct_home) -> CLI:
    return CLI(ct_home)


def wait_for(predicate, timeout=20.0, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
