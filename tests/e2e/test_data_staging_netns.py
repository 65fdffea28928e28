"""Issue 12 end to end: S3 staging through the real AWS path onto a namespace host. The tiny
ImageNet tree is pushed to a moto bucket with `cloudtrain data push`; the instance moto starts
is a network namespace (10.200.0.4) whose sshd answers at the private IP moto assigned; the
host's stager reads the bucket (moto on the bridge, 10.200.0.1) with the instance role's
credentials, fetched over the namespace's network from a fake IMDSv2 on the bridge; the
job then reads the staged copy, and everything is terminated.

The loopback version (same host namespace as the test) is
tests/integration/test_aws_data_staging.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import boto3
import pytest

from labs.aws import moto_lab
from labs.credentials import CLIENT_CREDS, REGION
from conftest import tiny_prepared_imagenet
from labs.imds import FakeIMDS
from labs.netns import GATEWAY, SUBNET, NetnsLab, lab_ip, netns_available
from labs.polling import wait_for

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd")]
pytest.importorskip("torch")

HOST_IP = lab_ip(4)  # the first address moto hands out in the lab's subnet
BRIDGE = str(GATEWAY)
BUCKET = "datasets-netns-e2e"
PROFILE = "cloudtrain-instance"
ROLE = "cloudtrain-instance-role"
ROLE_KEY, ROLE_SECRET, ROLE_TOKEN = "ASIANETNSROLEKEY0001", "netns-role-secret", "netns-role-tok"
IMDS_TOKEN = "imds-v2-token-netns"


def _tree(root: Path) -> dict[str, str]:
    """sha256 of every file under root (by relative path), hidden files and dirs aside."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts):
            out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def test_a_namespace_host_stages_s3_data_with_its_role_credentials_then_reads_it(
        cli, ct_home, tmp_path, monkeypatch):
    prepared = tiny_prepared_imagenet(tmp_path / "data", seed=7)
    source = _tree(prepared)
    assert len(source) > 10 and any(k.startswith("train/") for k in source)
    from moto.s3.responses import S3Response

    # every object GET moto's S3 answers (it runs in this process): (path, Authorization)
    s3_gets: list[tuple[str, str]] = []
    get_object = S3Response.get_object

    def recording_get_object(self):
        s3_gets.append((str(getattr(self, "path", "")), self.headers.get("Authorization") or ""))
        return get_object(self)

    monkeypatch.setattr(S3Response, "get_object", recording_get_object)
    tmux_socket = f"ct-e2e-staging-{os.getpid()}"
    monkeypatch.setenv("CLOUDTRAIN_TMUX_SOCKET", tmux_socket)
    with NetnsLab(tmp_path / "netns") as net, \
            moto_lab(BRIDGE, ct_home, tmp_path / "lab", monkeypatch, "10.200.0.0/16", {"us-east-1a": str(SUBNET)}) as lab:
        host = net.add_host(HOST_IP)
        imds = None
        try:
            imds = FakeIMDS(host=BRIDGE, role=ROLE, token=IMDS_TOKEN, creds={
                "AccessKeyId": ROLE_KEY, "SecretAccessKey": ROLE_SECRET, "Token": ROLE_TOKEN})
            sshd = host.start_sshd(client_key=lab.key)
            lab.serve_hosts(sshd)
            creds = {"endpoint_url": lab.endpoint, "region_name": REGION,
                     **CLIENT_CREDS}
            boto3.client("iam", **creds).create_instance_profile(InstanceProfileName=PROFILE)
            boto3.client("s3", **creds).create_bucket(Bucket=BUCKET)
            lab.write_config(ssh_port=22, ssh_wait_seconds=20.0, instance_profile=PROFILE,
                             imds_url=imds.url)

            cli.ok("data", "push", str(prepared), f"s3://{BUCKET}/imagenet", "--shard-mb", "1")
            # the job reads the copy (training on a staged copy is test_data_staging.py's)
            proc = cli("launch", "--instance", "g5.xlarge", "--data",
                       f"imagenet=s3://{BUCKET}/imagenet", "--follow", "--quiet", "--", "bash",
                       "-c", "find \"$CLOUDTRAIN_DATA_DIR/imagenet\" -name '*.JPEG' | wc -l",
                       timeout=240)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            job_id = proc.stdout.splitlines()[0]
            job = cli.job(job_id)
            assert job["state"] == "succeeded", job["reason"]
            assert str(sum(1 for _ in prepared.rglob("*.JPEG"))) in proc.stdout.splitlines()

            # The job ran on the namespace host, and its data is the pushed tree, file for file.
            (raw,) = lab.instances(**{"tag:cloudtrain:job": job_id})
            assert raw["PrivateIpAddress"] == HOST_IP
            assert sshd.connections() >= 1
            assert _tree(lab.work / "remote" / "data" / "imagenet") == source

            # The role's credentials came from the IMDS, asked by the namespace (not by this
            # process), token first and every GET carrying it.
            assert imds.seen, "the IMDS was never asked"
            assert set(imds.clients) == {HOST_IP}, imds.clients
            requests_seen = [(ip, *r) for ip, r in zip(imds.clients, imds.seen)]
            assert requests_seen[0][1:] == ("PUT", "/latest/api/token", "21600")
            gets = [r for r in requests_seen if r[1] == "GET"]
            assert [r[2] for r in gets][:2] == [
                "/latest/meta-data/iam/security-credentials/",
                "/latest/meta-data/iam/security-credentials/" + ROLE]
            assert all(r[3] == IMDS_TOKEN for r in gets), requests_seen
            assert all(r[3] for r in requests_seen if r[1] == "PUT"), requests_seen

            # The host read every shard signed with the role's key (SigV4), not the user's.
            shard_gets = [g for g in s3_gets if "/shards/" in g[0]]
            assert shard_gets, s3_gets
            for path, auth in shard_gets:
                assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={ROLE_KEY}/"), (path, auth)

            # The plan on the host: role auth, no presigned link, no secret.
            text = (lab.work / "remote" / "jobs" / job_id / "staging.json").read_text()
            plan = json.loads(text)
            (entry,) = plan["datasets"]
            assert entry["auth"] == "role", entry
            assert plan["imds_url"] == imds.url
            assert "X-Amz-Signature" not in text and "testing" not in text
            assert ROLE_SECRET not in text

            # The timeline: staging, then running.
            names = [p["name"] for p in job["timeline"]]
            assert "staging" in names and "running" in names, names
            assert names.index("staging") < names.index("running"), names
            phases = {p["name"]: p for p in job["timeline"]}
            assert phases["staging"]["start"] <= phases["running"]["start"]
            assert phases["running"]["detail"].startswith("data staged: imagenet ")

            # Nothing bills: the instance is terminated, and `down --all` leaves nothing.
            assert raw["State"]["Name"] == "terminated"
            cli.ok("down", "--all", "-y")
            running = [i for i in lab.instances() if i["State"]["Name"] != "terminated"]
            assert running == []
        finally:
            subprocess.run(["tmux", "-L", tmux_socket, "kill-server"], capture_output=True)
            if imds is not None:
                imds.close()


