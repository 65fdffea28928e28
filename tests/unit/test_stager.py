"""cloudtrain/host/stager.py and its stage_* modules (plan, SigV4, ranged GETs, the download
run), the on-instance staging of datasets, against moto's S3 server on
127.0.0.1: real shards pushed by `datasets.push`, read back through presigned URLs or requests
signed with credentials from a fake IMDSv2, through proxies that count, check signatures,
answer 503, cut bodies short or trickle."""

from __future__ import annotations

import datetime
import errno
import hashlib
import http.client
import http.server
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from unittest import mock

import boto3
import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.utils import percent_encode
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.aws import moto_endpoint
from labs.imds import FakeIMDS
from labs.loopback import serve
from labs.shipped_host import command
from cloudtrain.host import shards, stage_fetch, awsapi, stager
from cloudtrain.providers.aws import datasets as s3_datasets
from conftest import REPO
from labs.credentials import CLIENT_CREDS
from labs.aws import reset_moto

__all__ = ["moto_endpoint"]  # the server fixture, used by name below
REGION = "us-east-1"
BUCKET = "stage-test"
CREDS = CLIENT_CREDS
SHARD = 64 << 10
MiB = 1 << 20
WHEN = datetime.datetime(2026, 11, 23, 18, 5, 9)
ROLE = {"AccessKeyId": "ASIAROLEKEY", "SecretAccessKey": "role/secret+key",
        "Token": "IQoJb3JpZ2luX2VjE//token+with/slashes=="}


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A few hundred small random files in nested folders (names with spaces, unicode and
    +=&), and one of 2.5 MiB: its shard is read in three ranges of 1 MiB."""
    root = tmp_path_factory.mktemp("tree") / "src"
    rnd = random.Random(7)
    for i in range(300):
        folder = root / ("c%d" % (i % 7)) / ("d%d" % (i % 3))
        folder.mkdir(parents=True, exist_ok=True)
        name = ["f%03d.bin" % i, "with space %d.jpg" % i, "ünï-%d.txt" % i, "a+b=c&d%d" % i][i % 4]
        (folder / name).write_bytes(rnd.randbytes(rnd.randrange(0, 3000)))
    (root / "big.bin").write_bytes(rnd.randbytes(5 * MiB // 2))
    return root


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not any(x.startswith(".") for x in p.relative_to(root).parts)}


@pytest.fixture
def s3(moto_endpoint):
    reset_moto(moto_endpoint)
    client = s3_datasets.client(boto3.Session(region_name=REGION, **CREDS), REGION,
                                moto_endpoint, 16)
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def pushed(s3, tree):
    s3_datasets.push(s3, tree, BUCKET, "imagenet", shard_bytes=SHARD, workers=4, region=REGION)
    return s3_datasets.read_manifest(s3, BUCKET, "imagenet")


def _plan(datasets, workers=4, **kw) -> dict:
    plan = {"version": 1, "workers": workers, "part_bytes": MiB, "progress_s": 0.2,
            "imds_url": "http://127.0.0.1:9", "datasets": datasets}
    plan.update(kw)
    return plan


def _presign(s3, key: str) -> str:
    return s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key},
                                     ExpiresIn=600)


def _shards_dataset(s3, manifest, dest: Path, endpoint: str, auth="presigned",
                    url_base: str | None = None) -> dict:
    text = manifest.to_json()
    d = {"name": "imagenet", "dest": str(dest), "kind": "shards", "bucket": BUCKET,
         "prefix": "imagenet", "region": REGION, "endpoint": endpoint, "auth": auth,
         "identity": hashlib.sha256(text.encode()).hexdigest(), "manifest": json.loads(text)}
    if auth == "presigned":
        urls = [_presign(s3, f"imagenet/shards/{e.name}") for e in manifest.shards]
        if url_base:  # the same links, through a proxy in front of moto
            urls = [url_base + "/" + u.split("/", 3)[3] for u in urls]
        d["shard_urls"] = urls
    return d


def _partial(dest: Path) -> Path:
    """Where the stager builds a copy before it replaces dest whole."""
    return dest.parent / f".{dest.name}.cloudtrain-partial"


def _run(plan, tmp_path, **kw):
    out = io.StringIO()
    status = tmp_path / "status.json"
    code = stager.stage(plan, status, out=out, **kw)
    return code, json.loads(status.read_text()), out.getvalue()


def _failure(capsys) -> str:
    """The stager's one line on stderr (the test servers' own noise, a broken pipe when the
    stager cuts a connection, also lands there and is not the stager's)."""
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("cloudtrain ")]
    assert len(lines) == 1 and lines[0].startswith("cloudtrain staging failed: "), lines
    return lines[0][len("cloudtrain staging failed: "):]


