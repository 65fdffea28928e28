"""Live prices: refresh the catalog's spot prices from EC2 for one region."""

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
