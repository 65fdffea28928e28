"""Self-test of tests/labs/asg.py (issue 27's lab): moto's Auto Scaling groups behave as AWS's.
Launch templates and groups are made through boto3 against the lab's moto, as cloudtrain will
make them; each instance a group launches becomes a namespace host that runs the template's
user-data at boot; a lost instance is replaced in the other AZ; scheduled actions fire; a
deleted group's instances go, their processes too; a power-off from inside terminates the
instance in moto. Also the real infra/user-data.sh, rendered as the AWS provider renders it.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from labs.aws import AWSLab
from labs.credentials import REGION
from labs.cloud import cloud_lab
from labs.polling import wait_for
from labs.netns import SUBNET, netns_available

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd")]

ZONES = ("us-east-1a", "us-east-1b")
# A user-data that leaves a process behind (as cloudtrain's starts its agent) and exits.
SLEEPER = r"""#!/bin/bash
echo "user-data on $(hostname) as uid $(id -u)"
echo "ran $(date +%s)" > /home/ubuntu/marker
mkdir -p /var/lib/asg-lab-test && echo private > /var/lib/asg-lab-test/file
nohup sleep 600 >/dev/null 2>&1 &
echo "sleeper $!" | tee /var/lib/asg-lab-test/sleeper
"""


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    with cloud_lab(cli, ct_home, tmp_path, monkeypatch, [], f"ct-e2e-asg-{os.getpid()}",
                   autoscaling=True) as lab:
        yield lab
        assert lab.asg.errors() == []


def _client(lab, service: str):
    return boto3.client(service, endpoint_url=lab.endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 1}))


def _group(lab, name: str, user_data: str, size: int = 1, zones=ZONES, **template) -> None:
    """A launch template (`name`-lt) with this user-data and a group of `size` over `zones`,
    as cloudtrain makes them."""
    _client(lab, "ec2").create_launch_template(LaunchTemplateName=f"{name}-lt", LaunchTemplateData={
        "ImageId": lab.aws.ami, "InstanceType": "g5.xlarge",
        "InstanceInitiatedShutdownBehavior": "terminate",
        "UserData": base64.b64encode(user_data.encode()).decode(), **template})
    _client(lab, "autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=size, MaxSize=size, DesiredCapacity=size,
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt", "Version": "$Latest"},
        VPCZoneIdentifier=",".join(lab.aws.subnets[z] for z in zones),
        Tags=[{"Key": "cloudtrain:job", "Value": name, "PropagateAtLaunch": True}])


def _console(lab, instance_id: str) -> str:
    out = _client(lab, "ec2").get_console_output(InstanceId=instance_id).get("Output") or ""
    try:
        return base64.b64decode(out, validate=True).decode()
    except ValueError:
        return out


def _sleeper(inst) -> int:
    return int(inst.path("/var/lib/asg-lab-test/sleeper").read_text().split()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def _moto_state(lab, instance_id: str) -> dict:
    (found,) = lab.aws.instances(**{"instance-id": instance_id})
    return found


def test_a_groups_instance_is_a_host_that_runs_its_user_data(lab):
    """The group's instance gets a host at its private IP: its sshd, its home directory, its
    own /var; the user-data ran there once as root; the console shows the script's output,
    then the fingerprint block of that sshd's key (cloud-init's order); IMDS answers at
    169.254.169.254 with the instance's id and, the template naming an instance profile, the
    role's credentials."""
    iam = _client(lab, "iam")
    iam.create_role(RoleName="ct-job-role", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "ec2.amazonaws.com"}}]}))
    iam.create_instance_profile(InstanceProfileName="ct-job")
    iam.add_role_to_instance_profile(InstanceProfileName="ct-job", RoleName="ct-job-role")
    imds = ('T=$(curl -s -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" '
            'http://169.254.169.254/latest/api/token)\n'
            'for p in meta-data/instance-id meta-data/placement/availability-zone '
            'meta-data/iam/security-credentials/; do\n'
            '  echo "imds $p: $(curl -s -H "X-aws-ec2-metadata-token: $T" '
            'http://169.254.169.254/latest/$p)"; done\n')
    _group(lab, "g1", SLEEPER + imds, IamInstanceProfile={"Name": "ct-job"})
    (inst,) = lab.asg.wait_for_group("g1", 1)
    assert inst.user_data_exit == 0
    assert ipaddress.ip_address(inst.ip) in SUBNET and inst.zone in ZONES
    assert lab.hosts[inst.ip] is inst.host and lab.sshds[inst.ip] is inst.sshd
    # its home directory is the lab's (and its sessions'), its /var its own
    assert (lab.homes[inst.ip] / "marker").read_text().startswith("ran ")
    assert inst.path("/var/lib/asg-lab-test/file").read_text() == "private\n"
    assert not Path("/var/lib/asg-lab-test").exists()
    assert _alive(_sleeper(inst))
    # over SSH, in the same instance: what user-data installed is there
    from cloudtrain.ssh_host import SSHHost
    from cloudtrain.ssh import Endpoint

    ssh = SSHHost(Endpoint(inst.ip, 22, inst.sshd.user, str(lab.aws.key)))
    result = ssh.run("cat /var/lib/asg-lab-test/file; hostname; echo $HOME", check=True)
    assert result.stdout.split() == ["private", "ip-" + inst.ip.replace(".", "-"),
                                     str(lab.homes[inst.ip])]
    console = _console(lab, inst.id)
    assert f"user-data on ip-{inst.ip.replace('.', '-')} as uid 0" in console
    assert f"imds meta-data/instance-id: {inst.id}" in console
    assert f"imds meta-data/placement/availability-zone: {inst.zone}" in console
    assert "imds meta-data/iam/security-credentials/: ct-job-role" in console
    block = AWSLab.fingerprint_block(inst.sshd.host_key).split("\r\n", 1)[1]
    assert block in console and console.index("sleeper") < console.index(block)
    from cloudtrain.providers.aws.hostkeys import console_fingerprints

    key = subprocess.run(["ssh-keygen", "-l", "-f", f"{inst.sshd.host_key}.pub"],
                         capture_output=True, text=True, check=True).stdout.split()[1]
    assert console_fingerprints(console) == {key}
    found = _moto_state(lab, inst.id)
    assert found["IamInstanceProfile"]["Arn"].endswith("/ct-job")
    tags = lab.aws.tags(found)
    assert tags["aws:autoscaling:groupName"] == "g1" and tags["cloudtrain:job"] == "g1"
    assert [e["event"] for e in lab.asg.log() if e.get("instance") == inst.id][:4] == [
        "launch", "boot", "user-data-start", "user-data-exit"]


