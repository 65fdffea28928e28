"""A job's budget, kept by its own instances with nobody watching: what the job has spent, all
attempts and nodes, and when to stop it so that its last checkpoint, upload and power-off
still fit under the budget.

Standard library only, Python 3.8+; shipped beside agent.py. Imports awsapi (IMDSv2),
auto_scaling (the EC2 Query API with the instance's role), job_records (the job store's
records) and nothing else of ours.

job.json's "budget" (written by the launching machine: providers/aws/budget_plan.py):

    usd               the most the job may cost, USD
    spent_before_usd  what the attempts before this one cost, as the launching machine settled
                      them (a relaunch by its supervisor); a replacement AWS Auto Scaling
                      started carries the first attempt's job.json, so it reads the job
                      store's records of the attempts before it instead (earlier())
    nodes             instances per attempt (each bills the same)
    instance_per_h    the type's on-demand price per hour: what an on-demand instance bills,
                      and a spot instance's bound (its default maximum price is the on-demand
                      price: EC2 interrupts it rather than bill more)
    bounds            {type: its on-demand price per hour} of each type the job's group may
                      launch (several types of the same GPUs): an instance counts with its
                      own type's (of_type); instance_per_h is the dearest
    other_per_h       per instance: its volumes and public IPv4 address, per hour
    spot, type, zone  spot: the price is read from EC2 (DescribeSpotPriceHistory with the
                      instance's role, every PRICE_S) for the instance's own AZ and type;
                      until it is known, or where it cannot be read, the bound above
    reserve_s         what a stop takes from the request to the power-off: the recipe's
                      checkpoint within the grace period, the upload, the power-off

Billing follows EC2's rules (cloudtrain/cost.py has them in full): per second from the
instance's launch (the identity document's pendingTime), a spot second at the spot price in
force then. The agent asks over(now) as it supervises: True once what has been spent, plus
what the stop itself will cost at the present rate, reaches the budget.

    keep(agent, stopped, failed)         the agent's budget thread
    check(conf), of_type(conf, type)     job.json's budget checked; an instance type's
    Meter(conf, identity, earlier_usd)   this attempt's meter
    Meter.spent(now), Meter.rate(), Meter.over(now), Meter.refresh(ask)
    pending_at(imds)                     the instance's launch, from its identity document
    earlier(reader, prefix, n)           what attempts 1..n-1 spent, from their records
"""

import json
import math
import re
import threading
import time

from . import job_records
from .awsapi import imds_get, imds_token

POLL_S = 0.5  # how often the agent's budget thread checks the spend (its reserve is 50 s)
PRICE_S = 300.0  # how often a spot instance reads its price (EC2 changes it gradually)
# A record's figure is at most PROGRESS_S old (agent_progress.py), and an instance taken back
# without notice bills until EC2 has terminated it: an attempt whose record is not its last
# is counted for this much longer.
UNSEEN_S = 30.0 + 120.0
KEYS = ("usd", "nodes", "instance_per_h", "other_per_h", "reserve_s")
ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.\d+)?Z")
_POINT = re.compile(r"<item>.*?</item>", re.S)


def _number(value, low=0.0):
    """A finite float >= low, else None (job.json and the store are not trusted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= low else None


def check(conf):
    """job.json's budget with every figure checked, or None where there is none (or it is not
    one: the agent then says so and runs without it)."""
    if not isinstance(conf, dict):
        return None
    out = {k: _number(conf.get(k)) for k in KEYS}
    if any(v is None for v in out.values()) or out["usd"] <= 0 or out["nodes"] < 1:
        return None
    out["spent_before_usd"] = _number(conf.get("spent_before_usd")) or 0.0
    out["spot"] = conf.get("spot") is True
    for k in ("type", "region", "endpoint", "imds_url"):
        out[k] = conf.get(k) if isinstance(conf.get(k), str) else None
    given = conf.get("bounds")
    given = given if isinstance(given, dict) else {}
    out["bounds"] = {k: v for k, v in ((str(k), _number(v)) for k, v in given.items())
                     if v is not None}
    return out


def of_type(conf, instance_type):
    """The budget of an instance of `instance_type`, one of its group's types (bounds: each
    one's on-demand price), or conf as it is."""
    if instance_type in conf["bounds"]:
        return dict(conf, type=instance_type, instance_per_h=conf["bounds"][instance_type])
    return conf


