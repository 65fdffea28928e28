"""Issue 16: job history through the real CLI: status's default view and filters, rm and
prune (never a running job, never without saying what)."""

from __future__ import annotations

import json
import sqlite3
import time

DAY = 86400.0


def _age(ct_home, job_id: str, days: float) -> None:
    """Make a job look `days` old (created and ended then)."""
    db = sqlite3.connect(ct_home / "state.db")
    t = time.time() - days * DAY
    db.execute("UPDATE jobs SET created_at = ?, started_at = ?, ended_at = ? WHERE id = ?",
               (t, t, t + 1, job_id))
    db.commit()
    db.close()


def _ids(cli, *args) -> list[str]:
    return [j["id"] for j in json.loads(cli.ok("status", "--json", *args).stdout)]


def test_status_shows_active_and_recent_jobs_and_filters(cli, ct_home):
    """issue 16: by default active jobs and recent finished ones; -a all; --state, --name,
    --since filter; the footer says how many are hidden and how to see them."""
    old = cli.launch("--name", "exp-old", "--", "true")
    failed = cli.launch("--name", "exp-bad", "--", "false")
    running = cli.launch("--name", "other-run", "--", "sleep", "60")
    for j in (old, failed):
        cli.wait(j)
    _age(cli.home, old, 30)
    table = cli.ok("status").stdout
    shown = [line.split()[0] for line in table.splitlines()[1:] if line and line[0] != "("]
    assert running in shown and failed in shown and old not in shown
    assert set(_ids(cli)) == {old, failed, running}  # --json: every job, as -a
    assert "(1 older job not shown: cloudtrain status -a)" in table
    assert set(_ids(cli, "-a")) == {old, failed, running}
    assert _ids(cli, "-a", "--state", "failed") == [failed]
    assert set(_ids(cli, "-a", "--name", "exp-*")) == {old, failed}
    assert old not in _ids(cli, "-a", "--since", "7d")
    bad = cli("status", "--state", "bogus")
    assert bad.returncode == 2 and "--state 'bogus': not a job state" in bad.stderr
    both = cli("status", running, "--state", "failed")
    assert both.returncode == 2 and "not for one job's detail" in both.stderr
    cli.ok("down", running)


def test_u6_u18_u36_filters_that_match_nothing_several_recipes_and_an_empty_job(
        cli, ct_home, toy_recipes):
    """U6: an empty filter result says what matched nothing (not "no jobs yet"); U18: two
    --recipe both count; U36: `status ''` (an unset shell variable) is refused as `logs ''`."""
    toy = cli.launch("--recipe", "toy")
    own = cli.launch("--", "true")
    cli.wait(toy), cli.wait(own)
    none = cli.ok("status", "--state", "running").stdout.strip()
    assert none == "no jobs match --state running (2 jobs in all: cloudtrain status -a)"
    assert "no recipe is named resnet99" in cli.ok("status", "--recipe", "resnet99").stdout
    assert _ids(cli, "--recipe", "toy") == [toy]
    assert _ids(cli, "--recipe", "resnet9", "--recipe", "toy") == [toy]
    assert _ids(cli, "--recipe", "resnet9,toy") == [toy]
    for command in (("status", ""), ("status", "", "--json"), ("logs", "")):
        proc = cli(*command)
        assert proc.returncode == 2 and proc.stdout == "", (command, proc.stdout)
        assert proc.stderr.startswith("Error: give a job id, id prefix or name"), proc.stderr


def test_rm_and_prune_never_touch_a_running_job_and_say_what_they_remove(cli, ct_home):
    """issue 16: prune --older-than removes old finished jobs' records and directories,
    keeps the running one (even when old), and --dry-run removes nothing."""
    done = [cli.launch("--", "true") for _ in range(3)]
    running = cli.launch("--", "sleep", "60")
    for j in done:
        cli.wait(j)
    for j in (*done[:2], running):
        _age(ct_home, j, 40)
    dry = cli("prune", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "remove 2 finished job(s)" in dry.stderr and all(j in dry.stderr for j in done[:2])
    assert all((ct_home / "jobs" / j).is_dir() for j in done)
    proc = cli("prune", "--older-than", "30d", "-y")
    assert proc.returncode == 0, proc.stderr
    assert "removed 2 job(s)" in proc.stdout
    assert not (ct_home / "jobs" / done[0]).exists() and (ct_home / "jobs" / done[2]).is_dir()
    assert set(_ids(cli, "-a")) == {done[2], running}
    db = sqlite3.connect(ct_home / "state.db")
    assert db.execute("SELECT count(*) FROM events WHERE job_id = ?", (done[0],)).fetchone() \
        == (0,)
    db.close()
    refused = cli("rm", running)
    assert refused.returncode == 1 and "kept:" in refused.stderr and "cloudtrain down" in \
        refused.stderr, refused.stderr
    assert (ct_home / "jobs" / running).is_dir()
    cli.ok("down", running)
    gone = cli("rm", running[:5], "-y")
    assert gone.returncode == 0 and "removed 1 job(s)" in gone.stdout, gone.stderr
    assert _ids(cli, "-a") == [done[2]]


def test_U13_rm_and_prune_without_a_terminal_need_yes(cli, ct_home):
    """U13: Nobody can answer: refused in one line with the hint -y, nothing removed."""
    done = [cli.launch("--", "true") for _ in range(2)]
    for j in done:
        cli.wait(j)
        _age(ct_home, j, 40)
    for args in (["rm", done[0]], ["prune", "--older-than", "30d"]):
        proc = cli(*args, input="")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        error = [l for l in proc.stderr.splitlines() if l.startswith("Error: ")]
        assert error == [f"Error: {args[0]} removes 1 finished job(s) and there is no terminal "
                         "to ask" if args[0] == "rm" else "Error: prune removes 2 finished "
                         "job(s) and there is no terminal to ask"], proc.stderr
        assert "Hint: add -y" in proc.stderr
        assert all((ct_home / "jobs" / j).is_dir() for j in done)
    assert cli("prune", "--older-than", "30d", "--dry-run").returncode == 0  # asks nothing
    assert "removed 2 job(s)" in cli.ok("prune", "--older-than", "30d", "-y").stdout


def test_u6_an_empty_default_view_says_the_count_once(cli, ct_home):
    """U6: with every job older than the default view, status said the count twice: once in
    its empty line and again in the footer."""
    job = cli.launch("--", "true")
    cli.wait(job)
    _age(cli.home, job, 30)
    out = cli.ok("status").stdout.strip()
    assert out == "no active or recent jobs (1 job in all: cloudtrain status -a)"
