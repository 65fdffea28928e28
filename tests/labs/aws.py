"""An AWS stand-in for integration tests: moto's EC2/SSM/STS server in this process, a VPC
whose subnets are loopback ranges, and one real sshd listening on every address those
subnets can hand out, so the instance moto "starts" answers SSH at its private IP.

`moto_lab` is the one builder of "moto on an address + sshd hosts" for labs elsewhere (the
bridge of network-namespace hosts: tests/e2e, labs/cloud.py): the caller starts the hosts'
sshds, trusting `lab.key`, and hands them to `lab.serve_hosts`.

Faults are injected by patching moto's backend (it runs in this process, in a thread).
"""

from __future__ import annotations

import contextlib
import getpass
import ipaddress
import json
import stat
import sys
from pathlib import Path

import boto3
import pytest
import requests
from botocore.config import Config
from moto.server import ThreadedMotoServer

from cloudtrain.ssh import generate_ed25519

from .credentials import AWS_ENV, CLIENT_CREDS, REGION
from .loopback import free_port
from .moto_images import ImageFits, ImageRoots
from .moto_types import MotoTypes
from .moto_regions import EnabledRegions
from .moto_spot_scores import SpotScores
from .moto_templates import TemplateVersions
from .sshd import SSHD

SUBNETS = {"us-east-1a": "127.0.1.0/28", "us-east-1b": "127.0.2.0/28"}
DLAMI_PARAMETER = ("/aws/service/deeplearning/ami/x86_64/"
                   "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id")
UBUNTU_PARAMETER = ("/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/"
                    "ebs-gp3/ami-id")

SHUTDOWN_RECORDER = """#!{python}
# Stands in for `sudo shutdown -h now` on an instance launched with shutdown behaviour
# terminate: records the request, then terminates the instance in moto, as EC2 would.
import json, os, sys, time
import boto3
job = json.load(open(os.path.join(os.environ["CLOUDTRAIN_JOB_DIR"], "job.json")))["job_id"]
with open({log!r}, "a") as f:
    f.write(json.dumps({{"job": job, "at": time.time()}}) + "\\n")
ec2 = boto3.client("ec2", endpoint_url={endpoint!r}, region_name={region!r},
                   aws_access_key_id={key!r}, aws_secret_access_key={secret!r})
ids = [i["InstanceId"] for r in ec2.describe_instances(Filters=[
    {{"Name": "tag:cloudtrain:job", "Values": [job]}}])["Reservations"] for i in r["Instances"]]
if ids:
    ec2.terminate_instances(InstanceIds=ids)
"""

SUDO_SHIM = """#!/bin/bash
# The lab instance's sudo: only the power-off re-arm, recorded, never run.
[ "$1" = -n ] && shift
if [ "$1" = /usr/local/bin/cloudtrain-rearm ]; then
    echo "$2" >> {log}
    exit 0
fi
echo "lab sudo: refusing $*" >&2
exit 1
"""


