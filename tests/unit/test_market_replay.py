"""benchmarks/market_replay.py (issue 38, the honest-numbers benchmark): a tiny run prints a
row for every bundled recipe and band, with every share a percentage in [0, 100]. The figures
themselves live in the benchmark, not here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "market_replay.py"


@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("market_replay", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["market_replay"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("market_replay", None)


def test_a_tiny_replay_prints_every_recipe_and_band(replay, capsys, monkeypatch, tmp_path):
    """Issue 38: 3 runs a cell, stressed so that interruptions happen: the table has one row
    per recipe and band, its shares within [0, 100] %, and the same seed prints the same."""
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    argv = ["--runs", "3", "--seed", "7", "--rate-scale", "500", "--work-scale", "5"]
    cells = replay.main(argv)
    out = capsys.readouterr().out
    assert len(cells) == len(replay.RECIPES) * len(replay.BANDS)
    for name in replay.RECIPES:
        for band, _ in replay.BANDS:
            assert any(c.profile.recipe == name and c.band == band for c in cells)
        assert name in out
    for c in cells:
        f = c.figures
        for key in ("kept_spot", "kept_smart", "met_spot", "met_smart", "switched", "stopped"):
            assert 0.0 <= f[key] <= 100.0, (c.profile.recipe, c.band, key, f[key])
        assert 0.0 < f["usd_spot"] and 0.0 < f["usd_smart"] and 0.0 < f["usd_od"]
    assert "Spot Instance Advisor" in out and "seed 7" in out
    assert "kept b+d" in out and "met b+d" in out
    again = replay.main(argv)
    assert [c.figures for c in again] == [c.figures for c in cells]
