"""EC2's quotas in Service Quotas for moto, which serves only the VPC's (moto 5.2:
GetServiceQuota answers NoSuchResourceException for ServiceCode ec2, and
GetAWSDefaultServiceQuota is not implemented at all): the two calls `cloudtrain check`
makes (issue 16), with the Service Quotas behaviour it relies on.

    GetServiceQuota            the applied value where the test set one; else
                               NoSuchResourceException, as AWS answers for a quota whose
                               applied value is not available
    GetAWSDefaultServiceQuota  the default value the test set (0 where it set none: a new
                               account's G and P quotas)
    either                     AccessDeniedException naming the action, for the actions the
                               test denies

Installed with monkeypatch on moto's response class, so it serves in-process `mock_aws()`
and a ThreadedMotoServer alike, and goes away at the test's end. Other service codes (vpc)
still reach moto's own backend.
"""

from __future__ import annotations

import json
import threading

from moto.core import DEFAULT_ACCOUNT_ID

NAMES = {"L-417A185B": "Running On-Demand P instances",
         "L-DB2E81BA": "Running On-Demand G and VT instances",
         "L-7212CCBC": "All P Spot Instance Requests",
         "L-3819A6DF": "All G and VT Spot Instance Requests"}


class EC2Quotas:
    def __init__(self):
        self.applied: dict[str, float] = {}  # quota code -> the account's applied value
        self.defaults: dict[str, float] = {}  # quota code -> AWS's default (else 0)
        self.denied: set[str] = set()  # actions refused: "GetServiceQuota", ...
        self.calls: list[tuple[str, str, str]] = []  # (action, region, quota code)
        self.lock = threading.Lock()

    def install(self, monkeypatch) -> "EC2Quotas":
        from moto.core.exceptions import JsonRESTError
        from moto.servicequotas.responses import ServiceQuotasResponse

        lab = self
        original = ServiceQuotasResponse.get_service_quota

        def answer(response, action: str, applied: bool) -> str:
            params = json.loads(response.body)
            code = str(params.get("QuotaCode"))
            with lab.lock:
                lab.calls.append((action, response.region, code))
                if action in lab.denied:
                    raise JsonRESTError(
                        "AccessDeniedException",
                        f"User: arn:aws:iam::{DEFAULT_ACCOUNT_ID}:user/moto is not authorized "
                        f"to perform: servicequotas:{action} because no identity-based "
                        f"policy allows the servicequotas:{action} action")
                if applied and code not in lab.applied:
                    raise JsonRESTError(
                        "NoSuchResourceException",
                        f"The request failed because the specified quota {code} does not "
                        "have an applied value.")
                value = lab.applied[code] if applied else lab.defaults.get(code, 0.0)
            return json.dumps({"Quota": {
                "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                "QuotaArn": f"arn:aws:servicequotas:{response.region}:{DEFAULT_ACCOUNT_ID}:"
                            f"ec2/{code}",
                "QuotaCode": code, "QuotaName": NAMES.get(code, code), "Value": value,
                "Unit": "None", "Adjustable": True, "GlobalQuota": False}})

        def get_service_quota(self) -> str:
            if json.loads(self.body).get("ServiceCode") != "ec2":
                return original(self)
            return answer(self, "GetServiceQuota", applied=True)

        def get_aws_default_service_quota(self) -> str:
            return answer(self, "GetAWSDefaultServiceQuota", applied=False)

        monkeypatch.setattr(ServiceQuotasResponse, "get_service_quota", get_service_quota)
        monkeypatch.setattr(ServiceQuotasResponse, "get_aws_default_service_quota",
                            get_aws_default_service_quota, raising=False)
        return self

    def set_all(self, on_demand_g: float, on_demand_p: float, spot_g: float, spot_p: float,
                applied: bool = True) -> None:
        """The four vCPU quotas `check` reads, as applied values (or as AWS's defaults)."""
        values = {"L-DB2E81BA": on_demand_g, "L-417A185B": on_demand_p,
                  "L-3819A6DF": spot_g, "L-7212CCBC": spot_p}
        (self.applied if applied else self.defaults).update(values)
