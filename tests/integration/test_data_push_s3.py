"""`cloudtrain data push DIR s3://bucket/prefix` against moto's S3 server on 127.0.0.1: a
prepared synthetic ImageNet tree (real JPEGs, hard-linked full-size files, the hidden
.prepare/ folder) goes up as tar shards plus a manifest, comes back shard by shard through
shards.extract_shard equal to the source, and later pushes upload only what changed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import signal
import threading
import time
from pathlib import Path

import boto3
import pytest

from labs.aws import moto_endpoint
from cloudtrain import datasources
from cloudtrain.host import shards
from cloudtrain.errors import CloudtrainError, NotFound, UsageError
from cloudtrain.providers.aws import datasets as s3_datasets
from conftest import REPO, lying_manifest

sys.path.insert(0, str(REPO / "recipes"))
from common import imagenet_files  # noqa: E402
from labs.credentials import CLIENT_CREDS, aws_env
from labs.aws import reset_moto

REGION = "eu-west-1"
BUCKET = "datasets-test"
CREDS = CLIENT_CREDS
ENV = aws_env(REGION)
SHARD = 64 << 10  # small shards: the tree of ~0.3 MB makes several
__all__ = ["moto_endpoint"]  # the server fixture, used by name below


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A prepared ImageNet tree: train/ and val/ at full size (hard links to the source),
    sz/40/ resized copies, and data prepare's hidden .prepare/ folder."""
    base = tmp_path_factory.mktemp("imagenet")
    imagenet_files.write_synthetic_official(base / "src", classes=3, train_per_class=4,
                                            val_per_class=2, seed=3, min_side=48, max_side=96)
    imagenet_files.prepare_imagenet(base / "src", base / "prepared", sizes=(40,), workers=1)
    return base / "prepared"


