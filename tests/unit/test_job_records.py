"""host/job_records.py: the job store's records of a job run by an Auto Scaling group, each with
one writer and one checker that the instance and the launching machine share (issue 35). For
every record: what its writer builds, its checker takes back as written (a round trip), and
the checker refuses a forged, oversized or mistyped record, or one under another record's key,
and never lets a control character through (Hypothesis, under any input). The checks of
attempts/<n>.json and final.json were group_launch.py's, those of progress.json and of a
stored record's bytes test_auto_scaling.py's: their tests came with them."""

from __future__ import annotations

import ipaddress
import json
import math
import unicodedata

import pytest
from hypothesis import given, settings, strategies as st

from cloudtrain.host import job_records
from cloudtrain.host.job_records import (
    INSTANCE as INSTANCE_ID, MAX_ATTEMPTS, TYPE, ZONE, check_attempt, check_final)
from cloudtrain.host.job_status import HIDDEN

ATTEMPT_KEYS = {"attempt", "instance", "zone", "type", "lifecycle", "started_at", "by",
                "resumed_step", "resumed_seq", "resumed_attempt"}
FINAL_KEYS = {"state", "exit_code", "reason", "ended_at", "attempt", "instance"}
NOW = 1_760_000_000.0


def good_attempt(**over) -> dict:
    return {"attempt": 2, "instance": "i-0123456789abcdef0", "zone": "us-east-1b",
            "type": "g5.xlarge", "lifecycle": "spot", "started_at": NOW, "by": "bootstrap",
            "resumed_step": 1200, "resumed_seq": 7, "resumed_attempt": 1, **over}


# -- the records, as untrusted input ---------------------------------------------------------

def test_a_good_attempt_is_taken_as_written():
    assert check_attempt(good_attempt()) == good_attempt()
    assert check_attempt(good_attempt(lifecycle="on-demand"))["lifecycle"] == "on-demand"


@pytest.mark.parametrize("over", [
    {"attempt": 0}, {"attempt": -1}, {"attempt": MAX_ATTEMPTS + 1}, {"attempt": True},
    {"attempt": 2.0}, {"attempt": "2"}, {"attempt": None},
    {"instance": "i-123"}, {"instance": "i-0123456789ABCDEF0"}, {"instance": "x-0123456789"},
    {"instance": "i-0123456789abcdef0\n"}, {"instance": 7}, {"instance": None},
])
def test_an_attempt_without_its_number_or_instance_is_not_one(over):
    assert check_attempt(good_attempt(**over)) is None


@pytest.mark.parametrize("field, value", [
    ("zone", "us-east-1b; rm -rf /"), ("zone", "US-EAST-1B"), ("zone", 5),
    ("type", "g5.xlarge\x1b[2J"), ("type", ["g5.xlarge"]), ("started_at", True),
    ("started_at", float("nan")), ("started_at", float("inf")), ("started_at", 5),
    ("started_at", 1e12), ("started_at", "1760000000"), ("resumed_step", -1),
    ("resumed_step", True), ("resumed_step", 1 << 53), ("resumed_step", 3.0),
    ("resumed_seq", "7"), ("resumed_attempt", 2), ("resumed_attempt", 3),
    ("resumed_attempt", 0), ("resumed_attempt", True), ("resumed_attempt", "1"),
])
def test_a_bad_field_of_an_attempt_is_dropped_not_the_attempt(field, value):
    got = check_attempt(good_attempt(**{field: value}))
    assert got is not None and got[field] is None
    assert {k: v for k, v in got.items() if k != field} == \
        {k: v for k, v in good_attempt().items() if k != field}


