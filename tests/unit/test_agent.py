"""The agent's probe and stop, on real processes (no tmux needed here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from cloudtrain import agent


def _sleeper(*extra: str) -> subprocess.Popen:
    """A process in its own group whose command line mentions agent.py, like an agent's."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra],
                            start_new_session=True)


def _write_status(jobdir, **fields):
    (jobdir / "status.json").write_text(json.dumps(fields))


def test_probe_fails_a_job_whose_heartbeat_is_stale_and_kills_its_group(tmp_path):
    hung_agent, job = _sleeper("agent.py"), _sleeper()
    try:
        _write_status(tmp_path, state="running", agent_pid=hung_agent.pid, pid=job.pid,
                      pgid=job.pid, heartbeat_at=time.time() - 100)
        report = agent.probe(str(tmp_path), stale_after_s=30)
        assert report["status"]["state"] == "failed"
        assert report["status"]["reason"].startswith("no heartbeat from the agent for 1m4")
        assert job.wait(timeout=5) == -9
        on_disk = json.loads((tmp_path / "status.json").read_text())
        assert on_disk["state"] == "failed" and on_disk["ended_at"] is not None
    finally:
        for p in (hung_agent, job):
            p.kill()
            p.wait()


def test_probe_leaves_a_healthy_job_alone(tmp_path):
    live_agent, job = _sleeper("agent.py"), _sleeper()
    try:
        _write_status(tmp_path, state="running", agent_pid=live_agent.pid, pid=job.pid,
                      pgid=job.pid, heartbeat_at=time.time())
        assert agent.probe(str(tmp_path), stale_after_s=30)["status"]["state"] == "running"
        assert job.poll() is None
    finally:
        for p in (live_agent, job):
            p.kill()
            p.wait()


def test_a_reused_pid_is_not_mistaken_for_the_agent(tmp_path):
    other = _sleeper()  # alive, but not an agent
    try:
        _write_status(tmp_path, state="running", agent_pid=other.pid, pid=None,
                      heartbeat_at=time.time())
        status = agent.probe(str(tmp_path), stale_after_s=30)["status"]
        assert status["state"] == "failed" and "agent process died" in status["reason"]
    finally:
        other.kill()
        other.wait()


def test_metrics_tail_returns_latest_row_and_first_target(tmp_path):
    rows = [{"epoch": 1, "test_acc": 0.9}, {"event": "target_reached", "epoch": 2},
            {"epoch": 2, "test_acc": 0.95}, {"event": "target_reached", "epoch": 3}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"epoch": 3, "test_'  # torn last line
    (tmp_path / "metrics.jsonl").write_text(text)
    latest, target, summary = agent.metrics_tail(str(tmp_path))
    assert latest == {"epoch": 2, "test_acc": 0.95}
    assert target == {"event": "target_reached", "epoch": 2}
    assert summary is None


def test_metrics_tail_finds_events_far_from_the_end(tmp_path, monkeypatch):
    """A long multi-run job: the first target event is megabytes before the tail window, the
    runs summary comes last; only the newest plain row counts."""
    monkeypatch.setattr(agent, "METRICS_TAIL_BYTES", 4096)
    lines = [json.dumps({"event": "target_reached", "epoch": 7, "run": 0})]
    lines += [json.dumps({"epoch": i % 10 + 1, "run": i // 10, "test_acc": 0.9})
              for i in range(20000)]
    lines.append(json.dumps({"event": "runs_summary", "runs": 2000, "mean_acc": 0.9401}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    latest, target, summary = agent.metrics_tail(str(tmp_path))
    assert target == {"event": "target_reached", "epoch": 7, "run": 0}
    assert summary == {"event": "runs_summary", "runs": 2000, "mean_acc": 0.9401}
    assert latest == {"epoch": 10, "run": 1999, "test_acc": 0.9}


def test_agent_run_records_success_and_output(tmp_path):
    (tmp_path / "run.sh").write_text("echo out; echo err >&2; echo $CLOUDTRAIN_JOB_DIR $FOO\n")
    (tmp_path / "job.json").write_text(json.dumps({"env": {"FOO": "bar"}, "heartbeat_s": 0.1}))
    proc = subprocess.run([sys.executable, agent.__file__, "run", str(tmp_path)],
                          capture_output=True, timeout=30)
    assert proc.returncode == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    assert status["started_at"] <= status["ended_at"]
    log = (tmp_path / "output.log").read_text()
    assert "out\n" in log and "err\n" in log and f"{tmp_path} bar\n" in log
    assert proc.stdout.decode() == log  # what the tmux pane shows is the log


def test_agent_kills_leftover_background_processes(tmp_path):
    pidfile = tmp_path / "bg.pid"
    (tmp_path / "run.sh").write_text(f"sleep 60 & echo $! > {pidfile}\necho done\n")
    subprocess.run([sys.executable, agent.__file__, "run", str(tmp_path)], timeout=30,
                   capture_output=True)
    bg = int(pidfile.read_text())
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{bg}") or "zombie" in open(f"/proc/{bg}/status").read()


def test_agent_runs_under_python38_syntax():
    """The agent is copied to hosts with whatever python3 they have: keep it 3.8-compatible."""
    import ast

    source = open(agent.__file__).read()
    ast.parse(source, feature_version=(3, 8))
    tree = ast.parse(source)
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


class _FakeIMDS:
    """A metadata service on loopback that announces a spot interruption once told to."""

    def __init__(self):
        import http.server
        import threading

        self.announce = False
        self.tokens_seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                assert self.path == "/latest/api/token"
                assert self.headers["X-aws-ec2-metadata-token-ttl-seconds"]
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"tok123")

            def do_GET(self):
                outer.tokens_seen.append(self.headers.get("X-aws-ec2-metadata-token"))
                if self.path != "/latest/meta-data/spot/instance-action" or not outer.announce:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"action": "terminate", "time": "2026-11-22T04:00:00Z"}')

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def test_spot_interruption_notice_stops_the_job_as_preempted(tmp_path):
    imds = _FakeIMDS()
    try:
        (tmp_path / "run.sh").write_text(
            "trap 'echo checkpoint-saved; exit 143' TERM\necho training\n"
            "while true; do sleep 0.05; done\n")
        (tmp_path / "job.json").write_text(json.dumps(
            {"imds_url": imds.url, "spot_poll_s": 0.1, "heartbeat_s": 0.1, "grace_s": 5}))
        proc = subprocess.Popen([sys.executable, agent.__file__, "run", str(tmp_path)],
                                stdout=subprocess.DEVNULL)
        deadline = time.time() + 10
        while b"training" not in (tmp_path / "output.log").read_bytes() if (
                tmp_path / "output.log").exists() else True:
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        running = json.loads((tmp_path / "status.json").read_text())
        assert running["state"] == "running" and "interruption" not in running
        imds.announce = True
        assert proc.wait(timeout=10) == 0
        status = json.loads((tmp_path / "status.json").read_text())
        assert status["state"] == "preempted"
        assert status["reason"] == "spot interruption notice: terminate at 2026-11-22T04:00:00Z"
        assert status["exit_code"] == 143
        assert status["interruption"]["action"] == "terminate"
        assert "checkpoint-saved" in (tmp_path / "output.log").read_text()
        assert set(imds.tokens_seen) == {"tok123"}  # IMDSv2: every read carries the token
    finally:
        imds.close()


def test_no_metadata_service_means_no_notice():
    assert agent.spot_notice("http://127.0.0.1:9", timeout=0.2) is None
