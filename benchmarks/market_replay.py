"""Honest numbers for --budget and --deadline (issue 38): generated spot-price and interruption
histories replayed for the bundled recipes, three ways each.

    all-on-demand   one on-demand attempt
    all-spot        spot attempts until the work is done (no budget kept, no deadline)
    budget+deadline spot while cloudtrain/deadline.py says it fits, on-demand after; the budget
                    kept as the job's instances keep it (cloudtrain/host/budget.py's Meter:
                    stop once spend + the stop's reserve reaches the budget)

Usage: python benchmarks/market_replay.py [--seed S] [--runs N] [--region R]
       [--rate-scale X] [--work-scale X] [--slack F] [--budget-share F] [--recipe NAME ...]

Sources and assumptions (printed with the table):

* Each recipe's instance type, nodes, training seconds and overheads: cloudtrain/estimate.py
  (the recipe's published or measured time; boot, setup, startup, teardown as ASSUMED there),
  the cheapest type by spot price in --region. Prices: the bundled catalog snapshot
  (cloudtrain/catalog.py: SkyPilot's AWS catalog, the shared data snapshot), on-demand and
  the cheapest AZ's one-time spot price; volumes and the public IPv4 address as estimate.py
  prices them.
* Interruptions: a Poisson process per instance-hour (a group is interrupted when any of its
  nodes is). Rates from AWS's Spot Instance Advisor frequency bands (<5 %, 5-10 %, 10-15 %,
  15-20 %, >20 % "the rate at which Spot has reclaimed capacity during the trailing month"),
  read as the chance that an instance running the whole month (730 h) is interrupted: each
  band's middle (30 % for >20 %), rate = -ln(1 - p) / 730 per hour. --rate-scale multiplies
  them (AWS's bands are monthly averages; bursts on a short GPU type are not in them).
  The history is one per run, the same for every policy (an attempt on spot is interrupted at
  the history's first event after its launch).
* Spot price: a mean-reverting random walk of its logarithm around the snapshot, a step every
  PRICE_STEP_S (theta 0.1, sigma 0.05 per step), capped at on-demand (a spot instance's
  default maximum price); billed per second at the price in force (cost.py's rules, through
  the Meter).
* An interruption loses the work since the last checkpoint (every CHECKPOINT_S of training);
  the next attempt starts REPLACE_S after it (the supervisor's notice) and pays its launch
  again. A stop at the budget saves a checkpoint and bills for the Meter's reserve, RESERVE_S.
* Deadline: the on-demand run's length (launch + work + teardown) times 1 + --slack, from the
  first launch; met when the work is done by it. Budget: the spot estimate plus --budget-share
  of the gap to the on-demand estimate (1.2 by default: room for the deadline's on-demand
  fallback; below 1 the budget binds from the start and b+d is all-spot with a stop). Kept: the job's spend, all attempts, at most the
  budget plus a minute's on-demand price (issue 38's done-when: the Meter stops a job once its
  spend and its stop's reserve reach the budget, so it ends a poll's worth over, at most).
* budget+deadline weighs the two as deadline.weigh says: where the deadline would send the
  next attempt on-demand but the budget binds (on-demand would cross it), it stays on spot.

Deterministic for a --seed; the defaults run in well under a minute.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloudtrain import deadline  # noqa: E402
from cloudtrain.host.budget import Meter  # noqa: E402
from cloudtrain.market import Market  # noqa: E402

BANDS = [("<5 %", 0.025), ("5-10 %", 0.075), ("10-15 %", 0.125), ("15-20 %", 0.175),
         (">20 %", 0.30)]
HOURS_PER_MONTH = 730.0
PRICE_STEP_S = 600.0
THETA, SIGMA = 0.1, 0.05
CHECKPOINT_S = 600.0
REPLACE_S = 60.0
RESERVE_S = 50.0  # providers/aws/budget_plan.py: STOP_S + UPLOAD_S + POWER_OFF_S
CHECK_S = 5.0  # how often the simulated agent asks the Meter
MAX_ATTEMPTS = 200
RECIPES = ["airbench94", "airbench95", "airbench96", "resnet9", "wide-resnet34", "imagenet"]


def band_rate(p: float) -> float:
    """Interruptions per instance-hour of a monthly frequency band."""
    return -math.log(1.0 - p) / HOURS_PER_MONTH


@dataclass(frozen=True)
class Profile:
    recipe: str
    instance_type: str
    nodes: int
    work_s: float
    launch_s: float  # boot + setup + startup (+ staging)
    teardown_s: float
    on_demand_per_h: float  # one instance
    spot_per_h: float  # one instance, the snapshot's cheapest AZ
    other_per_h: float  # one instance's volume and public IPv4 address

    def usd(self, per_h: float) -> float:
        """The whole run, launch to teardown, at `per_h` an instance."""
        return self.nodes * (per_h + self.other_per_h) * \
            (self.launch_s + self.work_s + self.teardown_s) / 3600.0


def profiles(names: list[str], region: str, work_scale: float) -> list[Profile]:
    """What estimate.py says of each recipe: its cheapest type on spot, times and prices."""
    from cloudtrain import catalog, estimate, recipes

    out = []
    for name in names:
        rec = recipes.load(name)
        args = rec.resolve(None, ())
        est = estimate.estimate(rec, args, region, market="spot", nodes=rec.nodes_published(args))
        row = next(r for r in est.rows if r.spot is not None and r.total_s)
        assert row.total_s is not None and row.train_s is not None and row.on_demand is not None
        t = catalog.get(row.instance_type)
        assert t is not None
        od, spot = t.price(region, "on-demand"), t.price(region, "spot")
        assert od is not None and spot is not None
        teardown = est.overheads.seconds["teardown"]
        other = row.on_demand / row.nodes / (row.total_s / 3600.0) - od
        out.append(Profile(name, row.instance_type, row.nodes, row.train_s * work_scale,
                           row.total_s - row.train_s - teardown, teardown, od, spot,
                           max(0.0, other)))
    return out


class History:
    """One run's spot market: the price's points and the interruptions' times, generated as
    far as they are asked for."""

    def __init__(self, rng: random.Random, p: Profile, rate_per_h: float):
        self.rng, self.p = rng, p
        self.rate_s = rate_per_h * p.nodes / 3600.0
        self.mean = math.log(p.spot_per_h)
        self.points = [(0.0, min(p.spot_per_h, p.on_demand_per_h))]
        self._x = self.mean
        self.events: list[float] = []
        self._last_event = 0.0

    def prices_until(self, t: float) -> list[tuple[float, float]]:
        while self.points[-1][0] <= t:
            self._x += THETA * (self.mean - self._x) + self.rng.gauss(0.0, SIGMA)
            self.points.append((self.points[-1][0] + PRICE_STEP_S,
                                min(math.exp(self._x), self.p.on_demand_per_h)))
        return self.points

    def interruption_after(self, t: float) -> float:
        if self.rate_s <= 0:
            return math.inf
        while self._last_event <= t:
            self._last_event += self.rng.expovariate(self.rate_s)
            self.events.append(self._last_event)
        return next(e for e in self.events if e > t)


@dataclass
class Outcome:
    usd: float = 0.0
    done_at: float | None = None  # when the work was done; None: stopped at the budget
    interruptions: int = 0
    on_demand: bool = False
    stopped: bool = False


def _conf(p: Profile, spot: bool, budget: float) -> dict:
    return {"usd": budget, "spent_before_usd": 0.0, "nodes": p.nodes,
            "instance_per_h": p.on_demand_per_h, "other_per_h": p.other_per_h, "spot": spot,
            "type": p.instance_type, "region": None, "reserve_s": RESERVE_S}


def attempt(h: History, p: Profile, spot: bool, start: float, work: float, spent: float,
            budget: float) -> tuple[str, float, float, float]:
    """One attempt from `start` with `work` seconds of training left: (how it ended: done,
    interrupted or budget; when it stopped billing; work saved; the job's spend after it)."""
    finish = start + p.launch_s + work
    end = finish + p.teardown_s
    cut = h.interruption_after(start) if spot else math.inf
    stop = min(end, cut) if cut < finish else end
    meter = Meter(_conf(p, spot, budget), "az", start, spent, clock=lambda: start)
    if spot:
        meter.points = list(h.prices_until(stop + RESERVE_S + PRICE_STEP_S))
    bound = p.nodes * (p.on_demand_per_h + p.other_per_h) * RESERVE_S / 3600.0
    if math.isfinite(budget) and meter.spent(stop) + bound >= budget:
        t = start
        while t < stop:  # the agent asks the Meter every CHECK_S
            if meter.over(t):
                done = min(work, max(0.0, t - start - p.launch_s))
                return "budget", t + RESERVE_S, done, meter.spent(t + RESERVE_S)
            t += CHECK_S
    if cut < finish:
        worked = max(0.0, cut - start - p.launch_s)
        return "interrupted", cut, min(work, CHECKPOINT_S * math.floor(worked / CHECKPOINT_S)), \
            meter.spent(cut)
    return "done", end, work, meter.spent(end)


def run(h: History, p: Profile, policy: str, budget: float, due: float) -> Outcome:
    """One policy over one history, from t = 0."""
    out, t, work, seen_h = Outcome(), 0.0, p.work_s, 0.0
    for _ in range(MAX_ATTEMPTS):
        spot = policy == "spot"
        if policy == "smart":
            d = deadline.decide(deadline.Situation(
                work, t, due, p.launch_s, CHECKPOINT_S, out.interruptions, seen_h))
            spot = d.market == Market.SPOT
            if not spot and math.isfinite(budget):  # weighed: the budget may bind instead
                w = deadline.weigh(d, budget, p.nodes * (p.spot_per_h + p.other_per_h),
                                   p.nodes * (p.on_demand_per_h + p.other_per_h), out.usd)
                spot = w.binds == "budget"
        out.on_demand = out.on_demand or not spot
        how, ended, saved, out.usd = attempt(
            h, p, spot, t, work, out.usd, budget if policy == "smart" else math.inf)
        work -= saved
        if how == "done":
            out.done_at = ended - p.teardown_s
            return out
        if how == "budget":
            out.stopped = True
            return out
        out.interruptions += 1
        seen_h += p.nodes * (ended - t) / 3600.0
        t = ended + REPLACE_S
    return out


@dataclass
class Cell:
    profile: Profile
    band: str
    runs: int
    figures: dict = field(default_factory=dict)


def replay(profs: list[Profile], runs: int, seed: int, rate_scale: float, slack: float,
           share: float) -> list[Cell]:
    cells = []
    for p in profs:
        od_usd, spot_usd = p.usd(p.on_demand_per_h), p.usd(p.spot_per_h)
        budget = spot_usd + share * (od_usd - spot_usd)
        due = (1.0 + slack) * (p.launch_s + p.work_s + p.teardown_s)
        for band, freq in BANDS:
            rate = band_rate(freq) * rate_scale
            res: dict[str, list[Outcome]] = {"od": [], "spot": [], "smart": []}
            for i in range(runs):
                h = History(random.Random(f"{seed}:{p.recipe}:{band}:{i}"), p, rate)
                for policy in res:
                    res[policy].append(run(h, p, policy, budget, due))

            def pct(xs):
                return 100.0 * sum(xs) / len(xs)

            def mean(policy):
                return statistics.fmean(o.usd for o in res[policy])

            minute = p.nodes * (p.on_demand_per_h + p.other_per_h) / 60.0
            kept = {k: pct([o.usd <= budget + minute for o in v]) for k, v in res.items()}
            met = {k: pct([o.done_at is not None and o.done_at <= due for o in v])
                   for k, v in res.items()}
            fig = {"budget": budget, "deadline_s": due,
                   "interruptions": statistics.fmean(o.interruptions for o in res["spot"]),
                   "kept_spot": kept["spot"], "kept_smart": kept["smart"],
                   "met_spot": met["spot"], "met_smart": met["smart"],
                   "switched": pct([o.on_demand for o in res["smart"]]),
                   "stopped": pct([o.stopped for o in res["smart"]]),
                   "usd_od": mean("od"), "usd_spot": mean("spot"), "usd_smart": mean("smart")}
            fig["smart_vs_od"] = 100.0 * fig["usd_smart"] / fig["usd_od"]
            fig["smart_vs_spot"] = fig["usd_smart"] / fig["usd_spot"]
            cells.append(Cell(p, band, runs, fig))
    return cells


def assumptions(region: str, a) -> list[str]:
    from cloudtrain import catalog

    rates = ", ".join(f"{b} {band_rate(f) * a.rate_scale:.5f}/h" for b, f in BANDS)
    return [
        f"recipes: cloudtrain/estimate.py's cheapest spot type in {region}; prices: "
        f"{catalog.SNAPSHOT} (on-demand, cheapest AZ's spot)",
        f"interruptions: Poisson per instance-hour from the Spot Instance Advisor bands "
        f"(middle of each, >20 % as 30 %, of a 730 h month) x {a.rate_scale:g}: {rates}",
        f"spot price: log random walk around the snapshot (theta {THETA}, sigma {SIGMA} per "
        f"{PRICE_STEP_S:.0f} s), capped at on-demand",
        f"checkpoints every {CHECKPOINT_S:.0f} s of work; relaunch {REPLACE_S:.0f} s after an "
        f"interruption; a budget stop bills {RESERVE_S:.0f} s more; training x {a.work_scale:g}",
        f"deadline: the on-demand run x {1 + a.slack:g}; budget: spot estimate + "
        f"{a.budget_share:g} of the gap to on-demand (kept: within a minute's on-demand "
        f"price); where the budget binds (deadline.weigh) b+d stays on spot; {a.runs} runs a "
        f"cell, seed {a.seed}",
    ]


def table(cells: list[Cell]):
    from rich.table import Table

    t = Table(title="market replay: budget+deadline (deadline.py, the budget Meter) against "
                    "all-on-demand and all-spot")
    for name in ("recipe", "type", "band", "int/run", "kept spot", "kept b+d", "met spot",
                 "met b+d", "b+d on-dem", "$ on-dem", "$ spot", "$ b+d", "b+d/on-dem",
                 "b+d/spot"):
        t.add_column(name, justify="left" if name in ("recipe", "type", "band") else "right")
    for c in cells:
        f = c.figures
        t.add_row(c.profile.recipe, c.profile.instance_type, c.band,
                  f"{f['interruptions']:.4f}", f"{f['kept_spot']:.1f} %",
                  f"{f['kept_smart']:.1f} %", f"{f['met_spot']:.1f} %", f"{f['met_smart']:.1f} %",
                  f"{f['switched']:.1f} %", f"{f['usd_od']:.4f}", f"{f['usd_spot']:.4f}",
                  f"{f['usd_smart']:.4f}", f"{f['smart_vs_od']:.1f} %",
                  f"{f['smart_vs_spot']:.2f}x")
    return t


def main(argv: list[str] | None = None) -> list[Cell]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--work-scale", type=float, default=1.0)
    ap.add_argument("--slack", type=float, default=0.5)
    ap.add_argument("--budget-share", type=float, default=1.2)
    ap.add_argument("--recipe", action="append")
    a = ap.parse_args(argv)
    # The bundled snapshot only: prices a `catalog --refresh` fetched would change the figures.
    from rich.console import Console

    with tempfile.TemporaryDirectory(prefix="market-replay-") as home:
        os.environ["CLOUDTRAIN_HOME"] = home
        profs = profiles(a.recipe or RECIPES, a.region, a.work_scale)
    cells = replay(profs, a.runs, a.seed, a.rate_scale, a.slack, a.budget_share)
    console = Console(width=200)
    for line in assumptions(a.region, a):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(table(cells))
    return cells


if __name__ == "__main__":
    main()
