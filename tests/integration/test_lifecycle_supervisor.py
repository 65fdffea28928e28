"""cloudtrain/lifecycle/supervisor.py: the recovery supervisor on this machine, what it is
handed when it starts, and what it says when AWS refuses its credentials."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from conftest import REPO
from labs.polling import wait_for


def _files_holding(root: Path, *needles: str) -> list[str]:
    """Every file under `root` whose bytes contain one of the needles."""
    found = []
    for path in root.rglob("*"):
        try:
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        except OSError:
            continue
        if any(n.encode() in data for n in needles):
            found.append(str(path.relative_to(root)))
    return found


@pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")
def test_F31_environment_credentials_never_rest_in_the_home(cli, aws, ct_home, monkeypatch):
    """F31: aws-vault, CI secrets, SSO exports: credentials in the environment only. The
    supervisor a spot launch starts gets them without their being left in a file: none in
    $CLOUDTRAIN_HOME while it runs, nor after it leaves."""
    secret = "auditSECRET" + secrets.token_hex(8)
    token = "auditSESSION" + secrets.token_hex(8)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the supervisor runs this checkout's code
    (ct_home / "supervisor.env").write_text(json.dumps({"AWS_SECRET_ACCESS_KEY": secret}))
    proc = cli("launch", "-q", "-y", "--instance", "g5.xlarge", "--spot", "--", "sleep", "30")
    assert proc.returncode == 0, proc.stderr
    assert "recovery supervisor started" in proc.stderr
    info = wait_for(lambda: (lambda i: i if i.get("running") and i.get("credentials") else None)(
        json.loads(cli.ok("supervisor", "status", "--json").stdout)), timeout=30,
        what="the supervisor's status")
    assert info["credentials"] == "the environment of the command that started it"
    _nowhere(ct_home, secret, token)  # an older version's supervisor.env went too
    cli.ok("down", proc.stdout.strip())
    assert cli.ok("supervisor", "stop").stdout.strip() == "stopped"
    _nowhere(ct_home, secret, token)
    assert not (ct_home / "supervisor.env").exists()
    assert [p.name for p in ct_home.iterdir() if p.name.startswith(".supervisor")] == []


def _nowhere(home: Path, secret: str, token: str) -> None:
    """The secret key in no file; the session token only where AWS requires it: the job
    store's presigned POST signed with session credentials carries it as a form field
    (x-amz-security-token) in the job's job.json (useless without the secret)."""
    assert _files_holding(home, secret) == []
    for name in _files_holding(home, token):
        assert Path(name).name == "job.json", name
        text = (home / name).read_text()
        assert text.count(token) == 1, name
        assert json.loads(text)["results_store"]["fields"]["x-amz-security-token"] == token


def test_F31_expired_credentials_pause_recovery_and_say_so(ct_home, monkeypatch):
    """F31: Temporary credentials expire while the supervisor waits to relaunch: the job is not
    failed over it; it stays `recovering`, its reason says what happened and what to do, and
    the supervisor leaves (the next command with valid credentials restarts it)."""
    import botocore.client
    from botocore.exceptions import ClientError
    from moto import mock_aws

    from labs.credentials import AWS_ENV
    from cloudtrain import state
    from cloudtrain.lifecycle import recovery, supervisor
    from cloudtrain.config import Settings
    from cloudtrain.state import open_store
    from test_recovery import _recovering_job

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    original = botocore.client.BaseClient._make_api_call

    def expired(self, operation, params):
        if operation == "GetCallerIdentity":
            raise ClientError({"Error": {"Code": "ExpiredToken", "Message": "The security "
                                         "token included in the request is expired"}},
                              operation)
        return original(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", expired)
    with mock_aws():
        store = open_store(ct_home)
        job = _recovering_job(store)
        with pytest.raises(supervisor.Stop):
            recovery.round_(store, Settings.load(), job, {}, supervisor.FROM_ENVIRONMENT)
        job = store.job(job.id)
        assert job.state == state.RECOVERING
        assert job.reason.startswith("recovery paused: the credentials it was started with "
                                     "(from the environment) were refused, expired perhaps: "
                                     "AWS refused the credentials (ExpiredToken)")
        assert "any cloudtrain command run with valid AWS credentials restarts" in job.reason
        assert store.instances(job.id) == []


def test_U44_start_says_the_pid_of_the_supervisor_that_runs(ct_home):
    """U44: a spot launch printed `recovery supervisor started (pid None, ...)`: start()
    read supervisor.json before the new supervisor had written it (and a file left by one
    killed with SIGKILL names a process that is gone). The pid said is the live process that
    runs `cloudtrain supervisor run`, every time."""
    import subprocess

    from cloudtrain.lifecycle import supervisor
    from cloudtrain.state import open_store

    open_store(ct_home).close()  # it leaves at once where there is no state.db
    for _ in range(4):
        gone = subprocess.Popen(["true"])
        gone.wait()  # a pid no process has now, as a SIGKILLed supervisor leaves it behind
        (ct_home / supervisor.INFO).write_text(json.dumps({"pid": gone.pid, "started_at": 1.0}))
        pid = supervisor.start(ct_home)
        try:
            assert isinstance(pid, int), pid
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert b"supervisor" in cmdline and b"run" in cmdline, cmdline
            assert supervisor.state_of(ct_home)["pid"] == pid
        finally:
            assert supervisor.stop(ct_home)