def test_a_lifecycle_other_than_on_demand_is_spot():
    for value in ("spot", "scheduled", None, 1, "ON-DEMAND"):
        assert check_attempt(good_attempt(lifecycle=value))["lifecycle"] == "spot"


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled", "preempted"])
def test_a_final_record_of_an_end_is_taken(state):
    got = check_final({"state": state, "exit_code": 3, "reason": "  out of\n memory ",
                       "ended_at": NOW, "attempt": 2, "instance": "i-0123456789abcdef0"})
    assert got == {"state": state, "exit_code": 3, "reason": "out of memory", "ended_at": NOW,
                   "attempt": 2, "instance": "i-0123456789abcdef0"}


@pytest.mark.parametrize("doc", [None, [], "succeeded", {"state": "running"}, {"state": None},
                                 {"state": ["succeeded"]}, {"exit_code": 0}])
def test_a_final_record_without_an_end_state_is_not_one(doc):
    assert check_final(doc) is None


def test_a_final_record_s_bad_fields_are_dropped():
    got = check_final({"state": "failed", "exit_code": True, "reason": "x" * 5000,
                       "ended_at": float("nan"), "attempt": MAX_ATTEMPTS + 1})
    assert got["exit_code"] is None and got["ended_at"] is None and got["attempt"] is None
    assert len(got["reason"]) == 300
    assert check_final({"state": "failed", "exit_code": 4096})["exit_code"] is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
ANY = JSON | st.sets(st.integers(), max_size=3) | st.binary(max_size=10) | st.tuples(JSON)
NEAR = {"attempt": st.integers(-3, MAX_ATTEMPTS + 3) | st.booleans() | ANY,
        "instance": st.from_regex(INSTANCE_ID, fullmatch=True) | st.text(max_size=24) | ANY,
        "zone": st.from_regex(ZONE, fullmatch=True) | ANY,
        "type": st.from_regex(TYPE, fullmatch=True) | ANY,
        "lifecycle": st.sampled_from(["spot", "on-demand"]) | ANY,
        "started_at": st.floats(0, 2e11) | ANY, "by": ANY,
        "resumed_step": st.integers(-5, 1 << 54) | ANY, "resumed_seq": ANY,
        "resumed_attempt": st.integers(-2, MAX_ATTEMPTS + 2) | ANY,
        "state": st.sampled_from(["succeeded", "failed", "cancelled", "preempted"]) | ANY,
        "exit_code": st.integers(-2000, 2000) | ANY, "reason": st.text(max_size=400) | ANY,
        "ended_at": st.floats(allow_nan=True) | ANY}
DOCS = ANY | st.fixed_dictionaries({}, optional=NEAR)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_clean_line(text: str) -> bool:
    return all(unicodedata.category(c) not in HIDDEN for c in text)


def _when(value) -> bool:
    return value is None or (type(value) is float and math.isfinite(value)
                             and 1e9 < value < 1e11)


@settings(max_examples=600, deadline=None)
@given(DOCS)
def test_any_attempt_record_is_refused_or_comes_back_well_typed(doc):
    got = check_attempt(doc)
    if got is None:
        return
    assert set(got) == ATTEMPT_KEYS
    assert _int(got["attempt"]) and 1 <= got["attempt"] <= MAX_ATTEMPTS
    assert isinstance(got["instance"], str) and INSTANCE_ID.fullmatch(got["instance"])
    assert got["zone"] is None or ZONE.fullmatch(got["zone"])
    assert got["type"] is None or TYPE.fullmatch(got["type"])
    assert got["lifecycle"] in ("spot", "on-demand") and _when(got["started_at"])
    assert isinstance(got["by"], str) and len(got["by"]) <= 20 and _one_clean_line(got["by"])
    for key in ("resumed_step", "resumed_seq"):
        assert got[key] is None or (_int(got[key]) and 0 <= got[key] < 1 << 53)
    # C1: the attempt whose checkpoint it resumed from, an earlier one
    assert got["resumed_attempt"] is None or (_int(got["resumed_attempt"])
                                              and 1 <= got["resumed_attempt"] < got["attempt"])
    json.dumps(got, allow_nan=False)  # what the store and status take