def test_a_lost_instance_is_replaced_in_the_other_az_once(lab):
    """Taken back by EC2 (spot): the group launches one replacement, in the other AZ, which
    runs its own user-data; the lost one's processes are gone. Terminated through EC2's API:
    one replacement again (moto made one of its own at once, in the same subnet)."""
    _group(lab, "g2", SLEEPER)
    (first,) = lab.asg.wait_for_group("g2", 1)
    sleeper = _sleeper(first)
    lab.take_back(_moto_state(lab, first.id))
    (second,) = wait_for(lambda: [i for i in lab.asg.wait_for_group("g2", 1)
                                  if i.id != first.id], timeout=30, what="the replacement")
    assert second.zone != first.zone and second.replaces == first.id
    assert (lab.homes[second.ip] / "marker").exists() and _alive(_sleeper(second))
    assert not _alive(sleeper)
    assert _moto_state(lab, first.id)["StateReason"]["Code"] == "Server.SpotInstanceTermination"
    start = next(e for e in lab.asg.log("user-data-start") if e["instance"] == second.id)
    lost = next(e for e in lab.asg.log("lost") if e["instance"] == first.id)
    print(f"\nlost -> replacement's user-data start: {start['t'] - lost['t']:.2f} s "
          f"(launch -> user-data start {start['since_launch_s']:.2f} s)")

    _client(lab, "ec2").terminate_instances(InstanceIds=[second.id])
    (third,) = wait_for(lambda: [i for i in lab.asg.wait_for_group("g2", 1)
                                 if i.id not in (first.id, second.id)], timeout=30,
                        what="the second replacement")
    assert third.zone != second.zone
    time.sleep(0.5)  # nothing more is launched
    assert [e["instance"] for e in lab.asg.log("launch")] == [first.id, second.id, third.id]
    groups = _client(lab, "autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
    assert [i["InstanceId"] for i in groups[0]["Instances"]] == [third.id]


def test_a_scheduled_action_sets_desired_0_at_its_time(lab):
    """A one-time scheduled action 2 s ahead sets desired 0: at its time the instance is
    terminated and its processes stopped; the action is gone afterwards, as on AWS."""
    asg = _client(lab, "autoscaling")
    _group(lab, "g3", SLEEPER)
    (inst,) = lab.asg.wait_for_group("g3", 1)
    sleeper = _sleeper(inst)
    with pytest.raises(ClientError, match="in the past"):
        asg.put_scheduled_update_group_action(
            AutoScalingGroupName="g3", ScheduledActionName="deadline", MinSize=0,
            DesiredCapacity=0, StartTime=datetime.now(timezone.utc) - timedelta(minutes=5))
    at = datetime.now(timezone.utc) + timedelta(seconds=2)
    asg.put_scheduled_update_group_action(AutoScalingGroupName="g3",
                                          ScheduledActionName="deadline", MinSize=0,
                                          MaxSize=0, DesiredCapacity=0, StartTime=at)
    time.sleep(1)
    assert lab.asg.live("g3") == [inst]  # not before its time
    lab.asg.wait_for_group("g3", 0, timeout=10)
    (applied,) = lab.asg.log("scheduled-action")
    assert applied["desired"] == 0 and applied["t"] >= at.timestamp()
    assert _moto_state(lab, inst.id)["State"]["Name"] == "terminated"
    wait_for(lambda: not _alive(sleeper), timeout=5, what="its processes to stop")
    assert inst.ip not in lab.net.hosts and inst.ip not in lab.homes
    assert asg.describe_scheduled_actions()["ScheduledUpdateGroupActions"] == []
    (group,) = asg.describe_auto_scaling_groups()["AutoScalingGroups"]
    assert group["DesiredCapacity"] == 0 and group["Instances"] == []


def test_deleting_a_group_needs_force_and_ends_its_instances(lab):
    """DeleteAutoScalingGroup without ForceDelete is refused while the group has instances,
    as on AWS; with it, both instances are terminated and their processes stopped; the
    launch template is deleted by a plain call; nothing is left."""
    asg, ec2 = _client(lab, "autoscaling"), _client(lab, "ec2")
    _group(lab, "g4", SLEEPER, size=2)
    pair = lab.asg.wait_for_group("g4", 2)
    assert {i.zone for i in pair} == set(ZONES)  # spread over the AZs
    sleepers = [_sleeper(i) for i in pair]
    with pytest.raises(ClientError, match="ResourceInUse"):
        asg.delete_auto_scaling_group(AutoScalingGroupName="g4")
    asg.delete_auto_scaling_group(AutoScalingGroupName="g4", ForceDelete=True)
    assert {_moto_state(lab, i.id)["State"]["Name"] for i in pair} == {"terminated"}
    lab.asg.wait_for_group("g4", 0, timeout=10)
    wait_for(lambda: not any(_alive(p) for p in sleepers), timeout=5,
             what="their processes to stop")
    ec2.delete_launch_template(LaunchTemplateName="g4-lt")
    assert lab.asg.leftovers() == {"instances": [], "volumes": [], "spot_requests": [],
                                   "groups": [], "launch_templates": [], "hosts": []}


def test_shutdown_in_user_data_terminates_the_instance(lab):
    """A user-data that runs `shutdown -h now`: EC2 terminates the instance (shutdown
    behaviour terminate), with the reason EC2 gives; its processes stop."""
    _group(lab, "g5", SLEEPER + "shutdown -h now\necho after\n")
    first = wait_for(lambda: next(iter(lab.asg.live("g5")), None), timeout=30,
                     what="the instance")
    wait_for(lambda: _moto_state(lab, first.id)["State"]["Name"] == "terminated", timeout=10,
             what="its termination")
    found = _moto_state(lab, first.id)
    assert found["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
    request = next(e for e in lab.asg.log("power-off-request") if e["instance"] == first.id)
    assert request["command"] == ["shutdown", "-h", "now"] and request["kind"] == "now"
    wait_for(lambda: first.terminated_at, timeout=5, what="its host to go")
    assert first.host.name not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                 text=True).stdout
    _client(lab, "autoscaling").delete_auto_scaling_group(AutoScalingGroupName="g5",
                                                          ForceDelete=True)


def test_the_labs_shutdown_command_on_an_instance_terminates_it(lab):
    """The agent's power-off as the lab's config names it (cloud_lab's recorder, standing for
    `sudo shutdown -h now`), run over SSH on a group's instance: the instance is terminated
    as EC2 does on an OS power-off, the call recorded with the job dir it came from; the
    group replaces the instance."""
    _group(lab, "g9", SLEEPER)
    (inst,) = lab.asg.wait_for_group("g9", 1)
    from cloudtrain.ssh_host import SSHHost
    from cloudtrain.ssh import Endpoint

    ssh = SSHHost(Endpoint(inst.ip, 22, inst.sshd.user, str(lab.aws.key)))
    ssh.run(f"CLOUDTRAIN_JOB_DIR=/jobs/x {lab.tmp / 'shutdown'}", check=True)
    wait_for(lambda: _moto_state(lab, inst.id)["State"]["Name"] == "terminated", timeout=10,
             what="its termination")
    assert _moto_state(lab, inst.id)["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
    (request,) = lab.asg.log("power-off-request")
    assert request["command"] == ["poweroff"] and request["jobdir"] == "/jobs/x"
    assert not lab.log.exists()  # this machine's recorder was not the one that ran
    (second,) = wait_for(lambda: [i for i in lab.asg.wait_for_group("g9", 1)
                                  if i.id != inst.id], timeout=30, what="the replacement")
    assert second.replaces == inst.id
    _client(lab, "autoscaling").delete_auto_scaling_group(AutoScalingGroupName="g9",
                                                          ForceDelete=True)


def _rendered_user_data(shutdown_command: str = "sudo shutdown -h now") -> str:
    """infra/user-data.sh as the AWS provider renders it for a job of 60 min max runtime."""
    from cloudtrain.config import Settings
    from cloudtrain.providers.aws import instances
    from cloudtrain.providers.aws.session import AwsSession
    from cloudtrain.spec import JobSpec
    from cloudtrain.state import Job

    job = Job(id="asglab01", name=None, kind="command", recipe=None, command="true",
              backend="aws", state="provisioning", created_at=0.0, started_at=None,
              ended_at=None, exit_code=None, reason=None, spec={}, host=None, jobdir=None,
              metrics=None, cost=None)
    spec = JobSpec.of(kind="command", backend="aws", command="true", instance_type="g5.xlarge",
                   max_runtime_s=3600)
    return instances.user_data(AwsSession(Settings(shutdown_command=shutdown_command)), job, spec)


def _watchdog(inst) -> int:
    marker = inst.path("/var/lib/cloudtrain/user-data-ran").read_text()
    return int(marker.split("watchdog_pid=")[1].split()[0])


def test_the_real_user_data_runs_on_a_lab_instance_with_its_timers_armed(lab):
    """infra/user-data.sh, unchanged, rendered as the AWS provider does, as an instance's
    user-data: it runs to its end (exit 0) inside the instance, installs the re-arm script
    there (not on this machine), arms the watchdog (a process in the instance) and the
    systemd power-off (`shutdown -h +90`, kept by the lab as systemd would); its log is on the
    console before the fingerprints. A group delete ends the watchdog with the instance."""
    _group(lab, "g6", _rendered_user_data())
    (inst,) = lab.asg.wait_for_group("g6", 1, timeout=60)
    assert inst.user_data_exit == 0, lab.asg.console(inst.id)
    assert inst.path("/var/lib/cloudtrain/user-data-done").exists()
    assert os.access(inst.path("/usr/local/bin/cloudtrain-rearm"), os.X_OK)
    assert not Path("/usr/local/bin/cloudtrain-rearm").exists()
    assert not Path("/var/lib/cloudtrain/user-data-ran").exists()
    watchdog = _watchdog(inst)
    assert b"cloudtrain-watchdog" in Path(f"/proc/{watchdog}/cmdline").read_bytes()
    assert inst.path("/var/lib/cloudtrain/shutdown-command").read_text() == "shutdown -h now\n"
    requests = [e["command"] for e in lab.asg.log("power-off-request")]
    assert requests == [["shutdown", "-c"],
                        ["shutdown", "-h", "+90", "cloudtrain: power-off in 90 min"]]
    assert 89 * 60 < inst.power_off_at - time.time() <= 90 * 60
    console = _console(lab, inst.id)
    assert "cloudtrain-user-data: job asglab01: hard power-off in 90 min" in console
    assert console.index("cloudtrain-user-data: done") < console.index("FINGERPRINTS")
    # the agent's re-arm over SSH, with sudo as on the DLAMI
    from cloudtrain.ssh_host import SSHHost
    from cloudtrain.ssh import Endpoint

    ssh = SSHHost(Endpoint(inst.ip, 22, inst.sshd.user, str(lab.aws.key)))
    ssh.run("sudo -n /usr/local/bin/cloudtrain-rearm 45", check=True)
    wait_for(lambda: inst.power_off_at and inst.power_off_at - time.time() <= 45 * 60,
             timeout=5, what="the re-armed power-off")
    assert 44 * 60 < inst.power_off_at - time.time()
    second = _watchdog(inst)
    assert second != watchdog and _alive(second)
    wait_for(lambda: not _alive(watchdog), timeout=5, what="the first watchdog to end")
    _client(lab, "autoscaling").delete_auto_scaling_group(AutoScalingGroupName="g6",
                                                          ForceDelete=True)
    lab.asg.wait_for_group("g6", 0, timeout=10)
    assert not _alive(second)


def test_the_user_data_watchdog_powers_the_instance_off_and_the_group_replaces_it(lab):
    """user-data.sh's watchdog (1 s here, its test override) runs the shutdown command: the
    instance is terminated as EC2 does on an OS power-off, and the group replaces it."""
    lab.asg.user_data_env["CLOUDTRAIN_UD_WATCHDOG_SECONDS"] = "1"
    _group(lab, "g7", _rendered_user_data())
    first = wait_for(lambda: next(iter(lab.asg.live("g7")), None), timeout=30,
                     what="the instance")
    wait_for(lambda: _moto_state(lab, first.id)["State"]["Name"] == "terminated", timeout=20,
             what="the watchdog's power-off")
    assert _moto_state(lab, first.id)["StateReason"]["Code"] == \
        "Client.InstanceInitiatedShutdown"
    wait_for(lambda: any(e["replaces"] == first.id for e in lab.asg.log("launch")),
             timeout=10, what="a replacement")
    _client(lab, "autoscaling").delete_auto_scaling_group(AutoScalingGroupName="g7",
                                                          ForceDelete=True)
    lab.asg.wait_for_group("g7", 0, timeout=10)


def test_kill_launching_machine_spares_the_instances(lab, ct_home):
    """The laptop closes: this test's cloudtrain processes here and its tmux server go; the
    same command line on an instance, and another CLOUDTRAIN_HOME's process here, stay."""
    _group(lab, "g8", SLEEPER)
    (inst,) = lab.asg.wait_for_group("g8", 1)
    looks_like = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "cloudtrain"]
    env = {**os.environ, "CLOUDTRAIN_HOME": str(ct_home)}
    here = subprocess.Popen(looks_like, env=env)
    other = subprocess.Popen(looks_like, env={**env, "CLOUDTRAIN_HOME": "/nonexistent"})
    there = subprocess.Popen([*inst.enter(), "env", f"CLOUDTRAIN_HOME={ct_home}", *looks_like])
    socket = os.environ["CLOUDTRAIN_TMUX_SOCKET"]
    subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-s", "ct-supervisor-x",
                    "sleep 60"], check=True)
    try:
        time.sleep(0.3)  # `nsenter` has exec'd python
        killed = lab.asg.kill_launching_machine()
        assert here.wait(timeout=5) == -9 and killed == [here.pid]
        assert other.poll() is None and there.poll() is None
        assert subprocess.run(["tmux", "-L", socket, "has-session"],
                              capture_output=True).returncode != 0
    finally:
        for proc in (here, other, there):
            proc.kill()
            proc.wait()
    _client(lab, "autoscaling").delete_auto_scaling_group(AutoScalingGroupName="g8",
                                                          ForceDelete=True)


