"""The drivers of audit_drivers_1201.py against AWS in moto: forged job store records of a
group job (in-process moto: its group, the job's records here, then learn and release) and a
hostile node's regroup records (moto's server, a fake IMDS, the job's real grant; the real
host/regroup.py meets). Run through audit_drivers.py, never by hand; the conventions are
audit_drivers.py's (`Error: ...` exit 1, `harness: ...` exit 99, `FLAW <kind>: ...`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import audit_cases_1201 as corpus
from audit_drivers import harness, refused
from audit_drivers_1201 import OWNER, REGION, TREE, flaw
from cloudtrain.providers.aws import results


# -- forged records (in-process moto) ------------------------------------------------------------


def _aws_in_process(home: Path) -> None:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION=REGION, CLOUDTRAIN_HOME=str(home))
    for key in ("AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(key, None)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(f"region: {REGION}\npoll_seconds: 0.05\n"
                                      "instance_wait_seconds: 2\nssh_wait_seconds: 1\n")


class GroupJob:
    """A recovering job of an Auto Scaling group as its launch records it (the pattern of
    tests/integration/test_aws_group_launch_moto.py): the job store's bucket, the job's row
    and spec, its template and group (its instances tagged with the job, as groups.py tags
    them), attempt 1 on the group's instance, here and in the job store."""

    def __init__(self, provider, store):
        import boto3

        from cloudtrain.host import job_records
        from cloudtrain.providers.aws import jobstore
        from cloudtrain.state import Instance

        self.provider, self.store, self.records = provider, store, job_records
        self.s3 = boto3.client("s3", region_name=REGION)
        self.asg = boto3.client("autoscaling", region_name=REGION)
        self.ec2 = boto3.client("ec2", region_name=REGION)
        _, self.bucket, _ = results.job_store_client(provider.aws, REGION)
        self.s3.create_bucket(Bucket=self.bucket)
        self.t0 = time.time() - 600
        job = store.create_job(name=None, kind="command", recipe=None, command="true",
                               backend="aws", spec={}, launcher="audit:1", at=self.t0)
        self.id, self.group = job.id, f"cloudtrain-{job.id}"
        store.update_job(job.id, spec={"region": REGION, "store_owner": OWNER,
                                       "instance_type": "g5.xlarge", "market": "spot",
                                       "auto_scaling_group": self.group})
        store.set_state(job.id, "running")
        self.prefix = jobstore.job_prefix(job.id, owner_key=OWNER)
        self.ec2.create_launch_template(LaunchTemplateName=self.group, LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge", "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": "cloudtrain:job",
                                                       "Value": job.id}]}]})
        self.asg.create_auto_scaling_group(
            AutoScalingGroupName=self.group, MinSize=1, MaxSize=1, DesiredCapacity=1,
            AvailabilityZones=[f"{REGION}a"], LaunchTemplate={"LaunchTemplateName": self.group},
            Tags=[{"Key": "cloudtrain:job", "Value": job.id, "PropagateAtLaunch": True,
                   "ResourceId": self.group, "ResourceType": "auto-scaling-group"}])
        [self.i1] = self.members()
        self.own = {self.i1}  # every instance the job's group ever ran
        # and those that carry the job's tag without being in its group: the job's too by
        # its tag (release terminates what is tagged, F12), but never an attempt of it
        self.tagged: set[str] = set()
        store.add_instance(Instance(
            id=self.i1, job_id=job.id, provider="aws", region=REGION, zone=f"{REGION}a",
            instance_type="g5.xlarge", market="spot", state="running", launched_at=self.t0,
            terminated_at=None, price_per_hour=None, details={"auto_scaling_group": self.group}))
        store.add_attempt(job.id, 1, started_at=self.t0, instance_id=self.i1, region=REGION,
                          zone=f"{REGION}a", market="spot", instance_type="g5.xlarge")
        self.attempt(1, self.i1, self.t0)

    @property
    def job(self):
        return self.store.job(self.id)

    def members(self) -> list[str]:
        found = self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.group])["AutoScalingGroups"]
        return [i["InstanceId"] for g in found for i in g["Instances"]]

    def put(self, name: str, body) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)

    def attempt(self, n: int, instance: str, started_at: float, **over) -> None:
        self.put(f"{self.records.ATTEMPTS}{n}.json", {
            "attempt": n, "instance": instance, "zone": f"{REGION}a", "type": "g5.xlarge",
            "lifecycle": "spot", "started_at": started_at,
            "by": "launch" if n == 1 else "bootstrap", **over})

    def final(self, **over) -> None:
        self.put(self.records.FINAL, {"state": "succeeded", "exit_code": 0, "reason": None,
                                           "ended_at": time.time(), **over})

    def replace(self) -> str:
        """EC2 takes the group's instance back and AWS puts in a replacement."""
        before = set(self.members())
        self.ec2.terminate_instances(InstanceIds=sorted(before))
        [new] = set(self.members()) - before
        self.own.add(new)
        return new

    def stranger(self, region: str = REGION, **tags: str) -> str:
        import boto3

        spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v}
                                                      for k, v in tags.items()]}] if tags else []
        return boto3.client("ec2", region_name=region).run_instances(
            ImageId="ami-12c6146b" if region == REGION else _any_image(region),
            InstanceType="t3.micro", MinCount=1, MaxCount=1,
            TagSpecifications=spec)["Instances"][0]["InstanceId"]

    def state_of(self, instance: str, region: str = REGION) -> str:
        import boto3

        [res] = boto3.client("ec2", region_name=region).describe_instances(
            InstanceIds=[instance])["Reservations"]
        return res["Instances"][0]["State"]["Name"]


