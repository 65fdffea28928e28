"""What it costs to find what bills with the local state lost (F28, U1): a fresh
$CLOUDTRAIN_HOME, no region configured anywhere, one tagged instance running in us-east-1.
`status --refresh` and `down --all` then ask every region enabled for the account
(DescribeRegions, then one tag-filtered DescribeInstances per region, at once).

Prints, against moto's EC2 server in this process: the wall time of `cloudtrain status
--refresh` as a user runs it (a process of its own), the first time (moto builds each region's
backend on first use, which AWS does not) and warm; the EC2 calls one sweep makes; and the
wall time of `down --all -y`.

Usage: python benchmarks/lost_state_sweep.py [--runs R]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from labs.credentials import AWS_ENV  # noqa: E402
from aws_launch import CALLS  # noqa: E402  (counts EC2 calls made in this process)
from labs.loopback import free_port  # noqa: E402


def timed(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=ROOT,
                          capture_output=True, text=True, env=os.environ)
    return time.perf_counter() - t0, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    home = Path(tempfile.mkdtemp(prefix="ct-bench-sweep-"))
    os.environ.update(AWS_ENV, AWS_ENDPOINT_URL=endpoint, CLOUDTRAIN_HOME=str(home))
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        os.environ.pop(name, None)
    try:
        kw = dict(endpoint_url=endpoint, region_name="us-east-1")
        owner = boto3.client("sts", **kw).get_caller_identity()["Arn"]
        boto3.client("ec2", **kw).run_instances(
            ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
            TagSpecifications=[{"ResourceType": "instance", "Tags": [
                {"Key": "cloudtrain:owner", "Value": owner},
                {"Key": "cloudtrain:job", "Value": "6a92bfde"}]}])
        first, proc = timed("status", "--refresh")
        assert proc.returncode == 0 and "6a92bfde" in proc.stdout, proc.stdout + proc.stderr
        regions = next(l for l in proc.stdout.splitlines() if "regions checked" in l)
        warm = []
        for _ in range(args.runs):
            took, proc = timed("status", "--refresh")
            assert proc.returncode == 0, proc.stderr
            warm.append(took)
        from cloudtrain.lifecycle import stop
        from cloudtrain.state import open_store

        with open_store(home) as store:
            CALLS.clear()
            t0 = time.perf_counter()
            swept = stop.reconcile(store)
            in_process = time.perf_counter() - t0
        down, proc = timed("down", "--all", "-y")
        assert proc.returncode == 0 and "terminated" in proc.stdout, proc.stdout + proc.stderr
    finally:
        server.stop()
    print(f"`cloudtrain status --refresh`, state lost, no region configured, against moto "
          f"({len(swept.regions)} regions):")
    print(f"  first run {first:.2f} s (moto builds each region's backend on first use); "
          f"warm: median {statistics.median(warm):.2f} s over {args.runs} runs")
    print(f"  one sweep in this process: {in_process:.2f} s, EC2 calls {sum(CALLS.values())} "
          f"{dict(sorted(CALLS.items()))}")
    print(f"  {regions[:110]}...")
    print(f"`cloudtrain down --all -y` (terminates the instance): {down:.2f} s")


if __name__ == "__main__":
    main()
