"""IAM for the lab's moto, which evaluates no policy: the credentials AWS issues to an instance
for its role (handed out by the fake IMDS, renewed before they end), and IAM's decision on
every request moto serves that is signed with them, made by labs.iam from the role's own
policies and its permissions boundary as they stand in moto's IAM. Requests signed with any
other key are the user's and pass as before, unless that key was revoked (an access key
deleted, a session ended): then they are refused, as AWS refuses them.

    sessions = RoleSessions().install(monkeypatch)     in the process that runs moto's server
    sessions.issue(role_name) -> creds                 AccessKeyId, SecretAccessKey, Token,
                                                       Expiration (what IMDS answers)
    sessions.revoke(access_key_id)                     that key is refused from now on
    sessions.decisions                                 (role, action, resource, decision) of
                                                       every request a role's key made
    FakeIMDS(issuer=sessions.issue)                    an instance reads its role's own

What the request context holds (labs.iam.Request): the role session's principal keys
(aws:PrincipalAccount, aws:PrincipalArn, aws:userid, aws:PrincipalTag/<its role's tags>),
aws:ResourceAccount for S3, s3:prefix for a listing, and for the resources whose calls carry
them the resource's tags (aws:ResourceTag/...) and the sizes an update sets
(autoscaling:MinSize, MaxSize) and what else it names (autoscaling:InstanceTypes,
VPCZoneIdentifiers, LaunchTemplateVersionSpecified, LaunchConfigurationName, each present only
where the request names it): the keys the shipped policies use. An action the lab cannot
give a resource for is evaluated on "*".
"""

from __future__ import annotations

import secrets
import threading
import time

from .iam import Request, evaluate

ACCOUNT = "123456789012"  # moto's default account
TTL_S = 6 * 3600.0  # EC2's role credentials last about 6 hours; renewed well before


