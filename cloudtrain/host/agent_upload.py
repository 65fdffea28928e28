"""Upload a finished job's directory to the S3 job store, before the instance powers off.

Standard library only, Python 3.8+: part of the host package, imported by the agent. Imports
awsapi (retry, the role's credentials and SigV4) and stage_errors, nothing else of ours.
The host holds no AWS keys. The orchestrator hands it a *grant*, one of two kinds:

- an S3 presigned POST (cloudtrain/providers/aws/jobstore.py: upload_grant) that lets anyone
  holding it write objects under one job's key prefix, each at most `max_bytes`, until it
  expires (and no longer than the session that signed it). A POST carries one object, so
  each file is its own request: multipart/form-data, the grant's fields, then key = prefix +
  relative path, then the file (last: S3 ignores fields after it), streamed from disk;
- `{"signer": "role", "bucket", "region", "endpoint", "imds", "prefix", "max_bytes"}` for a
  job that runs on its own IAM role (providers/aws/job_role.py): each file is a PUT signed
  with the role's credentials from the instance metadata service (awsapi.RoleCredentials,
  renewed before they expire), so the writes last as long as the instance; the role's
  policy, not the grant, holds them to the job's prefix. A file over S3's largest PUT
  (5 GB) goes as a multipart upload (an LLM-sized checkpoint), each part retried on
  its own and the upload aborted when it cannot be finished.

Order: the small files first (status.json, job.json, metrics.jsonl, output.log), then
checkpoints/** (regular files, no symlinks), so that a spot notice or the time limit cutting
a multi-GB checkpoint short still leaves the status and the log readable; and LAST
manifest.json, which lists every file uploaded with its size and sha256 (and every file
skipped, with why). The reader takes the manifest as "the upload is complete" and trusts
nothing without it.

`upload_job` never raises: the agent calls it on its way to powering the machine off.
"""

import functools
import hashlib
import http.client
import io
import json
import os
import re
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from xml.sax.saxutils import escape as xml_escape

from .awsapi import IMDS_URL, RoleCredentials, object_url, retry, sign_request, utc_now
from .stage_errors import StageError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
# Uploaded in this order (checkpoints after them, the manifest last).
JOB_FILES = ("status.json", "job.json", "metrics.jsonl", "output.log", "staging-status.json",
             "setup-status.json")
CHECKPOINTS = "checkpoints"
# "The maximum allowed object size for a POST upload is 5 GB" (S3 POST Object docs); larger
# objects need a multipart upload, which a presigned POST cannot do.
POST_MAX_BYTES = 5 * 1024 ** 3
# A single PUT carries at most 5 GB too; a multipart upload at most 10,000 parts of at most
# 5 GB each (S3's multipart upload limits), the parts of one upload at least 5 MB but the
# last. Parts of PART_BYTES, or larger where 10,000 of those would not hold the file.
PUT_MAX_BYTES = 5 * 1024 ** 3
PART_BYTES = 512 * 1024 ** 2
MAX_PARTS = 10000
TRIES = 3  # per file, on connection errors and 5xx only
BACKOFF_S = 1.0  # 1 s, then 2 s
CHUNK = 1 << 20
ERROR_BODY_BYTES = 65536


def safe_relpath(rel):
    """`rel` (a '/'-separated path below a job directory) if it is safe to write below a
    local directory on any OS, else None: relative, no empty, '.' or '..' components, no
    control characters or backslashes. The uploader skips what the reader would refuse."""
    if not rel or len(rel) > 1024 or rel.startswith("/"):
        return None
    if any(ord(c) < 32 or ord(c) == 127 or c == "\\" for c in rel):
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") or len(p.encode("utf-8", "surrogatepass")) > 255
           for p in parts):
        return None
    if ":" in parts[0]:  # "C:" would be a drive on Windows
        return None
    return rel


