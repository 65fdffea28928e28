"""Auto Scaling's scaling activities for moto, which keeps none (moto 5.2: DescribeScalingActivities
answers an empty list whatever a group did): the record AWS keeps of what each group did to
its instances, written where moto's groups (and the namespace lab's, labs.asg) start and end
them, and served in AWS's shapes (Amazon EC2 Auto Scaling API Reference: Activity,
DescribeScalingActivities).

    launch      "Launching a new EC2 instance: i-..." when a group starts an instance (at its
                creation, on a capacity change, as a replacement); Cause "At <time>Z an
                instance was started in response to a difference between desired and actual
                capacity, increasing the capacity from n to n+1.", StatusCode Successful,
                Progress 100, Details '{"Subnet ID": ..., "Availability Zone": ...}'
    attach      "Attaching an existing EC2 instance: i-..." for AttachInstances
    detach      "Detaching EC2 instance: i-..." for DetachInstances (its end is then no
                activity of the group's)
    terminate   "Terminating EC2 instance: i-..." when an instance of a group ends: by the
                group (a lower desired capacity, the group deleted, a scheduled action,
                TerminateInstanceInAutoScalingGroup: "... taken out of service in response
                to a difference between desired and actual capacity, shrinking the capacity
                from n to n-1." or "... in response to a user request"), or by EC2 itself
                (TerminateInstances, a spot reclaim, a stop the group's health check ends):
                "... in response to an EC2 health check indicating it has been terminated
                or stopped." AWS notices that a little later; here it is at once.
    DescribeScalingActivities  AutoScalingGroupName; ActivityIds (at most 50); a deleted
                group's activities only with IncludeDeletedGroups (AutoScalingGroupState
                InService or Deleted: a group of the same name made again is another group);
                MaxRecords 1..100 (default 100) and NextToken (InvalidNextToken for one it did
                not give); newest first; only those of the last 6 weeks
    denied      AccessDenied naming autoscaling:DescribeScalingActivities, as AWS answers a
                principal whose policies lack the action

For tests: lab.activities(group) (the recorded ones, oldest first, each a dict of AWS's
fields), lab.calls (each DescribeScalingActivities asked: group, include_deleted, token,
max_records), lab.advance(s) (AWS's clock s ahead: activities older than 6 weeks leave the
answer), lab.denied = True; and forget_instance(id): EC2 stops listing an ended instance
(about an hour after its end), as if that hour had passed.

Installed with monkeypatch on moto's classes (its Auto Scaling group members, EC2's instance
termination, the Auto Scaling responses), so it serves in-process `mock_aws()` and a
ThreadedMotoServer alike, whichever starts the instances (moto's group launch or labs.asg's
own), and goes away at the test's end.
"""

from __future__ import annotations

import base64
import datetime
import json
import threading
import time
import uuid

from labs.credentials import REGION

RETENTION_S = 42 * 86400  # "all activities for the past six weeks are described"
MAX_RECORDS = 100  # "The default value is 100 and the maximum value is 100."
MAX_ACTIVITY_IDS = 50
DENIED = ("User: arn:aws:iam::123456789012:user/moto is not authorized to perform: "
          "autoscaling:DescribeScalingActivities because no identity-based policy allows the "
          "autoscaling:DescribeScalingActivities action")


