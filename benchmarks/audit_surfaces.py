"""The sets of benchmarks/audit_figures.py for the surfaces the audit of 2026-11-27 attacked
(/work/shared/findings/audit-2026-11-27.md): job files, injection launches, metrics x
commands, shards and manifests, stager plans, restore plans, the job store reader,
completion, rm/prune, sync and secrets. The data is in audit_cases.py; the readers of
untrusted data that have no command of their own run in audit_drivers.py.

Each builder returns audit_harness.Case objects; CASE_SETS names them for --only. Nothing
here reaches beyond 127.0.0.1: the "S3" the stager and the checkpoint restore read is
LyingS3, a local HTTP server that lies as the audit's did.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import unicodedata
from pathlib import Path

import audit_cases as corpus
from audit_harness import (Case, Outcome, Scratch, check_markers, closed_port,
                           files_holding, launch_in_case, replace_with, wait_jobs,
                           wait_running, write)

# -- a lying "S3" on 127.0.0.1 ------------------------------------------------------------------


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hung up on a lie is the point, not news


class LyingS3:
    """Objects by token at /<behaviour>/<token>: `ok` serves the bytes (ranges honoured),
    the others lie as a broken or hostile server would (see BEHAVIOURS)."""

    BEHAVIOURS = ("ok", "short", "long", "endless", "403", "404", "500", "302", "trickle")

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.closed = f"http://127.0.0.1:{closed_port()}"
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                try:
                    owner.answer(self)
                except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
                    self.close_connection = True

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def put(self, data: bytes) -> str:
        token = hashlib.sha256(data + os.urandom(8)).hexdigest()[:16]
        with self.lock:
            self.objects[token] = data
        return token

    def url(self, behaviour: str, data: bytes) -> str:
        return f"{self.base}/{behaviour}/{self.put(data)}"

    def answer(self, h) -> None:
        parts = h.path.split("?")[0].strip("/").split("/")
        behaviour, token = (parts + ["", ""])[:2]
        data = self.objects.get(token)
        if data is None or behaviour not in self.BEHAVIOURS:
            return self.error(h, 404, "NoSuchKey")
        if behaviour in ("403", "404", "500"):
            return self.error(h, int(behaviour), {"403": "AccessDenied", "404": "NoSuchKey",
                                                  "500": "InternalError"}[behaviour])
        if behaviour == "302":
            h.send_response(302)
            h.send_header("Location", f"{self.closed}/latest/meta-data/iam/")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        start, end = 0, len(data) - 1
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", h.headers.get("Range") or "")
        if m:
            start, end = int(m[1]), min(int(m[2]), len(data) - 1)
        body = data[start:end + 1]
        h.send_response(206 if m else 200)
        if m:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        h.send_header("ETag", '"%s"' % hashlib.md5(data).hexdigest())
        if behaviour == "endless":
            h.send_header("Connection", "close")
            h.end_headers()
            h.close_connection = True
            for _ in range(256):  # 64 MB at most, then the connection closes
                h.wfile.write(bytes(256 << 10))
            return
        declared = {"long": len(body) + 100}.get(behaviour, len(body))
        h.send_header("Content-Length", str(declared))
        h.end_headers()
        if behaviour == "short":
            h.wfile.write(body[: len(body) // 2])
            h.close_connection = True
        elif behaviour == "long":
            h.wfile.write(body + bytes(100))
        elif behaviour == "trickle":  # one byte a second, as a stuck middlebox would
            for i in range(len(body)):
                h.wfile.write(body[i:i + 1])
                h.wfile.flush()
                time.sleep(1.0)
        else:
            h.wfile.write(body)

    @staticmethod
    def error(h, status: int, code: str) -> None:
        body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_S3: LyingS3 | None = None
_S3_LOCK = threading.Lock()


def lying_s3() -> LyingS3:
    global _S3
    with _S3_LOCK:
        if _S3 is None:
            _S3 = LyingS3()
        return _S3


def stop_servers() -> None:
    global _S3
    with _S3_LOCK:
        if _S3 is not None:
            _S3.close()
            _S3 = None


# -- checks shared by the sets --------------------------------------------------------------------

GUARDED = ("job", "home")  # what the store / restore / shard / stager cases may write


def flaw_lines(s: Scratch) -> None:
    """`FLAW: ...` on a driver's stdout: a promise broken without an exception."""
    for outcome in s.outcomes:
        for line in outcome.stdout.splitlines():
            if line.startswith("FLAW: "):
                s.flaw("broken", line[6:])


