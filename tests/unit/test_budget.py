"""cloudtrain/host/budget.py: a job's budget kept by its own instances (issue 38). The meter's
arithmetic against EC2's billing rules, the spot price read through the Query API from the
lab's spot market (moto's server, signed with the role's credentials from a fake IMDS), the
attempts before read from the job store's records, and the agent stopping a real job
(stopped: budget) before it crosses the budget."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import boto3
import pytest
from hypothesis import given, settings, strategies as st

from cloudtrain.host import auto_scaling, awsapi, budget, bundle_reader, job_records
from labs.aws import moto_endpoint  # noqa: F401  (fixture)
from labs.credentials import CLIENT_CREDS, REGION
from labs.imds import FakeIMDS
from labs.polling import wait_for
from labs.shipped_host import command
from labs.spot_market import SpotMarket

T0 = 1_800_000_000.0  # 2027-01-15


def conf(**over) -> dict:
    base = {"usd": 10.0, "spent_before_usd": 0.0, "nodes": 1, "instance_per_h": 36.0,
            "other_per_h": 0.0, "spot": False, "type": "g5.xlarge", "region": REGION,
            "endpoint": None, "imds_url": None, "reserve_s": 60.0}
    base.update(over)
    checked = budget.check(base)
    assert checked is not None
    return checked


def test_issue38_on_demand_is_billed_by_the_second_with_ec2_s_first_minute():
    """$36/h is a cent a second: 10 s into the run the first minute is billed (60 s, $0.60),
    after it each second; two nodes bill twice; the attempts before are added."""
    m = budget.Meter(conf(nodes=2, spent_before_usd=1.5, other_per_h=3.6), launched_at=T0)
    assert m.spent(T0 + 10) == pytest.approx(1.5 + 2 * 0.66)
    assert m.spent(T0 + 100) == pytest.approx(1.5 + 2 * 1.1)
    assert m.rate(T0 + 100) == pytest.approx(2 * 39.6)


def test_issue38_the_stop_is_asked_when_the_spend_and_the_stop_s_own_cost_reach_the_budget():
    """Budget $10 at a cent a second, 60 s reserved for the stop: asked at 940 s (spent $9.40
    + $0.60 for the stop), not a second before."""
    m = budget.Meter(conf(), launched_at=T0)
    assert not m.over(T0 + 939)
    assert m.over(T0 + 940)
    assert m.at_stop(T0 + 940) == pytest.approx(10.0)


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_issue38_what_is_spent_never_falls_and_a_stop_once_due_stays_due(a, b):
    m = budget.Meter(conf(spot=True), launched_at=T0)
    m.points = [(T0 - 100, 5.0), (T0 + 300, 50.0), (T0 + 900, 1.0)]  # 50 > the $36 bound
    t1, t2 = sorted((T0 + a, T0 + b))
    assert m.spent(t1) <= m.spent(t2) + 1e-9
    assert not m.over(t1) or m.over(t2)


def test_issue38_a_spot_second_is_billed_at_the_price_in_force_never_above_on_demand():
    """Each second at the price in force then (EC2's piecewise-constant history); a price
    above the on-demand bound is counted at the bound (spot's default maximum price)."""
    m = budget.Meter(conf(spot=True), launched_at=T0)
    m.points = [(T0 - 100, 3.6), (T0 + 600, 72.0)]
    assert m.spent(T0 + 600) == pytest.approx(0.6)
    assert m.spent(T0 + 700) == pytest.approx(0.6 + 1.0)  # 100 s at the $36 bound
    m.points = []
    assert m.spent(T0 + 100) == pytest.approx(1.0)  # no price read yet: the bound


@settings(max_examples=200)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20))
def test_issue38_any_json_is_a_checked_budget_or_none_never_a_crash(doc):
    got = budget.check(doc)
    assert got is None or (got["usd"] > 0 and got["nodes"] >= 1)
    spend = job_records.check_spend(doc)
    assert spend is None or (0 <= spend["usd"] <= job_records.USD_MAX)


def test_issue38_a_budget_that_is_not_one_is_none():
    for bad in ({"usd": 0}, {"usd": -1}, {"usd": float("nan")}, {"usd": True},
                dict(conf(), usd="10"), dict(conf(), nodes=0), dict(conf(), reserve_s=-1)):
        assert budget.check(bad if "nodes" in bad else dict(conf(), **bad)) is None


@pytest.fixture
def imds():
    server = FakeIMDS(creds={"AccessKeyId": "ASIAJOBROLE1", "SecretAccessKey": "s1",
                             "Token": "t1"})
    yield server
    server.close()


