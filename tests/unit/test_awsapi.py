"""cloudtrain/host/awsapi.py, what the host side asks of AWS with the standard library alone:
`retry`, the one retry loop of the host modules (the uploader, the restore, the stager's ranged
GETs, the group's Query calls, the boot loader), and the instance metadata service (IMDSv2)
that the role's credentials, the spot notice and the instance's identity are read from. Each
against a real HTTP server on loopback (labs.loopback, labs.imds), no mocks (issue 35)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from cloudtrain.host import agent, auto_scaling, awsapi
from labs.imds import FakeIMDS
from labs.loopback import answering, free_port


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _server_error(exc: BaseException) -> bool:
    return isinstance(exc, urllib.error.HTTPError) and exc.code >= 500


@pytest.fixture
def server():
    started = []

    def start(*answers):
        url, srv, seen = answering(*answers)
        started.append(srv)
        return url, seen

    yield start
    for srv in started:
        srv.close()


# -- retry --------------------------------------------------------------------------------------

def test_a_transient_answer_is_tried_again_with_waits_that_double(server):
    url, seen = server((503, b""), (500, b""), (200, b"ok"))
    waits = []
    assert awsapi.retry(lambda: _get(url), _server_error, 5, 0.01, sleep=waits.append) == b"ok"
    assert len(seen) == 3 and waits == [0.01, 0.02]


def test_an_answer_not_worth_another_try_is_raised_at_once(server):
    url, seen = server((404, b""), (200, b"ok"))
    waits = []
    with pytest.raises(urllib.error.HTTPError) as err:
        awsapi.retry(lambda: _get(url), _server_error, 5, 0.01, sleep=waits.append)
    assert err.value.code == 404 and len(seen) == 1 and waits == []


def test_after_its_tries_the_last_error_is_raised_or_what_give_up_makes_of_it(server):
    url, seen = server((503, b""))
    with pytest.raises(urllib.error.HTTPError) as err:
        awsapi.retry(lambda: _get(url), _server_error, 3, 0.01)
    assert err.value.code == 503 and len(seen) == 3

    def give_up(exc, made):
        return RuntimeError(f"HTTP {exc.code} after {made} tries")

    with pytest.raises(RuntimeError, match="HTTP 503 after 2 tries") as err:
        awsapi.retry(lambda: _get(url), _server_error, 2, 0.01, give_up=give_up)
    assert isinstance(err.value.__cause__, urllib.error.HTTPError) and len(seen) == 5


def test_waits_are_capped(server):
    url, seen = server((503, b""))
    waits = []
    with pytest.raises(urllib.error.HTTPError):
        awsapi.retry(lambda: _get(url), _server_error, 6, 0.01, cap_s=0.03, sleep=waits.append)
    assert waits == [0.01, 0.02, 0.03, 0.03, 0.03] and len(seen) == 6


def test_no_wait_ends_after_the_deadline(server):
    """Without a limit on tries: the deadline alone ends it, before a wait that would end
    after it (so a caller's own time limit, a spot notice's two minutes, holds)."""
    url, seen = server((503, b""))
    started = time.time()
    deadline = started + 0.5
    ends = []

    def sleep(seconds):
        ends.append(time.time() + seconds)
        time.sleep(seconds)

    with pytest.raises(urllib.error.HTTPError):
        awsapi.retry(lambda: _get(url), _server_error, None, 0.1, factor=1.0,
                     deadline=deadline, sleep=sleep)
    assert ends and all(end <= deadline for end in ends)
    assert len(seen) == len(ends) + 1 >= 3
    assert time.time() < deadline + 5


def test_no_answer_is_tried_again_and_a_sleep_that_raises_stops_it():
    url = f"http://127.0.0.1:{free_port()}/"  # nobody listens: connection refused

    class Stop(Exception):
        pass

    tries = []

    def call():
        tries.append(1)
        return _get(url)

    def stop(_):
        raise Stop()

    with pytest.raises(urllib.error.URLError):
        awsapi.retry(call, lambda e: isinstance(e, OSError), 3, 0.01)
    assert len(tries) == 3
    with pytest.raises(Stop):
        awsapi.retry(call, lambda e: isinstance(e, OSError), 3, 0.01, sleep=stop)
    assert len(tries) == 4


# -- the instance metadata service ----------------------------------------------------------

@pytest.fixture
def imds():
    fake = FakeIMDS(role="ct-instance")
    fake.metadata["127.0.0.1"] = {"/latest/meta-data/instance-id": "i-0123456789abcdef0",
                                  "/latest/meta-data/placement/availability-zone": "us-east-1b",
                                  "/latest/meta-data/instance-type": "g5.xlarge",
                                  "/latest/meta-data/instance-life-cycle": "spot",
                                  "/latest/meta-data/local-ipv4": "10.0.1.17"}
    yield fake
    fake.close()


def test_a_token_is_put_for_with_its_ttl_then_sent_with_every_get(imds):
    token = awsapi.imds_token(imds.url, 300, 5.0)
    assert token == "imds-token-123"
    assert awsapi.imds_get(imds.url, "meta-data/instance-id", token) == b"i-0123456789abcdef0"
    assert awsapi.imds_get(imds.url + "/", "/meta-data/instance-id", token, limit=4) == b"i-01"
    assert imds.seen == [("PUT", "/latest/api/token", "300"),
                         ("GET", "/latest/meta-data/instance-id", token),
                         ("GET", "/latest/meta-data/instance-id", token)]


def test_a_get_without_the_token_or_of_nothing_is_urllib_s_http_error(imds):
    for token, path, code in (("stale", "meta-data/instance-id", 401),
                              (awsapi.imds_token(imds.url), "meta-data/no-such", 404)):
        with pytest.raises(urllib.error.HTTPError) as err:
            awsapi.imds_get(imds.url, path, token)
        assert err.value.code == code
        err.value.close()


def test_no_metadata_service_is_an_os_error_in_its_timeout():
    started = time.monotonic()
    with pytest.raises(OSError):
        awsapi.imds_token(f"http://127.0.0.1:{free_port()}", 300, 2.0)
    assert time.monotonic() - started < 5


def test_the_role_s_credentials_the_spot_notice_and_the_identity_all_read_it_so(imds):
    """The three readers of IMDS on the host share imds_token/imds_get: each asks for a token
    first and sends it with every GET."""
    creds = awsapi.RoleCredentials(imds.url).get()
    assert creds["AccessKeyId"] == "ASIAROLEKEY" and creds["Token"] == "role-session-token"
    assert agent.spot_notice(imds.url) is None  # 404: no interruption scheduled
    imds.announce("127.0.0.1")
    assert agent.spot_notice(imds.url)["action"] == "terminate"
    assert auto_scaling.identity(imds.url) == {
        "instance": "i-0123456789abcdef0", "zone": "us-east-1b", "type": "g5.xlarge",
        "lifecycle": "spot", "address": "10.0.1.17"}
    puts = [s for s in imds.seen if s[0] == "PUT"]
    assert [ttl for _, _, ttl in puts] == ["21600", "300", "300", "300"]
    assert all(tok == "imds-token-123" for method, _, tok in imds.seen if method == "GET")
