"""F19: what a host reports is cut to a schema, and rendering never raises on any value.
Hypothesis feeds arbitrary JSON-shaped values; the audit's own inputs are checked by name."""

from __future__ import annotations

import json
import math
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain import cells, hostdata, job_views
from cloudtrain.errors import HostError
from cloudtrain.state import Job

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=300))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=70), inner, max_size=8),
                           max_leaves=20)
status_like = st.fixed_dictionaries({}, optional={
    k: json_values | scalars for k in ("state", "agent_pid", "pid", "pgid", "started_at",
                                       "ended_at", "heartbeat_at", "exit_code", "reason",
                                       "interruption", "results_stored")})
rows = st.dictionaries(st.text(max_size=70), json_values, max_size=80) | json_values


def _one_clean_line(text: str) -> bool:
    return all(unicodedata.category(c) not in hostdata.HIDDEN for c in text)


def _flat_and_sane(row: dict) -> None:
    assert len(row) <= hostdata.MAX_ROW_KEYS
    for key, value in row.items():
        assert isinstance(key, str) and 0 < len(key) <= hostdata.MAX_KEY_LEN
        assert type(value) in (bool, int, float, str)
        if isinstance(value, float):
            assert math.isfinite(value)
        if isinstance(value, int):
            assert -(1 << 63) <= value < (1 << 63)
        if isinstance(value, str):
            assert len(value) <= hostdata.MAX_TEXT_LEN and _one_clean_line(value)


staging_like = st.fixed_dictionaries({}, optional={
    "state": st.sampled_from(["staging", "staged", "failed", "bogus"]) | json_values,
    "started_at": json_values, "ended_at": json_values, "error": json_values,
    "datasets": st.lists(st.fixed_dictionaries({}, optional={
        "name": json_values, "kind": json_values, "state": json_values,
        "bytes_total": json_values, "bytes_done": json_values, "files_total": json_values,
        "files_done": json_values, "mb_s": json_values, "seconds": json_values}) | json_values,
        max_size=4) | json_values})

# run.sh's setup-status.json (U49)
setup_like = st.fixed_dictionaries({}, optional={
    "state": st.sampled_from(["running", "done", "failed", "bogus"]) | json_values,
    "started_at": json_values, "ended_at": json_values, "exit_code": json_values})


@FUZZ
@given(report=st.fixed_dictionaries({}, optional={"status": status_like | json_values,
                                                   "now": json_values, "metrics": rows,
                                                   "target": rows, "runs": rows,
                                                   "staging": staging_like | json_values,
                                                   "setup": setup_like | json_values}))
def test_F19_fuzz_clean_report_keeps_only_what_fits(report):
    """F19, and the stager's staging-status.json (issue 12): whatever the job directory
    holds, the report has known keys, known states, finite numbers and one clean line."""
    out = hostdata.clean_report(report)
    assert set(out) == {"status", "now", "metrics", "target", "runs", "staging", "setup"}
    setup = out["setup"]
    if setup is not None:
        assert set(setup) == {"state", "started_at", "ended_at"}
        assert setup["state"] in hostdata.SETUP_STATES
        assert all(setup[k] is None or math.isfinite(setup[k]) for k in ("started_at",
                                                                          "ended_at"))
    staging = out["staging"]
    if staging is not None:
        assert staging["state"] in (None, *hostdata.STAGING_STATES)
        for key in ("started_at", "ended_at"):
            assert staging[key] is None or math.isfinite(staging[key])
        assert staging["error"] is None or _one_clean_line(staging["error"])
        for row in staging["datasets"]:
            assert row["state"] in (None, *hostdata.DATASET_STATES)
            assert isinstance(row["name"], str) and _one_clean_line(row["name"] or "x")
            for key in ("bytes_total", "bytes_done", "files_total", "files_done"):
                assert row[key] is None or (type(row[key]) is int and row[key] >= 0)
            for key in ("mb_s", "seconds"):
                assert row[key] is None or math.isfinite(row[key])
    assert out["now"] is None or math.isfinite(out["now"])
    for key in ("metrics", "target", "runs"):
        assert out[key] is None or isinstance(out[key], dict)
        if out[key] is not None:
            _flat_and_sane(out[key])
    status = out["status"]
    if status is not None:
        assert status["state"] in (None, *hostdata.AGENT_STATES)
        for key in hostdata.PID_FIELDS:
            assert status[key] is None or (type(status[key]) is int and status[key] > 0)
        for key in hostdata.TIME_FIELDS:
            assert status[key] is None or math.isfinite(status[key])
        assert status["exit_code"] is None or -255 <= status["exit_code"] <= 1024
        assert status["reason"] is None or (_one_clean_line(status["reason"])
                                            and len(status["reason"]) <= hostdata.MAX_REASON_LEN)
        stored = status.get("results_stored")
        if stored is not None:
            assert set(stored) == {"at", "ok", "files", "bytes", "error"}
            assert type(stored["ok"]) is bool
    json.dumps(out, allow_nan=False)  # what the state store binds: plain, finite JSON


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200))
def test_F19_fuzz_parse_raises_only_host_error(data):
    try:
        hostdata.probe_report(data, "h")
    except HostError as exc:
        assert "\n" not in exc.message


