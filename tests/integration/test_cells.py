"""cloudtrain/cells.py and the views that print with it, through the real CLI.

Tables that fit the terminal and listings that say what their numbers are (issue 14):
D7 (every listing fits COLUMNS, --wide shows all), D20 (an unsettled AWS cost is the estimate
from the instance's own times, not $0), D22 (the help's examples work in the default region),
D23 (a profile's estimate says whose figures they are), D24 ($/RUN vs $/H), D34/D35 (recipe
arguments aligned, null as `none (auto)`; no empty `by phase`), D37 (`recipes --json`)."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.terminal import run_in_terminal
from conftest import REPO

ANSI = re.compile(r"\x1b\[")
LONG_NAME = "a-rather-long-experiment-name-that-goes-on-and-on"
LONG_COMMAND = "python train.py " + " ".join(f"--option-{i} value-{i}" for i in range(30))


@pytest.fixture(scope="module")
def _many_jobs_db(tmp_path_factory):
    """1,000 ended jobs written straight into a store (no launches): long names and
    commands, every ending state, metrics and costs. Built once, copied for each test."""
    from cloudtrain.state import Store

    home = tmp_path_factory.mktemp("many")
    now = time.time()
    ends = ["succeeded", "failed", "cancelled", "preempted"]
    with Store(home / "state.db") as store:
        store.db.execute("PRAGMA synchronous=OFF")  # a test fixture: no fsync per job
        for n in range(1000):
            job = store.create_job(name=f"{LONG_NAME}-{n}", kind="command", recipe=None,
                                   command=f"{LONG_COMMAND} --seed {n}", backend="local",
                                   spec={}, at=now - 5000 + n)
            store.set_state(job.id, "running", at=now - 4000 + n)
            store.set_state(job.id, ends[n % 4], at=now - 3000 + n,
                            exit_code=1 if ends[n % 4] == "failed" else None,
                            metrics={"epoch": 3, "epochs": 10, "train_loss": 0.5,
                                     "test_acc": 0.9}, cost=0.0, cost_settled=1)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return home / "state.db"


@pytest.fixture
def many_jobs(ct_home, _many_jobs_db):
    import shutil

    shutil.copy(_many_jobs_db, ct_home / "state.db")


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _fits(text: str, width: int) -> None:
    too_long = [line for line in _lines(text) if len(line) > width]
    assert not too_long, f"{len(too_long)} lines over {width}: {too_long[:3]}"
    assert not ANSI.search(text), "ANSI escapes in piped output"


LISTINGS = [("recipes",), ("recipes", "resnet9"), ("recipes", "imagenet"),
            ("estimate", "--recipe", "resnet9"), ("catalog",), ("catalog", "--gpu", "V100"),
            ("cost-report",)]


@pytest.mark.parametrize("width", [80, 120])
def test_d7_every_listing_fits_columns(cli, many_jobs, width):
    env = {"COLUMNS": str(width)}
    status = cli.ok("status", "-a", env=env).stdout  # -a: all 1,000 (issue 16's default: recent)
    _fits(status, width)
    rows = _lines(status)
    assert len(rows) == 1001 and rows[0].split()[:2] == ["ID", "NAME"]
    assert "…" in status  # long names and commands are cut, with an ellipsis
    assert "COST" in rows[0] and "STATE" in rows[0]  # never dropped
    for args in LISTINGS:
        _fits(cli.ok(*args, env=env).stdout, width)


def test_u31_what_did_not_fit_at_60_columns_fits(cli, toy_recipes):
    """U31: at COLUMNS=60 estimate was 74 wide, recipes resnet9 73, metrics' event lines 84,
    and status JOB's args line 226 at any width."""
    env = {"COLUMNS": "60"}
    for args in (("estimate", "--recipe", "resnet9"), ("recipes", "resnet9"),
                 ("recipes", "airbench94")):
        _fits(cli.ok(*args, env=env).stdout, 60)
    writer = ("import json, os; f = open(os.path.join(os.environ['CLOUDTRAIN_JOB_DIR'], "
              "'metrics.jsonl'), 'a'); f.write(json.dumps({'epoch': 1, 'test_acc': 0.5}) + "
              "'\\n'); f.write(json.dumps({'event': 'target_reached', 'run': 0, 'epoch': 1, "
              "'test_acc': 0.9402, 'train_time': 7.11, 'wall_time': 11.66, 'tta_level': 2, "
              "'some_other_key': 123456}) + '\\n')")
    own = cli.launch("--", "python3", "-c", writer)
    toy = cli.launch("--recipe", "toy", "--set", "tag=" + "x" * 150)
    cli.wait(own), cli.wait(toy)
    _fits(cli.ok("metrics", own, env=env).stdout, 60)
    detail = cli.ok("status", toy, env=env).stdout
    _fits(detail, 60)
    assert "x" * 40 in detail  # wrapped, not cut: every argument is still there
    assert "x" * 150 in cli.ok("status", toy).stdout  # piped without COLUMNS: one line


