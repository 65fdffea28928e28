"""EC2's Spot placement scores for moto, which has none (moto 5.2: GetSpotPlacementScores
"has not been implemented", a NotImplementedError in-process, an HTML 500 from a server):
the call a spot launch makes to order its AZs (issue 38), answered as EC2 documents it.

    GetSpotPlacementScores   SingleAvailabilityZone=true: one row per AZ of each region
                             asked, {"Region", "AvailabilityZoneId", "Score" 1..10}, the
                             score the test set for that AZ id (else `default`), the top 10
                             at most; false: one row per region (its AZs' best score)
    validation               InstanceTypes and InstanceRequirementsWithMetadata both, or
                             neither: InvalidParameterCombination; fewer than three distinct
                             InstanceTypes: InvalidParameterValue (the User Guide's
                             limitations: "you must specify at least three different instance
                             types, otherwise Amazon EC2 will return an error"; the code and
                             message are the lab's, EC2 documents neither); a type EC2 does
                             not know: InvalidParameterValue "The request contains instance
                             types that are not valid" (as EC2 answers, redhat-developer/mapt
                             #902); TargetCapacity below 1: InvalidParameterValue
    refusals                 `unsupported`: UnsupportedOperation, as EC2 answers an action a
                             region does not offer; `denied`: UnauthorizedOperation, as EC2 answers an action the
                             caller's policies do not allow; `config_limit`: past that many
                             distinct request configurations, MaxConfigLimitExceeded (a
                             configuration already asked is answered again, as the User
                             Guide says)

Installed with monkeypatch on moto's EC2 response class, so it serves in-process
`mock_aws()` and a ThreadedMotoServer alike, and goes away at the test's end.
"""

from __future__ import annotations

import json
import threading


class SpotScores:
    def __init__(self, default: int = 5):
        self.scores: dict[str, int] = {}  # AZ id ("use1-az4") -> 1..10
        self.default = default  # an AZ the test set no score for
        self.denied = False
        self.unsupported = False  # UnsupportedOperation: a region or endpoint without the call
        self.config_limit: int | None = None  # distinct configurations answered, at most
        self.configs: list[str] = []  # the distinct configurations answered so far
        self.calls: list[dict] = []  # every request, as parsed: InstanceTypes, ...
        self.lock = threading.Lock()

    def install(self, monkeypatch) -> "SpotScores":
        from moto.core.responses import ActionResult
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.responses import EC2Response

        lab = self

        def get_spot_placement_scores(self) -> ActionResult:
            types = list(self._get_param("InstanceTypes", []) or [])
            requirements = self._get_param("InstanceRequirementsWithMetadata")
            capacity = int(self._get_param("TargetCapacity") or 0)
            unit = self._get_param("TargetCapacityUnitType") or "units"
            single = str(self._get_param("SingleAvailabilityZone")).lower() == "true"
            regions = list(self._get_param("RegionNames", []) or []) or [self.region]
            request = {"InstanceTypes": types, "TargetCapacity": capacity,
                       "TargetCapacityUnitType": unit, "SingleAvailabilityZone": single,
                       "RegionNames": regions, "requirements": requirements is not None}
            with lab.lock:
                lab.calls.append(request)
                if lab.unsupported:
                    raise EC2ClientError(
                        "UnsupportedOperation", "The operation GetSpotPlacementScores is not "
                        "supported in this region")
                if lab.denied:
                    raise EC2ClientError(
                        "UnauthorizedOperation", "You are not authorized to perform this "
                        "operation. User: arn:aws:iam::123456789012:user/moto is not authorized"
                        " to perform: ec2:GetSpotPlacementScores because no identity-based "
                        "policy allows the ec2:GetSpotPlacementScores action")
            if bool(types) == bool(requirements):
                raise EC2ClientError("InvalidParameterCombination",
                                     "Specify either InstanceTypes or "
                                     "InstanceRequirementsWithMetadata, not both or neither.")
            if capacity < 1:
                raise EC2ClientError("InvalidParameterValue",
                                     f"Invalid value '{capacity}' for TargetCapacity.")
            if types and len(set(types)) < 3:
                raise EC2ClientError("InvalidParameterValue",
                                     "Specify at least three different instance types.")
            unknown = sorted(set(types) - _known_types())
            if unknown:
                raise EC2ClientError("InvalidParameterValue",
                                     "The request contains instance types that are not valid. "
                                     "Remove or correct the following instance types, and try "
                                     f"again: [{', '.join(unknown)}].")
            config = json.dumps([sorted(set(types)), capacity, unit, single, sorted(regions),
                                 bool(requirements)])
            with lab.lock:
                if config not in lab.configs:
                    if lab.config_limit is not None and len(lab.configs) >= lab.config_limit:
                        raise EC2ClientError(
                            "MaxConfigLimitExceeded", "You have exceeded your maximum allowed "
                            "Spot placement configurations. You can retry configurations that "
                            "you used within the last 24 hours, or wait for 24 hours before "
                            "specifying a new configuration.")
                    lab.configs.append(config)
                rows = []
                for region in regions:
                    zones = _zone_ids(self, region)
                    scored = [(z, lab.scores.get(z, lab.default)) for z in zones]
                    if single:
                        rows += [{"Region": region, "AvailabilityZoneId": z, "Score": s}
                                 for z, s in scored]
                    elif scored:
                        rows.append({"Region": region, "Score": max(s for _, s in scored)})
            rows.sort(key=lambda r: -r["Score"])  # EC2 answers its top 10
            return ActionResult({"SpotPlacementScores": rows[:10]})

        monkeypatch.setattr(EC2Response, "get_spot_placement_scores", get_spot_placement_scores,
                            raising=False)
        return self


def _known_types() -> set[str]:
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    return set(INSTANCE_TYPES)


def _zone_ids(response, region: str) -> list[str]:
    """The AZ ids of `region`, as moto's DescribeAvailabilityZones gives them."""
    from moto.ec2.models import ec2_backends

    backend = ec2_backends[response.current_account][region]
    return [z.zone_id for z in backend.describe_availability_zones()]
