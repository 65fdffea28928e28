"""Bad inputs that benchmarks/audit_figures.py found still ending in "internal error" (F19,
F22, F23, F25 leftovers, and F10's kin: an endpoint that is not AWS): each is now one
designed line. And the benchmark's own corpus: every set's cases build, one of each set of
the 2026-11-27 audit runs as the benchmark runs it, and its checks can find a flaw."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import sys
import time

import pytest

from conftest import REPO

from labs.credentials import KEYS_ENV
from labs.loopback import serve
from labs.polling import wait_for


def test_a_job_reference_that_is_not_utf8_is_no_job(cli):
    for command in ("status", "logs", "down"):
        proc = cli(command, "\udcff")  # what Python makes of a lone 0xff byte in argv
        assert proc.returncode == 2 and "no job" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr


def test_a_workdir_name_too_long_is_a_usage_error(cli):
    proc = cli("launch", "-q", "--workdir", "a" * 100_000, "--", "true")
    assert proc.returncode == 2 and "File name too long" in proc.stderr, proc.stderr


def test_F23_published_results_given_as_numbers_are_listed(cli, tmp_path, monkeypatch):
    root = tmp_path / "recipes" / "numbers"
    root.mkdir(parents=True)
    (root / "train.py").write_text("print('x')\n")
    (root / "recipe.yaml").write_text(
        "name: numbers\ndescription: d\nentry: train.py\narguments: {}\n"
        "published: [{result: 1, time: 2, hardware: 3}]\n")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(tmp_path / "recipes"))
    proc = cli.ok("recipes")
    assert "numbers" in proc.stdout and "1 / 2 / 3" in proc.stdout


@pytest.fixture
def dead_agent_job(cli, ct_home):
    """A running local job whose agent was killed: the next status reaps it."""
    job_id = cli.launch("--", "sleep", "30")
    jobdir = ct_home / "jobs" / job_id
    status = wait_for(lambda: json.loads((jobdir / "status.json").read_text())
                      if (jobdir / "status.json").exists() else None, what="status.json")
    os.killpg(status["pgid"], signal.SIGKILL)
    os.kill(status["agent_pid"], signal.SIGKILL)
    time.sleep(0.3)
    return job_id, jobdir


@pytest.mark.parametrize("damage", ["status.json is a directory", "output.log is a directory",
                                    "the job directory is gone"])
def test_F19_a_broken_job_directory_never_breaks_status(cli, dead_agent_job, damage):
    job_id, jobdir = dead_agent_job
    if damage == "the job directory is gone":
        shutil.rmtree(jobdir)
    else:
        name = damage.split()[0]
        (jobdir / name).unlink()
        (jobdir / name).mkdir()
    for args in (("status",), ("status", job_id), ("status", "--json"), ("logs", job_id)):
        proc = cli(*args)
        assert "internal error" not in proc.stderr, (args, proc.stderr)
    assert cli.job(job_id)["state"] in ("failed", "running")


class _Portal(http.server.BaseHTTPRequestHandler):
    """A captive portal: 200 and an HTML page, whatever is asked."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<html><body>Please log in to the hotel Wi-Fi</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


def test_F10_an_endpoint_answering_html_is_said_not_crashed_on(cli, ct_home, monkeypatch):
    url, server = serve(_Portal)
    try:
        env = {"AWS_ENDPOINT_URL": url, **KEYS_ENV, "AWS_DEFAULT_REGION": "us-east-1"}
        for args in (("status", "--refresh"), ("down", "--all", "-y"),
                     ("catalog", "--refresh", "--region", "us-east-1")):
            proc = cli(*args, env=env)
            assert "internal error" not in proc.stderr, (args, proc.stderr)
            assert proc.returncode == 1 and "not an AWS reply" in proc.stdout + proc.stderr, \
                (args, proc.stdout, proc.stderr)
    finally:
        server.shutdown()


# -- the benchmark's own corpus keeps working ------------------------------------------------------

