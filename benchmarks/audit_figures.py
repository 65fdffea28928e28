"""The audit's figures (/work/shared/findings/audit-2026-11-23.md, "Figures"), measured on
today's code:

  --inputs   bad inputs tried -> tracebacks and hangs (the audit: 373 -> 67 tracebacks, 0 hangs)
  --healthy  healthy local jobs killed by concurrent read-only `status` (the audit: 8 of 80)
  --orphans  fault-injection scenarios that leave anything billing (the audit: 10 of 50),
             from tests/integration/test_faults.py (moto + a loopback sshd)
  --results  time from a job's end to its results being readable without the instance
             (benchmarks/job_store_roundtrip.py)

All parts run by default. Every `cloudtrain` runs as a fresh `python -m cloudtrain` process
in its own temporary CLOUDTRAIN_HOME and HOME, on a private tmux socket killed afterwards,
with AWS_EC2_METADATA_DISABLED=true, fake credentials and AWS_ENDPOINT_URL on 127.0.0.1 (a
closed port, or a stub that answers AccessDenied / garbage / 500): nothing leaves this machine
and a user's own jobs are never touched. The corpus is in benchmarks/audit_cases.py.

Each input is sorted as the audit did: TRACEBACK (a Python traceback, or the CLI's catch-all
"internal error"), HANG (no exit within --timeout), a designed error (`Error: ...`, non-zero
exit), a click usage error, or ok. An input that runs several commands takes the worst.

The code measured is a snapshot of HEAD (`git archive`, by default) so that edits made to the
checkout while this runs cannot mix versions; --tree worktree measures the checkout as it is,
--tree DIR another copy.

Usage: python benchmarks/audit_figures.py [--inputs] [--healthy] [--orphans] [--results]
           [--tree HEAD|worktree|REV|DIR] [--workers 4] [--timeout 60] [--inputs-budget 540]
           [--only SET ...]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import datetime
import http.server
import itertools
import json
import os
import re
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks")]

import audit_cases as corpus  # noqa: E402

PYTHON = sys.executable
RUN_ID = f"ctaudit-{os.getpid()}"
TREE = ROOT  # the source tree measured: set by use_tree()


def use_tree(choice: str, scratch: Path) -> str:
    """Measure `choice` (HEAD or another revision exported with `git archive`, `worktree`
    for this checkout, or a directory); returns how to name it in the figures."""
    global TREE
    if choice == "worktree":
        TREE, name = ROOT, f"the checkout at {git_head()}"
    elif Path(choice).is_dir():
        TREE, name = Path(choice).resolve(), str(Path(choice).resolve())
    else:
        rev = subprocess.run(["git", "rev-parse", "--short", choice], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
        TREE = scratch / f"tree-{rev}"
        TREE.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(TREE)], input=archive, check=True)
        name = f"commit {rev} ({choice}, exported)"
    sys.path.insert(0, str(TREE))  # the harness's own imports of cloudtrain (fixtures)
    return name

# worst first: the kind of an input that ran several commands is its worst command's
KINDS = ("TRACEBACK", "HANG", "other", "error", "usage", "ok", "harness")


# -- running one `cloudtrain` ---------------------------------------------------------------


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
            return next(line for line in lines if "internal error" in line)
        if self.kind == "other" and self.stdout.strip():
            return f"(stderr empty) stdout: {self.stdout.strip().splitlines()[-1]}"
        return lines[0]


def classify(returncode: int | None, stderr: str, stdout: str = "") -> str:
    if returncode is None:
        return "HANG"
    if "Traceback (most recent call last)" in stderr or "internal error" in stderr:
        return "TRACEBACK"
    if returncode == 0:
        return "ok"
    if stderr.startswith("Usage:") or "Try 'cloudtrain" in stderr:
        return "usage"
    if any(line.startswith("Error: ") for line in stderr.splitlines()):
        return "error"
    if not stderr.strip() and stdout.strip():  # `down`: one line per job, exit 1 if any failed
        return "error"
    return "other"


def cloudtrain(argv: list[str], env: dict, cwd: Path, timeout: float) -> Outcome:
    start = time.monotonic()
    try:
        proc = subprocess.run([PYTHON, "-m", "cloudtrain", *argv], env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = (exc.stderr or b"").decode("utf-8", "replace")
        return Outcome("HANG", argv, None, err or f"(no exit in {timeout:.0f} s)",
                       time.monotonic() - start)
    err, out = proc.stderr.decode("utf-8", "replace"), proc.stdout.decode("utf-8", "replace")
    return Outcome(classify(proc.returncode, err, out), argv, proc.returncode, err,
                   time.monotonic() - start, out)


def kill_tmux(sock: str) -> None:
    """End our private tmux server, and remove the socket file it leaves behind."""
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=10)
    path = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / sock
    if sock.startswith(RUN_ID) and path.is_socket():
        path.unlink(missing_ok=True)


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


# -- AWS stand-ins on 127.0.0.1 --------------------------------------------------------------

EC2_DENIED = (b"<Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>You are not "
              b"authorized to perform this operation.</Message></Error></Errors>"
              b"<RequestID>audit</RequestID></Response>")
STS_DENIED = (b"<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>"
              b"denied</Message></Error><RequestId>audit</RequestId></ErrorResponse>")
S3_DENIED = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
JSON_DENIED = json.dumps({"__type": "AccessDeniedException", "message": (
    "User: arn:aws:iam::123456789012:user/audit is not authorized to perform: "
    "pricing:GetProducts")}).encode()
EC2_500 = (b"<Response><Errors><Error><Code>InternalError</Code><Message>boom</Message></Error>"
           b"</Errors><RequestID>audit</RequestID></Response>")


class StubAWS(http.server.BaseHTTPRequestHandler):
    """Answers every AWS call the same way: `mode` is denied, garbage or error500."""

    mode = "denied"

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        json_api = bool(self.headers.get("X-Amz-Target"))
        status, ctype, data = 200, "text/html", b"<html>captive portal</html>"
        if self.mode == "error500":
            status, ctype, data = 500, "text/xml", EC2_500
        elif self.mode == "denied":
            if json_api:
                status, ctype, data = 400, "application/x-amz-json-1.1", JSON_DENIED
            elif b"Action=GetCallerIdentity" in body or b"Action=AssumeRole" in body:
                status, ctype, data = 403, "text/xml", STS_DENIED
            elif b"Action=" in body:
                status, ctype, data = 403, "text/xml", EC2_DENIED
            else:
                status, ctype, data = 403, "application/xml", S3_DENIED
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


def start_stubs() -> tuple[dict[str | None, str], list[http.server.HTTPServer]]:
    """{mode: endpoint URL}; None is a closed port."""
    urls: dict[str | None, str] = {None: f"http://127.0.0.1:{closed_port()}"}
    servers = []
    for mode in ("denied", "garbage", "error500"):
        handler = type(f"Stub_{mode}", (StubAWS,), {"mode": mode})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        urls[mode] = f"http://127.0.0.1:{server.server_address[1]}"
    return urls, servers


# -- one bad input ----------------------------------------------------------------------------


@dataclasses.dataclass
class Scratch:
    """What a case gets: its own directory, state directory, tmux socket and environment."""

    dir: Path
    home: Path
    sock: str
    env: dict
    ids: dict[str, str]
    timeout: float

    def run(self, argv: list[str]) -> Outcome:
        return cloudtrain(self.fill(argv), self.env, self.dir, self.timeout)

    def fill(self, argv: list[str]) -> list[str]:
        out = []
        for arg in argv:
            for key, value in {**self.ids, "dir": str(self.dir)}.items():
                arg = arg.replace("{" + key + "}", value)
            out.append(arg)
        return out

    def jobdir(self, key: str = "job") -> Path:
        return self.home / "jobs" / self.ids[key]


@dataclasses.dataclass
class Case:
    set: str
    label: str
    commands: list[list[str]]  # ["@sleep", "2"] waits between commands
    prepare: Callable[[Scratch], None] | None = None
    endpoint: str | None = None  # a StubAWS mode; None: a closed port
    home: str | None = None  # CLOUDTRAIN_HOME other than the case's own copy of the template


@dataclasses.dataclass
class Result:
    case: Case
    kind: str
    outcomes: list[Outcome]

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
        argv = ["launch", "-q", "--name", f"fixture-{key}", "--", "true"]
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
    tests/integration/test_inputs_state.py does)."""
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