def test_a_group_as_cloudtrain_makes_it_launches_spot_with_its_template(lab, monkeypatch):
    """A MixedInstancesPolicy group (spot above an on-demand base of 0, two types) over a
    template with a gp3 root volume, volume tags and instance-metadata tags, in a placement
    group: its instances are spot of the first override's type, in the placement group, with
    the template's volume (tagged, deleted with the instance: nothing left) and shutdown
    behaviour; IMDS serves their tags; the placement group is in use until the group goes."""
    from labs.moto_placement import PlacementGroups

    groups = PlacementGroups().install(monkeypatch)
    lab.asg.placement = groups
    ec2, asg = _client(lab, "ec2"), _client(lab, "autoscaling")
    ec2.create_placement_group(GroupName="job-pg", Strategy="cluster")
    ec2.create_launch_template(LaunchTemplateName="g10-lt", LaunchTemplateData={
        "ImageId": lab.aws.ami, "InstanceInitiatedShutdownBehavior": "terminate",
        "UserData": base64.b64encode(SLEEPER.encode()).decode(),
        "MetadataOptions": {"HttpTokens": "required", "InstanceMetadataTags": "enabled"},
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
            "VolumeSize": 100, "VolumeType": "gp3", "Encrypted": True,
            "DeleteOnTermination": True}}],
        "TagSpecifications": [{"ResourceType": "volume",
                               "Tags": [{"Key": "cloudtrain:job", "Value": "g10"}]}]})
    asg.create_auto_scaling_group(
        AutoScalingGroupName="g10", MinSize=2, MaxSize=2, DesiredCapacity=2,
        PlacementGroup="job-pg",
        VPCZoneIdentifier=",".join(lab.aws.subnets[z] for z in ZONES),
        Tags=[{"Key": "cloudtrain:job", "Value": "g10", "PropagateAtLaunch": True}],
        MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": "g10-lt",
                                                               "Version": "$Latest"},
                               "Overrides": [{"InstanceType": "g5.xlarge"},
                                             {"InstanceType": "g6.xlarge"}]},
            "InstancesDistribution": {"OnDemandBaseCapacity": 0,
                                      "OnDemandPercentageAboveBaseCapacity": 0,
                                      "SpotAllocationStrategy": "price-capacity-optimized"}})
    pair = lab.asg.wait_for_group("g10", 2)
    found = [_moto_state(lab, i.id) for i in pair]
    assert {f["InstanceType"] for f in found} == {"g5.xlarge"}
    assert {f.get("InstanceLifecycle") for f in found} == {"spot"}
    assert {f["Placement"]["GroupName"] for f in found} == {"job-pg"}
    volumes = ec2.describe_volumes()["Volumes"]
    assert sorted(v["Size"] for v in volumes) == [100, 100]
    assert all({"Key": "cloudtrain:job", "Value": "g10"} in v["Tags"] for v in volumes)
    attr = ec2.describe_instance_attribute(InstanceId=pair[0].id,
                                           Attribute="instanceInitiatedShutdownBehavior")
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    tags = lab.imds.metadata[pair[0].ip]
    assert tags["/latest/meta-data/tags/instance/cloudtrain:job"] == "g10"
    assert tags["/latest/meta-data/instance-life-cycle"] == "spot"
    with pytest.raises(ClientError, match="InUse"):
        ec2.delete_placement_group(GroupName="job-pg")
    asg.delete_auto_scaling_group(AutoScalingGroupName="g10", ForceDelete=True)
    lab.asg.wait_for_group("g10", 0, timeout=10)
    ec2.delete_placement_group(GroupName="job-pg")
    ec2.delete_launch_template(LaunchTemplateName="g10-lt")
    assert lab.asg.leftovers() == {"instances": [], "volumes": [], "spot_requests": [],
                                   "groups": [], "launch_templates": [], "hosts": []}
    assert ec2.describe_volumes()["Volumes"] == []


