"""providers/aws/group_launch.py against moto in this process (issue 27; the module alone:
tests/unit/test_aws_group_launch.py): the launch through a group (boot.tar, the template's
user-data, the first instance, attempts/1.json); group_record reads what a job's instances
left in the job store while nobody watched (attempts/<n>.json and final.json, put here with
boto3, garbage, oversized and misnamed ones among them) and gives back only checked records;
group_size tells a running group from an emptied, a deleted and an unaskable one. The
helpers here (a job of a group, its records, its group) serve test_lifecycle_autoscaled.py
too."""

from __future__ import annotations

import json

import boto3
import pytest

from labs.aws import _plain_http_stands_in_for_tls, ec2_provider  # noqa: F401  (fixture)
from labs.credentials import REGION
from test_aws_errors import _refuse
from test_aws_groups import cloud  # noqa: F401  (fixture)
from cloudtrain.host import job_records
from cloudtrain.providers.aws import jobstore
from cloudtrain.host.job_records import MAX_ATTEMPTS
from cloudtrain.providers.aws.jobstore_attempts import RECORD_MAX_BYTES
from cloudtrain.state import Store
from cloudtrain.providers.aws import group_launch, results

OWNER = "AIDAEXAMPLEOWNER0001"
GROUP_OF = "cloudtrain-{}"
T0 = 1_760_000_000.0


class GroupJob:
    """A recovering spot job recorded here as a launch through its group leaves it (its
    region, its job store's owner key, its group's name), the job store's bucket made, and
    ways to write what its instances would write and to change its group as AWS would."""

    def __init__(self, provider, store: Store):
        self.provider, self.store = provider, store
        self.s3 = boto3.client("s3", region_name=REGION)
        self.asg = boto3.client("autoscaling", region_name=REGION)
        self.ec2 = boto3.client("ec2", region_name=REGION)
        _, self.bucket, _ = results.job_store_client(provider.aws, REGION)
        self.s3.create_bucket(Bucket=self.bucket)
        job = store.create_job(name=None, kind="command", recipe=None, command="true",
                               backend="aws", spec={}, launcher="test:1", at=T0)
        self.id = job.id
        self.group = GROUP_OF.format(job.id)
        store.update_job(job.id, spec={"region": REGION, "instance_type": "g5.xlarge",
                                       "market": "spot"})
        store.record_facts(job.id, store_owner=OWNER, auto_scaling_group=self.group)
        store.set_state(job.id, "running")
        self.prefix = jobstore.job_prefix(job.id, owner_key=OWNER)

    @property
    def job(self):
        return self.store.job(self.id)

    def put(self, name: str, body) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)

    def attempt(self, n: int, instance: str, started_at: float, **over) -> dict:
        """attempts/<n>.json as bootstrap.py (or the launch, for 1) writes it."""
        doc = {"attempt": n, "instance": instance, "zone": "us-east-1b", "type": "g5.xlarge",
               "lifecycle": "spot", "started_at": started_at,
               "by": "launch" if n == 1 else "bootstrap", **over}
        self.put(f"{job_records.ATTEMPTS}{n}.json", doc)
        return doc

    def final(self, **over) -> dict:
        doc = {"state": "succeeded", "exit_code": 0, "reason": None, "ended_at": T0 + 900,
               "attempt": 3, "instance": "i-0333333333333333c", **over}
        self.put(job_records.FINAL, doc)
        return doc

    def make_group(self, desired: int = 1) -> list[str]:
        """The job's launch template and group, as groups.py makes them (in short: the job's
        tag goes to each instance the group launches, beside the group's own tag, which AWS
        sets); the ids of the instances moto started for it."""
        self.ec2.create_launch_template(LaunchTemplateName=self.group, LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
        self.asg.create_auto_scaling_group(
            AutoScalingGroupName=self.group, MinSize=desired, MaxSize=max(desired, 1),
            DesiredCapacity=desired, AvailabilityZones=[f"{REGION}a", f"{REGION}b"],
            LaunchTemplate={"LaunchTemplateName": self.group},
            Tags=[{"Key": "cloudtrain:job", "Value": self.id, "PropagateAtLaunch": True,
                   "ResourceId": self.group, "ResourceType": "auto-scaling-group"}])
        return self.members()

    def replace(self, instance: str) -> str:
        """EC2 takes `instance` back (a spot reclaim: TerminateInstances) and the group
        launches its replacement, as AWS does: the replacement's id."""
        before = set(self.members())
        self.ec2.terminate_instances(InstanceIds=[instance])
        [new] = set(self.members()) - before
        return new

    def stranger(self, **tags: str) -> str:
        """An instance outside the job's group, carrying only `tags` (a Name, another job's
        tag): what a forged record may name."""
        spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v}
                                                      for k, v in tags.items()]}] if tags else []
        return self.ec2.run_instances(ImageId="ami-12c6146b", InstanceType="t3.micro",
                                      MinCount=1, MaxCount=1, TagSpecifications=spec
                                      )["Instances"][0]["InstanceId"]

    def state_of(self, instance: str) -> str:
        [res] = self.ec2.describe_instances(InstanceIds=[instance])["Reservations"]
        return res["Instances"][0]["State"]["Name"]

    def members(self) -> list[str]:
        found = self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.group])["AutoScalingGroups"]
        return [i["InstanceId"] for g in found for i in g["Instances"]]

    def empty_group(self) -> None:
        """What the scheduled action at the deadline does: min = desired = 0."""
        self.asg.update_auto_scaling_group(AutoScalingGroupName=self.group, MinSize=0,
                                           DesiredCapacity=0)

    def delete_group(self) -> None:
        self.asg.delete_auto_scaling_group(AutoScalingGroupName=self.group, ForceDelete=True)


