"""The audit benchmark (benchmarks/audit_harness.py, audit_surfaces.py, audit_surfaces_1201.py,
audit_figures.py) keeps working: every set's cases build, one of each set of the 2026-11-27
audit and a few of each set of the 2026-12-01 audit's new surfaces (jobfile2, ckpt, images,
forged records, regroup members) run as the benchmark runs them, its checks can find a flaw,
and its table keeps the audit's columns. (The bad inputs it found, F10, F19, F23, F39, F41,
F42, F46, F48 and their kin, are tested with the code they reached: test_aws_errors.py,
test_lifecycle_watch.py, test_recipes.py, test_cli_errors.py, test_cli_launching.py,
test_lifecycle_autoscaled.py, test_regroup_s3.py, test_recipes_common.py,
test_imagenet_files.py.)"""

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
F39 = "the audit's F39 file: secrets AWS secret key, session token, GitHub token"
ASKED = "secrets: {GITHUB_TOKEN: null} (not a cloud's: asked)"
# A few cases of each set of the 2026-12-01 audit's new surfaces (F39, F46, F48, F41, F42):
# the kind each ends as today, with no flaw found (values the shell holds reach nothing,
# no code ran, no link reaches DEST, no instance but the job's ends, no member EC2 does not
# list is met); the controls show that what is designed still works.
SAMPLE_1201 = [
    ("jobfile2", f"{F39} [no terminal, -y]", "error"),
    ("jobfile2", f"{ASKED} [terminal, Enter]", "error"),
    ("jobfile2", f"{ASKED} [terminal, answered y]", "ok"),
    ("jobfile2", "YAML: a %TAG directive for python tags", "error"),
    ("ckpt", "load: os.system reduce", "error"),
    ("ckpt", "load: stride-0 view of 10^14", "error"),
    ("ckpt", "resnet9 --resume: step 10^18", "error"),
    ("images", "x.JPEG -> ~/.ssh/id_ed25519 in train", "ok"),
    ("images", "a 144 Mpx PNG of about 100 KB", "error"),
    ("forged", "attempts/2.json names an untagged instance (prod-database)", "ok"),
    ("forged", "final.json (succeeded) naming prod-database", "ok"),
    ("forged", "a true replacement by AWS (control)", "ok"),
    ("regroup", "b overwrites rank 0's record with 203.0.113.66:4444", "error"),
    ("regroup", "b rewrites c's record with iface lo", "ok"),
    ("regroup", "three honest nodes (control)", "ok"),
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
def new_surfaces(audit):
    import audit_surfaces_1201

    return audit_surfaces_1201


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
    sets = {**figures.new_sets(60), **figures.OLD_SETS}
    assert set(surfaces.case_sets(60)) >= {s for s, _, _ in SAMPLE}
    assert set(figures.new_sets(60)) >= {"jobfile2", "ckpt", "images", "forged", "regroup"}
    for name, build in sets.items():
        cases = build()
        assert cases, name
        labels = [c.label for c in cases]
        assert len(labels) == len(set(labels)), (name, [l for l in labels if labels.count(l) > 1])
    for build in figures.new_sets(60).values():  # a row of the audit's table each
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


@pytest.mark.parametrize("name, label, kind", SAMPLE_1201,
                         ids=[f"{s}: {l}" for s, l, _ in SAMPLE_1201])
def test_a_few_cases_of_each_new_surface_run_as_designed(new_surfaces, runner, name, label,
                                                         kind):
    """F39, F46, F48, F41, F42: a few cases of each set the 2026-12-01 audit ran on its new
    surfaces, run as the benchmark runs them: the kind the code answers today (never a
    traceback or a hang) and no flaw its checks count."""
    (case,) = [c for c in new_surfaces.case_sets(60)[name]() if c.label == label]
    result = runner(case)
    assert result.kind == kind, [(o.argv, o.returncode, o.stderr[-800:], o.stdout[-300:])
                                 for o in result.outcomes]
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


def test_the_new_checks_see_a_shells_value_an_instance_not_the_jobs_and_a_member(
        audit, new_surfaces, runner):
    """The checks of the new sets can fail: a launching shell's value in a job's log (a job
    file's case), and a driver's FLAW lines (an instance not the job's terminated, a member
    EC2 does not list) are counted, each as its kind; a line of no known kind is not."""
    harness, _, _ = audit
    import audit_cases_1201 as corpus

    text, modes = corpus.SECRET_FILES[ASKED]
    real = new_surfaces.secret_case(ASKED, text, modes[0])

    def misbehave(s):
        harness.write(s.home / "jobs" / "x" / "output.log",
                      f"got {corpus.MARKERS['GITHUB_TOKEN']}\n")
        return harness.Outcome("ok", ["(driver) forged"], 0, "", 0.0, stdout=(
            "FLAW foreign: i-1 (us-east-1), not the job's, is terminated after release\n"
            "FLAW member: rank 0: i-2 at 8.8.8.8\nFLAW unheard-of: x\nFLAW left\n"))

    def check(s):
        new_surfaces.driver_flaws(s)
        real.check(s)

    result = runner(harness.Case("test", "misbehaves", [misbehave], check=check))
    assert sorted(result.flaws) == [
        ("foreign", "i-1 (us-east-1), not the job's, is terminated after release"),
        ("leak", "GITHUB_TOKEN's value is in home/jobs/x/output.log"),
        ("member", "rank 0: i-2 at 8.8.8.8")]


def test_the_table_keeps_the_audits_columns_and_adds_the_new_checks(audit, capsys):
    """audit_figures.summary: the audit's columns (set, inputs, tracebacks, hangs), then the
    counts of secrets leaked, instances left billing, instances terminated that were not the
    job's and members EC2 does not list, a row per set in the audit's order; and a line for
    each of those figures."""
    harness, _, figures = audit

    def result(set_name, kind, *flaws):
        said = harness.Outcome(kind, ["status"], 1, f"{kind} said", 0.0)
        return harness.Result(harness.Case(set_name, f"{set_name} {kind} {flaws}", []), kind,
                              [said], list(flaws))

    results = [result("regroup members", "ok", ("member", "rank 0: i-2")),
               result("forged records", "ok", ("foreign", "i-1"), ("taken", "final.json")),
               result("forged records", "error", ("left", "i-3")),
               result("jobfile2", "TRACEBACK", ("leak", "A's value is in x")),
               result("ckpt", "HANG")]
    figures.summary(figures.InputFigures(results, 0), None, None)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "set", "jobfile2", "ckpt", "forged records", "regroup members"]
    assert [c.strip() for c in rows[0].split("|")[1:-1]] == [
        "set", "inputs", "tracebacks", "hangs", "secrets leaked", "left billing",
        "not the job's, terminated", "members EC2 does not list"]
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in rows[1:]}
    assert cells == {"jobfile2": ["1", "1", "0", "1", "0", "0", "0"],
                     "ckpt": ["1", "0", "1", "0", "0", "0", "0"],
                     "forged records": ["2", "0", "0", "0", "1", "1", "0"],
                     "regroup members": ["1", "0", "0", "0", "0", "0", "1"]}
    for line in ("Bad inputs tried: 5. Tracebacks: 1. Hangs: 1.", "Secrets leaked: 1",
                 "Instances terminated that were not the job's: 1",
                 "Members accepted that EC2 does not list: 1",
                 "Forged records taken as the job's: 1",
                 "Instances of a forged-records case left billing: 1"):
        assert line in out, (line, out)


def test_the_orphan_lab_relaunch_simulation_runs_against_todays_lifecycle():
    """audit_lab.py's F30 scenario (a supervisor killed mid-relaunch in a second region) runs
    the lifecycle's own functions in a process of its own; after they moved (launcher_died to
    watch.py) it printed NOT MEASURED with a traceback and the benchmark still exited 0. Here
    it measures: one live instance after the fault, and after the next supervisor only the
    job's attempt 2."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLOUDTRAIN_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"),
                                         str(REPO / "tests" / "integration")])
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "audit_lab.py"), "relaunch",
                           "other"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["after_fault"] == 1
    assert [(region, attempt) for region, _, attempt in figures["live"]] == [("us-west-2", "2")]
