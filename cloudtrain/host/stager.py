"""Stage a job's datasets onto the instance's disk before training, following a plan.

Standard library only, Python 3.8+: copied beside agent.py and shards.py and run with the
host's python3:

    python3 stager.py PLAN_JSON STATUS_JSON

The plan (written by the orchestrator, trusted but checked for shape) lists datasets; each is
either already on the host (kind "path": dest becomes a link to it), tar shards in S3 with
their manifest (kind "shards"), or a plain prefix of S3 objects (kind "objects"). S3 objects
are read with ranged GETs by a pool of `workers` threads, through presigned URLs or signed
with the instance role's credentials (IMDSv2, SigV4). Everything that comes back over the
network is untrusted: sizes, bodies and status codes are checked; a shard's files appear in
dest only once the whole shard matched its sha256 (shards.extract_shard).

    stage(plan, status_path, out=sys.stdout, backoff_s=0.5) -> exit code
    sign_get(url, region, creds, now, extra_headers=None) -> headers
    object_url(bucket, key, region, endpoint=None) -> url
    quote_key(key) -> the key URI-encoded as SigV4 wants it

Exit 0 when every dataset is staged; 1 after one line `cloudtrain staging failed: <reason>`
on stderr; 143 / 130 after SIGTERM / SIGINT. STATUS_JSON is rewritten (atomically) every
progress_s seconds and at each dataset's end.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import hashlib
import hmac
import http.client
import json
import multiprocessing
import os
import queue
import re
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

try:  # in the package (the orchestrator, tests), or shipped beside it on the host
    from . import safefile, shards
except ImportError:
    import safefile
    import shards

PLAN_VERSION = 1
MARKER = ".cloudtrain-staged.json"
STAGING = ".staging"
PARTIAL = ".cloudtrain-partial.json"  # in a copy under way: the version it is of
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
HEX = re.compile(r"[0-9a-f]+")
MD5 = re.compile(r"[0-9a-f]{32}")
TIMEOUT_S = 60.0
# A range that trickles in (audit F38: one byte a second kept one alive for ever, each read
# inside TIMEOUT_S) is cut and retried: when fewer than STALL_BYTES came in STALL_S (or
# nothing did), or when it takes longer than RANGE_MIN_S plus its bytes at FLOOR_RATE. S3
# serves one connection at tens of MB/s; a middlebox holding it open does not.
FLOOR_RATE = 1_000_000  # bytes per second
RANGE_MIN_S = 30.0
STALL_S = 20.0
STALL_BYTES = 64 << 10
IMDS_TIMEOUT_S = 10.0
RETRIES = 5  # after the first try
BACKOFF_CAP_S = 8.0
ERROR_BODY_BYTES = 64 << 10
READ_CHUNK = 256 << 10
# Shards are extracted in processes of their own: Python's tarfile reads a stream at a few
# hundred MB/s per core (benchmarks/data_staging.py), slower than an instance's disk.
MAX_EXTRACTORS = 8
REFRESH_S = 300.0  # credentials are renewed when fewer seconds than this remain
MARKER_BYTES = 1 << 20
UNSIGNED = "UNSIGNED-PAYLOAD"
NO_PROFILE = ("the instance has no instance profile: set instance_profile in config.yaml "
              "(infra/README.md)")


class StageError(Exception):
    """A one-line reason staging failed."""


class _Retry(Exception):
    """A fault worth another try (connection, timeout, 5xx, 429, a body of the wrong size)."""


class _Stopped(Exception):
    """Staging is stopping (a failure elsewhere, or a signal)."""


# -- the plan -----------------------------------------------------------------------------


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise StageError("plan: " + what)


def _is_int(v, low: int, high: int) -> bool:
    return type(v) is int and low <= v <= high


def check_plan(plan) -> list:
    """Copies of the plan's datasets (shards ones with their parsed manifest as "_manifest"),
    every field this stager reads checked; StageError otherwise."""
    _need(isinstance(plan, dict), "not a JSON object")
    _need(plan.get("version") == PLAN_VERSION and type(plan.get("version")) is int,
          "version is not %d (a newer cloudtrain wrote it?)" % PLAN_VERSION)
    _need(_is_int(plan.get("workers"), 1, 256), "workers is not an integer from 1 to 256")
    _need(_is_int(plan.get("part_bytes"), 1 << 20, shards.MAX_OBJECT_BYTES),
          "part_bytes is not an integer of at least 1048576")
    p = plan.get("progress_s", 5)
    _need(type(p) in (int, float) and 0 < p <= 86400, "progress_s is not a positive number")
    datasets = plan.get("datasets")
    _need(isinstance(datasets, list), "datasets is not a list")
    names = set()
    checked = []
    for i, d in enumerate(datasets):
        where = "dataset %d: " % i
        _need(isinstance(d, dict), where + "not an object")
        d = dict(d)  # the caller's plan is left as it was
        checked.append(d)
        name = d.get("name")
        _need(isinstance(name, str) and NAME.fullmatch(name) is not None,
              where + "name is not like [a-z0-9][a-z0-9_.-]*")
        where = "dataset %s: " % name
        _need(name not in names, where + "named twice")
        names.add(name)
        dest = d.get("dest")
        _need(isinstance(dest, str) and os.path.isabs(dest) and "\x00" not in dest
              and os.path.normpath(dest) != "/", where + "dest is not an absolute path")
        kind = d.get("kind")
        _need(kind in ("shards", "objects", "path"), where + "kind is not shards, objects or path")
        if kind == "path":
            _need(isinstance(d.get("path"), str) and os.path.isabs(d["path"]),
                  where + "path is not an absolute path")
            _need(isinstance(d.get("preread", False), bool), where + "preread is not true/false")
            continue
        for key in ("bucket", "region"):
            _need(isinstance(d.get(key), str) and d[key] != "", where + key + " is not a name")
        _need(isinstance(d.get("prefix", ""), str), where + "prefix is not a string")
        ep = d.get("endpoint")
        _need(ep is None or (isinstance(ep, str) and ep.startswith(("http://", "https://"))),
              where + "endpoint is not null or an http(s) URL")
        auth = d.get("auth")
        _need(auth in ("presigned", "role"), where + "auth is not presigned or role")
        if auth == "role":
            _need(isinstance(plan.get("imds_url"), str)
                  and plan["imds_url"].startswith(("http://", "https://")),
                  "imds_url is not an http URL (auth role needs it)")
        ident = d.get("identity")
        _need(isinstance(ident, str) and HEX.fullmatch(ident) is not None,
              where + "identity is not hex")
        if kind == "shards":
            try:
                d["_manifest"] = shards.Manifest.from_json(json.dumps(d.get("manifest")))
            except ValueError as exc:
                raise StageError("plan: " + where + str(exc)) from None
            if auth == "presigned":
                urls = d.get("shard_urls")
                _need(isinstance(urls, list) and len(urls) == len(d["_manifest"].shards)
                      and all(isinstance(u, str) and u.startswith(("http://", "https://"))
                              for u in urls),
                      where + "shard_urls is not one URL per manifest shard")
        else:
            objs = d.get("objects")
            _need(isinstance(objs, list), where + "objects is not a list")
            seen = set()
            for j, o in enumerate(objs):
                w = where + "object %d: " % j
                _need(isinstance(o, dict), w + "not an object")
                _need(isinstance(o.get("key"), str) and o["key"] != "", w + "key is not a string")
                _need(isinstance(o.get("path"), str), w + "path is not a string")
                why = shards.safe_member(o["path"])
                if why:
                    raise StageError("plan: %sunsafe path %r: %s" % (w, o["path"][:200], why))
                _need(o["path"] not in seen, w + "path %r listed twice" % o["path"][:200])
                seen.add(o["path"])
                _need(_is_int(o.get("bytes"), 0, shards.MAX_OBJECT_BYTES),
                      w + "bytes is not a size")
                md5 = o.get("md5")
                _need(md5 is None or (isinstance(md5, str) and MD5.fullmatch(md5) is not None),
                      w + "md5 is not null or 32 lowercase hex digits")
                if auth == "presigned":
                    _need(isinstance(o.get("url"), str)
                          and o["url"].startswith(("http://", "https://")),
                          w + "url is not an http(s) URL")
            _file_and_folder(where, d["bucket"], objs)
    return checked


def _file_and_folder(where: str, bucket: str, objects: list) -> None:
    """Two objects where one needs the other's path as a folder (keys `p/a` and `p/a/b`, which
    S3 allows): no disk can hold both. StageError naming them."""
    keys = {o["path"]: o["key"] for o in objects}
    for path in keys:
        parts = path.split("/")
        for n in range(1, len(parts)):
            folder = "/".join(parts[:n])
            if folder in keys:
                raise StageError("plan: %sobjects s3://%s/%s and s3://%s/%s: %s needs %s as a "
                                 "folder, and %s is a file" % (
                                     where, bucket, keys[folder][:300], bucket, keys[path][:300],
                                     path[:300], folder[:300], folder[:300]))


# -- S3 addresses and SigV4 ----------------------------------------------------------------


def quote_key(key: str) -> str:
    """Every byte of the key's UTF-8 except A-Z a-z 0-9 - _ . ~ percent-encoded, '/' kept."""
    return urllib.parse.quote(key, safe="/~")


