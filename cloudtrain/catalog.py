"""AWS GPU instance types and their on-demand prices, from the bundled catalog snapshot.

`data/aws-gpu-vms.csv` is SkyPilot's public AWS catalog (skypilot-org/skypilot-catalog,
catalogs/v9/aws/vms.csv @ 2c3d7ea, snapshot July 2026 or later), filtered to NVIDIA GPU types
in six regions: one row per (instance type, availability-zone id), with the region's
on-demand price and a one-time spot price snapshot (not a history).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .market import Market

CATALOG = Path(__file__).resolve().parent / "data" / "aws-gpu-vms.csv"
SNAPSHOT = "SkyPilot AWS catalog v9 @ 2c3d7ea (July 2026 or later)"
DEFAULT_ARCH = "x86_64"  # the Deep Learning AMI cloudtrain uses (images.DLAMI_PARAMETER)


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
    # Its NVMe instance store (LocalDiskCount x LocalDiskSize GB where NVMeSupported): free
    # with the type, lost with the instance; 0 where it has none.
    nvme_disks: int = 0
    nvme_disk_gb: float = 0.0

    def price(self, region: str, market: str = "on-demand") -> float | None:
        if market == Market.SPOT:
            zones = self.spot_snapshot.get(region) or {}
            return min(zones.values()) if zones else None
        return self.on_demand.get(region)

    def dearest(self, region: str, market: str = "on-demand") -> float | None:
        """The highest price of the region: spot in its dearest AZ (a launch that finds no
        capacity in the cheaper ones ends up there), else on-demand."""
        if market == Market.SPOT:
            zones = self.spot_snapshot.get(region) or {}
            return max(zones.values()) if zones else None
        return self.on_demand.get(region)


def live_spot_path() -> Path:
    from .config import home

    return home() / "spot-prices.json"


@lru_cache(maxsize=1)
def load() -> dict[str, InstanceType]:
    """The bundled snapshot, with on-demand and spot prices replaced by those `catalog
    --refresh` fetched (per region, where fetched)."""
    types = _load_bundled()
    for region, by_type in (_live_list().get("on_demand") or {}).items():
        for name, price in by_type.items():
            if name in types:
                types[name].on_demand[region] = float(price)
    try:
        live = json.loads(live_spot_path().read_text())
    except (OSError, ValueError):
        return types
    for region, by_type in (live.get("regions") or {}).items():
        for name, zones in by_type.items():
            if name in types:
                types[name].spot_snapshot[region] = {z: float(p) for z, p in zones.items()}
    return types


def _load_bundled() -> dict[str, InstanceType]:
    types: dict[str, InstanceType] = {}
    with open(CATALOG, newline="") as f:
        for row in csv.DictReader(f):
            t = types.get(row["InstanceType"])
            if t is None:
                t = types[row["InstanceType"]] = InstanceType(
                    row["InstanceType"], row["AcceleratorName"], float(row["AcceleratorCount"]),
                    float(row["vCPUs"]), float(row["MemoryGiB"]), row["Arch"])
                if row.get("NVMeSupported") == "True" and row.get("LocalDiskCount") and \
                        row.get("LocalDiskSize"):
                    t.nvme_disks = int(float(row["LocalDiskCount"]))
                    t.nvme_disk_gb = float(row["LocalDiskSize"])
            if row["Price"]:
                t.on_demand[row["Region"]] = float(row["Price"])
            if row["SpotPrice"]:
                t.spot_snapshot.setdefault(row["Region"], {})[row["AvailabilityZone"]] = \
                    float(row["SpotPrice"])
    return types


def get(name: str) -> InstanceType | None:
    return load().get(name)


@lru_cache(maxsize=1)
def regions() -> frozenset[str]:
    """The regions the bundled snapshot has prices for."""
    return frozenset(r for t in _load_bundled().values()
                     for r in (*t.on_demand, *t.spot_snapshot))


def priced_regions() -> list[str]:
    """The regions the catalog has a price for: the bundled snapshot's, and any that
    `catalog --refresh` fetched."""
    return sorted({r for t in load().values() for r in (*t.on_demand, *t.spot_snapshot)})


def no_prices(region: str):
    """None where the catalog has prices for `region`; else the UsageError that says which
    regions it has, and how to fetch this one's. A region that is none is refused."""
    from .errors import UsageError

    check_region(region)
    have = priced_regions()
    if region in have:
        return None
    return UsageError(f"the catalog has no prices for {region} (it has {', '.join(have)})",
                      hint=f"cloudtrain catalog --refresh --region {region} fetches them")


