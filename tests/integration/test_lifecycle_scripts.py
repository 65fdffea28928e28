"""The job's script (run.sh, cloudtrain/lifecycle/scripts.py) on the local backend: the command
is data, never shell code (F1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cloudtrain.lifecycle.scripts import run_script, threads_line
from cloudtrain.spec import JobSpec


def test_F1_a_newline_in_an_argument_is_data_not_shell_code(cli, ct_home, tmp_path):
    pwned = tmp_path / "pwned-argv"
    job_id = cli.launch("--", "echo", f"x\ntouch {pwned} #")
    assert cli.wait(job_id)["state"] == "succeeded"
    assert cli.ok("logs", job_id).stdout == f"x\ntouch {pwned} #\n"
    assert not pwned.exists()
    run_sh = (ct_home / "jobs" / job_id / "run.sh").read_text()
    assert run_sh.splitlines()[1] == "set -e"  # before anything derived from input


def test_F1_multi_line_python_and_one_string_scripts_run_once_in_the_workdir(cli, ct_home):
    job_id = cli.launch("--", sys.executable, "-c", 'import sys\nprint("hello from python")')
    assert cli.wait(job_id)["state"] == "succeeded"
    assert cli.ok("logs", job_id).stdout == "hello from python\n"

    job_id = cli.launch("--", "echo LINE1 in $PWD\necho LINE2 in $PWD")
    assert cli.wait(job_id)["state"] == "succeeded"
    work = ct_home / "jobs" / job_id / "work"
    assert cli.ok("logs", job_id).stdout == f"LINE1 in {work}\nLINE2 in {work}\n"


def _run_sh_args(tmp_path, spec, marker: bool) -> str:
    """What the recipe is started with by run.sh (its interpreter a stub printing them), in
    a job directory whose name needs quoting, with or without bootstrap's RESUME marker."""
    import os
    import subprocess

    from cloudtrain.host import bootstrap
    from cloudtrain.lifecycle import scripts

    jobdir = tmp_path / "jobs it's $HOME"
    jobdir.mkdir(exist_ok=True)
    stub = tmp_path / "stub"
    stub.write_text('#!/bin/sh\necho "$*"\n')
    stub.chmod(0o755)
    (jobdir / bootstrap.RESUME).unlink(missing_ok=True)
    if marker:
        (jobdir / bootstrap.RESUME).write_text("{}")
    (jobdir / "run.sh").write_text(scripts.run_script(spec, str(jobdir), str(stub)))
    done = subprocess.run(["bash", str(jobdir / "run.sh")], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]}, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def test_a_recovering_recipe_resumes_where_bootstrap_restored_a_checkpoint(tmp_path):
    """Issue 27: the bundle holds attempt 1's run.sh; on a replacement whose bootstrap
    restored a checkpoint (its RESUME marker) the same run.sh adds the recipe's resume
    argument, once; without the marker it runs as before and says nothing."""
    from cloudtrain.spec import RECIPE, JobSpec

    spec = JobSpec.of(kind=RECIPE, backend="aws", recipe="resnet9",
                   args={"epochs": 2, "resume": False}, recover=True)
    first = _run_sh_args(tmp_path, spec, marker=False)
    assert first == "recipes/resnet9/train.py --epochs 2 --resume false\n"
    resumed = _run_sh_args(tmp_path, spec, marker=True)
    assert resumed == "recipes/resnet9/train.py --epochs 2 --resume true\n"
    # Not recovering, or resuming already (the local supervisor's relaunch): no marker test.
    for other in (JobSpec(kind=RECIPE, backend="aws", recipe="resnet9", args={"epochs": 2}),
                  JobSpec.of(kind=RECIPE, backend="aws", recipe="resnet9", recover=True,
                          args={"epochs": 2, "resume": True})):
        with_marker = _run_sh_args(tmp_path, other, marker=True)
        assert with_marker == _run_sh_args(tmp_path, other, marker=False)
        assert with_marker.count("--resume") == other.args.get("resume", 0)


# ---------------------------------------------------------------------------------------------
# issue 28: torch's threads per process, run.sh's threads line


def _threads_after(line: str, env: dict) -> tuple[str, str]:
    """OMP_NUM_THREADS and CLOUDTRAIN_CORES after run.sh's threads line, run by bash."""
    out = subprocess.run(["bash", "-c", line + '\necho "${OMP_NUM_THREADS}|${CLOUDTRAIN_CORES:-}"'],
                         env=env, capture_output=True, text=True, check=True).stdout
    omp, cores = out.strip().split("|")
    return omp, cores


@pytest.mark.parametrize("procs", [1, 2, 64])
def test_a_recipes_run_sh_gives_each_process_its_share_of_the_cores(procs):
    spec = JobSpec(kind="recipe", backend="local", recipe="resnet9")
    text = run_script(spec, "/tmp/ct-job", sys.executable, procs=procs)
    line = [l for l in text.splitlines() if "OMP_NUM_THREADS" in l]
    assert len(line) == 1 and text.index(line[0]) < text.index("\nexec ")
    cores = len(os.sched_getaffinity(0))
    omp, told = _threads_after(line[0], {"PATH": os.environ["PATH"]})
    assert (omp, told) == (str(max(1, cores // procs)), str(cores))


def test_the_jobs_own_omp_num_threads_wins_over_the_threads_line():
    line = threads_line(1)
    assert _threads_after(line, {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "3"}) == ("3", "")


def test_own_code_is_left_to_its_own_threads():
    """An own-code job may start its processes itself: its count is not cloudtrain's."""
    spec = JobSpec(kind="command", backend="local", command=["python", "x.py"])
    assert "OMP_NUM_THREADS" not in run_script(spec, "/tmp/ct-job", sys.executable, procs=2)


def test_a_job_files_omp_num_threads_reaches_the_recipe_and_its_startup_row(cli, ct_home,
                                                                             tmp_path,
                                                                             monkeypatch):
    """End to end on the local backend: the job file's envs set OMP_NUM_THREADS=1; the
    recipe's startup row says 1 thread, the job's own choice, and `status JOB` says it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (tmp_path / "job.yaml").write_text(
        "name: threads-own\nrecipe: resnet9\nprofile: smoke\n"
        "args: {synthetic_train: 256, synthetic_test: 128, epochs: 1}\n"
        "envs: {OMP_NUM_THREADS: '1'}\n")
    cli.ok("launch", str(tmp_path / "job.yaml"), "--follow", "--quiet", timeout=300)
    job = cli.job("threads-own")
    assert job["state"] == "succeeded"
    rows = [json.loads(line) for line in
            (ct_home / "jobs" / job["id"] / "metrics.jsonl").read_text().splitlines()]
    row = [r for r in rows if r.get("event") == "startup"][0]
    assert (row["threads"], row["threads_from"]) == (1, "job")
    assert "torch threads 1 (the job's OMP_NUM_THREADS)" in cli.ok("status",
                                                                    "threads-own").stdout


def test_on_this_machine_the_launching_shells_omp_num_threads_is_the_jobs(monkeypatch):
    """The tmux server may be older than the shell: the shell's choice travels in job.json."""
    from cloudtrain.lifecycle.scripts import job_environment
    from cloudtrain.local_host import LocalHost

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert job_environment("j", "/d", LocalHost())["OMP_NUM_THREADS"] == "1"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "OMP_NUM_THREADS" not in job_environment("j", "/d", LocalHost())