def run_case(case: Case, number: int, template: Template, root: Path, urls: dict,
             timeout: float) -> Result:
    scratch_dir = root / f"case-{number:04d}"
    scratch_dir.mkdir()
    (scratch_dir / "afile").write_text("a file\n")
    home = scratch_dir / "home"
    shutil.copytree(template.home, home, symlinks=True)
    sock = f"{RUN_ID}-{number}"
    home_value = case.home.replace("{dir}", str(scratch_dir)) if case.home else home
    env = isolated_env(scratch_dir, home_value, sock, urls[case.endpoint])
    scratch = Scratch(scratch_dir, home, sock, env, dict(template.ids), timeout)
    outcomes = []
    try:
        if case.prepare:
            case.prepare(scratch)
        for argv in case.commands:
            if argv[0] == "@sleep":
                time.sleep(float(argv[1]))
                continue
            outcomes.append(scratch.run(argv))
    except Exception as exc:  # the harness's own failure: shown, never counted as the CLI's
        outcomes = [Outcome("harness", ["(prepare)"], -1, f"harness: {exc!r}", 0.0)]
    finally:
        kill_tmux(sock)
        shutil.rmtree(scratch_dir, ignore_errors=True)
    kind = "harness" if outcomes and outcomes[0].kind == "harness" else \
        min((o.kind for o in outcomes), key=KINDS.index, default="ok")
    return Result(case, kind, outcomes)


