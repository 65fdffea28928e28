"""Issue 16: training curves through the real CLI: `metrics`, `plot`, `status JOB`'s trend."""

from __future__ import annotations

import csv
import io
import json

import pytest

WRITER = ("import json, os, time\n"
          "path = os.path.join(os.environ['CLOUDTRAIN_JOB_DIR'], 'metrics.jsonl')\n"
          "with open(path, 'a') as f:\n"
          "    for e in range(1, 6):\n"
          "        f.write(json.dumps({'time': time.time() + e, 'epoch': e, 'epochs': 5,\n"
          "                            'train_loss': 2.0 / e, 'test_acc': 0.5 + e * {slope}})"
          " + '\\n')\n")


@pytest.fixture
def three_jobs(cli):
    ids = []
    for i, slope in enumerate((0.05, 0.08, 0.02)):
        job = cli.launch("--name", f"curve-{i}", "--", "python3", "-c",
                         WRITER.replace("{slope}", str(slope)))
        cli.wait(job)
        ids.append(job)
    return ids


def test_metrics_table_csv_and_json(cli, three_jobs):
    """issue 16: the per-epoch table, --csv that round-trips, --json."""
    table = cli.ok("metrics", three_jobs[0]).stdout
    assert f"job {three_jobs[0]} (curve-0)" in table and "5/5" in table and "75.00%" in table
    rows = list(csv.DictReader(io.StringIO(cli.ok("metrics", *three_jobs[:2], "--csv").stdout)))
    assert len(rows) == 10 and {r["job"] for r in rows} == set(three_jobs[:2])
    first = [r for r in rows if r["job"] == three_jobs[1]]
    assert [int(r["epoch"]) for r in first] == [1, 2, 3, 4, 5]
    assert float(first[-1]["test_acc"]) == pytest.approx(0.9)
    data = json.loads(cli.ok("metrics", three_jobs[2], "--json").stdout)
    assert data[0]["id"] == three_jobs[2] and len(data[0]["rows"]) == 5
    both = cli("metrics", three_jobs[0], "--csv", "--json")
    assert both.returncode == 2 and "not both" in both.stderr


def test_plot_writes_a_png_of_one_and_of_three_jobs(cli, three_jobs, tmp_path):
    """issue 16: `plot` writes a valid, non-blank PNG; three jobs overlaid differ from one."""
    from PIL import Image

    one, three = tmp_path / "one.png", tmp_path / "three.png"
    assert cli.ok("plot", three_jobs[0], "-o", str(one)).stdout.startswith("wrote ")
    cli.ok("plot", *three_jobs, "-o", str(three), "--target", "85")
    images = [Image.open(p) for p in (one, three)]
    for img in images:
        assert img.format == "PNG" and img.size[0] >= 800 and img.size[1] >= 500
        assert len(img.convert("RGB").getcolors(1 << 20)) > 50  # curves, text: not blank
    assert images[0].tobytes() != images[1].tobytes()
    bad = cli("plot", three_jobs[0], "-o", str(tmp_path / "x.gif"))
    assert bad.returncode == 2 and bad.stderr.startswith("Error: ")


def test_status_of_a_job_shows_its_accuracy_sparkline(cli, three_jobs):
    """issue 16: `status JOB` has a one-line sparkline of the accuracy."""
    detail = cli.ok("status", three_jobs[1]).stdout
    trend = [line for line in detail.splitlines() if line.strip().startswith("trend")]
    assert len(trend) == 1 and "test_acc" in trend[0] and "90.00%" in trend[0]
    blocks = [c for c in trend[0] if c in "▁▂▃▄▅▆▇█"]
    assert len(blocks) == 5 and blocks == sorted(blocks)


def test_status_of_a_job_shows_its_startup_breakdown(cli):
    """issue 17: a recipe's {"event": "startup"} row is shown by `status JOB`."""
    code = ("import json, os\n"
            "p = os.path.join(os.environ['CLOUDTRAIN_JOB_DIR'], 'metrics.jsonl')\n"
            "open(p, 'a').write(json.dumps({'event': 'startup', 'import': 1.25, 'data': 0.5,"
            " 'compile': 12.0, 'to_first_step': 14.0, 'device': 'cuda'}) + '\\n')\n"
            "assert float(os.environ['CLOUDTRAIN_STARTED_AT']) > 0\n")
    job = cli.launch("--", "python3", "-c", code)
    assert cli.wait(job)["state"] == "succeeded"
    line = [l for l in cli.ok("status", job).stdout.splitlines()
            if l.startswith("  startup ")]
    assert line and "import 1.25s, data 0.50s, compile 12s; first step 14s after the start" \
        in line[0], line


def test_u25_every_json_names_a_job_id_and_an_instance_type_the_same_way(cli, three_jobs):
    """U25: the job's id was `id` (status), `job` (metrics), `key` (cost-report); an instance
    type `instance_type` (estimate) and `name` (catalog), whose gpus was 1.0."""
    job = three_jobs[0]
    status = json.loads(cli.ok("status", job, "--json").stdout)
    metrics = json.loads(cli.ok("metrics", job, "--json").stdout)[0]
    cost = json.loads(cli.ok("cost-report", "--json").stdout)
    assert status["id"] == metrics["id"] == job
    assert cost["rows"] == [{"id": "local", "jobs": 3, "dollars": 0.0, "settled": True,
                             "to_target": None, "staging": 0.0, "local": True,
                             "budget": None}]  # U29
    catalog = json.loads(cli.ok("catalog", "--gpu", "A10G", "--json").stdout)["types"]
    estimate = json.loads(cli.ok("estimate", "--recipe", "resnet9", "--gpus", "A10G:1",
                                 "--json").stdout)
    g5 = next(t for t in catalog if t["instance_type"] == "g5.xlarge")
    assert g5["gpus"] == 1 and isinstance(g5["gpus"], int)
    assert "g5.xlarge" in {r["instance_type"] for r in estimate["rows"]}
