"""The hostile audits' figures, measured on today's code: the audit of 2026-11-27
(/work/shared/findings/audit-2026-11-27.md, "Counts (as the last audit counted)") and the new
surfaces of the one of 2026-12-01 (audit-2026-12-01.md, "Figures") by default, and the sets
of the one of 2026-11-23 on request.

  --inputs   bad inputs tried -> tracebacks and hangs, per set, and what the sets' checks
             found: injected code that ran, secrets leaked (credential files a sync sent,
             --secret values in files, ps or tmux, a launching shell's values a job file
             took), writes outside the job dir (a marker tree beside it, checked before and
             after every store, restore, shard, stager, rm/prune and data prepare case),
             instances terminated that were not the job's and forged records taken (forged
             job store records), members accepted that EC2 does not list (regroup records).
             The 2026-11-27 sets (audit_surfaces.py) and the 2026-12-01 ones (jobfile2, ckpt,
             images, forged, regroup: audit_surfaces_1201.py) by default; --only picks sets,
             --old-sets adds the 2026-11-23 ones (CLI arguments, config.yaml, state.db,
             CLOUDTRAIN_HOME, user recipes, job-side files, AWS stand-ins)
  --healthy  healthy local jobs killed by concurrent read-only `status`, half of them from
             another hostname (the audit: 0 of 30)
  --orphans  the audit's 10 orphan (billing) scenarios against moto and a loopback sshd
             (audit_lab.py), what is left billing after the documented cleanup, and the
             AWS keys a spot launch's supervisor may leave in $CLOUDTRAIN_HOME (F31)
  --faults   tests/integration/test_faults.py's table (the 2026-11-23 audit's 50 scenarios)
  --results  time from a job's end to its results being readable without the instance
             (benchmarks/job_store_roundtrip.py)

--inputs, --healthy and --orphans run by default (6 to 9 minutes on this 2-core machine, shared,
and about 6 more for the 2026-12-01 sets: --only jobfile2 ckpt images forged regroup took 340 s);
--all adds --faults, --results and the old sets. Every program runs as a fresh process (a
`python -m cloudtrain`, the stager, the checkpoint restore, a driver in audit_drivers.py) in
its own temporary CLOUDTRAIN_HOME and HOME, on a private tmux socket killed afterwards, under
a 2 GB address-space limit (6 GB for those that import torch), with
AWS_EC2_METADATA_DISABLED=true, fake credentials and AWS_ENDPOINT_URL on 127.0.0.1 (a closed
port, a stub that answers AccessDenied / garbage / 500, moto, or a lying HTTP "S3"): nothing
leaves this machine and a user's own jobs are never touched. The corpus is in
benchmarks/audit_cases.py and audit_cases_1201.py.

Each input is sorted as the audits did: TRACEBACK (a Python traceback, the CLI's catch-all
"internal error", or an exception's name as the reason of a refusal), HANG (no exit within
--timeout), a designed error (`Error: ...`, non-zero exit), a click usage error, or ok. An
input that runs several commands takes the worst.

The code measured is a snapshot of HEAD (`git archive`, by default) so that edits made to the
checkout while this runs cannot mix versions; --tree worktree measures the checkout as it is,
--tree DIR another copy.

Usage: python benchmarks/audit_figures.py [--inputs] [--healthy] [--orphans] [--faults]
           [--results] [--all] [--old-sets] [--only SET ...] [--tree HEAD|worktree|REV|DIR]
           [--workers 4] [--timeout 60] [--inputs-budget 660] [--memory-limit-mb 2048]
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
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

import audit_cases as corpus  # noqa: E402
import audit_harness as harness  # noqa: E402
import audit_surfaces as surfaces  # noqa: E402
import audit_surfaces_1201 as surfaces_1201  # noqa: E402
from audit_harness import (FLAW_KINDS, KINDS, PYTHON, ROOT, RUN_ID, Case, Outcome,  # noqa: E402
                           Result, Scratch, closed_port, cloudtrain, isolated_env, kill_tmux,
                           launch_in_case, make_template, replace_with, run_case, short,
                           wait_running, write)


def use_tree(choice: str, scratch: Path) -> str:
    """Measure `choice` (HEAD or another revision exported with `git archive`, `worktree`
    for this checkout, or a directory); returns how to name it in the figures."""
    if choice == "worktree":
        tree, name = ROOT, f"the checkout at {git_head()}"
    elif Path(choice).is_dir():
        tree, name = Path(choice).resolve(), str(Path(choice).resolve())
    else:
        rev = subprocess.run(["git", "rev-parse", "--short", choice], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
        tree = scratch / f"tree-{rev}"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        name = f"commit {rev} ({choice}, exported)"
    harness.TREE = tree
    sys.path.insert(0, str(tree))  # the harness's own imports of cloudtrain (fixtures, labs)
    sys.path.insert(1, str(tree / "tests"))
    return name


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



# -- the 2026-11-23 audit's sets ----------------------------------------------------------------


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
                from cloudtrain import state_schema
                version = state_schema.SCHEMA_VERSION
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


OLD_SETS = {"cli": cli_cases, "config": config_cases, "state": state_cases, "home": home_cases,
            "recipes": recipe_cases, "jobside": jobside_cases, "aws-stubs": aws_cases}
# The 2026-11-27 audit's table, in its order; `relaunch` and `aws` are the lab's (--orphans).
AUDIT_TABLE = ["job files", "injection launches", "metrics x commands", "shards and manifests",
               "stager plans", "restore plans", "job store", "completion", "rm/prune", "sync",
               "secrets", "relaunch", "aws", *surfaces_1201.TABLE]


def new_sets(timeout: float) -> dict:
    """{--only name: builder} of the audits' sets run by default: the 2026-11-27 audit's
    and the new surfaces of the 2026-12-01 one."""
    return {**surfaces.case_sets(timeout), **surfaces_1201.case_sets(timeout)}


def case_sets(args) -> dict:
    return {**new_sets(args.timeout), **OLD_SETS}


# -- part 1: bad inputs ---------------------------------------------------------------------


@dataclasses.dataclass
class InputFigures:
    results: list[Result]
    not_run: int

    @property
    def tried(self) -> int:
        return len(self.results)

    def count(self, kind: str) -> int:
        return sum(r.kind == kind for r in self.results)


def cause(outcome: Outcome) -> str:
    """The exception, without the paths, ids and numbers that differ from case to case."""
    line = outcome.first_line
    match = re.search(r"internal error: (.*?) \(run again with --debug", line)
    text = match[1] if match else line.rsplit(" ... ", 1)[-1]
    text = re.sub(r"'/[^']*'|/\S+", "<path>", text)
    text = re.sub(r"'a{20,}", "'aaa...", text)
    return re.sub(r"\b[0-9a-f]{8}\b|(?<![\w-])\d+(?![\w-])", "N", text)[:100]


def chosen_sets(args) -> list[str]:
    if args.only:
        return args.only
    names = list(new_sets(args.timeout))
    return names + list(OLD_SETS) if args.old_sets else names


def bad_inputs(args) -> InputFigures:
    builders = case_sets(args)
    # round-robin over the sets, so that a spent budget leaves out a little of each
    sets = [builders[name]() for name in chosen_sets(args)]
    cases = [c for group in itertools.zip_longest(*sets) for c in group if c is not None]
    print(f"== bad inputs: {len(cases)} cases in {len(sets)} sets, {args.workers} at a time, "
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
        surfaces.stop_servers()
        kill_tmux(f"{RUN_ID}-template")
        shutil.rmtree(root, ignore_errors=True)

    if args.show:
        for r in results:
            o = r.worst
            print(f"  {r.kind:9} [{r.case.set}] {short(r.case.label, 60)} "
                  f"({len(r.outcomes)} run): "
                  f"{short(o.first_line if o else '', 120)}"
                  + "".join(f"\n            FLAW {k}: {short(t, 100)}" for k, t in r.flaws))
    broken = [r for r in results if r.kind == "harness"]  # not inputs: the harness failed
    results = [r for r in results if r.kind != "harness"]
    by_set: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        by_set[r.case.set][r.kind] += 1
        for flaw, _ in r.flaws:
            by_set[r.case.set][flaw] += 1
    header = (f"{'set':24} {'inputs':>6} {'tracebacks':>10} {'hangs':>5} {'errors':>6} "
              f"{'usage':>5} {'other':>5} {'ok':>5} {'flaws':>5}")
    print(f"\n{header}\n{'-' * len(header)}")
    total = collections.Counter()
    for name, counts in by_set.items():
        total.update(counts)
        print(f"{name:24} {sum(counts[k] for k in KINDS):6} {counts['TRACEBACK']:10} "
              f"{counts['HANG']:5} {counts['error']:6} {counts['usage']:5} {counts['other']:5} "
              f"{counts['ok']:5} {sum(counts[k] for k in FLAW_KINDS):5}")
    print(f"{'total':24} {sum(total[k] for k in KINDS):6} {total['TRACEBACK']:10} "
          f"{total['HANG']:5} {total['error']:6} {total['usage']:5} {total['other']:5} "
          f"{total['ok']:5} {sum(total[k] for k in FLAW_KINDS):5}")
    print(f"({time.monotonic() - start:.0f} s; 'other' = non-zero exit with nothing said, "
          f"listed below; 'flaws' = what the checks found, in the summary; {len(broken)} cases "
          "the harness could not set up are not counted)")
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
            print(f"      $ {short(shlex.join(o.argv), 140)}")
            print(f"      -> exit {o.returncode}: {short(o.first_line)}")
    sent = [r for r in results if r.case.set == "sync" and r.case.label == "home as --workdir"]
    if sent:
        print(f"\nsync, a home as --workdir: {len(sent[0].flaws)} of "
              f"{len(surfaces.credential_files())} credential files reached the job's work dir")
    return InputFigures(results, len(skipped))


# -- part 2: healthy jobs killed by read-only commands -----------------------------------------


@dataclasses.dataclass
class HealthyFigures:
    launched: int
    killed: int
    launch_failures: int
    reader_tracebacks: int
    not_ok: list[dict]


def other_host(argv: list[str]) -> list[str]:
    """argv as run on another machine sharing the home (a container): another hostname, so
    only the launch lease can tell a live launcher (unshare --uts, root only)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return argv
    return ["unshare", "--uts", "sh", "-c", 'hostname ct-audit-other && exec "$@"', "sh",
            *argv]


