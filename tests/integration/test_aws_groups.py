"""A recovering spot job's EC2 Auto Scaling group (issue 27), against moto in this process:
the launch template and group the provider makes (providers/aws/groups.py), the scheduled
action that is the last kill switch at the deadline, their deletion (idempotent), finding
them by tag in every region, and `down` deleting a job's group before it terminates the
job's instances, with the local state kept or lost."""

from __future__ import annotations

import base64
import time

import boto3
import pytest

from labs.aws import ec2_provider  # noqa: F401  (fixture)
from labs.credentials import REGION
from labs.moto_activities import ScalingActivities
from labs.moto_images import ImageRoots
from labs.moto_placement import PlacementGroups
from test_aws_errors import _refuse
from cloudtrain import config
from cloudtrain.errors import CloudtrainError
from cloudtrain.lifecycle import stop
from cloudtrain.market import Market
from cloudtrain.providers.aws.instances import RUNTIME_MARGIN_MIN
from cloudtrain.spec import JobSpec
from cloudtrain.state import Store
from cloudtrain.providers.aws import bootstrap, group_launch, groups, instances, results

OTHER = "eu-west-1"
USER_DATA = "#!/bin/bash\necho 'the bootstrap of the other slice' > /var/lib/ct-boot\n"
DLAMI = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04) 20261101"


@pytest.fixture
def cloud(ec2_provider, monkeypatch, ct_home):
    """moto with a default VPC per region (one subnet per AZ), a DLAMI-named image in two
    regions, placement groups, a config that names the region, and a store."""
    PlacementGroups().install(monkeypatch)
    with (ct_home / "config.yaml").open("a") as f:
        f.write(f"region: {REGION}\nssh_cidr: 127.0.0.1/32\npoll_seconds: 0.05\n")
    images = {r: boto3.client("ec2", region_name=r).register_image(
        Name=DLAMI, RootDeviceName="/dev/sda1")["ImageId"] for r in (REGION, OTHER)}
    with Store(ct_home / "state.db") as store:
        yield ec2_provider, store, images


def _spec(image, nodes=1, region=REGION, instance="g5.xlarge", **kw) -> JobSpec:
    return JobSpec.of(kind="command", backend="aws", command=["true"], instance_type=instance,
                   market=Market.SPOT, nodes=nodes, region=region, ami=image,
                   max_runtime_s=3600, recover=True, **kw)


def _job(store: Store, spec: JobSpec):
    job = store.create_job(name=None, kind=spec.kind, recipe=spec.recipe,
                           command=spec.display(), backend="aws", spec=spec.to_dict(),
                           launcher="test:1")
    store.set_state(job.id, "running")
    return store.job(job.id)


def _asg(region=REGION):
    return boto3.client("autoscaling", region_name=region)


def _ec2(region=REGION):
    return boto3.client("ec2", region_name=region)


def _group(name, region=REGION) -> dict | None:
    found = _asg(region).describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    return (found["AutoScalingGroups"] or [None])[0]


def _templates(job_id, region=REGION) -> list[dict]:
    return _ec2(region).describe_launch_templates(Filters=[
        {"Name": "tag:cloudtrain:job", "Values": [job_id]}])["LaunchTemplates"]


def _template_data(job_id, region=REGION) -> dict:
    """The LaunchTemplateData of the job's one template's first version."""
    (template,) = _templates(job_id, region)
    return _ec2(region).describe_launch_template_versions(
        LaunchTemplateId=template["LaunchTemplateId"])["LaunchTemplateVersions"][0][
        "LaunchTemplateData"]


def _live(job_id, region=REGION) -> list[dict]:
    return [i for r in _ec2(region).describe_instances(Filters=[
        {"Name": "tag:cloudtrain:job", "Values": [job_id]}])["Reservations"]
        for i in r["Instances"] if i["State"]["Name"] not in ("terminated", "shutting-down")]


def _tags(raw: list[dict]) -> dict:
    return {t["Key"]: t["Value"] for t in raw}


def _offering_zones(instance: str) -> set[str]:
    found = _ec2().describe_instance_type_offerings(LocationType="availability-zone", Filters=[
        {"Name": "instance-type", "Values": [instance]}])["InstanceTypeOfferings"]
    return {o["Location"] for o in found}