@settings(max_examples=600, deadline=None)
@given(DOCS)
def test_any_final_record_is_refused_or_comes_back_well_typed(doc):
    got = check_final(doc)
    if got is None:
        return
    assert set(got) == FINAL_KEYS
    assert got["state"] in ("succeeded", "failed", "cancelled", "preempted")
    assert got["exit_code"] is None or (_int(got["exit_code"]) and -1024 < got["exit_code"] < 1024)
    assert got["reason"] is None or (isinstance(got["reason"], str) and len(got["reason"]) <= 300
                                     and _one_clean_line(got["reason"]))
    assert _when(got["ended_at"])
    assert got["attempt"] is None or (_int(got["attempt"]) and 1 <= got["attempt"] <= MAX_ATTEMPTS)
    assert got["instance"] is None or INSTANCE_ID.fullmatch(got["instance"])
    json.dumps(got, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.just(b"{" * 50_000), st.just(b"x" * 70_000),
                 st.recursive(st.none() | st.integers() | st.text(max_size=20),
                              lambda c: st.lists(c, max_size=3)
                              | st.dictionaries(st.text(max_size=8), c, max_size=4))
                 .map(lambda v: json.dumps(v).encode())))
def test_a_stored_record_is_a_dict_or_none_whatever_its_bytes(data):
    doc = job_records.read_record(data)
    assert doc is None or isinstance(doc, dict)
    if len(data) > job_records.RECORD_MAX_BYTES:
        assert doc is None


def test_the_records_have_the_contracts_fields():
    ident = {"instance": "i-1", "zone": "us-east-1a", "type": "g5.xlarge", "lifecycle": "spot"}
    assert set(job_records.attempt_doc(2, ident)) == {
        "attempt", "instance", "zone", "type", "lifecycle", "started_at", "by"}
    final = job_records.final_doc("failed", True, "x" * 5000, 2, "i-1")
    assert set(final) == {"state", "exit_code", "reason", "ended_at", "attempt", "instance"}
    assert final["exit_code"] is None and len(final["reason"]) == job_records.REASON_MAX_CHARS
    assert job_records.attempt_key("jobs/o/j/", 3) == "jobs/o/j/attempts/3.json"


# -- C1: an attempt's progress, for the launching machine ---------------------------------------

def test_C1_the_progress_record_written_is_read_back_as_written():
    """C1 (issue 34): attempts/<n>/progress.json, written by rank 0's agent (progress_doc) and
    checked where the launching machine reads it (check_progress): one shape, both sides."""
    doc = job_records.progress_doc(3, 120, 115, at=1_760_000_000.5)
    assert json.loads(json.dumps(doc)) == doc
    assert job_records.check_progress(doc, 3) == {
        "attempt": 3, "step": 120, "checkpoint_step": 115, "at": 1_760_000_000.5}
    assert job_records.progress_key("jobs/o/j/", 3) == "jobs/o/j/attempts/3/progress.json"
    # no step yet, or no checkpoint streamed yet: null, still the attempt's record
    assert job_records.check_progress(job_records.progress_doc(2, None, 7), 2)["step"] is None


@pytest.mark.parametrize("over", [
    {"attempt": 4},                 # another attempt's, under attempt 3's key
    {"attempt": "3"}, {"attempt": True}, {"attempt": None},
])
def test_C1_a_progress_record_not_the_attempt_s_is_none(over):
    assert job_records.check_progress(dict(job_records.progress_doc(3, 1, 1), **over), 3) \
        is None


@pytest.mark.parametrize("field, value", [
    ("step", -1), ("step", True), ("step", 1.5), ("step", "120"), ("step", 1 << 53),
    ("checkpoint_step", [1]), ("checkpoint_step", float("nan")),
    ("at", float("inf")), ("at", "now"), ("at", 5), ("at", True),
])
def test_C1_a_field_that_is_not_one_is_null_and_the_others_stand(field, value):
    got = job_records.check_progress(dict(job_records.progress_doc(
        3, 120, 115, at=1_760_000_000.0), **{field: value}), 3)
    assert got[field] is None
    assert {k: v for k, v in got.items() if k != field} == {k: v for k, v in {
        "attempt": 3, "step": 120, "checkpoint_step": 115, "at": 1_760_000_000.0}.items()
        if k != field}