def test_u31_status_watch_fits_the_terminals_height(cli):
    """U31: `status --watch` in a 20-line terminal printed 23 lines (it scrolled)."""
    for _ in range(25):
        cli.launch("--", "true")
    code, out = run_in_terminal(["status", "--watch", "--interval", "0.5"],
                                env={"LINES": "20"}, timeout=8, columns=100,
                                interrupt_after=3)
    lines = [l for l in out.replace("\r\n", "\n").split("\n") if l.strip()]
    ids = {m.group(1) for l in lines
           if (m := re.match(r"(?:\x1b\[[0-9;?]*[A-Za-z])*([0-9a-f]{8})  ", l))}
    assert 0 < len(ids) <= 16, lines[:30]  # each frame: the 16 newest of the 25 jobs
    assert any("9 older jobs not shown" in l for l in lines), lines[:30]


def test_d7_wide_and_piped_output_keep_the_full_text(cli, many_jobs):
    for args in (("status", "-a", "--wide"), ("status", "-a")):  # --wide, or piped, no COLUMNS
        out = cli.ok(*args, env={"COLUMNS": "80"} if "--wide" in args else {}).stdout
        assert f"{LONG_COMMAND} --seed 999" in out and f"{LONG_NAME}-999" in out
        assert "…" not in out
        assert _lines(out)[0].split() == ["ID", "NAME", "WHAT", "BACKEND", "STATE", "AGE",
                                          "RUNTIME", "EPOCH", "LOSS", "ACC", "COST"]
    recipes = cli.ok("recipes", "--wide", env={"COLUMNS": "80"}).stdout
    assert "fast.ai's DAWNBench run on one 8-GPU p3.16xlarge" in recipes
    # 80 columns: optional columns dropped, text cut, the ids whole
    narrow = cli.ok("status", env={"COLUMNS": "80"}).stdout
    header = _lines(narrow)[0].split()
    assert "LOSS" not in header and "BACKEND" not in header
    first_id = json.loads(cli.ok("status", "--json", "--limit", "1").stdout)[0]["id"]
    assert _lines(narrow)[1].startswith(first_id + "  ")


def test_d7_json_is_unchanged_by_columns(cli, many_jobs):
    wide = cli.ok("status", "-a", "--json", env={"COLUMNS": "40"}).stdout
    data = json.loads(wide)
    assert len(data) == 1000 and data[0]["command"].startswith(LONG_COMMAND)
    assert wide == cli.ok("status", "-a", "--json").stdout  # the same at any width
    est = json.loads(cli.ok("estimate", "--recipe", "resnet9", "--json",
                            env={"COLUMNS": "40"}).stdout)
    assert {"recipe", "region", "rows", "basis"} <= set(est)
    cat = json.loads(cli.ok("catalog", "--json", env={"COLUMNS": "40"}).stdout)
    assert {"region", "types"} <= set(cat)


