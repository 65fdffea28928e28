"""The agent re-arms the instance's power-off with what agent_settings tells it (F16): at job
start for every job, and at job end for a kept instance with --idle-minutes. The lab's `sudo`
records each `cloudtrain-rearm N` instead of running it."""

from __future__ import annotations

import os

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.polling import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


def test_F16_each_job_start_rearms_for_its_own_max_runtime(cli, aws):
    proc = cli("launch", "--instance", "g5.xlarge", "--max-runtime", "10", "--follow", "--quiet",
               "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    assert aws.rearms() == ["40"]  # 10 min + the 30-min margin, from job start
    assert "rearm" not in cli.ok("logs", proc.stdout.splitlines()[0]).stdout


def test_F16_a_kept_instance_is_rearmed_for_its_idle_time_after_the_job(cli, aws):
    proc = cli("launch", "--instance", "g5.xlarge", "--max-runtime", "10", "--keep",
               "--idle-minutes", "7", "--follow", "--quiet", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: len(aws.rearms()) == 2, timeout=20, what="the re-arm after the job")
    assert aws.rearms() == ["40", "7"]
    cli.ok("down", proc.stdout.splitlines()[0])
