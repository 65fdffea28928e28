"""The jobs queued on a kept instance, seen from the instance. `cloudtrain launch --on JOB`
while a job runs there prepares the next job's directory and puts its start here; the agent
of the job that runs now starts it once its own job has ended, whoever is watching (the
laptop may be closed). One job at a time runs on a kept instance, in the order queued.

Standard library only, Python 3.8+, shipped beside the agent. Files, under <root> (the
parent of <root>/jobs/):

    queue/.lock                    flock()ed by every step below: they happen one at a time
    queue/<order>-<job>.json       a queued job: {job, jobdir, argv, socket}; <order>, the
                                   job's creation time in microseconds, keeps them in order
    jobs/<job>/queue-checked       written by a job's agent when its job has ended, before
                                   it looks at the queue: a job queued after that starts
                                   at once instead of waiting for an agent that looked already
    jobs/<job>/queue-entry.json    the entry, moved here as the job is started
    jobs/<job>/queue-error.json    {error, at}: why it could not be started

The protocol (the CLI runs this file over SSH; the agent imports it):

    add ROOT JOB ORDER PYTHON AGENT SOCKET AHEAD   queue JOB behind job AHEAD (the last one
        ahead of it), or start it now when nothing is queued and AHEAD has ended and
        looked already (or its agent is gone). Prints {"queued": true} or {"started": true}.
    next JOBDIR      (the agent, after its job) start the first queued job that starts;
                     prints its id or nothing
    state ROOT JOB   {"state": "queued" | "started" | "failed" | "unknown", "error": ...}
    remove ROOT JOB  (`cloudtrain down` of a queued job) {"removed": true}, or false when
                     it was started already

Everything in an entry is checked before it is used (the job ids, that the job directory
and the agent are where cloudtrain puts them, the tmux socket's name): a job's own code runs
as the same user and could write here.
"""

import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Callable

from . import safefile
from .job_processes import pid_alive

QUEUE_DIR = "queue"
CHECKED = "queue-checked"
CLAIMED = "queue-entry.json"
ERROR = "queue-error.json"
JOB_ID = re.compile(r"[0-9a-f]{8,32}\Z")
ENTRY = re.compile(r"(\d{1,20})-([0-9a-f]{8,32})\.json\Z")
SOCKET = re.compile(r"[A-Za-z0-9_.-]{1,100}\Z")
START_TIMEOUT_S = 30.0
ENTRY_MAX_BYTES = 64 << 10


class Invalid(ValueError):
    """An entry or an argument that is not what cloudtrain writes."""


def root_of(jobdir):
    """<root> for a job directory <root>/jobs/<job>."""
    return os.path.dirname(os.path.dirname(os.path.abspath(jobdir)))


def _lock(root):
    """The queue's lock (its folder made, private, where missing): an open file, flock()ed."""
    queue = os.path.join(root, QUEUE_DIR)
    os.makedirs(queue, mode=0o700, exist_ok=True)
    f = open(os.path.join(queue, ".lock"), "a")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _entries(root):
    """[(order, job, path)] of the queued jobs, first first."""
    queue = os.path.join(root, QUEUE_DIR)
    try:
        names = os.listdir(queue)
    except OSError:
        return []
    found = []
    for name in names:
        m = ENTRY.match(name)
        if m:
            found.append((int(m.group(1)), m.group(2), os.path.join(queue, name)))
    return sorted(found)


def entry(root, job, python, agent, socket):
    """A queued job's entry, checked: its directory and agent where cloudtrain puts them."""
    root = os.path.abspath(root)
    if not JOB_ID.match(str(job)):
        raise Invalid("not a job id: %r" % (job,))
    jobdir = os.path.join(root, "jobs", job)
    agent_dir = os.path.dirname(str(agent))
    if os.path.dirname(agent_dir) != root or not re.match(r"agent-[0-9a-f]+\Z",
                                                          os.path.basename(agent_dir)) \
            or os.path.basename(str(agent)) != "agent.py":
        raise Invalid("the agent is not <root>/agent-<version>/agent.py: %r" % (agent,))
    if not isinstance(python, str) or not python or any(c in python for c in "\0\n\r"):
        raise Invalid("not an interpreter: %r" % (python,))
    if not SOCKET.match(str(socket)):
        raise Invalid("not a tmux socket name: %r" % (socket,))
    return {"job": job, "jobdir": jobdir, "argv": [python, agent, "run", jobdir],
            "socket": socket}


def _checked(root, doc):
    """An entry read back from the queue, checked again (anything on the host may have
    written it); Invalid otherwise."""
    if not isinstance(doc, dict) or not isinstance(doc.get("argv"), list) or \
            len(doc["argv"]) != 4:
        raise Invalid("not a queue entry")
    python, agent, run, jobdir = doc["argv"]
    made = entry(root, doc.get("job"), python, agent, doc.get("socket"))
    if run != "run" or jobdir != made["jobdir"] or doc.get("jobdir") != made["jobdir"]:
        raise Invalid("the entry's job directory is not its job's")
    return made


