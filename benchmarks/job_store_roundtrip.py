"""The S3 job store on loopback: time from a job's end to its results being readable on the
user's machine, against moto's S3 server on 127.0.0.1.

A realistic job directory (a 50 MB checkpoint, a 5 MB log, metrics, status) is uploaded by
the agent's uploader through a presigned POST grant (what the instance does before it powers
off), then fetched by the CLI side: first what `status` and `logs` need, then everything
(what --resume-from needs). Prints per phase the median over the runs, and MB/s.

moto keeps objects in memory in this process and serves them over plain HTTP: the figures
show the code's own overhead (multipart encoding, hashing, validation, the transfer
manager), not S3's or the network's.
Usage: python benchmarks/job_store_roundtrip.py [--runs R] [--checkpoint-mb N] [--log-mb N]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from cloudtrain.host import agent_upload  # noqa: E402
from cloudtrain.providers.aws import jobstore  # noqa: E402
from cloudtrain.providers.aws import jobstore_fetch  # noqa: E402
from labs.credentials import CLIENT_CREDS  # noqa: E402
from labs.loopback import free_port  # noqa: E402

REGION, ACCOUNT = "eu-west-1", "123456789012"
JOB = "bench0001"
KEY = "AIDAJQABLZS4A3QDU576Q"  # the caller's aws:userid (moto answers with its access key)


def make_job(root: Path, checkpoint_mb: int, log_mb: int) -> Path:
    job = root / "job"
    (job / "checkpoints").mkdir(parents=True)
    (job / "checkpoints" / "last.pt").write_bytes(os.urandom(checkpoint_mb << 20))
    line = b"step 1234 loss 0.123456 lr 0.0004 throughput 2345.6 img/s\n"
    (job / "output.log").write_bytes(line * ((log_mb << 20) // len(line)))
    (job / "metrics.jsonl").write_text("".join(
        json.dumps({"epoch": e, "step": e * 100, "train_loss": 1 / (e + 1), "test_acc": 0.9})
        + "\n" for e in range(2000)))
    (job / "job.json").write_text(json.dumps({"job_id": JOB}))
    (job / "status.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))
    return job


class Sink(http.server.BaseHTTPRequestHandler):
    """Reads each POST and answers 204, as S3 does: the uploader's own speed, without moto."""

    def do_POST(self):
        left = int(self.headers["Content-Length"])
        while left:
            left -= len(self.rfile.read(min(left, 1 << 20)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def sink_upload(job: Path, runs: int) -> float:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    grant = {"url": f"http://127.0.0.1:{server.server_address[1]}/", "fields": {},
             "prefix": jobstore.job_prefix(JOB, owner_key=KEY)}
    times = []
    for _ in range(runs):
        result = agent_upload.upload_job(str(job), grant, timeout_s=300)
        assert result["ok"], result
        times.append(result["seconds"])
    server.shutdown()
    server.server_close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--checkpoint-mb", type=int, default=50)
    parser.add_argument("--log-mb", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    try:
        session = boto3.Session(**CLIENT_CREDS,
                                region_name=REGION)
        s3 = jobstore.s3_client(session, REGION, f"http://127.0.0.1:{port}")
        bucket = jobstore.bucket_name(ACCOUNT, REGION)
        started = time.perf_counter()
        jobstore.ensure_bucket(s3, bucket, REGION, f"arn:aws:iam::{ACCOUNT}:user/bench",
                               owner_key=KEY)
        first = time.perf_counter() - started
        started = time.perf_counter()
        jobstore.ensure_bucket(s3, bucket, REGION, f"arn:aws:iam::{ACCOUNT}:user/bench",
                               owner_key=KEY)
        later = time.perf_counter() - started
        # moto denies every object read under a Deny it cannot evaluate (aws:SecureTransport).
        s3.delete_bucket_policy(Bucket=bucket)

        with tempfile.TemporaryDirectory() as tmp:
            job = make_job(Path(tmp), args.checkpoint_mb, args.log_mb)
            total = sum(p.stat().st_size for p in job.rglob("*") if p.is_file())
            upload, status, full = [], [], []
            for run in range(args.runs):
                jobstore.delete_job(s3, bucket, JOB, owner_key=KEY)
                grant = jobstore.upload_grant(s3, bucket, JOB, expires_s=3600,
                                              max_bytes=agent_upload.POST_MAX_BYTES,
                                              owner_key=KEY)
                t0 = time.perf_counter()
                result = agent_upload.upload_job(str(job), grant, timeout_s=300)
                t1 = time.perf_counter()
                assert result["ok"], result
                small = jobstore_fetch.fetch(s3, bucket, JOB, Path(tmp) / f"s{run}", 1 << 30,
                                       only=("status.json", "metrics.jsonl", "output.log"),
                                       owner_key=KEY)
                t2 = time.perf_counter()
                everything = jobstore_fetch.fetch(s3, bucket, JOB, Path(tmp) / f"f{run}", 1 << 30,
                                            owner_key=KEY)
                t3 = time.perf_counter()
                assert small.complete and everything.complete and not everything.skipped
                assert everything.bytes == total
                upload.append(t1 - t0)
                status.append(t2 - t1)
                full.append(t3 - t2)
            alone = sink_upload(job, args.runs)
    finally:
        server.stop()

    mb = total / (1 << 20)
    med = statistics.median
    print(f"job dir: {mb:.1f} MB ({args.checkpoint_mb} MB checkpoint, {args.log_mb} MB log, "
          f"metrics, status); {args.runs} runs, medians; moto S3 on 127.0.0.1")
    print(f"ensure_bucket: first {first * 1000:.0f} ms (create + 5 settings), "
          f"later {later * 1000:.1f} ms (one HeadBucket)")
    print(f"upload (agent, presigned POST):  {med(upload):6.2f} s  {mb / med(upload):6.0f} MB/s")
    print(f"upload into a sink (no moto):    {alone:6.2f} s  {mb / alone:6.0f} MB/s")
    print(f"fetch status+metrics+log:        {med(status):6.2f} s")
    print(f"fetch everything (sha256 check): {med(full):6.2f} s  {mb / med(full):6.0f} MB/s")
    print(f"job end -> status readable:      {med(upload) + med(status):6.2f} s")
    print(f"job end -> checkpoint readable:  {med(upload) + med(full):6.2f} s")


if __name__ == "__main__":
    main()
