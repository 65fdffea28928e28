"""A job with a deadline: whether its next attempt may stay on spot or must go on-demand, the
latest moment it may still start on spot (the plan's "switch at"), and, with a budget too,
which of the two binds (issue 38). Pure functions of the figures given; nothing here reads
the clock, the store or AWS.

The model, in seconds and instance-hours:

* Remaining work `work_s`: training seconds left, from the job's measured step rate and its
  steps left (`remaining_s`), or the estimate's training time before the launch.
* An attempt first spends `launch_s` (boot + setup + the job's start) before its first step.
  An interruption costs a restart: a new launch plus the work redone since the last
  checkpoint, at most one checkpoint interval (and never more than the work left):
  `restart_s = launch_s + min(checkpoint_s, work_s)`.
* Interruptions are a Poisson process in spot instance-hours. Its rate is estimated from
  those seen, with a prior of PRIOR_INTERRUPTIONS in PRIOR_HOURS (a Gamma prior: the rate is
  (seen + 1) / (spot hours + 20), 0.05 an hour when none were seen yet). The prior is ours
  and deliberately pessimistic: AWS's Spot Instance Advisor puts most GPU types in its
  "<5 %" to ">20 %" a month bands, which for an instance running the whole month is under
  0.0005 an hour, but interruptions come in bursts when a type's capacity is short; the cost
  of assuming too many is some on-demand time, of too few a missed deadline. Twenty hours
  without one bring the rate halfway down.
* Spot's plan: the work, its launch and k restarts, where k is the 90 % Poisson upper bound
  (QUANTILE) of the interruptions expected over the plan's own length (the least fixed point
  of k = bound(rate x (launch + work + k x restart)), capped at K_MAX).
* The switch: the latest moment the next attempt may start on spot is the deadline less
  spot's plan less one more restart, the interruption that would send it to on-demand:
  `switch_at = deadline - (launch_s + work_s + (k + 1) x restart_s)`. Spot stays while now
  <= switch_at. As an attempt runs undisturbed, now and the remaining work move together and
  the decision holds; an interruption (lost work, one more seen) is what moves it.
* On-demand alone must start by `last_on_demand_at = deadline - launch_s - work_s`; when
  now is past it, the deadline cannot be met on any market (said so; on-demand is still the
  fastest).

    decide(Situation) -> Decision            the market of the next attempt, and why
    weigh(Decision, budget_usd, ...) -> Weighing   with a budget: which binds, in one line
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, tzinfo

from .market import Market

__all__ = ["PRIOR_INTERRUPTIONS", "PRIOR_HOURS", "QUANTILE", "K_MAX", "Situation", "Decision",
           "Weighing", "remaining_s", "rate_per_hour", "poisson_upper", "decide", "weigh"]

PRIOR_INTERRUPTIONS = 1.0  # the prior: this many interruptions ...
PRIOR_HOURS = 20.0  # ... in this many spot instance-hours (0.05/h before any is seen)
QUANTILE = 0.9  # spot's plan holds with this probability under the Poisson model
K_MAX = 1000  # more restarts than this in one plan: spot does not fit anyway


@dataclass(frozen=True)
class Situation:
    """What is known when the next attempt's market is decided (times in epoch seconds)."""
    work_s: float  # training seconds left
    now: float
    deadline: float
    launch_s: float  # boot + setup + the job's start, before its first step
    checkpoint_s: float  # the checkpoint interval: the most work an interruption redoes
    interruptions: int = 0  # spot interruptions seen, this job (all its attempts)
    spot_hours: float = 0.0  # spot instance-hours they were seen in

    @property
    def restart_s(self) -> float:
        """What one interruption costs: a new launch and the work redone since the last
        checkpoint (at most one interval, never more than the work left)."""
        return self.launch_s + min(self.checkpoint_s, self.work_s)


@dataclass(frozen=True)
class Decision:
    market: Market  # the next attempt's
    switch_at: float  # the latest moment the next attempt may start on spot
    last_on_demand_at: float  # the latest on-demand from scratch still meets the deadline
    feasible: bool  # on-demand from now meets the deadline
    interruptions: int  # k: the 90 % bound of the interruptions in spot's plan
    rate_per_h: float  # the interruption rate used, per spot instance-hour
    spot_s: float  # spot's plan: launch + work + k restarts, seconds
    why: str  # one line
    situation: Situation


@dataclass(frozen=True)
class Weighing:
    binds: str  # "deadline" | "budget"
    spot_usd: float  # spent + spot's 90 % plan at the spot price
    on_demand_usd: float  # spent + spot until the switch (nothing done) + on-demand after it
    line: str  # one line, for the plan and the timeline


def remaining_s(steps_left: float, steps_per_s: float) -> float:
    """Training seconds left from a measured step rate."""
    if not steps_per_s > 0 or not math.isfinite(steps_per_s):
        raise ValueError(f"a step rate must be a positive number, got {steps_per_s!r}")
    return max(0.0, float(steps_left)) / steps_per_s


