"""check --launch --recovery's job (cloudtrain/launch_check_recovery.py), run here with sh: the
flow itself runs end to end in tests/e2e/test_launch_check_recovery.py."""

from __future__ import annotations

import json
import subprocess

from cloudtrain.launch_check_recovery import RESUMED_STEPS, script


def test_issue37_the_check_job_resumed_from_its_count_ends_three_steps_later(tmp_path):
    """Issue 37 (★): started with a checkpoint of step 5 (what the replacement restores), the
    script says it resumed from step 5, counts to 8, keeps each step as its checkpoint with a
    checkpoint-info.json the checkpoint stream reads the step from, and prints the check's
    line last."""
    from cloudtrain.host.checkpoint_manifest import step_from_info

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "count").write_text("5\n")
    (tmp_path / "job.sh").write_text(script("cloudtrain check --launch nonce"))
    done = subprocess.run(["sh", "job.sh"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin",
                                           "CLOUDTRAIN_CHECKPOINT_DIR": str(checkpoints)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["resumed from step 5"] + [f"step {n}" for n in
                                               range(6, 6 + RESUMED_STEPS)] + [
        "cloudtrain check --launch nonce"]
    assert (checkpoints / "count").read_text() == "8\n"
    info = (checkpoints / "checkpoint-info.json").read_bytes()
    assert json.loads(info) == {"step": 8} and step_from_info(info) == (8, None)


def test_issue37_a_count_that_is_not_a_number_starts_afresh(tmp_path):
    """Issue 37 (★): a checkpoint whose count is not a whole number (a hostile or broken file)
    is taken as none: the script starts counting from 1, never evaluates it."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "count").write_text("$(touch pwned)\n")
    (tmp_path / "job.sh").write_text(script("line"))
    proc = subprocess.Popen(["sh", "job.sh"], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin",
                                 "CLOUDTRAIN_CHECKPOINT_DIR": str(checkpoints)})
    try:
        first = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert first == "step 1\n" and not (tmp_path / "pwned").exists()
