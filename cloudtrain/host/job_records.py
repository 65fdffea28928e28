"""The records a job run by an Auto Scaling group keeps in its job store: for each one its key,
its one writer (the JSON it is stored as) and its one checker (that JSON read back, untrusted:
a typed record, or None where it is not one). The instance (bootstrap, agent, agent_progress,
regroup) and the launching machine (providers/aws/group_launch.py, jobstore_attempts.py) both
write and read them through these functions only; every limit and name pattern is here once.

Standard library only, Python 3.8+; shipped beside agent.py. Imports job_status (clean_text)
and nothing else of ours.

Under the job's prefix in the job store:

    final.json            {"state", "exit_code", "reason", "ended_at", "attempt", "instance"}:
                          the job has truly ended (not on a preemption), by its agent, or by a
                          bootstrap that gave up; an instance that finds it starts nothing
    attempts/<n>.json     {"attempt", "instance", "zone", "type", "lifecycle", "started_at",
                          "by"}: n = 1 by the launch, n >= 2 by bootstrap.py, which writes it
                          again after the restore with "resumed_step", "resumed_seq" and
                          "resumed_attempt" (the attempt that streamed the checkpoint)
    attempts/<n>/progress.json      {"attempt", "step", "checkpoint_step", "at"}: how far
                          attempt n got, by its rank 0's agent (agent_progress.py)
    attempts/<n>/<instance>.json    {"instance", "rank", "address", "iface", "port", "at"}: a
                          node of attempt n of a job on several nodes (regroup.py)
    attempts/<n>/ended-<rank>.json  {"rank", "state", "instance"}: rank k > 0 has stored its
                          results at the job's end
    attempts/<n>/leaving-<rank>.json  {"rank", "instance", "at"}: that node had a spot notice
    attempts/<n>/switched.json      {"attempt", "instance", "at", "ok", "line"}: attempt n's
                          instance set the job's group to on-demand, the deadline's switch
                          being past (agent.py at a notice, bootstrap.py on a spot replacement)

Everything below a job's prefix may have been written by any instance of the job, or anyone
who read its grant: a checker takes nothing on trust (sizes, types, ranges, name patterns, text
made one line without control characters), and refuses a record that names another attempt,
rank or instance than its key.

    read_record(data)                      a stored record's bytes as a dict, or None
    final_key / attempt_key / progress_key / member_key / ended_key / leaving_key
    attempt_of(prefix, key) / member_of(folder, key)   what a listed key names, or None
    final_doc / check_final                the job's end
    attempt_doc / check_attempt(doc, n)    an attempt
    progress_doc / check_progress(doc, n)  how far an attempt got
    member_doc / check_member(doc, nodes)  a node of a regrouping attempt
    ended_doc / check_ended(doc, rank)     a rank's results stored at the job's end
    leaving_doc / check_leaving(doc, rank) a rank's spot notice
    switch_key / switch_doc / check_switch(doc, n)   the group set to on-demand by attempt n
    as_attempt(v), attempt_in(text), as_step(v)   an attempt's number, a step, checked
"""

import ipaddress
import json
import math
import re
import time
from typing import TYPE_CHECKING, Optional

from .job_status import clean_text

if TYPE_CHECKING:  # 3.8's typing has TypedDict; only the type checker needs these
    from typing import NotRequired, TypedDict

    class Final(TypedDict):
        state: str
        exit_code: Optional[int]
        reason: Optional[str]
        ended_at: Optional[float]
        attempt: Optional[int]
        instance: Optional[str]

    class Attempt(TypedDict):
        attempt: int
        instance: str
        zone: Optional[str]
        type: Optional[str]
        lifecycle: str
        started_at: Optional[float]
        by: str
        resumed_step: Optional[int]
        resumed_seq: Optional[int]
        resumed_attempt: Optional[int]

    class Progress(TypedDict):
        attempt: int
        step: Optional[int]
        checkpoint_step: Optional[int]
        at: Optional[float]
        usd: "NotRequired[dict]"

    class Member(TypedDict):
        instance: str
        rank: Optional[int]
        address: str
        port: int
        iface: Optional[str]

    class Mark(TypedDict):
        rank: int
        instance: Optional[str]

FINAL = "final.json"
ATTEMPTS = "attempts/"
PROGRESS = "progress.json"  # below attempts/<n>/
SWITCHED = "switched.json"  # below attempts/<n>/
USD_MAX = 1e7  # a figure of spend above this is not one (the largest --budget is 1e5)
ENDED_STATES = ("succeeded", "failed", "cancelled", "preempted", "stopped")