def masked(outcome: Outcome) -> Outcome:
    """A reason that is an exception's name and text (a bug some `except Exception` turned
    into a message) counts as the traceback it was."""
    from audit_harness import masked_bug

    if outcome.kind in ("error", "other") and masked_bug(outcome.stderr):
        outcome.kind = "TRACEBACK"
    return outcome


def runner(argv: list[str]):
    """A command that runs argv (another program) and unmasks hidden bugs."""
    return lambda s: masked(s.run_any(argv))


# -- a victim's home directory ----------------------------------------------------------------


def credential_files() -> list[str]:
    return corpus.CREDENTIALS_F6 + corpus.CREDENTIALS_F27


def plant_home(s: Scratch) -> None:
    """The case's HOME (its scratch dir) as a victim's: the credential files of both audits,
    each holding a unique token, and a repository code/repo with its own train.py."""
    for i, rel in enumerate(credential_files()):
        write(s.dir / rel, f"audit-credential-{i:02d} {rel}\n")
    write(s.dir / "project" / "train.py", "print('project')\n")
    write(s.dir / "code" / "repo" / "train.py", "print('repo')\n")
    (s.dir / "code" / "repo" / "out").symlink_to("../..")
    (s.dir / "code" / "repo" / "loop").symlink_to("loop")


def credentials_sent(s: Scratch) -> list[str]:
    """The planted credential files found in any job's synced work dir (by their tokens)."""
    found = set()
    for work in (s.dir / "home" / "jobs").glob("*/work"):
        for rel in files_holding(work, "audit-credential-"):
            data = (work / rel).read_text(errors="replace")
            found.update(re.findall(r"audit-credential-\d\d (\S+)", data))
    return sorted(found)


def check_credentials(s: Scratch) -> None:
    for rel in credentials_sent(s):
        s.flaw("leak", f"{rel} reached the job's work dir")


# -- job files -------------------------------------------------------------------------------------

JOB_FILE = "code/repo/job.yaml"


def jobfile_cases() -> list[Case]:
    cases = []
    for label, text in corpus.JOB_FILES.items():
        def prepare(s, text=text):
            plant_home(s)
            data = text if isinstance(text, bytes) else "\n".join(
                s.fill(text.split("\n"))).encode()
            write(s.dir / JOB_FILE, data)

        def check(s):
            check_markers(s)
            check_credentials(s)
            for rel in files_holding(s.dir / "home", corpus.INLINE_SECRET):
                s.flaw("leak", f"the inline secret is in $CLOUDTRAIN_HOME/{rel}")

        cases.append(Case("job files", label, [
            ["launch", JOB_FILE, "--dry-run"], ["@if-local", "launch", "-q", JOB_FILE],
            ["@wait-jobs"]], prepare, check=check))
    return cases


# -- injection launches (F1 again) -------------------------------------------------------------

TOY_RECIPE = """\
name: toy
description: a tiny recipe whose tag argument is free text
entry: train.py
arguments:
  epochs: {type: int, default: 1, help: epochs}
  tag: {type: str, default: none, help: free text}
profiles:
  smoke: {description: one epoch, set: {epochs: 1}}
resources: {gpus_per_node: 1, nodes: 1, disk_gb: 10, max_runtime_minutes: 5}
published:
  - {result: "50%", time: "1 s", hardware: "any CPU", source: "audit"}
"""


def toy_recipe(s: Scratch) -> None:
    write(s.dir / "recipes" / "toy" / "recipe.yaml", TOY_RECIPE)
    write(s.dir / "recipes" / "toy" / "train.py", "import sys\nprint(sys.argv)\n")
    s.env["CLOUDTRAIN_RECIPES"] = str(s.dir / "recipes")


