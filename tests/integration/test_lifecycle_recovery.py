"""cloudtrain/lifecycle/recovery.py: its options through the CLI and its relaunch plans.

Issue 13's launch options, as a user types them: spot jobs recover by default, and the
recovery options are refused in one line where they cannot apply (no traceback, exit 2)."""

from __future__ import annotations

import json

import pytest

from cloudtrain.lifecycle import attempts, recovery
from cloudtrain.config import Settings
from cloudtrain.spec import JobSpec
from cloudtrain.state import Attempt


@pytest.mark.parametrize("args, message", [
    (["--recover"], "--recover applies to --spot jobs"),
    (["--spot", "--max-restarts", "-1"], "--max-restarts must be a whole number from 0 to 100"),
    (["--spot", "--max-restarts", "101"], "--max-restarts must be a whole number from 0 to 100"),
    (["--spot", "--no-recover", "--max-restarts", "2"], "--max-restarts applies to a recovering"),
    (["--fallback", "on-demand"], "--fallback applies to a recovering --spot job"),
    (["--spot", "--fallback", "spot"], "Invalid value for '--fallback'"),
])
def test_F13_recovery_options_refused_where_they_cannot_apply(cli, args, message):
    proc = cli("launch", "--instance", "g5.xlarge", "--region", "us-east-1", *args,
               "--dry-run", "--", "true")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_F13_recovery_options_on_the_local_backend_are_an_error(cli):
    proc = cli("launch", "--max-restarts", "2", "--", "true")
    assert proc.returncode == 2
    assert "--max-restarts applies to cloud backends" in proc.stderr


def test_F13_the_dry_run_says_a_spot_job_recovers_and_how(cli):
    out = cli.ok("launch", "--instance", "g5.xlarge", "--region", "us-east-1", "--spot",
                 "--max-restarts", "5", "--fallback", "on-demand", "--dry-run", "--",
                 "true").stdout
    line = next(l for l in out.splitlines() if l.strip().startswith("recovery"))
    assert "at most 5 times" in line and "then on-demand" in line
    off = cli.ok("launch", "--instance", "g5.xlarge", "--region", "us-east-1", "--spot",
                 "--no-recover", "--dry-run", "--", "true").stdout
    assert "off (--no-recover)" in off
    plain = cli.ok("launch", "--instance", "g5.xlarge", "--region", "us-east-1",
                   "--dry-run", "--", "true").stdout
    assert "recovery" not in plain  # on-demand: nothing to recover from


def test_u9_the_dry_run_s_at_most_covers_every_attempt_and_the_fallback(cli):
    """The finding's command said "at most $0.43 if it runs its whole max runtime of 60 min":
    one spot attempt. Six instances may run, the last five on demand, each to its power-off."""
    from cloudtrain import catalog, cost

    out = cli.ok("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--spot",
                 "--max-restarts", "5", "--fallback", "on-demand", "--region", "us-east-1",
                 "--dry-run").stdout
    row = next(l for l in out.splitlines() if l.strip().startswith("at most"))
    g5 = catalog.get("g5.xlarge")
    disk = 60 * catalog.gp3_price("us-east-1").per_gb_month / cost.HOURS_PER_MONTH
    ip = cost.PUBLIC_IPV4_PER_HOUR  # each instance's public IPv4 address (RH5)
    most = 1.5 * (g5.dearest("us-east-1", "spot") + disk + ip) \
        + 5 * 1.5 * (g5.price("us-east-1", "on-demand") + disk + ip)
    assert row.split(None, 2)[2] == (
        f"${most:.2f}: 6 attempts (1 + 5 restarts) of up to 90 min each (the max runtime of "
        f"60 min + 30 until user-data powers it off), spot at up to "
        f"${g5.dearest('us-east-1', 'spot'):.4f}/h (the dearest AZ in the catalog), on-demand "
        f"($1.0060/h) after spot runs out, each with its 60 GB gp3 disk (${disk:.4f}/h) and its "
        f"public IPv4 address (${ip:.4f}/h)")


def test_u23_no_restarts_is_recovery_off_and_said_so(cli):
    """`--max-restarts 0` with recovery on said "at most 0 times": it is --no-recover."""
    out = cli.ok("launch", "--instance", "g5.xlarge", "--region", "us-east-1", "--spot",
                 "--max-restarts", "0", "--dry-run", "--", "true").stdout
    line = next(l for l in out.splitlines() if l.strip().startswith("recovery"))
    assert line.split(None, 1)[1] == ("off (--max-restarts 0): an interruption ends the job "
                                      "as preempted")
    assert "0 times" not in out and "supervisor" not in out


