"""Staging a dataset onto a host, as an instance does before its job: the real stager
(cloudtrain/host/stager.py, run as `python3 stager.py PLAN STATUS` the way run.sh runs it), with
the plan the launch writes (datasets.host_plan), against moto's S3 server on 127.0.0.1.

It prints MB/s and files/s of:
  * shards, presigned links: tar shards pushed by `cloudtrain data push` (ranged GETs,
    sha256 per shard, extract, verify_tree);
  * shards, role: the same, each GET signed (SigV4) with credentials from a fake IMDSv2;
  * plain prefix: the same files as one object each (what a bucket not pushed by cloudtrain
    holds), md5-checked, one GET per file;
and the stager's own CPU seconds (user + system), which says what limits it here.

moto keeps objects in this process's memory and serves plain HTTP on loopback, on the same
cores as the stager: the figures are our code's overhead against a local moto, NOT S3's or
a network's speed (an instance reading S3 is limited by its network and its disk).

    python benchmarks/data_staging.py                       # 2,000 files of 100 KB
    python benchmarks/data_staging.py --files 500 --kb 50 --shard-mb 4
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from cloudtrain import config, datasets, datasources  # noqa: E402
from cloudtrain.providers.aws import AWSProvider  # noqa: E402
from cloudtrain.providers.aws import datasets as s3_datasets  # noqa: E402
from cloudtrain.hosts import write_host_files  # noqa: E402
from cloudtrain.spec import JobSpec  # noqa: E402
from data_push import make_tree, rate  # noqa: E402
from labs.imds import FakeIMDS  # noqa: E402
from labs.loopback import free_port  # noqa: E402

REGION, BUCKET = "eu-west-1", "bench-datasets"


def plan_for(prefix: str, auth: str, dest: Path, imds_url: str) -> dict:
    """The stager's plan for s3://BUCKET/prefix, made by the launch's own code."""
    source = datasources.parse_source("bench", f"s3://{BUCKET}/{prefix}", "benchmark").to_dict()
    settings = config.Settings(imds_url=imds_url,
                               instance_profile="bench" if auth == "role" else "")
    staged = AWSProvider(settings).read_dataset(  # as a launch reads it, from REGION
        JobSpec.of(kind="command", backend="aws", region=REGION), {**source, "dir": dest.name})
    spec = JobSpec(kind="command", backend="aws" if auth == "role" else "local")
    return datasets.host_plan([staged], spec, settings, str(dest.parent))


def run_stager(plan: dict, work: Path) -> tuple[float, float, dict]:
    """Wall seconds, the stager's CPU seconds, and its status file."""
    (work / "plan.json").write_text(json.dumps(plan))
    write_host_files(work / "agent")  # what a host gets: the stager is one of its commands
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, str(work / "agent" / "stager.py"), str(work / "plan.json"),
                    str(work / "status.json")], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads((work / "status.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--kb", type=int, default=100)
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--workers", type=int, default=datasets.STAGING_WORKERS,
                        help="the stager's concurrent GETs (the launch's default)")
    args = parser.parse_args()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="data-staging-bench-"))
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_REGION": REGION, "AWS_ENDPOINT_URL_S3": endpoint,
                 "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
                 "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                 "CLOUDTRAIN_HOME": str(work / "home")}.items():
        os.environ[k] = v
    imds = FakeIMDS(creds={"AccessKeyId": "testing", "SecretAccessKey": "testing"})
    try:
        tree = work / "tree"
        total = make_tree(tree, args.files, args.kb)
        s3 = s3_datasets.client(boto3.Session(region_name=REGION), REGION, endpoint, 32)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        s3_datasets.push(s3, tree, BUCKET, "sharded", shard_bytes=args.shard_mb << 20,
                         workers=8, region=REGION)
        files = sorted(p for p in tree.rglob("*") if p.is_file())
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda p: s3.put_object(
                Bucket=BUCKET, Key=f"plain/{p.relative_to(tree).as_posix()}",
                Body=p.read_bytes()), files))
        print(f"staging on loopback: {args.files} files of {args.kb} KB ({total / 1e6:.0f} MB), "
              f"{args.shard_mb} MB shards, the stager's {args.workers} workers and "
              f"{datasets.STAGING_PART_BYTES >> 20} MB ranges, against moto on 127.0.0.1")
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
        print("our code's overhead against a local moto (in-memory, plain HTTP, the same "
              "cores), not S3's speed\n")
        for label, prefix, auth in (("shards, presigned links", "sharded", "presigned"),
                                    ("shards, role (SigV4)", "sharded", "role"),
                                    ("plain prefix, presigned", "plain", "presigned")):
            dest = work / "data" / "bench"
            plan = dict(plan_for(prefix, auth, dest, imds.url), workers=args.workers)
            wall, cpu, status = run_stager(plan, work)
            (row,) = status["datasets"]
            assert status["state"] == "staged" and row["files_done"] == args.files, status
            print(f"  {label:<26} {rate(row['bytes_done'], row['files_done'], wall)}  "
                  f"stager CPU {cpu:5.2f} s ({cpu / wall:.0%} of one core)")
            shutil.rmtree(dest)
    finally:
        imds.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
