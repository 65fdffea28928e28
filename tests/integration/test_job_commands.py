"""Every command on a job sees its current state; job names and arguments; clean failures
(issue 14: D8, D9, D11, D12, D13, D18, D19, D25, D26, D32, D33, D38, D40 of the findings of
2026-11-23). The real CLI, real tmux jobs; AWS ones against moto with a real sshd."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.terminal import run_in_terminal
from conftest import REPO, TOY_RECIPE
from labs.polling import wait_for


def _ended_unseen(ct_home: Path, job_id: str, timeout: float = 20) -> None:
    """Wait until the job's agent says it ended, reading its status.json directly, so that
    no cloudtrain command has refreshed the job's record before the one under test."""
    path = ct_home / "jobs" / job_id / "status.json"

    def ended():
        try:
            return json.loads(path.read_text()).get("state") in ("succeeded", "failed")
        except (OSError, ValueError):
            return False

    wait_for(ended, timeout=timeout, what=f"job {job_id} to end")


def _store_state(ct_home: Path, job_id: str) -> str:
    import sqlite3

    db = sqlite3.connect(ct_home / "state.db")
    try:
        return db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
    finally:
        db.close()


# -- names and arguments ------------------------------------------------------------------------


def test_d18_u4_a_finished_jobs_name_goes_to_the_newest_launch(cli, toy_recipes):
    """U4: a name held by a finished job is taken by the next launch of that name (the newest
    wins, as dstack's apply does): a job file with `name:` runs again and again. The earlier
    job keeps its id and its record."""
    first = cli("launch", "--recipe", "toy", "--set", "lr=0.25", "--set", "mode=slow",
                "--name", "dawn24", "--follow", "--quiet")
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.split()[0]
    dry = cli.ok("launch", "--recipe", "toy", "--name", "dawn24", "--dry-run").stdout
    assert f"dawn24 now names job {first_id} (succeeded); this job takes the name" in dry
    again = cli("launch", "--recipe", "toy", "--name", "dawn24", "--follow", "--quiet")
    assert again.returncode == 0, again.stderr
    second_id = again.stdout.split()[0]
    assert second_id != first_id
    assert f"the name dawn24 moves from job {first_id} (succeeded) to this one" in again.stderr
    assert cli.job("dawn24")["id"] == second_id  # the name is the newest job's
    jobs = {j["id"]: j for j in json.loads(cli.ok("status", "--json").stdout)}
    assert set(jobs) == {first_id, second_id}
    # WHAT: the arguments that differ from the recipe's (after the profile) ...
    assert jobs[first_id]["command"] == "toy lr=0.25 mode=slow"
    row = [l for l in cli.ok("status").stdout.splitlines() if first_id in l][0]
    assert "toy lr=0.25 mode=slow" in row
    # ... and `status JOB` has them all, as the script got them.
    detail = cli.ok("status", first_id).stdout
    assert "  args      epochs=2 lr=0.25 mode=slow resume=false\n" in detail


def test_d18_u4_an_active_jobs_name_is_refused(cli, toy_recipes):
    """D18 still holds while the job of that name has not finished: two live jobs never share
    a name (`down NAME` would not know which)."""
    sleeper = cli.launch("--name", "busy", "--", "sleep", "60")
    again = cli("launch", "--recipe", "toy", "--name", "busy")
    assert again.returncode == 2
    assert again.stderr.splitlines()[0] == (
        f"Error: --name busy: job {sleeper} (running) has that name and has not finished")
    assert "cloudtrain down busy" in again.stderr and "--name busy-2" in again.stderr
    dry = cli("launch", "--recipe", "toy", "--name", "busy", "--dry-run")
    assert dry.returncode == 2 and "has not finished" in dry.stderr
    assert [j["id"] for j in json.loads(cli.ok("status", "--json").stdout)] == [sleeper]
    cli.ok("down", "busy")