def injection_cases() -> list[Case]:
    cases = []
    for kind, payload in corpus.INJECTIONS.items():
        for label, flags, command in corpus.INJECTION_FLAGS:
            flags = [f.replace("{P}", payload) for f in flags]
            command = [c.replace("{P}", payload) for c in command]

            def prepare(s, label=label, flags=flags):
                toy_recipe(s)
                if label == "--workdir":
                    path = Path(s.fill([flags[1]])[0])
                    write(path / "train.py", "print('x')\n")
                if label == "CLOUDTRAIN_HOME":
                    home = Path(s.fill(["{dir}/state-" + payload])[0])
                    home.mkdir(parents=True)
                    s.env["CLOUDTRAIN_HOME"] = str(home)

            argv = flags + (["--", *command] if command else [])
            cases.append(Case("injection launches", f"{label} [{kind}]", [
                ["launch", "--dry-run", *argv], ["@if-local", "launch", "-q", *argv],
                ["@wait-jobs"]], prepare, check=check_markers))
        for label, template in corpus.INJECTION_FIELDS:
            def prepare(s, label=label, template=template, payload=payload):
                toy_recipe(s)
                plant_home(s)
                filled = s.fill([payload])[0]
                write(s.dir / JOB_FILE, template.format(P=json.dumps(filled)))
                if label == "workdir":
                    write(s.dir / "code" / "repo" / filled / "train.py", "print('x')\n")

            cases.append(Case("injection launches", f"job file {label} [{kind}]", [
                ["launch", JOB_FILE, "--dry-run"], ["@if-local", "launch", "-q", JOB_FILE],
                ["@wait-jobs"]], prepare, check=check_markers))
    return cases


# -- metrics x commands (F19, F34, F38) --------------------------------------------------------


def plant_metrics(s: Scratch, label: str, content) -> None:
    path = s.jobdir() / "metrics.jsonl"
    if content is not None:
        write(path, content)
    elif label == "a FIFO":
        replace_with(path, "fifo")
    else:
        replace_with(path, "symlink to " + label.removeprefix("a link to "))


def metrics_cases() -> list[Case]:
    files = {**corpus.METRICS_FILES, **corpus.METRICS_HOSTILE}
    return [Case("metrics x commands", f"metrics.jsonl {label} | {' '.join(command)}",
                 [command], lambda s, label=label, content=content: plant_metrics(
                     s, label, content))
            for label, content in files.items() for command in corpus.METRICS_COMMANDS]


# -- shards and manifests ------------------------------------------------------------------------


def shard_cases() -> list[Case]:
    cases = [Case("shards and manifests", f"shard: {case}",
                  [["@drive", "shard", case, "{dir}/job/data/ds", "{outside}"]],
                  check=flaw_lines, allowed=GUARDED, template=False)
             for case in corpus.TAR_CASES]
    for case, text in corpus.MANIFEST_CASES.items():
        argv = ["@drive", "manifest", case] + (["{dir}/manifest.txt"] if text is not None else [])
        cases.append(Case("shards and manifests", f"manifest: {case}", [argv],
                          (lambda s, text=text: write(s.dir / "manifest.txt", text))
                          if text is not None else None, template=False))
    return cases


# -- stager plans (F38) ------------------------------------------------------------------------

STAGE = ["{python}", "-m", "cloudtrain.host.stager", "{dir}/plan.json",
         "{dir}/job/staging-status.json"]
OBJECT = b"an object's bytes\n" * 100


def _objects_dataset(s: Scratch, objects: list[tuple[str, str, bytes]], **extra) -> dict:
    """An objects dataset of (path, behaviour, bytes) read through presigned URLs."""
    server = lying_s3()
    entries = [{"key": f"p/{path}", "path": path, "bytes": len(data),
                "md5": hashlib.md5(data).hexdigest(), "url": server.url(behaviour, data)}
               for path, behaviour, data in objects]
    d = {"name": "ds", "dest": str(s.dir / "job" / "data" / "ds"), "kind": "objects",
         "bucket": "audit", "prefix": "p", "region": "us-east-1", "endpoint": None,
         "auth": "presigned", "identity": "ab12", "objects": entries}
    d.update(extra)
    return d