@pytest.fixture
def grouped(ec2_provider, ct_home):
    with Store(ct_home / "state.db") as store:
        yield GroupJob(ec2_provider, store)


def numbers(record: dict) -> list[int]:
    return [a["attempt"] for a in record["attempts"]]


def test_the_records_the_instances_left_come_back_checked_by_number(grouped):
    one = grouped.attempt(1, "i-0111111111111111a", T0)
    grouped.attempt(2, "i-0222222222222222b", T0 + 100, resumed_step=40, resumed_seq=2)
    grouped.attempt(10, "i-0aaaaaaaaaaaaaaa0", T0 + 1000)  # "10" sorts before "2" as a key
    record = grouped.provider.group_record(grouped.store, grouped.job)
    assert numbers(record) == [1, 2, 10]
    assert record["attempts"][0] == {**one, "resumed_step": None, "resumed_seq": None,
                                     "resumed_attempt": None}
    assert (record["attempts"][1]["resumed_step"], record["attempts"][1]["resumed_seq"]) == \
        (40, 2)
    assert record["final"] is None and record["group"] == {"gone": True}


@pytest.mark.parametrize("name, body", [
    ("3.json", b"\x00\xffnot json"),
    ("3.json", b"[" * 100_000),                                 # deeper than JSON may go
    ("3.json", b'{"attempt": 3, "instance": "i-03333333333333333", "pad": "'
               + b"x" * RECORD_MAX_BYTES + b'"}'),             # over the size of a record
    ("3.json", {"attempt": 4, "instance": "i-04444444444444444"}),  # under another's name
    ("4.json", {"attempt": 3, "instance": "i-03333333333333333"}),
    ("3.json", ["attempt", 3]),
    ("3.json", {"attempt": 3, "instance": "i-0333; rm -rf /"}),
    ("sub/3.json", {"attempt": 3, "instance": "i-03333333333333333"}),
    ("3.json.bak", {"attempt": 3, "instance": "i-03333333333333333"}),
    # C1: progress records (attempts/<n>/progress.json) that are not one
    ("2/progress.json", b"\x00\xffnot json"),
    ("2/progress.json", b"[" * 100_000),
    ("2/progress.json", {"attempt": 2, "step": 5, "pad": "x" * RECORD_MAX_BYTES}),
    ("2/progress.json", {"attempt": 3, "step": 500}),
    ("2/progress.json", {"attempt": 2, "step": -5, "checkpoint_step": "500"}),
    ("2/progress.json", {"attempt": 2, "step": True, "checkpoint_step": 1 << 60}),
    ("7/progress.json", {"attempt": 7, "step": 500}),
    ("2/x/progress.json", {"attempt": 2, "step": 500}),
    ("2/progress.json.bak", {"attempt": 2, "step": 500}),
], ids=["garbage", "deep", "huge", "wrong-key-4-in-3", "wrong-key-3-in-4", "list",
        "bad-instance", "nested", "suffix", "C1-progress-garbage", "C1-progress-deep",
        "C1-progress-huge", "C1-progress-another-attempt-s", "C1-progress-bad-steps",
        "C1-progress-bool-and-huge-steps", "C1-progress-of-no-recorded-attempt",
        "C1-progress-nested", "C1-progress-suffix"])