BENCHMARKS = REPO / "benchmarks"
# One case of each set of the 2026-11-27 audit, run as the benchmark runs it: (set, label,
# the kind it must end as)
SAMPLE = [
    ("jobfiles", "alias bomb 9 levels in name", "error"),
    ("injection", "--env value [newline]", "ok"),
    ("metrics", "metrics.jsonl a FIFO | metrics {job}", "ok"),
    ("shards", "shard: member ../../../evil", "error"),
    ("shards", "manifest: NaN", "error"),
    ("stager", "object path ..", "error"),
    ("restore", "symlink at output.log", "error"),
    ("jobstore", "link checkpoints -> outside in the local dir", "ok"),
    ("completion", "multi-line run through zsh", "ok"),
    ("rmprune", "rm a job whose dir is a symlink", "ok"),
    ("sync", "home as --workdir", "ok"),
    ("secrets", "--secret KEY=VALUE", "ok"),
]


@pytest.fixture(scope="module")
def audit():
    """benchmarks/audit_{harness,surfaces,figures}.py, measuring this checkout."""
    sys.path.insert(0, str(BENCHMARKS))
    import audit_figures
    import audit_harness
    import audit_surfaces

    audit_harness.TREE = REPO
    yield audit_harness, audit_surfaces, audit_figures
    audit_surfaces.stop_servers()
    sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def runner(audit, tmp_path_factory):
    """run(case): one case as the benchmark runs it, in its own scratch directory."""
    harness, _, figures = audit
    root = tmp_path_factory.mktemp("audit")
    urls, servers = figures.start_stubs()
    template = harness.make_template(root, urls[None], 60)
    numbers = iter(range(10_000))
    yield lambda case: harness.run_case(case, next(numbers), template, root, urls, 60)
    for server in servers:
        server.shutdown()
    harness.kill_tmux(f"{harness.RUN_ID}-template")


def test_every_set_of_the_audit_benchmark_builds_its_cases(audit):
    """benchmarks/audit_figures.py: each set's builder makes its cases (nothing runs), every
    label is its set's once, and the 2026-11-27 audit's sets are all there."""
    _, surfaces, figures = audit
    sets = {**surfaces.case_sets(60), **figures.OLD_SETS}
    assert set(surfaces.case_sets(60)) >= {s for s, _, _ in SAMPLE}
    for name, build in sets.items():
        cases = build()
        assert cases, name
        labels = [c.label for c in cases]
        assert len(labels) == len(set(labels)), (name, [l for l in labels if labels.count(l) > 1])
    for build in surfaces.case_sets(60).values():  # a row of the audit's table each
        (row,) = {c.set for c in build()}
        assert row in figures.AUDIT_TABLE, row


@pytest.mark.parametrize("name, label, kind", SAMPLE, ids=[f"{s}: {l}" for s, l, _ in SAMPLE])
def test_a_case_of_each_audit_set_runs_as_designed(audit, runner, name, label, kind):
    """One case of each set, run as the benchmark runs it: the kind the code answers today
    (never a traceback or a hang), and none of the set's checks finds a flaw."""
    _, surfaces, _ = audit
    (case,) = [c for c in surfaces.case_sets(60)[name]() if c.label == label]
    result = runner(case)
    assert result.kind == kind, [(o.argv, o.returncode, o.stderr[-500:]) for o in result.outcomes]
    assert result.flaws == []


def test_the_audit_benchmark_sees_a_write_outside_an_injection_and_a_leak(audit, runner):
    """The checks can fail: a case that writes beside the job dir, makes a marker file and
    plants a credential in a job's work dir gets the three flaws."""
    harness, surfaces, _ = audit

    def misbehave(s):
        (s.outside / "victim.txt").write_text("overwritten\n")
        (s.dir / "PWN-1").write_text("")
        harness.write(s.home / "jobs" / "x" / "work" / ".npmrc", "audit-credential-07 .npmrc\n")
        return None

    def check(s):
        harness.check_markers(s)
        surfaces.check_credentials(s)

    case = harness.Case("test", "misbehaves", [misbehave], check=check, allowed=("home",))
    result = runner(case)
    assert sorted(result.flaws) == [("injection", "PWN-1 was created"),
                                    ("leak", ".npmrc reached the job's work dir"),
                                    ("outside", "PWN-1 written"),
                                    ("outside", "outside/victim.txt changed")]
