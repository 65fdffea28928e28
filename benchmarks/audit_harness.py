"""The runner under benchmarks/audit_figures.py: one case of the corpus in a scratch directory
of its own, every program it runs a fresh process (under an address-space limit and a
timeout), sorted as the audits sort them. audit_surfaces.py builds the cases of the
2026-11-27 audit's surfaces with it, audit_figures.py the rest.

A case's result is the worst of its commands' kinds (KINDS), plus the flaws its checks found
after them: a marker file a shell made (injection), a secret found where it must not be
(leak), a file written, changed or removed outside the folders the case allows (outside),
or another broken promise (broken).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Union

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
RUN_ID = f"ctaudit-{os.getpid()}"
TREE = ROOT  # the source tree measured: audit_figures.use_tree sets it
MEMORY_LIMIT = 2 << 30  # bytes of address space per process (the audit: 1-2 GB); 0: none
DRIVERS = Path(__file__).resolve().parent / "audit_drivers.py"

# worst first: the kind of an input that ran several commands is its worst command's
KINDS = ("TRACEBACK", "HANG", "other", "error", "usage", "ok", "harness")
FLAW_KINDS = {"leak": "secrets leaked", "outside": "writes outside the job dir",
              "injection": "injected code ran", "broken": "other checks failed",
              "foreign": "instances terminated that were not the job's",
              "member": "members accepted that EC2 does not list",
              "taken": "forged records taken as the job's", "left": "left billing"}


# -- running one program ------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    kind: str
    argv: list[str]
    returncode: int | None
    stderr: str
    seconds: float
    stdout: str = ""

    @property
    def first_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        if not lines and self.stdout.strip():
            return f"(stderr empty) stdout: {self.stdout.strip().splitlines()[-1]}"
        if not lines:
            return f"(exit {self.returncode}, nothing on stderr)"
        if "Traceback (most recent call last)" in self.stderr:
            return f"{lines[0]} ... {lines[-1]}"  # the exception itself is the last line
        if self.kind == "TRACEBACK":  # the catch-all's line, after any progress lines
            return next((line for line in lines if "internal error" in line or
                         masked_bug(line)), lines[-1])
        return next((line for line in lines if line.startswith(DESIGNED) or
                     FOLLOWED.match(line)), lines[0])


# An exception's name at the head of a reason: a bug some `except Exception` turned into a
# message (checkpoint_stream.restore writes "TypeError: ..." into its status, for one).
BUG_NAMES = ("TypeError", "KeyError", "AttributeError", "IndexError", "NameError",
             "UnboundLocalError", "RecursionError", "ZeroDivisionError", "AssertionError",
             "MemoryError", "UnicodeDecodeError", "UnicodeEncodeError", "OverflowError")


def masked_bug(text: str) -> bool:
    return any(f"{name}: " in text or f"({name}" in text for name in BUG_NAMES)


# The one line a designed refusal starts with: the CLI's, and the stager's and the checkpoint
# restore's on the instance, rm's for a job it keeps, and a cloud listing's for a region it
# could not ask (README: never "nothing running").
DESIGNED = ("Error: ", "cloudtrain staging failed: ", "cloudtrain: checkpoint restore failed: ",
            "kept: ", "cloud: could not check ", "aws: could not check ")
# launch --follow's and logs --follow's one line on a job that did not succeed (exit 1); a
# recipe's refusal of a checkpoint (recipes/common/checkpoint.py: its path, or the recipe's name)
FOLLOWED = re.compile(r"job [0-9a-f]{8} (failed|cancelled|preempted)\b|"
                      r"\S.*: refused to (load the checkpoint|resume): ")


def classify(returncode: int | None, stderr: str, stdout: str = "") -> str:
    if returncode is None:
        return "HANG"
    if returncode == 99 and stderr.startswith("harness:"):
        return "harness"  # a driver could not set its case up: not the code's result
    if "Traceback (most recent call last)" in stderr or "internal error" in stderr:
        return "TRACEBACK"
    if returncode == 0:
        return "ok"
    if stderr.startswith("Usage:") or "Try 'cloudtrain" in stderr:
        return "usage"
    if any(line.startswith(DESIGNED) or FOLLOWED.match(line) for line in stderr.splitlines()):
        return "error"
    if not stderr.strip() and stdout.strip():  # `down`: one line per job, exit 1 if any failed
        return "error"
    return "other"


def limited(argv: list[str], memory: int | None = None) -> list[str]:
    """argv under MEMORY_LIMIT (or `memory`) bytes of address space (prlimit), where it can
    be."""
    memory = MEMORY_LIMIT if memory is None or not MEMORY_LIMIT else max(memory, MEMORY_LIMIT)
    if memory and shutil.which("prlimit"):
        return ["prlimit", f"--as={memory}", "--", *argv]
    return argv


def run_process(argv: list[str], env: dict, cwd: Path, timeout: float,
                shown: list[str] | None = None, stdin: bytes | None = None,
                memory: int | None = None) -> Outcome:
    """Run argv in a process group of its own; at the timeout the whole group is killed
    (a stager's extraction pool, a probe) and the outcome is a HANG."""
    start = time.monotonic()
    proc = subprocess.Popen(limited(argv, memory), env=env, cwd=cwd, start_new_session=True,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        text = err.decode("utf-8", "replace")
        return Outcome("HANG", shown or argv, None, text or f"(no exit in {timeout:.0f} s)",
                       time.monotonic() - start, out.decode("utf-8", "replace"))
    err, out = err.decode("utf-8", "replace"), out.decode("utf-8", "replace")
    return Outcome(classify(proc.returncode, err, out), shown or argv, proc.returncode, err,
                   time.monotonic() - start, out)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cloudtrain(argv: list[str], env: dict, cwd: Path, timeout: float) -> Outcome:
    return run_process([PYTHON, "-m", "cloudtrain", *argv], env, cwd, timeout, shown=argv)


def kill_tmux(sock: str) -> None:
    """End our private tmux server, and remove the socket file it leaves behind."""
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=10)
    path = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / sock
    if sock.startswith(RUN_ID) and path.is_socket():
        path.unlink(missing_ok=True)


def kill_left_under(folder: Path) -> None:
    """SIGKILL what a case left running that names its scratch folder (an agent that outlives
    its tmux server, a probe, a job of an instance the lab "terminated"), as the tests do
    (tests/conftest.py's kill_processes_under: every process found was started by the case)."""
    try:
        from conftest import kill_processes_under
    except ImportError:  # a tree from before it
        return
    kill_processes_under(folder)


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolated_env(scratch: Path, home: Path | str, sock: str, endpoint: str) -> dict:
    """The environment of every cloudtrain run here: nothing of the user's, nothing off-host."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "CLOUDTRAIN_", "TMUX"))}
    env.update(HOME=str(scratch), CLOUDTRAIN_HOME=str(home), CLOUDTRAIN_TMUX_SOCKET=sock,
               PYTHONPATH=str(TREE), PYTHONDONTWRITEBYTECODE="1", TERM="dumb",
               AWS_EC2_METADATA_DISABLED="true", AWS_ENDPOINT_URL=endpoint,
               AWS_ACCESS_KEY_ID="AKIAAUDITFAKE0000000", AWS_SECRET_ACCESS_KEY="audit-fake",
               AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE="/nonexistent/aws-config",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent/aws-credentials")
    return env


# -- one case -------------------------------------------------------------------------------


@dataclasses.dataclass
class Scratch:
    """What a case gets: its own directory, state directory, tmux socket and environment."""

    dir: Path
    home: Path
    sock: str
    env: dict
    ids: dict[str, str]
    timeout: float
    flaws: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    outcomes: list[Outcome] = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)  # anything a case keeps for later
    memory: int | None = None  # Case.memory

    @property
    def outside(self) -> Path:
        """Marker files beside the job's directory: the case must leave them alone."""
        return self.dir / "outside"

    @property
    def marker(self) -> str:
        """The prefix of the files an injected `touch` would make."""
        return str(self.dir / "PWN")

    def run(self, argv: list[str]) -> Outcome:
        return cloudtrain(self.fill(argv), self.env, self.dir, self.timeout)

    def run_any(self, argv: list[str], env: dict | None = None,
                stdin: bytes | None = None) -> Outcome:
        """Another program ({python} is this Python), in the case's environment."""
        argv = self.fill(argv)
        return run_process(argv, {**self.env, **(env or {})}, self.dir, self.timeout,
                           stdin=stdin, memory=self.memory)

    def drive(self, argv: list[str]) -> Outcome:
        """benchmarks/audit_drivers.py KIND ARGS in the case's environment."""
        argv = self.fill(argv)
        return run_process([PYTHON, str(DRIVERS), *argv], self.env, self.dir, self.timeout,
                           shown=[f"(driver) {argv[0]}", *argv[1:]], memory=self.memory)

    def fill(self, argv: list[str]) -> list[str]:
        values = {**self.ids, "dir": str(self.dir), "outside": str(self.outside),
                  "M": self.marker, "python": PYTHON, "home": str(self.home)}
        out = []
        for arg in argv:
            for key, value in values.items():
                arg = arg.replace("{" + key + "}", value)
            out.append(arg)
        return out

    def jobdir(self, key: str = "job") -> Path:
        return self.home / "jobs" / self.ids[key]

    def flaw(self, kind: str, text: str) -> None:
        assert kind in FLAW_KINDS, kind
        self.flaws.append((kind, text))


# A command of a case: cloudtrain's argv, or
#   ["@sleep", "2"]              wait
#   ["@run", argv...]            another program ({python} for this Python)
#   ["@drive", KIND, args...]    benchmarks/audit_drivers.py KIND args
#   ["@if-local", argv...]       cloudtrain argv, only if the command before succeeded and
#                                its plan ran on this machine (a dry run's `backend local`)
#   ["@wait-jobs"]               until no job of the case's store is active (30 s at most)
#   a callable(scratch)          harness code; may return an Outcome
Command = Union[list, Callable[["Scratch"], "Outcome | None"]]


@dataclasses.dataclass
class Case:
    set: str
    label: str
    commands: list[Command]
    prepare: Callable[[Scratch], None] | None = None
    endpoint: str | None = None  # a StubAWS mode; None: a closed port
    home: str | None = None  # CLOUDTRAIN_HOME other than the case's own copy of the template
    # after the commands: flaws found (scratch.flaw) by checking what they left
    check: Callable[[Scratch], None] | None = None
    # folders (relative to the scratch dir) the case may write in; anything else written,
    # changed or removed under the scratch dir is a write outside the job dir. None: no guard
    allowed: tuple[str, ...] | None = None
    timeout: float | None = None  # seconds per command, when not the run's --timeout
    template: bool = True  # the case's CLOUDTRAIN_HOME starts as a copy of the template
    # bytes of address space its programs get where MEMORY_LIMIT is less (torch's libraries
    # alone map more than 2 GB); None: MEMORY_LIMIT
    memory: int | None = None


@dataclasses.dataclass
class Result:
    case: Case
    kind: str
    outcomes: list[Outcome]
    flaws: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def worst(self) -> Outcome | None:
        return next((o for o in self.outcomes if o.kind == self.kind), None)


@dataclasses.dataclass
class Template:
    """A state directory with two finished local jobs and one finished AWS job (with its
    instance row), copied into every case."""

    home: Path
    ids: dict[str, str]


def make_template(root: Path, endpoint: str, timeout: float) -> Template:
    home = root / "template-home"
    sock = f"{RUN_ID}-template"
    env = isolated_env(root, home, sock, endpoint)
    ids = {}
    for key in ("job", "job2"):
        argv = ["launch", "-q", "--name", f"fixture-{key}", "--", "sh", "-c",
                'echo \'{"epoch": 1, "epochs": 2, "time": 1.5, "train_loss": 0.9, '
                '"test_acc": 0.5}\' >> "$CLOUDTRAIN_JOB_DIR/metrics.jsonl"']
        out = subprocess.run([PYTHON, "-m", "cloudtrain", *argv], env=env, cwd=root,
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode:
            raise SystemExit(f"cannot launch the fixture job: {out.stderr.strip()}")
        ids[key] = out.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run([PYTHON, "-m", "cloudtrain", "status", "--json"], env=env, cwd=root,
                             capture_output=True, text=True, timeout=timeout)
        if all(j["state"] == "succeeded" for j in json.loads(out.stdout or "[]")):
            break
        time.sleep(0.5)
    kill_tmux(sock)
    ids["aws"] = add_aws_job(home)
    ids["p1"] = ids["job"][:1]
    return Template(home, ids)


def add_aws_job(home: Path) -> str:
    """A finished job with an AWS instance row, written through the project's own Store (as
    tests/integration/test_state_cli.py does)."""
    from cloudtrain import state
    from cloudtrain.state import Instance, Store

    os.environ["CLOUDTRAIN_HOME"] = str(home)  # Store may consult config.home()
    with Store(home / "state.db") as store:
        job = store.create_job(name="fixture-aws", kind="command", recipe=None, command="true",
                               backend="aws", spec={"kind": "command", "backend": "aws"})
        store.add_instance(Instance(
            id="i-0a0d17a0d17a0d17a", job_id=job.id, provider="aws", region="us-east-1",
            zone="us-east-1a", instance_type="g5.xlarge", market="spot", state="terminated",
            launched_at=time.time() - 3600, terminated_at=time.time() - 60,
            price_per_hour=1.0, details={"disk_gb": 100}))
        store.set_state(job.id, state.SUCCEEDED, exit_code=0,
                        metrics={"epoch": 1, "train_loss": 0.5, "test_acc": 0.9},
                        cost=1.0, cost_detail={"phases": {"run": 1.0}})
    return job.id


def rehome(home: Path, template: Path) -> None:
    """The copy's jobs point at their files in the copy: a local job's record holds its job
    directory's absolute path, and every case reading (or damaging) the template's own files
    would read (or damage) them for all the others."""
    import sqlite3

    with sqlite3.connect(home / "state.db") as db:
        db.execute("UPDATE jobs SET jobdir = ? || substr(jobdir, ?) WHERE jobdir LIKE ? || '%'",
                   (str(home), len(str(template)) + 1, str(template)))
    db.close()


def run_case(case: Case, number: int, template: Template | None, root: Path, urls: dict,
             timeout: float) -> Result:
    scratch_dir = root / f"case-{number:04d}"
    scratch_dir.mkdir()
    (scratch_dir / "afile").write_text("a file\n")
    home = scratch_dir / "home"
    if case.template and template is not None:
        shutil.copytree(template.home, home, symlinks=True)
        rehome(home, template.home)
    else:
        home.mkdir()
    sock = f"{RUN_ID}-{number}"
    home_value = case.home.replace("{dir}", str(scratch_dir)) if case.home else home
    env = isolated_env(scratch_dir, home_value, sock, urls[case.endpoint])
    ids = dict(template.ids) if template is not None else {}
    scratch = Scratch(scratch_dir, home, sock, env, ids, case.timeout or timeout,
                      memory=case.memory)
    outcomes = scratch.outcomes
    before = None
    try:
        if case.allowed is not None:
            plant_outside(scratch)
        if case.prepare:
            case.prepare(scratch)
        if case.allowed is not None:
            before = snapshot(scratch_dir, case.allowed)
        for command in case.commands:
            outcome = run_command(scratch, command)
            if outcome is not None:
                outcomes.append(outcome)
        if case.check:
            case.check(scratch)
        if before is not None:
            for path in diff(before, snapshot(scratch_dir, case.allowed)):
                scratch.flaw("outside", path)
    except Exception as exc:  # the harness's own failure: shown, never counted as the CLI's
        outcomes[:] = [Outcome("harness", ["(prepare)"], -1, f"harness: {exc!r}", 0.0)]
        scratch.flaws.clear()
    finally:
        kill_tmux(sock)
        kill_left_under(scratch_dir)
        shutil.rmtree(scratch_dir, ignore_errors=True)
    kind = "harness" if outcomes and outcomes[0].kind == "harness" else \
        min((o.kind for o in outcomes), key=KINDS.index, default="ok")
    return Result(case, kind, list(outcomes), list(scratch.flaws))


def run_command(s: Scratch, command: Command) -> Outcome | None:
    if callable(command):
        return command(s)
    head = command[0]
    if head == "@sleep":
        time.sleep(float(command[1]))
        return None
    if head == "@run":
        return s.run_any(command[1:])
    if head == "@drive":
        return s.drive(command[1:])
    if head == "@if-local":
        last = s.outcomes[-1] if s.outcomes else None
        if last is None or last.kind != "ok" or not any(
                line.split()[:2] == ["backend", "local"] for line in last.stdout.splitlines()):
            return None
        return s.run(command[1:])
    if head == "@wait-jobs":
        wait_jobs(s)
        return None
    return s.run(command)


def wait_jobs(s: Scratch, seconds: float = 30) -> list[dict]:
    """The case's jobs, once none is active any more (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    while True:
        proc = subprocess.run([PYTHON, "-m", "cloudtrain", "status", "--json", "-a"],
                              env=s.env, cwd=s.dir, capture_output=True, text=True,
                              timeout=s.timeout)
        try:
            jobs = json.loads(proc.stdout or "[]")
        except ValueError:
            return []
        active = [j for j in jobs if j.get("state") not in ("succeeded", "failed", "cancelled")]
        if not active or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)


# -- what a case may touch --------------------------------------------------------------------

OUTSIDE_FILES = {"marker": "outside the job dir\n", "dir/inner": "inner\n",
                 "victim.txt": "do not overwrite\n", "jobdir/keep.txt": "a link's target\n"}


def plant_outside(s: Scratch) -> None:
    for rel, text in OUTSIDE_FILES.items():
        write(s.outside / rel, text)


def snapshot(root: Path, allowed: tuple[str, ...]) -> dict[str, tuple]:
    """{path: (type, size, mode, mtime_ns, sha256 of a small file)} of everything under root
    except the allowed folders (links are not followed)."""
    out = {}
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        keep = []
        for d in dirs:
            rel = os.path.normpath(os.path.join(rel_top, d))
            if rel in allowed or any(rel.startswith(a + os.sep) for a in allowed):
                continue
            keep.append(d)
        dirs[:] = keep
        for name in keep + files:
            path = os.path.join(top, name)
            rel = os.path.normpath(os.path.join(rel_top, name))
            if rel in allowed:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            digest = None
            if os.path.isfile(path) and not os.path.islink(path) and st.st_size < 1 << 20:
                try:
                    with open(path, "rb") as f:
                        digest = hashlib.sha256(f.read()).hexdigest()
                except OSError:
                    pass
            link = os.readlink(path) if os.path.islink(path) else None
            if os.path.isdir(path) and link is None:  # its entries are compared one by one
                out[rel] = (st.st_mode,)
                continue
            out[rel] = (st.st_mode, st.st_size, st.st_mtime_ns if digest is None else 0,
                        digest, link)
    return out


def diff(before: dict, after: dict) -> list[str]:
    changes = []
    for rel in sorted(before.keys() | after.keys()):
        if rel not in after:
            changes.append(f"{rel} removed")
        elif rel not in before:
            changes.append(f"{rel} written")
        elif before[rel] != after[rel]:
            changes.append(f"{rel} changed")
    return changes


def markers(s: Scratch) -> list[str]:
    """The marker files an injected `touch {M}-...` made."""
    return sorted(p.name for p in s.dir.glob("PWN*"))


def check_markers(s: Scratch) -> None:
    """No marker file; and no error whose text carries an input's newline raw (the one-line
    error split, the rest of a payload shown as a line of its own)."""
    for name in markers(s):
        s.flaw("injection", f"{name} was created")
    for outcome in s.outcomes:
        if any(line.startswith(f"touch {s.marker}") for line in outcome.stderr.splitlines()):
            s.flaw("broken", f"{' '.join(outcome.argv[:2])}: a newline of the input split its "
                             "error into lines")


def files_holding(root: Path, *needles: str) -> list[str]:
    """Every file under root (links not followed) whose bytes hold one of the needles."""
    found = []
    for top, _, files in os.walk(root):
        for name in files:
            path = os.path.join(top, name)
            try:
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if any(n.encode() in data for n in needles):
                found.append(os.path.relpath(path, root))
    return found


# -- small helpers the case builders share ------------------------------------------------------


def write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def replace_with(path: Path, shape: str) -> None:
    """Put something that is not a plain file at `path`."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if shape == "directory":
        path.mkdir()
    elif shape.startswith("symlink to "):
        path.symlink_to(shape.removeprefix("symlink to "))
    elif shape == "dangling symlink":
        path.symlink_to(path.parent / "nowhere" / "x")
    elif shape == "symlink loop":
        path.symlink_to(path)
    elif shape == "fifo":
        os.mkfifo(path)


def wait_running(s: Scratch, job_key: str = "job", seconds: float = 20) -> None:
    status = s.jobdir(job_key) / "status.json"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if json.loads(status.read_text()).get("state") == "running":
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"job {s.ids[job_key]} not running after {seconds:.0f} s")


def launch_in_case(s: Scratch, argv: list[str], key: str = "job") -> str:
    out = s.run(["launch", "-q", *argv])
    if out.returncode != 0:
        raise RuntimeError(f"launch failed: {out.first_line}")
    s.ids[key] = out.stdout.split()[-1]
    if key == "job":
        s.ids["p1"] = s.ids["job"][:1]
    return s.ids[key]


def short(text: str, width: int = 150) -> str:
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= width else text[: width - 3] + "..."