def gpus_error(gpu: str, count: float, regions: list[str], market: str | None = None):
    """The UsageError for `--gpus GPU:N` that no type has where asked: which counts
    the GPU comes in there, and its types (its larger-memory kin, A100-80GB beside A100,
    named too); the one count to ask for where there is only one."""
    from .errors import UsageError

    head = (f"no instance type with {count:g}x {gpu}" + (" (spot)" if market == Market.SPOT else "")
            + f" in {', '.join(regions)}")

    def offered(t: InstanceType) -> bool:
        return any((market != Market.SPOT and r in t.on_demand) or
                   (market != Market.ON_DEMAND and r in t.spot_snapshot) for r in regions)

    kin = sorted((t for t in load().values() if (t.gpu == gpu or t.gpu.startswith(gpu + "-"))
                  and offered(t)), key=lambda t: (t.gpu != gpu, t.gpus, t.name))
    if not kin:
        return UsageError(f"{head}: the catalog has no {gpu} there",
                          hint=f"cloudtrain catalog --gpu {gpu} lists where it has it")
    counts = [f"{c:g}" for c in sorted({t.gpus for t in kin if t.gpu == gpu}
                                       or {t.gpus for t in kin})]
    sizes = counts[0] if len(counts) == 1 else \
        ", ".join(f"{c}-" for c in counts[:-1]) + f" and {counts[-1]}"
    listed = ", ".join(f"{t.name} ({t.gpus:g}x {t.gpu})" for t in kin)
    return UsageError(f"{head}: {gpu} comes {'only ' if len(counts) == 1 else ''}in {sizes}-GPU "
                      f"types here: {listed}",
                      hint=f"--gpus {gpu}:{counts[0]}" if len(counts) == 1 else
                      f"cloudtrain catalog --gpu {gpu} lists them")


def gpu_names() -> list[str]:
    return sorted({t.gpu for t in load().values()})


def check_gpu(gpu: str, source: str = "--gpu") -> str:
    """The catalog's spelling of a GPU name (case-insensitive), else a UsageError with the
    nearest names."""
    from .config import suggest
    from .errors import UsageError

    names = gpu_names()
    for name in names:
        if name.lower() == gpu.strip().lower():
            return name
    raise UsageError(f"{source} {gpu}: no instance type in the catalog has a GPU named "
                     f"{gpu!r}{suggest(gpu, names)}", hint="the GPUs: " + ", ".join(names))


def check_region(region: str, source: str = "--region") -> str:
    """A region the catalog covers, or one EC2 has (its prices then unknown here); an unknown
    one is a UsageError with the nearest names."""
    if region in regions():
        return region
    from .config import check_known_region

    return check_known_region(region, source)


# GPUs that no current Deep Learning AMI runs: NVIDIA's open kernel modules (the DLAMI's
# driver) support Turing and newer, and current torch wheels carry no Volta code (sm_70).
NO_DLAMI_GPUS = frozenset({"V100", "V100-32GB"})
# Their instance families: a job there gets Ubuntu 24.04 with NVIDIA's proprietary driver
# (branch 580, the last that runs Volta) and a torch built for CUDA 12.6 (which still has
# sm_70), installed at boot (providers/aws/images.py).
VOLTA_FAMILIES = ("p3", "p3dn")
# What that install adds before the job starts: the driver's packages and torch's wheels
# (about 3 GB) downloaded and unpacked. Estimated from their sizes, not measured.
VOLTA_INSTALL_S = 360.0
# The GPU instance families the default image (the Ubuntu 24.04 PyTorch DLAMI) supports, as
# its release notes list them: not p3/p3dn (above), nor g7e and p6-b300 (newer Blackwell parts
# its driver is not released for), nor the fractional-GPU g6f/gr6f (an AL2023 image's).
DLAMI_FAMILIES = ("g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en",
                  "p6-b200")


def instance_store(name: str) -> tuple[int, float] | None:
    """(disks, GB each) of type `name`'s NVMe instance store, as the bundled catalog lists it;
    None where it has none, or the catalog does not know the type."""
    t = get(name)
    if t is None or not t.nvme_disks or t.nvme_disk_gb <= 0:
        return None
    return t.nvme_disks, t.nvme_disk_gb