def test_u4_a_job_file_runs_again_and_again(cli, tmp_path):
    """U4: `cloudtrain launch cloudtrain.yaml` twice (the file init writes has a name:)."""
    job = tmp_path / "proj" / "cloudtrain.yaml"
    job.parent.mkdir()
    job.write_text("name: my-training-run\nrun: echo hello from the file\n")
    ids = []
    for _ in range(3):
        proc = cli("launch", str(job), "--follow", "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert "hello from the file" in proc.stdout
        ids.append(proc.stdout.split()[0])
    assert len(set(ids)) == 3 and cli.job("my-training-run")["id"] == ids[-1]


def test_d18_profile_and_arguments_in_what(cli, toy_recipes):
    dry = cli.ok("launch", "--recipe", "toy", "--profile", "smoke", "--set", "epochs=1",
                 "--set", "tag=a b", "--dry-run").stdout
    # epochs=1 is what the smoke profile sets already: not shown; the tag is quoted
    assert "toy (smoke) tag='a b'" in dry


def test_d19_hex_names_are_refused_and_an_exact_name_beats_an_id_prefix(cli, ct_home):
    proc = cli("launch", "-q", "--name", "19a3", "--", "echo", "hi")
    assert proc.returncode == 2
    assert "--name 19a3: a name of hex digits reads as a job id prefix" in proc.stderr
    # A store from before that check may hold such a name: the exact name wins.
    from cloudtrain.state import open_store

    store = open_store(ct_home)
    older = store.create_job(name=None, kind="command", recipe=None, command="true",
                             backend="local", spec={})
    named = store.create_job(name=older.id[:4], kind="command", recipe=None, command="false",
                             backend="local", spec={})
    assert store.find_job(older.id[:4]).id == named.id
    assert store.find_job(older.id[:5]).id == older.id  # a longer prefix is no name
    assert store.find_job(older.id).id == older.id


# -- every command refreshes the job first ------------------------------------------------------


def test_d13_attach_right_after_the_job_ended_says_so(cli, ct_home):
    job_id = cli.launch("--", "true")
    _ended_unseen(ct_home, job_id)
    assert _store_state(ct_home, job_id) == "running"  # nobody looked yet
    proc = cli("attach", job_id)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"Error: job {job_id} has ended (succeeded)",
                                        f"Hint: cloudtrain logs {job_id}"]
    ssh = cli("ssh", job_id)
    assert ssh.returncode == 2 and f"job {job_id} has ended (succeeded)" in ssh.stderr


def test_d40_attach_without_a_terminal_says_to_use_logs(cli):
    job_id = cli.launch("--", "sleep", "30")
    try:
        proc = cli("attach", job_id)
        assert proc.returncode == 2
        assert proc.stderr.strip() == (f"Error: attach needs a terminal; use cloudtrain logs "
                                       f"{job_id} -f")
    finally:
        cli.ok("down", job_id)


def test_d12_resume_right_after_the_source_ended(cli, ct_home, toy_recipes):
    first = cli.launch("--recipe", "toy", "--set", "epochs=2")
    _ended_unseen(ct_home, first)
    proc = cli("launch", "--recipe", "toy", "--set", "epochs=3", "--resume-from", first,
               "--follow")
    assert proc.returncode == 0, proc.stderr
    assert "resuming from epoch 2" in proc.stdout
    assert "cloudtrain down" not in proc.stderr


def test_d33_resume_with_an_argument_the_checkpoint_is_tied_to_is_refused_before_launch(
        cli, toy_recipes):
    (toy_recipes / "toy" / "recipe.yaml").write_text(TOY_RECIPE + "resume_must_match: [epochs]\n")
    first = cli("launch", "--recipe", "toy", "--set", "epochs=2", "--follow", "--quiet")
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.split()[0]
    proc = cli("launch", "--recipe", "toy", "--set", "epochs=4", "--resume-from", first_id)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"Error: --resume-from {first_id}: its checkpoint was written with epochs=2, this run "
        f"has epochs=4; recipe toy resumes only with the same epochs",
        "Hint: --set epochs=2"]
    assert len(json.loads(cli.ok("status", "--json").stdout)) == 1  # nothing launched
    ok = cli("launch", "--recipe", "toy", "--set", "epochs=2", "--resume-from", first_id,
             "--follow")
    assert ok.returncode == 0, ok.stderr


def test_d33_resnet9_declares_what_its_checkpoint_is_tied_to():
    """What resnet9's train.py refuses on resume, its recipe.yaml declares for the check
    before launch."""
    from cloudtrain import recipes

    declared = recipes.load("resnet9").resume_must_match
    source = (REPO / "recipes" / "resnet9" / "train.py").read_text()
    start = source.index("MUST_MATCH_ON_RESUME = (")
    must = eval(source[start + len("MUST_MATCH_ON_RESUME = "):source.index(")", start) + 1])
    assert set(must) | {"epochs"} == set(declared)


