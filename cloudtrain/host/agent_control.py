"""The agent seen from outside its process: probe and stop (agent.py's subcommands, and
LocalHost's calls), and reap, which records the end of a job whose agent is gone.

Standard library only, Python 3.8+; shipped beside agent.py. Imports safefile, job_processes and
job_status, and nothing else of ours: nothing here runs a job.
"""

import os
import signal
import subprocess
import time

from . import safefile
from .job_processes import group_alive, kill_recorded, pid_alive, signal_group
from .job_status import (ACTIVE, BOOT_STATUS, CANCELLED, FAILED, as_pid, as_time, fmt_duration,
                         metrics_tail, now, read_json, save_status)

POLL_S = 0.1
STAGING_STATUS = "staging-status.json"  # written by stager.py while the datasets are copied
# run.sh's word on the job file's setup: {"state": "running", "started_at"} while it runs, then
# "done" with ended_at, or "failed" with its exit code (agent.setup_failure reads that)
SETUP_STATUS = "setup-status.json"


def reap(jobdir, status, reason):
    """The agent is gone: kill what is left of the job and record the failure. Its subreaper
    role went with it, so processes that left the job's group (setsid: torchrun ranks) are
    found by the pids and start times the agent recorded at its last heartbeat."""
    pgid = as_pid(status.get("pgid")) or as_pid(status.get("pid"))
    if pgid and group_alive(pgid):
        signal_group(pgid, signal.SIGKILL)
    kill_recorded(status.get("descendants"))
    status.update(state=FAILED, ended_at=now(), reason=reason, descendants=[])
    save_status(os.path.join(jobdir, "status.json"), status)
    return status


def agent_running(jobdir, session=None, tmux_socket=None):
    """Whether an agent still runs for `jobdir`: an `agent.py run <jobdir>` process (from
    /proc), or the job's tmux session. Unknown (no /proc, no session name): True."""
    found = None
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
        found = False
    except OSError:
        names = []
    for name in names:
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        args = [a.decode("utf-8", "replace") for a in argv]
        for i, arg in enumerate(args[:-2]):  # ... agent.py run JOBDIR
            if (arg.endswith("agent.py") and args[i + 1] == "run" and args[i + 2]
                    and os.path.abspath(args[i + 2]) == jobdir):
                return True
    if session:
        try:
            return subprocess.run(["tmux", "-L", tmux_socket or "cloudtrain", "has-session", "-t",
                                   session], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=5).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return bool(found is None)
    return found is None


def probe(jobdir, stale_after_s=30.0, session=None, tmux_socket=None):
    """Everything the orchestrator needs to know about the job, in one round trip."""
    jobdir = os.path.abspath(jobdir)
    status_path = os.path.join(jobdir, "status.json")
    status = read_json(status_path)
    t = now()
    if status is None and not agent_running(jobdir, session, tmux_socket):
        boot = read_json(os.path.join(jobdir, BOOT_STATUS))
        boot = boot if isinstance(boot, dict) else {}
        if boot.get("stage") == "booting" and pid_alive(boot.get("pid"), "python"):
            # The instance's bootstrap is still restoring the job; its agent comes next.
            return _report(jobdir, None, t)
        # Nothing readable and no agent: it never started (python missing, a crash before
        # its first write, a full disk, a bootstrap that failed or died), or the job
        # destroyed status.json after it died.
        reason = ("the instance could not start the job: %s" % str(boot.get("error"))[:300]
                  if boot.get("stage") == "failed" else
                  "the agent never started" if not os.path.exists(status_path) else
                  "status.json is unreadable and the agent is gone")
        err = _tail_text(os.path.join(jobdir, "agent.err"))
        status = {"state": FAILED, "ended_at": t, "reason": reason + (": " + err if err else "")}
        save_status(status_path, status)
    elif status is not None and status.get("state") in ACTIVE:
        beat = as_time(status.get("heartbeat_at"), 0.0)
        if not pid_alive(status.get("agent_pid"), "agent.py"):
            status = reap(jobdir, status, "the agent process died (killed or host restarted)")
        elif t - beat > stale_after_s:
            status = reap(jobdir, status, "no heartbeat from the agent for %s"
                          % fmt_duration(min(t - beat, 1e9)))
    return _report(jobdir, status, t)


def _report(jobdir, status, t):
    latest, target, summary = metrics_tail(jobdir)
    return {"status": status, "now": t, "metrics": latest, "target": target, "runs": summary,
            "staging": read_json(os.path.join(jobdir, STAGING_STATUS)),
            "setup": read_json(os.path.join(jobdir, SETUP_STATUS))}


def _tail_text(path, limit=300):
    """The last line of a small text file (what a failed start printed), or ""."""
    try:
        data, _ = safefile.read_tail(path, 4096)
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:limit] if lines else ""


def stop(jobdir, grace_s=None, wait_s=None, signal_only=False):
    """Cancel the job: the agent forwards SIGTERM, then SIGKILLs after the grace period.
    `signal_only`: tell the agent and return at once (the other nodes of a job one of whose
    nodes was interrupted: each checkpoints and ends on its own clock)."""
    jobdir = os.path.abspath(jobdir)
    status_path = os.path.join(jobdir, "status.json")
    status = read_json(status_path)
    if status is None or status.get("state") not in ACTIVE:
        return status
    settings = read_json(os.path.join(jobdir, "job.json"), {}) or {}
    grace_s = as_time(settings.get("grace_s"), 30.0) if grace_s is None else float(grace_s)
    wait_s = grace_s + 10.0 if wait_s is None else wait_s
    # The agent reads the grace period from here when the SIGTERM below reaches it.
    safefile.write_json(os.path.join(jobdir, "cancel"), {"at": now(), "grace_s": grace_s})
    agent_pid = as_pid(status.get("agent_pid"))
    if signal_only:
        if pid_alive(agent_pid, "agent.py"):
            os.kill(agent_pid, signal.SIGTERM)
        return status
    if pid_alive(agent_pid, "agent.py"):
        os.kill(agent_pid, signal.SIGTERM)
        deadline = now() + wait_s
        while now() < deadline:
            status = read_json(status_path, status)
            if status.get("state") not in ACTIVE:
                return status
            if not pid_alive(agent_pid, "agent.py"):
                break
            time.sleep(POLL_S)
    # The agent did not finish the job in time (or was already gone): do it here.
    status = read_json(status_path, status)
    if status.get("state") in ACTIVE:
        if pid_alive(agent_pid, "agent.py"):
            os.kill(agent_pid, signal.SIGKILL)
        status = reap(jobdir, status, "cancelled by user")
        status["state"] = CANCELLED
        save_status(status_path, status)
    return status
