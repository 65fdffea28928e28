"""Issue 16: training curves. A job's metrics.jsonl as a table (text, CSV, JSON), as a plot
against epoch and wall time, and as a sparkline; everything in the file is untrusted, so
Hypothesis feeds hostile files to every reader and renderer."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain import curves, plots
from cloudtrain.curves import JobMetrics
from cloudtrain.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = 1_795_607_664.64


def resnet9_rows(epochs: int = 10, *, run: int = 0, start: float = T0, rate: float = 1.0,
                 seconds: float = 0.94) -> list[dict]:
    """Rows as recipes/resnet9 writes them (MetricsWriter adds `time`)."""
    rows = []
    for e in range(1, epochs + 1):
        acc = min(0.99, 0.55 + 0.4 * rate * (1 - math.exp(-e / 3)))
        rows.append({"time": round(start + e * seconds, 3), "run": run, "epoch": e,
                     "epochs": epochs, "step": 97 * e, "lr": 0.4 * (1 - e / (epochs + 1)),
                     "train_loss": 2.1 * math.exp(-e / 4) + 0.05,
                     "train_acc": min(0.999, acc + 0.02), "test_acc": acc,
                     "test_loss": 1.8 * math.exp(-e / 3.5) + 0.1,
                     "train_time": round(0.79 * e, 4), "wall_time": round(3.2 + seconds * e, 4)})
    return rows


IMAGENET_ROW = {"time": T0, "epoch": 1, "epochs": 4, "step": 20, "steps": 70, "phase": 0,
                "size": 32, "batch": 8, "source": "sz/40", "val_mode": "center",
                "lr": 0.075, "train_loss": 4.578959131240845, "train_acc": 0.33125,
                "train_top5": 0.73125, "test_acc": 0.3, "top5": 0.725,
                "test_loss": 25.565984344482423, "images_per_s": 36.15, "train_time": 4.4255,
                "wall_time": 10.9853}
TARGET = {"time": T0 + 9.5, "event": "target_reached", "run": 0, "epoch": 9,
          "test_acc": 0.9402, "train_time": 7.11, "wall_time": 11.66}


def write_jsonl(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def job_at(home: Path, job_id: str, rows: list[dict], name: str | None = None) -> JobMetrics:
    """A job's metrics.jsonl where it is brought home, read as `metrics` and `plot` read it."""
    write_jsonl(home / "jobs" / job_id / "metrics.jsonl", rows)
    return curves.read_job(job_id, name)


# -- reading -----------------------------------------------------------------------------------

def test_reads_rows_and_events_from_the_home_copy(ct_home):
    """issue 16: rows without "event" are metric rows, the others events; read from
    $CLOUDTRAIN_HOME/jobs/<id>/metrics.jsonl."""
    rows = resnet9_rows(10)
    job = job_at(ct_home, "3f2a1b9c", rows[:9] + [TARGET] + rows[9:], name="fast")
    assert job.rows == rows
    assert job.events == [TARGET]
    assert job.notes == []
    assert job.label == "3f2a1b9c (fast)"
    assert curves.metrics_path("3f2a1b9c") == ct_home / "jobs" / "3f2a1b9c" / "metrics.jsonl"


def test_F38_numbers_out_of_any_sane_range_show_as_a_dash(ct_home):
    """F38: a finite 1e308 accuracy showed as `inf%`, a `time` or duration of -1e308 as a
    duration of 300 digits. Accuracies past 0..100 (a fraction, or a percentage some scripts
    write), durations that are negative or past ~30 years and times outside 1970..5138 are
    `-`."""
    rows = [{"time": T0, "epoch": 1, "test_acc": 1e308, "train_time": -1e308, "lr": 1e308},
            {"time": -1e308, "epoch": 2, "test_acc": 0.5, "train_time": 1e308},
            {"time": 1e308, "epoch": 3, "test_acc": -1e308, "train_time": 12.5}]
    text = curves.table([job_at(ct_home, "big", rows)])
    assert "inf" not in text and max(len(word) for word in text.split()) < 20, text
    lines = text.splitlines()
    assert lines[1].split() == ["EPOCH", "TEST_ACC", "ELAPSED", "LR", "TRAIN_TIME"], text
    assert lines[2].split() == ["1", "-", "0.00s", "1e+308", "-"]
    assert lines[3].split() == ["2", "50.00%", "-", "-", "-"]
    assert lines[4].split() == ["3", "-", "-", "-", "12s"]


