"""The one user-facing error type, caught once in the CLI.

Every error carries a message for humans, an optional hint (usually the command to run
next) and the exit code the process ends with.
"""

from __future__ import annotations

import math
import reprlib

# Exit codes, named once.
EXIT_OK = 0
EXIT_FAILED = 1  # a job failed, or an operation could not be done
EXIT_USAGE = 2  # the user asked for something that cannot be (bad flag, unknown id, ...)
EXIT_INTERRUPTED = 130


class CloudtrainError(Exception):
    """An error to show as `Error: <message>` (plus `hint`) and exit with `exit_code`."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(CloudtrainError):
    """Bad input: unknown recipe, job id or argument, a wrong type."""

    exit_code = EXIT_USAGE


def named_at(exc: UsageError, origin: str | None, flag: str) -> UsageError:
    """An error a check raised about a value a job file gave, named at the file's line
    and key (`origin`: `job.yaml:4: resources.gpus`) rather than by `flag` (`--gpus`), which
    nobody typed; a hint that is the flag with a value becomes the key with it. Without an
    origin (the flag was typed), `exc` as it is."""
    if not origin:
        return exc
    message = exc.message
    for said in (f"{flag}: ", f"{flag} "):  # "--data x: ..." -> "..."; "--gpus Z100: ..." ->
        if message.startswith(said):        # "Z100: ..."
            message = message[len(said):]
            break
    hint = exc.hint
    if hint and hint.startswith(f"{flag} "):  # "--gpus A100:8" -> "resources.gpus: A100:8"
        hint = f"{origin.rsplit(': ', 1)[-1]}: {hint[len(flag) + 1:]}"
    return type(exc)(f"{origin}: {message}", hint=hint, exit_code=exc.exit_code)


class NotFound(UsageError):
    """A named thing (job, recipe) does not exist."""


class ConfigError(UsageError):
    """config.yaml or a recipe.yaml is invalid."""


class MissingDependency(CloudtrainError):
    """A program or module the job needs is not installed where it runs."""


class NoCredentials(MissingDependency):
    """A command needs cloud credentials and found none (its hint says where they go; a
    command with a way on without them adds it)."""


class CredentialsError(CloudtrainError):
    """The cloud refused the credentials, or they could not be loaded: expired, revoked, an
    SSO session that ended. Nothing but new credentials helps (the recovery supervisor
    pauses on it rather than fail the job)."""


class HostError(CloudtrainError):
    """A command on a host failed or the host could not be reached."""


class NotRegularFile(HostError):
    """What is at a path a job writes to is a FIFO, a link, a device or a folder: not
    read, and not a reason to give up on the job's other files."""


class CloudError(CloudtrainError):
    """A cloud call that failed, in words; a provider's own errors say more (AWSError)."""

    code = ""  # the cloud's error code, where there is one (callers branch on it)

    @property
    def denied(self) -> bool:
        """The cloud refused a permission: a check may go on without that call."""
        return False

    @property
    def quota(self) -> bool:
        """A quota refused it: no other place of the same account will do better."""
        return False

    def refused_action(self, service: str) -> str | None:
        """The permission the cloud refused (`ec2:RunInstances`), where it can be told."""
        return None


class PlacementError(CloudtrainError):
    """The instance asked for cannot be had where it was asked for, now: no capacity in any
    AZ, or a quota. A relaunch (recovery.py) then tries its next place or market."""


class JobFailed(CloudtrainError):
    """The job ended in a state other than succeeded (used by `launch --follow`)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what it left behind: said as `interrupted: <message>` (exit 130)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class _Shown(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        """repr() of an integer over sys.get_int_max_str_digits() digits raises ValueError:
        its length instead."""
        if x.bit_length() > 14000:  # about 4200 digits: well inside the limit below it
            return f"<a number of {int(math.log10(abs(x))) + 1} digits>"
        return super().repr_int(x, level)


_SHOWN = _Shown()


def shown(value) -> str:
    """A value for an error message: its repr, cut short (a YAML alias bomb, 100,000 chars;
    an integer of 5000 digits)."""
    return _SHOWN.repr(value)
