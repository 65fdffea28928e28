"""The agent's probe and stop, on real processes (no tmux needed here)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.host import agent, agent_store, job_processes, job_status
from labs.loopback import serve
from labs.polling import wait_for
from labs.shipped_host import command


def _sleeper(*extra: str) -> subprocess.Popen:
    """A process in its own group whose command line mentions agent.py, like an agent's;
    returned once it runs that command (between fork and exec /proc shows the parent's, or
    nothing: on a loaded machine a probe could read it then)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra],
                            start_new_session=True)
    wait_for(lambda: "time.sleep(60)" in _cmdline(proc.pid), timeout=30, interval=0.01,
             what="the sleeper to run")
    return proc


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
        status = agent.probe(str(tmp_path), stale_after_s=30)["status"]
        assert status["state"] == "running", (status, live_agent.poll(), _cmdline(live_agent.pid))
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
    latest, target, summary = job_status.metrics_tail(str(tmp_path))
    assert latest == {"epoch": 2, "test_acc": 0.95}
    assert target == {"event": "target_reached", "epoch": 2}
    assert summary is None


def test_metrics_tail_finds_events_far_from_the_end(tmp_path, monkeypatch):
    """A long multi-run job: the first target event is megabytes before the tail window, the
    runs summary comes last; only the newest plain row counts."""
    monkeypatch.setattr(job_status, "METRICS_TAIL_BYTES", 4096)
    lines = [json.dumps({"event": "target_reached", "epoch": 7, "run": 0})]
    lines += [json.dumps({"epoch": i % 10 + 1, "run": i // 10, "test_acc": 0.9})
              for i in range(20000)]
    lines.append(json.dumps({"event": "runs_summary", "runs": 2000, "mean_acc": 0.9401}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    latest, target, summary = job_status.metrics_tail(str(tmp_path))
    assert target == {"event": "target_reached", "epoch": 7, "run": 0}
    assert summary == {"event": "runs_summary", "runs": 2000, "mean_acc": 0.9401}
    assert latest == {"epoch": 10, "run": 1999, "test_acc": 0.9}


def test_agent_run_records_success_and_output(tmp_path):
    (tmp_path / "run.sh").write_text("echo out; echo err >&2; echo $CLOUDTRAIN_JOB_DIR $FOO\n")
    (tmp_path / "job.json").write_text(json.dumps({"env": {"FOO": "bar"}, "heartbeat_s": 0.1}))
    proc = subprocess.run([sys.executable, command("agent"), "run", str(tmp_path)],
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
    subprocess.run([sys.executable, command("agent"), "run", str(tmp_path)], timeout=30,
                   capture_output=True)
    bg = int(pidfile.read_text())
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{bg}") or "zombie" in open(f"/proc/{bg}/status").read()


def test_agent_runs_under_python38_syntax():
    """The agent is copied to hosts with whatever python3 they have: keep it 3.8-compatible."""
    import ast

    from cloudtrain.host import agent_control, safefile

    # shipped with it (hosts.host_files), each itself standard library only
    beside = {"safefile", "agent_control", "agent_store", "job_processes", "job_status"}
    for module in (agent, agent_control, agent_store, job_processes, job_status, safefile):
        source = open(module.__file__).read()
        ast.parse(source, feature_version=(3, 8))
        tree = ast.parse(source)
        imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.Import)}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module}
        assert imported - beside <= set(sys.stdlib_module_names), \
            imported - beside - set(sys.stdlib_module_names)


class _FakeIMDS:
    """A metadata service on loopback that announces a spot interruption once told to."""

    def __init__(self):
        import http.server

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

        self.url, self.server = serve(Handler)

    def close(self):
        self.server.close()


def test_spot_interruption_notice_stops_the_job_as_preempted(tmp_path):
    """RC4 (confirmed path): the agent acts on spot/instance-action read with IMDSv2, two
    minutes ahead (the rebalance recommendation is not acted on: see the issue 37 note)."""
    imds = _FakeIMDS()
    try:
        (tmp_path / "run.sh").write_text(
            "trap 'echo checkpoint-saved; exit 143' TERM\necho training\n"
            "while true; do sleep 0.05; done\n")
        (tmp_path / "job.json").write_text(json.dumps(
            {"imds_url": imds.url, "spot_poll_s": 0.1, "heartbeat_s": 0.1, "grace_s": 5}))
        proc = subprocess.Popen([sys.executable, command("agent"), "run", str(tmp_path)],
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


# -- F19: the agent reads what the job may have written ------------------------------------------


def test_F19_probe_tolerates_whatever_status_json_holds(tmp_path):
    dead = _sleeper()
    dead.kill()
    dead.wait()
    for garbage in ('{"state": "running", "agent_pid": "abc", "pid": "7", "heartbeat_at": "x"}',
                    '{"state": "running", "agent_pid": %d, "heartbeat_at": NaN}' % dead.pid,
                    '{"state": "running", "agent_pid": [1], "pgid": -1, "heartbeat_at": 1e999}'):
        (tmp_path / "status.json").write_text(garbage)
        status = agent.probe(str(tmp_path), stale_after_s=30)["status"]
        assert status["state"] == "failed" and "agent process died" in status["reason"]
    for unreadable in ("[1, 2]", '{"a":' * 20000 + "1" + "}" * 20000, "\xff", "null"):
        (tmp_path / "status.json").write_text(unreadable, errors="surrogateescape")
        status = agent.probe(str(tmp_path), stale_after_s=30)["status"]
        assert status["state"] == "failed"
        assert status["reason"] == "status.json is unreadable and the agent is gone"


def test_F19_metrics_tail_skips_deep_and_non_object_rows(tmp_path):
    deep = '{"a":' * 9000 + "1" + "}" * 9000  # 54 KB, as in the audit
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"epoch": 1}) + "\n" + deep + "\n[1, 2]\n" + "3\n")
    assert job_status.metrics_tail(str(tmp_path)) == ({"epoch": 1}, None, None)
    assert job_status.read_json(str(tmp_path / "metrics.jsonl"), "dflt") == "dflt"


