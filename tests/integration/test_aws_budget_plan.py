"""cloudtrain/providers/aws/budget_plan.py (issue 38): a job's budget in the plan, its refusal
before anything is paid, the figures its instances keep it with (job.json), and `status` and
`cost-report` setting what was spent against it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import error_line
from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def offline(tmp_path):
    """A dry run with no AWS credentials at all (the plan needs none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               CLOUDTRAIN_HOME=str(tmp_path / "home"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cloudtrain", "launch", *args],
                              cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    return run


def test_issue38_the_plan_sets_the_budget_beside_at_most(offline):
    """The budget's line follows 'at most', says how it is kept (laptop off, the stop's own
    time reserved, spot at the AZ's price up to on-demand) and which of the two binds."""
    proc = offline("--recipe", "resnet9", "--instance", "g6.xlarge", "--spot", "--budget",
                   "$0.40", "--region", "us-east-1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    keys = [line[2:15].strip() for line in proc.stdout.splitlines()[1:] if line.strip()]
    assert keys[keys.index("at most") + 1] == "budget"
    line = " ".join(proc.stdout.split("  budget ", 1)[1].split("\n  ")[0].split())
    assert line.startswith("$0.40, every attempt, volume and staging included; its instances "
                           "keep it with this machine off")
    assert "(about 50 s: the last checkpoint, its upload, the power-off)" in line
    assert re.search(r"at most \$0\.80\d\d/h; it binds before 'at most' \(\$\d+\.\d\d\)", line)
    roomy = offline("--recipe", "resnet9", "--instance", "g6.xlarge", "--spot", "--budget",
                    "500", "--region", "us-east-1", "--dry-run")
    assert re.search(r"'at most' \(\$\d+\.\d\d\) is below it: it cannot bind", roomy.stdout)


@pytest.mark.parametrize("args, expected", [
    (("--budget", "$0.02"), "Error: --budget $0.02: one attempt costs about $0.05 before its "
                            "job could save a checkpoint"),
    (("--budget", "abc"), "Error: --budget 'abc': expected US dollars, e.g. 25 or $25"),
    (("--budget", "0"), "Error: --budget (USD) must be more than 0, got 0.0"),
    (("--budget", "1000000"), "Error: --budget (USD) must be at most 100000"),
])
def test_issue38_a_budget_one_attempt_cannot_fit_or_that_is_not_one_is_refused(
        offline, args, expected):
    proc = offline("--recipe", "resnet9", "--instance", "g6.xlarge", "--spot",
                   "--region", "us-east-1", "--dry-run", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert error_line(proc.stderr).startswith(expected), proc.stderr


def test_issue38_a_budget_on_this_machine_or_a_kept_instance_is_refused(offline, tmp_path):
    proc = offline("--backend", "local", "--budget", "5", "--dry-run", "--", "true")
    assert proc.returncode == 2
    assert error_line(proc.stderr) == ("Error: --budget: the local backend bills nothing; a "
                                       "budget holds a cloud job's instances")


def test_issue38_a_job_file_s_budget_is_the_flag_s(offline, tmp_path):
    (tmp_path / "job.yaml").write_text("budget: $0.50\nrun: echo hi\nresources: {instance: "
                                       "g6.xlarge, spot: true, region: us-east-1}\n")
    proc = offline("job.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "  budget       $0.50, every attempt" in proc.stdout
    (tmp_path / "bad.yaml").write_text("budget: lots\nrun: echo hi\nresources: {instance: "
                                       "g6.xlarge}\n")
    bad = offline("bad.yaml", "--dry-run")
    assert bad.returncode == 2
    assert error_line(bad.stderr) == ("Error: bad.yaml:1: budget: expected US dollars, e.g. 25 "
                                      "or $25, got text 'lots'")


def test_issue38_the_instance_gets_the_figures_and_status_sets_the_spend_against_them(
        cli, aws, ct_home):  # noqa: F811
    """job.json's budget: the type's on-demand price as the bound, its disk and address by
    the hour, the nodes, the stop's reserve; `status JOB` and `cost-report` show the budget
    beside what was spent."""
    proc = cli("launch", "--instance", "g5.xlarge", "--on-demand", "--budget", "$3",
               "--follow", "--quiet", "--", "true")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    settings = json.loads(next(ct_home.glob(f"jobs/{job_id}*/job.json")).read_text())
    meter = settings["budget"]
    assert meter["usd"] == 3.0 and meter["nodes"] == 1 and meter["spot"] is False
    assert meter["instance_per_h"] == pytest.approx(1.006)  # the catalog's us-east-1 price
    assert 0 < meter["other_per_h"] < 0.05 and 30 < meter["reserve_s"] <= 50  # grace: the lab's
    assert meter["spent_before_usd"] == 0.0
    status = cli.ok("status", job_id).stdout
    assert re.search(r"  budget    \$3\.00: ~?\$0\.\d\d spent \(\d+%\)", status), status
    report = cli.ok("cost-report").stdout
    assert "BUDGET" in report and re.search(r"\$3\.00 \(\d+%\)", report), report


@pytest.mark.parametrize("given, expected", [
    ("+6h", "ok"), ("2020-01-01 09:00", "Error: --deadline: 2020-01-01 09:00 is past"),
    ("+5m", "Error: --deadline: "), ("+40d", "Error: --deadline: "),
    ("soon", "Error: --deadline 'soon': expected a time"),
])
def test_issue38_a_deadline_is_a_time_10_minutes_to_30_days_ahead(offline, given, expected):
    proc = offline("--recipe", "resnet9", "--instance", "g6.xlarge", "--spot",
                   "--region", "us-east-1", "--dry-run", "--deadline", given)
    if expected == "ok":
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert error_line(proc.stderr).startswith(expected), proc.stderr


def test_issue38_a_job_file_s_deadline_reads_as_the_flag_s(tmp_path):
    """YAML reads a zoned ISO time as a datetime itself; text, a naive time (local) and +6h
    read as the flag's; anything else is a one-line error naming the file and line."""
    import datetime
    import time

    from cloudtrain.jobfile import deadline_time

    utc = datetime.datetime(2027, 1, 15, 8, 0, tzinfo=datetime.timezone.utc)
    assert deadline_time(utc) == utc.timestamp()
    assert deadline_time("2027-01-15T08:00Z") == utc.timestamp()
    assert deadline_time("2027-01-15 09:00+01:00") == utc.timestamp()
    assert deadline_time("2027-01-15 08:00") == time.mktime((2027, 1, 15, 8, 0, 0, 0, 0, -1))
    assert deadline_time("+1.5h", now=1000.0) == 1000.0 + 5400
    for bad in ("tomorrow", "+", "+x", 7, None, ["2027-01-15"]):
        assert deadline_time(bad) is None