def test_partial_last_line_is_skipped_quietly(tmp_path):
    """issue 16: the last line of a file still being written (no newline yet) is not a row
    and not counted as junk either."""
    rows = resnet9_rows(3)
    path = write_jsonl(tmp_path / "m.jsonl", rows, tail='{"epoch": 4, "test_acc": 0.9')
    assert curves.read_rows(path) == (rows, [])
    assert curves.read_job("x", path=path).notes == []
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1]))  # done, not flushed
    assert curves.read_rows(path) == ([rows[0]], [])


def test_junk_lines_are_left_out_with_a_note(tmp_path):
    """issue 16: lines that are not one JSON object (a list, a string, binary, nesting past
    the recursion limit) are counted in a note; the rows around them are kept."""
    rows = resnet9_rows(3)
    path = write_jsonl(tmp_path / "m.jsonl", [rows[0], [1, 2], rows[1], "text", rows[2]])
    with path.open("ab") as f:
        f.write(b"\xff\xfe binary\n" + b"[" * 100_000 + b"\n" + b"{" * 10 + b"\n")
    assert curves.read_rows(path) == (rows, [])
    assert curves.read_job("x", path=path).notes == ["5 lines skipped: not a JSON object"]


def test_values_that_do_not_fit_are_dropped_per_value(tmp_path):
    """issue 16: a string accuracy, NaN, Infinity, a huge int and a nested value go; the rest
    of the row stays."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"epoch": 2, "test_acc": "94.1%", "train_loss": NaN, "lr": Infinity, '
                    '"step": 1' + "0" * 30 + ', "deep": {"a": [1]}, "test_loss": 0.5}\n')
    rows, _ = curves.read_rows(path)
    assert rows == [{"epoch": 2, "test_acc": "94.1%", "test_loss": 0.5}]


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "dev-zero"])
def test_a_file_that_is_not_there_or_not_a_file_reads_as_nothing(tmp_path, kind):
    """issue 16, F34: no metrics.jsonl yet, a directory, a FIFO a job left there (which would
    block a plain open for good) or a link to /dev/zero (a read without end) read as no rows,
    with the reason as a note."""
    path = tmp_path / "metrics.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    got = []
    reader = threading.Thread(target=lambda: got.append(curves.read_job("abc", path=path)),
                              daemon=True)
    reader.start()
    reader.join(timeout=20)
    if reader.is_alive():  # blocked in open(): let it go, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO blocked")
    job = got[0]
    assert job.rows == [] and job.events == []
    assert len(job.notes) == 1 and str(path) in job.notes[0]


def test_an_enormous_file_is_read_up_to_the_limit(tmp_path, monkeypatch):
    """issue 16: past MAX_BYTES only the start is read, and a note says so."""
    monkeypatch.setattr(curves, "MAX_BYTES", 4096)
    path = write_jsonl(tmp_path / "m.jsonl", resnet9_rows(100))
    job = curves.read_job("abc", path=path)
    assert 0 < len(job.rows) < 100
    assert job.rows == resnet9_rows(100)[:len(job.rows)]
    assert any("only the first" in n for n in job.notes)


def test_at_most_max_rows_rows_are_read(tmp_path, monkeypatch):
    """issue 16: past MAX_ROWS rows the rest is left out, with a note."""
    monkeypatch.setattr(curves, "MAX_ROWS", 5)
    job = curves.read_job("abc", path=write_jsonl(tmp_path / "m.jsonl", resnet9_rows(20)))
    assert len(job.rows) == 5
    assert job.notes == ["only the first 5 rows read"]


@pytest.mark.parametrize("bad", ["../etc", ".hidden", "", "a/b"])
def test_metrics_path_refuses_what_is_not_a_job_id(bad):
    """issue 16: a job id never walks out of $CLOUDTRAIN_HOME/jobs."""
    with pytest.raises(UsageError, match="not a job id"):
        curves.metrics_path(bad)


# -- keys --------------------------------------------------------------------------------------

def test_accuracy_and_loss_keys_are_picked_by_preference():
    """issue 16: test_acc before top1/top5; the recipe's target metric first where present;
    train_loss, test_loss before other losses."""
    assert curves.accuracy_key([IMAGENET_ROW]) == "test_acc"
    assert curves.accuracy_key([IMAGENET_ROW], "top5") == "top5"
    assert curves.accuracy_key([{"epoch": 1, "top1": 0.5, "top5": 0.7}]) == "top1"
    assert curves.accuracy_key([{"epoch": 1, "acc": "high"}]) is None
    assert curves.loss_keys([{"aux_loss": 1.0, "test_loss": 2.0, "train_loss": 3.0}]) == \
        ["train_loss", "test_loss", "aux_loss"]


# -- the table ---------------------------------------------------------------------------------

def test_table_of_a_resnet9_job_exactly(ct_home):
    """issue 16: epoch first (with the total), losses, accuracies as percentages, time since
    the job started (U10: its first row when the start is not known), then the other numbers
    (not the recipe's own wall_time: one time column); the events under it."""
    rows = resnet9_rows(3)
    job = job_at(ct_home, "3f2a1b9c", rows + [dict(TARGET, epoch=3, test_acc=0.7901)])
    assert curves.table([job]) == "\n".join([
        "job 3f2a1b9c",
        "EPOCH  TRAIN_LOSS  TEST_LOSS  TRAIN_ACC  TEST_ACC  ELAPSED   LR  STEP  TRAIN_TIME",
        "1/3         1.685      1.453     68.34%    66.34%    0.00s  0.3    97       0.79s",
        "2/3         1.324      1.116     76.46%    74.46%    0.94s  0.2   194       1.58s",
        "3/3         1.042     0.8639     82.28%    80.28%    1.88s  0.1   291       2.37s",
        "event target_reached: run 0, epoch 3, test_acc 79.01%, train_time 7.11s, "
        "wall_time 12s"])


def test_u10_elapsed_and_the_plots_clock_count_from_the_jobs_start(ct_home, tmp_path):
    """U10: ELAPSED said 0.00s at epoch 1 of a job that had run 46 s (startup and the first
    epoch were dropped), and disagreed with WALL_TIME beside it; the plot's time axis ended
    a 1 min job at 0.43 min. Both count from when the job started now."""
    rows = resnet9_rows(3)  # epoch 1 written at T0 + 0.94
    write_jsonl(ct_home / "jobs" / "s1b" / "metrics.jsonl", rows)
    job = curves.read_job("s1b", started_at=T0 - 45)
    lines = curves.table([job]).splitlines()
    assert lines[1].split().count("ELAPSED") == 1 and "WALL_TIME" not in lines[1]
    assert lines[2].split()[5] == "46s" and lines[4].split()[5] == "48s"
    curve = plots._curves(job, ["test_acc"], "epoch", plots.TIME_SOURCES[0])[0]
    assert curve.by_time["test_acc"][0] == pytest.approx([45.94 / 60, 46.88 / 60, 47.82 / 60])
    # a start after the first row (clocks of two machines) is not believed
    assert curves.read_job("s1b", started_at=T0 + 100).start() == rows[0]["time"]


def test_u19_a_final_row_completes_its_epoch_in_the_table_plot_and_sparkline(ct_home):
    """U19: airbench's final row (the TTA accuracy, no train_acc) showed as a second `2/2`
    line with TRAIN_ACC `-`, and put a flat tail on the plot; it completes the epoch's row.
    --json still has every row as written."""
    rows = resnet9_rows(2)
    final = {"time": rows[-1]["time"] + 0.3, "run": 0, "epoch": 2, "epochs": 2,
             "step": 194, "train_loss": rows[-1]["train_loss"], "test_acc": 0.9412,
             "final_test_acc": 0.9412, "tta_level": 2, "train_time": 1.9}
    job = job_at(ct_home, "ab94", rows + [final])
    body = curves.table([job]).splitlines()[2:]
    assert [l.split()[0] for l in body] == ["1/2", "2/2"]
    assert "94.12%" in body[1] and "-" not in body[1].split()[:6]
    curve = plots._curves(job, ["test_acc"], "epoch", plots.TIME_SOURCES[0])[0]
    assert curve.by_epoch["test_acc"][1] == [rows[0]["test_acc"], 0.9412]
    assert len(curve.by_time["test_acc"][0]) == 2
    assert curves.accuracy_trend(job.rows).endswith("94.12%")
    assert len(json.loads(curves.to_json([job]))[0]["rows"]) == 3


def test_u19_a_finished_job_without_metrics_says_it_wrote_none(ct_home):
    assert curves.read_job("dddd1111", finished=True).notes == ["the job wrote no metrics.jsonl"]
    assert curves.read_job("dddd1111").notes[0].startswith("no metrics.jsonl yet")


def test_table_fits_the_width_by_dropping_the_extra_columns_first(ct_home):
    """issue 16: in a narrow terminal the other numbers go; epoch, losses, accuracies stay."""
    job = job_at(ct_home, "im1", [IMAGENET_ROW])
    wide = curves.table([job])
    narrow = curves.table([job], width=80)
    assert "IMAGES_PER_S" in wide and "IMAGES_PER_S" not in narrow
    head = narrow.splitlines()[1].split()
    assert head[:7] == ["EPOCH", "TRAIN_LOSS", "TEST_LOSS", "TRAIN_ACC", "TEST_ACC", "TOP5",
                        "TRAIN_TOP5"]
    assert all(len(line) <= 80 for line in narrow.splitlines())
    assert "SOURCE" not in wide  # strings are for --csv and --json


def test_several_jobs_one_table_each_and_a_run_column_for_several_runs(ct_home):
    """issue 16: one table per job under its id; a RUN column only where a job has more than
    one run; a job with no rows says so."""
    one = job_at(ct_home, "aaaa", resnet9_rows(2))
    many = job_at(ct_home, "bbbb", resnet9_rows(2, run=0) + resnet9_rows(2, run=1))
    empty = curves.read_job("cccc")
    text = curves.table([one, many, empty])
    blocks = text.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["job aaaa", "job bbbb", "job cccc"]
    assert blocks[0].splitlines()[1].startswith("EPOCH ")
    assert blocks[1].splitlines()[1].startswith("RUN  EPOCH ")
    assert len(blocks[1].splitlines()) == 2 + 4
    assert blocks[2].splitlines()[1:] == [
        "no metric rows", f"note: no metrics.jsonl yet ({ct_home}/jobs/cccc/metrics.jsonl)"]


# -- CSV and JSON ------------------------------------------------------------------------------

def _from_csv(text: str) -> dict[str, list[dict]]:
    """The CSV read back: rows by job, "" as absent, numbers as numbers."""
    def value(s: str):
        if s in ("true", "false"):
            return s == "true"
        for kind in (int, float):
            try:
                return kind(s)
            except ValueError:
                pass
        return s

    out: dict[str, list[dict]] = {}
    for rec in csv.DictReader(io.StringIO(text)):
        job = rec.pop("job")
        out.setdefault(job, []).append({k: value(v) for k, v in rec.items() if v != ""})
    return out


def test_csv_round_trips_to_the_parsed_rows(ct_home):
    """issue 16: --csv read back with the csv module gives every job's rows as parsed, value
    for value (floats exactly), keys of one job absent from the other's rows."""
    a = job_at(ct_home, "aaaa", resnet9_rows(5))
    b = job_at(ct_home, "bbbb", [IMAGENET_ROW, dict(IMAGENET_ROW, epoch=2, ok=True)])
    text = curves.to_csv([a, b])
    assert text.splitlines()[0].startswith("job,run,epoch,train_loss,test_loss,")
    assert _from_csv(text) == {"aaaa": a.rows, "bbbb": b.rows}


def test_csv_neutralises_spreadsheet_formulas_from_the_file(tmp_path):
    """issue 16: a string from metrics.jsonl that a spreadsheet would run as a formula is
    written with a leading quote; numbers (negative too) are left alone."""
    path = write_jsonl(tmp_path / "m.jsonl",
                       [{"epoch": 1, "note": "=HYPERLINK(\"http://x\")", "delta": -0.5}])
    text = curves.to_csv([curves.read_job("j", path=path)])
    rec = next(csv.DictReader(io.StringIO(text)))
    assert rec["note"] == "'=HYPERLINK(\"http://x\")"
    assert rec["delta"] == "-0.5"


def test_json_is_a_list_of_jobs_with_their_rows(ct_home):
    """issue 16: --json is [{job, name, rows, events, notes}]."""
    a = job_at(ct_home, "aaaa", resnet9_rows(2) + [TARGET], name="fast")
    got = json.loads(curves.to_json([a, curves.read_job("bbbb")]))
    assert [g["id"] for g in got] == ["aaaa", "bbbb"]
    assert got[0]["name"] == "fast" and got[0]["rows"] == resnet9_rows(2)
    assert got[0]["events"] == [TARGET]
    assert got[1]["rows"] == [] and len(got[1]["notes"]) == 1


# -- hostile files -----------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-(10 ** 40), max_value=10 ** 40)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=80))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=70), inner, max_size=6),
                           max_leaves=12)