# -- F20: an agent that never starts --------------------------------------------------------------


def _local_job(tmp_path, job_id: str, run_sh: str, python: str | None = None):
    """A job directory on this machine, laid out as launch makes it, agent installed."""
    from cloudtrain.local_host import LocalHost
    from conftest import TMUX_SOCKET

    host = LocalHost(TMUX_SOCKET, python=python)
    jobdir = tmp_path / "jobs" / job_id
    jobdir.mkdir(parents=True)
    host.install_agent(str(jobdir))
    (jobdir / "run.sh").write_text(run_sh)
    (jobdir / "job.json").write_text(json.dumps({"heartbeat_s": 0.1}))
    return host, jobdir


def test_F20_an_agent_that_cannot_start_fails_the_start_and_the_probe(tmp_path):
    from cloudtrain.errors import HostError

    host, jobdir = _local_job(tmp_path, "nostart1", "true\n", python="/nonexistent/python")
    t0 = time.monotonic()
    with pytest.raises(HostError, match="the agent did not start .*/nonexistent/python") as info:
        host.start_agent("nostart1", str(jobdir))
    assert time.monotonic() - t0 < 10  # the session ended: no need to wait the whole bound
    assert "\n" not in info.value.message
    assert not host.session_alive("nostart1")
    status = host.probe_job(str(jobdir), 30)["status"]
    assert status["state"] == "failed"
    assert status["reason"].startswith("the agent never started")


