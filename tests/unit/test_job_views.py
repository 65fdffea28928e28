"""cloudtrain/job_views.py: what the commands about jobs print."""

from __future__ import annotations

from cloudtrain import job_views


def test_u35_supervisor_not_running_is_alarming_only_when_a_job_needs_it():
    """U35: `supervisor status` printed `NOT running` in capitals with nothing to watch."""
    idle = {"running": False, "session": "ct-supervisor"}
    assert job_views.supervisor_line(idle, needed=False) == \
        "supervisor: not running (no recovering spot job needs it)"
    assert job_views.supervisor_line(idle, needed=True).startswith("supervisor: NOT running")
    busy = {"running": True, "pid": 42, "watching": 1, "session": "ct-supervisor"}
    assert job_views.supervisor_line(busy, needed=False).startswith("supervisor: running (pid 42")


def test_u35_supervisor_status_with_nothing_to_watch(cli):
    out = cli.ok("supervisor", "status").stdout.strip()
    assert out == "supervisor: not running (no recovering spot job needs it)"


def test_the_startup_line_says_torchs_threads_and_why():
    """issue 28: the startup row's thread choice, from the host (untrusted: only whole
    counts are shown, text in their place is left out)."""
    base = {"import": 1.0, "to_first_step": 2.0}
    assert job_views.startup_text({**base, "threads": 1, "threads_from": "cores", "cores": 96,
                                   "procs": 8, "loader_workers": 11}).endswith(
        "; torch threads 1 (96 cores / 8 processes, less 11 loader workers)")
    assert job_views.startup_text({**base, "threads": 3, "threads_from": "job"}).endswith(
        "; torch threads 3 (the job's OMP_NUM_THREADS)")
    assert job_views.startup_text({**base, "threads": 2, "threads_from": "cores",
                                   "cores": "\x1b[2J", "procs": 1}).endswith("; torch threads 2")
    assert "threads" not in job_views.startup_text({**base, "threads": "\x1b[2J"})
    assert "threads" not in job_views.startup_text({**base, "threads": True})


def _job(**over):
    from cloudtrain.state import Job

    fields = dict(id="a39620f2", name=None, kind="command", recipe=None, command="python t.py",
                  backend="aws", state="running", created_at=1.8e9, started_at=1.8e9 + 60,
                  ended_at=None, exit_code=None, reason=None, spec={}, host=None, jobdir=None,
                  metrics=None, cost=None)
    fields.update(over)
    return Job(**fields)


def _row(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"  {key} "))


def test_u52_a_running_aws_jobs_jobdir_is_labelled_as_on_the_instance():
    """U52: `status JOB` of a running AWS job showed `jobdir  <remote_root>/jobs/a39620f2`,
    a path on the instance, under the label that shows the local copy once the job ends."""
    remote = _job(host={"kind": "SSHHost", "host": "10.0.0.5", "user": "ubuntu"},
                  jobdir="/home/ubuntu/.cloudtrain/jobs/a39620f2")
    assert _row(job_views.job_detail(remote, [], b"", now=1.8e9 + 120), "jobdir") == \
        "  jobdir    on the instance: /home/ubuntu/.cloudtrain/jobs/a39620f2"
    home = _job(state="succeeded", ended_at=1.8e9 + 100, jobdir="/u/.cloudtrain/jobs/a39620f2",
                host={"kind": "LocalHost", "collected_from": remote.host,
                      "remote_jobdir": remote.jobdir})
    assert _row(job_views.job_detail(home, [], b"", now=1.8e9 + 120), "jobdir") == \
        "  jobdir    /u/.cloudtrain/jobs/a39620f2"
    local = _job(backend="local", host={"kind": "LocalHost"}, jobdir="/u/.cloudtrain/jobs/x")
    assert _row(job_views.job_detail(local, [], b"", now=1.8e9 + 120), "jobdir") == \
        "  jobdir    /u/.cloudtrain/jobs/x"


