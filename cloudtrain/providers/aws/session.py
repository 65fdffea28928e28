"""One AWS session: the settings, boto3 sessions and clients (with their retry modes), the
region a job goes to, and the caller's identity (owner). Every concern module of this package
takes it as its first argument; nothing else here holds state across calls.

boto3 and botocore are imported inside the methods that need them, so that `cloudtrain --help`
and `status` never load them.
"""

from __future__ import annotations

import getpass
import os
import re
import threading
from typing import Any

from ... import config
from ...config import check_region
from ...errors import CloudtrainError, UsageError
from ...state import Job
from .errors import aws_errors, foreign_answer

DEFAULT_REGION = "us-east-1"  # where a job goes when no region is configured anywhere
DEFAULT_SOURCE = ("the default: no --region, `region:` in config.yaml, AWS_REGION, "
                  "AWS_DEFAULT_REGION or region in the AWS profile")  # config.REGION_DEFAULT's order


# Variables through which boto3 finds credentials without a file (keys, a profile, a web
# identity or container role).
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN",
                        "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                        "AWS_CONTAINER_CREDENTIALS_FULL_URI")


# botocore's loaders, by data path (AWS_DATA_PATH): the service models they parsed, shared by
# every session of this process.
_LOADERS: dict[str, Any] = {}


def _with_shared_models() -> tuple:
    """A new botocore session (its own profile, credentials and region) whose service models
    come from the process's one loader: each session otherwise parses EC2's, S3's and Auto
    Scaling's models again (0.3 s of CPU here), and `status` makes one per AWS job."""
    import botocore.loaders
    import botocore.session

    session = botocore.session.get_session()
    data_path = session.get_config_variable("data_path") or ""
    if data_path not in _LOADERS:
        _LOADERS[data_path] = botocore.loaders.create_loader(data_path or None)
    loader = _LOADERS[data_path]
    session.register_component("data_loader", loader)
    return session, loader


def partition(region: str) -> str:
    """The AWS partition a region is in: credentials of one never work in another."""
    return "aws-cn" if region.startswith("cn-") else \
        "aws-us-gov" if region.startswith("us-gov-") else "aws"


