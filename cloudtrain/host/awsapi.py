"""What the host side asks of AWS with the standard library alone (an instance may have no
boto3): the instance metadata service (IMDSv2), the instance role's credentials from it, S3
addresses and SigV4-signed requests, and `retry`, the one retry loop every host module uses.

Standard library only, Python 3.8+. Imports stage_errors (StageError, reason) and nothing else
of ours: the boot loader that an Auto Scaling instance's user-data carries needs only these two.

    imds_token(imds, ttl_s, timeout) -> an IMDSv2 session token (PUT /latest/api/token)
    imds_get(imds, path, token, timeout, limit) -> the bytes at /latest/<path>
    RoleCredentials(imds_url).get() -> {AccessKeyId, SecretAccessKey, Token, Expiration}
    object_url(bucket, key, region, endpoint=None) -> url
    quote_key(key) -> the key URI-encoded as SigV4 wants it
    host_header(parts) -> the Host header for a urlsplit() result
    sign_get(url, region, creds, now, extra_headers=None) -> headers
    sign_request(method, url, region, creds, now, service, body) -> headers (any service)
    utc_now() -> the naive UTC datetime the signers take
    retry(call, transient, tries, delay_s, ...) -> call()'s result, tried again while transient
"""

import datetime
import hashlib
import hmac
import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from .stage_errors import StageError, reason


IMDS_URL = "http://169.254.169.254"
IMDS_TIMEOUT_S = 10.0
REFRESH_S = 300.0  # credentials are renewed when fewer seconds than this remain
UNSIGNED = "UNSIGNED-PAYLOAD"
NO_PROFILE = ("the instance has no instance profile: set instance_profile in config.yaml "
              "(infra/README.md)")


# -- retries ---------------------------------------------------------------------------------

def retry(call, transient, tries=None, delay_s=1.0, factor=2.0, cap_s=None, deadline=None,
          sleep=None, clock=None, give_up=None):
    """call()'s result. An exception that transient(exc) says is worth another try is tried
    again after delay_s, then delay_s * factor, ... (each at most cap_s), while fewer than
    `tries` (None: no limit) were made and the wait would end by `deadline` (clock()'s
    time; None: none); otherwise it is raised, or give_up(exc, tries made) is where given.
    Any other exception is raised at once. `sleep(seconds)` waits (time.sleep); it may raise
    to stop. `clock`: time.time."""
    sleep, clock = sleep or time.sleep, clock or time.time
    made = 0
    while True:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - transient() decides; the rest re-raised
            if not transient(exc):
                raise
            delay = delay_s * factor ** made
            if cap_s is not None:
                delay = min(delay, cap_s)
            made += 1
            if (tries is not None and made >= tries) or \
                    (deadline is not None and clock() + delay > deadline):
                if give_up is None:
                    raise
                raise give_up(exc, made) from exc
        sleep(delay)


# -- the instance metadata service (IMDSv2) ----------------------------------------------------

def _imds(imds, method, path, headers, timeout, limit):
    req = urllib.request.Request(imds.rstrip("/") + path, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read(limit)


def imds_token(imds=IMDS_URL, ttl_s=300, timeout=IMDS_TIMEOUT_S):
    """An IMDSv2 session token, good for `ttl_s`. Raises what urllib raises (HTTPError, an
    OSError) or ValueError for a token that is not ASCII."""
    return _imds(imds, "PUT", "/latest/api/token",
                 {"X-aws-ec2-metadata-token-ttl-seconds": str(int(ttl_s))}, timeout,
                 4096).decode("ascii").strip()


def imds_get(imds, path, token, timeout=IMDS_TIMEOUT_S, limit=1 << 20):
    """The bytes (at most `limit`) at /latest/<path> (meta-data/..., with the token of
    imds_token). Raises what urllib raises: HTTPError 404 where IMDS has no such value."""
    return _imds(imds, "GET", "/latest/" + path.lstrip("/"),
                 {"X-aws-ec2-metadata-token": token}, timeout, limit)


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


# -- S3 addresses and SigV4 --------------------------------------------------------------------


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


def host_header(parts) -> str:
    """host[:port] of a urlsplit() result, the port left out where it is the scheme's."""
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
    return sign_request("GET", url, region, creds, now, "s3", extra_headers=extra_headers)


def sign_request(method: str, url: str, region: str, creds: dict, now, service: str = "s3",
                 body: bytes = b"", extra_headers=None) -> dict:
    """The SigV4 headers of a `method` request of `url` (path URI-encoded, its query string
    the request's parameters) to `service` in `region` at `now`. S3 is signed with an
    unsigned payload (X-Amz-Content-SHA256: UNSIGNED-PAYLOAD, as botocore does over TLS);
    every other service (the Query APIs: autoscaling, ec2) with the sha256 of `body`, which
    they require. `extra_headers` are sent, not signed."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed = {"host": host_header(parts), "x-amz-date": amz_date}
    if service == "s3":
        payload = UNSIGNED
        signed["x-amz-content-sha256"] = UNSIGNED
    else:
        payload = hashlib.sha256(body).hexdigest()
    token = creds.get("Token")
    if token:
        signed["x-amz-security-token"] = token
    query = sorted((urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~"))
                   for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    names = sorted(signed)
    canonical = "\n".join([
        method, parts.path or "/", "&".join("%s=%s" % kv for kv in query),
        "".join("%s:%s\n" % (n, " ".join(signed[n].split())) for n in names),
        ";".join(names), payload])
    scope = "%s/%s/%s/aws4_request" % (day, region, service)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
    key = _hmac(("AWS4" + creds["SecretAccessKey"]).encode("utf-8"), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    headers = {"Host": signed["host"], "X-Amz-Date": amz_date}
    if service == "s3":
        headers["X-Amz-Content-SHA256"] = UNSIGNED
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
        self.creds: dict | None = None
        self.expires = 0.0

    def _ask(self, fn, *args):
        """fn(self.imds, *args): an HTTPError raised as it is, no answer as a StageError."""
        try:
            return fn(self.imds, *args)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise StageError("the instance metadata service at %s did not answer (%s)"
                             % (self.imds, reason(exc))) from None

    def _fetch(self) -> dict:
        try:
            token = self._ask(imds_token, 21600)
            listing = "meta-data/iam/security-credentials/"
            try:
                roles = self._ask(imds_get, listing, token).decode("utf-8", "replace")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    raise StageError(NO_PROFILE) from None
                raise
            role = (roles.splitlines() or [""])[0].strip()
            if not role:
                raise StageError(NO_PROFILE)
            doc = json.loads(self._ask(imds_get, listing + urllib.parse.quote(role), token))
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
                creds = self.creds = self._fetch()
                self.expires = creds["Expiration"]
                return creds
            return self.creds