PROGRESS_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                    | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=16),
                                                                        c, max_size=5))
FIELDS = st.fixed_dictionaries({}, optional={
    "attempt": st.integers(-2, 5) | PROGRESS_JSON,
    "step": st.integers(-5, 1 << 54) | PROGRESS_JSON,
    "checkpoint_step": st.integers(-5, 1 << 54) | PROGRESS_JSON,
    "at": st.floats(allow_nan=True, allow_infinity=True) | PROGRESS_JSON}) | PROGRESS_JSON


@settings(max_examples=400, deadline=None)
@given(FIELDS, st.integers(-1, MAX_ATTEMPTS + 2) | st.booleans())
def test_C1_any_json_is_a_checked_progress_record_or_none_never_a_crash(doc, n):
    """C1: the record comes from the job store, which anyone holding the job's grant could
    write: whatever JSON it holds, the checker returns None or the fields of the contract,
    each one what it says or null."""
    got = job_records.check_progress(doc, n)
    if got is None:
        return
    assert set(got) == {"attempt", "step", "checkpoint_step", "at"}
    assert got["attempt"] == n and type(n) is int and 1 <= n <= MAX_ATTEMPTS
    for key in ("step", "checkpoint_step"):
        assert got[key] is None or (type(got[key]) is int and 0 <= got[key] < 1 << 53)
    assert got["at"] is None or (type(got["at"]) is float and 1e9 < got["at"] < 1e11)


# -- each record: its writer, then its checker (a round trip) --------------------------------

IDENT = {"instance": "i-0123456789abcdef0", "zone": "us-east-1b", "type": "g5.xlarge",
         "lifecycle": "spot", "address": "10.0.1.7"}


def stored(doc: dict):
    """`doc` as the store gives it back: JSON bytes, read by read_record."""
    return job_records.read_record(json.dumps(doc).encode())


def test_an_attempt_written_comes_back_as_written():
    doc = job_records.attempt_doc(3, IDENT, started_at=NOW)
    assert check_attempt(stored(doc), 3) == {**doc, "resumed_step": None,
                                             "resumed_seq": None, "resumed_attempt": None}
    again = job_records.attempt_doc(3, check_attempt(stored(doc), 3), "bootstrap", NOW,
                                    {"step": 1200, "seq": 7, "attempt": 2})
    assert check_attempt(stored(again), 3) == {**doc, "resumed_step": 1200, "resumed_seq": 7,
                                               "resumed_attempt": 2}
    launch = job_records.attempt_doc(1, dict(IDENT, zone=None), by="launch", started_at=NOW)
    assert check_attempt(stored(launch), 1)["by"] == "launch"


def test_an_attempt_under_another_attempt_s_key_is_refused():
    doc = job_records.attempt_doc(3, IDENT, started_at=NOW)
    assert check_attempt(stored(doc), 4) is None
    assert check_attempt(stored(doc)) is not None  # no key to hold it to


def test_a_final_record_written_comes_back_as_written():
    doc = job_records.final_doc("failed", 137, "OOM\x1b[2J killed\n", 2, IDENT["instance"],
                                ended_at=NOW)
    assert doc["reason"] == "OOM[2J killed"  # written one line already
    assert check_final(stored(doc)) == doc
    long = job_records.final_doc("preempted", None, "x" * 5000, None, None, ended_at=NOW)
    assert check_final(stored(long)) == long and len(long["reason"]) == 300


def test_a_progress_record_written_comes_back_as_written():
    doc = job_records.progress_doc(2, 480, 450, at=NOW)
    assert job_records.check_progress(stored(doc), 2) == doc
    assert job_records.check_progress(stored(doc), 3) is None  # another attempt's key
    assert job_records.check_progress(stored(dict(doc, attempt=True)), 1) is None


