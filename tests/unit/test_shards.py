"""cloudtrain/host/shards.py: cutting a tree into shards, deterministic tar bytes, the manifest read
as untrusted (fuzzed), and extract_shard refusing every kind of bad shard with nothing left
behind. Real files, real tars (tarfile, and the system's `tar` reading ours)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.host import shards
from cloudtrain.host.shards import FileEntry, Manifest, ShardEntry

MTIME = 1_700_000_000


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (MTIME, MTIME))
    return root


@pytest.fixture
def tree(tmp_path) -> Path:
    return _write(tmp_path / "tree", {
        "train/b/2.jpg": b"B" * 700, "train/a/1.jpg": b"A" * 1500, "train/a/0.jpg": b"",
        "train-list.txt": b"x" * 100, "val/ümlaut and space.jpg": os.urandom(3000),
        "val/" + "long" * 40 + ".jpg": b"L" * 10, ".prepare/lock": b"", "val/.sizes.json": b"{}"})


def _shard_bytes(root: Path, plan: shards.ShardPlan) -> tuple[ShardEntry, bytes]:
    out = io.BytesIO()
    entry = shards.write_shard(root, plan, out)
    return entry, out.getvalue()


def _all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


# -- scan and cut -------------------------------------------------------------------------


def test_scan_lists_regular_files_sorted_and_says_what_it_left_out(tree):
    (tree / "val" / "link.jpg").symlink_to("../train/b/2.jpg")
    (tree / "train" / "alias").symlink_to("a", target_is_directory=True)
    os.mkfifo(tree / "pipe")
    files, skipped = shards.scan(tree)
    assert [f.path for f in files] == [
        "train-list.txt", "train/a/0.jpg", "train/a/1.jpg", "train/b/2.jpg", "val/link.jpg",
        "val/" + "long" * 40 + ".jpg", "val/ümlaut and space.jpg"]
    assert files[4] == FileEntry("val/link.jpg", 700, MTIME)  # the linked file, inside root
    assert skipped == [(".prepare", "hidden"), ("pipe", "not a regular file"),
                       ("train/alias", "a link to a folder"), ("val/.sizes.json", "hidden")]


def test_a_link_out_of_the_tree_is_refused(tree):
    (tree / "train" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match=r"^train/passwd links outside .* \(to /etc/passwd\): "
                                         r"copy the file in, or remove the link$"):
        shards.scan(tree)


def test_cut_fills_shards_in_order_and_never_splits_a_file():
    files = [FileEntry(f"f{i}", size, 0) for i, size in enumerate([100, 400, 1024, 5000, 1, 1])]
    # tar cost: 512 header + data rounded up to 512: 1024, 1024, 1536, 5632, 1024, 1024
    cut = shards.cut(files, 3000)
    assert [[f.path for f in s.files] for s in cut] == [["f0", "f1"], ["f2"], ["f3"],
                                                        ["f4", "f5"]]
    assert [s.name for s in cut] == ["shard-00000.tar", "shard-00001.tar", "shard-00002.tar",
                                     "shard-00003.tar"]
    assert [s.file_bytes for s in cut] == [500, 1024, 5000, 2]
    assert shards.cut(files, 1 << 30) == [shards.ShardPlan(0, tuple(files))]
    assert shards.cut([], 100) == []
    with pytest.raises(ValueError, match="^shard size must be positive, not 0$"):
        shards.cut(files, 0)


def test_plan_is_the_same_for_a_copy_of_the_tree(tree, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)  # copy2: contents and mtimes
    assert shards.plan(tree, 2048) == shards.plan(copy, 2048)
    # tar costs 1024, 512 | 2048 | 1536 | 1024 | 3584
    assert [len(s.files) for s in shards.plan(tree, 2048)] == [2, 1, 1, 1, 1]


# -- write_shard --------------------------------------------------------------------------


def test_a_shard_is_the_same_bytes_every_time_and_for_a_copied_tree(tree, tmp_path):
    plan = shards.plan(tree, 1 << 20)[0]
    entry, data = _shard_bytes(tree, plan)
    assert _shard_bytes(tree, plan) == (entry, data)
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    assert _shard_bytes(copy, plan) == (entry, data)
    assert shards.write_shard(tree, plan) == entry  # hashing only gives the same entry
    assert entry == ShardEntry("shard-00000.tar", 6, len(data), 5310,
                               hashlib.sha256(data).hexdigest())
    assert len(data) % 10240 == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [f.path for f in plan.files]
    assert {(m.type, m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == \
        {(tarfile.REGTYPE, 0o644, 0, 0, "", "", MTIME)}


def test_the_system_tar_reads_a_shard(tree, tmp_path):
    entry, data = _shard_bytes(tree, shards.plan(tree, 1 << 20)[0])
    (tmp_path / "s.tar").write_bytes(data)
    (tmp_path / "out").mkdir()
    subprocess.run(["tar", "-xf", str(tmp_path / "s.tar"), "-C", str(tmp_path / "out")],
                   check=True)
    assert _all_files(tmp_path / "out") == {k: v for k, v in _all_files(tree).items()
                                            if "/." not in "/" + k}


def test_a_file_that_changed_after_the_plan_is_refused(tree):
    plan = shards.plan(tree, 1 << 20)[0]
    (tree / "train/a/1.jpg").write_bytes(b"A" * 1501)
    with pytest.raises(ValueError, match="^train/a/1.jpg grew while being pushed: push again$"):
        shards.write_shard(tree, plan, io.BytesIO())
    (tree / "train/a/1.jpg").write_bytes(b"A" * 10)
    with pytest.raises(ValueError, match=r"^train/a/1.jpg shrank while being pushed"):
        shards.write_shard(tree, plan, io.BytesIO())


# -- extract_shard ------------------------------------------------------------------------


def test_extracting_every_shard_gives_the_tree_back(tree, tmp_path):
    entries = []
    dest = tmp_path / "dest"
    for plan in shards.plan(tree, 2048):
        entry, data = _shard_bytes(tree, plan)
        assert shards.extract_shard(io.BytesIO(data), dest, entry) == len(plan.files)
        entries.append(entry)
    wanted = {k: v for k, v in _all_files(tree).items() if "/." not in "/" + k}
    assert _all_files(dest) == wanted
    assert {p.stat().st_mtime for p in dest.rglob("*") if p.is_file()} == {MTIME}
    manifest = Manifest.build(2048, entries)
    shards.verify_tree(dest, manifest)
    # staged again after an interruption: the same files, replaced
    entry, data = _shard_bytes(tree, shards.plan(tree, 2048)[0])
    assert shards.extract_shard(io.BytesIO(data), dest, entry) == 2
    assert _all_files(dest) == wanted
    (dest / "train/b/2.jpg").unlink()
    with pytest.raises(ValueError, match=rf"^{dest} holds 5 files of 4610 bytes; the manifest "
                                         r"lists 6 of 5310$"):
        shards.verify_tree(dest, manifest)


def _tar(members: list[tuple[tarfile.TarInfo, bytes]], fmt=tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _member(name: str, data: bytes = b"", kind=tarfile.REGTYPE, **attrs) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


def _honest_entry(data: bytes, files: int, file_bytes: int) -> ShardEntry:
    """An entry that tells the truth about the bytes: whoever wrote a bad shard to the bucket
    could also have written its manifest."""
    return ShardEntry("shard-00007.tar", files, len(data), file_bytes,
                      hashlib.sha256(data).hexdigest())


def _refused(data: bytes, entry: ShardEntry, dest: Path, why: str) -> None:
    with pytest.raises(ValueError, match=r"^shard shard-0000\d.tar is not what the manifest "
                                         r"says: " + why):
        shards.extract_shard(io.BytesIO(data), dest, entry)
    assert sorted(os.listdir(dest)) == ["kept.txt"]  # nothing of the shard, no temp folder
    assert (dest / "kept.txt").read_bytes() == b"was here"


@pytest.fixture
def dest(tmp_path) -> Path:
    return _write(tmp_path / "dest", {"kept.txt": b"was here"})


def test_a_flipped_byte_or_a_cut_shard_leaves_nothing(tree, dest):
    entry, data = _shard_bytes(tree, shards.plan(tree, 1 << 20)[0])
    for at, why in ((0, r"not a readable tar \(bad checksum\)$"),  # a header
                    (600, "sha256 differs$"),  # a member's data
                    (len(data) - 1, "sha256 differs$")):  # the end blocks
        flipped = bytearray(data)
        flipped[at] ^= 1
        _refused(bytes(flipped), entry, dest, why)
    _refused(data[:4096], entry, dest, r"not a readable tar \(unexpected end of data\)$")
    _refused(data[:-10240], entry, dest, r"not a readable tar \(unexpected end of data\)$")
    _refused(data[:-512], entry, dest, rf"{len(data) - 512} bytes, not {len(data)}$")
    _refused(data + b"\0" * 512, entry, dest, rf"longer than {len(data)} bytes$")


@pytest.mark.parametrize("member, why", [
    (_member("../x", b"evil"), r"member '\.\./x': an empty, '\.' or '\.\.' component$"),
    (_member("a/../../x", b"evil"), r"member 'a/\.\./\.\./x': an empty, '\.' or '\.\.' comp"),
    (_member("/etc/x", b"evil"), r"member '/etc/x': an absolute path$"),
    (_member("a/.hidden", b"evil"), r"member 'a/\.hidden': a hidden name \(never pushed\)$"),
    (_member("link", kind=tarfile.SYMTYPE, linkname="/etc/passwd"),
     r"member 'link' is not a regular file$"),
    (_member("hard", kind=tarfile.LNKTYPE, linkname="ok.jpg"),
     r"member 'hard' is not a regular file$"),
    (_member("dev", kind=tarfile.CHRTYPE, devmajor=1, devminor=3),
     r"member 'dev' is not a regular file$"),
    (_member("fifo", kind=tarfile.FIFOTYPE), r"member 'fifo' is not a regular file$"),
    (_member("dir", kind=tarfile.DIRTYPE), r"member 'dir' is not a regular file$"),
    (_member("ok.jpg", b"again"), r"member 'ok.jpg' appears twice$"),
])
def test_a_bad_member_after_good_ones_leaves_nothing(dest, member, why):
    data = _tar([_member("ok.jpg", b"fine"), _member("sub/ok2.jpg", b"fine too"), member])
    entry = _honest_entry(data, 3, 12 + member[0].size)
    _refused(data, entry, dest, why)


def test_more_members_than_listed_are_refused(dest):
    data = _tar([_member("a", b"1"), _member("b", b"2"), _member("c", b"3")])
    _refused(data, _honest_entry(data, 2, 2), dest, r"more than the 2 files of 2 bytes listed$")
    _refused(data, _honest_entry(data, 4, 3), dest, r"3 files of 3 bytes, not 4 of 3$")


def test_a_file_where_a_folder_goes_is_refused(dest):
    data = _tar([_member("a", b"1"), _member("a/b", b"2")])
    _refused(data, _honest_entry(data, 2, 2), dest, r"'a' is both a file and a folder$")


def test_a_gnu_tar_of_plain_files_is_read(dest):
    data = _tar([_member("x/" + "n" * 150, b"gnu long name")], fmt=tarfile.GNU_FORMAT)
    assert shards.extract_shard(io.BytesIO(data), dest, _honest_entry(data, 1, 13)) == 1
    assert (dest / "x" / ("n" * 150)).read_bytes() == b"gnu long name"


def test_a_link_in_the_destination_is_not_followed(dest, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (dest / "sub").symlink_to(tmp_path / "elsewhere")
    for name in ("sub/x", "sub/new/deeper/x"):  # no folder is made through the link either
        data = _tar([_member("a/ok", b"1"), _member(name, b"1")])
        with pytest.raises(ValueError, match=rf"'{name}' would be written through a link$"):
            shards.extract_shard(io.BytesIO(data), dest, _honest_entry(data, 2, 2))
        assert os.listdir(tmp_path / "elsewhere") == []
        assert sorted(os.listdir(dest)) == ["kept.txt", "sub"]  # and a/ taken back


def test_garbage_is_not_a_tar(dest):
    data = b"<html>captive portal</html>" + b"\0" * 997
    _refused(data, _honest_entry(data, 1, 1), dest, r"not a readable tar \(")


# -- the manifest -------------------------------------------------------------------------


def _manifest() -> Manifest:
    entries = [ShardEntry(shards.shard_name(i), 2, 10240, 1000 + i, f"{i:064x}")
               for i in range(3)]
    return Manifest.build(4096, entries)


def test_a_manifest_round_trips():
    m = _manifest()
    assert Manifest.from_json(m.to_json()) == m
    assert Manifest.from_json(m.to_json().encode()) == m
    doc = json.loads(m.to_json())
    assert (doc["files"], doc["bytes"], doc["file_bytes"]) == (6, 30720, 3003)
    assert doc["shards"][1] == {"name": "shard-00001.tar", "files": 2, "bytes": 10240,
                                "file_bytes": 1001, "sha256": "0" * 63 + "1"}


def test_u41_a_manifest_lists_the_tree_s_folders_to_three_levels():
    """U41: a launch checks the folders a job reads against the dataset's manifest before
    anything is billed, so a push lists the tree's folders (sz/40/train, not the class
    folders below it); a manifest pushed before that lists none, and still reads."""
    paths = ["train/n01/a.JPEG", "val/n01/b.JPEG", "sz/160/train/n01/a.JPEG",
             "sz/160/val/n01/b.JPEG", "README"]
    folders = shards.folders_of(paths)
    assert folders == ("sz", "sz/160", "sz/160/train", "sz/160/val", "train", "train/n01",
                       "val", "val/n01")
    m = Manifest.build(4096, list(_manifest().shards), folders)
    back = Manifest.from_json(m.to_json())
    assert back == m and back.folders == folders
    assert back.has_folder("sz/160/train") and back.has_folder("sz/160/train/n01")
    assert back.has_folder("sz/40/train") is False and back.has_folder("") is True
    old = Manifest.from_json(_manifest().to_json())
    assert old.folders is None and old.has_folder("sz/40/train") is None
    assert shards.folders_of(f"d{i}/x" for i in range(shards.MAX_FOLDERS + 1)) is None


@pytest.mark.parametrize("folders, why", [
    ("sz", r"folders is not a list"),
    (["b", "a"], r"folders\[1\] is out of order or repeated"),
    (["a", "a"], r"folders\[1\] is out of order or repeated"),
    (["../etc"], r"folders\[0\] is not a relative path"),
    (["a/b/c/d"], r"folders\[0\] is not a relative path of at most 3 levels"),
    ([3], r"folders\[0\] is not a relative path"),
])
def test_u41_a_bad_folder_list_is_refused_in_one_line(folders, why):
    with pytest.raises(ValueError, match=r"^manifest: " + why):
        Manifest.from_json(_edited(lambda d: d.update(folders=folders)))


def _edited(change) -> str:
    doc = json.loads(_manifest().to_json())
    change(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("change, why", [
    (lambda d: d.update(version=2), r"version is not 1"),
    (lambda d: d.update(version=True), r"version is not 1"),
    (lambda d: d.update(files=True), r"files is not an integer"),
    (lambda d: d.update(files=7), r"files is 7, its shards add up to 6$"),
    (lambda d: d.update(bytes=-1), r"bytes is not an integer from 0 to"),
    (lambda d: d.update(extra=1), r"not an object with exactly the keys"),
    (lambda d: d.update(created="2026-02-30T00:00:00Z"), r"created is not a real date"),
    (lambda d: d.update(created="yesterday"), r"created is not a UTC time"),
    (lambda d: d.update(shards=[]), r"shards is not a list of 1 to 100000 shards$"),
    (lambda d: d["shards"][1].update(name="shard-00002.tar"), r"shard 1: name is not shard-"),
    (lambda d: d["shards"][0].update(name="../etc.tar"), r"shard 0: name is not shard-00000"),
    (lambda d: d["shards"][0].update(sha256="A" * 64), r"shard 0: sha256 is not 64 lowercase"),
    (lambda d: d["shards"][0].update(bytes=10241), r"shard 0: 2 files of 1000 bytes cannot"),
    (lambda d: d["shards"][0].update(file_bytes=10000), r"shard 0: 2 files of 10000 bytes"),
    (lambda d: d["shards"][0].update(files=0), r"shard 0: 0 files of 1000 bytes cannot"),
    (lambda d: d["shards"][0].update(files=1.0), r"shard 0: files is not an integer"),
])
def test_a_bad_manifest_is_refused_in_one_line(change, why):
    with pytest.raises(ValueError, match=r"^manifest: " + why):
        Manifest.from_json(_edited(change))


def test_non_json_numbers_deep_nesting_and_size_are_refused():
    with pytest.raises(ValueError, match=r"^manifest: not JSON \(NaN is a number JSON does not have\)$"):
        Manifest.from_json(_manifest().to_json().replace('"bytes": 30720', '"bytes": NaN'))
    with pytest.raises(ValueError, match=r"^manifest: "):
        Manifest.from_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"^manifest: larger than 16777216 bytes$"):
        Manifest.from_json(b" " * (16 << 20) + b"{}")
    with pytest.raises(ValueError, match=r"^manifest: shards is not a list of 1 to 2 shards$"):
        Manifest.from_json(_manifest().to_json(), max_shards=2)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=5), max_leaves=20)
FIELDS = sorted(shards.MANIFEST_KEYS | shards.OPTIONAL_KEYS)
SHARD_FIELDS = sorted(shards.SHARD_KEYS)


def _check_only_value_errors(text) -> None:
    try:
        Manifest.from_json(text)
    except ValueError as exc:
        assert str(exc).startswith("manifest: ") and "\n" not in str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), st.binary(), JSON.map(json.dumps)))
def test_fuzzed_text_is_a_manifest_or_a_value_error(text):
    _check_only_value_errors(text)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELDS), st.sampled_from(SHARD_FIELDS), JSON, st.booleans())
def test_a_fuzzed_field_is_a_manifest_or_a_value_error(top, inner, value, in_shard):
    doc = json.loads(_manifest().to_json())
    if in_shard:
        doc["shards"][1][inner] = value
    else:
        doc[top] = value
    _check_only_value_errors(json.dumps(doc))


def test_a_sparse_member_is_refused_before_its_zeros_are_written(dest, tmp_path):
    # GNU tar's PAX sparse member: type '0', GNU.sparse.* keys; tarfile would write its whole
    # claimed size of zeros (20 MB here) from a 10 KB shard.
    work = tmp_path / "sparse"
    work.mkdir()
    subprocess.run(["truncate", "-s", "20M", str(work / "f")], check=True)
    subprocess.run(["tar", "--sparse", "--format=pax", "-cf", "s.tar", "f"], cwd=work,
                   check=True)
    data = (work / "s.tar").read_bytes()
    assert len(data) <= 16384
    _refused(data, _honest_entry(data, 1, 20 << 20), dest,
             r"member 'f': sparse, or a pax header key write_shard never writes$")


def test_a_pax_key_write_shard_never_writes_is_refused(dest):
    info, body = _member("ok.jpg", b"fine")
    info.pax_headers = {"comment": "hello"}
    data = _tar([(info, body)])
    _refused(data, _honest_entry(data, 1, 4), dest,
             r"member 'ok.jpg': sparse, or a pax header key write_shard never writes$")


def test_a_clash_with_the_destination_is_a_value_error(dest):
    (dest / "afile").write_bytes(b"x")
    (dest / "afolder").mkdir()
    data = _tar([_member("ok", b"1"), _member("afile/b", b"2")])
    with pytest.raises(ValueError, match=r"says: 'afile/b': 'afile' is a file in the "
                                         r"destination, not a folder$"):
        shards.extract_shard(io.BytesIO(data), dest, _honest_entry(data, 2, 2))
    data = _tar([_member("ok", b"1"), _member("afolder", b"2")])
    with pytest.raises(ValueError, match=r"says: 'afolder' cannot be written \(Is a directory\)$"):
        shards.extract_shard(io.BytesIO(data), dest, _honest_entry(data, 2, 2))
    assert sorted(os.listdir(dest)) == ["afile", "afolder", "kept.txt"]
    assert os.listdir(dest / "afolder") == []


@pytest.mark.parametrize("name, why", [
    ("ü" * 128, "a name longer than 255 bytes"),  # 128 characters, 256 bytes
    ("/".join(["é" * 120] * 17), "longer than 4095 bytes"),  # 2056 characters, 4096 bytes
])
def test_a_name_too_long_in_bytes_is_refused(dest, name, why):
    data = _tar([_member(name, b"1")])
    _refused(data, _honest_entry(data, 1, 1), dest, rf"member '.*': {why}$")


def test_a_broken_or_looping_link_is_skipped_not_a_crash(tree):
    (tree / "train" / "gone.jpg").symlink_to("nothing-here.jpg")
    (tree / "loop").symlink_to("loop")
    files, skipped = shards.scan(tree)
    assert len(files) == 6
    assert ("train/gone.jpg", "a broken link") in skipped
    assert ("loop", "a broken link") in skipped


def test_a_file_deleted_after_the_plan_is_a_value_error(tree, monkeypatch):
    plan = shards.plan(tree, 1 << 20)[0]
    (tree / "train/a/1.jpg").unlink()
    with pytest.raises(ValueError, match="^train/a/1.jpg vanished while being pushed$"):
        shards.write_shard(tree, plan, io.BytesIO())
    _write(tree, {"train/a/1.jpg": b"A" * 1500})

    def failing(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(shards.tarfile, "copyfileobj", failing)
    with pytest.raises(OSError, match="Input/output error"):  # not "shrank": it did not
        shards.write_shard(tree, plan, io.BytesIO())


def _raw_header(name: str, kind: bytes, size: int) -> bytes:
    """One ustar header block announcing `size` bytes of an extended header."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