def test_F13_a_replacement_still_booting_is_not_a_job_whose_agent_never_started(tmp_path):
    """The CI run of this stop (and two of the last): after a spot instance was taken back
    without a notice, AWS Auto Scaling's replacement took its attempt (so `status` on the
    launching machine followed it there) and was still restoring the checkpoint when that
    `status` probed it: no status.json and no agent yet, so the probe wrote `failed: the
    agent never started` and the job ended
    (test_F13_termination_without_notice_resumes_from_the_last_upload). While the instance's
    bootstrap runs (bootstrap-status.json: booting, and its process alive) the probe reports
    nothing yet; a bootstrap that died or failed still ends the job, saying why."""
    host, jobdir = _local_job(tmp_path, "boot1", "true\n")
    booting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    boot_status = jobdir / job_status.BOOT_STATUS
    try:
        boot_status.write_text(json.dumps({"ok": None, "stage": "booting", "pid": booting.pid,
                                           "at": time.time()}))
        report = host.probe_job(str(jobdir), 30)
        assert report["status"] is None and not (jobdir / "status.json").exists()
    finally:
        booting.kill()
        booting.wait()
    status = host.probe_job(str(jobdir), 30)["status"]  # it died before starting the agent
    assert status["state"] == "failed"
    assert status["reason"].startswith("the agent never started")
    (jobdir / "status.json").unlink()
    boot_status.write_text(json.dumps({"ok": False, "stage": "failed", "exit_code": 5,
                                       "error": "checkpoint slot 1: files.tar does not match "
                                                "its manifest"}))
    status = host.probe_job(str(jobdir), 30)["status"]
    assert status["state"] == "failed"
    assert status["reason"] == ("the instance could not start the job: checkpoint slot 1: "
                                "files.tar does not match its manifest")


def test_F20_a_started_agent_is_waited_for(tmp_path):
    host, jobdir = _local_job(tmp_path, "started1", "true\n")
    host.start_agent("started1", str(jobdir))  # returns only once status.json names the agent
    status = json.loads((jobdir / "status.json").read_text())
    assert status["agent_pid"] and status["state"] in ("starting", "running", "succeeded")


# -- F17: job processes in their own session die with a SIGKILLed agent ---------------------------


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    return bool(_cmdline(pid)) and "zombie" not in job_processes.proc_state(pid)


def test_F17_reap_kills_recorded_descendants_that_left_the_group(tmp_path):
    from labs.polling import wait_for

    host, jobdir = _local_job(tmp_path, "setsid1", "bash -c 'setsid sleep 777 & sleep 555'\n")
    host.start_agent("setsid1", str(jobdir))

    def sleeps():
        status = json.loads((jobdir / "status.json").read_text())
        found = {_cmdline(p).strip(): p for p, _ in status.get("descendants") or []}
        return found if {"sleep 777", "sleep 555"} <= set(found) else None

    found = wait_for(sleeps, what="both sleeps recorded")
    agent_pid = json.loads((jobdir / "status.json").read_text())["agent_pid"]
    os.kill(agent_pid, 9)
    wait_for(lambda: not _alive(agent_pid), what="the agent gone")
    status = host.probe_job(str(jobdir), 30)["status"]
    assert status["state"] == "failed" and "agent process died" in status["reason"]
    wait_for(lambda: not _alive(found["sleep 777"]) and not _alive(found["sleep 555"]),
             timeout=5, what="both sleeps killed")


def test_F17_a_recorded_pid_reused_by_another_process_is_spared(tmp_path):
    other = _sleeper()
    try:
        start = job_processes.proc_stat(other.pid)[1]
        job_processes.kill_recorded([[other.pid, start + 1], ["x", 1], [other.pid], "junk"])
        time.sleep(0.1)
        assert other.poll() is None
        job_processes.kill_recorded([[other.pid, start]])
        assert other.wait(timeout=5) == -9
    finally:
        other.kill()
        other.wait()


# -- F16 and the results store: what the agent does after the job --------------------------------

RECORDER = """import json, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "at": time.time()}) + "\\n")
"""

FAKE_UPLOAD = """import json, os, time
def upload_job(jobdir, grant, timeout_s=60.0):
    with open(os.path.join(jobdir, "uploaded"), "w") as f:
        json.dump({"grant": grant, "at": time.time(),
                   "status": json.load(open(os.path.join(jobdir, "status.json")))["state"]}, f)
    if grant.get("fail"):
        raise RuntimeError("bucket says no")
    return {"ok": True, "files": 3, "bytes": 42, "error": None}
"""