def _subnet_zones(group: dict) -> list[str]:
    ids = group["VPCZoneIdentifier"].split(",")
    return sorted(s["AvailabilityZone"] for s in _ec2().describe_subnets(SubnetIds=ids)["Subnets"])


@pytest.fixture
def api_calls(monkeypatch) -> list[str]:
    """Every AWS operation any client made from now on, in order ("autoscaling.Delete..."),
    recorded through botocore's before-call hook on each client boto3 makes."""
    calls: list[str] = []
    original = boto3.session.Session.client

    def client(self, *args, **kwargs):
        made = original(self, *args, **kwargs)
        made.meta.events.register("before-call", lambda model, **_: calls.append(
            f"{model.service_model.endpoint_prefix}.{model.name}"))
        return made

    monkeypatch.setattr(boto3.session.Session, "client", client)
    return calls


# -- making a group -----------------------------------------------------------------------------

def test_a_one_node_group_is_spot_in_every_az_with_the_type_over_the_jobs_template(cloud):
    """The group, its template and its deadline: RD5 (confirmed) is the last part, a one-time
    scheduled action setting 0/0/0 at the max runtime + RUNTIME_MARGIN_MIN."""
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    before = time.time()
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    after = time.time()

    group = _group(name)
    assert group["MinSize"] == group["MaxSize"] == group["DesiredCapacity"] == 1
    zones = _offering_zones("g5.xlarge")
    assert "us-east-1e" not in zones  # moto's g5 is not offered there: left out
    assert _subnet_zones(group) == sorted(zones)
    policy = group["MixedInstancesPolicy"]
    assert policy["InstancesDistribution"] == {
        "OnDemandBaseCapacity": 0, "OnDemandPercentageAboveBaseCapacity": 0,
        "SpotAllocationStrategy": "price-capacity-optimized"}
    assert policy["LaunchTemplate"]["Overrides"] == [{"InstanceType": "g5.xlarge"}]
    assert policy["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateName"] == name
    tags = {t["Key"]: t for t in group["Tags"]}
    assert tags["cloudtrain:job"]["Value"] == job.id
    assert tags["cloudtrain:owner"]["Value"] == p.account.owner(REGION)
    assert all(t["PropagateAtLaunch"] for t in tags.values())
    assert "cloudtrain:attempt" not in tags  # a replacement is no attempt of the launch's
    assert group["NewInstancesProtectedFromScaleIn"] is False
    assert not group.get("CapacityRebalance")
    assert not group.get("PlacementGroup")

    (template,) = _templates(job.id)
    assert template["LaunchTemplateName"] == name
    assert _tags(template["Tags"])["cloudtrain:owner"] == p.account.owner(REGION)
    data = _ec2().describe_launch_template_versions(
        LaunchTemplateId=template["LaunchTemplateId"])["LaunchTemplateVersions"][0][
        "LaunchTemplateData"]
    boot = bootstrap.bootstrap(p.aws, REGION, images[REGION])
    assert data["ImageId"] == images[REGION] and data["InstanceType"] == "g5.xlarge"
    assert data["KeyName"] == boot["key_name"] and data["SecurityGroupIds"] == [boot["group"]]
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    (disk,) = data["BlockDeviceMappings"]
    assert disk["DeviceName"] == boot["root_device"]
    assert disk["Ebs"]["VolumeType"] == "gp3" and disk["Ebs"]["Encrypted"] is True
    assert disk["Ebs"]["DeleteOnTermination"] is True and disk["Ebs"]["VolumeSize"] == 100
    kinds = {t["ResourceType"]: _tags(t["Tags"]) for t in data["TagSpecifications"]}
    assert kinds["instance"]["cloudtrain:job"] == kinds["volume"]["cloudtrain:job"] == job.id
    assert base64.b64decode(data["UserData"]).decode() == USER_DATA
    assert "IamInstanceProfile" not in data  # none configured
    assert "InstanceMarketOptions" not in data  # a mixed-instances group refuses it

    (action,) = _asg().describe_scheduled_actions(
        AutoScalingGroupName=name)["ScheduledUpdateGroupActions"]
    assert action["MinSize"] == action["MaxSize"] == action["DesiredCapacity"] == 0
    deadline = action["StartTime"].timestamp()
    margin = 3600 + RUNTIME_MARGIN_MIN * 60
    assert before + margin - 1 <= deadline <= after + margin + 1

    assert len(_live(job.id)) == 1  # moto launched it, tagged through the group
    assert p.recorded_groups(store, job) == [(REGION, name)]


