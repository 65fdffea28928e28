"""A job's budget on AWS (`--budget`): the figures its instances keep it with (job.json's
"budget", read by host/budget.py), the plan's line on it, and the refusal of a budget that
one attempt cannot fit before anything is paid.

The instance counts what it bills from its own launch, at its market's price (spot: the price
EC2 reads in its AZ, bounded by the on-demand price, which is a spot instance's default
maximum price), plus its volumes and public IPv4 address, times the job's nodes, plus what
the attempts before it cost. It asks for a stop once that, and what the stop takes at the
present rate (STOP_RESERVE: the last checkpoint within the stop's grace period, its upload,
the power-off), would reach the budget.
"""

from __future__ import annotations

from ... import catalog
from ...errors import UsageError
from ...market import Market
from .images import VOLTA, image_kind
from . import reservations
from .plan import most_and_why, public_ipv4_per_hour, volumes_per_hour
from .results import store_endpoint
from .session import AwsSession

# Boot and setup before a job could save its first checkpoint, for the smallest attempt the
# plan sets against a budget: an instance's boot and the agent's setup, and on a Volta type
# the driver and torch it installs (images.VOLTA_INSTALL_S).
BOOT_S = 180.0
# What a stop takes, from its request to the end of billing (seconds): the recipe's next step
# boundary and its checkpoint (SIGTERM; the grace period is only its limit), the upload of
# what changed since the checkpoint stream's last, the power-off until EC2 stops billing
# ("as soon as its state changes to shutting-down"). An agent stopped at its budget powers
# off without the shutdown delay once its results are stored (host/agent.py). A smaller
# reserve would end jobs over their budget; a larger one, further below it.
STOP_S, UPLOAD_S, POWER_OFF_S = 20.0, 20.0, 10.0


def reserve_s(aws: AwsSession, spec) -> float:
    """Seconds from a stop's request to the end of billing."""
    return min(float(aws.settings.stop_grace_seconds), STOP_S) + UPLOAD_S + POWER_OFF_S


def bound_per_hour(spec, region: str, instance_type: str | None = None) -> float:
    """An instance's price per hour, at most: on-demand's list price of its type (the job's,
    or `instance_type`: another of its group's), as spot never bills above it, nor above
    --max-price. UsageError where the catalog has no price for the type."""
    name = instance_type or spec.placement.instance_type or ""
    t = catalog.get(name)
    price = t.on_demand.get(region) if t is not None else None
    if price is None:
        raise UsageError(f"--budget: no on-demand price for {name} in {region} to keep a "
                         "budget with", hint="`cloudtrain prices --refresh` reads AWS's price list")
    if spec.placement.market == Market.SPOT and spec.placement.max_price is not None:
        price = min(price, spec.placement.max_price)
    return price


def bounds(aws: AwsSession, spec, region: str) -> dict[str, float]:
    """bound_per_hour of each type the job's instances may be (Placement.types); in a
    reservation, its type at the reservation's price (reservations.priced)."""
    held = reservations.planned_for(aws, spec, region, spec.placement.market)
    if held is not None and held.usd_per_hour is not None:
        return {held.instance_type: held.usd_per_hour}
    return {name: bound_per_hour(spec, region, name) for name in spec.placement.types()}


def meter_settings(aws: AwsSession, spec, region: str) -> dict | None:
    """job.json's "budget" (host/budget.py), or None: the job has no budget."""
    if spec.budget_usd is None:
        return None
    return {"usd": float(spec.budget_usd), "spent_before_usd": 0.0,
            "nodes": max(1, int(spec.nodes or 1)),
            "instance_per_h": max(bounds(aws, spec, region).values()),
            "bounds": bounds(aws, spec, region),
            "other_per_h": volumes_per_hour(aws, spec, region) + public_ipv4_per_hour(aws),
            "spot": spec.placement.market == Market.SPOT,
            "type": spec.placement.instance_type, "region": region,
            "endpoint": store_endpoint(), "imds_url": aws.settings.imds_url,
            "reserve_s": reserve_s(aws, spec)}


def first_attempt_usd(aws: AwsSession, spec, region: str, boot_s: float) -> float:
    """The least one attempt costs before its job could checkpoint: its boot and setup
    (`boot_s`, the estimate's), EC2's 60-second minimum, and the stop, at the bound."""
    rate = max(1, int(spec.nodes or 1)) * (
        max(bounds(aws, spec, region).values()) + volumes_per_hour(aws, spec, region)
        + public_ipv4_per_hour(aws))
    return rate * (max(boot_s, 60.0) + reserve_s(aws, spec)) / 3600.0


def with_budget(aws: AwsSession, spec, rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The plan's rows with the budget's line after 'at most' (at the end where there is
    none); a UsageError where one attempt cannot fit in the budget."""
    if spec.budget_usd is None:
        return rows
    if spec.on_job:
        raise UsageError("--budget with --on: a kept instance bills for every job it runs and "
                         "for its idle time, not for one job", hint="leave out --budget")
    region = aws.region(spec)
    t = catalog.get(spec.placement.instance_type or "")
    most = most_and_why(aws, spec, t, region)[0] if t is not None and \
        t.price(region, spec.placement.market) is not None else None
    boot = BOOT_S + (catalog.VOLTA_INSTALL_S if image_kind(spec.placement.instance_type or "",
                                                   spec.placement.ami) == VOLTA else 0.0)
    added = budget_rows(aws, spec, region, most, boot)
    keys = [k for k, _ in rows]
    at = keys.index("at most") + 1 if "at most" in keys else len(rows)
    return rows[:at] + added + rows[at:]


def budget_rows(aws: AwsSession, spec, region: str, at_most: float | None,
                boot_s: float) -> list[tuple[str, str]]:
    """The plan's "budget" line; a UsageError where one attempt cannot fit in it."""
    if spec.budget_usd is None:
        return []
    budget = float(spec.budget_usd)
    floor = first_attempt_usd(aws, spec, region, boot_s)
    if floor >= budget:
        raise UsageError(f"--budget ${budget:.2f}: one attempt costs about ${floor:.2f} before "
                         f"its job could save a checkpoint (boot and setup, EC2's first "
                         f"minute, the stop), at up to "
                         f"${max(bounds(aws, spec, region).values()):.4f}/h",
                         hint=f"--budget ${floor * 2:.2f} or more, or a cheaper type "
                              "(`cloudtrain estimate` compares them)")
    text = (f"${budget:.2f}, every attempt, volume and staging included; its instances keep it "
            "with this machine off: they stop the job (stopped: budget) once what it has "
            f"spent and its stop (about {reserve_s(aws, spec):.0f} s: the last checkpoint, "
            "its upload, the power-off) would reach it, and nothing starts after")
    if spec.placement.market == Market.SPOT:
        text += (f"; spot counted at the price EC2 reads in the instance's AZ, at most "
                 f"${max(bounds(aws, spec, region).values()):.4f}/h")
    if at_most is not None:
        text += (f"; 'at most' (${at_most:.2f}) is below it: it cannot bind"
                 if at_most <= budget else f"; it binds before 'at most' (${at_most:.2f})")
    return [("budget", text)]
