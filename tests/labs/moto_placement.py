"""Placement groups for moto, which has none (moto 5.2: CreatePlacementGroup is "not
implemented", an HTML 500 in server mode): the three calls a job on several nodes makes,
added to moto's EC2 responses for the test, with the EC2 behaviour cloudtrain relies on.

    CreatePlacementGroup      GroupName, Strategy (cluster | spread | partition), tags;
                              InvalidPlacementGroup.Duplicate for a name in use
    DescribePlacementGroups   by GroupNames, or Filters group-name, strategy, state,
                              tag:KEY, tag-key
    DeletePlacementGroup      InvalidPlacementGroup.InUse while an instance launched into
                              it is not terminated; InvalidPlacementGroup.Unknown for none
    RunInstances              Placement.GroupName must name a group (else
                              InvalidPlacementGroup.Unknown, as EC2); its instances are
                              remembered as the group's

Installed with monkeypatch on moto's classes, so it serves in-process `mock_aws()` and a
ThreadedMotoServer alike (a subprocess that talks to that server sees it too), and goes
away at the test's end.
"""

from __future__ import annotations

import threading


class PlacementGroups:
    def __init__(self):
        self.groups: dict[str, dict] = {}  # name -> {GroupName, GroupId, Strategy, State, Tags}
        self.members: dict[str, list[str]] = {}  # name -> instance ids launched into it
        self.launches: list[dict] = []  # every RunInstances: {group, count, interfaces}
        self.lock = threading.Lock()

    def install(self, monkeypatch) -> "PlacementGroups":
        from moto.core.responses import ActionResult
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.responses import EC2Response
        from moto.ec2.responses.instances import InstanceResponse

        lab = self

        def create_placement_group(self) -> ActionResult:
            name = self._get_param("GroupName")
            strategy = self._get_param("Strategy") or "cluster"
            tags = self._parse_tag_specification().get("placement-group", {})
            self.error_on_dryrun()
            with lab.lock:
                if name in lab.groups and lab.groups[name]["State"] != "deleted":
                    raise EC2ClientError("InvalidPlacementGroup.Duplicate",
                                         f"The Placement Group '{name}' already exists.")
                group = {"GroupName": name, "GroupId": f"pg-{len(lab.groups):017x}",
                         "Strategy": strategy, "State": "available",
                         "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                lab.groups[name] = group
                lab.members[name] = []
            return ActionResult({"PlacementGroup": dict(group)})

        def describe_placement_groups(self) -> ActionResult:
            names = self._get_param("GroupNames", [])
            filters = self._filters_from_querystring()
            with lab.lock:
                found = [dict(g) for g in lab.groups.values() if g["State"] != "deleted"
                         and (not names or g["GroupName"] in names)
                         and all(_matches(g, k, v) for k, v in filters.items())]
            return ActionResult({"PlacementGroups": found})

        def delete_placement_group(self) -> ActionResult:
            name = self._get_param("GroupName")
            self.error_on_dryrun()
            with lab.lock:
                group = lab.groups.get(name)
                if group is None or group["State"] == "deleted":
                    raise EC2ClientError("InvalidPlacementGroup.Unknown",
                                         f"The Placement Group '{name}' is unknown.")
                if any(_state(self, i) != "terminated" for i in lab.members.get(name, [])):
                    raise EC2ClientError("InvalidPlacementGroup.InUse",
                                         f"The placement group '{name}' is in use and may "
                                         "not be deleted.")
                group["State"] = "deleted"
            return ActionResult({})

        original = InstanceResponse.run_instances

        def run_instances(self) -> ActionResult:
            group = self._get_param("Placement.GroupName")
            interfaces = self._get_param("NetworkInterfaces", [])
            if group is not None:
                with lab.lock:
                    if group not in lab.groups or lab.groups[group]["State"] == "deleted":
                        raise EC2ClientError("InvalidPlacementGroup.Unknown",
                                             f"The Placement Group '{group}' is unknown.")
            result = original(self)
            ids = [i.id for i in result.result.instances]
            for inst in result.result.instances:  # DescribeInstances shows Placement.GroupName
                inst.placement.group_name = group or ""
            with lab.lock:
                if group is not None:
                    lab.members[group].extend(ids)
                lab.launches.append({"group": group, "count": len(ids), "ids": ids,
                                     "interfaces": interfaces})
            return result

        monkeypatch.setattr(EC2Response, "create_placement_group", create_placement_group,
                            raising=False)
        monkeypatch.setattr(EC2Response, "describe_placement_groups", describe_placement_groups,
                            raising=False)
        monkeypatch.setattr(EC2Response, "delete_placement_group", delete_placement_group,
                            raising=False)
        monkeypatch.setattr(InstanceResponse, "run_instances", run_instances)
        return self

    def live(self) -> list[str]:
        """The names of the groups not deleted."""
        with self.lock:
            return sorted(n for n, g in self.groups.items() if g["State"] != "deleted")


def _state(response, instance_id: str) -> str:
    try:
        return response.ec2_backend.get_instance(instance_id).state
    except Exception:  # gone from moto altogether
        return "terminated"


def _matches(group: dict, key: str, values: list[str]) -> bool:
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    if key.startswith("tag:"):
        return tags.get(key[4:]) in values
    if key == "tag-key":
        return any(v in tags for v in values)
    field = {"group-name": "GroupName", "strategy": "Strategy", "state": "State"}.get(key)
    if field is None:
        from moto.ec2.exceptions import EC2ClientError

        raise EC2ClientError("InvalidParameterValue", f"The filter '{key}' is invalid")
    return group[field] in values
