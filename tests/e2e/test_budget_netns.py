"""Issue 38's budget end to end, with the laptop closed: a spot job with a budget below its
full cost, launched into its Auto Scaling group (tests/labs/asg.py plays AWS Auto Scaling,
the lab's spot market answers DescribeSpotPriceHistory), the launching machine killed, its
first instance taken back with a notice mid-training, the replacement resuming from the
stored checkpoint and counting what the first attempt spent from its record in the job store,
then stopping the job at the budget by itself: `stopped: budget`, its last checkpoint in the
store, nothing left, and the bill the launching machine settles afterwards within a minute's
price under the budget."""

from __future__ import annotations

import os
import time

import pytest

from labs.cloud import autoscaled_lab
from labs.netns import netns_available
from labs.polling import wait_for
from labs.spot_market import SpotMarket

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"),
              pytest.mark.slow]
pytest.importorskip("torch")

# Longer than the budget lets it run: 200 epochs of 16 steps, a checkpoint each.
RESNET9_LONG = ("--recipe", "resnet9", "--profile", "smoke", "--set", "epochs=200",
                "--set", "synthetic_train=2048", "--set", "batch_size=128",
                "--set", "ghost_splits=4")
SPOT_PER_H = 1.0  # g5.xlarge's spot price in every lab AZ (its on-demand bound: $1.006)


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    with autoscaled_lab(cli, ct_home, tmp_path, monkeypatch, "ct-e2e-budget",
                        "ct-instance") as lab:
        yield lab


def test_issue38_laptop_closed_a_spot_job_stops_at_its_budget_across_two_attempts(
        lab, cli, ct_home, monkeypatch):
    market = SpotMarket().install(monkeypatch)
    for zone in "abcdef":
        market.set("g5.xlarge", f"us-east-1{zone}", [(time.time() - 86400, SPOT_PER_H)])
    budget = 0.062  # about 220 s of the job's billing, the least one attempt could fit
    job_id = cli.launch(*RESNET9_LONG, "--instance", "g5.xlarge", "--spot", "--budget",
                        f"{budget}", timeout=300)
    name = f"cloudtrain-{job_id}"
    (first,) = lab.asg.wait_for_group(name, 1)
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("epoch"), timeout=180,
             what="the first streamed checkpoint")
    lab.asg.kill_launching_machine()
    lab.imds.announce(first.ip)  # a notice: the agent stores its checkpoint and powers off
    wait_for(lambda: first.id not in [i.id for i in lab.asg.live(name)]
             or first.power_off_at is not None, timeout=120, what="the notice's end")
    if first.id in [i.id for i in lab.asg.live(name)]:
        lab.take_back({"InstanceId": first.id, "PrivateIpAddress": first.ip})
    replacement = wait_for(lambda: next((i for i in lab.asg.live(name) if i.id != first.id),
                                        None), timeout=120, what="the replacement")
    wait_for(lambda: not {k: v for k, v in lab.asg.leftovers().items() if v}, timeout=400,
             interval=1.0, what="the job to stop at its budget and its group to go")

    job = cli.job(job_id)  # the first cloudtrain command since the laptop closed
    assert job["state"] == "stopped", (job["reason"], job["timeline"])
    assert job["reason"].startswith("budget: $"), job["reason"]
    attempts = job["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[1]["instance"] == replacement.id
    stored = lab.stored_checkpoint(job_id)
    assert 0 < stored["epoch"] < 200, stored  # stopped, not finished
    assert attempts[1]["resumed_step"] is not None, attempts
    # The bill, as the launching machine settles it from EC2's times and the spot market:
    # under the budget by no more than a minute of the job's price.
    out = cli.ok("status", job_id).stdout
    settled = cli.job(job_id)
    spent = settled["cost"]
    minute = (SPOT_PER_H + 0.02) / 60
    assert settled["cost_settled"] and budget - minute <= spent <= budget, (spent, out)
    assert "  state     stopped: budget: $" in out
    assert f"  budget    ${budget:.2f}: ${spent:.2f} spent ({spent / budget:.0%}); its " \
        "instances stopped it there (stopped: budget)" in out, out
