"""The job's bundle in the job store, read with the instance role and checked: its layout, its
manifest, each object (size before and while it comes, sha256 after), the archive's members.

Standard library only, Python 3.8+; shipped beside agent.py. Imports awsapi and
stage_fetch (the role's signed GETs), stage_plan (StageError) and safefile, and nothing else of
ours. bootstrap.py (an instance that starts its job by itself) is its user; the orchestrator
(providers/aws/jobbundle.py) imports the layout from here. The exit codes (EXIT_*) are the
bootstrap's, said here because every check ends in one (Failed).
"""

import hashlib
import html
import http.client
import json
import os
import re
import stat
import tarfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING

from . import safefile
from .stage_fetch import Fetcher, Source
from .stage_plan import StageError
from . import SHIPPED_AS
from .awsapi import IMDS_URL, RoleCredentials, object_url, sign_get, utc_now
from .job_status import BOOT_STATUS

if TYPE_CHECKING:  # 3.10's; the instance's Python may be older
    from typing import TypeGuard

# The bundle's layout below the job's prefix (the orchestrator imports these).
BUNDLE = "bundle/"
MANIFEST = "manifest.json"
ARCHIVE = "files.tar"
START = "start.sh"
JOB_DIR = "job/"
AGENT_DIR = "agent/"
VERSION = 1
STATUS_FILE = BOOT_STATUS  # in the job directory: booting, then how the bootstrap ended
STAGING = ".bundle"  # in the job directory: the objects while they are checked

MANIFEST_MAX_BYTES = 1 << 20
ARCHIVE_MAX_BYTES = 64 << 30
ARCHIVE_MAX_FILES = 500_000
FILE_MAX_BYTES = 16 << 20  # each object besides the archive
MAX_OBJECTS = 256
NAME_MAX = 4096
DEPTH_MAX = 64
AGENT_START_S = 15.0  # the agent's first status.json, as Host.start_agent waits for it
MANIFEST_POLL_S = 2.0  # how often an instance waiting for the bundle asks for it

EXIT_USAGE = 2
EXIT_CREDENTIALS = 3  # no role credentials from IMDSv2
EXIT_MANIFEST = 4  # no manifest (a partial upload), or one that is too large or not valid
EXIT_OBJECT = 5  # an object missing, of another size, or another sha256
EXIT_ARCHIVE = 6  # a member that cannot be unpacked safely; more files or bytes than listed
EXIT_WRITE = 7  # the job directory could not be written
EXIT_RESTORE = 8  # a stored checkpoint that could not be restored
EXIT_AGENT = 9  # the agent did not start
EXIT_ENDED = 10  # the job has ended (final.json): nothing to run; its group ended, power-off
EXIT_RESTARTS = 11  # past --max-restarts: final.json says preempted; group ended, power-off
EXIT_STORE = 12  # the job store's records (final.json, attempts/) could not be read or written
EXIT_GRANT = 13  # the job's upload grant has expired or is refused: no instance can record
EXIT_SWITCHED = 14  # a spot replacement past the deadline's switch: the group set to on-demand,
                   # this instance runs nothing and powers off (AWS launches an on-demand one)
RESUME = ".cloudtrain-resume"  # in the job directory: a checkpoint was restored, run.sh resumes

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}")
# a launcher, or a module of the host package in its folder (hosts.host_files)
AGENT_NAME = re.compile(r"(?:%s/)?[a-z_][a-z0-9_]{0,60}\.py" % SHIPPED_AS)
AGENT_VERSION = re.compile(r"agent-[0-9a-f]{12}")
PREFIX = re.compile(r"jobs/([A-Za-z0-9][A-Za-z0-9:+=,.@_-]{0,255}/)?"
                    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}/")
SHA256 = re.compile(r"[0-9a-f]{64}")
KEY = re.compile(r"jobs/[A-Za-z0-9:+=,.@_/-]{1,600}")  # a listed key we may read
LIST_MAX_KEYS = 100
LIST_MAX_BYTES = 1 << 20
CHUNK = 1 << 20