def test_a_record_not_an_attempt_under_its_own_name_is_left_out(grouped, name, body):
    """A record that is not one counts as no attempt, and (C1) says nothing of how far one
    got."""
    grouped.attempt(1, "i-0111111111111111a", T0)
    grouped.attempt(2, "i-0222222222222222b", T0 + 100)
    grouped.put(job_records.ATTEMPTS + name, body)
    record = grouped.provider.group_record(grouped.store, grouped.job)
    assert numbers(record) == [1, 2] and record["reached"] == {}


def test_an_attempt_record_s_bad_fields_are_dropped_and_escapes_never_come_back(grouped):
    grouped.attempt(2, "i-0222222222222222b", "yesterday", zone="us-east-1b\x1b[2J",
                    type=7, lifecycle="on-demand", by="\x1b]0;pwned\x07boot", resumed_step=-3)
    [got] = grouped.provider.group_record(grouped.store, grouped.job)["attempts"]
    assert got["instance"] == "i-0222222222222222b" and got["lifecycle"] == "on-demand"
    assert (got["started_at"], got["zone"], got["type"], got["resumed_step"]) == \
        (None, None, None, None)
    assert got["by"].isprintable() and "\x1b" not in got["by"]


@pytest.mark.parametrize("body, want", [
    ({"state": "succeeded", "exit_code": 0, "ended_at": T0 + 900, "attempt": 3,
      "instance": "i-0333333333333333c"},
     {"state": "succeeded", "exit_code": 0, "reason": None, "ended_at": T0 + 900,
      "attempt": 3, "instance": "i-0333333333333333c"}),
    ({"state": "failed", "exit_code": 9, "reason": "OOM\x1b[31m\nkilled", "ended_at": "now",
      "instance": "i-../x"},
     {"state": "failed", "exit_code": 9, "reason": "OOM[31m killed",
      "ended_at": None, "attempt": None, "instance": None}),
    ({"state": "running"}, None),
    (b"{not json", None),
    (b'{"state": "failed", "reason": "' + b"y" * RECORD_MAX_BYTES + b'"}', None),
], ids=["good", "bad-fields", "not-an-end", "garbage", "huge"])
def test_the_final_record_comes_back_checked(grouped, body, want):
    grouped.put(job_records.FINAL, body)
    assert grouped.provider.group_record(grouped.store, grouped.job)["final"] == want


def test_another_job_s_records_are_not_this_job_s(grouped):
    """The same names under another job's prefix (and under the layout before owners)."""
    for prefix in (jobstore.job_prefix("other123", owner_key=OWNER),
                   jobstore.job_prefix(grouped.id, owner_key=None)):
        grouped.s3.put_object(Bucket=grouped.bucket, Key=prefix + "attempts/2.json",
                              Body=json.dumps({"attempt": 2,
                                               "instance": "i-0222222222222222b"}).encode())
        grouped.s3.put_object(Bucket=grouped.bucket, Key=prefix + job_records.FINAL,
                              Body=json.dumps({"state": "failed"}).encode())
    record = grouped.provider.group_record(grouped.store, grouped.job)
    assert record["attempts"] == [] and record["final"] is None


def test_at_most_max_attempts_are_read(grouped, monkeypatch):
    monkeypatch.setattr(job_records, "MAX_ATTEMPTS", 3)
    for n in range(1, 6):
        grouped.attempt(n, f"i-0{n:016x}", T0 + n)
    assert numbers(grouped.provider.group_record(grouped.store, grouped.job)) == [1, 2, 3]
    assert MAX_ATTEMPTS >= 100  # a real job's restarts are far fewer