def _after_job(tmp_path, settings: dict, upload: str | None = FAKE_UPLOAD, collect_after=None,
               run_sh: str = "echo job-ran\n"):
    """Run the agent (from its own directory, with a fake agent_upload beside it when given)
    on `true`; returns the final status, the recorder's calls, and the seconds it took."""
    home = tmp_path / "agent-test"
    home.mkdir()
    from cloudtrain.hosts import HOST_PACKAGE, host_files, write_host_files

    # what a host gets, but for the uploader (a fake, or none)
    uploader = f"{HOST_PACKAGE}/agent_upload.py"
    write_host_files(home, [(n, d) for n, d in host_files() if n != uploader])
    if upload is not None:
        (home / uploader).write_text(upload)
    (tmp_path / "rec.py").write_text(RECORDER)
    jobdir = tmp_path / "jobs" / "j"
    jobdir.mkdir(parents=True, exist_ok=True)
    (jobdir / "run.sh").write_text(run_sh)
    calls = tmp_path / "calls.jsonl"
    rearm = [sys.executable, str(tmp_path / "rec.py"), str(calls), "rearm"]
    off = f"{shlex.quote(sys.executable)} {tmp_path / 'rec.py'} {calls} poweroff"
    (jobdir / "job.json").write_text(json.dumps({
        "heartbeat_s": 0.1, "rearm": {"argv": rearm, "start_minutes": 35, "idle_minutes": 10},
        "shutdown_command": off, **settings}))
    if collect_after is not None:
        threading.Timer(collect_after, lambda: (jobdir / "collected").write_text("")).start()
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(home / "agent.py"), "run", str(jobdir)], timeout=60,
                   capture_output=True, check=True)
    took = time.monotonic() - t0
    status = json.loads((jobdir / "status.json").read_text())
    made = [json.loads(l) for l in calls.read_text().splitlines()] if calls.exists() else []
    return jobdir, status, [c["argv"][1:] for c in made if c["argv"][0] == "rearm"], \
        [c for c in made if c["argv"][0] == "poweroff"], took


def test_F16_rearm_at_start_and_upload_before_a_power_off_that_collected_cuts_short(tmp_path):
    jobdir, status, rearms, offs, took = _after_job(
        tmp_path, {"results_store": {"url": "https://bucket/x"}, "shutdown_delay_s": 30},
        collect_after=1.0)
    assert rearms == [["35"]]  # counted from this job; no idle re-arm on a host powering off
    uploaded = json.loads((jobdir / "uploaded").read_text())
    assert uploaded["grant"] == {"url": "https://bucket/x"} and uploaded["status"] == "succeeded"
    assert status["results_stored"]["ok"] is True
    assert (status["results_stored"]["files"], status["results_stored"]["bytes"]) == (3, 42)
    assert len(offs) == 1 and uploaded["at"] <= offs[0]["at"]
    assert took < 15  # `collected` ended the 30 s wait
    assert status["shutdown_requested_at"] >= status["results_stored"]["at"]


@pytest.mark.parametrize("upload, grant", [(None, {"x": 1}), (FAKE_UPLOAD, {"fail": True}),
                                           ("def upload_job(j, g, timeout_s=60.0):\n    return [1]\n", {})],
                         ids=["no-module", "raises", "returns-junk"])
def test_F16_a_failed_upload_is_recorded_and_waits_collect_wait_instead(tmp_path, upload, grant):
    jobdir, status, rearms, offs, took = _after_job(
        tmp_path, {"results_store": grant, "shutdown_delay_s": 60, "collect_wait_s": 0.5}, upload)
    stored = status["results_stored"]
    assert stored["ok"] is False and stored["error"] and stored["at"]
    assert status["state"] == "succeeded" and len(offs) == 1 and took < 20
    assert "storing the results failed" in (jobdir / "output.log").read_text()


def test_F16_a_kept_host_rearms_for_its_idle_time_and_never_powers_off(tmp_path):
    jobdir, status, rearms, offs, took = _after_job(tmp_path, {"shutdown_command": None})
    assert rearms == [["35"], ["10"]] and offs == []
    assert "results_stored" not in status  # no grant: nothing to do


def test_F16_keep_written_during_the_wait_keeps_the_host(tmp_path):
    (tmp_path / "jobs" / "j").mkdir(parents=True)
    threading.Timer(1.0, lambda: (tmp_path / "jobs" / "j" / "keep").write_text("")).start()
    jobdir, status, rearms, offs, took = _after_job(tmp_path, {"shutdown_delay_s": 30})
    assert rearms == [["35"], ["10"]] and offs == [] and took < 15


