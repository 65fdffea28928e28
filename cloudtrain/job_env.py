"""A job's environment variables: the words of `--env` / `--secret` and of a job file's
`envs:` / `secrets:` read into values, and what a job file may take from this shell.

A null value in a job file (`secrets: {WANDB_API_KEY: null}`) takes the launching shell's
value. A job file is code from a repository, perhaps someone else's, and the
shell may hold AWS keys (aws-vault, an SSO export, CI) or a GitHub token: the file must not
carry them off unasked. So:

- a cloud's credential variables (`cloud_credential`) that a job file names are refused;
- any other value a job file takes from this shell is named in a question that `-y` does
  not skip (`consent`); without a terminal to ask, the launch is refused with the command
  that sends them;
- what the user types (`--secret NAME`, `--env NAME`) is the user's consent: never asked.

Imports the errors and config's `shown`; the launch options' places (origins) are plain
dictionaries here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .config import shown
from .errors import UsageError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# The job's own variables (jobs.job_environment) are cloudtrain's to set.
RESERVED_ENV_PREFIX = "CLOUDTRAIN_"
# What each cloud's SDK and CLI read their credentials from, by the prefix of its variables
# (AWS_SECRET_ACCESS_KEY, AZURE_CLIENT_SECRET, ARM_CLIENT_SECRET, GOOGLE_APPLICATION_CREDENTIALS,
# CLOUDSDK_AUTH_ACCESS_TOKEN, OS_PASSWORD for OpenStack, ...); the ones that hold a credential
# or point at one look like one (CREDENTIAL_LIKE).
CLOUD_PREFIXES = ("AWS_", "AMAZON_", "AZURE_", "ARM_", "GOOGLE_", "GCLOUD_", "CLOUDSDK_",
                  "GCP_", "GCE_", "GCS_", "OCI_", "OS_", "ALIBABA_CLOUD_", "ALICLOUD_",
                  "TENCENTCLOUD_", "IBMCLOUD_", "DIGITALOCEAN_", "HCLOUD_", "LINODE_", "SCW_",
                  "VULTR_", "CLOUDFLARE_", "LAMBDA_", "RUNPOD_", "VASTAI_", "PAPERSPACE_",
                  "COREWEAVE_", "OVH_", "EXOSCALE_", "HEROKU_", "FLY_", "NEBIUS_")
CREDENTIAL_LIKE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|"
                             r"SESSION|CERT|PRIVATE|CONNECTION_STRING|SAS|PAT$|PASS$")
FLAGS = {"envs": "--env", "secrets": "--secret"}


def cloud_credential(name: str) -> bool:
    """A cloud's credential variable, or one that points at a credential file: refused in a
    job file (AWS_ACCESS_KEY_ID, AWS_SESSION_TOKEN, AZURE_CLIENT_SECRET, ...)."""
    upper = name.upper()
    return upper.startswith(CLOUD_PREFIXES) and credential_like(upper)


def credential_like(name: str) -> bool:
    """A name that looks like it holds a credential: *_TOKEN, *_KEY, *SECRET*, *PASSWORD*,
    *CREDENTIAL*, ..."""
    return bool(CREDENTIAL_LIKE.search(name.upper()))


def environment(words, what: str, environ=None, named: dict | None = None) -> dict[str, str]:
    """`--env KEY=VALUE` / `--env KEY` (this shell's value) words as {KEY: VALUE}; the last
    word for a key wins. `what` is the flag, for messages; `named`: {KEY: "job.yaml:5:
    envs.KEY"} for the keys a job file gave, which messages name instead."""
    environ = os.environ if environ is None else environ
    named = named or {}
    given: dict[str, str | None] = {}  # the last word for a name wins, a value or not
    for word in words or ():
        name, eq, value = str(word).partition("=")
        if not ENV_NAME.fullmatch(name):  # the value may be a secret: never shown
            raise UsageError(f"{what} {shown(name)}{'=...' if eq else ''}: expected KEY=VALUE "
                             "with KEY an environment variable name (letters, digits and _)")
        if name.upper().startswith(RESERVED_ENV_PREFIX):
            raise UsageError(f"{named.get(name) or f'{what} {name}'}: CLOUDTRAIN_* variables "
                             "are set by cloudtrain for the job", hint="pick another name")
        given[name] = value if eq else None
    out: dict[str, str] = {}
    for name, maybe in given.items():
        said = named.get(name) or f"{what} {name}"
        if maybe is None:
            if name not in environ:
                raise UsageError(f"{said}: no value given and {name} is not set here",
                                 hint=f"{what} {name}=VALUE, or export {name} first")
            maybe = environ[name]
        if "\0" in maybe:
            raise UsageError(f"{said}: a value cannot hold a NUL character")
        out[name] = maybe
    return out


@dataclass(frozen=True)
class Taken:
    """A value the job takes from this shell: a null in a job file or a typed `--env NAME`."""
    name: str
    option: str  # "envs" or "secrets"
    at: str | None  # "job.yaml:7: secrets.NAME" where a job file named it; None: typed

    @property
    def flag(self) -> str:
        return FLAGS[self.option]


def taken(envs, secrets, origins: dict) -> list[Taken]:
    """The values the job takes from this shell (the words without `=VALUE`, the last word
    of a name winning), in the order given; `origins`: the launch options' places, where
    a job file's items are `envs.NAME` / `secrets.NAME` (a typed word removes its name's)."""
    out = []
    for option, words in (("envs", envs), ("secrets", secrets)):
        last: dict[str, bool] = {}
        for word in words or ():
            name, eq, _ = str(word).partition("=")
            last[name] = bool(eq)
        out += [Taken(name, option, origins.get(f"{option}.{name}"))
                for name, has_value in last.items() if not has_value]
    return out


def refuse_cloud_credentials(values: list[Taken]) -> None:
    """A job file may not take a cloud's credentials from this shell, asked or not: only the
    user, typing the flag, sends one."""
    for t in values:
        if t.at and cloud_credential(t.name):
            raise UsageError(f"{t.at}: a job file cannot take your cloud credentials from this "
                             "shell's environment (it may come from someone else's repository)",
                             hint=f"to send {t.name} to the job, type {t.flag} {t.name} on the "
                                  "command line")


@dataclass(frozen=True)
class Consent:
    """What a launch asks before a job file takes values from this shell: the question (in a
    terminal, whatever -y says; Enter is no) and the error without a terminal."""
    said: str  # what is taken: `job.yaml takes 2 values from your environment ...: A, B`
    ask: str  # `Send them?`
    refusal: UsageError


def consent(values: list[Taken], job_file: str | None) -> Consent | None:
    """The question for the values a job file (`job_file`, as typed) takes from this shell,
    or None when it takes none (what was typed is not asked)."""
    asked = [t for t in values if t.at]
    if not asked:
        return None
    n = len(asked)
    where = job_file or (asked[0].at or "").split(":", 1)[0]
    them = "it" if n == 1 else "them"
    what = f"{where} takes {'a value' if n == 1 else f'{n} values'} from your environment"
    listed = ", ".join(f"{t.name} ({_line(t)}"
                       f"{', credential-like' if credential_like(t.name) else ''})"
                       for t in asked)
    typed = " ".join(f"{t.flag} {t.name}" for t in asked)
    refusal = UsageError(f"{asked[0].at}: {what}"
                         + (f" ({', '.join(t.name for t in asked)})" if n > 1 else "")
                         + " and there is no terminal to ask",
                         hint=f"to send {them}, type {them}: cloudtrain launch {where} {typed}")
    return Consent(said=f"{what} into the job: {listed}", ask=f"Send {them}?",
                   refusal=refusal)


def _line(t: Taken) -> str:
    """`secrets, line 7` for a value at `job.yaml:7: secrets.NAME`."""
    place, _, key = (t.at or "").partition(": ")
    return f"{key.split('.', 1)[0]}, line {place.rsplit(':', 1)[-1]}"