def test_a_member_record_written_comes_back_as_written():
    doc = job_records.member_doc(IDENT["instance"], 1, "10.0.1.7", "ens5", 29500, at=NOW)
    assert job_records.check_member(stored(doc), 3) == {
        k: doc[k] for k in ("instance", "rank", "address", "port", "iface")}
    assert job_records.check_member(stored(dict(doc, port=0)), 3) is None
    assert job_records.check_member(stored(dict(doc, port=True)), 3) is None


@pytest.mark.parametrize("write, check", [
    (lambda rank: job_records.ended_doc(rank, "succeeded", IDENT["instance"]),
     job_records.check_ended),
    (lambda rank: job_records.leaving_doc(rank, IDENT["instance"], at=NOW),
     job_records.check_leaving),
    (lambda rank: job_records.leaving_doc(rank, None), job_records.check_leaving),
], ids=["ended", "leaving", "leaving-without-instance"])
def test_a_rank_s_mark_written_comes_back_and_only_for_its_rank(write, check):
    doc = write(2)
    assert check(stored(doc), 2) == {"rank": 2, "instance": doc["instance"]}
    assert check(stored(doc), 1) is None  # under another rank's key
    for forged in ({**doc, "rank": True}, {**doc, "rank": "2"}, {**doc, "instance": "i-../x"},
                   {**doc, "instance": 7}, [doc], None):
        assert check(forged, 2) is None, forged


def test_the_keys_name_what_their_records_are():
    prefix = "jobs/o/j/"
    assert job_records.final_key(prefix) == "jobs/o/j/final.json"
    assert job_records.attempt_of(prefix, job_records.attempt_key(prefix, 7)) == 7
    for key in (job_records.progress_key(prefix, 7), prefix + "attempts/07.json",
                prefix + "attempts/0.json", prefix + f"attempts/{MAX_ATTEMPTS + 1}.json",
                prefix + "attempts/7.json.bak", "jobs/o/k/attempts/7.json",
                prefix + "attempts/\u0667.json"):
        assert job_records.attempt_of(prefix, key) is None, key
    folder = job_records.attempt_folder(prefix, 2)
    assert job_records.member_of(folder, job_records.member_key(
        prefix, 2, IDENT["instance"])) == IDENT["instance"]
    for key in (job_records.ended_key(prefix, 2, 1), job_records.leaving_key(prefix, 2, 1),
                folder + "sub/" + IDENT["instance"] + ".json",
                job_records.member_key(prefix, 3, IDENT["instance"])):
        assert job_records.member_of(folder, key) is None, key


@pytest.mark.parametrize("data", [
    None, b"", b"\x00\xffnot json", b"[" * 100_000, b"[1, 2]", b'"final"', b"7",
    b'{"state": "failed", "pad": "' + b"x" * job_records.RECORD_MAX_BYTES + b'"}',
], ids=["none", "empty", "garbage", "deep", "list", "string", "number", "huge"])
def test_bytes_that_are_no_record_are_none_and_never_raise(data):
    assert job_records.read_record(data) is None


@pytest.mark.parametrize("text, want", [
    ("3", 3), (" 3\n", 3), ("1", 1), (str(MAX_ATTEMPTS), MAX_ATTEMPTS),
    ("0", None), (str(MAX_ATTEMPTS + 1), None), ("-1", None), ("3.0", None), ("", None),
    ("\u0663", None), ("\u00b2", None), ("1e3", None), (None, None),
], ids=repr)
def test_the_attempt_a_job_s_env_says_is_checked(text, want):
    assert job_records.attempt_in(text) == want


def test_the_limits_are_said_once_where_the_launch_and_the_instance_read_them():
    from cloudtrain import jobfile, spec
    from cloudtrain.host import auto_scaling

    assert spec.MAX_RESTARTS is job_records.MAX_RESTARTS
    assert jobfile.BY_PATH["resources.max_restarts"].high == job_records.MAX_RESTARTS
    assert auto_scaling.MAX_RESTARTS is job_records.MAX_RESTARTS
    assert MAX_ATTEMPTS == job_records.MAX_RESTARTS + 1