def _any_image(region: str) -> str:
    import boto3

    return boto3.client("ec2", region_name=region).describe_images(
        Owners=["amazon"])["Images"][0]["ImageId"]


def forge(g: GroupJob, case: str) -> dict:
    """Put what the case forges; {instance id: region} of the strangers it names."""
    t = g.t0 + 100
    strangers: dict[str, str] = {}

    def prod() -> str:
        i = g.stranger(Name="prod-database")
        strangers[i] = REGION
        return i

    def theirs() -> str:
        i = g.stranger(**{"cloudtrain:job": "0ther0b1", "Name": "another job"})
        strangers[i] = REGION
        return i

    if case == "attempts/2.json names an untagged instance (prod-database)":
        g.attempt(2, prod(), t)
    elif case == "attempts/2.json names another job's instance":
        g.attempt(2, theirs(), t)
    elif case == "attempts/2.json names an instance with the job's tag outside its group":
        loose = g.stranger(**{"cloudtrain:job": g.id})
        g.tagged.add(loose)
        g.attempt(2, loose, t)
    elif case == "attempts/2.json and 3.json name prod-database and another job's instance":
        g.attempt(2, prod(), t)
        g.attempt(3, theirs(), t + 100)
    elif case == "attempts/2.json names no instance EC2 has":
        g.attempt(2, "i-0123456789abcdef0", t)
    elif case == "attempts/2.json names an instance of another region":
        far = g.stranger(region="us-west-2", Name="prod-database")
        strangers[far] = "us-west-2"
        g.attempt(2, far, t)
    elif case == "attempts/2.json names the job's own first instance again":
        g.attempt(2, g.i1, t)
    elif case == "attempts/2.json garbage bytes":
        g.put(f"{g.records.ATTEMPTS}2.json", b"\x00\xff{garbage")
    elif case == "attempts/2.json a record of 1 MB":
        g.attempt(2, prod(), t, pad="x" * (1 << 20))
    elif case == "attempts/2.json holding attempt 3":
        g.put(f"{g.records.ATTEMPTS}2.json", {"attempt": 3, "instance": prod(),
                                                   "started_at": t})
    elif case == "final.json (succeeded) naming attempt 7, which the job does not have":
        i2 = g.replace()
        g.attempt(2, i2, t)
        g.final(attempt=7, instance=i2)
    elif case == "final.json (succeeded) naming prod-database":
        i2 = g.replace()
        g.attempt(2, i2, t)
        g.final(attempt=2, instance=prod())
    elif case == "final.json (succeeded) naming attempt 1 while attempt 2 runs":
        i2 = g.replace()
        g.attempt(2, i2, t)
        g.final(attempt=1, instance=g.i1)
    elif case == "final.json (succeeded) naming nothing":
        i2 = g.replace()
        g.attempt(2, i2, t)
        g.final(attempt=None, instance=None)
    elif case == "a true replacement by AWS (control)":
        g.attempt(2, g.replace(), t)
    else:
        harness(f"no such forged case {case!r}")
    return strangers


