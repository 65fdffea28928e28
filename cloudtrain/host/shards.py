"""A dataset tree as tar shards plus a manifest: what `cloudtrain data push` uploads and what
an instance stages back onto its disk. Standard library only: the agent runs this file on the
instance, which has no third-party packages.

    scan(root)                           (files, skipped): what a push takes, and what not, why
    cut(files, shard_bytes)              consecutive shards of about shard_bytes
    plan(root, shard_bytes)              both
    write_shard(root, shard, fileobj)    the shard's tar, streamed, -> ShardEntry (sha256, bytes)
    Manifest.to_json / from_json         the dataset's table of shards (from_json: untrusted)
    folders_of(paths)                    the folders a manifest lists (what a launch checks)
    extract_shard(fileobj, dest, entry)  a downloaded shard into dest, all of it or nothing
    verify_tree(dest, manifest)          the staged tree holds the manifest's files and bytes

Why tar shards and not the files themselves: ImageNet is 1.28 M files, and 1.28 M GETs (or
PUTs) cost more in request latency than in bytes; a few hundred 256 MB objects are read with
ranged GETs at the link's speed. Why plain tar: any machine can read it (`tar xf`), it streams
(no index needed before the first byte), and JPEGs do not compress.

A shard is an uncompressed POSIX.1-2001 (PAX) tar of regular files only, in sorted path order,
each member mode 0o644, uid/gid 0, no user or group names, mtime the file's (whole seconds):
the same tree gives the same bytes, so a second push can tell by sha256 that a shard is
already stored. Shards are named shard-00000.tar, shard-00001.tar, ... (at most 100,000).
Hidden files and folders (a name starting with "."), such as `data prepare`'s `.prepare/`, are
not pushed; neither are links to folders, devices, sockets or pipes: `scan` says each one.

Everything read back (the manifest, a shard) is untrusted: whoever can write the bucket can
write anything there. from_json checks every field; extract_shard checks every member, and
moves the shard's files into place only after the whole shard matched its sha256.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import safefile

MANIFEST_VERSION = 1
MAX_SHARDS = 100_000  # shard-%05d
MAX_OBJECT_BYTES = 5 << 40  # S3's largest object, 5 TiB
MAX_MANIFEST_BYTES = 16 << 20
# The folders a manifest lists, so that a launch can tell before anything is billed whether
# the tree holds what the job reads (imagenet's sz/40/train): those up to three levels deep,
# when there are at most MAX_FOLDERS of them (ImageNet's class folders make about 2,000).
FOLDER_DEPTH = 3
MAX_FOLDERS = 100_000
BLOCK = 512  # a tar block: each member is a header block plus its data padded to blocks
SHARD_NAME = re.compile(r"shard-[0-9]{5}\.tar")
SHA256 = re.compile(r"[0-9a-f]{64}")
CREATED = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
CHUNK = 1 << 20
# The pax keys tarfile writes for write_shard's members: a long or non-ASCII name, a size of
# 8 GiB or more, a fractional mtime. Anything else (GNU.sparse.*, above all) is refused.
PAX_KEYS = {"path", "size", "mtime"}
CLASHES = {errno.EEXIST, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG}


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative POSIX path below the root
    size: int
    mtime: int  # whole seconds, as stored in the tar


@dataclass(frozen=True)
class ShardPlan:
    index: int
    files: tuple[FileEntry, ...]

    @property
    def name(self) -> str:
        return shard_name(self.index)

    @property
    def file_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class ShardEntry:
    name: str  # shard-NNNNN.tar
    files: int  # members
    bytes: int  # the tar's size: the object's size
    file_bytes: int  # the members' data, what the files take once extracted
    sha256: str  # of the tar's bytes


def shard_name(index: int) -> str:
    if not 0 <= index < MAX_SHARDS:
        raise ValueError(f"a dataset has at most {MAX_SHARDS} shards; use larger shards")
    return f"shard-{index:05d}.tar"


# -- planning -----------------------------------------------------------------------------


def scan(root: str | Path) -> tuple[list[FileEntry], list[tuple[str, str]]]:
    """Every regular file below `root` (sorted by relative path; a link to a file inside root
    counts as that file), and (path, why) for what is left out. A link that points outside
    root is refused: the tree would not be what the user sees."""
    top = os.path.realpath(root)
    if not os.path.isdir(top):
        raise ValueError(f"{root} is not a folder")
    files: list[FileEntry] = []
    skipped: list[tuple[str, str]] = []
    pending = [""]
    while pending:
        folder = pending.pop()
        with os.scandir(os.path.join(top, folder) if folder else top) as found:
            entries = list(found)
        for e in entries:
            rel = f"{folder}/{e.name}" if folder else e.name
            if e.name.startswith("."):
                skipped.append((rel, "hidden"))
                continue
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                skipped.append((rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                                "name is not UTF-8"))
                continue
            try:
                st = os.stat(e.path) if e.is_symlink() else e.stat(follow_symlinks=False)
            except OSError:  # a link to nothing, or to itself
                if not e.is_symlink():
                    raise
                skipped.append((rel, "a broken link"))
                continue
            if e.is_symlink():
                target = os.path.realpath(e.path)
                if not target.startswith(top.rstrip(os.sep) + os.sep):
                    raise ValueError(f"{rel} links outside {root} (to {target}): copy the file "
                                     "in, or remove the link")
                if not stat.S_ISREG(st.st_mode):
                    skipped.append((rel, "a link to a folder"))
                    continue
            elif e.is_dir(follow_symlinks=False):
                pending.append(rel)
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append((rel, "not a regular file"))
                continue
            files.append(FileEntry(rel, st.st_size, max(0, int(st.st_mtime))))
    files.sort(key=lambda f: f.path)
    skipped.sort()
    return files, skipped


def tar_cost(size: int) -> int:
    """Bytes a file of `size` takes in a tar without long names: header block + padded data."""
    return BLOCK + -(-size // BLOCK) * BLOCK


def cut(files: list[FileEntry], shard_bytes: int) -> list[ShardPlan]:
    """Consecutive shards of at most about `shard_bytes` (counting tar headers); a file is never
    split, and one larger than `shard_bytes` is a shard of its own."""
    if shard_bytes < 1:
        raise ValueError(f"shard size must be positive, not {shard_bytes}")
    shards: list[list[FileEntry]] = []
    size = 0
    for f in files:
        cost = tar_cost(f.size)
        if not shards or size + cost > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(f)
        size += cost
    if len(shards) > MAX_SHARDS:
        raise ValueError(f"{len(shards)} shards: at most {MAX_SHARDS}; use larger shards")
    return [ShardPlan(i, tuple(s)) for i, s in enumerate(shards)]


def plan(root: Path, shard_bytes: int) -> list[ShardPlan]:
    return cut(scan(root)[0], shard_bytes)


# -- writing ------------------------------------------------------------------------------


class _Hashing:
    """A write-only file that hashes and counts what passes, into `out` (None: nowhere)."""

    def __init__(self, out=None):
        self.out, self.sha, self.count = out, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.count += len(data)
        if self.out is not None:
            self.out.write(data)
        return len(data)


def write_shard(root: Path, shard: ShardPlan, fileobj=None) -> ShardEntry:
    """The shard's tar into `fileobj` (None: only hashed), streamed a megabyte at a time.
    A file that changed size since the plan is a ValueError: the push would not be the tree."""
    out = _Hashing(fileobj)
    # A stream mode writes only: the stub's file type also asks for read, seek and tell.
    with tarfile.open(  # type: ignore[call-overload]
            fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8",
            bufsize=CHUNK) as tar:
        for f in shard.files:
            info = tarfile.TarInfo(f.path)
            info.size, info.mtime, info.mode = f.size, f.mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            try:
                src = open(os.path.join(root, *f.path.split("/")), "rb")
            except FileNotFoundError:
                raise ValueError(f"{f.path} vanished while being pushed") from None
            with src:
                try:
                    tar.addfile(info, src)
                except OSError as exc:  # tarfile: "unexpected end of data"
                    if os.fstat(src.fileno()).st_size >= f.size:
                        raise  # a real read error, not a file that shrank
                    raise ValueError(f"{f.path} shrank while being pushed ({exc})") from None
                if src.read(1):
                    raise ValueError(f"{f.path} grew while being pushed: push again")
    return ShardEntry(shard.name, len(shard.files), out.count, shard.file_bytes,
                      out.sha.hexdigest())


# -- the manifest -------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    version: int
    created: str  # UTC, 2026-11-23T16:49:43Z
    shard_bytes: int  # the push's target shard size
    files: int
    bytes: int  # of all shards: what a staging downloads
    file_bytes: int  # of all files: what they take on disk
    shards: tuple[ShardEntry, ...]
    # The tree's folders to FOLDER_DEPTH levels (folders_of); None: not listed (a manifest
    # pushed before they were, or a tree with more than MAX_FOLDERS of them)
    folders: tuple[str, ...] | None = None

    @classmethod
    def build(cls, shard_bytes: int, shards: list[ShardEntry],
              folders: tuple[str, ...] | None = None) -> "Manifest":
        return cls(MANIFEST_VERSION, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   shard_bytes, sum(s.files for s in shards), sum(s.bytes for s in shards),
                   sum(s.file_bytes for s in shards), tuple(shards), folders)

    def to_json(self) -> str:
        doc = {"version": self.version, "created": self.created, "shard_bytes": self.shard_bytes,
               "files": self.files, "bytes": self.bytes, "file_bytes": self.file_bytes,
               "shards": [{"name": s.name, "files": s.files, "bytes": s.bytes,
                           "file_bytes": s.file_bytes, "sha256": s.sha256} for s in self.shards]}
        if self.folders is not None:
            doc["folders"] = list(self.folders)
        return json.dumps(doc, indent=1) + "\n"

    def has_folder(self, folder: str) -> bool | None:
        """Whether the tree has `folder` (a relative path; one deeper than FOLDER_DEPTH is
        looked up by its first levels), or None when the manifest lists no folders."""
        if self.folders is None:
            return None
        parts = [p for p in folder.split("/") if p]
        return not parts or "/".join(parts[:FOLDER_DEPTH]) in self.folders

    @classmethod
    def from_json(cls, text, max_shards: int = MAX_SHARDS) -> "Manifest":
        """A manifest read back from a bucket, every field checked; ValueError (one line)
        for anything else."""
        try:
            return _parse_manifest(text, max_shards)
        except RecursionError:
            raise ValueError("manifest: nested too deeply") from None


def folders_of(paths) -> tuple[str, ...] | None:
    """The folders that hold the files at `paths` (relative POSIX paths), to FOLDER_DEPTH
    levels, sorted; None when there are more than MAX_FOLDERS."""
    found: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1][:FOLDER_DEPTH]
        for i in range(1, len(parts) + 1):
            found.add("/".join(parts[:i]))
        if len(found) > MAX_FOLDERS:
            return None
    return tuple(sorted(found))


MANIFEST_KEYS = {"version", "created", "shard_bytes", "files", "bytes", "file_bytes", "shards"}
OPTIONAL_KEYS = {"folders"}
SHARD_KEYS = {"name", "files", "bytes", "file_bytes", "sha256"}


def _bad(what: str):
    raise ValueError(f"manifest: {what}")


def _int(doc: dict, key: str, where: str, high: int = MAX_OBJECT_BYTES * MAX_SHARDS) -> int:
    value = doc[key]
    if type(value) is not int or not 0 <= value <= high:
        _bad(f"{where}{key} is not an integer from 0 to {high}")
    return value


def _reject_constant(name: str):
    raise ValueError(f"{name} is a number JSON does not have")


def _parse_manifest(text, max_shards: int) -> Manifest:
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_MANIFEST_BYTES:
            _bad(f"larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            _bad("not UTF-8")
    if not isinstance(text, str):
        _bad(f"not text but {type(text).__name__}")
    if len(text) > MAX_MANIFEST_BYTES:
        _bad(f"larger than {MAX_MANIFEST_BYTES} characters")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError, a too-long integer
        _bad(f"not JSON ({str(exc).splitlines()[0][:100]})")
    if not isinstance(doc, dict) or not MANIFEST_KEYS <= set(doc) <= MANIFEST_KEYS | OPTIONAL_KEYS:
        _bad(f"not an object with exactly the keys {', '.join(sorted(MANIFEST_KEYS))} (and "
             f"perhaps {', '.join(sorted(OPTIONAL_KEYS))})")
    if type(doc["version"]) is not int or doc["version"] != MANIFEST_VERSION:
        _bad(f"version is not {MANIFEST_VERSION} (a newer cloudtrain wrote it?)")
    created = doc["created"]
    if not isinstance(created, str) or not CREATED.fullmatch(created):
        _bad("created is not a UTC time like 2026-11-23T16:49:43Z")
    try:
        time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        _bad("created is not a real date and time")
    shard_bytes = _int(doc, "shard_bytes", "", MAX_OBJECT_BYTES)
    if shard_bytes < 1:
        _bad("shard_bytes is 0")
    listed = doc["shards"]
    if not isinstance(listed, list) or not 1 <= len(listed) <= min(max_shards, MAX_SHARDS):
        _bad(f"shards is not a list of 1 to {min(max_shards, MAX_SHARDS)} shards")
    shards = tuple(_shard(i, s) for i, s in enumerate(listed))
    for key in ("files", "bytes", "file_bytes"):
        total = sum(getattr(s, key) for s in shards)
        if _int(doc, key, "") != total:
            _bad(f"{key} is {doc[key]}, its shards add up to {total}")
    return Manifest(MANIFEST_VERSION, created, shard_bytes, doc["files"], doc["bytes"],
                    doc["file_bytes"], shards, _folders(doc.get("folders")))


def _folders(listed) -> tuple[str, ...] | None:
    """A manifest's folder list, checked: sorted, unique, safe relative paths."""
    if listed is None:
        return None
    if not isinstance(listed, list) or len(listed) > MAX_FOLDERS:
        _bad(f"folders is not a list of at most {MAX_FOLDERS} paths")
    for i, folder in enumerate(listed):
        if not isinstance(folder, str) or safe_member(folder) or \
                folder.count("/") >= FOLDER_DEPTH:
            _bad(f"folders[{i}] is not a relative path of at most {FOLDER_DEPTH} levels")
        if i and folder <= listed[i - 1]:
            _bad(f"folders[{i}] is out of order or repeated")
    return tuple(listed)


