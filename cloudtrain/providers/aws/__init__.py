"""EC2 through boto3, one concern per module, each a set of plain functions that take the
AwsSession (session.py) as their first argument; AWSProvider only delegates to them.

    provider.py        AWSProvider: the contract's verbs (providers/base.py), one line each
    cloud_account.py   AwsAccount: the provider's `account` (region, credentials, prices,
                       quotas, S3 datasets, what a launch makes), one line each
    session.py         AwsSession: settings, boto3 sessions and clients, region, owner
    plan.py            the dry run, the price rows and the question launch asks
    instance_types.py  preflight: the instance type, from the catalog or EC2
    bootstrap.py       owner, key pair, subnets, security group and AMI of a region (cached)
    acquire.py         one instance: run it, wait for it, its host key; `launch --on`
    host_setup.py      the instance as the job sees it: python3, tmux, paths, power-off
    instances.py       the RunInstances request, each AZ in turn; instances by tag
    boot.py            waiting for an instance: running, SSH, its host key on the console
    hostkeys.py        the console's SSH host key fingerprints
    inventory.py       instances by tag in every region: release, terminate, sweep, end times,
                       cleanup of what nothing uses
    cluster.py         N nodes in one AZ and placement group, all or nothing; EFA
    placement.py       placement groups, and which types have EFA
    groups.py          a recovering spot job's Auto Scaling group, template and deadline
    group_launch.py    a job that its Auto Scaling group starts and relaunches by itself
    network.py         key pair, security group, subnets
    job_role.py        a job's own IAM role and instance profile (`instance_profile: per-job`)
    images.py          the Deep Learning AMI and its root device
    volumes.py         datasets on EBS snapshots, as volumes of the job's instances
    datasets.py        datasets in S3 as tar shards: data push, and what a launch reads
    results.py         the job store verbs: where results go, how they come home
    jobstore.py        the S3 job store: its bucket, layout, grants and writes
    jobstore_fetch.py  reading the job store back: fetch, the latest checkpoint, restore plans
    jobstore_attempts.py  a group's attempt records in the job store
    jobbundle.py       the job's bundle in the job store
    account.py         where the credentials came from; EC2 vCPU quotas (Service Quotas)
    pricing.py         price list (on-demand, gp3) and spot price history
    spot_scores.py     EC2's spot placement score per AZ: a spot job's AZ order before price
    errors.py          AWS error codes in our words (AWSError)
    cache.py           what bootstrap found, per profile and region
    tags.py            the tags every resource carries

Which module may import which is tests/unit/test_layers.py's LAYERS (ARCHITECTURE.md draws
it): provider on top, then plan and the account, the launch paths, the concerns, session at
the bottom with the job store's layout. Raw boto dicts stay inside this package; what leaves
it is the store's records and Hosts.
"""
from .errors import AWSError, aws_errors
from .provider import AWSProvider
from .tags import GROUP_NAME, TAG_JOB, TAG_OWNER, TAG_RECIPE

__all__ = ["AWSError", "AWSProvider", "GROUP_NAME", "TAG_JOB", "TAG_OWNER", "TAG_RECIPE",
           "aws_errors"]