def test_the_template_names_the_instance_profile_when_one_is_configured(cloud):
    p, store, images = cloud
    p.settings.instance_profile = "cloudtrain-instance"
    spec = _spec(images[REGION])
    job = _job(store, spec)
    groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    data = _template_data(job.id)
    assert data["IamInstanceProfile"] == {"Name": "cloudtrain-instance"}


def test_a_three_node_group_is_in_the_jobs_placement_group_in_one_az(cloud):
    """RD4 (confirmed against AWS's CreateAutoScalingGroup reference: a cluster placement
    group takes one AZ only): the group of a job on several nodes is in its placement group,
    over the subnets of one AZ that offers the type."""
    p, store, images = cloud
    spec = _spec(images[REGION], nodes=3, instance="g5.12xlarge")
    job = _job(store, spec)
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    group = _group(name)
    assert group["MinSize"] == group["MaxSize"] == group["DesiredCapacity"] == 3
    placement = _ec2().describe_placement_groups(Filters=[
        {"Name": "tag:cloudtrain:job", "Values": [job.id]}])["PlacementGroups"]
    (pg,) = placement
    assert group["PlacementGroup"] == pg["GroupName"] and pg["Strategy"] == "cluster"
    # A cluster placement group is in one AZ: the group's subnets are that AZ's.
    (zone,) = _subnet_zones(group)
    assert zone in _offering_zones("g5.12xlarge")


def test_creating_twice_is_one_group_and_one_template(cloud):
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    first = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    assert groups.create_job_group(p.aws, store, job, spec, USER_DATA) == first
    assert len(_templates(job.id)) == 1
    assert len(_asg().describe_auto_scaling_groups()["AutoScalingGroups"]) == 1
    assert len(_asg().describe_scheduled_actions(
        AutoScalingGroupName=first)["ScheduledUpdateGroupActions"]) == 1


def test_access_denied_on_the_group_leaves_no_template_behind(cloud):
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    _refuse(p.aws.client("autoscaling", REGION), "CreateAutoScalingGroup", "AccessDenied",
            "User: arn:aws:iam::123456789012:user/u is not authorized to perform: "
            "autoscaling:CreateAutoScalingGroup")
    with pytest.raises(CloudtrainError) as caught:
        groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    assert "\n" not in caught.value.message
    assert "autoscaling:CreateAutoScalingGroup" in caught.value.message
    assert "iam-policy-autoscaling.json" in caught.value.hint
    assert _templates(job.id) == []
    assert _asg().describe_auto_scaling_groups()["AutoScalingGroups"] == []


def test_a_refused_scheduled_action_takes_the_group_down_with_it(cloud):
    """A group without its deadline could bill forever: it is not left standing."""
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    _refuse(p.aws.client("autoscaling", REGION), "PutScheduledUpdateGroupAction", "AccessDenied",
            "not authorized")
    with pytest.raises(CloudtrainError):
        groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    assert _asg().describe_auto_scaling_groups()["AutoScalingGroups"] == []
    assert _templates(job.id) == [] and _live(job.id) == []


# -- deleting and finding -----------------------------------------------------------------------

def test_deleting_a_group_is_idempotent_and_ends_its_instances_and_template(cloud):
    p, store, images = cloud
    spec = _spec(images[REGION], nodes=3, instance="g5.12xlarge")
    job = _job(store, spec)
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    assert len(_live(job.id)) == 3
    assert p.delete_job_groups(store, job) == [name]
    assert _group(name) is None and _templates(job.id) == [] and _live(job.id) == []
    assert p.delete_job_groups(store, job) == []  # again: nothing left, no error
    p.delete_job_group(REGION, name)  # and by name, twice
    assert p.recorded_groups(store, job) == []


