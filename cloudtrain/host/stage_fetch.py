"""Ranged GETs of S3 objects into a file, each range bounded in time and retried.

Standard library only, Python 3.8+; shipped beside stager.py. Imports stage_plan (StageError,
reason) and awsapi (signing, Host) and nothing else of ours.

    Source(bucket, key, url, region, creds, presigned)  where one object is read from
    Fetcher(stop, backoff_s).fetch(src, fd, start, length, size, counted)
        bytes [start, start+length) of the object into fd, over one connection per worker
        thread per host; StageError for anything final, Stopped once `stop` is set

Everything that comes back over the network is untrusted: status codes, Content-Range,
Content-Length and the body's size are checked.
"""

import http.client
import os
import re
import socket
import threading
import time
import urllib.parse

from .awsapi import host_header, retry, sign_get, utc_now
from .stage_plan import StageError, reason

TIMEOUT_S = 60.0
# A range that trickles in (one byte a second kept one alive for ever, each read
# inside TIMEOUT_S) is cut and retried: when fewer than STALL_BYTES came in STALL_S (or
# nothing did), or when it takes longer than RANGE_MIN_S plus its bytes at FLOOR_RATE. S3
# serves one connection at tens of MB/s; a middlebox holding it open does not.
FLOOR_RATE = 1_000_000  # bytes per second
RANGE_MIN_S = 30.0
STALL_S = 20.0
STALL_BYTES = 64 << 10
RETRIES = 5  # after the first try
BACKOFF_CAP_S = 8.0
ERROR_BODY_BYTES = 64 << 10
READ_CHUNK = 256 << 10


class Retry(Exception):
    """A fault worth another try (connection, timeout, 5xx, 429, a body of the wrong size)."""


class Stopped(Exception):
    """Staging is stopping (a failure elsewhere, or a signal)."""


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


def _error_code(body: bytes) -> str:
    m = re.search(rb"<Code>([A-Za-z0-9.]{1,64})</Code>", body)
    return m.group(1).decode() if m else ""


class Source:
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
        return sign_get(self.url, self.region, self.creds.get(), utc_now(), extra)


class _Connections(threading.local):
    """One HTTP(S) connection per worker thread per host, reused while it stays clean."""

    def __init__(self):
        self.conns = {}


class Fetcher:
    """Ranged GETs by many worker threads, each over connections of its own; `stop` (an
    Event the stager sets on a failure or a signal) ends them promptly."""

    def __init__(self, stop: threading.Event, backoff_s: float):
        self.stop = stop
        self.backoff_s = backoff_s
        self.local = _Connections()
        self.active: set = set()  # connections in use, shut down to stop promptly
        self.active_lock = threading.Lock()

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

    def interrupt(self) -> None:
        """Shut down every connection in use: a read blocked in one returns at once."""
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

    def fetch(self, src: Source, fd: int, start: int, length: int, size: int, counted) -> None:
        """Bytes [start, start+length) of the `size`-byte object into fd at `start`, retried
        on transient faults; StageError for anything final."""
        def once():
            if self.stop.is_set():
                raise Stopped()
            self._fetch_once(src, fd, start, length, size, counted)

        def wait(seconds):
            if self.stop.wait(seconds):
                raise Stopped()

        retry(once, lambda exc: isinstance(exc, Retry), RETRIES + 1, self.backoff_s,
              cap_s=BACKOFF_CAP_S, sleep=wait,
              give_up=lambda exc, made: StageError("reading %s failed %d times, last: %s"
                                                   % (src.name, made, exc)))

    def _fetch_once(self, src, fd, start, length, size, counted) -> None:
        parts = urllib.parse.urlsplit(src.url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        extra = {} if size == 0 else {"Range": "bytes=%d-%d" % (start, start + length - 1)}
        if src.presigned:
            extra["Host"] = host_header(parts)
        key, conn = self._conn(parts)
        got = [0]  # bytes of this try written (and counted) so far
        clean = False
        deadline = time.monotonic() + RANGE_MIN_S + length / FLOOR_RATE
        with self.active_lock:
            self.active.add(conn)
        try:
            resp = self._respond(src, conn, path, extra, (start, length, size), deadline)
            self._read_body(resp, conn, (fd, start, length), deadline, counted, got)
            clean = not resp.will_close
        except BaseException:
            if got[0]:
                counted(-got[0])
            raise
        finally:
            with self.active_lock:
                self.active.discard(conn)
            if not clean:
                self._drop(key, conn)

    def _respond(self, src, conn, path: str, extra: dict, span: tuple, deadline: float):
        """Send the GET and take the response: its status and headers checked against
        `span` (start, length, size); Retry, StageError or Stopped otherwise."""
        start, length, size = span
        try:
            conn.request("GET", path, headers=src.headers(extra))
            _bound(conn, deadline)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            if self.stop.is_set():
                raise Stopped() from None
            raise Retry(reason(exc)) from None
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
        if status == 200 and not (start == 0 and length == size):
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
                raise Retry("Content-Range %r, not %r" % (cr[:100], want))
        declared = resp.getheader("Content-Length")
        if declared is not None and declared.strip() != str(length):
            raise Retry("a body of %s bytes, not %d" % (declared.strip()[:20], length))
        return resp

    def _read_body(self, resp, conn, into: tuple, deadline: float, counted, got: list) -> None:
        """The body into fd at `start` (`into`: fd, start, length), exactly `length` bytes,
        cut and retried when it passes `deadline` or stalls; got[0] counts what was written."""
        fd, start, length = into
        done = 0
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
                    raise Stopped() from None
                now = time.monotonic()
                if now >= deadline:
                    raise Retry(_slow(done, length, now - began)) from None
                if isinstance(exc, socket.timeout) and now - window_at >= STALL_S:
                    raise Retry(_stalled(window)) from None
                raise Retry("the body broke off after %d of %d bytes (%s)"
                            % (done, length, reason(exc))) from None
            if not data:
                break
            now = time.monotonic()
            window += len(data)
            if now - window_at >= STALL_S:
                if window < STALL_BYTES:
                    raise Retry(_stalled(window))
                window_at, window = now, 0
            if now >= deadline and done + len(data) < length:
                raise Retry(_slow(done + len(data), length, now - began))
            if done + len(data) > length:
                raise Retry("a body longer than the %d bytes asked" % length)
            _write(fd, data, start + done)
            done += len(data)
            got[0] = done
            counted(len(data))
        if done != length:
            if self.stop.is_set():
                raise Stopped()
            raise Retry("a body cut short: %d of %d bytes" % (done, length))

    def _refuse(self, src: Source, status: int, code: str) -> None:
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
            raise Retry("HTTP %d%s" % (status, " " + code if code else ""))
        raise StageError("reading %s was refused%s" % (src.name, said))


def _write(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
