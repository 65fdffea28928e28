"""host/agent_progress.py without S3 (C1, issue 34): how far a run of a group's job got, read
from the run's own metrics rows and the checkpoint stream's last upload, and posted through
the job's grant to a loopback store (test_checkpoint_stream's, which keeps each POSTed object
as S3 would): at once with the first figures, then at most every PROGRESS_S when they changed,
at once at a spot notice, and at the run's end."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cloudtrain.host import agent_progress, agent_upload, job_records
from labs.loopback import serve
from labs.polling import wait_for
from test_checkpoint_stream import PREFIX, Store, _Handler

KEY = PREFIX + "attempts/3/progress.json"


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setattr(agent_upload, "BACKOFF_S", 0.01)
    _, server = serve(_Handler, server_class=Store)
    yield server
    server.close()


def rows(path: Path, *steps: int, **extra) -> None:
    with path.open("a") as f:
        for step in steps:
            f.write(json.dumps({"step": step, "loss": 0.5, **extra}) + "\n")


def stored(store: Store) -> list[dict]:
    """Every progress record the store took, in order."""
    return [json.loads(data) for key, data in store.history if key == KEY]


# -- the step a run reached ----------------------------------------------------------------------

def test_C1_the_last_step_is_the_run_s_own_last_metrics_row(tmp_path):
    """A restore brings the metrics of the runs before (rows up to step 88, though the
    checkpoint is step 86): those are not this run's; its own rows are those after the start."""
    metrics = tmp_path / "metrics.jsonl"
    rows(metrics, 86, 87, 88)
    start = agent_progress.file_size(metrics)
    assert agent_progress.last_step(metrics, start) is None
    assert agent_progress.last_step(metrics) == 88  # from the start of the file
    rows(metrics, 87)
    with metrics.open("a") as f:
        f.write('{"event": "startup", "step": 999}\n["not", "a", "row"]\n{"step": true}\n'
                '{"step": 88, "loss": 0.4')  # a row being written
    assert agent_progress.last_step(metrics, start) == 87