def test_states_are_coloured_only_in_a_terminal(ct_home):
    """Piped: no escapes (above). In a terminal: the STATE cell coloured, unless NO_COLOR."""
    from cloudtrain import job_views
    from cloudtrain.state import Job, open_store

    with open_store(ct_home) as store:
        for end, code in (("succeeded", None), ("failed", 1)):
            made = store.create_job(name=None, kind="command", recipe=None, command="true",
                                    backend="local", spec={})
            store.set_state(made.id, end, exit_code=code, cost=0.0, cost_settled=1)

    job = Job(id="abcd1234", name=None, kind="command", recipe=None, command="true",
              backend="local", state="failed", created_at=1.8e9, started_at=1.8e9,
              ended_at=1.8e9 + 5, exit_code=1, reason=None, spec={}, host=None, jobdir=None,
              metrics=None, cost=None)
    coloured = job_views.status_table([job], now=1.8e9 + 10, color=True)
    assert "\x1b[31mfailed (1)" in coloured
    assert not ANSI.search(job_views.status_table([job], now=1.8e9 + 10))
    code, tty = run_in_terminal(["status"], env={"NO_COLOR": None})
    assert code == 0 and "\x1b[32msucceeded" in tty and "\x1b[31mfailed (1)" in tty
    code, plain = run_in_terminal(["status"], env={"NO_COLOR": "1"})
    assert "succeeded" in plain and not ANSI.search(plain)


def test_d34_recipe_arguments_aligned_and_null_defaults_said(cli):
    out = cli.ok("recipes", "resnet9").stdout  # piped: one row per argument
    rows = [line for line in _lines(out) if line.startswith("    ") and
            line.split()[0] in ("NAME", "variant", "gpus", "epochs", "device")]
    starts = {line.index(line.split()[1], 4) for line in rows if not line.startswith("    NAME")}
    assert len(starts) == 1, rows  # the TYPE column starts at the same place on every row
    variant = [line for line in rows if line.split()[0] == "variant"][0]
    assert "bag-of-tricks | dawn | apple-8gpu" in variant and "none (auto)" in variant
    assert " - " not in variant
    narrow = cli.ok("recipes", "resnet9", env={"COLUMNS": "80"}).stdout
    lines = _lines(narrow)
    i = [n for n, line in enumerate(lines) if line.split()[:1] == ["variant"]][0]
    assert lines[i + 1].startswith("      null = bag-of-tricks")  # help under its argument
    _fits(narrow, 80)


def test_d35_local_job_detail_has_no_empty_by_phase_line(cli, ct_home):
    from cloudtrain.state import open_store

    with open_store(ct_home) as store:
        job = store.create_job(name=None, kind="command", recipe=None, command="true",
                               backend="local", spec={})
        store.set_state(job.id, "succeeded", cost=0.0, cost_settled=1,
                        cost_detail={"phases": {"boot": 0.0, "training": 0.0}})
    detail = cli.ok("status", job.id).stdout
    assert "by phase" not in detail and "cost      $0.00" in detail


def test_d37_recipes_json(cli):
    listed = json.loads(cli.ok("recipes", "--json").stdout)
    resnet9 = [r for r in listed if r["name"] == "resnet9"][0]
    assert resnet9["gpus"] == 1 and "smoke" in resnet9["profiles"]
    assert resnet9["published"][0]["seconds"] == 26 and resnet9["description"]
    one = json.loads(cli.ok("recipes", "resnet9", "--json").stdout)
    args = {a["name"]: a for a in one["arguments"]}
    assert args["variant"]["choices"] == ["bag-of-tricks", "dawn", "apple-8gpu"]
    assert args["variant"]["default"] is None and "smoke" in one["profiles"]
    assert one["resources"]["gpus_per_node"] == 1 and "gpu" not in one["resources"]  # RA2


