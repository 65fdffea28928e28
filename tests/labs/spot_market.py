"""A spot market for the lab: DescribeSpotPriceHistory answered from a table the test sets
(moto answers every type with a fixed $0.00001), in EC2's shape: one row per change, newest
first, filtered by AZ, type and description, a row from before StartTime kept (the price in
force at StartTime, as EC2 returns it). The launching machine's cost settlement and the
instance's budget (host/budget.py, through the Query API with its role) read the same table.

    market = SpotMarket().install(monkeypatch)
    market.set("g5.xlarge", "us-east-1a", [(t0, 0.40), (t1, 0.55)])
"""
from __future__ import annotations

import datetime

from moto.core.responses import ActionResult
from moto.ec2.responses.spot_instances import SpotInstances


class SpotMarket:
    def __init__(self):
        self.prices: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.asked: list[dict] = []

    def set(self, instance_type: str, zone: str, points: list[tuple[float, float]]) -> None:
        """The price of `instance_type` in `zone`: (from, USD/h), in any order."""
        self.prices[(instance_type, zone)] = sorted(points)

    def rows(self, types: list[str], zone: str | None, start: float | None,
             end: float | None) -> list[dict]:
        out = []
        for (t, z), points in self.prices.items():
            if (types and t not in types) or (zone and z != zone):
                continue
            kept = [p for p in points if (end is None or p[0] <= end)]
            if start is not None:
                before = [p for p in kept if p[0] <= start]
                kept = before[-1:] + [p for p in kept if p[0] > start]
            out += [{"InstanceType": t, "ProductDescription": "Linux/UNIX", "SpotPrice":
                     f"{usd:.6f}", "AvailabilityZone": z, "Timestamp":
                     datetime.datetime.fromtimestamp(at, datetime.timezone.utc)}
                    for at, usd in kept]
        return sorted(out, key=lambda r: r["Timestamp"], reverse=True)

    def install(self, monkeypatch) -> "SpotMarket":
        market = self

        def describe(handler):
            def when(name):
                value = handler._get_param(name)
                if not value:
                    return None
                if isinstance(value, datetime.datetime):
                    return value.timestamp()
                return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")) \
                    .timestamp()

            types = handler._get_param("InstanceTypes", [])
            zone = handler._get_param("AvailabilityZone")
            market.asked.append({"types": types, "zone": zone})
            return ActionResult({"SpotPriceHistory": market.rows(
                types, zone, when("StartTime"), when("EndTime"))})

        monkeypatch.setattr(SpotInstances, "describe_spot_price_history", describe)
        return self
