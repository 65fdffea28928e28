"""The first thing an Auto Scaling instance of a job runs: fetch the boot files, then bootstrap.

Standard library only, Python 3.8+. It travels inside the instance's user-data (the host
package with only awsapi and stage_errors, the modules it imports, and its launcher: hosts.
host_files), so it is small: it fetches one object, `<job prefix>boot.tar` (the whole host
package and its launchers, uploaded by the launch before the group was made), with a GET
signed by the instance role's credentials (IMDSv2), checks its sha256 against the one the
user-data names (the launch computed it; nothing of the bucket is trusted), unpacks its plain
files into its folder and runs bootstrap.py there, in place of itself, with the arguments
after `--`:

    python3 boot_loader.py --bucket B --key jobs/<owner>/<job>/boot.tar --sha256 HEX
                           --region R [--endpoint URL] [--imds URL] --dir DIR -- ARGS...

Every failure prints one line and exits with EXIT_BOOT; nothing is run from a tar whose sha256
does not match. A 403/404 (an upload not yet visible) or no answer is tried again for up to
FETCH_WAIT_S.
"""

import argparse
import hashlib
import io
import os
import sys
import tarfile
import time
import urllib.error
import urllib.request

from . import SHIPPED_AS
from .awsapi import IMDS_URL, RoleCredentials, object_url, retry, sign_get, utc_now
from .stage_errors import StageError

EXIT_BOOT = 11
FETCH_WAIT_S = 300.0
RETRY_S = 3.0
TAR_MAX_BYTES = 8 << 20  # the host modules: about 0.5 MB
NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789_.")


class BootError(Exception):
    """One line: why the boot files could not be had."""


class _Again(Exception):
    """A try that may succeed later: a 403/404 (an upload not yet visible), a 5xx, no answer."""


def fetch(url, region, creds, wait_s=None):
    """The object's bytes (at most TAR_MAX_BYTES), tried again every RETRY_S on 403, 404, 5xx
    or no answer until `wait_s` (None: FETCH_WAIT_S, read at the call) has passed."""
    wait_s = FETCH_WAIT_S if wait_s is None else wait_s

    def once():
        try:
            req = urllib.request.Request(url, headers=sign_get(url, region, creds.get(),
                                                               utc_now()))
            with urllib.request.urlopen(req, timeout=60) as resp:
                data = resp.read(TAR_MAX_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code not in (403, 404) and exc.code < 500:
                raise BootError("reading %s was refused (HTTP %d)" % (url, exc.code)) from None
            raise _Again("HTTP %d" % exc.code) from None
        except (OSError, StageError) as exc:
            raise _Again(str(exc) or type(exc).__name__) from None
        if len(data) > TAR_MAX_BYTES:
            raise BootError("the boot files are larger than %d bytes" % TAR_MAX_BYTES)
        return data

    # Tried until wait_s has passed: the last wait may end after it.
    return retry(once, lambda exc: isinstance(exc, _Again), delay_s=RETRY_S, factor=1.0,
                 deadline=time.time() + wait_s + RETRY_S,
                 give_up=lambda exc, _: BootError("no boot files at %s after %.0f s (%s)"
                                                  % (url, wait_s, exc)))


def _plain(name):
    return bool(name) and set(name) <= NAME_OK and not name.startswith(".")


def unpack(data, digest, folder):
    """Check the sha256, then write each member (a plain file with a plain name, in `folder`
    or in the host package's folder below it) into `folder`; the names written."""
    if hashlib.sha256(data).hexdigest() != digest:
        raise BootError("the boot files do not have the sha256 the user-data names: refused")
    names = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not member.isreg() or not _plain(parts[-1]) \
                    or parts[:-1] not in ([], [SHIPPED_AS]):
                raise BootError("the boot files hold %r: not a plain file" % member.name[:80])
            f = tar.extractfile(member)
            assert f is not None  # a regular file, checked above
            body = f.read()
            if len(parts) == 2:
                os.makedirs(os.path.join(folder, SHIPPED_AS), mode=0o700, exist_ok=True)
            path = os.path.join(folder, *parts)
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
            names.append(member.name)
    if "bootstrap.py" not in names:
        raise BootError("the boot files hold no bootstrap.py")
    return names


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="boot_loader.py", description=__doc__.split("\n")[0])
    for name in ("--bucket", "--key", "--sha256", "--region", "--dir"):
        parser.add_argument(name, required=True)
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--imds", default=IMDS_URL)
    args = parser.parse_args(argv)
    try:
        os.makedirs(args.dir, mode=0o700, exist_ok=True)
        creds = RoleCredentials(args.imds)
        data = fetch(object_url(args.bucket, args.key, args.region, args.endpoint),
                     args.region, creds)
        unpack(data, args.sha256, args.dir)
    except (BootError, StageError, OSError, tarfile.TarError) as exc:
        sys.stderr.write("boot_loader: %s\n" % " ".join(str(exc).split())[:500])
        return EXIT_BOOT
    script = os.path.join(args.dir, "bootstrap.py")
    os.execv(sys.executable, [sys.executable, script] + rest)
    return EXIT_BOOT  # not reached


if __name__ == "__main__":
    sys.exit(main())
