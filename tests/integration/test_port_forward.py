"""`cloudtrain forward JOB PORT[:LOCAL]` (issue 34: ports for TensorBoard or Jupyter, as
SkyPilot and dstack users have them), against the lab: the job runs a real HTTP server on
its "instance" (the loopback sshd's machine) and the forward reaches it over the job's SSH
connection, the host key pinned at launch checked."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request

import pytest

from conftest import REPO
from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.loopback import free_port
from labs.polling import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


def _forward(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cloudtrain", "forward", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/page.txt", timeout=10) as resp:
        return resp.read().decode()


def test_a_port_of_the_instance_is_reached_here_until_ctrl_c(cli, aws, tmp_path):
    """TensorBoard's case: a server the job runs on the instance's loopback, opened at
    localhost here; several requests, each its own channel of the one SSH connection."""
    remote, local = free_port(), free_port()
    job = cli.launch("--instance", "g5.xlarge", "--", "bash", "-c",
                     f"echo served-by-the-job > page.txt; exec {sys.executable} -m http.server "
                     f"{remote} --bind 127.0.0.1")
    wait_for(lambda: "Serving HTTP" in cli.ok("logs", job).stdout, timeout=30,
             what="the job's server")
    logins = aws.sshd.connections()
    proc = _forward(job, f"{remote}:{local}")
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"forwarding http://localhost:{local} to port {remote} on ")
        assert [_get(local) for _ in range(3)] == ["served-by-the-job\n"] * 3
        assert aws.sshd.connections() == logins + 1  # one SSH connection for all of it
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0 and "stopped forwarding" in err and "Traceback" not in err
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(OSError):
        _get(local)  # nothing listens here any more
    cli.ok("down", job)


def test_a_kept_instance_after_its_job_and_a_changed_host_key(cli, aws, ct_home):
    """A kept instance is reached after its job (and says when it powers off); a host key
    that is not the one pinned at launch is refused before anything is forwarded."""
    from labs.loopback import serve
    import http.server

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"jupyter-ish\n")

        def log_message(self, *args):
            pass

    url, server = serve(Page)
    remote = int(url.rsplit(":", 1)[1])
    local = free_port()
    job = cli.launch("--instance", "g5.xlarge", "--keep", "--", "true")
    cli.wait(job)
    proc = _forward(job, f"{remote}:{local}")
    try:
        assert proc.stdout.readline().startswith(f"forwarding http://localhost:{local}")
        assert _get(local) == "jupyter-ish\n"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    assert "powers itself off at" in " ".join(err.split())

    db = sqlite3.connect(ct_home / "state.db")
    host = db.execute("SELECT host FROM jobs WHERE id = ?", (job,)).fetchone()[0]
    forged = host.replace('"host_key": "ssh-ed25519 ', '"host_key": "ssh-ed25519 AAAA')
    assert forged != host
    db.execute("UPDATE jobs SET host = ? WHERE id = ?", (forged, job))
    db.commit()
    bad = cli("forward", job, f"{remote}:{free_port()}")
    assert bad.returncode != 0 and "host key" in bad.stderr and "changed" in bad.stderr
    server.shutdown()


def test_bad_ports_and_jobs_here_are_refused_in_one_line(cli, aws):
    for word in ("x", "0", "70000", "80:-1"):
        proc = cli("forward", "nojob", word)
        assert proc.returncode == 2 and proc.stderr.startswith(f"Error: '{word}': "), proc.stderr
    taken = free_port()
    job = cli.launch("--instance", "g5.xlarge", "--keep", "--", "true")
    cli.wait(job)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen(1)
        proc = cli("forward", job, f"80:{taken}")
    assert proc.returncode == 2 and f"localhost:{taken} cannot be used here" in proc.stderr