class AWSLab:
    def __init__(self, endpoint: str, home: Path, work: Path):
        self.endpoint = endpoint
        self.home = home
        self.work = work
        self.ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION,
                                config=Config(retries={"max_attempts": 1}), **CLIENT_CREDS)
        self.shutdown_log = work / "shutdowns.jsonl"
        self.sshd: SSHD | None = None

    def build(self, ssh_port: int) -> None:
        """Loopback subnets, one sshd answering at every address they hand out."""
        public = self.build_cloud("127.0.0.0/16", SUBNETS)
        # moto hands out a subnet's addresses in order after the 3 AWS reserves (.4 first);
        # sshd takes at most 16 listen addresses: the first 8 of each subnet.
        listen = [str(ip) for cidr in SUBNETS.values()
                  for ip in list(ipaddress.ip_network(cidr).hosts())[3:11]]
        self.sshd = SSHD(self.work / "sshd", host=listen[0], port=ssh_port)
        self.sshd.authorize(public)
        self.sshd.listen_on(listen)
        self.install_sudo_shim()
        self.sshd.start()
        self.serve_hosts(self.sshd)

    def serve_hosts(self, *sshds: SSHD) -> None:
        """The instances moto starts are these sshds' hosts: like a real instance, each prints
        its host key's fingerprint on the console (one console text for every instance)."""
        self.console_output(self.fingerprint_block(*(s.host_key for s in sshds)))

    def install_sudo_shim(self) -> None:
        """What `sudo -n /usr/local/bin/cloudtrain-rearm N` does on the "instance": this
        machine has no sudo and must not get the real script (it would touch this machine's
        timers), so commands over the lab's SSH find a `sudo` that records the re-arm in
        rearms.log instead (sshd's SetEnv puts it first on PATH)."""
        shims = self.work / "instance-bin"
        shims.mkdir()
        self.rearm_log = self.work / "rearms.log"
        (shims / "sudo").write_text(SUDO_SHIM.format(log=self.rearm_log))
        (shims / "sudo").chmod(0o755)
        with open(self.sshd.config, "a") as f:
            f.write(f"SetEnv PATH={shims}:/usr/local/bin:/usr/bin:/bin\n")

    def rearms(self) -> list[str]:
        """The minutes each `cloudtrain-rearm` call on a lab instance asked for."""
        return self.rearm_log.read_text().split() if self.rearm_log.exists() else []

    @staticmethod
    def fingerprint_block(*keys: Path, fingerprints: tuple[str, ...] = ()) -> str:
        """Console text as cloud-init's keys-to-console prints it on Ubuntu (each line
        prefixed "ec2: "), for host key files (fingerprinted by ssh-keygen) or given
        fingerprints."""
        import subprocess

        lines = [subprocess.run(["ssh-keygen", "-l", "-f", f"{k}.pub"], capture_output=True,
                                text=True, check=True).stdout.strip() for k in keys]
        lines += [f"256 {fp} root@ip-10-0-0-1 (ED25519)" for fp in fingerprints]
        return "\r\n".join(
            ["[   12.3] cloud-init[1021]: Cloud-init v. 24.1 running 'modules:final'",
             "ec2: #############################################################",
             "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----"]
            + [f"ec2: {line}" for line in lines]
            + ["ec2: -----END SSH HOST KEY FINGERPRINTS-----",
               "ec2: #############################################################", ""])

    def console_output(self, text: str) -> None:
        """What moto's GetConsoleOutput returns for every instance from now on (moto serves
        one sample text from a module global; restore() puts it back)."""
        import moto.ec2.responses.general as general

        if not hasattr(self, "_console_original"):
            self._console_original = general.SAMPLE_CONSOLE_OUTPUT
        general.SAMPLE_CONSOLE_OUTPUT = text

    def restore(self) -> None:
        import moto.ec2.responses.general as general

        if hasattr(self, "_console_original"):
            general.SAMPLE_CONSOLE_OUTPUT = self._console_original

    def build_cloud(self, vpc_cidr: str, subnets: dict[str, str]) -> str:
        """VPC, subnets, the DLAMI (image + SSM parameter), cloudtrain's key and the shutdown
        recorder. Returns the public key line an sshd must trust."""
        vpc = self.ec2.create_vpc(CidrBlock=vpc_cidr)["Vpc"]["VpcId"]
        self.vpc = vpc
        self.subnets = {}
        for zone, cidr in subnets.items():
            self.subnets[zone] = self.ec2.create_subnet(
                VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
        image = self.ec2.register_image(
            Name="Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04) 20261101",
            RootDeviceName="/dev/sda1", Architecture="x86_64", EnaSupport=True)["ImageId"]
        self.ami = image
        publish_parameter(DLAMI_PARAMETER, image)
        # Canonical's Ubuntu 24.04, the image of a Volta type's job (providers/aws/images.py)
        self.ubuntu_ami = self.ec2.register_image(
            Name="ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20261120",
            RootDeviceName="/dev/sda1", Architecture="x86_64", BootMode="uefi-preferred",
            EnaSupport=True)["ImageId"]
        publish_parameter(UBUNTU_PARAMETER, self.ubuntu_ami)
        # cloudtrain's own key, made where it looks for it, so the sshd can trust it.
        key = self.home / "keys" / REGION / "cloudtrain_ed25519"
        key.parent.mkdir(parents=True, exist_ok=True)
        public = generate_ed25519(str(key))
        Path(f"{key}.pub").write_text(public + "\n")
        self.key = key
        recorder = self.work / "fake-shutdown"
        recorder.write_text(SHUTDOWN_RECORDER.format(
            python=sys.executable, log=str(self.shutdown_log), endpoint=self.endpoint,
            region=REGION, key=CLIENT_CREDS["aws_access_key_id"],
            secret=CLIENT_CREDS["aws_secret_access_key"]))
        recorder.chmod(recorder.stat().st_mode | stat.S_IXUSR)
        self.recorder = recorder
        return public

    def config(self, **overrides) -> dict:
        values = {
            "stop_grace_seconds": 2.0, "heartbeat_seconds": 0.5, "stale_after_seconds": 10.0,
            "region": REGION, "vpc_id": self.vpc, "connect": "private",
            "ssh_port": self.sshd.port if self.sshd else 22, "ssh_user": getpass.getuser(), "ssh_cidr": "127.0.0.1/32",
            "remote_python": sys.executable, "remote_root": str(self.work / "remote"),
            "shutdown_command": str(self.recorder), "shutdown_delay_seconds": 0.0,
            "instance_wait_seconds": 10.0, "ssh_wait_seconds": 5.0, "poll_seconds": 0.1,
            # No metadata service here: never let an agent ask 169.254.169.254.
            "imds_url": "",
        }
        values.update(overrides)
        return values

    def write_config(self, **overrides) -> None:
        (self.home / "config.yaml").write_text(
            "".join(f"{k}: {json.dumps(v)}\n" for k, v in self.config(**overrides).items()))

    def instances(self, **filters) -> list[dict]:
        f = [{"Name": k, "Values": [v]} for k, v in filters.items()]
        out = []
        for res in self.ec2.describe_instances(Filters=f)["Reservations"]:
            out.extend(res["Instances"])
        return out

    def tags(self, raw: dict) -> dict:
        return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}

    def shutdowns(self) -> list[dict]:
        if not self.shutdown_log.exists():
            return []
        return [json.loads(l) for l in self.shutdown_log.read_text().splitlines()]


