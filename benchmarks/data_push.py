"""`cloudtrain data push` and the staging it prepares for, on loopback: a generated tree of
small JPEG-like files pushed as tar shards to moto's S3 server on 127.0.0.1, then downloaded,
verified (sha256 per shard) and extracted as an instance will do it.

Per shard size (256 MB and 16 MB by default) it prints MB/s and files/s of:
  * shard only: the tars streamed into sha256, nothing uploaded (what a second push costs
    besides its HEADs: a push of an unchanged tree reads it once and uploads nothing);
  * push: scan, tar to a temporary file, HEAD + upload (multipart above 64 MB), manifest;
  * push again: the same tree, nothing to upload;
  * stage: manifest, GET every shard (`--workers` at a time), extract_shard (hash while
    reading, write, rename), verify_tree.

moto keeps objects in this process's memory and serves them over plain HTTP on loopback: the
figures are our code's overhead (tar, sha256, temporary files, the transfer manager, moto's
own request handling) against a local moto, NOT S3's or a network's speed. On a 2-core
machine the push, moto and the hashing share the same two cores.

    python benchmarks/data_push.py                       # 2,000 files of 100 KB
    python benchmarks/data_push.py --files 500 --kb 50 --shard-mb 4 --shard-mb 1
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import boto3  # noqa: E402
import requests  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from cloudtrain.host import shards  # noqa: E402
from cloudtrain.providers.aws import datasets as s3_datasets  # noqa: E402
from labs.credentials import CLIENT_CREDS  # noqa: E402
from labs.loopback import free_port  # noqa: E402

REGION, BUCKET, PREFIX = "eu-west-1", "bench-datasets", "imagenet"


def make_tree(root: Path, files: int, kb: int) -> int:
    """`files` files of `kb` KB in 100 class folders: a JPEG start marker, then random bytes
    (JPEG data does not compress, and neither do these). Returns the bytes written."""
    for i in range(files):
        folder = root / "train" / f"n{i % 100:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:06d}.JPEG").write_bytes(b"\xff\xd8\xff\xe0" + os.urandom(kb * 1000 - 4))
    return files * kb * 1000


def rate(nbytes: int, files: int, seconds: float) -> str:
    return (f"{seconds:7.2f} s  {nbytes / 1e6 / seconds:8.1f} MB/s  "
            f"{files / seconds:9.0f} files/s")


def stage(s3, dest: Path, workers: int) -> shards.Manifest:
    manifest = s3_datasets.read_manifest(s3, BUCKET, PREFIX)

    def one(entry):
        body = s3.get_object(Bucket=BUCKET, Key=s3_datasets.shard_key(PREFIX, entry.name))["Body"]
        with body:
            return shards.extract_shard(body, dest, entry)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, manifest.shards))
    shards.verify_tree(dest, manifest)
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--kb", type=int, default=100)
    parser.add_argument("--shard-mb", type=int, action="append")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    sizes = args.shard_mb or [256, 16]

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's one line per request
    work = Path(tempfile.mkdtemp(prefix="data-push-bench-"))
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        tree = work / "tree"
        total = make_tree(tree, args.files, args.kb)
        session = boto3.Session(region_name=REGION, **CLIENT_CREDS)
        s3 = s3_datasets.client(session, REGION, endpoint,
                                args.workers * s3_datasets.PART_THREADS)
        print(f"data push on loopback: {args.files} files of {args.kb} KB "
              f"({total / 1e6:.0f} MB), --workers {args.workers}, against moto "
              f"{_version('moto')} on 127.0.0.1")
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
        print("our code's overhead against a local moto (in-memory, plain HTTP), not S3's "
              "speed\n")
        for shard_mb in sizes:
            requests.post(f"{endpoint}/moto-api/reset", timeout=10)
            s3.create_bucket(Bucket=BUCKET,
                             CreateBucketConfiguration={"LocationConstraint": REGION})
            plans = shards.plan(tree, shard_mb << 20)
            started = time.perf_counter()
            with ThreadPoolExecutor(args.workers) as pool:
                list(pool.map(lambda p: shards.write_shard(tree, p), plans))
            hashed = time.perf_counter() - started

            started = time.perf_counter()
            report = s3_datasets.push(s3, tree, BUCKET, PREFIX, shard_bytes=shard_mb << 20,
                                      workers=args.workers, region=REGION)
            pushed = time.perf_counter() - started
            started = time.perf_counter()
            again = s3_datasets.push(s3, tree, BUCKET, PREFIX, shard_bytes=shard_mb << 20,
                                     workers=args.workers, region=REGION)
            repushed = time.perf_counter() - started
            assert again.uploaded == 0, again

            dest = work / f"staged-{shard_mb}"
            started = time.perf_counter()
            stage(s3, dest, args.workers)
            staged = time.perf_counter() - started
            shutil.rmtree(dest)

            files, nbytes = report.files, report.bytes
            print(f"--shard-mb {shard_mb}: {report.shards} shards of {nbytes / 1e6:.0f} MB in all")
            print(f"  shard only (tar+sha256)    {rate(nbytes, files, hashed)}")
            print(f"  push                       {rate(nbytes, files, pushed)}")
            print(f"  push again (0 uploaded)    {rate(nbytes, files, repushed)}")
            print(f"  stage (GET+verify+extract) {rate(nbytes, files, staged)}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
