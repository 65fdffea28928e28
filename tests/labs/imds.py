"""A fake EC2 instance metadata service (IMDSv2) for tests of what an instance reads with its
role: a session token for a PUT carrying a TTL header; for GETs carrying that token, the
role's name and its credentials, and per host (by client address) its own role and more
metadata (`roles`, `metadata`). It records (method, path, TTL or token header) of every
request in `seen`, so a test can check that none went without the token, and the client
address of each in `clients` (a namespace host's own address, in the e2e tests)."""

from __future__ import annotations

import http.server
import json
import threading

from .loopback import serve

CREDS_PATH = "/latest/meta-data/iam/security-credentials/"
SPOT_PATH = "/latest/meta-data/spot/instance-action"


class FakeIMDS:
    def __init__(self, role: str | None = "ct-instance", creds: dict | None = None,
                 token: str = "imds-token-123", expiration: str = "2099-01-01T00:00:00Z",
                 host: str = "127.0.0.1"):
        """`role` None: an instance without an instance profile (the listing is a 404).
        `host`: the address it answers on (the bridge, for namespace hosts)."""
        self.seen: list[tuple[str, str, str | None]] = []
        # {client address: notice}: what spot/instance-action answers that host (404 for
        # every other, as for an instance with no interruption scheduled)
        self.spot_actions: dict[str, dict] = {}
        # {client address: role}: that host's role, None for a host without an instance
        # profile; a host not listed has `role`
        self.roles: dict[str, str | None] = {}
        # {client address: {path: text}}: more metadata that host reads (instance-id,
        # placement/availability-zone, ...); a path not listed is a 404
        self.metadata: dict[str, dict[str, str]] = {}
        self.clients: list[str] = []  # in step with `seen`
        lock = threading.Lock()
        # What the role's credentials are now (a test may renew them: set another dict)
        self.creds = creds or {"AccessKeyId": "ASIAROLEKEY", "SecretAccessKey": "role/secret",
                               "Token": "role-session-token"}
        self.expiration = expiration
        # role -> its credentials {AccessKeyId, SecretAccessKey, Token, Expiration} as AWS
        # issues them now (labs.moto_iam.RoleSessions.issue); None: `creds` for every role
        self.issuer = None
        imds = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, code, body=b""):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                with lock:
                    imds.seen.append(("PUT", self.path, ttl))
                    imds.clients.append(self.client_address[0])
                if self.path != "/latest/api/token":
                    return self.answer(404)
                if not ttl:
                    return self.answer(400)
                self.answer(200, token.encode())

            def do_GET(self):
                got = self.headers.get("X-aws-ec2-metadata-token")
                with lock:
                    imds.seen.append(("GET", self.path, got))
                    imds.clients.append(self.client_address[0])
                if got != token:
                    return self.answer(401)
                client = self.client_address[0]
                if self.path == SPOT_PATH:
                    notice = imds.spot_actions.get(client)
                    return self.answer(200, json.dumps(notice).encode()) if notice \
                        else self.answer(404)
                host_role = imds.roles[client] if client in imds.roles else role
                if host_role and self.path == CREDS_PATH:
                    return self.answer(200, host_role.encode() + b"\n")
                if host_role and self.path == CREDS_PATH + host_role:
                    issued = imds.issuer(host_role) if imds.issuer else dict(
                        imds.creds, Expiration=imds.expiration)
                    return self.answer(200, json.dumps(dict(
                        issued, Code="Success", Type="AWS-HMAC")).encode())
                text = imds.metadata.get(client, {}).get(self.path)
                if text is not None:
                    return self.answer(200, text.encode())
                self.answer(404)

        self.url, self.server = serve(Handler, host)

    def announce(self, host_ip: str, action: str = "terminate") -> None:
        """From now on, `host_ip` reads a spot interruption notice two minutes ahead."""
        import time

        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self.spot_actions[host_ip] = {"action": action, "time": at}

    def close(self):
        self.server.close()