def _at(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


class ScalingActivities:
    def __init__(self):
        self.records: list[dict] = []  # every activity, oldest first (with its group object)
        self.members: dict[str, object] = {}  # instance id -> the group that holds it
        self.calls: list[dict] = []
        self.denied = False
        self.ahead_s = 0.0
        self.lock = threading.RLock()
        self._why = threading.local()  # what the group is doing on this thread right now

    # -- for tests -----------------------------------------------------------------------------
    def activities(self, group: str | None = None) -> list[dict]:
        with self.lock:
            return [self._shape(r) for r in self.records
                    if group is None or r["group"].name == group]

    def advance(self, seconds: float) -> None:
        self.ahead_s += seconds

    # -- recording -----------------------------------------------------------------------------
    def _record(self, group, verb: str, instance, cause: str, start: float | None = None
                ) -> dict:
        now = time.time()
        start = now if start is None else start
        record = {"group": group, "ActivityId": str(uuid.uuid4()),
                  "Description": f"{verb}: {instance.id}", "Cause": cause[:1023],
                  "start": start, "end": max(now, start), "StatusCode": "Successful",
                  "Progress": 100, "Details": json.dumps({
                      "Subnet ID": getattr(instance, "subnet_id", None) or "",
                      "Availability Zone": instance.placement.zone})}
        with self.lock:
            self.records.append(record)
        return record

    @staticmethod
    def _live(group) -> int:
        return sum(1 for s in group.instance_states
                   if s.instance.state not in ("terminated", "shutting-down"))

    def install(self, monkeypatch) -> "ScalingActivities":
        from moto.autoscaling.exceptions import AutoscalingClientError
        from moto.autoscaling.models import (AutoScalingBackend, FakeAutoScalingGroup,
                                             InstanceState)
        from moto.autoscaling.responses import AutoScalingResponse
        from moto.core.responses import ActionResult
        from moto.ec2.models.instances import Instance

        lab = self
        member_init = InstanceState.__init__

        def joined(state, instance, *args, **kw) -> None:
            # moto's group launch and labs.asg's both make the member this way; so does
            # AttachInstances (with the lab's note that it is attaching)
            member_init(state, instance, *args, **kw)
            group = state.auto_scaling_group
            with lab.lock:
                if lab.members.get(instance.id) is group:
                    return
                lab.members[instance.id] = group
            live = lab._live(group)
            if getattr(lab._why, "attaching", False):
                lab._record(group, "Attaching an existing EC2 instance", instance,
                            f"At {_at(time.time())} an instance was added in response to user "
                            f"request. Keeping the capacity at the new {live + 1}.")
                return
            launched = instance.launch_time
            start = launched.replace(tzinfo=datetime.timezone.utc).timestamp() \
                if isinstance(launched, datetime.datetime) else None
            lab._record(group, "Launching a new EC2 instance", instance,
                        f"At {_at(start or time.time())} an instance was started in response "
                        "to a difference between desired and actual capacity, increasing the "
                        f"capacity from {live} to {live + 1}.", start=start)

        monkeypatch.setattr(InstanceState, "__init__", joined)

        def noting(cls, name: str, key: str, value=lambda _: True) -> None:
            """cls.name says on this thread, while it runs, what the group is doing (`key`)."""
            original = getattr(cls, name)

            def run(this, *args, **kw):
                before = getattr(lab._why, key, None)
                setattr(lab._why, key, value(this))
                try:
                    return original(this, *args, **kw)
                finally:
                    setattr(lab._why, key, before)

            monkeypatch.setattr(cls, name, run)

        noting(AutoScalingBackend, "attach_instances", "attaching")
        noting(AutoScalingBackend, "terminate_instance", "user")  # ...InAutoScalingGroup
        noting(FakeAutoScalingGroup, "set_desired_capacity", "shrinking", lambda group: group)

        detach_response = AutoScalingResponse.detach_instances

        def detach(response):
            name = response._get_param("AutoScalingGroupName")
            ids = response._get_param("InstanceIds", [])
            group = response.autoscaling_backend.autoscaling_groups.get(name)
            result = detach_response(response)
            for instance_id in ids:
                with lab.lock:
                    if group is None or lab.members.get(instance_id) is not group:
                        continue
                    del lab.members[instance_id]
                lab._record(group, "Detaching EC2 instance",
                            response.ec2_backend.get_instance(instance_id),
                            f"At {_at(time.time())} instance {instance_id} was detached in "
                            "response to a user request.")
            return result

        monkeypatch.setattr(AutoScalingResponse, "detach_instances", detach)

        terminate = Instance.terminate

        def ended(instance):
            was = instance._state.name
            if was == "terminated":
                # EC2: terminating a terminated instance changes nothing; moto wrote a new
                # "User initiated (<now>)" over the time of its end, which the bill reads
                # (a group deleted after its lost instance billed that one to the deletion).
                return None
            result = terminate(instance)
            with lab.lock:
                group = lab.members.pop(instance.id, None) if was != "terminated" else None
            if group is not None:
                now = _at(time.time())
                if getattr(lab._why, "user", False):
                    cause = (f"At {now} instance {instance.id} was taken out of service in "
                             "response to a user request.")
                elif getattr(lab._why, "shrinking", None) is group:
                    live = lab._live(group)
                    cause = (f"At {now} an instance was taken out of service in response to a "
                             "difference between desired and actual capacity, shrinking the "
                             f"capacity from {live + 1} to {live}.")
                else:
                    cause = (f"At {now} an instance was taken out of service in response to an "
                             "EC2 health check indicating it has been terminated or stopped.")
                lab._record(group, "Terminating EC2 instance", instance, cause)
            return result

        monkeypatch.setattr(Instance, "terminate", ended)

        def describe_scaling_activities(response) -> ActionResult:
            name = response._get_param("AutoScalingGroupName")
            ids = response._get_param("ActivityIds", []) or []
            deleted = response._get_bool_param("IncludeDeletedGroups", False)
            token = response._get_param("NextToken")
            size = response._get_int_param("MaxRecords")
            with lab.lock:
                lab.calls.append({"group": name, "include_deleted": deleted, "token": token,
                                  "max_records": size, "region": response.region})
                if lab.denied:
                    raise AutoscalingClientError("AccessDenied", DENIED)
            if size is None:
                size = MAX_RECORDS
            if not 1 <= size <= MAX_RECORDS:
                raise AutoscalingClientError(
                    "ValidationError", f"1 validation error detected: Value '{size}' at "
                    "'maxRecords' failed to satisfy constraint: Member must have value less "
                    f"than or equal to {MAX_RECORDS}")
            if len(ids) > MAX_ACTIVITY_IDS:
                raise AutoscalingClientError(
                    "ValidationError", "The list of requested activities cannot contain more "
                    f"than {MAX_ACTIVITY_IDS} items.")
            backend = response.autoscaling_backend
            oldest = time.time() + lab.ahead_s - RETENTION_S
            with lab.lock:
                found = [r for r in lab.records
                         if r["group"].region == response.region
                         and r["group"].account_id == response.current_account
                         and (name is None or r["group"].name == name)
                         and (not ids or r["ActivityId"] in ids)
                         and (deleted or backend.autoscaling_groups.get(r["group"].name)
                              is r["group"])
                         and r["start"] >= oldest]
                query = json.dumps([name, sorted(ids), deleted])
                start = 0
                if token:
                    try:
                        said = json.loads(base64.b64decode(token))
                        start, asked = int(said["from"]), said["query"]
                    except (ValueError, KeyError, TypeError):
                        asked = None
                    if asked != query:
                        raise AutoscalingClientError("InvalidNextToken",
                                                     "The NextToken value is invalid.")
                # newest first; an activity still in progress first of all
                found.sort(key=lambda r: (r["StatusCode"] == "Successful", -r["start"]))
                page = [lab._shape(r, backend) for r in found[start:start + size]]
            result = {"Activities": page}
            if start + size < len(found):
                result["NextToken"] = base64.b64encode(json.dumps(
                    {"from": start + size, "query": query}).encode()).decode()
            return ActionResult(result)

        monkeypatch.setattr(AutoScalingResponse, "describe_scaling_activities",
                            describe_scaling_activities)
        return self

    def _shape(self, record: dict, backend=None) -> dict:
        """An activity as DescribeScalingActivities gives it."""
        group = record["group"]
        if backend is None:
            from moto.autoscaling.models import autoscaling_backends

            backend = autoscaling_backends[group.account_id][group.region]
        utc = datetime.timezone.utc
        return {"ActivityId": record["ActivityId"], "AutoScalingGroupName": group.name,
                "Description": record["Description"], "Cause": record["Cause"],
                "StartTime": datetime.datetime.fromtimestamp(record["start"], utc),
                "EndTime": datetime.datetime.fromtimestamp(record["end"], utc),
                "StatusCode": record["StatusCode"], "Progress": record["Progress"],
                "Details": record["Details"], "AutoScalingGroupARN": group.arn,
                "AutoScalingGroupState": "InService"
                if backend.autoscaling_groups.get(group.name) is group else "Deleted"}


def forget_instance(instance_id: str, region: str = REGION) -> None:
    """EC2 no longer lists the ended instance (it does so about an hour after the end):
    moto's backend drops it, so DescribeInstances by id says InvalidInstanceID.NotFound and
    by filter leaves it out."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    for key, reservation in list(backend.reservations.items()):
        kept = [i for i in reservation.instances if i.id != instance_id]
        if len(kept) == len(reservation.instances):
            continue
        gone = next(i for i in reservation.instances if i.id == instance_id)
        if gone.state != "terminated":
            raise ValueError(f"{instance_id} is {gone.state}: EC2 lists it until after its end")
        if kept:
            reservation.instances = kept
        else:
            del backend.reservations[key]
        return
    raise KeyError(instance_id)
