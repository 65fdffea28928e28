"""What a job on the AWS path cost, end to end against moto: EC2's own launch and
termination times, the spot price history of the instance's AZ (moto's placeholder prices
replaced by real-looking ones), the root volume, and `cost-report` to the cent."""

from __future__ import annotations

import datetime
import json
import sqlite3
import time

import pytest
from moto.core.responses import ActionResult
from moto.ec2.responses.spot_instances import SpotInstances

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.pricing import price_list  # noqa: F401  (fixture)

GP3 = 0.08 / (730 * 3600)  # USD per GB-second, us-east-1


def _instance(ct_home, job_id):
    db = sqlite3.connect(ct_home / "state.db")
    db.row_factory = sqlite3.Row
    (row,) = db.execute("SELECT * FROM instances WHERE job_id = ?", (job_id,)).fetchall()
    return dict(row)


def _report(cli):
    return json.loads(cli.ok("cost-report", "--json").stdout)


def test_on_demand_job_costs_price_times_billed_seconds(cli, aws, ct_home):
    proc = cli("launch", "--instance", "g5.xlarge", "--disk-gb", "100", "--follow", "--quiet",
               "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    inst = _instance(ct_home, job_id)
    raw = aws.instances()[0]
    assert inst["launched_at"] == raw["LaunchTime"].timestamp()  # EC2's clock, not ours
    assert inst["terminated_at"] >= inst["launched_at"]
    billed = max(60.0, inst["terminated_at"] - inst["launched_at"])  # a short run: 60 s
    expected = 1.006 * billed / 3600 + 100 * GP3 * billed
    report = _report(cli)
    assert report["total"]["settled"] is True
    assert report["rows"][0]["dollars"] == pytest.approx(expected, abs=1e-9)
    assert round(report["total"]["dollars"], 2) == round(expected, 2)
    detail = cli.job(job_id)
    assert detail["cost_settled"] == 1
    phases = detail["cost_detail"]["phases"]
    assert sum(phases.values()) == pytest.approx(expected, abs=1e-9)
    assert cli.ok("status").stdout.splitlines()[1].endswith("$0.02")


def test_RH5_a_public_ipv4_address_is_in_the_bill(cli, aws, ct_home):
    """RH5: every public IPv4 address bills $0.005 an hour (since 2024-02-01), and the cost
    left it out. An instance in a subnet that maps public addresses holds one: its record
    says so (from DescribeInstances), and the job's cost counts it for as long as the
    instance ran, by the second, with no 60 s minimum; without one nothing is added."""
    from cloudtrain.providers.aws import instances

    for subnet in aws.subnets.values():
        aws.ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": True})
    proc = cli("launch", "--instance", "g5.xlarge", "--disk-gb", "100", "--follow", "--quiet",
               "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    inst = _instance(ct_home, job_id)
    assert json.loads(inst["details"])["public_ipv4"] == 1  # read while it ran
    ran = inst["terminated_at"] - inst["launched_at"]
    billed = max(60.0, ran)
    expected = 1.006 * billed / 3600 + 100 * GP3 * billed + 0.005 * ran / 3600
    report = _report(cli)
    assert report["rows"][0]["dollars"] == pytest.approx(expected, abs=1e-9)
    # DescribeInstances' shapes: none, the instance's one, one per interface that has one
    assert instances.public_ipv4s({}) == 0
    assert instances.public_ipv4s({"NetworkInterfaces": [
        {"Association": {"PublicIp": "3.3.3.3"}}, {"Association": {"PublicIp": "4.4.4.4"}},
        {}]}) == 2


def test_spot_job_pays_the_price_history_including_a_change(cli, aws, ct_home, monkeypatch):
    change = time.time() + 3  # the price rises while the instance runs
    history = [(change - 3600, "0.4000"), (change, "0.5500")]

    def spot_price_history(self):
        zone = self._get_param("AvailabilityZone")
        return ActionResult({"SpotPriceHistory": [
            {"InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX", "SpotPrice": price,
             "AvailabilityZone": zone,
             "Timestamp": datetime.datetime.fromtimestamp(at, datetime.timezone.utc)}
            for at, price in history]})

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", spot_price_history)
    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--disk-gb", "50", "--follow",
               "--quiet", "--", "sleep", "5")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    inst = _instance(ct_home, job_id)
    stored = json.loads(inst["details"])["spot_history"]
    assert [p[1] for p in stored] == [0.40, 0.55]
    change = stored[1][0]  # as EC2 (moto) reported it, to the second
    start, end = inst["launched_at"], inst["terminated_at"]
    assert start < change < start + 60
    # Under a minute: the first 60 s are billed, at the prices in force over them.
    expected = (0.40 * (change - start) + 0.55 * (start + 60 - change)) / 3600 + 50 * GP3 * 60
    assert end - start < 60
    report = _report(cli)
    assert report["total"]["settled"] is True
    assert report["total"]["dollars"] == pytest.approx(expected, abs=1e-9)
    assert round(report["total"]["dollars"], 2) == round(expected, 2)
    by_instance = json.loads(cli.ok("cost-report", "--by", "instance", "--json").stdout)
    assert by_instance["rows"][0]["instance"].startswith(inst["id"])


def test_cost_report_groupings_and_csv(cli, aws, ct_home):
    for _ in range(2):
        assert cli("launch", "--instance", "g5.xlarge", "--follow", "--", "true").returncode == 0
    by_recipe = json.loads(cli.ok("cost-report", "--by", "recipe", "--json").stdout)
    assert [r["recipe"] for r in by_recipe["rows"]] == ["(own command)"]
    assert by_recipe["rows"][0]["jobs"] == 2
    csv_text = cli.ok("cost-report", "--by", "month", "--csv").stdout.splitlines()
    assert csv_text[0] == "month,jobs,usd,settled,usd_to_target,usd_data_copy"
    assert csv_text[-1].startswith("total,2,")
    assert "no jobs in that period" in cli.ok("cost-report", "--since", "0m").stdout
    proc = cli("cost-report", "--since", "3x")
    assert proc.returncode == 2 and "--since 3x" in proc.stderr


def test_catalog_refresh_takes_current_spot_prices_from_ec2(cli, aws, price_list, monkeypatch):
    now = time.time()
    rows = [("us-east-1a", now - 7200, "0.6100"), ("us-east-1a", now - 60, "0.3900"),
            ("us-east-1b", now - 300, "0.4700")]

    def spot_price_history(self):
        return ActionResult({"SpotPriceHistory": [
            {"InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX", "SpotPrice": price,
             "AvailabilityZone": zone,
             "Timestamp": datetime.datetime.fromtimestamp(at, datetime.timezone.utc)}
            for zone, at, price in rows]})

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", spot_price_history)
    proc = cli("catalog", "--refresh", "--region", "us-east-1", "--gpu", "A10G", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "from EC2 now" in proc.stderr
    g5 = [t for t in json.loads(proc.stdout)["types"] if t["instance_type"] == "g5.xlarge"][0]
    assert g5["spot_snapshot"]["us-east-1"] == {"us-east-1a": 0.39, "us-east-1b": 0.47}
    # The dry run now quotes the live price.
    out = cli.ok("launch", "--instance", "g5.xlarge", "--spot", "--dry-run", "--", "true").stdout
    assert "$0.3900/h (cheapest AZ: EC2 spot price fetched " in out


def test_RC6_a_price_ec2_lists_for_amazon_vpc_only_counts_and_linux_unix_wins_over_it(
        cli, aws, ct_home, monkeypatch):
    """RC6: an account from before EC2-VPC became the default may see its instances' spot
    prices as "Linux/UNIX (Amazon VPC)". Both descriptions are asked for (the lab answers
    only those asked, as EC2 does); where EC2 has both for a type and AZ, "Linux/UNIX" is
    the price, never a mix of the two series. Checked for the catalog's current prices and
    for the history a bill is priced from."""
    from cloudtrain.config import Settings
    from cloudtrain.providers.aws import pricing
    from cloudtrain.providers.aws.session import AwsSession

    now = time.time()
    vpc = "Linux/UNIX (Amazon VPC)"
    rows = [("us-east-1a", vpc, now - 600, "0.3900"), ("us-east-1a", vpc, now - 60, "0.4100"),
            ("us-east-1b", "Linux/UNIX", now - 300, "0.4700"),
            ("us-east-1b", vpc, now - 30, "0.9900")]
    asked = []

    def spot_price_history(self):
        wanted = self._get_param("ProductDescriptions", [])
        zone = self._get_param("AvailabilityZone")
        asked.append(sorted(wanted))
        return ActionResult({"SpotPriceHistory": [
            {"InstanceType": "g5.xlarge", "ProductDescription": what, "SpotPrice": price,
             "AvailabilityZone": z,
             "Timestamp": datetime.datetime.fromtimestamp(at, datetime.timezone.utc)}
            for z, what, at, price in rows if what in wanted and zone in (None, z)]})

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", spot_price_history)
    aws_session = AwsSession(Settings.load())
    assert pricing.current_spot_prices(aws_session, "us-east-1", ["g5.xlarge"]) == {
        "g5.xlarge": {"us-east-1a": 0.41, "us-east-1b": 0.47}}
    assert asked[-1] == sorted(pricing.LINUX)
    history = pricing.spot_history(aws_session, "us-east-1", "us-east-1a", "g5.xlarge",
                                   now - 3600, now)
    assert [p[1] for p in history] == [0.39, 0.41]
    history = pricing.spot_history(aws_session, "us-east-1", "us-east-1b", "g5.xlarge",
                                   now - 3600, now)
    assert [p[1] for p in history] == [0.47]


def test_a_running_job_shows_its_cost_so_far_as_an_estimate(cli, aws, ct_home):
    from labs.polling import wait_for

    job_id = cli.launch("--instance", "g5.xlarge", "--", "bash", "-c", "echo up; sleep 60")
    wait_for(lambda: "up" in cli.ok("logs", job_id).stdout, timeout=30, what="job output")
    job = cli.job(job_id)
    assert job["state"] == "running" and job["cost_settled"] == 0
    assert job["cost"] > 0  # the 60 s minimum is already due
    row = [line for line in cli.ok("status").stdout.splitlines() if job_id in line][0]
    assert row.endswith("~$0.02")
    cli.ok("down", job_id)
    assert cli.job(job_id)["cost_settled"] == 1


def test_catalog_refresh_takes_on_demand_and_gp3_prices_from_the_price_list(
        cli, aws, price_list, ct_home):
    """A price change on AWS's list reaches the catalog, the dry run, estimates and the cost
    of the next job, to the cent."""
    price_list.instance("us-east-1", "g5.xlarge", "1.1000000000")
    price_list.instance("us-east-1", "p3.2xlarge", "3.0600000000")
    price_list.instance("eu-west-1", "g5.xlarge", "9.9900000000")  # another region: ignored
    price_list.gp3("us-east-1", "0.0900000000")
    proc = cli("catalog", "--refresh", "--region", "us-east-1", "--gpu", "A10G", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "on-demand prices for 2 of" in proc.stderr and "(1 differ from before)" in proc.stderr
    assert "gp3 $0.09/GB-month" in proc.stderr
    data = json.loads(proc.stdout)
    g5 = [t for t in data["types"] if t["instance_type"] == "g5.xlarge"][0]
    assert g5["on_demand"]["us-east-1"] == 1.10
    assert data["on_demand_source"].startswith("AWS price list fetched ")
    # Every query asked for Linux, shared tenancy, no pre-installed software, used capacity.
    for asked in price_list.requests:
        if "instanceType" in asked:
            assert asked["operatingSystem"] == "Linux" and asked["tenancy"] == "Shared"
            assert asked["preInstalledSw"] == "NA" and asked["capacitystatus"] == "Used"
            assert asked["regionCode"] == "us-east-1"

    out = cli.ok("launch", "--instance", "g5.xlarge", "--dry-run", "--", "true").stdout
    assert "$1.1000/h (AWS price list fetched " in out

    proc = cli("launch", "--instance", "g5.xlarge", "--disk-gb", "100", "--follow", "--quiet",
               "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    inst = _instance(ct_home, job_id)
    seconds = max(60.0, inst["terminated_at"] - inst["launched_at"])
    expected = 1.10 * seconds / 3600 + 100 * 0.09 * seconds / (730 * 3600)
    assert inst["price_per_hour"] == 1.10
    assert round(_report(cli)["total"]["dollars"], 2) == round(expected, 2)
    assert _report(cli)["total"]["dollars"] == pytest.approx(expected, rel=1e-9)


def test_the_estimate_shown_before_launch_is_kept_beside_the_bill(cli, aws, tmp_path,
                                                                   monkeypatch):
    root = tmp_path / "recipes"
    (root / "pub").mkdir(parents=True)
    (root / "pub" / "recipe.yaml").write_text(
        "name: pub\ndescription: published\nentry: train.py\narguments: {}\n"
        "resources: {disk_gb: 50}\n"
        "published:\n  - {result: '94%', time: '26 s', gpu: V100, gpus: 1, seconds: 26}\n")
    (root / "pub" / "train.py").write_text("print('trained')\n")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(root))
    proc = cli("launch", "--recipe", "pub", "--instance", "g5.xlarge", "--follow")
    assert proc.returncode == 0, proc.stderr
    line = [l for l in proc.stderr.splitlines() if l.startswith("estimate:")][0]
    assert "training 46s (x125/70 TFLOPS from V100)" in line and "on-demand" in line
    job_id = json.loads(cli.ok("status", "--json").stdout)[0]["id"]
    expected = cli.job(job_id)["spec"]["expected"]
    assert expected["train_s"] == pytest.approx(26 * 125 / 70)
    assert expected["market"] == "on-demand" and expected["usd"] > 0
    shown = cli.ok("status", job_id).stdout
    assert f"estimated ${expected['usd']:,.4f} before launch: training 46s" in shown
