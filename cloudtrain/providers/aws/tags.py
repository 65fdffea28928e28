"""The tags every cloudtrain resource carries, and the shared security group's name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...state import Job

TAG_JOB, TAG_OWNER, TAG_RECIPE = "cloudtrain:job", "cloudtrain:owner", "cloudtrain:recipe"
# Which attempt of a recovering job an instance runs (1 for the launch): a supervisor that
# was killed mid-relaunch finds the instance it had started instead of starting another.
TAG_ATTEMPT = "cloudtrain:attempt"
# The tag AWS Auto Scaling puts on each instance of a group: the aws: prefix is reserved, so
# no principal can write it (a record naming an instance is checked against it).
TAG_GROUP = "aws:autoscaling:groupName"
GROUP_NAME = "cloudtrain"
EFA_GROUP_NAME = "cloudtrain-efa"  # all traffic between its members: EFA's OS bypass needs it
# Instance states that bill, or may again (a stopped instance keeps its volumes).
LIVE_STATES = ("pending", "running", "stopping", "stopped")


def job_tags(job: Job, spec, owner: str) -> list[dict]:
    """The tags of everything made for the job (instances, volumes, templates)."""
    return [{"Key": TAG_JOB, "Value": job.id}, {"Key": TAG_OWNER, "Value": owner},
            {"Key": TAG_RECIPE, "Value": spec.recipe or "command"},
            {"Key": TAG_ATTEMPT, "Value": str(job.facts.attempt)},
            {"Key": "Name", "Value": f"cloudtrain-{job.id}" + (f"-{job.name}" if job.name else "")}]