class Proxy:
    """An HTTP/1.1 server in front of moto: records every request, and lets `fault(handler,
    n)` answer instead (n: how many times this path and Range were asked, from 1)."""

    def __init__(self, upstream: str, fault=None):
        self.upstream = upstream.split("//", 1)[1]
        self.fault = fault
        self.seen: list[tuple[str, str, dict]] = []
        self.counts: dict = {}
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                with proxy.lock:
                    proxy.seen.append(("GET", self.path, dict(self.headers)))
                    k = (self.path.split("?")[0], self.headers.get("Range"))
                    proxy.counts[k] = n = proxy.counts.get(k, 0) + 1
                if proxy.fault and proxy.fault(self, n):
                    return
                up = http.client.HTTPConnection(proxy.upstream, timeout=10)
                up.request("GET", self.path, headers={k: v for k, v in self.headers.items()
                                                      if k.lower() != "host"})
                resp = up.getresponse()
                body = resp.read()
                self.send_response(resp.status)
                for h in ("Content-Type", "Content-Range", "ETag"):
                    if resp.getheader(h):
                        self.send_header(h, resp.getheader(h))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                up.close()

        self.url, self.server = serve(Handler)

    def requests_for(self, key: str) -> list:
        return [s for s in self.seen if s[1].split("?")[0] == f"/{BUCKET}/{key}"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _botocore_headers(url: str, creds: dict, when=WHEN, region=REGION) -> dict:
    req = AWSRequest(method="GET", url=url, headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    req.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    auth = S3SigV4Auth(Credentials(creds["AccessKeyId"], creds["SecretAccessKey"],
                                   creds.get("Token")), "s3", region)
    with mock.patch.object(botocore.auth, "get_current_datetime", lambda: when):
        auth.add_auth(req)
    return dict(req.headers)


# -- 1. the signer -------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, ROLE["Token"]])
@pytest.mark.parametrize("bucket, endpoint", [("stage-test", None), ("with.dot", None),
                                              ("stage-test", "http://127.0.0.1:5000")])
def test_sign_get_gives_the_authorization_botocore_gives(token, bucket, endpoint):
    creds = dict(ROLE, Token=token)
    key = "imagenet/train/a file ünï+x=y&z~(1).jpg"
    url = awsapi.object_url(bucket, key, REGION, endpoint)
    mine = awsapi.sign_get(url, REGION, creds, WHEN, {"Range": "bytes=0-9"})
    theirs = _botocore_headers(url, creds)
    assert mine["Authorization"] == theirs["Authorization"]
    assert mine["X-Amz-Date"] == theirs["X-Amz-Date"] == "20261123T180509Z"
    assert mine.get("X-Amz-Security-Token") == theirs.get("X-Amz-Security-Token") == token
    assert mine["Range"] == "bytes=0-9"
    assert url.endswith("/imagenet/train/a%20file%20%C3%BCn%C3%AF%2Bx%3Dy%26z~%281%29.jpg")
    if endpoint:
        assert url.startswith("http://127.0.0.1:5000/stage-test/")
    elif "." in bucket:
        assert url.startswith("https://s3.us-east-1.amazonaws.com/with.dot/")
    else:
        assert url.startswith("https://stage-test.s3.us-east-1.amazonaws.com/")


@settings(max_examples=150, deadline=None)
@given(key=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60),
       token=st.one_of(st.none(), st.text("abc+/=", min_size=1, max_size=20)),
       second=st.integers(0, 10 ** 8))
def test_sign_get_matches_botocore_for_any_key(key, token, second):
    when = datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=second)
    creds = dict(ROLE, Token=token)
    url = awsapi.object_url("stage-test", key, "eu-west-1")
    assert url.split(".amazonaws.com/", 1)[1] == percent_encode(key, safe="/~")
    mine = awsapi.sign_get(url, "eu-west-1", creds, when)
    assert mine["Authorization"] == _botocore_headers(url, creds, when, "eu-west-1")[
        "Authorization"]


# -- 2. shards through presigned links -------------------------------------------------------


def test_shards_staged_through_presigned_links_equal_the_source_and_a_second_run_skips(
        s3, tree, pushed, moto_endpoint, tmp_path):
    dest = tmp_path / "data" / "imagenet"
    plan = _plan([_shards_dataset(s3, pushed, dest, moto_endpoint)])
    code, status, out = _run(plan, tmp_path)
    assert code == 0
    assert _files(dest) == _files(tree)
    assert not (_partial(dest) / ".staging").exists()
    marker = json.loads((dest / ".cloudtrain-staged.json").read_text())
    assert marker["identity"] == plan["datasets"][0]["identity"]
    assert (marker["name"], marker["files"], marker["bytes"]) == ("imagenet", pushed.files,
                                                                  pushed.bytes)
    assert status["state"] == "staged" and status["error"] is None
    assert status["ended_at"] >= status["started_at"]
    (rec,) = status["datasets"]
    assert rec["state"] == "staged" and rec["kind"] == "shards"
    assert (rec["bytes_done"], rec["bytes_total"]) == (pushed.bytes, pushed.bytes)
    assert (rec["files_done"], rec["files_total"]) == (pushed.files, pushed.files)
    assert pushed.files == 301
    assert re.search(r"^cloudtrain staging imagenet: [0-9.]+ of [0-9.]+ GB \(100%\), 301 of "
                     r"301 files, [0-9]+ MB/s, staged$", out, re.M), out

    (dest / "stale.bin").write_bytes(b"of an older version")  # the dataset changes
    newer = json.loads(json.dumps(plan))
    newer["datasets"][0]["identity"] = "ff" * 32
    code, status, _ = _run(newer, tmp_path)
    assert code == 0 and status["datasets"][0]["state"] == "staged"
    assert _files(dest) == _files(tree)  # the older version's files are gone
    assert json.loads((dest / ".cloudtrain-staged.json").read_text())["identity"] == "ff" * 32

    for e in pushed.shards:  # the run after reads nothing: the objects are gone
        s3.delete_object(Bucket=BUCKET, Key=f"imagenet/shards/{e.name}")
    code, status, out = _run(newer, tmp_path)
    assert code == 0 and status["datasets"][0]["state"] == "skipped"
    assert "skipped" in out and _files(dest) == _files(tree)


def test_a_folder_of_files_cloudtrain_did_not_stage_is_never_replaced(
        s3, tree, pushed, moto_endpoint, tmp_path, capsys):
    """The user's own data at the dataset's place (no marker): staging stops before any
    download and names the way out; the files stay as they were."""
    dest = tmp_path / "data" / "imagenet"
    dest.mkdir(parents=True)
    (dest / "mine.jpg").write_bytes(b"the user's")
    code, status, _ = _run(_plan([_shards_dataset(s3, pushed, dest, moto_endpoint)]),
                           tmp_path)
    assert code == 1 and status["state"] == "failed"
    assert _failure(capsys) == (f"{dest} already holds files cloudtrain did not stage: move "
                                f"them away, or read them as they are with --data NAME={dest}")
    assert os.listdir(dest) == ["mine.jpg"] and (dest / "mine.jpg").read_bytes() == b"the user's"
    assert not _partial(dest).exists()