def test_groups_and_templates_are_found_by_tag_in_every_region(cloud, ct_home, tmp_path):
    p, store, images = cloud
    here, there = _spec(images[REGION]), _spec(images[OTHER], region=OTHER)
    a, b = _job(store, here), _job(store, there)
    name_a = groups.create_job_group(p.aws, store, a, here, USER_DATA)
    name_b = groups.create_job_group(p.aws, store, b, there, USER_DATA)
    # A template whose group is already gone (a launcher killed between the two calls).
    p.delete_job_group(OTHER, name_b)
    groups.create_launch_template(p.aws, OTHER, b, there, USER_DATA)

    with Store(tmp_path / "lost.db") as lost:  # the local state lost
        swept = p.orphans(lost)
    found = {(o["region"], o.get("kind"), o["job"]) for o in swept.found}
    assert (REGION, "group", a.id) in found and (OTHER, "launch-template", b.id) in found
    assert {o["id"] for o in swept.found if o.get("kind") == "group"} == {name_a}
    assert not swept.unchecked
    assert {REGION, OTHER} <= set(swept.regions)

    held = p.orphans(store)  # with the store that holds both jobs: nothing is an orphan
    assert [o for o in held.found if o.get("kind")] == []


# -- down ---------------------------------------------------------------------------------------

def _settings():
    return config.Settings.load()


def test_down_job_deletes_its_group_before_it_terminates(cloud, api_calls):
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    (raw,) = _live(job.id)
    instances.record_found(p.aws, store, job, REGION, raw, 1)  # the instance known to the store
    api_calls.clear()
    (outcome,) = stop.cancel(store, _settings(), (job.id,), False)
    assert outcome.ok, outcome.note
    assert f"auto scaling group {name} deleted" in outcome.note
    assert "autoscaling.DeleteAutoScalingGroup" in api_calls
    assert api_calls.index("autoscaling.DeleteAutoScalingGroup") < api_calls.index(
        "ec2.TerminateInstances")
    assert _group(name) is None and _templates(job.id) == [] and _live(job.id) == []


def test_a_job_of_the_previous_version_shows_and_down_deletes_the_group_its_spec_names(
        cloud, api_calls):
    """issue 35: a job stored by the version before jobs.details (its group's name and its job
    store's owner in its spec, no details): status shows it, and `down` finds its group there
    and deletes it before it terminates the instance."""
    import json

    from cloudtrain import job_views

    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    (raw,) = _live(job.id)
    instances.record_found(p.aws, store, job, REGION, raw, 1)
    old = {**spec.to_dict(), "attempt": 1, "avoid_zones": [], "store_region": None,
           "store_owner": p.aws.owner_key(REGION), "auto_scaling_group": name}
    store.db.execute("UPDATE jobs SET spec = ?, details = NULL WHERE id = ?",
                     (json.dumps(old), job.id))
    shown = store.job(job.id)
    assert shown.facts.auto_scaling_group == name and shown.spec == spec
    assert job.id in job_views.status_table([shown], width=200)
    api_calls.clear()
    (outcome,) = stop.cancel(store, _settings(), (job.id,), False)
    assert outcome.ok, outcome.note
    assert f"auto scaling group {name} deleted" in outcome.note
    assert api_calls.index("autoscaling.DeleteAutoScalingGroup") < api_calls.index(
        "ec2.TerminateInstances")
    assert _group(name) is None and _live(job.id) == []


def test_down_all_with_the_local_state_lost_deletes_the_group_first(cloud, api_calls,
                                                                   tmp_path):
    p, store, images = cloud
    spec = _spec(images[REGION], nodes=3, instance="g5.12xlarge")
    job = _job(store, spec)
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    api_calls.clear()
    with Store(tmp_path / "lost.db") as lost:
        outcomes = stop.cancel(lost, _settings(), (), True)
    notes = [o.note for o in outcomes if o.kind == "orphan"]
    assert f"auto scaling group of job {job.id} not in this store: deleted" in notes
    assert all(o.ok for o in outcomes), [o.note for o in outcomes]
    deleted = api_calls.index("autoscaling.DeleteAutoScalingGroup")
    assert "ec2.TerminateInstances" not in api_calls[:deleted]
    assert _group(name) is None and _templates(job.id) == [] and _live(job.id) == []


