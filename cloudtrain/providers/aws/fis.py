"""A spot interruption on demand, through AWS Fault Injection Service (FIS), for
`check --launch --recovery`: EC2 itself tells the instance (the rebalance recommendation and
the two-minute notice in its metadata), then interrupts it, so the path a real reclaim takes
is the one proved.

    ROLE_NAME                               the role FIS acts with (infra/README.md 2b)
    role_arn(aws, region, name)             its ARN in the caller's account
    interrupt(aws, region, instance_id, job_id, owner, role) -> (template id, experiment id)
    experiment(aws, region, experiment_id)  {"status", "reason"} as FIS says it
    end(aws, region, template_id, experiment_id)   stopped if it runs, its template deleted
    templates(aws, region, job_id)          the experiment templates tagged with the job

FIS's action `aws:ec2:send-spot-instance-interruptions` targets resources of type
`aws:ec2:spot-instance`, named here by ARN (only Spot Instances resolve: an on-demand instance
leaves the target empty and the experiment fails), with `durationBeforeInterruption` between
PT2M and PT15M: at PT2M the rebalance recommendation and the interruption notice come
together, two minutes before the interruption. FIS acts with the experiment template's role
(trust fis.amazonaws.com; ec2:SendSpotInstanceInterruptions and ec2:DescribeInstances), which
the caller passes (iam:PassRole). Every template carries a stop condition (`none`: nothing
stops it early) and the owner's and job's tags, which the CLI's policy requires.
"""

from __future__ import annotations

import uuid

from .errors import AWSError, aws_errors
from .session import AwsSession, partition
from .tags import TAG_JOB, TAG_OWNER

ROLE_NAME = "cloudtrain-fis"
ACTION = "aws:ec2:send-spot-instance-interruptions"
TARGET_TYPE = "aws:ec2:spot-instance"
NOTICE = "PT2M"  # the least FIS allows: the notice and the interruption two minutes apart
TERMINAL = ("completed", "stopped", "failed", "cancelled")


def role_arn(aws: AwsSession, region: str, name: str) -> str:
    account = aws.identity(region)["Account"]
    return f"arn:{partition(region)}:iam::{account}:role/{name}"


def interrupt(aws: AwsSession, region: str, instance_id: str, job_id: str, owner: str,
              role: str) -> tuple[str, str]:
    """An experiment template that interrupts this one instance, started: (its template's
    id, the experiment's id). A template made but not started is deleted again."""
    account = aws.identity(region)["Account"]
    arn = f"arn:{partition(region)}:ec2:{region}:{account}:instance/{instance_id}"
    tags = {TAG_OWNER: owner, TAG_JOB: job_id}
    with aws_errors(region, "fis"):
        fis = aws.client("fis", region)
        made = fis.create_experiment_template(
            clientToken=str(uuid.uuid4()),
            description=f"cloudtrain check --launch --recovery: interrupt job {job_id}'s "
                        f"spot instance {instance_id}",
            roleArn=role_arn(aws, region, role),
            stopConditions=[{"source": "none"}],
            targets={"instance": {"resourceType": TARGET_TYPE, "resourceArns": [arn],
                                  "selectionMode": "ALL"}},
            actions={"interrupt": {"actionId": ACTION,
                                   "parameters": {"durationBeforeInterruption": NOTICE},
                                   "targets": {"SpotInstances": "instance"}}},
            tags=tags)["experimentTemplate"]
    try:
        with aws_errors(region, "fis"):
            started = fis.start_experiment(clientToken=str(uuid.uuid4()),
                                           experimentTemplateId=made["id"], tags=tags)
    except AWSError:
        end(aws, region, made["id"], None)
        raise
    return made["id"], started["experiment"]["id"]


def experiment(aws: AwsSession, region: str, experiment_id: str) -> dict:
    with aws_errors(region, "fis"):
        got = aws.client("fis", region).get_experiment(id=experiment_id)["experiment"]
    state = got.get("state") or {}
    return {"status": str(state.get("status") or "?"), "reason": str(state.get("reason") or "")}


def end(aws: AwsSession, region: str, template_id: str | None,
        experiment_id: str | None) -> None:
    """The experiment stopped if it still runs, and its template deleted (both gone already
    is fine: the experiment ends by itself, and an experiment keeps its own copy of the
    template)."""
    fis = aws.client("fis", region)
    if experiment_id:
        try:
            if experiment(aws, region, experiment_id)["status"] not in TERMINAL:
                with aws_errors(region, "fis"):
                    fis.stop_experiment(id=experiment_id)
        except AWSError as exc:
            if exc.code != "ResourceNotFoundException":
                raise
    if template_id:
        try:
            with aws_errors(region, "fis"):
                fis.delete_experiment_template(id=template_id)
        except AWSError as exc:
            if exc.code != "ResourceNotFoundException":
                raise


def templates(aws: AwsSession, region: str, job_id: str) -> list[str]:
    """The ids of the experiment templates tagged with this job (what a check left)."""
    found, token = [], None
    with aws_errors(region, "fis"):
        fis = aws.client("fis", region)
        while True:
            page = fis.list_experiment_templates(maxResults=100,
                                                 **({"nextToken": token} if token else {}))
            found += [t["id"] for t in page.get("experimentTemplates", [])
                      if (t.get("tags") or {}).get(TAG_JOB) == job_id]
            token = page.get("nextToken")
            if not token:
                return found
