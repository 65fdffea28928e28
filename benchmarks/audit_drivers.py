"""One hostile input to one of cloudtrain's readers of untrusted data, in a fresh process:
run by benchmarks/audit_figures.py (audit_harness.Scratch.drive) with cloudtrain on
PYTHONPATH, never by hand.

    audit_drivers.py shard CASE DEST OUTSIDE        shards.extract_shard of a hostile tar
    audit_drivers.py manifest CASE                  shards.Manifest.from_json
    audit_drivers.py jobstore CASE LOCAL OUTSIDE    jobstore_fetch.fetch from moto's S3 (in-process)
    audit_drivers.py KIND ARGS                      audit_drivers_1201.py's (the 2026-12-01 sets)

A refusal the code designed (the reader's own exception) is one line `Error: ...` and exit
1; anything else propagates as a traceback, which the runner counts as one. `FLAW: ...` on
stdout is a promise broken without an exception (a setuid bit kept). Exit 99 with
`harness: ...` is this script failing to build its case.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path


def harness(message: str) -> None:
    sys.stderr.write(f"harness: {message}\n")
    raise SystemExit(99)


def refused(message: str) -> None:
    sys.stderr.write(f"Error: {message}\n")
    raise SystemExit(1)


# -- shards -----------------------------------------------------------------------------------


def _member(name: str, data: bytes = b"x", kind=tarfile.REGTYPE, **attrs) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, len(data), 0o644, 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    if kind not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
        info.size, data = 0, b""
    return info, data


def _tar(members: list[tuple], fmt=tarfile.PAX_FORMAT, encoding="utf-8", **kw) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding=encoding, **kw) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return buf.getvalue()


class Endless:
    """The shard's bytes, then zeros for ever: a server that never stops sending."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        n = 1 << 20 if n is None or n < 0 else n
        head = self.data[self.pos:self.pos + n]
        self.pos += len(head)
        return head + bytes(n - len(head))