def test_C1_a_metrics_file_replaced_since_the_start_is_all_this_run_s(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows(metrics, *range(1, 50))
    start = agent_progress.file_size(metrics)
    metrics.unlink()
    rows(metrics, 3)
    assert agent_progress.last_step(metrics, start) == 3


def test_C1_the_metrics_are_read_from_their_tail_only(tmp_path):
    """A job may write gigabytes of metrics: only the last TAIL_BYTES are read."""
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("w") as f:
        f.write('{"step": 1, "pad": "' + "x" * (8 << 20) + '"}\n')
    rows(metrics, 2)
    assert agent_progress.last_step(metrics) == 2
    with metrics.open("a") as f:  # a last row longer than the window is no row at all
        f.write('{"step": 3, "pad": "' + "x" * agent_progress.TAIL_BYTES + '"}\n')
    started = time.monotonic()
    assert agent_progress.last_step(metrics) is None
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("kind", ["fifo", "link", "dir"])
def test_C1_a_metrics_file_the_job_planted_is_no_step(tmp_path, kind):
    metrics = tmp_path / "metrics.jsonl"
    if kind == "fifo":
        os.mkfifo(metrics)
    elif kind == "link":
        rows(tmp_path / "elsewhere.jsonl", 5)
        metrics.symlink_to(tmp_path / "elsewhere.jsonl")
    else:
        metrics.mkdir()
    assert agent_progress.file_size(metrics) == 0
    assert agent_progress.last_step(metrics) is None


# -- when it is posted -----------------------------------------------------------------------------

def progress(tmp_path: Path, store: Store, checkpoint=None, lines=None) -> agent_progress.Progress:
    return agent_progress.Progress(tmp_path, store.grant(), KEY, 3, checkpoint,
                                   (lines if lines is not None else []).append)


def test_C1_the_first_figures_go_up_at_once_then_at_most_every_progress_s(tmp_path, store,
                                                                          monkeypatch):
    monkeypatch.setattr(agent_progress, "PROGRESS_S", 1.5)
    monkeypatch.setattr(agent_progress, "LOOK_S", 0.05)
    metrics = tmp_path / "metrics.jsonl"
    rows(metrics, 40)  # restored: a run before
    run = progress(tmp_path, store).start()
    time.sleep(0.3)
    assert stored(store) == []  # nothing of this run's yet: nothing to say
    rows(metrics, 41)
    first = wait_for(lambda: stored(store), timeout=5, interval=0.02, what="the first record")
    assert [(d["attempt"], d["step"], d["checkpoint_step"]) for d in first] == [(3, 41, None)]
    assert job_records.check_progress(first[0], 3) is not None  # the checker takes it
    posted = time.monotonic()
    rows(metrics, 42, 43)
    wait_for(lambda: len(stored(store)) == 2, timeout=5, interval=0.02, what="the second")
    assert time.monotonic() - posted >= 1.5 - 0.1  # not before PROGRESS_S
    assert stored(store)[-1]["step"] == 43
    time.sleep(2.0)
    assert len(stored(store)) == 2  # nothing changed: nothing posted
    run.finish(5)


def test_C1_a_spot_notice_posts_at_once_and_the_run_s_end_posts_the_last_figures(tmp_path,
                                                                                 store,
                                                                                 monkeypatch):
    monkeypatch.setattr(agent_progress, "LOOK_S", 0.05)
    metrics = tmp_path / "metrics.jsonl"
    upload = {"ok": True, "step": 40, "seq": 2}
    run = progress(tmp_path, store, checkpoint=lambda: dict(upload)).start()
    rows(metrics, 41)
    wait_for(lambda: stored(store), timeout=5, interval=0.02, what="the first record")
    rows(metrics, 42, 43)
    run.now()  # within PROGRESS_S (30 s) of the first
    wait_for(lambda: len(stored(store)) == 2, timeout=5, interval=0.02, what="the notice's")
    assert (stored(store)[-1]["step"], stored(store)[-1]["checkpoint_step"]) == (43, 40)
    rows(metrics, 44)
    upload.update(step=44, seq=3)  # the notice's checkpoint, flushed at the end
    assert run.finish(5) is True
    assert [(d["step"], d["checkpoint_step"]) for d in stored(store)] == \
        [(41, 40), (43, 40), (44, 44)]
    upload.update(ok=False, step=99)  # an upload that failed says nothing of the step
    assert run.figures() == (44, 44, None)  # no budget: no spend
    assert run.finish(5) is True and len(stored(store)) == 3  # nothing new: no post


def test_C1_a_store_that_refuses_is_said_once_and_tried_again_later(tmp_path, store,
                                                                    monkeypatch):
    monkeypatch.setattr(agent_progress, "PROGRESS_S", 0.2)
    monkeypatch.setattr(agent_progress, "LOOK_S", 0.05)
    store.fail = lambda key: 403
    lines: list[str] = []
    run = progress(tmp_path, store, lines=lines).start()
    rows(tmp_path / "metrics.jsonl", 7)
    wait_for(lambda: len(store.posts) >= 3, timeout=10, interval=0.05, what="tries")
    assert len(lines) == 1 and "progress was not stored" in lines[0] and "403" in lines[0]
    store.fail = lambda key: None
    wait_for(lambda: stored(store), timeout=5, interval=0.05, what="the record once the store takes it")
    assert run.finish(5) is True


def test_C1_only_rank_0_of_a_group_s_job_with_a_grant_and_an_attempt_posts(tmp_path, store):
    conf = {"prefix": PREFIX, "rank": 0}
    job = {"results_store": store.grant(), "env": {"CLOUDTRAIN_ATTEMPT": "3"}}
    run = agent_progress.Progress.for_job(tmp_path, job, conf)
    assert (run.key, run.attempt, run.grant["prefix"]) == (KEY, 3, PREFIX)
    assert agent_progress.Progress.for_job(tmp_path, job, dict(conf, rank=1)) is None
    assert agent_progress.Progress.for_job(tmp_path, job, None) is None  # not a group's
    assert agent_progress.Progress.for_job(tmp_path, dict(job, env={}), conf) is None
    assert agent_progress.Progress.for_job(tmp_path, dict(job, results_store=None), conf) \
        is None