def iso_time(text):
    """Seconds since the epoch of EC2's '2026-12-04T16:45:30.000Z', or None."""
    m = ISO.fullmatch(text.strip()) if isinstance(text, str) else None
    if not m:
        return None
    import calendar

    return float(calendar.timegm(tuple(int(g) for g in m.groups()) + (0, 0, 0)))


def pending_at(imds, timeout=2.0):
    """When EC2 launched this instance (the identity document's pendingTime; billing starts
    when it runs, seconds later, so this errs on the side of the budget), or None."""
    try:
        token = imds_token(imds, 300, timeout)
        doc = json.loads(imds_get(imds, "dynamic/instance-identity/document", token, timeout,
                                  16384).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return iso_time(doc.get("pendingTime")) if isinstance(doc, dict) else None


def spot_points(body, zone, instance_type):
    """[(at, USD/h)] of a DescribeSpotPriceHistory answer, for `zone` and `instance_type`
    (Linux/UNIX; another description, zone or type is left out), oldest first."""
    points = []
    for item in _POINT.findall(body or ""):
        fields = dict(re.findall(r"<(\w+)>([^<]*)</\1>", item))
        at, price = iso_time(fields.get("timestamp")), fields.get("spotPrice") or ""
        if at is None or fields.get("availabilityZone") != zone or \
                fields.get("instanceType") != instance_type or \
                fields.get("productDescription") not in ("Linux/UNIX", "Linux/UNIX (Amazon VPC)"):
            continue
        try:
            usd = float(price)
        except (TypeError, ValueError):
            continue
        if math.isfinite(usd) and usd >= 0:
            points.append((at, usd))
    return sorted(points)


class Meter:
    """What the job has spent, seen from one of this attempt's instances."""

    def __init__(self, conf, zone=None, launched_at=None, earlier_usd=0.0, clock=time.time):
        self.conf = conf
        self.zone = zone
        self.clock = clock
        self.launched_at = launched_at if launched_at is not None else clock()
        self.earlier_usd = float(earlier_usd or 0.0) + conf["spent_before_usd"]
        self.points = []  # [(at, USD/h)] of the spot price in this AZ, from EC2
        self.price_note = None  # why the bound is used, once it is
        self.read_at = None

    def _price_at(self, t):
        """The instance's price per hour in force at `t`."""
        if not self.conf["spot"]:
            return self.conf["instance_per_h"]
        before = [p for at, p in self.points if at <= t]
        if before:
            return min(before[-1], self.conf["instance_per_h"])
        if self.points:  # the history starts after t: its first price, bounded
            return min(self.points[0][1], self.conf["instance_per_h"])
        return self.conf["instance_per_h"]

    def _instance_usd(self, t0, t1):
        """One instance's charge for [t0, t1] at the prices in force."""
        if t1 <= t0:
            return 0.0
        marks = [t0] + [at for at, _ in self.points if t0 < at < t1] + [t1]
        return math.fsum(self._price_at(a) * (b - a) / 3600.0 for a, b in zip(marks, marks[1:]))

    def spent(self, now=None):
        """USD spent by the job up to `now`: the attempts before this one, and this one's
        instances (EC2's 60 s minimum: at least a minute each)."""
        now = self.clock() if now is None else now
        end = max(now, self.launched_at + 60.0)
        one = self._instance_usd(self.launched_at, end) + \
            self.conf["other_per_h"] * (end - self.launched_at) / 3600.0
        return self.earlier_usd + self.conf["nodes"] * one

    def rate(self, now=None):
        """USD per hour the job bills now (all its instances)."""
        now = self.clock() if now is None else now
        return self.conf["nodes"] * (self._price_at(now) + self.conf["other_per_h"])

    def at_stop(self, now=None):
        """What the job will have spent once a stop asked now has powered it off."""
        now = self.clock() if now is None else now
        return self.spent(now) + self.rate(now) * self.conf["reserve_s"] / 3600.0

    def over(self, now=None):
        """Whether a stop must be asked now for the job to end within its budget."""
        return self.at_stop(now) >= self.conf["usd"]

    def refresh(self, ask):
        """Read this AZ's spot price history since the launch; `ask(params)` is the EC2 Query
        call, (ok, why, body). Keeps the bound (and says why once) where it cannot."""
        if not self.conf["spot"]:
            return
        self.read_at = self.clock()
        if not (self.zone and self.conf["type"]):
            self.price_note = "the instance's AZ or type is unknown"
            return
        params = {"Action": "DescribeSpotPriceHistory", "Version": "2016-11-15",
                  "AvailabilityZone": self.zone, "InstanceType.1": self.conf["type"],
                  "ProductDescription.1": "Linux/UNIX",
                  "StartTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                             time.gmtime(self.launched_at - 3600))}
        ok, why, body = ask(params)
        points = spot_points(body, self.zone, self.conf["type"]) if ok else []
        if not points:
            self.price_note = why or "EC2 gave no spot price for %s in %s" % (
                self.conf["type"], self.zone)
            return
        self.points, self.price_note = points, None

    def due(self):
        """Whether the spot price is due to be read again."""
        return self.conf["spot"] and (self.read_at is None or
                                      self.clock() - self.read_at >= PRICE_S)


def earlier(reader, prefix, n, launched_at=None, limit=4096):
    """USD the attempts 1..n-1 spent, from their progress records (job_records: `usd`, the
    spend at `at`, `final` once it runs to the instance's end). An attempt whose end is not
    known is counted on at its last rate until the next attempt's instance was launched (AWS
    Auto Scaling replaces an instance once it is gone; `launched_at`: this attempt's), at most
    UNSEEN_S; one with no record at all, as nothing (it cannot have got far: its first post
    comes within PROGRESS_S of its start). Returns (usd, attempts seen)."""
    spends = {}
    for k in range(1, n):
        data = reader.get_bytes(job_records.progress_key(prefix, k), limit, 0,
                                denied_is_missing=True)
        doc = job_records.check_progress(job_records.read_record(data), k) if data else None
        if doc and doc.get("usd"):
            spends[k] = (doc["usd"], doc["at"])
    total = []
    for k, (spend, at) in sorted(spends.items()):
        total.append(spend["usd"])
        if spend["final"]:
            continue
        after = spends.get(k + 1, ({}, None))[0].get("since") if k + 1 < n else launched_at
        unseen = UNSEEN_S if after is None or at is None else min(UNSEEN_S, max(0.0, after - at))
        total.append(spend["rate"] * unseen / 3600.0)
    return math.fsum(total), len(spends)


class Keeper:
    """The agent's side of the budget: this attempt's meter, built from job.json, the
    instance's identity and the job store's records (a group's replacement), and kept up to
    date in the background. `figure(final)` is what the attempt's progress record carries."""

    def __init__(self, meter, ask=None, log=None):
        self.meter = meter
        self.ask = ask
        self.log = log or (lambda line: None)
        self.said = None

    @classmethod
    def for_job(cls, settings, group, log=None):
        """The Keeper of job.json's budget, or None where it has none. `group`: job.json's
        auto_scaling, checked (a group's job), or None."""
        from . import auto_scaling, awsapi, bundle_reader

        log = log or (lambda line: None)
        raw = settings.get("budget")
        if raw is None:
            return None
        conf = check(raw)
        if conf is None:
            log("the budget in job.json is not one; the job runs without it")
            return None
        imds = conf["imds_url"] or settings.get("imds_url") or awsapi.IMDS_URL
        ident = auto_scaling.identity(imds)
        launched = pending_at(imds)
        earlier_usd, note = 0.0, ""
        n = auto_scaling.attempt_number(settings)
        if group is not None and n and n > 1:
            try:
                reader = bundle_reader.Bundle(group["bucket"], group["prefix"],
                                              group["store_region"], group["endpoint"], imds)
                earlier_usd, seen = earlier(reader, group["prefix"], n, launched)
                note = "; attempts before this one: $%.4f (%d of %d recorded)" % (
                    earlier_usd, seen, n - 1)
            except Exception as exc:  # noqa: BLE001 - counted as nothing, and said
                note = "; what the attempts before this one spent could not be read (%s)" % exc
        creds = awsapi.RoleCredentials(imds)
        region = (group or {}).get("region") or conf["region"]
        endpoint = (group or {}).get("endpoint") or conf["endpoint"]

        def ask(params):
            return auto_scaling.ask("ec2", params, region, creds, endpoint)

        meter = Meter(of_type(conf, ident.get("type")), ident.get("zone"), launched,
                      earlier_usd)
        log("budget $%.2f: spent $%.4f so far%s%s" % (
            conf["usd"], meter.spent(), note,
            "" if launched else " (the launch time is unknown: counted from now)"))
        return cls(meter, ask if region else None, log)

    def check_price(self):
        """Read the spot price when it is due (a blocking call: the budget's own thread)."""
        if self.ask is None or not self.meter.due():
            return
        self.meter.refresh(self.ask)
        note = self.meter.price_note
        if note and note != self.said:
            self.log("the spot price could not be read (%s): counted at the bound, $%.4f/h"
                     % (note, self.meter.conf["instance_per_h"]))
        self.said = note

    def reason(self, now=None):
        """Why the job stops here, for its state: stopped: budget ..."""
        m = self.meter
        return ("budget: $%.4f spent of $%.2f; stopped with $%.4f left for the last "
                "checkpoint, its upload and the power-off" % (
                    m.spent(now), m.conf["usd"], max(0.0, m.conf["usd"] - m.spent(now))))

    def figure(self, final=False, now=None):
        """{"usd", "rate", "final"} of this attempt's instances alone (the progress record:
        earlier attempts have their own); `final` runs it to the power-off."""
        m = self.meter
        now = m.clock() if now is None else now
        end = now + (m.conf["reserve_s"] if final else 0.0)
        return {"usd": round(m.spent(end) - m.earlier_usd, 6), "rate": round(m.rate(now), 6),
                "final": bool(final), "since": m.launched_at}


def keep(agent, stopped, failed):
    """The agent's budget thread (host/agent.py: Agent.keep_budget) while its job runs: the
    Keeper made once (a budget that cannot be kept stops the job, `failed`, saying why), the
    spot price read in a thread of its own (a hung read must not hold back the check), the
    spend in status.json each heartbeat, and the stop, `stopped`, once the spend and the
    stop's reserve reach the budget."""
    if agent.budget is None:
        try:
            agent.budget = Keeper.for_job(agent.settings, agent.group(), agent.log_line)
        except Exception as exc:  # noqa: BLE001 - a budget that cannot be kept stops the job
            why = "the budget cannot be kept: %s: %s" % (type(exc).__name__, exc)
            agent.log_line(why)
            if agent.stop_reason is None:  # its checkpoint is saved as at any stop
                agent.request_stop(failed, why)
            return
    keeper = agent.budget
    if keeper is None:
        return

    def running():
        return agent.proc is not None and agent.proc.poll() is None

    def read_prices():
        while running():
            keeper.check_price()
            time.sleep(POLL_S)

    threading.Thread(target=read_prices, name="spot-price", daemon=True).start()
    next_note = 0.0
    while running():
        t = time.time()
        if t >= next_note:
            agent.write_status(budget={"usd": keeper.meter.conf["usd"],
                                       "spent": round(keeper.meter.spent(t), 6),
                                       "rate": round(keeper.meter.rate(t), 6)})
            next_note = t + agent.heartbeat_s
        if agent.stop_reason is None and keeper.meter.over(t):
            agent.request_stop(stopped, keeper.reason(t))
            agent.log_line(keeper.reason(t))
            return
        time.sleep(POLL_S)