def default_gpu(count: int) -> str:
    """The GPU a job asks for when it names neither an instance nor a GPU and needs `count`
    on one host: a part every current DLAMI and torch wheel runs. The A10G of the default
    type (g5.xlarge) up to 4 (g5.12xlarge), A100 beyond (8: p4d.24xlarge)."""
    return "A10G" if count <= 4 else "A100"


def gpu_request(resources: dict, needed: int) -> str:
    """`A100:8`: what a cloud job asks for when no instance is given, from a recipe's
    `resources:` (its `gpu`, else default_gpu) and the GPUs its arguments need on one host
    (0: no requirement: its `gpus_per_node`). A variant set up for fewer GPUs than the
    recipe's default one asks for that many, not the default's instance."""
    count = needed or int(resources.get("gpus_per_node", 1))
    return f"{resources.get('gpu') or default_gpu(count)}:{count}"


def dlami_runs(name: str) -> bool:
    """Whether the default image supports GPU instance type `name` (DLAMI_FAMILIES)."""
    return name.split(".")[0] in DLAMI_FAMILIES


def volta(name: str) -> bool:
    """Whether `name` is a Volta type (VOLTA_FAMILIES): its own image and software."""
    return name.split(".")[0] in VOLTA_FAMILIES


def default_image_runs(name: str) -> bool:
    """Whether a job on GPU type `name` gets a default image that runs it: the DLAMI, or
    for Volta the Ubuntu image with the software installed at boot."""
    return dlami_runs(name) or volta(name)


def no_dlami_note(name: str, gpu: str | None) -> str:
    """Why no default image runs GPU type `name` (not default_image_runs)."""
    families = ", ".join(f.upper() for f in DLAMI_FAMILIES)
    return (f"{name} is not among the GPU types cloudtrain's default images support (the "
            f"Deep Learning AMI's release notes list {families}; P3 and P3DN get Ubuntu with "
            "NVIDIA's proprietary driver)")


def parse_gpus(request: str) -> tuple[str, float]:
    """`A10G:1` -> ("A10G", 1); `A100` -> ("A100", 1). Names as the catalog spells them."""
    from .errors import UsageError

    name, _, count = request.partition(":")
    try:
        n = float(count) if count else 1.0
    except ValueError:
        raise UsageError(f"--gpus {request}: expected NAME:COUNT, e.g. A10G:1") from None
    if not math.isfinite(n) or n < 1 or n != int(n):
        raise UsageError(f"--gpus {request}: the count must be a whole number of at least 1")
    return name.strip(), n


def matching(gpu: str | None = None, count: float | None = None,
             region: str | None = None, source: str = "--gpu") -> list[InstanceType]:
    """Types with that GPU (case-insensitive) and exactly that many, offered in `region`. A
    GPU name no type has, or a region that does not exist, is a UsageError (a typo is not
    "no match")."""
    if gpu:
        gpu = check_gpu(gpu, source)
    if region:
        check_region(region)
    out = []
    for t in load().values():
        if gpu and t.gpu.lower() != gpu.lower():
            continue
        if count is not None and t.gpus != count:
            continue
        if region and region not in t.on_demand and region not in t.spot_snapshot:
            continue
        out.append(t)
    return sorted(out, key=lambda t: (t.gpu, t.gpus, t.price(region or "us-east-1") or 1e9, t.name))


# How many other types a job chosen by --gpus may also run on in its Auto Scaling group:
# a replacement that finds no capacity for one type takes another; each more is a pool more,
# and a price more that the plan's "at most" must bound.
EQUIVALENTS = 2


def equivalents(t: InstanceType, region: str, most: int = EQUIVALENTS) -> list[InstanceType]:
    """Types a job planned for `t` runs on as well (an Auto Scaling group's overrides):
    the same GPU model, count and architecture, at least its vCPUs, memory and NVMe
    instance store (the job's data staging and loaders were planned for those), priced
    on-demand in `region`; the `most` cheapest by on-demand price."""
    own = t.nvme_disks * t.nvme_disk_gb
    found = [o for o in load().values()
             if o.name != t.name and o.gpu == t.gpu and o.gpus == t.gpus and o.arch == t.arch
             and o.vcpus >= t.vcpus and o.memory_gib >= t.memory_gib
             and o.nvme_disks * o.nvme_disk_gb >= own and o.on_demand.get(region) is not None]
    found.sort(key=lambda o: (o.on_demand[region], o.name))
    return found[:most]