# -- the corpus as Cases -------------------------------------------------------------------


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


def cli_cases() -> list[Case]:
    return [Case("CLI arguments", label, [argv]) for label, argv in corpus.cli_cases()]


def config_cases() -> list[Case]:
    commands = [["status"], ["launch", "-q", "--", "true"], ["status"]]

    def content(text):
        return lambda s: write(s.home / "config.yaml", text)

    def shape(name):
        return lambda s: replace_with(s.home / "config.yaml", name.replace("-> ", "symlink to "))

    cases = [Case("config.yaml", label, commands, content(text))
             for label, text in corpus.CONFIGS.items()]
    return cases + [Case("config.yaml", f"config.yaml {name}", commands, shape(name))
                    for name in corpus.CONFIG_SHAPES]


def corrupt_state(scratch: Scratch, shape: str) -> None:
    db = scratch.home / "state.db"
    if shape == "garbage WAL":
        write(db.with_name("state.db-wal"), os.urandom(8192))
        return
    if shape.endswith("table dropped"):
        with sqlite3.connect(db) as conn:
            conn.execute(f"DROP TABLE {shape.split()[0]}")
        return
    data = db.read_bytes()
    for extra in ("state.db-wal", "state.db-shm"):
        db.with_name(extra).unlink(missing_ok=True)
    if shape == "random bytes":
        write(db, os.urandom(len(data) or 8192))
    elif shape == "truncated":
        write(db, data[: len(data) // 3])
    elif shape == "empty file":
        write(db, b"")
    elif shape == "text file":
        write(db, "this is not a database\n" * 100)
    elif shape.startswith(("foreign schema", "user_version")):
        db.unlink()
        version = {"foreign schema v0": 0, "user_version 99": 99}.get(shape)
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE jobs (x)")
            if version is None:  # the current version, with a table of another shape
                conn.execute("PRAGMA user_version = 1")
                from cloudtrain import state
                version = state.SCHEMA_VERSION
            conn.execute(f"PRAGMA user_version = {version}")
    else:
        replace_with(db, shape)


def set_column(scratch: Scratch, table: str, column: str, value) -> None:
    key = "id" if table == "jobs" else "job_id"
    with sqlite3.connect(scratch.home / "state.db") as conn:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?",
                     (value, scratch.ids["aws"]))


def state_cases() -> list[Case]:
    readers = corpus.STATE_READERS
    cases = [Case("state.db", f"state.db {shape}", readers,
                  lambda s, shape=shape: corrupt_state(s, shape))
             for shape in corpus.STATE_SHAPES]
    for table, column, value in corpus.STATE_ROWS:
        shown = repr(value)[:40]
        cases.append(Case("state.db", f"{table}.{column} = {shown}", readers,
                          lambda s, t=table, c=column, v=value: set_column(s, t, c, v)))
    return cases


def home_cases() -> list[Case]:
    def prepare(s: Scratch) -> None:
        (s.dir / "loop").symlink_to(s.dir / "loop")
        (s.dir / "dangling").symlink_to(s.dir / "nowhere" / "home")

    commands = [["status"], ["launch", "-q", "--", "true"], ["recipes"]]
    return [Case("CLOUDTRAIN_HOME", f"CLOUDTRAIN_HOME {label}", commands, prepare, home=value)
            for label, value in corpus.HOMES.items()]


TOY_TRAIN = "print('toy')\n"


def recipe_dir(s: Scratch, bad: str | bytes | None) -> Path:
    root = s.dir / "recipes"
    write(root / "toy" / "recipe.yaml", corpus.GOOD_RECIPE.format(name="toy"))
    write(root / "toy" / "train.py", TOY_TRAIN)
    write(root / "bad" / "train.py", TOY_TRAIN)
    if bad is not None:
        write(root / "bad" / "recipe.yaml", bad)
    s.env["CLOUDTRAIN_RECIPES"] = str(root)
    return root


def recipe_shape(s: Scratch, shape: str) -> None:
    root = recipe_dir(s, corpus.GOOD_RECIPE.format(name="bad"))
    if shape == "recipe.yaml a directory":
        replace_with(root / "bad" / "recipe.yaml", "directory")
    elif shape == "recipe.yaml missing":
        (root / "bad" / "recipe.yaml").unlink()
    elif shape == "CLOUDTRAIN_RECIPES missing":
        s.env["CLOUDTRAIN_RECIPES"] = str(s.dir / "nowhere")
    elif shape == "CLOUDTRAIN_RECIPES a file":
        s.env["CLOUDTRAIN_RECIPES"] = str(s.dir / "afile")
    elif shape == "CLOUDTRAIN_RECIPES /dev/null":
        s.env["CLOUDTRAIN_RECIPES"] = "/dev/null"
    elif shape == "CLOUDTRAIN_RECIPES empty dir":
        (s.dir / "empty").mkdir()
        s.env["CLOUDTRAIN_RECIPES"] = str(s.dir / "empty")
    elif shape == "recipe dir named with newline":
        (root / "bad").rename(root / "ba\nd")


def recipe_cases() -> list[Case]:
    readers = corpus.RECIPE_READERS
    cases = [Case("user recipes", f"recipe {label}", readers,
                  lambda s, text=text: recipe_dir(s, text))
             for label, text in corpus.RECIPES.items()]
    return cases + [Case("user recipes", shape, readers,
                         lambda s, shape=shape: recipe_shape(s, shape))
                    for shape in corpus.RECIPE_SHAPES]


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


def launch_in_case(s: Scratch, argv: list[str]) -> None:
    out = s.run(["launch", "-q", *argv])
    if out.returncode != 0:
        raise RuntimeError(f"launch failed: {out.first_line}")
    s.ids["job"] = out.stdout.split()[-1]
    s.ids["p1"] = s.ids["job"][:1]


def stopped_job(s: Scratch) -> None:
    """A running local job whose agent and process are gone (its tmux server killed)."""
    launch_in_case(s, ["--", "sleep", "300"])
    wait_running(s)
    kill_tmux(s.sock)
    time.sleep(0.3)


def jobside_cases() -> list[Case]:
    readers = corpus.JOB_READERS
    cases = []
    for label, content in corpus.STATUS_FILES.items():
        for mode in ("finished", "stopped"):
            def prepare(s, content=content, mode=mode):
                if mode == "stopped":
                    stopped_job(s)
                write(s.jobdir() / "status.json", content)
            cases.append(Case("job-side files", f"status.json {label} ({mode} job)", readers,
                              prepare))
    for label, content in corpus.METRICS_FILES.items():
        cases.append(Case("job-side files", f"metrics.jsonl {label} (finished job)", readers,
                          lambda s, content=content: write(s.jobdir() / "metrics.jsonl", content)))

        def written(s, content=content):  # the job itself writes it, and keeps running a while
            write(s.dir / "payload", content)
            launch_in_case(s, ["--", "sh", "-c",
                               'cat "$0" >> "$CLOUDTRAIN_JOB_DIR/metrics.jsonl"; sleep 3',
                               str(s.dir / "payload")])
            wait_running(s)
            time.sleep(0.5)
        cases.append(Case("job-side files", f"metrics.jsonl {label} (written by the running job)",
                          readers[:2] + [["@sleep", "3"]] + readers[2:], written))
    for shape in corpus.JOB_SHAPES:
        for mode in ("finished", "stopped"):
            def prepare(s, shape=shape, mode=mode):
                if mode == "stopped":
                    stopped_job(s)
                jobdir = s.jobdir()
                if shape == "job dir removed":
                    shutil.rmtree(jobdir)
                elif shape == "job.json garbage":
                    write(jobdir / "job.json", "{garbage")
                else:
                    name, what = shape.split(" ", 1)
                    what = what.removeprefix("a ").replace("-> ", "symlink to ")
                    replace_with(jobdir / name, what)
            cases.append(Case("job-side files", f"{shape} ({mode} job)", readers, prepare))
    return cases


def aws_cases() -> list[Case]:
    cases = [Case("AWS: garbage endpoint" if server == "garbage" else "AWS (no AWS)", label,
                  [argv], endpoint=server)
             for label, server, argv in corpus.AWS_CASES]

    def no_credentials(s: Scratch) -> None:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            s.env.pop(key, None)

    return cases + [Case("AWS (no AWS)", f"{' '.join(argv[:2])} [no credentials]", [argv],
                         no_credentials) for argv in corpus.AWS_NO_CREDENTIALS]


CASE_SETS = {"cli": cli_cases, "config": config_cases, "state": state_cases, "home": home_cases,
             "recipes": recipe_cases, "jobside": jobside_cases, "aws": aws_cases}


# -- part 1: bad inputs ---------------------------------------------------------------------


@dataclasses.dataclass
class InputFigures:
    tried: int
    tracebacks: int
    hangs: int
    not_run: int


def short(text: str, width: int = 150) -> str:
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= width else text[: width - 3] + "..."


def cause(outcome: Outcome) -> str:
    """The exception, without the paths, ids and numbers that differ from case to case."""
    line = outcome.first_line
    match = re.search(r"internal error: (.*?) \(run again with --debug", line)
    text = match[1] if match else line.rsplit(" ... ", 1)[-1]
    text = re.sub(r"'/[^']*'|/\S+", "<path>", text)
    text = re.sub(r"'a{20,}", "'aaa...", text)
    return re.sub(r"\b[0-9a-f]{8}\b|(?<![\w-])\d+(?![\w-])", "N", text)[:100]


def bad_inputs(args) -> InputFigures:
    # round-robin over the sets, so that a spent budget leaves out a little of each
    sets = [make() for name, make in CASE_SETS.items() if not args.only or name in args.only]
    cases = [c for group in itertools.zip_longest(*sets) for c in group if c is not None]
    print(f"== bad inputs: {len(cases)} cases, {args.workers} at a time, "
          f"{args.timeout:.0f} s per command (HANG after), budget {args.inputs_budget:.0f} s")
    urls, servers = start_stubs()
    root = Path(tempfile.mkdtemp(prefix="ct-audit-inputs-"))
    results: list[Result] = []
    skipped: list[Case] = []
    start = time.monotonic()
    try:
        template = make_template(root, urls[None], args.timeout)
        deadline = start + args.inputs_budget
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            def guarded(number_case):
                number, case = number_case
                if time.monotonic() > deadline:
                    skipped.append(case)
                    return None
                return run_case(case, number, template, root, urls, args.timeout)

            for done, result in enumerate(pool.map(guarded, enumerate(cases)), 1):
                if result is not None:
                    results.append(result)
                if done % 100 == 0:
                    print(f"   {done}/{len(cases)} after {time.monotonic() - start:.0f} s",
                          flush=True)
    finally:
        for server in servers:
            server.shutdown()
        kill_tmux(f"{RUN_ID}-template")
        shutil.rmtree(root, ignore_errors=True)

    broken = [r for r in results if r.kind == "harness"]  # not inputs: the harness failed
    results = [r for r in results if r.kind != "harness"]
    by_set: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        by_set[r.case.set][r.kind] += 1
    header = f"{'set':24} {'inputs':>6} {'tracebacks':>10} {'hangs':>5} {'errors':>6} " \
             f"{'usage':>5} {'other':>5} {'ok':>5}"
    print(f"\n{header}\n{'-' * len(header)}")
    total = collections.Counter()
    for name, counts in by_set.items():
        total.update(counts)
        print(f"{name:24} {sum(counts.values()):6} {counts['TRACEBACK']:10} {counts['HANG']:5} "
              f"{counts['error']:6} {counts['usage']:5} {counts['other']:5} {counts['ok']:5}")
    print(f"{'total':24} {sum(total.values()):6} {total['TRACEBACK']:10} {total['HANG']:5} "
          f"{total['error']:6} {total['usage']:5} {total['other']:5} {total['ok']:5}")
    print(f"({time.monotonic() - start:.0f} s; 'other' = non-zero exit with nothing said, "
          f"listed below; {len(broken)} cases the harness could not set up are not counted)")
    if skipped:
        left = collections.Counter(c.set for c in skipped)
        print(f"NOT RUN (budget spent): {len(skipped)} cases: "
              + ", ".join(f"{n} {name}" for name, n in left.items()))

    causes: dict[str, list[str]] = collections.defaultdict(list)
    for r in results:
        if r.kind == "TRACEBACK":
            causes[cause(r.worst)].append(next((a for a in r.worst.argv if a[:1] != "-"), "?"))
    if causes:
        print(f"\nTRACEBACK by cause ({len(causes)} distinct):")
        for text, commands in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(commands):4}  {short(text, 110)}  "
                  f"[{', '.join(sorted(set(commands)))}]")
    for kind in ("TRACEBACK", "HANG", "other", "harness"):
        found = [r for r in results + broken if r.kind == kind]
        if not found:
            continue
        print(f"\n{kind}: {len(found)}")
        for r in found:
            o = r.worst
            print(f"  [{r.case.set}] {short(r.case.label, 70)}")
            print(f"      $ cloudtrain {short(shlex.join(o.argv), 140)}")
            print(f"      -> exit {o.returncode}: {short(o.first_line)}")
    return InputFigures(len(results), total["TRACEBACK"], total["HANG"], len(skipped))