@pytest.mark.parametrize("text, message", [
    ("not json", "did not answer with JSON"),
    (b"\xff{}", "not UTF-8"),
    ('{"a":' * 20000 + "1" + "}" * 20000, "nested too deeply"),
    ("[1, 2]", "list, not an object"),
    ("9" * 5000, "did not answer with JSON"),
    ("", "(nothing)"),
])
def test_F19_unparseable_answers_are_one_line_errors(text, message):
    with pytest.raises(HostError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        hostdata.probe_report(text, "h")
    assert "\n" not in info.value.message


def test_F19_the_audit_inputs():
    report = hostdata.clean_report({
        "status": [1, 2], "metrics": {"epoch": 1, "test_acc": "94.1%", "train_time": math.nan,
                                      "loss": math.inf, "nested": {"a": {"a": 1}}}})
    assert report["status"] is None
    assert report["metrics"] == {"epoch": 1, "test_acc": "94.1%"}
    status = hostdata.clean_status({"state": "running", "agent_pid": "abc", "started_at": "x",
                                    "heartbeat_at": "soon", "exit_code": True})
    assert (status["state"], status["agent_pid"], status["started_at"], status["exit_code"]) == \
        ("running", None, None, None)
    assert hostdata.clean_status({"state": "pwned"})["state"] is None
    assert hostdata.clean_status({"exit_code": 1025})["exit_code"] is None
    assert hostdata.clean_status({"exit_code": -255})["exit_code"] == -255
    deep = '{"a":' * 9000 + "1" + "}" * 9000  # 54 KB, as in the audit
    with pytest.raises(HostError, match="nested too deeply"):
        hostdata.probe_report(deep, "h")
    stored = hostdata.clean_status({"results_stored": {"at": 5, "ok": "yes", "files": -1,
                                                       "bytes": 10, "error": "a\nb"}})
    assert stored["results_stored"] == {"at": 5.0, "ok": False, "files": None, "bytes": 10,
                                        "error": "a b"}
    assert hostdata.clean_status({"interruption": {"action": "terminate", "x": [1]}}
                                 )["interruption"] == {"action": "terminate"}


# -- render: any value in, text out ---------------------------------------------------------------

anything = json_values | st.floats(allow_nan=True, allow_infinity=True) | st.integers(
    min_value=-(10 ** 400), max_value=10 ** 400)


@FUZZ
@given(value=anything, other=anything)
def test_F19_fuzz_formatters_never_raise(value, other):
    for fmt in (cells.number, cells.pct, cells.duration, cells.clock, cells.money,
                cells.money4, cells.epoch_text):
        assert isinstance(fmt(value), str)
    assert isinstance(cells.age(value, other), str)
    assert isinstance(job_views._metric(value if isinstance(value, str) else "k", value), str)


@FUZZ
@given(metrics=rows, started=anything, ended=anything, exit_code=anything, target=rows,
       runs=rows)
def test_F19_fuzz_status_table_and_detail_never_raise(metrics, started, ended, exit_code,
                                                      target, runs):
    job = Job(id="abcd1234", name=None, kind="command", recipe=None, command="x", backend="local",
              state="failed", created_at=1.7e9, started_at=started, ended_at=ended,
              exit_code=exit_code, reason=None, spec={}, host=None, jobdir=None, metrics=metrics,
              cost=None)
    assert "abcd1234" in job_views.status_table([job], now=1.8e9)
    assert "abcd1234" in job_views.job_detail(job, [], b"", target=target, runs=runs, now=1.8e9)


def test_F19_render_the_audit_inputs():
    assert cells.pct("94.1%") == "94.1%"
    assert cells.number(None) == "-"
    assert cells.duration(math.nan) == "nan" and cells.duration(math.inf) == "inf"
    assert cells.duration(1e300) == "1e+300s"
    assert cells.pct(0.9412) == "94.12%" and cells.duration(75) == "1m15s"
    assert cells.clock(1e300) == "1e+300" or cells.clock(1e300).startswith("1")
    assert cells.age("x", 5) == "-"
    assert cells.epoch_text({"epoch": {"a": 1}, "epochs": 10 ** 100}).startswith("{'a': 1}/")
    assert len(cells.number("x" * 10000)) <= cells.MAX_SHOWN


# -- F36: a job's output on the user's terminal ------------------------------------------------

ESC = b"\x1b"
HOSTILE_LOG = (b"start\n" + ESC + b"]0;owned-title\x07" + ESC + b"[2J"  # title, clear screen
               + ESC + b"]52;c;SGVsbG8=\x07"  # OSC 52: write the clipboard
               + ESC + b"P+q544e\x1b\\" + ESC + b"_apc\x1b\\" + ESC + b"^pm\x1b\\"  # DCS APC PM
               + ESC + b"[31mred" + ESC + b"[0m \xc3\xa9t\xc3\xa9\t1\r\n"  # SGR colour, UTF-8
               + b"\x07bell\x08\x00nul\x7f " + ESC + b"c" + ESC + b"[?1049h"  # C0, reset, alt
               + "\u009b2J\u009d0;c1\u009c".encode() + b"end\n")  # C1 CSI and OSC, in UTF-8
SHOWN = (b"start\n" + ESC + b"[31mred" + ESC + b"[0m \xc3\xa9t\xc3\xa9\t1\r\n" + b"bellnul end\n")


def test_F36_terminal_text_keeps_text_and_colours_and_drops_every_other_sequence():
    screen = hostdata.TerminalText()
    assert screen.feed(HOSTILE_LOG) + screen.flush() == SHOWN


def test_F36_a_sequence_split_across_chunks_is_still_dropped():
    """Output arrives in chunks (`logs -f`): one byte at a time gives the same as all at once,
    a UTF-8 character split in two included."""
    screen = hostdata.TerminalText()
    shown = b"".join(screen.feed(HOSTILE_LOG[i:i + 1]) for i in range(len(HOSTILE_LOG)))
    assert shown + screen.flush() == SHOWN
    for cut in range(1, len(HOSTILE_LOG)):
        screen = hostdata.TerminalText()
        assert screen.feed(HOSTILE_LOG[:cut]) + screen.feed(HOSTILE_LOG[cut:]) \
            + screen.flush() == SHOWN, cut


def test_F36_an_unterminated_string_sequence_does_not_hide_the_rest_of_the_log():
    screen = hostdata.TerminalText()
    shown = screen.feed(ESC + b"]0;" + b"x" * 100_000 + b"\nstill here\n") + screen.flush()
    assert shown.endswith(b"still here\n") and ESC not in shown and len(shown) < 100


@given(st.binary(max_size=300))
@FUZZ
def test_F36_fuzz_nothing_but_sgr_reaches_the_terminal(data):
    screen = hostdata.TerminalText()
    shown = (screen.feed(data) + screen.flush()).decode("utf-8")  # valid UTF-8, always
    for i, c in enumerate(shown):
        if c == "\x1b":  # only `ESC [ params m`
            end = shown.index("m", i)
            assert shown[i + 1] == "[" and all(p in "0123456789;:" for p in shown[i + 2:end])
        else:
            assert c in "\n\r\t\x1b" or unicodedata.category(c) != "Cc", repr(c)


def test_F38_shared_formatters_never_spell_out_absurd_numbers():
    """F38: `status` shows the same values: 1e308 as an accuracy is no `inf%`, -1e308 seconds
    no 300-digit duration."""
    assert cells.pct(1e308) == "-" and cells.pct(0.5) == "50.00%"
    assert cells.duration(-1e308) == "-1e+308s" and cells.duration(-2) == "-2.00s"