keys = st.sampled_from(["epoch", "run", "time", "step", "train_loss", "test_loss", "test_acc",
                        "top5", "lr", "event", "wall_time", "hours", "job"]) | st.text(max_size=70)
rows = st.dictionaries(keys, json_values, max_size=12)
lines = st.one_of(
    rows.map(json.dumps),  # NaN and Infinity come out as JSON's non-standard words
    json_values.map(json.dumps),
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
    st.integers(1, 5000).map(lambda n: "[" * n),
    st.integers(1, 5000).map(lambda n: '{"epoch": 1' + "9" * n + "}"),
    st.just('{"epoch": 1e999, "test_acc": -1e999}'),
)
files = st.tuples(st.lists(lines, max_size=25), st.text(max_size=30))


def _plain_line(text: str) -> bool:
    return all(unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in text)


@FUZZ
@given(content=files, width=st.none() | st.integers(1, 200))
def test_hostile_metrics_files_never_raise(tmp_path_factory, content, width):
    """issue 16: any metrics.jsonl reads, tables, CSVs and JSONs without raising: rows are
    flat finite values, the table lines are plain text, the CSV parses back to as many rows,
    the JSON is strict."""
    body, tail = content
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    path.write_bytes(("\n".join(body) + "\n" + tail).encode("utf-8", "surrogatepass"))
    job = curves.read_job("abcd1234", path=path)
    for row in job.rows + job.events:
        for key, value in row.items():
            assert type(value) in (bool, int, float, str)
            assert not isinstance(value, float) or math.isfinite(value)
    assert all("event" not in r for r in job.rows)
    text = curves.table([job, job], width=width)
    assert all(_plain_line(line) for line in text.splitlines())
    recs = list(csv.DictReader(io.StringIO(curves.to_csv([job]))))
    assert len(recs) == len(job.rows)
    json.loads(curves.to_json([job]), parse_constant=lambda c: pytest.fail(f"JSON has {c}"))
    trend = curves.accuracy_trend(job.rows)
    assert trend is None or ("\n" not in trend and _plain_line(trend))