# -- part 2: healthy jobs killed by read-only commands -----------------------------------------


@dataclasses.dataclass
class HealthyFigures:
    launched: int
    killed: int
    launch_failures: int
    reader_tracebacks: int


def healthy_jobs(args) -> HealthyFigures:
    rounds, per_round = args.rounds, 20
    print(f"\n== healthy jobs: {rounds} rounds of {per_round} parallel local launches "
          f"(`-- true`), 10-20 parallel `status` during each")
    root = Path(tempfile.mkdtemp(prefix="ct-audit-healthy-"))
    sock = f"{RUN_ID}-healthy"
    env = isolated_env(root, root / "home", sock, f"http://127.0.0.1:{closed_port()}")
    launch_failures, readers = [], []
    start = time.monotonic()
    try:
        for r in range(rounds):
            n_readers = 10 + (5 * r) % 11  # 10, 15, 20, 10, ...
            with concurrent.futures.ThreadPoolExecutor(per_round + n_readers) as pool:
                launches = [pool.submit(cloudtrain, ["launch", "-q", "--name", f"run-{r}-{i}",
                                                     "--", "true"], env, root, args.timeout)
                            for i in range(per_round)]

                def reader(delay):
                    time.sleep(delay)
                    return cloudtrain(["status"], env, root, args.timeout)

                statuses = [pool.submit(reader, 0.1 * i) for i in range(n_readers)]
                launch_failures += [f.result() for f in launches if f.result().kind != "ok"]
                readers += [f.result() for f in statuses]
        jobs = wait_all_ended(env, root, args.timeout)
    finally:
        kill_tmux(sock)
        shutil.rmtree(root, ignore_errors=True)
    not_ok = [j for j in jobs if j["state"] != "succeeded"]
    bad_readers = [o for o in readers if o.kind in ("TRACEBACK", "HANG")]
    print(f"{len(jobs)} jobs recorded of {rounds * per_round} launched, {len(launch_failures)} "
          f"launches failed, {len(readers)} status runs ({len(bad_readers)} TRACEBACK/HANG); "
          f"{time.monotonic() - start:.0f} s")
    print(f"jobs not succeeded: {len(not_ok)}")
    for j in not_ok:
        print(f"  {j['id']} {j.get('name')}: {j['state']}: {j.get('reason')}")
    for o in launch_failures + bad_readers:
        print(f"  {o.kind}: cloudtrain {shlex.join(o.argv)} -> exit {o.returncode}: "
              f"{short(o.first_line)}")
    return HealthyFigures(rounds * per_round, len(not_ok), len(launch_failures), len(bad_readers))