def job_files(jobdir, include_checkpoints=True, outputs=()):
    """[(relative path, absolute path)] in upload order, and [(relative path, reason)] for
    what cannot be uploaded. Only regular files: a symlink could point anywhere on the host.
    Without `include_checkpoints`, nothing below checkpoints/ (they were streamed).
    `outputs`: the job's named outputs (`--output`), files or directories relative to the
    job directory, after the checkpoints; one that is not there is said in the skipped."""
    files, skipped = [], []

    def consider(rel, path):
        try:
            st = os.lstat(path)
        except OSError as exc:
            skipped.append((rel, "cannot stat: %s" % exc.strerror))
            return
        if not stat.S_ISREG(st.st_mode):
            skipped.append((rel, "not a regular file"))
        elif safe_relpath(rel) is None or not _utf8(rel):
            skipped.append((rel, "name not portable"))
        else:
            files.append((rel, path))

    def tree(rel):
        root = os.path.join(jobdir, rel)
        if os.path.islink(root):
            skipped.append((rel, "not a regular file"))
        elif os.path.isdir(root):
            for top, dirs, names in os.walk(root):  # followlinks=False: links not entered
                dirs.sort()
                for name in dirs:
                    if os.path.islink(os.path.join(top, name)):
                        skipped.append((_rel(jobdir, os.path.join(top, name)),
                                        "not a regular file"))
                for name in sorted(names):
                    path = os.path.join(top, name)
                    consider(_rel(jobdir, path), path)
        elif os.path.lexists(root):
            consider(rel, root)
        else:
            return False
        return True

    for name in JOB_FILES:
        if os.path.lexists(os.path.join(jobdir, name)):
            consider(name, os.path.join(jobdir, name))
    if include_checkpoints:
        tree(CHECKPOINTS)
    seen = set(rel for rel, _ in files)
    for rel in outputs or ():
        if safe_relpath(rel) is None:
            skipped.append((str(rel)[:200], "not a path inside the job directory"))
            continue
        if rel.split("/")[0] in (CHECKPOINTS,) + JOB_FILES:
            continue  # brought home anyway
        before = len(files)
        if not tree(rel):
            skipped.append((rel, "not found"))
        # an output inside another output: each file once
        files[before:] = [f for f in files[before:] if f[0] not in seen]
        seen.update(r for r, _ in files[before:])
    return files, skipped


def _rel(jobdir, path):
    return os.path.relpath(path, jobdir).replace(os.sep, "/")


def _utf8(text):
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:  # a name that is not UTF-8 on disk (surrogateescape)
        return False


class UploadError(Exception):
    """A POST failed. `retry`: worth another try (connection error, 5xx)."""

    def __init__(self, message, retry):
        Exception.__init__(self, message)
        self.retry = retry


class FileUnreadable(Exception):
    """A file could not be read, or shrank while it was being sent: skip it."""


class _Body(object):
    """The multipart body as a file object: head bytes, then `size` bytes of `source` (hashed
    on the way), then the tail. http.client reads it in blocks, so a multi-GB checkpoint is
    never held in memory. Past `deadline` it stops the request."""

    def __init__(self, head, source, size, tail, deadline, sha256=None):
        self.head, self.source, self.size, self.tail = head, source, size, tail
        self.deadline = deadline
        self.left = size
        self.sha256 = sha256 if sha256 is not None else hashlib.sha256()
        self.length = len(head) + size + len(tail)

    def __len__(self):
        return self.length

    def read(self, n=-1):
        if time.time() > self.deadline:
            raise UploadError("the upload ran out of time", retry=False)
        if n is None or n < 0:
            n = CHUNK
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        if self.left:
            try:
                data = self.source.read(min(n, self.left, CHUNK))
            except OSError as exc:
                raise FileUnreadable("cannot read: %s" % exc)
            if not data:
                raise FileUnreadable("shrank while it was uploaded")
            self.left -= len(data)
            self.sha256.update(data)
            return data
        out, self.tail = self.tail[:n], self.tail[n:]
        return out


def _form(fields, filename, boundary):
    """(head, tail) of a multipart/form-data body whose last part is the file."""
    head = []
    for name, value in fields:
        head.append("--%s\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n"
                    % (boundary, name, value))
    # S3 uses the file part's filename only for ${filename} in the key, which we replace.
    safe = re.sub(r'[^A-Za-z0-9._-]', "_", filename)[:100] or "file"
    head.append("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n" % (boundary, safe))
    return "".join(head).encode("utf-8"), ("\r\n--%s--\r\n" % boundary).encode("ascii")