def test_issue38_the_instance_reads_its_az_s_spot_price_with_its_role(
        moto_endpoint, imds, monkeypatch):  # noqa: F811
    """DescribeSpotPriceHistory through the Query API, signed with the role's credentials:
    the instance's AZ and type only, from before its launch; a change while it runs is
    billed from its time on."""
    market = SpotMarket().install(monkeypatch)
    market.set("g5.xlarge", "us-east-1a", [(T0 - 7200, 0.36), (T0 + 3600, 0.72)])
    market.set("g5.xlarge", "us-east-1b", [(T0 - 7200, 9.0)])
    market.set("p3.2xlarge", "us-east-1a", [(T0 - 7200, 9.0)])
    m = budget.Meter(conf(spot=True, endpoint=moto_endpoint), "us-east-1a", launched_at=T0)
    creds = awsapi.RoleCredentials(imds.url)
    m.refresh(lambda p: auto_scaling.ask("ec2", p, REGION, creds, moto_endpoint))
    assert m.price_note is None and m.points == [(T0 - 7200, 0.36), (T0 + 3600, 0.72)]
    assert m.spent(T0 + 7200) == pytest.approx(0.36 + 0.72)
    assert market.asked[-1] == {"types": ["g5.xlarge"], "zone": "us-east-1a"}


def test_issue38_a_price_that_cannot_be_read_is_counted_at_the_bound_and_said(imds):
    m = budget.Meter(conf(spot=True), "us-east-1a", launched_at=T0)
    keeper = budget.Keeper(m, lambda p: (False, "UnauthorizedOperation: not allowed", ""),
                           log=(said := []).append)
    keeper.check_price()
    assert m.points == [] and m.spent(T0 + 100) == pytest.approx(1.0)
    assert said == ["the spot price could not be read (UnauthorizedOperation: not allowed): "
                    "counted at the bound, $36.0000/h"]
    keeper.check_price()  # not due again before PRICE_S, and said once
    assert len(said) == 1


def test_issue38_the_launch_time_is_the_identity_document_s_pending_time(imds):
    imds.metadata["127.0.0.1"] = {"/latest/dynamic/instance-identity/document": json.dumps(
        {"instanceId": "i-0123456789abcdef0", "pendingTime": "2027-01-15T08:00:00Z"})}
    assert budget.pending_at(imds.url) == budget.iso_time("2027-01-15T08:00:00Z")
    imds.metadata["127.0.0.1"] = {"/latest/dynamic/instance-identity/document": "[1]"}
    assert budget.pending_at(imds.url) is None


def test_issue38_the_attempts_before_are_read_from_their_records(moto_endpoint, imds):  # noqa: F811
    """A replacement started by AWS Auto Scaling carries the first attempt's job.json: what
    attempts 1..n-1 spent comes from their progress records, a record that is not an
    attempt's last counted UNSEEN_S longer at its rate, a forged one left out."""
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_endpoint, **CLIENT_CREDS)
    s3.create_bucket(Bucket="cloudtrain-lab")
    prefix = "jobs/KEY/ab12cd34/"
    put = lambda n, doc: s3.put_object(Bucket="cloudtrain-lab",  # noqa: E731
                                       Key=job_records.progress_key(prefix, n),
                                       Body=json.dumps(doc).encode())
    put(1, job_records.progress_doc(1, 10, 10, usd={"usd": 0.5, "rate": 36.0, "final": True}))
    put(2, job_records.progress_doc(2, 20, 20, usd={"usd": 0.25, "rate": 36.0}))
    put(3, dict(job_records.progress_doc(4, 1, 1), usd={"usd": 100.0, "rate": 1.0}))  # not 3's
    put(4, job_records.progress_doc(4, 30, None, usd={"usd": 1e300, "rate": 1.0}))  # not one
    reader = bundle_reader.Bundle("cloudtrain-lab", prefix, REGION, moto_endpoint, imds.url)
    usd, seen = budget.earlier(reader, prefix, 6)
    assert seen == 2
    assert usd == pytest.approx(0.5 + 0.25 + 36.0 * budget.UNSEEN_S / 3600)