def test_a_failed_copy_leaves_the_staged_version_in_place(s3, tree, pushed, moto_endpoint,
                                                         tmp_path):
    """A newer version whose copy fails (a shard gone) never half-replaces the older copy:
    the job reading it finds the whole older tree, marker and all."""
    dest = tmp_path / "data" / "imagenet"
    plan = _plan([_shards_dataset(s3, pushed, dest, moto_endpoint)])
    assert _run(plan, tmp_path)[0] == 0
    before = _files(dest)
    newer = json.loads(json.dumps(plan))
    newer["datasets"][0]["identity"] = "ee" * 32
    s3.delete_object(Bucket=BUCKET, Key=f"imagenet/shards/{pushed.shards[-1].name}")
    assert _run(newer, tmp_path)[0] == 1
    assert _files(dest) == before
    assert json.loads((dest / ".cloudtrain-staged.json").read_text())["identity"] == \
        plan["datasets"][0]["identity"]


def test_two_stagings_of_one_folder_at_once_copy_it_once(s3, tree, pushed, moto_endpoint,
                                                         tmp_path):
    """Two jobs on one host (the local backend's shared data dir) staging the same dataset:
    one copies, the other waits for it and finds the copy made."""
    dest = tmp_path / "data" / "imagenet"
    proxy = Proxy(moto_endpoint)
    plan = _plan([_shards_dataset(s3, pushed, dest, moto_endpoint, url_base=proxy.url)])
    results = {}

    def one(n):
        out = io.StringIO()
        code = stager.stage(plan, tmp_path / f"status{n}.json", out=out)
        results[n] = (code, json.loads((tmp_path / f"status{n}.json").read_text()),
                      out.getvalue())

    threads = [threading.Thread(target=one, args=(n,)) for n in (1, 2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        proxy.close()
    assert [results[n][0] for n in (1, 2)] == [0, 0]
    states = sorted(results[n][1]["datasets"][0]["state"] for n in (1, 2))
    assert states == ["skipped", "staged"]
    assert any("waiting for another job staging it" in results[n][2] for n in (1, 2))
    assert len(proxy.seen) == len(pushed.shards) + 2  # one copy's GETs, not two
    assert _files(dest) == _files(tree)


# -- 3. the instance role ------------------------------------------------------------------


def test_role_credentials_from_imdsv2_sign_every_request(s3, tree, pushed, moto_endpoint,
                                                          tmp_path):
    imds, proxy = FakeIMDS(creds=ROLE), Proxy(moto_endpoint)
    try:
        dest = tmp_path / "imagenet"
        plan = _plan([_shards_dataset(s3, pushed, dest, proxy.url, auth="role")],
                     imds_url=imds.url)
        code, status, _ = _run(plan, tmp_path)
        assert code == 0, status
        assert _files(dest) == _files(tree)
    finally:
        imds.close()
        proxy.close()
    assert imds.seen[0] == ("PUT", "/latest/api/token", "21600")
    assert imds.seen[1:] == [("GET", "/latest/meta-data/iam/security-credentials/",
                              "imds-token-123"),
                             ("GET", "/latest/meta-data/iam/security-credentials/ct-instance",
                              "imds-token-123")]  # fetched once: they expire in 2099
    assert len(proxy.seen) == len(pushed.shards) + 2  # the 2.5 MiB shard: three ranges
    for _, path, headers in proxy.seen:  # each as botocore would have signed it
        when = datetime.datetime.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
        expect = _botocore_headers(f"http://{headers['Host']}{path}", ROLE, when)
        assert headers["Authorization"] == expect["Authorization"]
        assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=ASIAROLEKEY/")
        assert headers["X-Amz-Security-Token"] == ROLE["Token"]
        assert re.fullmatch(r"bytes=[0-9]+-[0-9]+", headers["Range"])


def test_an_instance_without_a_role_is_told_to_set_instance_profile(s3, pushed, moto_endpoint,
                                                                    tmp_path, capsys):
    imds = FakeIMDS(role=None, creds=ROLE)
    try:
        plan = _plan([_shards_dataset(s3, pushed, tmp_path / "d", moto_endpoint, auth="role")],
                     imds_url=imds.url)
        code, status, _ = _run(plan, tmp_path)
    finally:
        imds.close()
    assert code == 1
    reason = _failure(capsys)
    assert reason == ("the instance has no instance profile: set instance_profile in "
                      "config.yaml (infra/README.md)")
    assert status["state"] == "failed" and status["error"] == reason


# -- 4, 5. bad and missing shards ---------------------------------------------------------


def test_a_corrupt_shard_fails_on_its_sha256_and_leaves_nothing_of_it(s3, tree, pushed,
                                                                      moto_endpoint, tmp_path,
                                                                      capsys):
    victim = pushed.shards[1]
    key = f"imagenet/shards/{victim.name}"
    body = bytes(b ^ 0xFF for b in s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    dest = tmp_path / "imagenet"
    code, status, _ = _run(_plan([_shards_dataset(s3, pushed, dest, moto_endpoint)]), tmp_path)
    assert code == 1
    reason = _failure(capsys)
    assert reason.startswith(f"shard {victim.name} is not what the manifest says: ")
    assert "sha256 differs" in reason or "not a readable tar" in reason
    victim_files = shards.cut(shards.scan(tree)[0], SHARD)[1].files
    assert not any((dest / f.path).exists() for f in victim_files)
    assert not (_partial(dest) / ".staging").exists()
    assert not (dest / ".cloudtrain-staged.json").exists()
    assert status["state"] == "failed" and status["datasets"][0]["state"] == "failed"


def test_a_shard_whose_body_hashes_wrong_is_refused_by_sha256(s3, tree, pushed, moto_endpoint,
                                                               tmp_path, capsys):
    """Flip one byte inside a member's data: still a readable tar, only the hash tells."""
    victim = pushed.shards[0]
    key = f"imagenet/shards/{victim.name}"
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[1024 + 5] ^= 0x01  # the first member's data, after its pax and ustar headers
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    dest = tmp_path / "imagenet"
    code, _, _ = _run(_plan([_shards_dataset(s3, pushed, dest, moto_endpoint)]), tmp_path)
    assert code == 1
    assert _failure(capsys) == (f"shard {victim.name} is not what the manifest says: "
                                "sha256 differs")
    assert not any((dest / f.path).exists()
                   for f in shards.cut(shards.scan(tree)[0], SHARD)[0].files)
    assert not (_partial(dest) / ".staging").exists()


def test_a_missing_shard_is_a_404_naming_its_key_and_is_not_retried(s3, pushed, moto_endpoint,
                                                                     tmp_path, capsys):
    key = f"imagenet/shards/{pushed.shards[2].name}"
    s3.delete_object(Bucket=BUCKET, Key=key)
    proxy = Proxy(moto_endpoint)
    try:
        d = _shards_dataset(s3, pushed, tmp_path / "d", moto_endpoint, url_base=proxy.url)
        code, status, _ = _run(_plan([d]), tmp_path)
    finally:
        proxy.close()
    assert code == 1
    assert _failure(capsys) == (f"no object s3://{BUCKET}/{key} (404): the dataset is not "
                                "where its source says; push it again or fix the source")
    assert len(proxy.requests_for(key)) == 1
    assert not (_partial(tmp_path / "d") / ".staging").exists()


@pytest.mark.parametrize("auth, said", [
    ("presigned", "the presigned link was refused (expired or revoked)"),
    ("role", "the instance role needs s3:GetObject on it (infra/instance-role-policy.json)")])
def test_a_refused_read_says_why_and_is_not_retried(s3, pushed, moto_endpoint, tmp_path,
                                                    capsys, auth, said):
    def denied(handler, n):
        _answer(handler, 403, b"<Error><Code>AccessDenied</Code></Error>")
        return True

    imds, proxy = FakeIMDS(creds=ROLE), Proxy(moto_endpoint, denied)
    try:
        d = _shards_dataset(s3, pushed, tmp_path / "d", proxy.url, auth=auth,
                            url_base=proxy.url)
        code, _, _ = _run(_plan([d], workers=1, imds_url=imds.url), tmp_path)
    finally:
        imds.close()
        proxy.close()
    assert code == 1
    key = f"imagenet/shards/{pushed.shards[0].name}"
    assert _failure(capsys) == f"access denied to s3://{BUCKET}/{key} (403): {said}"
    assert len(proxy.seen) == 1


def test_role_credentials_are_renewed_five_minutes_before_they_expire():
    imds = FakeIMDS(creds=ROLE, expiration="2030-01-01T00:10:00Z")
    expires = datetime.datetime(2030, 1, 1, 0, 10, tzinfo=datetime.timezone.utc).timestamp()
    now = [expires - 3600]
    try:
        creds = awsapi.RoleCredentials(imds.url, clock=lambda: now[0])
        assert creds.get()["AccessKeyId"] == "ASIAROLEKEY"
        now[0] = expires - 301
        creds.get()
        assert len(imds.seen) == 3  # token, role, credentials: once
        now[0] = expires - 299
        assert creds.get()["Token"] == ROLE["Token"]
        assert len(imds.seen) == 6
    finally:
        imds.close()


# -- 6. retries ----------------------------------------------------------------------------


def _answer(handler, code: int, body: bytes = b"") -> None:
    handler.send_response(code)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


SLOWDOWN = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"


def test_503s_and_a_body_cut_short_are_retried_until_staging_succeeds(s3, tree, pushed,
                                                                       moto_endpoint, tmp_path):
    cut = []

    def flaky(handler, n):
        if n <= 2:
            _answer(handler, 503, SLOWDOWN)
            return True
        if n == 3 and not cut:  # once: the headers promise more than the body holds
            cut.append(handler.path)
            a, b = map(int, handler.headers["Range"].split("=")[1].split("-"))
            size = next(e.bytes for e in pushed.shards if e.name in handler.path)
            handler.send_response(206)
            handler.send_header("Content-Length", str(b - a + 1))
            handler.send_header("Content-Range", f"bytes {a}-{min(b, size - 1)}/{size}")
            handler.end_headers()
            handler.wfile.write(b"x" * 10)
            handler.close_connection = True
            return True
        return False

    proxy = Proxy(moto_endpoint, flaky)
    try:
        dest = tmp_path / "imagenet"
        d = _shards_dataset(s3, pushed, dest, moto_endpoint, url_base=proxy.url)
        code, status, _ = _run(_plan([d]), tmp_path, backoff_s=0.001)
    finally:
        proxy.close()
    assert code == 0, status
    assert _files(dest) == _files(tree)
    ranges = len(pushed.shards) + 2
    assert len(proxy.counts) == ranges and cut
    assert sorted(proxy.counts.values()) == [3] * (ranges - 1) + [4]


def test_a_server_that_always_503s_fails_after_bounded_retries(s3, pushed, moto_endpoint,
                                                                tmp_path, capsys):
    def down(handler, n):
        _answer(handler, 503, SLOWDOWN)
        return True

    proxy = Proxy(moto_endpoint, down)
    try:
        d = _shards_dataset(s3, pushed, tmp_path / "d", moto_endpoint, url_base=proxy.url)
        started = time.monotonic()
        code, _, _ = _run(_plan([d], workers=1), tmp_path, backoff_s=0.001)
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert code == 1 and took < 5
    key = f"imagenet/shards/{pushed.shards[0].name}"
    assert _failure(capsys) == (f"reading s3://{BUCKET}/{key} failed 6 times, last: "
                                "HTTP 503 SlowDown")
    assert list(proxy.counts.values()) == [6]  # one try and five retries; no other shard
    assert not (_partial(tmp_path / "d") / ".staging").exists()


# -- 7. kind objects -----------------------------------------------------------------------


def _objects_dataset(s3, files: dict, dest: Path, md5=None) -> dict:
    objects = []
    for path, data in files.items():
        key = f"plain/{path}"
        etag = s3.put_object(Bucket=BUCKET, Key=key, Body=data)["ETag"].strip('"')
        objects.append({"key": key, "path": path, "bytes": len(data),
                        "md5": (md5 or {}).get(path, etag), "url": _presign(s3, key)})
    return {"name": "plain", "dest": str(dest), "kind": "objects", "bucket": BUCKET,
            "prefix": "plain", "region": REGION, "endpoint": None, "auth": "presigned",
            "identity": "ab12", "objects": objects}


def test_plain_objects_are_staged_with_their_md5_checked(s3, tmp_path):
    rnd = random.Random(3)
    files = {"train/a b.jpg": rnd.randbytes(5000), "train/ü/c.bin": rnd.randbytes(3 * MiB + 7),
             "val/empty": b"", "top.txt": b"hello"}
    dest = tmp_path / "plain"
    code, status, _ = _run(_plan([_objects_dataset(s3, files, dest)]), tmp_path)
    assert code == 0, status
    assert {p: (dest / p).read_bytes() for p in files} == files
    assert sorted(_files(dest)) == sorted(files)
    rec = status["datasets"][0]
    assert (rec["files_done"], rec["bytes_done"]) == (4, sum(map(len, files.values())))
    assert json.loads((dest / ".cloudtrain-staged.json").read_text())["identity"] == "ab12"


def test_an_object_with_the_wrong_md5_fails(s3, tmp_path, capsys):
    dest = tmp_path / "plain"
    d = _objects_dataset(s3, {"a.txt": b"hello", "b.txt": b"world"}, dest,
                         md5={"b.txt": "0" * 32})
    code, _, _ = _run(_plan([d]), tmp_path)
    assert code == 1
    assert _failure(capsys) == (f"s3://{BUCKET}/plain/b.txt is not what its listing says: md5 "
                                f"{hashlib.md5(b'world').hexdigest()}, not {'0' * 32}")
    assert not (dest / "b.txt").exists() and not (_partial(dest) / ".staging").exists()


def test_a_kms_encrypted_object_is_size_checked_not_md5_checked(s3, tmp_path):
    """S3's ETag of an SSE-KMS object is not the MD5 of its bytes (here: a listing's ETag
    that is not); S3 says on the GET that the object is KMS-encrypted, and only its size is
    checked then. An unencrypted object with the same wrong ETag still fails (test above)."""
    dest = tmp_path / "plain"
    key = "plain/k.bin"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"secret bytes", ServerSideEncryption="aws:kms")
    d = {"name": "plain", "dest": str(dest), "kind": "objects", "bucket": BUCKET,
         "prefix": "plain", "region": REGION, "endpoint": None, "auth": "presigned",
         "identity": "cd34", "objects": [{"key": key, "path": "k.bin", "bytes": 12,
                                          "md5": "1" * 32, "url": _presign(s3, key)}]}
    code, status, _ = _run(_plan([d]), tmp_path)
    assert code == 0, status
    assert (dest / "k.bin").read_bytes() == b"secret bytes"


def test_an_object_path_out_of_dest_is_refused(s3, tmp_path, capsys):
    d = _objects_dataset(s3, {"../x": b"evil"}, tmp_path / "plain")
    code, _, _ = _run(_plan([d]), tmp_path)
    assert code == 1
    assert _failure(capsys) == ("plan: dataset plain: object 0: unsafe path '../x': an empty, "
                                "'.' or '..' component")
    assert not (tmp_path / "x").exists()


# -- 8. kind path --------------------------------------------------------------------------


def test_a_dataset_already_on_the_host_is_linked(tmp_path, capsys):
    src = tmp_path / "mnt" / "imagenet"
    src.mkdir(parents=True)
    (src / "a").write_text("a")
    dest = tmp_path / "data" / "imagenet"
    d = {"name": "imagenet", "dest": str(dest), "kind": "path", "path": str(src)}
    for _ in range(2):  # again: the link is there already
        code, status, out = _run(_plan([d]), tmp_path)
        assert code == 0 and status["datasets"][0]["state"] == "staged"
        assert dest.is_symlink() and os.readlink(dest) == str(src)
        # U60: it said `staging imagenet: 0.0 of 0.0 GB (100%), 0 of 0 files, 0 MB/s, staged`
        assert out == f"cloudtrain staging imagenet: linked {src}\n"
    (dest.parent / "real").mkdir()
    d["dest"] = str(dest.parent / "real")
    code, _, _ = _run(_plan([d]), tmp_path)
    assert code == 1
    assert _failure(capsys) == (f"{dest.parent / 'real'} already exists and is not a link to "
                                f"{src}: move it away or choose another dest")
    d["path"] = str(tmp_path / "absent")
    d["dest"] = str(dest)
    code, _, _ = _run(_plan([d]), tmp_path)
    assert code == 1 and "absent is not a folder on this host" in _failure(capsys)


# -- 9. disk full --------------------------------------------------------------------------


def test_a_full_disk_says_how_far_it_got_and_what_to_do(s3, pushed, moto_endpoint, tmp_path,
                                                        capsys, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(stage_fetch.os, "pwrite", full)
    dest = tmp_path / "imagenet"
    code, status, _ = _run(_plan([_shards_dataset(s3, pushed, dest, moto_endpoint)]), tmp_path)
    assert code == 1
    reason = _failure(capsys)
    assert reason == (f"no space left on {dest} after 0 of {pushed.bytes} bytes: give the "
                      "instance a larger disk (--disk-gb)")
    assert status["error"] == reason and not (_partial(dest) / ".staging").exists()


# -- 10. SIGTERM ---------------------------------------------------------------------------


def test_sigterm_stops_a_slow_staging_promptly_and_cleans_up(tmp_path):
    """Run as a plain script (shards.py imported from beside it), against a server that
    trickles its bodies."""
    asked = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            asked.set()
            a, b = map(int, self.headers["Range"].split("=")[1].split("-"))
            self.send_response(206)
            self.send_header("Content-Length", str(b - a + 1))
            self.send_header("Content-Range", f"bytes {a}-{b}/{2 * MiB}")
            self.end_headers()
            try:
                for _ in range(b - a + 1):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass

    url, server = serve(Trickle)
    dest = tmp_path / "slow"
    plan = _plan([{"name": "slow", "dest": str(dest), "kind": "objects", "bucket": BUCKET,
                   "prefix": "", "region": REGION, "endpoint": None, "auth": "presigned",
                   "identity": "01", "objects": [{"key": "big", "path": "big", "bytes": 2 * MiB,
                                                  "md5": None, "url": url + "/big?sig=1"}]}],
                 progress_s=0.2)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    status = tmp_path / "status.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([sys.executable, command("stager"),
                             str(tmp_path / "plan.json"), str(status)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert asked.wait(10), proc.communicate(timeout=5)
        time.sleep(0.5)
        assert (_partial(dest) / ".staging").is_dir()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=5)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        server.shutdown()
        server.server_close()
    assert proc.returncode == 143 and took < 3, (proc.returncode, took, err)
    assert err.splitlines() == ["cloudtrain staging failed: interrupted"]
    assert "cloudtrain staging slow: " in out
    doc = json.loads(status.read_text())
    assert (doc["state"], doc["error"]) == ("failed", "interrupted")
    assert doc["datasets"][0]["state"] == "failed"
    assert not (_partial(dest) / ".staging").exists() and not (dest / "big").exists()


# -- 11. F38: edge inputs -------------------------------------------------------------------


@pytest.mark.parametrize("plan", [[], None, 3, "plan", [{"workers": 4}]])
def test_F38_a_plan_that_is_not_an_object_is_a_designed_error(plan, tmp_path, capsys):
    code, status, _ = _run(plan, tmp_path)
    assert code == 1 and status["state"] == "failed"
    assert _failure(capsys) == "plan: not a JSON object"


def test_F38_an_object_that_is_also_a_folder_names_both_objects(s3, tmp_path, capsys):
    """A plain prefix holding p/a and p/a/b: no file can be both; the error names the two
    objects, not `.staging/obj-0: Is a directory`."""
    d = _objects_dataset(s3, {"a": b"file", "a/b": b"under it", "c": b"fine"},
                         tmp_path / "plain")
    code, _, _ = _run(_plan([d]), tmp_path)
    assert code == 1
    assert _failure(capsys) == ("plan: dataset plain: objects s3://%s/plain/a and "
                                "s3://%s/plain/a/b: a/b needs a as a folder, and a is a file"
                                % (BUCKET, BUCKET))


class _OneByteASecond(http.server.BaseHTTPRequestHandler):
    """A connection that delivers one byte a second: never silent long enough for a socket
    timeout, never done."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        a, b = map(int, self.headers["Range"].split("=")[1].split("-"))
        self.send_response(206)
        self.send_header("Content-Length", str(b - a + 1))
        self.send_header("Content-Range", f"bytes {a}-{b}/{b - a + 1}")
        self.end_headers()
        try:
            for _ in range(b - a + 1):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(1.0)
        except OSError:
            pass


def _trickled(tmp_path, size: int) -> dict:
    url, server = serve(_OneByteASecond)
    plan = _plan([{"name": "slow", "dest": str(tmp_path / "slow"), "kind": "objects",
                   "bucket": BUCKET, "prefix": "", "region": REGION, "endpoint": None,
                   "auth": "presigned", "identity": "01",
                   "objects": [{"key": "big", "path": "big", "bytes": size, "md5": None,
                                "url": url + "/big?sig=1"}]}])
    return plan, server


@pytest.mark.parametrize("bound", ["stall", "deadline"])
def test_F38_a_trickling_connection_is_retried_then_fails_with_its_reason(
        bound, tmp_path, capsys, monkeypatch):
    """F38: one byte a second kept a range alive for ever (the only bound was 60 s per socket
    read). A stall detector (under STALL_BYTES in STALL_S) and a deadline per range (its bytes
    at FLOOR_RATE, plus RANGE_MIN_S) end each try; after the retries, a clear reason. The
    bounds are made short here; their defaults are the same code."""
    monkeypatch.setattr(stage_fetch, "RETRIES", 1)
    if bound == "stall":
        monkeypatch.setattr(stage_fetch, "STALL_S", 1.5)
    else:  # the stall detector satisfied by a byte a second; the range's deadline is not
        monkeypatch.setattr(stage_fetch, "STALL_BYTES", 1)
        monkeypatch.setattr(stage_fetch, "RANGE_MIN_S", 2.0)
    plan, server = _trickled(tmp_path, 100)
    started = time.monotonic()
    try:
        code, status, _ = _run(plan, tmp_path, backoff_s=0.01)
    finally:
        server.shutdown()
        server.server_close()
    took = time.monotonic() - started
    assert code == 1 and took < 20, took
    reason = _failure(capsys)
    assert reason.startswith("reading s3://%s/big failed 2 times, last: " % BUCKET), reason
    if bound == "stall":
        assert re.search(r"stalled: \d byte\(s\) in 1\.5 s", reason), reason
    else:
        assert re.search(r"\d+ of 100 bytes in 2 s: slower than 1 MB/s", reason), reason
    assert not (_partial(tmp_path / "slow") / ".staging").exists()


def test_F38_the_default_bounds_end_a_trickle_in_minutes_not_never():
    """The defaults: a 1 MiB part gets RANGE_MIN_S + about a second; silence or a trickle for
    STALL_S ends a try; RETRIES + 1 tries of at most that are a few minutes."""
    assert stage_fetch.FLOOR_RATE == 1_000_000 and 10 <= stage_fetch.RANGE_MIN_S <= 60
    assert stage_fetch.STALL_S <= 30 and stage_fetch.STALL_BYTES >= 1024
    assert (stage_fetch.RETRIES + 1) * stage_fetch.STALL_S + stage_fetch.RETRIES * stage_fetch.BACKOFF_CAP_S < 300


@settings(max_examples=60, deadline=None)
@given(name=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
       token=st.one_of(st.none(), st.text("abc+/=", min_size=1, max_size=20)),
       service=st.sampled_from(["autoscaling", "ec2"]))
def test_sign_request_signs_a_query_api_call_as_botocore_does(name, token, service):
    """The Auto Scaling and EC2 calls of host/auto_scaling.py: a GET whose query string holds
    the parameters, the payload's sha256 signed (those services refuse UNSIGNED-PAYLOAD)."""
    from botocore.auth import SigV4Auth

    creds = dict(ROLE, Token=token)
    query = urllib.parse.urlencode({"Action": "DeleteAutoScalingGroup", "Version": "2011-01-01",
                                    "AutoScalingGroupName": name, "ForceDelete": "true"},
                                   quote_via=urllib.parse.quote, safe="-_.~")
    url = f"https://{service}.eu-west-1.amazonaws.com/?{query}"
    mine = awsapi.sign_request("GET", url, "eu-west-1", creds, WHEN, service)
    req = AWSRequest(method="GET", url=url)
    auth = SigV4Auth(Credentials(creds["AccessKeyId"], creds["SecretAccessKey"],
                                 creds.get("Token")), service, "eu-west-1")
    with mock.patch.object(botocore.auth, "get_current_datetime", lambda: WHEN):
        auth.add_auth(req)
    assert mine["Authorization"] == req.headers["Authorization"]
    assert "X-Amz-Content-SHA256" not in mine


# -- 12. RG5: onto the local NVMe the image mounts, or back onto the root volume -------------------

can_mount = pytest.mark.skipif(
    os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"],
                                        capture_output=True).returncode != 0,
    reason="mounts a folder in a mount namespace of its own (root, unshare)")


def _nvme_plan(s3, pushed, tmp_path, endpoint, mount: Path, need_bytes: int = 1 << 20) -> dict:
    """A plan that copies the pushed tree onto the NVMe mounted at `mount` (as the Deep
    Learning AMI's is at /opt/dlami/nvme), linked from its dest in the root volume's data dir."""
    dest = tmp_path / "data" / "imagenet"
    d = _shards_dataset(s3, pushed, dest, endpoint)
    d.update(scratch_dest=str(mount / "cloudtrain" / "data" / "imagenet"), need_bytes=need_bytes)
    return _plan([d], scratch={"mount": str(mount), "dir": str(mount / "cloudtrain" / "data")})


def _run_mounted(plan: dict, tmp_path: Path, disk: Path, mount: Path, read_only=False):
    """The stager as a host runs it, in a mount namespace where `disk` is mounted at `mount`
    (read-only if asked): (exit code, status, stdout, stderr). What it wrote through the mount
    is in `disk` afterwards."""
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    status = tmp_path / "status.json"
    mounts = f"mount --bind {disk} {mount}" + (
        f" && mount -o remount,bind,ro {mount}" if read_only else "")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f"{mounts} && exec \"$@\"", "sh",
                           sys.executable, command("stager"), str(tmp_path / "plan.json"),
                           str(status)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, json.loads(status.read_text()), proc.stdout, proc.stderr


@can_mount
def test_RG5_the_copy_goes_onto_the_mounted_nvme_and_the_data_dir_links_to_it(
        s3, tree, pushed, moto_endpoint, tmp_path):
    """RG5: with the local NVMe mounted where the plan says, the copy lands on it (the disk
    behind the mount holds every file) and the dataset's place in the data dir (what
    $CLOUDTRAIN_DATA_DIR/imagenet names) is a link to it; the status and the log say so.
    A second run finds it there, through the link, and copies nothing."""
    disk, mount = tmp_path / "nvme-disk", tmp_path / "opt-dlami-nvme"
    disk.mkdir()
    mount.mkdir()
    plan = _nvme_plan(s3, pushed, tmp_path, moto_endpoint, mount)
    code, status, out, err = _run_mounted(plan, tmp_path, disk, mount)
    assert code == 0, err
    on_disk = disk / "cloudtrain" / "data" / "imagenet"
    assert _files(on_disk) == _files(tree)
    dest = tmp_path / "data" / "imagenet"
    assert dest.is_symlink() and os.readlink(dest) == str(mount / "cloudtrain/data/imagenet")
    assert not (tmp_path / "data" / ".imagenet.cloudtrain-partial").exists()
    assert status["disk"] == {"local": True, "path": str(mount / "cloudtrain" / "data"),
                              "note": None}
    assert out.startswith(f"cloudtrain staging: onto the local NVMe at {mount}/cloudtrain/data"
                          " ("), out
    assert status["datasets"][0]["state"] == "staged"
    for e in pushed.shards:  # the run after reads nothing: the objects are gone
        s3.delete_object(Bucket=BUCKET, Key=f"imagenet/shards/{e.name}")
    code, status, out, err = _run_mounted(plan, tmp_path, disk, mount)
    assert code == 0 and status["datasets"][0]["state"] == "skipped", err


@can_mount
@pytest.mark.parametrize("read_only, need, said", [
    (True, 1 << 20, "cannot make {dir}: Read-only file system"),
    (False, 10**18, "{mount} has {free} GB free, the copy needs 1000000000.0 GB"),
])
def test_RG5_an_nvme_that_cannot_take_the_copy_falls_back_to_the_root_volume_and_says_why(
        s3, tree, pushed, moto_endpoint, tmp_path, read_only, need, said):
    """RG5: mounted but read-only, or without the room the copy needs: the copy goes into
    the root volume's data dir as it did before, and the log and the status say why."""
    disk, mount = tmp_path / "nvme-disk", tmp_path / "opt-dlami-nvme"
    disk.mkdir()
    mount.mkdir()
    plan = _nvme_plan(s3, pushed, tmp_path, moto_endpoint, mount, need_bytes=need)
    code, status, out, err = _run_mounted(plan, tmp_path, disk, mount, read_only=read_only)
    assert code == 0, err
    dest = tmp_path / "data" / "imagenet"
    assert not dest.is_symlink() and _files(dest) == _files(tree)
    assert not (disk / "cloudtrain" / "data" / "imagenet").exists()
    note = status["disk"]["note"]
    free = re.search(r"has ([0-9.,]+) GB free", note).group(1) if not read_only else ""
    assert note == said.format(dir=mount / "cloudtrain" / "data", mount=mount, free=free), note
    assert status["disk"] == {"local": False, "path": str(tmp_path / "data"), "note": note}
    assert (f"cloudtrain staging: not onto the local NVMe ({note}): onto the root volume at "
            f"{tmp_path / 'data'} instead") in out, out


@pytest.mark.parametrize("mount_is, said", [
    ("absent", "{mount} is not there (the image did not mount the local NVMe)"),
    ("a plain folder", "{mount} is not a mounted volume (the image did not mount the local "
                       "NVMe there): a copy there would fill the root volume"),
])
def test_RG5_no_nvme_mounted_at_run_time_the_copy_goes_onto_the_root_volume(
        s3, tree, pushed, moto_endpoint, tmp_path, mount_is, said):
    """RG5: the plan expected the DLAMI's NVMe, and the instance has none mounted there (the
    folder missing, or a folder of the root volume's own): the copy goes to the data dir as
    before, said; nothing is written below the would-be mount."""
    mount = tmp_path / "opt-dlami-nvme"
    if mount_is == "a plain folder":
        mount.mkdir()
    code, status, out = _run(_nvme_plan(s3, pushed, tmp_path, moto_endpoint, mount), tmp_path)
    assert code == 0
    dest = tmp_path / "data" / "imagenet"
    assert not dest.is_symlink() and _files(dest) == _files(tree)
    assert status["disk"]["note"] == said.format(mount=mount)
    assert not (mount / "cloudtrain").exists()
    assert "onto the root volume at" in out


def test_RG5_a_root_volume_too_small_for_the_fallback_fails_before_downloading(
        s3, pushed, moto_endpoint, tmp_path, capsys, monkeypatch):
    """RG5: the root volume was not sized for a copy planned onto the NVMe: when the NVMe is
    missing and the root volume cannot hold even the files, the staging fails at once,
    saying both, rather than after filling the disk."""
    from cloudtrain.host import stage_disk

    monkeypatch.setattr(stage_disk, "free_bytes", lambda path: 1000)
    mount = tmp_path / "opt-dlami-nvme"
    plan = _nvme_plan(s3, pushed, tmp_path, moto_endpoint, mount)
    code, status, _ = _run(plan, tmp_path)
    assert code == 1 and status["state"] == "failed"
    assert _failure(capsys) == (
        f"not onto the local NVMe ({mount} is not there (the image did not mount the local "
        f"NVMe)), and the root volume has 0.0 MB free at {tmp_path / 'data'} for the "
        f"{pushed.file_bytes / 1e6:.1f} MB of files: launch on a type whose local NVMe holds "
        "them, or with a --disk-gb that does")
    assert not (tmp_path / "data" / "imagenet").exists()


def test_RG5_a_root_owned_nvme_is_made_writable_with_sudo_or_left(
        s3, tree, pushed, moto_endpoint, tmp_path, monkeypatch):
    """RG5: the job's user may not write to the mount's root (who owns it is the image's
    choice): the stager makes its folder there with `sudo -n install -d -o USER`, as the
    DLAMI's default user may; where sudo refuses, the copy goes onto the root volume."""
    from cloudtrain.host import stage_disk

    calls = tmp_path / "sudo-calls"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sudo").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {calls}\n"
                               "[ \"$CT_SUDO\" = yes ] || { echo 'sudo: a password is "
                               "required' >&2; exit 1; }\nshift; exec \"$@\"\n")
    (fake / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    mount = Path("/dev/shm")  # a real mount point, writable, standing in for the NVMe
    assert os.path.ismount(mount)
    scratch = mount / f"ct-test-{os.getpid()}-{random.randrange(1 << 30)}"
    real_makedirs = os.makedirs

    def refused(path, *a, **kw):  # the job's user may not write below the mount's root
        if str(path) in (str(scratch), str(scratch / "data")) and not os.path.isdir(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_makedirs(path, *a, **kw)

    monkeypatch.setattr(stage_disk.os, "makedirs", refused)
    try:
        plan = _nvme_plan(s3, pushed, tmp_path, moto_endpoint, mount)
        plan["scratch"]["dir"] = str(scratch / "data")
        plan["datasets"][0]["scratch_dest"] = str(scratch / "data" / "imagenet")
        code, status, out = _run(plan, tmp_path)
        assert code == 0 and status["disk"]["local"] is False
        assert status["disk"]["note"] == (f"cannot make {scratch / 'data'}: Permission denied "
                                          "(sudo -n: sudo: a password is required)")
        uid, gid = os.getuid(), os.getgid()
        assert calls.read_text().split() == ["-n", "install", "-d", "-o", str(uid), "-g",
                                             str(gid), "-m", "0755", str(scratch / "data")]
        monkeypatch.setenv("CT_SUDO", "yes")
        (tmp_path / "data" / "imagenet").rename(tmp_path / "older")  # not this test's point
        code, status, out = _run(plan, tmp_path)
        assert code == 0 and status["disk"] == {"local": True, "path": str(scratch / "data"),
                                                "note": None}
        assert _files(scratch / "data" / "imagenet") == _files(tree)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("change, said", [
    ({"scratch": {"mount": "opt/dlami/nvme", "dir": "/opt/dlami/nvme/x"}},
     "plan: scratch mount is not an absolute path"),
    ({"scratch": {"mount": "/opt/dlami/nvme", "dir": "/opt/other"}},
     "plan: scratch dir is not a folder below its mount"),
    ({"dataset": {"scratch_dest": "/elsewhere/imagenet"}},
     "plan: dataset imagenet: scratch_dest is not a folder below the scratch dir"),
    ({"dataset": {"need_bytes": -1}}, "plan: dataset imagenet: need_bytes is not a size"),
    ({"no scratch": True}, "plan: dataset imagenet: scratch_dest without a scratch"),
])
def test_RG5_the_plan_s_scratch_fields_are_checked(s3, pushed, moto_endpoint, tmp_path, capsys,
                                                   change, said):
    plan = _nvme_plan(s3, pushed, tmp_path, moto_endpoint, Path("/opt/dlami/nvme"))
    plan["datasets"][0]["scratch_dest"] = "/opt/dlami/nvme/cloudtrain/data/imagenet"
    if "scratch" in change:
        plan["scratch"] = change["scratch"]
    plan["datasets"][0].update(change.get("dataset", {}))
    if "no scratch" in change:
        del plan["scratch"]
    code, status, _ = _run(plan, tmp_path)
    assert code == 1 and _failure(capsys) == said
