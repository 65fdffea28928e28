"""Cluster placement groups: the nodes of a multi-node job in one, made per job and deleted
with it; and which instance types have EFA interfaces for them."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import CloudtrainError
from ...state import Job
from .errors import AWSError
from .session import AwsSession
from .tags import TAG_JOB, TAG_OWNER


@dataclass(frozen=True)
class EfaCards:
    """An instance type's EFA as EC2's DescribeInstanceTypes NetworkInfo gives it: how many
    EFA interfaces (EfaInfo.MaximumEfaInterfaces), how many network cards (0 .. cards - 1),
    which one is the primary (DefaultNetworkCardIndex: the primary network interface's),
    and whether that one takes EFA; each further card takes an EFA-only interface."""
    efa: int
    cards: int
    primary: int = 0
    primary_efa: bool = True


# EFA per instance type, for the catalog's GPU types: the fallback where EC2 cannot be asked
# (no credentials); EC2 is asked where there are. Types that are not here have no EFA
# (p3.16xlarge, g5.xlarge). p6-b300.48xlarge: 17 cards, the primary one ENA only, EFA on
# cards 1..16.
EFA_INTERFACES: dict[str, EfaCards] = {
    **{name: EfaCards(1, 1) for name in (
        "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge", "g4dn.metal", "g5.8xlarge",
        "g5.12xlarge", "g5.16xlarge", "g5.24xlarge", "g5.48xlarge", "g6.8xlarge", "g6.12xlarge",
        "g6.16xlarge", "g6.24xlarge", "g6.48xlarge", "g6e.8xlarge", "g6e.12xlarge",
        "g6e.16xlarge", "g7e.8xlarge", "g7e.12xlarge", "gr6.8xlarge", "p3dn.24xlarge",
        "p5.4xlarge")},
    "g6e.24xlarge": EfaCards(2, 2), "g6e.48xlarge": EfaCards(4, 4),
    "g7e.24xlarge": EfaCards(2, 2), "g7e.48xlarge": EfaCards(4, 4),
    "p4d.24xlarge": EfaCards(4, 4), "p4de.24xlarge": EfaCards(4, 4),
    "p5.48xlarge": EfaCards(32, 32), "p5e.48xlarge": EfaCards(32, 32),
    "p5en.48xlarge": EfaCards(16, 16), "p6-b200.48xlarge": EfaCards(8, 8),
    "p6-b300.48xlarge": EfaCards(16, 17, primary=0, primary_efa=False),
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
