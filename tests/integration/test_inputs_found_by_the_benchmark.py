"""Bad inputs that benchmarks/audit_figures.py found still ending in "internal error" (F19,
F22, F23, F25 leftovers, and F10's kin: an endpoint that is not AWS): each is now one
designed line."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import threading
import time

import pytest

from conftest import wait_for


def test_a_job_reference_that_is_not_utf8_is_no_job(cli):
    for command in ("status", "logs", "down"):
        proc = cli(command, "\udcff")  # what Python makes of a lone 0xff byte in argv
        assert proc.returncode == 2 and "no job" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr


def test_a_workdir_name_too_long_is_a_usage_error(cli):
    proc = cli("launch", "-q", "--workdir", "a" * 100_000, "--", "true")
    assert proc.returncode == 2 and "File name too long" in proc.stderr, proc.stderr


def test_F23_published_results_given_as_numbers_are_listed(cli, tmp_path, monkeypatch):
    root = tmp_path / "recipes" / "numbers"
    root.mkdir(parents=True)
    (root / "train.py").write_text("print('x')\n")
    (root / "recipe.yaml").write_text(
        "name: numbers\ndescription: d\nentry: train.py\narguments: {}\n"
        "published: [{result: 1, time: 2, hardware: 3}]\n")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(tmp_path / "recipes"))
    proc = cli.ok("recipes")
    assert "numbers" in proc.stdout and "1 / 2 / 3" in proc.stdout


@pytest.fixture
def dead_agent_job(cli, ct_home):
    """A running local job whose agent was killed: the next status reaps it."""
    job_id = cli.launch("--", "sleep", "30")
    jobdir = ct_home / "jobs" / job_id
    status = wait_for(lambda: json.loads((jobdir / "status.json").read_text())
                      if (jobdir / "status.json").exists() else None, what="status.json")
    os.killpg(status["pgid"], signal.SIGKILL)
    os.kill(status["agent_pid"], signal.SIGKILL)
    time.sleep(0.3)
    return job_id, jobdir


@pytest.mark.parametrize("damage", ["status.json is a directory", "output.log is a directory",
                                    "the job directory is gone"])
def test_F19_a_broken_job_directory_never_breaks_status(cli, dead_agent_job, damage):
    job_id, jobdir = dead_agent_job
    if damage == "the job directory is gone":
        shutil.rmtree(jobdir)
    else:
        name = damage.split()[0]
        (jobdir / name).unlink()
        (jobdir / name).mkdir()
    for args in (("status",), ("status", job_id), ("status", "--json"), ("logs", job_id)):
        proc = cli(*args)
        assert "internal error" not in proc.stderr, (args, proc.stderr)
    assert cli.job(job_id)["state"] in ("failed", "running")


class _Portal(http.server.BaseHTTPRequestHandler):
    """A captive portal: 200 and an HTML page, whatever is asked."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<html><body>Please log in to the hotel Wi-Fi</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


def test_F10_an_endpoint_answering_html_is_said_not_crashed_on(cli, ct_home, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
        for args in (("status", "--refresh"), ("down", "--all", "-y"),
                     ("catalog", "--refresh", "--region", "us-east-1")):
            proc = cli(*args, env=env)
            assert "internal error" not in proc.stderr, (args, proc.stderr)
            assert proc.returncode == 1 and "not an AWS reply" in proc.stdout + proc.stderr, \
                (args, proc.stdout, proc.stderr)
    finally:
        server.shutdown()
