"""A stand-in for the AWS Free Tier API (moto has none): a real HTTP server on loopback
speaking its JSON 1.0 protocol (`X-Amz-Target: AWSFreeTierService.GetAccountPlanState`), as
the API reference documents it. boto3 reaches it through AWS_ENDPOINT_URL_FREETIER, the way it
reaches the real, global endpoint (freetier.us-east-1.api.aws).

    FreeTier.plan      what GetAccountPlanState answers: {"accountPlanType": FREE | PAID,
                       "accountPlanStatus": NOT_STARTED | ACTIVE | EXPIRED, ...}; None:
                       ResourceNotFoundException (an account on no plan)
    FreeTier.denied    answer AccessDeniedException naming the action
    FreeTier.calls     the targets asked
    free_tier()        the process's one stand-in (started on first use), reset to a Paid
                       plan: every lab account is Paid unless a test says otherwise
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

from .loopback import serve

PAID = {"accountId": "123456789012", "accountPlanType": "PAID", "accountPlanStatus": "ACTIVE"}


class FreeTier:
    def __init__(self):
        self.plan: dict | None = dict(PAID)
        self.denied = False
        self.calls: list[str] = []
        self.url = ""

    def reset(self) -> "FreeTier":
        self.plan, self.denied, self.calls = dict(PAID), False, []
        return self

    def answer(self, target: str) -> tuple[int, dict]:
        self.calls.append(target)
        if target != "AWSFreeTierService.GetAccountPlanState":
            return 400, {"__type": "UnknownOperationException", "message": target}
        if self.denied:
            return 400, {"__type": "AccessDeniedException", "message": (
                "User: arn:aws:iam::123456789012:user/moto is not authorized to perform: "
                "freetier:GetAccountPlanState because no identity-based policy allows the "
                "freetier:GetAccountPlanState action")}
        if self.plan is None:
            return 400, {"__type": "ResourceNotFoundException",
                         "message": "No account plan found"}
        return 200, self.plan


_lock = threading.Lock()
_one: FreeTier | None = None


def free_tier() -> FreeTier:
    global _one
    with _lock:
        if _one is None:
            tier = FreeTier()

            class Handler(BaseHTTPRequestHandler):
                def do_POST(self):
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    status, body = tier.answer(self.headers.get("X-Amz-Target") or "")
                    data = json.dumps(body).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/x-amz-json-1.0")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

                def log_message(self, *args):
                    pass

            tier.url, _server = serve(Handler)
            _one = tier
        return _one.reset()