def drive_forged(case: str, home: str) -> None:
    _aws_in_process(Path(home))
    from moto import mock_aws

    from cloudtrain.config import Settings
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.lifecycle import autoscaled
    from cloudtrain.providers.aws import AWSProvider
    from cloudtrain.state import Store

    errors = []
    with mock_aws(), Store(Path(home) / "state.db") as store:
        try:
            g = GroupJob(AWSProvider(Settings(region=REGION, ssh_cidr="127.0.0.1/32",
                                              poll_seconds=0.05)), store)
            strangers = forge(g, case)
        except Exception as exc:  # noqa: BLE001 - the lab, not the code measured
            harness(f"{type(exc).__name__}: {exc}")
        finals = []
        for _ in range(2):  # status learns; a second look must add nothing
            try:
                finals.append(autoscaled.learn(store, g.job))
            except CloudtrainError as exc:
                errors.append(f"learn: {exc.message if hasattr(exc, 'message') else exc}")
        try:
            g.provider.release(store, g.job)  # what `down` and the job's end run
        except CloudtrainError as exc:
            errors.append(f"release: {exc.message if hasattr(exc, 'message') else exc}")
        report(g, case, strangers, finals)
    if errors:
        refused(errors[0])


def report(g: GroupJob, case: str, strangers: dict, finals: list) -> None:
    store = g.store
    for inst, region in strangers.items():
        state = g.state_of(inst, region)
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            flaw("foreign", f"{inst} ({region}), not the job's, is {state} after release")
    taken = [i.id for i in store.instances(g.id) if i.id not in g.own | g.tagged]
    if taken:
        flaw("taken", f"recorded (and priced) as the job's: {taken}")
    rows = [(a.n, a.instance_id) for a in store.attempts(g.id)]
    foreign_rows = [(n, i) for n, i in rows if i and i not in g.own]
    if foreign_rows:
        flaw("taken", f"attempt rows on instances outside the job's group: {foreign_rows}")
    if case.startswith("final.json") and any(f is not None for f in finals):
        final = next(f for f in finals if f is not None)
        flaw("taken", f"final.json taken as the job's end: {final.get('state')}")
    for inst in sorted(g.own | g.tagged):
        state = g.state_of(inst)
        if state in ("pending", "running"):
            flaw("left", f"the job's own {inst} is {state} after release")
    if "(control)" in case and len(rows) < 2:
        flaw("broken", f"the true replacement was not recorded: attempts {rows}")
    print(f"attempts {rows}; instances {[i.id for i in store.instances(g.id)]}; finals "
          f"{[f and f.get('state') for f in finals]}; strangers "
          f"{ {i: g.state_of(i, r) for i, r in strangers.items()} }")


# -- regroup members (moto's server, the real reader and grant) --------------------------------


def _tests_on_path() -> None:
    sys.path.insert(0, str(TREE / "tests"))