def wait_all_ended(env: dict, cwd: Path, timeout: float, seconds: float = 90) -> list[dict]:
    """Every job once none is active any more (or after `seconds`, as they are)."""
    deadline = time.monotonic() + seconds
    while True:
        proc = subprocess.run([PYTHON, "-m", "cloudtrain", "status", "--json"], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
        jobs = json.loads(proc.stdout or "[]")
        active = [j for j in jobs if j["state"] not in ("succeeded", "failed", "cancelled")]
        if not active or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


# -- part 3: orphans --------------------------------------------------------------------------


@dataclasses.dataclass
class OrphanFigures:
    scenarios: int | None
    left: int | None
    verdict: str


def orphans(args) -> OrphanFigures:
    print("\n== orphans: fault injection over the AWS path (tests/integration/test_faults.py)")
    if not Path("/usr/sbin/sshd").exists():
        print("openssh-server is not installed (/usr/sbin/sshd): the scenarios cannot run")
        return OrphanFigures(None, None, "not run: no openssh-server")
    command = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/integration/test_faults.py"]
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=TREE, capture_output=True, text=True,
                              timeout=args.orphans_timeout)
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        output += f"\n(timed out after {args.orphans_timeout:.0f} s)"
    lines = output.splitlines()
    table = []
    for i, line in enumerate(lines):
        if line.startswith("fault injection over the AWS path"):
            table = lines[i:]
            table = table[: next((n + 1 for n, t in enumerate(table) if " scenarios, " in t),
                                 len(table))]
    verdict = next((ln.strip("= ") for ln in reversed(lines)
                    if re.search(r"\d+ (passed|failed|error|skipped)|timed out", ln)), "?")
    print("\n".join(table) if table else "(no table printed)")
    failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    print("\n".join(failures))
    print(f"pytest: {verdict} ({time.monotonic() - start:.0f} s)")
    match = re.search(r"(\d+) scenarios, (\d+) left anything billing", "\n".join(table))
    if not match:
        return OrphanFigures(None, None, verdict)
    return OrphanFigures(int(match[1]), int(match[2]), verdict)