def test_down_says_a_group_it_cannot_delete(cloud, monkeypatch, tmp_path):
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    from moto.autoscaling.models import AutoScalingBackend
    from moto.autoscaling.exceptions import AutoscalingClientError

    def refuse(self, *args, **kwargs):
        raise AutoscalingClientError("AccessDenied", "User is not authorized to perform: "
                        "autoscaling:DeleteAutoScalingGroup")

    monkeypatch.setattr(AutoScalingBackend, "delete_auto_scaling_group", refuse)
    (outcome,) = stop.cancel(store, _settings(), (job.id,), False)
    assert not outcome.ok
    assert "GROUP DELETE FAILED" in outcome.note and "nothing" not in outcome.note
    assert _group(name) is not None

    with Store(tmp_path / "lost.db") as lost:
        outcomes = stop.cancel(lost, _settings(), (), True)
    failed = [o for o in outcomes if o.kind == "orphan" and not o.ok]
    assert failed and "GROUP DELETE FAILED" in failed[0].note


def test_down_of_an_ended_job_whose_group_is_left_is_not_nothing_to_stop(cloud):
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    name = groups.create_job_group(p.aws, store, job, spec, USER_DATA)
    store.set_state(job.id, "failed", only_if_active=False)
    for inst in store.instances(job.id):
        store.update_instance(inst.id, state="terminated")
    assert job.id in [j.id for j in stop.down_targets(store)]
    (outcome,) = stop.cancel(store, _settings(), (job.id,), False)
    assert "nothing to stop" not in outcome.note and outcome.ok
    assert _group(name) is None and _live(job.id) == []


def test_down_with_the_cli_policy_alone_skips_the_group_lookups_it_may_not_make(cloud,
                                                                               monkeypatch):
    """A user who attached only infra/iam-policy-cli.json: the lookups of groups and
    templates by tag are refused, and `down` of a job that has no recorded group terminates
    its instance as before (whoever may not describe groups could not have made one)."""
    from moto.autoscaling.exceptions import AutoscalingClientError
    from moto.autoscaling.models import AutoScalingBackend
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models import EC2Backend

    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    raw = _ec2().run_instances(ImageId=images[REGION], InstanceType="g5.xlarge", MinCount=1,
                               MaxCount=1, TagSpecifications=[{
                                   "ResourceType": "instance",
                                   "Tags": [{"Key": "cloudtrain:job", "Value": job.id}]}]
                               )["Instances"][0]
    instances.record_found(p.aws, store, job, REGION, raw, 1)

    def refused_groups(self, *args, **kwargs):
        raise AutoscalingClientError("AccessDenied", "User is not authorized to perform: "
                                     "autoscaling:DescribeAutoScalingGroups")

    def refused_templates(self, *args, **kwargs):
        raise EC2ClientError("UnauthorizedOperation", "You are not authorized to perform "
                             "this operation: ec2:DescribeLaunchTemplates")

    monkeypatch.setattr(AutoScalingBackend, "describe_auto_scaling_groups", refused_groups)
    monkeypatch.setattr(EC2Backend, "describe_launch_templates", refused_templates)
    (outcome,) = stop.cancel(store, _settings(), (job.id,), False)
    assert outcome.ok, outcome.note
    assert "group" not in outcome.note
    assert _live(job.id) == []