def _make_group(endpoint: str, name: str, job: str, count: int,
                cidr: str = "10.200.0.0/24") -> dict[str, str]:
    """The job's Auto Scaling group in moto with `count` instances (the job's tag by its
    launch template, the group's by AWS): {instance id: private address}."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    vpc = ec2.create_vpc(CidrBlock=cidr.rsplit(".", 2)[0] + ".0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr,
                               AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge", "TagSpecifications": [
            {"ResourceType": "instance", "Tags": [{"Key": "cloudtrain:job", "Value": job}]}]})
    boto3.client("autoscaling", region_name=REGION, endpoint_url=endpoint
                 ).create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": name}, MinSize=count,
        MaxSize=count, DesiredCapacity=count, VPCZoneIdentifier=subnet)
    return _listed(endpoint, name)


def _listed(endpoint: str, group: str) -> dict[str, str]:
    """What EC2 lists in `group`, live: {instance id: private address}."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    found = ec2.describe_instances(Filters=[
        {"Name": "tag:aws:autoscaling:groupName", "Values": [group]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"]
    return {i["InstanceId"]: i["PrivateIpAddress"] for r in found for i in r["Instances"]}


def _call(function, *args, **optional):
    """function(*args, **the optional keywords it takes): the regroup API before and after a
    keyword was added."""
    import inspect

    names = inspect.signature(function).parameters
    return function(*args, **{k: v for k, v in optional.items() if k in names})


def _junk(case: str, honest: dict, marker: str):
    value = corpus.REGROUP_JUNK[case]
    address = honest["address"]
    zeros = ".".join(f"{int(p):03d}" for p in address.split("."))
    fill = {"{address}": address, "{zeros}": zeros, "{b}": honest["instance"], "{M}": marker}

    def filled(text: str) -> str:
        for key, sub in fill.items():
            text = text.replace(key, sub)
        return text

    if isinstance(value, bytes):
        return filled(value.decode("latin-1")).encode("latin-1")
    if isinstance(value, dict):
        return {**honest, **{k: filled(v) if isinstance(v, str) else v
                             for k, v in value.items()}}
    return value


def drive_regroup(case: str, marker: str) -> None:
    import logging

    import boto3
    from _pytest.monkeypatch import MonkeyPatch

    _tests_on_path()
    from labs.aws import instance_store, moto_server

    from cloudtrain.host import regroup
    from cloudtrain.host.bundle_reader import Bundle, Failed
    from cloudtrain.host.awsapi import RoleCredentials

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    job, bucket = "regroup01", "cloudtrain-123456789012-us-east-1"
    prefix, group = f"jobs/{OWNER}/{job}/", f"cloudtrain-{job}"
    patch = MonkeyPatch()
    with moto_server() as endpoint:
        try:
            s3, imds, grant = instance_store(endpoint, patch, bucket, job, OWNER, REGION)
            addresses = _make_group(endpoint, group, job, 3)
        except Exception as exc:  # noqa: BLE001 - the lab, not the code measured
            harness(f"{type(exc).__name__}: {exc}")
        try:  # the fake IMDS closed whatever happens
            a, b, c = sorted(addresses)

            def record(inst: str, rank, **over) -> dict:
                return {"instance": inst, "rank": rank, "address": addresses[inst],
                        "iface": "eth0", "port": 29500 + rank if isinstance(rank, int)
                        else 29500, "at": time.time(), **over}

            def put(name: str, body) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                s3.put_object(Bucket=bucket, Key=prefix + name, Body=data)

            def stored(name: str) -> bool:
                return "Contents" in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + name)

            put("attempts/2.json", {"attempt": 2})
            put(f"attempts/2/{a}.json", record(a, 0))
            me = regroup.mine({"instance": c, "address": addresses[c]}, 2)
            later = hostile(case, put, record, a, b, c, endpoint, marker)
            reader = Bundle(bucket, prefix, REGION, endpoint, imds.url)
            conf = {"group": group, "region": REGION, "endpoint": endpoint, "prefix": prefix}
            peers = (regroup.group_peers(conf, RoleCredentials(imds.url))
                     if hasattr(regroup, "group_peers") else None)
            out: dict = {}

            def meeting() -> None:
                try:
                    out["met"] = _call(regroup.meet, reader, regroup.records_grant(
                        {"results_store": grant}, prefix), prefix, 2, 3, me, peers=peers,
                        wait_s=5.0, meet_s=3.0, poll_s=0.1)
                except Failed as exc:
                    out["failed"] = exc

            thread = threading.Thread(target=meeting, daemon=True)
            thread.start()
            if later is not None:  # what b writes once c's record is there
                deadline = time.monotonic() + 20
                while not stored(f"attempts/2/{c}.json") and time.monotonic() < deadline:
                    time.sleep(0.05)
                later()
            thread.join()
        finally:
            imds.close()
        if "failed" in out:
            refused(str(out["failed"]))
        n, ranks = out["met"]
        listed = _listed(endpoint, group)
        for m in ranks:
            if listed.get(m["instance"]) != m["address"]:
                flaw("member", f"rank {m['rank']}: {m['instance']} at {m['address']}, which EC2 "
                               f"does not list in the job's group at that address")
        rank = next(m["rank"] for m in ranks if m["instance"] == c)
        part = _call(regroup.take_part, {"env": {}, "results_store": grant}, prefix, rank,
                     ranks, iface=me["iface"])
        env = part["env"]
        for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if env.get(key) not in (None, me["iface"]):
                flaw("broken", f"c's {key}={env[key]}: taken from a record, not its own")
        print(f"attempt {n}: {[(m['rank'], m['instance'], m['address']) for m in ranks]}; "
              f"MASTER_ADDR={env.get('MASTER_ADDR')}")