def healthy_jobs(args) -> HealthyFigures:
    rounds, per_round, readers_per_host = args.rounds, 15, 6
    print(f"\n== healthy jobs: {rounds} rounds of {per_round} parallel local launches "
          f"(`-- true`), {readers_per_host} parallel `status` from this host and "
          f"{readers_per_host} from another hostname during each")
    root = Path(tempfile.mkdtemp(prefix="ct-audit-healthy-"))
    sock = f"{RUN_ID}-healthy"
    env = isolated_env(root, root / "home", sock, f"http://127.0.0.1:{closed_port()}")
    launch_failures, readers = [], []
    start = time.monotonic()
    try:
        for r in range(rounds):
            with concurrent.futures.ThreadPoolExecutor(per_round + 2 * readers_per_host) as pool:
                launches = [pool.submit(cloudtrain, ["launch", "-q", "--name", f"run-{r}-{i}",
                                                     "--", "true"], env, root, args.timeout)
                            for i in range(per_round)]

                def reader(delay, elsewhere):
                    time.sleep(delay)
                    argv = [PYTHON, "-m", "cloudtrain", "status"]
                    return harness.run_process(other_host(argv) if elsewhere else argv, env,
                                               root, args.timeout, shown=["status"])

                statuses = [pool.submit(reader, 0.15 * i, i % 2 == 1)
                            for i in range(2 * readers_per_host)]
                launch_failures += [f.result() for f in launches if f.result().kind != "ok"]
                readers += [f.result() for f in statuses]
        jobs = wait_all_ended(env, root, args.timeout)
    finally:
        kill_tmux(sock)
        harness.kill_left_under(root)
        shutil.rmtree(root, ignore_errors=True)
    not_ok = [j for j in jobs if j["state"] != "succeeded"]
    bad_readers = [o for o in readers if o.kind in ("TRACEBACK", "HANG")]
    print(f"{len(jobs)} jobs recorded of {rounds * per_round} launched, {len(launch_failures)} "
          f"launches failed, {len(readers)} status runs ({sum(o.kind == 'ok' for o in readers)} "
          f"ok, {len(bad_readers)} TRACEBACK/HANG); {time.monotonic() - start:.0f} s")
    print(f"jobs not succeeded: {len(not_ok)}")
    for j in not_ok:
        print(f"  {j['id']} {j.get('name')}: {j['state']}: {j.get('reason')}")
    for o in launch_failures + bad_readers:
        print(f"  {o.kind}: cloudtrain {shlex.join(o.argv)} -> exit {o.returncode}: "
              f"{short(o.first_line)}")
    return HealthyFigures(rounds * per_round, len(not_ok), len(launch_failures),
                          len(bad_readers), not_ok)