def test_u23_a_max_price_below_the_cheapest_spot_price_is_warned_of(cli):
    from cloudtrain import catalog

    cheapest = catalog.get("g5.xlarge").price("us-east-1", "spot")
    warning = (f"--max-price $0.1/h is below the cheapest spot price of g5.xlarge in us-east-1 "
               f"(${cheapest:.4f}/h in the catalog): EC2 starts no instance while spot costs "
               "more")
    args = ("launch", "--instance", "g5.xlarge", "--region", "us-east-1", "--spot",
            "--max-price", "0.1")
    out = cli.ok(*args, "--dry-run", "--", "true").stdout
    assert f"  WARNING      {warning}" in out.splitlines()
    # a launch says it on stderr, terminal or not (here it stops later: no credentials)
    proc = cli(*args, "-y", "--", "true", env={"AWS_ACCESS_KEY_ID": "",
                                               "AWS_SECRET_ACCESS_KEY": "",
                                               "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                                               "AWS_CONFIG_FILE": "/nonexistent"})
    assert f"WARNING: {warning}" in proc.stderr.splitlines(), proc.stderr
    above = cli.ok(*args[:-1], f"{cheapest:.4f}", "--dry-run", "--", "true").stdout
    assert "WARNING" not in above


def _spec(**kw) -> JobSpec:
    return JobSpec.of(kind="command", backend="aws", command=["true"], instance_type="g5.xlarge",
                   market="spot", recover=True, **kw)


def test_F13_relaunch_places_other_regions_then_on_demand():
    settings = Settings(regions="us-west-2, us-east-1")
    assert recovery.places(_spec(fallback="on-demand"), settings, "us-east-1") == [
        ("us-east-1", "spot"), ("us-west-2", "spot"),
        ("us-east-1", "on-demand"), ("us-west-2", "on-demand")]
    # data on an EBS snapshot lives in one region
    snap = _spec(datasets=[{"name": "imagenet", "kind": "snapshot"}])
    assert recovery.places(snap, settings, "us-east-1") == [("us-east-1", "spot")]


def test_F13_a_relaunch_tries_the_interrupted_zone_last_and_keeps_the_job_store_region():
    before = Attempt(job_id="j", n=1, started_at=0.0, region="us-east-1", zone="us-east-1b")
    spec, facts = recovery.attempt_spec(_spec(max_price=0.5), 2, "us-east-1", "spot", before,
                                        "us-east-1")
    assert (facts.attempt, facts.avoid_zones, facts.store_region) == (2, ("us-east-1b",),
                                                                      "us-east-1")
    assert spec.placement.max_price == 0.5
    elsewhere, facts = recovery.attempt_spec(_spec(max_price=0.5), 2, "us-west-2", "on-demand",
                                             before, "us-east-1")
    assert facts.avoid_zones == () and elsewhere.placement.max_price is None
    assert facts.store_region == "us-east-1"


def test_F13_redone_steps_and_their_price_per_attempt(ct_home):
    from cloudtrain.state import Instance, open_store

    store = open_store(ct_home)
    job = store.create_job(name=None, kind="command", recipe=None, command="x", backend="aws",
                           spec={"recover": True})
    for n, (iid, start, end) in enumerate([("i-1", 1000.0, 1700.0), ("i-2", 1800.0, 2500.0)],
                                          1):
        store.add_instance(Instance(id=iid, job_id=job.id, provider="aws", region="us-east-1",
                                    zone="us-east-1a", instance_type="g5.xlarge", market="spot",
                                    state="terminated", launched_at=start, terminated_at=end,
                                    price_per_hour=3.6, details={}))
        store.add_attempt(job.id, n, started_at=start, instance_id=iid, running_at=start + 100)
    # attempt 1 ran steps 0..600 in 600 s (1 s a step), attempt 2 resumed from step 500
    store.update_attempt(job.id, 1, ended_at=1700.0, outcome="interrupted", last_step=600)
    store.update_attempt(job.id, 2, resumed_step=500, last_step=1200, ended_at=2500.0,
                         outcome="succeeded")
    rows = attempts.summary(store, store.job(job.id))
    assert [r["redone_steps"] for r in rows] == [100, None]
    assert rows[0]["redone_usd"] == pytest.approx(100 * 1.0 * 3.6 / 3600)
    totals = attempts.recovery_cost(rows)
    assert totals == {"attempts": 2, "interruptions": 1, "redone_steps": 100,
                      "redone_usd": round(100 * 3.6 / 3600, 4)}
    assert json.dumps(rows)  # what `status --json` prints


def test_RC5_each_attempt_row_carries_its_azs_placement_score(ct_home):
    """RC5: the attempts summary carries the score the launch recorded on the attempt's
    instance (placement_score), so `status JOB` can show it beside the AZ; none where the
    record has none (or something that is not a whole number)."""
    from cloudtrain.state import Instance, open_store

    store = open_store(ct_home)
    job = store.create_job(name=None, kind="command", recipe=None, command="x", backend="aws",
                           spec={"recover": True})
    for n, details in enumerate([{"placement_score": 9}, {"placement_score": "9"}, {}], 1):
        store.add_instance(Instance(id=f"i-{n}", job_id=job.id, provider="aws",
                                    region="us-east-1", zone="us-east-1a",
                                    instance_type="g5.xlarge", market="spot", state="terminated",
                                    launched_at=1000.0 * n, terminated_at=1000.0 * n + 500,
                                    price_per_hour=1.0, details=details))
        store.add_attempt(job.id, n, started_at=1000.0 * n, instance_id=f"i-{n}")
    rows = attempts.summary(store, store.job(job.id))
    assert [r["score"] for r in rows] == [9, None, None]


def test_the_dry_run_says_who_relaunches_a_spot_job_and_where(cli, ct_home):
    """Issue 27: with an instance profile (a replacement reads the job's bundle with it) a
    recovering spot job is relaunched by AWS Auto Scaling, and the plan says so and what it
    does not do; without one, or with a fallback AWS cannot follow, the supervisor here does,
    and the plan says why, and that it needs this machine on."""
    args = ("launch", "--instance", "g5.xlarge", "--region", "us-east-1", "--spot",
            "--dry-run", "--", "true")
    line = next(l for l in cli.ok(*args).stdout.splitlines()
                if l.strip().startswith("recovery"))
    assert "relaunched by a supervisor on this machine (only while it is on)" in line
    assert "set `instance_profile:` in config.yaml to let AWS Auto Scaling do it" in line
    config = ct_home / "config.yaml"
    config.write_text(config.read_text() + "instance_profile: cloudtrain-instance\n")
    line = next(l for l in cli.ok(*args).stdout.splitlines()
                if l.strip().startswith("recovery"))
    assert "relaunched by AWS Auto Scaling in the region's AZs (the job's group)" in line
    assert "no move to another region or to on-demand" in line
    fallback = cli.ok(*args[:-3], "--fallback", "on-demand", "--dry-run", "--", "true").stdout
    line = next(l for l in fallback.splitlines() if l.strip().startswith("recovery"))
    assert "then on-demand" in line and "--fallback on-demand or more regions" in line
    # Issue 38: a deadline's switch is made by the job's own instances, laptop closed
    due = cli.ok(*args[:-3], "--max-runtime", "60", "--deadline", "+12h", "--dry-run", "--",
                 "true").stdout
    line = " ".join(due.split("  recovery ", 1)[1].split("\n  ")[0].split())
    assert "relaunched by AWS Auto Scaling" in line and "past the deadline's switch, the " \
        "instance that stops sets the group to on-demand, so AWS's next one is" in line, line
    nodes = cli.ok(*args[:-3], "--nodes", "2", "--max-runtime", "60", "--deadline", "+12h",
                   "--dry-run", "--", "true").stdout
    line = " ".join(nodes.split("  recovery ", 1)[1].split("\n  ")[0].split())
    assert "relaunched by a supervisor on this machine" in line and "on several nodes" in line


def test_RD3_a_gpus_job_s_group_may_take_the_same_gpus_and_at_most_bounds_the_dearest(
        cli, ct_home):
    """RD3, RC1: where --gpus chose the type, the launch tries the types of the same GPUs
    with at least its resources after its own, and AWS Auto Scaling's group may take them,
    said in the plan; 'at most' and the budget's bound are the dearest of them; --instance
    keeps its one type."""
    import re

    config = ct_home / "config.yaml"
    config.write_text(config.read_text() + "instance_profile: cloudtrain-instance\n")
    base = ("launch", "--region", "us-east-1", "--spot", "--max-runtime", "60")

    def plan(*args: str) -> str:
        return " ".join(cli.ok(*base, *args, "--dry-run", "--", "true").stdout.split())

    gpus, instance = plan("--gpus", "A10G:1"), plan("--instance", "g5.xlarge")
    assert "instance g5.xlarge:" in gpus and "; then g5.2xlarge, g5.4xlarge (the same GPUs, " \
        "at least its vCPUs, memory and instance store) where no AZ has capacity for it" in gpus
    assert "(the job's group, on g5.xlarge or g5.2xlarge, g5.4xlarge: the same GPUs" in gpus
    assert "(the job's group)," in instance and "on g5.xlarge or" not in instance

    def most(text: str) -> float:
        return float(re.search(r"at most \$([0-9.]+):", text).group(1))

    assert most(gpus) > most(instance)
    budget = plan("--gpus", "A10G:1", "--budget", "30")
    from cloudtrain import catalog

    dearest = catalog.get("g5.4xlarge").on_demand["us-east-1"]
    assert f"spot counted at the price EC2 reads in the instance's AZ, at most ${dearest:.4f}/h" \
        in budget, budget


def test_issue38_a_relaunch_after_the_deadline_s_slack_runs_out_goes_on_demand(ct_home):
    """A spot job with a deadline: its relaunch stays on spot while the work left, with the
    interruptions seen, fits before the deadline (the timeline says until when); once the
    slack is out, the relaunch tries on-demand in the same regions, and says why."""
    from cloudtrain.state import open_store

    store = open_store(ct_home)
    now = 1_800_000_000.0
    spec = _spec(max_restarts=3, args={"epochs": 10}, expected={"train_s": 3600.0},
                 deadline_at=now + 5 * 3600)
    job = store.create_job(name=None, kind="command", recipe=None, command="x", backend="aws",
                           spec=spec.to_dict())
    store.add_attempt(job.id, 1, started_at=now - 1200, running_at=now - 1100)
    store.update_attempt(job.id, 1, ended_at=now - 100, outcome="interrupted", market="spot")
    store.update_job(job.id, metrics={"epoch": 2})
    order = [("us-east-1", "spot"), ("us-west-2", "spot"), ("us-east-1", "on-demand")]
    job = store.job(job.id)
    assert recovery.work_left(job) == pytest.approx(3600.0 * 0.8)
    assert recovery.deadline_places(store, job, order, now=now) == order
    said = [e.detail for e in store.events(job.id) if e.phase == "deadline"]
    assert said and said[-1].startswith("spot until ")
    # An hour before it, 48 min of work and the restarts no longer fit on spot.
    late = now + 4 * 3600
    assert recovery.deadline_places(store, job, order, now=late) == [
        ("us-east-1", "on-demand"), ("us-west-2", "on-demand")]
    said = [e.detail for e in store.events(job.id) if e.phase == "deadline"]
    assert said[-1].startswith("on-demand: the switch was at "), said[-1]
    # RC7: with a reservation, on-demand is the reservation: its region only
    held = store.create_job(name=None, kind="command", recipe=None, command="x", backend="aws",
                            spec=spec.changed(reservation="cr-0123456789abcdef0").to_dict())
    store.add_attempt(held.id, 1, started_at=now - 1200, running_at=now - 1100)
    store.update_attempt(held.id, 1, ended_at=now - 100, outcome="interrupted", market="spot")
    store.update_job(held.id, metrics={"epoch": 2})
    assert recovery.deadline_places(store, store.job(held.id), order, now=late) == [
        ("us-east-1", "on-demand")]


def test_issue38_a_job_whose_deadline_spot_cannot_meet_launches_on_demand(cli):
    """Before anything is paid: an hour of work (the max runtime bounds an own command's)
    and the restarts interruptions would cost do not fit in 70 minutes on spot; on-demand
    does: the plan's market is on-demand, and its deadline line says why."""
    out = cli.ok("launch", "--instance", "g5.xlarge", "--spot", "--max-runtime", "60",
                 "--deadline", "+70m", "--dry-run", "--", "sleep", "1").stdout
    assert "  market       on-demand" in out, out
    line = " ".join(out.split("  deadline ", 1)[1].split("\n  ")[0].split())
    assert ": on-demand: the switch was at " in line and "no longer fits before the " \
        "deadline, on-demand does" in line, line
    roomy = cli.ok("launch", "--instance", "g5.xlarge", "--spot", "--max-runtime", "60",
                   "--deadline", "+12h", "--dry-run", "--", "sleep", "1").stdout
    assert "  market       spot" in roomy and ": spot until " in roomy


def test_F13_an_attempt_reached_at_least_the_step_the_next_one_resumes_from(ct_home):
    """F13 (CI found the race): the last step seen here of an interrupted attempt comes from
    its metrics, read every few seconds, and can lag behind the checkpoint it streamed: the
    next attempt resumed from step 10 while attempt 1's last step read 8, and its redone
    steps came out negative. An attempt ran at least to the step the next one resumes from."""
    from cloudtrain.lifecycle import attempts
    from cloudtrain.state import open_store

    store = open_store(ct_home)
    job = store.create_job(name=None, kind="command", recipe=None, command="x", backend="aws",
                           spec=_spec().to_dict())
    store.add_attempt(job.id, 1, started_at=1.0)
    store.update_attempt(job.id, 1, last_step=8, outcome="interrupted")
    store.add_attempt(job.id, 2, started_at=2.0)
    attempts.resuming(store, job.id, 2, {"seq": 2, "step": 10})
    assert store.attempt(job.id, 1).last_step == 10
    store.update_attempt(job.id, 1, last_step=12)  # seen further than the checkpoint: kept
    attempts.resuming(store, job.id, 2, {"seq": 2, "step": 10})
    assert store.attempt(job.id, 1).last_step == 12
    row = attempts.summary(store, store.job(job.id))[0]
    assert row["redone_steps"] == 2
