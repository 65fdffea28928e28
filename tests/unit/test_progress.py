"""progress.py: what a launch says while it works (D3, D4)."""

from __future__ import annotations

import io

from cloudtrain import progress


def test_d3_lines_say_each_phase_once_and_a_retry_at_most_every_few_seconds(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    report = progress.Lines(out)
    report.phase("waiting for SSH on ubuntu@10.0.0.4:22 (at most 600 s)")
    for step in range(30):  # a failed attempt every second for 30 s
        now[0] += 1
        report.retry("SSH not up yet (banner timeout), retrying")
    report.transfer(10)
    report.sent(5)  # no bar, no carriage return when piped
    report.note("WARNING: something")
    assert out.getvalue().splitlines() == [
        "waiting for SSH on ubuntu@10.0.0.4:22 (at most 600 s)",
        "SSH not up yet (banner timeout), retrying (1 s)",
        "SSH not up yet (banner timeout), retrying (11 s)",
        "SSH not up yet (banner timeout), retrying (21 s)",
        "WARNING: something",
    ]


def test_d3_a_plain_say_callback_gets_notes_but_no_phases():
    said = []
    report = progress.of(said.append)
    report.phase("syncing 3 files, 1.0 MB")
    report("a note")
    assert said == ["a note"]
    assert progress.of(None) is progress.SILENT and progress.of(report) is report


def test_megabytes():
    assert [progress.megabytes(n) for n in (300, 4_200_000, 1_200_000_000)] == \
        ["0.3 kB", "4.2 MB", "1.2 GB"]
