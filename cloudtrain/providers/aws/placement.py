"""Cluster placement groups: the nodes of a multi-node job in one, made per job and deleted
with it; and which instance types have EFA interfaces for them."""

from __future__ import annotations

from ...errors import CloudtrainError
from ...state import Job
from .errors import AWSError
from .session import AwsSession
from .tags import TAG_JOB, TAG_OWNER


# EFA interfaces per instance type (EC2 DescribeInstanceTypes NetworkInfo.EfaInfo, for the
# catalog's GPU types; EC2 is asked where there are credentials). Types that are not here have
# no EFA (p3.16xlarge, g5.xlarge).
EFA_INTERFACES = {
    "g4dn.8xlarge": 1, "g4dn.12xlarge": 1, "g4dn.16xlarge": 1, "g4dn.metal": 1,
    "g5.8xlarge": 1, "g5.12xlarge": 1, "g5.16xlarge": 1, "g5.24xlarge": 1, "g5.48xlarge": 1,
    "g6.8xlarge": 1, "g6.12xlarge": 1, "g6.16xlarge": 1, "g6.24xlarge": 1, "g6.48xlarge": 1,
    "g6e.8xlarge": 1, "g6e.12xlarge": 1, "g6e.16xlarge": 1, "g6e.24xlarge": 2,
    "g6e.48xlarge": 4, "g7e.8xlarge": 1, "g7e.12xlarge": 1, "g7e.24xlarge": 2,
    "g7e.48xlarge": 4, "gr6.8xlarge": 1, "p3dn.24xlarge": 1, "p4d.24xlarge": 4,
    "p4de.24xlarge": 4, "p5.4xlarge": 1, "p5.48xlarge": 32, "p5e.48xlarge": 32,
    "p5en.48xlarge": 16, "p6-b200.48xlarge": 8, "p6-b300.48xlarge": 16,
}

def placement_group_name(job: Job, spec, try_n: int) -> str:
    return f"cloudtrain-{job.id}-a{job.facts.attempt}-{try_n}"


def create_placement_group(aws: AwsSession, region: str, job: Job, spec, try_n: int,
                           owner: str) -> str:
    """A cluster placement group for one try at the job's nodes (a group is tied to the
    AZ of its first instance: each AZ tried gets its own), tagged like the instances."""
    name = placement_group_name(job, spec, try_n)
    try:
        aws.call(region, "create_placement_group", GroupName=name, Strategy="cluster",
                 TagSpecifications=[{"ResourceType": "placement-group", "Tags": [
                     {"Key": TAG_JOB, "Value": job.id}, {"Key": TAG_OWNER, "Value": owner},
                     {"Key": "Name", "Value": name}]}])
    except AWSError as exc:
        if exc.code != "InvalidPlacementGroup.Duplicate":  # a retried launch made it
            raise
    return name


def delete_placement_groups(aws: AwsSession, region: str, job_id: str | None = None,
                            owner: str | None = None) -> list[str]:
    """Delete the job's placement groups (or, with `owner`, every one of ours) that no
    instance is in any more; one still in use (instances shutting down) is left for the
    next cleanup (`down`, the next launch on several nodes). Placement groups do not
    bill; they count against a limit per region."""
    filters = [{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}] if job_id else \
        [{"Name": f"tag:{TAG_OWNER}", "Values": [owner]}]
    import botocore.exceptions

    try:
        groups = aws.call(region, "describe_placement_groups",
                          Filters=filters)["PlacementGroups"]
    except (CloudtrainError, botocore.exceptions.BotoCoreError):
        return []  # not allowed to look, or no answer: the next cleanup looks again
    removed = []
    for g in groups:
        if g.get("State") in ("deleting", "deleted"):
            continue
        try:  # EC2 refuses one that an instance not yet terminated is in: InUse
            aws.call(region, "delete_placement_group", GroupName=g["GroupName"])
            removed.append(g["GroupName"])
        except AWSError as exc:
            if exc.code not in ("InvalidPlacementGroup.InUse",
                                "InvalidPlacementGroup.Unknown"):
                raise
    return removed