def aws_error(body):
    """'Code: Message' from an AWS XML error body (S3's, Auto Scaling's, EC2's), read with a
    regex: never parse XML from the network with a full parser here."""
    text = body.decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]{1,200})</Code>", text)
    message = re.search(r"<Message>([^<]{1,500})</Message>", text)
    parts = [m.group(1) for m in (code, message) if m]
    return ": ".join(parts) if parts else text[:200].strip()


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(functools.partial(http.client.HTTPConnection, blocksize=CHUNK), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        context = self._context  # type: ignore[attr-defined]  # HTTPSHandler's, not in its stub
        return self.do_open(functools.partial(http.client.HTTPSConnection, blocksize=CHUNK),
                            req, context=context)


# http.client sends a file body in 8 KiB blocks by default: 1 MiB blocks send a checkpoint
# about twice as fast (226 -> 460-540 MB/s into a local sink, benchmarks/job_store_roundtrip.py).
_OPENER = urllib.request.build_opener(_HTTPHandler, _HTTPSHandler)


def writable(grant):
    """Whether `grant` is one this module writes through: a presigned POST's (url, prefix)
    or a role's (bucket, region, prefix). What the instance reads from job.json is checked
    here, the one place that knows both kinds."""
    if not isinstance(grant, dict) or not isinstance(grant.get("prefix"), str):
        return False
    if grant.get("signer") == "role":
        return isinstance(grant.get("bucket"), str) and isinstance(grant.get("region"), str)
    return isinstance(grant.get("url"), str)


# One RoleCredentials per metadata service address: every upload of the process shares the
# role's credentials and their renewal.
_ROLES = {}  # type: dict


def _role(imds):
    if imds not in _ROLES:
        _ROLES[imds] = RoleCredentials(imds)
    return _ROLES[imds]


def upload_limit(grant):
    """The largest file the grant can carry: one POST's 5 GB, or with the job's role a
    multipart upload's 10,000 parts of 5 GB; never above the grant's own max_bytes."""
    most = MAX_PARTS * PUT_MAX_BYTES if grant.get("signer") == "role" else POST_MAX_BYTES
    try:
        asked = int(grant.get("max_bytes") or most)
    except (TypeError, ValueError):
        asked = most
    return max(0, min(most, asked))


def part_bytes(size):
    """The part size of a multipart upload of `size` bytes: PART_BYTES, or the MiB multiple
    that keeps the upload within MAX_PARTS parts."""
    need = -(-size // MAX_PARTS)
    return max(PART_BYTES, -(-need // (1 << 20)) * (1 << 20))


def post_file(grant, key, source, size, deadline):
    """Send `size` bytes of the file object `source` under `key` through the grant (a POST,
    or a PUT signed with the job's role: a multipart upload over PUT_MAX_BYTES); returns their
    sha256 (hex), computed on the bytes as they were sent."""
    if grant.get("signer") == "role":
        if size > PUT_MAX_BYTES:
            return _role_multipart(grant, key, source, size, deadline)
        body = _Body(b"", source, size, b"", deadline)
        _role_send(grant, "PUT", key, "", body, size, deadline)
        return body.sha256.hexdigest()
    boundary = "cloudtrain" + uuid.uuid4().hex
    fields = list((grant.get("fields") or {}).items()) + [("key", key)]
    head, tail = _form(fields, key.rsplit("/", 1)[-1], boundary)
    body = _Body(head, source, size, tail, deadline)
    request = urllib.request.Request(grant["url"], data=body, method="POST", headers={
        "Content-Type": "multipart/form-data; boundary=%s" % boundary,
        "Content-Length": str(len(body))})
    _send(request, "S3 refused the upload grant (403 {}): it has expired or does not cover {}",
          key, deadline)
    return body.sha256.hexdigest()


def _role_send(grant, method, key, query, body, size, deadline):
    """One request on the object `key` (with `query`, e.g. "uploads"), signed with the job's
    role's credentials: (the answer's headers, up to ERROR_BODY_BYTES of its body)."""
    url = object_url(grant["bucket"], key, grant["region"], grant.get("endpoint"))
    if query:
        url += "?" + query
    try:
        creds = _role(grant.get("imds") or IMDS_URL).get()
    except StageError as exc:  # no role, or no metadata service
        raise UploadError("no credentials of the job's role: %s" % exc, retry=True)
    headers = sign_request(method, url, grant["region"], creds, utc_now(), "s3",
                           extra_headers={"Content-Length": str(size),
                                          "Content-Type": "application/octet-stream"})
    headers.pop("Host", None)  # urllib sends it
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    return _send(request, "S3 refused the job's role (403 {}) for {}", key, deadline)


def _send(request, refused, key, deadline):
    """Carry out `request`: (the answer's headers, up to ERROR_BODY_BYTES of its body), or
    UploadError saying why not (`refused` formatted with S3's error and the key on a 403)."""
    try:
        with _OPENER.open(request, timeout=_socket_timeout(deadline)) as resp:
            return resp.headers, resp.read(ERROR_BODY_BYTES)
    except urllib.error.HTTPError as exc:
        detail = aws_error(exc.read(ERROR_BODY_BYTES) or b"")
        if exc.code == 403:
            raise UploadError(refused.format(detail, key), retry=False)
        raise UploadError("HTTP %d from S3 for %s: %s" % (exc.code, key, detail),
                          retry=exc.code >= 500)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        # URLError wraps refused and reset connections; socket.timeout is an OSError.
        reason = getattr(exc, "reason", None) or exc
        raise UploadError("cannot reach %s: %s" % (request.full_url, reason), retry=True)


def _xml_value(answer, name):
    """The text of the first <name> element of S3's XML answer, or None."""
    found = re.search(r"<%s>([^<]*)</%s>" % (name, name), answer.decode("utf-8", "replace"))
    return found.group(1) if found else None


def _role_multipart(grant, key, source, size, deadline):
    """`size` bytes of the seekable `source` as one S3 multipart upload signed with the job's
    role: CreateMultipartUpload, UploadPart for each part (each tried again on its own on a
    transient error, from its offset), CompleteMultipartUpload; AbortMultipartUpload when it
    cannot be finished, so no parts are left billing (the bucket's lifecycle rule is the
    backstop). Returns the sha256 (hex) of the whole file as sent."""
    _, answer = _role_send(grant, "POST", key, "uploads", b"", 0, deadline)
    upload_id = _xml_value(answer, "UploadId")
    if not upload_id:
        raise UploadError("S3 answered the multipart upload of %s with no UploadId" % key,
                          retry=True)
    upload = "uploadId=" + urllib.parse.quote(upload_id, safe="")
    step = part_bytes(size)
    whole = hashlib.sha256()
    etags = []
    try:
        for number, offset in enumerate(range(0, size, step), 1):
            length = min(step, size - offset)

            def once():
                source.seek(offset)
                hashed = whole.copy()  # a part tried again hashes its bytes once
                body = _Body(b"", source, length, b"", deadline, sha256=hashed)
                headers, _ = _role_send(grant, "PUT", key, "partNumber=%d&%s" % (number, upload),
                                        body, length, deadline)
                return headers.get("ETag"), hashed

            etag, whole = retry(once, lambda exc: isinstance(exc, UploadError) and exc.retry,
                                TRIES, BACKOFF_S, deadline=deadline)
            if not etag:
                raise UploadError("S3 gave part %d of %s no ETag" % (number, key), retry=False)
            etags.append(etag)
        parts = "".join("<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>"
                        % (n, xml_escape(e)) for n, e in enumerate(etags, 1))
        done = ("<CompleteMultipartUpload>%s</CompleteMultipartUpload>" % parts).encode()
        _, answer = _role_send(grant, "POST", key, upload, io.BytesIO(done), len(done),
                               deadline)
        if b"<Error>" in answer:  # S3 can fail a completion inside a 200 answer
            raise UploadError("S3 did not complete the multipart upload of %s: %s"
                              % (key, aws_error(answer)), retry=False)
    except BaseException:
        try:
            _role_send(grant, "DELETE", key, upload, b"", 0, min(deadline, time.time() + 30))
        except UploadError:
            pass  # the bucket's rule aborts incomplete uploads after a day
        raise
    return whole.hexdigest()


def _socket_timeout(deadline):
    """Seconds one blocking socket operation may take: the time left, within [1, 60]."""
    return max(1.0, min(60.0, deadline - time.time()))


def _post_with_retries(grant, key, path_or_file, size, deadline):
    """post_file from the start of the file (a path, or an open file object), up to TRIES
    times while the error is transient and time is left (1 s, then 2 s between tries)."""
    opened = isinstance(path_or_file, str)

    def once():
        try:
            source = open(path_or_file, "rb") if opened else path_or_file
        except OSError as exc:
            raise FileUnreadable("cannot read: %s" % exc.strerror)
        try:
            source.seek(0)
            return post_file(grant, key, source, size, deadline)
        finally:
            if opened:
                source.close()

    return retry(once, lambda exc: isinstance(exc, UploadError) and exc.retry, TRIES,
                 BACKOFF_S, deadline=deadline)


def post_json(grant, key, doc, timeout_s=60.0):
    """One small JSON object (`doc`) stored at `key` (below the grant's prefix) through the
    grant, with post_file's retries; UploadError when it could not be."""
    if not key.startswith(grant.get("prefix") or "\0"):
        raise UploadError("%s is outside the grant's prefix %s" % (key, grant.get("prefix")),
                          retry=False)
    data = json.dumps(doc, sort_keys=True).encode("utf-8")
    _post_with_retries(grant, key, io.BytesIO(data), len(data), time.time() + float(timeout_s))


def upload_job(jobdir, grant, timeout_s=60.0, include_checkpoints=True, outputs=()):
    """Upload `jobdir` through `grant` ({"url", "fields", "prefix", "max_bytes"?}) within
    `timeout_s` seconds. Returns {"ok", "files", "bytes", "error", "seconds"}: ok only when
    every file that could be sent was sent and the manifest went up last. Never raises.
    `include_checkpoints=False`: checkpoints/ is left out (the checkpoint stream stored it,
    stream/latest.json names it); the manifest then says "checkpoints_in_stream": true.
    `outputs`: the job's named outputs, uploaded after the checkpoints (job_files)."""
    started = time.time()
    result: dict[str, object] = {"ok": False, "files": 0, "bytes": 0, "error": None,
                                 "seconds": 0.0}
    try:
        _upload(jobdir, grant, started + float(timeout_s), result, include_checkpoints,
                outputs)
    except Exception as exc:  # the agent is powering off: report, never raise
        result["error"] = "upload failed: %s: %s" % (type(exc).__name__, exc)
    result["seconds"] = round(time.time() - started, 3)
    return result


def _upload(jobdir, grant, deadline, result, include_checkpoints=True, outputs=()):
    prefix = grant["prefix"]
    limit = upload_limit(grant)
    files, not_sent = job_files(jobdir, include_checkpoints, outputs)
    manifest: dict = {"version": MANIFEST_VERSION, "files": [],
                "skipped": [{"path": rel, "reason": why} for rel, why in not_sent]}
    if not include_checkpoints:
        manifest["checkpoints_in_stream"] = True
    for rel, path in files:
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            manifest["skipped"].append({"path": rel, "reason": "cannot stat: %s" % exc.strerror})
            continue
        if size > limit:
            manifest["skipped"].append({"path": rel, "size": size, "reason":
                                        "larger than the %d-byte upload limit" % limit})
            continue
        try:
            digest = _post_with_retries(grant, prefix + rel, path, size, deadline)
        except FileUnreadable as exc:
            manifest["skipped"].append({"path": rel, "size": size, "reason": str(exc)})
            continue
        except UploadError as exc:
            result["error"] = "%s (%d of %d files sent, no manifest)" % (
                exc, result["files"], len(files))
            return
        manifest["files"].append({"path": rel, "size": size, "sha256": digest})
        result["files"] += 1
        result["bytes"] += size
    manifest["uploaded_at"] = time.time()
    data = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    try:
        _post_with_retries(grant, prefix + MANIFEST, io.BytesIO(data), len(data), deadline)
    except UploadError as exc:
        result["error"] = "%s (all %d files sent, but not the manifest)" % (exc, result["files"])
        return
    result["ok"] = True