def _shard(index: int, item) -> ShardEntry:
    where = f"shard {index}: "
    if not isinstance(item, dict) or set(item) != SHARD_KEYS:
        _bad(f"{where}not an object with exactly the keys {', '.join(sorted(SHARD_KEYS))}")
    if item["name"] != shard_name(index):
        _bad(f"{where}name is not {shard_name(index)}")
    if not isinstance(item["sha256"], str) or not SHA256.fullmatch(item["sha256"]):
        _bad(f"{where}sha256 is not 64 lowercase hex digits")
    files = _int(item, "files", where, MAX_OBJECT_BYTES // BLOCK)
    size = _int(item, "bytes", where, MAX_OBJECT_BYTES)
    data = _int(item, "file_bytes", where, MAX_OBJECT_BYTES)
    # A tar holds a header block per member, the data, and two zero blocks at the end.
    if files < 1 or size % BLOCK or size < (files + 2) * BLOCK + data:
        _bad(f"{where}{files} files of {data} bytes cannot make a {size}-byte tar")
    return ShardEntry(item["name"], files, size, data, item["sha256"])


# -- extracting ---------------------------------------------------------------------------


class _Bad(Exception):
    """The shard is not what its entry says."""


class _Reading:
    """A read-only file that hashes and counts what passes, and refuses to read past `limit`."""

    def __init__(self, src, limit: int):
        self.src, self.limit, self.sha, self.count = src, limit, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        want = self.limit + 1 - self.count
        data = self.src.read(want if n is None or n < 0 else min(n, want))
        self.sha.update(data)
        self.count += len(data)
        if self.count > self.limit:
            raise _Bad(f"longer than {self.limit} bytes")
        return data


def safe_member(name: str) -> str | None:
    """Why a member name may not be written below the destination, or None."""
    if not name or len(name) > 4096 or "\\" in name or "\x00" in name:
        return "empty, too long, or with a backslash or NUL"
    if name.startswith("/"):
        return "an absolute path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' component"
    if any(p.startswith(".") for p in parts):
        return "a hidden name (never pushed)"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "not UTF-8"
    if len(name.encode("utf-8")) > 4095:  # PATH_MAX less its NUL
        return "longer than 4095 bytes"
    if any(len(p.encode("utf-8")) > 255 for p in parts):  # NAME_MAX
        return "a name longer than 255 bytes"
    return None


MAX_PAX_HEADER = 64 << 10  # a path of 4,095 bytes, a size and an mtime fit many times over


class _ShardMember(tarfile.TarInfo):
    """A member header as write_shard writes them, or refused before its extended header is
    read: tarfile reads a pax or GNU long-name header whole into memory, so a bucket writer's
    shard with a 4 GB "header" would take 4 GB here. Per-member pax headers and GNU long names
    of at most MAX_PAX_HEADER bytes pass; global, link-name, sparse and Solaris extensions
    never do."""

    def _proc_member(self, tarfile_):  # the one place tarfile decides how to read a header
        if self.type in (tarfile.GNUTYPE_LONGLINK, tarfile.GNUTYPE_SPARSE, tarfile.XGLTYPE,
                         tarfile.SOLARIS_XHDTYPE):
            raise tarfile.HeaderError("a header type write_shard never writes (%r)" % self.type)
        if self.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME) and \
                self.size > MAX_PAX_HEADER:
            raise tarfile.HeaderError("an extended header of %d bytes" % self.size)
        return super()._proc_member(tarfile_)  # type: ignore[misc]  # tarfile's private hook