@pytest.mark.parametrize("kind, size, why", [
    (tarfile.XHDTYPE, 1 << 30, r"an extended header of 1073741824 bytes"),
    (tarfile.GNUTYPE_LONGNAME, 1 << 30, r"an extended header of 1073741824 bytes"),
    (tarfile.XGLTYPE, 100, r"a header type write_shard never writes"),
    (tarfile.GNUTYPE_LONGLINK, 100, r"a header type write_shard never writes"),
])
def test_a_huge_or_foreign_extended_header_is_refused_before_it_is_read(dest, kind, size, why):
    """A bucket writer's shard whose pax or GNU long-name header claims a gigabyte: tarfile
    would read it whole into memory; it is refused from its 512-byte header alone."""
    head = _tar([_member("ok.jpg", b"fine")])[:1024]  # the first member, end blocks cut
    data = head + _raw_header("././@x", kind, size) + b"\0" * 2048
    reads = []

    class Counting(io.BytesIO):
        def read(self, n=-1):
            out = super().read(n)
            reads.append(len(out))
            return out

    with pytest.raises(ValueError, match=why):
        shards.extract_shard(Counting(data), dest, _honest_entry(data, 2, 4 + size))
    assert sum(reads) <= len(data) and sorted(os.listdir(dest)) == ["kept.txt"]
