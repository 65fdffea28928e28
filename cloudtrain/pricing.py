"""Live prices: refresh the catalog's on-demand (AWS price list) and spot (EC2) prices for one
region."""

from __future__ import annotations

import time

from . import catalog


def refresh_spot(region: str) -> str:
    """Ask EC2 for the current spot price of every catalog type offered in `region`; keep
    them (per AZ name) for the catalog, --gpus and dry-run estimates. Returns a summary."""
    from .providers.aws import AWSProvider

    types = sorted(t.name for t in catalog.load().values()
                   if region in t.on_demand or region in t.spot_snapshot)
    provider = AWSProvider()
    prices: dict[str, dict[str, float]] = {}
    for i in range(0, len(types), 50):  # keep each request's filter list modest
        prices.update(provider.current_spot_prices(region, types[i:i + 50]))
    path = catalog.save_live_spot(region, prices, time.time())
    zones = sum(len(z) for z in prices.values())
    return (f"spot prices for {len(prices)} of {len(types)} types ({zones} AZ prices) in "
            f"{region}, from EC2 now; kept in {path}")


def refresh_list_prices(region: str) -> str:
    """Ask the AWS price list for the on-demand price of every catalog type offered in
    `region`, and for gp3 storage; keep them for the catalog, estimates and costs."""
    from .providers.aws import AWSProvider

    types = sorted(t.name for t in catalog.load().values()
                   if region in t.on_demand or region in t.spot_snapshot)
    provider = AWSProvider()
    prices = provider.on_demand_prices(region, types)
    gp3 = provider.gp3_price(region)
    changed = sum(1 for name, price in prices.items()
                  if catalog.get(name).on_demand.get(region) != price)
    path = catalog.save_list_prices(region, prices, gp3, time.time())
    return (f"on-demand prices for {len(prices)} of {len(types)} types in {region} "
            f"({changed} differ from before)"
            + (f", gp3 ${gp3:g}/GB-month" if gp3 is not None else ", no gp3 price")
            + f", from the AWS price list; kept in {path}")