def _plan(datasets: list, **extra) -> dict:
    plan = {"version": 1, "workers": 2, "part_bytes": 1 << 20, "progress_s": 0.5,
            "imds_url": "http://127.0.0.1:9", "datasets": datasets}
    plan.update(extra)
    return plan


def stager_plan(s: Scratch, case: str):
    """The plan of one stager case (a dict, or whatever else the case writes)."""
    one = lambda behaviour="ok", path="a.txt", data=OBJECT: _objects_dataset(  # noqa: E731
        s, [(path, behaviour, data)])
    paths = {"object path ..": "../../../evil", "object path absolute": f"{s.outside}/evil",
             "object path hidden": ".hidden", "object path NUL": "a\x00b",
             "object path empty": ""}
    behaviours = {"short body": "short", "longer body": "long", "endless body": "endless",
                  "403": "403", "404": "404", "500 always": "500",
                  "302 to a metadata-like address": "302", "trickle (1 byte/s)": "trickle"}
    if case in paths:
        return _plan([one(path=paths[case])])
    if case in behaviours:
        return _plan([one(behaviours[case])])
    if case == "duplicate paths":
        return _plan([_objects_dataset(s, [("a", "ok", OBJECT), ("a", "ok", OBJECT)])])
    if case == "file and folder":
        return _plan([_objects_dataset(s, [("p/a", "ok", OBJECT), ("p/a/b", "ok", OBJECT)])])
    if case == "md5 mismatch":
        d = one()
        d["objects"][0]["md5"] = "0" * 32
        return _plan([d])
    if case in ("size lies (smaller)", "size lies (larger)"):
        d = one()
        d["objects"][0]["bytes"] += -100 if "smaller" in case else 100
        return _plan([d])
    if case == "file:// URL":
        d = one()
        d["objects"][0]["url"] = "file:///etc/passwd"
        return _plan([d])
    if case in ("dest /", "dest relative", "dest a file", "dest holds files"):
        d = one()
        d["dest"] = {"dest /": "/", "dest relative": "job/data/ds",
                     "dest a file": str(s.dir / "job" / "afile"),
                     "dest holds files": str(s.dir / "job" / "data" / "mine")}[case]
        write(s.dir / "job" / "afile", "a file\n")
        write(s.dir / "job" / "data" / "mine" / "notes.txt", "the user's own\n")
        return _plan([d])
    if case == "bad name":
        return _plan([one() | {"name": "../Bad Name"}])
    if case in ("workers 0", "workers 10^9"):
        return _plan([one()], workers=0 if case == "workers 0" else 10**9)
    if case == "plan version 2":
        return _plan([one()], version=2)
    if case == "plan a list":
        return [_plan([one()])]
    if case == "plan a string":
        return "stage everything"
    if case == "kind unknown":
        return _plan([one() | {"kind": "torrent"}])
    if case == "shard with ../ member through the stager":
        return _plan([_shards_dataset(s)])
    if case == "good objects (control)":
        return _plan([_objects_dataset(s, [("a.txt", "ok", OBJECT),
                                           ("sub/b.bin", "ok", os.urandom(3 << 20))])])
    if case == "path dataset pointing outside":
        return _plan([{"name": "ds", "dest": str(s.dir / "job" / "data" / "ds"),
                       "kind": "path", "path": str(s.outside / "dir")}])
    raise ValueError(f"no such stager case {case!r}")