def test_u53_an_event_after_the_end_has_no_now_duration():
    """U53: in an ended job's timeline the `outputs` event after `succeeded` showed its
    duration as `(now)`; a running job's last phase still does."""
    from cloudtrain.lifecycle.inspect import Phase

    phases = [Phase("running", 1.8e9 + 60, 40.0), Phase("succeeded", 1.8e9 + 100, 0.0),
              Phase("outputs", 1.8e9 + 100.5, None, "outputs: in /x; not found: missing.pt")]
    ended = _job(backend="local", state="succeeded", ended_at=1.8e9 + 100)
    lines = job_views.job_detail(ended, phases, b"", now=1.8e9 + 200).splitlines()
    line = next(l for l in lines if l.startswith("    outputs "))
    assert "(now)" not in line and line.endswith("outputs: in /x; not found: missing.pt"), line
    running = _job(backend="local")
    lines = job_views.job_detail(running, phases[:1] + [Phase("running", 1.8e9 + 100, None)],
                                 b"", now=1.8e9 + 200).splitlines()
    assert "(now)" in [l for l in lines if l.startswith("    running ")][-1]


def test_u50_the_acc_column_is_the_recipe_s_target_metric():
    """U50: for an imagenet job the list's ACC was test_acc (top-1, 87.50%) where the
    recipe's target, `status JOB`'s trend and `plot` use top-5 (100.00%). A job keeps its
    recipe's target for its arguments (spec.target) and the column shows that metric; a
    job without one, or a row without that metric, shows test_acc as before."""
    from cloudtrain import config
    from cloudtrain.launch_options import LaunchOptions
    from cloudtrain.spec import build_spec
    from cloudtrain.state import Job

    def job(spec, metrics):
        return Job(id="a1b2c3d4", name=None, kind="recipe", recipe="imagenet",
                   command="imagenet", backend="local", state="succeeded", created_at=1.8e9, started_at=1.8e9,
                   ended_at=1.8e9 + 30, exit_code=0, reason=None, spec=spec, host=None,
                   jobdir=None, metrics=metrics, cost=0.0)

    def acc(table):
        header, row = (line.split("  ") for line in table.splitlines()[:2])
        cells_ = [c.strip() for c in row if c.strip()]
        return cells_[[c.strip() for c in header if c.strip()].index("ACC")]

    smoke = build_spec(LaunchOptions(recipe="imagenet", profile="smoke"), config.Settings())
    assert smoke.target == {"metric": "top5", "value": 0.93}
    ffcv = build_spec(LaunchOptions(recipe="imagenet", sets=("variant=ffcv-rn50-32",
                                                      "data=synthetic")),
                      config.Settings())
    assert ffcv.target["metric"] == "top1"
    row = {"epoch": 4, "epochs": 4, "test_acc": 0.875, "top5": 1.0, "train_loss": 1.5}
    assert acc(job_views.status_table([job(smoke.to_dict(), row)], now=1.8e9 + 60)) == \
        "100.00%"
    assert acc(job_views.status_table([job({}, row)], now=1.8e9 + 60)) == "87.50%"
    assert acc(job_views.status_table([job(ffcv.to_dict(), row)], now=1.8e9 + 60)) == \
        "87.50%"  # FFCV's top-1 is test_acc: no `top1` key in the rows


def _kept_job(**fields):
    from cloudtrain.state import Job

    base = dict(id="fcade774", name="kept3", kind="command", recipe=None, command="sleep 15",
                backend="aws", state="succeeded", created_at=1000.0, started_at=1010.0,
                ended_at=1025.0, exit_code=0, reason=None, spec={}, host=None, jobdir=None,
                metrics=None, cost=0.02, cost_settled=0)
    return Job(**{**base, **fields})


KEPT = {"job": "fcade774", "name": "kept3", "instance": "i-0abc", "type": "g5.xlarge",
        "region": "us-east-1", "market": "on-demand", "price_per_hour": 1.006,
        "billing_since": 1000.0, "state": "kept", "job_state": "succeeded", "idle_minutes": 60,
        "power_off_at": 1025.0 + 3600, "due": False, "queued": []}