def test_d24_headers_say_per_run_and_per_hour(cli):
    est = _lines(cli.ok("estimate", "--recipe", "resnet9").stdout)
    header = [line for line in est if line.startswith("TYPE")][0]
    assert "$/RUN ON-DEMAND" in header and "$/RUN SPOT" in header
    assert "per run" in est[0]
    cat = cli.ok("catalog", "--gpu", "V100").stdout
    assert "$/H ON-DEMAND" in _lines(cat)[0] and "$/H SPOT" in _lines(cat)[0]
    assert "prices per hour in us-east-1" in cat


def test_d23_profile_estimate_says_whose_figures_they_are(cli):
    out = cli.ok("estimate", "--recipe", "resnet9", "--profile", "smoke", "--instance",
                 "g5.xlarge", env={"COLUMNS": "100"}).stdout
    out = " ".join(out.split())  # the note is wrapped at 100 columns
    assert "resnet9 (profile smoke)" in out
    assert "no published time for profile smoke" in out and "full recipe's" in out
    full = cli.ok("estimate", "--recipe", "resnet9", "--instance", "g5.xlarge").stdout
    assert "profile" not in full
    plan = cli.ok("launch", "--recipe", "resnet9", "--profile", "smoke", "--instance",
                  "g5.xlarge", "--region", "us-east-1", "--dry-run").stdout
    line = [l for l in _lines(plan) if l.strip().startswith("estimate")][0]
    assert "no published time for profile smoke" in line


def _examples(cli, command: str) -> list[list[str]]:
    text = cli.ok(command, "--help").stdout
    return [line.split()[1:] for line in _lines(text)
            if line.strip().startswith(f"cloudtrain {command}")]


@pytest.mark.parametrize("command", ["estimate", "catalog"])
def test_d22_help_examples_work_in_the_default_region(cli, command):
    examples = [e for e in _examples(cli, command) if "--refresh" not in e]
    assert len(examples) >= 2
    for argv in examples:  # offline: the bundled catalog, us-east-1 by default
        proc = cli(*argv, env={"AWS_DEFAULT_REGION": "us-east-1"})
        assert proc.returncode == 0, (argv, proc.stderr)


def test_d20_failed_aws_launch_costs_its_instance_time_not_zero(cli, aws, ct_home):
    """A launch whose instance never answers SSH is terminated without the job's cost being
    settled; cost-report showed $0.0000 for the EC2 seconds it billed."""
    aws.write_config(ssh_port=1, ssh_wait_seconds=1.0)  # nothing listens on port 1
    proc = cli("launch", "--instance", "g5.xlarge", "--disk-gb", "100", "--", "true")
    assert proc.returncode != 0
    db = sqlite3.connect(ct_home / "state.db")
    (job_id, job_cost), = db.execute("SELECT id, cost FROM jobs").fetchall()
    (start, end), = db.execute("SELECT launched_at, terminated_at FROM instances").fetchall()
    billed = max(60.0, end - start)
    expected = 1.006 * billed / 3600 + 100 * 0.08 / (730 * 3600) * billed
    report = json.loads(cli.ok("cost-report", "--json").stdout)
    assert report["rows"][0]["dollars"] == pytest.approx(expected, abs=1e-6)
    # The failed launch settles what its instance cost at once: status shows it too.
    assert json.loads(cli.ok("status", job_id, "--json").stdout)["cost"] == \
        pytest.approx(expected, abs=1e-6)
    text = cli.ok("cost-report").stdout
    assert f"${expected:.4f}" in text and "$0.0000" not in text


def test_status_watch_refreshes_and_ctrl_c_exits_zero(cli, many_jobs):
    """Piped, `status --watch` prints the table every interval; Ctrl-C ends it with 0."""
    import os

    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "status", "--watch",
                             "--interval", "0.3", "--limit", "3"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=os.environ)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert out.count("ID  ") >= 2  # printed more than once
    assert cli("status", "--watch", "--json").returncode == 2