def _shards_dataset(s: Scratch) -> dict:
    """A shards dataset whose one shard holds `../../../evil`, its manifest true to it."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("../../../evil-stager")
        info.size, info.mode = 5, 0o644
        tar.addfile(info, io.BytesIO(b"evil\n"))
    data = buf.getvalue()
    manifest = {"version": 1, "created": "2026-11-27T10:00:00Z", "shard_bytes": 1 << 20,
                "files": 1, "bytes": len(data), "file_bytes": 5, "shards": [
                    {"name": "shard-00000.tar", "files": 1, "bytes": len(data),
                     "file_bytes": 5, "sha256": hashlib.sha256(data).hexdigest()}]}
    return {"name": "ds", "dest": str(s.dir / "job" / "data" / "ds"), "kind": "shards",
            "bucket": "audit", "prefix": "p", "region": "us-east-1", "endpoint": None,
            "auth": "presigned", "identity": "cd34", "manifest": manifest,
            "shard_urls": [lying_s3().url("ok", data)]}


def stager_cases(timeout: float) -> list[Case]:
    def prepare(s, case):
        (s.dir / "job").mkdir(exist_ok=True)
        write(s.dir / "plan.json", json.dumps(stager_plan(s, case)))

    # the trickle is retried 6 times at 20 s of stall each: a HANG only past 300 s
    return [Case("stager plans", case, [runner(STAGE)],
                 lambda s, case=case: prepare(s, case), allowed=GUARDED, template=False,
                 timeout=max(timeout, 300.0) if "trickle" in case else None)
            for case in corpus.STAGER_CASES]


# -- checkpoint restore plans ---------------------------------------------------------------------

RESTORE = ["{python}", "-m", "cloudtrain.host.checkpoint_stream", "restore", "{dir}/plan.json",
           "{dir}/job"]


def restore_plan(s: Scratch, case: str):
    server = lying_s3()
    files = {"checkpoints/model.pt": b"weights" * 100, "output.log": b"the log so far\n"}
    paths = {"path ..": "checkpoints/../../evil", "path absolute": f"{s.outside}/evil",
             "run.sh": "run.sh", "job.json": "job.json", ".secrets.env": ".secrets.env"}
    if case in paths:
        files[paths[case]] = b"#!/bin/sh\ntouch " + s.marker.encode() + b"-restore\n"
    if case == "file and folder":
        files["checkpoints/a"], files["checkpoints/a/b"] = b"1", b"2"
    if case == "10001 files":
        files = {f"checkpoints/{i}.pt": b"x" for i in range(10001)}
    job = s.dir / "job"
    job.mkdir(exist_ok=True)
    write(job / "output.log", "started\n")
    if case == "symlink at checkpoints/":
        (job / "checkpoints").symlink_to(s.outside / "dir")
    elif case == "symlink at the file":
        (job / "checkpoints").mkdir()
        (job / "checkpoints" / "model.pt").symlink_to(s.outside / "victim.txt")
    elif case == "symlink at output.log":
        (job / "output.log").unlink()
        (job / "output.log").symlink_to(s.outside / "victim.txt")
    behaviour = "500" if case == "500 always" else "ok"
    items = []
    for path, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        if case == "sha256 mismatch":
            digest = "0" * 64
        url = server.url(behaviour, data) if len(files) < 100 else f"{server.base}/ok/x{path}"
        items.append({"path": path, "size": len(data) + (7 if case == "size mismatch" else 0),
                      "sha256": digest, "url": "file:///etc/passwd" if case == "file:// URL"
                      else url})
    plan = {"version": 1, "job_id": "a1b2c3d4", "seq": 3, "slot": "a", "step": 30,
            "epoch": 3, "attempt": 1, "step_source": "checkpoint", "taken_at": 1.7e9,
            "uploaded_at": 1.7e9, "upload_seconds": 1.0, "final": False,
            "bytes": sum(i["size"] for i in items) + (1 if case == "bytes total lies" else 0),
            "files": items, "timeout_s": float("nan") if case == "timeout NaN" else 60.0}
    if case == "plan a list":
        return json.dumps([plan])
    if case == "plan not JSON":
        return "{not json"
    return json.dumps(plan)


def restore_cases() -> list[Case]:
    def prepare(s, case):
        write(s.dir / "plan.json", restore_plan(s, case))

    def check(s):
        check_markers(s)

    return [Case("restore plans", case, [runner(RESTORE)], lambda s, case=case: prepare(s, case),
                 check=check, allowed=GUARDED, template=False)
            for case in corpus.RESTORE_CASES]


# -- the job store reader ------------------------------------------------------------------------


def jobstore_cases() -> list[Case]:
    return [Case("job store", case, [["@drive", "jobstore", case, "{dir}/job/store",
                                      "{outside}"]], allowed=GUARDED, template=False)
            for case in corpus.JOBSTORE_CASES]


# -- completion (F35) --------------------------------------------------------------------------


def complete(s: Scratch, shell: str) -> Outcome:
    """What `cloudtrain status <Tab>` gets in `shell`, through click's protocol; a broken
    protocol or a control character in what the shell shows is a flaw."""
    env = {"_CLOUDTRAIN_COMPLETE": f"{shell}_complete", "COMP_WORDS": "cloudtrain status ",
           "COMP_CWORD": "2" if shell != "fish" else ""}
    outcome = s.run_any(["{python}", "-m", "cloudtrain"], env=env)
    out = outcome.stdout
    known = {s.ids["job"], s.ids.get("name", "")}
    if shell == "zsh":
        lines = out.split("\n")
        if lines[-1] != "" or (len(lines) - 1) % 3:
            s.flaw("broken", f"zsh: {len(lines) - 1} lines, not triplets")
        triplets = [lines[i:i + 3] for i in range(0, len(lines) - 1, 3)]
        values = {t[1] for t in triplets if len(t) == 3}
        helps = [t[2] for t in triplets if len(t) == 3]
    elif shell == "bash":
        rows = [r for r in out.split("\n") if r]
        values = {r.split(",", 1)[-1] for r in rows}
        helps = []
    else:
        rows = [r for r in out.split("\n") if r]
        values = {r.split(",", 1)[-1].split("\t")[0] for r in rows}
        helps = [r.split("\t", 1)[1] for r in rows if "\t" in r]
    if values - known:
        s.flaw("broken", f"{shell}: candidates that are no job: {sorted(values - known)[:3]}")
    if any(unicodedata.category(c) == "Cc" for text in [*values, *helps] for c in text):
        s.flaw("broken", f"{shell}: control characters reach the menu")
    return outcome


def completion_cases() -> list[Case]:
    cases = []
    for label, run in corpus.COMPLETION_JOBS.items():
        def prepare(s, run=run, label=label):
            write(s.dir / "job.yaml", "\n".join(s.fill(f"name: {label[:5]}\n{run}".split(
                "\n"))))
            launch_in_case(s, ["job.yaml"])
            s.ids["name"] = label[:5]
            wait_jobs(s, 20)

        for shell in corpus.COMPLETION_SHELLS:
            cases.append(Case("completion", f"{label} through {shell}",
                              [lambda s, shell=shell: complete(s, shell)], prepare,
                              check=check_markers, template=False))
    return cases


# -- rm and prune ------------------------------------------------------------------------------


def rm_prune_case(label: str) -> Case:
    commands: list = []

    def prepare(s: Scratch) -> None:
        jobdir = s.jobdir()
        if label == "rm a running job":
            launch_in_case(s, ["--", "sleep", "30"], key="running")
            wait_running(s, "running")
        elif label == "rm a job whose dir links to outside folders":
            (jobdir / "outside-link").symlink_to(s.outside / "dir")
            (jobdir / "checkpoints").mkdir(exist_ok=True)
            (jobdir / "checkpoints" / "victim").symlink_to(s.outside / "victim.txt")
        elif label in ("rm a job whose dir is a symlink", "prune a symlinked job dir"):
            target = s.outside / "jobdir"
            for item in jobdir.iterdir():
                if item.is_file():
                    write(target / item.name, item.read_bytes())
            shutil.rmtree(jobdir)
            jobdir.symlink_to(target)
        elif label == "rm a job whose dir holds a hardlink to outside":
            os.link(s.outside / "victim.txt", jobdir / "hardlink")
        elif label == "rm a job whose dir holds a FIFO and a loop of links":
            os.mkfifo(jobdir / "pipe")
            (jobdir / "loop").symlink_to("loop")
            (jobdir / "checkpoints").mkdir(exist_ok=True)
            (jobdir / "checkpoints" / "up").symlink_to("..")

    ref = {"rm ../../x": "../../x", "rm %": "%"}.get(label, "{job}")
    if label == "rm a running job":
        ref = "{running}"
    if label.startswith("rm"):
        commands = [["rm", ref, "-y"]]
    else:
        age = label.rsplit(" ", 1)[-1] if "older-than" in label else "1s"
        commands = [["prune", "--older-than", age, "-y"]]

    def check(s: Scratch) -> None:
        if label == "rm a running job":
            jobs = {j["id"]: j for j in wait_jobs(s, 0)}
            if s.ids["running"] not in jobs:
                s.flaw("broken", "the running job was removed")
            subprocess.run(["tmux", "-L", s.sock, "kill-server"], capture_output=True)

    return Case("rm/prune", label, commands, prepare, check=check, allowed=("home",))


def rm_prune_cases() -> list[Case]:
    return [rm_prune_case(label) for label in corpus.RM_PRUNE_CASES]


# -- sync (F6, F27, F3) ------------------------------------------------------------------------


def sync_case(label: str) -> Case:
    argv: list = ["launch", "-q", "--workdir", "{dir}", "--", "true"]

    def prepare(s: Scratch) -> None:
        plant_home(s)
        if label == "a project below home as --workdir":
            for rel in (".env", "id_rsa", ".npmrc", "deploy.key", "service-account.json"):
                write(s.dir / "project" / rel, f"audit-credential-99 project/{rel}\n")
        elif label == "a .gitignore that re-includes .aws":
            write(s.dir / ".gitignore", "!.aws/\n!.aws/**\n!.ssh/\n")
        elif label == "credentials in a project subfolder":
            for rel in corpus.CREDENTIALS_F27[:6]:
                write(s.dir / "project" / "sub" / rel, f"audit-credential-98 sub/{rel}\n")
        elif label == "a link to .aws inside the workdir":
            (s.dir / "project" / "aws-settings").symlink_to(s.dir / ".aws")
            (s.dir / "project" / "notes.txt").symlink_to(s.dir / ".aws" / "credentials")
        elif label == "a newline file name (F3)":
            write(s.dir / "project" / "ok\nsecret.txt", "fine\n")
            write(s.dir / "project" / "secret.txt", "audit-credential-97 project/secret.txt\n")
            write(s.dir / "project" / ".gitignore", "secret.txt\n")
        elif label == "file names that look like rsync options":
            for name in ("-e", f"--rsh=touch {s.marker}-rsync", "-rf"):
                write(s.dir / "project" / name, "x\n")
        elif label == "home through a symlinked workdir":
            (s.dir / "code" / "home-link").symlink_to(s.dir)
        elif label == "a job file in the home, workdir .":
            write(s.dir / "job.yaml", "name: home-run\nworkdir: .\nrun: ls -a\n")
        elif label.startswith("a workdir holding a FIFO"):
            os.mkfifo(s.dir / "project" / "pipe")
            (s.dir / "project" / "zero").symlink_to("/dev/zero")
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(s.dir / "project" / "sock"))
        elif label == "a job file with workdir ../..":
            write(s.dir / JOB_FILE, "workdir: ../..\nrun: cat .aws/credentials\n")
        elif label == "a job file with include .aws/.ssh":
            write(s.dir / JOB_FILE, "workdir: .\ninclude: ['.aws/**', '.ssh/**']\nrun: ls\n")

    if label == "home as --workdir, dry run":
        argv = ["launch", "--dry-run", "--workdir", "{dir}", "--", "true"]
    elif label in ("a project below home as --workdir", "credentials in a project subfolder",
                   "a link to .aws inside the workdir", "a newline file name (F3)",
                   "file names that look like rsync options",
                   "a workdir holding a FIFO, a socket and a link to /dev/zero"):
        argv = ["launch", "-q", "--workdir", "{dir}/project", "--", "true"]
    elif label == "home through a symlinked workdir":
        argv = ["launch", "-q", "--workdir", "{dir}/code/home-link", "--", "true"]
    elif label == "a job file in the home, workdir .":
        argv = ["launch", "-q", "job.yaml"]
    elif label.startswith("a job file with"):
        argv = ["launch", "-q", "-y", JOB_FILE]
    elif label.startswith("--include typed"):
        argv = ["launch", "-q", "-y", "--workdir", "{dir}", "--include", ".npmrc", "--",
                "true"]

    def check(s: Scratch) -> None:
        check_markers(s)
        sent = credentials_sent(s)
        s.extra["sent"] = sent
        for rel in sent:
            if label.startswith("--include typed") and rel == ".npmrc":
                continue  # typed by the user, sent with a WARNING: the design
            s.flaw("leak", f"{rel} reached the job's work dir")

    return Case("sync", label, [argv, ["@wait-jobs"]], prepare, check=check)


def sync_cases() -> list[Case]:
    return [sync_case(label) for label in corpus.SYNC_CASES]


# -- secrets -----------------------------------------------------------------------------------

SECRET = "auditSECRETvalue-5d1c9e"


def seen_while_running(s: Scratch) -> Outcome:
    """ps of every process and the job's tmux scrollback, while the job runs."""
    wait_running(s)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    pane = subprocess.run(["tmux", "-L", s.sock, "capture-pane", "-p", "-S", "-", "-t",
                           f"ct-{s.ids['job']}"], capture_output=True, text=True).stdout
    for what, text in (("ps", ps), ("the tmux scrollback", pane)):
        if SECRET in text:
            s.flaw("leak", f"the secret is in {what}")
    return None


