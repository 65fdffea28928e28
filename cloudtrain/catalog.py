"""AWS GPU instance types and their on-demand prices, from the bundled catalog snapshot.

`data/aws-gpu-vms.csv` is SkyPilot's public AWS catalog (skypilot-org/skypilot-catalog,
catalogs/v9/aws/vms.csv @ 2c3d7ea, snapshot July 2026 or later), filtered to NVIDIA GPU types
in six regions: one row per (instance type, availability-zone id), with the region's
on-demand price and a one-time spot price snapshot (not a history).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

CATALOG = Path(__file__).resolve().parent / "data" / "aws-gpu-vms.csv"
SNAPSHOT = "SkyPilot AWS catalog v9 @ 2c3d7ea (July 2026 or later)"


@dataclass
class InstanceType:
    name: str
    gpu: str  # accelerator name: V100, A100, A10G, T4, ...
    gpus: float  # per instance (fractional for g6f/gr6f)
    vcpus: float
    memory_gib: float
    arch: str
    on_demand: dict[str, float] = field(default_factory=dict)  # region -> USD/h
    spot_snapshot: dict[str, dict[str, float]] = field(default_factory=dict)  # region -> az id -> USD/h

    def price(self, region: str, market: str = "on-demand") -> float | None:
        if market == "spot":
            zones = self.spot_snapshot.get(region) or {}
            return min(zones.values()) if zones else None
        return self.on_demand.get(region)


@lru_cache(maxsize=1)
def load() -> dict[str, InstanceType]:
    types: dict[str, InstanceType] = {}
    with open(CATALOG, newline="") as f:
        for row in csv.DictReader(f):
            t = types.get(row["InstanceType"])
            if t is None:
                t = types[row["InstanceType"]] = InstanceType(
                    row["InstanceType"], row["AcceleratorName"], float(row["AcceleratorCount"]),
                    float(row["vCPUs"]), float(row["MemoryGiB"]), row["Arch"])
            if row["Price"]:
                t.on_demand[row["Region"]] = float(row["Price"])
            if row["SpotPrice"]:
                t.spot_snapshot.setdefault(row["Region"], {})[row["AvailabilityZone"]] = \
                    float(row["SpotPrice"])
    return types


def get(name: str) -> InstanceType | None:
    return load().get(name)
