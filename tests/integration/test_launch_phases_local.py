"""`launch` on the local backend says the same phases as on AWS, shorter (D3)."""

from __future__ import annotations


def test_d3_local_launch_says_its_phases_in_order_as_plain_lines(cli, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('trained')\n")
    (work / "data.bin").write_bytes(b"x" * 2_500_000)
    proc = cli.ok("launch", "--workdir", str(work), "--", "python", "train.py")
    job_id = proc.stdout.split("launched job ")[1][:8]
    assert proc.stderr.splitlines() == [
        f"launching job {job_id}: waiting until it starts (Ctrl-C cancels the launch)",
        "running on this machine (local backend)",
        "syncing 2 files, 2.5 MB",
        "setting up the host",
        "starting the job in tmux",
        f"started job {job_id}",
    ]
    assert cli.wait(job_id)["state"] == "succeeded"


def test_d3_quiet_local_launch_prints_only_the_id(cli, tmp_path):
    proc = cli.ok("launch", "-q", "--", "true")
    assert len(proc.stdout.strip()) == 8 and proc.stderr == ""
