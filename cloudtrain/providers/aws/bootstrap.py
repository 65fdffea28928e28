"""Owner, key pair, subnets, security group and AMI of a region, reused across jobs and
kept in $CLOUDTRAIN_HOME/aws-cache.json (cache.py)."""

from __future__ import annotations

import time

from . import images, network, reservations
from .cache import CACHE_TTL_S, RegionCache
from .session import AwsSession


def for_placement(aws: AwsSession, region: str, place, cached: bool = True, spec=None) -> dict:
    """bootstrap for a job's placement: its --ami, else its type's default image; with the
    job's `spec`, its --reservation too, read now (never cached), checked and priced."""
    boot = bootstrap(aws, region, place.ami, cached,
                     images.image_kind(place.instance_type, place.ami))
    if spec is not None:
        boot["reservation"] = reservations.held(aws, spec, region)
    return boot


def bootstrap(aws: AwsSession, region: str, ami: str | None, cached: bool = True,
              kind: str | None = images.DLAMI) -> dict:
    """Owner, key pair, subnets, security group, AMI and its root device (name and snapshot
    size) for a region; the AMI `ami` as given, else the default image of `kind`
    (images.image_kind: the DLAMI, or a Volta type's Ubuntu).
    What was set up before is taken from $CLOUDTRAIN_HOME/aws-cache.json (AMI and subnets
    for a day), so a warm launch makes no describe calls; a stale entry shows up as a
    *.NotFound from RunInstances, and the caller bootstraps again uncached."""
    cache = RegionCache(aws.settings.aws_profile, region)
    entry = cache.load() if cached else {}
    credentials = aws.credentials(region)
    access_key = credentials.access_key if credentials else None
    if entry.get("access_key") == access_key and entry.get("owner"):
        aws.remember(entry["owner"], entry.get("owner_key"))
    owner = aws.owner(region)
    key_path = network.key_path(region)
    if entry.get("key_name") and key_path.exists():
        key_name = entry["key_name"]
    else:
        key_name, key_path = network.ensure_key(aws, region, owner)
    now = time.time()
    if now - entry.get("zones_at", 0) < CACHE_TTL_S and entry.get("zones"):
        zones = [tuple(z) + ("",) * (4 - len(z)) for z in entry["zones"]]
    else:
        zones = network.subnets(aws, region)
        entry.update(zones=[list(z) for z in zones], zones_at=now)
    ssh_from = network.ssh_cidr(aws)
    group_key = f"{zones[0][2]}|{ssh_from}|{aws.settings.ssh_port}"
    if entry.get("group_key") == group_key:
        group = entry["group"]
    else:
        group = network.ensure_group(aws, region, zones[0][2], owner)
        entry.update(group_key=group_key, group=group)
    if ami is not None:  # the user's own: resolved each time, never cached as the default
        facts = images.image_facts(aws, region, ami)
        root_device, root_gb = facts["root_device"], facts["root_gb"]
    else:  # each default image under its own keys (the DLAMI's: ami, ...; Volta: volta_ami)
        at = "" if kind in (None, images.DLAMI) else f"{kind}_"
        if now - entry.get(f"{at}ami_at", 0) < CACHE_TTL_S and entry.get(f"{at}ami") \
                and f"{at}root_gb" in entry:
            ami, root_device, root_gb = (entry[f"{at}ami"], entry[f"{at}root_device"],
                                         entry[f"{at}root_gb"])
        else:
            ami = images.resolve_ami(aws, region, None, kind)
            facts = images.image_facts(aws, region, ami)
            root_device, root_gb = facts["root_device"], facts["root_gb"]
            entry.update({f"{at}ami": ami, f"{at}root_device": root_device,
                          f"{at}root_gb": root_gb, f"{at}ami_at": now})
    entry.update(access_key=access_key, owner=owner, owner_key=aws.owner_key(region),
                 key_name=key_name)
    cache.save(entry)
    return {"owner": owner, "key_name": key_name, "key_path": key_path, "zones": zones,
            "group": group, "ami": ami, "root_device": root_device, "root_gb": root_gb,
            "ssh_from": ssh_from}
