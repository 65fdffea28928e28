"""The job's processes on this host: alive or not, signalled, found below the agent, killed.

Standard library only, Python 3.8+; shipped beside agent.py. Reads /proc where there is one
(Linux); elsewhere the answers fall back as each function says. Imports job_status (as_pid)
and nothing else of ours.
"""

import os
import signal

from .job_status import as_pid

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MAX_RECORDED_PIDS = 4096  # descendants written to status.json at each heartbeat


def pid_alive(pid, needle=None):
    """Whether `pid` exists (and, on Linux, runs a command line containing `needle`)."""
    pid = as_pid(pid)
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if needle:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            return True  # no /proc (macOS): trust the pid
        if "zombie" in proc_state(pid) or needle not in cmdline:
            return False
    return True


def proc_state(pid):
    """The "State:" line of /proc/<pid>/status, lower case; "" without it."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("State:"):
                    return line.lower()
    except OSError:
        pass
    return ""


def group_alive(pgid):
    """Whether a process of the group is left (one we may not signal counts)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def signal_group(pgid, sig):
    """Send `sig` to the group, if it is still there."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(returncode):
    """(exit_code, reason) in shell terms: a signal-killed job exits 128+N."""
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "signal %d" % sig
        return 128 + sig, "killed by %s" % name
    if returncode == 0:
        return 0, None
    return returncode, "exited with code %d" % returncode


def prctl(option, arg):
    """prctl(2) with one argument; False where it failed or there is none (not Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except Exception:  # not Linux, or no libc
        return False


def proc_stat(pid):
    """(ppid, start time in clock ticks since boot) from /proc/<pid>/stat, or None.
    The start time (field 22) tells a process from a later one that got the same pid."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def descendants(root, with_start=False):
    """Every process below `root` in the process tree (from /proc; [] without it); with
    `with_start`, [pid, start time] pairs."""
    children: dict[int, list[int]] = {}
    start: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        stat = proc_stat(name)
        if stat is None:
            continue
        children.setdefault(stat[0], []).append(int(name))
        start[int(name)] = stat[1]
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return [[p, start[p]] for p in found] if with_start else found


def kill_recorded(recorded):
    """SIGKILL the recorded [pid, start time] pairs that are still those processes."""
    if not isinstance(recorded, list):
        return
    for item in recorded[:MAX_RECORDED_PIDS]:
        if not (isinstance(item, list) and len(item) == 2):
            continue
        pid, start = as_pid(item[0]), item[1]
        stat = proc_stat(pid) if pid else None
        if stat is not None and stat[1] == start and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def set_pdeathsig():
    """In the child: die with the agent (Linux), so a killed agent leaves no orphan job
    (elsewhere the probe's reaping still covers it)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
