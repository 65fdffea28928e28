"""What a recipe will take and cost on each instance type, before anything is launched.

The training time comes from the recipe's published result (recipe.yaml `published`: gpu,
gpus, seconds), scaled to another GPU by the ratio of peak dense FP16/BF16 tensor-core
throughput. That ratio is an *optimistic* bound: small CIFAR models are limited by memory
bandwidth, kernel launches and the input pipeline long before tensor cores, so a faster GPU
gains less than the ratio says. Each row says which basis it used.

The training time is also bounded by what feeds the GPUs (issue 28): where the recipe says
how fast its loader decodes (recipe.yaml `data_path`: images per CPU-second by folder, the
epochs each variant reads each folder), the data-bound time is the run's images over the
type's vCPUs times that rate, and training takes the larger of the two bounds; the row says
which bound it used and why. A published time (FFCV's on 8 A100s) is shown only where the
data path can reach it. vCPUs count hyper-threads, which decode less than a core each, and
every vCPU is taken as decoding: the data bound is the optimistic side.

Around the training come overheads a published time never includes, each either measured
from your own past jobs (median per phase of the AWS jobs in the store) or an assumed
default, and labelled as which:
  boot      RunInstances until SSH answers (the timeline's provisioning phase)
  setup     sync, checks and the agent start (syncing + setting-up)
  startup   imports, data download, cuDNN warm-up: inside the job but outside the recipe's
            timer (assumed; the published timers exclude it)
  staging   copying the job's datasets from S3 onto the instance's disk before training:
            their size over the slower of the disk's writes and the instance type's stated
            network bandwidth (NETWORK_GBPS). The disk is the type's local NVMe where its
            default image mounts one that holds the copy (free; its writes assumed at
            NVME_WRITE_MBPS a disk), else the root volume with its provisioned gp3
            throughput (config.yaml `staging_disk_mbps`), sized for the copy, both priced in
  teardown  from the job's end until EC2 stops billing (the agent powers off)
Cost = per-second billing with the 60 s minimum over boot..teardown at the on-demand price
(or the cheapest AZ's spot price), plus the gp3 root volume, with the same arithmetic
(cost.py) as the settled cost of a real job.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from . import catalog, cost
from .errors import UsageError
from .market import Market

# Peak dense (no sparsity) FP16/BF16 tensor-core TFLOPS per GPU, from NVIDIA's datasheets.
GPU_TFLOPS: dict[str, float] = {
    "V100": 125.0,       # V100 SXM2 (p3): 125
    "V100-32GB": 125.0,  # V100 SXM2 32 GB (p3dn): 125
    "T4": 65.0,          # T4 (g4dn): 65
    "A10G": 70.0,        # AWS's A10 variant (g5). Sources disagree: 70 is quoted for the A10G,
                         # 125 for the A10; we take the lower one (see TFLOPS_NOTES)
    "L4": 121.0,         # L4 (g6): 121
    "L40S": 362.0,       # L40S (g6e): 362
    "A100": 312.0,       # A100 40 GB SXM (p4d): 312
    "A100-80GB": 312.0,  # A100 80 GB SXM (p4de): 312
    "H100": 989.0,       # H100 SXM (p5): 989
    "H200": 989.0,       # H200 SXM (p5e/p5en): 989, same compute as H100, more memory
    "B200": 2250.0,      # B200 (p6): 2,250
}
TFLOPS_NOTES = {
    "A10G": "A10G figure uncertain (70 vs 125 TFLOPS quoted); the estimate uses 70",
}
TFLOPS_BASIS = "peak dense FP16 tensor TFLOPS (NVIDIA datasheets): an optimistic bound"

# Stated network bandwidth (Gbit/s, AWS's instance type pages) of the multi-GPU types a long
# staging runs on; types not listed ("up to" bandwidths that a long copy outlasts) are taken
# at the disk's rate alone, which is then the optimistic side.
NETWORK_GBPS: dict[str, float] = {
    "p3.8xlarge": 10, "p3.16xlarge": 25, "p3dn.24xlarge": 100, "p4d.24xlarge": 400,
    "p4de.24xlarge": 400, "p5.48xlarge": 3200, "g4dn.12xlarge": 50, "g4dn.metal": 100,
    "g5.12xlarge": 40, "g5.24xlarge": 50, "g5.48xlarge": 100, "g6.48xlarge": 100,
    "g6e.48xlarge": 400,
}


# What one disk of an instance's NVMe instance store is taken to write, MB/s: assumed (AWS
# states the instance store's IOPS per type, not its MB/s; NVMe SSDs write sequentially at
# 1 to 3 GB/s), the optimistic side no more than the network's figures are.
NVME_WRITE_MBPS = 1000


def local_nvme(name: str, own_image: bool = False) -> tuple[int, float] | None:
    """(disks, GB in all) of the local NVMe the default image mounts on type `name`, which a
    copy can go onto (the AWS provider decides the same by its image: images.local_nvme);
    None with an image of your own (nothing is known of it), on a Volta type (its Ubuntu
    image mounts nothing) or a type without instance store."""
    if own_image or catalog.volta(name):
        return None
    found = catalog.instance_store(name)
    return None if found is None else (found[0], found[0] * found[1])


def staging_rate(instance_type: str, disk_mbps: int, nvme_disks: int = 0
                 ) -> tuple[float, str]:
    """MB/s a staging copy is expected to reach on this type, and what limits it: the
    network, or the disk it lands on (the root volume's provisioned gp3 MB/s, or with
    `nvme_disks` the local NVMe's writes)."""
    net = NETWORK_GBPS.get(instance_type)
    net_mbps = net * 1000 / 8 if net else float("inf")
    if nvme_disks:
        disk = float(NVME_WRITE_MBPS * nvme_disks)
        if net_mbps < disk:
            return net_mbps, f"{net:g} Gbit/s network (onto the local NVMe)"
        several = nvme_disks > 1
        return disk, (f"the local NVMe's writes ({nvme_disks} disk{'s' if several else ''} at "
                      f"~{NVME_WRITE_MBPS} MB/s{' each' if several else ''}, assumed)")
    if net_mbps < disk_mbps:
        return net_mbps, f"{net:g} Gbit/s network"
    return float(disk_mbps), f"{disk_mbps} MB/s gp3 root volume"


# Assumed overheads (seconds) when the store has no AWS job to measure them from.
ASSUMED = {"boot": 150.0, "setup": 45.0, "startup": 30.0, "teardown": 30.0}


@dataclass
class Basis:
    """The published result an estimate scales from."""
    gpu: str
    gpus: int
    seconds: float
    accuracy: float | None
    text: str  # "26 s on 1x V100 (94.1%; davidcpage/cifar10-fast ...)"


@dataclass
class Overheads:
    seconds: dict[str, float]  # boot, setup, startup, teardown
    source: dict[str, str]  # phase -> "measured: median of N jobs" | "assumed"

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


@dataclass
class Row:
    instance_type: str
    gpu: str
    gpus: float
    train_s: float | None  # None: no throughput figure for this GPU
    total_s: float | None
    on_demand: float | None  # USD for the whole job, None where no price
    spot: float | None
    scaling: str  # how train_s was obtained
    marks: list[str] = field(default_factory=list)  # "cheapest", "fastest"
    staging_s: float = 0.0  # copying the datasets onto the disk (in total_s)
    staging_basis: str = ""
    profile_note: str = ""  # a profile the figures are not for (Estimate.profile_note)
    nodes: int = 1  # instances of this type the job runs on (every one billed)
    gpu_bound_s: float | None = None  # training seconds the GPUs alone need
    data_bound_s: float | None = None  # seconds the type's CPUs need to decode the run's images
    bound: str = ""  # "gpu" | "data": which of the two train_s is; "" where no data bound
    on_nvme: bool = False  # the copy goes onto the type's local NVMe, not the root volume
    disk_gb: int = 0  # its root volume (raised for the copy unless on_nvme)


@dataclass
class Estimate:
    recipe: str
    region: str
    market: str
    basis: Basis
    overheads: Overheads
    disk_gb: int
    rows: list[Row]
    notes: list[str]
    staging_bytes: int = 0
    disk_mbps: int = 0
    preread_s: float = 0.0
    profile: str | None = None  # the --profile asked for
    profile_note: str = ""  # what the figures are for when not for that profile
    nodes: int = 1  # instances per run (a job on several machines)
    plain_disk_gb: int = 0  # the root volume where the copy goes onto a type's local NVMe


def profile_note(recipe, profile: str | None) -> str:
    """Empty where the figures are the profile's own (a published entry with `profile: NAME`)
    or no profile is asked for; else a line saying they are the full recipe's. A profile
    such as smoke changes the data and the model, not only the epochs, so the published
    time is not scaled down: it is the full run's, said so."""
    if profile is None or any(p.get("profile") == profile for p in recipe.published):
        return ""
    sets = ", ".join(f"{k}={v}" for k, v in
                     ((recipe.profiles.get(profile) or {}).get("set") or {}).items())
    return (f"no published time for profile {profile}" + (f" (it sets {sets})" if sets else "")
            + "; the figures are the full recipe's, an upper bound")


def published_basis(recipe, args: dict, profile: str | None = None) -> Basis:
    """The recipe's published entry for these arguments: the entry whose `variant` (if it has
    one) equals the `variant` argument and whose `gpus` equals the GPUs the arguments need,
    among those with a structured time (`gpu`, `gpus`, `seconds`). An entry published for a
    profile (`profile: smoke`) is used for that profile, and only for it."""
    needed = recipe.gpus_needed(args)
    usable = [p for p in recipe.published if p.get("seconds") and p.get("gpu")]
    own = [p for p in usable if profile is not None and p.get("profile") == profile]
    usable = own or [p for p in usable if not p.get("profile")]
    if not usable:
        raise UsageError(f"recipe {recipe.name} has no published time to estimate from "
                         f"(recipe.yaml `published` needs gpu, gpus and seconds)")
    variant = args.get("variant")
    fits = [p for p in usable if variant is None or p.get("variant") in (None, variant)]
    if needed:
        fits = [p for p in fits if int(p.get("gpus", 1)) == needed] or fits
    if not fits:
        known = ", ".join(sorted({str(p.get("variant")) for p in usable}))
        raise UsageError(f"recipe {recipe.name} has no published time for variant "
                         f"{variant!r} (published: {known})")
    p = fits[0]
    acc = p.get("accuracy")
    text = (f"{p['seconds']:g} s on {int(p.get('gpus', 1))}x {p['gpu']}"
            + (f" ({acc:.2%})" if acc else "") + (f"; {p['source']}" if p.get("source") else ""))
    return Basis(p["gpu"], int(p.get("gpus", 1)), float(p["seconds"]),
                 float(acc) if acc else None, text)


def measured_seconds(recipe, args: dict, profile: str | None, gpu: str,
                     gpus: int) -> tuple[float, str] | None:
    """Training seconds measured with this project's code on `gpu` for these arguments
    (recipe.yaml `measured`: same GPU model and count, its `when` arguments equal to these,
    measured for the same profile or none), and the basis said; None without one.
    Preferred over a published time scaled from another GPU (issue 17)."""
    entries = [m for m in recipe.measured if m.get("gpu") == gpu and
               int(m.get("gpus", 1)) == gpus and
               all(args.get(k) == v for k, v in (m.get("when") or {}).items())]
    # A profile (smoke) changes the model and the data: only its own figure is its figure.
    entries = [m for m in entries if m.get("profile") == profile]
    if not entries:
        return None
    m = entries[0]
    said = ", ".join(str(m[k]) for k in ("torch", "date") if m.get(k))
    return float(m["seconds"]), f"measured on {gpu}" + (f" ({said})" if said else "")


def compile_seconds(recipe, args: dict, gpu: str) -> float | None:
    """compile=true: the first run's compile before its first step, measured on `gpu` with
    these arguments' compile settings (recipe.yaml `measured` compile_seconds: a cold
    inductor cache, as on a new instance); None when not compiling or not measured."""
    if not args.get("compile"):
        return None
    for m in recipe.compile_costs():
        if m.get("gpu") == gpu and all(args.get(k) == v
                                       for k, v in (m.get("when") or {}).items()):
            return float(m["compile_seconds"])
    return None


def scaled_seconds(basis: Basis, gpu: str) -> tuple[float | None, str]:
    """Training seconds on `gpu` (same GPU count as the basis) and how they were obtained."""
    if gpu == basis.gpu:
        return basis.seconds, "published"
    mine, theirs = GPU_TFLOPS.get(gpu), GPU_TFLOPS.get(basis.gpu)
    if not mine or not theirs:
        return None, f"no throughput figure for {gpu if not mine else basis.gpu}"
    return basis.seconds * theirs / mine, f"x{theirs:g}/{mine:g} TFLOPS from {basis.gpu}"


def data_bound(recipe, args: dict, vcpus: float, nodes: int = 1) -> tuple[float, str] | None:
    """Seconds the type's CPUs need to decode the run's training images with decode=cpu
    (recipe.yaml data_path: images per epoch, the epochs read from each folder, images per
    CPU-second from each), and how; None where the recipe or the variant has no such
    figures, or the images are decoded on the GPU (no measured rate yet)."""
    path = getattr(recipe, "data_path", None)
    if not path or args.get("decode") == "gpu" or vcpus <= 0:
        return None
    epochs = (path.get("epochs") or {}).get(args.get("variant"))
    if not epochs:
        return None
    cpus = vcpus * max(1, nodes)
    seconds = sum(n * path["images_per_epoch"] / (cpus * path["per_core"][folder])
                  for folder, n in epochs.items())
    rates = " and ".join(f"{path['per_core'][f]:g}/s per core from {f}" for f in epochs)
    return seconds, f"{cpus:g} vCPUs decoding at {rates}"


def overheads(store=None) -> Overheads:
    """Boot and setup: the median over past AWS jobs in the store where there are any;
    startup and teardown: assumed."""
    seconds, source = dict(ASSUMED), {k: "assumed" for k in ASSUMED}
    if store is None:
        return Overheads(seconds, source)
    from .ledger import phases_of

    samples: dict[str, list[float]] = {"boot": [], "setup": []}
    for job in store.jobs(limit=200):
        if job.backend != "aws" or job.state != "succeeded":
            continue
        for phase in phases_of(store, job):
            if phase.name in samples and phase.end is not None:
                samples[phase.name].append(phase.end - phase.start)
    for name, values in samples.items():
        if values:
            seconds[name] = statistics.median(values)
            source[name] = f"measured: median of {len(values)} of your AWS jobs"
    return Overheads(seconds, source)


def candidates(basis: Basis, region: str, types: list[str] | None, gpu_request: str | None,
               nodes: int = 1) -> list[catalog.InstanceType]:
    """--instance types as given; --gpus: the matching types; else every x86 type in the
    region with the basis's GPU count (per node, on several nodes) that a launch takes on the
    Deep Learning AMI (catalog.dlami_runs)."""
    if types:
        out = []
        for name in types:
            t = catalog.get(name)
            if t is None:
                from .config import INSTANCE_PATTERN, suggest
                from .preflight import instance_type_error, unknown_instance_type

                if not INSTANCE_PATTERN.fullmatch(name):
                    raise instance_type_error(name)
                raise unknown_instance_type(name, "" if suggest(name, catalog.load()) else
                                            "not in the bundled catalog, which has the prices")
            out.append(t)
        return out
    if gpu_request:
        gpu, count = catalog.parse_gpus(gpu_request)
        found = catalog.matching(gpu, count, region, source="--gpus")
        if not found:
            raise catalog.gpus_error(catalog.check_gpu(gpu, "--gpus"), count, [region])
        return found
    per_node = max(1, basis.gpus // max(1, nodes))
    return [t for t in catalog.matching(None, per_node, region)
            if t.arch == "x86_64" and catalog.dlami_runs(t.name)]


def estimate(recipe, args: dict, region: str, *, market: str = "on-demand",
             types: list[str] | None = None, gpu_request: str | None = None,
             disk_gb: int | None = None, store=None, staging_bytes: int = 0,
             disk_mbps: int = 0, preread_s: float = 0.0, profile: str | None = None,
             nodes: int = 1, own_image: bool = False,
             local_disk: bool | None = None) -> Estimate:
    """`staging_bytes`: copied from S3 before the job (at staging_rate; on several nodes each
    copies its own, at the same time): onto the type's local NVMe where its default image
    mounts one that holds it (local_nvme; `local_disk`, a launch's own decision, overrides),
    which needs no root volume space nor `disk_mbps`; else onto the root volume, sized for
    it and given `disk_mbps`; `preread_s`: reading snapshot volumes once
    before the job (first_read: preread), at their own rate; `profile`: the recipe profile
    the arguments came from (the figures say whose they are); `nodes`: instances per run,
    each billed (with its disk) for the whole run; `own_image`: the job brings its own AMI
    (--ami), which installs nothing at boot (a Volta type's default image does)."""
    unpriced = catalog.no_prices(region)
    if unpriced is not None:  # nothing here could be priced; say where it could
        raise unpriced
    basis = published_basis(recipe, args, profile)
    note = profile_note(recipe, profile)
    over = overheads(store)
    disk, gp3_month, notes = _disk(recipe, region, disk_gb, staging_bytes, disk_mbps, profile)
    plain, plain_month, _ = _disk(recipe, region, disk_gb, 0, 0, profile)  # copy elsewhere
    rows, unmeasured_compile = [], []
    nodes = max(1, int(nodes or 1))
    on = f"{nodes} x {{}}" if nodes > 1 else "{}"
    for t in candidates(basis, region, types, gpu_request, nodes):
        have = t.gpus * nodes
        if have < basis.gpus:
            rows.append(Row(t.name, t.gpu, t.gpus, None, None, None, None,
                            f"published on {basis.gpus} GPUs, {on.format(t.name)} has {have:g}",
                            nodes=nodes))
            continue
        train_s, scaling = measured_seconds(recipe, args, profile, t.gpu, basis.gpus) or \
            scaled_seconds(basis, t.gpu)
        if train_s is None:
            rows.append(Row(t.name, t.gpu, t.gpus, None, None, None, None, scaling, nodes=nodes))
            continue
        if have > basis.gpus:  # the rest sit idle, and are paid for
            scaling += f"; uses {basis.gpus} of {have:g} GPUs"
        gpu_s, data_s, bound = train_s, None, ""
        fed = data_bound(recipe, args, t.vcpus, nodes)
        if fed is not None:
            data_s, how = fed
            if data_s > train_s:
                bound, train_s = "data", data_s
                scaling = (f"data-bound: {how} need {_minutes(data_s)}, the GPUs "
                           f"{_minutes(gpu_s)} ({scaling}: not reachable with this data path)")
            else:
                bound = "gpu"
                scaling += f"; GPU-bound: {how} need {_minutes(data_s)}"
        elif getattr(recipe, "data_path", None) and args.get("decode") == "gpu":
            scaling += "; decode=gpu: no measured GPU decode rate, GPU-bound time only"
        compiling = compile_seconds(recipe, args, t.gpu)
        if compiling is not None:  # billed before the first step, off the recipe's timer
            train_s += compiling
            scaling += f"; +{compiling:.0f} s compile (measured)"
        elif args.get("compile"):
            unmeasured_compile.append(t.gpu)
        staging_s, staging_basis = preread_s, "snapshot volume pre-read" if preread_s else ""
        nvme = _nvme_for_copy(t.name, staging_bytes, own_image, local_disk)
        row_disk, row_month = (plain, plain_month) if nvme else (disk, gp3_month)
        if staging_bytes:
            rate, staging_basis = staging_rate(t.name, disk_mbps or cost.GP3_BASE_MBPS,
                                               nvme_disks=nvme)
            staging_s += staging_bytes / 1e6 / rate
        total = train_s + over.total + staging_s
        if catalog.volta(t.name) and not own_image:  # its image installs them at boot
            total += catalog.VOLTA_INSTALL_S
            scaling += (f"; +{catalog.VOLTA_INSTALL_S / 60:.0f} min boot-time install of the "
                        "driver and torch (Volta; estimated)")
        disk_usd = cost.ebs_cost(0.0, total, row_disk, row_month).dollars
        ipv4_usd = total / 3600 * cost.PUBLIC_IPV4_PER_HOUR  # its public address

        def dollars(price):
            return None if price is None else nodes * (
                cost.on_demand_cost(0.0, total, price).dollars + disk_usd + ipv4_usd)

        rows.append(Row(t.name, t.gpu, t.gpus, train_s, total,
                        dollars(t.price(region, "on-demand")), dollars(t.price(region, "spot")),
                        scaling, staging_s=staging_s, staging_basis=staging_basis,
                        profile_note=note, nodes=nodes, gpu_bound_s=gpu_s,
                        data_bound_s=data_s, bound=bound, on_nvme=bool(nvme),
                        disk_gb=row_disk))
        if t.gpu in TFLOPS_NOTES and TFLOPS_NOTES[t.gpu] not in notes:
            notes.append(TFLOPS_NOTES[t.gpu])
    _rank(rows, market)
    if market == Market.SPOT:
        notes.append(f"spot: the cheapest AZ's price, {catalog.spot_source(region)}")
    if unmeasured_compile:
        notes.append("compile=true: the first run's compile is not in the figures for "
                     + ", ".join(sorted(set(unmeasured_compile)))
                     + f" (not measured there; `cloudtrain recipes {recipe.name}` says what is"
                       " known, `python benchmarks/gpu.py --compile` measures it)")
    return Estimate(recipe.name, region, market, basis, over, disk, rows, notes,
                    staging_bytes=staging_bytes, disk_mbps=disk_mbps, preread_s=preread_s,
                    profile=profile, profile_note=note, nodes=nodes, plain_disk_gb=plain)


def _nvme_for_copy(name: str, staging_bytes: int, own_image: bool,
                   decided: bool | None) -> int:
    """The disks of type `name`'s local NVMe the copy goes onto (0: the root volume): where
    the default image mounts one that holds the copy's room (datasets.copy_room, as preflight
    reckons it, with `data push`'s shards), unless a launch `decided`."""
    from .datasets import copy_room

    if not staging_bytes or decided is False:
        return 0
    found = local_nvme(name, own_image)
    if decided:
        return found[0] if found else 1
    return found[0] if found and copy_room(staging_bytes, 256 << 20) <= found[1] else 0


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _disk(recipe, region: str, disk_gb: int | None, staging_bytes: int,
          disk_mbps: int, profile: str | None = None) -> tuple[int, float, list[str]]:
    """(the root volume's GB, its gp3 USD per GB-month with the throughput bought beyond
    the base, the notes on that price); `profile`: a profile's own disk (a smoke run's)."""
    disk = int(disk_gb or recipe.resources_for(profile).get("disk_gb", 100))
    if staging_bytes:  # the copies need room (datasets.preflight sizes the disk the same way)
        from .datasets import disk_needed

        disk = max(disk, disk_needed(staging_bytes, 256 << 20))  # `data push`'s shards
    gp3 = catalog.gp3_price(region)
    gp3_month = gp3.per_gb_month + (cost.gp3_performance_per_month(disk_mbps) / disk
                                    if disk_mbps else 0.0)
    return disk, gp3_month, [] if not gp3.approximate else [gp3.note]


def _rank(rows: list[Row], market: str) -> None:
    """Mark the cheapest row (in `market`) and the fastest, then sort: timed before untimed,
    by price (unpriced last), by name."""
    def price(r: Row) -> float | None:
        return r.spot if market == Market.SPOT else r.on_demand

    priced = [r for r in rows if price(r) is not None]
    if priced:
        min(priced, key=lambda r: price(r) or 0.0).marks.append("cheapest")  # all priced
    timed = [r for r in rows if r.total_s is not None]
    if timed:
        min(timed, key=lambda r: r.total_s or 0.0).marks.append("fastest")  # all timed
    rows.sort(key=lambda r: (r.total_s is None,
                             price(r) if price(r) is not None else float("inf"),
                             r.instance_type))


def for_recipe(name: str, profile: str | None, sets: tuple[str, ...], region: str | None,
               *, market: str = "on-demand", types: list[str] | None = None,
               gpu_request: str | None = None, disk_gb: int | None = None,
               store=None, nodes: int | None = None) -> Estimate:
    """`cloudtrain estimate`: the recipe's arguments as launch would resolve them (the
    nodes too: --nodes, else the machines the variant was published on)."""
    from . import config, recipes
    from .spec import MAX_NODES, check_recipe_nodes

    if types and gpu_request:
        raise UsageError("give --instance or --gpus, not both")
    if nodes is not None and not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes must be a whole number from 1 to {MAX_NODES}, got {nodes}")
    rec = recipes.load(name)
    args = rec.resolve(profile, sets)
    nodes = nodes or rec.nodes_published(args)
    check_recipe_nodes(rec, args, nodes)  # what the launch would refuse is not priced
    settings = config.Settings.load()
    staged = staged_bytes(rec, args, settings)
    if not region:  # the region launch resolves, else us-east-1: the same for every command
        from . import providers

        region = providers.get("aws").account.region()
    return estimate(rec, args, region, market=market,
                    types=types, gpu_request=gpu_request, disk_gb=disk_gb, store=store,
                    staging_bytes=staged, disk_mbps=_disk_mbps(staged, settings),
                    preread_s=preread_seconds(rec, args, settings), profile=profile,
                    nodes=nodes)


def preread_seconds(rec, args: dict, settings) -> float:
    """Reading each declared snapshot dataset once (first_read: preread) at the throughput
    of its volume, at the recipe's stated size."""
    from . import datasets

    total = 0.0
    for entry in datasets.needed(rec.data, args):
        source = settings.datasets.get(entry["name"])
        if source is not None and source.kind == "snapshot" and source.first_read == "preread":
            total += float(entry.get("size_mb") or 0) / source.throughput
    return total


def staged_bytes(rec, args: dict, settings) -> int:
    """What a launch of the recipe with these arguments copies onto the disk: each dataset
    it reads that is declared (config.yaml) as an S3 source, or that it cannot download
    itself, at the recipe's stated size."""
    from . import datasets

    total = 0
    for entry in datasets.needed(rec.data, args):
        source = settings.datasets.get(entry["name"])
        if (source is not None and source.kind == "s3") or \
                (source is None and not entry.get("download")):
            total += int(float(entry.get("size_mb") or 0) * 1e6)
    return total


def _disk_mbps(staged: int, settings) -> int:
    from .datasets import STAGING_FAST_DISK_GB

    return settings.staging_disk_mbps if staged >= STAGING_FAST_DISK_GB * 1e9 else 0


def for_spec(spec, region: str, store=None) -> Row | None:
    """The estimate for what a cloud launch is about to start, or None where there is no
    basis (your own command, a recipe without a published time, an unknown GPU)."""
    place = spec.placement
    from . import recipes

    if spec.kind != "recipe" or not place.instance_type:
        return None
    try:
        staged = sum(int(info.get("bytes") or 0) for info in (spec.data.staging or {}).values()
                     if info.get("kind") in ("shards", "objects"))
        preread = sum((spec.data.staging or {}).get(d["name"], {}).get("bytes", 0) / 1e6
                      / int(d.get("throughput") or 125) for d in spec.data.datasets
                      if d["kind"] == "snapshot" and d.get("first_read") == "preread")
        est = estimate(recipes.load(spec.recipe), spec.args, region, market=place.market,
                       types=[place.instance_type], disk_gb=place.disk_gb, store=store,
                       staging_bytes=staged, disk_mbps=spec.data.disk_mbps or 0,
                       preread_s=preread, profile=spec.profile, nodes=spec.nodes,
                       own_image=bool(place.ami), local_disk=(
                           bool(spec.data.local_disk.get("used")) if spec.data.local_disk
                           else None))
    except UsageError:
        return None
    row = est.rows[0]
    return row if row.total_s is not None else None
