"""The job's script (run.sh, cloudtrain/lifecycle/scripts.py) on the local backend: the command
is data, never shell code (F1)."""

from __future__ import annotations

import sys


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

    spec = JobSpec(kind=RECIPE, backend="aws", recipe="resnet9",
                   args={"epochs": 2, "resume": False}, recover=True)
    first = _run_sh_args(tmp_path, spec, marker=False)
    assert first == "recipes/resnet9/train.py --epochs 2 --resume false\n"
    resumed = _run_sh_args(tmp_path, spec, marker=True)
    assert resumed == "recipes/resnet9/train.py --epochs 2 --resume true\n"
    # Not recovering, or resuming already (the local supervisor's relaunch): no marker test.
    for other in (JobSpec(kind=RECIPE, backend="aws", recipe="resnet9", args={"epochs": 2}),
                  JobSpec(kind=RECIPE, backend="aws", recipe="resnet9", recover=True,
                          args={"epochs": 2, "resume": True})):
        with_marker = _run_sh_args(tmp_path, other, marker=True)
        assert with_marker == _run_sh_args(tmp_path, other, marker=False)
        assert with_marker.count("--resume") == other.args.get("resume", 0)