MARK_NEAR = {"rank": st.integers(-2, 70) | st.booleans() | ANY,
             "instance": st.from_regex(INSTANCE_ID, fullmatch=True) | st.none() | ANY,
             "state": ANY, "at": ANY}
@settings(max_examples=200, deadline=None)
@given(ANY | st.fixed_dictionaries({}, optional=MARK_NEAR), st.integers(0, 63))
def test_any_mark_is_refused_or_names_its_own_rank(doc, rank):
    for check in (job_records.check_ended, job_records.check_leaving):
        got = check(doc, rank)
        if got is None:
            continue
        assert got == {"rank": rank, "instance": got["instance"]}
        assert _int(doc["rank"]) and doc["rank"] == rank
        assert got["instance"] is None or INSTANCE_ID.fullmatch(got["instance"])


# -- a node's record of a regroup (these were test_regroup.py's) ------------------------------

MEMBER_FIELDS = {"instance", "rank", "address", "port", "iface"}
MEMBER_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() |
                    st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
MEMBER_NEAR = {  # values close to the ones a node writes, good and bad, to reach every check
    "instance": st.from_regex(r"i-[0-9a-f]{8,17}", fullmatch=True) | st.sampled_from(
        ["i-0123", "i-0123456789abcdef0; rm", "I-0123456789", ""]) | MEMBER_JSON,
    "rank": st.none() | st.integers(-3, 70) | st.booleans() | st.floats() | MEMBER_JSON,
    "address": st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).map(str) |
    st.ip_addresses(network="10.0.0.0/8").map(str) |
    st.ip_addresses(network="172.16.0.0/12").map(str) |
    st.sampled_from(["10.0.0.1 ", "10.0.0", "localhost", "1.2.3.4/8"]) | st.integers() |
    st.booleans() | MEMBER_JSON,
    "port": st.integers(-2, 70000) | st.booleans() | st.sampled_from(["80", 80.0]) | MEMBER_JSON,
    "iface": st.none() | st.from_regex(r"[A-Za-z0-9_.:@-]{1,15}", fullmatch=True) |
    st.sampled_from(["eth0; rm -rf /", "x" * 16, "", "eth 0"]) | MEMBER_JSON,
}
MEMBER_RECORDS = MEMBER_JSON | st.fixed_dictionaries(
    MEMBER_NEAR, optional={"at": MEMBER_JSON, "extra": MEMBER_JSON}) | \
    st.fixed_dictionaries({}, optional=MEMBER_NEAR)