@contextlib.contextmanager
def moto_server(host: str = "127.0.0.1"):
    """moto's server (EC2, S3, SSM, STS, IAM, ...) in this process on a free port of `host`
    (loopback, or the bridge that namespace hosts reach): yields its endpoint URL."""
    port = free_port(host)
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


# moto's reset empties every backend of every region: seconds on a loaded 2-core machine
# (10 s timed out twice in one CI run, with both workers training).
RESET_TIMEOUT_S = 120


def reset_moto(endpoint: str) -> None:
    """moto's server at `endpoint` emptied (every backend, every region)."""
    requests.post(f"{endpoint}/moto-api/reset", timeout=RESET_TIMEOUT_S)


def publish_parameter(name: str, value: str, region: str = REGION) -> None:
    """One of AWS's public /aws/service/... parameters (the DLAMI's id), as AWS publishes it:
    they cannot be put through the API (moto refuses reserved names as AWS does), so it goes
    into moto's backend of this process."""
    import datetime

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters[name].append(Parameter(
        account_id=DEFAULT_ACCOUNT_ID, name=name, value=value, parameter_type="String",
        description=None, allowed_pattern=None, keyid=None,
        last_modified_date=datetime.datetime.now(), version=1, data_type="text"))


def ec2_as_aws(monkeypatch) -> None:
    """EC2's behaviour that moto leaves out, for this test: a root volume no smaller than
    its image's snapshot, an image only on a type it boots on (labs/moto_images.py), the
    Volta types moto lacks (labs/moto_types.py), a launch template's later versions
    (labs/moto_templates.py), the regions enabled for the account (labs/moto_regions.py), a
    terminated instance that stays as it ended (terminated_stays_ended)."""
    terminated_stays_ended(monkeypatch)
    MotoTypes().install(monkeypatch)
    ImageRoots().install(monkeypatch)
    ImageFits().install(monkeypatch)
    TemplateVersions().install(monkeypatch)
    EnabledRegions().install(monkeypatch)