def object_url(bucket: str, key: str, region: str, endpoint=None) -> str:
    k = quote_key(key)
    if endpoint:
        return "%s/%s/%s" % (endpoint.rstrip("/"), bucket, k)
    if "." in bucket:
        return "https://s3.%s.amazonaws.com/%s/%s" % (region, bucket, k)
    return "https://%s.s3.%s.amazonaws.com/%s" % (bucket, region, k)


def _host(parts) -> str:
    host = parts.hostname or ""
    if ":" in host:
        host = "[%s]" % host
    port = parts.port
    if port is None or (parts.scheme, port) in (("http", 80), ("https", 443)):
        return host
    return "%s:%d" % (host, port)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def sign_get(url: str, region: str, creds: dict, now, extra_headers=None) -> dict:
    """The headers that make a GET of `url` (its path already URI-encoded) an S3 SigV4
    request at `now` (a UTC datetime): Host, X-Amz-Date, X-Amz-Content-SHA256
    (UNSIGNED-PAYLOAD), X-Amz-Security-Token when creds has a Token, Authorization, plus
    `extra_headers` (unsigned). creds: {AccessKeyId, SecretAccessKey, Token (optional)}."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed = {"host": _host(parts), "x-amz-content-sha256": UNSIGNED, "x-amz-date": amz_date}
    token = creds.get("Token")
    if token:
        signed["x-amz-security-token"] = token
    query = sorted((urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~"))
                   for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    names = sorted(signed)
    canonical = "\n".join([
        "GET", parts.path or "/", "&".join("%s=%s" % kv for kv in query),
        "".join("%s:%s\n" % (n, " ".join(signed[n].split())) for n in names),
        ";".join(names), UNSIGNED])
    scope = "%s/%s/s3/aws4_request" % (day, region)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
    key = _hmac(("AWS4" + creds["SecretAccessKey"]).encode("utf-8"), day)
    for part in (region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    headers = {"Host": signed["host"], "X-Amz-Date": amz_date, "X-Amz-Content-SHA256": UNSIGNED}
    if token:
        headers["X-Amz-Security-Token"] = token
    headers["Authorization"] = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, " \
        "Signature=%s" % (creds["AccessKeyId"], scope, ";".join(names), signature)
    if extra_headers:
        headers.update(extra_headers)
    return headers


def _parse_expiration(text) -> float:
    try:
        return datetime.datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        raise StageError("the instance metadata service gave credentials with an unreadable "
                         "Expiration %r" % str(text)[:40]) from None


class RoleCredentials:
    """The instance role's credentials from IMDSv2, renewed (once, under a lock) when fewer
    than five minutes remain before they expire."""

    def __init__(self, imds_url: str, clock=time.time):
        self.imds = imds_url.rstrip("/")
        self.clock = clock
        self.lock = threading.Lock()
        self.creds = None
        self.expires = 0.0

    def _call(self, method: str, path: str, headers: dict) -> bytes:
        req = urllib.request.Request(self.imds + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=IMDS_TIMEOUT_S) as resp:
                return resp.read(1 << 20)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise StageError("the instance metadata service at %s did not answer (%s)"
                             % (self.imds, _reason(exc))) from None

    def _fetch(self) -> dict:
        try:
            token = self._call("PUT", "/latest/api/token",
                               {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}).decode().strip()
            auth = {"X-aws-ec2-metadata-token": token}
            listing = "/latest/meta-data/iam/security-credentials/"
            try:
                roles = self._call("GET", listing, auth).decode("utf-8", "replace")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    raise StageError(NO_PROFILE) from None
                raise
            role = (roles.splitlines() or [""])[0].strip()
            if not role:
                raise StageError(NO_PROFILE)
            doc = json.loads(self._call("GET", listing + urllib.parse.quote(role), auth))
        except urllib.error.HTTPError as exc:
            raise StageError("the instance metadata service refused %s (HTTP %d)"
                             % (exc.url, exc.code)) from None
        except (ValueError, UnicodeError):
            raise StageError("the instance metadata service gave unreadable credentials") \
                from None
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in
                                                ("AccessKeyId", "SecretAccessKey")):
            raise StageError("the instance metadata service gave no AccessKeyId and "
                             "SecretAccessKey for the role")
        token = doc.get("Token")
        return {"AccessKeyId": doc["AccessKeyId"], "SecretAccessKey": doc["SecretAccessKey"],
                "Token": token if isinstance(token, str) else None,
                "Expiration": _parse_expiration(doc.get("Expiration"))}

    def get(self) -> dict:
        with self.lock:
            if self.creds is None or self.expires - self.clock() < REFRESH_S:
                self.creds = self._fetch()
                self.expires = self.creds["Expiration"]
            return self.creds


# -- HTTP ---------------------------------------------------------------------------------


def _bound(conn, deadline: float) -> None:
    """The connection's next read waits at most until `deadline`, and at most STALL_S."""
    sock = getattr(conn, "sock", None)
    if sock is not None:
        sock.settimeout(max(0.05, min(TIMEOUT_S, STALL_S, deadline - time.monotonic())))