def hostile(case, put, record, a, b, c, endpoint, marker):
    """Write what hostile node b writes for `case`; a callable for what it writes once c has
    joined, or None."""
    if case == "three honest nodes (control)":
        put(f"attempts/2/{b}.json", record(b, 1))
    elif case == "b overwrites rank 0's record with 203.0.113.66:4444":
        put(f"attempts/2/{b}.json", record(b, 1))
        put(f"attempts/2/{a}.json", record(a, 0, address="203.0.113.66", port=4444))
    elif case.startswith("b writes a phantom"):
        phantom = "i-00000000000000001"
        address = "198.51.100.7" if "198.51" in case else "10.200.0.77"
        put(f"attempts/2/{phantom}.json", {"instance": phantom, "rank": 0, "address": address,
                                           "iface": "eth0", "port": 4444})
    elif case == "b rewrites c's record with iface lo":
        me_then = dict(record(c, 2))

        def later():
            put(f"attempts/2/{c}.json", dict(me_then, iface="lo"))
            put(f"attempts/2/{b}.json", record(b, 1))
        return later
    elif case == "b writes a record for another job's group's instance":
        other = _make_group(endpoint, "cloudtrain-other", "other", 1, cidr="10.201.0.0/24")
        [(inst, address)] = other.items()
        put(f"attempts/2/{inst}.json", {"instance": inst, "rank": 1, "address": address,
                                        "iface": "eth0", "port": 29501})
    elif case.startswith("b's own record at "):
        address = case.removeprefix("b's own record at ").split()[0]
        put(f"attempts/2/{b}.json", record(b, 1, address=address))
    elif case.startswith("b's own record: "):
        body = _junk(case.removeprefix("b's own record: "), record(b, 1), marker)
        put(f"attempts/2/{b}.json", body)
    elif case == "newer attempts recorded every 0.2 s while c meets (F43)":
        put(f"attempts/2/{b}.json", record(b, 1))

        def writer():
            n = 3
            while True:
                put(f"attempts/{n}.json", {"attempt": n})
                n += 1
                time.sleep(0.2)
        threading.Thread(target=writer, daemon=True).start()
    else:
        harness(f"no such regroup case {case!r}")
    return None
