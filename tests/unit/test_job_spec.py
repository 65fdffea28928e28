"""JobSpec (cloudtrain/job_spec.py): what the user asked, and the facts derived from it alone."""

from __future__ import annotations

import subprocess
import sys

from cloudtrain.job_spec import COMMAND, RECIPE, JobSpec
from conftest import REPO


def test_output_paths_are_below_the_working_directory_for_own_code_and_workdir_recipes():
    """Named outputs (`--output`) relative to the job directory on the host: a recipe's
    below it, own code's (and a recipe run from a synced working directory) below work/."""
    outs = ["runs/best.pt", "plots"]
    assert JobSpec(kind=RECIPE, backend="local", outputs=outs).output_paths() == outs
    assert JobSpec(kind=RECIPE, backend="local", workdir="/w", outputs=outs).output_paths() \
        == ["work/runs/best.pt", "work/plots"]
    assert JobSpec(kind=COMMAND, backend="local", command=["true"],
                   outputs=outs).output_paths() == ["work/runs/best.pt", "work/plots"]
    assert JobSpec(kind=COMMAND, backend="local", command=["true"]).output_paths() == []


def test_reading_jobs_loads_none_of_the_instances_code():
    """`status` and `status JOB` (polled by scripts and by every waiting test) imported the
    whole instance side (host/bootstrap.py and what it ships: the stager, Auto Scaling,
    regroup) through kept -> collect -> scripts, for one helper on the spec: 0.3 to 0.4 s of
    each call's 0.8 s here."""
    code = ("import sys; import cloudtrain.lifecycle.kept, cloudtrain.lifecycle.inspect, "
            "cloudtrain.lifecycle.watch; "
            "print(sorted(m for m in sys.modules if m in ('cloudtrain.host.bootstrap', "
            "'cloudtrain.lifecycle.scripts')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == "[]"