# The limits, each said once: the launch (spec.py, jobfile.py) takes --max-restarts up to
# MAX_RESTARTS, the instance counts at most MAX_ATTEMPTS records, and no reader takes more.
MAX_RESTARTS = 100
MAX_ATTEMPTS = MAX_RESTARTS + 1
RECORD_MAX_BYTES = 64 << 10  # a record bigger than this is not one of ours
STEP_LIMIT = 1 << 53  # a step past this is no training step (nor exact in JSON's doubles)
SEQ_LIMIT = 1 << 53
REASON_MAX_CHARS = 300  # of final.json's reason, written and read
BY_MAX_CHARS = 20  # of an attempt's "by"
EXIT_CODE_LIMIT = 1024  # an exit code read back is within +-this
NODES_MAX = 64  # the most nodes of one job's group
TIME_MIN, TIME_MAX = 1e9, 1e11  # a time read back is seconds since the epoch, in between

INSTANCE = re.compile(r"i-[0-9a-f]{8,17}")
ZONE = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,4}")
TYPE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)?\.[a-z0-9]+")
IFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
ATTEMPT_NAME = re.compile(r"([1-9][0-9]{0,%d})\.json" % (len(str(MAX_ATTEMPTS)) - 1))
MEMBER_NAME = re.compile(r"(%s)\.json" % INSTANCE.pattern)

