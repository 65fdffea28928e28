"""Spot placement scores: EC2's rating, 1 to 10, of how likely a spot request for N instances
is to succeed in each AZ of a region now (GetSpotPlacementScores with SingleAvailabilityZone),
which a spot job's AZ order follows before price (network.order_zones). Asked once per
configuration and kept a while in $CLOUDTRAIN_HOME/aws-cache.json; where EC2 cannot score
the job, refuses, or is not asked, the AZs go by price and the reason is kept with the
answer, for the plan and the timeline to say."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from ... import catalog
from ...errors import CloudtrainError
from ...market import Market
from .cache import RegionCache
from .errors import POLICY_FILE, AWSError, is_permission_error
from .session import AwsSession

# Capacity moves within minutes, so an answer is reused for a quarter of an hour; EC2's limit
# is on *new* configurations within 24 h, and one already asked may be asked again.
SCORE_TTL_S = 15 * 60
# The EC2 User Guide's limitations for Spot placement score: "If you specify instance types,
# you must specify at least three different instance types, otherwise Amazon EC2 will return
# an error", and the API reference: with one or two types "the returned placement score will
# always be low". A job runs on one type, so it is scored with two of the same GPU model and
# count beside it, or not at all.
MIN_TYPES = 3
ACTION = "ec2:GetSpotPlacementScores"


@dataclass(frozen=True)
class ZoneScores:
    """EC2's scores for a spot job's AZs, or why there are none."""
    scores: dict[str, int] = field(default_factory=dict)  # AZ id -> 1..10
    types: tuple[str, ...] = ()  # the types scored together, the job's first
    why: str = ""  # why the AZs go by price alone ("" where EC2 scored them)
    later: bool = False  # not asked yet (the dry run without credentials): asked at launch

    def of(self, zone_id: str) -> int | None:
        return self.scores.get(zone_id)


def score_types(instance_type: str, region: str) -> list[str]:
    """The job's type and the two of the catalog's types nearest it in vCPUs with the same
    GPU model, GPU count and architecture, offered in `region`: what EC2 is asked to score
    (three at least, MIN_TYPES); fewer where the catalog has no such types."""
    t = catalog.get(instance_type)
    if t is None:
        return [instance_type]
    try:
        same = [o for o in catalog.matching(t.gpu, t.gpus, region)
                if o.arch == t.arch and o.name != t.name]
    except CloudtrainError:  # a region the catalog does not know
        same = []
    same.sort(key=lambda o: (abs(o.vcpus - t.vcpus), o.name))
    return [t.name] + [o.name for o in same[:MIN_TYPES - 1]]


def _instances(nodes: int) -> str:
    n = max(int(nodes), 1)
    return f"{n} instance" + ("s" if n != 1 else "")


def request(types: list[str], nodes: int, region: str) -> dict:
    """GetSpotPlacementScores' parameters: one score per AZ of `region` for `nodes`
    instances in one AZ."""
    return {"InstanceTypes": list(types), "TargetCapacity": max(int(nodes), 1),
            "TargetCapacityUnitType": "units", "SingleAvailabilityZone": True,
            "RegionNames": [region]}


def zone_scores(aws: AwsSession, region: str, instance_type: str, nodes: int, market: str,
                ask: bool = True) -> ZoneScores | None:
    """EC2's score of each AZ of `region` for `nodes` spot instances of the type (with its
    equivalents, score_types); None for on-demand. Never raises: a refusal, an error or an
    endpoint without the call (moto) gives no scores and says why. `ask` False: only a
    cached answer (the dry run without credentials asks nothing)."""
    if market != Market.SPOT:
        return None
    types = score_types(instance_type, region)
    if len(types) < MIN_TYPES:
        return ZoneScores(types=tuple(types), why=(
            f"placement scores need {MIN_TYPES} types of the same GPUs and the catalog has "
            f"{len(types)} ({', '.join(types)}) in {region}"))
    params = request(types, nodes, region)
    key = json.dumps(params, sort_keys=True)
    cache = RegionCache(aws.settings.aws_profile, region)
    entry = cache.load()
    now = time.time()
    found = (entry.get("spot_scores") or {}).get(key)
    if isinstance(found, dict) and now - float(found.get("at") or 0) < SCORE_TTL_S:
        return ZoneScores({str(k): int(v) for k, v in (found.get("scores") or {}).items()},
                          tuple(types), str(found.get("why") or ""))
    if not ask:
        return ZoneScores(types=tuple(types), later=True, why=(
            f"EC2's spot placement scores for {_instances(nodes)} of "
            f"{', '.join(types)} are asked at launch (no credentials here), then price"))
    scores, why, keep = _ask(aws, region, params)
    if keep:
        kept = {k: v for k, v in (entry.get("spot_scores") or {}).items()
                if isinstance(v, dict) and now - float(v.get("at") or 0) < SCORE_TTL_S}
        kept[key] = {"at": now, "scores": scores, "why": why}
        entry = cache.load()  # bootstrap may have written since
        entry["spot_scores"] = kept
        cache.save(entry)
    return ZoneScores(scores, tuple(types), why)


def _ask(aws: AwsSession, region: str, params: dict) -> tuple[dict[str, int], str, bool]:
    """(AZ id -> score, why there are none, whether to keep the answer): an answer EC2 gave
    (a refusal included) is kept; one it did not give (no connection) is not."""
    scores: dict[str, int] = {}
    try:
        token = None
        for _ in range(10):  # SingleAvailabilityZone: at most 10 rows, a page or two
            page = aws.call(region, "get_spot_placement_scores", fail_fast=True,
                            **params, **({"NextToken": token} if token else {}))
            for row in page.get("SpotPlacementScores") or []:
                zone, score = row.get("AvailabilityZoneId"), row.get("Score")
                if zone and isinstance(score, int) and 1 <= score <= 10:
                    scores[zone] = score
            token = page.get("NextToken")
            if not token:
                break
    except AWSError as exc:
        if exc.code and is_permission_error(exc.code):
            return {}, f"{ACTION} is not allowed ({exc.code}): attach {POLICY_FILE}", True
        if exc.code and not exc.code.isdigit():
            return {}, f"EC2 refused the placement scores ({exc.code}: {exc.aws_message})", True
        return {}, f"no placement scores: {exc.message}", bool(exc.code)
    except CloudtrainError as exc:
        return {}, f"no placement scores: {exc.message}", False
    if not scores:
        return {}, "EC2 scored no AZ of the region", True
    return scores, "", True


def said(zones: list[tuple], scores: ZoneScores | None, instance_type: str, region: str,
         limit: int = 6) -> str:
    """The AZs in the order a launch tries them, each with its score and snapshot spot
    price where known, and what the order follows: 'use1-az4 (score 9, $0.40/h), ...'."""
    t = catalog.get(instance_type)
    prices = (t.spot_snapshot.get(region) or {}) if t else {}
    parts = []
    for z in zones[:limit]:
        bits = []
        score = scores.of(z[3]) if scores and z[3] else None
        if score is not None:
            bits.append(f"score {score}")
        if z[3] in prices:
            bits.append(f"${prices[z[3]]:.2f}/h")
        name = f"{z[0]} {z[3]}" if z[3] and z[3] != z[0] else z[0]
        parts.append(name + (f" ({', '.join(bits)})" if bits else ""))
    more = f" and {len(zones) - limit} more" if len(zones) > limit else ""
    listed = ", ".join(parts) + more
    if scores is None:
        return listed
    if scores.scores:
        return (f"{listed}; by EC2's spot placement score for {len(scores.types)} types of "
                f"the same GPUs ({', '.join(scores.types)}), then price")
    if scores.later:
        return f"{listed} by the catalog's price for now; {scores.why}"
    return f"{listed}; by price: {scores.why}"