# -- follow: one line with the outcome, and its exit code ---------------------------------------


def test_d11_logs_follow_exits_with_the_jobs_outcome(cli):
    job_id = cli.launch("--", "bash", "-c", "sleep 1; echo done; exit 1")
    proc = cli("logs", job_id, "--follow")
    assert proc.returncode == 1
    assert proc.stdout == "done\n"
    assert proc.stderr == f"job {job_id} failed: exited with code 1\n"
    ok = cli.launch("--", "echo", "fine")
    proc = cli("logs", ok, "-f")
    assert proc.returncode == 0 and proc.stdout == "fine\n"
    assert proc.stderr == f"job {ok} succeeded\n"


def test_F36_logs_on_a_terminal_drop_a_jobs_escapes_raw_and_pipes_get_the_bytes(cli):
    """F36: the log of a job is the host's text. On a terminal `logs` (and -f) keeps text and
    colours and drops the title, clipboard and clear-screen sequences; `--raw` and a pipe give
    the bytes as they are."""
    import subprocess
    import sys

    script = ("printf 'before\\033]0;owned-title\\007\\033]52;c;SGVsbG8=\\007\\033[2J"
              "\\033[31mred\\033[0m after\\n'")
    job_id = cli.launch("--", "bash", "-c", script)
    cli.wait(job_id)
    raw = b"before\x1b]0;owned-title\x07\x1b]52;c;SGVsbG8=\x07\x1b[2J\x1b[31mred\x1b[0m after\n"
    piped = subprocess.run([sys.executable, "-m", "cloudtrain", "logs", job_id],
                           capture_output=True, cwd=REPO, timeout=60)
    assert piped.returncode == 0 and piped.stdout == raw  # scripts get it byte for byte
    for follow in ([], ["--follow"]):
        code, shown = run_in_terminal(["logs", job_id, *follow], timeout=30)
        assert code == 0, shown
        assert "before\x1b[31mred\x1b[0m after" in shown, repr(shown)
        assert "owned-title" not in shown and "SGVsbG8" not in shown and "\x1b[2J" not in shown
    code, shown = run_in_terminal(["logs", job_id, "--raw"], timeout=30)
    assert code == 0 and "\x1b]0;owned-title\x07" in shown and "\x1b[2J" in shown


def test_d38_a_failed_launch_follow_says_it_once(cli):
    proc = cli("launch", "--follow", "--", "bash", "-c", "exit 1")
    assert proc.returncode == 1
    job_id = proc.stderr.split("launched job ")[1].split(":")[0]
    lines = proc.stderr.splitlines()
    assert lines[-1] == f"job {job_id} failed: exited with code 1"
    assert not any(line.startswith(("Error:", "Hint:")) for line in lines)


# -- --debug after the subcommand -----------------------------------------------------------------


def test_d32_debug_is_accepted_after_the_subcommand(cli):
    proc = cli("status", "nope", "--debug")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == "Error: no job 'nope'"
    # after `--` it is the job's own argument
    echo = cli("launch", "--follow", "--", "echo", "--debug")
    assert echo.returncode == 0 and echo.stdout == "--debug\n"


def test_d32_debug_after_the_subcommand_shows_the_traceback(ct_home, monkeypatch):
    """The internal-error line says "run again with --debug": after the subcommand, as a user
    types it, that gives the traceback."""
    from cloudtrain import cli as cli_module

    def broken(*args, **kwargs):
        raise KeyError("host")

    monkeypatch.setattr(cli_module.config.Settings, "load", broken)
    with pytest.raises(KeyError):
        cli_module.main(["logs", "x", "--debug"])
    with pytest.raises(SystemExit) as exc:
        cli_module.main(["logs", "x"])
    assert exc.value.code == 1


# -- down --all asks in a terminal --------------------------------------------------------------


def _in_terminal(args: list[str], answer: str) -> tuple[int, str]:
    code, out = run_in_terminal(args, answer=answer, when=b"[y/N]", timeout=30)
    return code, out.replace("\r\n", "\n")


