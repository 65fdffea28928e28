"""host/bootstrap.py's checks, and the bundle the orchestrator builds for it
(lifecycle/scripts.bundle_parts, providers/aws/jobbundle.manifest): what an instance accepts
from the job store before it starts a job by itself (issue 27, item 1); and what the bundle
reader takes from a listing of attempts/ (Bundle.list_keys, host/regroup.py's)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from cloudtrain.errors import UsageError
from cloudtrain.gitignore import list_files
from cloudtrain.host import bootstrap, bundle_reader
from cloudtrain.hosts import agent_dir, host_files
from cloudtrain.lifecycle import scripts
from cloudtrain.local_host import LocalHost
from cloudtrain.providers.aws import jobbundle

JOBDIR = "/home/ubuntu/.cloudtrain/jobs/j1"
SHA = "0" * 64


def good_manifest(**over) -> dict:
    objects = [{"name": n, "size": 10, "sha256": SHA} for n in
               ("files.tar", "start.sh", "job/run.sh", "job/job.json", "agent/agent.py")]
    return {"version": 1, "job_id": "j1", "jobdir": JOBDIR, "agent_dir": "agent-0123456789ab",
            "archive": {"files": 1, "bytes": 10}, "objects": objects, **over}


# -- names -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.",
                                  "a\nb", "a\x00b", "", ".bundle/x", "a/" * 70 + "x"])
def test_unsafe_member_names_are_refused(name):
    assert bootstrap.check_name(name) is not None


@pytest.mark.parametrize("name", ["work/train.py", "recipes/resnet9/recipe.yaml", "a b/ü.txt",
                                  "work/..hidden", "work/.gitignore"])
def test_ordinary_member_names_are_taken(name):
    assert bootstrap.check_name(name) is None


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=60))
def test_every_name_taken_stays_below_the_job_directory(name):
    """Whatever the name, one that is taken joins the job directory below it, without a NUL
    or a line break (the job directory's own folder for the bundle is never named)."""
    if bootstrap.check_name(name) is None:
        joined = os.path.normpath(os.path.join(JOBDIR, name))
        assert joined.startswith(JOBDIR + "/")
        assert not any(c in name for c in "\x00\n\r")
        assert not joined.startswith(f"{JOBDIR}/{bootstrap.STAGING}/")


# -- the manifest ----------------------------------------------------------------------------

def test_a_good_manifest_is_read():
    objects, counts, agent = bootstrap.check_manifest(good_manifest(), JOBDIR)
    assert set(objects) == {"files.tar", "start.sh", "job/run.sh", "job/job.json",
                            "agent/agent.py"}
    assert counts == (1, 10) and agent == "agent-0123456789ab"


def _with_object(**item):
    doc = good_manifest()
    doc["objects"].append({"name": "job/x", "size": 1, "sha256": SHA, **item})
    return doc


@pytest.mark.parametrize("doc, words", [
    (good_manifest(version=2), "version"),
    (good_manifest(jobdir="/tmp/other"), "job directory"),
    (good_manifest(agent_dir="../../etc"), "agent directory"),
    (good_manifest(archive={"files": -1, "bytes": 1}), "archive"),
    (good_manifest(archive={"files": 10**9, "bytes": 1}), "archive"),
    (good_manifest(objects=[]), "objects"),
    (_with_object(name="job/../../x"), "named"),
    (_with_object(name="agent/evil.sh"), "named"),
    (_with_object(name="job/.hidden"), "named"),
    (_with_object(name="job/run.sh"), "twice"),
    (_with_object(size=bootstrap.FILE_MAX_BYTES + 1), "size"),
    (_with_object(size=True), "size"),
    (_with_object(sha256="xyz"), "sha256"),
    ({**good_manifest(), "objects": good_manifest()["objects"][1:]}, "no files.tar"),
    ([], "version"),
])
def test_a_manifest_not_ours_is_refused(doc, words):
    with pytest.raises(bootstrap.Failed) as err:
        bootstrap.check_manifest(doc, JOBDIR)
    assert err.value.code == bootstrap.EXIT_MANIFEST and words in str(err.value)


# -- the archive -----------------------------------------------------------------------------

def tar_of(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    path = tmp_path / "files.tar"
    with tarfile.open(path, mode="w") as tar:
        for info, data in members:
            if info.isreg():
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def reg(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


def test_an_archive_is_unpacked_with_its_modes_and_nothing_more(tmp_path):
    tar = tar_of(tmp_path, (reg("work/run.py", 0o755), b"print(1)"), (reg("work/a/b.txt"), b"b"))
    root = tmp_path / "job"
    root.mkdir()
    members = bootstrap.check_archive(tar, 2, 9)
    bootstrap.unpack(tar, members, str(root))
    assert (root / "work/run.py").read_bytes() == b"print(1)"
    assert os.access(root / "work/run.py", os.X_OK)
    assert not os.access(root / "work/a/b.txt", os.X_OK)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == \
        ["work", "work/a", "work/a/b.txt", "work/run.py"]


@pytest.mark.parametrize("files, nbytes", [(1, 9), (2, 8), (3, 9), (2, 10)])
def test_an_archive_other_than_its_manifest_says_is_refused(tmp_path, files, nbytes):
    tar = tar_of(tmp_path, (reg("work/run.py"), b"print(1)"), (reg("work/b"), b"b"))
    with pytest.raises(bootstrap.Failed) as err:
        bootstrap.check_archive(tar, files, nbytes)
    assert err.value.code == bootstrap.EXIT_ARCHIVE


def _typed(name, kind, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("member, words", [
    (_typed("work/l", tarfile.SYMTYPE, "/etc/passwd"), "a link"),
    (_typed("work/h", tarfile.LNKTYPE, "work/a"), "a link"),
    (_typed("work/f", tarfile.FIFOTYPE), "not a regular file"),
    (_typed("work/d", tarfile.CHRTYPE), "not a regular file"),
    (_typed("work/dir", tarfile.DIRTYPE), "a folder"),
    (reg("../escape"), "`..`"),
    (reg("work/a"), "twice"),
])
def test_an_archive_member_not_a_safe_file_is_refused(tmp_path, member, words):
    tar = tar_of(tmp_path, (reg("work/a"), b"a"), (member, b"x" if member.isreg() else b""))
    with pytest.raises(bootstrap.Failed) as err:
        bootstrap.check_archive(tar, 2, 2)
    assert words in str(err.value)


def test_a_link_already_in_the_job_directory_is_not_followed(tmp_path):
    """A folder of the job directory that is a link (left by anything on the instance) is
    refused, not written through."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "job"
    root.mkdir()
    (root / "work").symlink_to(outside)
    tar = tar_of(tmp_path, (reg("work/x.txt"), b"x"))
    with pytest.raises(OSError):
        bootstrap.unpack(tar, bootstrap.check_archive(tar, 1, 1), str(root))
    assert list(outside.iterdir()) == []


def test_bad_arguments_end_in_one_line_and_a_usage_exit(capsys, tmp_path):
    assert bootstrap.main(["--bucket", "b", "--prefix", "jobs/../x/", "--jobdir",
                           str(tmp_path / "j"), "--region", "us-east-1"]) == bootstrap.EXIT_USAGE
    assert bootstrap.main(["--bucket", "b", "--prefix", "jobs/o/j/", "--jobdir", "rel/j",
                           "--region", "us-east-1"]) == bootstrap.EXIT_USAGE
    # RD7: the watchdog's --end-group names the group it ends
    assert bootstrap.main(["--bucket", "b", "--prefix", "jobs/o/j/", "--jobdir",
                           str(tmp_path / "j"), "--region", "us-east-1", "--end-group"]
                          ) == bootstrap.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and err.startswith("bootstrap: ")
    assert "--end-group needs --group" in err


# -- what the orchestrator puts in it ----------------------------------------------------------

def test_the_bundle_holds_what_a_sync_sends_the_job_files_the_agent_and_its_start(tmp_path):
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "a.py").write_text("print(1)\n")
    (work / "sub" / "b.txt").write_text("b\n")
    (work / ".env").write_text("SECRET=1\n")  # left out, as a sync leaves it out
    (work / ".gitignore").write_text("ignored/\n")
    (work / "ignored").mkdir()
    (work / "ignored" / "big.bin").write_bytes(b"x" * 1000)
    jobdir = tmp_path / "h" / "jobs" / "j1"
    jobdir.mkdir(parents=True)
    (jobdir / "run.sh").write_text("#!/bin/sh\necho run\n")
    (jobdir / "job.json").write_text('{"job_id": "j1"}')
    host = LocalHost(tmux_socket="ct-test-sock")
    into = tmp_path / "parts"
    into.mkdir()
    parts, meta = scripts.bundle_parts(host, str(jobdir), "j1", [(work, "work", ())],
                                       ["run.sh", "job.json"], into)
    names = [n for n, _ in parts]
    assert names[0] == "files.tar" and names[-1] == "start.sh"
    assert names[1:3] == ["job/run.sh", "job/job.json"]
    assert names[3:-1] == [f"agent/{name}" for name, _ in host_files()]
    with tarfile.open(dict(parts)["files.tar"]) as tar:
        listed = sorted(tar.getnames())
    assert listed == sorted(f"work/{rel}" for rel in list_files(work))
    assert "work/.env" not in listed and "work/ignored/big.bin" not in listed
    assert meta == {"job_id": "j1", "jobdir": str(jobdir),
                    "agent_dir": Path(agent_dir(str(jobdir))).name,
                    "archive": {"files": len(listed), "bytes": sum(
                        (work / n[len("work/"):]).stat().st_size for n in listed)}}
    assert dict(parts)["job/run.sh"].read_bytes() == (jobdir / "run.sh").read_bytes()
    start = dict(parts)["start.sh"].read_text()
    assert start == "#!/bin/sh\n" + host.start_command("j1", str(jobdir)) + "\n"
    assert "-L ct-test-sock new-session" in start
    # The manifest: each object's size and sha256, and it is one an instance accepts.
    doc = jobbundle.manifest(parts, meta)
    for item, (_, path) in zip(doc["objects"], parts):
        data = path.read_bytes()
        assert item["size"] == len(data)
        assert item["sha256"] == hashlib.sha256(data).hexdigest()
    objects, counts, agent = bootstrap.check_manifest(doc, str(jobdir))
    assert len(objects) == len(parts) and counts == (meta["archive"]["files"],
                                                     meta["archive"]["bytes"])


def test_a_link_in_the_workdir_is_said_before_a_bundle_no_instance_would_take(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.py").write_text("1\n")
    (work / "latest").symlink_to("a.py")
    jobdir = tmp_path / "h" / "jobs" / "j1"
    jobdir.mkdir(parents=True)
    into = tmp_path / "parts"
    into.mkdir()
    with pytest.raises(UsageError, match="work/latest is a link"):
        scripts.bundle_parts(LocalHost(), str(jobdir), "j1", [(work, "work", ())], [], into)


def test_a_403_is_a_missing_key_only_where_the_role_read_its_neighbour(monkeypatch):
    """S3 answers 403 for a missing key to a role without s3:ListBucket: no checkpoint yet
    (stream/latest.json) is not an error, a 403 on the manifest says both readings."""
    import http.server

    from labs.imds import FakeIMDS
    from labs.loopback import serve

    class Denied(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"<Error><Code>AccessDenied</Code></Error>"
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    url, server = serve(Denied)
    imds = FakeIMDS()
    try:
        b = bootstrap.Bundle("bucket", "jobs/o/j1/", "us-east-1", url, imds.url)
        assert b.get_json("jobs/o/j1/stream/latest.json", 100, bootstrap.EXIT_RESTORE,
                          denied_is_missing=True) is None
        with pytest.raises(bootstrap.Failed) as err:
            b.manifest()
        assert err.value.code == bootstrap.EXIT_MANIFEST
        assert "it is not there" in str(err.value) and "lacks s3:GetObject" in str(err.value)
    finally:
        server.close()
        imds.close()


def _list(status: int, body: bytes, prefix: str = "jobs/o/j1/attempts/2/"):
    from labs.imds import FakeIMDS
    from labs.loopback import answering

    url, server, seen = answering((status, body))
    imds = FakeIMDS()
    try:
        b = bundle_reader.Bundle("bucket", "jobs/o/j1/", "us-east-1", url, imds.url)
        return b.list_keys(prefix, bundle_reader.EXIT_STORE), seen
    finally:
        server.close()
        imds.close()


def _contents(*items: tuple[str, str]) -> bytes:
    rows = "".join(f"<Contents><Key>{k}</Key><Size>{s}</Size></Contents>" for k, s in items)
    return f"<?xml version='1.0'?><ListBucketResult>{rows}</ListBucketResult>".encode()


def test_a_listing_keeps_only_the_prefixs_keys_that_may_be_read_unescaped():
    """What a ListObjectsV2 answer (or whoever stands in for S3) lists is checked key by key:
    XML character references are undone before the checks, a key outside the prefix, one
    KEY does not take, or one without a size is left out."""
    p = "jobs/o/j1/attempts/2/"
    keys, seen = _list(200, _contents(
        (p + "i-0123456789abcdef0.json", "120"),
        ("jobs&#x2F;o/j1/attempts/2/i-&#48;123456789abcdef1.json", "7"),  # escaped, ours
        ("jobs/o/j1/attempts/20/i-0123456789abcdef2.json", "5"),  # another attempt's
        ("jobs/o/other/attempts/2/i-0123456789abcdef3.json", "5"),
        (p + "a&amp;b.json", "5"), (p + "a b.json", "5"), (p + "x&lt;y", "5"),
        (p + "no-size.json", "x"), (p + "huge.json", "9" * 16)))
    assert keys == {p + "i-0123456789abcdef0.json": 120, p + "i-0123456789abcdef1.json": 7}
    assert seen == [{"list-type": "2", "prefix": p, "max-keys": str(bundle_reader.LIST_MAX_KEYS)}]


def test_a_listing_over_its_byte_limit_or_refused_is_a_failure_that_says_so():
    p = "jobs/o/j1/attempts/2/"
    big = _contents(*[(p + "i-%017x.json" % k, "1") for k in range(12_000)])
    assert len(big) > bundle_reader.LIST_MAX_BYTES
    with pytest.raises(bundle_reader.Failed) as err:
        _list(200, big)
    assert err.value.code == bundle_reader.EXIT_STORE and "larger than" in str(err.value)
    with pytest.raises(bundle_reader.Failed) as err:
        _list(403, b"<Error><Code>AccessDenied</Code></Error>")
    assert err.value.code == bundle_reader.EXIT_STORE
    assert "HTTP 403" in str(err.value) and "s3:ListBucket" in str(err.value)


def test_a_listing_reads_at_most_its_page_of_keys():
    p = "jobs/o/j1/attempts/2/"
    keys, _ = _list(200, _contents(*[(p + "i-%017x.json" % k, "1")
                                     for k in range(bundle_reader.LIST_MAX_KEYS + 50)]))
    assert len(keys) == bundle_reader.LIST_MAX_KEYS