# -- C1: how far each attempt got ------------------------------------------------------------

def progress(g: GroupJob, n: int, step, checkpoint_step, **over) -> None:
    """attempts/<n>/progress.json as rank 0's agent posts it (agent_progress.py)."""
    g.put(job_records.progress_key("", n), {**job_records.progress_doc(
        n, step, checkpoint_step, at=T0 + 10 * n), **over})


def test_C1_each_attempt_s_progress_record_says_how_far_it_got(grouped):
    """C1 (issue 34): with the launching machine closed, only stream/latest.json was left
    of how far attempts got. Each attempt's rank 0 keeps its own record: its last metrics
    step and its newest streamed checkpoint's, the larger of which it reached."""
    for n in (1, 2, 3):
        grouped.attempt(n, f"i-0{n:016x}", T0 + 100 * n)
    progress(grouped, 1, 120, 115)
    progress(grouped, 2, 90, None)
    progress(grouped, 3, 150, 200)  # a checkpoint named later than the last row read
    record = grouped.provider.group_record(grouped.store, grouped.job)
    assert numbers(record) == [1, 2, 3]
    assert record["reached"] == {1: 120, 2: 90, 3: 200}


def test_C1_the_step_a_later_attempt_resumed_from_is_reached_by_the_one_that_streamed_it(
        grouped):
    """Attempt 1 was taken back before it stored any progress, attempt 2 before it streamed
    a checkpoint: both 2 and 3 resumed from attempt 1's (resumed_attempt, which bootstrap
    writes after the restore), so attempt 1 reached step 86 at least. A resume that names
    itself or a later attempt says nothing."""
    grouped.attempt(1, "i-0111111111111111a", T0)
    grouped.attempt(2, "i-0222222222222222b", T0 + 100, resumed_step=86, resumed_attempt=1)
    grouped.attempt(3, "i-0333333333333333c", T0 + 200, resumed_step=86, resumed_attempt=1)
    grouped.attempt(4, "i-0444444444444444d", T0 + 300, resumed_step=500, resumed_attempt=4)
    progress(grouped, 1, 80, 75)  # an older record of attempt 1: the resume says more
    record = grouped.provider.group_record(grouped.store, grouped.job)
    assert [a["resumed_attempt"] for a in record["attempts"]] == [None, 1, 1, None]
    assert record["reached"] == {1: 86}


def test_C1_only_attempt_and_progress_records_are_read_and_the_listing_is_bounded(
        grouped, monkeypatch):
    """The nodes' records of a regroup (attempts/<n>/<instance>.json) and whatever else the
    grant's holders put below attempts/ are listed, never fetched; a listing stops at
    MAX_OBJECTS keys."""
    from cloudtrain.providers.aws import jobstore_attempts

    grouped.attempt(1, "i-0111111111111111a", T0)
    grouped.attempt(2, "i-0222222222222222b", T0 + 100)
    progress(grouped, 2, 40, 35)
    for k in range(30):
        grouped.put(f"{job_records.ATTEMPTS}2/i-{k:017x}.json", {"instance": f"i-{k:017x}"})
    s3, _, _ = results.job_store_client(grouped.provider.aws, REGION)
    got: list[str] = []
    s3.meta.events.register("provide-client-params.s3.GetObject",
                            lambda params, **kw: got.append(params["Key"]))
    record = grouped.provider.group_record(grouped.store, grouped.job)
    assert record["reached"] == {2: 40}
    assert sorted(k[len(grouped.prefix):] for k in got) == [
        "attempts/1.json", "attempts/2.json", "attempts/2/progress.json"]
    monkeypatch.setattr(jobstore_attempts, "MAX_OBJECTS", 2)
    assert len(jobstore_attempts.attempt_keys(s3, grouped.bucket, grouped.prefix, None)) == 2


# -- the group's size -------------------------------------------------------------------------