class RoleSessions:
    def __init__(self, account: str = ACCOUNT, ttl_s: float = TTL_S):
        self.account, self.ttl_s = account, ttl_s
        self.lock = threading.Lock()
        self.by_key: dict[str, dict] = {}  # access key -> {role, secret, token, expires}
        self.current: dict[str, dict] = {}  # role -> the creds IMDS hands out now
        self.revoked: set[str] = set()
        self.decisions: list[tuple[str, str, str, str]] = []

    # -- what IMDS hands out -----------------------------------------------------------------

    def issue(self, role: str) -> dict:
        """The role's credentials as the instance metadata service answers them: the same
        ones until fewer than 15 minutes remain (EC2 renews them at least 5 minutes before
        they expire), then new ones."""
        with self.lock:
            now = time.time()
            creds = self.current.get(role)
            if creds is None or creds["expires"] - now < 900:
                key = "ASIA" + secrets.token_hex(8).upper()
                creds = {"role": role, "AccessKeyId": key,
                         "SecretAccessKey": secrets.token_urlsafe(30),
                         "Token": secrets.token_urlsafe(60), "expires": now + self.ttl_s}
                self.current[role] = self.by_key[key] = creds
            return {"AccessKeyId": creds["AccessKeyId"],
                    "SecretAccessKey": creds["SecretAccessKey"], "Token": creds["Token"],
                    "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                time.gmtime(creds["expires"]))}

    def revoke(self, access_key_id: str) -> None:
        with self.lock:
            self.revoked.add(access_key_id)

    def expire(self, role: str) -> None:
        """The role's current credentials end now (a session past its Expiration)."""
        with self.lock:
            if role in self.current:
                self.current[role]["expires"] = time.time() - 1

    # -- the decision on each request --------------------------------------------------------

    def install(self, monkeypatch) -> "RoleSessions":
        from moto.core.authorization import ActionAuthenticatorMixin

        sessions = self

        def authorize(response, iam_request_cls, resource="*"):
            sessions.authorize(response, resource)

        monkeypatch.setattr(ActionAuthenticatorMixin, "_authenticate_and_authorize_action",
                            authorize)
        return self

    def authorize(self, response, resource: str) -> None:
        key = _access_key(response)
        s3 = type(response).__module__.startswith("moto.s3")
        if key is None:
            return
        if key in self.revoked:
            _refuse(s3, "InvalidAccessKeyId" if s3 else "InvalidClientTokenId",
                    "The security token included in the request is invalid.", 403)
        session = self.by_key.get(key)
        if session is None:
            return  # the user's: moto's own behaviour
        if session["expires"] < time.time():
            _refuse(s3, "ExpiredToken", "The provided token has expired.", 400)
        for request in self._requests(response, session["role"], resource, s3):
            identity, boundary = self._policies(session["role"])
            decision = evaluate(identity, request, boundary)
            self.decisions.append((session["role"], request.action, request.resource, decision))
            if decision != "allow":
                _refuse(s3, "AccessDenied", f"User: {request.context['aws:PrincipalArn']} is "
                        f"not authorized to perform: {request.action} on resource: "
                        f"{request.resource} ({decision.replace('-', ' ')})", 403)

    def _role(self, name: str):
        from moto.iam.models import iam_backends

        return iam_backends[self.account]["aws"].get_role(name)

    def _policies(self, name: str) -> tuple[list[dict], dict | None]:
        import json

        from moto.iam.models import iam_backends

        try:
            role = self._role(name)
        except Exception:  # noqa: BLE001 - deleted: its sessions are worth nothing
            return [], None
        docs = [json.loads(d) if isinstance(d, str) else d for d in role.policies.values()]
        for managed in role.managed_policies.values():
            docs.append(json.loads(_default(managed).document))
        boundary = None
        if role.permissions_boundary_arn:
            # AWS refuses a role whose boundary does not exist; the lab's setup made it
            policy = iam_backends[self.account]["aws"].get_policy(role.permissions_boundary_arn)
            boundary = json.loads(_default(policy).document)
        return docs, boundary

    def _principal(self, name: str) -> dict:
        try:
            role = self._role(name)
        except Exception:  # noqa: BLE001 - deleted: no tags, no id
            return {"aws:PrincipalAccount": self.account, "aws:PrincipalArn":
                    f"arn:aws:iam::{self.account}:role/{name}"}
        tags = role.tags.values() if isinstance(role.tags, dict) else role.tags
        context = {"aws:PrincipalAccount": self.account, "aws:PrincipalArn": role.arn,
                   "aws:userid": f"{role.id}:i-lab"}
        context.update({f"aws:PrincipalTag/{t['Key']}": t["Value"] for t in tags})
        return context

    def _requests(self, response, role: str, resource: str, s3: bool) -> list[Request]:
        """The request(s) IAM evaluates for this call: one per resource it acts on."""
        principal = self._principal(role)
        if s3:
            action = "s3:" + str(response.data.get("Action") or "")
            context = {**principal, "aws:ResourceAccount": self.account}
            prefix = _param(response, "prefix")
            if prefix is not None:
                context["s3:prefix"] = prefix
            return [Request(action, resource, context)]
        service = _service(response)
        action = f"{service}:{response._get_action()}"
        region = response.region
        if action in ("autoscaling:DeleteAutoScalingGroup", "autoscaling:UpdateAutoScalingGroup"):
            from moto.autoscaling.models import autoscaling_backends

            name = _param(response, "AutoScalingGroupName") or ""
            group = autoscaling_backends[self.account][region].autoscaling_groups.get(name)
            arn = group.arn if group else (
                f"arn:aws:autoscaling:{region}:{self.account}:autoScalingGroup:*:"
                f"autoScalingGroupName/{name}")
            context = {**principal, **_tagged({t["Key"]: t["Value"]
                                               for t in (group.tags if group else [])})}
            for size in ("MinSize", "MaxSize"):
                if _param(response, size) is not None:
                    context[f"autoscaling:{size}"] = _param(response, size)
            context.update(_group_update_keys(response))
            return [Request(action, arn, context)]
        if action == "ec2:DeleteLaunchTemplate":
            from moto.ec2.models import ec2_backends

            backend = ec2_backends[self.account][region]
            ident, name = _param(response, "LaunchTemplateId"), _param(
                response, "LaunchTemplateName")
            template = next((t for t in backend.launch_templates.values()
                             if t.id == ident or t.name == name), None)
            tid = template.id if template else (ident or "lt-unknown")
            tags = {t["key"]: t["value"] for t in template.get_tags()} if template else {}
            return [Request(action, f"arn:aws:ec2:{region}:{self.account}:launch-template/{tid}",
                            {**principal, **_tagged(tags)})]
        if action == "ec2:TerminateInstances":
            from moto.ec2.models import ec2_backends

            backend = ec2_backends[self.account][region]
            out = []
            for ident in _indexed(response, "InstanceId"):
                try:
                    tags = {t["key"]: t["value"] for t in backend.get_instance(ident).get_tags()}
                except Exception:  # noqa: BLE001 - an unknown id: no tags
                    tags = {}
                out.append(Request(action, f"arn:aws:ec2:{region}:{self.account}:instance/"
                                   f"{ident}", {**principal, **_tagged(tags)}))
            return out
        return [Request(action, resource, principal)]


def _default(policy):
    return next(v for v in policy.versions if v.is_default)


def _tagged(tags: dict) -> dict:
    return {f"aws:ResourceTag/{k}": v for k, v in tags.items()}


def _param(response, name: str):
    value = response.querystring.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    return value


def _indexed(response, name: str) -> list[str]:
    """Query API list parameters (InstanceId.1, InstanceId.2, ...)."""
    found = sorted((k, v) for k, v in response.querystring.items()
                   if k.startswith(name + ".") and k[len(name) + 1:].isdigit())
    return [v[0] if isinstance(v, list) else v for _, v in found]


def _auth_part(text: str, start: str) -> str | None:
    if start not in text:
        return None
    return text.split(start, 1)[1].split("/", 1)[0].split(",", 1)[0]


def _access_key(response) -> str | None:
    """The access key a request was signed with: its Authorization header's, or a presigned
    request's X-Amz-Credential (query or POST form)."""
    headers = response.headers
    found = _auth_part(headers.get("Authorization") or "", "Credential=")
    if found:
        return found
    for name in ("X-Amz-Credential", "x-amz-credential"):
        value = _param(response, name)
        if value:
            return str(value).split("/", 1)[0]
    form = getattr(response, "form_data", None) or {}
    value = form.get("x-amz-credential") or form.get("X-Amz-Credential")
    return str(value).split("/", 1)[0] if value else None


def _service(response) -> str:
    scope = (response.headers.get("Authorization") or "").split("Credential=", 1)[-1]
    parts = scope.split(",", 1)[0].split("/")
    return parts[3] if len(parts) > 3 else ""


def _refuse(s3: bool, code: str, message: str, status: int):
    """AWS's refusal: S3's XML error, or the Query APIs' (HTTP `status` either way)."""
    if s3:
        from moto.s3.exceptions import S3ClientError

        error = S3ClientError(code, message)
        error.status_code = status  # type: ignore[attr-defined]
        raise error
    from moto.core.exceptions import _RESTError

    class Refused(_RESTError):
        pass

    Refused.code = status
    raise Refused(code, message)


def _group_update_keys(response) -> dict:
    """AWS's condition keys of CreateAutoScalingGroup and UpdateAutoScalingGroup (Service
    Authorization Reference, Amazon EC2 Auto Scaling) beyond the sizes, each in the context
    only where the request names what it is about: the instance types of its launch template
    overrides, its subnets, whether it names a launch template (with a version other than
    $Latest or $Default), and its launch configuration."""
    keys: dict = {}
    policy = response._get_param("MixedInstancesPolicy") or {}
    template = response._get_param("LaunchTemplate") or \
        (policy.get("LaunchTemplate") or {}).get("LaunchTemplateSpecification")
    overrides = (policy.get("LaunchTemplate") or {}).get("Overrides") or []
    types = [o["InstanceType"] for o in overrides if isinstance(o, dict) and o.get("InstanceType")]
    if types:
        keys["autoscaling:InstanceTypes"] = types
    subnets = response._get_param("VPCZoneIdentifier")
    if subnets:
        keys["autoscaling:VPCZoneIdentifiers"] = [s.strip() for s in subnets.split(",")]
    if template:
        keys["autoscaling:LaunchTemplateVersionSpecified"] = str(
            template.get("Version") not in (None, "$Latest", "$Default")).lower()
    if response._get_param("LaunchConfigurationName"):
        keys["autoscaling:LaunchConfigurationName"] = response._get_param(
            "LaunchConfigurationName")
    return keys