def wait_all_ended(env: dict, cwd: Path, timeout: float, seconds: float = 90) -> list[dict]:
    """Every job once none is active any more (or after `seconds`, as they are)."""
    deadline = time.monotonic() + seconds
    while True:
        proc = subprocess.run([PYTHON, "-m", "cloudtrain", "status", "--json", "-a"], env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)
        jobs = json.loads(proc.stdout or "[]")
        active = [j for j in jobs if j["state"] not in ("succeeded", "failed", "cancelled")]
        if not active or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


# -- part 4: the fault-injection table of tests/integration/test_faults.py -----------------------


@dataclasses.dataclass
class FaultFigures:
    scenarios: int | None
    left: int | None
    verdict: str


def faults(args) -> FaultFigures:
    print("\n== faults: fault injection over the AWS path (tests/integration/test_faults.py)")
    if not Path("/usr/sbin/sshd").exists():
        print("openssh-server is not installed (/usr/sbin/sshd): the scenarios cannot run")
        return FaultFigures(None, None, "not run: no openssh-server")
    command = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/integration/test_faults.py"]
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=harness.TREE, capture_output=True, text=True,
                              timeout=args.faults_timeout)
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        output += f"\n(timed out after {args.faults_timeout:.0f} s)"
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
        return FaultFigures(None, None, verdict)
    return FaultFigures(int(match[1]), int(match[2]), verdict)


