"""How a failure on the host is said: StageError and reason(exc), one line each.

Standard library only, Python 3.8+; imports nothing of ours. The lowest host module: the
signer (awsapi) needs only this, so the boot loader that an Auto Scaling instance's
user-data carries (boot_loader.py) stays small.
"""

import socket


class StageError(Exception):
    """A one-line reason staging failed."""


def reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0][:200] if text else type(exc).__name__