# The addresses a VPC's instances may have: RFC 1918, and the shared range AWS lets a VPC
# use (RFC 6598). Never loopback, link-local (the IMDS), multicast, broadcast or public.
PRIVATE = tuple(ipaddress.IPv4Network(n) for n in
                ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"))


def read_record(data):
    """A stored record's bytes (at most RECORD_MAX_BYTES + 1 read) as a dict, or None when
    they are not one: too large, not UTF-8, not JSON, not an object. Never raises."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > RECORD_MAX_BYTES:
        return None
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


# -- keys ------------------------------------------------------------------------------------

def final_key(prefix):
    return prefix + FINAL


def attempt_key(prefix, n):
    return "%s%s%d.json" % (prefix, ATTEMPTS, n)


def attempt_folder(prefix, n):
    return "%s%s%d/" % (prefix, ATTEMPTS, n)


def progress_key(prefix, n):
    return attempt_folder(prefix, n) + PROGRESS


def member_key(prefix, n, instance):
    return "%s%s.json" % (attempt_folder(prefix, n), instance)


def ended_key(prefix, n, rank):
    return "%sended-%d.json" % (attempt_folder(prefix, n), rank)


def leaving_key(prefix, n, rank):
    return "%sleaving-%d.json" % (attempt_folder(prefix, n), rank)


def switch_key(prefix, n):
    return attempt_folder(prefix, n) + SWITCHED


def attempt_of(prefix, key):
    """n where `key` is attempts/<n>.json below `prefix` (n from 1 to MAX_ATTEMPTS), else
    None: a progress record, a node's record, anything else listed there."""
    if not (isinstance(key, str) and key.startswith(prefix + ATTEMPTS)):
        return None
    name = ATTEMPT_NAME.fullmatch(key[len(prefix + ATTEMPTS):])
    return attempt_in(name.group(1)) if name else None


def member_of(folder, key):
    """The instance where `key` is <instance>.json directly in `folder` (an attempt's, as
    attempt_folder says), else None."""
    if not (isinstance(key, str) and key.startswith(folder)):
        return None
    name = MEMBER_NAME.fullmatch(key[len(folder):])
    return name.group(1) if name else None


# -- the checks every checker uses -----------------------------------------------------------

def _count(value, limit):
    """`value` where it is an int from 0 to below `limit` (never a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) \
        and 0 <= value < limit else None


def as_step(value):
    """`value` where it is a training step (an int from 0 to below STEP_LIMIT), else None."""
    return _count(value, STEP_LIMIT)


def as_attempt(value):
    """`value` where it is an attempt's number (an int from 1 to MAX_ATTEMPTS), else None."""
    n = _count(value, MAX_ATTEMPTS + 1)
    return n if n else None


def attempt_in(text):
    """The attempt's number that `text` says in decimal (CLOUDTRAIN_ATTEMPT), else None."""
    text = str(text).strip()
    short = text.isascii() and text.isdigit() and len(text) <= len(str(MAX_ATTEMPTS))
    return as_attempt(int(text)) if short else None


def _time(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and TIME_MIN < value < TIME_MAX else None


def _text(value, limit):
    """`value` as one line of at most `limit` characters, without control characters (a
    terminal escape in a record must not reach `status`)."""
    return " ".join(clean_text(str(value), limit * 4).split())[:limit]


def _instance(value):
    return value if isinstance(value, str) and INSTANCE.fullmatch(value) else None


def _now(at):
    return time.time() if at is None else at


# -- final.json ------------------------------------------------------------------------------

def restarts_used(max_restarts):
    """final.json's reason when a job is past --max-restarts (a replacement's bootstrap, or
    its nodes meeting again after a loss)."""
    return "all %d restarts used (--max-restarts %d)" % (max_restarts, max_restarts)


def final_doc(state, exit_code, reason, attempt, instance, ended_at=None):
    """The job's end: its state (ENDED_STATES), the job's exit code, why, the attempt and the
    instance whose word it is (None where the writer has none)."""
    int_code = isinstance(exit_code, int) and not isinstance(exit_code, bool)
    return {"state": state, "exit_code": exit_code if int_code else None,
            "reason": None if reason is None else _text(reason, REASON_MAX_CHARS),
            "ended_at": _now(ended_at), "attempt": attempt, "instance": instance}


def check_final(doc):
    # type: (object) -> Optional[Final]
    """The job's end as its agent (or a bootstrap that gave up) recorded it (None: not one)."""
    if not isinstance(doc, dict) or doc.get("state") not in ENDED_STATES:
        return None
    code, reason = doc.get("exit_code"), doc.get("reason")
    return {"state": doc["state"],
            "exit_code": code if isinstance(code, int) and not isinstance(code, bool)
            and -EXIT_CODE_LIMIT < code < EXIT_CODE_LIMIT else None,
            "reason": _text(reason, REASON_MAX_CHARS) if isinstance(reason, str) else None,
            "ended_at": _time(doc.get("ended_at")),
            "attempt": as_attempt(doc.get("attempt")),
            # the instance that wrote it, whose word it is (autoscaled.ends_here checks it)
            "instance": _instance(doc.get("instance"))}


# -- attempts/<n>.json -----------------------------------------------------------------------

def attempt_doc(n, ident, by="bootstrap", started_at=None, resumed=None):
    """Attempt n, on the instance `ident` says ({instance, zone, type, lifecycle}: an
    identity, or the attempt's record before); `resumed` (a restore's status: its step, seq
    and the attempt that streamed it) says where it resumed."""
    doc = {"attempt": n, "instance": ident.get("instance"), "zone": ident.get("zone"),
           "type": ident.get("type"), "lifecycle": ident.get("lifecycle"),
           "started_at": _now(started_at), "by": by}
    if resumed is not None:
        doc.update(resumed_step=resumed.get("step"), resumed_seq=resumed.get("seq"),
                   resumed_attempt=resumed.get("attempt"))
    return doc


def check_attempt(doc, n=None):
    # type: (object, Optional[int]) -> Optional[Attempt]
    """An attempt's record with every field checked, or None: not one, or (with `n`, the
    attempt its key names) one of another attempt."""
    if not isinstance(doc, dict):
        return None
    got, inst = as_attempt(doc.get("attempt")), _instance(doc.get("instance"))
    if got is None or inst is None or (n is not None and got != n):
        return None
    zone, kind, resumed = doc.get("zone"), doc.get("type"), doc.get("resumed_attempt")
    resumed = _count(resumed, got)  # an earlier attempt's checkpoint, never its own
    return {"attempt": got, "instance": inst,
            "zone": zone if isinstance(zone, str) and ZONE.fullmatch(zone) else None,
            "type": kind if isinstance(kind, str) and TYPE.fullmatch(kind) else None,
            "lifecycle": "on-demand" if doc.get("lifecycle") == "on-demand" else "spot",
            "started_at": _time(doc.get("started_at")),
            "by": _text(doc.get("by"), BY_MAX_CHARS),
            "resumed_step": as_step(doc.get("resumed_step")),
            "resumed_seq": _count(doc.get("resumed_seq"), SEQ_LIMIT),
            "resumed_attempt": resumed if resumed else None}


# -- attempts/<n>/progress.json --------------------------------------------------------------

def progress_doc(n, step, checkpoint_step, at=None, usd=None):
    """`usd` (a job with a budget: host/budget.py): {"usd": what the attempt's instances
    have spent by `at`, "rate": USD/h they bill, "final": whether usd runs to their end,
    "since": when its instance was launched}."""
    doc = {"attempt": n, "step": step, "checkpoint_step": checkpoint_step, "at": _now(at)}
    if usd is not None:
        doc["usd"] = usd
    return doc


def check_spend(value):
    """A progress record's `usd` with each figure checked (finite, not negative, under
    USD_MAX), or None."""
    if not isinstance(value, dict):
        return None
    figures = []
    for v in (value.get("usd"), value.get("rate")):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and 0 <= v <= USD_MAX):
            return None
        figures.append(float(v))
    return {"usd": figures[0], "rate": figures[1], "final": value.get("final") is True,
            "since": _time(value.get("since"))}


def check_progress(doc, n):
    # type: (object, int) -> Optional[Progress]
    """Attempt n's progress record (at progress_key(prefix, n)) with every field checked, or
    None where it is not one, or names another attempt than its key. A step that is not one
    is None; so is a time that is not a time since the epoch."""
    if not (isinstance(doc, dict) and as_attempt(n) is not None
            and as_attempt(doc.get("attempt")) == n):
        return None
    out = {"attempt": n, "step": as_step(doc.get("step")),
           "checkpoint_step": as_step(doc.get("checkpoint_step")),
           "at": _time(doc.get("at"))}  # type: Progress
    spend = check_spend(doc.get("usd"))
    if spend is not None:  # a job with a budget
        out["usd"] = spend
    return out


# -- attempts/<n>/<instance>.json ------------------------------------------------------------

def private(address):
    """Whether `address` (an IPv4Address) may be an instance's private address in a VPC."""
    return any(address in net for net in PRIVATE) and address not in (
        net.network_address for net in PRIVATE) and address not in (
        net.broadcast_address for net in PRIVATE)


def member_doc(instance, rank, address, iface, port, at=None):
    """A node of an attempt: its instance and private address, the interface that holds it,
    the rendezvous port it offers, the rank it had (None: a new node)."""
    return {"instance": instance, "rank": rank, "address": address, "iface": iface,
            "port": port, "at": _now(at)}


def check_member(doc, nodes):
    # type: (object, int) -> Optional[Member]
    """A node's record with every field checked, or None (not one): its address must be one
    a VPC may give (`private`). `iface` is what the writer says of its own interface: no
    node ever takes it for itself (regroup.take_part)."""
    if not isinstance(doc, dict):
        return None
    inst, rank, address = _instance(doc.get("instance")), doc.get("rank"), doc.get("address")
    port, iface = doc.get("port"), doc.get("iface")
    if inst is None or not isinstance(address, str):  # IPv4Address takes a number too
        return None
    try:
        parsed = ipaddress.IPv4Address(address)
    except (ipaddress.AddressValueError, ValueError, TypeError):
        return None
    port = _count(port, 65536)
    if not private(parsed) or not port:
        return None
    return {"instance": inst, "rank": _count(rank, nodes), "address": str(parsed), "port": port,
            "iface": iface if isinstance(iface, str) and IFACE.fullmatch(iface) else None}


# -- attempts/<n>/ended-<rank>.json, attempts/<n>/leaving-<rank>.json ------------------------

def ended_doc(rank, state, instance):
    return {"rank": rank, "state": state, "instance": instance}


def leaving_doc(rank, instance, at=None):
    return {"rank": rank, "instance": instance, "at": _now(at)}


def _check_mark(doc, rank):
    # type: (object, int) -> Optional[Mark]
    if not isinstance(doc, dict) or _count(rank, NODES_MAX) is None \
            or _count(doc.get("rank"), NODES_MAX) != rank:
        return None
    inst = doc.get("instance")
    if inst is not None and _instance(inst) is None:
        return None
    return {"rank": rank, "instance": inst}


def check_ended(doc, rank):
    # type: (object, int) -> Optional[Mark]
    """Rank `rank`'s mark that it stored its results (at ended_key(prefix, n, rank)), or
    None: not one, or one of another rank."""
    return _check_mark(doc, rank)


def check_leaving(doc, rank):
    # type: (object, int) -> Optional[Mark]
    """Rank `rank`'s spot notice (at leaving_key(prefix, n, rank)), or None: not one, or
    one of another rank."""
    return _check_mark(doc, rank)


# -- attempts/<n>/switched.json --------------------------------------------------------------

def switch_doc(n, instance, ok, line, at=None):
    """Attempt n's instance set the job's group to on-demand (ok), or tried to (the line
    says why not): auto_scaling.to_on_demand's answer."""
    return {"attempt": n, "instance": instance, "at": _now(at), "ok": bool(ok),
            "line": _text(line, REASON_MAX_CHARS)}


def check_switch(doc, n):
    """Attempt n's switch of the group to on-demand, or None: not one, or another attempt's."""
    if not isinstance(doc, dict) or as_attempt(doc.get("attempt")) != n or n is None:
        return None
    at, line = _time(doc.get("at")), doc.get("line")
    if at is None or not isinstance(doc.get("ok"), bool):
        return None
    return {"attempt": n, "instance": _instance(doc.get("instance")), "at": at,
            "ok": doc["ok"], "line": _text(line, REASON_MAX_CHARS) if isinstance(line, str)
            else ""}
