"""The audit benchmark (benchmarks/audit_harness.py, audit_surfaces.py, audit_figures.py)
keeps working: every set's cases build, one of each set of the 2026-11-27 audit runs as the
benchmark runs it, and its checks can find a flaw. (The bad inputs it found, F10, F19, F23
and their kin, are tested with the code they reached: test_aws_errors.py,
test_lifecycle_watch.py, test_recipes.py, test_cli_errors.py.)"""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

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