def stable_session_name() -> str:
    """The session name cloudtrain gives a `role_arn` profile that names none: one per local
    user, the same in every process. botocore's own is `botocore-session-<unix time>`, so each
    process was a new `aws:userid` (`<role id>:<session>`), a new job-store prefix, and the
    jobs recorded under the last one were denied to it. STS allows 2-64 characters of
    [\\w+=,.@-]."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return ("cloudtrain-" + re.sub(r"[^\w+=,.@-]", "-", user, flags=re.ASCII))[:64]


def name_role_sessions(full_config: dict) -> list[str]:
    """Give every `role_arn` profile of the AWS config that names no `role_session_name` the
    stable one (stable_session_name), before botocore assumes any role: the profiles changed."""
    named = []
    for name, profile in (full_config.get("profiles") or {}).items():
        if isinstance(profile, dict) and profile.get("role_arn") and \
                not profile.get("role_session_name"):
            profile["role_session_name"] = stable_session_name()
            named.append(name)
    return named


def assumed_role(arn: str) -> tuple[str, str] | None:
    """(role ARN without a path, role name) for an STS assumed-role session ARN, else None."""
    parts = arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts" and parts[5].startswith("assumed-role/"):
        name = parts[5].split("/")[1]
        return f"arn:{parts[1]}:iam::{parts[4]}:role/{name}", name
    return None


class AwsSession:
    """Credentials, clients, region and owner of one user of one profile. `clients` also
    keeps what is asked once per session (the job store's client, a bucket found ready)."""
    name = "aws"

    def __init__(self, settings: config.Settings | None = None):
        self.settings = settings or config.Settings.load()
        self._sessions: dict[str, object] = {}
        self.clients: dict[tuple, object] = {}
        self.sweep_lock = threading.Lock()  # sweep threads make their clients one at a time
        self.named_sessions: list[str] = []  # role_arn profiles given a session name

    def session(self, region: str | None = None):
        """A boto3 session; with no region, the AWS chain's (AWS_REGION, AWS_DEFAULT_REGION,
        the profile), which region() checks before any client is made from it."""
        import boto3
        import botocore.exceptions

        if region:
            check_region(region, "--region or a job's record")
        elif self.settings.region:
            check_region(self.settings.region, "`region:` in config.yaml")
        key = region or ""
        if key not in self._sessions:
            try:
                core, loader = _with_shared_models()
                session = self._sessions[key] = boto3.Session(
                    botocore_session=core,
                    profile_name=self.settings.aws_profile or None,
                    region_name=region or self.settings.region
                    or os.environ.get("AWS_REGION") or None)
                # boto3 adds its data directory to the loader's path with each session
                loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))
                self.named_sessions = name_role_sessions(core.full_config)
                session.events.register("before-parse", foreign_answer)
            except botocore.exceptions.ProfileNotFound as exc:
                raise UsageError(f"AWS profile not found: {exc}",
                                 hint="list yours with: aws configure list-profiles") from exc
        return self._sessions[key]

    def region(self, spec=None) -> str:
        return self.region_and_source(spec.placement.region if spec is not None else None)[0]

    def region_and_source(self, asked: str | None = None) -> tuple[str, str]:
        """The job's region and where it came from, the same way for every command: --region
        (`asked`), `region:` in config.yaml, AWS_REGION, AWS_DEFAULT_REGION, the AWS profile's;
        else us-east-1 (the catalog's and estimate's default), said as such. botocore itself
        reads AWS_DEFAULT_REGION only, so AWS_REGION is read here."""
        if asked:
            source = "--region"
            region = asked
        elif self.settings.region:
            source, region = "`region:` in config.yaml", self.settings.region
        elif os.environ.get("AWS_REGION"):
            source, region = "AWS_REGION", os.environ["AWS_REGION"]
        elif os.environ.get("AWS_DEFAULT_REGION"):
            source, region = "AWS_DEFAULT_REGION", os.environ["AWS_DEFAULT_REGION"]
        else:
            region = self.session().region_name
            if not region:
                return DEFAULT_REGION, DEFAULT_SOURCE
            source = "the AWS profile"
        check_region(region, source)
        return config.check_known_region(region, source), source

    def client(self, service: str, region: str, fail_fast: bool = False):
        """A client; fail_fast for run_instances (capacity errors are not retried, the next
        AZ is tried instead). Others retry throttling and 5xx with backoff (standard mode)."""
        key = (service, region, fail_fast)
        if key not in self.clients:
            check_region(region)
            from botocore.config import Config

            retries = {"max_attempts": 1} if fail_fast else {"max_attempts": 6, "mode": "standard"}
            cfg = Config(retries=retries, connect_timeout=10, read_timeout=60)
            self.clients[key] = self.session(region).client(service, region_name=region,
                                                             config=cfg)
        return self.clients[key]

    def configured(self) -> bool:
        """Whether this machine may have AWS credentials, told without asking for them
        (botocore's chain ends at the instance metadata service, a second's wait off EC2): a
        credentials variable, an AWS config or credentials file, or settings that name AWS."""
        if self.settings.backend == self.name or self.settings.region or \
                self.settings.aws_profile or any(os.environ.get(v) for v in CREDENTIAL_VARIABLES):
            return True
        files = (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
                 os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config")
        return any(os.path.isfile(os.path.expanduser(f)) for f in files)

    def credentials(self, region: str):
        """The session's credentials, None without any (a broken credential_process or an
        expired SSO token is an error in words, not a traceback)."""
        with aws_errors(region, "sts"):
            return self.session(region).get_credentials()

    def call(self, region: str, method: str, fail_fast: bool = False, service: str = "ec2",
             **kwargs):
        """One call (EC2's unless `service` names another, e.g. autoscaling), with AWS's
        errors turned into ours where we know what to say."""
        with aws_errors(region, service):
            return getattr(self.client(service, region, fail_fast), method)(**kwargs)

    def check_credentials(self, region: str) -> None:
        """Ask STS whether the credentials still work (GetCallerIdentity, never cached): a
        relaunch asks before it starts anything, so that credentials that expired while it
        waited pause the recovery instead of failing the launch half-way."""
        with aws_errors(region, "sts"):
            self.session(region).client("sts", region_name=region).get_caller_identity()

    def owner(self, region: str) -> str:
        """The caller's principal ARN: the cloudtrain:owner tag of everything this user
        creates, and what infra/iam-policy-cli.json compares it with (`${aws:PrincipalArn}`).
        For an IAM user that is GetCallerIdentity's ARN; for an assumed role (SSO, CI) STS
        names the session (arn:aws:sts::A:assumed-role/R/S) while aws:PrincipalArn is the
        role itself, path included (arn:aws:iam::A:role/PATH/R): asked of IAM (GetRole on
        one's own role), else the role without a path."""
        if not hasattr(self, "_owner"):
            arn = self.identity(region)["Arn"]
            role = assumed_role(arn)
            if role is not None:
                try:
                    with aws_errors(region, "iam"):
                        iam = self.session(region).client("iam", region_name=region)
                        arn = iam.get_role(RoleName=role[1])["Role"]["Arn"]
                except CloudtrainError:
                    arn = role[0]
            self._owner = arn
        return self._owner

    def owner_key(self, region: str | None) -> str:
        """The caller's aws:userid (GetCallerIdentity's UserId: an IAM user's unique id, or
        `<role id>:<session name>`): the job store keeps each principal's jobs under
        `jobs/<owner_key>/`, the prefix infra/iam-policy-cli.json names `${aws:userid}`."""
        if not hasattr(self, "_owner_key"):
            self._owner_key = self.identity(region)["UserId"]
        return self._owner_key

    def identity(self, region: str | None) -> dict:
        """STS GetCallerIdentity (UserId, Account, Arn), asked once."""
        if not hasattr(self, "_caller"):
            with aws_errors(region, "sts"):
                sts = self.session(region).client("sts", region_name=region)
                self._caller = sts.get_caller_identity()
        return self._caller

    def sweep_client(self, region: str, service: str = "ec2"):
        """A client for a sweep (EC2's, or `service`'s): from the one session every region
        shares (a session per region costs half a second each), with short timeouts and few
        retries."""
        key = (f"{service}-sweep", region)
        with self.sweep_lock:
            if key not in self.clients:
                from botocore.config import Config

                check_region(region)
                self.clients[key] = self.session().client(service, region_name=region, config=Config(
                    retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5,
                    read_timeout=20))
            return self.clients[key]

    def region_of(self, job: Job) -> str:
        return job.spec.placement.region or self.region()
    def remember(self, owner: str, owner_key: str | None) -> None:
        """The identity bootstrap's cache holds for these credentials: no STS call for it."""
        self._owner = owner
        if owner_key:
            self._owner_key = owner_key