def secrets_case(label: str) -> Case:
    env_value = {}
    if label == "--secret KEY=VALUE":
        launch = ["--secret", f"TOKEN={SECRET}", "--", "sleep", "3"]
    elif label == "--secret KEY from the environment":
        launch, env_value = ["--secret", "TOKEN", "--", "sleep", "3"], {"TOKEN": SECRET}
    elif label == "job file secrets: {KEY: null}":
        launch, env_value = ["job.yaml"], {"TOKEN": SECRET}
    else:
        launch = ["job.yaml"]

    def prepare(s: Scratch) -> None:
        s.env.update(env_value)
        if label.startswith("job file secrets"):
            write(s.dir / "job.yaml", "secrets: {TOKEN: null}\nrun: sleep 3\n")
        elif label.startswith("job file secret written"):
            write(s.dir / "job.yaml", f"secrets: {{TOKEN: {SECRET}}}\nrun: sleep 3\n")

    def start(s: Scratch) -> Outcome:
        outcome = s.run(["launch", "-q", *launch])
        if outcome.kind == "ok":
            s.ids["job"] = outcome.stdout.split()[-1]
            seen_while_running(s)
        return outcome

    def check(s: Scratch) -> None:
        for outcome in s.outcomes:
            if SECRET in outcome.stdout + outcome.stderr:
                s.flaw("leak", f"the secret is in the output of {' '.join(outcome.argv[:2])}")
        for rel in files_holding(s.home, SECRET):
            s.flaw("leak", f"the secret is in $CLOUDTRAIN_HOME/{rel}")

    readers = [["launch", "--dry-run", *launch], start, ["@wait-jobs"], ["status", "{job}"],
               ["status", "--json"], ["logs", "{job}"]]
    return Case("secrets", label, readers, prepare, check=check, template=False)


def secrets_cases() -> list[Case]:
    return [secrets_case(label) for label in corpus.SECRETS_CASES]


def case_sets(timeout: float) -> dict:
    """{--only name: builder} for the sets of the 2026-11-27 audit."""
    return {"jobfiles": jobfile_cases, "injection": injection_cases, "metrics": metrics_cases,
            "shards": shard_cases, "stager": lambda: stager_cases(timeout),
            "restore": restore_cases, "jobstore": jobstore_cases,
            "completion": completion_cases, "rmprune": rm_prune_cases, "sync": sync_cases,
            "secrets": secrets_cases}
