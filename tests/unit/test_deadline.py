"""cloudtrain/deadline.py (issue 38): whether a job with a deadline may stay on spot, when it
must switch to on-demand, and, with a budget too, which of the two binds. Pure functions: the
figures below are worked by hand from the module's documented model."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings, strategies as st

from cloudtrain import deadline
from cloudtrain.market import Market

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc).timestamp()  # 10:00 UTC
H = 3600.0


def situation(**kw) -> deadline.Situation:
    base = dict(work_s=3 * H, now=T0, deadline=T0 + 4 * H, launch_s=300.0,
                checkpoint_s=600.0, interruptions=0, spot_hours=0.0)
    base.update(kw)
    return deadline.Situation(**base)


def clock(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M")


# -- worked examples ------------------------------------------------------------------------


def test_no_interruptions_seen_uses_the_prior_and_stays_on_spot():
    """Issue 38: 3 h of work, 4 h to the deadline, 300 s launch, 600 s checkpoints (a restart
    costs 900 s), nothing seen: the prior 1 interruption in 20 h, 0.05/h. Over 3.083 h,
    P(0) = e^-0.154 = 0.857 < 0.9, so the bound is 1; over 3.333 h P(<=1) = 0.988: 1 holds.
    Switch at 14:00 - (300 + 10,800 + 2 x 900) s = 10:25; on-demand alone may start by 10:55."""
    d = deadline.decide(situation())
    assert d.rate_per_h == pytest.approx(0.05)
    assert d.interruptions == 1
    assert d.spot_s == pytest.approx(12_000.0)
    assert d.switch_at == pytest.approx(T0 + 1500.0)
    assert d.last_on_demand_at == pytest.approx(T0 + 3300.0)
    assert d.market == Market.SPOT and d.feasible
    assert clock(d.switch_at) == "10:25"
    assert "spot" in d.why and "1 interruption" in d.why and "\n" not in d.why


def test_interruptions_seen_raise_the_rate_and_bring_the_switch_forward():
    """Issue 38: 3 interruptions in 2 spot hours with the prior: (3 + 1) / (2 + 20) = 0.182/h.
    Over 3.083 h, P(<=1) = 0.891 < 0.9 and P(<=2) = 0.981; over 3.583 h P(<=2) = 0.971: the
    bound is 2, and the switch comes at 14:00 - (11,100 + 3 x 900) s = 10:10."""
    d = deadline.decide(situation(interruptions=3, spot_hours=2.0))
    assert d.rate_per_h == pytest.approx(4 / 22)
    assert d.interruptions == 2
    assert d.switch_at == pytest.approx(T0 + 600.0)
    assert d.market == Market.SPOT


def test_the_slack_spent_sends_the_next_attempt_on_demand():
    """Issue 38: with the deadline at 13:10 on-demand still makes it (10:00 + 11,100 s =
    13:05) but spot's plan does not: the switch was at 09:35, so the next attempt goes
    on-demand, and the why says so."""
    d = deadline.decide(situation(deadline=T0 + 11_400.0))
    assert d.switch_at == pytest.approx(T0 - 1500.0)
    assert d.market == Market.ON_DEMAND and d.feasible
    assert "on-demand" in d.why


def test_a_deadline_not_even_on_demand_can_meet_is_said_so():
    """Issue 38: 3 h of work and a 300 s launch cannot end by 13:00 on any market."""
    d = deadline.decide(situation(deadline=T0 + 3 * H))
    assert d.market == Market.ON_DEMAND and not d.feasible
    assert "cannot be met even on-demand" in d.why


def test_poisson_bound_figures():
    """Issue 38: the 90 % Poisson upper bound: the least k with P(N <= k) >= 0.9."""
    assert deadline.poisson_upper(0.0) == 0
    assert deadline.poisson_upper(0.1) == 0  # e^-0.1 = 0.905
    assert deadline.poisson_upper(0.11) == 1  # e^-0.11 = 0.896
    assert deadline.poisson_upper(1.0) == 2  # 0.736, 0.920
    assert deadline.poisson_upper(10.0) == 14  # 0.864 at 13, 0.917 at 14


def test_the_deadline_binds_when_both_fit_the_budget():
    """Issue 38: spot at $1.00/h, on-demand $3.00/h, a $15 budget. Spot's 90 % plan (12,000 s)
    costs $3.33; the worst case, spot until 10:25 with nothing done ($0.42) and then 3 h 5 min
    on-demand ($9.25), $9.67: both fit, so the deadline is what binds."""
    w = deadline.weigh(deadline.decide(situation()), budget_usd=15.0, spot_per_h=1.0,
                       on_demand_per_h=3.0, tz=timezone.utc)
    assert w.binds == "deadline"
    assert w.spot_usd == pytest.approx(12_000 / H)
    assert w.on_demand_usd == pytest.approx(1500 / H + 11_100 / H * 3)
    assert w.line == "the deadline binds: on-demand from 10:25 costs at most $9.67 of the " \
                     "$15.00 budget"


def test_the_budget_binds_when_the_fallback_would_break_it():
    """Issue 38: an $8 budget holds spot's $3.33 but not the on-demand fallback's $9.67."""
    w = deadline.weigh(deadline.decide(situation()), budget_usd=8.0, spot_per_h=1.0,
                       on_demand_per_h=3.0, tz=timezone.utc)
    assert w.binds == "budget"
    assert w.line == "the budget binds: on-demand from 10:25 would cost up to $9.67, over " \
                     "the $8.00 budget"


def test_the_budget_binds_when_even_spot_does_not_fit():
    """Issue 38: $1.50 spent already and a $4 budget: spot's plan comes to $4.83."""
    w = deadline.weigh(deadline.decide(situation()), budget_usd=4.0, spot_per_h=1.0,
                       on_demand_per_h=3.0, spent_usd=1.5, tz=timezone.utc)
    assert w.binds == "budget"
    assert w.spot_usd == pytest.approx(1.5 + 12_000 / H)
    assert w.line.startswith("the budget binds: spot's 90 % plan costs $4.83, over the $4.00")