numbers = (st.integers(min_value=-(10 ** 20), max_value=10 ** 20)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from([0, 1.7e308, -1.7e308, 5e-324, 1e12, -1e12]))
plot_rows = st.lists(st.fixed_dictionaries(
    {}, optional={k: numbers for k in ("epoch", "run", "time", "train_loss", "test_loss",
                                       "test_acc", "wall_time")}), min_size=1, max_size=15)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=plot_rows, target=st.none() | st.floats(0, 100))
def test_hostile_numbers_plot_or_say_why(tmp_path_factory, rows, target):
    """issue 16: huge, tiny, negative, repeated and missing numbers still make a PNG."""
    path = write_jsonl(tmp_path_factory.mktemp("p") / "metrics.jsonl", rows)
    out = path.parent / "curves.png"
    job = curves.read_job("abcd1234", name=r"$\undefined{$ _y", path=path)  # not TeX
    plots.plot([job], out, target=target)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_leaves_off_numbers_too_big_to_draw(tmp_path):
    """issue 16: values near the float limit (matplotlib's axis arithmetic overflows on them:
    "arange: cannot compute length") are left off; the rest is drawn."""
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"epoch": 1, "time": 0, "train_loss": 1.7e308, "test_acc": -1.7e308},
        {"epoch": 2, "time": 1.7e308, "train_loss": -1.7e308, "test_acc": 1.7e308},
        {"epoch": 3, "time": 60, "train_loss": 5e-324, "test_acc": 0.5},
        {"epoch": 1e308, "time": 120, "train_loss": 0.5, "test_acc": 0.6}])
    assert plots.plot([curves.read_job("a", path=path)], tmp_path / "c.png") == []
    assert _colour_count(_image(tmp_path / "c.png")) > 50