def test_a_launch_without_auto_scaling_permissions_falls_back_to_the_supervisor(cloud):
    """Issue 27: an instance profile is configured but the Auto Scaling policy is not
    attached: AWS refuses the launch template; the launch goes on without a group (the
    supervisor here relaunches the job), says so as a WARNING in the timeline, leaves nothing
    of the group, and the job's job.json gets no auto_scaling settings."""
    p, store, images = cloud
    p.settings.instance_profile = "cloudtrain-instance"
    spec = _spec(images[REGION])
    assert group_launch.group_recovery(p.aws, spec) is None
    job = _job(store, spec)
    # in-process moto takes its own requests for plain HTTP: the store's DenyInsecureTransport
    # statement would refuse the boot files' upload, which on AWS (HTTPS) it allows
    p.account.ensure_job_store(REGION, p.aws.owner_key(REGION))
    s3, bucket, _ = results.job_store_client(p.aws, REGION)
    s3.delete_bucket_policy(Bucket=bucket)
    _refuse(p.aws.client("ec2", REGION), "CreateLaunchTemplate", "UnauthorizedOperation",
            "You are not authorized to perform this operation. User: "
            "arn:aws:iam::123456789012:user/u is not authorized to perform: "
            "ec2:CreateLaunchTemplate")
    assert group_launch.acquire_from_group_or_say(p.aws, store, job, spec) is None
    said = [e.detail for e in store.events(job.id) if e.phase == "recovery"]
    assert len(said) == 1 and said[0].startswith("WARNING: AWS refused the job's Auto Scaling")
    assert "the supervisor on this machine relaunches it" in said[0]
    assert _templates(job.id) == [] and _group(f"cloudtrain-{job.id}") is None
    assert _live(job.id) == []
    assert p.group_settings(store, job, spec) == {}
    assert not store.job(job.id).facts.auto_scaling_group


def test_F41_the_instances_a_group_launched_are_read_from_its_activities_after_its_end(
        cloud, monkeypatch):
    """F41: what AWS Auto Scaling itself records of the job's group (its scaling activities,
    kept 6 weeks, deleted groups included) says which instances the group launched, when,
    in which AZ, and when it ended each: group_launches. An instance attached to the group
    was not launched by it; a job without a group asks nothing; AWS's refusal is an AWSError
    that names the action."""
    import json

    from test_aws_group_launch_moto import GroupJob
    from cloudtrain.providers.aws.errors import AWSError

    lab = ScalingActivities().install(monkeypatch)
    provider, store, _ = cloud
    g = GroupJob(provider, store)
    [i1] = g.make_group(desired=1)
    i2 = g.replace(i1)
    attached = g.stranger(Name="attached by hand")
    g.asg.update_auto_scaling_group(AutoScalingGroupName=g.group, MaxSize=2)
    g.asg.attach_instances(AutoScalingGroupName=g.group, InstanceIds=[attached])
    g.delete_group()
    said = {(a["Description"].split(": ")[0], a["Description"].split(": ")[1]): a
            for a in lab.activities(g.group)}
    assert ("Attaching an existing EC2 instance", attached) in said

    def at(verb, instance):
        return said[(verb, instance)]["StartTime"].timestamp()

    launched = "Launching a new EC2 instance"
    ended = "Terminating EC2 instance"
    assert provider.group_launches(store, g.job) == {
        i: {"launched_at": at(launched, i), "terminated_at": at(ended, i),
            "zone": json.loads(said[(launched, i)]["Details"])["Availability Zone"]}
        for i in (i1, i2)}
    assert lab.calls[-1]["include_deleted"] is True
    lab.denied = True
    with pytest.raises(AWSError) as refused:
        provider.group_launches(store, g.job)
    assert refused.value.denied and "autoscaling:DescribeScalingActivities" in \
        refused.value.message
    asked = len(lab.calls)
    store.record_facts(g.id, auto_scaling_group=None)
    assert provider.group_launches(store, g.job) == {} and len(lab.calls) == asked