def _stalled(got: int) -> str:
    return "stalled: %d byte(s) in %g s (less than %d)" % (got, STALL_S, STALL_BYTES)


def _slow(done: int, length: int, seconds: float) -> str:
    return "%d of %d bytes in %.0f s: slower than %g MB/s" % (done, length, seconds,
                                                             FLOOR_RATE / 1e6)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _error_code(body: bytes) -> str:
    m = re.search(rb"<Code>([A-Za-z0-9.]{1,64})</Code>", body)
    return m.group(1).decode() if m else ""


class _Source:
    """Where one object is read from: a presigned URL, or bucket/key signed with the role."""

    def __init__(self, bucket: str, key: str, url: str, region: str, creds, presigned: bool):
        self.bucket, self.key, self.url, self.region = bucket, key, url, region
        self.creds, self.presigned = creds, presigned
        # Encrypted with KMS or a customer key (S3 says so on each GET): its ETag is then no
        # MD5 of the bytes, so only its size can be checked.
        self.etag_not_md5 = False

    @property
    def name(self) -> str:
        return "s3://%s/%s" % (self.bucket, self.key)

    def headers(self, extra: dict) -> dict:
        if self.presigned:
            return dict(extra)
        now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
        return sign_get(self.url, self.region, self.creds.get(), now, extra)


class _Connections(threading.local):
    """One HTTP(S) connection per worker thread per host, reused while it stays clean."""

    def __init__(self):
        self.conns = {}