# -- part 5: results outlive the instance --------------------------------------------------------


def results_time(args) -> str:
    print("\n== results: job end -> results readable without the instance "
          "(benchmarks/job_store_roundtrip.py --runs 3)")
    script = harness.TREE / "benchmarks" / "job_store_roundtrip.py"
    if not script.exists():
        print("benchmarks/job_store_roundtrip.py does not exist")
        return "not measured (no benchmarks/job_store_roundtrip.py)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    try:
        proc = subprocess.run([PYTHON, str(script), "--runs", "3"], cwd=harness.TREE, env=env,
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


# -- the summary, as the audit counted -------------------------------------------------------------


def summary(inputs: InputFigures | None, lab, healthy: HealthyFigures | None) -> None:
    """The audit's "Counts": the per-set table, then one line per figure, each with the cases
    that failed listed under it."""
    results = list(inputs.results) if inputs else []
    if lab:
        results += lab.results
    if results:
        by_set: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in results:
            by_set[r.case.set][r.kind] += 1
        order = [s for s in AUDIT_TABLE if s in by_set] + \
            [s for s in by_set if s not in AUDIT_TABLE]
        flaws: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in results:
            flaws[r.case.set].update(kind for kind, _ in r.flaws)
        # the audit's columns, then what the checks count: secrets leaked, instances left
        # billing, instances terminated that were not the job's, members EC2 does not list
        extra = [("leak", "secrets leaked"), ("left", "left billing"),
                 ("foreign", "not the job's, terminated"), ("member", "members EC2 does not list")]
        print(f"| {'set':22} | {'inputs':>6} | {'tracebacks':>10} | {'hangs':>5} | "
              + " | ".join(title for _, title in extra) + " |")
        print(f"|{'-' * 24}|{'-' * 8}|{'-' * 12}|{'-' * 7}|"
              + "|".join("-" * (len(title) + 2) for _, title in extra) + "|")
        for name in order:
            c = by_set[name]
            print(f"| {name:22} | {sum(c.values()):6} | {c['TRACEBACK']:10} | {c['HANG']:5} | "
                  + " | ".join(f"{flaws[name][kind]:>{len(title)}}" for kind, title in extra)
                  + " |")
        print()
        bad = [r for r in results if r.kind in ("TRACEBACK", "HANG")]
        extra = f" ({inputs.not_run} not run: budget spent)" if inputs and inputs.not_run else ""
        print(f"Bad inputs tried: {len(results)}. Tracebacks: "
              f"{sum(r.kind == 'TRACEBACK' for r in results)}. Hangs: "
              f"{sum(r.kind == 'HANG' for r in results)}.{extra}")
        for r in bad:
            print(f"  - {r.kind} [{r.case.set}] {short(r.case.label, 60)}: "
                  f"{short(r.worst.first_line, 110)}")
    if lab:
        left = [s for s in lab.scenarios if s.left]
        print(f"Orphan (billing) scenarios tried: {len(lab.scenarios)}. Left billing: "
              f"{sum(s.left for s in lab.scenarios)}.")
        for s in left:
            print(f"  - {s.name}: {s.left} left after `{s.cleanup}`: {s.detail}")
        for s in lab.scenarios:
            if s.error:
                print(f"  - {s.name}: NOT MEASURED: {s.error}")
    if healthy:
        print(f"Healthy jobs killed by read-only commands: {healthy.killed} of "
              f"{healthy.launched}" + (f" ({healthy.launch_failures} launches failed)"
                                       if healthy.launch_failures else ""))
        for j in healthy.not_ok:
            print(f"  - {j['id']} {j.get('name')}: {j['state']}: {short(j.get('reason') or '')}")
    if results:
        for kind, title in (("leak", "Secrets leaked"), ("outside", "Writes outside the job dir"),
                            ("injection", "Injected code that ran"),
                            ("foreign", "Instances terminated that were not the job's"),
                            ("member", "Members accepted that EC2 does not list"),
                            ("taken", "Forged records taken as the job's"),
                            ("left", "Instances of a forged-records case left billing"),
                            ("broken", "Other checks failed")):
            found = [(r, text) for r in results for k, text in r.flaws if k == kind]
            print(f"{title}: {len(found)}")
            for r, text in found:
                print(f"  - [{r.case.set}] {short(r.case.label, 60)}: {short(text, 100)}")


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", action="store_true", help="part 1: bad inputs")
    parser.add_argument("--healthy", action="store_true", help="part 2: healthy jobs killed")
    parser.add_argument("--orphans", action="store_true",
                        help="part 3: the audit's orphan scenarios (moto + sshd)")
    parser.add_argument("--faults", action="store_true",
                        help="part 4: tests/integration/test_faults.py's table")
    parser.add_argument("--results", action="store_true", help="part 5: results time")
    parser.add_argument("--all", action="store_true",
                        help="every part, and the 2026-11-23 sets with the inputs")
    parser.add_argument("--only", nargs="*", choices=sorted(
        [*new_sets(0), *OLD_SETS]), help="only these input sets")
    parser.add_argument("--old-sets", action="store_true",
                        help="the 2026-11-23 audit's input sets as well")
    parser.add_argument("--show", action="store_true",
                        help="one line per input case: its kind and what it said")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["inputs", "healthy", "orphans"], help="leave these parts out")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per command before it counts as a HANG")
    parser.add_argument("--tree", default="HEAD",
                        help="the code to measure: HEAD (default) or another git revision, "
                             "exported; `worktree` for this checkout as it is; or a directory")
    parser.add_argument("--inputs-budget", type=float, default=660.0,
                        help="seconds after which no new input case starts")
    parser.add_argument("--memory-limit-mb", type=int, default=2048,
                        help="address space of every program run (0: no limit)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--faults-timeout", type=float, default=420.0)
    parser.add_argument("--results-timeout", type=float, default=240.0)
    args = parser.parse_args()
    parts = ("inputs", "healthy", "orphans", "faults", "results")
    chosen = [p for p in parts if getattr(args, p)]
    if args.all:
        chosen, args.old_sets = list(parts), True
    chosen = [p for p in chosen or ["inputs", "healthy", "orphans"] if p not in args.skip]
    if shutil.which("tmux") is None and {"inputs", "healthy"} & set(chosen):
        raise SystemExit("tmux is not installed: local jobs (parts 1 and 2) need it")
    harness.MEMORY_LIMIT = args.memory_limit_mb << 20

    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="ct-audit-tree-"))
    try:
        measured = use_tree(args.tree, scratch)
        print(f"measuring {measured}")
        inputs = bad_inputs(args) if "inputs" in chosen else None
        healthy = healthy_jobs(args) if "healthy" in chosen else None
        lab = None
        if "orphans" in chosen:
            import audit_lab

            lab = audit_lab.run(args)
        fault = faults(args) if "faults" in chosen else None
        results = results_time(args) if "results" in chosen else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print("\n" + "=" * 78)
    print(f"audit figures, {started:%Y-%m-%d %H:%M} UTC, {time.monotonic() - t0:.0f} s, "
          f"{measured}")
    print(f"$ {shlex.join([Path(PYTHON).name, *sys.argv])}")
    print("the audit of 2026-11-27 counted: 532 bad inputs, 17 tracebacks, 1 hang; 10 orphan "
          "scenarios, 3 left billing;\n0 of 30 healthy jobs killed; secrets leaked: yes; "
          "writes outside the job dir: no.\nthe audit of 2026-12-01 counted on its new sets: "
          "106 inputs, 5 tracebacks (ckpt), 1 hang (regroup, F43);\nsecrets leaked: yes (F39); "
          "an instance terminated that was not the job's: yes (F41); members EC2 does not "
          "list: yes (F42). Now:\n")
    summary(inputs, lab, healthy)
    if fault:
        now = (f"{fault.scenarios} / {fault.left}" if fault.scenarios is not None
               else "not measured")
        print(f"test_faults.py scenarios / left billing: {now} (pytest: {fault.verdict}; "
              "the audit of 2026-11-23: 50 / 10)")
    if results:
        print(f"job end -> results readable: {results}")
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