def start(doc):
    """Start the queued job's agent in a new detached tmux session, as Host.start_command
    does (its early stderr in agent.err); None, or why it did not start."""
    line = "exec %s 2>>%s" % (" ".join(shlex.quote(a) for a in doc["argv"]),
                              shlex.quote(os.path.join(doc["jobdir"], "agent.err")))
    # Started from inside the running job's tmux session: tmux would take $TMUX for a
    # nested session; the new one is detached and stands on its own.
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    try:
        done = subprocess.run(["tmux", "-L", doc["socket"], "new-session", "-d", "-s",
                               "ct-" + doc["job"], "-x", "200", "-y", "50", line],
                              cwd=doc["jobdir"], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=START_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return "tmux did not run: %s" % exc
    if done.returncode != 0:
        return "tmux exited with %d: %s" % (done.returncode,
                                             done.stdout.decode("utf-8", "replace").strip()[:300])
    return None


def _failed(jobdir, why):
    try:
        safefile.write_json(os.path.join(jobdir, ERROR),
                            {"error": str(why)[:500], "at": time.time()})
    except OSError:
        pass


def _take(root, path):
    """Claim the entry at `path` (moved into its job's directory) and start it: its job id
    once started, else None (why is in the job's queue-error.json when it has a directory)."""
    try:
        doc = _checked(root, safefile.read_json(path, ENTRY_MAX_BYTES))
    except (Invalid, OSError, ValueError):
        doc = None
    if doc is None or not os.path.isdir(doc["jobdir"]):
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    try:
        os.replace(path, os.path.join(doc["jobdir"], CLAIMED))
    except OSError as exc:
        _failed(doc["jobdir"], "could not claim its queue entry: %s" % exc)
        return None
    why = start(doc)
    if why is not None:
        _failed(doc["jobdir"], why)
        return None
    return doc["job"]


def next_job(jobdir):
    """The agent of a job that has ended: say so (queue-checked), then start the first queued
    job that starts; its id, or None with nothing queued."""
    jobdir = os.path.abspath(jobdir)
    root = root_of(jobdir)
    try:
        with open(os.path.join(jobdir, CHECKED), "w") as f:
            f.write("%.3f\n" % time.time())
    except OSError:
        pass
    # Only where something was ever queued: every other host (this machine's local jobs
    # among them) gets no queue folder.
    if not os.path.isdir(os.path.join(root, QUEUE_DIR)):
        return None
    with _lock(root):
        for _, _, path in _entries(root):
            started = _take(root, path)
            if started is not None:
                return started
    return None


def _ahead_done(root, ahead):
    """Whether job `ahead` will start nothing more: its agent looked at the queue already, or
    it ran and its agent is gone."""
    jobdir = os.path.join(root, "jobs", ahead)
    if os.path.exists(os.path.join(jobdir, CHECKED)):
        return True
    status = safefile.read_json(os.path.join(jobdir, "status.json"), 1 << 20)
    if not isinstance(status, dict):
        return False  # queued itself, or starting: its agent has not written yet
    pid = status.get("agent_pid")
    return not (isinstance(pid, int) and pid_alive(pid, "agent.py"))


def add(root, job, order, python, agent, socket, ahead):
    """Queue the job behind `ahead`, or start it now when nothing is queued and `ahead` is
    done: {"queued": True} or {"started": True}."""
    root = os.path.abspath(root)
    doc = entry(root, job, python, agent, socket)
    if not JOB_ID.match(str(ahead)):
        raise Invalid("not a job id: %r" % (ahead,))
    if not str(order).isdigit() or len(str(order)) > 20:
        raise Invalid("not an order: %r" % (order,))
    with _lock(root):
        if not _entries(root) and _ahead_done(root, ahead):
            why = start(doc)
            if why is not None:
                _failed(doc["jobdir"], why)
                return {"started": False, "error": why}
            return {"started": True}
        path = os.path.join(root, QUEUE_DIR, "%020d-%s.json" % (int(order), job))
        safefile.write_json(path, doc)
    return {"queued": True}


def state(root, job):
    """Where a queued job is now (see the module's docstring)."""
    root = os.path.abspath(root)
    if not JOB_ID.match(str(job)):
        raise Invalid("not a job id: %r" % (job,))
    jobdir = os.path.join(root, "jobs", job)
    with _lock(root):
        error = safefile.read_json(os.path.join(jobdir, ERROR), 1 << 16)
        if isinstance(error, dict):
            return {"state": "failed", "error": str(error.get("error"))[:500]}
        if any(j == job for _, j, _ in _entries(root)):
            return {"state": "queued"}
        # Started: its entry claimed, or (started at once by `add`) its agent has written.
        status = safefile.read_json(os.path.join(jobdir, "status.json"), 1 << 20)
        if os.path.exists(os.path.join(jobdir, CLAIMED)) or \
                (isinstance(status, dict) and status.get("agent_pid")):
            return {"state": "started"}
    return {"state": "unknown"}


def remove(root, job):
    """Take a queued job out of the queue: {"removed": True}, or False when it is not there
    (started already, or never queued)."""
    root = os.path.abspath(root)
    if not JOB_ID.match(str(job)):
        raise Invalid("not a job id: %r" % (job,))
    with _lock(root):
        for _, j, path in _entries(root):
            if j == job:
                os.unlink(path)
                return {"removed": True}
    return {"removed": False}


def main(argv):
    usage = ("usage: job_queue.py add ROOT JOB ORDER PYTHON AGENT SOCKET AHEAD | next JOBDIR | "
             "state ROOT JOB | remove ROOT JOB")
    commands: dict[str, tuple[Callable[..., dict], int]] = {
        "add": (add, 7), "next": (next_job, 1), "state": (state, 2), "remove": (remove, 2)}
    if not argv or argv[0] not in commands or len(argv) - 1 != commands[argv[0]][1]:
        print(usage, file=sys.stderr)
        return 2
    try:
        result = commands[argv[0]][0](*argv[1:])
    except (Invalid, OSError) as exc:
        print(json.dumps({"error": str(exc)[:500]}))
        return 1
    print(json.dumps(result) if argv[0] != "next" else (result or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