@pytest.mark.parametrize("how", ["one instance", "a group's template"])
def test_RB1_a_root_volume_below_the_images_snapshot_is_raised_to_it(cloud, monkeypatch, how):
    """RB1: airbench asks for a 20 GB root and resnet9 for 60, and EC2 refuses a root volume
    smaller than the image's snapshot (InvalidBlockDeviceMapping; the lab refuses it the same
    way, labs/moto_images.py). The launch asks for the snapshot's size, says so, and records
    the size it got (its cost counts it)."""
    p, store, images = cloud
    roots = ImageRoots().install(monkeypatch)
    roots.sizes[images[REGION]] = 75
    spec = _spec(images[REGION], disk_gb=20)
    job = _job(store, spec)
    boot = bootstrap.bootstrap(p.aws, REGION, images[REGION], cached=False)
    assert boot["root_gb"] == 75
    assert instances.root_volume_gb(p.aws, spec, boot) == 75
    assert instances.root_volume_line(p.aws, spec, boot) == (
        "root volume 75 GB, not the 20 GB asked: the image's snapshot is 75 GB, the smallest "
        "EC2 accepts")
    assert instances.root_volume_gb(p.aws, spec.changed(disk_gb=200), boot) == 200
    if how == "one instance":
        said = []
        report = type("Said", (), {"note": lambda self, line: said.append(line),
                                   "phase": lambda self, line: None})()
        instance_id = instances.run_instance(p.aws, store, job, spec, REGION, boot, report)
        assert said == [instances.root_volume_line(p.aws, spec, boot)]
        (volume,) = _ec2().describe_volumes(Filters=[
            {"Name": "attachment.instance-id", "Values": [instance_id]}])["Volumes"]
        assert volume["Size"] == 75
        assert store.instances(job.id)[0].details["disk_gb"] == 75
    else:
        groups.create_launch_template(p.aws, REGION, job, spec, USER_DATA)
        data = _template_data(job.id)
        assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 75
    # What EC2 (and the lab) does with the size asked as it was:
    with pytest.raises(Exception, match="InvalidBlockDeviceMapping"):
        _ec2().run_instances(ImageId=images[REGION], MinCount=1, MaxCount=1,
                             InstanceType="g5.xlarge", BlockDeviceMappings=[{
                                 "DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 20}}])
    assert roots.refused[-1].endswith("expect size >= 75GB")


def test_RB1_the_plan_says_when_the_image_raises_the_disk(cloud, monkeypatch):
    """RB1: the dry run, which resolves the AMI with credentials, says the root volume the
    launch will ask for when the image's snapshot is larger than the size asked."""
    from cloudtrain.providers.aws import plan

    p, _, images = cloud
    ImageRoots().install(monkeypatch).sizes[images[REGION]] = 75
    rows = plan.plan(p.aws, _spec(images[REGION], disk_gb=20))
    assert ("disk", "75 GB, not 20: the image's root snapshot is 75 GB, the smallest root "
                    "volume EC2 accepts") in rows
    assert [v for k, v in plan.plan(p.aws, _spec(images[REGION], disk_gb=80))
            if k == "disk"] == ["80 GB gp3, encrypted, deleted with the instance"]


def test_RD1_the_template_tags_every_resource_the_cli_policy_wants_tagged_at_launch(cloud):
    """RD1: creating a group checks the caller's ec2:RunInstances against its template, and
    the CLI policy allows RunInstances only where the owner tag is requested on the instance,
    its volume, its network interface and its spot request. The template tagged the first
    two only, so on a real account with that policy the group was refused (and the job fell
    back to the supervisor on the laptop). The resource types are read from the policy
    itself, so one it adds is asked of the template too."""
    import json
    from pathlib import Path

    POLICY = json.loads((Path(__file__).resolve().parents[2] / "infra" / "iam-policy-cli.json")
                        .read_text())
    wanted = set()
    for s in POLICY["Statement"]:
        if s["Effect"] == "Allow" and s["Action"] == "ec2:RunInstances" and \
                "aws:RequestTag/cloudtrain:owner" in s.get("Condition", {}).get(
                    "StringEquals", {}):
            res = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
            wanted |= {r.split(":")[5].split("/")[0] for r in res}
    assert wanted == {"instance", "volume", "network-interface", "spot-instances-request"}
    p, store, images = cloud
    spec = _spec(images[REGION])
    job = _job(store, spec)
    groups.create_launch_template(p.aws, REGION, job, spec, USER_DATA)
    data = _template_data(job.id)
    owner = p.aws.owner(REGION)
    tagged = {t["ResourceType"] for t in data["TagSpecifications"]
              if {"Key": "cloudtrain:owner", "Value": owner} in t["Tags"]}
    assert wanted <= tagged, json.dumps(data["TagSpecifications"])
