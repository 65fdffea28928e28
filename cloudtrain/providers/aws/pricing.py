"""Prices: the Price List Query API (on-demand, gp3) and EC2's spot price history; `catalog
--refresh` keeps what they say for the catalog (refresh_list_prices, refresh_spot)."""

from __future__ import annotations

import json
import time

from ... import catalog
from .errors import aws_errors
from .session import AwsSession

# The Price List Query API answers from us-east-1 (also eu-central-1, ap-south-1) for every
# region; the region asked about is a filter.
PRICING_REGION = "us-east-1"
EC2_PRICE_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                     "capacitystatus": "Used"}


def price_per_unit(item: str, unit: str) -> float | None:
    """The on-demand USD price per `unit` ("Hrs", "GB-Mo") in one PriceList item: a JSON
    document whose terms.OnDemand.<offer>.priceDimensions.<rate> has unit and pricePerUnit.
    Zero-priced dimensions (reserved-capacity placeholders) do not count."""
    doc = json.loads(item)
    prices = []
    for offer in ((doc.get("terms") or {}).get("OnDemand") or {}).values():
        for dim in (offer.get("priceDimensions") or {}).values():
            if dim.get("unit") == unit:
                try:
                    usd = float((dim.get("pricePerUnit") or {}).get("USD", "nan"))
                except ValueError:
                    continue
                if usd > 0:
                    prices.append(usd)
    return min(prices) if prices else None