def test_an_unmeetable_deadline_binds_and_says_so():
    """Issue 38: when not even on-demand meets the deadline, that is the line."""
    w = deadline.weigh(deadline.decide(situation(deadline=T0 + 3 * H)), budget_usd=100.0,
                       spot_per_h=1.0, on_demand_per_h=3.0, tz=timezone.utc)
    assert w.binds == "deadline"
    assert "cannot be met even on-demand" in w.line


def test_restart_overhead_is_boot_setup_and_at_most_one_checkpoint_interval():
    """Issue 38: a restart redoes at most one checkpoint interval's work."""
    assert situation().restart_s == 900.0
    assert situation(work_s=100.0).restart_s == 400.0  # less work left than an interval


def test_remaining_work_from_a_measured_step_rate():
    """Issue 38: 1,000 steps left at 4 steps a second: 250 s."""
    assert deadline.remaining_s(steps_left=1000, steps_per_s=4.0) == 250.0
    with pytest.raises(ValueError):
        deadline.remaining_s(steps_left=10, steps_per_s=0.0)


# -- properties -----------------------------------------------------------------------------

works = st.floats(min_value=0.0, max_value=200 * H, allow_nan=False)
extra = st.floats(min_value=0.0, max_value=50 * H, allow_nan=False)
counts = st.integers(min_value=0, max_value=500)
hours = st.floats(min_value=0.0, max_value=5000.0, allow_nan=False)
spans = st.floats(min_value=0.0, max_value=400 * H, allow_nan=False)
launches = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False)
checkpoints = st.floats(min_value=0.0, max_value=4 * H, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(works, extra, counts, hours, spans, launches, checkpoints)
def test_more_work_never_moves_the_switch_later(work, more, n, h, span, launch, ckpt):
    """Issue 38: more remaining work never moves the switch later."""
    a = deadline.decide(situation(work_s=work, interruptions=n, spot_hours=h,
                                  deadline=T0 + span, launch_s=launch, checkpoint_s=ckpt))
    b = deadline.decide(situation(work_s=work + more, interruptions=n, spot_hours=h,
                                  deadline=T0 + span, launch_s=launch, checkpoint_s=ckpt))
    assert b.switch_at <= a.switch_at
    assert b.interruptions >= a.interruptions


@settings(max_examples=300, deadline=None)
@given(works, counts, st.integers(min_value=0, max_value=500), hours, spans, launches,
       checkpoints)
def test_more_interruptions_never_move_the_switch_later(work, n, more, h, span, launch, ckpt):
    """Issue 38: more interruptions seen (in the same spot hours) never move the switch later,
    nor keep spot where fewer would not."""
    a = deadline.decide(situation(work_s=work, interruptions=n, spot_hours=h,
                                  deadline=T0 + span, launch_s=launch, checkpoint_s=ckpt))
    b = deadline.decide(situation(work_s=work, interruptions=n + more, spot_hours=h,
                                  deadline=T0 + span, launch_s=launch, checkpoint_s=ckpt))
    assert b.switch_at <= a.switch_at
    assert not (b.market == Market.SPOT and a.market == Market.ON_DEMAND)


@settings(max_examples=300, deadline=None)
@given(works, counts, hours, spans, launches, checkpoints)
def test_the_decision_and_its_switch_agree(work, n, h, span, launch, ckpt):
    """Issue 38: spot exactly while now is not past the switch; on-demand from the switch
    still meets the deadline; a deadline on-demand cannot meet is said so."""
    s = situation(work_s=work, interruptions=n, spot_hours=h, deadline=T0 + span,
                  launch_s=launch, checkpoint_s=ckpt)
    d = deadline.decide(s)
    assert d.feasible == (T0 + launch + work <= T0 + span)
    assert (d.market == Market.SPOT) == (d.feasible and T0 <= d.switch_at)
    assert d.switch_at <= d.last_on_demand_at
    if not d.feasible:
        assert "cannot be met even on-demand" in d.why
    assert "\n" not in d.why and math.isfinite(d.switch_at)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.0, max_value=300.0, allow_nan=False))
def test_poisson_bound_is_the_least_k_at_the_quantile(mu):
    """Issue 38: P(N <= k) >= 0.9 at the bound and < 0.9 just below it."""
    k = deadline.poisson_upper(mu)

    def cdf(j):
        return math.fsum(math.exp(-mu + i * math.log(mu) - math.lgamma(i + 1)) if mu else
                         float(i == 0) for i in range(j + 1))

    assert cdf(k) >= 0.9 - 1e-9
    assert k == 0 or cdf(k - 1) < 0.9 + 1e-9