def terminated_stays_ended(monkeypatch) -> None:
    """TerminateInstances of an instance EC2 has terminated already changes nothing there
    (it answers with the state it is in); moto terminated it again, writing "User initiated
    (<now>)" over the time of its end, which the bill reads: a spot instance reclaimed
    minutes before `down` swept the job's instances was billed up to the sweep."""
    from moto.ec2.models.instances import Instance

    terminate = Instance.terminate

    def once(instance, *args, **kwargs):
        if instance._state.name == "terminated":
            return None
        return terminate(instance, *args, **kwargs)

    monkeypatch.setattr(Instance, "terminate", once)


def use_moto(endpoint: str, monkeypatch) -> None:
    """A fresh moto (reset) and this process's AWS (its environment, so the `cloudtrain`
    processes it starts too) pointed at it, as the fake account, with EC2's rules that moto
    leaves out (ec2_as_aws)."""
    from .freetier import free_tier

    reset_moto(endpoint)
    ec2_as_aws(monkeypatch)
    for k, v in {**AWS_ENV, "AWS_ENDPOINT_URL": endpoint,
                 # moto has no Free Tier API: the lab's stand-in, a Paid plan unless a test
                 # says otherwise (labs/freetier.py)
                 "AWS_ENDPOINT_URL_FREETIER": free_tier().url}.items():
        monkeypatch.setenv(k, v)


@contextlib.contextmanager
def moto_lab(host: str, home: Path, work: Path, monkeypatch, vpc_cidr: str,
             subnets: dict[str, str]):
    """Moto on `host` + sshd hosts: moto's server at `host`, reset, the environment pointed
    at it, and an AWSLab (in `work`) with a VPC of `subnets` ({zone: cidr}), the DLAMI,
    cloudtrain's key and the shutdown recorder. The caller starts its hosts' sshds trusting
    `lab.key` and passes them to `lab.serve_hosts`; moto stops and its console text is put
    back on exit. EC2's spot placement scores are answered (labs/moto_spot_scores.py: every
    AZ alike), as tests/conftest.py does for every test, for a benchmark's lab too."""
    with moto_server(host) as endpoint:
        use_moto(endpoint, monkeypatch)
        SpotScores().install(monkeypatch)
        lab = AWSLab(endpoint, home, work)
        lab.work.mkdir()
        lab.build_cloud(vpc_cidr, subnets)
        try:
            yield lab
        finally:
            lab.restore()


@pytest.fixture(scope="session")
def moto_endpoint():
    with moto_server() as endpoint:
        yield endpoint


def _plain_http_stands_in_for_tls(monkeypatch) -> None:
    """The lab reaches moto over plain HTTP where AWS is reached over TLS. The job store's
    bucket denies requests without TLS (aws:SecureTransport false), and moto, which cannot
    evaluate that condition, would then refuse every object read: such a policy is left out
    of moto's decision here (the policy itself is still checked by the job store's tests)."""
    from moto.iam.access_control import PermissionResult
    from moto.s3.models import FakeBucket

    original = FakeBucket.get_permission

    def get_permission(self, action, resource):
        if self.policy and b"aws:SecureTransport" in self.policy:
            return PermissionResult.NEUTRAL
        return original(self, action, resource)

    monkeypatch.setattr(FakeBucket, "get_permission", get_permission)


