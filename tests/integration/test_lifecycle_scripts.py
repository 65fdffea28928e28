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