def test_F16_a_failing_rearm_is_logged_not_fatal(tmp_path):
    (tmp_path / "jobs" / "j").mkdir(parents=True)
    jobdir = tmp_path / "jobs" / "j"
    (jobdir / "run.sh").write_text("echo job-ran\n")
    (jobdir / "job.json").write_text(json.dumps({"rearm": {
        "argv": ["/nonexistent/rearm"], "start_minutes": 5, "idle_minutes": 3}}))
    subprocess.run([sys.executable, command("agent"), "run", str(jobdir)], timeout=30, check=True,
                   capture_output=True)
    log = (jobdir / "output.log").read_text()
    assert json.loads((jobdir / "status.json").read_text())["state"] == "succeeded"
    assert "job-ran" in log and log.count("rearm /nonexistent/rearm") == 2


# -- F34: job-written files that are not regular files ---------------------------------------


def _plant(path, kind: str) -> None:
    """What a job can leave where the agent reads: a FIFO (an open() for reading waits for a
    writer for ever), or a symlink to /dev/zero (a read to the end never ends)."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", ["metrics.jsonl", "status.json", "staging-status.json"])
def test_F34_the_probe_answers_at_once_whatever_the_job_planted(tmp_path, name, kind):
    """F34: `agent.py probe` (the process `status` runs on the host) answers at once when the
    job turned a file it reads into a FIFO or a link to /dev/zero, and is not left behind."""
    live_agent = _sleeper("agent.py")
    try:
        _write_status(tmp_path, state="running", agent_pid=live_agent.pid,
                      heartbeat_at=time.time())
        (tmp_path / "metrics.jsonl").write_text(json.dumps({"epoch": 1}) + "\n")
        _plant(tmp_path / name, kind)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, command("agent"), "probe", str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=15)
        finally:
            proc.kill()  # a probe stuck on the FIFO must not outlive the test
            proc.wait()
        assert proc.returncode == 0, err
        assert time.monotonic() - started < 10  # before: blocked until the 20 s deadline
        report = json.loads(out)
        if name == "metrics.jsonl":
            assert report["status"]["state"] == "running" and report["metrics"] is None
        elif name == "status.json":  # no `agent.py run` for this jobdir: recorded as failed
            assert report["status"]["reason"] == "status.json is unreadable and the agent is gone"
            assert report["metrics"] == {"epoch": 1}
        else:
            assert report["staging"] is None and report["metrics"] == {"epoch": 1}
    finally:
        live_agent.kill()
        live_agent.wait()


def test_F34_job_files_are_read_bounded(tmp_path):
    """A huge status.json is not read whole: read_json takes at most its bound."""
    with open(tmp_path / "status.json", "wb") as f:
        f.write(b'{"state": "running", "pad": "' + b"x" * (job_status.JSON_MAX_BYTES + 10) + b'"}')
    assert job_status.read_json(str(tmp_path / "status.json"), "too big") == "too big"
    _plant(tmp_path / "status.json", "dev-zero")
    assert job_status.read_json(str(tmp_path / "status.json"), "not a file") == "not a file"


def test_F43_a_second_run_of_the_same_agent_keeps_the_max_runtime_clock(tmp_path):
    """F43: each run (a regroup's run again after AWS replaced a peer) started the agent's
    max-runtime clock again, so a job that kept regrouping was never stopped by it. The
    second run here is stopped at the job's max runtime counted from the first run's start,
    not from its own."""
    (tmp_path / "job.json").write_text(json.dumps({"max_runtime_s": 3, "heartbeat_s": 0.2,
                                                   "grace_s": 2}))
    runner = agent.Agent(str(tmp_path))
    done = threading.Thread(target=lambda: None)
    done.start()
    (tmp_path / "run.sh").write_text("sleep 2\n")
    began = time.monotonic()
    assert runner.run_once(None, done) is None
    assert runner.status["state"] == "succeeded"
    (tmp_path / "run.sh").write_text("sleep 30\n")
    again = time.monotonic()
    assert runner.run_once(None, done) is None
    assert runner.status["state"] == "failed", runner.status
    assert runner.status["reason"].startswith("exceeded the maximum runtime of 3s"), \
        runner.status["reason"]
    assert time.monotonic() - again < 2.5 and time.monotonic() - began < 5.5