def test_d26_down_all_lists_and_asks_in_a_terminal(cli):
    job_id = cli.launch("--", "sleep", "60")
    code, out = _in_terminal(["down", "--all"], "n")
    assert code == 1, out
    assert "down --all stops these 1 job(s) and terminates their instances:" in out
    assert job_id in out and "Proceed? [y/N]" in out and "nothing stopped" in out
    assert cli.job(job_id)["state"] == "running"
    code, out = _in_terminal(["down", "--all"], "y")
    assert code == 0 and f"{job_id}: cancelled" in out, out
    # -y does not ask
    other = cli.launch("--", "sleep", "60")
    code, out = _in_terminal(["down", "--all", "-y"], "n")
    assert code == 0 and "Proceed" not in out and f"{other}: cancelled" in out, out


def test_U13_down_all_without_a_terminal_needs_yes(cli):
    """U13: Nobody can answer (an IDE task, a tool runner, ssh without -t): refused in one line
    with the hint, nothing stopped; -y goes on."""
    job_id = cli.launch("--", "sleep", "60")
    proc = cli("down", "--all", input="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[0].startswith("Error: down --all stops every job")
    assert "no terminal to ask" in proc.stderr and "Hint: add -y" in proc.stderr
    assert proc.stdout == "" and cli.job(job_id)["state"] == "running"
    assert f"{job_id}: cancelled" in cli.ok("down", "--all", "-y").stdout
    assert cli.ok("down", "--all", "-y").stdout.strip() == "no active jobs"


# -- a cloud job that never started ---------------------------------------------------------------


def test_d8_d9_d25_a_launch_that_failed_before_ssh(cli, aws):
    aws.sshd.stop()
    proc = cli("launch", "--instance", "g5.xlarge", "--name", "aws1", "--", "true", timeout=60)
    assert proc.returncode == 1
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    assert job["state"] == "failed" and job["reason"].startswith("launch failed: SSH to i-")
    # D8: ssh (and attach) say why there is no instance to go to
    for command in ("ssh", "attach"):
        out = cli(command, "aws1")
        assert out.returncode == 2, out.stderr
        assert out.stderr.splitlines()[0] == f"Error: job {job['id']} has no instance " \
                                             f"({job['reason']})"
    # D9: logs of a job that never started say so, and fail
    logs = cli("logs", "aws1")
    assert logs.returncode == 1 and logs.stdout == ""
    assert logs.stderr.splitlines()[0] == f"Error: job {job['id']} never started: " \
                                          f"{job['reason']}"
    assert cli("logs", "aws1", "-f").returncode == 1
    # D25: with nothing active, `down --all` removes the group and key pair nothing uses
    assert aws.ec2.describe_security_groups(Filters=[
        {"Name": "group-name", "Values": ["cloudtrain"]}])["SecurityGroups"]
    assert aws.ec2.describe_key_pairs()["KeyPairs"]
    lines = cli.ok("down", "--all", "-y").stdout.splitlines()
    assert lines[0] == "no active jobs" and lines[1].startswith("aws: checked ")
    assert aws.ec2.describe_security_groups(Filters=[
        {"Name": "group-name", "Values": ["cloudtrain"]}])["SecurityGroups"] == []
    assert aws.ec2.describe_key_pairs()["KeyPairs"] == []


def _no_credentials(tmp_path: Path) -> dict:
    """An environment where botocore finds no credentials at all (no keys, no profile files,
    no metadata service), and no region: a new laptop."""
    empty = tmp_path / "empty-home"
    empty.mkdir(exist_ok=True)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        assert name not in os.environ, f"the test runs with {name} set"
    return {"HOME": str(empty), "AWS_CONFIG_FILE": str(empty / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(empty / "none"),
            "AWS_EC2_METADATA_DISABLED": "true"}


def test_u5_a_launch_without_credentials_records_nothing_and_keeps_the_name_free(cli, tmp_path):
    """U5: the credentials are checked before the question and before the job is recorded, so
    the launch that could not start leaves no job behind and its --name is still free."""
    env = _no_credentials(tmp_path)
    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--name", "aws1", "--", "true",
               env=env)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[0] == "Error: no AWS credentials found", proc.stderr
    assert json.loads(cli.ok("status", "--json").stdout) == []
    # In a terminal the error comes before any question about money.
    code, out = run_in_terminal(["launch", "--instance", "g5.xlarge", "--spot", "--name",
                                 "aws1", "--", "true"], env=env, timeout=60)
    assert code == 1 and "no AWS credentials found" in out and "Proceed" not in out, out
    assert json.loads(cli.ok("status", "--json").stdout) == []
    local = cli.launch("--name", "aws1", "--", "true")  # the name was never taken
    assert cli.job("aws1")["id"] == local
