"""Which disk a plan's copies go onto: the instance's local NVMe the plan names (the Deep
Learning AMI mounts the instance store at /opt/dlami/nvme), where it is mounted there, the
job's user can write it (its folder made with `sudo -n` where the mount's root is not
theirs) and it has the room; else the root volume's data dir, and why, said in the job's log
and the staging status.

Standard library only, Python 3.8+; shipped beside stager.py. Imports stage_plan only
(StageError, reason).

    choose(scratch, wanted) -> (folder or None, why not)
    mounted(path)             a file system is mounted there
    check_root(datasets, why) the root volume holds the files a copy planned elsewhere brings
    free_bytes(path)          what the job's user may still write on path's file system
"""

import os
import re
import subprocess
import tempfile

from .stage_plan import StageError, reason

SUDO_TIMEOUT_S = 60


def free_bytes(path: str) -> int:
    """Bytes the job's user may still write on the file system of `path` (or of its nearest
    folder that exists)."""
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def mounted(path: str) -> bool:
    """Whether a file system is mounted at `path`: another device than its parent's, or a
    mount point the kernel lists (a bind mount of a folder of the same device)."""
    if os.path.ismount(path):
        return True
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            table = f.read(4 << 20).decode("utf-8", "replace")
    except OSError:
        return False
    for line in table.splitlines():
        fields = line.split(" ")
        if len(fields) > 4 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                                      fields[4]) == path:
            return True
    return False


def size(n: float) -> str:
    return "%.1f GB" % (n / 1e9) if n >= 1e8 else "%.1f MB" % (n / 1e6)


def choose(scratch, wanted: int):
    """(the plan's local folder for the copies, None) where it can take `wanted` bytes;
    (None, why not) otherwise; (None, None) where the plan names none."""
    if not scratch:
        return None, None
    mount, folder = scratch["mount"], scratch["dir"]
    if not os.path.isdir(mount):
        return None, "%s is not there (the image did not mount the local NVMe)" % mount
    if not mounted(os.path.realpath(mount)):
        return None, ("%s is not a mounted volume (the image did not mount the local NVMe "
                      "there): a copy there would fill the root volume" % mount)
    try:
        _make(folder)
        fd, probe = tempfile.mkstemp(prefix=".cloudtrain-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        said = getattr(exc, "sudo", None)
        return None, "cannot make %s: %s%s" % (folder, reason(exc),
                                               " (sudo -n: %s)" % said if said else "")
    free = free_bytes(folder)
    if free < wanted:
        return None, "%s has %.1f GB free, the copy needs %.1f GB" % (mount, free / 1e9,
                                                                      wanted / 1e9)
    return folder, None


def _make(folder: str) -> None:
    """The copies' folder, the job's user's: made as them, else (the mount's root is the
    image's, root's) with `sudo -n install -d -o USER`, as the DLAMI's default user may. The
    first refusal is raised, with sudo's last word in its `sudo` attribute."""
    try:
        os.makedirs(folder, exist_ok=True)
        return
    except PermissionError as exc:
        refused = exc
    argv = ["sudo", "-n", "install", "-d", "-o", str(os.getuid()), "-g", str(os.getgid()),
            "-m", "0755", folder]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=SUDO_TIMEOUT_S)
        said = (done.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
        ok = done.returncode == 0
    except (OSError, subprocess.SubprocessError) as exc:
        said, ok = reason(exc), False
    if not ok or not os.path.isdir(folder):
        refused.sudo = said[:200] or "refused"  # type: ignore[attr-defined]
        raise refused


def check_root(datasets, why: str) -> None:
    """A copy planned onto the local disk goes onto the root volume instead (`why`): a
    StageError, before anything is downloaded, where the root volume cannot hold even the
    files (it was not sized for them)."""
    where: dict = {}
    for d in datasets:
        if not d.get("scratch_dest"):
            continue
        if d["kind"] == "shards":
            files = d["_manifest"].file_bytes
        else:
            files = sum(o["bytes"] for o in d["objects"])
        parent = os.path.dirname(d["dest"].rstrip("/"))
        where[parent] = where.get(parent, 0) + files
    for parent, files in where.items():
        free = free_bytes(parent)
        if free < files:
            raise StageError(
                "not onto the local NVMe (%s), and the root volume has %s free at %s for the "
                "%s of files: launch on a type whose local NVMe holds them, or with a "
                "--disk-gb that does" % (why, size(free), parent, size(files)))