def _files(root: Path) -> dict[str, str]:
    """{relative path: sha256} of the non-hidden regular files below root."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".")
                                       for part in p.relative_to(root).parts)}


@pytest.fixture
def s3(moto_endpoint):
    reset_moto(moto_endpoint)
    client = s3_datasets.client(boto3.Session(region_name=REGION, **CREDS), REGION,
                                moto_endpoint, 16)
    client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    return client


def _push(s3, root, shard_bytes=SHARD, prefix="imagenet", progress=None):
    return s3_datasets.push(s3, root, BUCKET, prefix, shard_bytes=shard_bytes, workers=3,
                            progress=progress, region=REGION)


def _keys(s3, prefix="imagenet/") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _calls(s3) -> list[str]:
    seen: list[str] = []
    s3.meta.events.register("before-parameter-build.s3",
                            lambda model, params, **kw: seen.append((model.name,
                                                                     params.get("Key", ""))))
    return seen


def _stage(s3, prefix: str, dest: Path) -> shards.Manifest:
    """What an instance will do: read the manifest, then download and extract every shard."""
    manifest = s3_datasets.read_manifest(s3, BUCKET, prefix)
    for entry in manifest.shards:
        body = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/shards/{entry.name}")["Body"]
        shards.extract_shard(body, dest, entry)
    shards.verify_tree(dest, manifest)
    return manifest


def test_a_pushed_tree_comes_back_identical_shard_by_shard(s3, tree, tmp_path):
    seen = []
    report = _push(s3, tree, progress=lambda done, total, stage: seen.append((done, total, stage)))
    source = _files(tree)
    assert report.files == len(source) == 36  # 3 classes x 6 images, full size and 40 px
    assert report.skipped == [(".prepare", "hidden")]
    assert report.uploaded == report.shards >= 3 and report.already == report.deleted == 0
    assert seen == [(i, report.shards, "shards") for i in range(1, report.shards + 1)]

    names = [shards.shard_name(i) for i in range(report.shards)]
    assert sorted(_keys(s3)) == ["imagenet/manifest.json"] + [f"imagenet/shards/{n}"
                                                                for n in names]
    manifest = _stage(s3, "imagenet", tmp_path / "staged")
    assert [s.name for s in manifest.shards] == names
    assert (manifest.files, manifest.file_bytes) == (report.files, report.file_bytes)
    assert manifest.file_bytes == sum((tree / p).stat().st_size for p in source)
    for entry in manifest.shards:
        head = s3.head_object(Bucket=BUCKET, Key=f"imagenet/shards/{entry.name}")
        assert (head["ContentLength"], head["Metadata"]) == (entry.bytes, {"sha256": entry.sha256})
        assert entry.bytes <= SHARD + 20 * 512 or entry.files == 1  # tar records of 10 KiB
    assert _files(tmp_path / "staged") == source
    stored = json.loads(s3.get_object(Bucket=BUCKET, Key="imagenet/manifest.json")["Body"].read())
    assert sorted(stored) == ["bytes", "created", "file_bytes", "files", "folders",
                              "shard_bytes", "shards", "version"]
    assert stored["version"] == 1 and stored["shard_bytes"] == SHARD
    # U41: the folders a launch checks against what the job reads, to three levels
    classes = sorted(p.name for p in (tree / "train").iterdir())
    assert len(classes) == 3 and stored["folders"] == sorted(
        ["sz", "sz/40", "sz/40/train", "sz/40/val", "train", "val"]
        + [f"{split}/{c}" for split in ("train", "val") for c in classes])


def test_pushing_again_uploads_only_the_missing_shard(s3, tree):
    first = _push(s3, tree)
    calls = _calls(s3)
    again = _push(s3, tree)
    assert (again.uploaded, again.already, again.uploaded_bytes) == (0, first.shards, 0)
    assert [c for c in calls if c[0] in ("PutObject", "DeleteObject", "DeleteObjects",
                                         "CreateMultipartUpload")] == \
        [("PutObject", "imagenet/manifest.json")]

    s3.delete_object(Bucket=BUCKET, Key="imagenet/shards/shard-00001.tar")
    calls.clear()
    third = _push(s3, tree)
    assert (third.uploaded, third.already) == (1, first.shards - 1)
    # the old manifest goes before any shard is written, the new one after all of them
    assert [c for c in calls if c[0] in ("PutObject", "DeleteObject")] == [
        ("DeleteObject", "imagenet/manifest.json"),
        ("PutObject", "imagenet/shards/shard-00001.tar"),
        ("PutObject", "imagenet/manifest.json")]


def test_a_changed_shard_object_is_replaced(s3, tree, tmp_path):
    _push(s3, tree)
    s3.put_object(Bucket=BUCKET, Key="imagenet/shards/shard-00002.tar", Body=b"x" * 512,
                  Metadata={"sha256": "0" * 64})
    report = _push(s3, tree)
    assert report.uploaded == 1
    assert _files(_stage_dir(s3, tmp_path)) == _files(tree)


def _stage_dir(s3, tmp_path: Path) -> Path:
    _stage(s3, "imagenet", tmp_path / "staged")
    return tmp_path / "staged"


def test_fewer_shards_delete_the_stale_ones_after_the_manifest(s3, tree, tmp_path):
    many = _push(s3, tree, shard_bytes=SHARD)
    s3.put_object(Bucket=BUCKET, Key="imagenet/shards/notes.txt", Body=b"not ours to delete")
    calls = _calls(s3)
    few = _push(s3, tree, shard_bytes=1 << 20)
    assert few.shards == 1 and few.deleted == many.shards - 1
    writes = [c[0] for c in calls if c[0] in ("PutObject", "DeleteObjects")]
    assert writes == ["PutObject", "PutObject", "DeleteObjects"]  # shard, manifest, stale
    assert sorted(_keys(s3)) == ["imagenet/manifest.json", "imagenet/shards/notes.txt",
                                 "imagenet/shards/shard-00000.tar"]
    assert _files(_stage_dir(s3, tmp_path)) == _files(tree)


def test_a_corrupt_stored_shard_is_refused_at_staging(s3, tree, tmp_path):
    _push(s3, tree)
    key = "imagenet/shards/shard-00000.tar"
    data = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    data[600] ^= 0xFF  # inside the first member's data
    manifest = s3_datasets.read_manifest(s3, BUCKET, "imagenet")
    with pytest.raises(ValueError, match=r"^shard shard-00000.tar is not what the manifest "
                                         r"says: sha256 differs$"):
        shards.extract_shard(io.BytesIO(bytes(data)), tmp_path / "staged", manifest.shards[0])
    assert os.listdir(tmp_path / "staged") == []


def test_a_missing_or_broken_manifest_is_said(s3, tree):
    with pytest.raises(NotFound, match=r"^no dataset at s3://datasets-test/nothing: "):
        s3_datasets.read_manifest(s3, BUCKET, "nothing")
    s3.put_object(Bucket=BUCKET, Key="bad/manifest.json", Body=b'{"version": 1}')
    with pytest.raises(CloudtrainError, match=r"^s3://datasets-test/bad/manifest.json: manifest: "
                                              r"not an object with exactly the keys"):
        s3_datasets.read_manifest(s3, BUCKET, "bad")


def test_f29_a_manifest_of_twelve_5_tib_shards_that_are_not_stored_is_refused(s3):
    """The audit's 12-entry manifest (2 KB): 66 TB claimed, nothing behind it. Read at a
    launch, it took the max runtime past the one-week limit and the disk to 124,345 GB."""
    s3.put_object(Bucket=BUCKET, Key="huge12/manifest.json", Body=lying_manifest(12, 5 << 40))
    with pytest.raises(CloudtrainError) as err:
        s3_datasets.contents(s3, BUCKET, "huge12")
    assert err.value.message == (f"dataset s3://{BUCKET}/huge12: 12 of the 12 shards its "
                                 "manifest lists are not stored (shards/shard-00000.tar first)")
    assert "\n" not in err.value.message + (err.value.hint or "")


def test_f29_a_manifest_of_1000_shards_is_checked_with_one_listing(s3):
    """The audit's 1,000-entry manifest (5 TiB each, 5.5 PB in all): refused from one
    ListObjectsV2 of shards/ (one page here), without a request per shard."""
    s3.put_object(Bucket=BUCKET, Key="huge/manifest.json", Body=lying_manifest(1000, 5 << 40))
    s3.put_object(Bucket=BUCKET, Key="huge/shards/shard-00000.tar", Body=b"x" * 1024)
    calls = _calls(s3)
    with pytest.raises(CloudtrainError, match=r"^dataset s3://datasets-test/huge: 999 of the "
                                              r"1,000 shards its manifest lists are not stored "
                                              r"\(shards/shard-00001.tar first\)$"):
        s3_datasets.contents(s3, BUCKET, "huge")
    assert [c[0] for c in calls] == ["GetObject", "ListObjectsV2"]


def test_f29_stored_shards_smaller_than_the_manifest_says_are_refused(s3, tree):
    """Real shards, pushed; then a manifest that claims each is 5 TiB (sums consistent)."""
    report = _push(s3, tree)
    assert report.shards > 1
    manifest = s3_datasets.read_manifest(s3, BUCKET, "imagenet")
    claimed = 5 << 40
    lie = shards.Manifest.build(claimed, [shards.ShardEntry(
        s.name, s.files, claimed, s.file_bytes, s.sha256) for s in manifest.shards])
    s3.put_object(Bucket=BUCKET, Key="imagenet/manifest.json", Body=lie.to_json().encode())
    first = manifest.shards[0]
    with pytest.raises(CloudtrainError) as err:
        s3_datasets.contents(s3, BUCKET, "imagenet")
    assert err.value.message == (
        f"dataset s3://{BUCKET}/imagenet: shards/{first.name} is {first.bytes:,} bytes, its "
        f"manifest says {claimed:,} ({report.shards} shards differ)")


def test_f29_a_consistent_dataset_is_sized_by_what_s3_stores(s3, tree):
    report = _push(s3, tree)
    found = s3_datasets.contents(s3, BUCKET, "imagenet")
    stored = {k: s3.head_object(Bucket=BUCKET, Key=k)["ContentLength"]
              for k in _keys(s3, "imagenet/shards/")}
    assert found.kind == "shards" and found.bytes == sum(stored.values()) == report.bytes
    assert found.largest == max(stored.values())
    assert found.file_bytes == report.file_bytes <= found.bytes


def test_a_bucket_that_refuses_writes_is_an_error_in_words(s3, tree):
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
            "Resource": f"arn:aws:s3:::{BUCKET}/*"}]}))
    with pytest.raises(CloudtrainError, match=r"^upload of s3://datasets-test/imagenet/shards/"
                                              r"shard-0000\d.tar failed: An error occurred \(403\) "
                                              r"when calling the PutObject operation: Forbidden$"):
        _push(s3, tree)
    assert "imagenet/manifest.json" not in _keys(s3)


@pytest.mark.parametrize("url, said", [
    ("imagenet", "'imagenet' is not an s3://BUCKET/PREFIX address"),
    ("s3://Bad_Bucket/x", "'Bad_Bucket' is not an S3 bucket name"),
    ("s3://ab/x", "'ab' is not an S3 bucket name"),
    ("s3://192.168.1.1/x", "'192.168.1.1' is not an S3 bucket name"),
    ("s3://bucket/a/../b", "'a/../b' is not a prefix cloudtrain writes under"),
    ("s3://bucket/a//b", "'a//b' is not a prefix cloudtrain writes under"),
])
def test_bad_addresses_are_refused(url, said):
    with pytest.raises(UsageError, match="^" + said.replace(".", r"\.").replace("/", "/")):
        datasources.parse_s3_url(url)


def test_addresses_parse():
    assert datasources.parse_s3_url("s3://my-bucket/imagenet/") == ("my-bucket", "imagenet")
    assert datasources.parse_s3_url("s3://my.bucket") == ("my.bucket", "")
    assert datasources.parse_s3_url("s3://b12/a/b c/d") == ("b12", "a/b c/d")


# -- the real command, in its own process --------------------------------------------------


def _cli(endpoint: str | None, *args: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, **ENV, **env}
    full.pop("AWS_PROFILE", None)
    if endpoint:
        full["AWS_ENDPOINT_URL"] = endpoint
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "data", "push", *args],
                          capture_output=True, text=True, env=full, timeout=120, cwd=REPO)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_the_command_pushes_and_says_what_it_did(s3, tree, moto_endpoint, tmp_path):
    proc = _cli(moto_endpoint, str(tree), f"s3://{BUCKET}/cli/imagenet/", "--shard-mb", "1",
                "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    files = len(_files(tree))
    assert re.fullmatch(rf"pushed s3://{BUCKET}/cli/imagenet: {files} files, [0-9.]+ MB in 1 "
                        r"shard \([0-9.]+ MB\); manifest.json written last", lines[0])
    assert re.fullmatch(r"uploaded 1 shard \([0-9.]+ MB, [0-9.]+ MB/s\), 0 already stored; .+",
                        lines[1])
    assert lines[2] == "left out 1: .prepare (hidden)"
    _stage(s3, "cli/imagenet", tmp_path / "staged")
    assert _files(tmp_path / "staged") == _files(tree)
    again = _cli(moto_endpoint, str(tree), f"s3://{BUCKET}/cli/imagenet", "--shard-mb", "1")
    assert again.stdout.splitlines()[1].startswith("uploaded 0 shards (0.0 MB), 1 already "
                                                   "stored; ")


@pytest.mark.parametrize("args, code, error", [
    (["{tree}", "s3://no-such-bucket/x"], 2, "Error: no S3 bucket named no-such-bucket"),
    (["{tree}", "http://x/y"], 2, "Error: 'http://x/y' is not an s3://BUCKET/PREFIX address"),
    (["{tmp}/absent", "s3://datasets-test/x"], 2, "Error: '{tmp}/absent' is not a folder"),
    (["{tree}", "s3://datasets-test/x", "--shard-mb", "0"], 2,
     "Error: --shard-mb must be from 1 to 100000, not 0"),
])
def test_the_command_fails_in_one_line(s3, tree, moto_endpoint, tmp_path, args, code,
                                       error):
    fill = {"tree": str(tree), "tmp": str(tmp_path)}
    proc = _cli(moto_endpoint, *[a.format(**fill) for a in args])
    assert proc.returncode == code
    assert proc.stderr.splitlines()[0] == error.format(**fill)
    assert all(line.startswith(("Error: ", "Hint: ")) for line in proc.stderr.splitlines())
    assert proc.stdout == ""


def test_the_command_without_credentials_says_so(s3, tree, moto_endpoint):
    proc = _cli(moto_endpoint, str(tree), f"s3://{BUCKET}/x",
                AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="")
    assert proc.returncode == 1
    # U21: the hint fits `data push`: it needs credentials, and a launch's dry run is no help
    assert proc.stderr.splitlines() == [
        "Error: no AWS credentials found",
        "Hint: run `aws configure`, or set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY)"]
    assert _keys(s3, "x/") == []


def test_the_command_refuses_a_link_out_of_the_tree(s3, moto_endpoint, tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.jpg").write_bytes(b"jpeg")
    (tree / "passwd").symlink_to("/etc/passwd")
    proc = _cli(moto_endpoint, str(tree), f"s3://{BUCKET}/x")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"Error: passwd links outside {tree} (to /etc/passwd): "
                                        "copy the file in, or remove the link"]
    assert _keys(s3, "x/") == []


def test_an_interrupted_push_stops_its_uploads_and_leaves_no_parts(s3, tmp_path, monkeypatch):
    """Ctrl-C during a push: the uploads under way give up at their next chunk instead of
    running to their end, their multipart uploads are aborted (no parts left billing), and
    no manifest exists (the dataset is not mistaken for complete)."""
    monkeypatch.setattr(s3_datasets, "PART_BYTES", 5 << 20)  # S3's smallest part
    root = tmp_path / "big"
    for i in range(3):
        (root / f"d{i}").mkdir(parents=True)
        (root / f"d{i}" / "blob.bin").write_bytes(os.urandom(24 << 20))  # 5 parts each
    started, finished = [], []

    def slow_part(**kwargs):  # each part takes a moment: the interrupt lands mid-upload
        started.append(1)
        if len(started) == 2:
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C
        time.sleep(0.4)

    s3.meta.events.register("before-call.s3.UploadPart", slow_part)
    s3.meta.events.register("after-call.s3.UploadPart", lambda **kw: finished.append(1))
    with pytest.raises(KeyboardInterrupt):
        _push(s3, root, shard_bytes=32 << 20)
    assert len(finished) < 15 // 2, len(finished)  # all 15 parts went up before the fix
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert "imagenet/manifest.json" not in _keys(s3)
    assert not any(k.startswith("imagenet/shards/") for k in _keys(s3))
