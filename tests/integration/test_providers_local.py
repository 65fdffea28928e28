"""cloudtrain/providers/local.py: the whole lifecycle on the local backend.

The whole lifecycle on the local backend: real tmux, the real agent, the real CLI process."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from cloudtrain import state_schema
from conftest import REPO
from labs.polling import wait_for


def test_command_job_runs_in_tmux_and_is_recorded(cli, ct_home):
    job_id = cli.launch("--name", "hello", "--", "bash", "-c", "echo hello from $CLOUDTRAIN_JOB_ID")
    job = cli.wait(job_id)
    assert job["state"] == "succeeded"
    assert job["exit_code"] == 0
    assert job["name"] == "hello"
    assert cli.ok("logs", job_id).stdout == f"hello from {job_id}\n"
    phases = [p["name"] for p in job["timeline"]]
    assert phases == ["pending", "provisioning", "syncing", "setting-up", "running", "succeeded"]
    starts = [p["start"] for p in job["timeline"]]
    assert starts == sorted(starts)
    status = json.loads((ct_home / "jobs" / job_id / "status.json").read_text())
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    # The job can be referred to by name and by an id prefix.
    assert cli.job("hello")["id"] == job_id
    assert cli.job(job_id[:5])["id"] == job_id


def test_status_table_shows_the_columns(cli):
    job_id = cli.launch("--", "true")
    cli.wait(job_id)
    out = cli.ok("status").stdout
    header = out.splitlines()[0].split()
    assert header == ["ID", "NAME", "WHAT", "BACKEND", "STATE", "AGE", "RUNTIME", "EPOCH",
                      "LOSS", "ACC", "COST"]
    row = out.splitlines()[1]
    assert job_id in row and "succeeded" in row and "local" in row and "$0.00" in row
    listed = json.loads(cli.ok("status", "--json").stdout)
    assert [j["id"] for j in listed] == [job_id]


def test_last_metrics_appear_in_status(cli, tmp_path):
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text(
        "import json, os\n"
        "with open(os.path.join(os.environ['CLOUDTRAIN_JOB_DIR'], 'metrics.jsonl'), 'a') as f:\n"
        "    for e in (1, 2):\n"
        "        f.write(json.dumps({'epoch': e, 'epochs': 5, 'train_loss': 2.5 / e,"
        " 'test_acc': 0.4 * e}) + '\\n')\n")
    job_id = cli.launch("--workdir", str(work), "--", "python", "train.py")
    job = cli.wait(job_id)
    assert job["state"] == "succeeded", job["log_tail"]
    assert job["metrics"]["epoch"] == 2
    row = [line for line in cli.ok("status").stdout.splitlines() if job_id in line][0]
    assert "2/5" in row and "1.25" in row and "80.00%" in row


def test_target_and_runs_summary_appear_in_status_of_the_job(cli, tmp_path):
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text(
        "import json, os\n"
        "rows = [{'event': 'target_reached', 'epoch': 9, 'test_acc': 0.9402, 'train_time': 3.8},\n"
        "        {'epoch': 10, 'epochs': 10, 'run': 1, 'test_acc': 0.93},\n"
        "        {'event': 'runs_summary', 'runs': 2, 'mean_acc': 0.9351, 'std_acc': 0.007,\n"
        "         'reached': 1, 'target': 0.94}]\n"
        "with open(os.path.join(os.environ['CLOUDTRAIN_JOB_DIR'], 'metrics.jsonl'), 'a') as f:\n"
        "    f.write(''.join(json.dumps(r) + '\\n' for r in rows))\n")
    job_id = cli.launch("--workdir", str(work), "--", "python", "train.py")
    job = cli.wait(job_id)
    assert job["runs"]["mean_acc"] == 0.9351 and job["target"]["epoch"] == 9
    shown = cli.ok("status", job_id).stdout
    assert "runs      2: mean 93.51% (sd 0.70%), 1 of 2 reached 94.00%" in shown
    assert "target    reached at epoch 9: test_acc 94.02%, train time 3.80s" in shown


def test_own_code_is_synced_honouring_gitignore(cli, ct_home, tmp_path):
    work = tmp_path / "proj"
    (work / "data").mkdir(parents=True)
    (work / "pkg").mkdir()
    (work / ".gitignore").write_text("data/\n*.ckpt\n")
    (work / "data" / "huge.bin").write_bytes(b"x" * 1000)
    (work / "model.ckpt").write_text("old")
    (work / "pkg" / "util.py").write_text("VALUE = 42\n")
    (work / "train.py").write_text(
        "import argparse, os\nfrom pkg.util import VALUE\n"
        "p = argparse.ArgumentParser(); p.add_argument('--lr', type=float)\n"
        "a = p.parse_args()\n"
        "print('lr', a.lr, 'value', VALUE, 'cwd', os.path.basename(os.getcwd()))\n"
        "print('files', sorted(os.listdir('.')))\n")
    job_id = cli.launch("--workdir", str(work), "--", "python", "train.py", "--lr", "0.1")
    job = cli.wait(job_id)
    assert job["state"] == "succeeded", job["log_tail"]
    out = cli.ok("logs", job_id).stdout
    assert "lr 0.1 value 42 cwd work" in out
    assert "files ['.gitignore', 'pkg', 'train.py']" in out
    synced = ct_home / "jobs" / job_id / "work"
    assert not (synced / "data").exists() and not (synced / "model.ckpt").exists()


def test_shell_snippet_as_one_argument(cli):
    job_id = cli.launch("--", "X=5; echo $((X * 2)) | tr 0 Z")
    assert cli.wait(job_id)["state"] == "succeeded"
    assert cli.ok("logs", job_id).stdout == "1Z\n"


def test_failed_job_shows_exit_code_and_last_lines(cli):
    script = "for i in $(seq 1 30); do echo line $i; done; echo boom >&2; exit 3"
    proc = cli("launch", "--follow", "--", "bash", "-c", script)
    assert proc.returncode == 1
    assert "line 30" in proc.stdout and "boom" in proc.stdout
    assert "failed: exited with code 3" in proc.stderr
    assert "Error:" not in proc.stderr  # the outcome is said once (D38)
    job_id = proc.stderr.split("launched job ")[1].split(":")[0]
    detail = cli.ok("status", job_id).stdout
    assert "state     failed: exited with code 3" in detail
    assert "exit code 3" in detail
    assert "last output (failed):" in detail
    assert "    boom" in detail and "    line 30" in detail and "line 20\n" not in detail
    row = [line for line in cli.ok("status").stdout.splitlines() if job_id in line][0]
    assert "failed (3)" in row


def test_follow_streams_and_exits_zero(cli):
    proc = cli("launch", "--follow", "--", "bash", "-c", "echo one; sleep 0.5; echo two")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "one\ntwo\n"
    assert "succeeded" in proc.stderr


def test_logs_tail_and_follow(cli):
    job_id = cli.launch("--", "bash", "-c", "for i in 1 2 3 4 5; do echo l$i; sleep 0.2; done")
    proc = cli("logs", job_id, "--follow")
    assert proc.returncode == 0
    assert proc.stdout == "l1\nl2\nl3\nl4\nl5\n"
    assert cli.ok("logs", job_id, "--tail", "2").stdout == "l4\nl5\n"
    assert cli.ok("logs", job_id, "--tail", "0").stdout == ""


def test_down_sends_sigterm_and_marks_cancelled(cli, ct_home):
    marker = ct_home / "got-term"
    job_id = cli.launch("--", "bash", "-c",
                        f"trap 'echo term > {marker}; exit 0' TERM; echo ready; "
                        "while true; do sleep 0.1; done")
    wait_for(lambda: "ready" in cli.ok("logs", job_id).stdout, what="job start")
    out = cli.ok("down", job_id).stdout
    assert f"{job_id}: cancelled" in out
    assert marker.read_text().strip() == "term"
    job = cli.job(job_id)
    assert job["state"] == "cancelled"
    assert job["reason"] == "cancelled by user"
    assert job["timeline"][-1]["name"] == "cancelled"
    status = json.loads((ct_home / "jobs" / job_id / "status.json").read_text())
    assert status["state"] == "cancelled"
    assert not _process_alive(status["pid"])


def test_down_kills_a_job_that_ignores_sigterm_after_the_grace(cli, ct_home):
    """U2: after the --grace given (1 s), not the configured one (15 s here)."""
    config = ct_home / "config.yaml"
    config.write_text(config.read_text().replace("stop_grace_seconds: 2.0",
                                                 "stop_grace_seconds: 15"))
    job_id = cli.launch("--", "bash", "-c",
                        "trap '' TERM; echo ready; while true; do sleep 0.1; done")
    wait_for(lambda: "ready" in cli.ok("logs", job_id).stdout, what="job start")
    t0 = time.monotonic()
    cli.ok("down", job_id, "--grace", "1")
    took = time.monotonic() - t0
    assert 1.0 <= took < 6.0, took  # ~1 s and a round trip
    status = json.loads((ct_home / "jobs" / job_id / "status.json").read_text())
    assert status["state"] == "cancelled"
    assert status["exit_code"] == 128 + signal.SIGKILL
    assert not _process_alive(status["pid"])


def test_U2_down_grace_gives_a_slow_sigterm_handler_its_time(cli, ct_home):
    """--grace longer than the configured one (2 s here): a job that needs 4 s to checkpoint
    after SIGTERM is not SIGKILLed at 2 s."""
    job_id = cli.launch("--", "bash", "-c", "trap 'sleep 4; echo cleaned; exit 0' TERM; "
                        "echo ready; while true; do sleep 0.1; done")
    wait_for(lambda: "ready" in cli.ok("logs", job_id).stdout, what="job start")
    t0 = time.monotonic()
    assert f"{job_id}: cancelled" in cli.ok("down", job_id, "--grace", "10").stdout
    took = time.monotonic() - t0
    assert "cleaned" in cli.ok("logs", job_id).stdout
    assert 4.0 <= took < 10.0 + 5, took
    status = json.loads((ct_home / "jobs" / job_id / "status.json").read_text())
    assert status["state"] == "cancelled" and status["exit_code"] == 0


def test_U30_ctrl_c_during_downs_grace_says_what_the_job_is_left_in(cli, ct_home):
    """U30: Ctrl-C during down's grace period said only `interrupted`; it says which job may
    still be running and what to run next."""
    job_id = cli.launch("--", "bash", "-c", "trap 'sleep 30' TERM; echo ready; "
                        "while true; do sleep 0.1; done")
    wait_for(lambda: "ready" in cli.ok("logs", job_id).stdout, what="job start")
    down = subprocess.Popen([sys.executable, "-m", "cloudtrain", "down", job_id, "--grace",
                             "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for(lambda: (ct_home / "jobs" / job_id / "cancel").exists(), what="the stop begun")
    time.sleep(0.5)
    down.send_signal(signal.SIGINT)
    out, err = down.communicate(timeout=30)
    assert down.returncode == 130, (out, err)
    assert "Traceback" not in err
    assert err.strip().splitlines() == [  # U43: the stop said as it began
        f"stopping {job_id}: SIGTERM sent, SIGKILL in 60 s", "",
        f"interrupted: job {job_id} may still be running: its stop had begun but not finished "
        f"(it is not marked cancelled, and any instance of it still runs); run `cloudtrain "
        f"down {job_id}` again"], err
    assert cli.job(job_id)["state"] == "running"  # which is what it said
    assert f"{job_id}: cancelled" in cli.ok("down", job_id, "--grace", "0").stdout


def test_down_on_finished_job_says_so(cli):
    job_id = cli.launch("--", "true")
    cli.wait(job_id)
    proc = cli.ok("down", job_id)
    assert f"{job_id}: already succeeded: nothing to stop" in proc.stdout
    assert cli.job(job_id)["state"] == "succeeded"


def test_down_all_stops_every_active_job(cli):
    ids = [cli.launch("--", "sleep", "60") for _ in range(3)]
    done = cli.launch("--", "true")
    cli.wait(done)
    out = cli.ok("down", "--all", "-y").stdout
    for job_id in ids:
        assert f"{job_id}: cancelled" in out
        assert cli.job(job_id)["state"] == "cancelled"
    assert done not in out
    assert cli.ok("down", "--all", "-y").stdout.strip() == "no active jobs"


def test_agent_killed_with_sigkill_is_failed_not_running_forever(cli, ct_home):
    job_id = cli.launch("--", "bash", "-c", "echo ready; sleep 300")
    wait_for(lambda: "ready" in cli.ok("logs", job_id).stdout, what="job start")
    status_path = ct_home / "jobs" / job_id / "status.json"
    status = json.loads(status_path.read_text())
    os.kill(status["agent_pid"], signal.SIGKILL)
    job = cli.job(job_id)
    assert job["state"] == "failed"
    assert "agent" in job["reason"] and "died" in job["reason"]
    # The job's own processes did not outlive their agent.
    wait_for(lambda: not _process_alive(status["pid"]), what="job process gone")
    row = [line for line in cli.ok("status").stdout.splitlines() if job_id in line][0]
    assert "failed" in row


def test_max_runtime_is_enforced(cli):
    job_id = cli.launch("--max-runtime", "0.02", "--", "sleep", "60")
    job = cli.wait(job_id, timeout=20)
    assert job["state"] == "failed"
    assert job["reason"] == "exceeded the maximum runtime of 1s"
    assert job["runtime_s"] < 10


def test_attach_argv_and_finished_job(cli):
    job_id = cli.launch("--", "true")
    cli.wait(job_id)
    proc = cli("attach", job_id)
    assert proc.returncode == 2
    assert "has ended (succeeded)" in proc.stderr and f"cloudtrain logs {job_id}" in proc.stderr


def test_attach_to_a_running_job_reaches_its_tmux_session(cli):
    """Attach inside an outer tmux (a real terminal) and read the job's pane through it."""
    import subprocess
    import sys

    from conftest import REPO, TMUX_SOCKET

    job_id = cli.launch("--", "bash", "-c", "echo attached-ok; sleep 30")
    outer = f"{TMUX_SOCKET}-outer"
    env = {**os.environ, "TMUX": ""}
    try:
        subprocess.run(["tmux", "-L", outer, "new-session", "-d", "-s", "o", "-x", "120", "-y", "30",
                        f"cd {REPO} && {sys.executable} -m cloudtrain attach {job_id}"],
                       check=True, env=env)
        wait_for(lambda: "attached-ok" in subprocess.run(
            ["tmux", "-L", outer, "capture-pane", "-p", "-t", "o"], capture_output=True,
            text=True).stdout, what="job output through attach")
    finally:
        subprocess.run(["tmux", "-L", outer, "kill-server"], capture_output=True)
        cli.ok("down", job_id)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}").exists() else ""
    return "zombie" not in state


def test_store_is_wal_with_schema_version(cli, ct_home):
    cli.launch("--", "true")
    db = sqlite3.connect(ct_home / "state.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == 8 == state_schema.SCHEMA_VERSION