# -- the plot ----------------------------------------------------------------------------------

def _image(path: Path):
    from matplotlib.image import imread
    return imread(path)


def _rgb(img):
    return (img[:, :, :3] * 255).round().astype(int)


def _colour_count(img) -> int:
    import numpy as np
    return len(np.unique(_rgb(img).reshape(-1, 3), axis=0))


def _has(img, colour: tuple) -> bool:
    return bool((_rgb(img) == colour).all(axis=-1).any())


TAB_GREEN = (44, 160, 44)  # tab10's third colour: the third job's


@pytest.fixture
def three_jobs(ct_home) -> list[JobMetrics]:
    return [job_at(ct_home, "aaaa1111", resnet9_rows(10), name="base"),
            job_at(ct_home, "bbbb2222", resnet9_rows(10, rate=1.2, seconds=1.3)),
            job_at(ct_home, "cccc3333", resnet9_rows(10, rate=0.8, seconds=0.6) + [TARGET])]


def test_plot_writes_a_png_for_one_job_and_for_three(three_jobs, tmp_path):
    """issue 16: a 1200x800 RGBA PNG, not blank; three jobs draw a third colour that one job
    does not."""
    out = tmp_path / "out"
    out.mkdir()
    one, three = out / "one.png", out / "three.png"
    assert plots.plot(three_jobs[:1], one, target=0.94) == []
    assert plots.plot(three_jobs, three, target=0.94) == []
    a, b = _image(one), _image(three)
    assert a.shape == b.shape == (800, 1200, 4)
    assert _colour_count(a) > 100
    assert (a != b).any()
    assert _has(b, TAB_GREEN) and not _has(a, TAB_GREEN)
    assert sorted(os.listdir(out)) == ["one.png", "three.png"]  # no temporary file left