# -- RG5: onto the local NVMe of an instance Auto Scaling starts ----------------------------------

ASG_PROFILE = "ct-instance"
# what the job reads: where its data dir's imagenet leads, and the JPEGs through it
READ_DATA = ("echo \"link: $(readlink \"$CLOUDTRAIN_DATA_DIR/imagenet\" || echo none)\"; "
             "find \"$CLOUDTRAIN_DATA_DIR/imagenet/\" -name '*.JPEG' | wc -l")


@pytest.fixture
def asg_lab(cli, ct_home, tmp_path, monkeypatch):
    from labs.cloud import autoscaled_lab

    with autoscaled_lab(cli, ct_home, tmp_path, monkeypatch, "ct-e2e-nvme", ASG_PROFILE) as lab:
        yield lab


@pytest.mark.parametrize("nvme", ["mounted", "missing"])
def test_RG5_a_group_instance_stages_onto_its_local_nvme_or_says_why_not(
        asg_lab, cli, tmp_path, nvme):
    """RG5 end to end: a spot g5.xlarge job in its Auto Scaling group (the lab's instance
    runs in a mount namespace of its own, as an instance's disks are its own). Where the
    Deep Learning AMI mounted the NVMe at /opt/dlami/nvme (the lab mounts a folder of its own
    there), the copy lands on it, $CLOUDTRAIN_DATA_DIR/imagenet links to it and the job reads
    it through the link; where nothing is mounted there, the copy goes onto the root volume's
    data dir as before, and the timeline says why."""
    lab = asg_lab
    lab.asg.local_nvme = nvme
    prepared = tiny_prepared_imagenet(tmp_path / "data", seed=7)
    source = _tree(prepared)
    boto3.client("s3", endpoint_url=lab.endpoint, region_name=REGION,
                 **CLIENT_CREDS).create_bucket(Bucket=BUCKET)
    cli.ok("data", "push", str(prepared), f"s3://{BUCKET}/imagenet", "--shard-mb", "1")
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--data",
                        f"imagenet=s3://{BUCKET}/imagenet", "--", "bash", "-c", READ_DATA,
                        timeout=300)
    job = wait_for(lambda: (lambda j: j if j["state"] in ("succeeded", "failed") else None)(
        cli.job(job_id)), timeout=300, what="the job to end")
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    (inst,) = [i for i in lab.asg.instances.values() if i.group == f"cloudtrain-{job_id}"]
    log = cli.ok("logs", job_id).stdout
    assert str(sum(1 for _ in prepared.rglob("*.JPEG"))) in log.splitlines(), log[-2000:]
    staged = {p["name"]: p for p in job["timeline"]}["running"]["detail"]
    on_nvme = inst.dir / "nvme" / "cloudtrain" / "data" / "imagenet"  # the instance store
    if nvme == "mounted":
        assert staged.endswith("; onto the local NVMe (/opt/dlami/nvme/cloudtrain/data)"), staged
        assert _tree(on_nvme) == source
        assert "link: /opt/dlami/nvme/cloudtrain/data/imagenet" in log.splitlines()
    else:
        assert staged.endswith(
            "; onto the root volume (/home/ubuntu/.cloudtrain/data), not the local NVMe: "
            "/opt/dlami/nvme is not there (the image did not mount the local NVMe)"), staged
        assert "link: none" in log.splitlines()
        assert not on_nvme.exists()
