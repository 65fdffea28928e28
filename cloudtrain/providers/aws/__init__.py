"""EC2 through boto3, one concern per module:

    provider.py        AWSProvider: sessions, clients, bootstrap and the contract's host verbs
    plan.py            the dry run, the price rows and the question launch asks
    instances.py       the RunInstances request, each AZ in turn
    boot.py            waiting for an instance: running, SSH, its host key on the console
    hostkeys.py        the console's SSH host key fingerprints
    inventory.py       instances by tag in every region: release, terminate, sweep, end times
    cluster.py         N nodes in one AZ and placement group, all or nothing; EFA
    groups.py          a recovering spot job's Auto Scaling group, template and deadline
    network.py         key pair, security group, subnets, cleanup of what nothing uses
    images.py          the Deep Learning AMI and its root device
    volumes.py         datasets on EBS snapshots, as volumes of the job's instances
    datasets.py        datasets in S3 as tar shards: data push, and what a launch reads
    results.py         the job store verbs: where results go, how they come home
    jobstore.py        the S3 job store: its bucket, layout, grants and writes
    jobstore_fetch.py  reading the job store back: fetch, the latest checkpoint, restore plans
    account.py         where the credentials came from; EC2 vCPU quotas (Service Quotas)
    pricing.py         price list (on-demand, gp3) and spot price history
    errors.py          AWS error codes in our words (AWSError)
    cache.py           what bootstrap found, per profile and region
    tags.py            the tags every resource carries

Raw boto dicts stay inside this package; what leaves it is the store's records and Hosts.
"""

from .errors import AWSError, aws_errors
from .provider import AWSProvider
from .tags import GROUP_NAME, TAG_JOB, TAG_OWNER, TAG_RECIPE

__all__ = ["AWSError", "AWSProvider", "GROUP_NAME", "TAG_JOB", "TAG_OWNER", "TAG_RECIPE",
           "aws_errors"]