def test_U40_a_kept_instance_is_marked_and_said_under_the_table():
    """U40: the row said `succeeded ~$0.02` and nothing said that an instance still billed."""
    import time

    text = job_views.status_table([_kept_job()], now=1085.0, kept=[KEPT])
    row = next(line for line in text.splitlines() if line.startswith("fcade774"))
    assert "succeeded, kept" in row and "~$0.02" in row
    off = time.strftime("%H:%M", time.localtime(1025.0 + 3600))
    assert text.splitlines()[-1] == (
        f"kept: i-0abc (g5.xlarge, us-east-1) of job fcade774 (kept3): running and billing "
        f"$1.0060/h since {time.strftime('%H:%M', time.localtime(1000.0))} (1m ago); powers "
        f"itself off at {off} (in 59m), 60 min after its last job, unless a job comes "
        "(cloudtrain launch --on fcade774); cloudtrain down fcade774 ends it now")
    assert job_views._kept_style("succeeded, kept") == "bold yellow"
    assert job_views._kept_style("succeeded") == "green"
    # fitted to a narrow terminal: wrapped, nothing lost
    narrow = job_views.kept_lines([KEPT], now=1100.0, width=60)
    assert all(len(line) <= 60 for line in narrow)
    assert " ".join(" ".join(narrow).split()).endswith("cloudtrain down fcade774 ends it now")


def test_U40_a_due_power_off_and_a_queue_are_said_as_such():
    due = {**KEPT, "due": True}
    assert "its power-off was due at" in job_views.kept_words(due, now=1025.0 + 4000)
    busy = {**KEPT, "state": "busy", "idle_minutes": None, "power_off_at": None,
            "queued": ["bbbb0002", "cccc0003"]}
    line = job_views.kept_lines([busy], now=1100.0)[0]
    assert line == ("queue: i-0abc (g5.xlarge, us-east-1) runs job fcade774 (kept3); queued "
                    "behind it: bbbb0002, cccc0003 (each starts there when the one before it "
                    "ends)")
    queued = _kept_job(id="cccc0003", state="queued", name=None)
    assert job_views.queue_of(queued, [busy]) == {"instance": "i-0abc", "running": "fcade774",
                                                  "position": 2}


def test_U40_json_and_detail_carry_the_kept_instance():
    import json

    from cloudtrain import cells

    listed = json.loads(job_views.jobs_json([_kept_job()], kept=[KEPT]))[0]
    assert listed["kept"] == cells.json_times(KEPT) and listed["queue"] is None  # U25
    detail = job_views.job_detail(_kept_job(), [], b"", now=1100.0, kept=[KEPT])
    assert "  cost      ~$0.02 (so far: its kept instance still bills)" in detail
    assert "  kept      i-0abc (g5.xlarge, us-east-1) of job fcade774 (kept3): running" in detail
    plain = job_views.job_detail(_kept_job(), [], b"", now=1100.0, kept=[])
    assert "kept  " not in plain and "  cost      ~$0.02 (estimate)" in plain


def test_RC5_an_attempts_az_shows_the_placement_score_ec2_gave_it():
    """RC5: an attempt's AZ is shown with the spot placement score EC2 gave it at launch, so
    that interruptions can be read against it; an attempt without one shows the AZ alone."""
    rows = [{"attempt": 1, "instance": "i-1", "zone": "us-east-1a", "score": 9,
             "market": "spot", "outcome": "interrupted"},
            {"attempt": 2, "instance": "i-2", "zone": "us-east-1b", "score": None,
             "market": "spot", "outcome": "running"}]
    lines = job_views.attempts_lines(rows, {"interruptions": 1}, width=None)
    first = next(line for line in lines if "i-1" in line)
    second = next(line for line in lines if "i-2" in line)
    assert "us-east-1a 9/10" in first
    assert "us-east-1b" in second and "/10" not in second