def test_the_group_s_size_running_emptied_and_deleted(grouped):
    size = lambda: group_launch.group_size(grouped.provider.aws, grouped.job)  # noqa: E731
    assert size() == {"gone": True}  # recorded, not there (deleted by hand before this)
    assert len(grouped.make_group(desired=1)) == 1
    assert size() == {"desired": 1}
    grouped.empty_group()
    assert size() == {"desired": 0}
    grouped.delete_group()
    assert size() == {"gone": True}
    assert grouped.provider.group_record(grouped.store, grouped.job)["group"] == {"gone": True}


def test_a_job_without_a_group_or_a_caller_who_may_not_ask_has_no_size(grouped):
    grouped.make_group(desired=1)
    _refuse(grouped.provider.aws.client("autoscaling", REGION), "DescribeAutoScalingGroups",
            "AccessDenied", "User: arn:aws:iam::123456789012:user/me is not authorized to "
            "perform: autoscaling:DescribeAutoScalingGroups")
    assert group_launch.group_size(grouped.provider.aws, grouped.job) is None
    grouped.store.record_facts(grouped.id, auto_scaling_group=None)
    assert group_launch.group_size(grouped.provider.aws, grouped.job) is None


# -- the launch through a group ---------------------------------------------------------------

def test_a_launch_through_its_group_leaves_what_a_replacement_boots_from(cloud, monkeypatch):
    """acquire_from_group in moto: boot.tar in the job store (the bytes boot_tar makes),
    the group's launch template with the gzipped user-data whose boot script names that
    tar, its sha256 and the job's group; the group's first instance recorded as the job's;
    then record_attempt's attempts/1.json reads back through group_record (the launch's own
    record passes the checks every instance's does) and group_settings names the same
    store."""
    import base64
    import gzip

    from test_aws_groups import _job, _spec
    from cloudtrain.providers.aws.group_launch import BOOT_TAR, boot_tar

    _plain_http_stands_in_for_tls(monkeypatch)
    p, store, images = cloud
    p.settings.instance_profile = "cloudtrain-instance"
    spec = _spec(images[REGION])
    job = _job(store, spec)
    assert group_launch.group_recovery(p.aws, spec) is None
    (instance,) = group_launch.acquire_from_group(p.aws, store, job, spec)
    job = store.job(job.id)
    name = job.facts.auto_scaling_group
    assert name == GROUP_OF.format(job.id)
    [row] = store.instances(job.id)
    assert row.id == instance and row.details["auto_scaling_group"] == name

    s3, bucket, _ = results.job_store_client(p.aws, REGION)
    prefix = jobstore.job_prefix(job.id, owner_key=job.facts.store_owner)
    data, digest = boot_tar()
    assert s3.get_object(Bucket=bucket, Key=prefix + BOOT_TAR)["Body"].read() == data

    version = boto3.client("ec2", region_name=REGION).describe_launch_template_versions(
        LaunchTemplateName=name)["LaunchTemplateVersions"][-1]
    user_data = gzip.decompress(base64.b64decode(version["LaunchTemplateData"]["UserData"]))
    text = user_data.decode()
    assert f"--sha256 {digest}" in text and f"--key {prefix}{BOOT_TAR}" in text
    assert f"--group {name}" in text and f"--jobdir /home/ubuntu/.cloudtrain/jobs/{job.id}" \
        in text and f"--bucket {bucket}" in text

    group_launch.record_attempt(p.aws, store, job, spec, 1, instance)
    [first] = p.group_record(store, job)["attempts"]
    assert (first["attempt"], first["instance"], first["zone"], first["type"], first["by"]) \
        == (1, instance, row.zone, "g5.xlarge", "launch")
    assert first["started_at"] is not None
    conf = p.group_settings(store, job, spec)["auto_scaling"]
    assert (conf["group"], conf["bucket"], conf["prefix"], conf["max_restarts"]) == \
        (name, bucket, prefix, spec.recovery.max_restarts)