def test_a_new_distribution_keeps_the_rest_and_replaces_spot_launching_first(lab):
    """Issue 38's switch as AWS plays it: an update that names only the instances
    distribution (100% on-demand) keeps the group's template and overrides ("any
    properties that you don't specify are not changed"), and the group's spot instance is
    replaced: an on-demand one launched first, then the spot one terminated once the new one
    runs ("launches new instances before terminating the previous ones"); nothing more."""
    ec2, asg = _client(lab, "ec2"), _client(lab, "autoscaling")
    ec2.create_launch_template(LaunchTemplateName="g11-lt", LaunchTemplateData={
        "ImageId": lab.aws.ami, "InstanceInitiatedShutdownBehavior": "terminate",
        "UserData": base64.b64encode(SLEEPER.encode()).decode()})
    asg.create_auto_scaling_group(
        AutoScalingGroupName="g11", MinSize=1, MaxSize=1, DesiredCapacity=1,
        VPCZoneIdentifier=",".join(lab.aws.subnets[z] for z in ZONES),
        MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": "g11-lt",
                                                               "Version": "$Latest"},
                               "Overrides": [{"InstanceType": "g5.xlarge"}]},
            "InstancesDistribution": {"OnDemandBaseCapacity": 0,
                                      "OnDemandPercentageAboveBaseCapacity": 0}})
    (spot,) = lab.asg.wait_for_group("g11", 1)
    assert _moto_state(lab, spot.id).get("InstanceLifecycle") == "spot"
    asg.update_auto_scaling_group(AutoScalingGroupName="g11", MixedInstancesPolicy={
        "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 100}})
    new = wait_for(lambda: next((i for i in lab.asg.live("g11") if i.id != spot.id), None),
                   timeout=30, what="the on-demand replacement")
    found = _moto_state(lab, new.id)
    assert found.get("InstanceLifecycle") is None and found["InstanceType"] == "g5.xlarge"
    wait_for(lambda: _moto_state(lab, spot.id)["State"]["Name"] == "terminated", timeout=30,
             what="the spot instance terminated")
    launched = next(e["t"] for e in lab.asg.log("launch") if e["instance"] == new.id)
    ended = next(e["t"] for e in lab.asg.log("rebalance-terminate") if e["instance"] == spot.id)
    assert launched < ended
    time.sleep(0.5)  # nothing more is launched
    assert [e["instance"] for e in lab.asg.log("launch")] == [spot.id, new.id]
    assert [i.id for i in lab.asg.wait_for_group("g11", 1)] == [new.id]
    (group,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["g11"])[
        "AutoScalingGroups"]
    policy = group["MixedInstancesPolicy"]
    assert policy["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateName"] == \
        "g11-lt" and policy["LaunchTemplate"]["Overrides"] == [{"InstanceType": "g5.xlarge"}]
    assert policy["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"] == 100
