"""Twenty `cloudtrain` processes launching and reading at once lose no job, corrupt nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from conftest import REPO

PROCESSES = 20


def _run(args):
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], capture_output=True,
                          text=True, cwd=REPO, env=os.environ, timeout=180)


def test_twenty_processes_launch_and_read_concurrently(cli, ct_home):
    # Half launch (each a real job in tmux), half read the table while that happens.
    work = [["launch", "--quiet", "--name", f"run-{i}", "--", "echo", f"job{i}"]
            if i % 2 == 0 else ["status", "--json"] for i in range(PROCESSES)]
    work += [["launch", "--quiet", "--name", f"run-{i}", "--", "echo", f"job{i}"]
             for i in range(1, PROCESSES, 2)]  # every process count launches once in total
    with ThreadPoolExecutor(max_workers=PROCESSES) as pool:
        results = list(pool.map(_run, work))
    for args, proc in zip(work, results):
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        if args[0] == "status":
            json.loads(proc.stdout)  # every read saw a consistent table
    launched = {proc.stdout.strip() for args, proc in zip(work, results) if args[0] == "launch"}
    assert len(launched) == PROCESSES

    for job_id in launched:
        cli.wait(job_id)
    jobs = json.loads(cli.ok("status", "--json").stdout)
    assert {j["id"] for j in jobs} == launched
    assert all(j["state"] == "succeeded" for j in jobs)
    for j in jobs:
        assert cli.ok("logs", j["id"]).stdout == f"job{j['name'][4:]}\n"

    db = sqlite3.connect(ct_home / "state.db")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # Every job has its whole timeline, each phase once.
    rows = db.execute("SELECT job_id, COUNT(*), COUNT(DISTINCT phase) FROM events GROUP BY job_id")
    for job_id, n, distinct in rows:
        assert n == distinct == 6, job_id


def test_store_writes_from_many_processes_all_land(ct_home):
    code = (
        "import sys\n"
        "from cloudtrain.state import open_store\n"
        "from cloudtrain.config import home\n"
        "s = open_store(home())\n"
        "for i in range(25):\n"
        "    j = s.create_job(name=sys.argv[1], kind='command', recipe=None, command='x',"
        " backend='local', spec={})\n"
        "    s.set_state(j.id, 'running')\n"
        "    s.set_state(j.id, 'succeeded', exit_code=0)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, f"w{i}"], cwd=REPO, env=os.environ,
                              stderr=subprocess.PIPE, text=True) for i in range(PROCESSES)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    db = sqlite3.connect(ct_home / "state.db")
    assert db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0] == 500
    assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1500
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