def _unpack(src, work: str, entry: ShardEntry) -> list[tuple[str, int]]:
    """The shard's members into `work` as numbered files; [(name, mtime)] in order."""
    reader = _Reading(src, entry.bytes)
    names: list[tuple[str, int]] = []
    seen: set[str] = set()
    data = 0
    try:
        # A stream mode reads only: the stub's file type also asks for write, seek and tell.
        with tarfile.open(  # type: ignore[call-overload]
                fileobj=reader, mode="r|", encoding="utf-8", errors="strict",
                bufsize=CHUNK, tarinfo=_ShardMember) as tar:
            for member in tar:
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    raise _Bad(f"member {member.name[:200]!r} is not a regular file")
                if member.sparse is not None or not set(member.pax_headers) <= PAX_KEYS:
                    raise _Bad(f"member {member.name[:200]!r}: sparse, or a pax header key "
                               "write_shard never writes")
                why = safe_member(member.name)
                if why:
                    raise _Bad(f"member {member.name[:200]!r}: {why}")
                if member.name in seen:
                    raise _Bad(f"member {member.name[:200]!r} appears twice")
                seen.add(member.name)
                data += member.size
                if len(names) >= entry.files or data > entry.file_bytes:
                    raise _Bad(f"more than the {entry.files} files of {entry.file_bytes} bytes "
                               "listed")
                part = os.path.join(work, str(len(names)))
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "wb") as out:
                    _copy(tar.extractfile(member), out, member.size, member.name)
                if 0 <= member.mtime < 1 << 33:
                    os.utime(part, (member.mtime, member.mtime))
                names.append((member.name, int(member.mtime)))
        while reader.read(CHUNK):  # the end-of-archive blocks count in the hash too
            pass
    except (tarfile.TarError, EOFError, UnicodeError, OverflowError, ValueError) as exc:
        raise _Bad(f"not a readable tar ({_first_line(exc)})") from None
    if reader.count != entry.bytes:
        raise _Bad(f"{reader.count} bytes, not {entry.bytes}")
    if reader.sha.hexdigest() != entry.sha256:
        raise _Bad("sha256 differs")
    if len(names) != entry.files or data != entry.file_bytes:
        raise _Bad(f"{len(names)} files of {data} bytes, not {entry.files} of {entry.file_bytes}")
    return names


