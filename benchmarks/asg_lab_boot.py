"""The Auto Scaling lab's own time (issue 27): from an instance's loss to its replacement's
user-data start, in the lab of tests/labs/asg.py (namespace hosts, moto; root only). What the
later end-to-end figures (termination -> first training step on the replacement) contain of
the lab itself, rather than of cloudtrain.

Per run: a group of 1 over two AZs whose user-data leaves a process behind and exits (as
tests/e2e/test_asg_lab.py's); its instance is taken back (CloudLab.take_back, a spot reason)
`--losses` times. Per replacement:

  detect     take_back -> the replacement launched in moto (the lab's 0.1 s tick)
  boot       launch -> the host up: namespace, mounts, sshd listening, IMDS forwarder
  user-data  launch -> its user-data started
  total      take_back -> the replacement's user-data started
  exited     user-data start -> its exit (the script itself: a few echo, a file, a fork)

    sudo .venv/bin/python benchmarks/asg_lab_boot.py [--runs N] [--losses N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]


def one(losses: int) -> list[dict]:
    from labs.cloud import bench_home, cloud_lab
    from labs.polling import wait_for
    from test_asg_lab import SLEEPER, _group, _moto_state

    rows = []
    with bench_home("asg") as (tmp, home, mp, cli, socket):
        with cloud_lab(cli, home, tmp, mp, [], socket, autoscaling=True) as lab:
            _group(lab, "bench", SLEEPER)
            (current,) = lab.asg.wait_for_group("bench", 1)
            for _ in range(losses):
                t0 = time.time()
                lab.take_back(_moto_state(lab, current.id))
                (current,) = wait_for(lambda: [i for i in lab.asg.wait_for_group("bench", 1)
                                               if i.id != current.id], timeout=60,
                                      what="the replacement")
                rows.append({"detect": current.launched_at - t0,
                             "boot": current.booted_at - current.launched_at,
                             "user-data": current.user_data_started_at - current.launched_at,
                             "total": current.user_data_started_at - t0,
                             "exited": current.user_data_ended_at
                             - current.user_data_started_at})
            assert lab.asg.errors() == [], lab.asg.errors()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--losses", type=int, default=5)
    args = parser.parse_args()
    from labs.netns import require_netns

    require_netns()
    rows = [row for _ in range(args.runs) for row in one(args.losses)]
    print(f"{len(rows)} replacements; seconds, median (min-max)")
    for key in ("detect", "boot", "user-data", "total", "exited"):
        got = [r[key] for r in rows]
        print(f"  {key:<10} {statistics.median(got):6.2f} ({min(got):.2f}-{max(got):.2f})")


if __name__ == "__main__":
    main()