class Stager:
    def __init__(self, plan: dict, status_path, out, backoff_s: float):
        self.plan = plan
        self.status_path = str(status_path)
        self.out = out
        self.backoff_s = backoff_s
        # From the plan once check_plan has passed it (run): it may not even be an object.
        self.workers, self.part, self.progress_s = 1, 1 << 20, 5.0
        self.extractors = max(1, min(MAX_EXTRACTORS, os.cpu_count() or 1))
        self.local = _Connections()
        self.active = set()  # connections in use, shut down to stop promptly
        self.active_lock = threading.Lock()
        self.stop = threading.Event()
        self.signum = None
        self.role = None
        self.started = time.time()
        self.status = {"state": "staging", "started_at": self.started, "ended_at": None,
                       "error": None, "datasets": []}

    # - connections --------------------------------------------------------------------

    def _conn(self, parts):
        key = (parts.scheme, parts.hostname, parts.port)
        conn = self.local.conns.get(key)
        if conn is None:
            cls = http.client.HTTPSConnection if parts.scheme == "https" else \
                http.client.HTTPConnection
            conn = cls(parts.hostname, parts.port, timeout=TIMEOUT_S)
            self.local.conns[key] = conn
        return key, conn

    def _drop(self, key, conn) -> None:
        self.local.conns.pop(key, None)
        try:
            conn.close()
        except Exception:
            pass

    def _interrupt_connections(self) -> None:
        with self.active_lock:
            conns = list(self.active)
        for conn in conns:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # - one ranged GET -----------------------------------------------------------------

    def fetch(self, src: _Source, fd: int, start: int, length: int, size: int, counted) -> None:
        """Bytes [start, start+length) of the `size`-byte object into fd at `start`, retried
        on transient faults; StageError for anything final."""
        attempt = 0
        while True:
            if self.stop.is_set():
                raise _Stopped()
            try:
                self._fetch_once(src, fd, start, length, size, counted)
                return
            except _Retry as exc:
                if attempt >= RETRIES:
                    raise StageError("reading %s failed %d times, last: %s" % (
                        src.name, attempt + 1, exc)) from None
                delay = min(self.backoff_s * (2 ** attempt), BACKOFF_CAP_S)
                attempt += 1
                if self.stop.wait(delay):
                    raise _Stopped() from None

    def _fetch_once(self, src, fd, start, length, size, counted) -> None:
        parts = urllib.parse.urlsplit(src.url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        whole = start == 0 and length == size
        extra = {} if size == 0 else {"Range": "bytes=%d-%d" % (start, start + length - 1)}
        if src.presigned:
            extra["Host"] = _host(parts)
        key, conn = self._conn(parts)
        done = 0
        clean = False
        deadline = time.monotonic() + RANGE_MIN_S + length / FLOOR_RATE
        with self.active_lock:
            self.active.add(conn)
        try:
            try:
                conn.request("GET", path, headers=src.headers(extra))
                _bound(conn, deadline)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                if self.stop.is_set():
                    raise _Stopped() from None
                raise _Retry(_reason(exc)) from None
            status = resp.status
            if status not in (200, 206):
                try:
                    body = resp.read(ERROR_BODY_BYTES)
                except (OSError, http.client.HTTPException):
                    body = b""
                self._refuse(src, status, _error_code(body))
            if resp.getheader("x-amz-server-side-encryption", "").startswith("aws:kms") or \
                    resp.getheader("x-amz-server-side-encryption-customer-algorithm"):
                src.etag_not_md5 = True
            if status == 200 and not whole:
                raise StageError("%s: the server answered a range request with the whole "
                                 "object (HTTP 200)" % src.name)
            if status == 206:
                cr = resp.getheader("Content-Range", "")
                want = "bytes %d-%d/%d" % (start, start + length - 1, size)
                if cr.replace(" ", "") != want.replace(" ", ""):
                    m = re.fullmatch(r"bytes \d+-\d+/(\d+)", cr.strip())
                    if m and int(m.group(1)) != size:
                        raise StageError("%s is %s bytes, not the %d its source lists: push it "
                                         "again" % (src.name, m.group(1), size))
                    raise _Retry("Content-Range %r, not %r" % (cr[:100], want))
            declared = resp.getheader("Content-Length")
            if declared is not None and declared.strip() != str(length):
                raise _Retry("a body of %s bytes, not %d" % (declared.strip()[:20], length))
            began = time.monotonic()
            window_at, window = began, 0  # the stall detector's window
            while done <= length:
                try:
                    _bound(conn, deadline)  # no single read waits past the deadline
                    # read1: what has come in, not a whole chunk (a trickle returns at once);
                    # at the end read, which also ends the response (read1(0) would not)
                    data = resp.read1(min(READ_CHUNK, length - done)) if done < length \
                        else resp.read(1)
                except (OSError, http.client.HTTPException) as exc:
                    if self.stop.is_set():
                        raise _Stopped() from None
                    now = time.monotonic()
                    if now >= deadline:
                        raise _Retry(_slow(done, length, now - began)) from None
                    if isinstance(exc, socket.timeout) and now - window_at >= STALL_S:
                        raise _Retry(_stalled(window)) from None
                    raise _Retry("the body broke off after %d of %d bytes (%s)"
                                 % (done, length, _reason(exc))) from None
                if not data:
                    break
                now = time.monotonic()
                window += len(data)
                if now - window_at >= STALL_S:
                    if window < STALL_BYTES:
                        raise _Retry(_stalled(window))
                    window_at, window = now, 0
                if now >= deadline and done + len(data) < length:
                    raise _Retry(_slow(done + len(data), length, now - began))
                if done + len(data) > length:
                    raise _Retry("a body longer than the %d bytes asked" % length)
                self._write(fd, data, start + done)
                done += len(data)
                counted(len(data))
            if done != length:
                if self.stop.is_set():
                    raise _Stopped()
                raise _Retry("a body cut short: %d of %d bytes" % (done, length))
            clean = not resp.will_close
        except BaseException:
            if done:
                counted(-done)
            raise
        finally:
            with self.active_lock:
                self.active.discard(conn)
            if not clean:
                self._drop(key, conn)

    def _write(self, fd: int, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def _refuse(self, src: _Source, status: int, code: str) -> None:
        said = " (%d%s)" % (status, ", " + code if code else "")
        if status == 404 or code in ("NoSuchKey", "NoSuchBucket"):
            raise StageError("no object %s (404): the dataset is not where its source says; "
                             "push it again or fix the source" % src.name)
        if status == 403:
            if src.presigned:
                raise StageError("access denied to %s (403): the presigned link was refused "
                                 "(expired or revoked)" % src.name)
            raise StageError("access denied to %s (403): the instance role needs s3:GetObject "
                             "on it (infra/instance-role-policy.json)" % src.name)
        if status >= 500 or status == 429 or code == "SlowDown":
            raise _Retry("HTTP %d%s" % (status, " " + code if code else ""))
        raise StageError("reading %s was refused%s" % (src.name, said))

    # - status and progress ------------------------------------------------------------

    def write_status(self) -> None:
        try:
            safefile.write_atomic(self.status_path,
                                  (json.dumps(self.status, indent=1) + "\n").encode("ascii"),
                                  sync=False)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise

    def progress(self, rec: dict, t0: float) -> None:
        rec["seconds"] = round(time.time() - t0, 3)
        rate = rec["bytes_done"] / rec["seconds"] if rec["seconds"] > 0 else 0.0
        rec["mb_s"] = round(rate / 1e6, 3)
        total = rec["bytes_total"]
        pct = int(100 * rec["bytes_done"] / total) if total else 100
        line = "cloudtrain staging %s: %.1f of %.1f GB (%d%%), %s of %s files, %.0f MB/s" % (
            rec["name"], rec["bytes_done"] / 1e9, total / 1e9, pct,
            "{:,}".format(rec["files_done"]), "{:,}".format(rec["files_total"]), rate / 1e6)
        if rec["state"] == "staging" and rate > 0:
            left = (total - rec["bytes_done"]) / rate
            line += ", about %s left" % (
                "%d min" % round(left / 60) if left >= 90 else "%d s" % max(1, round(left)))
        elif rec["state"] != "staging":
            line += ", " + rec["state"]
        print(line, file=self.out, flush=True)
        self.write_status()

    # - running ------------------------------------------------------------------------

    def run(self) -> int:
        datasets = None
        try:
            datasets = check_plan(self.plan)
            self.workers, self.part = self.plan["workers"], self.plan["part_bytes"]
            self.progress_s = float(self.plan.get("progress_s", 5))
            for d in datasets:
                self.status["datasets"].append({
                    "name": d["name"], "kind": d["kind"], "state": "waiting",
                    "bytes_total": 0, "bytes_done": 0, "files_total": 0, "files_done": 0,
                    "mb_s": 0.0, "seconds": 0.0})
            self.write_status()
            for d, rec in zip(datasets, self.status["datasets"]):
                self._check_signal()
                self.dataset(d, rec)
        except StageError as exc:
            return self._fail(str(exc))
        except OSError as exc:  # the status file or dest cannot be written
            return self._fail(_disk_reason(exc))
        except Exception as exc:  # a bug: the status says so, the traceback follows
            self._fail("internal error (%s: %s)" % (type(exc).__name__, _reason(exc)))
            raise
        self.status.update(state="staged", ended_at=time.time())
        self.write_status()
        return 0

    def _fail(self, reason: str) -> int:
        interrupted = self.signum is not None
        if interrupted:
            reason = "interrupted"
        self.status.update(state="failed", ended_at=time.time(), error=reason)
        for rec in self.status["datasets"]:
            if rec["state"] == "staging":
                rec["state"] = "failed"
        try:
            self.write_status()
        except OSError:
            pass
        print("cloudtrain staging failed: %s" % reason, file=sys.stderr, flush=True)
        if interrupted:
            return 130 if self.signum == signal.SIGINT else 143
        return 1

    def on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        self.stop.set()

    def _check_signal(self) -> None:
        if self.signum is not None:
            raise StageError("interrupted")

    def dataset(self, d: dict, rec: dict) -> None:
        t0 = time.time()
        if d["kind"] == "path":
            rec["state"] = "staging"
            self._link(d)
            if d.get("preread"):
                self._preread(d["path"], rec, t0)
            rec["state"] = "staged"
            self.progress(rec, t0)
            return
        dest = d["dest"].rstrip("/")
        if d["kind"] == "shards":
            m = d["_manifest"]
            rec["bytes_total"], rec["files_total"] = m.bytes, m.files
        else:
            rec["bytes_total"] = sum(o["bytes"] for o in d["objects"])
            rec["files_total"] = len(d["objects"])
        parent, base = os.path.split(dest)
        os.makedirs(parent, exist_ok=True)
        # One staging of a folder at a time (two jobs on one host, the local backend's shared
        # data dir): the second waits, then finds the copy made.
        with _Lock(os.path.join(parent, ".%s.cloudtrain-lock" % base), self.out, d["name"]):
            if _marker_identity(os.path.join(dest, MARKER)) == d["identity"]:
                rec["state"] = "skipped"
                rec["bytes_done"], rec["files_done"] = rec["bytes_total"], rec["files_total"]
                self.progress(rec, t0)
                return
            _check_replaceable(dest)
            rec["state"] = "staging"
            self._copy(d, rec, t0, os.path.join(parent, ".%s.cloudtrain-partial" % base))
            _swap_in(os.path.join(parent, ".%s.cloudtrain-partial" % base), dest,
                     os.path.join(parent, ".%s.cloudtrain-old" % base))
        rec["state"] = "staged"
        self.progress(rec, t0)

    def _copy(self, d: dict, rec: dict, t0: float, partial: str) -> None:
        """The dataset into `partial`, verified and marked: what replaces dest whole. A
        partial copy of this same version (a staging cut short) is continued."""
        marker = os.path.join(partial, MARKER)
        if _read_doc(os.path.join(partial, PARTIAL)).get("identity") != d["identity"]:
            shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial, exist_ok=True)
        safefile.write_json(os.path.join(partial, PARTIAL), {"identity": d["identity"]},
                            sync=False)
        if d["auth"] == "role" and self.role is None:
            self.role = RoleCredentials(self.plan["imds_url"])
        if d["auth"] == "role":
            self.role.get()  # no instance profile: say so before any worker starts
        staging = os.path.join(partial, STAGING)
        shutil.rmtree(staging, ignore_errors=True)
        os.mkdir(staging, 0o700)
        try:
            _Run(self, dict(d, dest=partial, _shown_dest=d["dest"]), rec, t0, staging).go()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if d["kind"] == "shards":
            try:
                shards.verify_tree(partial, d["_manifest"])
            except ValueError as exc:
                raise StageError(str(exc)) from None
        os.unlink(os.path.join(partial, PARTIAL))
        safefile.write_json(marker, {"identity": d["identity"], "name": d["name"],
                                     "files": rec["files_total"], "bytes": rec["bytes_total"],
                                     "staged_at": time.time()}, sync=False)

    def _preread(self, root: str, rec: dict, t0: float) -> None:
        """Read every file below root once, `workers` at a time: a volume made from an EBS
        snapshot fetches each block from S3 on its first read, so an epoch that reads it
        would run at that speed; paid here, it is the staging phase's (timed, priced)."""
        files = []
        for top, dirs, names in os.walk(root):
            dirs[:] = sorted(n for n in dirs if not os.path.islink(os.path.join(top, n)))
            for n in names:
                p = os.path.join(top, n)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    files.append((p, st.st_size))
        rec["files_total"], rec["bytes_total"] = len(files), sum(n for _, n in files)
        lock = threading.Lock()
        todo = iter(files)
        errors = []
        last = [time.time()]

        def reader():
            while not self.stop.is_set() and not errors:
                with lock:
                    item = next(todo, None)
                if item is None:
                    return
                try:
                    with open(item[0], "rb", buffering=0) as f:
                        while not self.stop.is_set():
                            chunk = f.read(1 << 20)
                            if not chunk:
                                break
                            with lock:
                                rec["bytes_done"] += len(chunk)
                except OSError as exc:
                    errors.append("cannot read %s: %s" % (item[0], _reason(exc)))
                    return
                with lock:
                    rec["files_done"] += 1
                    tick = time.time() - last[0] >= float(self.plan.get("progress_s", 5))
                    if tick:
                        last[0] = time.time()
                if tick:
                    self.progress(rec, t0)

        threads = [threading.Thread(target=reader, daemon=True)
                   for _ in range(int(self.plan.get("workers", 16)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._check_signal()
        if errors:
            raise StageError(errors[0])

    def _link(self, d: dict) -> None:
        path, dest = d["path"], d["dest"]
        if not os.path.isdir(path):
            raise StageError("%s is not a folder on this host: the dataset's path must exist "
                             "before the job starts" % path)
        if os.path.islink(dest):
            if os.readlink(dest) == path:
                return
            os.unlink(dest)
        elif os.path.lexists(dest):
            if os.path.realpath(dest) == os.path.realpath(path):
                return
            raise StageError("%s already exists and is not a link to %s: move it away or "
                             "choose another dest" % (dest, path))
        parent = os.path.dirname(dest.rstrip("/"))
        os.makedirs(parent, exist_ok=True)
        tmp = "%s.cloudtrain-link.%d" % (dest.rstrip("/"), os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(path, tmp)
        os.replace(tmp, dest.rstrip("/"))


class _Lock:
    """An exclusive flock on `path` for the staging of one folder; says so while it waits."""

    def __init__(self, path: str, out, name: str):
        self.path, self.out, self.name, self.fd = path, out, name, None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("cloudtrain staging %s: waiting for another job staging it on this host"
                  % self.name, file=self.out, flush=True)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock


def _read_doc(path: str) -> dict:
    try:
        if os.path.islink(path):
            return {}
        with open(path, "rb") as f:
            doc = json.loads(f.read(MARKER_BYTES))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _check_replaceable(dest: str) -> None:
    """dest may be replaced by a staged copy: absent, a link (an earlier `path` dataset), an
    empty folder, or an earlier copy of ours (its marker says so). A folder of files that
    cloudtrain did not stage is never deleted: the staging stops and says so."""
    if not os.path.lexists(dest) or os.path.islink(dest):
        return
    if not os.path.isdir(dest):
        raise StageError("%s is a file, not a dataset folder: move it away" % dest)
    if os.path.exists(os.path.join(dest, MARKER)) or not os.listdir(dest):
        return
    raise StageError("%s already holds files cloudtrain did not stage: move them away, or "
                     "read them as they are with --data NAME=%s" % (dest, dest))


def _swap_in(partial: str, dest: str, old: str) -> None:
    """Put the finished copy in place of dest with renames (a reader sees the old tree or
    the new one, never a mix), then delete the old one."""
    shutil.rmtree(old, ignore_errors=True)
    if os.path.islink(dest):
        os.unlink(dest)
    elif os.path.lexists(dest):
        os.rename(dest, old)
    os.rename(partial, dest)
    shutil.rmtree(old, ignore_errors=True)


def _disk_reason(exc: OSError) -> str:
    where = getattr(exc, "filename", None) or "disk"
    return "cannot write %s: %s" % (where, exc.strerror or exc)


def _marker_identity(marker: str):
    try:
        if os.path.islink(marker):
            return None
        with open(marker, "rb") as f:
            doc = json.loads(f.read(MARKER_BYTES))
    except (OSError, ValueError):
        return None
    return doc.get("identity") if isinstance(doc, dict) else None


class _Job:
    """One object to download into a temp file: a shard, or one file of kind objects."""

    def __init__(self, index: int, src: _Source, size: int, tmp: str, item):
        self.index, self.src, self.size, self.tmp, self.item = index, src, size, tmp, item
        self.fd = None
        self.left = 0


class _Run:
    """One dataset's download: `workers` threads fetch ranges, 2 threads finish files."""

    def __init__(self, stager: Stager, d: dict, rec: dict, t0: float, staging: str):
        self.s, self.d, self.rec, self.t0, self.staging = stager, d, rec, t0, staging
        self.dest = d["dest"]
        self.shown = d.get("_shown_dest", self.dest)  # the folder the user knows it by
        self.cond = threading.Condition()
        self.error = None
        self.tasks = queue.Queue()
        self.finish_q = queue.Queue()
        self.queued = 0  # range tasks not yet taken by a worker
        self.unfinished = 0  # downloaded jobs not yet extracted / placed
        self.open_jobs = 0
        self.opened = []
        self.pool = None  # extraction processes (shards)
        self.root = os.path.realpath(self.dest)

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()
        self.s.stop.set()

    def counted(self, n: int) -> None:
        with self.cond:
            self.rec["bytes_done"] += n

    def jobs(self):
        d = self.d
        presigned = d["auth"] == "presigned"
        region, bucket, endpoint = d["region"], d["bucket"], d.get("endpoint")
        prefix = d.get("prefix", "").strip("/")
        if d["kind"] == "shards":
            for i, entry in enumerate(d["_manifest"].shards):
                key = "%s/shards/%s" % (prefix, entry.name) if prefix else "shards/" + entry.name
                url = d["shard_urls"][i] if presigned else object_url(bucket, key, region,
                                                                      endpoint)
                src = _Source(bucket, key, url, region, self.s.role, presigned)
                yield _Job(i, src, entry.bytes, os.path.join(self.staging, entry.name), entry)
        else:
            for i, o in enumerate(d["objects"]):
                url = o["url"] if presigned else object_url(bucket, o["key"], region, endpoint)
                src = _Source(bucket, o["key"], url, region, self.s.role, presigned)
                yield _Job(i, src, o["bytes"], os.path.join(self.staging, "obj-%d" % i), o)

    def go(self) -> None:
        s = self.s
        s.stop.clear()
        finishers = 2
        if self.d["kind"] == "shards":
            # Forked before any thread of this run starts (a fork copies no lock held by
            # another thread); `fork` also works where the script runs as __main__.
            finishers = s.extractors
            self.pool = multiprocessing.get_context("fork").Pool(
                finishers, initializer=_extractor_signals)
        threads = [threading.Thread(target=self.worker, name="stage-get-%d" % i, daemon=True)
                   for i in range(s.workers)]
        threads += [threading.Thread(target=self.finisher, name="stage-put-%d" % i,
                                     daemon=True) for i in range(finishers)]
        for t in threads:
            t.start()
        last = time.monotonic()
        try:
            for job in self.jobs():
                with self.cond:
                    while self.error is None and s.signum is None and not (
                            self.queued < s.workers and self.unfinished <= finishers):
                        self.cond.wait(0.2)
                        last = self._tick(last)
                    if self.error is not None or s.signum is not None:
                        break
                self.open(job)
                last = self._tick(last)
            with self.cond:
                while self.error is None and s.signum is None and self.open_jobs > 0:
                    self.cond.wait(0.2)
                    last = self._tick(last)
        finally:
            s.stop.set()
            for _ in range(s.workers):
                self.tasks.put(None)
            for _ in range(finishers):
                self.finish_q.put(None)
            s._interrupt_connections()
            if self.pool is not None:  # an extraction under way is cut off: its shard's
                self.pool.terminate()  # files never appeared (they land only when whole)
                self.pool.join()
                self.pool = None
            deadline = time.monotonic() + 1.5
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            for job in self.opened:
                if job.fd is not None:
                    try:
                        os.close(job.fd)
                    except OSError:
                        pass
                    job.fd = None
        s._check_signal()
        if self.error is not None:
            err = self.error
            if isinstance(err, StageError):
                raise err
            if isinstance(err, OSError):
                raise StageError(self.disk_reason(err)) from None
            raise err
        if self.open_jobs:
            raise StageError("staging stopped with %d files unfinished" % self.open_jobs)

    def disk_reason(self, exc: OSError) -> str:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "no space left on %s after %d of %d bytes: give the instance a larger " \
                   "disk (--disk-gb)" % (self.shown, self.rec["bytes_done"],
                                         self.rec["bytes_total"])
        return _disk_reason(exc)

    def _tick(self, last: float) -> float:
        now = time.monotonic()
        if now - last >= self.s.progress_s:
            self.s.progress(self.rec, self.t0)
            return now
        return last

    def open(self, job: _Job) -> None:
        try:
            job.fd = os.open(job.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            self.fail(exc)
            return
        self.opened.append(job)
        ranges = [(a, min(self.s.part, job.size - a)) for a in range(0, job.size, self.s.part)]
        if not ranges:
            ranges = [(0, 0)]
        with self.cond:
            job.left = len(ranges)
            self.open_jobs += 1
            self.queued += len(ranges)
        for a, n in ranges:
            self.tasks.put((job, a, n))

    def worker(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                return
            job, start, length = task
            with self.cond:
                self.queued -= 1
                self.cond.notify_all()
            if self.s.stop.is_set():
                continue
            try:
                self.s.fetch(job.src, job.fd, start, length, job.size, self.counted)
            except _Stopped:
                continue
            except BaseException as exc:
                self.fail(exc)
                continue
            with self.cond:
                job.left -= 1
                complete = job.left == 0
                if complete:
                    self.unfinished += 1
            if complete:
                try:
                    os.close(job.fd)
                except OSError as exc:
                    self.fail(exc)
                    continue
                job.fd = None
                self.finish_q.put(job)

    def finisher(self) -> None:
        while True:
            job = self.finish_q.get()
            if job is None:
                return
            if self.s.stop.is_set():
                continue
            try:
                files = self.finish(job)
            except _Stopped:
                continue
            except ValueError as exc:
                self.fail(StageError(str(exc).splitlines()[0] if str(exc) else "bad data"))
                continue
            except BaseException as exc:
                self.fail(exc)
                continue
            finally:
                try:
                    os.unlink(job.tmp)
                except OSError:
                    pass
            with self.cond:
                self.unfinished -= 1
                self.open_jobs -= 1
                self.rec["files_done"] += files
                self.cond.notify_all()

    def finish(self, job: _Job) -> int:
        if self.d["kind"] == "shards":  # in the pool; make_folders takes folders made meanwhile
            pending = self.pool.apply_async(_extract, (job.tmp, self.dest, job.item))
            # A pool replaces a worker that died (killed, out of memory) but not its task:
            # never wait for ever. A shard extracts at tens of MB/s at the very least.
            deadline = time.monotonic() + 600 + job.size / 10e6
            while True:
                try:
                    return pending.get(0.5)
                except multiprocessing.TimeoutError:
                    if self.s.stop.is_set():
                        raise _Stopped() from None
                    if time.monotonic() > deadline:
                        raise StageError("extracting %s did not finish (its process died?)"
                                         % job.item.name) from None
        o = job.item
        size = os.path.getsize(job.tmp)
        if size != o["bytes"]:
            raise ValueError("%s is %d bytes, not the %d listed" % (job.src.name, size,
                                                                   o["bytes"]))
        if o.get("md5") and not job.src.etag_not_md5:
            h = hashlib.md5()
            with open(job.tmp, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            if h.hexdigest() != o["md5"]:
                raise ValueError("%s is not what its listing says: md5 %s, not %s" % (
                    job.src.name, h.hexdigest(), o["md5"]))
        parts = o["path"].split("/")
        try:
            parent = safefile.make_folders(self.root, parts[:-1])
        except safefile.NotFolder as exc:
            raise ValueError("%r cannot be written: %r in the destination is a link or a file, "
                             "not a folder" % (o["path"][:200],
                                               exc.filename[len(self.root) + 1:][:200])) from None
        os.replace(job.tmp, os.path.join(parent, parts[-1]))
        return 1


def _extractor_signals() -> None:
    """An extraction process leaves SIGTERM and SIGINT (sent to the whole group) to the
    stager, which stops it itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _extract(tmp: str, dest: str, entry) -> int:
    with open(tmp, "rb") as f:
        return shards.extract_shard(f, dest, entry)


def stage(plan: dict, status_path, out=sys.stdout, backoff_s: float = 0.5) -> int:
    """Stage every dataset of `plan`, rewriting `status_path`; the exit code (0, 1, 130,
    143). SIGTERM and SIGINT stop it promptly when called from the main thread."""
    s = Stager(plan, status_path, out, backoff_s)
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            installed[signum] = signal.signal(signum, s.on_signal)
    try:
        return s.run()
    finally:
        for signum, old in installed.items():
            signal.signal(signum, old)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python3 stager.py PLAN_JSON STATUS_JSON", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as f:
            plan = json.loads(f.read(256 << 20))
    except (OSError, ValueError) as exc:
        print("cloudtrain staging failed: cannot read the plan %s (%s)" % (argv[0], _reason(exc)),
              file=sys.stderr)
        return 1
    return stage(plan, argv[1])


if __name__ == "__main__":
    sys.exit(main())