@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".pdf", b"%PDF-"),
                                           (".PNG", b"\x89PNG")])
def test_plot_format_follows_the_suffix(three_jobs, tmp_path, suffix, magic):
    """issue 16: -o curves.svg is SVG, .pdf PDF; the suffix in any case."""
    out = tmp_path / f"curves{suffix}"
    plots.plot(three_jobs, out)
    assert out.read_bytes().startswith(magic)


@pytest.mark.parametrize("name", ["curves.jpg", "curves", "curves.png.txt"])
def test_plot_refuses_an_unknown_suffix(three_jobs, tmp_path, name):
    """issue 16: a suffix that is not .png, .svg or .pdf is one UsageError line; nothing is
    written."""
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UsageError) as exc:
        plots.plot(three_jobs, out / name)
    assert "\n" not in exc.value.message and ".png, .svg or .pdf" in exc.value.message
    assert os.listdir(out) == []


def test_a_job_without_rows_is_an_error_alone_and_a_note_among_others(ct_home, tmp_path):
    """issue 16: the only job having no rows is a UsageError; among others it is left out
    with a note and the plot is still drawn."""
    empty = curves.read_job("eeee0000")
    with pytest.raises(UsageError, match=r"^job eeee0000 has no metric rows to plot \(no "
                                         r"metrics.jsonl yet"):
        plots.plot([empty], tmp_path / "c.png")
    full = job_at(ct_home, "ffff1111", resnet9_rows(3))
    notes = plots.plot([empty, full], tmp_path / "c.png")
    assert notes == [f"eeee0000: no metric rows (no metrics.jsonl yet "
                     f"({ct_home}/jobs/eeee0000/metrics.jsonl)), left out of the plot"]
    assert (tmp_path / "c.png").stat().st_size > 10_000
    with pytest.raises(UsageError, match="none of these jobs"):
        plots.plot([empty, curves.read_job("dddd")], tmp_path / "c.png")


