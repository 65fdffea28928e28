"""EC2 through boto3, one concern per module:

    provider.py    AWSProvider: the contract's verbs (preflight, acquire, release, plan, ...)
    instances.py   RunInstances per AZ, waits, lookups by tag, termination, end times
    network.py     key pair, security group, subnets, cleanup of what nothing uses
    images.py      the Deep Learning AMI and its root device
    account.py     where the credentials came from; EC2 vCPU quotas (Service Quotas)
    pricing.py     price list (on-demand, gp3) and spot price history
    errors.py      AWS error codes in our words (AWSError)
    cache.py       what bootstrap found, per profile and region
    tags.py        the tags every resource carries

Raw boto dicts stay inside this package; what leaves it is the store's records and Hosts.
"""

from .errors import AWSError, aws_errors
from .provider import AWSProvider
from .tags import GROUP_NAME, TAG_JOB, TAG_OWNER, TAG_RECIPE

__all__ = ["AWSError", "AWSProvider", "GROUP_NAME", "TAG_JOB", "TAG_OWNER", "TAG_RECIPE",
           "aws_errors"]