def rate_per_hour(interruptions: int, spot_hours: float) -> float:
    """Interruptions per spot instance-hour: those seen, with the prior."""
    return (max(0, interruptions) + PRIOR_INTERRUPTIONS) / (max(0.0, spot_hours) + PRIOR_HOURS)


def poisson_upper(mu: float, quantile: float = QUANTILE, k_max: int = K_MAX) -> int:
    """The least k with P(N <= k) >= quantile for N ~ Poisson(mu); k_max where it is more."""
    if mu <= 0:
        return 0
    total, log_mu = 0.0, math.log(mu)
    for k in range(k_max + 1):
        total += math.exp(-mu + k * log_mu - math.lgamma(k + 1))
        if total >= quantile:
            return k
    return k_max


def _spot_plan(s: Situation, rate: float) -> tuple[int, float]:
    """(k, seconds) of spot's plan: the least fixed point of k = bound(rate x its length)."""
    base, restart = s.launch_s + s.work_s, s.restart_s
    k = 0
    while True:
        nxt = poisson_upper(rate * (base + k * restart) / 3600.0)
        if nxt <= k or nxt >= K_MAX:
            k = max(k, min(nxt, K_MAX))
            return k, base + k * restart
        k = nxt


def hm(t: float, tz: tzinfo | None = None) -> str:
    return datetime.fromtimestamp(t, tz).strftime("%H:%M")


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {seconds % 3600 / 60:02.0f} min"


def decide(s: Situation, tz: tzinfo | None = None) -> Decision:
    """The next attempt's market (`tz`: the zone the why's times are written in; default
    this machine's)."""
    rate = rate_per_hour(s.interruptions, s.spot_hours)
    k, spot_s = _spot_plan(s, rate)
    last_od = s.deadline - s.launch_s - s.work_s
    switch_at = s.deadline - spot_s - s.restart_s
    feasible = s.now <= last_od
    seen = f"{s.interruptions} seen in {s.spot_hours:.1f} spot h" if s.interruptions else \
        "none seen yet, the prior"
    plan = (f"{_span(s.work_s)} of work with {k} interruption{'' if k == 1 else 's'} "
            f"(90 % bound at {rate:.3f}/h, {seen})")
    if not feasible:
        why = (f"the deadline cannot be met even on-demand: {_span(s.launch_s + s.work_s)} "
               f"needed, {_span(s.deadline - s.now)} left; on-demand is the fastest")
        market = Market.ON_DEMAND
    elif s.now <= switch_at:
        why = f"spot until {hm(switch_at, tz)}: {plan} fits before the deadline, with time " \
              "to switch"
        market = Market.SPOT
    else:
        why = (f"on-demand: the switch was at {hm(switch_at, tz)}; {plan} no longer fits "
               f"before the deadline, on-demand does (by {hm(s.now + s.launch_s + s.work_s, tz)})")
        market = Market.ON_DEMAND
    return Decision(market, switch_at, last_od, feasible, k, rate, spot_s, why, s)


def weigh(d: Decision, budget_usd: float, spot_per_h: float, on_demand_per_h: float,
          spent_usd: float = 0.0, tz: tzinfo | None = None) -> Weighing:
    """With a budget: which binds. Prices are the job's per hour, all its instances and
    volumes. Spot's cost is its 90 % plan at `spot_per_h`; on-demand's, the worst case of the
    switch: spot until the switch with nothing done, then all the work on-demand. The budget
    binds where either would cross it (the job then stops at its budget, the deadline may be
    missed); else the deadline does (it is what may move the job to on-demand)."""
    s = d.situation
    spot_usd = spent_usd + spot_per_h * d.spot_s / 3600.0
    from_t = max(s.now, d.switch_at)
    od_usd = spent_usd + spot_per_h * max(0.0, d.switch_at - s.now) / 3600.0 + \
        on_demand_per_h * (s.launch_s + s.work_s) / 3600.0
    when = "now" if from_t <= s.now else hm(from_t, tz)
    if not d.feasible:
        return Weighing("deadline", spot_usd, od_usd, d.why)
    if spot_usd > budget_usd:
        return Weighing("budget", spot_usd, od_usd,
                        f"the budget binds: spot's 90 % plan costs ${spot_usd:.2f}, over the "
                        f"${budget_usd:.2f} budget: the job stops at its budget before it ends")
    if od_usd > budget_usd:
        return Weighing("budget", spot_usd, od_usd,
                        f"the budget binds: on-demand from {when} would cost up to "
                        f"${od_usd:.2f}, over the ${budget_usd:.2f} budget")
    return Weighing("deadline", spot_usd, od_usd,
                    f"the deadline binds: on-demand from {when} costs at most ${od_usd:.2f} of "
                    f"the ${budget_usd:.2f} budget")