@settings(max_examples=800, deadline=None)
@given(MEMBER_RECORDS, st.integers(1, 64))
def test_a_record_from_the_job_store_is_kept_only_with_every_field_checked(doc, nodes):
    out = job_records.check_member(doc, nodes)  # never raises
    if out is None:
        return
    assert set(out) == MEMBER_FIELDS
    assert job_records.INSTANCE.fullmatch(out["instance"])
    # the address is the IPv4 address the record wrote, as EC2 writes one, and a VPC's
    assert isinstance(doc["address"], str) and out["address"] == doc["address"]
    assert str(ipaddress.IPv4Address(out["address"])) == out["address"]
    assert any(ipaddress.IPv4Address(out["address"]) in ipaddress.IPv4Network(n)
               for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"))
    assert type(out["port"]) is int and 1 <= out["port"] <= 65535
    assert out["iface"] is None or (type(out["iface"]) is str
                                    and job_records.IFACE.fullmatch(out["iface"]))
    assert out["rank"] is None or (type(out["rank"]) is int and 0 <= out["rank"] < nodes)
    json.dumps(out)


def test_a_good_record_is_kept_and_a_bad_rank_or_interface_only_forgotten():
    doc = {"instance": "i-0123456789abcdef0", "rank": 2, "address": "10.0.1.7",
           "port": 29501, "iface": "ens5", "at": 1.0}
    assert job_records.check_member(doc, 3) == {k: doc[k] for k in MEMBER_FIELDS}
    assert job_records.check_member(dict(doc, rank=3), 3)["rank"] is None  # not a rank of 3
    assert job_records.check_member(dict(doc, iface="ens5; rm"), 3)["iface"] is None
    for bad in ({"port": 0}, {"port": True}, {"address": 167837959}, {"address": "::1"},
                {"instance": "i-xyz"}):
        assert job_records.check_member(dict(doc, **bad), 3) is None, bad


def test_F42_only_an_address_a_vpc_may_give_is_a_members():
    """F42: check_member took any IPv4 address: public, loopback, the IMDS, broadcast,
    multicast. A VPC's instances have RFC 1918 (or RFC 6598) addresses."""
    doc = {"instance": "i-0123456789abcdef0", "rank": 0, "port": 29500}
    for good in ("10.0.1.7", "172.16.5.4", "172.31.255.254", "192.168.1.2", "100.64.3.3"):
        assert job_records.check_member(dict(doc, address=good), 3)["address"] == good
    for bad in ("8.8.8.8", "127.0.0.1", "169.254.169.254", "0.0.0.0", "255.255.255.255",
                "224.0.0.1", "203.0.113.66", "198.51.100.7", "172.32.0.1", "10.0.0.0",
                "10.255.255.255", "192.168.255.255"):
        assert job_records.check_member(dict(doc, address=bad), 3) is None, bad


def test_the_records_keys_are_below_the_attempt():
    assert job_records.member_key("jobs/o/j1/", 4, "i-0000000a") == \
        "jobs/o/j1/attempts/4/i-0000000a.json"
    assert job_records.ended_key("jobs/o/j1/", 4, 2) == "jobs/o/j1/attempts/4/ended-2.json"
    assert job_records.MEMBER_NAME.fullmatch("i-0000000a.json")
    assert not job_records.MEMBER_NAME.fullmatch("ended-2.json")


def test_issue38_a_switch_to_on_demand_comes_back_as_written_or_not_at_all():
    """attempts/<n>/switched.json: attempt n's instance set the group to on-demand. Read
    back as written; another attempt's, or one without its time or outcome, is none; its
    line is one line without escapes (it reaches the timeline)."""
    doc = job_records.switch_doc(2, "i-0123456789abcdef0", True, "group g set\n\x1b[31mred",
                                 at=1.8e9)
    got = job_records.check_switch(json.loads(json.dumps(doc)), 2)
    assert got == {"attempt": 2, "instance": "i-0123456789abcdef0", "at": 1.8e9, "ok": True,
                   "line": got["line"]}
    assert "\n" not in got["line"] and "\x1b" not in got["line"] and "group g set" in got["line"]
    assert job_records.check_switch(doc, 3) is None
    for bad in ({"ok": "yes"}, {"at": "now"}, {"attempt": True}):
        assert job_records.check_switch(dict(doc, **bad), 2) is None, bad
    assert job_records.switch_key("jobs/o/j/", 2) == "jobs/o/j/attempts/2/switched.json"


SWITCHES = ANY | st.fixed_dictionaries({}, optional={
    **NEAR, "ok": st.booleans() | ANY, "line": st.text(max_size=600) | ANY,
    "at": st.floats(allow_nan=True) | st.floats(1e9, 2e9) | ANY})


@given(SWITCHES, st.integers(-1, MAX_ATTEMPTS + 2))
def test_issue38_any_json_is_a_checked_switch_or_none_never_a_crash(doc, n):
    got = job_records.check_switch(doc, n)
    assert got is None or (got["attempt"] == n and isinstance(got["ok"], bool)
                           and _one_clean_line(got["line"]) and _when(got["at"])
                           and got["instance"] in (None, doc.get("instance")))