@pytest.fixture
def aws(moto_endpoint, ct_home, tmp_path, monkeypatch):
    use_moto(moto_endpoint, monkeypatch)
    _plain_http_stands_in_for_tls(monkeypatch)
    lab = AWSLab(moto_endpoint, ct_home, tmp_path / "lab")
    lab.work.mkdir()
    lab.build(free_port())
    lab.write_config()
    yield lab
    lab.sshd.stop()
    lab.restore()


@pytest.fixture
def stored_as(monkeypatch) -> dict:
    """{key: size}: objects that moto's S3 (in this process) lists at that size rather than
    their own, so that a test can store a 5 TiB shard in a few bytes. What a launch plans
    with is S3's listing; the bytes are read only on the instance."""
    from moto.s3.models import FakeKey

    sizes: dict[str, int] = {}
    own = FakeKey.size
    monkeypatch.setattr(FakeKey, "size", property(lambda key: sizes.get(key.name,
                                                                         own.fget(key))))
    return sizes


@pytest.fixture
def ec2_provider(monkeypatch, ct_home):
    """An AWSProvider against in-process moto (`mock_aws`): no sshd, for the provider's own
    EC2 logic. Settings: us-east-1, SSH from 127.0.0.1/32, short polls."""
    from moto import mock_aws

    from cloudtrain.config import Settings
    from cloudtrain.providers.aws import AWSProvider

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    ec2_as_aws(monkeypatch)
    with mock_aws():
        yield AWSProvider(Settings(region=REGION, ssh_cidr="127.0.0.1/32", poll_seconds=0.05))


def group_with_template(endpoint: str, name: str, region: str = REGION) -> tuple:
    """A launch template and an Auto Scaling group of one instance, both named `name`, in the
    moto server at `endpoint`, as the launch makes a recovering job's (providers/aws/groups.py,
    in short); returns its (autoscaling, ec2) clients and a function listing which of the two
    still exist: ([group] or [], [template] or [])."""
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint)
    asg = boto3.client("autoscaling", region_name=region, endpoint_url=endpoint)
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
    asg.create_auto_scaling_group(AutoScalingGroupName=name, MinSize=1, MaxSize=1,
                                  DesiredCapacity=1, AvailabilityZones=[f"{region}a"],
                                  LaunchTemplate={"LaunchTemplateName": name})

    def present() -> tuple[list, list]:
        return ([g["AutoScalingGroupName"] for g in asg.describe_auto_scaling_groups()[
            "AutoScalingGroups"] if g["AutoScalingGroupName"] == name],
                [t["LaunchTemplateName"] for t in ec2.describe_launch_templates()[
                    "LaunchTemplates"] if t["LaunchTemplateName"] == name])

    return asg, ec2, present


def fresh_store(endpoint: str, monkeypatch, bucket: str, region: str = REGION):
    """The moto server at `endpoint` emptied, this process's AWS settings the lab account's
    in `region`, and `bucket` made: returns its S3 client (an instance's tests then add the
    fake IMDS, labs.imds)."""
    from . import credentials

    reset_moto(endpoint)
    for k, v in credentials.aws_env(region).items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3", region_name=region, endpoint_url=endpoint)
    s3.create_bucket(Bucket=bucket)
    return s3


def instance_store(endpoint: str, monkeypatch, bucket: str, job: str, owner: str,
                   region: str = REGION) -> tuple:
    """The job store as an instance of job `job` meets it: the moto server emptied and
    `bucket` made (fresh_store), a fake IMDS that gives the instance role's credentials
    (labs.imds), and the job's upload grant as job.json carries it (jobstore.upload_grant,
    through JSON). Returns (s3, imds, grant); the caller closes imds."""
    from cloudtrain.providers.aws import jobstore

    from .imds import FakeIMDS

    s3 = fresh_store(endpoint, monkeypatch, bucket, region)
    imds = FakeIMDS(role="ct-instance")
    grant = json.loads(json.dumps(jobstore.upload_grant(s3, bucket, job, 600, 1 << 30,
                                                        owner_key=owner)))
    return s3, imds, grant
