"""Issue 16: shell completion, through the installed `cloudtrain` script and real bash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "cloudtrain"


def _complete(line: str, env: dict | None = None) -> list[str]:
    """What click's bash completion answers for `line` (the cursor at its end)."""
    words = line.split(" ")
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60, env={
        **os.environ, **(env or {}), "_CLOUDTRAIN_COMPLETE": "bash_complete",
        "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)})
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return [row.split(",", 1)[1] for row in proc.stdout.splitlines() if row]


@pytest.fixture
def two_jobs(cli):
    first = cli.launch("--name", "alpha-run", "--", "true")
    second = cli.launch("--name", "beta-run", "--", "true")
    cli.wait(first)
    cli.wait(second)
    return first, second


def test_job_ids_and_names_complete_for_every_job_argument(cli, two_jobs):
    """issue 16: job ids and names complete wherever a JOB is asked for."""
    first, second = two_jobs
    for line in ("cloudtrain status ", "cloudtrain logs ", "cloudtrain down ",
                 "cloudtrain launch --resume-from "):
        got = _complete(line)
        assert {first, second, "alpha-run", "beta-run"} <= set(got), (line, got)
    assert _complete("cloudtrain status al") == ["alpha-run"]
    assert _complete(f"cloudtrain status {second[:4]}") == [second]


def test_recipes_profiles_set_keys_and_instance_types_complete():
    """issue 16: recipes, the recipe's profiles and `--set` keys (then their choices), and
    the catalog's instance types."""
    assert _complete("cloudtrain launch --recipe air") == ["airbench94", "airbench95",
                                                          "airbench96"]
    assert "smoke" in _complete("cloudtrain launch --recipe resnet9 --profile ")
    keys = _complete("cloudtrain launch --recipe resnet9 --set ")
    assert "epochs=" in keys and "variant=" in keys and all(k.endswith("=") for k in keys)
    assert _complete("cloudtrain launch --recipe resnet9 --set device=c") == ["device=cpu",
                                                                              "device=cuda"]
    assert _complete("cloudtrain launch --set ep") == []  # no recipe: nothing to offer
    types = _complete("cloudtrain launch --instance p4")
    assert types and all(t.startswith("p4") for t in types)
    assert "resnet9" in _complete("cloudtrain recipes ")


def test_completion_of_a_broken_store_answers_nothing(ct_home):
    """issue 16: completion never prints an error into the command line."""
    (ct_home / "state.db").write_bytes(b"not a database" * 100)
    assert _complete("cloudtrain status ") == []


def test_bash_sources_the_script_and_completes(cli, two_jobs, tmp_path):
    """issue 16: the README's bash line works in a real bash: COMPREPLY gets the names."""
    rc = tmp_path / "rc.bash"
    script = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "_CLOUDTRAIN_COMPLETE": "bash_source"}).stdout
    assert "complete " in script
    rc.write_text(script + "\nCOMP_WORDS=(cloudtrain status al); COMP_CWORD=2\n"
                  "_cloudtrain_completion cloudtrain status al\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    proc = subprocess.run(["bash", str(rc)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{SCRIPT.parent}:{os.environ['PATH']}"})
    assert proc.stdout.split() == ["alpha-run"], (proc.stdout, proc.stderr)