def test_issue38_the_agent_stops_a_job_at_its_budget_as_stopped(tmp_path, imds):
    """A real run: at a cent a second with a $0.90 budget, its first minute billed and 20 s
    kept for the stop, the agent asks for the stop once $0.70 is spent (70 s after the
    identity document's launch, here 65 s ago): the job checkpoints on SIGTERM and ends
    stopped: budget; status.json shows the spend as it runs."""
    launched = float(int(time.time() - 65))  # the document has whole seconds
    imds.metadata["127.0.0.1"] = {"/latest/dynamic/instance-identity/document": json.dumps(
        {"pendingTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(launched))})}
    (tmp_path / "run.sh").write_text("trap 'echo checkpoint-saved; exit 143' TERM\n"
                                     "echo training\nwhile true; do sleep 0.05; done\n")
    (tmp_path / "job.json").write_text(json.dumps({
        "heartbeat_s": 0.2, "grace_s": 5,
        "budget": dict(conf(usd=0.9, reserve_s=20.0), imds_url=imds.url)}))
    proc = subprocess.Popen([sys.executable, command("agent"), "run", str(tmp_path)],
                            stdout=subprocess.DEVNULL)
    try:
        status_file = tmp_path / "status.json"
        wait_for(lambda: status_file.exists() and "budget" in json.loads(
            status_file.read_text() or "{}"), timeout=20, interval=0.1,
            what="the spend in status.json")
        early = json.loads((tmp_path / "status.json").read_text())
        assert early["budget"]["usd"] == 0.9 and 0.6 <= early["budget"]["spent"] < 0.7
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "stopped", status
    assert status["reason"].startswith("budget: $0.70")
    assert time.time() - launched >= 70
    log = (tmp_path / "output.log").read_text()
    assert "checkpoint-saved" in log and "budget $0.90: spent $0.6" in log


def test_issue38_a_job_stopped_at_its_budget_powers_off_without_the_shutdown_delay(tmp_path):
    """Every second after the stop bills against the budget: once the results are stored,
    the agent powers off at once rather than wait its 30 s shutdown delay for a collect."""
    from test_agent import FAKE_UPLOAD, _after_job
    from cloudtrain.host import agent_upload

    # the real uploader's module, its upload_job a stand-in that stores nothing
    uploader = open(agent_upload.__file__).read() + "\n" + FAKE_UPLOAD
    jobdir, status, _, offs, took = _after_job(
        tmp_path, {"results_store": {"url": "https://bucket/x"}, "shutdown_delay_s": 30,
                   "budget": dict(conf(usd=0.5), imds_url="http://127.0.0.1:9")},
        upload=uploader, run_sh="trap 'exit 143' TERM\nwhile true; do sleep 0.05; done\n")
    # (EC2's first minute alone is $0.60, over the $0.50)
    assert status["state"] == "stopped" and status["reason"].startswith("budget: $0.6000")
    assert status["results_stored"]["ok"] is True
    assert len(offs) == 1 and took < 15


def test_issue38_a_budget_that_cannot_be_kept_stops_the_job_rather_than_let_it_spend(tmp_path):
    """An instance whose agent cannot keep the budget (here its host package lacks what the
    meter needs) does not run on unmetered: the job is stopped (its checkpoint saved as at any
    stop), failed, saying why."""
    from test_agent import _after_job

    jobdir, status, _, offs, _ = _after_job(
        tmp_path, {"results_store": {"url": "https://bucket/x"}, "shutdown_delay_s": 0,
                   "budget": conf(usd=50.0)},
        run_sh="trap 'echo checkpoint-saved; exit 143' TERM\nwhile true; do sleep 0.05; done\n")
    assert status["state"] == "failed", status
    assert status["reason"].startswith("the budget cannot be kept: ImportError")
    assert "checkpoint-saved" in (jobdir / "output.log").read_text() and len(offs) == 1


def test_issue38_an_attempt_without_its_end_runs_on_only_until_the_next_was_launched(
        moto_endpoint, imds):  # noqa: F811
    """AWS Auto Scaling replaces an instance once it is gone: an attempt whose last record is
    not its end is counted on until the next attempt's launch (its record's `since`, or this
    attempt's own), not the whole UNSEEN_S."""
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_endpoint, **CLIENT_CREDS)
    s3.create_bucket(Bucket="cloudtrain-lab")
    prefix = "jobs/KEY/ab12cd34/"
    for n, at, since in ((1, T0 + 100, T0), (2, T0 + 400, T0 + 130)):
        s3.put_object(Bucket="cloudtrain-lab", Key=job_records.progress_key(prefix, n),
                      Body=json.dumps(job_records.progress_doc(n, 1, 1, at=at, usd={
                          "usd": 1.0, "rate": 36.0, "since": since})).encode())
    reader = bundle_reader.Bundle("cloudtrain-lab", prefix, REGION, moto_endpoint, imds.url)
    usd, seen = budget.earlier(reader, prefix, 3, launched_at=T0 + 410)
    assert seen == 2
    assert usd == pytest.approx(2.0 + 30 * 0.01 + 10 * 0.01)  # 30 s to attempt 2, 10 s to 3


def test_RD3_an_instance_of_another_of_its_group_s_types_counts_with_that_type_s_bound():
    """RD3: a group of several types of the same GPUs: job.json's budget names each type's
    bound (its on-demand price); an instance counts with its own type's, reads its own
    type's spot price, and a type not named (or a bound that is not a number) keeps the
    job's."""
    c = conf(instance_per_h=1.624, bounds={"g5.xlarge": 1.006, "g5.2xlarge": 1.212,
                                            "g5.4xlarge": 1.624, "g5.8xlarge": "x"})
    assert c["bounds"] == {"g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624}
    two = budget.of_type(c, "g5.2xlarge")
    assert (two["type"], two["instance_per_h"]) == ("g5.2xlarge", 1.212)
    assert budget.of_type(c, "g5.8xlarge") == c and budget.of_type(c, None) == c
    meter = budget.Meter(two, launched_at=T0, clock=lambda: T0 + 3600)
    assert meter.spent() == pytest.approx(1.212)