class Failed(Exception):
    """The bootstrap cannot go on: one line, and the exit code that says where it stopped."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _size(value) -> "TypeGuard[int]":
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_name(name):
    """Why an archive member's name cannot become a path below the job directory, or None."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if len(name) > NAME_MAX:
        return "a name longer than %d characters" % NAME_MAX
    if any(c in name for c in "\x00\n\r"):
        return "a NUL or line break in its name"
    if name.startswith("/"):
        return "an absolute name"
    parts = name.split("/")
    if len(parts) > DEPTH_MAX:
        return "deeper than %d folders" % DEPTH_MAX
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, `.` or `..` part in its name"
    if parts[0] == STAGING:
        return "a name in the bundle's own folder"
    return None


def check_manifest(doc, jobdir):
    """({name: (size, sha256)} of the manifest's objects, (files, bytes) of its archive, the
    agent's directory name); Failed when it is not one we wrote for this job directory."""
    def bad(why):
        return Failed(EXIT_MANIFEST, "the bundle's manifest is not valid: %s" % why)

    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise bad("not a version %d manifest" % VERSION)
    if doc.get("jobdir") != jobdir:
        raise bad("written for the job directory %r, not %r" % (str(doc.get("jobdir"))[:200],
                                                                jobdir))
    if not isinstance(doc.get("agent_dir"), str) or not AGENT_VERSION.fullmatch(doc["agent_dir"]):
        raise bad("no agent directory agent-<12 hex digits>")
    archive = doc.get("archive")
    if not isinstance(archive, dict) or not _size(archive.get("files")) \
            or not _size(archive.get("bytes")) or archive["files"] > ARCHIVE_MAX_FILES:
        raise bad("no archive file count and bytes (at most %d files)" % ARCHIVE_MAX_FILES)
    objects = doc.get("objects")
    if not isinstance(objects, list) or not objects or len(objects) > MAX_OBJECTS:
        raise bad("no list of 1 to %d objects" % MAX_OBJECTS)
    found = {}
    for item in objects:
        if not isinstance(item, dict):
            raise bad("an object that is not a JSON object")
        name, size, digest = item.get("name"), item.get("size"), item.get("sha256")
        if not isinstance(name, str) or not (
                name in (ARCHIVE, START)
                or (name.startswith(JOB_DIR) and JOB_NAME.fullmatch(name[len(JOB_DIR):]))
                or (name.startswith(AGENT_DIR)
                    and AGENT_NAME.fullmatch(name[len(AGENT_DIR):]))):
            raise bad("an object named %r" % str(name)[:100])
        if name in found:
            raise bad("the object %s twice" % name)
        limit = ARCHIVE_MAX_BYTES if name == ARCHIVE else FILE_MAX_BYTES
        if not _size(size) or size > limit:
            raise bad("%s's size is not a number of bytes up to %d" % (name, limit))
        if not isinstance(digest, str) or not SHA256.fullmatch(digest):
            raise bad("%s has no sha256" % name)
        found[name] = (size, digest)
    for name in (ARCHIVE, START, JOB_DIR + "run.sh", JOB_DIR + "job.json", AGENT_DIR + "agent.py"):
        if name not in found:
            raise bad("no %s" % name)
    return found, (archive["files"], archive["bytes"]), doc["agent_dir"]