def cheapest(gpu: str, count: float, regions: list[str], market: str = "on-demand"
             ) -> tuple[InstanceType, str, str | None]:
    """The cheapest type with `count` x `gpu` in `regions`: (type, region, spot AZ id or None).
    An impossible request is a UsageError that lists what exists."""
    from .errors import UsageError

    best: tuple[float, InstanceType, str, str | None] | None = None
    found = matching(gpu, count, source="--gpus")
    other_arch = sorted({t.arch for t in found if t.arch != DEFAULT_ARCH})
    if found and len(other_arch) == 1 and all(t.arch != DEFAULT_ARCH for t in found):
        raise UsageError(f"--gpus {gpu}:{count:g}: the types with it "
                         f"({', '.join(t.name for t in found[:4])}) are {other_arch[0]}, and "
                         f"the Deep Learning AMI is {DEFAULT_ARCH}",
                         hint="choose another GPU (cloudtrain catalog), or pass --instance TYPE "
                              f"with an {other_arch[0]} --ami")
    for t in found:
        if t.arch != DEFAULT_ARCH:  # the Deep Learning AMI is x86_64
            continue
        for region in regions:
            if market == Market.SPOT:
                zones = t.spot_snapshot.get(region) or {}
                for zone, price in zones.items():
                    if best is None or price < best[0]:
                        best = (price, t, region, zone)
            else:
                listed = t.on_demand.get(region)
                if listed is not None and (best is None or listed < best[0]):
                    best = (listed, t, region, None)
    if best is None:
        raise gpus_error(check_gpu(gpu, "--gpus"), count, regions, market)
    return best[1], best[2], best[3]


def _update_json(path: Path, change) -> Path:
    """Read-modify-write a small JSON file, replaced atomically."""
    import os

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    change(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    load.cache_clear()
    return path


def save_live_spot(region: str, prices: dict[str, dict[str, float]], fetched_at: float) -> Path:
    """Keep what `catalog --refresh` fetched: region -> type -> AZ -> USD/h."""
    def change(data):
        data.setdefault("regions", {})[region] = prices
        data.setdefault("fetched_at", {})[region] = fetched_at
    return _update_json(live_spot_path(), change)


def live_list_path() -> Path:
    from .config import home

    return home() / "list-prices.json"


def save_list_prices(region: str, on_demand: dict[str, float], gp3: float | None,
                     fetched_at: float) -> Path:
    """Keep the on-demand and gp3 list prices `catalog --refresh` fetched for a region."""
    def change(data):
        data.setdefault("on_demand", {})[region] = on_demand
        if gp3 is not None:
            data.setdefault("gp3", {})[region] = gp3
        data.setdefault("fetched_at", {})[region] = fetched_at
    return _update_json(live_list_path(), change)


def _live_list() -> dict:
    try:
        return json.loads(live_list_path().read_text())
    except (OSError, ValueError):
        return {}


def gp3_price(region: str):
    """gp3 USD per GB-month: the price list's figure if `catalog --refresh` fetched one for
    the region, else cost.py's (which flags regions it only approximates)."""
    from . import cost

    live = (_live_list().get("gp3") or {}).get(region)
    if live:
        return cost.Gp3Price(float(live), approximate=False)
    return cost.gp3_price(region)


def on_demand_source(region: str) -> str:
    """Where the on-demand prices for `region` come from, for whoever reads a figure."""
    fetched = (_live_list().get("fetched_at") or {}).get(region)
    if fetched:
        import time

        return "AWS price list fetched " + time.strftime("%Y-%m-%d %H:%M UTC",
                                                        time.gmtime(fetched))
    return f"on-demand list price, {SNAPSHOT}"


def spot_source(region: str) -> str:
    """Where the spot prices for `region` come from, for whoever reads a figure."""
    try:
        fetched = json.loads(live_spot_path().read_text()).get("fetched_at", {}).get(region)
    except (OSError, ValueError):
        fetched = None
    if fetched:
        import time

        return "EC2 spot price fetched " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(fetched))
    return f"the catalog's one-time spot snapshot ({SNAPSHOT}), not a live quote"