def test_RB1_a_launch_through_its_group_asks_for_the_images_snapshot_and_says_so(
        cloud, monkeypatch):
    """RB1 on the group's path: the template asks for the image's root snapshot where the
    job asked for less, the launch says so, and the group's instance is recorded with the
    size it got (what its cost counts)."""
    from labs.moto_images import ImageRoots
    from test_aws_groups import _job, _spec

    _plain_http_stands_in_for_tls(monkeypatch)
    p, store, images = cloud
    ImageRoots().install(monkeypatch).sizes[images[REGION]] = 75
    spec = _spec(images[REGION], disk_gb=20)
    job = _job(store, spec)
    said = []
    report = type("Said", (), {"note": lambda self, line: said.append(line),
                               "phase": lambda self, line: None})()
    group_launch.acquire_from_group(p.aws, store, job, spec, report)
    assert said == ["root volume 75 GB, not the 20 GB asked: the image's snapshot is 75 GB, "
                    "the smallest EC2 accepts"]
    [row] = store.instances(job.id)
    assert row.details["disk_gb"] == 75


def _but_user_data(version: dict) -> dict:
    """A template version's data but its user-data (and the template's own tags, which moto
    copies into its first version's TagSpecifications)."""
    data = {k: v for k, v in version["LaunchTemplateData"].items() if k != "UserData"}
    data["TagSpecifications"] = [t for t in data.get("TagSpecifications", [])
                                 if t["ResourceType"] != "launch-template"]
    return data


@pytest.mark.parametrize("allowed", [True, False])
def test_F40_the_uploaded_bundle_is_pinned_in_a_new_version_of_the_groups_template(
        cloud, monkeypatch, tmp_path, allowed):
    """F40: once the bundle is up, the group's template gets a version whose user-data names
    the sha256 of the manifest as stored (--manifest-sha256), the rest as the first version
    (made whole: moto drops what AWS's SourceVersion would inherit); the group launches
    $Latest, so every replacement checks it. AWS refusing the version (a policy from before
    it) is a WARNING in the launch's words, and the job goes on unpinned."""
    import base64
    import gzip
    import hashlib

    from test_aws_groups import _job, _spec

    _plain_http_stands_in_for_tls(monkeypatch)
    p, store, images = cloud
    p.settings.instance_profile = "cloudtrain-instance"
    spec = _spec(images[REGION])
    job = _job(store, spec)
    group_launch.acquire_from_group(p.aws, store, job, spec)
    job = store.job(job.id)
    ec2 = boto3.client("ec2", region_name=REGION)
    if not allowed:
        _refuse(p.aws.client("ec2", REGION), "CreateLaunchTemplateVersion",
                "UnauthorizedOperation", "You are not authorized to perform this operation.")
    part = tmp_path / "files.tar"
    part.write_bytes(b"x" * 100)
    line = p.upload_bundle(store, job, spec, [("files.tar", part)],
                           {"archive": {"files": 1, "bytes": 100}})
    versions = ec2.describe_launch_template_versions(
        LaunchTemplateName=job.facts.auto_scaling_group)["LaunchTemplateVersions"]
    if not allowed:
        assert len(versions) == 1
        assert "WARNING: the bundle is not pinned" in line and "ec2:CreateLaunchTemplateVersion" \
            in line, line
        return
    s3, bucket, _ = results.job_store_client(p.aws, REGION)
    prefix = jobstore.job_prefix(job.id, owner_key=job.facts.store_owner)
    stored = s3.get_object(Bucket=bucket, Key=prefix + "bundle/manifest.json")["Body"].read()
    pin = hashlib.sha256(stored).hexdigest()
    first, latest = sorted(versions, key=lambda v: v["VersionNumber"])
    assert latest["VersionNumber"] == 2
    assert f"replacements start only this bundle (its manifest's sha256 {pin[:12]}" in line
    text = gzip.decompress(base64.b64decode(latest["LaunchTemplateData"]["UserData"])).decode()
    old = gzip.decompress(base64.b64decode(first["LaunchTemplateData"]["UserData"])).decode()
    assert f"--manifest-sha256 {pin}" in text and "--manifest-sha256" not in old
    assert text.replace(f" --manifest-sha256 {pin}", "") == old
    assert _but_user_data(latest) == _but_user_data(first)
    group = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[job.facts.auto_scaling_group])["AutoScalingGroups"][0]
    assert group["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"][
        "Version"] == "$Latest"
