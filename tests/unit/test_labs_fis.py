"""The lab's AWS Fault Injection Service (tests/labs/fis.py) refuses and does what FIS's
documentation says, on moto in this process: a lab with a metadata table and a take_back
standing in for the namespace lab's."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

REGION = "us-east-1"
TRUST_FIS = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "fis.amazonaws.com"}}]}


@pytest.fixture
def aws(monkeypatch):
    from labs.fis import FaultInjection

    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(var, value)
    with moto.mock_aws():
        taken: list[str] = []
        lab = SimpleNamespace(imds=SimpleNamespace(metadata={}, spot_actions={}),
                              take_back=lambda inst, reason: (
                                  taken.append(inst["InstanceId"]),
                                  ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])))
        fis_lab = FaultInjection(lab, monkeypatch, minute=0.05).install()
        ec2 = boto3.client("ec2", region_name=REGION)
        iam = boto3.client("iam", region_name=REGION)
        iam.create_role(RoleName="cloudtrain-fis", AssumeRolePolicyDocument=json.dumps(TRUST_FIS))
        iam.create_role(RoleName="ec2-only", AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [dict(TRUST_FIS["Statement"][0], Principal={
                "Service": "ec2.amazonaws.com"})]}))
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        yield SimpleNamespace(ec2=ec2, fis=boto3.client("fis", region_name=REGION),
                              lab=fis_lab, taken=taken, lab_ns=lab, image=image)
        fis_lab.close()


def _instance(aws, spot: bool) -> str:
    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    return aws.ec2.run_instances(ImageId=aws.image, InstanceType="t3.micro", MinCount=1,
                                 MaxCount=1, **extra)["Instances"][0]["InstanceId"]


def _template(aws, instance_id: str, role: str = "cloudtrain-fis", duration: str = "PT2M",
              action: str = "aws:ec2:send-spot-instance-interruptions",
              resource_type: str = "aws:ec2:spot-instance", selection: str = "ALL") -> str:
    arn = f"arn:aws:ec2:{REGION}:123456789012:instance/{instance_id}"
    return aws.fis.create_experiment_template(
        clientToken=str(time.time()), description="t",
        roleArn=f"arn:aws:iam::123456789012:role/{role}", stopConditions=[{"source": "none"}],
        targets={"i": {"resourceType": resource_type, "resourceArns": [arn],
                       "selectionMode": selection}},
        actions={"a": {"actionId": action, "parameters": {"durationBeforeInterruption": duration},
                       "targets": {"SpotInstances": "i"}}})["experimentTemplate"]["id"]


@pytest.mark.parametrize("change, why", [
    ({"duration": "PT1M"}, "between PT2M and PT15M"),
    ({"duration": "PT16M"}, "between PT2M and PT15M"),
    ({"action": "aws:ec2:terminate-everything"}, "unknown action id"),
    ({"resource_type": "aws:ec2:instance"}, "takes a aws:ec2:spot-instance target"),
    ({"selection": "SOME"}, "invalid selectionMode"),
    ({"role": "nobody"}, "does not exist"),
    ({"role": "ec2-only"}, "does not name fis.amazonaws.com"),
])
def test_a_template_fis_refuses_is_refused(aws, change, why):
    instance = _instance(aws, spot=True)
    with pytest.raises(aws.fis.exceptions.ClientError) as err:
        _template(aws, instance, **change)
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert why in err.value.response["Error"]["Message"]


def test_an_on_demand_instance_is_no_target_and_the_experiment_fails(aws):
    template = _template(aws, _instance(aws, spot=False))
    started = aws.fis.start_experiment(clientToken="x", experimentTemplateId=template)
    got = aws.fis.get_experiment(id=started["experiment"]["id"])["experiment"]
    assert got["state"]["status"] == "failed" and aws.taken == []


def test_a_spot_instance_hears_the_notice_then_is_interrupted_and_the_experiment_completes(aws):
    instance = _instance(aws, spot=True)
    ip = aws.ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0][
        "PrivateIpAddress"]
    started = aws.fis.start_experiment(clientToken="y", experimentTemplateId=_template(
        aws, instance, duration="PT3M"))["experiment"]["id"]
    assert aws.fis.get_experiment(id=started)["experiment"]["state"]["status"] == "running"
    # At once: the rebalance recommendation; the notice two (lab) minutes before the end.
    assert "noticeTime" in json.loads(aws.lab_ns.imds.metadata[ip][
        "/latest/meta-data/events/recommendations/rebalance"])
    deadline = time.time() + 5
    while aws.fis.get_experiment(id=started)["experiment"]["state"]["status"] == "running":
        assert time.time() < deadline
        time.sleep(0.01)
    assert aws.lab_ns.imds.spot_actions[ip]["action"] == "terminate"
    assert aws.taken == [instance]
    assert [e["event"] for e in aws.lab.events] == ["started", "notice", "interrupted",
                                                    "completed"]


def test_a_stopped_experiment_never_interrupts(aws):
    instance = _instance(aws, spot=True)
    started = aws.fis.start_experiment(clientToken="z", experimentTemplateId=_template(
        aws, instance, duration="PT5M"))["experiment"]["id"]
    aws.fis.stop_experiment(id=started)
    time.sleep(0.4)
    assert aws.fis.get_experiment(id=started)["experiment"]["state"]["status"] == "stopped"
    assert aws.taken == []