def test_plot_names_what_it_could_not_draw(ct_home, tmp_path):
    """issue 16: no time in the rows, no epoch, or not the target metric: a note each."""
    job = job_at(ct_home, "aaaa", [{"step": 10, "train_loss": 1.0, "test_acc": 0.5}])
    notes = plots.plot([job], tmp_path / "c.png", target=0.9, metric="top5")
    assert notes == ["aaaa: no top5 in its rows; test_acc drawn instead",
                     "aaaa: no time in its rows, left off the time plots"]
    job = job_at(ct_home, "bbbb", [{"time": T0, "train_loss": 1.0}])
    assert plots.plot([job], tmp_path / "c.png") == [
        "bbbb: no epoch or step in its rows, left off the epoch plots"]


def test_plot_cannot_write_is_a_usage_error(three_jobs, tmp_path):
    """issue 16: a folder that is not there is one line naming the file, no traceback."""
    with pytest.raises(UsageError, match="cannot write .*nowhere/c.png: No such file"):
        plots.plot(three_jobs, tmp_path / "nowhere" / "c.png")


@pytest.mark.parametrize("target, why", [(float("nan"), "a finite number"), ("high", "a finite"),
                                         (9e307, "at most 100"), (-0.5, "at least 0")])
def test_plot_refuses_a_target_that_is_not_an_accuracy(three_jobs, tmp_path, target, why):
    """issue 16: the target accuracy is a finite number from 0 to 100 (a fraction or a
    percentage); 9e307 would overflow matplotlib's tick arithmetic."""
    with pytest.raises(UsageError, match=f"^the target accuracy must be {why}"):
        plots.plot(three_jobs, tmp_path / "c.png", target=target)


def test_runs_are_separate_curves_and_a_redone_epoch_is_drawn_once(ct_home):
    """issue 16: each run of a multi-run job is its own curve; where a resumed job wrote an
    epoch again, the later row is the one drawn; wall time is minutes since the first row."""
    first = resnet9_rows(4, run=0)
    redo = [dict(r, test_acc=r["test_acc"] + 0.01, time=r["time"] + 60) for r in first[2:]]
    job = job_at(ct_home, "aaaa", first + redo + resnet9_rows(2, run=1, start=T0 + 120))
    c0, c1 = plots._curves(job, ["test_acc"], "epoch", plots.TIME_SOURCES[0])
    xs, ys = c0.by_epoch["test_acc"]
    assert xs == [1, 2, 3, 4]
    assert ys == [r["test_acc"] for r in first[:2] + redo]
    assert c1.by_epoch["test_acc"][0] == [1, 2]
    minutes = c1.by_time["test_acc"][0]
    assert minutes == pytest.approx([(T0 + 120 + e * 0.94 - first[0]["time"]) / 60
                                     for e in (1, 2)], abs=1e-4)


def test_plot_never_needs_a_display_and_curves_imports_no_matplotlib(tmp_path):
    """issue 16: with a GUI backend asked for and no display, plot still writes (it never
    imports pyplot); importing cloudtrain.curves and plots alone imports no matplotlib."""
    path = write_jsonl(tmp_path / "m.jsonl", resnet9_rows(3))
    out = tmp_path / "c.png"
    code = ("import sys; from cloudtrain import curves, plots; assert 'matplotlib' not in sys.modules; "
            f"plots.plot([curves.read_job('a', path={str(path)!r})], {str(out)!r}); "
            "assert 'matplotlib.pyplot' not in sys.modules; print('ok')")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["MPLBACKEND"] = "TkAgg"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
    assert out.stat().st_size > 10_000