class Bundle:
    """One job's bundle in S3, read with the instance role."""

    def __init__(self, bucket, prefix, region, endpoint=None, imds=IMDS_URL):
        self.bucket, self.prefix, self.region, self.endpoint = bucket, prefix, region, endpoint
        self.creds = RoleCredentials(imds)
        self.fetcher = Fetcher(threading.Event(), backoff_s=1.0)

    def key(self, name):
        return self.prefix + BUNDLE + name

    def url(self, name):
        return object_url(self.bucket, self.key(name), self.region, self.endpoint)

    def credentials(self):
        try:
            self.creds.get()
        except StageError as exc:
            raise Failed(EXIT_CREDENTIALS, str(exc)) from None

    def sign(self, url):
        """The headers that make a GET of `url` one of the role's (SigV4, now)."""
        return sign_get(url, self.region, self.creds.get(), utc_now())

    def manifest(self, pin=None, missing="the bundle was never uploaded, or its upload did "
                 "not finish"):
        """The bundle's manifest: Failed where there is none (an upload that did not finish;
        `missing` None: None then, for a caller that waits for it). `pin`: the sha256 its
        bytes must have (the launch template's user-data says it), or Failed."""
        return self.get_json(self.key(MANIFEST), MANIFEST_MAX_BYTES, EXIT_MANIFEST, missing,
                             denied_is_missing=missing is None, sha256=pin)

    def get_json(self, key, limit, code, missing=None, denied_is_missing=False, sha256=None):
        """The JSON object at `key`, read to at most `limit` bytes (one byte more refuses
        it); None where there is none and `missing` is None, else Failed(code). `sha256`:
        what its bytes must hash to, else Failed(code)."""
        data = self.get_bytes(key, limit, code, missing, denied_is_missing)
        if data is None:
            return None
        where = "s3://%s/%s" % (self.bucket, key)
        if len(data) > limit:
            raise Failed(code, "%s is larger than %d bytes: refused" % (where, limit))
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise Failed(code, "%s is not the one the job was launched with (its sha256 is "
                         "not the %s the instance's user-data names): someone rewrote the "
                         "job's bundle; refused" % (where, sha256))
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise Failed(code, "%s is not JSON" % where) from None

    def get_bytes(self, key, limit, code, missing=None, denied_is_missing=False):
        """The object at `key`, at most `limit` + 1 of its bytes (more than `limit`: it is
        larger); None where there is none and `missing` is None, else Failed(code).

        S3 answers a GET of a missing key with 403, not 404, to a caller without
        s3:ListBucket on the bucket (the instance role has none): `denied_is_missing` takes
        a 403 as "not there", for a key the same statement of the role covers as one read
        already (stream/ beside bundle/)."""
        url = object_url(self.bucket, key, self.region, self.endpoint)
        req = urllib.request.Request(url, headers=self.sign(url))
        where = "s3://%s/%s" % (self.bucket, key)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.read(limit + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404 or (exc.code == 403 and denied_is_missing):
                if missing is None:
                    return None
                raise Failed(code, "no %s: %s" % (where, missing)) from None
            if exc.code == 403:
                raise Failed(code, "access denied to %s (403): it is not there (%s; S3 says "
                             "403 for a missing key to a role that may not list the bucket), "
                             "or the instance role lacks s3:GetObject on it "
                             "(infra/instance-role-policy.json)"
                             % (where, missing or "never stored")) from None
            raise Failed(code, "reading %s was refused (HTTP %d)" % (where, exc.code)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise Failed(code, "reading %s failed: %s" % (where, exc)) from None

    def list_keys(self, prefix, code, limit=LIST_MAX_KEYS):
        """{key: size} of the objects below `prefix` (one ListObjectsV2 page of at most
        `limit`, signed with the role: it may list attempts/ only), every key checked against
        KEY; a key that is not one is left out. Failed(code) where S3 refuses."""
        query = urllib.parse.urlencode({"list-type": "2", "prefix": prefix,
                                        "max-keys": str(limit)}, quote_via=urllib.parse.quote)
        url = object_url(self.bucket, "", self.region, self.endpoint) + "?" + query
        req = urllib.request.Request(url, headers=self.sign(url))
        where = "s3://%s/%s" % (self.bucket, prefix)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = resp.read(LIST_MAX_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise Failed(code, "listing %s was refused (HTTP %d): the instance role needs "
                         "s3:ListBucket on jobs/*/attempts/* (infra/instance-role-policy.json)"
                         % (where, exc.code)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise Failed(code, "listing %s failed: %s" % (where, exc)) from None
        if len(body) > LIST_MAX_BYTES:
            raise Failed(code, "the listing of %s is larger than %d bytes: refused"
                         % (where, LIST_MAX_BYTES))
        text = body.decode("utf-8", "replace")
        found = {}
        for item in re.findall(r"<Contents>(.*?)</Contents>", text, re.S)[:limit]:
            named = re.search(r"<Key>([^<]*)</Key>", item)
            size = re.search(r"<Size>([0-9]{1,15})</Size>", item)
            key = named and html.unescape(named.group(1))
            if key and size and key.startswith(prefix) and KEY.fullmatch(key):
                found[key] = int(size.group(1))
        return found

    def download(self, name, size, digest, path):
        """The object into the new file `path`: exactly `size` bytes (Fetcher refuses a body
        of any other length), then its sha256 compared."""
        src = Source(self.bucket, self.key(name), self.url(name), self.region, self.creds,
                     presigned=False)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        try:
            try:
                self.fetcher.fetch(src, fd, 0, size, size, lambda n: None)
            except StageError as exc:
                raise Failed(EXIT_OBJECT, "bundle object %s: %s" % (name, exc)) from None
            if os.fstat(fd).st_size != size:
                raise Failed(EXIT_OBJECT, "bundle object %s is not %d bytes" % (name, size))
            h = hashlib.sha256()
            os.lseek(fd, 0, os.SEEK_SET)
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                h.update(chunk)
            if h.hexdigest() != digest:
                raise Failed(EXIT_OBJECT, "bundle object %s does not have the sha256 its "
                             "manifest lists: refused" % name)
        finally:
            os.close(fd)


def check_archive(path, files, nbytes):
    """The archive's members, each a regular file with a safe name, at most `files` of them
    and `nbytes` bytes in all; Failed (EXIT_ARCHIVE) naming the first that is not."""
    def bad(why):
        return Failed(EXIT_ARCHIVE, "the bundle's archive is refused: %s" % why)

    members, seen, total = [], set(), 0
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                why = check_name(member.name)
                if why:
                    raise bad("%r: %s" % (member.name[:200], why))
                if not member.isreg() or member.issparse():
                    what = "a link" if member.issym() or member.islnk() else \
                        "a folder" if member.isdir() else "not a regular file"
                    raise bad("%s is %s" % (member.name[:200], what))
                if member.name in seen:
                    raise bad("%s is in it twice" % member.name[:200])
                seen.add(member.name)
                total += member.size
                if len(seen) > files or total > nbytes:
                    raise bad("more than the %d files and %d bytes its manifest lists"
                              % (files, nbytes))
                members.append(member)
    except tarfile.TarError as exc:
        raise bad("not a tar archive (%s)" % exc) from None
    if len(members) != files or total != nbytes:
        raise bad("%d files and %d bytes, not the %d and %d its manifest lists"
                  % (len(members), total, files, nbytes))
    return members


def unpack(path, members, root):
    """Each checked member into root/<name>: folders made one at a time without following a
    link (safefile.make_folders), each file written beside its place and renamed over it
    (safefile.write_atomic: opened with O_NOFOLLOW), its mode's permission bits kept, and
    never more bytes than the member's size."""
    with tarfile.open(path, mode="r:") as tar:
        for member in members:
            parts = member.name.split("/")
            folder = safefile.make_folders(root, parts[:-1])
            target = os.path.join(folder, parts[-1])
            if os.path.lexists(target) and not stat.S_ISREG(os.lstat(target).st_mode):
                raise Failed(EXIT_ARCHIVE, "%s is in the job directory already and is not a "
                             "file" % member.name)
            safefile.write_atomic(target, _chunks(tar.extractfile(member), member),
                                  sync=False, mode=member.mode & 0o755 | 0o600)


def _chunks(src, member):
    """The member's bytes, a block at a time, never more than its size."""
    left = member.size
    while left:
        chunk = src.read(min(CHUNK, left))
        if not chunk:
            raise Failed(EXIT_ARCHIVE, "%s is cut short" % member.name)
        left -= len(chunk)
        yield chunk