@pytest.mark.parametrize("width", [80, 120])
def test_d7_status_job_attempts_and_cloud_instances_fit(width):
    """The tables inside `status JOB` (a recovering job's attempts) and `status --refresh`
    (instances tagged as ours) fit the terminal too; at full length nothing is cut."""
    from cloudtrain import job_views

    attempts = [{"attempt": n, "instance": f"i-0{n}23456789abcdef0", "zone": "us-east-1b",
                 "market": "spot", "started_at": 1.8e9, "ended_at": 1.8e9 + 600,
                 "outcome": "interrupted", "resumed_checkpoint": n, "resumed_step": 100 * n,
                 "last_step": 100 * n + 40, "redone_steps": 3, "usd": 0.1234,
                 "reason": "EC2 took the spot instance back (instance-terminated-no-capacity)"}
                for n in range(1, 4)]
    lines = job_views.attempts_lines(attempts, {"interruptions": 3, "redone_steps": 9,
                                             "redone_usd": 0.01}, width=width)
    table = [line for line in lines[1:] if not re.match(r"    \d+: ", line)]  # not reasons
    assert len(table) == 4 and "INSTANCE" in table[0], lines
    _fits("\n".join(table), width)
    assert "i-0123456789abcdef0" in "\n".join(lines)  # ids are never cut
    full = job_views.attempts_lines(attempts, {"interruptions": 3}, width=None)
    assert any("RESUMED AT" in line and "LAST STEP" in line for line in full)
    found = [{"instance": f"i-0{n}23456789abcdef0", "region": "ap-southeast-2",
              "type": "p4de.24xlarge", "state": "running", "job": f"abcd{n:04d}",
              "launched_at": 1.8e9, "tracked": False} for n in range(3)]
    text = job_views.cloud_instances(found, now=1.8e9 + 60, width=width)
    _fits("\n".join(text.splitlines()[:4]), width)
    assert "i-0023456789abcdef0" in text


PLAN_ARGS = ("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--spot", "--dry-run")


def _continued(lines: list[str], indent: int) -> list[str]:
    """The lines of a wrapped plan that continue the row above them."""
    return [line for line in lines[1:] if line[:indent].strip() == "" and line.strip()]


@pytest.mark.parametrize("width", [60, 80])
def test_u42_the_plan_wraps_at_the_terminal_under_its_value_column(cli, width):
    """U42: the dry run's rows were lines of 120-330 characters that an 80-column terminal
    split mid-word (`AWS_DEFAULT_REGI` / `ON`). Now each row wraps at the terminal's width,
    its later lines under the value column, no word cut that fits the column; piped, each
    row is still one line."""
    piped = cli.ok(*PLAN_ARGS).stdout
    shown = cli.ok(*PLAN_ARGS, env={"COLUMNS": str(width)}).stdout
    _fits(shown, width)
    rows = _lines(piped)[1:]
    keys = max(len(r[2:].split("  ", 1)[0]) for r in rows)
    value_at = 2 + keys + 2
    assert all(r[value_at - 1] == " " and r[value_at] != " " for r in rows), rows
    more = _continued(_lines(shown), value_at)
    assert more and all(line.startswith(" " * value_at) and line[value_at] != " "
                        for line in more), more
    fitting = [w for w in piped.split() if len(w) <= width - value_at]
    words = shown.split()
    assert all(w in words for w in fitting), [w for w in fitting if w not in words]


def test_u42_the_recovery_row_says_cause_then_remedy(cli):
    """U42: `a supervisor on this machine does it, so only while this machine is on: no
    instance_profile in config.yaml, the role ... with: infra/README.md`: three clauses, and
    the reader could not tell cause from remedy."""
    row = next(l for l in _lines(cli.ok(*PLAN_ARGS).stdout) if l.strip().startswith("recovery"))
    assert row.endswith("relaunched by a supervisor on this machine (only while it is on); "
                        "set `instance_profile:` in config.yaml to let AWS Auto Scaling do it "
                        "(the role a replacement instance reads the job's bundle with: "
                        "infra/README.md)"), row