def _products(aws: AwsSession, filters: dict[str, str]) -> list[str]:
    """GetProducts for AmazonEC2 with TERM_MATCH filters: the PriceList items (JSON text)."""
    items: list[str] = []
    paginator = aws.client("pricing", PRICING_REGION).get_paginator("get_products")
    with aws_errors(PRICING_REGION, "pricing"):
        for page in paginator.paginate(
                ServiceCode="AmazonEC2", FormatVersion="aws_v1", Filters=[
                    {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()]):
            items.extend(page.get("PriceList") or [])
    return items


def on_demand_prices(aws: AwsSession, region: str, instance_types: list[str]) -> dict[str, float]:
    """Linux on-demand USD/h per type in `region`, from AWS's public price list: shared
    tenancy, no pre-installed software, capacity "Used" (the rows a plain RunInstances is
    billed at). One query per type, a few at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> tuple[str, float | None]:
        items = _products(aws, {**EC2_PRICE_FILTERS, "regionCode": region,
                                "instanceType": name})
        prices = [p for p in (price_per_unit(item, "Hrs") for item in items) if p]
        return name, (min(prices) if prices else None)

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = dict(pool.map(one, instance_types))
    return {name: price for name, price in found.items() if price is not None}


def gp3_price(aws: AwsSession, region: str) -> float | None:
    """gp3 storage, USD per GB-month in `region`, from the price list."""
    items = _products(aws, {"productFamily": "Storage", "volumeApiName": "gp3",
                            "regionCode": region})
    prices = [p for p in (price_per_unit(item, "GB-Mo") for item in items) if p]
    return min(prices) if prices else None


# The product descriptions of a Linux instance's spot price. EC2 lists one in a VPC as
# "Linux/UNIX"; an account from before EC2-VPC became the default (2013-12-04) saw its VPC
# instances' prices as "Linux/UNIX (Amazon VPC)", which the history may still carry (Karpenter
# asks for both). Both are asked for; the first wins where EC2 has both for a type and AZ.
LINUX = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")


def _one_description(rows: list[dict]) -> list[dict]:
    """The history rows of one product description per type and AZ: LINUX's first where EC2
    listed it, else the other (one price each: the two series are never mixed)."""
    best: dict[tuple, int] = {}
    for p in rows:
        rank = LINUX.index(p["ProductDescription"]) if p.get("ProductDescription") in LINUX \
            else len(LINUX)
        key = (p.get("InstanceType"), p.get("AvailabilityZone"))
        best[key] = min(best.get(key, rank), rank)
    return [p for p in rows if p.get("ProductDescription") in LINUX and LINUX.index(
        p["ProductDescription"]) == best[(p.get("InstanceType"), p.get("AvailabilityZone"))]]


def current_spot_prices(aws: AwsSession, region: str, instance_types: list[str]) -> dict[str, dict[str, float]]:
    """The spot price now, per type and AZ (Linux, LINUX): the newest history row of each."""
    import datetime

    latest: dict[str, dict[str, tuple[float, float]]] = {}
    rows: list[dict] = []
    paginator = aws.client("ec2", region).get_paginator("describe_spot_price_history")
    with aws_errors(region):
        for page in paginator.paginate(
                InstanceTypes=instance_types, ProductDescriptions=list(LINUX),
                StartTime=datetime.datetime.now(datetime.timezone.utc)):
            rows.extend(page["SpotPriceHistory"])
    for p in _one_description(rows):
        at = p["Timestamp"].timestamp()
        zones = latest.setdefault(p["InstanceType"], {})
        if p["AvailabilityZone"] not in zones or zones[p["AvailabilityZone"]][0] < at:
            zones[p["AvailabilityZone"]] = (at, float(p["SpotPrice"]))
    return {t: {z: price for z, (_, price) in zones.items()} for t, zones in latest.items()}


def refresh_spot(aws: AwsSession, region: str) -> str:
    """Ask EC2 for the current spot price of every catalog type offered in `region`; keep
    them (per AZ name) for the catalog, --gpus and dry-run estimates. Returns a summary."""
    types = _offered(region)
    prices: dict[str, dict[str, float]] = {}
    for i in range(0, len(types), 50):  # keep each request's filter list modest
        prices.update(current_spot_prices(aws, region, types[i:i + 50]))
    path = catalog.save_live_spot(region, prices, time.time())
    zones = sum(len(z) for z in prices.values())
    return (f"spot prices for {len(prices)} of {len(types)} types ({zones} AZ prices) in "
            f"{region}, from EC2 now; kept in {path}")


def refresh_list_prices(aws: AwsSession, region: str) -> str:
    """Ask the AWS price list for the on-demand price of every catalog type offered in
    `region`, and for gp3 storage; keep them for the catalog, estimates and costs."""
    types = _offered(region)
    prices = on_demand_prices(aws, region, types)
    gp3 = gp3_price(aws, region)
    known = catalog.load()  # the types asked are the catalog's (_offered)
    changed = sum(1 for name, price in prices.items()
                  if known[name].on_demand.get(region) != price)
    path = catalog.save_list_prices(region, prices, gp3, time.time())
    return (f"on-demand prices for {len(prices)} of {len(types)} types in {region} "
            f"({changed} differ from before)"
            + (f", gp3 ${gp3:g}/GB-month" if gp3 is not None else ", no gp3 price")
            + f", from the AWS price list; kept in {path}")


def spot_history(aws: AwsSession, region: str, zone: str | None, instance_type: str | None,
                 start: float | None, end: float) -> list[list[float]]:
    """[(at, USD/h)] for Linux (LINUX) in that AZ, from the last change before `start`."""
    import datetime

    def ts(t):
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc)

    rows: list[dict] = []
    paginator = aws.client("ec2", region).get_paginator("describe_spot_price_history")
    with aws_errors(region):
        for page in paginator.paginate(
                AvailabilityZone=zone, InstanceTypes=[instance_type],
                ProductDescriptions=list(LINUX), StartTime=ts(start), EndTime=ts(end)):
            rows.extend(page["SpotPriceHistory"])
    return sorted([p["Timestamp"].timestamp(), float(p["SpotPrice"])]
                  for p in _one_description(rows))


def _offered(region: str) -> list[str]:
    """The catalog's types offered in `region` (on-demand or spot), by name."""
    return sorted(t.name for t in catalog.load().values()
                  if region in t.on_demand or region in t.spot_snapshot)
