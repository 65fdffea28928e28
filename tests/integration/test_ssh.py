"""cloudtrain/ssh.py: connecting to an instance that is still booting.

The SSH wait of an AWS launch (moto) against an instance whose port accepts TCP but sends
no SSH banner, the way an instance looks while it boots: one short line while it retries, no
paramiko traceback (D4); `--debug` still shows paramiko's log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from conftest import REPO
from labs.loopback import free_port

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


@pytest.fixture
def silent_port():
    """A port on every loopback address (the lab's instances are 127.0.x.y) that accepts
    connections and says nothing, closing each after half a second."""
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            time.sleep(0.5)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(2)
    server.close()




def test_d4_banner_timeouts_say_one_line_and_no_paramiko_traceback(cli, aws, silent_port):
    aws.write_config(ssh_port=silent_port, ssh_wait_seconds=3.0)
    proc = cli("launch", "--instance", "g5.xlarge", "--", "true", timeout=60)
    assert proc.returncode != 0
    err = proc.stderr
    assert "Exception (client)" not in err and "Traceback" not in err, err
    assert "Error reading SSH protocol banner" not in err.split("Error: ")[0], err
    # Several attempts failed (one every half second), said once (D4's "one line").
    assert err.count("SSH not up yet (banner timeout), retrying") == 1, err
    lines = err.splitlines()
    waiting = next(i for i, l in enumerate(lines) if l.startswith("waiting for SSH on "))
    assert lines[waiting + 1].startswith("SSH not up yet (banner timeout), retrying ("), err
    assert any(l.startswith("Error: SSH to i-") and "did not answer in 3 s" in l
               for l in lines), err


def test_d4_debug_still_shows_paramikos_log(aws, silent_port):
    aws.write_config(ssh_port=silent_port, ssh_wait_seconds=2.0)
    # Not the `cli` fixture: with --debug a traceback (paramiko's) is what is asked for.
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "--debug", "launch", "--instance",
                           "g5.xlarge", "--", "true"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode != 0
    assert "paramiko.transport: ERROR: Exception (client): Error reading SSH protocol banner" \
        in proc.stderr, proc.stderr