def _copy(src, out, size: int, name: str) -> None:
    """Exactly `size` bytes from src to out; a byte more or less is refused as soon as seen."""
    written = 0
    while True:
        data = src.read(min(CHUNK, size - written + 1))
        if not data:
            break
        written += len(data)
        if written > size:
            raise _Bad(f"member {name[:200]!r} holds more than its {size} bytes")
        out.write(data)
    if written != size:
        raise _Bad(f"member {name[:200]!r} is cut short")


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _place(work: str, root: str, names: list[tuple[str, int]]) -> None:
    """Move the verified files into place; on any failure take back the ones moved."""
    prefixes = {"/".join(n.split("/")[:k]) for n, _ in names for k in range(1, n.count("/") + 1)}
    clash = prefixes & {n for n, _ in names}
    if clash:
        raise _Bad(f"{sorted(clash)[0][:200]!r} is both a file and a folder")
    placed: list[str] = []
    made: list[str] = []  # folders this shard created, taken back too on a failure
    try:
        for i, (name, _) in enumerate(names):
            parts = name.split("/")
            try:
                parent = safefile.make_folders(root, parts[:-1], made)
                target = os.path.join(parent, parts[-1])
                os.replace(os.path.join(work, str(i)), target)
            except safefile.NotFolder as exc:  # a link or a file already in dest on the way
                if exc.what == "a symbolic link":
                    raise _Bad(f"{name[:200]!r} would be written through a link") from None
                raise _Bad(f"{name[:200]!r}: {exc.filename[len(root) + 1:][:200]!r} is a file "
                           "in the destination, not a folder") from None
            except OSError as exc:  # a folder where the file goes, a name the disk refuses
                if exc.errno not in CLASHES:
                    raise
                raise _Bad(f"{name[:200]!r} cannot be written ({exc.strerror})") from None
            placed.append(target)
    except BaseException:
        for target in placed:
            os.unlink(target)
        for folder in reversed(made):
            try:
                os.rmdir(folder)
            except OSError:
                pass
        raise


def extract_shard(fileobj, dest: str | Path, entry: ShardEntry) -> int:
    """Read the shard from `fileobj` into `dest` (files only appear once the whole shard
    matched entry's bytes and sha256); returns the number of files. On a mismatch nothing of
    the shard remains and a ValueError names it. Existing files of the same names are
    replaced (a staging run again after an interruption)."""
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    work = tempfile.mkdtemp(prefix=f".{entry.name}.", dir=root)  # hidden: never pushed
    try:
        names = _unpack(fileobj, work, entry)
        _place(work, root, names)
    except _Bad as exc:
        raise ValueError(f"shard {entry.name} is not what the manifest says: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return len(names)


def verify_tree(dest: str | Path, manifest: Manifest) -> None:
    """The staged tree holds exactly the manifest's number of files and bytes (a stat per
    file; the contents were checked shard by shard as they came in). ValueError otherwise."""
    files, _ = scan(dest)
    size = sum(f.size for f in files)
    if len(files) != manifest.files or size != manifest.file_bytes:
        raise ValueError(f"{dest} holds {len(files)} files of {size} bytes; the manifest lists "
                         f"{manifest.files} of {manifest.file_bytes}")