# -- the sparkline -----------------------------------------------------------------------------

@FUZZ
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=300),
       width=st.integers(1, 60))
def test_sparkline_length_and_monotone_input_gives_rising_blocks(values, width):
    """issue 16: at most `width` blocks, one per value up to that; non-decreasing values give
    non-decreasing blocks (at full resolution and resampled)."""
    line = curves.sparkline(sorted(values), width)
    assert len(line) == min(len(values), width)
    assert set(line) <= set(curves.BLOCKS)
    levels = [curves.BLOCKS.index(c) for c in line]
    assert levels == sorted(levels)
    if len(set(values)) > 1 and len(values) <= width:  # at full resolution: the full range
        assert levels[0] == 0 and levels[-1] == len(curves.BLOCKS) - 1


@FUZZ
@given(values=st.lists(scalars, max_size=50))
def test_sparkline_skips_what_is_not_a_number(values):
    """issue 16: None, NaN, strings and bools in the series are skipped, never raised on."""
    kept = [v for v in values if type(v) in (int, float) and math.isfinite(v)]
    assert len(curves.sparkline(values, 100)) == len(kept)


def test_sparkline_edges():
    """issue 16: empty is "", one value and a constant series are mid blocks, a fixed scale
    places a constant series by its value, a width under 1 is refused."""
    assert curves.sparkline([]) == ""
    assert curves.sparkline([0.7]) == "▄"
    assert curves.sparkline([3, 3, 3, 3]) == "▄▄▄▄"
    assert curves.sparkline([0.95] * 3, low=0, high=1) == "███"
    assert curves.sparkline([0.0, 0.5, 1.0], low=0, high=1) == "▁▅█"
    assert curves.sparkline([1e308, -1e308, 1e308]) == "█▁█"
    assert curves.sparkline([0.0, 5e-324]) == "▁█"  # the tiniest span is still a span
    assert curves.sparkline(list(range(100)), 4) == "▁▃▆█"
    # 7 x (0.3 / 7) sums to 0.30000000000000004, 8 x (0.3 / 8) to 0.3: the first run's mean
    # would cross a block boundary the second run's does not, and a constant series rise.
    assert curves.sparkline([0.3] * 15, 2, low=0, high=0.6000000000000001) == "▄▄"
    with pytest.raises(UsageError, match="at least 1 block"):
        curves.sparkline([1, 2], 0)


def test_accuracy_trend_for_status_shows_the_latest_run(ct_home):
    """issue 16: `status JOB`'s line: the accuracy key, its sparkline on 0..100% and its last
    value; a multi-run job shows its latest run; no accuracy, no line."""
    job = job_at(ct_home, "aaaa", resnet9_rows(10, run=0) + resnet9_rows(3, run=1))
    line = curves.accuracy_trend(job.rows)
    assert line == "test_acc ▆▆▇ 80.28%"
    assert curves.accuracy_trend([{"epoch": 1, "train_loss": 2.0}]) is None
    assert curves.accuracy_trend([IMAGENET_ROW], metric="top5").startswith("top5 ")


# -- the contract ------------------------------------------------------------------------------

def test_the_contract_names_every_key_the_code_reads():
    """issue 16: METRICS_CONTRACT (pasted in the README) names every key plot and status
    pick, and the limits the reader has."""
    text = " ".join(curves.METRICS_CONTRACT.split())
    for key in (*curves.ACCURACY_KEYS, *curves.LOSS_ORDER[:2], "epoch", "epochs", "run",
                "step", "event", *(k for k, _, _ in plots.TIME_SOURCES)):
        assert f"`{key}`" in text, key
    assert f"first {curves.MAX_BYTES >> 20} MB" in text
    assert f"{curves.MAX_ROWS:,} rows" in text


def test_the_readme_carries_the_metrics_contract():
    """issue 16: the metrics.jsonl contract for own code is documented in the README as the
    code states it."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    body = curves.METRICS_CONTRACT.split("\n", 1)[1]
    assert body.strip() in readme
