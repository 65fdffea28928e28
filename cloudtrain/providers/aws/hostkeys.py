"""The instance's SSH host key, checked against what the instance itself printed.

cloud-init's keys-to-console module prints the host key fingerprints to the serial console at
first boot, which EC2 serves through GetConsoleOutput (base64) to whoever may call it for that
instance, over the AWS API rather than over the network path SSH takes:

    ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
    ec2: 256 SHA256:Xb2PZ4... root@ip-172-31-7-9 (ED25519)
    ec2: -----END SSH HOST KEY FINGERPRINTS-----

(Ubuntu prefixes each line with "ec2: ", other images print them bare.) A key the SSH server
presents is accepted only if its fingerprint is listed there; a listed set that does not
contain it means someone else answered (refused); no list in time means trust on first use,
recorded as such.
"""

from __future__ import annotations

import base64
import hashlib
import re

# How long acquire waits for the fingerprints to appear in the console output, counted from
# the moment SSH answers: keys-to-console runs in cloud-final after user-data
# (scripts-user), so sshd is up before the keys are printed. Never longer than the SSH wait.
FINGERPRINT_WAIT_S = 120.0
# Xen instances have no live console buffer (GetConsoleOutput's Latest is Nitro-only): EC2
# serves a snapshot it refreshes every few minutes, so they get at least this long.
XEN_FINGERPRINT_WAIT_S = 180.0
# The Xen-based families among those cloudtrain launches (and a few general ones); p3dn is
# Nitro. A type not listed whose console turns out to have no live buffer counts too.
XEN_FAMILIES = frozenset({"p2", "p3", "g2", "g3", "g3s", "f1", "c4", "m4", "r4", "t2", "x1",
                          "x1e", "d2", "h1", "i3"})

BEGIN = "-----BEGIN SSH HOST KEY FINGERPRINTS-----"
END = "-----END SSH HOST KEY FINGERPRINTS-----"
_FINGERPRINT = re.compile(r"\bSHA256:([A-Za-z0-9+/]{43})(?![A-Za-z0-9+/])")


def console_fingerprints(text: str) -> set[str]:
    """Every `SHA256:...` inside a BEGIN/END fingerprint block of the console text (a reboot
    prints the block again; an unterminated block counts only up to where it ends)."""
    found: set[str] = set()
    inside = False
    for line in text.replace("\r", "\n").splitlines():
        if BEGIN in line:
            inside = True
        elif END in line:
            inside = False
        elif inside:
            found.update(f"SHA256:{m}" for m in _FINGERPRINT.findall(line))
    return found


def fingerprint_window(instance_type: str | None, ssh_wait_s: float, latest: bool) -> float:
    """Seconds to wait for the fingerprints once SSH answers: FINGERPRINT_WAIT_S (at most the
    SSH wait), and at least XEN_FINGERPRINT_WAIT_S for a Xen type or a console without a
    live buffer (`latest` False)."""
    window = min(FINGERPRINT_WAIT_S, ssh_wait_s)
    family = (instance_type or "").split(".")[0]
    if family in XEN_FAMILIES or not latest:
        window = max(window, XEN_FINGERPRINT_WAIT_S)
    return window


def fingerprint(host_key: str) -> str:
    """OpenSSH's SHA256 fingerprint of a "<type> <base64 blob>" key: the unpadded base64 of
    the SHA-256 of the blob, as `ssh-keygen -l` and cloud-init print it."""
    blob = base64.b64decode(host_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