def tar_case(case: str, dest: Path, outside: str) -> tuple[bytes, list, dict, object]:
    """(the shard's bytes, its members, changes to its entry, a stream to read instead of
    the bytes or None)."""
    m, override, stream = _member, {}, None
    simple = {
        "member ../evil": [m("../evil")],
        "member ../../../evil": [m("../../../evil")],
        "member absolute into outside": [m(f"{outside}/evil-absolute")],
        "member a/../../../evil": [m("a/../../../evil")],
        "member ./a": [m("./a")],
        "member a//b": [m("a//b")],
        "member .hidden": [m(".hidden")],
        "member .git/x": [m(".git/x")],
        "member with backslash": [m("a\\..\\..\\..\\evil")],
        "member with NUL": [m("a", pax_headers={"path": "a\x00b"})],
        "name of 4097 bytes": [m("d/" * 2048 + "x")],
        "component of 256 bytes": [m("a" * 256)],
        "symlink to outside": [m("link", kind=tarfile.SYMTYPE, linkname=outside)],
        "symlink then write through it": [m("link", kind=tarfile.SYMTYPE, linkname=outside),
                                          m("link/evil-through")],
        "hardlink to /etc/passwd": [m("passwd", kind=tarfile.LNKTYPE, linkname="/etc/passwd")],
        "hardlink to outside": [m("victim", kind=tarfile.LNKTYPE,
                                  linkname=f"{outside}/victim.txt")],
        "char device": [m("zero", kind=tarfile.CHRTYPE, devmajor=1, devminor=5)],
        "block device": [m("disk", kind=tarfile.BLKTYPE, devmajor=8, devminor=0)],
        "FIFO": [m("pipe", kind=tarfile.FIFOTYPE)],
        "directory": [m("folder", kind=tarfile.DIRTYPE), m("folder/a")],
        "contiguous file": [m("contiguous", kind=tarfile.CONTTYPE)],
        "duplicate member": [m("a", b"1"), m("a", b"2")],
        "file and folder": [m("a", b"1"), m("a/b", b"2")],
        "sparse pax key": [m("sparse", pax_headers={
            "GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "sparse",
            "GNU.sparse.realsize": "1"})],
        "pax path override ../evil": [m("fine.txt", pax_headers={"path": "../evil-pax"})],
        "8 MB pax header": [m("big-header", pax_headers={"comment": "x" * (8 << 20)})],
        "setuid file": [m("tool", mode=0o4755)],
        "member non-UTF-8": [m("\xff\xfe-name")],
        "GNU longname ../..": [m("../../" + "x" * 120)],
        "GNU longlink": [m("link", kind=tarfile.SYMTYPE, linkname="/" + "y" * 150)],
        "global pax header": [m("a")],
    }
    good = [m("train/a.jpg", b"A" * 700), m("train/b.jpg", b"B" * 10)]
    members = simple.get(case, [])
    if case == "member non-UTF-8":
        data = _tar(members, fmt=tarfile.USTAR_FORMAT, encoding="latin-1")
    elif case in ("GNU longname ../..", "GNU longlink"):
        data = _tar(members, fmt=tarfile.GNU_FORMAT)
    elif case == "global pax header":
        data = _tar(members, pax_headers={"comment": "global"})
    elif case in simple:
        data = _tar(members)
    elif case.startswith("entry ") or case in ("a good shard (control)", "endless stream",
                                               "truncated tar", "link already in dest"):
        members = good if case != "link already in dest" else [m("sub/evil-via-link")]
        data = _tar(members)
        override = {"entry lies about sha256": {"sha256": "0" * 64},
                    "entry says larger": {"bytes": len(data) + 512},
                    "entry says smaller": {"bytes": len(data) - 512},
                    "entry lies about files": {"files": 1},
                    "entry lies about file bytes": {"file_bytes": 5}}.get(case, {})
        if case == "endless stream":
            stream = Endless(data)
        elif case == "truncated tar":
            stream = io.BytesIO(data[: len(data) // 2])
        elif case == "link already in dest":
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "sub").symlink_to(outside)
    elif case == "garbage bytes":
        data = hashlib.sha256(b"garbage").digest() * 320  # 10,240 bytes, not a tar
        members = [m("?")]
    elif case == "empty stream":
        data, members = b"", [m("?")]
    else:
        harness(f"no such tar case {case!r}")
    return data, members, override, stream


def drive_shard(case: str, dest: str, outside: str) -> None:
    from cloudtrain.host import shards

    dest_path = Path(dest)
    data, members, override, stream = tar_case(case, dest_path, outside)
    entry = {"name": "shard-00000.tar", "files": len(members), "bytes": len(data),
             "file_bytes": sum(len(d) for _, d in members),
             "sha256": hashlib.sha256(data).hexdigest()}
    entry.update(override)
    try:
        count = shards.extract_shard(stream or io.BytesIO(data), dest_path,
                                     shards.ShardEntry(**entry))
    except ValueError as exc:
        refused(str(exc).splitlines()[0])
    for path in dest_path.rglob("*"):
        if path.is_file() and path.stat().st_mode & 0o7000:
            print(f"FLAW: {path.relative_to(dest_path)} kept mode {path.stat().st_mode:o}")
    print(f"extracted {count} files")


# -- manifests --------------------------------------------------------------------------------


def manifest_text(case: str) -> str | bytes:
    from cloudtrain.host import shards

    entries = [shards.ShardEntry(shards.shard_name(i), 2, 4096, 1000, "ab" * 32)
               for i in range(3)]
    doc = json.loads(shards.Manifest.build(1 << 20, entries).to_json())
    if case == "NaN":
        return json.dumps(doc).replace('"bytes": 12288', '"bytes": NaN', 1)
    if case == "5000-digit integer":
        return json.dumps(doc).replace('"files": 6', '"files": ' + "9" * 5000, 1)
    if case == "UTF-16":
        return json.dumps(doc).encode("utf-16")
    if case == "17 MB":
        doc["pad"] = "x" * (17 << 20)
    elif case == "totals that do not add up":
        doc["bytes"] += 512
    elif case == "shard named ../../x.tar":
        doc["shards"][0]["name"] = "../../x.tar"
    elif case == "created 9999-99-99":
        doc["created"] = "9999-99-99T00:00:00Z"
    elif case == "extra keys":
        doc["url"] = "http://169.254.169.254/"
    elif case == "version 2":
        doc["version"] = 2
    elif case == "bool as a count":
        doc["shards"][0]["files"] = True
    elif case == "1e400 bytes":
        return json.dumps(doc).replace('"bytes": 12288', '"bytes": 1e400', 1)
    elif case != "a good manifest (control)":
        harness(f"no such manifest case {case!r}")
    return json.dumps(doc)


def drive_manifest(case: str, text_file: str | None = None) -> None:
    from cloudtrain.host import shards

    text = Path(text_file).read_bytes() if text_file else manifest_text(case)
    try:
        manifest = shards.Manifest.from_json(text)
    except ValueError as exc:
        refused(str(exc).splitlines()[0])
    print(f"a manifest of {len(manifest.shards)} shards")


# -- the job store reader -----------------------------------------------------------------------

BUCKET = "cloudtrain-audit-store"
OWNER = "AIDAAUDITAUDITAUDIT01"
JOB = "a1b2c3d4"


def drive_jobstore(case: str, local: str, outside: str) -> None:
    import boto3
    from moto import mock_aws

    from cloudtrain.providers.aws import jobstore_fetch
    from cloudtrain.errors import CloudtrainError

    from audit_cases import HOSTILE_KEYS

    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1")
    os.environ.pop("AWS_ENDPOINT_URL", None)
    local_dir = Path(local)
    job_id, owner = JOB, OWNER
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        prefix = f"jobs/{OWNER}/{JOB}/"

        def put(rel: str, body: bytes) -> None:
            s3.put_object(Bucket=BUCKET, Key=prefix + rel, Body=body)

        def manifest(files: dict, **extra) -> None:
            put("manifest.json", json.dumps({"files": [
                {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                for p, b in files.items()], **extra}).encode())

        put("status.json", b'{"state": "succeeded"}')
        if case in ("hostile keys, no manifest", "hostile keys listed in a manifest"):
            files = {k: b"evil\n" for k in HOSTILE_KEYS}
            for rel, body in files.items():
                put(rel, body)
            if case.endswith("manifest"):
                manifest({**files, "status.json": b'{"state": "succeeded"}'})
        elif case == "manifest lies about sha256":
            put("output.log", b"the real log\n")
            put("manifest.json", json.dumps({"files": [
                {"path": "output.log", "size": 13, "sha256": "0" * 64}]}).encode())
        elif case == "junk manifest":
            put("manifest.json", b"\x00\xff not json {{{")
        elif case == "manifest a list":
            put("manifest.json", b"[1, 2, 3]")
        elif case == "manifest entry types":
            put("manifest.json", json.dumps({"files": [
                {"path": ["a"], "size": "12", "sha256": None}, {"path": "x"}, 5],
                "skipped": [{"path": 1, "reason": {}}, "x"], "uploaded_at": "noon"}).encode())
        elif case == "link checkpoints -> outside in the local dir":
            local_dir.mkdir(parents=True, exist_ok=True)
            (local_dir / "checkpoints").symlink_to(outside)
            put("checkpoints/evil-through-link", b"evil\n")
            put("checkpoints/victim.txt", b"overwritten\n")
        elif case == "link status.json -> outside":
            local_dir.mkdir(parents=True, exist_ok=True)
            (local_dir / "status.json").symlink_to(f"{outside}/victim.txt")
        elif case == "streamed checkpoints with a hostile latest.json":
            body = b"evil\n"
            manifest({"status.json": b'{"state": "succeeded"}'}, checkpoints_in_stream=True)
            put("stream/a/../../../../x", body)
            put("stream/latest.json", json.dumps({
                "version": 1, "job_id": JOB, "seq": 1, "slot": "a", "step": 1, "epoch": 1,
                "attempt": 1, "step_source": "checkpoint", "taken_at": 1.0, "uploaded_at": 1.0,
                "upload_seconds": 1.0, "final": True, "bytes": len(body), "files": [
                    {"path": "checkpoints/../../../../x", "size": len(body),
                     "sha256": hashlib.sha256(body).hexdigest()}]}).encode())
        elif case.startswith("job id "):
            job_id = {"job id ../x": "../x", "job id a/b": "a/b", "job id ..": "..",
                      "job id ''": "", "job id of 200 characters": "j" * 200}[case]
        elif case == "owner key hostile":
            owner = "../../x"
        else:
            harness(f"no such job store case {case!r}")
        try:
            result = jobstore_fetch.fetch(s3, BUCKET, job_id, local_dir, 1 << 30, owner_key=owner)
        except CloudtrainError as exc:
            refused(exc.message if hasattr(exc, "message") else str(exc))
    for rel, why in result.skipped:
        print(f"skipped {rel!r}: {why}")
    print(f"fetched {len(result.files)} files ({result.bytes} bytes)")


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # audit_cases
    kind, *args = argv
    if kind == "shard":
        drive_shard(*args)
    elif kind == "manifest":
        drive_manifest(*args)
    elif kind == "jobstore":
        drive_jobstore(*args)
    else:  # the sets of the 2026-12-01 audit's new surfaces
        import audit_drivers_1201

        audit_drivers_1201.main(kind, args)


if __name__ == "__main__":
    main(sys.argv[1:])
