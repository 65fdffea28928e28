"""Cost integration: hand-computed cases, then properties (hypothesis)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cloudtrain.cost import (
    GP3_PRICE_PER_GB_MONTH, InstanceRun, Phase, PricePoint, billed_seconds, cost_by_phase,
    cost_to_target, ebs_cost, gp3_price, instance_cost, job_cost, on_demand_cost, spot_cost,
)

T = 1_767_225_600.0          # 2026-01-01 00:00:00 UTC
H = 3600.0
GP3_HOURLY_100GB = 100 * 0.08 / 730    # USD per hour of a 100 GB gp3 volume


# --- billed seconds, on-demand ----------------------------------------------------------

def test_billed_seconds_minimum_and_per_second():
    assert billed_seconds(T, T + 30) == 60
    assert billed_seconds(T, T) == 60
    assert billed_seconds(T, T + 90.5) == 90.5
    with pytest.raises(ValueError):
        billed_seconds(T, T - 1)


def test_on_demand_90_seconds_g5_xlarge():
    b = on_demand_cost(T, T + 90, 1.006)
    assert b.dollars == pytest.approx(90 / 3600 * 1.006, abs=1e-12)
    assert b.billed_seconds == 90
    assert b.settled and b.notes == ()


def test_on_demand_30_seconds_billed_as_60():
    b = on_demand_cost(T, T + 30, 1.006)
    assert b.dollars == pytest.approx(60 / 3600 * 1.006, abs=1e-12)
    assert b.billed_seconds == 60
    assert b.settled


def test_still_running_billed_to_now_not_settled():
    b = on_demand_cost(T, None, 1.0, now=T + 1800)
    assert b.dollars == pytest.approx(0.5, abs=1e-12)
    assert b.billed_seconds == 1800
    assert not b.settled
    assert any("still running" in n for n in b.notes)
    with pytest.raises(ValueError):
        on_demand_cost(T, None, 1.0)             # no `now`


def test_now_is_ignored_once_the_run_has_ended():
    assert on_demand_cost(T, T + H, 1.0, now=T + 10 * H).dollars == pytest.approx(1.0)


def test_end_before_start_rejected():
    with pytest.raises(ValueError):
        on_demand_cost(T, T - 5, 1.0)
    with pytest.raises(ValueError):
        spot_cost(T, T - 5, [PricePoint(T - 10, 1.0)])


# --- spot -------------------------------------------------------------------------------

def test_spot_price_change_inside_the_interval():
    history = [PricePoint(T - 600, 0.40), PricePoint(T + 20 * 60, 0.55)]
    b = spot_cost(T, T + H, history)
    assert b.dollars == pytest.approx(0.40 / 3 + 0.55 * 2 / 3, abs=1e-12)
    assert b.settled and b.notes == ()
    # a single constant price is not what was billed
    assert abs(b.dollars - 0.40) > 0.01 and abs(b.dollars - 0.55) > 0.01


def test_spot_change_exactly_at_start_and_at_end():
    history = [PricePoint(T - 600, 0.30), PricePoint(T, 0.50), PricePoint(T + H, 9.0)]
    b = spot_cost(T, T + H, history)
    assert b.dollars == pytest.approx(0.50, abs=1e-12)
    assert b.settled


def test_spot_history_only_after_start_is_an_estimate():
    history = [PricePoint(T + 600, 0.40), PricePoint(T + 1800, 0.60)]
    b = spot_cost(T, T + H, history)
    # the uncovered first 10 minutes use the first known price
    assert b.dollars == pytest.approx((1800 * 0.40 + 1800 * 0.60) / 3600, abs=1e-12)
    assert not b.settled
    assert any("no spot price at or before" in n for n in b.notes)


def test_spot_unsorted_history_is_sorted():
    ordered = [PricePoint(T - 60, 0.40), PricePoint(T + 1200, 0.55), PricePoint(T + 2400, 0.35)]
    shuffled = [ordered[2], ordered[0], ordered[1]]
    expected = (1200 * 0.40 + 1200 * 0.55 + 1200 * 0.35) / 3600
    assert spot_cost(T, T + H, shuffled).dollars == pytest.approx(expected, abs=1e-12)
    assert spot_cost(T, T + H, shuffled) == spot_cost(T, T + H, ordered)


def test_spot_short_run_billed_for_its_first_minute():
    b = spot_cost(T, T + 30, [PricePoint(T - 60, 0.36)])
    assert b.dollars == pytest.approx(60 * 0.36 / 3600, abs=1e-12)
    assert b.billed_seconds == 60
    # a price drop within the minimum minute: billed as if it ran [start, start + 60]
    history = [PricePoint(T - 60, 0.60), PricePoint(T + 40, 0.30)]
    b = spot_cost(T, T + 30, history)
    assert b.dollars == pytest.approx((40 * 0.60 + 20 * 0.30) / 3600, abs=1e-12)
    assert b.dollars <= spot_cost(T, T + 61, history).dollars     # so cost stays monotone


def test_spot_still_running():
    b = spot_cost(T, None, [PricePoint(T - 60, 0.72)], now=T + H / 2)
    assert b.dollars == pytest.approx(0.36, abs=1e-12)
    assert not b.settled and any("still running" in n for n in b.notes)


def test_spot_without_history_rejected():
    with pytest.raises(ValueError):
        spot_cost(T, T + H, [])


# --- EBS ---------------------------------------------------------------------------------

def test_ebs_gp3_month_is_730_hours_with_60s_minimum():
    assert ebs_cost(T, T + 730 * H, 100, 0.08).dollars == pytest.approx(8.0, abs=1e-12)
    assert ebs_cost(T, T + H, 100, 0.08).dollars == pytest.approx(8.0 / 730, abs=1e-12)
    short = ebs_cost(T, T + 10, 100, 0.08)
    assert short.billed_seconds == 60
    assert short.dollars == pytest.approx(8.0 / 730 / 60, abs=1e-15)
    # AWS prorates over the billing month's own length; callers may say which
    assert ebs_cost(T, T + 24 * H, 31, 1.0, hours_per_month=744).dollars == pytest.approx(1.0)


def test_gp3_price_known_and_approximated_regions():
    assert GP3_PRICE_PER_GB_MONTH["us-east-1"] == 0.08
    known = gp3_price("us-east-1")
    assert known.per_gb_month == 0.08 and not known.approximate
    other = gp3_price("ap-south-1")
    assert other.per_gb_month == 0.08 and other.approximate
    assert "ap-south-1" in other.note and "us-east-1" in other.note


# --- instances and jobs -----------------------------------------------------------------

def _retry_job() -> list[InstanceRun]:
    """Attempt 1: spot, failed after 45 s. Attempt 2: spot for 2 h, price 0.40 then 0.55 after
    the first hour. Both with a 100 GB gp3 root volume at $0.08/GB-month."""
    history = (PricePoint(T + 3700, 0.55), PricePoint(T - 3600, 0.40))    # unsorted on purpose
    return [
        InstanceRun("i-first", "spot", T, T + 45, None, history, 100, 0.08),
        InstanceRun("i-second", "spot", T + 100, T + 7300, None, history, 100, 0.08),
    ]


def test_job_with_retry_exact_figure():
    b = job_cost(_retry_job())
    compute = 60 * 0.40 / 3600 + (3600 * 0.40 + 3600 * 0.55) / 3600
    volumes = GP3_HOURLY_100GB * (60 + 7200) / 3600
    assert b.dollars == pytest.approx(compute + volumes, abs=1e-9)
    assert abs(b.dollars - 1429 / 1460) < 1e-9          # exact rational: 0.97876712...
    assert round(b.dollars, 2) == 0.98
    assert b.billed_seconds == 60 + 7200
    assert b.settled and b.notes == ()


def test_instance_cost_parts():
    first, second = _retry_job()
    assert instance_cost(first).dollars == pytest.approx(
        60 * 0.40 / 3600 + GP3_HOURLY_100GB / 60, abs=1e-12)
    assert instance_cost(second).billed_seconds == 7200
    local = InstanceRun("local-1", "local", T, None, None)
    assert instance_cost(local) == instance_cost(local, now=T + 5)
    assert instance_cost(local).dollars == 0 and instance_cost(local).settled


def test_job_still_running_is_an_estimate_with_instance_notes():
    first, second = _retry_job()
    running = InstanceRun("i-second", "spot", T + 100, None, None, second.spot_history, 100, 0.08)
    b = job_cost([first, running], now=T + 100 + H)
    assert not b.settled
    assert any(n.startswith("i-second: still running") for n in b.notes)
    assert b.dollars == pytest.approx(instance_cost(first).dollars + 0.40 + GP3_HOURLY_100GB,
                                      abs=1e-12)


def test_missing_prices():
    no_gp3 = InstanceRun("i-a", "on-demand", T, T + H, 1.0, disk_gb=100)
    b = instance_cost(no_gp3)
    assert b.dollars == pytest.approx(1.0 + GP3_HOURLY_100GB, abs=1e-12)
    assert not b.settled and any("gp3" in n for n in b.notes)
    spot_recorded = InstanceRun("i-b", "spot", T, T + H, 0.5)
    b = instance_cost(spot_recorded)
    assert b.dollars == pytest.approx(0.5) and not b.settled
    with pytest.raises(ValueError):
        instance_cost(InstanceRun("i-c", "on-demand", T, T + H, None))
    with pytest.raises(ValueError):
        instance_cost(InstanceRun("i-d", "reserved", T, T + H, 1.0))


# --- phases and cost to target -----------------------------------------------------------

def test_cost_by_phase_splits_the_retry_job():
    phases = [
        Phase("provisioning", T, T + 160),
        Phase("setup", T + 160, T + 400),
        Phase("training", T + 400, T + 7000),
        Phase("teardown", T + 7000, T + 7300),
    ]
    runs = _retry_job()
    split = cost_by_phase(runs, phases)
    assert set(split) == {"provisioning", "setup", "training", "teardown", "other"}
    assert math.fsum(split.values()) == pytest.approx(job_cost(runs).dollars, abs=1e-9)
    # training: 3300 s at 0.40 then 3300 s at 0.55, plus the volume for 6600 s
    assert split["training"] == pytest.approx(
        3300 * (0.40 + 0.55) / 3600 + GP3_HOURLY_100GB * 6600 / 3600, abs=1e-12)
    # other: only the 15 s of the first attempt's 60 s minimum (compute and volume)
    assert split["other"] == pytest.approx(15 * 0.40 / 3600 + GP3_HOURLY_100GB * 15 / 3600,
                                           abs=1e-12)


def test_cost_by_phase_time_outside_phases_and_overlaps():
    runs = [InstanceRun("i-a", "on-demand", T, T + 2 * H, 1.0)]
    split = cost_by_phase(runs, [Phase("training", T + H, None)])
    assert split == pytest.approx({"training": 1.0, "other": 1.0}, abs=1e-12)
    with pytest.raises(ValueError):
        cost_by_phase(runs, [Phase("a", T, T + 100), Phase("b", T + 50, T + 200)])


def test_cost_to_target():
    runs = _retry_job()
    at_one_hour = T + 100 + H
    expected = (instance_cost(runs[0]).dollars            # short run: its minimum in full
                + 0.40 + GP3_HOURLY_100GB)
    assert cost_to_target(runs, at_one_hour) == pytest.approx(expected, abs=1e-12)
    # truncation to 30 s adds no minimum for a run that lasted longer
    assert cost_to_target(runs, T + 130) == pytest.approx(
        instance_cost(runs[0]).dollars + 30 * (0.40 + GP3_HOURLY_100GB) / 3600, abs=1e-12)
    assert cost_to_target(runs, T) == 0.0
    assert cost_to_target(runs, T + 10 * H) == pytest.approx(job_cost(runs).dollars, abs=1e-12)


# --- properties --------------------------------------------------------------------------

PROPS = settings(max_examples=200, deadline=None)
JOB_PROPS = settings(max_examples=100, deadline=None)     # whole jobs: slower to generate

offsets = st.one_of(st.integers(0, 100_000).map(float),
                    st.floats(0, 100_000, allow_nan=False, allow_infinity=False))
prices = st.one_of(st.sampled_from([0.0, 0.4, 0.55, 1.006]),
                   st.floats(0, 100, allow_nan=False, allow_infinity=False))
durations = st.one_of(st.integers(0, 120).map(float), offsets)    # short runs are common
# Spot history relative to a run's start (`_at`), often inside its first minutes.
rel_times = st.one_of(st.integers(-120, 240).map(float),
                      st.floats(-10_000, 100_000, allow_nan=False, allow_infinity=False))
histories = st.lists(st.builds(PricePoint, rel_times, prices), min_size=1, max_size=6)


def _at(start, history):
    return tuple(PricePoint(start + p.at, p.price) for p in history)


@st.composite
def runs_(draw):
    market = draw(st.sampled_from(["on-demand", "spot", "local"]))
    start = T + draw(offsets)
    end = None if draw(st.booleans()) and draw(st.booleans()) else start + draw(durations)
    return InstanceRun(
        f"i-{draw(st.integers(0, 10**6))}", market, start, end,
        draw(prices) if market != "spot" or draw(st.booleans()) else None,
        _at(start, draw(histories)) if market == "spot" else (),
        draw(st.sampled_from([0.0, 8.0, 100.0])), draw(st.sampled_from([None, 0.08, 0.1])))


NOW = T + 250_000        # after every generated end
jobs = st.lists(runs_(), max_size=5)


@st.composite
def phases_(draw):
    cuts = sorted(T + draw(offsets) for _ in range(2 * draw(st.integers(0, 4))))
    phases = [Phase(f"p{i}", a, b) for i, (a, b) in enumerate(zip(cuts[::2], cuts[1::2]))]
    if draw(st.booleans()):
        phases.append(Phase("open", (cuts[-1] if cuts else T) + draw(offsets), None))
    return phases


def _cost(kind, a, b, price, history):
    if kind == "spot":
        return spot_cost(a, b, history).dollars
    if kind == "ebs":
        return ebs_cost(a, b, 100, 0.08).dollars
    return on_demand_cost(a, b, price).dollars


kinds = st.sampled_from(["on-demand", "spot", "ebs"])


@PROPS
@given(kind=kinds, a=offsets, d=durations, price=prices, history=histories)
def test_prop_cost_never_negative(kind, a, d, price, history):
    history = _at(T + a, history)
    assert _cost(kind, T + a, T + a + d, price, history) >= 0


@PROPS
@given(kind=kinds, a=offsets, d1=durations, d2=durations, price=prices, history=histories)
def test_prop_monotone_in_end(kind, a, d1, d2, price, history):
    lo, hi = sorted((d1, d2))
    start = T + a
    history = _at(start, history)
    assert (_cost(kind, start, start + lo, price, history)
            <= _cost(kind, start, start + hi, price, history) + 1e-9)


@PROPS
@given(kind=kinds, a=offsets, d1=durations, d2=durations, price=prices, history=histories)
def test_prop_additive_over_split(kind, a, d1, d2, price, history):
    d1, d2 = 60 + d1, 60 + d2                     # both halves at least 60 s
    s, m = T + a, T + a + d1
    history = _at(s, history)
    e = m + d2
    whole = _cost(kind, s, e, price, history)
    parts = _cost(kind, s, m, price, history) + _cost(kind, m, e, price, history)
    assert whole == pytest.approx(parts, abs=1e-9, rel=0)


@PROPS
@given(a=offsets, d=durations)
def test_prop_billed_seconds(a, d):
    b = billed_seconds(T + a, T + a + d)
    assert b >= 60 and b >= (T + a + d) - (T + a)


@JOB_PROPS
@given(runs=jobs)
def test_prop_job_cost_is_fsum_of_instances(runs):
    job = job_cost(runs, now=NOW)
    parts = [instance_cost(r, now=NOW) for r in runs]
    assert job.dollars == math.fsum(p.dollars for p in parts)
    assert job.settled == all(p.settled for p in parts)
    assert job.dollars >= 0


@JOB_PROPS
@given(runs=jobs, phases=phases_())
def test_prop_cost_by_phase_adds_up(runs, phases):
    split = cost_by_phase(runs, phases, now=NOW)
    assert all(v >= 0 for v in split.values())
    total = job_cost(runs, now=NOW).dollars
    assert math.fsum(split.values()) == pytest.approx(total, abs=1e-9, rel=0)


@JOB_PROPS
@given(runs=jobs, t1=offsets, t2=offsets)
def test_prop_cost_to_target_monotone_and_bounded(runs, t1, t2):
    lo, hi = sorted((T + t1, T + t2))
    c_lo, c_hi = cost_to_target(runs, lo, now=NOW), cost_to_target(runs, hi, now=NOW)
    total = job_cost(runs, now=NOW).dollars
    assert 0 <= c_lo <= c_hi + 1e-9
    assert c_hi <= total + 1e-9
    assert cost_to_target(runs, NOW + 1, now=NOW) == pytest.approx(total, abs=1e-9, rel=0)


@JOB_PROPS
@given(runs=jobs, t=offsets)
def test_prop_cost_to_target_is_the_truncated_job(runs, t):
    target = T + t
    expected = []
    for r in runs:
        if r.market == "local" or r.start >= target:
            continue
        stop = NOW if r.end is None else r.end
        if stop - r.start < 60:                      # short run: its minimum in full
            expected.append(instance_cost(r, now=NOW).dollars)
            continue
        cut = min(stop, target)
        assume(cut - r.start >= 60)                  # else no minimum applies: not comparable
        expected.append(instance_cost(replace(r, end=cut)).dollars)
    assert cost_to_target(runs, target, now=NOW) == pytest.approx(math.fsum(expected),
                                                                  abs=1e-9, rel=0)


@PROPS
@given(a=st.integers(0, 10_000), d=st.integers(0, 300),
       history=st.lists(st.builds(PricePoint, st.integers(-120, 400).map(float), prices),
                        min_size=1, max_size=6))
def test_prop_spot_matches_a_second_by_second_reference(a, d, history):
    """Oracle: with whole-second times, sum the price in force second by second over the
    billed seconds (at least the first 60)."""
    start = T + a
    history = _at(start, history)
    ordered = sorted(history, key=lambda p: p.at)

    def in_force(t):
        before = [p for p in ordered if p.at <= t]
        return (before[-1] if before else ordered[0]).price

    reference = math.fsum(in_force(start + s) for s in range(max(d, 60))) / 3600
    b = spot_cost(start, start + d, history)
    assert b.dollars == pytest.approx(reference, abs=1e-9, rel=0)
    assert b.settled == (ordered[0].at <= start)


def test_u29_cost_report_by_job_shows_cloud_jobs_and_this_machine_as_one_row(tmp_path):
    """U29: every local job had its own $0.0000 row (and its own "instance" by instance);
    JOBS was always 1 and the rows said nothing of date, recipe or instance."""
    from cloudtrain import catalog_views, ledger
    from cloudtrain.state import Instance, open_store

    with open_store(tmp_path) as store:
        for i in range(5):
            job = store.create_job(name=f"smoke-{i}", kind="recipe", recipe="resnet9",
                                   command="resnet9 (smoke)", backend="local", spec={},
                                   at=1000.0 + i)
            store.add_instance(Instance(id=f"local-{job.id}", job_id=job.id, provider="local",
                                        region=None, zone=None, instance_type="local",
                                        market="on-demand", state="terminated",
                                        launched_at=1000.0 + i, terminated_at=1001.0 + i,
                                        price_per_hour=0.0, details={}))
            store.update_job(job.id, cost=0.0, cost_settled=1)
        cloud = store.create_job(name="big", kind="recipe", recipe="imagenet",
                                 command="imagenet machines-4", backend="aws", spec={},
                                 at=1_795_000_000.0)
        for n in range(2):
            store.add_instance(Instance(id=f"i-{n}", job_id=cloud.id, provider="aws",
                                        region="us-east-1", zone="us-east-1a",
                                        instance_type="p3.16xlarge", market="spot",
                                        state="terminated", launched_at=1_795_000_000.0,
                                        terminated_at=1_795_003_600.0, price_per_hour=7.0,
                                        details={}))
        store.update_job(cloud.id, cost=14.0, cost_settled=1)
        rows, total = ledger.report(store, "job", now=1_795_010_000.0)
        assert [(r.key, r.jobs, r.local) for r in rows] == [(cloud.id, 1, False),
                                                           ("local", 5, True)]
        assert rows[0].instances == "2 x p3.16xlarge" and rows[0].what == "imagenet machines-4"
        text = catalog_views.cost_report(rows, total, "job")
        head, first, local, last = text.splitlines()
        assert head.split()[:5] == ["ID", "NAME", "DATE", "WHAT", "INSTANCE"]
        assert first.split()[:3] == [cloud.id, "big", "2026-11-18"]
        assert "imagenet machines-4  2 x p3.16xlarge  $14.0000" in first
        assert local.split()[:5] == ["local", "5", "jobs", "on", "this"]
        assert last.split()[:3] == ["TOTAL", "6", "jobs"]
        by_instance, _ = ledger.report(store, "instance", now=1_795_010_000.0)
        assert [(r.key.split()[0], r.jobs) for r in by_instance] == [("i-0", 1), ("i-1", 1),
                                                                     ("local", 5)]
        data = json.loads(ledger.report_json(rows, total, "job"))
        assert data["rows"][0]["id"] == cloud.id and data["rows"][0]["name"] == "big"
        assert data["rows"][1] == {"id": "local", "jobs": 5, "dollars": 0.0, "settled": True,
                                   "to_target": None, "staging": 0.0, "local": True,
                                   "budget": None}


def test_RH5_a_public_ipv4_address_bills_by_the_second_with_no_minimum():
    """RH5: $0.005 an hour per public IPv4 address, for as long as the instance runs; the
    60 s minimum is EC2's compute's and EBS's, not the address's; none without one."""
    from cloudtrain.cost import PUBLIC_IPV4_PER_HOUR

    base = InstanceRun("i-1", "on-demand", 0.0, 30.0, 3.6)
    with_ip = replace(base, public_ipv4=1)
    extra = instance_cost(with_ip).dollars - instance_cost(base).dollars
    assert extra == pytest.approx(PUBLIC_IPV4_PER_HOUR * 30 / 3600)  # 30 s, not 60
    hour = replace(with_ip, end=3600.0)
    assert instance_cost(hour).dollars - instance_cost(replace(hour, public_ipv4=0)).dollars \
        == pytest.approx(0.005)
    assert instance_cost(replace(base, public_ipv4=2)).dollars - instance_cost(base).dollars \
        == pytest.approx(2 * extra)
    assert instance_cost(with_ip).billed_seconds == 60.0  # the compute's minimum still