@pytest.mark.parametrize("width", [60, 80])
def test_u42_the_paid_launch_question_wraps_at_the_terminal(aws, width):
    """U42: the `Proceed? [Y/n]` question was one paragraph of 500 characters; the estimate
    line before it 150. In a terminal both now wrap at its width; answered no, nothing is
    created."""
    code, out = run_in_terminal(["launch", "--recipe", "resnet9", "--instance", "g5.xlarge",
                                 "--spot"], answer="n", when=b"[Y/n]", columns=width,
                                timeout=90)
    assert code == 1 and "not launched" in out, out
    lines = out.replace("\r\n", "\n").split("\n")
    assert not [l for l in lines if len(l) > width], [l for l in lines if len(l) > width]
    question = out[out.index("This launches"):out.index("[Y/n]")]
    assert "\n" in question.strip() and "Proceed?" in question, question
    assert " ".join(question.split()).startswith("This launches a spot g5.xlarge in "), question
    assert not aws.instances()


def test_u31_metrics_of_an_imagenet_like_job_fit_60_columns(cli):
    """U31: at 60 columns `metrics` of a job with losses, training accuracy, top-1 and top-5
    was 64 wide (ELAPSED wrapped in the terminal): the other losses and training columns
    now go first; the epoch, the first accuracy and ELAPSED stay."""
    writer = ("import json, os; f = open(os.path.join(os.environ['CLOUDTRAIN_JOB_DIR'], "
              "'metrics.jsonl'), 'a'); [f.write(json.dumps({'epoch': e, 'epochs': 16, "
              "'train_loss': 1.2, 'test_loss': 1.1, 'train_acc': 0.5, 'top1': 0.6, "
              "'top5': 0.8, 'lr': 0.1, 'step': 100 * e}) + '\\n') for e in range(1, 17)]")
    job = cli.launch("--", "python3", "-c", writer)
    cli.wait(job)
    narrow = cli.ok("metrics", job, env={"COLUMNS": "60"}).stdout
    _fits(narrow, 60)
    header = _lines(narrow)[1].split()
    assert header[0] == "EPOCH" and "TOP1" in header and "ELAPSED" in header, header
    assert "TEST_LOSS" not in header
    full = _lines(cli.ok("metrics", job, "--wide").stdout)[1].split()
    assert {"TEST_LOSS", "TRAIN_LOSS", "TRAIN_ACC", "TOP5", "LR", "STEP"} <= set(full)


ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _times(value, path="") -> list[tuple[str, object]]:
    """Every (path, value) under a key that names a moment (`*_at`, lease_until, a
    timeline's start)."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "metrics":  # the job's own row, as it wrote it
                continue
            here = f"{path}.{k}"
            if k.endswith("_at") or k in ("lease_until", "start", "at"):
                out.append((here, v))
            else:
                out += _times(v, here)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _times(v, f"{path}[{i}]")
    return out


def test_u25_every_json_output_gives_times_in_iso_8601_utc(cli):
    """U25: times were unix floats (`"created_at": 1796165870.11`) in every --json output;
    `check --json` had `exit_code` but no `ok`, where `check --launch --json` has both."""
    job = cli.launch("--", "true")
    cli.wait(job)
    outputs = {args: json.loads(cli.ok(*args).stdout) for args in (
        ("status", "--json"), ("status", job, "--json"), ("cost-report", "--json"),
        ("supervisor", "status", "--json"))}
    found = [t for data in outputs.values() for t in _times(data)]
    named = {p.rsplit(".", 1)[-1].split("[")[0] for p, _ in found}
    assert {"created_at", "started_at", "ended_at", "start"} <= named, named
    numbers = [(p, v) for p, v in found if isinstance(v, (int, float))]
    assert not numbers, numbers
    assert all(v is None or ISO_UTC.match(v) for _, v in found), found
    created = outputs[("status", "--json")][0]["created_at"]
    assert created == outputs[("status", job, "--json")]["created_at"]
    import datetime

    when = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    assert abs(when.timestamp() - time.time()) < 600
    checked = cli("check", "--json")
    data = json.loads(checked.stdout)
    assert data["ok"] is (data["exit_code"] == 0) and data["exit_code"] == checked.returncode