# -- part 4: results outlive the instance --------------------------------------------------------


def results_time(args) -> str:
    print("\n== results: job end -> results readable without the instance "
          "(benchmarks/job_store_roundtrip.py --runs 3)")
    script = TREE / "benchmarks" / "job_store_roundtrip.py"
    if not script.exists():
        print("benchmarks/job_store_roundtrip.py does not exist")
        return "not measured (no benchmarks/job_store_roundtrip.py)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    try:
        proc = subprocess.run([PYTHON, str(script), "--runs", "3"], cwd=TREE, env=env,
                              capture_output=True, text=True, timeout=args.results_timeout)
    except subprocess.TimeoutExpired:
        print(f"timed out after {args.results_timeout:.0f} s")
        return "not measured (timed out)"
    print(proc.stdout.rstrip())
    if proc.returncode:
        print(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        return f"not measured (exit {proc.returncode})"
    figures = re.findall(r"job end -> (\w+) readable:\s+([\d.]+ s)", proc.stdout)
    if not figures:
        return "(no 'job end ->' line)"
    return ", ".join(f"{what} {seconds}" for what, seconds in figures) + \
        " (moto S3 on 127.0.0.1, median of 3)"


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", action="store_true", help="part 1: bad inputs")
    parser.add_argument("--healthy", action="store_true", help="part 2: healthy jobs killed")
    parser.add_argument("--orphans", action="store_true", help="part 3: fault injection")
    parser.add_argument("--results", action="store_true", help="part 4: results time")
    parser.add_argument("--only", nargs="*", choices=sorted(CASE_SETS),
                        help="only these input sets")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per cloudtrain command before it counts as a HANG")
    parser.add_argument("--tree", default="HEAD",
                        help="the code to measure: HEAD (default) or another git revision, "
                             "exported; `worktree` for this checkout as it is; or a directory")
    parser.add_argument("--inputs-budget", type=float, default=540.0,
                        help="seconds after which no new input case starts")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--orphans-timeout", type=float, default=420.0)
    parser.add_argument("--results-timeout", type=float, default=240.0)
    args = parser.parse_args()
    chosen = [p for p in ("inputs", "healthy", "orphans", "results") if getattr(args, p)]
    chosen = chosen or ["inputs", "healthy", "orphans", "results"]
    if shutil.which("tmux") is None and {"inputs", "healthy"} & set(chosen):
        raise SystemExit("tmux is not installed: local jobs (parts 1 and 2) need it")

    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="ct-audit-tree-"))
    try:
        measured = use_tree(args.tree, scratch)
        print(f"measuring {measured}")
        inputs = bad_inputs(args) if "inputs" in chosen else None
        healthy = healthy_jobs(args) if "healthy" in chosen else None
        orphan = orphans(args) if "orphans" in chosen else None
        results = results_time(args) if "results" in chosen else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print("\n" + "=" * 78)
    print(f"audit figures, {started:%Y-%m-%d %H:%M} UTC, {time.monotonic() - t0:.0f} s, "
          f"{measured}")
    print(f"$ {shlex.join([Path(PYTHON).name, *sys.argv])}")
    print("                                      audit (2026-11-23)   now")
    if inputs:
        extra = f" ({inputs.not_run} not run)" if inputs.not_run else ""
        print(f"bad inputs tried / tracebacks / hangs   373 / 67 / 0       "
              f"{inputs.tried} / {inputs.tracebacks} / {inputs.hangs}{extra}")
    if orphan:
        now = (f"{orphan.scenarios} / {orphan.left}" if orphan.scenarios is not None
               else "not measured")
        print(f"orphan scenarios / left billing        50 / 10            {now} "
              f"(pytest: {orphan.verdict})")
    if healthy:
        print(f"healthy jobs killed / launched         8 / 80             "
              f"{healthy.killed} / {healthy.launched}"
              + (f" ({healthy.launch_failures} launches failed)" if healthy.launch_failures
                 else ""))
    if results:
        print(f"job end -> results readable            (not measured)     {results}")
    print("=" * 78)


def git_head() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    main()
